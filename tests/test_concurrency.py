"""Writers in two processes, one held just before its commit (a pause point) while the other
commits: the conflict rules, case by case. `tests/stress` runs them at random, at scale."""

from __future__ import annotations

import subprocess
import threading
import time
from pathlib import Path

import oxlake
import pytest
from conftest import hudi_read, rows, run_paused, trips, trips_table

HEARTBEAT = 0.2


def held_write(uri: str, call: str, tmp: Path, point: str = "before-commit") -> subprocess.Popen[str]:
    """Starts `t.<call>` in another process and returns once it waits at `point`. It prints
    `landed <instant>` or `conflict <their instant> <message>`."""
    code = (
        "import sys, oxlake\n"
        f"sys.path.insert(0, {str(Path(__file__).parent)!r})\n"
        "from conftest import trips\n"
        f"t = oxlake.Table(sys.argv[1], heartbeat_interval={HEARTBEAT})\n"
        "try:\n"
        f"    print('landed', t.{call}.instant)\n"
        "except oxlake.CommitConflictError as e:\n"
        "    print('conflict', e.instant, e)\n"
    )
    return run_paused(uri, point, code, tmp)


def release(proc: subprocess.Popen[str], tmp: Path) -> list[str]:
    (tmp / "resume").touch()
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    return out.split()


def pending(t: oxlake.Table) -> list[oxlake.Instant]:
    return [i for i in t.timeline() if i.state != "completed"]


def test_the_second_to_commit_on_a_file_group_conflicts(table_path: str, tmp_path: Path) -> None:
    t = trips_table(table_path, heartbeat_interval=HEARTBEAT)
    t.insert(trips(list(range(6))))
    held = held_write(table_path, "upsert(trips([1, 4], ts=5, name='held'))", tmp_path)
    ours = t.upsert(trips([1], ts=3, name="first")).instant
    out = release(held, tmp_path)
    assert out[:2] == ["conflict", ours], "the error names the write that won"
    got = {r["id"]: r["name"] for r in rows(t.scan())}
    assert got[1] == "first1" and got[4] == "n4", "nothing of the conflicting write is visible"
    assert pending(t) == []
    # Its files were rolled back: every base file belongs to a completed instant.
    completed = {i.time for i in t.timeline()}
    bases = [p.name for p in Path(table_path).rglob("*.parquet") if ".hoodie" not in p.parts]
    assert all(b.rsplit("_", 1)[-1].removesuffix(".parquet") in completed for b in bases)
    assert [i.action for i in t.timeline()] == ["commit", "commit", "rollback"]


def test_disjoint_writes_both_commit(table_path: str, tmp_path: Path) -> None:
    t = trips_table(table_path, heartbeat_interval=HEARTBEAT)
    t.insert(trips(list(range(6))))
    # ids 0 and 3 are in "sf", 1 and 4 in "nyc": different partitions, different file groups.
    held = held_write(table_path, "upsert(trips([0, 3], ts=5, name='held'))", tmp_path)
    t.upsert(trips([1, 4], ts=5, name="free"))
    assert release(held, tmp_path)[0] == "landed"
    got = {r["id"]: r["name"] for r in rows(t.scan())}
    assert got == {0: "held0", 1: "free1", 2: "n2", 3: "held3", 4: "free4", 5: "n5"}


@pytest.mark.parametrize("meta_fields", [True, False], ids=["meta", "virtual-keys"])
def test_one_new_key_inserted_by_two_writers_lands_once(
    table_path: str, tmp_path: Path, meta_fields: bool
) -> None:
    """Only the keys tell the two writes apart: without meta fields, those the key fields make."""
    t = trips_table(table_path, heartbeat_interval=HEARTBEAT, meta_fields=meta_fields)
    t.insert(trips([0, 3]))
    # Both insert key 9 into "sf": into different new files, so only the keys tell them apart.
    held = held_write(
        table_path, "insert(trips([9], ts=5, name='held', city='sf'), target_file_size=1)", tmp_path
    )
    t.insert(trips([9], ts=5, name="free", city="sf"), target_file_size=1)
    assert release(held, tmp_path)[0] == "conflict"
    assert [(r["id"], r["name"]) for r in rows(t.scan())] == [(0, "n0"), (3, "n3"), (9, "free9")]


def test_conflict_retries_write_again_against_the_new_table(table_path: str, tmp_path: Path) -> None:
    t = trips_table(table_path, heartbeat_interval=HEARTBEAT)
    t.insert(trips(list(range(6))))
    held = held_write(table_path, "upsert(trips([1, 4], ts=9, name='held'), conflict_retries=1)", tmp_path)
    t.upsert(trips([1], ts=3, name="first"))
    out = release(held, tmp_path)
    assert out[0] == "landed"
    got = {r["id"]: r["name"] for r in rows(t.scan())}
    assert got[1] == "held1" and got[4] == "held4"
    actions = [i.action for i in t.timeline()]
    assert actions == ["commit", "commit", "rollback", "commit"] and pending(t) == []


@pytest.mark.parametrize("version", [6, 8])
def test_a_compaction_waits_for_a_write_that_began_before_it(
    table_path: str, tmp_path: Path, version: int
) -> None:
    t = trips_table(
        table_path, heartbeat_interval=HEARTBEAT, table_type="merge_on_read", table_version=version
    )
    t.insert(trips(list(range(6))))
    t.upsert(trips([0, 1], ts=2, name="u"))
    held = held_write(table_path, "upsert(trips([3, 4], ts=5, name='held'))", tmp_path)
    compaction: list[oxlake.CompactionResult] = []
    worker = threading.Thread(target=lambda: compaction.append(oxlake.Table(table_path).compact()))
    worker.start()
    time.sleep(0.5)
    assert worker.is_alive(), "the compaction waits for the earlier write"
    assert release(held, tmp_path)[0] == "landed"
    worker.join(timeout=60)
    assert compaction and len(compaction[0].instants) == 1
    got = {r["id"]: r["name"] for r in rows(t.scan())}
    assert got == {0: "u0", 1: "u1", 2: "n2", 3: "held3", 4: "held4", 5: "n5"}
    ro = {r["id"]: r["name"] for r in rows(t.to_arrow(query="read_optimized"))}
    if version == 6:
        # The held write's logs joined the planned slices: the compacted base files hold them.
        assert ro == got
    else:
        # Slices by completion time: the held write completed after the compaction's time, so
        # its logs belong to the slice the compaction starts; the base files do not hold it.
        assert ro == {**got, 3: "n3", 4: "n4"}
        assert rows(hudi_read(table_path)) == rows(t.scan())
    assert pending(t) == []
