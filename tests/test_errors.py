"""Bad input: a typed exception, and the table exactly as it was."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import oxlake
import pyarrow as pa
import pytest
from conftest import SCHEMA, snapshot, trips


def test_schema_mismatch(filled: oxlake.Table) -> None:
    before = snapshot(filled)
    bad = trips([7]).append_column("extra", pa.array([1]))
    with pytest.raises(oxlake.SchemaMismatchError, match="extra"):
        filled.upsert(bad)
    wrong_type = trips([7]).set_column(3, "ts", pa.array(["not a number"]))
    with pytest.raises(oxlake.SchemaMismatchError):
        filled.upsert(wrong_type)
    assert snapshot(filled) == before


def test_null_record_key(filled: oxlake.Table) -> None:
    before = snapshot(filled)
    schema = SCHEMA.set(0, pa.field("id", pa.int64(), nullable=True))
    data = pa.table({"id": [None], "name": ["x"], "city": ["sf"], "ts": [1], "fare": [1.0]}, schema=schema)
    with pytest.raises(oxlake.InvalidDataError):
        filled.upsert(data)
    assert snapshot(filled) == before


def test_missing_partition_or_ordering_column(filled: oxlake.Table) -> None:
    before = snapshot(filled)
    with pytest.raises(oxlake.InvalidDataError, match="city"):
        filled.delete(trips([1]).select(["id"]))
    with pytest.raises(oxlake.InvalidDataError, match="ts"):
        filled.upsert(trips([1]).drop_columns(["ts"]))
    assert snapshot(filled) == before


def test_unknown_column_and_malformed_filters(filled: oxlake.Table) -> None:
    with pytest.raises(oxlake.InvalidArgumentError):
        filled.to_arrow(filter="nope = 1")
    with pytest.raises(oxlake.InvalidArgumentError):
        filled.to_arrow(filter="city = = 'sf'")
    with pytest.raises(oxlake.InvalidArgumentError):
        filled.to_arrow(filter=[("nope", "=", 1)])
    with pytest.raises(oxlake.InvalidArgumentError):
        filled.to_arrow(filter=[("id", "~", 1)])
    with pytest.raises(oxlake.InvalidArgumentError):
        filled.to_arrow(columns=["nope"])
    with pytest.raises(oxlake.InvalidArgumentError):
        filled.to_arrow(query="sideways")


def test_not_a_table(tmp_path: Path) -> None:
    with pytest.raises(oxlake.TableNotFoundError):
        oxlake.Table(str(tmp_path))
    with pytest.raises(oxlake.TableNotFoundError):
        oxlake.Table(str(tmp_path / "missing"))


def test_corrupt_properties(filled: oxlake.Table) -> None:
    props = Path(filled.uri) / ".hoodie" / "hoodie.properties"
    props.write_text("hoodie.table.name=t\nhoodie.table.type=SIDEWAYS\nhoodie.table.version=6\n")
    with pytest.raises(oxlake.CorruptTableError):
        oxlake.Table(filled.uri)
    props.write_text("garbage without equals signs\n")
    with pytest.raises(oxlake.CorruptTableError):
        oxlake.Table(filled.uri)


def test_create_twice_and_bad_create_arguments(table_path: str) -> None:
    oxlake.create_table(table_path, SCHEMA, record_key="id")
    with pytest.raises(oxlake.TableExistsError):
        oxlake.create_table(table_path, SCHEMA, record_key="id")
    with pytest.raises(oxlake.InvalidArgumentError):
        oxlake.create_table(table_path + "2", SCHEMA, record_key="nope")
    with pytest.raises(oxlake.InvalidArgumentError):
        oxlake.create_table(table_path + "3", SCHEMA, record_key="id", table_type="sideways")
    assert not Path(table_path + "2").exists() or not (Path(table_path + "2") / ".hoodie").exists()


def test_not_arrow_data(filled: oxlake.Table) -> None:
    with pytest.raises(oxlake.InvalidArgumentError):
        filled.insert([{"id": 1}])


def test_errors_share_one_base_class() -> None:
    for cls in (
        oxlake.TableNotFoundError,
        oxlake.TableExistsError,
        oxlake.SchemaMismatchError,
        oxlake.InvalidDataError,
        oxlake.CommitConflictError,
        oxlake.CorruptTableError,
        oxlake.StorageError,
    ):
        assert issubclass(cls, oxlake.OxlakeError)


@pytest.mark.parametrize(
    ("absent", "call", "extra"),
    [
        (["pandas"], lambda t: t.to_pandas(), "pandas"),
        (["pandas"], lambda t: t.scan().to_pandas(), "pandas"),
        (["polars"], lambda t: t.to_polars(), "polars"),
        (["polars"], lambda t: oxlake.polars.scan(t), "polars"),
        (["dask", "dask.dataframe"], lambda t: oxlake.dask.read(t.uri), "dask"),
    ],
)
def test_a_missing_extra_is_named(
    filled: oxlake.Table, monkeypatch: pytest.MonkeyPatch, absent: list[str], call: Any, extra: str
) -> None:
    import oxlake.dask
    import oxlake.polars

    for module in absent:
        monkeypatch.setitem(sys.modules, module, None)  # `import` of it now fails as if absent
    with pytest.raises(oxlake.MissingDependencyError, match=re.escape(f"pip install 'oxlake[{extra}]'")) as e:
        call(filled)
    assert isinstance(e.value, ImportError) and isinstance(e.value, oxlake.OxlakeError)


def test_oxlake_spark_without_pyspark_names_the_extra() -> None:
    code = (
        "import sys; sys.modules['pyspark'] = None\n"
        "try:\n    import oxlake.spark\nexcept ImportError as e:\n    print(type(e).__name__, e)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.startswith("MissingDependencyError oxlake.spark needs pyspark"), out
    assert "pip install 'oxlake[spark]'" in out


def test_a_column_without_a_type_is_refused(tmp_path: Path, filled: oxlake.Table) -> None:
    # What pyarrow infers from an empty or all-null list: Arrow's `null` type.
    table_path = str(tmp_path / "new")
    untyped = pa.table({"id": pa.array([], pa.int64()), "city": []})
    with pytest.raises(oxlake.SchemaMismatchError, match="column `city` has Arrow type null"):
        oxlake.create_table(table_path, untyped.schema, record_key="id")
    nested = pa.schema([pa.field("id", pa.int64()), pa.field("s", pa.struct([pa.field("x", pa.null())]))])
    with pytest.raises(oxlake.SchemaMismatchError, match="column `s.x` has Arrow type null"):
        oxlake.create_table(table_path, nested, record_key="id")
    assert not Path(table_path, ".hoodie").exists()
    before = snapshot(filled)
    with pytest.raises(oxlake.SchemaMismatchError, match="column `note` has Arrow type null"):
        filled.upsert(trips([1]).append_column("note", pa.array([None])), schema_mode="merge")
    assert snapshot(filled) == before


@pytest.mark.parametrize("global_index", [False, True], ids=["unpartitioned", "global-index"])
def test_keys_to_delete_of_the_wrong_type_are_refused_naming_the_column(
    tmp_path: Path, global_index: bool
) -> None:
    """A plain list of keys (or of rows) is held to the key column's type as rows given as Arrow
    data are: a string for an integer key, a float a key cannot hold exactly (5.5, which pyarrow
    would truncate to the stored key 5), values of mixed kinds. Keys that fit are taken."""
    partition = ["city"] if global_index else None
    t = oxlake.create_table(
        str(tmp_path / "t"),
        SCHEMA,
        record_key="id",
        partition_by=partition,
        ordering_field="ts",
        global_index=global_index,
    )
    t.insert(trips([1, 5, 6]))
    before = snapshot(t)
    for keys in (["5"], [5.5], [5, "x"], [[5]], [{"id": "5"}], [{"id": 5.5}]):
        with pytest.raises(oxlake.SchemaMismatchError, match="`id`"):
            t.delete(keys)
        assert snapshot(t) == before, keys
    assert t.delete([5.0]).num_deletes == 1  # a float holding an integer exactly is that key
    assert t.delete([{"id": 6}]).num_deletes == 1
    assert t.delete([]).instant is None
    with pytest.raises(oxlake.InvalidDataError, match="null"):
        t.delete([None])
    assert [r["id"] for r in t.to_arrow().to_pylist()] == [1]


def test_keys_to_delete_given_as_datetimes_take_the_columns_time_zone(tmp_path: Path) -> None:
    """Naive datetimes name instants in UTC for a key column with a time zone (as pyarrow takes
    them); a datetime finer than the column's unit is no key of it."""
    import datetime as dt

    key = pa.field("id", pa.timestamp("ms", tz="UTC"), nullable=False)
    schema = pa.schema([key, pa.field("v", pa.int64())])
    t = oxlake.create_table(str(tmp_path / "t"), schema, record_key="id")
    first = dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=dt.UTC)
    t.insert(pa.table({"id": [first, first + dt.timedelta(seconds=1)], "v": [1, 2]}, schema=schema))
    before = snapshot(t)
    with pytest.raises(oxlake.SchemaMismatchError, match="`id`"):
        t.delete([dt.datetime(2026, 1, 2, 3, 4, 5, 1)])
    assert snapshot(t) == before
    assert t.delete([dt.datetime(2026, 1, 2, 3, 4, 5)]).num_deletes == 1
    assert t.to_arrow()["v"].to_pylist() == [2]


def test_a_failure_inside_a_change_or_incremental_query_keeps_its_class(table_path: str) -> None:
    """A store failure or a damaged log met while a change or incremental query runs is the
    `StorageError` or `CorruptTableError` a snapshot read raises, not the base class: the
    change query's join shares its first side's error between its partitions (behind an `Arc`
    in DataFusion), which hid the class. The same holds across the Arrow stream of a scan."""
    from oxlake.testing import faults

    t = oxlake.create_table(
        table_path, SCHEMA, record_key="id", ordering_field="ts", table_type="merge_on_read"
    )
    a = t.insert(trips(list(range(100))))
    t.upsert(trips([1, 2], ts=2, name="u"))
    queries: list[dict[str, Any]] = [
        {},
        {"query": "changes", "start": a.instant},
        {"query": "incremental", "start": a.completion or a.instant},
    ]
    for query in queries:  # planned before the store fails, read while it does
        scan = t.scan(**query)
        with faults("get:always,backoff=1"), pytest.raises(oxlake.StorageError):
            scan.to_arrow()
        stream = pa.RecordBatchReader.from_stream(t.scan(**query))
        tagged = r"\[oxlake\.StorageError\]"
        with faults("get:always,backoff=1"), pytest.raises(pa.ArrowException, match=tagged):
            stream.read_all()
    [log] = [p for p in Path(table_path).rglob("*.log.*") if ".hoodie" not in p.parts]
    log.write_bytes(log.read_bytes()[: log.stat().st_size // 2])
    for query in queries:
        with pytest.raises(oxlake.CorruptTableError, match=re.escape(log.name)):
            t.to_arrow(**query)
