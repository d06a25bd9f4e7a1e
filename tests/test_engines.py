"""oxlake tables in other engines (issue 31): `Table` as a reusable Arrow source for DuckDB,
Polars and pyarrow; a Polars lazy scan pushing projection, filters and limits into oxlake; Dask
keeping Arrow types."""

from __future__ import annotations

import decimal
from pathlib import Path
from typing import Any

import oxlake
import oxlake.dask
import oxlake.polars
import pyarrow as pa
import pyarrow.dataset as pds
import pytest
from conftest import rows, trips, trips_table
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

pl = pytest.importorskip("polars")
duckdb = pytest.importorskip("duckdb")


@pytest.fixture(params=["copy_on_write", "merge_on_read"])
def filled(request: pytest.FixtureRequest, table_path: str) -> oxlake.Table:
    t = trips_table(table_path, table_type=request.param)
    t.insert(trips(list(range(30))))
    t.upsert(trips(list(range(0, 30, 4)), ts=2, name="u", fare=50.0))
    t.delete(trips([5, 6]))
    return t


def data_rows(frame: Any) -> list[dict[str, Any]]:
    table = frame.to_arrow() if hasattr(frame, "to_arrow") else pa.table(frame)
    return rows(table.select([c for c in table.column_names if not c.startswith("_hoodie_")]))


# ---- Table as a reusable source ---------------------------------------------------------------


def test_duckdb_queries_a_table_again_and_sees_new_commits(filled: oxlake.Table) -> None:
    t = filled
    assert duckdb.sql("select count(*) from t").fetchall() == [(28,)]
    sf = duckdb.sql("select id from t where city = 'sf' order by id").fetchall()
    assert [r[0] for r in sf] == [r["id"] for r in rows(t.to_arrow(filter="city = 'sf'"))]
    t.insert(trips([100, 101]))
    assert duckdb.sql("select count(*) from t").fetchall() == [(30,)]


def test_polars_pandas_and_pyarrow_take_a_table_and_a_scan(filled: oxlake.Table) -> None:
    expected = rows(filled.to_arrow())
    assert data_rows(pl.DataFrame(filled)) == expected
    assert data_rows(filled.to_polars()) == expected
    assert data_rows(filled.scan().to_polars()) == expected
    assert data_rows(pa.table(filled)) == expected
    assert filled.to_polars(columns=["id"], filter="fare > 40").columns == ["id"]
    pd = pytest.importorskip("pandas")
    if hasattr(pd.DataFrame, "from_arrow"):  # pandas 3
        frame = pd.DataFrame.from_arrow(filled.scan(with_meta_columns=False))
        assert sorted(frame["id"]) == [r["id"] for r in expected]


# ---- a reusable dataset with pushdown -----------------------------------------------------------


def sorted_rows(table: pa.Table) -> list[str]:
    return sorted(str(r) for r in table.to_pylist())


def test_a_dataset_takes_duckdb_polars_and_pyarrow_filters_into_the_files(table_path: str) -> None:
    """`to_pyarrow_dataset` of a copy-on-write table: DuckDB, Polars and pyarrow push filter and
    projection into it. The proof that pruning happens: the other partitions' files are damaged
    after the dataset is made, and queries of one partition do not notice; a query reaching them
    does. The dataset is reusable and equals the scan with the same filter."""
    t = trips_table(table_path)
    t.insert(trips(list(range(3000))))
    t.upsert(trips([1, 4], ts=2, name="u"))
    ds = t.to_pyarrow_dataset(with_meta_columns=False)
    assert type(ds).__name__ == "FileSystemDataset"
    expected = rows(t.to_arrow(columns=["id", "name"], filter="city = 'nyc' AND id < 100"))
    query = "select id, name from ds where city = 'nyc' and id < 100 order by id"
    for _ in range(2):  # reusable
        assert [dict(zip(["id", "name"], r, strict=True)) for r in duckdb.sql(query).fetchall()] == expected
    for path in Path(table_path).glob("city=sf/*.parquet"):
        path.write_bytes(b"damaged")
    assert [dict(zip(["id", "name"], r, strict=True)) for r in duckdb.sql(query).fetchall()] == expected
    lazy = pl.scan_pyarrow_dataset(ds).filter((pl.col("city") == "nyc") & (pl.col("id") < 100))
    assert rows(lazy.select("id", "name").collect().to_arrow()) == expected
    got = ds.to_table(columns=["id", "name"], filter=(pds.field("city") == "nyc") & (pds.field("id") < 100))
    assert rows(got) == expected
    with pytest.raises(Exception, match="(?i)parquet|magic|corrupt|invalid"):
        duckdb.sql("select count(*) from ds where city = 'sf'").fetchall()


@pytest.mark.parametrize("with_meta_columns", [True, False])
def test_a_merge_on_read_dataset_merges_slices_with_logs(table_path: str, with_meta_columns: bool) -> None:
    """Slices with logs are merged by oxlake (held in memory), the others read by pyarrow; after a
    compaction every slice is a file. Time travel gives the table as it was."""
    t = trips_table(table_path, table_type="merge_on_read")
    first = t.insert(trips(list(range(300))))
    t.upsert(trips([1, 4], ts=2, name="u"))  # both in nyc: sf and chennai stay files
    t.delete(trips([7]))
    ds = t.to_pyarrow_dataset(with_meta_columns=with_meta_columns)
    assert type(ds).__name__ == "UnionDataset"
    expected = t.to_arrow(with_meta_columns=with_meta_columns)
    assert ds.schema.equals(expected.schema)
    assert sorted_rows(ds.to_table()) == sorted_rows(expected)
    assert duckdb.sql("select name from ds where id = 1").fetchall() == [("u1",)]
    assert duckdb.sql("select count(*) from ds where id = 7").fetchall() == [(0,)]
    old = t.to_pyarrow_dataset(as_of=first.instant, with_meta_columns=with_meta_columns)
    assert sorted_rows(old.to_table()) == sorted_rows(
        t.to_arrow(as_of=first.instant, with_meta_columns=with_meta_columns)
    )
    ro = t.to_pyarrow_dataset(query="read_optimized")
    assert type(ro).__name__ == "FileSystemDataset"
    assert sorted_rows(ro.to_table()) == sorted_rows(t.to_arrow(query="read_optimized"))
    t.compact()
    compacted = t.to_pyarrow_dataset(with_meta_columns=with_meta_columns)
    assert type(compacted).__name__ == "FileSystemDataset"
    assert sorted_rows(compacted.to_table()) == sorted_rows(expected)


def test_a_dataset_reads_files_written_before_a_rename_through_oxlake(table_path: str) -> None:
    """A column renamed, then one added under the old name: files written before hold the old
    column under that name, so pyarrow reading them itself would give the old values for the new
    column. They are merged by oxlake instead; files written after are read by pyarrow."""
    t = trips_table(table_path)
    first = t.insert(trips(list(range(30))))
    t.update_schema().rename_column("name", "label").commit()
    t.update_schema().add_column("name", pa.string()).commit()
    t.insert(
        pa.table(
            {
                "id": pa.array([100], pa.int64()),
                "label": ["l100"],
                "city": ["sf"],
                "ts": pa.array([1], pa.int64()),
                "fare": [1.0],
                "name": ["fresh"],
            }
        ).select([f.name for f in t.schema if not f.name.startswith("_hoodie_")])
    )
    ds = t.to_pyarrow_dataset(with_meta_columns=False)
    assert type(ds).__name__ == "UnionDataset"  # the old files merged, the new one a file
    expected = t.to_arrow(with_meta_columns=False)
    assert sorted_rows(ds.to_table()) == sorted_rows(expected)
    assert duckdb.sql("select label, name from ds where id = 7").fetchall() == [("n7", None)]
    assert duckdb.sql("select label, name from ds where id = 100").fetchall() == [("l100", "fresh")]
    # Time travel to before the rename reads the old names, read-optimized too.
    for query in ("snapshot", "read_optimized"):
        then = t.to_pyarrow_dataset(query=query, as_of=first.instant, with_meta_columns=False).to_table()
        assert then.column_names == ["id", "name", "city", "ts", "fare"]
        assert sorted_rows(then) == sorted_rows(
            t.to_arrow(query=query, as_of=first.instant, with_meta_columns=False)
        )
        assert sorted(then["name"].to_pylist())[:2] == ["n0", "n1"]


def test_a_dataset_and_a_scan_see_a_schema_another_handle_changed(table_path: str) -> None:
    """A handle opened before another process renamed a column and added one under the old name
    reads the table as it is now: the dataset and `with_meta_columns=False` take the columns of
    the reloaded table, not the handle's first view (which gave the renamed column's values to
    the new one, or none)."""
    t = trips_table(table_path)
    t.insert(trips(list(range(30))))
    other = oxlake.Table(table_path)
    other.update_schema().rename_column("name", "label").commit()
    other.update_schema().add_column("name", pa.string()).commit()
    expected = oxlake.Table(table_path).to_arrow(with_meta_columns=False)
    assert expected.column_names == ["id", "label", "city", "ts", "fare", "name"]
    assert sorted_rows(t.to_arrow(with_meta_columns=False)) == sorted_rows(expected)
    ds = t.to_pyarrow_dataset(with_meta_columns=False)
    assert ds.schema.names == expected.column_names
    assert sorted_rows(ds.to_table()) == sorted_rows(expected)


def test_a_dataset_of_an_empty_table_has_its_schema(table_path: str) -> None:
    t = trips_table(table_path)
    ds = t.to_pyarrow_dataset()
    assert ds.schema.equals(t.schema)
    assert ds.to_table().num_rows == 0
    with pytest.raises(oxlake.InvalidArgumentError, match="query"):
        t.to_pyarrow_dataset(query="incremental")  # type: ignore[arg-type]


@pytest.mark.parametrize("table_type", ["copy_on_write", "merge_on_read"])
@pytest.mark.parametrize("indexed", [False, True])
def test_a_filter_on_a_float_column_keeps_nan_rows_statistics_leave_out(
    table_path: str, table_type: str, indexed: bool
) -> None:
    """Parquet statistics (and the metadata table's column stats, page indexes, bloom filters)
    leave NaN out: a file of 3.0 and NaN has min = max = 3.0. DataFusion orders NaN above every
    number, so `g > 5` and `g != 3` hold for it: pruning by statistics dropped that row (a wrong
    answer). Filters reading a float column no longer prune by statistics."""
    schema = pa.schema([("id", pa.int64()), ("g", pa.float64())])
    t = oxlake.create_table(table_path, schema, record_key="id", table_type=table_type)
    if indexed:
        t.build_metadata()
    t.insert(pa.table({"id": [1, 2, 3], "g": [3.0, float("nan"), 3.0]}, schema=schema))
    if table_type == "merge_on_read":
        t.upsert(pa.table({"id": [3], "g": [3.0]}, schema=schema))  # a log beside the base
    for sql, ids in [("g > 5", [2]), ("g != 3", [2]), ("g = 'NaN'::double", [2]), ("g < 5", [1, 3])]:
        assert sorted(t.to_arrow(filter=sql, columns=["id"])["id"].to_pylist()) == ids, sql
    datafusion = pytest.importorskip("datafusion")
    ctx = datafusion.SessionContext()
    ctx.register_table("t", t)
    assert ctx.sql("select id from t where g > 5").to_arrow_table()["id"].to_pylist() == [2]


# ---- datafusion-python ------------------------------------------------------------------------


@pytest.mark.parametrize("table_type", ["copy_on_write", "merge_on_read"])
def test_datafusion_python_queries_a_table_with_filters_pushed_into_oxlake(
    table_path: str, table_type: str
) -> None:
    """`SessionContext.register_table(name, t)` through DataFusion's FFI: SQL over the table
    equals the scan with the same filter; the other partitions' files are damaged after the
    registration and a query of one partition does not notice (its filter reached oxlake's
    partition pruning), while a query reaching them fails with the file's error."""
    datafusion = pytest.importorskip("datafusion")
    t = trips_table(table_path, table_type=table_type)
    t.insert(trips(list(range(3000))))
    t.upsert(trips([1, 4, 5], ts=2, name="u"))
    t.delete(trips([7]))
    ctx = datafusion.SessionContext()
    ctx.register_table("trips", t)
    with pytest.raises(oxlake.UnsupportedError, match="datafusion-python 55"):
        t.__datafusion_table_provider__()  # as datafusion-python before 52 asks
    query = "select id, name from trips where city = 'nyc' and id < 100 order by id"
    expected = rows(t.to_arrow(columns=["id", "name"], filter="city = 'nyc' AND id < 100"))
    assert rows(ctx.sql(query).to_arrow_table()) == expected
    assert ctx.sql("select count(*) as n from trips").to_arrow_table()["n"].to_pylist() == [2999]
    for path in Path(table_path).glob("city=sf/*"):
        if path.name.endswith(".parquet") or ".log." in path.name:
            path.write_bytes(b"damaged")
    assert rows(ctx.sql(query).to_arrow_table()) == expected
    with pytest.raises(Exception, match="city=sf"):
        ctx.sql("select count(*) from trips where city = 'sf'").to_arrow_table()


# ---- the Polars lazy scan ---------------------------------------------------------------------


def test_polars_scan_pushes_projection_filter_and_limit(filled: oxlake.Table) -> None:
    lazy = oxlake.polars.scan(filled.uri)
    got = lazy.filter((pl.col("city") == "sf") & (pl.col("fare") > 20)).select("id", "fare").collect()
    assert got.columns == ["id", "fare"]
    assert data_rows(got) == rows(filled.to_arrow(columns=["id", "fare"], filter="city = 'sf' AND fare > 20"))
    assert lazy.filter(pl.col("ts") == 2).head(3).collect().height == 3
    # The frame reads the table as it is at each collect.
    filled.insert(trips([200]))
    assert lazy.filter(pl.col("id") == 200).collect()["name"].to_list() == ["n200"]
    # An open Table and the scan's other queries.
    assert oxlake.polars.scan(filled, with_meta_columns=False).collect().columns == [
        "id",
        "name",
        "city",
        "ts",
        "fare",
    ]


def test_polars_predicates_translate_to_oxlake_filters() -> None:
    schema = pa.schema(
        [("id", pa.int64()), ("city", pa.string()), ("fare", pa.float64()), ('we"ird ✓', pa.string())]
    )

    def sql(e: Any) -> str | None:
        return oxlake.polars.sql_of(e, schema)

    assert (
        sql((pl.col("id") > 1) & (pl.col("city") == "o'hare")) == "((\"id\" > 1) AND (\"city\" = 'o''hare'))"
    )
    assert sql(pl.lit(3) <= pl.col("id")) == '("id" >= 3)'
    assert sql(pl.col('we"ird ✓') != "x") == '("we""ird ✓" <> \'x\')'
    assert sql(pl.col("fare").is_null() | ~(pl.col("id") < 5)) == '(("fare" IS NULL) OR (NOT ("id" < 5)))'
    # Parts oxlake cannot evaluate: left out of an AND (the rows are filtered again), nothing of
    # an OR or a NOT built on them.
    assert sql((pl.col("id") > 1) & (pl.col("city").str.len_chars() > 2)) == '("id" > 1)'
    assert sql((pl.col("id") > 1) | (pl.col("city").str.len_chars() > 2)) is None
    assert sql(~((pl.col("id") > 1) & (pl.col("city").str.len_chars() > 2))) is None
    # Literals of another kind than the column's are not pushed (no cast could change a result),
    # nor comparisons of floating-point columns (NaN, -0.0 and float32 literals compare
    # differently in Polars and DataFusion).
    assert sql(pl.col("city") == 1) is None
    assert sql(pl.col("nope") == 1) is None
    assert sql(pl.col("fare") == 0.0) is None
    assert sql((pl.col("fare") > 1) & (pl.col("id") == 2)) == '("id" = 2)'
    assert sql(pl.col("id") == 2**70) is None


def test_the_polars_query_reaches_the_scan(filled: oxlake.Table, monkeypatch: pytest.MonkeyPatch) -> None:
    """What Polars hands the source (typed literals, the projection with the predicate's
    columns) becomes the scan's filter and columns."""
    seen: list[dict[str, Any]] = []
    scan = oxlake.Table.scan

    def spy(self: oxlake.Table, **kwargs: Any) -> oxlake.Scan:
        seen.append(kwargs)
        return scan(self, **kwargs)

    monkeypatch.setattr(oxlake.Table, "scan", spy)
    lazy = oxlake.polars.scan(filled).filter(
        (pl.col("city") == "sf") & (pl.col("id") > 20) & (pl.col("fare") > 1)
    )
    got = lazy.select("id").collect()
    last = seen[-1]
    assert sorted(got["id"]) == [r["id"] for r in rows(filled.to_arrow(filter="city = 'sf' AND id > 20"))]
    assert last["filter"] == '(("city" = \'sf\') AND ("id" > 20))'
    assert sorted(last["columns"]) == ["city", "fare", "id"]


_VALUES = st.integers(min_value=-3, max_value=33)


@st.composite
def predicates(draw: st.DrawFn, depth: int = 0) -> Any:
    leaves = [
        lambda: pl.col("id") > draw(_VALUES),
        lambda: pl.col("id") <= draw(_VALUES),
        lambda: pl.col("fare") != float(draw(_VALUES)) + 10,
        lambda: pl.col("city") == draw(st.sampled_from(["sf", "nyc", "chennai", "x"])),
        lambda: pl.col("name").str.starts_with("u"),  # not translatable
        lambda: pl.col("name").is_null(),
    ]
    if depth >= 2 or draw(st.booleans()):
        return draw(st.sampled_from(leaves))()
    left, right = draw(predicates(depth + 1)), draw(predicates(depth + 1))
    combine = draw(st.sampled_from(["and", "or", "not"]))
    return left & right if combine == "and" else left | right if combine == "or" else ~left


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(predicate=predicates())
def test_a_polars_scan_equals_filtering_all_rows(filled: oxlake.Table, predicate: Any) -> None:
    """The law of pushdown: whatever oxlake prunes, the rows are those of the predicate."""
    everything = pl.DataFrame(filled.to_arrow())
    expected = everything.filter(predicate).select("id", "name").sort("id")
    got = oxlake.polars.scan(filled).filter(predicate).select("id", "name").collect().sort("id")
    assert got.to_dicts() == expected.to_dicts()


# ---- Dask keeps Arrow types -------------------------------------------------------------------


def test_dask_keeps_decimal_struct_list_and_date_columns(table_path: str) -> None:
    pytest.importorskip("dask")
    import datetime

    data = pa.table(
        {
            "id": pa.array([1, 2], pa.int64()),
            "amount": pa.array([decimal.Decimal("1.25"), None], pa.decimal128(10, 2)),
            "who": pa.array([{"name": "a", "tier": 1}, {"name": "b", "tier": None}]),
            "tags": pa.array([["x"], []], pa.list_(pa.string())),
            "day": pa.array([datetime.date(2026, 1, 2), None], pa.date32()),
        }
    )
    t = oxlake.write_table(table_path, data, record_key="id")
    got = oxlake.dask.read(t.uri, columns=["id", "amount", "who", "tags", "day"]).compute(scheduler="sync")
    back = pa.Table.from_pandas(got, preserve_index=False)
    assert back.schema.field("amount").type == pa.decimal128(10, 2)
    assert back.schema.field("who").type == data.schema.field("who").type
    assert back.schema.field("day").type == pa.date32()
    assert rows(back) == rows(data)
