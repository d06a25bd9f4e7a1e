"""Crashes: a writer process killed at each step of the commit protocol.

Afterwards the table reads exactly the committed data, and the next write rolls the failed
instant back (its files deleted, a `rollback` instant recorded).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import oxlake
import pytest
from conftest import SCHEMA, rows, trips

HEARTBEAT = 0.2  # seconds; a crashed writer's heartbeat expires after three intervals

WRITER = textwrap.dedent(
    """
    import sys, pyarrow as pa, oxlake
    sys.path.insert(0, {tests!r})
    from conftest import trips
    t = oxlake.Table({uri!r}, heartbeat_interval={hb})
    t.upsert(trips([2, 3, 40, 41], ts=5, name="crashed"))
    """
)


@pytest.mark.parametrize("failpoint", ["after-requested", "after-inflight", "before-commit", "after-commit"])
def test_killed_writer_leaves_committed_data(table_path: str, failpoint: str) -> None:
    t = oxlake.create_table(
        table_path,
        SCHEMA,
        record_key="id",
        partition_by=["city"],
        ordering_field="ts",
        heartbeat_interval=HEARTBEAT,
    )
    t.insert(trips(list(range(6))))
    committed = rows(t.scan())
    script = WRITER.format(tests=str(Path(__file__).parent), uri=table_path, hb=HEARTBEAT)
    env = dict(os.environ, OXLAKE_FAILPOINT=failpoint)
    proc = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True)
    assert proc.returncode != 0, "the writer must have been killed"

    reader = oxlake.Table(table_path)
    if failpoint == "after-commit":
        # The completed instant was written: the write is committed, only cleanup was lost.
        assert {r["name"] for r in rows(reader.scan()) if r["id"] in (2, 3, 40, 41)} == {
            "crashed2",
            "crashed3",
            "crashed40",
            "crashed41",
        }
        return
    assert rows(reader.scan()) == committed
    pending = [i for i in reader.timeline() if i.state != "completed"]
    assert len(pending) == 1

    time.sleep(HEARTBEAT * 4)
    writer = oxlake.Table(table_path, heartbeat_interval=HEARTBEAT)
    res = writer.upsert(trips([1], ts=9, name="next"))
    timeline = writer.timeline()
    assert all(i.state == "completed" for i in timeline)
    assert [i.action for i in timeline] == ["commit", "rollback", "commit"]
    assert res.instant == timeline[-1].time
    # No file of the failed instant is left.
    failed = pending[0].time
    assert not [p for p in Path(table_path).rglob(f"*{failed}*") if ".hoodie" not in p.parts]
    expect = {r["id"]: r for r in committed}
    expect[1] = rows(trips([1], ts=9, name="next"))[0]
    assert rows(writer.scan()) == sorted(expect.values(), key=lambda r: r["id"])


def test_live_writer_is_not_rolled_back(table_path: str) -> None:
    """A pending instant with a fresh heartbeat belongs to a live writer: leave it alone."""
    t = oxlake.create_table(table_path, SCHEMA, record_key="id", heartbeat_interval=30.0, table_version=6)
    t.insert(trips([1]))
    hb = Path(table_path) / ".hoodie" / ".heartbeat"
    hb.mkdir(exist_ok=True)
    live = "29990101000000000"
    (Path(table_path) / ".hoodie" / f"{live}.commit.requested").write_text("")
    (hb / live).write_text(str(int(time.time() * 1000)))
    assert t.rollback_failed() == []
    (hb / live).write_text("0")
    assert t.rollback_failed() == [live]
    assert [i.action for i in t.timeline()] == ["commit", "rollback"]


def test_interrupted_rollback_is_finished(table_path: str) -> None:
    t = oxlake.create_table(table_path, SCHEMA, record_key="id", heartbeat_interval=HEARTBEAT)
    t.insert(trips([1, 2]))
    script = WRITER.format(tests=str(Path(__file__).parent), uri=table_path, hb=HEARTBEAT)
    subprocess.run(
        [sys.executable, "-c", script],
        env=dict(os.environ, OXLAKE_FAILPOINT="before-commit"),
        capture_output=True,
    )
    time.sleep(HEARTBEAT * 4)
    roll = f"import oxlake; oxlake.Table({table_path!r}, heartbeat_interval={HEARTBEAT}).rollback_failed()"
    proc = subprocess.run(
        [sys.executable, "-c", roll],
        env=dict(os.environ, OXLAKE_FAILPOINT="rollback-after-delete"),
        capture_output=True,
    )
    assert proc.returncode != 0
    assert [r["id"] for r in rows(oxlake.Table(table_path).scan())] == [1, 2]
    # The rollback beat like a write: it is left to its process until the heartbeat expires.
    assert oxlake.Table(table_path, heartbeat_interval=HEARTBEAT).rollback_failed() == []
    time.sleep(HEARTBEAT * 4)
    done = oxlake.Table(table_path, heartbeat_interval=HEARTBEAT).rollback_failed()
    assert len(done) == 1
    timeline = oxlake.Table(table_path).timeline()
    assert [(i.action, i.state) for i in timeline] == [("commit", "completed"), ("rollback", "completed")]
