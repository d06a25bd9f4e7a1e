"""Races that lost committed rows (issue 22): a rollback from another process racing a commit, two
compactions planning one slice, a wait for a writer whose heartbeat never expires, and writes that
lose a race to a table service. Each test runs the processes for real, on local disk."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import oxlake
import pyarrow as pa
import pytest
from conftest import race_past_the_intents, rows, run_paused, trips, trips_table
from oxlake.testing import faults, inject_faults
from test_concurrency import held_write

HEARTBEAT = 0.2


def kv(t: oxlake.Table) -> dict[int, str]:
    return {r["id"]: r["v"] for r in rows(t.scan())}


def kv_table(path: str, **options: object) -> oxlake.Table:
    schema = pa.schema([("id", pa.int64()), ("ts", pa.int64()), ("v", pa.string())])
    return oxlake.create_table(
        path,
        schema,
        record_key="id",
        ordering_field="ts",
        table_type="merge_on_read",
        heartbeat_interval=HEARTBEAT,
        **options,  # type: ignore[arg-type]
    )


def kv_rows(ids: list[int], ts: int, v: str) -> pa.Table:
    return pa.table(
        {
            "id": pa.array(ids, pa.int64()),
            "ts": pa.array([ts] * len(ids), pa.int64()),
            "v": [f"{v}{i}" for i in ids],
        }
    )


@pytest.mark.parametrize("table_type", ["copy_on_write", "merge_on_read"])
@pytest.mark.parametrize("resume_after", [0.3, 1.5, 3.5])
def test_a_write_that_reports_a_commit_is_never_rolled_back(
    tmp_path: Path, table_type: str, resume_after: float
) -> None:
    """A writer paused after its metadata sync (its heartbeat long expired) races a rollback by a
    process on a slow store: whichever wins, what the writer reports is what the table holds."""
    path = str(tmp_path / "t")
    t = trips_table(path, heartbeat_interval=HEARTBEAT, table_type=table_type)
    t.insert(trips(list(range(6))))
    t.build_metadata()
    pause = tmp_path / "pause"
    pause.mkdir()
    held = held_write(path, "upsert(trips([1, 4], ts=5, name='held'))", pause, "after-metadata-sync")
    time.sleep(HEARTBEAT * 5)  # the writer's heartbeat is stale: it is taken for gone
    other = oxlake.Table(path, heartbeat_interval=HEARTBEAT)
    rolled: list[list[str]] = []
    errors: list[BaseException] = []

    def roll() -> None:
        try:
            with faults("latency=1000"):
                rolled.append(other.rollback_failed())
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    worker = threading.Thread(target=roll)
    worker.start()
    time.sleep(resume_after)
    (pause / "resume").touch()
    out, err = held.communicate(timeout=120)
    worker.join(timeout=120)
    assert held.returncode == 0, err
    assert not errors, errors
    outcome, instant = out.split()[:2]
    t = oxlake.Table(path)
    names = {r["id"]: r["name"] for r in rows(t.scan())}
    completed = {i.time for i in t.timeline() if i.state == "completed"}
    if outcome == "landed":
        assert instant in completed
        assert instant not in rolled[0], "a commit the writer reported was rolled back"
        assert names[1] == "held1" and names[4] == "held4", "the committed rows are there"
    else:
        assert names[1] == "n1" and names[4] == "n4", "nothing of the rolled-back write is visible"
    assert [i for i in t.timeline() if i.state != "completed"] == []
    assert t.validate().ok


@pytest.mark.parametrize("table_type", ["copy_on_write", "merge_on_read"])
@pytest.mark.parametrize("point", ["after-plan", "before-commit"])
def test_a_write_rolled_back_while_frozen_is_a_conflict(tmp_path: Path, table_type: str, point: str) -> None:
    """A writer frozen (SIGSTOP: no heartbeat) is rolled back by another process; once thawed it
    reports a conflict, whatever it finds missing (its own files, deleted by that rollback), and
    nothing of it is visible. Seen in the stress suite as a StorageError naming its base file."""
    path = str(tmp_path / "t")
    t = trips_table(path, heartbeat_interval=HEARTBEAT, table_type=table_type)
    t.insert(trips(list(range(6))))
    t.build_metadata()
    before = rows(t.scan())
    pause = tmp_path / "pause"
    pause.mkdir()
    held = held_write(path, "upsert(trips([1, 40], ts=5, name='held'))", pause, point)
    os.kill(held.pid, signal.SIGSTOP)
    try:
        time.sleep(HEARTBEAT * 5)
        rolled = oxlake.Table(path, heartbeat_interval=HEARTBEAT).rollback_failed()
        (pause / "resume").touch()
    finally:
        os.kill(held.pid, signal.SIGCONT)
    out, err = held.communicate(timeout=120)
    assert held.returncode == 0, err
    assert len(rolled) == 1
    assert out.split()[0] == "conflict", out
    assert "rolled back by another process" in out
    t = oxlake.Table(path)
    assert rows(t.scan()) == before
    assert [i for i in t.timeline() if i.state != "completed"] == []
    assert t.validate().ok


def test_a_writer_killed_after_deciding_to_commit_is_completed_by_the_next(tmp_path: Path) -> None:
    """A kill between the fate record and the completed file: the next writer rolls the commit
    forward instead of back (every check had passed)."""
    path = str(tmp_path / "t")
    t = trips_table(path, heartbeat_interval=HEARTBEAT)
    t.insert(trips(list(range(4))))
    code = (
        "import sys, oxlake\n"
        f"sys.path.insert(0, {str(Path(__file__).parent)!r})\n"
        "from conftest import trips\n"
        f"t = oxlake.Table(sys.argv[1], heartbeat_interval={HEARTBEAT})\n"
        "t.upsert(trips([2], ts=5, name='killed'))\n"
    )
    env = {**__import__("os").environ, "OXLAKE_FAILPOINT": "after-fate"}
    proc = subprocess.run([sys.executable, "-c", code, path], env=env, capture_output=True, text=True)
    assert proc.returncode != 0, "the failpoint aborts the writer"
    time.sleep(HEARTBEAT * 5)
    t = oxlake.Table(path, heartbeat_interval=HEARTBEAT)
    assert t.rollback_failed() == [], "nothing is rolled back"
    assert {r["id"]: r["name"] for r in rows(t.scan())}[2] == "killed2"
    assert [i.action for i in t.timeline()] == ["commit", "commit"]


def compactor(path: str, latency_ms: int) -> subprocess.Popen[str]:
    code = (
        "import sys, oxlake\n"
        "from oxlake.testing import inject_faults\n"
        f"inject_faults('latency={latency_ms}')\n"
        f"t = oxlake.Table(sys.argv[1], heartbeat_interval={HEARTBEAT})\n"
        "try:\n"
        "    print('compacted', len(t.compact().instants))\n"
        "except oxlake.CommitConflictError as e:\n"
        "    print('conflict', e.instant)\n"
    )
    return subprocess.Popen(
        [sys.executable, "-c", code, path], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


@pytest.mark.parametrize("head_start", [0.8, 1.6])
def test_two_compactions_never_lose_a_write_between_them(tmp_path: Path, head_start: float) -> None:
    """The issue's reproduction: a slow compactor starts first, a fast one compacts and a write
    lands in its new slice; the slow one must not replace that slice."""
    path = str(tmp_path / "t")
    t = kv_table(path)
    t.insert(kv_rows([1, 2], 1, "v1-"))
    t.build_metadata()
    t.upsert(kv_rows([1], 2, "v2-"))
    slow = compactor(path, 400)
    time.sleep(head_start)
    t.compact()
    t.upsert(kv_rows([1], 3, "v3-"))
    assert kv(t)[1] == "v3-1"
    out, err = slow.communicate(timeout=180)
    assert slow.returncode == 0, err
    t = oxlake.Table(path)
    assert kv(t) == {1: "v3-1", 2: "v1-2"}, f"the slow compactor said {out!r}"
    assert [i for i in t.timeline() if i.state != "completed" and i.action != "compaction"] == []
    assert t.validate().ok
    # Whatever is left pending compacts cleanly, and the rows stay.
    t.compact()
    assert kv(t) == {1: "v3-1", 2: "v1-2"}
    assert {r["id"]: r["v"] for r in rows(t.to_arrow(query="read_optimized"))} == {1: "v3-1", 2: "v1-2"}


def test_three_compactors_and_a_writer_keep_every_row(tmp_path: Path) -> None:
    path = str(tmp_path / "t")
    t = kv_table(path, partition_by=None)
    t.insert(kv_rows(list(range(20)), 1, "a"))
    t.build_metadata()
    expected = {i: f"a{i}" for i in range(20)}
    procs = [compactor(path, lat) for lat in (0, 150, 300)]
    for round_ in range(6):
        ids = list(range(round_, 20, 3))
        t.upsert(kv_rows(ids, round_ + 2, f"r{round_}-"), conflict_retries=5)
        expected.update({i: f"r{round_}-{i}" for i in ids})
        if round_ % 2:
            procs.append(compactor(path, 100))
    for p in procs:
        _, err = p.communicate(timeout=180)
        assert p.returncode == 0, err
    t = oxlake.Table(path)
    assert kv(t) == expected
    t.compact()
    assert kv(t) == expected
    assert t.validate().ok


def test_a_compaction_waiting_for_a_heartbeat_that_never_expires_gives_up(tmp_path: Path) -> None:
    """A pending write whose heartbeat holds a time in the future (clock skew, damage): the
    compaction says what it waits for and fails with a typed error instead of hanging."""
    path = str(tmp_path / "t")
    t = kv_table(path)
    t.insert(kv_rows([1], 1, "a"))
    t.upsert(kv_rows([1], 2, "b"))
    # A write that began and stopped: its requested and inflight files, a heartbeat far ahead.
    hoodie = Path(path) / ".hoodie"
    stuck = "20260101000000000"
    last = max(i.time for i in t.timeline())
    stuck = str(int(last) + 1)
    layout2 = (hoodie / "timeline").is_dir()
    timeline = hoodie / "timeline" if layout2 else hoodie
    (timeline / f"{stuck}.deltacommit.requested").write_text("")
    (timeline / f"{stuck}.deltacommit.inflight").write_text("" if layout2 else "{}")
    (hoodie / ".heartbeat").mkdir(exist_ok=True)
    future_ms = int((time.time() + 10 * 365 * 86400) * 1000)
    (hoodie / ".heartbeat" / stuck).write_text(str(future_ms))
    started = time.monotonic()
    with pytest.raises(oxlake.CommitConflictError) as e:
        oxlake.Table(path, heartbeat_interval=HEARTBEAT).compact()
    assert e.value.instant == stuck
    assert "heartbeat" in str(e.value) and stuck in str(e.value)
    assert time.monotonic() - started < 120
    assert kv(oxlake.Table(path)) == {1: "b1"}


def test_a_write_that_loses_a_race_to_a_clean_is_a_conflict_and_is_retried(tmp_path: Path) -> None:
    """A copy-on-write upsert planned against a base file that a clean removes before the write
    reads it: a conflict (retried by `conflict_retries`, then it lands), never a storage error."""
    path = str(tmp_path / "t")
    t = trips_table(path, heartbeat_interval=HEARTBEAT)
    t.insert(trips(list(range(6)), city="sf"))
    pause = tmp_path / "pause"
    pause.mkdir()
    code = (
        "import sys, oxlake\n"
        f"sys.path.insert(0, {str(Path(__file__).parent)!r})\n"
        "from conftest import trips\n"
        f"t = oxlake.Table(sys.argv[1], heartbeat_interval={HEARTBEAT})\n"
        "rows = trips([1], ts=9, city='sf', name='late')\n"
        "try:\n"
        "    print('landed', t.upsert(rows, conflict_retries=3).instant)\n"
        "except oxlake.CommitConflictError as e:\n"
        "    print('conflict', e.instant)\n"
    )
    with_log = {**os.environ, "OXLAKE_LOG": "info"}
    held = run_paused(path, "after-plan", code, pause, env=with_log)
    # The held write planned against the first base file; two rewrites and a clean remove it.
    t.upsert(trips([2], ts=5, city="sf", name="b"))
    t.upsert(trips([3], ts=5, city="sf", name="c"))
    assert t.clean(retain=1), "the clean removed the base file the held write planned against"
    (pause / "resume").touch()
    out, err = held.communicate(timeout=120)
    assert held.returncode == 0, err
    assert "StorageError" not in err
    assert out.split()[0] == "landed", (out, err)
    assert "lost a conflict" in err and "removed or replaced" in err, err
    got = {r["id"]: r["name"] for r in rows(oxlake.Table(path).scan())}
    assert got == {0: "n0", 1: "late1", 2: "b2", 3: "c3", 4: "n4", 5: "n5"}


def test_fate_records_are_not_left_for_instants_nobody_decided(tmp_path: Path) -> None:
    """Every commit records its fate once; the records are small and name the action."""
    path = str(tmp_path / "t")
    t = kv_table(path)
    t.insert(kv_rows([1], 1, "a"))
    done = [i.time for i in t.timeline()]
    fate = Path(path) / ".hoodie" / "oxlake" / "fate" / done[0]
    # The action, then (timeline layout 2) the completion time taken with the commit; then the
    # commit metadata, JSON on layout 1 and Avro on layout 2.
    head, meta = fate.read_bytes().split(b"\n", 1)
    assert head.split(b" ")[:2] == [b"commit", b"deltacommit"]
    if t.timeline()[0].completion is None:
        json.loads(meta)
    else:
        assert meta.startswith(b"Obj\x01")
        assert head.split(b" ")[2].decode() == t.timeline()[0].completion
    inject_faults("")


def test_an_overlapping_write_completing_while_the_intents_are_listed_is_a_conflict(
    table_path: str, tmp_path: Path
) -> None:
    """Found by the stress suite: writer B reloaded the timeline (A pending), then A completed and
    withdrew its intent, then B listed the intents (none): both upserts of one new key landed, and
    the key was in the table twice. B's check reads the timeline again after the intents."""
    t = trips_table(table_path)
    t.insert(trips([1, 2, 3]))
    code = (
        "import sys, oxlake; from conftest import trips; "
        "oxlake.Table(sys.argv[1]).upsert(trips([100], name='{w}'))"
    )
    returncode, err = race_past_the_intents(table_path, tmp_path, code.format(w="a"), code.format(w="b"))
    assert returncode != 0 and "CommitConflictError" in err, err
    t = oxlake.Table(table_path)
    got = [r for r in rows(t.scan(with_meta_columns=False)) if r["id"] == 100]
    assert [r["name"] for r in got] == ["a100"]
