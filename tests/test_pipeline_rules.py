"""The pipeline's decision rules (`oxlake.pipeline.rules`) on small hand-built Arrow tables,
without Spark: checksums, the operation of each candidate, vanished outputs, a map-group task's
graph rows; and the laws that let the Spark path apply them batch by batch."""

from __future__ import annotations

import base64
import hashlib
import json
import random
from functools import partial

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from hypothesis import given
from hypothesis import strategies as st
from oxlake.pipeline import STATE_LAYER, _spark, rules


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def candidates(rows: list[tuple[str, bytes | None]], **columns: list[object]) -> pa.Table:
    """CANDIDATES rows of layer "l" (partition, payload), with extra `columns`."""
    t = pa.table(
        {
            "layer": pa.array(["l"] * len(rows), pa.string()),
            "partition": pa.array([p for p, _ in rows], pa.string()),
            "payload": pa.array([v for _, v in rows], pa.binary()),
        }
    )
    for name, values in columns.items():
        t = t.append_column(name, pa.array(values))
    return t


def joined(rows: list[tuple[str, bytes | None, bool | None, str | None]]) -> pa.Table:
    """Candidates joined to what is published, as `decide` takes them: (partition, payload,
    compiled, old) → with their checksums."""
    t = candidates(
        [(p, v) for p, v, _, _ in rows],
        compiled=pa.array([c for _, _, c, _ in rows], pa.bool_()),
        old=pa.array([o for _, _, _, o in rows], pa.string()),
    )
    return rules.checksummed(t)


# ---- checksummed -------------------------------------------------------------------------------


def test_checksummed_nulls_empty_payloads_and_keeps_other_columns() -> None:
    t = rules.checksummed(candidates([("a", b"x"), ("b", b""), ("c", None)], compiled=[True, False, None]))
    assert t.column_names == ["layer", "partition", "payload", "checksum", "compiled"]
    assert t.column("payload").to_pylist() == [b"x", None, None]
    assert t.column("checksum").to_pylist() == [sha(b"x"), None, None]
    assert t.column("compiled").to_pylist() == [True, False, None]
    assert rules.checksummed(candidates([])).schema == rules.SUMMED


def test_checksummed_of_candidates_is_summed() -> None:
    t = rules.checksummed(candidates([("a", b"\x00\xff")]))
    assert t.schema == rules.SUMMED
    assert t.to_pylist() == [
        {"layer": "l", "partition": "a", "payload": b"\x00\xff", "checksum": sha(b"\x00\xff")}
    ]


# ---- decide ------------------------------------------------------------------------------------


def ops(t: pa.Table) -> dict[str, str]:
    return dict(zip(t.column("partition").to_pylist(), t.column("op").to_pylist(), strict=True))


def test_decide_each_case() -> None:
    t = rules.decide(
        "T",
        joined(
            [
                ("new", b"1", True, None),  # no published row
                ("changed", b"2", True, sha(b"old")),
                ("same", b"3", True, sha(b"3")),
                ("emptied", b"", True, sha(b"4")),  # empty: no content, published → deleted
                ("nothing", None, True, None),  # no content, not published
                ("gone", None, None, sha(b"5")),  # published only (a full run's join)
            ]
        ),
    )
    assert t.schema == rules.ROWS
    assert ops(t) == {
        "new": "upsert",
        "changed": "upsert",
        "same": "unchanged",
        "emptied": "delete",
        "nothing": "none",
        "gone": "delete",
    }
    by_partition = {r["partition"]: r for r in t.to_pylist()}
    assert by_partition["gone"] == {
        "task": "T",
        "op": "delete",
        "layer": "l",
        "partition": "gone",
        "payload": None,
        "checksum": None,
        "compiled": False,
    }
    assert by_partition["changed"]["payload"] == b"2" and by_partition["changed"]["checksum"] == sha(b"2")
    assert by_partition["emptied"]["payload"] is None and by_partition["emptied"]["compiled"] is True
    assert set(t.column("task").to_pylist()) == {"T"}


def test_decide_keeps_the_compiled_flag_of_state_rows() -> None:
    t = rules.decide("T", joined([("T", b"{}", False, None), ("T|in|c|l|p", b"[]", False, sha(b"[]"))]))
    assert t.column("compiled").to_pylist() == [False, False]
    assert t.column("op").to_pylist() == ["upsert", "unchanged"]


def test_decide_of_nothing() -> None:
    t = rules.decide("T", joined([]))
    assert t.num_rows == 0 and t.schema == rules.ROWS


def test_decide_of_a_published_row_without_a_checksum_is_as_unpublished() -> None:
    t = rules.decide("T", joined([("a", b"1", True, None), ("b", None, True, None)]))
    assert t.column("op").to_pylist() == ["upsert", "none"]


def test_written_keeps_upserts_and_deletes() -> None:
    t = rules.decide(
        "T", joined([("u", b"1", True, None), ("s", b"2", True, sha(b"2")), ("d", None, True, sha(b"3"))])
    )
    assert rules.written(t).column("partition").to_pylist() == ["u", "d"]
    assert rules.written(rules.ROWS.empty_table()).num_rows == 0


# ---- vanished ----------------------------------------------------------------------------------


def keys(pairs: list[tuple[str, str]]) -> pa.Table:
    return pa.table(
        {"layer": pa.array([k[0] for k in pairs], pa.string()), "partition": [k[1] for k in pairs]},
        schema=pa.schema([("layer", pa.string()), ("partition", pa.string())]),
    )


def test_vanished_rows_have_no_content() -> None:
    t = rules.vanished(keys([("l", "a"), ("m", "b")]))
    assert t.schema == rules.CANDIDATES
    assert t.to_pylist() == [
        {"layer": "l", "partition": "a", "payload": None},
        {"layer": "m", "partition": "b", "payload": None},
    ]
    summed = rules.vanished(keys([("l", "a")]), rules.SUMMED)
    assert summed.schema == rules.SUMMED and summed.column("checksum").to_pylist() == [None]
    assert rules.vanished(keys([])).num_rows == 0


def test_a_vanished_output_is_deleted_when_published_else_nothing() -> None:
    gone = rules.checksummed(rules.vanished(keys([("l", "was"), ("l", "never")])))
    t = gone.append_column("compiled", pa.array([True, True])).append_column(
        "old", pa.array([sha(b"x"), None], pa.string())
    )
    assert ops(rules.decide("T", t)) == {"was": "delete", "never": "none"}


# ---- graph rows --------------------------------------------------------------------------------


def pieces(edges: list[tuple[str, str, str, str, str]]) -> pa.Table:
    """PIECE rows of (out_layer, out_partition, catalog, layer, partition) edges."""
    columns = [*rules.OUT_KEYS, *rules.IN_KEYS]
    data = {c: pa.array([e[i] for e in edges], pa.string()) for i, c in enumerate(columns)}
    data["seq"] = pa.array(range(len(edges)), pa.int32())
    data["value"] = pa.array([b"v"] * len(edges), pa.binary())
    return pa.table(data, schema=_spark.PIECES)


EDGES = [
    ("o", "2", "c", "l", "a"),
    ("o", "1", "c", "l", "a"),
    ("o", "1", "c", "l", "a"),  # a second piece of the same edge
    ("o", "1", "c", "l", "b"),
]


def test_graph_rows_of_each_side() -> None:
    inputs = rules.graph_rows("T", "in", pieces(EDGES))
    assert inputs.schema == rules.CANDIDATES
    assert inputs.to_pylist() == [
        {"layer": STATE_LAYER, "partition": "T|in|c|l|a", "payload": b'[["o","1"],["o","2"]]'},
        {"layer": STATE_LAYER, "partition": "T|in|c|l|b", "payload": b'[["o","1"]]'},
    ]
    outputs = rules.graph_rows("T", "out", pieces(EDGES))
    assert outputs.to_pylist() == [
        {
            "layer": STATE_LAYER,
            "partition": "T|out|o|1",
            "payload": b'[["c","l","a",1,"dg=="],["c","l","a",2,"dg=="],["c","l","b",3,"dg=="]]',
        },
        {"layer": STATE_LAYER, "partition": "T|out|o|2", "payload": b'[["c","l","a",0,"dg=="]]'},
    ]
    assert rules.stored_pieces(outputs.column("payload")[0].as_py()) == [
        ("c", "l", "a", 1, b"v"),
        ("c", "l", "a", 2, b"v"),
        ("c", "l", "b", 3, b"v"),
    ]
    # Unpacked, the out rows give back the pieces they were made of.
    named = outputs.drop_columns(["layer", "partition"])
    named = named.add_column(0, "out_layer", pa.array(["o", "o"])).add_column(
        1, "out_partition", pa.array(["1", "2"])
    )
    assert sorted(rules.unpacked(named).to_pylist(), key=str) == sorted(pieces(EDGES).to_pylist(), key=str)
    # The in rows name the outputs each input feeds.
    assert rules.fed_outputs(inputs).to_pylist() == [
        {"out_layer": "o", "out_partition": p} for p in ["1", "2", "1"]
    ]


def test_kept_pieces_without_a_value_round_trip() -> None:
    """A `map` that gives None as a value: kept as null, given back as None."""
    table = pieces([("o", "1", "c", "l", "a"), ("o", "1", "c", "l", "b")])
    table = table.set_column(
        table.schema.get_field_index("value"), "value", pa.array([None, b"v"], pa.binary())
    )
    out = rules.graph_rows("T", "out", table)
    assert rules.stored_pieces(out.column("payload")[0].as_py()) == [
        ("c", "l", "a", 0, None),
        ("c", "l", "b", 1, b"v"),
    ]
    named = out.drop_columns(["layer", "partition"]).add_column(0, "out_layer", pa.array(["o"]))
    named = named.add_column(1, "out_partition", pa.array(["1"]))
    assert rules.unpacked(named).to_pylist() == table.to_pylist()


def test_graph_rows_of_no_pieces() -> None:
    for side in rules.SIDES:
        t = rules.graph_rows("T", side, pieces([]))
        assert t.num_rows == 0 and t.schema == rules.CANDIDATES


def test_graph_rows_keep_unicode_and_names_follow_graph_name() -> None:
    t = rules.graph_rows("T", "in", pieces([("ö", "1", "c", "l", "ü/é")]))
    assert (
        t.column("partition").to_pylist()
        == [rules.graph_name("T", "in", ("c", "l", "ü/é"))]
        == ["T|in|c|l|ü/é"]
    )
    payload = t.column("payload")[0].as_py()
    assert payload == json.dumps([["ö", "1"]], ensure_ascii=False, separators=(",", ":")).encode()
    assert rules.edges(payload) == [("ö", "1")]
    t = rules.graph_rows("T", "out", pieces([("ö", "1", "c", "l", "ü/é")]))
    assert t.column("partition").to_pylist() == [rules.graph_name("T", "out", ("ö", "1"))] == ["T|out|ö|1"]
    assert rules.stored_pieces(t.column("payload")[0].as_py()) == [("c", "l", "ü/é", 0, b"v")]


@pytest.mark.parametrize("side", sorted(rules.SIDES))
def test_graph_rows_for_whole_groups_split_by_key(side: str) -> None:
    """What the Spark path computes per task (whole groups) adds up to the graph of all."""
    by, _ = rules.SIDES[side]
    table = pieces(EDGES)
    first = table.filter(pc.equal(table.column(by[-1]), table.column(by[-1])[0]))
    rest = table.filter(pc.not_equal(table.column(by[-1]), table.column(by[-1])[0]))
    parts = pa.concat_tables([rules.graph_rows("T", side, first), rules.graph_rows("T", side, rest)])
    assert sorted(parts.to_pylist(), key=str) == sorted(
        rules.graph_rows("T", side, table).to_pylist(), key=str
    )


# ---- laws --------------------------------------------------------------------------------------

PAYLOADS = [None, b"", b"a", b"b"]
OLD = [None, sha(b"a"), sha(b"b")]

rows_strategy = st.lists(
    st.tuples(
        st.text(max_size=3),
        st.sampled_from(PAYLOADS),
        st.sampled_from([None, True, False]),
        st.sampled_from(OLD),
    ),
    max_size=12,
)


def oracle(checksum: str | None, old: str | None) -> str:
    """The operation of one candidate, as the driver path computed it before the rules."""
    if checksum is None:
        return "delete" if old is not None else "none"
    return "upsert" if old != checksum else "unchanged"


@given(rows_strategy)
def test_decide_follows_the_row_oracle(rows: list[tuple[str, bytes | None, bool | None, str | None]]) -> None:
    t = rules.decide("T", joined(rows))
    expected = [oracle(sha(v) if v else None, o) for _, v, _, o in rows]
    assert t.column("op").to_pylist() == expected
    assert t.column("compiled").to_pylist() == [bool(c) for _, _, c, _ in rows]


@given(rows_strategy, rows_strategy)
def test_decide_of_a_concatenation_is_the_concatenation_of_decides(
    a: list[tuple[str, bytes | None, bool | None, str | None]],
    b: list[tuple[str, bytes | None, bool | None, str | None]],
) -> None:
    both = rules.decide("T", pa.concat_tables([joined(a), joined(b)]))
    assert (
        both.to_pylist()
        == rules.decide("T", joined(a)).to_pylist() + rules.decide("T", joined(b)).to_pylist()
    )


@given(rows_strategy, st.integers(min_value=1, max_value=5))
def test_decide_applied_per_batch_as_on_spark(
    rows: list[tuple[str, bytes | None, bool | None, str | None]], size: int
) -> None:
    """The Spark path's `mapInArrow` (checksum, then decide, batch by batch) equals the rules
    applied to the whole table, as the driver path does."""
    t = candidates(
        [(p, v) for p, v, _, _ in rows],
        compiled=pa.array([c for _, _, c, _ in rows], pa.bool_()),
        old=pa.array([o for _, _, _, o in rows], pa.string()),
    )
    fn = _spark.per_batch(lambda x: rules.decide("T", rules.checksummed(x)))
    batches = list(fn(iter(t.to_batches(max_chunksize=size))))
    got = pa.Table.from_batches(batches, rules.ROWS) if batches else rules.ROWS.empty_table()
    assert got.to_pylist() == rules.decide("T", rules.checksummed(t)).to_pylist()


edges_strategy = st.lists(
    st.tuples(*(st.sampled_from(["x", "y", "é"]) for _ in range(5))),
    max_size=10,
)


@given(edges_strategy, st.randoms())
def test_graph_rows_ignore_the_order_and_repetition_of_pieces(
    edges: list[tuple[str, str, str, str, str]], rnd: random.Random
) -> None:
    table = pieces(edges)
    order = list(range(len(edges))) + list(range(len(edges) // 2))
    rnd.shuffle(order)
    shuffled = table.take(pa.array(order, pa.int64()))
    for side in rules.SIDES:
        graph = partial(rules.graph_rows, "T", side)
        assert graph(shuffled).to_pylist() == graph(table).to_pylist()
    for row in rules.graph_rows("T", "in", table).to_pylist():
        listed = rules.edges(row["payload"])
        assert listed == sorted(set(listed))
    for row in rules.graph_rows("T", "out", table).to_pylist():
        kept = rules.stored_pieces(row["payload"])
        assert kept == sorted(set(kept))


def graph_rows_as_json_dumps_writes_them(task: str, side: str, pieces: pa.Table) -> list[dict[str, object]]:
    """The oracle of `rules.graph_rows`: each key's distinct items in Arrow's order (strings and
    bytes by their bytes, nulls last), written by `json.dumps` one key at a time, values in
    base64."""
    by, to = rules.SIDES[side]
    listed = list(to) if side == "in" else [*to, "seq", "value"]
    groups: dict[tuple[str, ...], set[tuple[object, ...]]] = {}
    for row in pieces.to_pylist():
        groups.setdefault(tuple(row[c] for c in by), set()).add(tuple(row[c] for c in listed))

    def order(item: tuple[object, ...]) -> tuple[tuple[bool, object], ...]:
        return tuple((x is None, x if x is not None else 0) for x in item)

    def text(item: tuple[object, ...]) -> list[object]:
        value = item[-1]
        if side == "in":
            return list(item)
        encoded = None if value is None else base64.b64encode(value).decode("ascii")  # type: ignore[arg-type]
        return [*item[:-1], encoded]

    return [
        {
            "layer": STATE_LAYER,
            "partition": rules.graph_name(task, side, key),
            "payload": json.dumps(
                [text(i) for i in sorted(items, key=order)], separators=(",", ":"), ensure_ascii=False
            ).encode(),
        }
        for key, items in sorted(groups.items())
    ]


def test_graph_rows_refuse_a_piece_without_its_key() -> None:
    """A piece whose output (or input) key is null has no graph row name: refused, not written
    under a null name."""
    table = pieces([("o", "1", "c", "l", "a")])
    for column, side in [("out_partition", "out"), ("partition", "in")]:
        broken = table.set_column(table.schema.get_field_index(column), column, pa.nulls(1, pa.string()))
        with pytest.raises(ValueError, match=f"a piece without its {column}"):
            rules.graph_rows("T", side, broken)


hostile = st.text(
    alphabet=st.sampled_from(
        ["x", "|", '"', "\\", "\n", "\x00", "\x1f", "\x7f", "é", "😀", "%", "/", "[", ","]
    ),
    max_size=3,
)


@given(
    st.lists(
        st.tuples(
            *(hostile for _ in range(5)), st.integers(0, 2), st.sampled_from([None, b"", b"\x00\xff", b"v"])
        ),
        max_size=12,
    ),
    st.sampled_from([1, 2, 3, 200_000]),
    st.sampled_from([1, 40, 2**28]),
)
def test_graph_rows_are_what_json_dumps_writes_whatever_the_names(
    edges: list[tuple[str, str, str, str, str, int, bytes | None]], cut: int, cut_bytes: int
) -> None:
    """Names with quotes, backslashes, control characters, separators and any Unicode; values of
    any bytes or none; repeated pieces; the rows turned into text in slices of any size: the
    graph rows hold exactly what `json.dumps` writes, and decode back to their pieces. Spark's
    large string types are taken as strings."""
    columns = [*rules.OUT_KEYS, *rules.IN_KEYS]
    data: dict[str, pa.Array] = {
        c: pa.array([e[i] for e in edges], pa.string()) for i, c in enumerate(columns)
    }
    data["seq"] = pa.array([e[5] for e in edges], pa.int32())
    data["value"] = pa.array([e[6] for e in edges], pa.binary())
    table = pa.table(data, schema=_spark.PIECES)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(rules, "_SLICE", cut)
        patch.setattr(rules, "_SLICE_BYTES", cut_bytes)
        large = table.cast(
            pa.schema(
                [
                    pa.field(f.name, pa.large_string() if f.type == pa.string() else f.type)
                    for f in table.schema
                ]
            )
        )
        for side in rules.SIDES:
            got = rules.graph_rows("T", side, table)
            assert got.schema == rules.CANDIDATES
            assert got.to_pylist() == graph_rows_as_json_dumps_writes_them("T", side, table)
            assert rules.graph_rows("T", side, large).equals(got)
    out = rules.graph_rows("T", "out", table)
    keys = sorted({(e[0], e[1]) for e in edges})
    named = pa.table(
        {
            "out_layer": pa.array([k[0] for k in keys], pa.string()),
            "out_partition": pa.array([k[1] for k in keys], pa.string()),
            "payload": out.column("payload"),
        }
    )
    # Unpacked, the out rows give back each distinct piece once.
    distinct = {tuple(r.values()) for r in table.to_pylist()}
    unpacked = [tuple(r.values()) for r in rules.unpacked(named).to_pylist()]
    assert sorted(map(repr, unpacked)) == sorted(map(repr, distinct))
    fed = rules.fed_outputs(rules.graph_rows("T", "in", table)).to_pylist()
    assert sorted((r["out_layer"], r["out_partition"]) for r in fed) == sorted(
        d[:2] for d in {e[:5] for e in edges}
    )


names_strategy = st.text(alphabet=st.sampled_from(["x", "[", "]", '"', "\\", "é", ","]), max_size=3)


@given(
    st.lists(st.tuples(*(names_strategy for _ in range(5)), st.sampled_from([None, b"", b"[v]"])), max_size=8)
)
def test_pieces_at_most_bounds_the_pieces_kept_before_they_are_decoded(
    edges: list[tuple[str, str, str, str, str, bytes | None]],
) -> None:
    """The driver path refuses to decode more kept pieces than it may hold by this count, taken
    from the "out" rows' bytes: never fewer than `unpacked` makes, whatever brackets, quotes or
    backslashes the names hold."""
    table = pieces([e[:5] for e in edges])
    table = table.set_column(
        table.schema.get_field_index("value"), "value", pa.array([e[5] for e in edges], pa.binary())
    )
    out = rules.graph_rows("T", "out", table)
    keys = [name.split("|")[2:] for name in out.column("partition").to_pylist()]
    named = pa.table(
        {
            "out_layer": pa.array([k[0] for k in keys], pa.string()),
            "out_partition": pa.array(["|".join(k[1:]) for k in keys], pa.string()),
            "payload": out.column("payload"),
        }
    )
    assert rules.pieces_at_most(named) >= rules.unpacked(named).num_rows
    assert rules.pieces_at_most(named.slice(0, 0)) == 0


def with_marks(rows: pa.Table, side: str, marked: list[tuple[str, ...]]) -> pa.Table:
    """`rows` and marks of the `side` keys `marked`, as `_spark.marks` makes them on Spark: the
    side's key columns set, every other column null."""
    by, _ = rules.SIDES[side]
    columns = {
        f.name: pa.array([k[by.index(f.name)] for k in marked], f.type)
        if f.name in by
        else pa.nulls(len(marked), f.type)
        for f in rows.schema
    }
    return pa.concat_tables([rows, pa.table(columns, schema=rows.schema)])


def run_task(fn: object, table: pa.Table) -> pa.Table:
    out = list(fn(iter(table.to_batches(max_chunksize=2))))  # type: ignore[operator]
    return pa.Table.from_batches(out, rules.CANDIDATES).sort_by(
        [("layer", "ascending"), ("partition", "ascending")]
    )


def test_a_marked_reduce_builds_the_marked_outputs_alone_and_empties_those_without_pieces() -> None:
    from oxlake.pipeline import MapGroupCompiler

    class Count(MapGroupCompiler):
        inputs = {"c": ["l"]}
        outputs = ["o"]

        def reduce(self, layer: str, partition: str, values: list[bytes]) -> bytes:
            return str(len(values)).encode()

    table = with_marks(pieces(EDGES), "out", [("o", "1"), ("o", "1"), ("o", "gone")])
    got = run_task(_spark.reduce_pieces(Count(), {}, graph=True, only_marked=True), table)
    assert got.to_pylist() == [
        {
            "layer": STATE_LAYER,
            "partition": "Count|out|o|1",
            "payload": b'[["c","l","a",1,"dg=="],["c","l","a",2,"dg=="],["c","l","b",3,"dg=="]]',
        },
        {"layer": STATE_LAYER, "partition": "Count|out|o|gone", "payload": None},
        {"layer": "o", "partition": "1", "payload": b"3"},
        {"layer": "o", "partition": "gone", "payload": None},
    ]
    # Unmarked, the same rows give every output and its graph row, and nothing empty.
    whole = run_task(_spark.reduce_pieces(Count(), {}, graph=True), pieces(EDGES))
    assert [r["partition"] for r in whole.to_pylist()] == ["Count|out|o|1", "Count|out|o|2", "1", "2"]
    assert None not in whole.column("payload").to_pylist()


def test_marked_graph_rows_of_inputs_and_marked_compiles_of_outputs() -> None:
    from oxlake.pipeline import DirectCompiler

    table = with_marks(pieces(EDGES), "in", [("c", "l", "b"), ("c", "l", "ü|/%")])
    got = run_task(_spark.graph_task("T", "in", only_marked=True), table)
    assert got.to_pylist() == [
        {"layer": STATE_LAYER, "partition": "T|in|c|l|b", "payload": b'[["o","1"]]'},
        {"layer": STATE_LAYER, "partition": "T|in|c|l|ü|/%", "payload": None},
    ]

    class Names(DirectCompiler):
        inputs = {"c": ["l"]}
        outputs = ["o"]

        def compile(self, layer: str, partition: str, inputs: list[object]) -> bytes:
            return ",".join(i.partition for i in inputs).encode()  # type: ignore[attr-defined]

    direct = pieces(EDGES).drop_columns(["seq", "value"])
    direct = direct.append_column("payload", pa.array([b"p"] * direct.num_rows, pa.binary()))
    got = run_task(
        _spark.compile_direct(Names(), {}, {}, only_marked=True),
        with_marks(direct, "out", [("o", "2"), ("o", "none")]),
    )
    assert got.to_pylist() == [
        {"layer": "o", "partition": "2", "payload": b"a"},
        {"layer": "o", "partition": "none", "payload": None},
    ]
