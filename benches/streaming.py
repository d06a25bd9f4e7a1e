"""A stream's long run: many micro-batches of a small upsert into one merge-on-read table, each
committed as a streaming sink commits it (the batch id recorded as Apache Hudi's streaming
checkpoint, the last one looked up first), with inline compaction, cleaning and archival and the
metadata table kept in step. Prints, per block of batches, the mean time of a batch and the number of files
under `.hoodie/`: both should stay flat as commits accumulate.

    python benches/streaming.py --batches 2000 --rows 200 [--keys N] [--table-type copy_on_write]
        [--clean-retain 10 | --no-clean] [--spark] [--s3]

With `--s3` the table lives in a bucket of a SeaweedFS S3 server started on loopback (the tests'
server); files are then counted by listing the bucket, and each line also has the time of a fixed
probe of the server (20 small objects put, listed, read and deleted in a bucket of their own), so
a slowdown of the server itself shows apart from the table's. `--then-fresh N` then streams N more
batches into a new table beside the first (same bucket, then a new bucket): a new table as slow as
the old one's end means the store, not the table, slowed down.

By default Spark's own overhead per micro-batch (planning, tasks) is left out: it does not depend
on the table. With `--spark` the batches come from a Spark Structured Streaming query
(`local[2]`, the `rate-micro-batch` source, `foreachBatch` with `oxlake.spark.write_batch`: tasks
write, the driver commits); the report then has the whole micro-batch's time (from one batch's
start to the next) beside the write's.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
import urllib.error
from pathlib import Path

import oxlake
import oxlake.spark
import pyarrow as pa
from oxlake.testing import fault_counts, inject_faults

SCHEMA = pa.schema([("id", pa.int64()), ("city", pa.string()), ("ts", pa.int64()), ("v", pa.string())])


class Place:
    """Where the table lives, and how its files are counted: a local folder or an S3 bucket."""

    def __init__(self, root: Path, s3: object | None = None, bucket: str = "stream") -> None:
        self.root = root
        self.options: dict[str, str] | None = None
        self.fs = None
        self.uri = str(root)
        self.prefix = f"{bucket}/{root.name}"
        self.server_pid: int | None = None
        if s3 is not None:
            self.server_pid = s3.proc.pid  # type: ignore[attr-defined]
            import pyarrow.fs as pafs

            self.options = s3.storage_options()  # type: ignore[attr-defined]
            with contextlib.suppress(urllib.error.HTTPError):  # 409: the bucket is there already
                s3.create_bucket(bucket)  # type: ignore[attr-defined]
            self.uri = f"s3://{self.prefix}"
            self.fs = pafs.S3FileSystem(
                access_key="any",
                secret_key="any",
                endpoint_override=self.options["endpoint"],
                scheme="http",
                region="us-east-1",
            )

    def files(self, under: str) -> list[str]:
        """Paths of every file under `under` (relative to the table root)."""
        if self.fs is None:
            return [str(p.relative_to(self.root)) for p in (self.root / under).rglob("*") if p.is_file()]
        import pyarrow.fs as pafs

        infos = self.fs.get_file_info(pafs.FileSelector(f"{self.prefix}/{under}".rstrip("/"), recursive=True))
        return [i.path.removeprefix(f"{self.prefix}/") for i in infos if i.type == pafs.FileType.File]

    def hoodie_files(self, under: str = "") -> int:
        return len(self.files(f".hoodie/{under}"))

    def data_files(self) -> int:
        return sum(1 for p in self.files("") if p.endswith(".parquet") and not p.startswith(".hoodie"))

    def open(self) -> oxlake.Table:
        return oxlake.Table(self.uri, storage_options=self.options)

    def server_cpu(self) -> float:
        """CPU seconds the S3 server has used so far (user + system, from `/proc`), 0 locally."""
        if self.server_pid is None:
            return 0.0
        fields = Path(f"/proc/{self.server_pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def probe_ms(self) -> float | None:
        """Milliseconds a fixed piece of work takes the store (S3 only): 20 objects of 1 KiB put,
        listed, read and deleted, in a bucket the table never touches (plain unsigned HTTP, as
        the tests' server takes it: no client library's own costs in the figure)."""
        if self.fs is None:
            return None
        import urllib.request

        endpoint = self.options["endpoint"]

        def call(method: str, path: str, body: bytes | None = None) -> bytes:
            request = urllib.request.Request(f"{endpoint}/probe/{path}", data=body, method=method)
            with urllib.request.urlopen(request, timeout=30) as response:
                return bytes(response.read())

        started = time.perf_counter()
        names = [f"p/{i}" for i in range(20)]
        for name in names:
            call("PUT", name, b"x" * 1024)
        call("GET", "?list-type=2&prefix=p/")
        for name in names:
            call("GET", name)
        for name in names:
            call("DELETE", name)
        return 1000 * (time.perf_counter() - started)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batches", type=int, default=2000)
    ap.add_argument("--rows", type=int, default=200, help="rows per micro-batch")
    ap.add_argument("--keys", type=int, default=100_000, help="distinct keys the stream updates")
    ap.add_argument("--block", type=int, default=100, help="batches per line of the report")
    ap.add_argument("--metadata", action=argparse.BooleanOptionalAction, default=True)
    ap.add_argument("--table-version", type=int, default=8, choices=[6, 8, 9])
    ap.add_argument("--clean", action=argparse.BooleanOptionalAction, default=True)
    ap.add_argument("--clean-retain", type=int, default=10, help="commits an inline clean keeps")
    ap.add_argument("--table-type", default="merge_on_read", choices=["merge_on_read", "copy_on_write"])
    ap.add_argument("--spark", action="store_true", help="micro-batches of a Spark streaming query")
    ap.add_argument("--s3", action="store_true", help="the table on a local SeaweedFS S3 server")
    ap.add_argument(
        "--calls", action="store_true", help="store calls per batch by kind (list, get, head, put, ...)"
    )
    ap.add_argument("--then-fresh", type=int, default=0, metavar="N", help="then N batches into new tables")
    args = ap.parse_args()

    base = Path(tempfile.mkdtemp(prefix="oxlake-stream-"))
    stack = contextlib.ExitStack()
    try:
        s3 = None
        if args.s3:
            sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
            from seaweed import SeaweedS3

            s3 = stack.enter_context(SeaweedS3())
            s3.create_bucket("probe")
        place = Place(base / "t", s3)
        t = new_table(place, args)
        if args.spark:
            run_spark(args, place)
            return
        stream(t, place, args, args.batches)
        finish(t, args)
        if args.then_fresh:
            for label, fresh in [
                ("a new table beside it", Place(base / "t2", s3)),
                (
                    "a new table in a new bucket" if s3 else "a new table in a new folder",
                    Place(base / "t3", s3, "fresh"),
                ),
            ]:
                print(f"\n{args.then_fresh} batches into {label}:")
                stream(new_table(fresh, args), fresh, args, args.then_fresh)
    finally:
        stack.close()
        if not os.environ.get("KEEP"):
            shutil.rmtree(base, ignore_errors=True)


def new_table(place: Place, args: argparse.Namespace) -> oxlake.Table:
    t = oxlake.create_table(
        place.uri,
        SCHEMA,
        storage_options=place.options,
        record_key="id",
        partition_by=["city"],
        ordering_field="ts",
        table_type=args.table_type,
        table_version=args.table_version,
        inline_compaction=10 if args.table_type == "merge_on_read" else None,
    )
    if args.metadata:
        t.build_metadata()
    if args.clean:
        t.set_cleaning(args.clean_retain)
    return t


def stream(t: oxlake.Table, place: Place, args: argparse.Namespace, batches: int) -> None:
    """`batches` micro-batches into `t`, a line of the report every `--block` of them."""
    cities = ["sf", "nyc", "chennai", "são paulo"]
    times: list[float] = []
    # CPU of this process (the upsert's threads) and of the S3 server, per batch: a time per batch
    # that grows while both stay flat is waiting, not work.
    cpu: list[float] = []
    server_cpu: list[float] = []
    probe = f" {'probe ms':>9}" if place.fs is not None else ""
    server = f" {'server cpu':>10}" if place.server_pid is not None else ""
    kinds = ["list", "get", "head", "put", "put_if_absent", "delete"]
    calls = "".join(f" {k:>6}" for k in kinds) if args.calls else ""
    print(
        f"{'batches':>8} {'ms/batch':>9} {'p95 ms':>7} {'.hoodie files':>14} {'of which oxlake/':>17} "
        f"{'active instants':>16} {'data files':>11} {'cpu ms':>7}{server}{probe}"
        f"{' calls/batch:' + calls if calls else ''}"
    )
    if args.calls:
        # A plan whose one rule never fires (the 10^12th get): the store counts its calls, nothing else.
        inject_faults("get@1000000000000:once")
    counted: dict[str, int] = fault_counts() if args.calls else {}
    for batch in range(batches):
        ids = [(batch * args.rows + i * 7919) % args.keys for i in range(args.rows)]
        data = pa.table(
            {
                "id": pa.array(ids, pa.int64()),
                "city": [cities[i % len(cities)] for i in ids],
                "ts": pa.array([batch] * len(ids), pa.int64()),
                "v": [f"b{batch}"] * len(ids),
            },
            schema=SCHEMA,
        )
        started, started_cpu, started_server = time.perf_counter(), time.process_time(), place.server_cpu()
        done = oxlake.spark.committed_batch(t)
        assert done is None or done < batch
        checkpoint = {oxlake.spark.SINK_CHECKPOINT_KEY: json.dumps({"default_single_writer": str(batch)})}
        t.upsert(data, extra_metadata=checkpoint)
        times.append(time.perf_counter() - started)
        cpu.append(time.process_time() - started_cpu)
        server_cpu.append(place.server_cpu() - started_server)
        if (batch + 1) % args.block == 0:
            per_batch = ""
            if args.calls:
                now = fault_counts()
                deltas = [(now.get(k, 0) - counted.get(k, 0)) / args.block for k in kinds]
                per_batch = "".join(f" {d:>6.1f}" for d in deltas)
            block = times[-args.block :]
            p95 = statistics.quantiles(block, n=20)[18]
            active = len(t.timeline())
            probe_ms = place.probe_ms()
            print(
                f"{batch + 1:>8} {1000 * statistics.mean(block):>9.1f} {1000 * p95:>7.1f} "
                f"{place.hoodie_files():>14} {place.hoodie_files('oxlake'):>17} {active:>16} "
                f"{place.data_files():>11} {1000 * statistics.mean(cpu[-args.block :]):>7.1f}"
                + (f" {1000 * statistics.mean(server_cpu[-args.block :]):>10.1f}" if server else "")
                + (f" {probe_ms:>9.1f}" if probe_ms is not None else "")
                + (f"             {per_batch}" if per_batch else ""),
                flush=True,
            )
            counted = fault_counts() if args.calls else {}  # the report's own calls left out


def finish(t: oxlake.Table, args: argparse.Namespace) -> None:
    report = t.validate() if args.metadata else None
    print(f"validate: {'ok' if report is None or report.ok else report}")
    print(f"rows: {t.to_arrow(columns=['id']).num_rows:,}")


def run_spark(args: argparse.Namespace, place: Place) -> None:
    """The batches through Spark: a `rate-micro-batch` source of `--rows` rows a batch, made
    upserts of `--keys` keys, written by `write_batch` in `foreachBatch`."""
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql import functions as F

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    spark = (
        SparkSession.builder.master("local[2]")
        .appName("oxlake-stream-bench")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    cities = F.array(*[F.lit(c) for c in ("sf", "nyc", "chennai", "são paulo")])
    key = (F.col("value") * 7919) % args.keys
    events = (
        spark.readStream.format("rate-micro-batch")
        .option("rowsPerBatch", args.rows)
        .load()
        .select(
            key.alias("id"),
            F.element_at(cities, (key % 4 + 1).cast("int")).alias("city"),
            F.col("value").alias("ts"),
            F.concat(F.lit("b"), F.col("value").cast("string")).alias("v"),
        )
    )
    starts: list[float] = []
    writes: list[float] = []
    print(
        f"{'batches':>8} {'ms/batch':>9} {'p95 ms':>7} {'write ms':>9} {'.hoodie files':>14} "
        f"{'of which oxlake/':>17} {'active instants':>16} {'data files':>11}"
    )

    def sink(df: DataFrame, batch_id: int) -> None:
        starts.append(time.perf_counter())
        oxlake.spark.write_batch(df, batch_id, place.uri, storage_options=place.options)
        writes.append(time.perf_counter() - starts[-1])
        n = len(starts)
        if n > args.block and (n - 1) % args.block == 0:
            cycles = [b - a for a, b in zip(starts[-args.block - 1 : -1], starts[-args.block :], strict=True)]
            p95 = statistics.quantiles(cycles, n=20)[18]
            print(
                f"{n - 1:>8} {1000 * statistics.mean(cycles):>9.1f} {1000 * p95:>7.1f} "
                f"{1000 * statistics.mean(writes[-args.block - 1 : -1]):>9.1f} {place.hoodie_files():>14} "
                f"{place.hoodie_files('oxlake'):>17} {len(place.open().timeline()):>16} "
                f"{place.data_files():>11}",
                flush=True,
            )

    query = (
        events.writeStream.foreachBatch(sink)
        .option("checkpointLocation", str(place.root.parent / "checkpoint"))
        .trigger(processingTime="0 seconds")
        .start()
    )
    while len(starts) <= args.batches and query.isActive:
        time.sleep(0.5)
    query.stop()
    if query.exception() is not None:
        raise SystemExit(f"the query failed: {query.exception()}")
    spark.stop()
    finish(place.open(), args)


if __name__ == "__main__":
    main()
