"""Merge-on-read tables: deltacommits into log files, merged reads, read-optimized reads, and
hudi-rs reading what we write."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import oxlake
import pyarrow as pa
import pytest
from conftest import SCHEMA, checkpoint, data_paths, hudi_read, rows, trips, trips_table


@pytest.fixture
def mor(table_path: str) -> oxlake.Table:
    return oxlake.create_table(
        table_path,
        SCHEMA,
        record_key="id",
        partition_by=["city"],
        ordering_field="ts",
        table_type="merge_on_read",
    )


@pytest.fixture
def mor6(table_path: str) -> oxlake.Table:
    """Version 6 naming: a log file carries its slice's base instant and a version counted up
    (version 8 logs carry their own delta commit's instant: `test_version8.py`)."""
    return oxlake.create_table(
        table_path,
        SCHEMA,
        record_key="id",
        partition_by=["city"],
        ordering_field="ts",
        table_type="merge_on_read",
        table_version=6,
    )


def log_files(t: oxlake.Table) -> list[Path]:
    return data_paths(t.uri, ".*.log.*")


def test_updates_and_deletes_go_to_log_files(mor6: oxlake.Table) -> None:
    first = mor6.insert(trips(list(range(9))))
    bases = data_paths(mor6.uri, "*.parquet")
    up = mor6.upsert(trips([1, 4], ts=2, name="u"))
    gone = mor6.delete(trips([2]).select(["id", "city"]))
    # Base files are never rewritten: one new log file per touched file group and write.
    assert data_paths(mor6.uri, "*.parquet") == bases
    logs = log_files(mor6)
    assert len(logs) == 2  # ids 1 and 4 live in one file group (nyc), 2 in another
    assert all(p.name.split("_")[1].startswith(first.instant) for p in logs)
    assert [i.action for i in mor6.timeline()] == ["deltacommit"] * 3
    out = {r["id"]: r for r in rows(mor6.scan())}
    assert sorted(out) == [0, 1, 3, 4, 5, 6, 7, 8]
    assert out[1]["name"] == "u1" and out[4]["ts"] == 2 and out[5]["name"] == "n5"
    meta = {r["id"]: r for r in mor6.to_arrow().to_pylist()}
    assert meta[1]["_hoodie_commit_time"] == up.instant
    assert meta[0]["_hoodie_commit_time"] == first.instant
    assert gone.num_deletes == 1
    # Read-optimized: the base files alone, as of the first write.
    assert rows(mor6.to_arrow(query="read_optimized")) == rows(trips(list(range(9))))


def test_event_time_ordering_across_logs(mor: oxlake.Table) -> None:
    mor.insert(trips([1, 2, 3], ts=5))
    mor.upsert(trips([1], ts=4, name="late"))  # loses: lower ordering value
    mor.upsert(trips([2], ts=5, name="tie"))  # wins: equal ordering, later commit
    mor.delete(trips([3], ts=1))  # an event-time delete that loses
    out = {r["id"]: r["name"] for r in rows(mor.scan())}
    assert out == {1: "n1", 2: "tie2", 3: "n3"}
    mor.delete(trips([3]).select(["id", "city"]))  # no ordering value: always wins
    assert sorted(r["id"] for r in rows(mor.scan())) == [1, 2]


def test_hudi_rs_reads_our_merge_on_read_table_at_every_instant(mor: oxlake.Table) -> None:
    mor.insert(trips(list(range(20))))
    mor.upsert(trips([1, 5, 30], ts=2, name="u"))
    mor.delete(trips([2, 7]).select(["id", "city"]))
    mor.upsert(trips([5, 31], ts=3, name="v"))
    assert rows(hudi_read(mor.uri)) == rows(mor.to_arrow())
    for i in mor.timeline():
        assert rows(hudi_read(mor.uri, as_of=i.time)) == rows(mor.to_arrow(as_of=i.time)), i
    assert rows(hudi_read(mor.uri, read_optimized=True)) == rows(mor.to_arrow(query="read_optimized"))


def test_time_travel_and_incremental(mor: oxlake.Table) -> None:
    a = mor.insert(trips(list(range(6))))
    b = mor.upsert(trips([1, 2], ts=2, name="b"))
    c = mor.upsert(trips([2, 8], ts=3, name="c"))
    assert rows(mor.to_arrow(as_of=a.instant)) == rows(trips(list(range(6))))
    names = {r["id"]: r["name"] for r in rows(mor.to_arrow(as_of=b.instant))}
    assert (names[1], names[2]) == ("b1", "b2")
    window = rows(mor.to_arrow(query="incremental", start=checkpoint(a), end=checkpoint(b)))
    assert [(r["id"], r["name"]) for r in window] == [(1, "b1"), (2, "b2")]
    window = rows(mor.to_arrow(query="incremental", start=checkpoint(b), end=checkpoint(c)))
    assert [(r["id"], r["name"]) for r in window] == [(2, "c2"), (8, "c8")]


def test_filters_apply_after_the_merge(mor: oxlake.Table) -> None:
    mor.insert(trips([1, 2], ts=1, fare=100.0))
    mor.upsert(trips([1], ts=2, fare=0.0))
    # The base row of 1 passes `fare > 50` but its log version does not: 1 must not appear.
    assert [r["id"] for r in rows(mor.scan(filter="fare > 50"))] == [2]
    assert [r["id"] for r in rows(mor.scan(filter=[("id", "=", 1)]))] == [1]
    assert [r["fare"] for r in rows(mor.scan(filter="id = 1"))] == [1.0]


def test_a_filter_on_the_partition_column_sees_the_version_the_merge_keeps_in_a_default_partition(
    table_path: str,
) -> None:
    """Null and empty values share `__HIVE_DEFAULT_PARTITION__`: there a record's partition column
    may differ between its versions, so a filter on it must wait for the merge."""
    schema = pa.schema(
        [pa.field("id", pa.string(), nullable=False), pa.field("r", pa.string()), ("v", pa.int64())]
    )
    t = oxlake.create_table(
        table_path,
        schema,
        record_key="id",
        partition_by=["r"],
        ordering_field="v",
        table_type="merge_on_read",
    )
    t.insert(pa.table({"id": ["a"], "r": [""], "v": [10]}, schema=schema))
    t.upsert(pa.table({"id": ["a"], "r": [None], "v": [5]}, schema=schema))  # loses: lower v
    assert rows(t.scan(), key="id") == [{"id": "a", "r": "", "v": 10}]
    assert rows(t.scan(filter="r IS NULL"), key="id") == []
    assert rows(t.scan(filter=[("r", "=", "")]), key="id") == [{"id": "a", "r": "", "v": 10}]


def test_a_corrupt_block_of_a_committed_instant_is_an_error(mor6: oxlake.Table) -> None:
    mor6.insert(trips([1, 2, 3], city="sf"))
    mor6.upsert(trips([1], ts=2, name="u", city="sf"))
    mor6.upsert(trips([2], ts=2, name="v", city="sf"))
    first, second = log_files(mor6)  # versions 1 and 2 of the one file group
    assert (first.name.split(".")[-1][:2], second.name.split(".")[-1][:2]) == ("1_", "2_")
    data = second.read_bytes()
    # Damage the second log's block: its reverse pointer no longer matches. Its instant
    # completed, so skipping it would answer with the older row (issue 22).
    second.write_bytes(data[:-1] + bytes([data[-1] ^ 0xFF]))
    with pytest.raises(oxlake.CorruptTableError, match=second.name):
        mor6.to_arrow()
    second.write_bytes(data[: len(data) // 2])
    with pytest.raises(oxlake.CorruptTableError, match=second.name):
        mor6.to_arrow()
    # Past what the instant wrote, a damaged tail (a torn append that never committed) is skipped.
    second.write_bytes(data + data[: len(data) // 2])
    assert {r["id"]: r["name"] for r in rows(mor6.scan())} == {1: "u1", 2: "v2", 3: "n3"}
    assert first.exists()


def test_large_slices_merge_in_passes_under_a_small_memory_budget(mor: oxlake.Table) -> None:
    mor.insert(trips(list(range(20_000)), city="sf"))
    mor.upsert(trips(list(range(0, 20_000, 2)), ts=2, name="u", city="sf"))
    expected = rows(mor.to_arrow())
    small = mor.to_arrow(memory_limit=256 * 1024)
    assert rows(small) == expected
    assert sum(1 for r in expected if r["name"].startswith("u")) == 10_000


def test_a_read_by_logs_keys_merges_in_passes_under_a_small_memory_budget(mor: oxlake.Table) -> None:
    """A slice read by its logs' keys (an incremental window after its base file) whose keys do
    not fit a small memory budget: each pass holds the keys of its own share of them, and the
    window's rows are those read without a budget."""
    first = mor.insert(trips(list(range(20_000)), city="sf"))
    mor.upsert(trips(list(range(0, 20_000, 2)), ts=2, name="u", city="sf"))
    window = {"query": "incremental", "start": checkpoint(first)}
    [plan] = [json.loads(s.data)["Scan"] for s in mor.splits(**window)]
    assert [s.get("keys_of") is not None for s in plan["slices"]] == [True]
    expected = rows(mor.to_arrow(**window))
    assert [r["name"] for r in expected] == [f"u{i}" for i in range(0, 20_000, 2)]
    assert rows(mor.to_arrow(**window, memory_limit=256 * 1024)) == expected


def test_schema_of_log_blocks_is_the_table_schema(mor: oxlake.Table) -> None:
    mor.insert(trips([1]))
    mor.upsert(
        pa.table(
            {"id": [1], "city": ["nyc"], "ts": [2]},
            schema=pa.schema(
                [pa.field("id", pa.int64(), nullable=False), ("city", pa.string()), ("ts", pa.int64())]
            ),
        ),
        schema_mode="merge",  # the columns the input lacks are null in its rows
    )
    out = rows(mor.scan())
    assert out == [{"id": 1, "name": None, "city": "nyc", "ts": 2, "fare": None}]
    assert mor.to_arrow().schema == mor.schema


def test_compaction_rewrites_slices_and_keeps_the_rows(mor: oxlake.Table) -> None:
    mor.insert(trips(list(range(30))))
    mor.upsert(trips([1, 2, 3, 31], ts=2, name="u"))
    mor.delete(trips([4, 5]).select(["id", "city"]))
    before = rows(mor.scan())
    result = mor.compact()
    assert len(result.instants) == 1 and result.file_groups == 3
    c = result.instants[0]
    assert (c, "commit", "completed") in [(i.time, i.action, i.state) for i in mor.timeline()]
    assert rows(mor.scan()) == before
    # The new slices are base files alone: read-optimized now sees the merged state.
    assert rows(mor.to_arrow(query="read_optimized")) == before
    # Three groups had logs; the insert of 31 went to a new group's base file, left as it is.
    assert sum(fg.base_file.endswith(f"_{c}.parquet") for fg in mor.file_groups()) == 3
    assert rows(hudi_read(mor.uri)) == before
    # Time travel to before the compaction still merges the old slices.
    first = mor.timeline()[0].time
    assert rows(mor.to_arrow(as_of=first)) == rows(trips(list(range(30))))
    # Nothing left to compact; updates after it go to the new slices' logs.
    assert mor.compact().instants == []
    mor.upsert(trips([1], ts=3, name="w"))
    assert [r["name"] for r in rows(mor.scan()) if r["id"] == 1] == ["w1"]
    assert rows(hudi_read(mor.uri)) == rows(mor.scan())


def test_writes_during_a_pending_compaction_land_in_the_new_slice(mor6: oxlake.Table) -> None:
    mor6.insert(trips(list(range(6)), city="sf"))
    mor6.upsert(trips([1], ts=2, name="u", city="sf"))
    # A compaction that crashed after planning and starting: its plan stays requested.
    code = "import oxlake, sys; oxlake.Table(sys.argv[1]).compact()"
    env = {**os.environ, "OXLAKE_FAILPOINT": "after-inflight"}
    proc = subprocess.run([sys.executable, "-c", code, mor6.uri], env=env, capture_output=True)
    assert proc.returncode != 0
    pending = [i for i in mor6.timeline() if i.action == "compaction"]
    assert len(pending) == 1 and pending[0].state == "inflight"
    c = pending[0].time
    # A writer meanwhile: its log is named with the compaction's instant.
    mor6.upsert(trips([2], ts=2, name="v", city="sf"))
    assert any(p.name.split("_")[1].startswith(c) for p in log_files(mor6))
    expected = rows(mor6.scan())
    assert {r["id"]: r["name"] for r in expected}[2] == "v2"
    # Once the crashed run's heartbeat expires, the next run undoes its files and executes the plan.
    time.sleep(0.3)
    result = oxlake.Table(mor6.uri, heartbeat_interval=0.05).compact(min_log_files=99)
    assert result.instants == [c]
    assert rows(mor6.scan()) == expected
    assert rows(hudi_read(mor6.uri)) == expected


def test_inline_compaction_after_n_deltacommits(table_path: str) -> None:
    t = oxlake.create_table(
        table_path,
        SCHEMA,
        record_key="id",
        partition_by=["city"],
        ordering_field="ts",
        table_type="merge_on_read",
        inline_compaction=3,
    )
    assert t.properties["oxlake.compaction.inline.max.delta.commits"] == "3"
    t.insert(trips(list(range(9))))
    t.upsert(trips([1], ts=2, name="a"))
    assert [i.action for i in t.timeline()] == ["deltacommit"] * 2
    t.upsert(trips([2, 4], ts=3, name="b"))  # the third deltacommit: compaction follows
    actions = [i.action for i in t.timeline()]
    assert actions == ["deltacommit"] * 3 + ["commit"]
    # The latest slices are base files alone (old logs stay on disk until a clean).
    assert not [f for f in t.planned_files() if ".log." in f]
    assert rows(t.to_arrow(query="read_optimized")) == rows(t.to_arrow())
    out = {r["id"]: r["name"] for r in rows(t.scan())}
    assert (out[1], out[2], out[4], out[5]) == ("a1", "b2", "b4", "n5")
    # The count starts again after the compaction; another process opening the table agrees.
    other = oxlake.Table(table_path)
    other.upsert(trips([5], ts=4, name="c"))
    other.upsert(trips([6], ts=4, name="c"))
    assert [i.action for i in other.timeline()][4:] == ["deltacommit"] * 2
    other.upsert(trips([7], ts=4, name="c"))
    assert [i.action for i in other.timeline()][4:] == ["deltacommit"] * 3 + ["commit"]
    assert rows(hudi_read(table_path)) == rows(other.to_arrow())


def test_inline_compaction_is_checked(table_path: str) -> None:
    with pytest.raises(oxlake.InvalidArgumentError, match="merge-on-read"):
        oxlake.create_table(table_path, SCHEMA, record_key="id", inline_compaction=2)
    with pytest.raises(oxlake.InvalidArgumentError, match="at least 1"):
        oxlake.create_table(
            table_path, SCHEMA, record_key="id", table_type="merge_on_read", inline_compaction=0
        )
    assert not Path(table_path).exists()


def test_an_upsert_goes_to_the_group_where_its_key_is_live(mor: oxlake.Table) -> None:
    """Found by the change-stream property test: after a delete, an insert of the same key lands in
    a new file group while the old group still holds the key (deleted in its log). The next upsert
    must update the live row, not revive the deleted one (which made the key appear twice)."""
    first = mor.upsert(trips([0, 3], ts=1))
    mor.delete(trips([0]).select(["id", "city"]))
    again = mor.insert(trips([0], ts=1, name="again"))
    assert again.files and all(first.instant not in f for f in again.files)  # a new group
    last = mor.upsert(trips([0], ts=2, name="u"))
    assert len(last.files) == 1 and again.files[0].split("_")[0].split("/")[-1] in last.files[0]
    out = mor.to_arrow().to_pylist()
    assert sorted((r["id"], r["name"]) for r in out) == [(0, "u0"), (3, "n3")]
    assert rows(hudi_read(mor.uri)) == rows(mor.to_arrow())


def test_inserts_go_to_base_files_so_apache_hudis_index_finds_every_key(mor: oxlake.Table) -> None:
    """Apache Hudi's default indexes (bloom, simple) look keys up in base files only: a key kept
    only in a log file is invisible to a Java upsert, which then writes it twice. So inserts go to
    base files (new file groups); updates to logs. Law: every key live in a snapshot is in some
    base file (the read-optimized view)."""
    import random

    rng = random.Random(7)
    mor.insert(trips(list(range(9))))
    before = data_paths(mor.uri, "*.parquet")
    mor.upsert(trips([20, 21, 22, 1], ts=2, name="u"))
    after = data_paths(mor.uri, "*.parquet")
    assert set(before) < set(after), "the inserts went to new base files, the old ones stay"
    assert len(log_files(mor)) == 1, "the update of key 1 went to a log"
    ro = {r["id"] for r in rows(mor.to_arrow(query="read_optimized"))}
    assert {20, 21, 22} <= ro
    live: set[int] = set(range(9)) | {20, 21, 22}
    for step in range(12):
        new = [100 + 10 * step + n for n in range(rng.randint(0, 3))]
        old = rng.sample(sorted(live), rng.randint(0, 3))
        if step % 4 == 3 and old:
            mor.delete(trips(old).select(["id", "city"]))
            live -= set(old)
        else:
            mor.upsert(trips(new + old, ts=step + 3, name=f"s{step}-"))
            live |= set(new)
        snapshot = {r["id"] for r in rows(mor.scan())}
        assert snapshot == live
        in_base = {r["id"] for r in rows(mor.to_arrow(query="read_optimized"))}
        assert snapshot <= in_base, f"keys only in logs after step {step}: {snapshot - in_base}"
    assert log_files(mor), "updates of groups with logs still go to logs"
    assert rows(hudi_read(mor.uri)) == rows(mor.to_arrow())


@pytest.mark.parametrize("table_version", [6, 8])
def test_a_table_without_meta_fields_merges_its_logs_by_the_record_key(
    table_path: str, table_version: int
) -> None:
    """Apache Hudi's virtual keys (`hoodie.populate.meta.fields=false`): base files hold null meta
    columns, and readers key the merge by the record key fields. Here a merge-on-read table with
    updates and deletes in its logs is made one (its base files' meta columns nulled, as Apache
    Hudi writes them, and the property set): reads still see each key once, at its newest version,
    and no deleted key (not base rows and log rows side by side)."""
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    t = oxlake.create_table(
        table_path,
        SCHEMA,
        record_key="id",
        partition_by=["city"],
        ordering_field="ts",
        table_type="merge_on_read",
        table_version=table_version,
        metadata=False,  # its files are rewritten below, as Apache Hudi would have written them
    )
    t.insert(trips(list(range(12))))
    t.upsert(trips([1, 2, 4], ts=2, name="u"))
    t.upsert(trips([2], ts=1, name="stale"))
    t.delete(trips([3, 5]))
    t.insert(trips([20, 21]))
    data = ["id", "name", "city", "ts", "fare"]
    expected = rows(t.to_arrow(columns=data))
    assert len(expected) == 12
    for f in Path(table_path).rglob("*.parquet"):
        if ".hoodie" in f.parts:
            continue
        base = pq.read_table(f)
        for c in [c for c in base.column_names if c.startswith("_hoodie_")]:
            i = base.column_names.index(c)
            base = base.set_column(
                i, base.schema.field(i), pa.nulls(base.num_rows, base.schema.field(i).type)
            )
        pq.write_table(base, f)
    props = Path(table_path) / ".hoodie" / "hoodie.properties"
    props.write_text(props.read_text() + "hoodie.populate.meta.fields=false\n")
    virtual = oxlake.Table(table_path)
    assert virtual.properties["hoodie.populate.meta.fields"] == "false"
    got = virtual.to_arrow(columns=data)
    assert rows(got) == expected
    assert pc.count_distinct(got["id"]).as_py() == got.num_rows
    assert rows(virtual.to_arrow(columns=data, filter="id = 2")) == [r for r in expected if r["id"] == 2]


# ---- A compaction spread over processes (the driver plans and commits, tasks write) -----------


def mor_with_logs(path: str, **options: Any) -> oxlake.Table:
    """A merge-on-read table of 30 trips in three partitions, each slice with a log."""
    t = trips_table(path, table_type="merge_on_read", **options)
    t.insert(trips(list(range(30))))
    t.upsert(trips(list(range(0, 30, 2)), ts=2, name="u"))
    return t


def base_files_at(path: str, instant: str) -> set[str]:
    return {p.name for p in data_paths(path, "*.parquet") if p.name.endswith(f"_{instant}.parquet")}


def test_a_compaction_written_by_tasks_commits_one_file_per_slice(table_path: str) -> None:
    """The driver's plan, its slices written by tasks (an attempt that died after writing, then
    its retries), the driver's commit of the retries' files: the dead attempt's files are
    deleted, the rows are the table's. A commit missing a slice, or naming one twice, is refused
    and rolled back with the plan kept, which the next compaction (here one in-process) takes up."""
    t = mor_with_logs(table_path)
    before = rows(t.to_arrow())
    native = oxlake._native
    pending = native.begin_compaction(t._t)
    assert pending is not None and pending.is_new
    instant, ops = pending.instant, list(enumerate(pending.operations))
    assert len(ops) == 3  # one slice per city, each with a log
    parts = [native.compact_slices(t._t, instant, pending.epoch, [op], (i, 1)) for i, op in enumerate(ops)]
    with pytest.raises(oxlake.InvalidDataError, match="needs exactly one"):
        pending.commit(parts[:2])
    t = oxlake.Table(table_path)
    assert rows(t.to_arrow()) == before
    assert not base_files_at(table_path, instant)  # rolled back: the tasks' files are gone
    assert [(i.action, i.state) for i in t.timeline() if i.time == instant] == [("compaction", "requested")]

    again = native.begin_compaction(t._t)
    assert again is not None and not again.is_new and again.instant == instant
    assert list(enumerate(again.operations)) == ops
    parts = [native.compact_slices(t._t, instant, again.epoch, [op], (i, 1)) for i, op in enumerate(ops)]
    with pytest.raises(oxlake.InvalidDataError, match="2 new base files"):
        again.commit([*parts, parts[0]])

    last = native.begin_compaction(t._t)
    assert last is not None and last.instant == instant
    native.compact_slices(t._t, instant, last.epoch, ops, (0, 1))  # an attempt that died
    dead = base_files_at(table_path, instant)
    retries = [native.compact_slices(t._t, instant, last.epoch, [op], (i, 2)) for i, op in enumerate(ops)]
    assert len(base_files_at(table_path, instant)) == 6
    committed, groups, records = last.commit(retries)
    assert (committed, groups, records) == (instant, 3, 30)
    kept = base_files_at(table_path, instant)
    assert len(kept) == 3 and not kept & dead
    t = oxlake.Table(table_path)
    assert [(i.action, i.state) for i in t.timeline() if i.time == instant] == [("commit", "completed")]
    assert rows(t.to_arrow()) == before
    assert rows(hudi_read(table_path)) == before
    assert not [f for f in t.planned_files() if ".log." in f]
    assert native.begin_compaction(t._t) is None
    with pytest.raises(oxlake.InvalidArgumentError, match="already committed"):
        last.commit(retries)
    with pytest.raises(oxlake.InvalidArgumentError, match="not a running compaction"):
        native.compact_slices(t._t, instant, last.epoch, ops, (0, 3))


@pytest.mark.parametrize("version", [6, 8])
def test_a_write_while_tasks_compact_lands_in_the_new_slice(table_path: str, version: int) -> None:
    """A write that begins after the plan puts its logs in the compacted groups' new slices; the
    commit's removal of files the tasks did not report leaves them be (version 6 names them with
    the compaction's time, version 8 with their own)."""
    t = mor_with_logs(table_path, table_version=version)
    native = oxlake._native
    pending = native.begin_compaction(t._t)
    assert pending is not None
    ops = list(enumerate(pending.operations))
    parts = [native.compact_slices(t._t, pending.instant, pending.epoch, ops, (0, 1))]
    written = oxlake.Table(table_path).upsert(trips([1, 2, 40], ts=3, name="w")).files
    pending.commit(parts)
    t = oxlake.Table(table_path)
    expected = {r["id"]: r["name"] for r in rows(pa.concat_tables([trips(list(range(30))), trips([40])]))}
    expected |= {i: f"u{i}" for i in range(0, 30, 2)} | {1: "w1", 2: "w2", 40: "w40"}
    assert {r["id"]: r["name"] for r in rows(t.to_arrow())} == expected
    assert {r["id"]: r["name"] for r in rows(hudi_read(table_path))} == expected
    compacted = {json.loads(op)["fileId"] for _, op in ops}
    logs = [f for f in written if ".log." in f and f.rsplit("/", 1)[-1][1:].split("_")[0] in compacted]
    assert logs and all((Path(table_path) / f).exists() for f in logs), logs
    assert set(logs) <= set(t.planned_files())


def test_an_aborted_compaction_keeps_its_plan_and_a_compaction_on_cow_is_refused(table_path: str) -> None:
    """An aborted attempt deletes its files and keeps its plan; a task of it that runs late is
    refused; the next compaction (in-process) completes the plan."""
    t = mor_with_logs(table_path)
    before = rows(t.to_arrow())
    native = oxlake._native
    pending = native.begin_compaction(t._t)
    assert pending is not None
    native.compact_slices(t._t, pending.instant, pending.epoch, list(enumerate(pending.operations)), (0, 1))
    pending.abort()
    pending.abort()  # idempotent
    assert not base_files_at(table_path, pending.instant)
    # The next attempt; a task of the aborted one (a straggler) is refused and writes nothing.
    again = native.begin_compaction(t._t)
    assert again is not None and again.instant == pending.instant and again.epoch == pending.epoch + 1
    ops = list(enumerate(again.operations))
    with pytest.raises(oxlake.CommitConflictError, match="was rolled back"):
        native.compact_slices(t._t, again.instant, pending.epoch, ops, (0, 1))
    assert not base_files_at(table_path, pending.instant)
    again.abort()
    t = oxlake.Table(table_path)
    assert rows(t.to_arrow()) == before
    done = t.compact()
    assert done.instants == [pending.instant] and done.file_groups == 3
    assert rows(t.to_arrow()) == before
    cow = oxlake.create_table(table_path + "-cow", SCHEMA, record_key="id")
    with pytest.raises(oxlake.InvalidArgumentError, match="merge-on-read"):
        native.begin_compaction(cow._t)
    assert native.compaction_due(cow._t) is None


@pytest.mark.parametrize("version", [6, 8])
def test_an_incremental_read_of_logs_over_an_older_base_file_reads_their_keys(
    table_path: str, version: int
) -> None:
    """A slice whose base file was written before an incremental window holds none of its rows
    there: it is read by the keys its logs hold (the plan's `keys_of`), not merged whole. The
    window's rows are the same: updates, a version that loses to the base (not in the window),
    new keys; read whole and in splits cut by rows. A window reaching the base file's commit, or
    a compaction's, reads the slice whole."""
    n = 30_000
    t = oxlake.create_table(
        table_path,
        SCHEMA,
        record_key="id",
        ordering_field="ts",
        table_type="merge_on_read",
        table_version=version,
    )
    a = t.insert(trips(list(range(n))))
    b = t.upsert(trips(list(range(0, n, 300)), ts=2, name="b"))  # 100 keys
    c = t.upsert(trips([*range(1, n, 600), n, n + 1], ts=0, name="c"))  # 50 lose to the base

    def keyed(start: oxlake.WriteResult | None) -> set[bool]:
        window = {"query": "incremental", "start": checkpoint(start) if start else None}
        plans = [json.loads(s.data)["Scan"] for s in t.splits(**window)]
        return {s.get("keys_of") is not None for p in plans for s in p["slices"] if s["logs"]}

    def window(start: oxlake.WriteResult | None) -> dict[int, str]:
        args = {"query": "incremental", "start": checkpoint(start) if start else None}
        whole = {r["id"]: r["name"] for r in rows(t.to_arrow(**args))}
        parts = [t.scan_split(s).to_arrow() for s in t.splits(**args, min_splits=3)]
        assert {r["id"]: r["name"] for r in rows(pa.concat_tables(parts))} == whole
        return whole

    assert keyed(a) == {True} and keyed(None) == {False}
    updated = {i: f"b{i}" for i in range(0, n, 300)}
    assert window(a) == {**updated, n: f"c{n}", n + 1: f"c{n + 1}"}
    assert window(b) == {n: f"c{n}", n + 1: f"c{n + 1}"}
    assert len(window(None)) == n + 2
    t.compact()
    d = t.upsert(trips([7, n + 2], ts=3, name="d"))
    assert keyed(c) == {False}  # the compaction's base file is inside the window
    assert window(c) == {7: "d7", n + 2: f"d{n + 2}"}
    t.upsert(trips([8, 9], ts=0, name="e"))  # 8 and 9 lose to the compacted base
    t.upsert(trips([10], ts=4, name="f"))
    assert keyed(d) == {True}  # the compaction's base file is before it
    assert window(d) == {10: "f10"}
