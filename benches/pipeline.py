"""Incremental pipeline runs against full runs of the same change, on Spark `local[2]`.

    .venv/bin/python benches/pipeline.py --partitions 1000000 --change 0.01 0.1 0.3 --spread random clustered

An input catalog of `--partitions` partitions (small JSON payloads), a direct M:N task (the
example's `Tiles`, with its inverse) and a map-group task (`AreaClasses`: road length per class in
each level-12 area of 16 input tiles). After a full first run, for each `--change` and `--spread`
(anywhere at random, or one contiguous band) that share of the input partitions changes; the
change is compiled once incrementally (on the path `--path` forces, default chosen by size) and
once in full into a copy of the output catalog taken before. Reported per run: seconds, bytes
written, partitions compiled and written, the path each task took, and the driver process's peak
resident memory above what it held before the run (sampled every 10 ms); and the peak of any one
of Spark's Python workers over the whole bench (sampled every 0.5 s).
"""

from __future__ import annotations

import argparse
import cProfile
import os
import random
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples"))


def area_classes():  # type: ignore[no-untyped-def]
    import json

    import roads
    from oxlake.pipeline import MapGroupCompiler

    class AreaClasses(MapGroupCompiler):
        """Road length per class in each level-12 area (4 x 4 input tiles); keys from content."""

        inputs = {"roads": ["segments"]}
        outputs = ["area_classes"]

        def map(self, item):  # type: ignore[no-untyped-def]
            x, y = roads.parse_tile(item.partition)
            by_class: dict[str, float] = {}
            for s in json.loads(item.payload):
                by_class[s["class"]] = by_class.get(s["class"], 0.0) + s["length"]
            for cls, length in sorted(by_class.items()):
                yield "area_classes", f"{x // 4}_{y // 4}/{cls}", json.dumps(length).encode()

        def reduce(self, layer, partition, values):  # type: ignore[no-untyped-def]
            return json.dumps(round(sum(json.loads(v) for v in values), 3)).encode()

    return AreaClasses()


def size(path: Path, since: set[Path]) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file() and p not in since)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--partitions", type=int, default=100_000)
    parser.add_argument("--change", type=float, nargs="+", default=[0.01])
    parser.add_argument(
        "--spread",
        choices=["random", "clustered"],
        nargs="+",
        default=["random"],
        help="changed input tiles anywhere, or in one contiguous band of rows (as edits of one region)",
    )
    parser.add_argument(
        "--case",
        nargs="+",
        metavar="CHANGE:SPREAD",
        help="run these changes only, in this order (e.g. 0.1:random 0.01:clustered), "
        "instead of every --change for every --spread",
    )
    parser.add_argument("--path", choices=["auto", "driver", "spark"], default="auto")
    parser.add_argument(
        "--driver-memory", default="6g", help="spark.driver.memory (under local[2], the executors' too)"
    )
    parser.add_argument("--work", help="keep the tables here (default: a temporary directory, removed)")
    parser.add_argument(
        "--stages",
        action="store_true",
        help="after each run, its Spark stages: seconds and the plan operators each ran (event log)",
    )
    parser.add_argument(
        "--profile",
        metavar="DIR",
        help="write a cProfile of each incremental run's driver process into DIR "
        "(the Spark work it waits for shows as socket reads)",
    )
    args = parser.parse_args()
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

    import pyarrow as pa
    import roads
    from oxlake.pipeline import Catalog, Driver
    from pyspark.sql import SparkSession

    work = Path(args.work or tempfile.mkdtemp(prefix="oxlake-pipeline-bench-"))
    events = work / "events"
    builder = SparkSession.builder
    if args.stages:
        shutil.rmtree(events, ignore_errors=True)
        events.mkdir(parents=True)
        for key, value in {
            "enabled": "true",
            "dir": str(events),
            "compress": "false",
            "rolling.enabled": "false",
        }.items():
            builder = builder.config(f"spark.eventLog.{key}", value)
    spark = (
        builder.master("local[2]")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "8")
        .config("spark.driver.memory", args.driver_memory)
        .getOrCreate()
    )
    rng = random.Random(1)
    side = int(args.partitions**0.5) + 1
    tiles = [f"{i % side}_{i // side}" for i in range(args.partitions)]
    inputs = Catalog.create(str(work / "roads"))

    def publish(keys: list[str]) -> None:
        for at in range(0, len(keys), 1_000_000):  # one version, written in slices
            part = keys[at : at + 1_000_000]
            payloads = [roads.segments(rng, t, rng.randint(1, 3)) for t in part]
            table = pa.table(
                {
                    "layer": ["segments"] * len(part),
                    "partition": part,
                    "payload": pa.array(payloads, pa.binary()),
                    "checksum": pa.nulls(len(part), pa.string()),
                }
            )
            if at == 0:
                writer = inputs.table.upsert if inputs.latest() else inputs.table.insert
                writer(table)
                inputs.refresh()
            else:
                inputs.table.upsert(table)  # another version: only the first run reads them all
        inputs.refresh()

    workers = WorkerPeak()
    start = time.perf_counter()
    publish(tiles)
    print(f"inputs written in {time.perf_counter() - start:.0f} s", flush=True)
    out = Catalog.create(str(work / "out"))
    tasks = [roads.Tiles(), area_classes()]
    start = time.perf_counter()
    Driver(spark, out, {"roads": inputs}, tasks).run()
    first = time.perf_counter() - start
    republish = size(work / "out", set())
    print(f"first run {first:.1f} s; Python workers' peak so far {workers.mib:,.0f} MiB", flush=True)

    rows = []
    seen = print_stages(events, 0) if args.stages else 0
    cases = [(s, c) for s in args.spread for c in args.change]
    if args.case:
        cases = [(spread, float(change)) for change, spread in (c.split(":") for c in args.case)]
        if unknown := {s for s, _ in cases} - {"random", "clustered"}:
            parser.error(f"--case: unknown spread {sorted(unknown)}")
    for spread, change in cases:
        shutil.rmtree(work / "full", ignore_errors=True)
        shutil.copytree(work / "out", work / "full")
        n = int(args.partitions * change)
        if spread == "random":
            publish(rng.sample(tiles, n))
        else:
            band = rng.randrange(len(tiles) - n)
            publish(tiles[band : band + n])
        for name, path in [("incremental", work / "out"), ("full", work / "full")]:
            before = {p for p in path.rglob("*") if p.is_file()}
            driver = Driver(spark, Catalog(str(path)), {"roads": inputs}, tasks, incremental_path=args.path)
            profile = cProfile.Profile() if args.profile and name == "incremental" else None
            with Peak() as peak:
                start = time.perf_counter()
                if profile:
                    profile.enable()
                report = driver.run(full=name == "full")
                secs = time.perf_counter() - start
            if profile:
                profile.disable()
                Path(args.profile).mkdir(parents=True, exist_ok=True)
                profile.dump_stats(Path(args.profile) / f"{len(rows) // 2 + 1}-{change:g}-{spread}.prof")
            rows.append((spread, change, name, secs, size(path, before), report, peak.mib))
            print(rows[-1][:4], flush=True)
            if args.stages:
                seen = print_stages(events, seen)

    print(
        f"\n{args.partitions:,} input partitions, Spark local[2]; "
        f"first run (full republish) {first:.1f} s, {republish:,} bytes"
    )
    print()
    print(
        "| change | run | path (Tiles / AreaClasses) | seconds | vs full | driver peak MiB "
        "| bytes written | tiles13 compiled / written | area_classes compiled / written |"
    )
    print("| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for i, (spread, change, name, secs, written, report, mib) in enumerate(rows):
        t, c = report.layers["tiles13"], report.layers["area_classes"]
        paths = " / ".join(task.path for task in report.tasks.values()) if name == "incremental" else ""
        ratio = f"{rows[i + 1][3] / secs:.1f}x" if name == "incremental" else ""
        print(
            f"| {change:.0%} {spread} | {name} | {paths} | {secs:.1f} | {ratio} | {mib:,.0f} | {written:,} "
            f"| {t.compiled:,} / {t.written:,} | {c.compiled:,} / {c.written:,} |"
        )
    for name, task in rows[0][5].tasks.items():
        print(f"- {name}: {task.path_reason}")
    print(f"- Spark's Python workers' peak resident memory over the bench: {workers.mib:,.0f} MiB")
    spark.stop()
    if not args.work:
        shutil.rmtree(work, ignore_errors=True)
    return 0


def print_stages(events: Path, seen: int) -> int:
    """Prints the Spark stages completed since the first `seen` ones of the event log, longest
    first: seconds, tasks, the stage's call site and the plan operators of its RDDs. Returns how
    many there are."""
    import json

    stages = []
    for log in events.iterdir():  # one file: not rolled over, not compressed
        for line in log.read_text().splitlines():
            event = json.loads(line)
            if event.get("Event") == "SparkListenerStageCompleted":
                info = event["Stage Info"]
                scopes = [json.loads(r["Scope"])["name"] for r in info["RDD Info"] if r.get("Scope")]
                secs = (info["Completion Time"] - info["Submission Time"]) / 1000
                operators = ", ".join(dict.fromkeys(reversed(scopes)))
                stages.append((secs, info["Number of Tasks"], info["Stage Name"], operators))
    new = stages[seen:]
    print(f"  {len(new)} stages, {sum(s[0] for s in new):.1f} s in all; the longest:")
    for secs, tasks, name, operators in sorted(new, reverse=True)[:12]:
        print(f"  {secs:7.1f} s {tasks:4d} tasks  {name}: {operators}")
    return len(stages)


class Peak:
    """The peak resident memory of this process above its level on entry, sampled every 10 ms."""

    def __enter__(self) -> Peak:
        self.base = self.peak = rss()
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._sample, daemon=True)
        self.thread.start()
        return self

    def _sample(self) -> None:
        while not self.done.wait(0.01):
            self.peak = max(self.peak, rss())

    def __exit__(self, *exc: object) -> None:
        self.done.set()
        self.thread.join()
        self.peak = max(self.peak, rss())

    @property
    def mib(self) -> float:
        return (self.peak - self.base) / 2**20


class WorkerPeak:
    """The peak resident memory of any one of Spark's Python workers (its daemon and the workers
    it forks), sampled every 0.5 s from `/proc` while the bench runs."""

    def __init__(self) -> None:
        self.peak = 0
        threading.Thread(target=self._sample, daemon=True).start()

    def _sample(self) -> None:
        while True:
            for proc in Path("/proc").iterdir():
                try:
                    cmdline = (proc / "cmdline").read_bytes() if proc.name.isdigit() else b""
                    if b"pyspark.daemon" in cmdline or b"pyspark.worker" in cmdline:
                        pages = int((proc / "statm").read_text().split()[1])
                        self.peak = max(self.peak, pages * os.sysconf("SC_PAGE_SIZE"))
                except OSError:
                    continue  # gone meanwhile
            time.sleep(0.5)

    @property
    def mib(self) -> float:
        return self.peak / 2**20


def rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


if __name__ == "__main__":
    sys.exit(main())
