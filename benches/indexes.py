"""The metadata table's indexes at work, against the same table without them.

    python benches/indexes.py --rows 1000000 --partitions 20 --files-per-partition 10

One merge-on-read table (record key `id`, partitioned by `id % partitions`, a sorted column `ts`),
copied before `build_metadata()`: one copy has the metadata table, the other does not.

- upsert of 1% of the keys through the record index, against the key-reading index (key
  columns of the files of the partitions touched whose key range may hold a key): once the most
  recent ids (late corrections: a few files per partition hold them), once ids at random (a
  correction anywhere in the history: every file may hold one);
- `lookup` of 100 random keys, against a full scan filtered by `id IN (...)`;
- a filter selecting 1% of a sorted column, with column-stats pruning and without.

`--keys uuid` keys the rows by random UUID strings instead of sequential ids (the case the record
index exists for: no file's key range narrows a lookup), adds `lookup` of 1 key and an upsert of
1,000 random keys, and measures the routing alone (`_native.route`: keys to file groups, nothing
written) beside each upsert.

Each timing is on a freshly opened table, best of `--repeat` (the upserts run once: they change
the table).
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any


def best(repeat: int, run: Callable[[], object]) -> float:
    out = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        run()
        out = min(out, time.perf_counter() - start)
    return out


def two_tables(
    work: Path, args: argparse.Namespace, keys: Any, key: str, bytes_per_row: int
) -> tuple[Any, str, str, int, float]:
    """The bench's table (`key` column `keys`, `args.partitions` partitions, about
    `args.files_per_partition` base files each), written once and copied before
    `build_metadata()`: the copy without the metadata table, the one with it, and how many base
    files and how long the build took."""
    import oxlake
    import pyarrow as pa

    n = args.rows
    data = pa.table(
        {
            key: keys,
            "part": pa.array([f"p{i % args.partitions:03d}" for i in range(n)]),
            "ts": pa.array(range(n), pa.int64()),
            "v": pa.array([float(i) for i in range(n)]),
        }
    )
    plain, indexed = str(work / "plain"), str(work / "indexed")
    t = oxlake.create_table(
        plain,
        data.schema,
        record_key=key,
        partition_by=["part"],
        ordering_field="ts",
        table_type="merge_on_read",
    )
    per_file = n // (args.partitions * args.files_per_partition)
    t.insert(data, target_file_size=per_file * bytes_per_row)
    files = sum(1 for _ in Path(plain).rglob("*.parquet"))
    shutil.copytree(plain, indexed)
    start = time.perf_counter()
    oxlake.Table(indexed).build_metadata()
    return data, plain, indexed, files, time.perf_counter() - start


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--partitions", type=int, default=20)
    parser.add_argument("--files-per-partition", type=int, default=10)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--keys", choices=["sequential", "uuid"], default="sequential")
    parser.add_argument(
        "--cache",
        help="with --keys uuid: keep the tables under this directory and reuse them on the next run",
    )
    args = parser.parse_args()
    if args.keys == "uuid":
        return uuid_keys(args)

    import oxlake
    import pyarrow as pa

    work = Path(tempfile.mkdtemp(prefix="oxlake-index-bench-"))
    n = args.rows
    data, plain, indexed, files, build = two_tables(work, args, pa.array(range(n), pa.int64()), "id", 14)

    k = n // 100
    spreads = {
        "the most recent": list(range(n - k, n)),
        "random": sorted(random.Random(3).sample(range(n), k)),
    }
    upserts: dict[tuple[str, str], float] = {}
    for spread, ids in spreads.items():
        changes = data.take(pa.array(ids, pa.int64())).set_column(3, "v", pa.array([-1.0] * k))
        for name, uri in [("key reads", plain), ("record index", indexed)]:
            copy = str(work / "upserted")
            shutil.rmtree(copy, ignore_errors=True)
            shutil.copytree(uri, copy)  # every upsert starts from the same table
            start = time.perf_counter()
            oxlake.Table(copy).upsert(changes)
            upserts[(spread, name)] = time.perf_counter() - start
            if name == "record index":
                assert oxlake.Table(copy).validate().ok

    keys = sorted(random.Random(7).sample(range(n), 100))
    key_rows = pa.table({"id": pa.array(keys, pa.int64())})
    in_list = f"id IN ({', '.join(map(str, keys))})"
    lookup = best(args.repeat, lambda: oxlake.Table(indexed).lookup(key_rows))
    scan = best(args.repeat, lambda: oxlake.Table(plain).to_arrow(filter=in_list))
    assert oxlake.Table(indexed).lookup(key_rows).num_rows == 100

    lo = n // 2
    window = f"ts >= {lo} AND ts < {lo + n // 100}"
    pruned = best(args.repeat, lambda: oxlake.Table(indexed).to_arrow(filter=window))
    unpruned = best(args.repeat, lambda: oxlake.Table(plain).to_arrow(filter=window))
    assert oxlake.Table(indexed).to_arrow(filter=window).num_rows == n // 100
    kept = len(oxlake.Table(indexed).planned_files(filter=window))

    print(f"\n{n:,} rows, {files:,} base files in {args.partitions} partitions, merge-on-read, local disk")
    print(f"build_metadata: {build:.2f} s\n")
    print("| operation | with the index (s) | without (s) | ratio |")
    print("| --- | ---: | ---: | ---: |")
    for spread in spreads:
        index, reads = upserts[(spread, "record index")], upserts[(spread, "key reads")]
        print(
            f"| upsert of {k:,} keys ({spread} ids): record index / key reads | {index:.3f} | "
            f"{reads:.3f} | {reads / index:.1f}x |"
        )
    print(f"| lookup of 100 keys / filtered full scan | {lookup:.4f} | {scan:.4f} | {scan / lookup:.1f}x |")
    print(
        f"| 1% window of a sorted column: column stats ({kept} of {files} files) / none | {pruned:.4f} | "
        f"{unpruned:.4f} | {unpruned / pruned:.1f}x |"
    )
    shutil.rmtree(work, ignore_errors=True)
    return 0


UUID_BATCH = 1_000_000


def uuid_batch(index: int, rows: int, partitions: int) -> Any:
    """Rows `index * UUID_BATCH ..` of the UUID bench's table, the same on every call: random
    version-4 UUID keys (made from random bytes by numpy, so that 100,000,000 of them take
    seconds), `part` = `p{row % partitions:03d}`, `ts` = the row's number, `v` = a float."""
    import numpy as np
    import pyarrow as pa

    start = index * UUID_BATCH
    n = min(UUID_BATCH, rows - start)
    raw = np.frombuffer(np.random.default_rng([11, index]).bytes(n * 16), np.uint8).reshape(n, 16).copy()
    raw[:, 6] = (raw[:, 6] & 0x0F) | 0x40
    raw[:, 8] = (raw[:, 8] & 0x3F) | 0x80
    hex_digits = np.frombuffer(b"0123456789abcdef", np.uint8)
    d = np.stack([hex_digits[raw >> 4], hex_digits[raw & 15]], axis=2).reshape(n, 32)
    dash = np.full((n, 1), ord("-"), np.uint8)
    text = np.concatenate(
        [d[:, :8], dash, d[:, 8:12], dash, d[:, 12:16], dash, d[:, 16:20], dash, d[:, 20:]], axis=1
    )
    offsets = np.arange(0, 36 * (n + 1), 36, dtype=np.int32)
    keys = pa.StringArray.from_buffers(n, pa.py_buffer(offsets), pa.py_buffer(text.tobytes()))
    number = np.arange(start, start + n, dtype=np.int64)
    names = pa.array([f"p{i:03d}" for i in range(partitions)])
    return pa.record_batch(
        {
            "key": keys,
            "part": names.take(pa.array(number % partitions)),
            "ts": pa.array(number),
            "v": pa.array(number.astype(np.float64)),
        }
    )


def uuid_rows(rows: int, partitions: int, picked: list[int]) -> Any:
    """The rows numbered `picked` (sorted) of the UUID bench's table, `v` set to -1."""
    import pyarrow as pa

    taken = []
    for index in sorted({i // UUID_BATCH for i in picked}):
        offsets = [i - index * UUID_BATCH for i in picked if i // UUID_BATCH == index]
        taken.append(uuid_batch(index, rows, partitions).take(pa.array(offsets, pa.int64())))
    table = pa.Table.from_batches(taken)
    return table.set_column(3, "v", pa.array([-1.0] * table.num_rows))


def uuid_tables(work: Path, args: argparse.Namespace) -> tuple[str, str, int, float]:
    """The UUID bench's two tables under `work`, written once and kept there (`--cache`): the
    table streamed through `bulk_insert` into files of `rows / (partitions x files per
    partition)` rows, and its hard-linked copy with `build_metadata()`. Returns their paths, the
    base files and how long the build took (when it was made)."""
    import json

    import oxlake
    import pyarrow as pa

    plain, indexed, ready = work / "plain", work / "indexed", work / "ready.json"
    if ready.exists():
        made = json.loads(ready.read_text())
        return str(plain), str(indexed), made["files"], made["build"]
    shutil.rmtree(plain, ignore_errors=True)
    shutil.rmtree(indexed, ignore_errors=True)
    n, partitions = args.rows, args.partitions
    batches = (n + UUID_BATCH - 1) // UUID_BATCH
    first = uuid_batch(0, n, partitions)
    t = oxlake.create_table(
        str(plain),
        first.schema,
        record_key="key",
        partition_by=["part"],
        ordering_field="ts",
        table_type="merge_on_read",
    )
    per_file = n // (partitions * args.files_per_partition)
    stream = pa.RecordBatchReader.from_batches(
        first.schema, (uuid_batch(i, n, partitions) for i in range(batches))
    )
    # A new table's files are sized from the input's Arrow bytes (64 a row, times the 0.4 a
    # write expects Parquet to take of them).
    t.bulk_insert(stream, target_file_size=per_file * 26)
    files = sum(1 for _ in plain.rglob("*.parquet"))
    # Hard links: data files are never written in place, and the copy costs no disk.
    shutil.copytree(plain, indexed, copy_function=os.link)
    start = time.perf_counter()
    oxlake.Table(str(indexed)).build_metadata()
    build = time.perf_counter() - start
    ready.write_text(json.dumps({"files": files, "build": build}))
    return str(plain), str(indexed), files, build


def uuid_keys(args: argparse.Namespace) -> int:
    import oxlake
    import pyarrow as pa
    from oxlake import _native

    work = Path(args.cache) if args.cache else Path(tempfile.mkdtemp(prefix="oxlake-index-bench-"))
    if args.cache:
        work = work / f"uuid-{args.rows}-{args.partitions}-{args.files_per_partition}"
        work.mkdir(parents=True, exist_ok=True)
    n = args.rows
    plain, indexed, files, build = uuid_tables(work, args)
    rng = random.Random(11)

    rows: list[tuple[str, float, float]] = []
    for count in (1, 100):
        picked = sorted(rng.sample(range(n), count))
        key_rows = uuid_rows(n, args.partitions, picked).select(["key"])
        in_list = "key IN ({})".format(", ".join(f"'{k}'" for k in key_rows.column(0).to_pylist()))
        lookup = best(args.repeat, lambda key_rows=key_rows: oxlake.Table(indexed).lookup(key_rows))
        scan = best(args.repeat, lambda in_list=in_list: oxlake.Table(plain).to_arrow(filter=in_list))
        assert oxlake.Table(indexed).lookup(key_rows).num_rows == count
        rows.append((f"lookup of {count} key(s) / filtered full scan", lookup, scan))
    for count in (1_000, 100_000):
        changes = uuid_rows(n, args.partitions, sorted(rng.sample(range(n), count)))
        timings = {}
        for name, uri in [("record index", indexed), ("key reads", plain)]:

            def routing(uri: str = uri, changes: pa.Table = changes) -> object:
                return pa.RecordBatchReader.from_stream(
                    _native.route(oxlake.Table(uri)._t, "upsert", changes)
                ).read_all()

            route = best(args.repeat, routing)
            copy = work / "upserted"
            shutil.rmtree(copy, ignore_errors=True)
            shutil.copytree(uri, copy, copy_function=os.link)  # every upsert starts from the same table
            start = time.perf_counter()
            oxlake.Table(str(copy)).upsert(changes)
            timings[name] = (time.perf_counter() - start, route)
            shutil.rmtree(copy, ignore_errors=True)
        (index, index_route), (reads, reads_route) = timings["record index"], timings["key reads"]
        rows.append((f"upsert of {count:,} random keys: record index / key reads", index, reads))
        rows.append((f"  routing alone (`route`) of those {count:,} keys", index_route, reads_route))

    print(
        f"\n{n:,} rows keyed by random UUIDs, {files:,} base files in {args.partitions} partitions,"
        " local disk"
    )
    print(f"build_metadata: {build:.2f} s\n")
    print("| operation | with the index (s) | without (s) | ratio |")
    print("| --- | ---: | ---: | ---: |")
    for name, with_index, without in rows:
        print(f"| {name} | {with_index:.4f} | {without:.4f} | {without / with_index:.1f}x |")
    if not args.cache:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
