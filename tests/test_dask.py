"""oxlake tables as Dask DataFrames, read partition by partition by the native reader."""

from __future__ import annotations

import oxlake
import oxlake.dask
import pyarrow as pa
import pytest
from conftest import rows, trips

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
