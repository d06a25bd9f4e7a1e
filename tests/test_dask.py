"""oxlake tables as Dask DataFrames, read partition by partition by the native reader."""

from __future__ import annotations

import re

import oxlake
import oxlake.dask
import pyarrow as pa
import pytest
from conftest import SCHEMA, rows, trips

dask = pytest.importorskip("dask")


def test_dask_read_equals_the_native_reader(table: oxlake.Table) -> None:
    table.insert(trips(list(range(300))))
    first = [i.time for i in table.timeline() if i.state == "completed"][-1]
    table.upsert(trips(list(range(0, 300, 7)), ts=2, name="u"))
    table.delete(trips([1, 2, 3]))

    ddf = oxlake.dask.read(table.uri, split_bytes=1)
    assert ddf.npartitions == len(table.splits(target_bytes=1)) > 1
    assert list(ddf.columns) == table.schema.names
    got = ddf.compute(scheduler="threads")
    assert rows(pa.Table.from_pandas(got, preserve_index=False)) == rows(table.to_arrow())

    old = oxlake.dask.read(table.uri, as_of=first).compute(scheduler="sync")
    assert rows(pa.Table.from_pandas(old, preserve_index=False)) == rows(table.to_arrow(as_of=first))


def test_dask_read_prunes_partitions_and_columns(table: oxlake.Table) -> None:
    table.insert(trips(list(range(90))))
    ddf = oxlake.dask.read(table.uri, columns=["id", "fare"], filter=[("city", "=", "sf")], split_bytes=1)
    assert ddf.npartitions == len(table.splits(filter="city = 'sf'", target_bytes=1))
    assert ddf.npartitions < len(table.splits(target_bytes=1))
    got = ddf.compute(scheduler="sync")
    assert list(got.columns) == ["id", "fare"]
    assert sorted(got["id"]) == [i for i in range(90) if i % 3 == 0]
    # Lazy: pandas operations compose before anything is read.
    assert float(ddf["fare"].sum().compute(scheduler="sync")) == sum(10.0 + i for i in range(0, 90, 3))
    with pytest.raises(oxlake.InvalidArgumentError, match="unknown columns"):
        oxlake.dask.read(table.uri, columns=["nope"])


@pytest.mark.parametrize("table_type", ["copy_on_write", "merge_on_read"])
def test_a_table_of_one_large_file_is_cut_by_rows_into_as_many_splits_as_asked(
    table_path: str, table_type: str
) -> None:
    """One base file of 200,000 rows (one row group) is read by several workers: each split a
    range of its rows, together every row once. A slice with logs is cut too, each part merging
    the logs over its rows; a file smaller than a piece's minimum is not cut."""
    t = oxlake.create_table(table_path, SCHEMA, record_key="id", ordering_field="ts", table_type=table_type)
    n = 200_000
    ids = pa.array(range(n), pa.int64())
    data = pa.table(
        {
            "id": ids,
            "name": pa.array([f"n{i % 977}" for i in range(n)]),
            "city": pa.array(["sf"] * n),
            "ts": pa.array([1] * n, pa.int64()),
            "fare": pa.array([float(i) for i in range(n)]),
        },
        schema=SCHEMA,
    )
    t.insert(data)
    assert len(t.splits()) == 1
    whole = rows(t.to_arrow())
    for asked in (2, 3, 7):
        splits = t.splits(min_splits=asked)
        assert len(splits) == asked
        parts = [t.scan_split(s).to_arrow() for s in splits]
        assert all(p.num_rows > 0 for p in parts)
        assert sum(p.num_rows for p in parts) == n
        assert rows(pa.concat_tables(parts)) == whole
    # A split whose rows were altered on the way to a worker is refused, not read as other rows.
    cut = t.splits(min_splits=2)[1]
    for bad in (rb'"start":199999999', rb'"end":200001'):
        field = bad.split(b":")[0]
        altered = oxlake.Split(re.sub(field + rb":\d+", bad, cut.data, count=1), cut.size, cut.files)
        with pytest.raises(oxlake.InvalidArgumentError, match="of a file of 200000 rows"):
            t.scan_split(altered).to_arrow()
    # Filters and columns apply inside each part.
    splits = t.splits(columns=["id"], filter="fare >= 150000", min_splits=4)
    got = sorted(
        i
        for s in splits
        for i in t.scan_split(s, columns=["id"], filter="fare >= 150000").to_arrow()["id"].to_pylist()
    )
    assert got == list(range(150_000, n))
    ddf = oxlake.dask.read(t.uri, min_splits=3)
    assert ddf.npartitions == 3
    assert len(ddf.compute(scheduler="threads")) == n
    if table_type == "merge_on_read":
        t.upsert(data.slice(0, 10).set_column(4, "fare", pa.array([-1.0] * 10)))
        t.delete(data.slice(n - 5, 5))
        merged = rows(t.to_arrow())
        assert len(merged) == n - 5 and merged[:10] == [{**r, "fare": -1.0} for r in whole[:10]]
        splits = t.splits(min_splits=4)
        assert len(splits) == 4, "the slice with a log is cut too"
        assert rows(pa.concat_tables([t.scan_split(s).to_arrow() for s in splits])) == merged
        assert (
            t.splits(query="read_optimized", min_splits=4)
            and len(t.splits(query="read_optimized", min_splits=4)) == 4
        )
    small = oxlake.create_table(table_path + "-small", SCHEMA, record_key="id", ordering_field="ts")
    small.insert(trips(list(range(50))))
    assert len(small.splits(min_splits=8)) == 1
