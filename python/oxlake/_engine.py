"""What the engine integrations (Spark, Dask, Polars, pandas) share: the schema a query reads,
the columns it reads by default, the split size, and the error for a missing optional dependency.
Internal: the engines import these, users do not."""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from typing import TYPE_CHECKING

import pyarrow as pa

from oxlake import _native
from oxlake._native import InvalidArgumentError, OxlakeError

if TYPE_CHECKING:
    from oxlake.table import Table

#: Split size a distributed read aims for (bytes of Parquet and log files per task).
DEFAULT_SPLIT_BYTES = 128 * 1024 * 1024
#: Columns Apache Hudi adds to every record (`_hoodie_commit_time`, `_hoodie_record_key`, ...).
META_PREFIX = "_hoodie_"
#: The column of an upsert's input flagging rows that delete their key (Apache Hudi's
#: `HoodieRecord.HOODIE_IS_DELETED_FIELD`).
IS_DELETED = "_hoodie_is_deleted"
#: The column a change query adds (`insert`, `update_before`, `update_after`, `delete`).
CHANGE_TYPE = "_change_type"

#: The extra of `pip install "oxlake[...]"` that brings each optional module.
_EXTRAS = {"pandas": "pandas", "numpy": "pandas", "pyspark": "spark", "dask": "dask", "polars": "polars"}


class MissingDependencyError(OxlakeError, ImportError):
    """An optional dependency (pandas, pyspark, dask, polars) is not installed; the message names
    the extra that installs it. Also an `ImportError`, so `except ImportError` catches it."""


def require(module: str, *, needed_by: str) -> None:
    """Imports `module`: a `MissingDependencyError` naming the extra to install when its
    top-level package is absent (an import error inside an installed package propagates as is)."""
    top = module.split(".")[0]
    try:
        importlib.import_module(module)
    except ModuleNotFoundError as e:
        if e.name is None or e.name.split(".")[0] != top:
            raise
        extra = _EXTRAS.get(top, top)
        raise MissingDependencyError(
            f"{needed_by} needs {top}, which is not installed: pip install 'oxlake[{extra}]'",
            name=top,
        ) from e


def native(table: Table) -> _native.Table:
    """The native handle of `table`, for the engine modules that call the extension directly
    (distributed writes: `begin_write`, `write_files`, `route`)."""
    return table._t


def query_schema(table: Table, query: str, as_of: str | None) -> pa.Schema:
    """The table's columns as a query reads them (time travel: as of its instant)."""
    if as_of is not None and query in ("snapshot", "read_optimized"):
        return table.schema_as_of(as_of)
    return table.schema


def result_schema(table: Table, columns: list[str] | None, query: str, as_of: str | None = None) -> pa.Schema:
    """The schema of a query's rows (a change query adds `_change_type`), from metadata only; an
    unknown column is an `InvalidArgumentError` naming it."""
    schema = query_schema(table, query, as_of)
    if query == "changes":
        schema = schema.append(pa.field(CHANGE_TYPE, pa.string()))
    if columns is None:
        return schema
    fields = {c: column_field(schema, c) for c in columns}
    missing = [c for c, f in fields.items() if f is None]
    if missing:
        raise InvalidArgumentError(f"unknown columns {missing} (the table has {schema.names})")
    return pa.schema([fields[c] for c in columns])


def column_field(schema: pa.Schema, name: str) -> pa.Field | None:
    """The field a scan gives for `name`: a top-level column, else a field inside struct columns
    by its dotted path (`customer.tier`, the longest top-level prefix first), named `name`."""
    if name in schema.names:
        return schema.field(name)
    parts = name.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        top = ".".join(parts[:cut])
        if top not in schema.names:
            continue
        field: pa.Field | None = schema.field(top)
        for part in parts[cut:]:
            if field is None or not pa.types.is_struct(field.type) or field.type.get_field_index(part) < 0:
                field = None
                break
            field = field.type.field(part)
        if field is not None:
            return field.with_name(name).with_nullable(True)
    return None


def read_columns(
    table: Table,
    columns: Sequence[str] | None,
    with_meta_columns: bool,
    query: str = "snapshot",
    as_of: str | None = None,
) -> list[str] | None:
    """The columns a read asks for: the given ones, else all (None) or all but the meta columns."""
    if columns is not None:
        return list(columns)
    if with_meta_columns:
        return None
    return [f.name for f in query_schema(table, query, as_of) if not f.name.startswith(META_PREFIX)]
