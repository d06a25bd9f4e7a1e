"""Exactly once under failure: a Spark Structured Streaming pipeline (`stream_driver.py`: a file
source upserted into an oxlake table one file per micro-batch, and a second query copying that
table's commits into another table through the oxlake stream source) has its whole driver process
group SIGKILLed again and again, and is restarted from its checkpoints each time, while new files
keep arriving.

Half of the kills come after a random delay (Spark starting, planning, tasks writing, committing);
the others at a named step of a commit (`OXLAKE_PAUSEPOINT`: the process stops there and is killed),
so that the narrow windows are hit on purpose: after the table's commit and before Spark's own
checkpoint (the replayed batch must be skipped), between the completion claim and the completed
file, after the metadata table's update.

The tables live on local disk or in a bucket of the S3 server of the tests (`where`).

At the end, after one last run left alone:
- the table equals the source exactly: each key at its newest version, no key missing, none extra;
- every micro-batch (one source file each) is recorded by exactly one commit, batch ids 0..n-1;
- the copy made through the stream source equals the table;
- nothing is left pending, and the metadata table equals storage (`validate()`).
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import oxlake
import oxlake.spark
import pyarrow as pa
import pytest
from stress_lib import HERE, LONG, Target, s3_server, target_for  # noqa: F401 (fixture)

pyspark = pytest.importorskip("pyspark")
SPARK = tuple(int(p) for p in pyspark.__version__.split(".")[:2])

KILLS = 30 if LONG else 3
FILES_PER_RUN = 2  # new source files before each restart
ROWS_PER_FILE = 20
KEYS = 60
CITIES = ("sf", "nyc", "東京 %/")
PAUSEPOINTS = (
    "after-commit",
    "after-fate",
    "after-completion-claim",
    "after-metadata-sync",
    "before-commit",
    # The same steps of the metadata table's commit, inside the data commit.
    "metadata-before-commit",
    "metadata-after-fate",
)
SCHEMA = pa.schema([("id", pa.int64()), ("city", pa.string()), ("ts", pa.int64()), ("v", pa.string())])
RUN_TIMEOUT = 300  # seconds for one run left alone
HEARTBEAT = 0.5  # seconds: the heartbeat interval of the tables' writers


def drop_file(source: Path, index: int, rng: random.Random) -> list[dict]:
    """Source file `index`: `ROWS_PER_FILE` distinct keys, most newer than anything before, some
    stale (older than what an earlier file wrote: they must lose)."""
    rows = []
    for j, key in enumerate(rng.sample(range(KEYS), ROWS_PER_FILE)):
        stale = rng.random() < 0.2 and index >= 3
        ts = (index - 3) * 1000 + 500 + j if stale else index * 1000 + j
        rows.append({"id": key, "city": CITIES[key % len(CITIES)], "ts": ts, "v": f"f{index}-{j}"})
    source.mkdir(parents=True, exist_ok=True)
    tmp = source / f".{index:05d}.tmp"
    tmp.write_text("".join(json.dumps(r) + "\n" for r in rows))
    tmp.rename(source / f"{index:05d}.json")
    return rows


def newest(rows: list[dict]) -> dict[int, tuple]:
    out: dict[int, dict] = {}
    for r in rows:
        if r["id"] not in out or r["ts"] > out[r["id"]]["ts"]:
            out[r["id"]] = r
    return {k: (r["city"], r["ts"], r["v"]) for k, r in out.items()}


def table_rows(target: Target) -> dict[int, tuple]:
    uri = target.uri
    rows = target.open().to_arrow(columns=["id", "city", "ts", "v"]).to_pylist()
    ids = [r["id"] for r in rows]
    assert len(ids) == len(set(ids)), f"duplicate keys in {uri}"
    return {r["id"]: (r["city"], r["ts"], r["v"]) for r in rows}


def batches_recorded(target: Target) -> list[int]:
    """The batch id each completed commit of the stream sink recorded, in timeline order (the
    archived timeline included)."""
    t = target.open()
    out = []
    for i in t.timeline(include_archived=True):
        if i.state == "completed" and i.action in ("commit", "deltacommit"):
            recorded = t.extra_metadata(i.time).get(oxlake.spark.SINK_CHECKPOINT_KEY)
            if recorded:
                out.append(int(json.loads(recorded)[oxlake.spark.DEFAULT_CHECKPOINT_IDENTIFIER]))
    return out


def create(target: Target) -> None:
    t = oxlake.create_table(
        target.uri,
        SCHEMA,
        storage_options=target.storage_options,
        record_key="id",
        partition_by=["city"],
        ordering_field="ts",
        table_type="merge_on_read",
        heartbeat_interval=HEARTBEAT,
        inline_compaction=4,
    )
    t.build_metadata(files_shards=2, record_index_shards=2)
    t.set_archival(5, 8)
    # Cleaning must retain more commits than an incremental reader lags by (Apache Hudi's rule
    # for its consumers): the copy's query pins its first window when it starts, and with 3
    # commits retained a run that took 28 s to reach that window found its files cleaned, and
    # failed, as it should, asking for a restart (CI, 2026-11-29).
    t.set_cleaning(12, every=4)


def session_members(sid: int) -> list[int]:
    """The processes of session `sid`."""
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[3]) == sid:
            out.append(int(stat.parent.name))
    return out


class Driver:
    """A run of `stream_driver.py` in its own process group (the JVM and Spark's Python workers
    die with it)."""

    def __init__(self, spec: dict, log: Path, pausepoint: str | None, pause_dir: Path) -> None:
        env = dict(os.environ, PYSPARK_PYTHON=sys.executable)
        env.pop("OXLAKE_PAUSEPOINT", None)
        if pausepoint is not None:
            for f in ("reached", "resume"):
                (pause_dir / f).unlink(missing_ok=True)
            env.update(OXLAKE_PAUSEPOINT=pausepoint, OXLAKE_PAUSE_DIR=str(pause_dir))
        self.log = log
        with log.open("w") as out:
            self.proc = subprocess.Popen(
                [sys.executable, str(HERE / "stream_driver.py"), json.dumps(spec)],
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
            )

    def kill(self) -> None:
        """SIGKILL to every process of the run's session (Spark's Python workers have process
        groups of their own)."""
        for pid in [self.proc.pid, *session_members(self.proc.pid)]:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.proc.wait()

    def finished(self) -> bool:
        """Whether the run ended by itself; a failed run fails the test."""
        if self.proc.poll() is None:
            return False
        assert self.proc.returncode == 0, self.log.read_text()[-4000:]
        assert "done" in self.log.read_text()
        return True


#: Sink and store of each run: every pair in long mode; by default S3 through one sink only (a
#: run takes about two minutes).
RUNS = [
    (sink, where)
    for where in ("local", "s3")
    for sink in ("data_source", "foreach_batch")
    if LONG or where == "local" or sink == "data_source"
]


@pytest.mark.skipif(SPARK < (4, 1), reason="the oxlake stream source needs Spark 4.1")
@pytest.mark.parametrize(("sink", "where"), RUNS)
def test_a_stream_killed_again_and_again_writes_each_batch_once(
    sink: str, where: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    rng = random.Random(f"{sink}-{where}-{time.time_ns()}")
    source = tmp_path / "in"
    target = target_for(where, request, tmp_path / "t")
    copy = Target(target.uri.rsplit("/", 1)[0] + "/copy", target.storage_options)
    pause_dir = tmp_path / "pause"
    pause_dir.mkdir()
    create(target)
    create(copy)
    spec = {
        "sink": sink,
        "source": str(source),
        "table": target.uri,
        "checkpoint": str(tmp_path / "cp"),
        "copy": copy.uri,
        "copy_checkpoint": str(tmp_path / "copy_cp"),
        "storage_options": target.storage_options or {},
    }
    written: list[dict] = []
    files = 0
    kills: list[str] = []
    run = 0
    while len(kills) < KILLS:
        for _ in range(FILES_PER_RUN):
            written += drop_file(source, files, rng)
            files += 1
        run += 1
        pausepoint = rng.choice(PAUSEPOINTS) if rng.random() < 0.5 else None
        started = time.monotonic()
        driver = Driver(spec, tmp_path / f"run{run}.log", pausepoint, pause_dir)
        deadline = time.monotonic() + (RUN_TIMEOUT if pausepoint else rng.uniform(2.0, 25.0))
        while time.monotonic() < deadline and not driver.finished():
            if pausepoint is not None and (pause_dir / "reached").exists():
                break
            time.sleep(0.05)
        if driver.finished():
            print(f"run {run}: caught up in {time.monotonic() - started:.1f} s")
            continue  # caught up before the kill: the next run gets new files
        driver.kill()
        kills.append(pausepoint or "random")
        print(f"run {run}: killed ({kills[-1]}) after {time.monotonic() - started:.1f} s")
    # One last run left alone catches up.
    started = time.monotonic()
    driver = Driver(spec, tmp_path / "last.log", None, pause_dir)
    deadline = time.monotonic() + RUN_TIMEOUT
    while not driver.finished():
        assert time.monotonic() < deadline, "the last run did not catch up"
        time.sleep(0.2)
    print(f"last run: caught up in {time.monotonic() - started:.1f} s")
    how = ", ".join(sorted(set(kills)))
    print(f"{sink} ({where}): {run} runs, {len(kills)} kills ({how}), {files} files")

    assert table_rows(target) == newest(written)
    # One file per batch (maxFilesPerTrigger=1), unless a driver died between recording a batch's
    # files in the source's log and its offsets: the restarted query then plans one batch to the
    # newest offset, over both files (seen: batch 4 of offsets 3 -> 5). Spark's commit log names
    # the batches that ran; each must be committed once, in order.
    spark_batches = sorted(int(p.name) for p in (tmp_path / "cp" / "commits").iterdir() if p.name.isdigit())
    assert spark_batches == list(range(len(spark_batches))) and len(spark_batches) <= files
    assert batches_recorded(target) == spark_batches, "each batch committed once, in order"
    assert table_rows(copy) == table_rows(target)
    for place in (target, copy):
        u = place.uri
        # A write killed in the last killed run may still look alive to a process going by the
        # default heartbeat (30 s of silence): judged by the tables' writers' own interval.
        t = place.open(heartbeat_interval=HEARTBEAT)
        time.sleep(HEARTBEAT * 4)
        t.rollback_failed()
        # A compaction a writer planned inline and was killed before running stays planned (as
        # in Apache Hudi: a plan is not a failed write); the next compaction runs it.
        if any(i.action == "compaction" for i in t.timeline() if i.state != "completed"):
            t.compact()
        assert not [i for i in t.timeline() if i.state != "completed"], u
        assert table_rows(place) == newest(written), u
        report = t.validate()
        assert report.ok, (u, report)
