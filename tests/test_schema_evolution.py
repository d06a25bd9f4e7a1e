"""Schema evolution on write (issue 24, part 1 and the reads of part 3): `schema_mode="merge"`
adds nullable columns (nested too) and widens types by Apache Hudi's rules; without it the
table's schema stays and every difference is a typed error; reads project files written under
older schemas onto the latest one; concurrent writes never lose an evolution."""

from __future__ import annotations

import hashlib
import json
from decimal import Decimal
from pathlib import Path
from typing import Any

import oxlake
import oxlake.dask
import pandas as pd
import pyarrow as pa
import pytest
from conftest import hudi_read, rows

TYPES = ["copy_on_write", "merge_on_read"]

BASE = pa.schema(
    [
        pa.field("id", pa.int64(), nullable=False),
        pa.field("city", pa.string()),
        pa.field("n", pa.int32()),
        pa.field("ts", pa.int64()),
    ]
)


def make(path: str, table_type: str, schema: pa.Schema = BASE) -> oxlake.Table:
    return oxlake.create_table(
        path,
        schema,
        record_key="id",
        partition_by=["city"],
        ordering_field="ts",
        table_type=table_type,
        table_version=6,
    )


def batch(ids: list[int], ts: int = 1, **columns: Any) -> pa.Table:
    data: dict[str, Any] = {"id": ids, "city": ["sf" if i % 2 else "nyc" for i in ids], "ts": [ts] * len(ids)}
    data.update(columns)
    return pa.table(data)


def files_digest(path: str) -> dict[str, str]:
    """Every file of the table and its content hash: "the table is left as it was"."""
    out = {}
    for p in sorted(Path(path).rglob("*")):
        if p.is_file() and ".heartbeat" not in p.parts:
            out[str(p.relative_to(path))] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


def latest(t: oxlake.Table, columns: list[str]) -> list[dict[str, Any]]:
    return sorted(oxlake.Table(t.uri).to_arrow(columns=columns).to_pylist(), key=lambda r: r["id"])


@pytest.mark.parametrize("table_type", TYPES)
def test_strict_writes_refuse_every_difference_and_leave_the_table_as_it_was(
    table_path: str, table_type: str
) -> None:
    t = make(table_path, table_type)
    t.insert(batch([1, 2], n=pa.array([1, 2], pa.int32())))
    before = files_digest(table_path)
    cases = [
        (batch([3], n=pa.array([3], pa.int32()), extra=["x"]), "`extra`"),  # a new column
        (batch([3]), "`n`"),  # a table column missing
        (batch([3], n=["3"]), "`n`"),  # string into int: not a promotion the other way
        (batch([3], n=pa.array([1 << 40], pa.int64())), "`n`"),  # wider values that do not fit
    ]
    for data, column in cases:
        with pytest.raises(oxlake.SchemaMismatchError, match=column):
            t.upsert(data)
    assert files_digest(table_path) == before
    # Narrower input that fits is stored in the table's type (no evolution needed).
    t.upsert(batch([3], n=pa.array([3], pa.int8())))
    assert oxlake.Table(table_path).schema.field("n").type == pa.int32()


@pytest.mark.parametrize("table_type", TYPES)
def test_merge_refuses_what_apache_hudi_refuses_and_leaves_the_table_as_it_was(
    table_path: str, table_type: str
) -> None:
    t = make(table_path, table_type)
    t.insert(batch([1, 2], n=pa.array([1, 2], pa.int32())))
    before = files_digest(table_path)
    cases = [
        (batch([3], n=pa.array([True])), "`n`"),  # int -> bool
        (
            pa.table({"id": ["3"], "city": ["sf"], "ts": [1], "n": pa.array([3], pa.int32())}),
            "`id`",
        ),  # key type
        (
            pa.table({"id": [3], "city": [7], "ts": [1], "n": pa.array([3], pa.int32())}),
            "`city`",
        ),  # partition
    ]
    for data, column in cases:
        with pytest.raises(oxlake.SchemaMismatchError, match=column):
            t.upsert(data, schema_mode="merge")
    not_null = pa.schema(
        [*batch([3], n=pa.array([3], pa.int32())).schema, pa.field("req", pa.int64(), False)]
    )
    with pytest.raises(oxlake.SchemaMismatchError, match="not nullable"):
        t.upsert(
            pa.table(
                {"id": [3], "city": ["sf"], "ts": [1], "n": pa.array([3], pa.int32()), "req": [1]}, not_null
            ),
            schema_mode="merge",
        )
    with pytest.raises(oxlake.InvalidArgumentError, match="schema_mode"):
        t.upsert(batch([3], n=pa.array([3], pa.int32())), schema_mode="evolve")
    assert files_digest(table_path) == before


@pytest.mark.parametrize("table_type", TYPES)
def test_added_and_widened_columns_read_at_every_instant(table_path: str, table_type: str) -> None:
    t = make(table_path, table_type)
    first = t.insert(batch([1, 2, 3, 4], n=pa.array([1, 2, 3, 4], pa.int32()))).instant
    # Add a column and widen n to int64 with a value only int64 holds; update key 1 too.
    second = t.upsert(
        batch([1, 5], ts=2, n=pa.array([10, 1 << 40], pa.int64()), note=["u1", "n5"]), schema_mode="merge"
    ).instant
    # Widen again (int64 -> double), a value above 2**53 in the older files stays readable.
    third = t.upsert(batch([6], ts=3, n=pa.array([0.5]), note=["n6"]), schema_mode="merge").instant
    # A later strict write without the new column fails; with merge it is null in its rows.
    with pytest.raises(oxlake.SchemaMismatchError, match="`note`"):
        t.upsert(batch([2], ts=4, n=pa.array([2.5])))
    fourth = t.upsert(batch([2], ts=4, n=pa.array([2.5])), schema_mode="merge").instant
    t = oxlake.Table(table_path)
    assert t.schema.field("n").type == pa.float64() and t.schema.field("note").type == pa.string()
    expected = {
        1: (10.0, "u1"),
        2: (2.5, None),
        3: (3.0, None),
        4: (4.0, None),
        5: (float(1 << 40), "n5"),
        6: (0.5, "n6"),
    }
    got = {r["id"]: (r["n"], r["note"]) for r in t.to_arrow(columns=["id", "n", "note"]).to_pylist()}
    assert got == expected
    # Time travel: the rows of each instant, in the schema of that instant.
    old = t.to_arrow(as_of=first)
    assert old.schema == t.schema_as_of(first)
    assert "note" not in old.schema.names and old.schema.field("n").type == pa.int32()
    assert {r["id"]: r["n"] for r in old.to_pylist()} == {i: i for i in [1, 2, 3, 4]}
    older = t.to_arrow(as_of=second)
    assert older.schema.field("n").type == pa.int64()
    as_second = {r["id"]: (r["n"], r["note"]) for r in older.to_pylist()}
    assert as_second == {1: (10, "u1"), 2: (2, None), 3: (3, None), 4: (4, None), 5: (1 << 40, "n5")}
    # Incremental: what each commit wrote.
    inc = {r["id"]: r["n"] for r in t.to_arrow(query="incremental", start=second, end=third).to_pylist()}
    assert inc == {6: 0.5}
    inc = {r["id"]: r["note"] for r in t.to_arrow(query="incremental", start=third, end=fourth).to_pylist()}
    assert inc == {2: None}
    changes = t.to_arrow(query="changes", start=first).to_pylist()
    assert {r["id"] for r in changes} == {1, 2, 5, 6}
    if table_type == "merge_on_read":
        t.compact()
        t = oxlake.Table(table_path)
        got_after = {
            r["id"]: (r["n"], r["note"]) for r in t.to_arrow(columns=["id", "n", "note"]).to_pylist()
        }
        assert got_after == expected
        ro = {r["id"]: r["n"] for r in t.to_arrow(query="read_optimized").to_pylist()}
        assert ro == {k: v[0] for k, v in expected.items()}
    # Clustering rewrites every group into the latest schema; the rows stay.
    t.cluster()
    assert {r["id"]: (r["n"], r["note"]) for r in oxlake.Table(table_path).to_arrow().to_pylist()} == expected


@pytest.mark.parametrize("table_type", TYPES)
def test_an_incremental_window_admitting_nothing_after_an_evolution_is_empty(
    table_path: str, table_type: str
) -> None:
    """A window that admits no instant reads no rows, with the latest columns, also once the
    schema has changed (it failed: the empty plan's schema was looked up as of no instant)."""
    t = make(table_path, table_type)
    a = t.insert(batch([1, 2], n=pa.array([1, 2], pa.int32())))
    with t.update_schema() as u:
        u.add_column("x", pa.string())
    b = t.upsert(batch([1], ts=2, n=pa.array([3], pa.int32()), x=["q"]))
    for instant in (a.instant, b.instant):
        empty = t.to_arrow(query="incremental", start=instant, end=instant)
        assert empty.num_rows == 0 and "x" in empty.column_names
    assert t.to_arrow(query="incremental", start=a.instant)["x"].to_pylist() == ["q"]


@pytest.mark.parametrize("table_type", TYPES)
def test_hudi_rs_reads_a_table_with_an_added_column(table_path: str, table_type: str) -> None:
    t = make(table_path, table_type)
    t.insert(batch([1, 2], n=pa.array([1, 2], pa.int32())))
    t.upsert(batch([3, 1], ts=2, n=pa.array([3, 5], pa.int32()), note=["c", "u"]), schema_mode="merge")
    ours = rows(oxlake.Table(table_path).to_arrow())
    theirs = rows(hudi_read(table_path))
    assert [r["note"] for r in ours] == ["u", None, "c"]
    assert theirs == ours


@pytest.mark.parametrize("table_type", TYPES)
def test_nested_fields_are_added_inside_structs_and_lists(table_path: str, table_type: str) -> None:
    point = pa.struct([("x", pa.int32())])
    schema = pa.schema(
        [
            *BASE,
            pa.field("p", point),
            pa.field("ps", pa.list_(point)),
        ]
    )
    t = make(table_path, table_type, schema)
    t.insert(
        pa.table(
            {
                "id": [1],
                "city": ["sf"],
                "n": pa.array([1], pa.int32()),
                "ts": [1],
                "p": pa.array([{"x": 1}], point),
                "ps": pa.array([[{"x": 2}]], pa.list_(point)),
            },
            schema,
        )
    )
    wider = pa.struct([("x", pa.int64()), ("label", pa.string())])
    t.upsert(
        pa.table(
            {
                "id": [2],
                "city": ["nyc"],
                "n": pa.array([2], pa.int32()),
                "ts": [2],
                "p": pa.array([{"x": 1 << 40, "label": "a"}], wider),
                "ps": pa.array([[{"x": 5, "label": "b"}]], pa.list_(wider)),
            }
        ),
        schema_mode="merge",
    )
    t = oxlake.Table(table_path)
    assert t.schema.field("p").type == wider
    got = {r["id"]: r for r in t.to_arrow(columns=["id", "p", "ps"]).to_pylist()}
    assert got[1]["p"] == {"x": 1, "label": None}
    assert got[1]["ps"] == [{"x": 2, "label": None}]
    assert got[2]["p"] == {"x": 1 << 40, "label": "a"}
    # A write without the nested field (the older struct) fills it with null.
    t.upsert(
        pa.table(
            {
                "id": [1],
                "city": ["sf"],
                "n": pa.array([1], pa.int32()),
                "ts": [3],
                "p": pa.array([{"x": 7}], point),
                "ps": pa.array([[{"x": 8}]], pa.list_(point)),
            },
            schema,
        ),
        schema_mode="merge",
    )
    got = {r["id"]: r for r in oxlake.Table(table_path).to_arrow(columns=["id", "p"]).to_pylist()}
    assert got[1]["p"] == {"x": 7, "label": None}


def test_rolling_back_an_evolving_commit_takes_its_schema_back(table_path: str) -> None:
    t = make(table_path, "copy_on_write")
    t.insert(batch([1, 2], n=pa.array([1, 2], pa.int32())))
    evolved = t.upsert(batch([3], ts=2, n=pa.array([3], pa.int32()), note=["c"]), schema_mode="merge")
    assert "note" in oxlake.Table(table_path).schema.names
    t.rollback(evolved.instant)
    t = oxlake.Table(table_path)
    assert "note" not in t.schema.names
    assert sorted(t.to_arrow().column("id").to_pylist()) == [1, 2]
    # Strict writes follow the schema as it is again.
    t.upsert(batch([4], ts=3, n=pa.array([4], pa.int32())))


def test_a_write_that_began_before_an_evolution_keeps_the_added_column(
    table_path: str, tmp_path: Path
) -> None:
    """A writer paused before its commit while another write adds a column: whichever completes
    last, the table's schema keeps the column and every row."""
    from conftest import paused

    t = make(table_path, "copy_on_write")
    t.insert(batch([1, 2], n=pa.array([1, 2], pa.int32())))
    code = (
        "import sys, oxlake, pyarrow as pa; t = oxlake.Table(sys.argv[1]); "
        "t.upsert(pa.table({'id': [7], 'city': ['sf'], 'ts': [5], 'n': pa.array([7], pa.int32())}))"
    )
    with paused(table_path, "before-commit", code, tmp_path) as proc:
        t.upsert(batch([4], ts=2, n=pa.array([4], pa.int32()), note=["d"]), schema_mode="merge")
    assert proc.returncode == 0, (proc.out, proc.err)
    got = {r["id"]: r["note"] for r in oxlake.Table(table_path).to_arrow(columns=["id", "note"]).to_pylist()}
    assert got == {1: None, 2: None, 4: "d", 7: None}


def test_an_evolution_that_a_later_commit_overtook_is_a_conflict_then_retried(
    table_path: str, tmp_path: Path
) -> None:
    """The evolving writer is the slow one: a later instant completes first with the old schema.
    Committing the evolution then would hide it (the latest commit's schema is the table's): it
    is a conflict, and a retry lands it."""
    from conftest import paused

    t = make(table_path, "merge_on_read")
    t.insert(batch([1, 2], n=pa.array([1, 2], pa.int32())))
    code = (
        "import sys, oxlake, pyarrow as pa; t = oxlake.Table(sys.argv[1]); "
        "t.upsert(pa.table({'id': [7], 'city': ['sf'], 'ts': [5], 'n': pa.array([7], pa.int32()), "
        "'note': ['g']}), schema_mode='merge', conflict_retries=2)"
    )
    with paused(table_path, "before-commit", code, tmp_path) as proc:
        t.upsert(batch([4], ts=2, n=pa.array([4], pa.int32())))
    assert proc.returncode == 0, (proc.out, proc.err)
    got = {r["id"]: r["note"] for r in oxlake.Table(table_path).to_arrow(columns=["id", "note"]).to_pylist()}
    assert got == {1: None, 2: None, 4: None, 7: "g"}


@pytest.mark.parametrize("table_type", TYPES)
def test_column_stats_never_prune_a_file_whose_column_was_widened_to_text(
    table_path: str, table_type: str
) -> None:
    """Column stats of a file written when `n` was an int hold its bounds as ints: compared as
    text after `n` became a string they would order "100" before "50" and prune a file holding
    50. Pruning must never drop a matching row. (On merge-on-read the new row goes to a new file
    group, so the old file and its int bounds stay.)"""
    t = make(table_path, table_type)
    t.build_metadata()
    t.insert(batch([1, 3, 5], n=pa.array([5, 50, 100], pa.int32())))
    t.upsert(batch([7], ts=2, n=["abc"]), schema_mode="merge")
    t = oxlake.Table(table_path)
    assert t.schema.field("n").type == pa.string()
    got = t.to_arrow(filter=[("n", "=", "50")]).column("id").to_pylist()
    assert got == [3]
    got = sorted(t.to_arrow(filter="n > '1'").column("id").to_pylist())
    assert got == [1, 3, 5, 7]


@pytest.mark.parametrize("table_type", TYPES)
def test_a_maps_values_gain_a_field_and_older_files_read_it_as_null(table_path: str, table_type: str) -> None:
    """A map whose struct values gain a field (`schema_mode="merge"`): base files and log blocks
    written before read it as null, through snapshots, time travel (the old type), compaction or
    clustering; a change of the map's key type stays refused, the table unchanged."""
    point = pa.struct([("x", pa.int32())])
    schema = pa.schema([*BASE, pa.field("m", pa.map_(pa.string(), point))])
    t = make(table_path, table_type, schema)

    def rows_with(ids: list[int], ts: int, m: pa.Array) -> pa.Table:
        n = pa.array(ids, pa.int32())
        return pa.table({"id": ids, "city": ["sf"] * len(ids), "n": n, "ts": [ts] * len(ids), "m": m})

    first = t.insert(
        rows_with([1, 2], 1, pa.array([[("k", {"x": 1})], [("j", {"x": 2})]], pa.map_(pa.string(), point)))
    )
    wider = pa.struct([("x", pa.int32()), ("label", pa.string())])
    second = t.upsert(
        rows_with(
            [2, 3],
            2,
            pa.array(
                [[("k", {"x": 20, "label": "b"})], [("k", {"x": 3, "label": "c"})]],
                pa.map_(pa.string(), wider),
            ),
        ),
        schema_mode="merge",
    )
    expect_now = {
        1: [("k", {"x": 1, "label": None})],
        2: [("k", {"x": 20, "label": "b"})],
        3: [("k", {"x": 3, "label": "c"})],
    }

    def check(t: oxlake.Table) -> None:
        assert t.schema.field("m").type == pa.map_(pa.string(), wider)
        assert {r["id"]: r["m"] for r in t.to_arrow(columns=["id", "m"]).to_pylist()} == expect_now
        old = t.to_arrow(as_of=first.instant, columns=["id", "m"])
        assert old.schema.field("m").type == pa.map_(pa.string(), point)
        assert {r["id"]: r["m"] for r in old.to_pylist()} == {1: [("k", {"x": 1})], 2: [("j", {"x": 2})]}
        inc = t.to_arrow(query="incremental", start=first.instant, end=second.instant, columns=["id", "m"])
        assert {r["id"] for r in inc.to_pylist()} == {2, 3}

    check(oxlake.Table(table_path))
    if table_type == "merge_on_read":
        t.compact(min_log_files=1)
    t.cluster()
    check(oxlake.Table(table_path))

    before = files_digest(table_path)
    keyed_by_int = pa.array([[(1, {"x": 1, "label": "z"})]], pa.map_(pa.int64(), wider))
    with pytest.raises(oxlake.SchemaMismatchError, match="`m`.*key type"):
        t.upsert(rows_with([4], 3, keyed_by_int), schema_mode="merge")
    assert files_digest(table_path) == before


# -- the law: random evolving writes equal a model --------------------------------------------

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

#: The promotion paths of the evolving columns: each write carrying one may move it one step on
#: (never back). `v`: int32 → int64 → double → string; `w`: float → double; `d`: a decimal whose
#: precision and scale grow.
PATHS: dict[str, list[pa.DataType]] = {
    "v": [pa.int32(), pa.int64(), pa.float64(), pa.string()],
    "w": [pa.float32(), pa.float64()],
    "d": [pa.decimal128(5, 2), pa.decimal128(9, 3)],
}
#: The fields the struct column `s` gains, one at a time.
S_FIELDS = ["a", "b"]

step = st.one_of(
    st.tuples(
        st.just("upsert"),
        st.lists(st.integers(0, 11), min_size=1, max_size=5, unique=True),
        st.sets(st.sampled_from(sorted(PATHS))),  # the evolving columns the write carries
        st.integers(0, 2),  # how many of the added text columns it carries (it may add one)
        st.booleans(),  # widen each carried column one step
        st.integers(0, 2),  # 0: no `s`; 1: `s` with its fields; 2: `s` gaining a field
    ),
    st.tuples(st.just("delete"), st.lists(st.integers(0, 11), min_size=1, max_size=3, unique=True)),
    st.tuples(st.sampled_from(["compact", "cluster", "clean"])),
)


def value_of(column: str, i: int, n: int, t: pa.DataType) -> Any:
    """The value of an evolving column a write at step `n` gives row `i` (exact in every type)."""
    if column == "d":
        return Decimal(i) + Decimal(n) / 100
    base = i * 1000 + n
    if column == "w":
        return base + 0.5
    return as_type(base, t)


def expected(
    state: dict[int, dict[str, Any]], names: list[str], types: dict[str, pa.DataType]
) -> list[dict[str, Any]]:
    """The rows of a model state as a read with the columns `names` of types `types` gives them."""
    out = []
    for i in sorted(state):
        row = {c: state[i].get(c) for c in names}
        for c in PATHS:
            if c in names and row[c] is not None:
                row[c] = read_as(row[c], state[i][f"_{c}_type"], types[c])
        if "s" in names and row["s"] is not None:
            row["s"] = {f: row["s"].get(f) for f in types["s"].names}
        out.append(row)
    return out


def read_as(value: Any, written: pa.DataType, latest: pa.DataType) -> Any:
    """A value written as `written` read as the promoted `latest` (Arrow's casts: a double as
    text is its shortest round-trip form, as Python's repr)."""
    if pa.types.is_string(latest):
        return repr(float(value)) if pa.types.is_floating(written) else str(value)
    if pa.types.is_floating(latest):
        return float(value)
    return value


def as_type(value: int, t: pa.DataType) -> Any:
    if pa.types.is_floating(t):
        return float(value)
    if pa.types.is_string(t):
        return str(value)
    return value


def numbers(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Rows with `v` as a number once it is text: a value's text depends on the types it was
    stored in (an int read as text is `"1"`; rewritten as a double by a copy-on-write merge,
    compaction or clustering while `v` was one, `"1.0"`), which the model does not follow."""
    return [{**r, "v": float(r["v"])} if isinstance(r.get("v"), str) else r for r in rows]


def by_id(rows: list[dict[str, Any]]) -> dict[int, dict[str, Any]]:
    return {r["id"]: r for r in rows}


@pytest.mark.parametrize("table_type", TYPES)
@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(steps=st.lists(step, min_size=1, max_size=10))
def test_random_evolving_writes_equal_a_model(
    tmp_path_factory: Any, table_type: str, steps: list[tuple]
) -> None:
    """Upserts whose schemas evolve (text columns added, `v` widened int32 → int64 → double →
    string, `w` float → double, `d` a decimal widened, a struct `s` gaining fields, columns
    missing and so null), deletes, compactions, clusterings and cleans: after every step
    - the snapshot equals the model (values as the latest types read them);
    - each earlier instant's time travel still gives that instant's rows in that instant's schema
      (after a clean, the instants it keeps);
    - each incremental window between two instants gives the rows of the later one written in it;
    - the changes of each window applied to the model's earlier state give its later one;
    and hudi-rs reads the latest rows as oxlake does while the table only gained columns."""
    path = str(tmp_path_factory.mktemp("evolve") / "t")
    schema = pa.schema(
        [pa.field("id", pa.int64(), False), pa.field("city", pa.string()), pa.field("ts", pa.int64())]
    )
    t = oxlake.create_table(
        path,
        schema,
        record_key="id",
        partition_by=["city"],
        ordering_field="ts",
        table_type=table_type,
        table_version=6,
    )
    model: dict[int, dict[str, Any]] = {}
    types: dict[str, pa.DataType] = {}  # the evolving columns' types, once a write added them
    s_fields: list[str] = []
    added: list[str] = []
    widened = False
    history: list[tuple[str, dict[int, dict[str, Any]], list[str], dict[str, pa.DataType]]] = []
    for n, s in enumerate(steps):
        instant = None
        if s[0] == "upsert":
            _, ids, carried, extra, widen, nested = s
            columns: dict[str, Any] = {
                "id": ids,
                "city": ["sf" if i % 2 else "nyc" for i in ids],
                "ts": [n] * len(ids),
            }
            for c in sorted(carried):
                path_of = PATHS[c]
                if c not in types:
                    types[c] = path_of[0]
                elif widen and path_of.index(types[c]) + 1 < len(path_of):
                    types[c] = path_of[path_of.index(types[c]) + 1]
                    widened = True
                columns[c] = pa.array([value_of(c, i, n, types[c]) for i in ids], types[c])
            if extra > len(added):
                added.append(f"c{len(added)}")
            for c in added[:extra]:
                columns[c] = [f"{c}-{i}-{n}" for i in ids]
            if nested:
                if not s_fields or (nested == 2 and len(s_fields) < len(S_FIELDS)):
                    s_fields.append(S_FIELDS[len(s_fields)])
                struct = pa.struct([(f, pa.int64()) for f in s_fields])
                columns["s"] = pa.array([{f: i * 10 + n for f in s_fields} for i in ids], struct)
            instant = t.upsert(pa.table(columns), schema_mode="merge").instant
            for i in ids:
                row = {
                    k: (v[ids.index(i)] if isinstance(v, list) else v[ids.index(i)].as_py())
                    for k, v in columns.items()
                }
                for c in PATHS:
                    row[f"_{c}_type"] = types[c] if c in carried else None
                row["_at"] = instant
                model[i] = row
        elif s[0] == "delete":
            keys = pa.table({"id": s[1], "city": ["sf" if i % 2 else "nyc" for i in s[1]]})
            instant = t.delete(keys).instant
            for i in s[1]:
                model.pop(i, None)
        elif s[0] == "compact":
            if table_type == "merge_on_read":
                t.compact()
        elif s[0] == "cluster":
            t.cluster(sort_by=["id"])
        else:
            t.clean(retain=1)
            # Earlier instants may be cleaned away (a typed error, checked elsewhere; a
            # compaction since the last write leaves even that one unreadable): the snapshot
            # stays, and time travel and windows start again from the next write.
            history = []
        t = oxlake.Table(path)
        names = [c for c in t.schema.names if not c.startswith("_hoodie_")]
        now = {c: t.schema.field(c).type for c in [*PATHS, "s"] if c in names}

        got = sorted(t.to_arrow(columns=names).to_pylist(), key=lambda r: r["id"])
        assert numbers(got) == numbers(expected(model, names, now)), f"after step {n}: {s}"
        if instant is not None:
            history.append((instant, {k: dict(v) for k, v in model.items()}, names, now))
        for at, state, names_then, types_then in history:
            as_of = sorted(t.to_arrow(as_of=at, columns=names_then).to_pylist(), key=lambda r: r["id"])
            assert numbers(as_of) == numbers(expected(state, names_then, types_then)), (
                f"as of {at} after step {n}"
            )
        for (a, before, _, _), (b, after, _, _) in zip(history, history[1:], strict=False):
            window = f"({a}, {b}] after step {n}"
            inc = t.to_arrow(query="incremental", start=a, end=b, columns=names).to_pylist()
            written = {i: r for i, r in after.items() if r["_at"] > a}
            assert numbers(sorted(inc, key=lambda r: r["id"])) == numbers(expected(written, names, now)), (
                window
            )
            applied = by_id(expected(before, names, now))
            for r in t.to_arrow(
                query="changes", start=a, end=b, columns=[*names, "_change_type"]
            ).to_pylist():
                change = r.pop("_change_type")
                if change == "delete":
                    assert applied.pop(r["id"], None) is not None, (window, r)
                else:
                    assert (r["id"] in applied) == (change == "update"), (window, r)
                    applied[r["id"]] = r
            assert numbers([applied[i] for i in sorted(applied)]) == numbers(expected(after, names, now)), (
                window
            )
    if not widened and not s_fields and not any(c in types for c in ("w", "d")):
        # hudi-rs (0.5) reconciles no promoted type and no struct that gained a field (it fails
        # with "reconcile child-count mismatch"): compared while columns were only added.
        ours = sorted(oxlake.Table(path).to_arrow(columns=names).to_pylist(), key=lambda r: r["id"])
        read = hudi_read(path)  # no columns at all when the table holds no file
        theirs = sorted(read.select(names).to_pylist() if read.num_columns else [], key=lambda r: r["id"])
        assert theirs == ours


def test_an_evolved_table_whose_later_commits_are_another_engines_keeps_its_columns(table_path: str) -> None:
    """Apache Hudi's own writer records only its Avro writer schema: when no active commit
    records oxlake's exact schema any more, the schema is the created one evolved by the latest
    commit's Avro schema (added columns stay visible), never silently the created one."""
    import json

    t = make(table_path, "copy_on_write")
    t.insert(batch([1, 2], n=pa.array([1, 2], pa.int32())))
    t.upsert(batch([3], ts=2, n=pa.array([3], pa.int32()), note=["c"]), schema_mode="merge")
    t.upsert(batch([4], ts=3, n=pa.array([4], pa.int32()), note=["d"]))
    commits = sorted(Path(table_path, ".hoodie").glob("*.commit"))
    # The latest commit as Java writes it: walking back finds the schema in the one before.
    for i, path in enumerate(reversed(commits)):
        meta = json.loads(path.read_text())
        meta["extraMetadata"].pop("oxlake.arrow.schema")
        path.write_text(json.dumps(meta))
        names = oxlake.Table(table_path).schema.names
        assert "note" in names, f"after stripping {i + 1} commits: {names}"
    got = {r["id"]: r["note"] for r in oxlake.Table(table_path).to_arrow(columns=["id", "note"]).to_pylist()}
    assert got == {1: None, 2: None, 3: "c", 4: "d"}


# --- Explicit evolution: `update_schema` (issue 24, part 2) ---------------------------------

WIDE = pa.schema(
    [
        pa.field("id", pa.int64(), nullable=False),
        pa.field("city", pa.string()),
        pa.field("n", pa.int32()),
        pa.field("x", pa.string()),
        pa.field("ts", pa.int64()),
    ]
)


def commit_file(path: str, instant: str) -> dict[str, Any]:
    found = [
        p for p in Path(path, ".hoodie").iterdir() if p.name.startswith(instant) and p.name.endswith("commit")
    ]
    assert len(found) == 1, found
    return json.loads(found[0].read_text())


@pytest.mark.parametrize("table_type", TYPES)
def test_renamed_dropped_and_moved_columns_are_read_by_id_at_every_instant(
    table_path: str, table_type: str
) -> None:
    """Rename `n` → `amount` (and widen it), drop `x` and add a new `x`, move `amount` first:
    files of every age read under the current names: the renamed column keeps its values, the
    new `x` is null in older files (never the dropped column's values), through snapshots, time
    travel, incremental queries, read-optimized reads, compaction or clustering, and reopening."""
    t = make(table_path, table_type, WIDE)
    first = t.insert(batch([1, 2, 3], n=pa.array([10, 20, 30], pa.int32()), x=["a", "b", "c"])).instant
    second = t.upsert(batch([2], ts=2, n=pa.array([21], pa.int32()), x=["b2"])).instant
    with t.update_schema() as u:
        u.rename_column("n", "amount")
        u.delete_column("x")
        u.add_column("x", pa.string())
        u.update_column("amount", pa.int64())
        u.move_first("amount")
    assert u.instant is not None
    assert t.schema.names[5:] == ["amount", "id", "city", "ts", "x"]
    assert t.schema.field("amount").type == pa.int64()
    third = t.upsert(batch([3, 4], ts=3, amount=[300, 400], x=["new3", "new4"])).instant

    # Time travel reads the columns of its instant, under their names then.
    old, new = ["id", "n", "x"], ["id", "amount", "x"]
    expected = {
        first: (old, [(1, 10, "a"), (2, 20, "b"), (3, 30, "c")]),
        second: (old, [(1, 10, "a"), (2, 21, "b2"), (3, 30, "c")]),
        u.instant: (new, [(1, 10, None), (2, 21, None), (3, 30, None)]),
        third: (new, [(1, 10, None), (2, 21, None), (3, 300, "new3"), (4, 400, "new4")]),
    }

    def as_rows(table: pa.Table, cols: list[str] = new) -> list[tuple]:
        return sorted(tuple(r.values()) for r in table.select(cols).to_pylist())

    def check(t: oxlake.Table) -> None:
        assert as_rows(t.to_arrow()) == expected[third][1]
        for instant, (cols, want) in expected.items():
            assert t.schema_as_of(instant).names[5:] == (
                ["id", "city", "n", "x", "ts"] if cols == old else ["amount", "id", "city", "ts", "x"]
            )
            assert as_rows(t.to_arrow(as_of=instant), cols) == want, instant
        assert as_rows(t.to_arrow(query="incremental", start=u.instant)) == [
            (3, 300, "new3"),
            (4, 400, "new4"),
        ]
        assert as_rows(t.to_arrow(query="incremental", start=first, end=second)) == [(2, 21, None)]
        assert sorted(t.to_arrow(filter=[("amount", ">=", 30)]).column("id").to_pylist()) == [3, 4]
        assert sorted(t.to_arrow(filter="x IS NULL").column("id").to_pylist()) == [1, 2]
        assert t.to_arrow(as_of=second, filter=[("n", "=", 21)]).column("x").to_pylist() == ["b2"]
        for instant, (cols, want) in expected.items():
            dask = oxlake.dask.read(table_path, as_of=instant).compute(scheduler="sync")
            got = sorted(
                tuple(None if pd.isna(v) else v for v in r) for r in dask[cols].itertuples(index=False)
            )
            assert got == want, instant
        dask = oxlake.dask.read(table_path).compute(scheduler="sync")
        assert list(dask.columns[5:]) == ["amount", "id", "city", "ts", "x"]
        assert len(dask) == 4

    check(t)
    check(oxlake.Table(table_path))
    if table_type == "merge_on_read":
        t.compact(min_log_files=1)
        assert as_rows(t.to_arrow(query="read_optimized")) == expected[third][1]
    else:
        t.cluster()
    check(oxlake.Table(table_path))


@pytest.mark.parametrize("table_type", TYPES)
def test_lookup_reads_files_of_every_schema_version_by_the_record_index(
    table_path: str, table_type: str
) -> None:
    """`lookup` finds keys through the record index in files written before an added column, a
    promotion, a rename and a drop, and gives their rows in the latest schema."""
    t = make(table_path, table_type, WIDE)
    t.build_metadata()
    t.insert(batch([1, 2, 3], n=pa.array([10, 20, 30], pa.int32()), x=["a", "b", "c"]))
    t.upsert(batch([4], ts=2, n=pa.array([40], pa.int32()), x=["d"], note=["added"]), schema_mode="merge")
    with t.update_schema() as u:
        u.rename_column("n", "amount")
        u.update_column("amount", pa.int64())
        u.delete_column("x")
    t.upsert(batch([2, 5], ts=3, amount=[200, 500], note=["two", "five"]))
    t = oxlake.Table(table_path)
    keys = pa.table({"id": [1, 2, 4, 5, 9], "city": ["sf", "nyc", "nyc", "sf", "sf"]})
    got = sorted(tuple(r.values()) for r in t.lookup(keys, columns=["id", "amount", "note"]).to_pylist())
    assert got == [(1, 10, None), (2, 200, "two"), (4, 40, "added"), (5, 500, "five")]
    assert t.lookup(keys).schema.names == t.schema.names
    assert "x" not in t.lookup(keys).schema.names


def test_schema_history_is_apache_hudi_internal_schema_json(table_path: str) -> None:
    """`.hoodie/.schema/<instant>.schemacommit` holds every version, newest first, as
    `SerDeHelper.toJson` writes them; each commit records its version as `latestSchema`. Ids:
    meta fields 0-4, data columns from 5 in order; a renamed column keeps its id, a column
    added again under a dropped one's name takes a fresh one."""
    t = make(table_path, "copy_on_write", WIDE)
    t.insert(batch([1], n=pa.array([1], pa.int32()), x=["a"]))
    with t.update_schema() as u:
        u.rename_column("n", "amount")
        u.delete_column("x")
        u.add_column("x", pa.string(), doc="the new x")
    alter = u.instant
    assert alter is not None
    written = t.upsert(batch([2], ts=2, amount=[2], x=["b"])).instant
    evolved = t.upsert(batch([3], ts=3, amount=[3], x=["c"], note=["z"]), schema_mode="merge").instant

    meta = commit_file(table_path, alter)
    assert meta["operationType"] == "ALTER_SCHEMA"
    assert meta["partitionToWriteStats"] == {}
    latest = json.loads(meta["extraMetadata"]["latestSchema"])
    assert list(latest) == ["max_column_id", "version-id", "type", "fields"]
    assert latest["version-id"] == int(alter) and latest["type"] == "record"
    by_name = {f["name"]: f for f in latest["fields"]}
    assert [f["id"] for f in latest["fields"][:5]] == [0, 1, 2, 3, 4]
    assert by_name["amount"]["id"] == 7 and by_name["amount"]["type"] == "int"
    assert by_name["x"]["id"] == 10 and by_name["x"]["doc"] == "the new x"
    assert latest["max_column_id"] == 10
    assert list(by_name["id"]) == ["id", "name", "optional", "type"]
    assert json.loads(meta["extraMetadata"]["schema"])["fields"][2]["name"] == "amount"

    # A plain write records the same version; an evolving one a new version with a new id.
    assert json.loads(commit_file(table_path, written)["extraMetadata"]["latestSchema"]) == latest
    newest = json.loads(commit_file(table_path, evolved)["extraMetadata"]["latestSchema"])
    assert newest["version-id"] == int(evolved) and newest["max_column_id"] == 11
    assert {f["name"]: f["id"] for f in newest["fields"]}["note"] == 11

    history_files = sorted(Path(table_path, ".hoodie", ".schema").glob("*.schemacommit"))
    assert [p.name.split(".")[0] for p in history_files] == [alter, written, evolved]
    history = json.loads(history_files[-1].read_text())
    assert [s["version-id"] for s in history["schemas"]] == [int(evolved), int(alter), 0]
    assert [f["name"] for f in history["schemas"][-1]["fields"]][5:] == ["id", "city", "n", "x", "ts"]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda u: u.rename_column("id", "key"), "`id`"),
        (lambda u: u.delete_column("city"), "`city`"),
        (lambda u: u.rename_column("ts", "t"), "`ts`"),
        (lambda u: u.rename_column("n", "x"), "already exists"),
        (lambda u: u.rename_column("n", "_hoodie_commit_time"), "cannot name"),
        (lambda u: u.delete_column("nope"), "`nope`"),
        (lambda u: u.update_column("n", pa.int8()), "`n`"),
        (lambda u: u.update_column("x", pa.int64()), "`x`"),
        (lambda u: u.add_column("n", pa.string()), "already exists"),
        (lambda u: u.add_column(("x", "inner"), pa.string()), "not a struct"),
        (lambda u: u.move_after("n", "nope"), "`nope`"),
        (lambda u: u.rename_column("n", "n\x00m"), "cannot name"),
        (lambda u: u.delete_column(("x", "inner")), "not a top-level column"),
        (lambda u: u.rename_column(("x", "inner"), "y"), "not a top-level column"),
        (lambda u: u.move_first(("x", "inner")), "not a top-level column"),
    ],
)
def test_refused_schema_changes_leave_the_table_as_it_was(table_path: str, change: Any, message: str) -> None:
    t = make(table_path, "merge_on_read", WIDE)
    t.insert(batch([1], n=pa.array([1], pa.int32()), x=["a"]))
    before = files_digest(table_path)
    with pytest.raises(oxlake.SchemaMismatchError, match=message):
        with t.update_schema() as u:
            u.move_first("n")  # applied only with the rest: the refusal discards it
            change(u)
    assert files_digest(table_path) == before
    assert oxlake.Table(table_path).schema == t.schema


def test_an_error_inside_the_block_commits_nothing(table_path: str) -> None:
    t = make(table_path, "copy_on_write", WIDE)
    t.insert(batch([1], n=pa.array([1], pa.int32()), x=["a"]))
    before = files_digest(table_path)
    with pytest.raises(RuntimeError):
        with t.update_schema() as u:
            u.rename_column("n", "amount")
            raise RuntimeError("changed my mind")
    assert files_digest(table_path) == before
    with t.update_schema() as u:
        pass
    assert u.instant is None


def test_a_schema_change_waits_for_a_pending_compaction(table_path: str, tmp_path: Path) -> None:
    """A compaction's files are named by its (earlier) instant, whose schema version would not
    match what it writes: the change is refused while one is pending, the table unchanged."""
    from conftest import paused

    t = make(table_path, "merge_on_read", WIDE)
    t.insert(batch([1, 2], n=pa.array([1, 2], pa.int32()), x=["a", "b"]))
    t.upsert(batch([1], ts=2, n=pa.array([3], pa.int32()), x=["c"]))
    code = "import sys, oxlake; oxlake.Table(sys.argv[1]).compact(min_log_files=1)"
    with paused(table_path, "before-commit", code, tmp_path) as proc:
        before = files_digest(table_path)
        with pytest.raises(oxlake.CommitConflictError, match="compaction is pending"):
            with t.update_schema() as u:
                u.rename_column("n", "amount")
        assert files_digest(table_path) == before
    assert proc.returncode == 0, (proc.out, proc.err)
    with t.update_schema() as u:
        u.rename_column("n", "amount")
    got = sorted((r["id"], r["amount"]) for r in t.to_arrow(columns=["id", "amount"]).to_pylist())
    assert got == [(1, 3), (2, 2)]


def test_rolling_back_a_schema_change_reads_the_old_names_again(table_path: str) -> None:
    t = make(table_path, "merge_on_read", WIDE)
    t.insert(batch([1, 2], n=pa.array([1, 2], pa.int32()), x=["a", "b"]))
    with t.update_schema() as u:
        u.rename_column("n", "amount")
        u.delete_column("x")
    t.rollback(u.instant)
    t = oxlake.Table(table_path)
    assert t.schema.names[5:] == ["id", "city", "n", "x", "ts"]
    assert sorted(t.to_arrow(columns=["id", "n", "x"]).to_pylist(), key=lambda r: r["id"]) == [
        {"id": 1, "n": 1, "x": "a"},
        {"id": 2, "n": 2, "x": "b"},
    ]
    # And the change can be made again, then written under.
    with t.update_schema() as u:
        u.rename_column("n", "amount")
    t.upsert(batch([3], ts=2, amount=[3], x=["c"]))
    got = sorted((r["id"], r["amount"], r["x"]) for r in oxlake.Table(table_path).to_arrow().to_pylist())
    assert got == [(1, 1, "a"), (2, 2, "b"), (3, 3, "c")]


def test_column_stats_never_prune_by_a_name_a_file_gave_another_column(table_path: str) -> None:
    """Drop `x`, add a new `x`: the metadata table's stats of older files describe the old
    column under that name. A filter on the new `x` must not use them (every old row's `x` is
    null now)."""
    t = make(table_path, "copy_on_write", WIDE)
    t.build_metadata()
    t.insert(batch([1, 2], n=pa.array([1, 2], pa.int32()), x=["a", "b"]))
    with t.update_schema() as u:
        u.delete_column("x")
        u.add_column("x", pa.string())
        u.rename_column("n", "m")
        u.add_column("n", pa.int32())
    t = oxlake.Table(table_path)
    assert sorted(t.to_arrow(filter="x IS NULL").column("id").to_pylist()) == [1, 2]
    assert sorted(t.to_arrow(filter="n IS NULL").column("id").to_pylist()) == [1, 2]
    assert sorted(t.to_arrow(filter=[("m", "=", 2)]).column("id").to_pylist()) == [2]


def test_the_cli_alters_the_schema(table_path: str, capsys: pytest.CaptureFixture[str]) -> None:
    from oxlake.cli import main

    t = make(table_path, "copy_on_write", WIDE)
    t.insert(batch([1], n=pa.array([5], pa.int32()), x=["a"]))
    args = ["alter-schema", table_path, "--rename", "n=amount", "--drop", "x", "--add", "x:string"]
    assert main([*args, "--update", "amount:long", "--add", "price:decimal(10, 2)", "--move-first", "x"]) == 0
    assert "schema changed, instant" in capsys.readouterr().out
    t = oxlake.Table(table_path)
    assert t.schema.names[5:] == ["x", "id", "city", "amount", "ts", "price"]
    assert t.schema.field("price").type == pa.decimal128(10, 2)
    assert t.to_arrow(columns=["id", "amount", "x", "price"]).to_pylist() == [
        {"id": 1, "amount": 5, "x": None, "price": None}
    ]
    assert main(["alter-schema", table_path, "--rename", "id=key"]) == 1
    assert "SchemaMismatchError" in capsys.readouterr().err
    assert main(["alter-schema", table_path, "--add", "y:nonsense"]) == 1


def test_a_table_apache_hudi_evolved_by_column_id_is_read_by_id(table_path: str) -> None:
    """A table whose columns Apache Hudi's schema-on-read evolution renamed and dropped (built
    by hand: oxlake's own schema records taken out, so that only what Java writes is left:
    `latestSchema` in every commit, `.hoodie/.schema` history, the Avro `schema`): read by id."""
    t = make(table_path, "merge_on_read", WIDE)
    t.insert(batch([1, 2], n=pa.array([10, 20], pa.int32()), x=["a", "b"]))
    with t.update_schema() as u:
        u.rename_column("n", "amount")
        u.delete_column("x")
    t.upsert(batch([2, 3], ts=2, amount=pa.array([21, 30], pa.int32())))
    hoodie = Path(table_path, ".hoodie")
    for commit in hoodie.glob("*commit"):
        meta = json.loads(commit.read_text())
        if meta.get("extraMetadata", {}).pop("oxlake.arrow.schema", None) is not None:
            commit.write_text(json.dumps(meta))
    properties = (hoodie / "hoodie.properties").read_text().splitlines()
    kept = [line for line in properties if not line.startswith("oxlake.table.")]
    assert len(kept) < len(properties)
    (hoodie / "hoodie.properties").write_text("\n".join(kept) + "\n")

    t = oxlake.Table(table_path)
    assert t.schema.names[5:] == ["id", "city", "amount", "ts"]
    got = sorted((r["id"], r["amount"]) for r in t.to_arrow(columns=["id", "amount"]).to_pylist())
    assert got == [(1, 10), (2, 21), (3, 30)]


@pytest.mark.parametrize("table_type", TYPES)
@pytest.mark.parametrize("how", ["drop", "rename"])
def test_a_write_adding_a_dropped_columns_name_never_reads_the_dropped_values(
    table_path: str, table_type: str, how: str
) -> None:
    """Drop `x` (or rename it to `y`), then a `schema_mode="merge"` write adds a new `x` into the
    file group holding the old values: rewriting that file (copy-on-write) must not carry them
    into the new column."""
    t = make(table_path, table_type, WIDE)
    t.insert(batch([1], n=pa.array([1], pa.int32()), x=["SECRET"]))
    with t.update_schema() as u:
        u.delete_column("x") if how == "drop" else u.rename_column("x", "y")
    t.upsert(batch([3], ts=2, n=pa.array([3], pa.int32()), x=["new"]), schema_mode="merge")
    got = {r["id"]: r["x"] for r in oxlake.Table(table_path).to_arrow(columns=["id", "x"]).to_pylist()}
    assert got == {1: None, 3: "new"}


def test_a_schema_change_overtaken_by_a_later_write_conflicts(table_path: str, tmp_path: Path) -> None:
    """The schema change is paused before its commit while a write with a later instant
    completes: the latest commit's schema is the table's, so landing the change now would hide
    it. It fails with a conflict, the table as the write left it; a retry lands it."""
    from conftest import paused

    t = make(table_path, "copy_on_write", WIDE)
    t.insert(batch([1, 2], n=pa.array([1, 2], pa.int32()), x=["a", "b"]))
    code = (
        "import sys, oxlake; t = oxlake.Table(sys.argv[1])\n"
        "with t.update_schema() as u:\n    u.rename_column('n', 'amount')"
    )
    with paused(table_path, "before-commit", code, tmp_path) as proc:
        t.upsert(batch([3], ts=2, n=pa.array([3], pa.int32()), x=["c"]))
    assert proc.returncode != 0 and "CommitConflictError" in proc.err, (proc.out, proc.err)
    t = oxlake.Table(table_path)
    assert "n" in t.schema.names and "amount" not in t.schema.names
    with t.update_schema() as u:
        u.rename_column("n", "amount")
    got = sorted((r["id"], r["amount"]) for r in oxlake.Table(table_path).to_arrow().to_pylist())
    assert got == [(1, 1), (2, 2), (3, 3)]


@pytest.mark.parametrize("change", ["add", "rename"])
def test_a_schema_change_committing_beside_a_later_write_lands(
    table_path: str, tmp_path: Path, change: str
) -> None:
    """A schema change past its intent (held before it reads the others') and a write of other
    rows beginning after it, both committing at once: they meet only through the schema, so
    neither gives way. The write waits for the earlier change and says so; the change lands,
    then the write, against the changed schema: an added column reads null in its rows, a
    renamed one it wrote by the old name is a conflict naming the column."""
    import threading

    from conftest import paused

    t = make(table_path, "copy_on_write", WIDE)
    t.insert(batch([1, 2], n=pa.array([1, 2], pa.int32()), x=["a", "b"]))
    how = "u.add_column('extra', pa.string())" if change == "add" else "u.rename_column('n', 'amount')"
    code = (
        "import sys, oxlake, pyarrow as pa; t = oxlake.Table(sys.argv[1])\n"
        f"with t.update_schema() as u:\n    {how}"
    )
    outcome: list[object] = []

    def write() -> None:
        try:
            outcome.append(
                oxlake.Table(table_path).upsert(batch([3], ts=2, n=pa.array([3], pa.int32()), x=["c"]))
            )
        except oxlake.OxlakeError as e:
            outcome.append(e)

    with paused(table_path, "before-intents", code, tmp_path) as proc:
        writer = threading.Thread(target=write)
        writer.start()
        writer.join(timeout=3)
        assert writer.is_alive(), f"the write did not wait for the schema change: {outcome}"
    writer.join(timeout=120)
    assert proc.returncode == 0, (proc.out, proc.err)
    t = oxlake.Table(table_path)
    if change == "add":
        assert isinstance(outcome[0], oxlake.WriteResult), outcome
        got = sorted((r["id"], r["extra"]) for r in t.to_arrow(columns=["id", "extra"]).to_pylist())
        assert got == [(1, None), (2, None), (3, None)]
    else:
        assert isinstance(outcome[0], oxlake.CommitConflictError), outcome
        assert "column `n` was renamed or dropped" in str(outcome[0])
        got = sorted((r["id"], r["amount"]) for r in t.to_arrow(columns=["id", "amount"]).to_pylist())
        assert got == [(1, 1), (2, 2)]
    assert t.validate().ok
