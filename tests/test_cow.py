"""Copy-on-write operations, each checked by reading rows back."""

from __future__ import annotations

from pathlib import Path

import oxlake
import pyarrow as pa
import pytest
from conftest import SCHEMA, checkpoint, rows, trips, trips_table


def expected(*tables: pa.Table) -> list[dict]:
    """Upsert semantics by key (later tables win) as sorted rows."""
    by_key: dict[int, dict] = {}
    for t in tables:
        for r in t.to_pylist():
            by_key[r["id"]] = r
    return sorted(by_key.values(), key=lambda r: r["id"])


def test_insert_then_read(table: oxlake.Table) -> None:
    data = trips(list(range(10)))
    res = table.insert(data)
    assert res.instant is not None and res.num_inserts == 10 and res.num_updates == 0
    assert rows(table.scan()) == rows(data)
    # Every partition got its marker file and one base file.
    base = Path(table.uri)
    for city in ("sf", "nyc", "chennai"):
        assert (base / f"city={city}" / ".hoodie_partition_metadata").exists()
        assert len(list((base / f"city={city}").glob("*.parquet"))) == 1


def test_meta_fields_are_filled_like_hudi(table: oxlake.Table) -> None:
    res = table.insert(trips([1, 2]))
    out = table.to_arrow().to_pylist()
    for r in out:
        assert r["_hoodie_commit_time"] == res.instant
        assert r["_hoodie_record_key"] == str(r["id"])
        assert r["_hoodie_partition_path"] == f"city={r['city']}"
        assert r["_hoodie_commit_seqno"].startswith(f"{res.instant}_")
        assert r["_hoodie_file_name"].endswith(f"_{res.instant}.parquet")
        assert r["_hoodie_file_name"] in {Path(f).name for f in res.files}
    assert table.schema.names[:5] == [
        "_hoodie_commit_time",
        "_hoodie_commit_seqno",
        "_hoodie_record_key",
        "_hoodie_partition_path",
        "_hoodie_file_name",
    ]


def test_upsert_updates_and_inserts_keeping_unchanged_meta(table: oxlake.Table) -> None:
    first = table.insert(trips(list(range(6))))
    change = trips([1, 4, 7], ts=2, name="new")
    res = table.upsert(change)
    assert (res.num_updates, res.num_inserts) == (2, 1)
    assert rows(table.scan()) == expected(trips(list(range(6))), change)
    by_id = {r["id"]: r for r in table.to_arrow().to_pylist()}
    # Unchanged rows keep the commit time and sequence number of their insert.
    assert by_id[0]["_hoodie_commit_time"] == first.instant
    assert by_id[1]["_hoodie_commit_time"] == res.instant
    assert by_id[7]["_hoodie_commit_time"] == res.instant


def test_event_time_ordering_keeps_the_newer_row(table: oxlake.Table) -> None:
    table.insert(trips([1, 2], ts=10))
    res = table.upsert(trips([1, 2], ts=5, name="stale"))
    assert res.num_updates == 0
    assert [r["name"] for r in rows(table.scan())] == ["n1", "n2"]


def test_duplicates_in_one_batch_are_combined_by_ordering(table: oxlake.Table) -> None:
    batch = pa.concat_tables(
        [trips([1], ts=3, name="b"), trips([1], ts=9, name="a"), trips([1], ts=4, name="c")]
    )
    res = table.insert(batch)
    assert res.num_inserts == 1
    assert [r["name"] for r in rows(table.scan())] == ["a1"]


def test_delete(table: oxlake.Table) -> None:
    table.insert(trips(list(range(9))))
    res = table.delete(trips([0, 4, 8]).select(["id", "city"]))
    assert res.num_deletes == 3
    assert [r["id"] for r in rows(table.scan())] == [1, 2, 3, 5, 6, 7]


def test_delete_with_lower_ordering_value_loses(table: oxlake.Table) -> None:
    table.insert(trips([1, 2], ts=10))
    res = table.delete(trips([1, 2], ts=5).select(["id", "city", "ts"]))
    assert res.num_deletes == 0
    assert [r["id"] for r in rows(table.scan())] == [1, 2]


def test_insert_overwrite_replaces_only_present_partitions(table: oxlake.Table) -> None:
    table.insert(trips(list(range(9))))
    res = table.insert_overwrite(trips([100, 103], city="sf"))
    assert res.instant is not None
    assert table.timeline()[-1].action == "replacecommit"
    got = {(r["id"], r["city"]) for r in table.to_arrow().to_pylist()}
    others = {(i, c) for i, c in ((i, ["sf", "nyc", "chennai"][i % 3]) for i in range(9)) if c != "sf"}
    assert got == others | {(100, "sf"), (103, "sf")}


def test_insert_overwrite_table(table: oxlake.Table) -> None:
    table.insert(trips(list(range(9))))
    table.insert_overwrite_table(trips([50]))
    assert [r["id"] for r in rows(table.scan())] == [50]


def test_time_travel_to_every_instant(table: oxlake.Table) -> None:
    states = []
    table.insert(trips([1, 2, 3]))
    states.append(rows(table.scan()))
    table.upsert(trips([2, 4], ts=2, name="x"))
    states.append(rows(table.scan()))
    table.delete(trips([1]).select(["id", "city"]))
    states.append(rows(table.scan()))
    table.insert_overwrite(trips([9], city="nyc"))
    states.append(rows(table.scan()))
    commits = [i for i in table.timeline() if i.state == "completed"]
    assert len(commits) == 4
    for instant, state in zip(commits, states, strict=True):
        assert rows(table.scan(as_of=instant.time)) == state
    # Before the first commit the table did not exist: an error, not an empty table.
    with pytest.raises(oxlake.InvalidArgumentError, match="before the table's first commit"):
        table.to_arrow(as_of="20000101000000000")


def test_time_travel_by_datetime_and_iso_strings(table: oxlake.Table) -> None:
    """`as_of`, `start` and `end` take datetimes (with a zone: converted to the timeline's UTC;
    without: taken as UTC), pandas Timestamps, dates and ISO strings, all meaning the same instant."""
    import datetime as dt

    import pandas as pd

    first = table.insert(trips([1, 2])).instant
    assert first is not None
    table.upsert(trips([3], ts=2))
    when = dt.datetime.strptime(first, "%Y%m%d%H%M%S%f").replace(tzinfo=dt.UTC)
    expected_first = rows(table.scan(as_of=first))
    assert [r["id"] for r in expected_first] == [1, 2]
    paris = dt.timezone(dt.timedelta(hours=1))
    iso = when.strftime("%Y-%m-%dT%H:%M:%S.") + first[14:]
    for as_of in (when, when.astimezone(paris), when.replace(tzinfo=None), pd.Timestamp(when), iso):
        assert rows(table.scan(as_of=as_of)) == expected_first, as_of
    assert rows(table.scan(query="incremental", start=when)) == rows(
        table.scan(query="incremental", start=first)
    )
    with pytest.raises(oxlake.InvalidArgumentError, match="before the table's first commit"):
        table.to_arrow(as_of=dt.date(2000, 1, 1))
    assert [r["id"] for r in rows(table.scan(as_of=dt.date(2999, 1, 1)))] == [1, 2, 3]
    assert table.schema_as_of(when).names == table.schema.names


def test_read_arguments_of_the_wrong_shape_are_explained(table: oxlake.Table) -> None:
    import pyarrow.compute as pc

    table.insert(trips([1, 2]))
    with pytest.raises(oxlake.InvalidArgumentError, match=r"did you mean columns=\['id'\]"):
        table.to_arrow(columns="id")
    with pytest.raises(oxlake.InvalidArgumentError, match="not a pyarrow Expression|write it as SQL"):
        table.to_arrow(filter=pc.field("id") == 1)
    with pytest.raises(oxlake.InvalidArgumentError, match=r"not a \(column, op, value\) tuple"):
        table.to_arrow(filter=[("id", 1)])
    with pytest.raises(oxlake.InvalidArgumentError, match="`as_of` takes an instant time"):
        table.to_arrow(as_of=12345)
    assert [r["id"] for r in rows(table.scan(filter=[("id", "=", 1)]))] == [1]


def test_delete_takes_a_list_of_keys_or_of_rows(table: oxlake.Table, tmp_path: Path) -> None:
    table.insert(trips([1, 2, 3, 4]))
    table.delete([{"id": 1, "city": trips([1])["city"][0].as_py()}])
    assert [r["id"] for r in rows(table.scan())] == [2, 3, 4]
    # A partitioned table needs each key's partition: a plain list is refused, saying what to give.
    with pytest.raises(oxlake.InvalidArgumentError, match=r"\['id', 'city'\] for each row"):
        table.delete([2, 3])
    with pytest.raises(oxlake.InvalidArgumentError, match=r"lack the key or partition columns \['city'\]"):
        table.delete([{"id": 2}])
    assert [r["id"] for r in rows(table.scan())] == [2, 3, 4]
    flat = oxlake.create_table(str(tmp_path / "flat"), SCHEMA, record_key="id", ordering_field="ts")
    flat.insert(trips([1, 2, 3, 4]))
    flat.delete([2, 4])
    assert [r["id"] for r in rows(flat.scan())] == [1, 3]


def test_incremental_between_consecutive_instants(table: oxlake.Table) -> None:
    a = table.insert(trips([1, 2, 3]))
    b = table.upsert(trips([2, 4], ts=2, name="x"))
    c = table.upsert(trips([3], ts=3, name="y"))

    def window(start: str | None, end: str | None) -> list[int]:
        out = table.to_arrow(query="incremental", start=start, end=end)
        return sorted(out["id"].to_pylist())

    a, b, c = checkpoint(a), checkpoint(b), checkpoint(c)
    assert window(None, a) == [1, 2, 3]
    assert window(a, b) == [2, 4]
    assert window(b, c) == [3]
    assert window(c, None) == []
    assert window(a, None) == [2, 3, 4]


def test_filters_sql_and_tuples(table: oxlake.Table) -> None:
    table.insert(trips(list(range(30))))
    sql = rows(table.scan(filter="city = 'sf' AND fare > 20"))
    tup = rows(table.scan(filter=[("city", "=", "sf"), ("fare", ">", 20)]))
    want = [r for r in rows(trips(list(range(30)))) if r["city"] == "sf" and r["fare"] > 20]
    assert sql == tup == want
    assert rows(table.scan(filter=[("id", "in", [1, 2, 3])])) == rows(trips([1, 2, 3]))
    assert rows(table.scan(filter=[("city", "not in", ["sf", "nyc"])])) == [
        r for r in rows(trips(list(range(30)))) if r["city"] == "chennai"
    ]


def test_partition_pruning_reads_only_matching_partitions(table: oxlake.Table) -> None:
    table.insert(trips(list(range(30))))
    out = table.scan(filter="city = 'nyc'", columns=["id", "city"]).to_arrow()
    assert set(out["city"].to_pylist()) == {"nyc"}
    assert out.column_names == ["id", "city"]


def test_columns_projection_and_order(table: oxlake.Table) -> None:
    table.insert(trips([1, 2]))
    out = table.to_arrow(columns=["fare", "id"])
    assert out.column_names == ["fare", "id"]
    assert out.schema.field("fare").type == pa.float64()


def test_complex_keys_non_partitioned(table_path: str) -> None:
    schema = pa.schema([("k1", pa.int32()), ("k2", pa.string()), ("v", pa.int64())])
    t = oxlake.create_table(table_path, schema, record_key=["k1", "k2"])
    t.insert(pa.table({"k1": [1, 1, 2], "k2": ["a", "b", "a"], "v": [1, 2, 3]}, schema=schema))
    t.upsert(pa.table({"k1": [1], "k2": ["b"], "v": [20]}, schema=schema))
    out = t.to_arrow()
    assert sorted(out["_hoodie_record_key"].to_pylist()) == ["k1:1,k2:a", "k1:1,k2:b", "k1:2,k2:a"]
    assert set(out["_hoodie_partition_path"].to_pylist()) == {""}
    assert sorted(zip(out["k1"].to_pylist(), out["k2"].to_pylist(), out["v"].to_pylist(), strict=True)) == [
        (1, "a", 1),
        (1, "b", 20),
        (2, "a", 3),
    ]
    assert not [p for p in Path(table_path).iterdir() if p.is_dir() and p.name != ".hoodie"]


def test_plain_partition_paths_multiple_fields(table_path: str) -> None:
    schema = pa.schema([("id", pa.int64()), ("country", pa.string()), ("year", pa.int32())])
    t = oxlake.create_table(
        table_path, schema, record_key="id", partition_by=["country", "year"], hive_style=False
    )
    t.insert(
        pa.table({"id": [1, 2, 3], "country": ["fr", "fr", "in"], "year": [2023, 2024, 2024]}, schema=schema)
    )
    assert (Path(table_path) / "fr" / "2024").is_dir()
    assert sorted(r["id"] for r in t.to_arrow(filter=[("year", "=", 2024)]).to_pylist()) == [2, 3]
    assert sorted(r["id"] for r in t.to_arrow(filter="country = 'fr' AND year < 2024").to_pylist()) == [1]


def test_empty_inputs_write_nothing(table: oxlake.Table) -> None:
    res = table.insert(trips([]))
    assert res.instant is None and res.files == []
    assert table.timeline() == []
    assert table.to_arrow().num_rows == 0
    assert table.to_arrow().schema == table.schema


def test_nulls_in_non_key_columns(table: oxlake.Table) -> None:
    data = pa.table(
        {"id": [1, 2], "name": [None, "b"], "city": ["sf", None], "ts": [1, None], "fare": [None, 2.0]},
        schema=SCHEMA,
    )
    table.insert(data)
    out = rows(table.scan())
    assert out == [
        {"id": 1, "name": None, "city": "sf", "ts": 1, "fare": None},
        {"id": 2, "name": "b", "city": None, "ts": None, "fare": 2.0},
    ]
    assert (Path(table.uri) / "city=__HIVE_DEFAULT_PARTITION__").is_dir()


def test_pandas_input_and_output(table: oxlake.Table) -> None:
    df = trips([1, 2, 3]).to_pandas()
    table.insert(df)
    out = table.to_pandas(columns=["id", "name"]).sort_values("id")
    assert out["id"].tolist() == [1, 2, 3] and out["name"].tolist() == ["n1", "n2", "n3"]


def test_stream_interface(table: oxlake.Table) -> None:
    table.insert(trips(list(range(100))))
    scan = table.scan(batch_size=16)
    batches = list(scan)
    assert all(isinstance(b, pa.RecordBatch) for b in batches)
    assert sum(b.num_rows for b in batches) == 100
    assert max(b.num_rows for b in batches) <= 16
    # Any consumer of the Arrow PyCapsule interface takes the stream.
    reader = pa.RecordBatchReader.from_stream(table.scan(columns=["id"]))
    assert reader.read_all().num_rows == 100
    # Strings are plain strings, never view types.
    assert table.schema.field("name").type == pa.string()


def test_small_files_take_inserts(table_path: str) -> None:
    t = oxlake.create_table(table_path, SCHEMA, record_key="id", ordering_field="ts")
    t.insert(trips(list(range(10))))
    res = t.insert(trips(list(range(10, 20))))
    assert len(t.file_groups()) == 1, "the second insert tops up the small file"
    assert res.num_inserts == 10
    assert [r["id"] for r in rows(t.scan())] == list(range(20))


def test_target_file_size_splits_new_groups(table_path: str) -> None:
    t = oxlake.create_table(table_path, SCHEMA, record_key="id", ordering_field="ts")
    t.insert(trips(list(range(1000))))
    # The first commit taught the table its bytes per record; a small target makes several files.
    t.insert(trips(list(range(1000, 3000))), target_file_size=8 * 1024)
    assert len(t.file_groups()) > 2
    assert len(rows(t.scan())) == 3000


def test_commit_metadata_is_what_hudi_expects(table_path: str) -> None:
    """Version 6's JSON commit metadata (version 8's Avro: test_version8.py)."""
    import json

    table = trips_table(table_path, table_version=6)
    res = table.insert(trips([1, 2, 3]))
    meta = json.loads((Path(table.uri) / ".hoodie" / f"{res.instant}.commit").read_text())
    assert meta["operationType"] == "INSERT"
    schema = json.loads(meta["extraMetadata"]["schema"])
    assert [f["name"] for f in schema["fields"]] == ["id", "name", "city", "ts", "fare"]
    stats = [s for v in meta["partitionToWriteStats"].values() for s in v]
    assert sum(s["numWrites"] for s in stats) == 3
    for s in stats:
        assert s["prevCommit"] == "null"
        assert (Path(table.uri) / s["path"]).stat().st_size == s["fileSizeInBytes"]
    props = table.properties
    assert props["hoodie.table.version"] == "6" and props["hoodie.timeline.layout.version"] == "1"
    assert props["hoodie.table.checksum"].isdigit()


def test_reopen_sees_the_same_table(table: oxlake.Table) -> None:
    table.insert(trips([1, 2]))
    again = oxlake.Table(table.uri)
    assert rows(again.scan()) == rows(table.scan())
    assert again.schema == table.schema


@pytest.mark.parametrize("uri_form", ["plain", "file"])
def test_file_urls(tmp_path: Path, uri_form: str) -> None:
    uri = str(tmp_path / "u") if uri_form == "plain" else f"file://{tmp_path / 'u'}"
    t = oxlake.create_table(uri, SCHEMA, record_key="id")
    t.insert(trips([1]))
    assert oxlake.Table(str(tmp_path / "u")).to_arrow().num_rows == 1


def test_sliced_nested_input_is_written_or_refused_never_a_panic(table_path: str) -> None:
    """arrow-rs mis-imports struct columns sliced at an offset (its import asserts). pyarrow tables
    are copied where needed before export; any other stream gets a typed error instead of a panic."""
    schema = pa.schema(
        [
            pa.field("id", pa.int64(), nullable=False),
            pa.field("st", pa.struct([("a", pa.string()), ("b", pa.struct([("c", pa.int32())]))])),
        ]
    )
    rows3 = [{"id": i, "st": {"a": f"x{i}", "b": {"c": i}}} for i in range(3)]
    data = pa.Table.from_pylist(rows3, schema=schema)
    t = oxlake.create_table(table_path, schema, record_key="id")
    t.insert(data)
    changed = pa.Table.from_pylist([{"id": 1, "st": {"a": "new", "b": {"c": 9}}}] * 3, schema=schema)
    assert t.upsert(changed.slice(1, 1)).num_updates == 1
    got = {r["id"]: r["st"] for r in t.to_arrow().to_pylist()}
    assert got[1] == {"a": "new", "b": {"c": 9}} and got[2] == {"a": "x2", "b": {"c": 2}}
    reader = pa.RecordBatchReader.from_batches(schema, data.slice(2, 1).to_batches())
    try:
        result = t.upsert(reader)
    except oxlake.InvalidDataError as e:
        assert "could not be imported" in str(e)
    else:
        assert result.num_updates == 1
    assert len(t.to_arrow()) == 3
