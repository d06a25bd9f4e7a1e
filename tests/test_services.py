"""Table services: rollback of a completed commit, savepoint and restore, clean, and the console
script that runs them; each checked by the rows read afterwards and the files left on disk."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import oxlake
import pytest
from conftest import SCHEMA, data_files, hudi_read, rows, trips


@pytest.fixture(params=["copy_on_write", "merge_on_read"])
def t(request: pytest.FixtureRequest, table_path: str) -> oxlake.Table:
    return oxlake.create_table(
        table_path,
        SCHEMA,
        record_key="id",
        partition_by=["city"],
        ordering_field="ts",
        table_type=request.param,
    )


def test_rollback_of_the_latest_commit(t: oxlake.Table) -> None:
    t.insert(trips(list(range(10))))
    before_files = data_files(t)
    before = rows(t.scan())
    last = t.upsert(trips([1, 2, 20], ts=2, name="u"))
    t.rollback(last.instant)
    assert rows(t.scan()) == before
    assert data_files(t) == before_files
    completed = [i.time for i in t.timeline() if i.state == "completed" and i.action != "rollback"]
    assert last.instant not in completed
    assert rows(hudi_read(t.uri)) == before
    # Only the latest commit can be rolled back.
    first = completed[0]
    t.upsert(trips([3], ts=3))
    with pytest.raises(oxlake.InvalidArgumentError):
        t.rollback(first)


def test_savepoint_and_restore(t: oxlake.Table) -> None:
    a = t.insert(trips(list(range(8))))
    t.upsert(trips([1], ts=2, name="b"))
    keep = rows(t.scan())
    sp = t.timeline()[-1].time
    t.savepoint(sp)
    t.upsert(trips([2, 30], ts=3, name="c"))
    t.delete(trips([3]).select(["id", "city"]))
    t.restore(sp)
    assert rows(t.scan()) == keep
    assert rows(hudi_read(t.uri)) == keep
    assert [i.time for i in t.timeline() if i.action == "savepoint"] == [sp]
    assert any(i.action == "restore" and i.state == "completed" for i in t.timeline())
    # The table takes writes again, and time travel before the savepoint still works.
    t.upsert(trips([4], ts=4, name="d"))
    assert {r["id"]: r["name"] for r in rows(t.scan())}[4] == "d4"
    assert rows(t.to_arrow(as_of=a.instant)) == rows(trips(list(range(8))))
    with pytest.raises(oxlake.InvalidArgumentError):
        t.restore(a.instant)  # not a savepoint


def test_clean_keeps_what_retained_commits_and_savepoints_read(t: oxlake.Table) -> None:
    a = t.insert(trips(list(range(6)), city="sf"))
    t.savepoint(a.instant)
    t.upsert(trips([1], ts=2, name="b", city="sf"))
    if t.properties["hoodie.table.type"] == "MERGE_ON_READ":
        t.compact()
    c = t.upsert(trips([2], ts=3, name="c", city="sf"))
    if t.properties["hoodie.table.type"] == "MERGE_ON_READ":
        t.compact()
    d = t.upsert(trips([3], ts=4, name="d", city="sf"))
    commits = [
        i.time for i in t.timeline() if i.state == "completed" and i.action in ("commit", "deltacommit")
    ]
    snapshots = {i: rows(t.to_arrow(as_of=i)) for i in commits}
    # Compactions are commits too: merge-on-read keeps three to reach back to `c`.
    retain = 2 if t.properties["hoodie.table.type"] == "COPY_ON_WRITE" else 3
    deleted = t.clean(policy="keep_latest_commits", retain=retain)
    assert not any(Path(t.uri, f).exists() for f in deleted)
    for instant in [a.instant, *commits[-retain:]]:
        assert rows(t.to_arrow(as_of=instant)) == snapshots[instant]
    assert c.instant in commits[-retain:]
    assert rows(t.scan()) == snapshots[d.instant]
    assert t.clean(policy="keep_latest_commits", retain=retain) == []
    # Keeping one commit frees the older slices; the savepoint still reads.
    assert t.clean(policy="keep_latest_commits", retain=1)
    assert any(i.action == "clean" and i.state == "completed" for i in t.timeline())
    assert rows(t.scan()) == snapshots[d.instant]
    assert rows(t.to_arrow(as_of=a.instant)) == snapshots[a.instant]
    # What the clean removed can no longer be read, nor rolled back to: a typed error, not rows
    # missing. The savepoint stays readable.
    with pytest.raises(oxlake.InvalidArgumentError, match="no longer readable"):
        t.to_arrow(as_of=c.instant)
    with pytest.raises(oxlake.InvalidArgumentError, match="no longer readable"):
        t.to_arrow(query="incremental", start=a.instant, end=c.instant)
    with pytest.raises(oxlake.InvalidArgumentError, match="no longer readable"):
        t.to_arrow(query="changes", start=c.instant)
    if t.properties["hoodie.table.type"] == "MERGE_ON_READ":
        # Back to the compaction before `d`, which the clean kept; not further.
        t.rollback(d.instant)
        assert rows(t.scan()) == snapshots[c.instant]
        with pytest.raises(oxlake.InvalidArgumentError, match="no longer readable"):
            t.rollback(commits[-2])
        assert rows(t.scan()) == snapshots[c.instant]
    else:
        with pytest.raises(oxlake.InvalidArgumentError, match="no longer readable"):
            t.rollback(d.instant)
        assert rows(t.scan()) == snapshots[d.instant]
        assert [i.time for i in t.timeline() if i.action == "rollback"] == []
    # A restore to the savepoint works: the states between are not needed.
    t.restore(a.instant)
    assert rows(t.scan()) == snapshots[a.instant]


def test_clean_keep_latest_file_versions(table_path: str) -> None:
    t = oxlake.create_table(table_path, SCHEMA, record_key="id", ordering_field="ts")
    for ts in range(4):
        t.upsert(trips([1, 2], ts=ts))
    assert len(data_files(t)) == 4
    deleted = t.clean(policy="keep_latest_file_versions", retain=2)
    assert len(deleted) == 2 and len(data_files(t)) == 2
    assert rows(t.scan()) == rows(trips([1, 2], ts=3))
    with pytest.raises(oxlake.InvalidArgumentError):
        t.clean(policy="keep_nothing")


def test_console_script_runs_the_services(table_path: str) -> None:
    t = oxlake.create_table(
        table_path, SCHEMA, record_key="id", ordering_field="ts", table_type="merge_on_read"
    )
    t.insert(trips(list(range(5))))
    last = t.upsert(trips([1], ts=2, name="u"))

    def cli(*args: str) -> str:
        out = subprocess.run(
            [sys.executable, "-m", "oxlake.cli", *args], capture_output=True, text=True, env=os.environ
        )
        assert out.returncode == 0, out.stderr
        return out.stdout.strip()

    assert cli("savepoint", table_path, last.instant).startswith(f"savepoint: {last.instant} savepointed")
    assert cli("compact", table_path).startswith("compact: 1 file groups, 5 records")
    assert cli("clean", table_path, "--retain", "1").startswith("clean: ")
    assert cli("restore", table_path, last.instant).startswith(f"restore: table restored to {last.instant}")
    assert {r["id"]: r["name"] for r in rows(t.scan())}[1] == "u1"
    bad = subprocess.run(
        [sys.executable, "-m", "oxlake.cli", "rollback", table_path, "20000101000000000"],
        capture_output=True,
        text=True,
    )
    assert bad.returncode == 1 and "InvalidArgumentError" in bad.stderr


#: The heartbeat interval of the processes killed below (seconds).
BEAT = 0.2


@pytest.mark.parametrize(
    "point", ["rollback-after-uncommit", "rollback-after-inflight", "rollback-after-delete"]
)
def test_a_crashed_rollback_is_finished_by_the_next_writer(table_path: str, point: str) -> None:
    t = oxlake.create_table(
        table_path, SCHEMA, record_key="id", ordering_field="ts", table_type="merge_on_read"
    )
    t.insert(trips(list(range(5))))
    before = rows(t.scan())
    last = t.upsert(trips([1, 9], ts=2, name="u"))
    code = f"import oxlake, sys; oxlake.Table(sys.argv[1], heartbeat_interval={BEAT}).rollback(sys.argv[2])"
    proc = subprocess.run(
        [sys.executable, "-c", code, table_path, last.instant],
        env={**os.environ, "OXLAKE_FAILPOINT": point},
        capture_output=True,
    )
    assert proc.returncode != 0
    # Readers already see the table without the rolled-back commit.
    assert rows(oxlake.Table(table_path).scan()) == before
    # The rollback beat like a write: the next writer finishes it once its heartbeat expired.
    time.sleep(BEAT * 4)
    t2 = oxlake.Table(table_path, heartbeat_interval=BEAT)
    t2.upsert(trips([2], ts=3, name="v"))
    expected = {r["id"]: r for r in before}
    expected[2] = {**expected[2], "name": "v2", "ts": 3}
    assert rows(t2.scan()) == sorted(expected.values(), key=lambda r: r["id"])
    assert not [i for i in t2.timeline() if i.state != "completed"]


def test_a_crashed_clean_is_finished_by_the_next_clean(table_path: str) -> None:
    t = oxlake.create_table(table_path, SCHEMA, record_key="id", ordering_field="ts")
    for ts in range(3):
        t.upsert(trips([1, 2], ts=ts))
    code = f"import oxlake, sys; oxlake.Table(sys.argv[1], heartbeat_interval={BEAT}).clean(retain=1)"
    proc = subprocess.run(
        [sys.executable, "-c", code, table_path],
        env={**os.environ, "OXLAKE_FAILPOINT": "clean-after-delete"},
        capture_output=True,
    )
    assert proc.returncode != 0
    assert rows(t.scan()) == rows(trips([1, 2], ts=2))
    # A clean whose cleaner is alive is left to it; this one's heartbeat expires.
    assert oxlake.Table(table_path, heartbeat_interval=BEAT).clean(retain=1) == []
    time.sleep(BEAT * 4)
    t = oxlake.Table(table_path, heartbeat_interval=BEAT)
    t.clean(retain=1)
    assert [i.state for i in t.timeline() if i.action == "clean"] == ["completed"]
    assert len(data_files(t)) == 1


def test_a_crashed_restore_is_finished_by_the_next_writer(t: oxlake.Table) -> None:
    a = t.insert(trips(list(range(6))))
    t.savepoint(a.instant)
    saved = rows(t.scan())
    b = t.upsert(trips([1, 7], ts=2, name="b"))
    t.upsert(trips([2], ts=3, name="c"))
    after_b = rows(t.to_arrow(as_of=b.instant))
    code = "import oxlake, sys; oxlake.Table(sys.argv[1]).restore(sys.argv[2])"
    proc = subprocess.run(
        [sys.executable, "-c", code, t.uri, a.instant],
        env={**os.environ, "OXLAKE_FAILPOINT": "restore-after-rollback"},
        capture_output=True,
    )
    assert proc.returncode != 0
    # Killed after rolling back the newest commit: readers see the table as of `b`, a committed state.
    reader = oxlake.Table(t.uri)
    assert rows(reader.scan()) == after_b
    assert [i.state for i in reader.timeline() if i.action == "restore"] == ["inflight"]
    # The next writer finishes the restore first, then writes.
    w = reader.upsert(trips([3], ts=4, name="w"))
    expected = {r["id"]: r for r in saved}
    expected[3] = {**expected[3], "name": "w3", "ts": 4}
    assert rows(reader.scan()) == sorted(expected.values(), key=lambda r: r["id"])
    assert [i.state for i in reader.timeline() if i.action == "restore"] == ["completed"]
    data = [i.time for i in reader.timeline() if i.action in ("commit", "deltacommit")]
    assert data == [a.instant, w.instant]
    assert rows(hudi_read(t.uri)) == rows(reader.scan())


def test_a_crashed_savepoint_leaves_no_savepoint(t: oxlake.Table) -> None:
    a = t.insert(trips(list(range(3))))
    code = "import oxlake, sys; oxlake.Table(sys.argv[1]).savepoint(sys.argv[2])"
    proc = subprocess.run(
        [sys.executable, "-c", code, t.uri, a.instant],
        env={**os.environ, "OXLAKE_FAILPOINT": "savepoint-after-inflight"},
        capture_output=True,
    )
    assert proc.returncode != 0
    again = oxlake.Table(t.uri)
    assert rows(again.scan()) == rows(trips(list(range(3))))
    with pytest.raises(oxlake.InvalidArgumentError, match="not a savepoint"):
        again.restore(a.instant)
    again.savepoint(a.instant)  # the savepoint can be taken again
    again.upsert(trips([1], ts=2, name="u"))
    again.restore(a.instant)
    assert rows(again.scan()) == rows(trips(list(range(3))))


def test_progress_counts_the_work_of_each_service(table_path: str) -> None:
    from oxlake.cli import _Progress

    t = oxlake.create_table(
        table_path,
        SCHEMA,
        record_key="id",
        partition_by=["city"],
        ordering_field="ts",
        table_type="merge_on_read",
    )
    t.insert(trips(list(range(9))))
    t.upsert(trips([1, 2, 3], ts=2, name="u"))
    p = oxlake.Progress()
    assert (p.done, p.total, p.unit) == (0, 0, "")
    r = t.compact(progress=p)
    assert (p.done, p.total, p.unit) == (r.file_groups, r.file_groups, "file groups") and r.file_groups == 3
    p = oxlake.Progress()
    deleted = t.clean(retain=1, progress=p)
    assert (p.done, p.total, p.unit) == (len(deleted), len(deleted), "files") and deleted
    t.insert(trips([10, 11, 12]), target_file_size=1)
    p = oxlake.Progress()
    c = t.cluster(progress=p)
    assert (p.done, p.total) == (
        c.replaced_file_groups,
        c.replaced_file_groups,
    ) and c.replaced_file_groups == 6
    # The console script's bar, drawn from a progress.
    bar = _Progress("cluster")
    assert bar.line(0).startswith("| cluster")
    bar.native = p
    assert bar.line(0).startswith("cluster [" + "#" * _Progress.WIDTH + "] 6/6 file groups")


@pytest.mark.parametrize("version", [6, 8])
def test_writes_clean_inline_when_the_table_says_so(table_path: str, version: int) -> None:
    """`set_cleaning` (Apache Hudi's `hoodie.clean.automatic`): every write cleans once enough
    commits landed, so a table written again and again keeps a bounded number of files; reads of
    the retained commits stay, and Apache Hudi's readers (hudi-rs) read the cleaned table."""
    t = oxlake.create_table(table_path, SCHEMA, record_key="id", ordering_field="ts", table_version=version)
    t.build_metadata()
    with pytest.raises(oxlake.InvalidArgumentError):
        t.set_cleaning(0)
    t.set_cleaning(2)
    props = (Path(table_path) / ".hoodie" / "hoodie.properties").read_text()
    for line in (
        "hoodie.clean.automatic=true",
        "hoodie.cleaner.policy=KEEP_LATEST_COMMITS",
        "hoodie.cleaner.commits.retained=2",
        "hoodie.clean.max.commits=1",
    ):
        assert line in props
    written = [t.upsert(trips([1, 2], ts=ts)) for ts in range(8)]
    cleans = [i for i in t.timeline() if i.action == "clean" and i.state == "completed"]
    assert len(cleans) >= 5, "a clean after each write once there was something to delete"
    assert len(data_files(t)) <= 3, "the slices of the two retained commits (and the latest)"
    assert rows(t.scan()) == rows(trips([1, 2], ts=7))
    assert rows(t.to_arrow(as_of=written[-2].instant)) == rows(trips([1, 2], ts=6))
    assert rows(hudi_read(table_path)) == rows(trips([1, 2], ts=7))
    assert oxlake.Table(table_path).validate().ok

    # Every third commit, keeping file versions: cleans come less often.
    t.set_cleaning(1, policy="keep_latest_file_versions", every=3)
    before = len([i for i in t.timeline() if i.action == "clean"])
    for ts in range(8, 14):
        t.upsert(trips([1, 2], ts=ts))
    assert len([i for i in t.timeline() if i.action == "clean"]) - before == 2
    assert len(data_files(t)) <= 3

    # Off: files pile up again.
    t.set_cleaning(None)
    assert "hoodie.clean.automatic=false" in (Path(table_path) / ".hoodie/hoodie.properties").read_text()
    count = len(data_files(t))
    for ts in range(14, 17):
        t.upsert(trips([1, 2], ts=ts))
    assert len(data_files(t)) == count + 3


def test_a_bad_cleaning_property_never_fails_a_write(table_path: str) -> None:
    """A write lands whatever the cleaning properties say: an unparsable one is logged and
    skipped (the table's other writers may be Apache Hudi's, with its own options)."""
    t = oxlake.create_table(table_path, SCHEMA, record_key="id", ordering_field="ts")
    t.set_cleaning(2)
    props = Path(table_path) / ".hoodie" / "hoodie.properties"
    props.write_text(
        props.read_text().replace("hoodie.cleaner.commits.retained=2", "hoodie.cleaner.commits.retained=two")
    )
    t = oxlake.Table(table_path)
    for ts in range(4):
        t.upsert(trips([1], ts=ts))
    assert rows(t.scan()) == rows(trips([1], ts=3))
    assert not [i for i in t.timeline() if i.action == "clean"]
