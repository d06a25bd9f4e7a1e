"""Planning with and without the metadata table: a table of 1,000 base files over 100 partitions.

    python benches/metadata.py --partitions 100 --files-per-partition 10

Planning is `Table.splits()` (timeline, file listing, slices; no data read), each timing on a
freshly opened table, best of `--repeat`. Without the metadata table the files come from one
recursive listing of storage; with it, from the `files` index (a merge-on-read read of its shards).
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--partitions", type=int, default=100)
    parser.add_argument("--files-per-partition", type=int, default=10)
    parser.add_argument("--rows-per-file", type=int, default=100)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()

    import oxlake
    import pyarrow as pa

    work = Path(tempfile.mkdtemp(prefix="oxlake-mdt-bench-"))
    uri = str(work / "t")
    n = args.partitions * args.files_per_partition * args.rows_per_file
    data = pa.table(
        {
            "id": pa.array(range(n), pa.int64()),
            "part": pa.array([f"p{i % args.partitions:03d}" for i in range(n)]),
            "v": pa.array([float(i) for i in range(n)]),
        }
    )
    t = oxlake.create_table(uri, data.schema, record_key="id", partition_by=["part"])
    # A tiny target file size: every partition gets `files-per-partition` base files.
    t.insert(data, target_file_size=args.rows_per_file * 8)
    files = sum(1 for _ in Path(uri).rglob("*.parquet"))

    def plan() -> float:
        best = float("inf")
        for _ in range(args.repeat):
            start = time.perf_counter()
            splits = oxlake.Table(uri).splits()
            best = min(best, time.perf_counter() - start)
            assert sum(s.files for s in splits) == files
        return best

    listing = plan()
    t.build_metadata()
    assert t.validate().ok
    indexed = plan()
    print(f"\n{files:,} base files in {args.partitions} partitions, local disk, best of {args.repeat}\n")
    print("| planning | seconds |")
    print("| --- | ---: |")
    print(f"| listing storage | {listing:.3f} |")
    print(f"| the metadata table's files index | {indexed:.3f} |")
    shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
