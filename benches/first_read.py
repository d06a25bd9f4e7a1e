"""The first read of a table in a new process, against the second: what planning costs before its
caches are warm. Since issue 22 a snapshot plan checks every completed instant's written files
against the listing (a committed base or log file that is gone is an error, never stale rows):
that reads each completed commit's metadata once per process.

    .venv/bin/python benches/first_read.py --table-type copy_on_write --commits 200
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile

import oxlake
import pyarrow as pa

PROBE = """
import sys, time, oxlake
from oxlake.testing import inject_faults, fault_counts
inject_faults("latency=%s")
t0 = time.monotonic(); t = oxlake.Table(sys.argv[1]); rows = t.to_arrow().num_rows; t1 = time.monotonic()
first = fault_counts(); t.to_arrow(); t2 = time.monotonic(); second = fault_counts()
print(f"rows {rows}: first read {t1 - t0:.3f} s, {first.get('get')} GETs; "
      f"second {t2 - t1:.3f} s, {second.get('get') - first.get('get')} GETs")
"""


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--table-type", default="copy_on_write")
    ap.add_argument("--commits", type=int, default=200)
    ap.add_argument("--latency", default="0,20", help="store latencies (ms), comma-separated")
    args = ap.parse_args()
    path = tempfile.mkdtemp() + "/t"
    schema = pa.schema([("id", pa.int64()), ("ts", pa.int64()), ("v", pa.string())])
    t = oxlake.create_table(path, schema, record_key="id", ordering_field="ts", table_type=args.table_type)
    for i in range(args.commits):
        ids = pa.array([i % 50, 1000 + i], pa.int64())
        t.upsert(pa.table({"id": ids, "ts": pa.array([i, i], pa.int64()), "v": ["x", "y"]}))
    for latency in args.latency.split(","):
        out = subprocess.run([sys.executable, "-c", PROBE % latency, path], capture_output=True, text=True)
        print(f"{args.table_type}, {args.commits} commits, latency {latency} ms: {out.stdout.strip()}")


if __name__ == "__main__":
    main()
