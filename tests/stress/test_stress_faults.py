"""Storage faults: during each operation (upsert, delete, compaction, clean), each kind of store
call (list, get, head, put, conditional put, delete) fails at chosen positions, once and then
permanently (`oxlake.testing` injects the failures below the retry layer).

- Failing once, or losing the answer of a call that took effect: the retries hide it, and the
  operation lands with exactly the result of a run without faults.
- Failing permanently: the operation either landed (the failure came after its commit) or raised
  `StorageError` and left the table reading as before. Either way, once storage is back and the
  failed attempt's heartbeat has expired, the next writer repairs the table (nothing pending, the
  metadata table equal to storage) and its own write lands.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable
from pathlib import Path

import oxlake
import pyarrow as pa
import pytest
from oxlake.testing import fault_counts, faults, inject_faults
from stress_lib import LONG, SCHEMA, SHARED, Target, create, pending, table_rows

HEARTBEAT = 0.05
CALLS = ["list", "get", "head", "put", "put_if_absent", "delete"]
#: Positions tried per call kind: evenly spread over the calls the operation makes.
POSITIONS = 12 if LONG else 3


def changes(ts: int) -> pa.Table:
    ids = list(range(0, 40, 3)) + list(range(9_000_000, 9_000_020, 4)) + [500, 501]
    return pa.Table.from_pylist(
        [
            {
                "id": i,
                "region": SHARED if i >= 9_000_000 else "w0",
                "name": f"f{ts}",
                "ts": ts,
                "value": i * 7,
            }
            for i in ids
        ],
        SCHEMA,
    )


OPERATIONS: dict[str, Callable[[oxlake.Table], object]] = {
    "upsert": lambda t: t.upsert(changes(10**18)),
    "delete": lambda t: t.delete(
        pa.table({"id": pa.array([1, 2, 9_000_001], pa.int64()), "region": ["w0", "w0", SHARED]})
    ),
    "compact": lambda t: t.compact(),
    "clean": lambda t: t.clean(retain=1),
}


#: The action an operation completes when it lands.
ACTIONS = {"upsert": "deltacommit", "delete": "deltacommit", "compact": "commit", "clean": "clean"}


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A table with log files to compact and old slices to clean."""
    root = tmp_path_factory.mktemp("faults") / "template"
    t, _ = create(Target(str(root)), ["w0", SHARED], heartbeat_interval=HEARTBEAT)
    for k in range(1, 4):
        t.upsert(changes(k))
    t.compact()
    for k in range(4, 6):
        t.upsert(changes(k))
    return root


def fresh(template: Path, tmp: Path, name: str, heartbeat: float = HEARTBEAT) -> oxlake.Table:
    path = tmp / name
    shutil.copytree(template, path)
    return oxlake.Table(str(path), heartbeat_interval=heartbeat)


def state(t: oxlake.Table) -> tuple[list[dict], set[tuple[str, str]]]:
    """What a reader sees, and the completed instants (time, action)."""
    reader = oxlake.Table(t.uri)
    return table_rows(reader), {(i.time, i.action) for i in reader.timeline() if i.state == "completed"}


def positions(count: int) -> list[int]:
    if count <= POSITIONS:
        return list(range(1, count + 1))
    return sorted({1 + round(k * (count - 1) / (POSITIONS - 1)) for k in range(POSITIONS)})


@pytest.mark.parametrize("operation", list(OPERATIONS))
def test_each_call_failing_once_then_permanently(operation: str, template: Path, tmp_path: Path) -> None:
    op = OPERATIONS[operation]
    # Counted without heartbeat refreshes (their number follows the run's duration): every
    # position counted is then reached by a run with them, however fast it goes.
    clean_run = fresh(template, tmp_path, "clean", heartbeat=60.0)
    before_rows, before_instants = state(clean_run)
    with faults("backoff=1") as counts:
        op(clean_run)
    expect_rows, _ = state(clean_run)
    if operation != "compact" and operation != "clean":
        assert expect_rows != before_rows
    figures = {"runs": 0, "injected": 0, "landed": 0, "unchanged": 0}
    for call in CALLS:
        for n in positions(counts[call]):
            for mode in ["once", "lost", "always"]:
                if mode == "lost" and call in ("list", "get", "head"):
                    continue  # reads have no effect to lose
                name = f"{call}-{n}-{mode}"
                t = fresh(template, tmp_path, name)
                inject_faults(f"{call}@{n}:{mode},backoff=1")
                try:
                    op(t)
                    error = None
                except oxlake.StorageError as e:
                    error = e
                finally:
                    injected = fault_counts()["injected"]
                    inject_faults("")
                assert injected >= 1, f"{name}: the fault never fired"
                rows, instants = state(t)
                landed = any(a == ACTIONS[operation] for _, a in instants - before_instants)
                if mode != "always":
                    assert error is None, f"{name}: a transient fault must be retried: {error}"
                if error is None or landed:
                    assert rows == expect_rows, f"{name}: landed with other rows than a run without faults"
                    figures["landed"] += 1
                else:
                    assert rows == before_rows, f"{name}: failed but changed what readers see"
                    figures["unchanged"] += 1
                repair(t, rows, operation)
                figures["runs"] += 1
                figures["injected"] += injected
    print(f"{operation}: calls {dict(counts)}; {figures}")


def repair(t: oxlake.Table, rows: list[dict], operation: str) -> None:
    """The next writer, once the failed attempt's heartbeat expired: the table reads the same, and
    its own write lands. Then the next run of the operation finishes what is left pending (a clean
    or a compaction plan resumes), and the metadata table equals storage."""
    time.sleep(HEARTBEAT * 3.5)
    writer = oxlake.Table(t.uri, heartbeat_interval=HEARTBEAT)
    writer.rollback_failed()
    # Services resume their own plans: a compaction plan, a clean.
    left = [i for i in pending(writer) if i.action not in ("compaction", "clean")]
    assert left == [], f"{t.uri}: left pending: {left}"
    assert table_rows(writer) == rows
    writer.upsert(changes(2 * 10**18))
    assert {r["name"] for r in table_rows(writer) if r["ts"] == 2 * 10**18} == {f"f{2 * 10**18}"}
    OPERATIONS[operation](writer)
    assert pending(writer) == [], f"{t.uri}: left pending after the next {operation}"
    # The write caught the metadata table up if the failure left it stale.
    report = writer.validate()
    assert report.ok, (t.uri, report.missing_instants, report.differences)
