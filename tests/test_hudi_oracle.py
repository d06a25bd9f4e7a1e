"""hudi-rs (PyPI `hudi`) reads every table oxlake writes and returns the same rows."""

from __future__ import annotations

import oxlake
import pyarrow as pa
from conftest import SCHEMA, hudi_read, rows, trips


def same(ours: pa.Table, theirs: pa.Table, key: str | tuple[str, ...] = "id") -> None:
    assert rows(theirs, key=key) == rows(ours, key=key)


def test_hudi_reads_every_instant_of_a_partitioned_table(table: oxlake.Table) -> None:
    table.insert(trips(list(range(20))))
    table.upsert(trips([1, 5, 30], ts=2, name="u"))
    table.delete(trips([2, 7]).select(["id", "city"]))
    table.insert_overwrite(trips([100, 103], city="sf"))
    same(table.to_arrow(), hudi_read(table.uri))
    for i in table.timeline():
        if i.action in ("commit", "replacecommit"):
            same(table.to_arrow(as_of=i.time), hudi_read(table.uri, as_of=i.time))


def test_hudi_incremental_windows_match(table: oxlake.Table) -> None:
    a = table.insert(trips(list(range(10))))
    b = table.upsert(trips([1, 2, 11], ts=2, name="u"))
    c = table.upsert(trips([2], ts=3, name="v"))
    for s, e in ((a.instant, b.instant), (b.instant, c.instant)):
        same(table.to_arrow(query="incremental", start=s, end=e), hudi_read(table.uri, start=s, end=e))


def test_hudi_reads_complex_keys_and_plain_paths(table_path: str) -> None:
    schema = pa.schema(
        [("k1", pa.int32()), ("k2", pa.string()), ("region", pa.string()), ("v", pa.float64())]
    )
    t = oxlake.create_table(
        table_path, schema, record_key=["k1", "k2"], partition_by=["region"], hive_style=False
    )
    t.insert(
        pa.table(
            {"k1": [1, 1, 2], "k2": ["a", "b", "a"], "region": ["eu", "us", "eu"], "v": [1.0, 2.0, 3.0]},
            schema=schema,
        )
    )
    t.upsert(pa.table({"k1": [1], "k2": ["b"], "region": ["us"], "v": [20.0]}, schema=schema))
    same(t.to_arrow(), hudi_read(table_path), key=("k1", "k2"))


def test_hudi_reads_non_partitioned_table_with_nulls(table_path: str) -> None:
    t = oxlake.create_table(table_path, SCHEMA, record_key="id", ordering_field="ts")
    data = pa.table(
        {"id": [1, 2], "name": [None, "b"], "city": ["sf", None], "ts": [1, None], "fare": [None, 2.0]},
        schema=SCHEMA,
    )
    t.insert(data)
    t.upsert(trips([3]))
    same(t.to_arrow(), hudi_read(table_path))
