"""Planning with and without the metadata table: a table of 1,000 base files over 100 partitions.

    python benches/metadata.py --partitions 100 --files-per-partition 10 --where local,s3 --latency-ms 0,20

Planning is `Table.splits()` (timeline, file listing, slices; no data read), each timing on a
freshly opened table, best of `--repeat`. Without the metadata table the files come from one
recursive listing of storage; with it, from the `files` index (a merge-on-read read of its shards).
`--where s3` puts the table on the SeaweedFS S3 server of the tests (started here); `--latency-ms`
adds that much to every store request while planning (`oxlake.testing`: a cloud store's round
trip; a listing pays it again for each page of 1,000 entries after the first), and the requests
are counted.
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
    parser.add_argument("--where", default="local", help="local, s3 or both (comma-separated)")
    parser.add_argument("--latency-ms", default="0", help="added to every store request, e.g. 0,20")
    args = parser.parse_args()
    latencies = [int(x) for x in args.latency_ms.split(",")]
    print("| storage | latency per request | listing (s) | requests | files index (s) | requests | ratio |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for where in args.where.split(","):
        if where == "s3":
            sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
            from seaweed import SeaweedS3

            with SeaweedS3() as s3:
                s3.create_bucket("bench")
                bench(args, "s3://bench/t", s3.storage_options(), latencies)
        else:
            work = Path(tempfile.mkdtemp(prefix="oxlake-mdt-bench-"))
            bench(args, str(work / "t"), None, latencies)
            shutil.rmtree(work, ignore_errors=True)
    return 0


def bench(args: argparse.Namespace, uri: str, options: dict[str, str] | None, latencies: list[int]) -> None:
    import oxlake
    import pyarrow as pa
    from oxlake.testing import fault_counts, inject_faults

    n = args.partitions * args.files_per_partition * args.rows_per_file
    data = pa.table(
        {
            "id": pa.array(range(n), pa.int64()),
            "part": pa.array([f"p{i % args.partitions:03d}" for i in range(n)]),
            "v": pa.array([float(i) for i in range(n)]),
        }
    )
    t = oxlake.create_table(uri, data.schema, record_key="id", partition_by=["part"], storage_options=options)
    # A tiny target file size: every partition gets `files-per-partition` base files.
    t.insert(data, target_file_size=args.rows_per_file * 8)
    files = len(t.file_groups())  # one base file each (copy-on-write, one commit)

    def plan(latency: int) -> tuple[float, int]:
        best, calls = float("inf"), 0
        for _ in range(args.repeat):
            inject_faults(f"latency={latency}")
            start = time.perf_counter()
            splits = oxlake.Table(uri, options).splits()
            elapsed = time.perf_counter() - start
            counts = fault_counts()
            inject_faults("")
            best, calls = min(best, elapsed), sum(v for k, v in counts.items() if k != "injected")
            assert sum(s.files for s in splits) == files
        return best, calls

    listing = {ms: plan(ms) for ms in latencies}
    t.build_metadata()
    assert t.validate().ok
    indexed = {ms: plan(ms) for ms in latencies}
    where = "S3 (SeaweedFS)" if options else "local disk"
    for ms in latencies:
        (a, ca), (b, cb) = listing[ms], indexed[ms]
        ca_, cb_ = (str(ca), str(cb)) if ms else ("", "")  # requests are counted under a latency plan
        print(f"| {where} | {ms} ms | {a:.3f} | {ca_} | {b:.3f} | {cb_} | {a / b:.1f}x |")


if __name__ == "__main__":
    sys.exit(main())
