"""One large commit with the metadata table on: time and peak memory, against the same commit
without it.

    python benches/scale.py --rows 5000000 --files 2000

Each run is a fresh process (peak memory is per process): it builds the input (`--rows` rows:
record key `id` as a string, 100 partitions, a payload), creates a merge-on-read table, builds an
empty metadata table (every index, default shards) when asked, and inserts the rows in one commit
cut into about `--files` base files. Printed: the write's seconds, the process's peak resident
memory before the write (the input) and after it, and what the metadata table holds afterwards.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def peak_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def one(rows: int, files: int, metadata: bool) -> dict[str, float]:
    import oxlake
    import pyarrow as pa
    import pyarrow.compute as pc

    ids = pa.array(range(rows), pa.int64())
    data = pa.table(
        {
            "id": pc.cast(ids, pa.string()),
            "part": pc.cast(pc.add(pc.bit_wise_and(ids, 63), 1000), pa.string()),
            "ts": ids,
            "v": pc.cast(ids, pa.float64()),
        }
    )
    del ids
    uri = str(Path(tempfile.mkdtemp(prefix="oxlake-scale-")) / "t")
    t = oxlake.create_table(
        uri,
        data.schema,
        record_key="id",
        partition_by=["part"],
        ordering_field="ts",
        table_type="merge_on_read",
    )
    if metadata:
        t.build_metadata()
    # Base files are cut by their Parquet size (this data compresses about 2.5x).
    target = max(1, int(data.nbytes / files / 2.5))
    before = peak_mib()
    start = time.perf_counter()
    written = t.insert(data, target_file_size=target)
    seconds = time.perf_counter() - start
    after = peak_mib()
    out = {
        "seconds": seconds,
        "input_mib": data.nbytes / 2**20,
        "peak_before_mib": before,
        "peak_after_mib": after,
        "files": float(len(written.files)),
    }
    if metadata:
        t = oxlake.Table(uri)
        report = t.validate()
        assert report.ok, report.differences
        assert t.lookup(pa.table({"id": ["0", str(rows - 1)]})).num_rows == 2
    return out


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--files", type=int, default=400)
    parser.add_argument("--child", choices=["with", "without"])
    args = parser.parse_args()
    if args.child:
        print(json.dumps(one(args.rows, args.files, args.child == "with")))
        return 0
    results = {}
    for variant in ["without", "with"]:
        cmd = [sys.executable, __file__, "--rows", str(args.rows), "--files", str(args.files)]
        cmd += ["--child", variant]
        out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
        results[variant] = json.loads(out.strip().splitlines()[-1])
    print(f"\n{args.rows:,} keys in one insert, merge-on-read, local disk\n")
    print(
        "| metadata table | base files | write (s) | input (MiB) | peak before (MiB) "
        "| peak after (MiB) | added by the write (MiB) |"
    )
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for variant, r in results.items():
        before, after = r["peak_before_mib"], r["peak_after_mib"]
        print(
            f"| {variant} | {r['files']:,.0f} | {r['seconds']:.1f} | {r['input_mib']:.0f} | "
            f"{before:.0f} | {after:.0f} | {after - before:.0f} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
