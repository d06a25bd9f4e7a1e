"""A stress-suite worker process: `python worker.py SPEC LOG`.

SPEC is JSON: `role` (writer, compactor, cleaner, reader, crasher), `name`, `target` and the role's
arguments. Every outcome goes to LOG as one JSON line, flushed at once, so that a killed worker's
log still says what it knew. Services and readers run until the file `stop` appears beside LOG.
"""

from __future__ import annotations

import json
import random
import sys
import time
import traceback
from pathlib import Path
from typing import Any

import oxlake
import oxlake.testing
from stress_lib import INITIAL_KEYS, Target, apply, plan_write


class Log:
    def __init__(self, path: Path) -> None:
        self.file = open(path, "a", buffering=1)  # noqa: SIM115

    def __call__(self, **entry: Any) -> None:
        self.file.write(json.dumps(entry) + "\n")
        self.file.flush()


def writer(spec: dict, log: Log, t: oxlake.Table) -> None:
    """`commits` write attempts; a conflict is logged and the writer goes on."""
    rng = random.Random(spec["seed"])
    next_new = INITIAL_KEYS
    for i in range(spec["commits"]):
        attempt = f"{spec['name']}-{i}"
        op, rows = plan_write(rng, spec["region"], attempt, spec["slot"], next_new)
        next_new += 5 if any(r["region"] == spec["region"] for r in rows) and op == "upsert" else 0
        log(attempt=attempt, op=op, rows=rows)
        try:
            res = apply(op, rows, t, spec.get("conflict_retries", 0))
            log(attempt=attempt, status="landed", instant=res.instant)
        except oxlake.CommitConflictError as e:
            log(attempt=attempt, status="conflict", instant=e.instant, detail=str(e))
        time.sleep(rng.random() * spec.get("pause", 0.0))


def service(spec: dict, log: Log, t: oxlake.Table, stop: Path) -> None:
    """Compaction, clean or reads in a loop until `stop` appears (then a last round that lands:
    a compaction that lost a conflict keeps its plan, to run again)."""
    i = 0
    last_rounds = 0
    while True:
        last = stop.exists()
        last_rounds += last
        lost = False
        attempt = f"{spec['name']}-{i}"
        # A service may lose to a write like any commit (its metadata-table update raced one):
        # it fails with a conflict, leaves nothing a reader uses, and runs again next round.
        if spec["role"] == "compactor":
            try:
                res = t.compact()
                done = {"instants": res.instants, "groups": res.file_groups}
                log(attempt=attempt, op="compact", status="landed", **done)
            except oxlake.CommitConflictError as e:
                log(attempt=attempt, op="compact", status="conflict", instant=e.instant, detail=str(e))
                lost = True
        elif spec["role"] == "rollbacker":
            # On a slow store (its own latency): what it read is old by the time it acts.
            try:
                rolled = t.rollback_failed()
                log(attempt=attempt, op="rollback", status="landed", rolled_back=rolled)
            except oxlake.CommitConflictError as e:
                log(attempt=attempt, op="rollback", status="conflict", instant=e.instant, detail=str(e))
        elif spec["role"] == "cleaner":
            try:
                deleted = t.clean(retain=spec["retain"])
                log(attempt=attempt, op="clean", status="landed", deleted=len(deleted))
            except oxlake.CommitConflictError as e:
                log(attempt=attempt, op="clean", status="conflict", instant=e.instant, detail=str(e))
        else:
            reader = Target.from_json(spec["target"]).open()
            data = reader.to_arrow(columns=["id", "name"])
            ids = data.column("id").to_pylist()
            log(
                attempt=attempt,
                op="read",
                status="landed",
                rows=len(ids),
                duplicates=len(ids) - len(set(ids)),
            )
        i += 1
        if last and (not lost or last_rounds >= 10):
            return
        time.sleep(spec.get("pause", 0.2))


def crasher(spec: dict, log: Log, t: oxlake.Table) -> None:
    """Writes, compacts and cleans until killed: says `ready`, waits for a line on stdin, then goes."""
    rng = random.Random(spec["seed"])
    next_new = spec["next_new"]
    print("ready", flush=True)
    sys.stdin.readline()
    for i in range(1_000_000):
        attempt = f"{spec['name']}-{i}"
        roll = rng.random()
        if roll < 0.15:
            log(attempt=attempt, op="compact")
            res = t.compact()
            log(attempt=attempt, status="landed", instants=res.instants)
        elif roll < 0.25:
            log(attempt=attempt, op="clean")
            t.clean(retain=3)
            log(attempt=attempt, status="landed")
        else:
            op, rows = plan_write(rng, spec["region"], attempt, 0, next_new)
            next_new += 5 if op == "upsert" else 0
            log(attempt=attempt, op=op, rows=rows, next_new=next_new)
            res = apply(op, rows, t)
            log(attempt=attempt, status="landed", instant=res.instant)


def main() -> None:
    spec = json.loads(sys.argv[1])
    log_path = Path(sys.argv[2])
    log = Log(log_path)
    target = Target.from_json(spec["target"])
    if spec.get("faults"):
        oxlake.testing.inject_faults(spec["faults"])
    t = target.open(heartbeat_interval=spec.get("heartbeat", 1.0))
    try:
        if spec["role"] == "writer":
            writer(spec, log, t)
        elif spec["role"] == "crasher":
            crasher(spec, log, t)
        else:
            service(spec, log, t, log_path.parent / "stop")
    except Exception as e:
        log(attempt=f"{spec['name']}-fatal", op="fatal", status="error", detail=traceback.format_exc())
        raise SystemExit(f"{spec['name']}: {e!r}") from e


if __name__ == "__main__":
    main()
