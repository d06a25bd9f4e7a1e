"""The change stream: `scan(query="changes", start, end)`.

Its law: applying the changes of `(a, b]` to the snapshot at `a` gives the snapshot at `b`, for any
two instants and any history of writes and table services. A property test checks it on random
histories of both table types, for the whole query and for the splits workers read it in.
"""

from __future__ import annotations

import json
import os
import pickle
import random
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import oxlake
import pyarrow as pa
import pytest
from conftest import SCHEMA, checkpoint, trips
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

TABLE_TYPES = ["copy_on_write", "merge_on_read"]


def create(path: str, table_type: str, partitioned: bool = True) -> oxlake.Table:
    return oxlake.create_table(
        path,
        SCHEMA,
        record_key="id",
        partition_by=["city"] if partitioned else None,
        ordering_field="ts",
        table_type=table_type,
    )


def state(data: pa.Table) -> dict[int, tuple[Any, ...]]:
    """id -> data columns of a snapshot."""
    return {r["id"]: (r["name"], r["city"], r["ts"], r["fare"]) for r in data.to_pylist()}


def apply(before: dict[int, tuple[Any, ...]], changes: pa.Table) -> dict[int, tuple[Any, ...]]:
    """`before` with `changes` applied, each key changed at most once."""
    ids = changes["id"].to_pylist()
    assert len(ids) == len(set(ids)), "a key changed twice"
    out = dict(before)
    for r in changes.to_pylist():
        if r["_change_type"] == "delete":
            assert r["id"] in out, f"delete of absent key {r['id']}"
            del out[r["id"]]
        else:
            assert (r["id"] in out) == (r["_change_type"] == "update"), r
            out[r["id"]] = (r["name"], r["city"], r["ts"], r["fare"])
    return out


@pytest.mark.parametrize("table_type", TABLE_TYPES)
def test_inserts_updates_and_deletes(table_path: str, table_type: str) -> None:
    t = create(table_path, table_type)
    a = t.insert(trips(list(range(10))))
    b = t.upsert(trips([1, 2, 20], ts=2, name="b"))
    t.delete(trips([3, 20]).select(["id", "city"]))
    c = t.upsert(trips([4, 21], ts=3, name="c"))

    out = t.to_arrow(query="changes", start=checkpoint(a), end=checkpoint(c))
    assert out.schema.names == [*t.schema.names, "_change_type"]
    got = {r["id"]: r for r in out.to_pylist()}
    # 20 was inserted and deleted inside the window: no net change.
    assert {k: r["_change_type"] for k, r in got.items()} == {
        1: "update",
        2: "update",
        3: "delete",
        4: "update",
        21: "insert",
    }
    assert got[1]["name"] == "b1" and got[1]["_hoodie_commit_time"] == b.instant
    assert got[21]["name"] == "c21" and got[21]["_hoodie_commit_time"] == c.instant
    # A deleted row carries its key and partition, nothing else.
    gone = got[3]
    assert (gone["_hoodie_record_key"], gone["_hoodie_partition_path"], gone["city"]) == (
        "3",
        "city=sf",
        "sf",
    )
    assert gone["name"] is None and gone["ts"] is None and gone["_hoodie_commit_time"] is None

    # From the beginning of time every live row is an insert.
    first = t.to_arrow(query="changes", end=checkpoint(a))
    assert sorted(first.column("_change_type").to_pylist()) == ["insert"] * 10
    # Untouched rows never appear; an empty window is empty.
    assert t.to_arrow(query="changes", start=checkpoint(c)).num_rows == 0
    assert t.to_arrow(query="changes", start=checkpoint(b), end=checkpoint(b)).num_rows == 0


@pytest.mark.parametrize("table_type", TABLE_TYPES)
def test_columns_filters_and_planned_files(table_path: str, table_type: str) -> None:
    t = create(table_path, table_type)
    a = t.insert(trips(list(range(9))))
    t.upsert(trips([1, 2], ts=2, name="u"))
    t.delete(trips([4]).select(["id", "city"]))
    out = t.to_arrow(query="changes", start=checkpoint(a), columns=["id", "_change_type"])
    assert sorted(out.to_pylist(), key=lambda r: r["id"]) == [
        {"id": 1, "_change_type": "update"},
        {"id": 2, "_change_type": "update"},
        {"id": 4, "_change_type": "delete"},
    ]
    # Partition filters hold for deletes too (their partition columns are kept).
    nyc = t.to_arrow(query="changes", start=checkpoint(a), filter=[("city", "=", "nyc")])
    assert sorted(nyc.column("id").to_pylist()) == [1, 4]
    deletes = t.to_arrow(query="changes", start=checkpoint(a), filter="_change_type = 'delete'")
    assert deletes.column("id").to_pylist() == [4]
    # Only the file groups the window touched are planned (sf holds none of 1, 2, 4).
    planned = t.planned_files(query="changes", start=checkpoint(a))
    assert planned and all("city=sf" not in p for p in planned)


def test_compaction_and_clustering_change_nothing(table_path: str) -> None:
    t = create(table_path, "merge_on_read")
    a = t.insert(trips(list(range(12))))
    t.upsert(trips([1, 5], ts=2, name="u"))
    compacted = t.compact()
    assert compacted.instants
    out = t.to_arrow(query="changes", start=checkpoint(a))
    assert sorted(out.column("id").to_pylist()) == [1, 5]
    assert t.to_arrow(query="changes", start=compacted.instants[0]).num_rows == 0


def test_bad_arguments(table_path: str) -> None:
    t = create(table_path, "copy_on_write")
    assert t.to_arrow(query="changes").num_rows == 0  # an empty table has no change
    a = t.insert(trips([1]))
    with pytest.raises(oxlake.InvalidArgumentError, match="as_of"):
        t.to_arrow(query="changes", as_of=a.instant)
    with pytest.raises(oxlake.InvalidArgumentError, match="before start"):
        t.to_arrow(query="changes", start=checkpoint(a), end="20000101000000000")


def data_instants(t: oxlake.Table) -> list[str]:
    return [i.time for i in t.timeline() if i.state == "completed" and i.action in DATA_ACTIONS]


DATA_ACTIONS = {"commit", "deltacommit", "replacecommit"}

ops = st.lists(
    st.tuples(
        st.sampled_from(["upsert", "insert", "delete", "compact", "rollback", "cluster", "overwrite"]),
        st.lists(st.integers(0, 14), min_size=1, max_size=6, unique=True),
        st.integers(1, 4),
    ),
    min_size=2,
    max_size=7,
)


@pytest.mark.parametrize("table_type", TABLE_TYPES)
@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(history=ops)
def test_changes_turn_one_snapshot_into_another(
    tmp_path_factory: Any, table_type: str, history: list
) -> None:
    t = create(str(tmp_path_factory.mktemp("chg") / "t"), table_type)
    for op, ids, ts in history:
        if op == "upsert":
            t.upsert(trips(ids, ts=ts, name=f"u{ts}-"))
        elif op == "insert":
            live = set(state(t.to_arrow()))
            fresh = [i for i in ids if i not in live]
            if fresh:
                # A file group per row: clusterings and overwrites then move keys between groups.
                t.insert(trips(fresh, ts=ts), target_file_size=1)
        elif op == "delete":
            t.delete(trips(ids).select(["id", "city"]))
        elif op == "compact" and table_type == "merge_on_read":
            t.compact()
        elif op == "rollback" and len(data_instants(t)) > 1:
            t.rollback(data_instants(t)[-1])
        elif op == "cluster":
            t.cluster(small_file_limit=1 << 30)
        elif op == "overwrite":
            t.insert_overwrite(trips(ids, ts=ts, name=f"o{ts}-"))
    instants = data_instants(t)
    snapshots = {i: state(t.to_arrow(as_of=i)) for i in instants}
    # Windows bound completion times on versions 8 and 9; snapshots take requested times.
    bound = {i.time: i.completion or i.time for i in t.timeline() if i.time in snapshots}
    pairs = [(None, i) for i in instants] + [(a, b) for k, a in enumerate(instants) for b in instants[k:]]
    for a, b in pairs:
        before = snapshots[a] if a else {}
        assert (
            apply(before, t.to_arrow(query="changes", start=a and bound[a], end=bound[b])) == snapshots[b]
        ), (a, b)
    # Split as finely as planning allows (a file group a split), the changes read by workers
    # are the same: a key that a clustering, an overwrite or a delete and a reinsert moved
    # between groups is not a delete in one split and an insert in another.
    for a in [None, *instants[:-1]] if instants else []:
        b = instants[-1]
        splits = t.splits(query="changes", start=a and bound[a], end=bound[b], target_bytes=1)
        parts = pa.concat_tables([t.scan_split(s).to_arrow() for s in splits])
        assert apply(snapshots[a] if a else {}, parts) == snapshots[b], (a, b)


def test_a_change_of_keys_everywhere_in_a_large_table_stays_within_memory(table_path: str) -> None:
    """A random change touches every file group, so both snapshots of the whole table are
    compared: past half of `memory_limit` in files they are sorted by key (spilling) and merged,
    where a hash table of one side failed with `Resources exhausted`. Same rows either way."""
    n = 2_000_000
    t = create(table_path, "copy_on_write")
    a = t.insert(trips(list(range(n))))
    rng = random.Random(3)
    updated, deleted = rng.sample(range(n), 20_000), rng.sample(range(n), 2_000)
    t.upsert(trips(updated, ts=2, name="u"))
    t.delete(trips(deleted).select(["id", "city"]))
    c = t.upsert(trips(list(range(n, n + 1_000)), ts=3, name="c"))
    # The default limit (1 GiB) holds a hash table of these files; 150 MB does not (the build
    # before the sort join failed here), and the files pass half of it: the sort join runs.
    files = [f for f in Path(table_path).rglob("*") if f.is_file() and ".hoodie" not in f.parts]
    assert sum(f.stat().st_size for f in files) >= 75_000_000
    window = {"query": "changes", "start": checkpoint(a), "end": checkpoint(c)}
    by_hash = t.to_arrow(**window).sort_by("_hoodie_record_key")
    by_sort = t.to_arrow(**window, memory_limit=150_000_000).sort_by("_hoodie_record_key")
    expected = {k: "update" for k in set(updated) - set(deleted)}
    expected |= {k: "delete" for k in deleted} | {k: "insert" for k in range(n, n + 1_000)}
    assert by_sort.equals(by_hash)
    assert by_sort.num_rows == len(expected)
    rows = {r["id"]: r for r in by_sort.to_pylist()}
    assert {k: r["_change_type"] for k, r in rows.items()} == expected
    some_update = next(k for k, kind in expected.items() if kind == "update")
    assert (rows[some_update]["name"], rows[some_update]["ts"]) == (f"u{some_update}", 2)
    assert rows[deleted[0]]["name"] is None and rows[deleted[0]]["ts"] is None
    assert (rows[n]["name"], rows[n]["ts"]) == (f"c{n}", 3)


@pytest.mark.parametrize("table_type", TABLE_TYPES)
def test_a_change_of_one_large_file_group_is_read_in_parts(table_path: str, table_type: str) -> None:
    """A change query of a table of one large file group, read by more workers than it has
    groups: where only logs were written in the window (merge-on-read), both snapshots read the
    same base file, so the group is cut by rows, both sides alike; the parts' changes are the
    whole query's. A copy-on-write group, rewritten in the window, stays whole."""
    n = 60_000
    t = create(table_path, table_type, partitioned=False)
    a = t.insert(trips(list(range(n))))
    rng = random.Random(5)
    t.upsert(trips(rng.sample(range(n), 300), ts=2, name="u"))
    t.delete(trips(rng.sample(range(n), 200)).select(["id", "city"]))
    # A version that loses to the base (an older ordering value) is no change.
    t.upsert(trips(rng.sample(range(n), 100), ts=0, name="old"))
    window = {"query": "changes", "start": checkpoint(a)}
    whole = t.to_arrow(**window)
    assert 0 < whole.num_rows < 600
    splits = t.splits(**window, min_splits=3)
    assert len(splits) == (3 if table_type == "merge_on_read" else 1)
    parts = pa.concat_tables([t.scan_split(s).to_arrow() for s in splits])
    key = [("_hoodie_record_key", "ascending")]
    assert parts.sort_by(key).equals(whole.sort_by(key))
    before = state(t.to_arrow(as_of=a.instant))
    assert apply(before, parts) == state(t.to_arrow())


def keyed_groups(t: oxlake.Table, start: str) -> dict[str, tuple[bool, ...]]:
    """For each file group of the change query from `start`, whether each of its slices (the
    snapshot at `start` and the latest) is read by its logs' keys (the plan's `keys_of`)."""
    keyed: dict[str, tuple[bool, ...]] = {}
    for split in t.splits(query="changes", start=start):
        plan = json.loads(split.data)["Changes"]
        for side in ("before", "after"):
            for s in plan[side]["slices"]:
                keyed[s["file_id"]] = (*keyed.get(s["file_id"], ()), s.get("keys_of") is not None)
    return keyed


def test_a_group_whose_base_the_window_kept_is_read_by_its_logs_keys(table_path: str) -> None:
    """Where only logs were written into a file group in the window, both of its snapshots are
    read by the keys those logs hold (its other base rows cannot differ): a 1% change of a
    large group reads that 1% of its base file. The changes obey the law with a losing update,
    deletes, a rolled-back write and a restore inside the window; once a compaction gives the
    group a new base file, it is read whole."""
    n = 50_000
    t = create(table_path, "merge_on_read", partitioned=False)
    a = t.insert(trips(list(range(n))))
    [large] = [g.file_id for g in t.file_groups()]
    rng = random.Random(8)
    b = t.upsert(trips(rng.sample(range(n), 300), ts=2, name="u"))
    t.savepoint(b.instant)
    t.delete(trips(rng.sample(range(n), 200)).select(["id", "city"]))
    t.upsert(trips(rng.sample(range(n), 100), ts=0, name="old"))  # loses to the base: no change
    c = t.upsert(trips(rng.sample(range(n), 50) + [n + 1], ts=3, name="gone"))
    t.rollback(c.instant)
    t.upsert(trips(rng.sample(range(n), 40) + [n + 2], ts=4, name="kept"))

    def law(start: oxlake.WriteResult) -> None:
        changes = t.to_arrow(query="changes", start=checkpoint(start))
        assert apply(state(t.to_arrow(as_of=start.instant)), changes) == state(t.to_arrow())
        assert not {"gone"} & {(x or "")[:4] for x in changes["name"].to_pylist()}

    keyed = keyed_groups(t, checkpoint(a))
    assert keyed.pop(large) == (True, True)
    assert set(keyed.values()) == {(False,)}  # the new keys' group, at the end only: read whole
    law(a)
    law(b)
    t.restore(b.instant)
    assert keyed_groups(t, checkpoint(a)) == {large: (True, True)}
    law(a)
    t.upsert(trips([5, n + 3], ts=5, name="late"))
    t.compact()
    assert keyed_groups(t, checkpoint(a))[large] == (False, False)  # a new base file in the window
    law(a)
    law(b)


def killed_upsert(table_path: str, ids: list[int], city: str | None = None) -> None:
    """An upsert of `ids` killed before it commits: its log file stays, listed, until a rollback."""
    writer = (
        f"import sys; sys.path.insert(0, {str(Path(__file__).parent)!r}); import oxlake; "
        "from conftest import trips; "
        f"oxlake.Table({table_path!r}, heartbeat_interval=0.2)"
        f".upsert(trips({ids!r}, ts=5, name='killed', city={city!r}))"
    )
    env = dict(os.environ, OXLAKE_FAILPOINT="before-commit")
    assert subprocess.run([sys.executable, "-c", writer], env=env, capture_output=True).returncode != 0


def roll_back_the_killed_write(t: oxlake.Table) -> None:
    """Rolls the killed write back once its heartbeat (0.2 s) has expired."""
    deadline = time.monotonic() + 30
    while not (rolled := t.rollback_failed()):
        assert time.monotonic() < deadline, "the killed writer's heartbeat never expired"
        time.sleep(0.1)
    assert len(rolled) == 1


def log_files(table_path: str) -> set[Path]:
    return {f for f in Path(table_path).rglob("*.log.*") if ".hoodie" not in f.parts}


def mor_with_a_killed_write(table_path: str, **options: Any) -> oxlake.Table:
    return oxlake.create_table(
        table_path,
        SCHEMA,
        record_key="id",
        ordering_field="ts",
        table_type="merge_on_read",
        metadata=False,  # files listed from storage: the killed write's log is among them
        heartbeat_interval=0.2,
        **options,
    )


def test_splits_read_by_logs_keys_survive_a_rollback_deleting_a_listed_log(table_path: str) -> None:
    """Splits planned while a killed writer's log file is listed, read after its rollback deleted
    that file: the keys of the group's logs are read without it (no completed instant wrote it),
    and the changes are the window's."""
    t = mor_with_a_killed_write(table_path)
    a = t.insert(trips(list(range(10))))
    b = t.upsert(trips([1, 2], ts=2, name="b"))
    killed_upsert(table_path, [3, 4])
    splits = t.splits(query="changes", start=checkpoint(a), end=checkpoint(b), target_bytes=1)
    assert set(keyed_groups(t, checkpoint(a)).values()) == {(True, True)}
    roll_back_the_killed_write(t)
    changes = pa.concat_tables([t.scan_split(s).to_arrow() for s in splits])
    assert sorted(zip(changes["id"].to_pylist(), changes["name"].to_pylist(), strict=True)) == [
        (1, "b1"),
        (2, "b2"),
    ]


def test_both_sides_read_the_same_keys_when_a_rollback_deletes_a_log_between_them(
    table_path: str, tmp_path: Path
) -> None:
    """A rollback deleting a killed writer's log file after one side of a keyed group has read its
    keys and before the other has: both sides take the keys of what completed by the end, so
    they read the same base rows. (When each took every block of the files as it found them,
    one side read rows 3 and 4 and the other did not, and the query reported them changed.)"""
    t = mor_with_a_killed_write(table_path)
    a = t.insert(trips(list(range(10))))
    b = t.upsert(trips([1, 2], ts=2, name="b"))
    killed_upsert(table_path, [3, 4])
    assert set(keyed_groups(t, checkpoint(a)).values()) == {(True, True)}
    (tmp_path / "splits").write_bytes(
        pickle.dumps(t.splits(query="changes", start=checkpoint(a), end=checkpoint(b)))
    )
    pause = tmp_path / "pause"
    pause.mkdir()
    reader = (
        "import pickle, oxlake; "
        f"t = oxlake.Table({table_path!r}); "
        f"splits = pickle.loads(open({str(tmp_path / 'splits')!r}, 'rb').read()); "
        "print(sorted((r['id'], r['name'], r['_change_type']) "
        "for s in splits for r in t.scan_split(s).to_arrow().to_pylist()))"
    )
    env = dict(os.environ, OXLAKE_PAUSEPOINT="read-after-logged-keys", OXLAKE_PAUSE_DIR=str(pause))
    proc = subprocess.Popen(
        [sys.executable, "-c", reader], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        deadline = time.monotonic() + 60
        while not (pause / "reached").exists():
            assert proc.poll() is None and time.monotonic() < deadline, "the reader never read a group's keys"
            time.sleep(0.02)
        listed = log_files(table_path)
        roll_back_the_killed_write(t)
        assert len(log_files(table_path)) == len(listed) - 1  # the killed write's log is gone
    finally:
        (pause / "resume").touch()
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    assert out.strip() == str([(1, "b1", "update"), (2, "b2", "update")])


@pytest.mark.parametrize("table_type", TABLE_TYPES)
def test_an_update_in_the_default_partition_carries_its_null_partition_value(
    table_path: str, table_type: str
) -> None:
    """ "" and null name the same default partition, so a key may go from one to the other in
    place: its update carries the end's null, not the start's "" (partition columns were filled
    from the start where the end's value was null). A delete still carries the start's."""
    t = create(table_path, table_type)
    a = t.insert(trips([1, 2], city=""))
    t.upsert(trips([1], ts=3, name="b").set_column(2, "city", pa.array([None], pa.string())))
    t.delete(trips([2], city="").select(["id", "city"]))
    changes = {r["id"]: r for r in t.to_arrow(query="changes", start=checkpoint(a)).to_pylist()}
    assert (changes[1]["_change_type"], changes[1]["city"], changes[1]["name"]) == ("update", None, "b1")
    assert (changes[2]["_change_type"], changes[2]["city"]) == ("delete", "")
    assert apply(
        state(t.to_arrow(as_of=a.instant)), t.to_arrow(query="changes", start=checkpoint(a))
    ) == state(t.to_arrow())


@pytest.mark.parametrize("table_type", TABLE_TYPES)
@pytest.mark.parametrize("removal", ["delete", "overwrite_table"])
def test_a_key_back_in_another_file_group_is_one_update_in_splits(
    table_path: str, table_type: str, removal: str
) -> None:
    """A key deleted (or overwritten away) and inserted again inside the window lands in another
    file group: the whole query calls it an update, and so must the splits (split apart, the
    groups gave a delete and an insert, which applied in the other order lose the row)."""
    t = create(table_path, table_type, partitioned=False)
    a = t.insert(trips([1, 2]), target_file_size=1)
    if removal == "delete":
        t.delete(trips([1]).select(["id", "city"]))
    else:
        t.insert_overwrite_table(trips([2], ts=2))
    t.insert(trips([1], ts=3, name="again"), target_file_size=1)
    whole = t.to_arrow(query="changes", start=checkpoint(a))
    splits = t.splits(query="changes", start=checkpoint(a), target_bytes=1)
    for s in splits:
        part = t.scan_split(s).to_arrow()
        assert sorted(part.column("_change_type").to_pylist()) == sorted(
            whole.column("_change_type").to_pylist()
        )
    assert (
        len(splits) == 1
        and dict(zip(whole["id"].to_pylist(), whole["_change_type"].to_pylist(), strict=True))[1] == "update"
    )
