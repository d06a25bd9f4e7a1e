"""Model-based test: random operation sequences against an in-memory model of the table.

After every step the snapshot, every time-travel read and every incremental read between
consecutive instants equal what the model says. The second test interleaves the table services
(compaction, clustering, clean, rollback, savepoint and restore) with the writes.

Copy-on-write applies each version in turn and a delete removes the row. Merge-on-read keeps every
version of a key in its file group until compaction, deletes included: the visible version is the one
with the greatest ordering value (ties to the later), and a delete that wins hides the key - so an
update older than a delete stays hidden (event-time ordering), as Apache Hudi's readers decide.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from typing import Any

import oxlake
import pyarrow as pa
import pytest
from conftest import SCHEMA
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st

#: Examples per test (raise it for a longer run: `OXLAKE_MODEL_EXAMPLES=500 pytest tests/test_model.py`).
EXAMPLES = int(os.environ.get("OXLAKE_MODEL_EXAMPLES", "25"))
CITIES = ["sf", "nyc"]
Row = dict[str, Any]
Model = dict[tuple[str, int], Row]

ids = st.integers(min_value=0, max_value=12)
row = st.builds(
    lambda i, c, ts, fare: {"id": i, "name": f"n{i}-{ts}", "city": c, "ts": ts, "fare": fare},
    ids,
    st.sampled_from(CITIES),
    st.integers(min_value=0, max_value=5),
    st.floats(min_value=0, max_value=100, allow_nan=False),
)
op = st.tuples(
    st.sampled_from(["insert", "upsert", "delete", "insert_overwrite"]), st.lists(row, min_size=0, max_size=8)
)


def combine(batch: list[Row]) -> list[Row]:
    """Duplicates in one batch: the greatest ts wins, ties to the later row."""
    out: dict[tuple[str, int], Row] = {}
    for r in batch:
        k = (r["city"], r["id"])
        if k not in out or r["ts"] >= out[k]["ts"]:
            out[k] = r
    return list(out.values())


def apply(model: Model, name: str, batch: list[Row]) -> tuple[Model, set[tuple[str, int]]]:
    """The model after the operation, and the keys the operation (re)wrote: a winning upsert
    rewrites its record with the new commit time even when the values are the same."""
    new = dict(model)
    written: set[tuple[str, int]] = set()
    batch = combine(batch)
    if name == "insert_overwrite":
        for city in {r["city"] for r in batch}:
            for k in [k for k in new if k[0] == city]:
                del new[k]
        for r in batch:
            new[(r["city"], r["id"])] = r
            written.add((r["city"], r["id"]))
    elif name == "delete":
        for r in batch:
            k = (r["city"], r["id"])
            if k in new and r["ts"] >= new[k]["ts"]:
                del new[k]
    else:
        for r in batch:
            k = (r["city"], r["id"])
            if name == "insert" or k not in new or r["ts"] >= new[k]["ts"]:
                new[k] = r
                written.add(k)
    return new, written


class MorModel:
    """Merge-on-read: every version of every key (None for a delete), in commit order."""

    def __init__(self) -> None:
        self.versions: dict[tuple[str, int], list[tuple[int, Row | None]]] = {}

    def visible(self) -> Model:
        out: Model = {}
        for k, vs in self.versions.items():
            best: tuple[int, Row | None] | None = None
            for v in vs:
                if best is None or v[0] >= best[0]:
                    best = v
            if best is not None and best[1] is not None:
                out[k] = best[1]
        return out

    def collapse(self) -> None:
        """Compaction and clustering rewrite each key's visible version alone; tombstones go."""
        visible = self.visible()
        self.versions = {k: [(r["ts"], r)] for k, r in visible.items()}

    def copy(self) -> MorModel:
        out = MorModel()
        out.versions = {k: list(v) for k, v in self.versions.items()}
        return out

    def apply(self, name: str, batch: list[Row]) -> set[tuple[str, int]]:
        batch = combine(batch)
        written: set[tuple[str, int]] = set()
        if name == "insert_overwrite":
            for city in {r["city"] for r in batch}:
                for k in [k for k in self.versions if k[0] == city]:
                    del self.versions[k]
        for r in batch:
            k = (r["city"], r["id"])
            if name == "delete":
                if k in self.versions:  # a key no file group holds is not looked up
                    self.versions[k].append((r["ts"], None))
                continue
            self.versions.setdefault(k, []).append((r["ts"], r))
        after = self.visible()
        for r in batch:
            k = (r["city"], r["id"])
            if name != "delete" and after.get(k) is r:
                written.add(k)
        return written


def as_set(rows: list[Row]) -> list[tuple]:
    return sorted((r["city"], r["id"], r["name"], r["ts"], r["fare"]) for r in rows)


def read(t: oxlake.Table, **kw: Any) -> list[tuple]:
    table = t.to_arrow(**kw)
    return as_set(table.select(SCHEMA.names).to_pylist())


def window_holds(window: list[tuple], changed: list[Row], after: list[Row], meta_fields: bool) -> None:
    """An incremental window holds the rows its instants changed. A table without meta fields
    keeps no commit time per row: its window admits whole files of those instants, so it holds
    the changed rows and maybe other rows of those files, each as it was at the window's end."""
    if meta_fields:
        assert window == as_set(changed)
    else:
        assert set(as_set(changed)) <= set(window) <= set(as_set(after)), (window, changed)


def window_bounds(t: oxlake.Table) -> dict[str, str]:
    """What an incremental window of each completed instant is bounded by: its requested time on
    a version 6 table, its completion time on versions 8 and 9."""
    return {i.time: i.completion or i.time for i in t.timeline() if i.state == "completed"}


#: Tables with meta fields, and without (Apache Hudi's virtual keys: keys made from the fields).
META_FIELDS = pytest.mark.parametrize("meta_fields", [True, False], ids=["meta", "virtual-keys"])


@pytest.mark.parametrize("table_version", [6, 8])
@pytest.mark.parametrize("table_type", ["copy_on_write", "merge_on_read"])
@META_FIELDS
@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(op, min_size=1, max_size=6))
def test_operations_match_the_model(
    table_type: str, table_version: int, meta_fields: bool, ops: list[tuple[str, list[Row]]]
) -> None:
    path = tempfile.mkdtemp()
    try:
        t = oxlake.create_table(
            path + "/t",
            SCHEMA,
            record_key="id",
            partition_by=["city"],
            ordering_field="ts",
            table_type=table_type,
            table_version=table_version,
            meta_fields=meta_fields,
        )
        model: Model = {}
        mor = MorModel() if table_type == "merge_on_read" else None
        history: list[tuple[str, set[tuple[str, int]], Model]] = []  # (instant, keys written, model after)
        for name, batch in ops:
            data = pa.Table.from_pylist(batch, schema=SCHEMA)
            if name == "insert":
                # Plain inserts of existing keys would duplicate them (as in Apache Hudi); the model
                # keeps one row per key, so only new keys are inserted.
                stored = mor.versions if mor is not None else model
                data = pa.Table.from_pylist(
                    [r for r in batch if (r["city"], r["id"]) not in stored], schema=SCHEMA
                )
                batch = data.to_pylist()
            res = getattr(t, name)(data)
            if mor is not None:
                written = mor.apply(name, batch)
                after = mor.visible()
            else:
                after, written = apply(model, name, batch)
            if res.instant is not None:
                history.append((res.instant, written, after))
            model = after
            assert read(t) == as_set(list(model.values()))
        for instant, _, after in history:
            assert read(t, as_of=instant) == as_set(list(after.values()))
        bound = window_bounds(t)
        for i, (instant, written, after) in enumerate(history):
            start = bound[history[i - 1][0]] if i else None
            changed = [after[k] for k in written]
            window = read(t, query="incremental", start=start, end=bound[instant])
            window_holds(window, changed, list(after.values()), meta_fields)
    finally:
        shutil.rmtree(path, ignore_errors=True)


service = st.one_of(
    op,
    st.tuples(
        st.sampled_from(["compact", "cluster", "rollback", "savepoint", "restore", "rebuild"]), st.just([])
    ),
    st.tuples(st.just("clean"), st.integers(min_value=1, max_value=3)),
)


class Entry:
    """A completed data instant: its operation (a write and its rows, or None for a compaction or
    clustering, which rewrites each key's visible version alone), the keys it wrote and the model
    after it."""

    def __init__(self, instant: str, op: tuple[str, list[Row]] | None) -> None:
        self.instant, self.op = instant, op
        self.written: set[tuple[str, int]] = set()
        self.model: Model = {}
        self.mor: MorModel | None = None
        self.kept = True  # False once a clean may have removed what reading as of it needs


class History:
    """The completed data instants in timeline order, each with the model after it.

    A compaction rolled back keeps its plan and runs again at its own time, older than writes
    made meanwhile: it takes its place among them, and the models after it are computed again (its
    plan names the slices as they were at its time, so it rewrites what was written before it)."""

    def __init__(self, merge_on_read: bool) -> None:
        self.merge_on_read = merge_on_read
        self.entries: list[Entry] = []

    def state(self, upto: int) -> tuple[Model, MorModel | None]:
        """The model after the first `upto` entries."""
        if upto == 0:
            return {}, MorModel() if self.merge_on_read else None
        e = self.entries[upto - 1]
        return dict(e.model), e.mor.copy() if e.mor is not None else None

    def record(self, instant: str, op: tuple[str, list[Row]] | None) -> None:
        at = sum(1 for e in self.entries if e.instant < instant)
        self.entries.insert(at, Entry(instant, op))
        model, mor = self.state(at)
        for e in self.entries[at:]:
            if e.op is None:
                if mor is not None:
                    mor.collapse()
                e.written = set()
            elif mor is not None:
                e.written = mor.apply(*e.op)
                model = mor.visible()
            else:
                model, e.written = apply(model, *e.op)
            e.model, e.mor = dict(model), mor.copy() if mor is not None else None

    def back_to(self, index: int) -> None:
        """Keeps the entries up to `index` (none for -1)."""
        del self.entries[index + 1 :]


@pytest.mark.parametrize("table_version", [6, 8])
@pytest.mark.parametrize("table_type", ["copy_on_write", "merge_on_read"])
@pytest.mark.parametrize("metadata", [False, True], ids=["listing", "metadata-table"])
@META_FIELDS
@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(service, min_size=1, max_size=10))
# A compaction rolled back runs again at its time, older than a write made meanwhile.
@example(
    [
        ("insert", [{"id": 0, "name": "a", "city": "sf", "ts": 0, "fare": 1.0}]),
        ("upsert", [{"id": 0, "name": "b", "city": "sf", "ts": 1, "fare": 1.0}]),
        ("compact", []),
        ("rollback", []),
        ("insert", [{"id": 1, "name": "c", "city": "nyc", "ts": 0, "fare": 1.0}]),
        ("compact", []),
        ("upsert", [{"id": 0, "name": "d", "city": "sf", "ts": 2, "fare": 1.0}]),
        ("rollback", []),
        ("compact", []),
        ("cluster", []),
    ]
)
# The record index built again keeps the key of an event-time delete, as the one kept in step
# does: the later upsert with a lower ordering value goes to the same file group and stays hidden.
@example(
    [
        ("insert", [{"id": 0, "name": "a", "city": "sf", "ts": 0, "fare": 1.0}]),
        ("delete", [{"id": 0, "name": "a", "city": "sf", "ts": 5, "fare": 1.0}]),
        ("rebuild", []),
        ("upsert", [{"id": 0, "name": "b", "city": "sf", "ts": 2, "fare": 1.0}]),
    ]
)
def test_services_interleaved_with_writes(
    table_type: str, table_version: int, metadata: bool, meta_fields: bool, ops: list[tuple[str, Any]]
) -> None:
    """With `metadata`, the metadata table is built first and kept in step (and built again by
    `rebuild`): after every step it equals a full listing (and planning reads it instead of
    listing)."""
    path = tempfile.mkdtemp()
    try:
        t = oxlake.create_table(
            path + "/t",
            SCHEMA,
            record_key="id",
            partition_by=["city"],
            ordering_field="ts",
            table_type=table_type,
            table_version=table_version,
            meta_fields=meta_fields,
        )
        if metadata:
            t.build_metadata(files_shards=2)
        h = History(table_type == "merge_on_read")
        history = h.entries
        savepoints: list[str] = []

        def current() -> tuple[Model, MorModel | None]:
            return h.state(len(history))

        for name, arg in ops:
            model, mor = current()
            if name in ("insert", "upsert", "delete", "insert_overwrite"):
                batch = arg
                if name == "insert":
                    stored = mor.versions if mor is not None else model
                    batch = [r for r in batch if (r["city"], r["id"]) not in stored]
                res = getattr(t, name)(pa.Table.from_pylist(batch, schema=SCHEMA))
                if res.instant is not None:
                    h.record(res.instant, (name, batch))
            elif name == "compact":
                if mor is None:
                    with pytest.raises(oxlake.InvalidArgumentError):
                        t.compact()
                    continue
                for instant in t.compact().instants:
                    h.record(instant, None)
            elif name == "rebuild":
                if not metadata:
                    continue
                t.build_metadata(files_shards=2)
            elif name == "cluster":
                r = t.cluster(sort_by=["fare"], small_file_limit=1 << 40)
                if r.instant is not None:
                    h.record(r.instant, None)
            elif name == "clean":
                t.clean(policy="keep_latest_commits", retain=arg)
                for e in history[: max(len(history) - arg, 0)]:
                    if e.instant not in savepoints:
                        e.kept = False
            elif name == "rollback" and history:
                latest = history[-1]
                previous_kept = len(history) < 2 or history[-2].kept
                if latest.instant in savepoints:
                    with pytest.raises(oxlake.InvalidArgumentError, match="savepoint"):
                        t.rollback(latest.instant)
                    continue
                try:
                    t.rollback(latest.instant)
                except oxlake.InvalidArgumentError as e:
                    assert not previous_kept and "no longer readable" in str(e)
                    continue
                h.back_to(len(history) - 2)
            elif name == "savepoint" and history:
                if history[-1].instant in savepoints:
                    with pytest.raises(oxlake.InvalidArgumentError, match="already savepointed"):
                        t.savepoint(history[-1].instant)
                    continue
                t.savepoint(history[-1].instant)
                savepoints.append(history[-1].instant)
            elif name == "restore" and savepoints:
                target = savepoints[-1]
                t.restore(target)
                h.back_to(next(i for i, e in enumerate(history) if e.instant == target))
            event(f"ran {name}")
            model, _ = current()
            assert read(t) == as_set(list(model.values())), (name, arg)
            if metadata:
                report = t.validate()
                assert report.ok, (name, arg, report)

        assert [e.instant for e in history] == [
            i.time
            for i in t.timeline()
            if i.state == "completed" and i.action in ("commit", "deltacommit", "replacecommit")
        ]
        bound = window_bounds(t)
        # Windows follow completion times (a compaction run again completes after newer writes).
        by_completion = sorted(history, key=lambda e: bound[e.instant])
        for i, e in enumerate(by_completion):
            start = bound[by_completion[i - 1].instant] if i else None
            try:
                snapshot = read(t, as_of=e.instant)
                window = read(t, query="incremental", start=start, end=bound[e.instant])
            except oxlake.InvalidArgumentError as err:
                assert not e.kept and "no longer readable" in str(err), e.instant
                continue
            assert snapshot == as_set(list(e.model.values())), e.instant
            window_holds(window, [e.model[k] for k in e.written], list(e.model.values()), meta_fields)
    finally:
        shutil.rmtree(path, ignore_errors=True)
