"""The indexes of the metadata table at work: column statistics and bloom filters prune planning,
the record index routes writes and lookups without reading the files it rules out."""

from __future__ import annotations

from pathlib import Path

import oxlake
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import hudi_read, rows, trips, trips_table
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st


def three_commits(t: oxlake.Table) -> None:
    t.insert(trips(list(range(60))))
    t.upsert(trips(list(range(0, 60, 3)), ts=2, name="u"))
    t.delete(trips([1, 4, 7]))


def expected(t: oxlake.Table, ids: list[int]) -> list[dict[str, object]]:
    return [r for r in rows(t.to_arrow()) if r["id"] in ids]


def key_rows(ids: list[int]) -> pa.Table:
    return pa.table({"id": pa.array(ids, pa.int64())})


@pytest.mark.parametrize("table_type", ["copy_on_write", "merge_on_read"])
@pytest.mark.parametrize("indexes", ["none", "bloom_filters", "record_index"])
def test_lookup_returns_the_current_rows_of_the_keys(tmp_path: Path, table_type: str, indexes: str) -> None:
    t = trips_table(str(tmp_path / "t"), table_type=table_type)
    three_commits(t)
    if indexes == "bloom_filters":
        t.build_metadata(record_index_shards=0)
    elif indexes == "record_index":
        t.build_metadata()
    ids = [0, 1, 2, 3, 30, 59, 1000]  # 1 was deleted, 1000 never existed
    got = rows(t.lookup(key_rows(ids)).select(t.to_arrow().column_names))
    assert got == expected(t, ids)
    assert [r["id"] for r in got] == [0, 2, 3, 30, 59]
    assert rows(t.lookup(key_rows([]))) == []
    assert t.lookup(key_rows([3]), columns=["id", "name"]).to_pylist() == [{"id": 3, "name": "u3"}]
    with pytest.raises(oxlake.InvalidArgumentError, match="record key column `id`"):
        t.lookup(pa.table({"other": [1]}))


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ids=st.lists(st.integers(-5, 70), max_size=12))
def test_lookup_equals_a_filtered_scan(tmp_path_factory: pytest.TempPathFactory, ids: list[int]) -> None:
    t = indexed_table(tmp_path_factory)
    assert rows(t.lookup(key_rows(ids)).select(t.to_arrow().column_names)) == expected(t, ids)


_INDEXED: dict[str, oxlake.Table] = {}


def indexed_table(factory: pytest.TempPathFactory) -> oxlake.Table:
    if "t" not in _INDEXED:
        t = trips_table(str(factory.mktemp("indexed") / "t"), table_type="merge_on_read")
        three_commits(t)
        t.build_metadata()
        t.upsert(trips(list(range(50, 70)), ts=3, name="late"))
        _INDEXED["t"] = t
    return _INDEXED["t"]


def spoil(path: Path) -> bytes:
    """Overwrites a data file with garbage (returns what it held): a read of it fails."""
    held = path.read_bytes()
    path.write_bytes(b"not parquet" * 10)
    return held


def test_the_record_index_routes_writes_and_lookups_without_reading_other_files(tmp_path: Path) -> None:
    t = trips_table(str(tmp_path / "t"))
    # Several file groups in city=sf (a small target size: new groups, no small-file filling).
    t.insert(trips(list(range(0, 120, 3)), city="sf"), target_file_size=200)
    t.build_metadata()
    holder = next(f for f in t.planned_files() if "city=sf" in f)
    keys_there = [int(k) for k in pq.read_table(Path(t.uri) / holder)["_hoodie_record_key"].to_pylist()]
    other = next(Path(t.uri) / f for f in t.planned_files() if "city=sf" in f and f != holder)
    held = spoil(other)
    with pytest.raises((oxlake.OxlakeError, pa.ArrowInvalid)):
        t.to_arrow()  # the spoiled file cannot be read...
    # ...yet only the group holding the keys is read: the spoiled file is never opened.
    assert [r["id"] for r in t.lookup(key_rows(keys_there[:2])).to_pylist()] == keys_there[:2]
    t.upsert(trips(keys_there[:2], ts=5, name="moved", city="sf"))
    other.write_bytes(held)
    assert t.validate().ok
    assert {r["id"]: r["name"] for r in t.lookup(key_rows(keys_there[:2])).to_pylist()} == {
        k: f"moved{k}" for k in keys_there[:2]
    }
    assert len(rows(t.to_arrow())) == 40


@pytest.mark.parametrize("table_type", ["copy_on_write", "merge_on_read"])
def test_lookups_plan_only_the_groups_the_record_index_names_through_every_service(
    tmp_path: Path, table_type: str
) -> None:
    """A lookup through the record index plans only the partitions the index names (the `files`
    index read by path prefix): partitions whose names start others' (`sf`, `sf2`, `sf 3`),
    logs, a compaction, a clustering that replaces the groups and a clean all read the same rows
    as a filtered scan."""
    t = trips_table(str(tmp_path / "t"), table_type=table_type)
    t.build_metadata()
    cities = ["sf", "sf2", "sf 3", "s"]
    for n, city in enumerate(cities):
        t.insert(trips(list(range(n * 100, n * 100 + 40)), city=city), target_file_size=400)
    ids = [0, 1, 39, 40, 100, 139, 205, 238, 300, 339, 999]

    def check() -> None:
        # A key upserted into a second partition (no global index) is there twice.
        def by_key(found: list[dict[str, object]]) -> list[dict[str, object]]:
            return sorted(found, key=lambda r: (r["id"], r["city"]))

        got = rows(t.lookup(key_rows(ids)).select(t.to_arrow().column_names))
        assert by_key(got) == by_key(expected(t, ids))

    check()
    for n, city in enumerate(cities):
        t.upsert(trips([n * 100, n * 100 + 39], ts=2, name="u", city=city))
    t.delete(trips([205], city="sf 3"))
    check()
    assert {r["id"] for r in t.lookup(key_rows(ids)).to_pylist()} == {0, 1, 39, 100, 139, 238, 300, 339}
    if table_type == "merge_on_read":
        assert t.compact().file_groups > 0
        check()
    assert t.cluster().replaced_file_groups > 0
    check()
    t.upsert(trips([1, 238], ts=3, name="after", city=None))
    check()
    t.clean(retain=1)
    check()
    assert t.validate().ok


def test_bloom_filters_route_writes_when_there_is_no_record_index(tmp_path: Path) -> None:
    t = trips_table(str(tmp_path / "t"))
    t.insert(trips(list(range(0, 40)), city="sf"), target_file_size=200)
    t.build_metadata(record_index_shards=0, column_stats_shards=0)
    files = sorted(t.planned_files())
    assert len(files) > 1
    untouched = next(
        f for f in files if "5" not in pq.read_table(Path(t.uri) / f)["_hoodie_record_key"].to_pylist()
    )
    held = spoil(Path(t.uri) / untouched)
    with pytest.raises((oxlake.OxlakeError, pa.ArrowInvalid)):
        t.to_arrow()
    # The spoiled file's bloom filter rules out key 5: the upsert reads only the other file.
    t.upsert(trips([5], ts=9, name="b", city="sf"))
    (Path(t.uri) / untouched).write_bytes(held)
    assert t.validate().ok
    assert [r for r in rows(t.to_arrow()) if r["id"] == 5][0]["name"] == "b5"
    assert len(rows(t.to_arrow())) == 40


@pytest.mark.parametrize("table_type", ["copy_on_write", "merge_on_read"])
def test_column_stats_and_bloom_filters_prune_planning(tmp_path: Path, table_type: str) -> None:
    t = trips_table(str(tmp_path / "t"), table_type=table_type)
    # One file group per day (a partition each), each with its own range of `ts` and ids.
    for day in range(5):
        t.insert(trips(list(range(day * 100, day * 100 + 50)), ts=day, city=f"c{day}"))
    all_files = t.planned_files(filter="ts >= 3")
    assert len(all_files) == 5  # no metadata table: nothing to prune with
    t.build_metadata()
    assert len(t.planned_files()) == 5
    pruned = t.planned_files(filter="ts >= 3")
    assert len(pruned) == 2
    assert len(t.planned_files(filter=[("ts", "=", 2)])) == 1
    assert len(t.planned_files(filter="ts > 100")) == 0
    # Float columns do not prune: statistics leave NaN out, which `fare > x` holds for.
    assert len(t.planned_files(filter="fare > 100000")) == 5
    assert len(t.planned_files(filter="ts > 100 AND fare > 100000")) == 0
    # Equality on the record key: the bloom filters rule out the other files.
    assert len(t.planned_files(filter="_hoodie_record_key = '205'")) == 1
    assert len(t.planned_files(filter="id = 205")) == 1
    everything = rows(t.to_arrow())
    checks = {
        "ts >= 3": lambda r: r["ts"] >= 3,
        "id = 205": lambda r: r["id"] == 205,
        "fare > 100000": lambda r: r["fare"] > 100000,
        "ts = 2 OR id = 7": lambda r: r["ts"] == 2 or r["id"] == 7,
    }
    for sql, keep in checks.items():
        assert rows(t.to_arrow(filter=sql)) == [r for r in everything if keep(r)], sql
    assert rows(hudi_read(t.uri)) == everything
    # A merge-on-read slice whose log holds a row passing the filter is kept.
    t.upsert(trips([10], ts=9, city="c0"))
    assert {r["id"] for r in rows(t.to_arrow(filter="ts >= 9"))} == {10}
    assert t.validate().ok


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ids=st.lists(st.integers(-10, 3_010), max_size=40))
def test_lookups_read_single_pages_of_a_large_record_index(
    tmp_path_factory: pytest.TempPathFactory, ids: list[int]
) -> None:
    """One record-index shard of 3,000 keys spans many 256-row pages: a lookup prunes pages by
    the page index and still finds every key, including those at page boundaries."""
    if "large" not in _INDEXED:
        t = trips_table(str(tmp_path_factory.mktemp("large") / "t"))
        t.insert(trips(list(range(3_000))))
        t.build_metadata(1, column_stats_shards=0, bloom_filters_shards=0, record_index_shards=1)
        t.delete(trips([5, 500, 2_999]))
        _INDEXED["large"] = t
    t = _INDEXED["large"]
    got = sorted(t.lookup(key_rows(ids), columns=["id"]).column("id").to_pylist())
    assert got == sorted({i for i in ids if 0 <= i < 3_000 and i not in (5, 500, 2_999)})


def test_a_commit_larger_than_a_log_block_is_indexed_whole(tmp_path: Path) -> None:
    """A commit writes the record index as log blocks of 65,536 records, shards encoded side by
    side: 200,000 keys in two shards span several blocks each; an upsert and a delete of keys
    from every block then route by them, and lookups find the current rows."""
    t = trips_table(str(tmp_path / "t"), table_type="merge_on_read")
    t.build_metadata(1, column_stats_shards=0, bloom_filters_shards=0, record_index_shards=2)
    n = 200_000
    t.insert(trips(list(range(n))))
    changed = list(range(0, n, 3))
    upserted = t.upsert(trips(changed + [n, n + 1], ts=2, name="u"))
    assert (upserted.num_updates, upserted.num_inserts) == (len(changed), 2)
    gone = list(range(1, n, 1_000))
    t.delete(trips(gone))
    assert oxlake.Table(t.uri).validate().ok
    probe = [0, 1, 2, 65_535, 65_536, 65_537, 131_072, 199_998, 199_999, n, n + 1, n + 2]
    got = {r["id"]: r["name"] for r in rows(t.lookup(key_rows(probe)))}
    want = {i: ("u" if i % 3 == 0 or i >= n else "n") + str(i) for i in probe if i <= n + 1 and i not in gone}
    assert got == want


def duplicated(path: str, table_type: str, how: str, indexes: str) -> oxlake.Table:
    """A table holding key 1 twice in `nyc`, in two file groups (key 4 beside the first copy): an
    insert of a stored key into a merge-on-read table goes to a new file group without a lookup
    (as in Apache Hudi), and so does every row of a bulk insert. `indexes`: `record_index` is
    built first and kept in step by the writes, `record_index_built` and `bloom_filters` are built
    after them."""
    t = trips_table(path, table_type=table_type)
    if indexes == "record_index":
        t.build_metadata()
    write = t.insert if how == "insert" else t.bulk_insert
    write(trips([1, 4]))
    write(trips([1], name="dup"))
    if indexes == "record_index_built":
        t.build_metadata()
    elif indexes == "bloom_filters":
        t.build_metadata(record_index_shards=0)
    assert len(t.file_groups()) == 2
    assert names(t.to_arrow()) == [(1, "dup1"), (1, "n1"), (4, "n4")]
    return t


def names(data: pa.Table) -> list[tuple[int, str]]:
    return sorted((r["id"], r["name"]) for r in data.to_pylist())


#: The ways a key gets two copies in two file groups of one partition.
DUPLICATES = pytest.mark.parametrize(
    ("table_type", "how"),
    [("copy_on_write", "bulk_insert"), ("merge_on_read", "insert"), ("merge_on_read", "bulk_insert")],
)
#: Each attempt makes new file ids: the two groups come in either order.
ATTEMPTS = 4


@DUPLICATES
@pytest.mark.parametrize("indexes", ["none", "bloom_filters"])
def test_a_delete_reaches_every_copy_of_a_key(
    tmp_path: Path, table_type: str, how: str, indexes: str
) -> None:
    """A delete of a key held in two file groups deletes both copies, as Apache Hudi's simple and
    bloom indexes tag every location of a key (it reached one: the group whose file id came first)."""
    for attempt in range(ATTEMPTS):
        t = duplicated(str(tmp_path / str(attempt)), table_type, how, indexes)
        deleted = t.delete(trips([1], ts=2))
        assert deleted.num_deletes == 2
        assert names(t.to_arrow()) == [(4, "n4")]
        if table_type == "merge_on_read":
            assert t.compact().instants
            assert names(t.to_arrow(query="read_optimized")) == [(4, "n4")]
        assert deleted.instant is not None
        after = [i.time for i in t.timeline() if i.state == "completed" and i.time >= deleted.instant]
        assert after and all(names(t.to_arrow(as_of=time)) == [(4, "n4")] for time in after)
        if indexes != "none":
            assert t.validate().ok


@DUPLICATES
@pytest.mark.parametrize("indexes", ["none", "bloom_filters"])
def test_an_upsert_updates_every_copy_of_a_key(
    tmp_path: Path, table_type: str, how: str, indexes: str
) -> None:
    """An upsert of a key held in two file groups updates both copies: no stale copy is left."""
    for attempt in range(ATTEMPTS):
        t = duplicated(str(tmp_path / str(attempt)), table_type, how, indexes)
        written = t.upsert(trips([1, 7], ts=2, name="new"))
        assert (written.num_updates, written.num_inserts) == (2, 1)
        both = [(1, "new1"), (1, "new1"), (4, "n4"), (7, "new7")]
        assert names(t.to_arrow()) == both
        if table_type == "merge_on_read":
            assert t.compact().instants
            assert names(t.to_arrow(query="read_optimized")) == both
        if indexes != "none":
            assert t.validate().ok


@DUPLICATES
@pytest.mark.parametrize("indexes", ["record_index", "record_index_built"], ids=["kept", "built"])
def test_with_the_record_index_a_write_reaches_the_copy_written_last(
    tmp_path: Path, table_type: str, how: str, indexes: str
) -> None:
    """The record index places a key in one file group per partition: of two copies, the one
    written last, whether kept in step (the last write's group) or built (the latest slice). A
    delete or an upsert routed by it reaches that copy alone, as with Apache Hudi's record index,
    which holds one location per key; the older copy stays, the same way every time. Once the
    copy the index placed is deleted, `validate` names the one left, and a build places it."""
    for attempt in range(ATTEMPTS):
        t = duplicated(str(tmp_path / f"delete{attempt}"), table_type, how, indexes)
        assert t.delete(trips([1], ts=2)).num_deletes == 1
        assert names(t.to_arrow()) == [(1, "n1"), (4, "n4")]
        differences = t.validate().differences
        assert len(differences) == 1 and "1 @ city=nyc" in differences[0], differences
        t.build_metadata()
        assert t.validate().ok
        assert t.delete(trips([1], ts=3)).num_deletes == 1
        assert names(t.to_arrow()) == [(4, "n4")]
        t = duplicated(str(tmp_path / f"upsert{attempt}"), table_type, how, indexes)
        t.upsert(trips([1], ts=2, name="new"))
        assert names(t.to_arrow()) == [(1, "n1"), (1, "new1"), (4, "n4")]
        assert t.validate().ok
