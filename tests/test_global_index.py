"""Tables with a global index (`create_table(..., global_index=True)`): a record key is unique
across partitions. An upsert naming another partition moves the record there in one commit (as
Apache Hudi's global indexes with `update.partition.path`), a delete finds a key wherever it is,
and without the option a key is unique within its partition only."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import oxlake
import pyarrow as pa
import pytest
from conftest import SCHEMA, hudi_read, race_past_the_intents, rows, trips
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

EXAMPLES = int(os.environ.get("OXLAKE_MODEL_EXAMPLES", "25"))


def global_table(path: str, table_type: str = "copy_on_write", **options: Any) -> oxlake.Table:
    return oxlake.create_table(
        path,
        SCHEMA,
        record_key="id",
        partition_by=["city"],
        ordering_field="ts",
        table_type=table_type,  # type: ignore[arg-type]
        global_index=True,
        **options,
    )


def row(i: int, city: str, ts: int, name: str = "n") -> dict[str, Any]:
    return {"id": i, "name": f"{name}{i}", "city": city, "ts": ts, "fare": float(i)}


def table_of(items: list[dict[str, Any]]) -> pa.Table:
    return pa.Table.from_pylist(items, schema=SCHEMA)


def where(t: oxlake.Table) -> dict[int, tuple[str, str]]:
    """Each key's partition column and name, failing if a key is there twice."""
    out: dict[int, tuple[str, str]] = {}
    for r in rows(t.scan()):
        assert r["id"] not in out, f"key {r['id']} is in the table twice"
        out[r["id"]] = (r["city"], r["name"])
    return out


@pytest.fixture(params=["copy_on_write", "merge_on_read"])
def table_type(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.mark.parametrize("record_index", [False, True], ids=["key-reads", "record-index"])
def test_an_upsert_naming_another_partition_moves_the_record(
    table_path: str, table_type: str, record_index: bool
) -> None:
    t = global_table(table_path, table_type)
    if record_index:
        t.build_metadata(record_index_shards=2)
    t.insert(trips([1, 2, 3, 4]))  # 1 nyc, 2 chennai, 3 sf, 4 nyc
    result = t.upsert(table_of([row(1, "sf", 2, "moved"), row(2, "chennai", 2, "same")]))
    assert (result.num_inserts, result.num_updates, result.num_deletes) == (1, 1, 1)
    got = where(t)
    assert got == {1: ("sf", "moved1"), 2: ("chennai", "same2"), 3: ("sf", "n3"), 4: ("nyc", "n4")}
    # The old partition no longer holds it; the meta fields name the new one.
    meta = {r["id"]: r["_hoodie_partition_path"] for r in rows(t.scan(), keep_meta=True)}
    assert meta[1] == "city=sf"
    if record_index:
        assert t.lookup(pa.table({"id": pa.array([1], pa.int64())}))["city"].to_pylist() == ["sf"]
        assert t.validate().ok
    # hudi-rs reads the same rows.
    other = hudi_read(table_path)
    assert sorted(zip(other["id"].to_pylist(), other["city"].to_pylist(), strict=True)) == [
        (1, "sf"),
        (2, "chennai"),
        (3, "sf"),
        (4, "nyc"),
    ]


def test_an_insert_of_a_stored_key_updates_or_moves_it(table_path: str, table_type: str) -> None:
    """On a global table an insert looks its keys up too: keys stay unique."""
    t = global_table(table_path, table_type)
    t.insert(trips([1, 2]))  # 1 nyc, 2 chennai
    result = t.insert(table_of([row(1, "sf", 2, "again"), row(2, "chennai", 2, "again")]))
    assert (result.num_inserts, result.num_updates) == (1, 1)
    assert where(t) == {1: ("sf", "again1"), 2: ("chennai", "again2")}


@pytest.mark.parametrize("record_index", [False, True], ids=["key-reads", "record-index"])
def test_a_key_already_in_two_partitions_is_updated_in_the_one_the_row_names(
    table_path: str, table_type: str, record_index: bool
) -> None:
    """A bulk insert does not look keys up: it can leave a key in two partitions. An upsert
    then updates the copy in the partition it names (both lookups agree), never moving the
    other copy into that partition beside it."""
    t = global_table(table_path, table_type)
    if record_index:
        t.build_metadata(record_index_shards=2)
    t.insert(trips([1]))  # nyc
    t.bulk_insert(table_of([row(1, "sf", 2, "bulk")]))
    t.upsert(table_of([row(1, "sf", 3, "named")]))
    got = sorted((r["city"], r["name"]) for r in rows(t.scan()))
    assert got == [("nyc", "n1"), ("sf", "named1")]


def test_copies_of_a_key_in_one_partition_are_all_updated_moved_or_deleted(
    table_path: str, table_type: str
) -> None:
    """Two bulk inserts leave a key in two file groups of one partition: an upsert naming that
    partition updates both copies, one naming another moves the record there once (both copies
    leave), and a delete deletes both."""
    for step in ("same", "moved", "delete"):
        t = global_table(f"{table_path}-{step}", table_type)
        t.bulk_insert(table_of([row(1, "nyc", 1), row(4, "nyc", 1)]))
        t.bulk_insert(table_of([row(1, "nyc", 1, "dup")]))
        if step == "delete":
            result = t.delete([1])
        else:
            result = t.upsert(table_of([row(1, "nyc" if step == "same" else "sf", 2, step)]))
        got = sorted((r["id"], r["city"], r["name"]) for r in rows(t.scan()))
        counts = (result.num_inserts, result.num_updates, result.num_deletes)
        if step == "same":
            assert (counts, got) == ((0, 2, 0), [(1, "nyc", "same1"), (1, "nyc", "same1"), (4, "nyc", "n4")])
        elif step == "moved":
            assert (counts, got) == ((1, 0, 2), [(1, "sf", "moved1"), (4, "nyc", "n4")])
        else:
            assert (counts, got) == ((0, 0, 2), [(4, "nyc", "n4")])


def test_without_a_global_index_a_key_is_unique_within_its_partition(table_path: str) -> None:
    t = oxlake.create_table(table_path, SCHEMA, record_key="id", partition_by=["city"], ordering_field="ts")
    assert not t.global_index
    t.insert(trips([1]))
    t.upsert(table_of([row(1, "sf", 2)]))
    assert sorted(r["city"] for r in rows(t.scan())) == ["nyc", "sf"]


def test_an_older_version_naming_another_partition_loses_and_moves_nothing(
    table_path: str, table_type: str
) -> None:
    t = global_table(table_path, table_type)
    t.insert(table_of([row(1, "nyc", 5, "new"), row(2, "nyc", 5, "new")]))
    t.upsert(table_of([row(1, "sf", 4, "old"), row(2, "sf", 5, "tie")]))
    # ts 4 < 5: the stored version wins and stays where it is; a tie goes to the incoming row.
    assert where(t) == {1: ("nyc", "new1"), 2: ("sf", "tie2")}


def test_duplicates_of_a_key_in_one_input_with_different_partitions_are_one_record(
    table_path: str, table_type: str
) -> None:
    t = global_table(table_path, table_type)
    t.upsert(table_of([row(7, "sf", 1, "a"), row(7, "nyc", 3, "b"), row(7, "chennai", 2, "c")]))
    assert where(t) == {7: ("nyc", "b7")}
    t.upsert(table_of([row(7, "sf", 9, "d"), row(7, "chennai", 8, "e")]))
    assert where(t) == {7: ("sf", "d7")}


def test_a_delete_finds_the_key_in_any_partition(table_path: str, table_type: str) -> None:
    t = global_table(table_path, table_type)
    t.insert(trips([1, 2, 3]))
    # By key alone (a plain list), and by rows naming the wrong partition.
    assert t.delete([1]).num_deletes == 1
    assert t.delete(table_of([row(2, "sf", 9)])).num_deletes == 1
    assert where(t) == {3: ("sf", "n3")}
    assert t.delete([42]).instant is None


def test_a_moved_record_reads_as_a_delete_and_an_insert_in_the_change_stream(
    table_path: str, table_type: str
) -> None:
    t = global_table(table_path, table_type)
    first = t.insert(trips([1, 2]))
    t.upsert(table_of([row(1, "sf", 2, "moved")]))
    changes = t.to_arrow(query="changes", start=first.completion or first.instant)
    got = sorted((r["_change_type"], r["id"], r["city"]) for r in changes.to_pylist())
    assert got == [("delete", 1, "nyc"), ("insert", 1, "sf")]
    incremental = t.to_arrow(query="incremental", start=first.completion or first.instant)
    assert [(r["id"], r["city"]) for r in incremental.to_pylist()] == [(1, "sf")]


def test_compaction_and_clean_keep_moved_records_where_they_went(table_path: str) -> None:
    t = global_table(table_path, "merge_on_read")
    t.build_metadata(record_index_shards=2)
    t.insert(trips(list(range(12))))
    for ts, city in enumerate(["sf", "nyc", "chennai", "sf"], start=2):
        t.upsert(table_of([row(i, city, ts, f"v{ts}-") for i in range(0, 12, 3)]))
    t.compact()
    t.clean(retain=1)
    got = where(t)
    assert {i: got[i][0] for i in range(0, 12, 3)} == dict.fromkeys(range(0, 12, 3), "sf")
    assert len(got) == 12
    assert t.validate().ok


def test_two_writers_inserting_one_new_key_into_different_partitions_do_not_both_land(
    table_path: str, tmp_path: Path
) -> None:
    """Writer A has passed its conflict check and waits to complete; B, later, upserts the same
    new key into another partition. With a partition-scoped index the two are different records;
    with a global index B must see A's key and fail (or A's write is refused), never both."""
    t = global_table(table_path)
    t.insert(trips([1]))
    code = (
        "import sys, oxlake, pyarrow as pa; from conftest import SCHEMA; "
        "oxlake.Table(sys.argv[1]).upsert(pa.Table.from_pylist("
        "[{{'id': 100, 'name': '{w}', 'city': '{city}', 'ts': 1, 'fare': 1.0}}], schema=SCHEMA))"
    )
    a, b = code.format(w="a", city="sf"), code.format(w="b", city="nyc")
    returncode, err = race_past_the_intents(table_path, tmp_path, a, b)
    assert returncode != 0 and "CommitConflictError" in err, err
    assert where(oxlake.Table(table_path))[100] == ("sf", "a")


CITIES = ["sf", "nyc", "chennai"]
step = st.tuples(
    st.sampled_from(["upsert", "upsert", "delete", "compact", "clean"]),
    st.lists(
        st.tuples(
            st.integers(min_value=0, max_value=9),
            st.sampled_from(CITIES),
            st.integers(min_value=0, max_value=4),
        ),
        min_size=1,
        max_size=6,
    ),
)


@settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    table_type=st.sampled_from(["copy_on_write", "merge_on_read"]),
    record_index=st.booleans(),
    steps=st.lists(step, min_size=1, max_size=8),
)
def test_upserts_moving_keys_match_a_model(
    table_type: str, record_index: bool, steps: list[tuple[str, list[tuple[int, str, int]]]]
) -> None:
    """Random upserts (keys given random partitions and ordering values), deletes by key,
    compactions and cleans: the table always holds each key once, in the partition and with the
    version the model says (the greatest ordering value wins, ties to the later write)."""
    root = tempfile.mkdtemp(prefix="oxlake-global-")
    try:
        t = global_table(str(Path(root) / "t"), table_type)
        if record_index:
            t.build_metadata(record_index_shards=2)
        model: dict[int, dict[str, Any]] = {}
        for n, (kind, items) in enumerate(steps):
            if kind == "compact":
                if table_type == "merge_on_read":
                    t.compact()
                continue
            if kind == "clean":
                t.clean(retain=1)
                continue
            if kind == "delete":
                keys = sorted({i for i, _, _ in items})
                t.delete(keys)
                for i in keys:
                    model.pop(i, None)
                continue
            batch: dict[int, dict[str, Any]] = {}
            for i, city, ts in items:
                r = row(i, city, ts, f"s{n}-")
                if i not in batch or ts >= batch[i]["ts"]:
                    batch[i] = r
            t.upsert(table_of(list(batch.values())))
            for i, r in batch.items():
                if i not in model or r["ts"] >= model[i]["ts"]:
                    model[i] = r
            assert rows(t.scan()) == [model[i] for i in sorted(model)]
        assert rows(t.scan()) == [model[i] for i in sorted(model)]
        if record_index:
            assert t.validate().ok
    finally:
        shutil.rmtree(root, ignore_errors=True)


@pytest.mark.parametrize("log_ts", [11, 9], ids=["log-wins", "base-wins"])
def test_an_update_kept_in_its_old_file_group_is_merged_whatever_the_filter(
    table_path: str, log_ts: int
) -> None:
    """Apache Hudi's global indexes without `update.partition.path` keep an update in the record's
    old file group while its partition column names the new partition. Made here by moving the
    log of partition b's group into partition a's large group: keys 20000..20099 then have a base
    row with city 'a' and a log version with city 'b'. A filter naming the partition column with
    the key (so partitions cannot be pruned by it) must not drop the base rows before the merge:
    the winner is returned, or not, by the whole read and by splits cutting the group by rows."""
    schema = pa.schema([("id", pa.int64()), ("city", pa.string()), ("ts", pa.int64()), ("v", pa.string())])

    def data(ids: range, city: str, ts: int, tag: str) -> pa.Table:
        n = len(ids)
        values = {"id": list(ids), "city": [city] * n, "ts": [ts] * n, "v": [f"{tag}{i}" for i in ids]}
        return pa.table(values, schema=schema)

    # Version 8 names a log by the instant that wrote it; without the metadata table, the moved
    # file is listed where it now is.
    t = oxlake.create_table(
        table_path,
        schema,
        record_key="id",
        partition_by=["city"],
        ordering_field="ts",
        table_type="merge_on_read",
        table_version=8,
        metadata=False,
    )
    t.insert(data(range(30_000), "a", 10, "base"))
    t.upsert(data(range(0, 30_000, 1000), "a", 11, "upd"))
    (large,) = [g.file_id for g in t.file_groups() if g.partition == "city=a"]
    t.insert(data(range(20_000, 20_100), "b", 10, "b"))
    t.upsert(data(range(20_000, 20_100), "b", log_ts, "moved"))
    (small,) = [g.file_id for g in t.file_groups() if g.partition == "city=b"]
    for log in (Path(table_path) / "city=b").glob(f".{small}_*.log.*"):
        instant, version, token = log.name.removeprefix(f".{small}_").replace(".log.", "_", 1).split("_", 2)
        log.rename(Path(table_path) / "city=a" / f".{large}_{instant}.log.{int(version) + 1}_{token}")
    t = oxlake.Table(table_path)
    moved = sorted(f"moved{i}" for i in range(20_000, 20_100)) if log_ts > 10 else []
    # A filter on the partition column alone prunes partition a by its path, as Apache Hudi's
    # partition pruning does: the updates kept there are not read.
    for flt, want in [("city = 'b' OR id = -1", moved), ("city = 'b'", [])]:
        whole = sorted(t.to_arrow(filter=flt)["v"].to_pylist())
        assert [v for v in whole if v.startswith("moved")] == want, flt
        for pieces in (2, 3):
            splits = t.splits(filter=flt, min_splits=pieces)
            parts = pa.concat_tables([t.scan_split(s, filter=flt).to_arrow() for s in splits])
            assert sorted(parts["v"].to_pylist()) == whole, (flt, pieces)
    assert len(t.splits(min_splits=2)) >= 2, "the large group is cut"
