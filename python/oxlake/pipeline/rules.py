"""The decision rules of a pipeline run, written once as pure Arrow functions of tables.

The driver path applies them to `pa.Table`s (after `pa.Table.join`); the Spark path applies the
same functions in its tasks through `mapInArrow` (after Spark's join or repartition by key),
one batch or one task's rows at a time:

- `checksummed`: a candidate's content (an empty payload is none) and its checksum;
- `decide`: a candidate against the checksum published for its key → the operation;
- `vanished`: the empty candidate of an output no input feeds any more (a published one is
  deleted);
- `graph_rows`: the state rows of a map-group task's graph (per input the outputs it feeds, per
  output its pieces), and `graph_name`, `edges`, `stored_pieces` to read them;
- `written`: the decided rows a commit writes.
"""

from __future__ import annotations

import base64
import hashlib
import json

import pyarrow as pa
import pyarrow.compute as pc

from oxlake.pipeline.catalog import STATE_LAYER

#: The key of a catalog row, of an input partition (INPUT rows), of an output (PIECE rows).
KEYS = ["layer", "partition"]
IN_KEYS = ["catalog", "layer", "partition"]
OUT_KEYS = ["out_layer", "out_partition"]

#: The operations a commit writes.
WRITES = ("upsert", "delete")

#: Candidate rows of an output or state partition (a null payload: no content).
CANDIDATES = pa.schema([("layer", pa.string()), ("partition", pa.string()), ("payload", pa.binary())])
#: Candidates with their checksums (`checksummed`).
SUMMED = CANDIDATES.append(pa.field("checksum", pa.string()))
#: Decided rows of a task (`decide`): what each candidate does to the catalog.
ROWS = pa.schema([("task", pa.string()), ("op", pa.string()), *SUMMED, ("compiled", pa.bool_())])

#: Pieces of a map-group task: an input's contribution to an output (`MapGroupCompiler.map`).
PIECES = pa.schema(
    [
        *((c, pa.string()) for c in (*OUT_KEYS, *IN_KEYS)),
        ("seq", pa.int32()),
        ("value", pa.binary()),
    ]
)

#: The sides of a map-group task's graph: the key columns of PIECE rows a graph row is named by,
#: and those of the partitions it lists.
SIDES = {"in": (IN_KEYS, OUT_KEYS), "out": (OUT_KEYS, IN_KEYS)}


def checksummed(rows: pa.Table) -> pa.Table:
    """`rows` (with a `payload` column and no `checksum`) with an empty payload made null and,
    after `payload`, its `checksum`: the SHA-256 of the payload (hex; null for null)."""
    payloads = [p or None for p in rows.column("payload").to_pylist()]
    sums = [None if p is None else hashlib.sha256(p).hexdigest() for p in payloads]
    at = rows.schema.get_field_index("payload")
    rows = rows.set_column(at, "payload", pa.array(payloads, pa.binary()))
    return rows.add_column(at + 1, "checksum", pa.array(sums, pa.string()))


def decide(task: str, rows: pa.Table) -> pa.Table:
    """ROWS of candidates joined to what is published for their keys.

    Columns in: layer, partition, payload, checksum (null: no content), compiled (null: no
    candidate, a published key only) and `old`, the published checksum (null: not published).
    The op: upsert (content, not published or published with another checksum), unchanged
    (content, published with this checksum), delete (no content, published), none (no content,
    not published)."""
    checksum, old = rows.column("checksum"), rows.column("old")
    content, published = pc.is_valid(checksum), pc.is_valid(old)
    differs = pc.or_kleene(pc.invert(published), pc.not_equal(checksum, old))
    op = pc.if_else(
        content, pc.if_else(differs, "upsert", "unchanged"), pc.if_else(published, "delete", "none")
    )
    columns = {"task": pa.repeat(task, rows.num_rows), "op": op}
    columns |= {c: rows.column(c) for c in ["layer", "partition", "payload", "checksum"]}
    columns["compiled"] = pc.fill_null(rows.column("compiled"), False)
    return pa.table(columns, schema=ROWS)


def vanished(keys: pa.Table, schema: pa.Schema = CANDIDATES) -> pa.Table:
    """Rows of `schema` for the (layer, partition) `keys`, without content (every other column
    null): the candidates of outputs no input feeds any more."""
    n = keys.num_rows
    return pa.table(
        [keys.column(f.name) if f.name in KEYS else pa.nulls(n, f.type) for f in schema], schema=schema
    )


def graph_name(task: str, side: str, key: tuple[str, ...]) -> str:
    """The state-layer partition of a map-group task's edges of one input ("in") or output
    ("out") partition."""
    return "|".join([task, side, *key])


def graph_rows(task: str, side: str, pieces: pa.Table) -> pa.Table:
    """CANDIDATES rows (state layer) of one side of a map-group task's graph, from PIECE rows
    holding every piece of each of their keys on that side, in key order:
    - per input partition ("in"), the outputs it feeds: a sorted JSON list of their keys;
    - per output partition ("out"), its pieces: a JSON list of `[catalog, layer, partition, seq,
      value (base64)]` in the order `reduce` takes them (`stored_pieces`), so that an incremental
      run reduces an output from the pieces of its unchanged inputs without mapping them again.
    A piece repeated (same input and `seq`) is kept once."""
    by, to = SIDES[side]
    listed = list(to) if side == "in" else [*to, "seq", "value"]
    rows = pieces.select([*by, *listed]).sort_by([(c, "ascending") for c in [*by, *listed]])
    columns = [rows.column(c).to_pylist() for c in listed]
    if side == "out":
        columns[-1] = [None if v is None else base64.b64encode(v).decode("ascii") for v in columns[-1]]
    owners, items = _tuples(rows, by), list(zip(*columns, strict=True))
    keys, payloads, start = [], [], 0
    for i in range(1, len(items) + 1):
        if i == len(items) or owners[i] != owners[start]:
            group = [x for j, x in enumerate(items[start:i], start) if j == start or x != items[j - 1]]
            keys.append(owners[start])
            payloads.append(json.dumps(group, separators=(",", ":"), ensure_ascii=False).encode())
            start = i
    return pa.table(
        [
            pa.array([STATE_LAYER] * len(keys), pa.string()),
            pa.array([graph_name(task, side, k) for k in keys], pa.string()),
            pa.array(payloads, pa.binary()),
        ],
        schema=CANDIDATES,
    )


def edges(payload: bytes) -> list[tuple[str, ...]]:
    """The output keys an "in" graph row lists."""
    return [tuple(key) for key in json.loads(payload)]


def stored_pieces(payload: bytes) -> list[tuple[str, str, str, int, bytes | None]]:
    """The pieces an "out" graph row keeps: (catalog, layer, partition, seq, value), in order."""
    return [(c, layer, p, seq, _decoded(v)) for c, layer, p, seq, v in json.loads(payload)]


def _decoded(value: str | None) -> bytes | None:
    """A kept piece's value: base64, or null for a `map` that gave None."""
    return None if value is None else base64.b64decode(value)


def fed_outputs(rows: pa.Table) -> pa.Table:
    """(out_layer, out_partition) of every output the "in" graph rows (column `payload`) list."""
    listed = [key for payload in rows.column("payload").to_pylist() if payload for key in edges(payload)]
    return pa.table([pa.array([k[i] for k in listed], pa.string()) for i in (0, 1)], names=OUT_KEYS)


def pieces_at_most(rows: pa.Table) -> int:
    """At least as many as the pieces the "out" graph rows `rows` (column `payload`) keep,
    counted without decoding them (each piece is a JSON list inside the row's list, so each
    opens one `[` more; names may hold more): what `unpacked` would make of them is bounded
    before it is made."""
    payloads = rows.column("payload")
    brackets = int(pc.sum(pc.count_substring(payloads, "[")).as_py() or 0)
    lists = rows.num_rows - int(payloads.null_count)
    return int(max(brackets - lists, 0))


def unpacked(rows: pa.Table) -> pa.Table:
    """PIECES of the "out" graph rows `rows` (columns out_layer, out_partition, payload)."""
    listed: list[tuple[object, ...]] = []
    for layer, partition, payload in zip(
        *(rows.column(c).to_pylist() for c in [*OUT_KEYS, "payload"]), strict=True
    ):
        if payload:
            listed.extend((layer, partition, *piece) for piece in json.loads(payload))
    columns = [list(c) for c in zip(*listed, strict=True)] if listed else [[] for _ in PIECES.names]
    columns[-1] = [_decoded(v) for v in columns[-1]]
    return pa.table(columns, schema=PIECES)


def written(rows: pa.Table) -> pa.Table:
    """The ROWS a commit writes (op upsert or delete)."""
    return rows.filter(pc.is_in(rows.column("op"), value_set=pa.array(WRITES, pa.string())))


def _tuples(rows: pa.Table, columns: list[str]) -> list[tuple[str, ...]]:
    return list(zip(*(rows.column(c).to_pylist() for c in columns), strict=True))
