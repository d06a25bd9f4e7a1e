"""Restores and rollbacks beside the metadata table, and savepoints several at a time (issue 71,
defects 1 and 2): a restore far back, past the metadata table's compactions, keeps every later
file in the `files` index; a restore past a newer savepoint is refused before anything is
touched; savepoints can be deleted; a restore left pending across a savepoint is finished; a
write that read a commit a rollback or restore undoes never brings its rows back."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

import oxlake
import pyarrow as pa
import pytest
from conftest import paused

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


# An upsert of key 0 (its file group also holds key 2), run in another process.
UPSERT_ZERO = (
    "import oxlake, pyarrow as pa, sys\n"
    "s = pa.schema([pa.field('id', pa.int64(), nullable=False), pa.field('ts', pa.int64())])\n"
    "try:\n"
    "    oxlake.Table(sys.argv[1]).upsert(pa.table({'id': [0], 'ts': [5]}, schema=s))\n"
    "    print('landed')\n"
    "except oxlake.CommitConflictError as e:\n"
    "    print('conflict', e)\n"
)


def rows_by_id(t: oxlake.Table) -> dict[int, int]:
    got = t.to_arrow(columns=["id", "ts"]).to_pylist()
    return {r["id"]: r["ts"] for r in got}


@pytest.mark.parametrize("version", [6, 8])
@pytest.mark.parametrize("undo", ["rollback", "restore"])
def test_a_write_held_before_its_check_fails_beside_an_undo_of_what_it_read(
    tmp_path: Path, version: int, undo: str
) -> None:
    """A copy-on-write upsert that read commit b (key 2 updated) rewrites b's file group: held
    before its conflict check while b is rolled back (or restored past), it conflicts; landing,
    its base file would bring b's row back."""
    path = str(tmp_path / "t")
    t = keyed_table(path, "copy_on_write", version)
    a = t.upsert(pa.table({"id": [0, 2], "ts": [0, 0]}, schema=SCHEMA)).instant
    t.savepoint(a)
    b = upsert(t, 2, ts=1)
    (tmp_path / "held").mkdir()
    with paused(path, "before-commit", UPSERT_ZERO, tmp_path / "held") as held:
        if undo == "rollback":
            oxlake.Table(path).rollback(b)
        else:
            oxlake.Table(path).restore(a)
    assert held.returncode == 0, held.err
    assert held.out.startswith("conflict") and f"the commit {b}, which this write read" in held.out, held.out
    t = oxlake.Table(path)
    assert rows_by_id(t) == {0: 0, 2: 0}
    assert t.validate().ok


@pytest.mark.parametrize("version", [6, 8])
@pytest.mark.parametrize("undo", ["rollback", "restore"])
def test_an_undo_waits_for_a_write_past_its_check(tmp_path: Path, version: int, undo: str) -> None:
    """The other order: the upsert passed its conflict check before the rollback or restore was on
    the timeline, and is about to complete. The undo waits for it; then a rollback of b is refused
    (b is no longer the latest commit) and a restore takes the upsert back too."""
    path = str(tmp_path / "t")
    t = keyed_table(path, "copy_on_write", version)
    a = t.upsert(pa.table({"id": [0, 2], "ts": [0, 0]}, schema=SCHEMA)).instant
    t.savepoint(a)
    b = upsert(t, 2, ts=1)
    outcome: list[object] = []

    def run_undo() -> None:
        try:
            t = oxlake.Table(path)
            outcome.append(t.rollback(b) if undo == "rollback" else t.restore(a))
        except oxlake.OxlakeError as e:
            outcome.append(e)

    (tmp_path / "held").mkdir()
    with paused(path, "after-metadata-sync", UPSERT_ZERO, tmp_path / "held") as held:
        undoer = threading.Thread(target=run_undo)
        undoer.start()
        undoer.join(timeout=3)
        assert undoer.is_alive(), f"the {undo} did not wait for the write completing: {outcome}"
    undoer.join(timeout=120)
    assert held.out.startswith("landed"), (held.out, held.err)
    t = oxlake.Table(path)
    if undo == "rollback":
        assert isinstance(outcome[0], oxlake.InvalidArgumentError), outcome
        assert "no longer the latest" in str(outcome[0])
        assert rows_by_id(t) == {0: 5, 2: 1}
    else:
        assert isinstance(outcome[0], str), outcome
        assert rows_by_id(t) == {0: 0, 2: 0}
    assert t.validate().ok
