"""Shared by the stress suite: the table, the workload, the model, the worker processes.

The table is merge-on-read, keyed by `id`, partitioned by `region` and ordered by `ts` (event time),
with the metadata table on. Every row a write produces carries the name of the write attempt that
produced it (`name`), so that a check can tell which attempts' rows are visible. Every attempt's
`ts` is unique across processes, so the model never depends on a tie.

The model replays the landed writes in instant order: an upsert keeps a stored row whose `ts` is
greater (event-time ordering), a delete (keys only: a commit-time delete) removes the key.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import oxlake
import pyarrow as pa
import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from seaweed import SeaweedS3  # noqa: E402

#: `OXLAKE_STRESS=long` runs the sizes the issue names; the default run is a short version.
LONG = os.environ.get("OXLAKE_STRESS") == "long"

SCHEMA = pa.schema(
    [
        pa.field("id", pa.int64(), nullable=False),
        pa.field("region", pa.string(), nullable=False),
        pa.field("name", pa.string()),
        pa.field("ts", pa.int64()),
        pa.field("value", pa.int64()),
    ]
)
COLUMNS = [f.name for f in SCHEMA]
SHARED = "shared"
#: Keys each region starts with; writers add more.
INITIAL_KEYS = 200


def region_base(region: str) -> int:
    return 9_000_000 if region == SHARED else int(region[1:]) * 1_000_000


def unique_ts(slot: int) -> int:
    """A timestamp no other process produces: nanoseconds with the writer's slot in the last digit."""
    return time.time_ns() // 10 * 10 + slot


@dataclass
class Target:
    """Where the table lives: a local path or a bucket of the S3 server."""

    uri: str
    storage_options: dict[str, str] | None = None

    def open(self, **kwargs: Any) -> oxlake.Table:
        return oxlake.Table(self.uri, self.storage_options, **kwargs)

    def to_json(self) -> str:
        return json.dumps({"uri": self.uri, "storage_options": self.storage_options})

    @staticmethod
    def from_json(text: str) -> Target:
        return Target(**json.loads(text))


@pytest.fixture(scope="session")
def s3_server() -> Iterator[SeaweedS3]:
    with SeaweedS3() as s3:
        yield s3


def target_for(where: str, request: pytest.FixtureRequest, tmp_path: Path) -> Target:
    """A new table's place: `local` under `tmp_path`, `s3` in a new bucket of the S3 server."""
    if where == "local":
        return Target(str(tmp_path / "table"))
    s3: SeaweedS3 = request.getfixturevalue("s3_server")
    bucket = f"stress-{random.randrange(1 << 30)}"
    s3.create_bucket(bucket)
    return Target(f"s3://{bucket}/table", s3.storage_options())


def create(target: Target, regions: Iterable[str], **options: Any) -> tuple[oxlake.Table, dict[int, dict]]:
    """A merge-on-read table holding `INITIAL_KEYS` keys per region, with its metadata table; returns
    it and its rows as the model's starting state."""
    t = oxlake.create_table(
        target.uri,
        SCHEMA,
        record_key="id",
        partition_by=["region"],
        ordering_field="ts",
        table_type="merge_on_read",
        storage_options=target.storage_options,
        **options,
    )
    t.build_metadata(files_shards=2, column_stats_shards=1, bloom_filters_shards=1, record_index_shards=2)
    # Archival inline after every commit (the default) and often: 8 commits past the last run.
    t.set_archival(5, 8)
    initial = [
        {"id": region_base(r) + i, "region": r, "name": "initial", "ts": 0, "value": i}
        for r in regions
        for i in range(INITIAL_KEYS)
    ]
    t.insert(pa.Table.from_pylist(initial, SCHEMA))
    return t, {row["id"]: row for row in initial}


# -- the workload -------------------------------------------------------------------------------


def plan_write(
    rng: random.Random, own: str, attempt: str, slot: int, next_new: int
) -> tuple[str, list[dict]]:
    """One write of a writer owning region `own`: mostly upserts of its own keys (updates and new
    keys), some deletes of its own keys, and often keys of the shared region, which other writers
    write too (updates, and new keys that two writers may both insert)."""
    ts = unique_ts(slot)
    base = region_base(own)
    roll = rng.random()
    if roll < 0.2:
        ids = rng.sample(range(base, base + next_new), 5)
        return "delete", [{"id": i, "region": own} for i in ids]
    rows: list[dict] = []
    if roll < 0.8:
        ids = rng.sample(range(base, base + next_new), 15) + list(range(base + next_new, base + next_new + 5))
        rows += [{"id": i, "region": own} for i in ids]
    if roll >= 0.8 or rng.random() < 0.35:
        shared = region_base(SHARED)
        rows += [{"id": shared + i, "region": SHARED} for i in rng.sample(range(INITIAL_KEYS + 40), 6)]
    for r in rows:
        r.update(name=attempt, ts=ts, value=rng.randrange(1 << 40))
    return "upsert", rows


def apply(op: str, rows: list[dict], target: oxlake.Table, conflict_retries: int = 0) -> oxlake.WriteResult:
    if op == "delete":
        keys = pa.table(
            {"id": pa.array([r["id"] for r in rows], pa.int64()), "region": [r["region"] for r in rows]}
        )
        return target.delete(keys, conflict_retries=conflict_retries)
    return target.upsert(pa.Table.from_pylist(rows, SCHEMA), conflict_retries=conflict_retries)


# -- the model ----------------------------------------------------------------------------------


@dataclass
class Attempt:
    """One write attempt as its writer logged it."""

    attempt: str
    op: str
    rows: list[dict]
    status: str = "started"  # landed | conflict | error | started (killed before it knew)
    instant: str | None = None
    detail: str = ""
    #: What else the worker logged (services: instants compacted, files deleted, rows read).
    extra: dict[str, Any] = field(default_factory=dict)


def replay(state: dict[int, dict], landed: Iterable[Attempt]) -> dict[int, dict]:
    """The table the landed attempts make of `state`, applied in instant order."""
    out = dict(state)
    for a in sorted(landed, key=lambda a: a.instant or ""):
        for r in a.rows:
            if a.op == "delete":
                out.pop(r["id"], None)
            elif r["id"] not in out or out[r["id"]]["ts"] <= r["ts"]:
                out[r["id"]] = dict(r)
    return out


def table_rows(t: oxlake.Table) -> list[dict]:
    return sorted(t.to_arrow(columns=COLUMNS).to_pylist(), key=lambda r: r["id"])


def model_rows(state: dict[int, dict]) -> list[dict]:
    return [state[k] for k in sorted(state)]


def read_log(path: Path) -> list[Attempt]:
    """A worker's log: one JSON object per line; later lines about an attempt update it."""
    attempts: dict[str, Attempt] = {}
    if not path.exists():
        return []
    for line in path.read_text().splitlines():
        if not line.strip():
            continue
        try:
            entry = json.loads(line)
        except json.JSONDecodeError:  # the last line of a killed worker may be cut short
            continue
        a = attempts.setdefault(entry["attempt"], Attempt(entry["attempt"], entry.get("op", ""), []))
        for k, v in entry.items():
            if k in Attempt.__dataclass_fields__ and k != "extra":
                setattr(a, k, v)
            else:
                a.extra[k] = v
    return list(attempts.values())


def data_files(t: oxlake.Table, target: Target) -> list[str]:
    """Every data file (base and log) under the table, for a local table."""
    root = Path(target.uri)
    return [
        str(p)
        for p in root.rglob("*")
        if p.is_file() and ".hoodie" not in p.parts and p.name != ".hoodie_partition_metadata"
    ]


def pending(t: oxlake.Table) -> list[oxlake.Instant]:
    return [i for i in t.timeline() if i.state != "completed"]


# -- worker processes ---------------------------------------------------------------------------


@dataclass
class Workers:
    """Worker processes (`worker.py`) started together and waited for."""

    target: Target
    logs: Path
    procs: list[tuple[str, subprocess.Popen[bytes]]] = field(default_factory=list)
    frozen: int = 0

    def start(self, role: str, name: str, **args: Any) -> None:
        spec = json.dumps({"role": role, "name": name, "target": self.target.to_json(), **args})
        log = self.logs / f"{name}.jsonl"
        err = open(self.logs / f"{name}.stderr", "wb")  # noqa: SIM115
        env = dict(os.environ, OXLAKE_LOG=os.environ.get("OXLAKE_LOG", "info"))
        proc = subprocess.Popen(
            [sys.executable, str(HERE / "worker.py"), spec, str(log)], stderr=err, env=env
        )
        self.procs.append((name, proc))

    def wait(self, names: Iterable[str], timeout: float) -> None:
        deadline = time.monotonic() + timeout
        for name, proc in self.procs:
            if name in names:
                proc.wait(timeout=max(1.0, deadline - time.monotonic()))
                assert proc.returncode == 0, f"{name} failed: {self.stderr(name)}"

    def stderr(self, name: str) -> str:
        return (self.logs / f"{name}.stderr").read_text()[-4000:]

    def stop(self) -> None:
        (self.logs / "stop").touch()

    def freeze_now_and_then(self, names: list[str], seconds: float, rng: random.Random) -> threading.Thread:
        """Stops (SIGSTOP) one of `names` at random for `seconds`, again and again until `stop`:
        a process paused past its heartbeat, as a GC pause or a suspended VM pauses it. The others
        take it for gone and roll its write back while it sleeps. The first comes within a second
        of the start: a fast run's writers may all be done within the first few seconds."""

        def run() -> None:
            procs = [p for n, p in self.procs if n in names]
            while not (self.logs / "stop").exists() and any(p.poll() is None for p in procs):
                time.sleep(rng.uniform(1.0, 3.0) if self.frozen else rng.uniform(0.3, 1.0))
                proc = rng.choice(procs)
                if proc.poll() is not None:
                    continue
                os.kill(proc.pid, signal.SIGSTOP)
                time.sleep(seconds)
                os.kill(proc.pid, signal.SIGCONT)
                self.frozen += 1

        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        return thread

    def kill_all(self) -> None:
        for _, proc in self.procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
