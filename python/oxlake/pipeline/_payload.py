"""Structured payloads inside a pipeline run.

A structured layer keeps its payloads in a struct column of its own (named after the layer);
between reading and writing, a run carries every payload as bytes: a structured value as the
Arrow IPC message of a one-row batch of its type. That encoding is canonical (the same value of
the same type gives the same bytes), so the publisher's checksum of it says whether a
partition changed, exactly as for binary payloads.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pyarrow as pa


def encode(value: Mapping[str, Any], type: pa.StructType) -> bytes:
    """The bytes of one structured value (raises TypeError/ArrowInvalid when it does not fit)."""
    column = pa.array([value], type)
    return pa.record_batch([column], names=["v"]).serialize().to_pybytes()  # type: ignore[no-any-return]


def decode(data: bytes, type: pa.StructType) -> dict[str, Any]:
    batch = pa.ipc.read_record_batch(pa.py_buffer(data), pa.schema([("v", type)]))
    return batch.column(0)[0].as_py()  # type: ignore[no-any-return]


def to_bytes(values: pa.Array, type: pa.StructType) -> pa.Array:
    """A struct column as encoded payloads (null stays null)."""
    return pa.array([None if v is None else encode(v, type) for v in values.to_pylist()], pa.binary())


def to_struct(payloads: pa.Array, type: pa.StructType) -> pa.Array:
    """Encoded payloads as a struct column (null stays null)."""
    return pa.array([None if p is None else decode(p, type) for p in payloads.to_pylist()], type)


def payloads(rows: pa.Table, structured: Mapping[str, pa.StructType]) -> pa.Array:
    """The payload of each catalog row as bytes: the `payload` column, or for a row of a
    structured layer, its value in the layer's column, encoded."""
    layers = rows.column("layer").to_pylist()
    present = set(layers)
    mine = [layer for layer in structured if layer in rows.column_names and layer in present]
    if not mine:
        return rows.column("payload").combine_chunks()
    out = rows.column("payload").to_pylist()
    columns = {layer: rows.column(layer).to_pylist() for layer in mine}
    for i, layer in enumerate(layers):
        if layer in columns:
            value = columns[layer][i]
            out[i] = None if value is None else encode(value, structured[layer])
    return pa.array(out, pa.binary())
