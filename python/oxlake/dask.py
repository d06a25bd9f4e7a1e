"""oxlake tables as Dask DataFrames: planned once here (as for Spark: splits of whole file
slices, metadata only), each partition read by the native reader on the worker."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import pyarrow as pa

from oxlake._engine import DEFAULT_SPLIT_BYTES, require, result_schema
from oxlake.table import FilterLike, Split, Table, _filter

if TYPE_CHECKING:
    import dask.dataframe as dd
    import pandas as pd


def read(
    uri: str,
    *,
    columns: Sequence[str] | None = None,
    filter: FilterLike | None = None,
    as_of: str | None = None,
    storage_options: dict[str, str] | None = None,
    split_bytes: int = DEFAULT_SPLIT_BYTES,
    min_splits: int = 1,
) -> dd.DataFrame:
    """The table's snapshot (at `as_of` when given) as a Dask DataFrame with one partition per
    split of about `split_bytes` of files; partitions the filter rules out get no partition.
    With `min_splits` (the cluster's workers, say), base files are cut by rows when there are
    fewer splits than that (`Table.splits`)."""
    require("dask.dataframe", needed_by="oxlake.dask.read")
    require("pandas", needed_by="oxlake.dask.read")
    import dask.dataframe as dd

    table = Table(uri, storage_options)
    cols = list(columns) if columns is not None else None
    splits = table.splits(
        columns=cols, filter=filter, as_of=as_of, target_bytes=split_bytes, min_splits=min_splits
    )
    meta = _pandas(result_schema(table, cols, "snapshot", as_of).empty_table())
    frame: dd.DataFrame = dd.from_map(  # type: ignore[no-untyped-call]
        _read_split,
        [s.data for s in splits],
        uri=uri,
        storage_options=storage_options,
        columns=cols,
        filter=_filter(filter),
        meta=meta,
        label="oxlake-read",
        enforce_metadata=False,
    )
    return frame


def _read_split(
    data: bytes,
    uri: str,
    storage_options: dict[str, str] | None,
    columns: list[str] | None,
    filter: str | list[tuple[str, str, object]] | None,
) -> pd.DataFrame:
    split = Split(data, 0, 0)
    return _pandas(Table(uri, storage_options).scan_split(split, columns=columns, filter=filter).to_arrow())


def _pandas(table: pa.Table) -> pd.DataFrame:
    """`table` in pandas with every column pandas would hold as Python objects (decimals,
    structs, lists, maps, dates, times, binaries) kept as its Arrow type (`pd.ArrowDtype`):
    as objects, Dask's string conversion would turn them into strings."""
    import pandas as pd

    def mapper(t: pa.DataType) -> pd.ArrowDtype | None:
        return pd.ArrowDtype(t) if _object_in_pandas(t) else None

    return table.to_pandas(types_mapper=mapper)


def _object_in_pandas(t: pa.DataType) -> bool:
    return bool(
        pa.types.is_decimal(t)
        or pa.types.is_nested(t)
        or pa.types.is_date(t)
        or pa.types.is_time(t)
        or pa.types.is_binary(t)
        or pa.types.is_large_binary(t)
        or pa.types.is_fixed_size_binary(t)
    )
