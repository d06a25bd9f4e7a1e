"""`Table.merge`: a source matched with the table by record key, clauses deciding per row what
happens (`when_matched_update`, `when_matched_delete`, `when_not_matched_insert`, ...), written as
one commit that is one transaction with the read of the matched rows.

Conditions and values are `pyarrow.compute` expressions over two struct columns, `source` (the
source row) and `target` (the table's current row; its fields null for a row not matched):
`pc.field("source", "ts") > pc.field("target", "ts")`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Literal

import pyarrow as pa

from oxlake import _native
from oxlake._engine import IS_DELETED as _IS_DELETED
from oxlake._engine import META_PREFIX as _META_PREFIX

if TYPE_CHECKING:
    import pyarrow.compute as pc

    from oxlake.table import WriteResult

#: The partition path of null and empty partition values (Apache Hudi's default partition).
DEFAULT_PARTITION = "__HIVE_DEFAULT_PARTITION__"

#: Runs a write of what a read gives as one transaction with that read (`Table._by_predicate`).
Transact = Callable[[str, Callable[[], pa.Table], int, Mapping[str, str] | None], "WriteResult"]


@dataclass(frozen=True)
class _Clause:
    kind: Literal["update", "delete", "insert"]
    condition: pc.Expression | None
    #: The columns to set (`update`) or give (`insert`); None: every column of the source.
    values: Mapping[str, Any] | None


@dataclass(frozen=True)
class Merge:
    """A merge being built: each `when_*` returns a new `Merge` with the clause added; `execute`
    runs it. Clauses apply in the order given: a row takes the first whose condition holds (a
    clause without a condition holds for every row); a row no clause takes is left as it is."""

    _schema: pa.Schema
    _source: pa.Table
    _on: tuple[str, ...]
    _fixed: tuple[str, ...]
    _lookup: Callable[[pa.Table], pa.Table]
    _transact: Transact
    _clauses: tuple[_Clause, ...] = ()

    # -- clauses ----------------------------------------------------------------------------

    def when_matched_update(self, set: Mapping[str, Any], *, condition: pc.Expression | None = None) -> Merge:
        """Matched rows get the columns of `set` (literals or expressions), the others keep the
        stored values (a partial update). The record key, partition and ordering fields cannot
        be set."""
        for name in set:
            self._check_column(name, "when_matched_update")
            if name in self._fixed:
                raise _native.InvalidArgumentError(
                    f"when_matched_update cannot set `{name}`: "
                    "it is a record key, partition or ordering field"
                )
        return self._with(_Clause("update", condition, dict(set)))

    def when_matched_update_all(self, *, condition: pc.Expression | None = None) -> Merge:
        """Matched rows get every column the source has (the others keep the stored values). As
        in every upsert, a source row whose ordering value is lower than the stored row's loses
        to it."""
        return self._with(_Clause("update", condition, None))

    def when_matched_delete(self, *, condition: pc.Expression | None = None) -> Merge:
        """Matched rows are deleted."""
        return self._with(_Clause("delete", condition, None))

    def when_not_matched_insert(
        self, values: Mapping[str, Any], *, condition: pc.Expression | None = None
    ) -> Merge:
        """Source rows without a match are inserted with the columns of `values` (literals or
        expressions over `source`); the key columns come from the source, the columns neither
        gives are null."""
        for name in values:
            self._check_column(name, "when_not_matched_insert")
            if name in self._on:
                raise _native.InvalidArgumentError(
                    f"when_not_matched_insert cannot set `{name}`: the key and partition columns of an "
                    "inserted row are the source's (the ones matched and found absent)"
                )
        return self._with(_Clause("insert", condition, dict(values)))

    def when_not_matched_insert_all(self, *, condition: pc.Expression | None = None) -> Merge:
        """Source rows without a match are inserted as they are: the source must have every
        column of the table."""
        missing = [f.name for f in self._data_fields() if f.name not in self._source.column_names]
        if missing:
            raise _native.SchemaMismatchError(
                f"when_not_matched_insert_all: the source lacks the table's columns {missing} "
                "(give them, or use when_not_matched_insert(values=...))"
            )
        return self._with(_Clause("insert", condition, None))

    # -- running ----------------------------------------------------------------------------

    def execute(
        self, *, conflict_retries: int = 0, extra_metadata: Mapping[str, str] | None = None
    ) -> WriteResult:
        """Runs the merge as one commit: an upsert of the updated and inserted rows, the deleted
        ones among them flagged `_hoodie_is_deleted` (Apache Hudi's delete marker; a merge of
        delete clauses alone is a delete). The read of the matched rows and the write are one
        transaction: a commit landing in between on the same file groups makes it read and decide
        again (up to `conflict_retries` times, then `CommitConflictError`). `instant` is None
        when no clause took a row."""
        if not self._clauses:
            raise _native.InvalidArgumentError("a merge needs at least one when_* clause")
        kinds = {c.kind for c in self._clauses}
        operation = "delete" if kinds == {"delete"} else "upsert"
        return self._transact(operation, self._decide, conflict_retries, extra_metadata)

    def _decide(self) -> pa.Table:
        """The rows to write: read the matched rows, apply the clauses."""
        source = self._source
        target = self._lookup(source.select(list(self._on)))
        target = target.select([c for c in target.column_names if not c.startswith(_META_PREFIX)])
        source_at, target_at = _match(source, target, self._on)
        fields = self._data_fields()
        target_aligned = target.select([f.name for f in fields]) if target.num_rows else _null_rows(fields, 0)

        import pyarrow.compute as pc

        found = target_at.is_valid()
        matched = _pair(source.take(source_at.filter(found)), target_aligned.take(target_at.filter(found)))
        unmatched_source = source.take(source_at.filter(pc.invert(found)))
        unmatched = _pair(unmatched_source, _null_rows(fields, unmatched_source.num_rows))

        out: list[pa.Table] = []
        for kind, rows in (("matched", matched), ("unmatched", unmatched)):
            taken = pa.array([False] * rows.num_rows)
            for clause in self._clauses:
                if (clause.kind == "insert") != (kind == "unmatched") or rows.num_rows == 0:
                    continue
                holds = _evaluate(rows, clause.condition) if clause.condition is not None else None
                if holds is not None and not pa.types.is_boolean(holds.type):
                    raise _native.InvalidArgumentError(
                        f"a merge condition must be true or false, {clause.condition} is {holds.type}"
                    )
                mine = _and_not(holds, taken, rows.num_rows)
                taken = _or(taken, mine)
                chosen = rows.filter(mine)
                if chosen.num_rows:
                    out.append((clause.kind, self._rows_of(clause, chosen, fields)))
        kinds = {c.kind for c in self._clauses}
        names = [f.name for f in fields]
        # Deleted rows beside upserted ones are flagged; a merge of deletes alone is a delete.
        flagged = "delete" in kinds and len(kinds) > 1
        if not out:
            empty = pa.table({f.name: pa.nulls(0, f.type) for f in fields})
            return empty.append_column(_IS_DELETED, pa.array([], pa.bool_())) if flagged else empty
        if kinds == {"delete"}:
            return pa.concat_tables([t.select(names) for _, t in out]).select(list(self._on))
        parts = []
        for kind, t in out:
            t = t.select(names)
            if flagged:
                t = t.append_column(_IS_DELETED, pa.array([kind == "delete"] * t.num_rows, pa.bool_()))
            parts.append(t)
        return pa.concat_tables(parts)

    def _rows_of(self, clause: _Clause, rows: pa.Table, fields: list[pa.Field]) -> pa.Table:
        """The rows `clause` writes for `rows` (paired `source`/`target` structs)."""
        source = rows.column("source").combine_chunks()
        target = rows.column("target").combine_chunks()
        source_names = {f.name for f in source.type}
        values = clause.values
        columns: dict[str, Any] = {}
        for f in fields:
            if clause.kind == "delete":
                columns[f.name] = target.field(f.name)
            elif values is None:  # *_all: the source's columns, the target's for the rest
                base = source if f.name in source_names else target
                columns[f.name] = base.field(f.name)
            elif f.name in values:
                columns[f.name] = _value(rows, values[f.name], f, clause.kind)
            elif clause.kind == "update":
                columns[f.name] = target.field(f.name)
            elif f.name in self._on:
                columns[f.name] = source.field(f.name)
            else:
                columns[f.name] = pa.nulls(rows.num_rows, f.type)
        return pa.table({f.name: _typed(columns[f.name], f) for f in fields})

    # -- helpers ----------------------------------------------------------------------------

    def _with(self, clause: _Clause) -> Merge:
        if clause.condition is not None:
            import pyarrow.compute as pc

            if not isinstance(clause.condition, pc.Expression):
                raise _native.InvalidArgumentError(
                    f"a merge condition is a pyarrow.compute expression over `source` and `target`, e.g. "
                    'pc.field("source", "ts") > pc.field("target", "ts"), '
                    f"not {type(clause.condition).__name__}"
                )
        return replace(self, _clauses=(*self._clauses, clause))

    def _check_column(self, name: str, where: str) -> None:
        if name not in self._schema.names or name.startswith(_META_PREFIX):
            raise _native.SchemaMismatchError(
                f"{where} names `{name}`, which the table lacks: {[f.name for f in self._data_fields()]}"
            )

    def _data_fields(self) -> list[pa.Field]:
        return [f for f in self._schema if not f.name.startswith(_META_PREFIX)]


def start(
    properties: Mapping[str, str],
    table_schema: pa.Schema,
    source: pa.Table,
    on: Sequence[str],
    key_columns: Sequence[str],
    fixed: Sequence[str],
    lookup: Callable[[pa.Table], pa.Table],
    transact: Transact,
) -> Merge:
    """A `Merge` of `source` into a table (see `Table.merge`)."""
    if isinstance(on, str):
        on = [on]
    if sorted(on) != sorted(key_columns):
        raise _native.UnsupportedError(
            f"a merge matches rows by the table's record key and partition columns {list(key_columns)}, "
            f"not {list(on)}"
        )
    missing = [c for c in on if c not in source.column_names]
    if missing:
        raise _native.SchemaMismatchError(f"the merge source lacks the key columns {missing}")
    unknown = [c for c in source.column_names if c not in table_schema.names or c.startswith(_META_PREFIX)]
    if unknown:
        raise _native.SchemaMismatchError(
            f"the merge source has columns the table lacks: {unknown} (evolve the schema first)"
        )
    keygen = (
        properties.get("hoodie.table.keygenerator.type")
        or properties.get("hoodie.table.keygenerator.class", "")
    ).upper()
    if "TIMESTAMP" in keygen or "CUSTOM" in keygen:
        raise _native.UnsupportedError(
            "merge matches rows by their column values; on a table partitioned by time "
            f"({keygen.lower()}) several values name one partition: use upsert"
        )
    for name in on:  # the writer takes null, "" and the default name to one partition path
        column = source.column(name)
        bad = column.null_count > 0
        if not bad and (
            pa.types.is_string(column.type)
            or pa.types.is_large_string(column.type)
            or pa.types.is_string_view(column.type)
        ):
            import pyarrow.compute as pc

            text = column.cast(pa.large_string())
            empty = pc.or_(pc.equal(text, ""), pc.equal(text, DEFAULT_PARTITION))
            bad = bool(pc.any(empty).as_py())
        if bad:
            raise _native.InvalidDataError(
                f"the merge source's key column `{name}` holds null, empty or {DEFAULT_PARTITION!r} values: "
                "such rows cannot be matched by value (they share one partition path)"
            )
    # The source in the table's types (lossless casts only): keys compare in them, and every
    # later step (takes, the clauses' columns) works on one set of types.
    source = pa.table(
        {name: _typed(source.column(name), table_schema.field(name)) for name in source.column_names}
    )
    if source.num_rows:
        import pyarrow.compute as pc

        keys = source.select(list(on)).group_by(list(on)).aggregate([([], "count_all")])
        duplicated = keys.filter(pc.greater(keys.column("count_all"), 1))
        if duplicated.num_rows:
            example = duplicated.slice(0, 3).select(list(on)).to_pylist()
            raise _native.InvalidDataError(
                f"the merge source holds {duplicated.num_rows} keys more than once, e.g. {example}: "
                "each target row can be matched by one source row only"
            )
    return Merge(table_schema, source, tuple(on), tuple(fixed), lookup, transact)


def _match(source: pa.Table, target: pa.Table, on: Sequence[str]) -> tuple[pa.Array, pa.Array]:
    """One pair of positions per source row: the row's, and its target row's (null: none)."""
    left = source.select(list(on)).append_column("__source", pa.array(range(source.num_rows), pa.int64()))
    right = target.select(list(on)).append_column("__target", pa.array(range(target.num_rows), pa.int64()))
    joined = left.join(right, keys=list(on), join_type="left outer")
    if joined.num_rows != source.num_rows:
        import pyarrow.compute as pc

        counts = joined.group_by("__source").aggregate([([], "count_all")])
        twice = counts.filter(pc.greater(counts.column("count_all"), 1)).column("__source").to_pylist()
        example = source.take(pa.array(twice[:3], pa.int64())).select(list(on)).to_pylist()
        raise _native.InvalidDataError(
            f"the table holds {len(twice)} of the merge's keys more than once, e.g. {example} "
            "(bulk_insert keeps duplicate keys): upsert them once to combine them, then merge"
        )
    return joined.column("__source").combine_chunks(), joined.column("__target").combine_chunks()


def _pair(source: pa.Table, target: pa.Table) -> pa.Table:
    def struct(t: pa.Table) -> pa.Array:
        return t.combine_chunks().to_struct_array().combine_chunks()

    return pa.table({"source": struct(source), "target": struct(target)})


def _null_rows(fields: list[pa.Field], n: int) -> pa.Table:
    return pa.table({f.name: pa.nulls(n, f.type) for f in fields})


def _evaluate(rows: pa.Table, expression: Any) -> pa.Array:
    import pyarrow.dataset as ds

    try:
        result = ds.dataset(rows).to_table(columns={"v": expression}).column("v").combine_chunks()
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as e:
        raise _native.InvalidArgumentError(f"merge: cannot evaluate {expression}: {e}") from None
    return result


def _value(rows: pa.Table, value: Any, field: pa.Field, clause: str) -> pa.Array:
    import pyarrow.compute as pc

    if isinstance(value, pc.Expression):
        return _evaluate(rows, value)
    if value is None:
        return pa.nulls(rows.num_rows, field.type)
    try:
        return pa.array([value] * rows.num_rows)
    except (pa.ArrowException, TypeError) as e:
        raise _native.SchemaMismatchError(
            f"merge {clause}: the value {value!r} for `{field.name}`: {e}"
        ) from None


def _typed(column: Any, field: pa.Field) -> Any:
    """`column` in the table's type of `field`, by a cast that loses nothing (as every write
    takes its input), else a `SchemaMismatchError` naming the column."""
    if column.type == field.type:
        return column
    try:
        return column.cast(field.type, safe=True)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as e:
        raise _native.SchemaMismatchError(
            f"merge: the values for `{field.name}` are {column.type}, the table's column {field.type}: {e}"
        ) from None


def _and_not(holds: pa.Array | None, taken: pa.Array, n: int) -> pa.Array:
    """Rows where `holds` is true (a null condition does not hold) and not yet `taken`."""
    import pyarrow.compute as pc

    condition = pc.fill_null(holds, False) if holds is not None else pa.array([True] * n)
    return pc.and_(condition, pc.invert(taken))


def _or(a: pa.Array, b: pa.Array) -> pa.Array:
    import pyarrow.compute as pc

    return pc.or_(a, b)
