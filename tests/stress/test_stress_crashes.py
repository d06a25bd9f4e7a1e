"""Crashes: a process that writes, compacts and cleans in a loop is killed (SIGKILL) at a random
moment, run after run, on the local disk and on the S3 server.

After each kill:
- a reader sees exactly the committed data: the model of every write the process reported landed,
  plus the write it was killed in when (and only when) that one's instant completed;
- the next writer (after the dead process's heartbeat expired) rolls back what it left pending, and
  the table still reads the same; every few runs the metadata table is validated against storage.
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
import time
from pathlib import Path

import pytest
from stress_lib import (
    HERE,
    LONG,
    SHARED,
    Attempt,
    Target,
    apply,
    create,
    model_rows,
    pending,
    plan_write,
    read_log,
    replay,
    s3_server,
    table_rows,
    target_for,
)

__all__ = ["s3_server"]

RUNS = {"local": 200 if LONG else 12, "s3": 200 if LONG else 5}
HEARTBEAT = 0.1  # seconds: a killed process's instants expire after three intervals
MAX_DELAY = 1.2  # seconds between "go" and the kill


def crash_once(target: Target, log: Path, run: int, seed: int, next_new: int) -> None:
    spec = {
        "role": "crasher",
        "name": f"run{run}",
        "target": target.to_json(),
        "region": "w0",
        "seed": seed,
        "next_new": next_new,
        "heartbeat": HEARTBEAT,
    }
    proc = subprocess.Popen(
        [sys.executable, str(HERE / "worker.py"), json.dumps(spec), str(log)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )
    assert proc.stdout is not None and proc.stdin is not None
    try:
        assert proc.stdout.readline().strip() == b"ready"
        proc.stdin.write(b"go\n")
        proc.stdin.flush()
        time.sleep(random.Random(seed).uniform(0.0, MAX_DELAY))
    finally:
        proc.kill()
        proc.wait()


def run(target: Target, logs: Path, where: str, seed: int, table_version: int = 6) -> dict[str, int]:
    t, initial = create(target, ["w0", SHARED], heartbeat_interval=HEARTBEAT, table_version=table_version)
    landed: list[Attempt] = []
    known = {i.time for i in t.timeline() if i.state == "completed"}
    next_new = 200
    figures = {"runs": 0, "landed": 0, "killed_in_write": 0, "killed_write_landed": 0, "rolled_back": 0}
    for n in range(RUNS[where]):
        log = logs / f"run{n}.jsonl"
        crash_once(target, log, n, seed * 1000 + n, next_new)
        attempts = read_log(log)
        data = [a for a in attempts if a.op in ("upsert", "delete")]
        done = [a for a in data if a.status == "landed"]
        unfinished = [a for a in data if a.status == "started"]
        assert len(unfinished) <= 1
        next_new = max([next_new] + [a.extra.get("next_new", 0) for a in data])

        reader = target.open()
        timeline = reader.timeline()
        new = {i.time for i in timeline if i.state == "completed" and i.action == "deltacommit"} - known
        new -= {a.instant for a in done}
        # Only the write the process was killed in may have completed without its report.
        assert len(new) <= (1 if unfinished else 0), (new, unfinished)
        if unfinished:
            figures["killed_in_write"] += 1
            if new:
                unfinished[0].instant = new.pop()
                done.append(unfinished[0])
                figures["killed_write_landed"] += 1
        landed += done
        # Completed instants only: an instant still in flight here may be the killed write, which the
        # repair below completes from its fate record (then it counts as landed there).
        known |= {i.time for i in timeline if i.state == "completed"}
        expect = model_rows(replay(initial, landed))
        assert table_rows(reader) == expect, f"run {n}: the reader must see exactly the committed data"

        time.sleep(HEARTBEAT * 3.5)
        writer = target.open(heartbeat_interval=HEARTBEAT)
        figures["rolled_back"] += len(writer.rollback_failed())
        # Services resume their own: a compaction plan (its files undone), a clean.
        left = [
            i
            for i in pending(writer)
            if not (i.action == "compaction" and i.state == "requested") and i.action != "clean"
        ]
        assert left == [], f"run {n}: left pending after repair: {left}"
        # A write killed after it decided to commit (its fate record) is completed by the repair,
        # never rolled back (COMMIT_PROTOCOL.md): then it landed.
        timeline = writer.timeline()
        completed = {i.time for i in timeline if i.state == "completed" and i.action == "deltacommit"}
        forward = completed - known - {a.instant for a in landed}
        assert len(forward) <= (1 if unfinished and unfinished[0] not in done else 0), (forward, unfinished)
        if forward:
            unfinished[0].instant = forward.pop()
            landed.append(unfinished[0])
            figures["killed_write_landed"] += 1
            expect = model_rows(replay(initial, landed))
        assert table_rows(writer) == expect
        if n % 5 == 4 or n == RUNS[where] - 1:
            # The next write catches the metadata table up (a kill between the metadata commit
            # and a rollback of a commit may have left it stale): then it equals storage.
            op, rows = plan_write(random.Random(n), "w0", f"repair{n}", 9, next_new)
            next_new += 5
            landed.append(Attempt(f"repair{n}", op, rows, "landed", apply(op, rows, writer).instant))
            expect = model_rows(replay(initial, landed))
            assert table_rows(writer) == expect
            report = writer.validate()
            assert report.ok, (n, report.missing_instants, report.differences)
        known |= {i.time for i in writer.timeline() if i.state == "completed"}
        figures["runs"] += 1
    figures["landed"] = len(landed)
    figures["rows_checked"] = len(expect)
    print(f"{where}: {figures}")
    return figures


@pytest.mark.parametrize("table_version", [6, 8])
@pytest.mark.parametrize("where", ["local", "s3"])
def test_killed_writer_leaves_exactly_the_committed_data(
    where: str, table_version: int, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    target = target_for(where, request, tmp_path)
    logs = tmp_path / "logs"
    logs.mkdir()
    figures = run(target, logs, where, seed=random.randrange(1 << 20), table_version=table_version)
    assert figures["landed"] > 0
