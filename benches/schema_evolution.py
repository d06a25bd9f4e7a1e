"""Reading a table written under five schemas against one written under one (issue 24: at most
1.2x). Both tables hold the same rows in five inserts; in the first, each insert evolves the schema
(`schema_mode="merge"`: columns added, `a` widened int32 -> int64 -> double), so reads project four
of the five files' batches onto the latest schema; the second is written in the final schema
throughout. A full read (`to_arrow`) of each, best of `--repeat`, in this process.

    python benches/schema_evolution.py --rows 10000000 --repeat 3 [--table-type merge_on_read]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np
import oxlake
import pyarrow as pa

FINAL = pa.schema(
    [
        pa.field("id", pa.int64(), nullable=False),
        ("a", pa.float64()),
        ("b", pa.string()),
        ("c", pa.int64()),
        ("d", pa.string()),
    ]
)


def part(n: int, start: int, step: int, final: bool) -> pa.Table:
    ids = np.arange(start, start + n, dtype=np.int64)
    a = ids % 1000
    columns: dict[str, pa.Array] = {"id": pa.array(ids)}
    # The type of `a` and the columns present at each step of the evolving table.
    a_type = [pa.int32(), pa.int32(), pa.int64(), pa.int64(), pa.float64()][step]
    columns["a"] = pa.array(a).cast(pa.float64() if final else a_type)
    columns["b"] = pa.array(np.char.add("b", (ids % 97).astype(str)))
    if final or step >= 1:
        columns["c"] = pa.array(ids * 3)
    if final or step >= 3:
        columns["d"] = pa.array(np.char.add("d", (ids % 13).astype(str)))
    table = pa.table(columns)
    return table.cast(FINAL) if final else table


def build(path: str, rows: int, evolving: bool, table_type: str) -> None:
    first = part(1, 0, 0, not evolving).schema
    t = oxlake.create_table(path, first, record_key="id", table_type=table_type)
    n = rows // 5
    for step in range(5):
        t.insert(part(n, step * n, step, not evolving), schema_mode="merge" if evolving else None)


def read(path: str, repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        out = oxlake.Table(path).to_arrow()
        best = min(best, time.perf_counter() - start)
    assert out.schema.field("a").type == pa.float64()
    return best


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=10_000_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--table-type", default="copy_on_write")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        one, five = str(Path(tmp, "one")), str(Path(tmp, "five"))
        build(one, args.rows, False, args.table_type)
        build(five, args.rows, True, args.table_type)
        t_one, t_five = read(one, args.repeat), read(five, args.repeat)
        print(f"rows={args.rows} table_type={args.table_type}")
        print(f"one schema:   {t_one:.3f} s")
        print(f"five schemas: {t_five:.3f} s  ({t_five / t_one:.2f}x)")


if __name__ == "__main__":
    main()
