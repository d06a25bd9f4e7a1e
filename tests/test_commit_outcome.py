"""A write that fails says whether it may have committed (issue 71, defect 6): a plain error means
not committed, ever; `CommitUnknownError` means the store failed past the decision, and
`Table.outcome` answers once it works again. Swept over the store calls of one upsert failing
from each position on (the conditional creates of the commit protocol, with and without the
plain puts that take a decision back)."""

from __future__ import annotations

import time
from pathlib import Path

import oxlake
import pyarrow as pa
import pytest
from oxlake.testing import inject_faults

SCHEMA = pa.schema([pa.field("id", pa.int64(), nullable=False), pa.field("v", pa.string())])


def ids(path: str) -> list[int]:
    return sorted(oxlake.Table(path).to_arrow(columns=["id"])["id"].to_pylist())


@pytest.mark.parametrize("version", [6, 8])
def test_a_failed_write_is_committed_only_when_it_says_it_may_be(tmp_path: Path, version: int) -> None:
    seen: dict[str, int] = {"ok": 0, "failed": 0, "unknown": 0}
    for creates in range(1, 17):
        for puts in (None, 1, 3, 5, 7):
            path = str(tmp_path / f"t{creates}-{puts}")
            t = oxlake.create_table(path, SCHEMA, record_key="id", table_version=version)
            t.insert(pa.table({"id": [1], "v": ["a"]}, schema=SCHEMA))
            spec = f"put_if_absent@{creates}:always" + (f",put@{puts}:always" if puts else "")
            inject_faults(spec)
            try:
                t.upsert(pa.table({"id": [2], "v": ["b"]}, schema=SCHEMA))
                outcome = "ok"
            except oxlake.CommitUnknownError as e:
                outcome, instant = "unknown", e.instant
            except oxlake.OxlakeError:
                outcome = "failed"
            finally:
                inject_faults("")
            seen[outcome] += 1
            if outcome == "ok":
                assert ids(path) == [1, 2], spec
            elif outcome == "unknown":
                # Its writer gave up: once its heartbeat expired (a short interval here), the
                # answer is final.
                time.sleep(0.2)
                asked = oxlake.Table(path, heartbeat_interval=0.05).outcome(instant)
                assert asked in ("committed", "rolled_back"), (spec, asked)
                assert ids(path) == ([1, 2] if asked == "committed" else [1]), spec
            else:
                # Not committed, whatever the next writer does.
                time.sleep(0.2)
                settled = oxlake.Table(path, heartbeat_interval=0.05)
                settled.rollback_failed(complete_decided=True)
                assert ids(path) == [1], spec
    assert seen["ok"] and seen["failed"] and seen["unknown"], seen


def test_outcome_of_a_completed_and_of_a_rolled_back_write(tmp_path: Path) -> None:
    path = str(tmp_path / "t")
    t = oxlake.create_table(path, SCHEMA, record_key="id")
    kept = t.insert(pa.table({"id": [1], "v": ["a"]}, schema=SCHEMA)).instant
    undone = t.upsert(pa.table({"id": [2], "v": ["b"]}, schema=SCHEMA)).instant
    assert kept is not None and undone is not None
    t.rollback(undone)
    assert t.outcome(kept) == "committed"
    assert t.outcome(undone) == "rolled_back"
    with pytest.raises(oxlake.InvalidArgumentError, match="no write at"):
        t.outcome("20990101000000000")
