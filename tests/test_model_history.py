"""Model-based test of a table's history (issue 71): savepoints on any commit (several alive),
restores to any of them, rollbacks, compactions, clusterings and cleans, with the metadata table
on and every index built, and writes held at a pause point in another process while the others
run.

After every step, the model says what every read gives: the snapshot; `as_of` every completed
data instant; and the incremental and change windows between any two completed instants (not
only consecutive ones).

The laws (docs/FORMAT.md §4, `read/mod.rs: Seen`):
- time travel `as_of` T sees the completed data instants *requested* at or before T;
- a window `(a, b]` holds the instants requested in it on version 6, and those *completed* in it on
  version 8 ("a window's answer is a function of the instants completed in it, whatever completes
  later"), each merged as the instants seen at its bounds leave it;
- each write's decisions (a delete of a key no file group holds is nothing; an upsert with a lower
  ordering value loses; an overwrite replaces the file groups it saw) are taken on what it read
  (the instants completed when it began); two writes that completed side by side and touched the
  same key cannot both have landed;
- merge-on-read: a compaction (or clustering) rewrites each key's visible version and drops
  tombstones. On version 6 a log belongs to the slice its writer planned on (a write held across a
  compaction comes before it); on version 8 to the slice of the base instant before its completion
  time (a write that completes after a compaction was requested comes after it).
"""

from __future__ import annotations

import json
import os
import select
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import oxlake
import pyarrow as pa
import pytest
from conftest import SCHEMA
from hypothesis import HealthCheck, Phase, example, given, settings
from hypothesis import event as hypothesis_event
from hypothesis import strategies as st
from test_model import Row, combine
from test_model import row as row_strategy

#: Examples per test (`OXLAKE_MODEL_EXAMPLES=200 pytest tests/test_model_history.py` for a long run).
EXAMPLES = int(os.environ.get("OXLAKE_MODEL_EXAMPLES", "15"))
#: `OXLAKE_MODEL_NO_SHRINK=1`: report a failing history as found (shrinking one takes minutes).
PHASES = [p for p in Phase if p != Phase.shrink or not os.environ.get("OXLAKE_MODEL_NO_SHRINK")]
Key = tuple[str, int]


def event(name: str) -> None:
    """Counts what the examples exercised (`pytest --hypothesis-show-statistics`); outside a
    Hypothesis test (a replay), nothing."""
    try:
        hypothesis_event(name)
    except Exception:  # noqa: BLE001 - hypothesis.errors.InvalidArgument
        pass


# -- a writer in another process, held at a pause point --------------------------------------

WORKER = r"""
import json, os, sys
import oxlake, pyarrow as pa
sys.path.insert(0, sys.argv[1])
from conftest import SCHEMA
for line in sys.stdin:
    cmd = json.loads(line)
    os.environ["OXLAKE_PAUSEPOINT"] = cmd["point"]
    os.environ["OXLAKE_PAUSE_DIR"] = cmd["dir"]
    try:
        t = oxlake.Table(cmd["path"])
        res = getattr(t, cmd["op"])(pa.Table.from_pylist(cmd["rows"], schema=SCHEMA))
        out = {"landed": res.instant, "completion": res.completion}
    except oxlake.CommitConflictError as e:
        out = {"conflict": f"{e}"}
    except Exception as e:
        out = {"error": f"{type(e).__name__}: {e}"}
    del os.environ["OXLAKE_PAUSEPOINT"], os.environ["OXLAKE_PAUSE_DIR"]
    print(json.dumps(out), flush=True)
"""


class Worker:
    """One process for every held write of a test run (a process each would cost more than the
    rest of an example): it takes a write, runs it up to the pause point, and answers once let go."""

    def __init__(self) -> None:
        self.err = tempfile.TemporaryFile(mode="w+")
        self.proc = subprocess.Popen(
            [sys.executable, "-c", WORKER, str(Path(__file__).parent)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.err,
            text=True,
        )

    def _answer(self, timeout: float) -> dict[str, Any] | None:
        assert self.proc.stdout is not None
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        if not ready:
            return None
        line = self.proc.stdout.readline()
        assert line, f"the worker died: {self.stderr()}"
        return json.loads(line)

    def stderr(self) -> str:
        self.err.seek(0)
        return self.err.read()[-3000:]

    def start(self, path: str, op: str, rows: list[Row], point: str) -> Held:
        """Starts `op` of `rows` and returns once it waits at `point` (or finished without
        reaching it: a write of nothing)."""
        pause = Path(tempfile.mkdtemp(prefix="held-"))
        assert self.proc.stdin is not None
        cmd = {"path": path, "op": op, "rows": rows, "point": point, "dir": str(pause)}
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()
        deadline = time.monotonic() + 60
        while not (pause / "reached").exists():
            done = self._answer(0.01)
            if done is not None:
                shutil.rmtree(pause, ignore_errors=True)
                return Held(self, pause, done)
            assert time.monotonic() < deadline, f"never reached {point}: {self.stderr()}"
        return Held(self, pause, None)

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        self.proc.wait(timeout=60)
        self.err.close()


@dataclass
class Held:
    worker: Worker
    pause: Path
    answer: dict[str, Any] | None

    def release(self) -> dict[str, Any]:
        """Lets the write go on; its outcome: `landed` (and `completion`), `conflict` or `error`."""
        if self.answer is None:
            (self.pause / "resume").touch()
            self.answer = self.worker._answer(120)
            assert self.answer is not None, f"the held write never finished: {self.worker.stderr()}"
            shutil.rmtree(self.pause, ignore_errors=True)
        return self.answer


@pytest.fixture(scope="module")
def worker() -> Iterator[Worker]:
    w = Worker()
    yield w
    w.close()


# -- the model ----------------------------------------------------------------------------------


@dataclass
class Entry:
    """A completed data instant: a write (`op`: its operation and rows) or a compaction or
    clustering (`op` None), with the instants completed when it began (`reads`: what its
    decisions were taken on)."""

    time: str
    completion: str
    op: tuple[str, list[Row]] | None
    reads: frozenset[str]
    kept: bool = True  # False once a clean may have removed what reading as of it needs


#: A table's state: each key's versions (ordering value, row or None for a delete, commit time),
#: in the order the table merges them. Copy-on-write keeps one version (never a delete).
Versions = dict[Key, list[tuple[int, Row | None, str]]]


def visible(state: Versions) -> dict[Key, tuple[Row, str]]:
    """The version a reader sees of each key (the greatest ordering value, ties to the later),
    with its commit time; a delete that wins hides the key."""
    out: dict[Key, tuple[Row, str]] = {}
    for k, vs in state.items():
        best = None
        for v in vs:
            if best is None or v[0] >= best[0]:
                best = v
        if best is not None and best[1] is not None:
            out[k] = (best[1], best[2])
    return out


class Model:
    def __init__(self, merge_on_read: bool, version: int) -> None:
        self.merge_on_read, self.version = merge_on_read, version
        self.entries: list[Entry] = []  # by requested time
        self._memo: dict[frozenset[str], Versions] = {}

    # The history changes: the states computed are forgotten.
    def add(self, e: Entry) -> None:
        assert all(x.time != e.time for x in self.entries), e.time
        self.entries.append(e)
        self.entries.sort(key=lambda x: x.time)
        self._memo.clear()

    def remove_after(self, time_: str) -> list[Entry]:
        gone = [e for e in self.entries if e.time > time_]
        self.entries = [e for e in self.entries if e.time <= time_]
        self._memo.clear()
        return gone

    def times(self) -> frozenset[str]:
        return frozenset(e.time for e in self.entries)

    def bound(self, e: Entry) -> str:
        """What bounds a window: requested times on version 6, completion times on 8."""
        return e.time if self.version == 6 else e.completion

    def position(self, e: Entry) -> str:
        """Where an instant's changes go among the others': merge-on-read slices follow requested
        times on version 6; on version 8 a log joins the slice of the base instant before its
        deltacommit's completion, so a compaction stands at its requested time among the writes'
        completions."""
        if self.version == 6 or e.op is None:
            return e.time
        return e.completion

    def state(self, seen: frozenset[str]) -> Versions:
        """The table made of the instants `seen` (requested times)."""
        if seen in self._memo:
            return self._memo[seen]
        out: Versions = {}
        for e in sorted((e for e in self.entries if e.time in seen), key=self.position):
            if e.op is None:
                if self.merge_on_read:
                    out = {k: [(r["ts"], r, ct)] for k, (r, ct) in visible(out).items()}
                continue
            read = self.state(e.reads & self.times())
            out = self.apply(out, read, e.time, *e.op)
        self._memo[seen] = out  # (read only: `apply` copies what it changes)
        return out

    def apply(self, state: Versions, read: Versions, time_: str, name: str, batch: list[Row]) -> Versions:
        """`state` after the write at `time_` of `name` and `batch`, decided on what it read."""
        out = {k: list(v) for k, v in state.items()}
        batch = combine(batch)
        seen = visible(read)
        if name == "insert_overwrite":
            cities = {r["city"] for r in batch}
            for k in [k for k in out if k[0] in cities and k in read]:
                del out[k]
        for r in batch:
            k = (r["city"], r["id"])
            if self.merge_on_read:
                if name == "delete":
                    if k in read:  # a key no file group holds is not looked up
                        out.setdefault(k, []).append((r["ts"], None, time_))
                else:
                    out.setdefault(k, []).append((r["ts"], r, time_))
            elif name == "delete":
                if k in seen and r["ts"] >= seen[k][0]["ts"]:
                    out.pop(k, None)
            elif name in ("insert", "insert_overwrite") or k not in seen or r["ts"] >= seen[k][0]["ts"]:
                out[k] = [(r["ts"], r, time_)]
        return out

    def touched(self, e: Entry) -> set[Key]:
        """The keys whose records the write `e` rewrote or logged (two writes side by side that
        both touch one cannot both land)."""
        assert e.op is not None
        name, batch = e.op
        read = self.state(e.reads & self.times())
        keys = {(r["city"], r["id"]) for r in batch}
        if name == "delete":
            keys &= set(read)
        if name == "insert_overwrite":
            cities = {r["city"] for r in batch}
            keys |= {k for k in read if k[0] in cities}
        return keys

    # What reads give.

    def as_of(self, t: str) -> list[tuple]:
        return rows_of(self.state(frozenset(e.time for e in self.entries if e.time <= t)))

    def seen_at(self, b: str) -> frozenset[str]:
        """The instants a window ending at the bound `b` sees."""
        return frozenset(e.time for e in self.entries if self.bound(e) <= b)

    def in_window(self, a: str | None, b: str) -> set[str]:
        return {
            e.time
            for e in self.entries
            if e.op is not None and (a is None or self.bound(e) > a) and self.bound(e) <= b
        }

    def incremental(self, a: str | None, b: str) -> list[tuple]:
        window = self.in_window(a, b)
        end = visible(self.state(self.seen_at(b)))
        return sorted(row_tuple(r) for r, ct in end.values() if ct in window)

    def changes(self, a: str | None, b: str) -> list[tuple]:
        window = self.in_window(a, b)
        before = visible(self.state(self.seen_at(a))) if a is not None else {}
        after = visible(self.state(self.seen_at(b)))
        out = []
        for k in before.keys() | after.keys():
            if k not in before:
                out.append(change_tuple(after[k][0], "insert"))
            elif k not in after:
                out.append((k[0], k[1], "delete", None, None, None))
            elif after[k][1] in window:
                out.append(change_tuple(after[k][0], "update"))
        return sorted(out, key=repr)


def row_tuple(r: Row) -> tuple:
    return (r["city"], r["id"], r["name"], r["ts"], r["fare"])


def change_tuple(r: Row, kind: str) -> tuple:
    return (r["city"], r["id"], kind, r["name"], r["ts"], r["fare"])


def rows_of(state: Versions) -> list[tuple]:
    return sorted(row_tuple(r) for r, _ in visible(state).values())


# -- what the table gives -----------------------------------------------------------------------


def read_rows(t: oxlake.Table, **kw: Any) -> list[tuple]:
    return sorted(row_tuple(r) for r in t.to_arrow(**kw).select(SCHEMA.names).to_pylist())


def read_changes(t: oxlake.Table, **kw: Any) -> list[tuple]:
    got = t.to_arrow(query="changes", **kw).select([*SCHEMA.names, "_change_type"]).to_pylist()
    return sorted(
        ((r["city"], r["id"], r["_change_type"], r["name"], r["ts"], r["fare"]) for r in got), key=repr
    )


def unreadable(err: Exception) -> bool:
    """The typed error of a read that needs files a clean removed."""
    return isinstance(err, oxlake.InvalidArgumentError) and "no longer readable" in str(err)


def check(t: oxlake.Table, m: Model, what: Any) -> None:
    """Every read the model can tell: the snapshot, `as_of` every completed data instant, and
    every incremental and change window between two of them (or from the start)."""
    assert read_rows(t) == m.as_of("9" * 17), ("snapshot", what)
    by_time = {e.time: e for e in m.entries}
    for e in m.entries:
        try:
            got = read_rows(t, as_of=e.time)
        except oxlake.OxlakeError as err:
            assert not e.kept and unreadable(err), ("as_of", e.time, what, err)
            event("as_of: no longer readable")
            continue
        assert got == m.as_of(e.time), ("as_of", e.time, what)
    bounds = sorted((m.bound(e), e) for e in m.entries)
    starts: list[tuple[str | None, Entry | None]] = [(None, None), *bounds]
    for a, ea in starts:
        for b, eb in bounds:
            if a is not None and b <= a:
                continue
            window = [by_time[x] for x in m.in_window(a, b)]
            involved = [eb, *window]
            try:
                got = read_rows(t, query="incremental", start=a, end=b)
            except oxlake.OxlakeError as err:
                assert not all(x.kept for x in involved) and unreadable(err), ("incremental", a, b, what, err)
                event("incremental: no longer readable")
            else:
                assert got == m.incremental(a, b), ("incremental", a, b, what)
            try:
                got = read_changes(t, start=a, end=b)
            except oxlake.OxlakeError as err:
                assert not all(x.kept for x in [*involved, *([ea] if ea else [])]) and unreadable(err), (
                    "changes",
                    a,
                    b,
                    what,
                    err,
                )
                event("changes: no longer readable")
            else:
                assert got == m.changes(a, b), ("changes", a, b, what)


# -- the steps ----------------------------------------------------------------------------------

WRITES = ["insert", "upsert", "delete", "insert_overwrite"]
write = st.tuples(st.sampled_from(WRITES), st.lists(row_strategy, min_size=1, max_size=6))
savepoint = st.tuples(st.just("savepoint"), st.integers(min_value=0, max_value=30))
restore = st.tuples(st.just("restore"), st.tuples(st.integers(min_value=0, max_value=30), st.booleans()))
step = st.one_of(
    write,
    write,
    # Single-row upserts in a row: the metadata table compacts every few commits.
    st.tuples(st.just("burst"), st.lists(row_strategy, min_size=2, max_size=5)),
    # A write held at a pause point in another process while the next steps run.
    st.tuples(st.just("hold"), st.tuples(st.sampled_from(["before-commit", "after-plan"]), write)),
    st.tuples(
        st.sampled_from(["compact", "cluster", "rollback", "rollback", "release", "rebuild"]), st.just(0)
    ),
    st.tuples(st.just("clean"), st.integers(min_value=1, max_value=3)),
    savepoint,
    savepoint,
    st.tuples(st.just("delete_savepoint"), st.integers(min_value=0, max_value=30)),
    restore,
    restore,
)

Step = tuple[str, Any]


def r(i: int, city: str, ts: int, name: str | None = None) -> Row:
    """A row of an example."""
    return {"id": i, "name": name or f"n{i}-{ts}", "city": city, "ts": ts, "fare": 1.0}


class Run:
    """One history played on a table and on the model side by side."""

    def __init__(self, path: str, table_type: str, table_version: int, worker: Worker) -> None:
        self.path, self.worker = path, worker
        self.t = oxlake.create_table(
            path,
            SCHEMA,
            record_key="id",
            partition_by=["city"],
            ordering_field="ts",
            table_type=table_type,
            table_version=table_version,
        )
        self.build()
        self.m = Model(table_type == "merge_on_read", table_version)
        self.savepoints: set[str] = set()
        self.held: tuple[Held, str, list[Row], frozenset[str]] | None = None

    def build(self) -> None:
        """The metadata table with every index: files, column stats, bloom filters, record index."""
        self.t.build_metadata(
            files_shards=2, column_stats_shards=1, bloom_filters_shards=1, record_index_shards=2
        )

    def timeline(self) -> dict[str, oxlake.Instant]:
        return {i.time: i for i in self.t.timeline() if i.state == "completed" and i.action in DATA_ACTIONS}

    def record(self, instant: str, op: tuple[str, list[Row]] | None, reads: frozenset[str]) -> None:
        completion = self.timeline()[instant].completion or instant
        self.m.add(Entry(instant, completion, op, reads))

    def fresh_keys(self, batch: list[Row]) -> list[Row]:
        """Inserts only of keys the table does not hold (a plain insert does not look keys up)."""
        stored = self.m.state(self.m.times())
        held = {(r["city"], r["id"]) for r in self.held[2]} if self.held else set()
        return [r for r in batch if (r["city"], r["id"]) not in stored and (r["city"], r["id"]) not in held]

    def write(self, name: str, batch: list[Row]) -> None:
        if name == "insert":
            batch = self.fresh_keys(batch)
        reads = self.m.times()
        res = getattr(self.t, name)(pa.Table.from_pylist(batch, schema=SCHEMA))
        if res.instant is not None:
            self.record(res.instant, (name, batch), reads)

    def hold(self, point: str, name: str, batch: list[Row]) -> None:
        if name == "insert":
            batch = self.fresh_keys(batch)
        reads = self.m.times()
        held = self.worker.start(self.path, name, batch, point)
        self.held = (held, name, batch, reads)

    def release(self) -> None:
        if self.held is None:
            return
        held, name, batch, reads = self.held
        self.held = None
        answer = held.release()
        self.t = oxlake.Table(self.path)
        if "error" in answer:
            raise AssertionError(f"the held {name} failed: {answer['error']}")
        if "conflict" in answer:
            event("held write: conflict")
            return
        event("held write: landed")
        if answer["landed"] is None:
            return
        self.record(answer["landed"], (name, batch), reads)
        e = next(e for e in self.m.entries if e.time == answer["landed"])
        # Writes that completed beside it: none touched a key it touched.
        for other in self.m.entries:
            if (
                other.op is not None
                and other.time not in reads
                and other is not e
                and e.time not in other.reads
            ):
                both = self.m.touched(e) & self.m.touched(other)
                assert not both, f"{name} {e.time} landed beside {other.time}, both writing {both}"

    def beside_held(self, action: Callable[[], Any]) -> Any:
        """Runs a service while a write is held: one that waits for it (a compaction waits for
        the writes that began before it) gets it let go once its own instant is pending."""
        if self.held is None:
            return action()
        before = {i.time for i in self.t.timeline()}
        out: list[Any] = []

        def run() -> None:
            try:
                out.append(("ok", action()))
            except Exception as e:  # noqa: BLE001 - handed to the main thread
                out.append(("err", e))

        worker = threading.Thread(target=run)
        worker.start()
        deadline = time.monotonic() + 5
        while worker.is_alive() and time.monotonic() < deadline:
            pending = [
                i
                for i in oxlake.Table(self.path).timeline()
                if i.time not in before and i.state != "completed"
            ]
            if any(i.action in ("compaction", "replacecommit", "clustering") for i in pending):
                time.sleep(0.1)
                break
            worker.join(0.02)
        if worker.is_alive():
            event("a service waited for the held write")
            self.release()
            worker.join(120)
            assert not worker.is_alive()
        self.t = oxlake.Table(self.path)
        kind, value = out[0]
        if kind == "err":
            raise value
        return value

    def step(self, name: str, arg: Any) -> None:
        m, t = self.m, self.t
        if name in WRITES:
            self.write(name, arg)
        elif name == "burst":
            for r in arg:
                self.write("upsert", [r])
        elif name == "hold":
            point, (op, batch) = arg
            if self.held is None:
                self.hold(point, op, batch)
            else:
                self.write(op, batch)
        elif name == "release":
            self.release()
        elif name == "compact":
            if not m.merge_on_read:
                with pytest.raises(oxlake.InvalidArgumentError):
                    t.compact()
                return
            reads = m.times()
            result = self.beside_held(lambda: oxlake.Table(self.path).compact())
            for instant in result.instants:
                self.record(instant, None, reads)
        elif name == "cluster":
            reads = m.times()
            result = self.beside_held(
                lambda: oxlake.Table(self.path).cluster(sort_by=["fare"], small_file_limit=1 << 40)
            )
            if result.instant is not None:
                self.record(result.instant, None, reads)
        elif name == "rebuild":
            self.beside_held(self.build)
        elif name == "clean":
            self.beside_held(lambda: oxlake.Table(self.path).clean(policy="keep_latest_commits", retain=arg))
            by_time = [e.time for e in m.entries]
            by_completion = [e.time for e in sorted(m.entries, key=lambda e: e.completion)]
            latest = set(by_time[-arg:]) | set(by_completion[-arg:])
            for e in m.entries:
                if e.time not in latest and e.time not in self.savepoints:
                    e.kept = False
        elif name == "savepoint" and m.entries:
            entry = m.entries[arg % len(m.entries)]
            target = entry.time
            if target in self.savepoints:
                with pytest.raises(oxlake.InvalidArgumentError, match="already savepointed"):
                    t.savepoint(target)
                return
            try:
                t.savepoint(target)
            except oxlake.InvalidArgumentError as err:
                assert not entry.kept and unreadable(err), err
                event("savepoint: no longer readable")
                return
            self.savepoints.add(target)
        elif name == "delete_savepoint" and self.savepoints:
            target = sorted(self.savepoints)[arg % len(self.savepoints)]
            t.delete_savepoint(target)
            self.savepoints.discard(target)
        elif name == "restore" and (self.savepoints or m.entries):
            which, delete_newer = arg
            if not self.savepoints:
                # None alive: one made first, on any commit.
                self.step("savepoint", which)
                if not self.savepoints:
                    return
            target = sorted(self.savepoints)[which % len(self.savepoints)]
            newer = sorted(s for s in self.savepoints if s > target)
            if newer and not delete_newer:
                with pytest.raises(oxlake.InvalidArgumentError) as refused:
                    t.restore(target)
                assert all(s in str(refused.value) for s in newer), refused.value
                event("restore refused: newer savepoints")
                return
            for s in newer:
                t.delete_savepoint(s)
                self.savepoints.discard(s)
            t.restore(target)
            m.remove_after(target)
        elif name == "rollback" and m.entries:
            latest = m.entries[-1]
            if latest.time in self.savepoints:
                with pytest.raises(oxlake.InvalidArgumentError, match="savepoint"):
                    t.rollback(latest.time)
                return
            try:
                t.rollback(latest.time)
            except oxlake.InvalidArgumentError as err:
                assert unreadable(err) and not all(e.kept for e in m.entries[:-1]), err
                event("rollback: no longer readable")
                return
            m.remove_after(m.entries[-2].time if len(m.entries) > 1 else "")
        else:
            return
        event(f"ran {name}")


DATA_ACTIONS = ("commit", "deltacommit", "replacecommit")


def play(table_type: str, table_version: int, steps: list[Step], worker: Worker) -> None:
    path = tempfile.mkdtemp()
    run = Run(path + "/t", table_type, table_version, worker)
    try:
        for i, (name, arg) in enumerate(steps):
            run.step(name, arg)
            what = (i, name)
            assert sorted(run.timeline()) == [e.time for e in run.m.entries], what
            # A write held pending leaves validate() clean too (its files are in no index).
            report = run.t.validate()
            assert report.ok, (what, report)
            check(run.t, run.m, what)
        if run.held is not None:
            run.release()
            check(run.t, run.m, "the held write let go at the end")
    finally:
        if run.held is not None:
            run.held[0].release()
        shutil.rmtree(path, ignore_errors=True)


TABLES = [
    pytest.param(table_type, version, id=f"{table_type}-v{version}")
    for version in (6, 8)
    for table_type in ("copy_on_write", "merge_on_read")
]


@pytest.mark.parametrize(("table_type", "table_version"), TABLES)
@settings(
    max_examples=EXAMPLES,
    deadline=None,
    phases=PHASES,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(steps=st.lists(step, min_size=3, max_size=10))
# A write requested before a compaction and completed after it (issue 71, defect 3): as of the
# write, all of it; as of the compaction, on version 8, its logs after the compacted base.
@example(
    steps=[
        ("insert", [r(0, "sf", 0), r(1, "nyc", 0)]),
        ("upsert", [r(0, "sf", 1), r(1, "nyc", 1)]),
        ("hold", ("before-commit", ("upsert", [r(0, "sf", 3, "w"), r(1, "nyc", 3, "w")]))),
        ("compact", 0),
        ("savepoint", 2),
        ("upsert", [r(0, "sf", 4)]),
        ("restore", (0, False)),
        ("rollback", 0),
    ]
)
# A window ends where it ends, whatever completes later (defect 4): W, held, completes after X.
@example(
    steps=[
        ("insert", [r(0, "sf", 0), r(1, "nyc", 0), r(2, "sf", 0)]),
        ("hold", ("after-plan", ("upsert", [r(1, "nyc", 9, "w")]))),
        ("upsert", [r(0, "sf", 5, "c1")]),
        ("delete", [r(2, "sf", 5)]),
        ("release", 0),
        ("savepoint", 1),
        ("savepoint", 3),
        ("restore", (0, False)),
        ("restore", (0, True)),
    ]
)
# Restores far back, past the metadata table's compactions (defect 1), several savepoints alive.
@example(
    steps=[
        ("upsert", [r(0, "sf", 0)]),
        ("savepoint", 0),
        ("burst", [r(1, "sf", 0), r(2, "nyc", 0), r(3, "sf", 0), r(4, "nyc", 0), r(5, "sf", 0)]),
        ("savepoint", 3),
        ("burst", [r(6, "sf", 0), r(7, "nyc", 0), r(8, "sf", 0), r(9, "nyc", 0), r(10, "sf", 0)]),
        ("restore", (1, False)),
        ("upsert", [r(0, "sf", 1), r(11, "nyc", 1)]),
        ("restore", (0, True)),
        ("upsert", [r(0, "sf", 2), r(1, "sf", 2)]),
    ]
)
def test_history_matches_the_model(
    table_type: str, table_version: int, steps: list[Step], worker: Worker
) -> None:
    play(table_type, table_version, steps, worker)


# -- what oxlake gets wrong (each kept as the example that found it) ------------------------


@pytest.mark.parametrize("table_version", [6, 8])
@settings(max_examples=1, deadline=None, phases=[Phase.explicit])
@given(steps=st.just([]))
@example(
    steps=[
        ("insert", [r(0, "sf", 0), r(2, "sf", 0)]),
        ("savepoint", 0),
        ("upsert", [r(2, "sf", 1, "b")]),
        ("hold", ("before-commit", ("upsert", [r(0, "sf", 3, "w")]))),
        ("restore", (0, False)),
        ("release", 0),
    ]
)
@example(
    steps=[
        ("insert", [r(0, "sf", 0), r(2, "sf", 0)]),
        ("upsert", [r(2, "sf", 1, "b")]),
        ("hold", ("before-commit", ("upsert", [r(0, "sf", 3, "w")]))),
        ("rollback", 0),
        ("release", 0),
    ]
)
def test_a_write_held_across_a_rollback_of_what_it_read(
    table_version: int, steps: list[Step], worker: Worker
) -> None:
    play("copy_on_write", table_version, steps, worker)


@pytest.mark.parametrize(("table_type", "table_version"), TABLES)
@settings(max_examples=1, deadline=None, phases=[Phase.explicit])
@given(steps=st.just([]))
@example(
    steps=[
        ("insert", [r(0, "sf", 0), r(1, "nyc", 0)]),
        ("hold", ("before-commit", ("upsert", [r(1, "nyc", 5, "w"), r(2, "nyc", 5, "w")]))),
        ("rebuild", 0),
        ("release", 0),
        ("upsert", [r(2, "nyc", 6, "x")]),
    ]
)
def test_validate_while_a_write_is_held_after_a_build(
    table_type: str, table_version: int, steps: list[Step], worker: Worker
) -> None:
    play(table_type, table_version, steps, worker)
