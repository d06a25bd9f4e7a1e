"""oxlake tables as Polars lazy frames: `scan(uri)` is a Polars IO source, so a query's
projection, its filters and its row limit reach oxlake's planner (files and row groups the filter
rules out are never read).

Polars hands the source its predicate as an expression; the parts of it oxlake can evaluate
(comparisons of a column with a literal, `is_null`, `is_not_null`, `&`, `|`, `~`) become the
scan's SQL filter and prune what is read, and the whole predicate is always applied to the rows
read as well, so a part left out only costs reading, never a wrong row.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from oxlake._engine import require
from oxlake.table import QueryType, Table, TimeLike

if TYPE_CHECKING:
    import polars as pl


def scan(
    table: str | Table,
    *,
    as_of: TimeLike | None = None,
    query: QueryType = "snapshot",
    start: TimeLike | None = None,
    end: TimeLike | None = None,
    with_meta_columns: bool = True,
    storage_options: dict[str, str] | None = None,
) -> pl.LazyFrame:
    """The table (a URI or an open `Table`) as a `polars.LazyFrame` read by oxlake when collected.

    `as_of`, `query`, `start`, `end` and `with_meta_columns` are those of `Table.scan`; the
    projection, filters and `head(n)` of the Polars query are pushed into the scan. Each `collect`
    reads the table as it is then (for `as_of=None`), so the frame can be collected again after
    more commits.
    """
    require("polars", needed_by="oxlake.polars.scan")
    import polars as pl
    from polars.io.plugins import register_io_source

    t = table if isinstance(table, Table) else Table(table, storage_options)
    schema = _result_schema(t, query, as_of, with_meta_columns)
    polars_schema = pl.DataFrame(schema.empty_table()).schema

    def source(
        with_columns: list[str] | None, predicate: pl.Expr | None, n_rows: int | None, batch_size: int | None
    ) -> Iterator[pl.DataFrame]:
        columns = with_columns if with_columns is not None else schema.names
        pushed = sql_of(predicate, schema) if predicate is not None else None
        # The predicate may name columns the projection leaves out: read them, drop them after.
        needed = list(columns)
        if predicate is not None:
            needed += [c for c in predicate.meta.root_names() if c not in needed]
        batches = t.scan(
            columns=needed,
            filter=pushed,
            as_of=as_of,
            query=query,
            start=start,
            end=end,
            batch_size=batch_size,
        )
        left = n_rows
        for batch in batches:
            frame = pl.DataFrame(pa.Table.from_batches([batch], batches.schema))
            if predicate is not None:
                frame = frame.filter(predicate)
            frame = frame.select(columns)
            if left is not None:
                frame = frame.head(left)
                left -= frame.height
            if frame.height:
                yield frame
            if left == 0:
                return

    return register_io_source(source, schema=polars_schema)


def _result_schema(
    table: Table, query: QueryType, as_of: TimeLike | None, with_meta_columns: bool
) -> pa.Schema:
    """The schema `Table.scan` gives for these arguments, from metadata only."""
    return table.scan(
        columns=None, filter="false", as_of=as_of, query=query, with_meta_columns=with_meta_columns
    ).schema


# -- predicates ------------------------------------------------------------------------------

_COMPARISONS = {"Eq": "=", "NotEq": "<>", "Lt": "<", "LtEq": "<=", "Gt": ">", "GtEq": ">="}
_FLIPPED = {"Eq": "Eq", "NotEq": "NotEq", "Lt": "Gt", "LtEq": "GtEq", "Gt": "Lt", "GtEq": "LtEq"}


class _Untranslatable(Exception):
    """A part of a predicate that oxlake's filter does not express."""


def sql_of(predicate: pl.Expr, schema: pa.Schema) -> str | None:
    """A SQL filter every row satisfying `predicate` satisfies (the parts of an `&` oxlake
    cannot evaluate are left out, so it may admit more rows), or None when nothing of it
    translates. Works on the expression's serialized tree; a tree of an unknown shape (another
    Polars version) translates to None, which costs pruning only."""
    try:
        tree = json.loads(predicate.meta.serialize(format="json"))
    except (ValueError, TypeError, AttributeError):
        return None
    try:
        sql, _exact = _translate(tree, schema)
    except _Untranslatable:
        return None
    return sql


def _translate(node: Any, schema: pa.Schema) -> tuple[str, bool]:
    """(sql, exact): `sql` admits every row `node` admits; `exact` when it admits no others."""
    if not isinstance(node, Mapping) or len(node) != 1:
        raise _Untranslatable
    ((kind, body),) = node.items()
    if kind == "BinaryExpr":
        op = body["op"]
        if op in ("And", "LogicalAnd"):
            return _and(body["left"], body["right"], schema)
        if op in ("Or", "LogicalOr"):
            left, left_exact = _translate(body["left"], schema)
            right, right_exact = _translate(body["right"], schema)
            return f"({left} OR {right})", left_exact and right_exact
        if op in _COMPARISONS:
            return _comparison(body["left"], op, body["right"], schema), True
        raise _Untranslatable
    if kind == "Function":
        function, inputs = body.get("function"), body.get("input", [])
        boolean = function.get("Boolean") if isinstance(function, Mapping) else None
        if boolean == "Not" and len(inputs) == 1:
            inner, exact = _translate(inputs[0], schema)
            if not exact:  # the negation of a wider filter would be a narrower one
                raise _Untranslatable
            return f"(NOT {inner})", True
        if boolean in ("IsNull", "IsNotNull") and len(inputs) == 1:
            column = _column(inputs[0], schema)
            return f"({_quote(column)} IS {'NOT ' if boolean == 'IsNotNull' else ''}NULL)", True
    raise _Untranslatable


def _and(left_node: Any, right_node: Any, schema: pa.Schema) -> tuple[str, bool]:
    parts: list[tuple[str, bool] | None] = []
    for side in (left_node, right_node):
        try:
            parts.append(_translate(side, schema))
        except _Untranslatable:
            parts.append(None)
    kept = [p for p in parts if p is not None]
    if not kept:
        raise _Untranslatable
    if len(kept) == 1:
        return kept[0][0], False
    return f"({kept[0][0]} AND {kept[1][0]})", kept[0][1] and kept[1][1]


def _comparison(left: Any, op: str, right: Any, schema: pa.Schema) -> str:
    if _is_column(right) and not _is_column(left):
        left, right, op = right, left, _FLIPPED[op]
    column = _column(left, schema)
    value = _literal(right, schema.field(column).type)
    return f"({_quote(column)} {_COMPARISONS[op]} {value})"


def _is_column(node: Any) -> bool:
    return isinstance(node, Mapping) and "Column" in node


def _column(node: Any, schema: pa.Schema) -> str:
    if not _is_column(node) or not isinstance(node["Column"], str) or node["Column"] not in schema.names:
        raise _Untranslatable
    return str(node["Column"])


def _literal(node: Any, column_type: pa.DataType) -> str:
    """`node` as a SQL literal that compares with a column of `column_type` as Polars compares:
    integers with integer columns, strings with string columns, booleans with boolean columns.
    Floating-point and decimal columns are never pushed: Polars and DataFusion differ on NaN
    (Polars orders it above every number; Parquet statistics leave it out), on -0.0, and on
    literals DataFusion would widen or cast (a float32 0.1 is not the float64 0.1)."""
    if not isinstance(node, Mapping) or "Literal" not in node or not isinstance(node["Literal"], Mapping):
        raise _Untranslatable
    literal = node["Literal"]
    values = literal.get("Dyn") or literal.get("Scalar")
    if not isinstance(values, Mapping) or len(values) != 1:
        raise _Untranslatable
    ((kind, value),) = values.items()
    if isinstance(value, bool):
        if kind != "Boolean" or not pa.types.is_boolean(column_type):
            raise _Untranslatable
        return "TRUE" if value else "FALSE"
    if isinstance(value, int) and kind in _INTEGER_KINDS and pa.types.is_integer(column_type):
        if not -(2**63) <= value < 2**63:
            raise _Untranslatable
        return str(value)
    if isinstance(value, str) and kind in ("String", "Str") and _is_string(column_type):
        return "'" + value.replace("'", "''") + "'"
    raise _Untranslatable


def _is_string(t: pa.DataType) -> bool:
    return bool(pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_string_view(t))


_INTEGER_KINDS = ("Int", "Int8", "Int16", "Int32", "Int64", "UInt8", "UInt16", "UInt32", "UInt64")


def _quote(column: str) -> str:
    return '"' + column.replace('"', '""') + '"'
