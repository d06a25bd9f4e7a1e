"""Tables without meta fields (Apache Hudi's virtual keys, `hoodie.populate.meta.fields=false`):
data files keep the five `_hoodie_*` columns, all null, and every reader and writer makes a row's
key from its record key fields. Every operation and service gives what it gives on a table with
meta fields; `tests/test_model.py` runs its model on both, `tests/test_compat.py` and
`tests/test_version8.py` write into the ones Apache Hudi wrote."""

from __future__ import annotations

from pathlib import Path

import oxlake
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import hudi_read, rows, trips, trips_table

META = ["_hoodie_commit_time", "_hoodie_commit_seqno", "_hoodie_record_key", "_hoodie_partition_path"]
DATA = ["id", "name", "city", "ts", "fare"]


def data_files(path: str) -> list[Path]:
    return [p for p in Path(path).rglob("*.parquet") if ".hoodie" not in p.parts]


def history(t: oxlake.Table, merge_on_read: bool) -> None:
    """Every write and service, keys in partitions with hostile names included."""
    t.insert(trips(list(range(20))))
    t.insert(trips([50, 51], city="東京 %/,=x"))
    t.upsert(trips([1, 2, 3, 30], ts=2, name="u"))
    t.upsert(trips([2], ts=1, name="stale"))  # loses to the stored ts=2
    t.delete(trips([4, 5]))
    t.upsert(trips([50], ts=4, city="東京 %/,=x", name="h"))
    if merge_on_read:
        t.compact()
    t.cluster(sort_by=["fare"], small_file_limit=1 << 40)
    t.upsert(trips([6, 7], ts=5, name="post"))
    t.insert_overwrite(trips([60, 61], city="nyc", name="o"))
    t.bulk_insert(trips([70, 71], city="la"))


@pytest.mark.parametrize("table_version", [6, 8])
@pytest.mark.parametrize("table_type", ["copy_on_write", "merge_on_read"])
def test_every_operation_and_service_gives_what_a_table_with_meta_fields_gives(
    tmp_path: Path, table_type: str, table_version: int
) -> None:
    tables = {}
    for meta_fields in (True, False):
        path = str(tmp_path / f"t{meta_fields}")
        t = trips_table(path, table_type=table_type, table_version=table_version, meta_fields=meta_fields)
        history(t, table_type == "merge_on_read")
        tables[meta_fields] = (path, t)
    (_, meta), (path, virtual) = tables[True], tables[False]
    assert virtual.properties["hoodie.populate.meta.fields"] == "false"

    # Time travel (the same operations make the same instants, in order).
    def commits(t: oxlake.Table) -> list[str]:
        return [i.time for i in t.timeline() if i.state == "completed"]

    for ours, theirs in zip(commits(meta), commits(virtual), strict=True):
        assert rows(virtual.to_arrow(columns=DATA, as_of=theirs)) == rows(
            meta.to_arrow(columns=DATA, as_of=ours)
        )
    for t in (meta, virtual):
        t.clean(policy="keep_latest_commits", retain=1)
    expected = rows(meta.to_arrow(columns=DATA))
    assert rows(virtual.to_arrow(columns=DATA)) == expected
    assert rows(oxlake.Table(path).to_arrow(columns=DATA)) == expected
    assert rows(virtual.to_arrow(columns=DATA, filter="id = 2")) == [r for r in expected if r["id"] == 2]
    assert len({r["id"] for r in expected}) == len(expected)
    assert rows(hudi_read(path).select(DATA)) == expected
    # As Apache Hudi writes them: the meta columns are there, and null.
    for f in data_files(path):
        base = pq.read_table(f)
        assert base.column_names[:5] == [*META, "_hoodie_file_name"]
        assert all(base[c].null_count == base.num_rows for c in META), f
    assert rows(virtual.to_arrow(columns=DATA, query="read_optimized")) == rows(
        meta.to_arrow(columns=DATA, query="read_optimized")
    )


@pytest.mark.parametrize("table_type", ["copy_on_write", "merge_on_read"])
def test_an_incremental_window_admits_whole_files_of_its_commits(tmp_path: Path, table_type: str) -> None:
    """No row carries its commit time: a window holds every row its commits wrote, and the other
    rows of the files they wrote, each as it is at the window's end."""
    t = trips_table(str(tmp_path / "t"), table_type=table_type, meta_fields=False)
    first = t.insert(trips(list(range(9))))
    second = t.upsert(trips([0, 3], ts=2, name="u"))  # both in "sf"
    bound = {i.time: i.completion or i.time for i in t.timeline()}
    window = rows(t.to_arrow(columns=DATA, query="incremental", start=bound[first.instant]))
    names = {r["id"]: r["name"] for r in window}
    assert names[0] == "u0" and names[3] == "u3"
    assert {r["city"] for r in window} == {"sf"}, "only the files the upsert wrote"
    assert all(r in rows(t.to_arrow(columns=DATA)) for r in window)
    assert second.instant is not None


def test_the_bloom_index_routes_writes_by_keys_made_from_the_fields(tmp_path: Path) -> None:
    """The metadata table's bloom filters hold the keys the key generator makes (the meta column
    would give every file an empty filter, and every upsert would insert a second copy). The
    record index, kept from stored keys, is left out by default and refused when asked for."""
    path = str(tmp_path / "t")
    t = oxlake.create_table(
        path,
        trips([0]).schema,
        record_key=["id", "city"],
        partition_by=["city"],
        ordering_field="ts",
        meta_fields=False,
    )
    t.insert(trips(list(range(30))))
    t.build_metadata(files_shards=2)
    assert "record_index" not in t.properties["oxlake.metadata.partitions"]
    with pytest.raises(oxlake.UnsupportedError, match="record index of a table without meta fields"):
        t.build_metadata(record_index_shards=2)
    t.upsert(trips([1, 2, 29], ts=3, name="u"))
    assert t.validate().ok
    got = rows(t.to_arrow(columns=DATA))
    assert [r["id"] for r in got] == list(range(30))
    assert {r["id"]: r["name"] for r in got if r["name"].startswith("u")} == {1: "u1", 2: "u2", 29: "u29"}
    assert rows(t.to_arrow(columns=DATA, filter="id = 29")) == [r for r in got if r["id"] == 29]


def test_a_key_field_that_is_null_in_a_stored_file_is_an_error_naming_it(tmp_path: Path) -> None:
    """A stored row whose key fields make no key (a null key, which no writer stores) fails the
    write that has to route by it, naming the file, and the table is left as it was."""
    path = str(tmp_path / "t")
    t = trips_table(path, meta_fields=False)
    t.insert(trips([0, 3, 6]))
    (f,) = [p for p in data_files(path) if "city=sf" in str(p)]
    damaged = pq.read_table(f)
    i = damaged.column_names.index("id")
    field = damaged.schema.field(i).with_nullable(True)
    pq.write_table(damaged.set_column(i, field, pa.nulls(damaged.num_rows, pa.int64())), f)
    before = [i.time for i in t.timeline()]
    with pytest.raises(oxlake.CorruptTableError, match="city=sf"):
        t.upsert(trips([3], ts=2, name="u"))
    after = oxlake.Table(path).timeline()
    assert [i.time for i in after if i.action == "commit"] == before, "the failed write was rolled back"
    assert all(i.state == "completed" for i in after)


def test_the_cli_creates_a_table_without_meta_fields_and_bulk_inserts_sorted(tmp_path: Path) -> None:
    import subprocess
    import sys

    path = str(tmp_path / "t")
    pq.write_table(trips([5, 1, 4, 2, 3]), tmp_path / "a.parquet")
    create = ["--record-key", "id", "--partition-by", "city", "--ordering-field", "ts", "--no-meta-fields"]
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "oxlake.cli",
            "bulk-insert",
            path,
            str(tmp_path / "a.parquet"),
            *create,
            "--sort-mode",
            "global_sort",
        ],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    t = oxlake.Table(path)
    assert t.properties["hoodie.populate.meta.fields"] == "false"
    for f in data_files(path):
        keys = [str(i) for i in pq.read_table(f)["id"].to_pylist()]
        assert keys == sorted(keys), "global_sort lays each file out by record key"
    t.upsert(trips([3], ts=2, name="u"))
    assert [(r["id"], r["name"]) for r in rows(t.to_arrow())] == [
        (1, "n1"),
        (2, "n2"),
        (3, "u3"),
        (4, "n4"),
        (5, "n5"),
    ]


@pytest.mark.parametrize("table_type", ["copy_on_write", "merge_on_read"])
def test_lookup_merge_and_a_global_index_read_the_key_fields(tmp_path: Path, table_type: str) -> None:
    """What the record key column served elsewhere, the key fields serve here: `lookup` (its
    `_hoodie_record_key` holds the key), `merge`, and a global index moving a key to another
    partition, each as on a table with meta fields."""
    import pyarrow.compute as pc

    results = {}
    for meta_fields in (True, False):
        t = trips_table(
            str(tmp_path / f"t{meta_fields}"),
            table_type=table_type,
            global_index=True,
            meta_fields=meta_fields,
        )
        t.insert(trips(list(range(12))))
        found = t.lookup(trips([4, 7, 99]))
        assert sorted(found["id"].to_pylist()) == [4, 7]
        assert sorted(found["_hoodie_record_key"].to_pylist()) == ["4", "7"]
        assert t.lookup(trips([5]), columns=["name"]).to_pylist() == [{"name": "n5"}]
        t.upsert(trips([1], ts=3, city="la", name="moved"))  # from "nyc" to "la"
        S = pc.field
        t.merge(trips([2, 40], ts=4, name="m")).when_matched_update(
            {"name": S("source", "name")}, condition=S("source", "ts") > S("target", "ts")
        ).when_not_matched_insert_all().execute()
        results[meta_fields] = rows(t.to_arrow(columns=DATA))
    assert results[False] == results[True]
    got = {r["id"]: (r["city"], r["name"]) for r in results[False]}
    assert got[1] == ("la", "moved1") and got[2][1] == "m2" and got[40][1] == "m40"
    assert len(results[False]) == 13
