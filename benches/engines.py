"""oxlake tables in other engines (issue 31): a query with a selective filter and two columns,
each engine reading through oxlake with pushdown against the same engine reading every row and
filtering afterwards. Results are checked equal before anything is timed.

    .venv/bin/python benches/engines.py --rows 5000000

The table: `--rows` rows of 6 columns, partitioned by `city` (8 values), copy-on-write, files of
about 128 MB, ids in order (so `id` ranges prune by column statistics too).
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections.abc import Callable
from typing import Any

import datafusion
import duckdb
import numpy as np
import oxlake
import oxlake.polars
import polars as pl
import pyarrow as pa

CITIES = ["sf", "nyc", "chennai", "paris", "lima", "oslo", "pune", "rome"]


def build(path: str, rows: int) -> oxlake.Table:
    rng = np.random.default_rng(7)
    step = 1_000_000
    t: oxlake.Table | None = None
    for start in range(0, rows, step):
        n = min(step, rows - start)
        ids = np.arange(start, start + n, dtype=np.int64)
        data = pa.table(
            {
                "id": ids,
                "city": pa.array(np.array(CITIES)[ids % len(CITIES)]),
                "ts": pa.array(np.full(n, 1, np.int64)),
                "fare": rng.uniform(1, 100, n),
                "tip": rng.uniform(0, 20, n),
                "note": pa.array(np.char.add("note-", (ids % 1000).astype(str))),
            }
        )
        if t is None:
            t = oxlake.write_table(
                path,
                data,
                record_key="id",
                partition_by=["city"],
                ordering_field="ts",
                table_type="copy_on_write",
            )
        else:
            t.bulk_insert(data)
    assert t is not None
    return t


def duckdb_pushed(t: oxlake.Table, sql: str) -> Any:
    """DuckDB over a scan that oxlake filtered and projected (DuckDB takes a `Table` without
    pushdown: it reads every row)."""
    return duckdb.from_arrow(t.scan(columns=["id", "fare"], filter=sql)).to_arrow_table()


def duckdb_dataset(ds: Any, sql: str) -> Any:
    """DuckDB over `t.to_pyarrow_dataset()`: DuckDB's own query, its filter and projection pushed
    into the dataset's Parquet fragments."""
    return duckdb.sql(f"select id, fare from ds where {sql}").to_arrow_table()


def datafusion_everything(t: oxlake.Table, sql: str) -> Any:
    """datafusion-python over the table read whole as an Arrow stream, filtering itself."""
    ctx = datafusion.SessionContext()
    ctx.from_arrow(t, name="everything")
    return ctx.sql(f"select id, fare from everything where {sql}").to_arrow_table()


def duckdb_everything(t: oxlake.Table, sql: str) -> Any:
    """DuckDB over the `Table` itself: every row read, DuckDB filters."""
    return duckdb.sql(f"select id, fare from t where {sql}").to_arrow_table()


def best(fn: Callable[[], Any], repeat: int) -> tuple[float, Any]:
    times, out = [], None
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return min(times), out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=5_000_000)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    path = tempfile.mkdtemp() + "/trips"
    t0 = time.perf_counter()
    t = build(path, args.rows)
    print(f"built {args.rows:,} rows in {time.perf_counter() - t0:.1f} s")
    low = args.rows // 100

    sql = f"city = 'sf' AND id < {low}"
    t0 = time.perf_counter()
    ds = t.to_pyarrow_dataset(with_meta_columns=False)
    print(f"to_pyarrow_dataset: {time.perf_counter() - t0:.3f} s ({len(ds.files)} files, footers read once)")
    fusion = datafusion.SessionContext()
    t0 = time.perf_counter()
    fusion.register_table("trips", t)
    print(f"datafusion register_table: {time.perf_counter() - t0:.3f} s (the snapshot planned)")
    expected = t.to_arrow(columns=["id", "fare"], filter=sql).num_rows
    cases: list[tuple[str, Callable[[], Any], Callable[[], Any]]] = [
        (
            "polars",
            lambda: (
                oxlake.polars.scan(t)
                .filter((pl.col("city") == "sf") & (pl.col("id") < low))
                .select("id", "fare")
                .collect()
            ),
            lambda: (
                pl.DataFrame(t).filter((pl.col("city") == "sf") & (pl.col("id") < low)).select("id", "fare")
            ),
        ),
        (
            "duckdb",
            lambda: duckdb_pushed(t, sql),
            lambda: duckdb_everything(t, sql),
        ),
        (
            "duckdb (dataset)",
            lambda: duckdb_dataset(ds, sql),
            lambda: duckdb_everything(t, sql),
        ),
        (
            "polars (dataset)",
            lambda: (
                pl.scan_pyarrow_dataset(ds)
                .filter((pl.col("city") == "sf") & (pl.col("id") < low))
                .select("id", "fare")
                .collect()
            ),
            lambda: (
                pl.DataFrame(t).filter((pl.col("city") == "sf") & (pl.col("id") < low)).select("id", "fare")
            ),
        ),
        (
            "datafusion-python (`register_table`)",
            lambda: fusion.sql(f"select id, fare from trips where {sql}").to_arrow_table(),
            lambda: datafusion_everything(t, sql),
        ),
        (
            "pyarrow",
            lambda: t.to_arrow(columns=["id", "fare"], filter=sql),
            lambda: pa.table(t).filter(pa.compute.field("city") == "sf").filter(pa.compute.field("id") < low),
        ),
    ]
    print(f"filter {sql!r}: {expected:,} of {args.rows:,} rows")
    print("| engine | through oxlake, pushed down (s) | every row, filtered after (s) | ratio |")
    print("|---|---|---|---|")
    for name, pushed, everything in cases:
        a, got = best(pushed, args.repeat)
        b, full = best(everything, args.repeat)
        rows_of = (lambda x: x.height) if isinstance(got, pl.DataFrame) else (lambda x: len(x))
        assert rows_of(got) == rows_of(full) == expected, (name, rows_of(got), rows_of(full), expected)
        print(f"| {name} | {a:.3f} | {b:.3f} | {b / a:.1f}x |")
    print(f"(best of {args.repeat} runs each)")


if __name__ == "__main__":
    main()
