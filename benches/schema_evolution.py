"""Reading a table written under five schemas against one written under one (issue 24: at most
1.2x). Both tables hold the same rows in five inserts; in the first, each insert evolves the schema
(`schema_mode="merge"`: columns added, `a` widened int32 -> int64 -> double), so reads project four
of the five files' batches onto the latest schema; the second is written in the final schema
throughout and holds the same values (nulls stored where the first lacks a column), so both
reads give the same table (checked). A full read (`to_arrow`) of each, best of `--repeat`, in this process.

With `--renames`, the evolving table also renames `b` before each later insert (`update_schema`:
`b` -> `b_1` -> ... -> `b_4`), so that reads find it by column id under five names; the other
table calls it `b_4` throughout.

    python benches/schema_evolution.py --rows 10000000 --repeat 3 [--table-type merge_on_read] [--renames]
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


def b_name(step: int, renames: bool) -> str:
    """The name of `b` at `step` (with renames: `b`, `b_1`, ..., `b_4`)."""
    return "b" if not renames or step == 0 else f"b_{step}"


def part(n: int, start: int, step: int, final: bool, renames: bool = False) -> pa.Table:
    ids = np.arange(start, start + n, dtype=np.int64)
    a = ids % 1000
    columns: dict[str, pa.Array] = {"id": pa.array(ids)}
    # The type of `a` and the columns present at each step of the evolving table.
    a_type = [pa.int32(), pa.int32(), pa.int64(), pa.int64(), pa.float64()][step]
    columns["a"] = pa.array(a).cast(pa.float64() if final else a_type)
    columns[b_name(4 if final else step, renames)] = pa.array(np.char.add("b", (ids % 97).astype(str)))
    # The final-schema table holds the same values: nulls where the evolving one lacks a column.
    if step >= 1:
        columns["c"] = pa.array(ids * 3)
    elif final:
        columns["c"] = pa.nulls(n, pa.int64())
    if step >= 3:
        columns["d"] = pa.array(np.char.add("d", (ids % 13).astype(str)))
    elif final:
        columns["d"] = pa.nulls(n, pa.string())
    table = pa.table(columns)
    if not final:
        return table
    names = [b_name(4, renames) if f.name == "b" else f.name for f in FINAL]
    return table.cast(pa.schema([f.with_name(name) for f, name in zip(FINAL, names, strict=True)]))


def build(path: str, rows: int, evolving: bool, table_type: str, renames: bool) -> None:
    first = part(1, 0, 0, not evolving, renames).schema
    t = oxlake.create_table(path, first, record_key="id", table_type=table_type)
    n = rows // 5
    for step in range(5):
        if evolving and renames and step > 0:
            with t.update_schema() as u:
                u.rename_column(b_name(step - 1, True), b_name(step, True))
        t.insert(part(n, step * n, step, not evolving, renames), schema_mode="merge" if evolving else None)


def read(path: str, repeat: int) -> tuple[float, pa.Table]:
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        out = oxlake.Table(path).to_arrow()
        best = min(best, time.perf_counter() - start)
    assert out.schema.field("a").type == pa.float64()
    return best, out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=10_000_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--table-type", default="copy_on_write")
    parser.add_argument("--renames", action="store_true", help="rename `b` at every step (by column id)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        one, five = str(Path(tmp, "one")), str(Path(tmp, "five"))
        build(one, args.rows, False, args.table_type, args.renames)
        build(five, args.rows, True, args.table_type, args.renames)
        (t_one, rows_one), (t_five, rows_five) = read(one, args.repeat), read(five, args.repeat)
        assert oxlake.Table(five).schema.names == oxlake.Table(one).schema.names
        # Like for like: both reads give the same rows and values (the tables' `id` differ only
        # in nullability: the evolving table was created from a nullable one).
        one_rows, five_rows = rows_one.sort_by("id"), rows_five.sort_by("id")
        data = [n for n in rows_one.schema.names if not n.startswith("_hoodie_")]
        assert all(one_rows.column(n).equals(five_rows.column(n)) for n in data)
        print(f"rows={args.rows} table_type={args.table_type} renames={args.renames}")
        print(f"one schema:   {t_one:.3f} s")
        print(f"five schemas: {t_five:.3f} s  ({t_five / t_one:.2f}x)")


if __name__ == "__main__":
    main()
