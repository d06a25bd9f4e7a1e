"""Restores and rollbacks beside the metadata table, and savepoints several at a time (issue 71,
defects 1 and 2): a restore far back, past the metadata table's compactions, keeps every later
file in the `files` index; a restore past a newer savepoint is refused before anything is
touched; savepoints can be deleted; a restore left pending across a savepoint is finished."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import oxlake
import pyarrow as pa
import pytest

SCHEMA = pa.schema([pa.field("id", pa.int64(), nullable=False), pa.field("ts", pa.int64())])
VERSIONS_AND_TYPES = [(v, t) for v in (6, 8) for t in ("copy_on_write", "merge_on_read")]


def keyed_table(path: str, table_type: str, version: int) -> oxlake.Table:
    return oxlake.create_table(
        path, SCHEMA, record_key="id", ordering_field="ts", table_type=table_type, table_version=version
    )


def upsert(t: oxlake.Table, *ids: int, ts: int = 1) -> str:
    result = t.upsert(pa.table({"id": list(ids), "ts": [ts] * len(ids)}, schema=SCHEMA))
    assert result.instant is not None
    return result.instant


def ids(t: oxlake.Table) -> list[int]:
    return sorted(t.to_arrow(columns=["id"])["id"].to_pylist())


def metadata_compactions(path: str) -> int:
    """Completed compactions of the metadata table (its only commits)."""
    mdt = oxlake.Table(f"{path}/.hoodie/oxlake/metadata")
    return sum(1 for i in mdt.timeline() if i.action == "commit" and i.state == "completed")


@pytest.mark.parametrize(("version", "table_type"), VERSIONS_AND_TYPES)
def test_a_restore_past_metadata_compactions_keeps_every_later_file(
    tmp_path: Path, version: int, table_type: str
) -> None:
    path = str(tmp_path / "t")
    t = keyed_table(path, table_type, version)
    sp = upsert(t, 0)
    t.savepoint(sp)
    for i in range(1, 12):
        upsert(t, i)
    assert metadata_compactions(path) >= 1, "the metadata table compacted past the savepoint"
    t.restore(sp)
    assert ids(t) == [0]
    upsert(t, 100)
    assert ids(t) == [0, 100]
    # Every upsert of a key finds it (a files index missing the file would insert it again).
    upsert(t, 100, ts=2)
    upsert(t, 100, ts=3)
    t.delete([0])
    assert ids(t) == [100]
    assert t.validate().ok, t.validate()
    t.build_metadata()
    assert ids(t) == [100]
    assert oxlake.Table(path).to_arrow(columns=["id", "ts"]).to_pylist() == [{"id": 100, "ts": 3}]
    assert t.validate().ok


@pytest.mark.parametrize(("version", "table_type"), VERSIONS_AND_TYPES)
def test_a_rollback_of_a_commit_the_metadata_table_compacted_keeps_later_files(
    tmp_path: Path, version: int, table_type: str
) -> None:
    path = str(tmp_path / "t")
    t = keyed_table(path, table_type, version)
    before = metadata_compactions(path)
    latest = ""
    for i in range(12):
        latest = upsert(t, i)
        if metadata_compactions(path) > before:
            break
    assert metadata_compactions(path) > before, "a compaction folded the latest commit in"
    written = ids(t)
    t.rollback(latest)
    assert ids(t) == written[:-1]
    upsert(t, 500)
    upsert(t, 500, ts=2)
    assert ids(t) == [*written[:-1], 500]
    assert t.validate().ok, t.validate()


def test_a_restore_past_a_newer_savepoint_is_refused_untouched(tmp_path: Path) -> None:
    path = str(tmp_path / "t")
    t = keyed_table(path, "copy_on_write", 8)
    a = upsert(t, 1)
    t.savepoint(a)
    b = upsert(t, 2)
    t.savepoint(b)
    upsert(t, 3)
    timeline = t.timeline()
    with pytest.raises(oxlake.InvalidArgumentError, match=f"savepoint {b} newer than {a}") as e:
        t.restore(a)
    assert "delete_savepoint" in str(e.value)
    assert t.timeline() == timeline and ids(t) == [1, 2, 3]
    # The way out: delete the newer savepoint, then restore.
    t.delete_savepoint(b)
    assert not any(i.action == "savepoint" and i.time == b for i in t.timeline())
    t.restore(a)
    assert ids(t) == [1]
    upsert(t, 4)
    t.clean(retain=1)
    assert ids(t) == [1, 4]
    with pytest.raises(oxlake.InvalidArgumentError, match="is not a savepoint"):
        t.delete_savepoint(b)


def test_the_cli_deletes_a_savepoint(tmp_path: Path) -> None:
    path = str(tmp_path / "t")
    t = keyed_table(path, "merge_on_read", 6)
    a = upsert(t, 1)
    t.savepoint(a)
    cli = [sys.executable, "-m", "oxlake.cli"]
    done = subprocess.run([*cli, "savepoint", "--delete", path, a], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert f"savepoint {a} deleted" in done.stdout
    assert not any(i.action == "savepoint" for i in oxlake.Table(path).timeline())


def test_a_restore_left_pending_across_a_savepoint_is_finished(tmp_path: Path) -> None:
    """A restore killed after its first rollback, and a savepoint made after that on a commit the
    restore's plan takes back (what an older oxlake left when it planned past newer savepoints):
    the next writer finishes the restore, past the savepoint, and the table writes again."""
    path = str(tmp_path / "t")
    t = keyed_table(path, "copy_on_write", 8)
    a = upsert(t, 1)
    t.savepoint(a)
    b = upsert(t, 2)
    upsert(t, 3)
    code = "import oxlake, sys; oxlake.Table(sys.argv[1]).restore(sys.argv[2])"
    env = dict(os.environ, OXLAKE_FAILPOINT="restore-after-rollback")
    killed = subprocess.run([sys.executable, "-c", code, path, a], env=env, capture_output=True, text=True)
    assert killed.returncode != 0
    t = oxlake.Table(path)
    assert any(i.action == "restore" and i.state != "completed" for i in t.timeline())
    t.savepoint(b)
    upsert(t, 7)
    assert ids(t) == [1, 7]
    assert not any(i.action == "savepoint" and i.time == b for i in t.timeline())
    assert all(i.state == "completed" for i in t.timeline() if i.action == "restore")
