"""Timeline archival (issue 23 item 3): the oldest instants move to `.hoodie/archived` as Apache
Hudi 0.14 archives them, every read as of or from an archived commit gives the rows it gave
before, Java's schemas decode the archive, and a crash at any step leaves a readable table."""

from __future__ import annotations

import io
import json
import os
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any

import fastavro
import oxlake
import pytest
from conftest import SCHEMA, hudi_avro_schema, hudi_read, rows, trips, trips_table


def archive_files(table_path: str) -> list[Path]:
    files = Path(table_path, ".hoodie", "archived").glob(".commits_.archive.*")
    return sorted(files, key=lambda p: int(p.name.split(".")[3].split("_")[0]))


def read_archive(path: Path, reader_schema: Any | None = None) -> list[dict[str, Any]]:
    """The records of an archive file, read as Apache Hudi's log reader does: each block's
    `SCHEMA` header is the writer schema (`HoodieAvroDataBlock`)."""
    data = path.read_bytes()
    out: list[dict[str, Any]] = []
    pos = 0
    while pos < len(data):
        assert data[pos : pos + 6] == b"#HUDI#", (path, pos)
        (length,) = struct.unpack(">q", data[pos + 6 : pos + 14])
        block = io.BytesIO(data[pos + 14 : pos + 14 + length])
        version, block_type = struct.unpack(">ii", block.read(8))
        assert (version, block_type) == (1, 3)  # log format 1, an Avro data block
        header = {}
        for _ in range(struct.unpack(">i", block.read(4))[0]):
            key, size = struct.unpack(">ii", block.read(8))
            header[key] = block.read(size).decode()
        assert set(header) == {2}  # SCHEMA only, as HoodieTimelineArchiver writes it
        writer = fastavro.parse_schema(json.loads(header[2]))
        (content_len,) = struct.unpack(">q", block.read(8))
        content = io.BytesIO(block.read(content_len))
        content_version, count = struct.unpack(">ii", content.read(8))
        assert content_version == 3
        for _ in range(count):
            (size,) = struct.unpack(">i", content.read(4))
            datum = io.BytesIO(content.read(size))
            out.append(fastavro.schemaless_reader(datum, writer, reader_schema))
        pos += 14 + length
    return out


def entry_reader() -> Any:
    """Apache Hudi's `HoodieArchivedMetaEntry.avsc` as the reader schema."""
    return hudi_avro_schema("HoodieArchivedMetaEntry")


def commits(t: oxlake.Table, *, archived: bool = False) -> list[str]:
    return [
        i.time
        for i in t.timeline(include_archived=archived)
        if i.state == "completed" and i.action in ("commit", "deltacommit", "replacecommit")
    ]


def read_or_error(t: oxlake.Table, **query: Any) -> Any:
    key = ("id", "_change_type") if query.get("query") == "changes" else ("id",)
    try:
        return rows(t.to_arrow(**query), key=key)
    except oxlake.OxlakeError as e:
        return type(e).__name__


def every_read(t: oxlake.Table, times: list[str]) -> dict[str, Any]:
    """Time travel to every commit, and the incremental window up to and from each one."""
    out: dict[str, Any] = {}
    previous = "0" * 17
    for time_ in times:
        out[f"as_of {time_}"] = read_or_error(t, as_of=time_)
        out[f"incremental {time_}"] = read_or_error(t, query="incremental", start=previous, end=time_)
        out[f"since {time_}"] = read_or_error(t, query="incremental", start=time_)
        previous = time_
    out["latest"] = rows(t.scan())
    out["incremental from the start"] = read_or_error(t, query="incremental")
    out["changes from the start"] = read_or_error(t, query="changes")
    return out


@pytest.mark.parametrize("table_type", ["copy_on_write", "merge_on_read"])
def test_archival_keeps_every_read_as_it_was(table_path: str, table_type: str) -> None:
    t = trips_table(table_path, table_type=table_type, table_version=6)
    t.set_archival(4, 6, inline=False)
    t.insert(trips(list(range(12))))
    for n in range(1, 40):
        if n % 9 == 0:
            t.delete(trips([n % 12]))
        else:
            t.upsert(trips([n % 12, (n * 5) % 12, 20 + n], ts=n + 1, name=f"v{n}"))
        if table_type == "merge_on_read" and n % 4 == 0:
            t.compact()
        if n == 13:
            t.rollback(commits(t)[-1])
        if n == 30:
            t.clean(retain=12)
    times = commits(t)
    before = every_read(t, times)
    hudi_before = rows(hudi_read(table_path))
    archived = t.archive()
    assert archived, "more than 6 commits and nothing holds them"
    active = commits(t)
    assert len(active) < len(times)
    assert commits(t, archived=True) == times
    assert [i for i in t.timeline(include_archived=True) if i.state == "completed"] == sorted(
        [i for i in t.timeline(include_archived=True) if i.state == "completed"]
    )
    assert all(a.time < active[0] for a in archived)
    # One rollback and one clean: each action is archived only past max_commits of its own.
    assert [i.action for i in t.timeline() if i.action in ("rollback", "clean")] == ["rollback", "clean"]
    # Nothing of the archived instants stays on the active timeline.
    names = {p.name.split(".")[0] for p in Path(table_path, ".hoodie").iterdir() if p.is_file()}
    assert not names & {a.time for a in archived}
    after = every_read(oxlake.Table(table_path), times)
    assert after == before
    assert rows(hudi_read(table_path)) == hudi_before
    # Archiving again archives nothing more; a new commit reads as before.
    assert t.archive() == []
    t.upsert(trips([1], ts=1000, name="last"))
    assert rows(t.to_arrow(as_of=times[-1])) == before[f"as_of {times[-1]}"]


def test_the_archive_decodes_with_apache_hudis_schema(table_path: str) -> None:
    t = trips_table(table_path, metadata=False, table_version=6)
    t.set_archival(2, 3, inline=False)
    for n in range(8):
        t.upsert(trips([n, n + 1], ts=n))
    t.clean(retain=2)
    times = commits(t)
    archived = t.archive()
    [path] = archive_files(table_path)
    assert path.name == ".commits_.archive.1_1-0-1"
    entries = read_archive(path, entry_reader())
    by_time: dict[str, list[dict[str, Any]]] = {}
    for e in entries:
        by_time.setdefault(e["commitTime"], []).append(e)
    assert sorted(by_time) == sorted(a.time for a in archived)
    for a in archived:
        states = [e["actionState"] for e in by_time[a.time]]
        assert states == ["REQUESTED", "INFLIGHT", "COMPLETED"], a
        assert {e["actionType"] for e in by_time[a.time]} == {a.action}
        done = by_time[a.time][-1]
        meta = done["hoodieCommitMetadata"]
        assert meta["operationType"] == "UPSERT"
        assert meta["extraMetadata"]["ROLLING_STAT"] == ""
        stats = [s for v in meta["partitionToWriteStats"].values() for s in v]
        assert stats and all(Path(table_path, s["path"]).name.endswith(".parquet") for s in stats)
    assert times[: len(archived)] == [a.time for a in archived]
    # A second archival writes the next version, as Java does on a store without append.
    for n in range(8, 12):
        t.upsert(trips([n], ts=n))
    assert t.archive() == [], "the latest clean retains these commits"
    t.clean(retain=2)
    assert t.archive()
    assert [p.name for p in archive_files(table_path)] == [
        ".commits_.archive.1_1-0-1",
        ".commits_.archive.2_1-0-1",
    ]
    assert commits(t, archived=True) == commits(oxlake.Table(table_path), archived=True)


def test_commits_archive_inline_and_stop_at_what_must_stay(table_path: str) -> None:
    t = oxlake.create_table(
        table_path,
        SCHEMA,
        record_key="id",
        ordering_field="ts",
        table_type="merge_on_read",
        table_version=6,
        metadata=False,
    )
    t.set_archival(3, 5)
    t.insert(trips(list(range(4))))
    for n in range(12):
        t.upsert(trips([n % 4], ts=n + 1))
    # Merge-on-read: the latest five deltacommits since the latest compaction stay (what the next
    # inline compaction counts), older ones go although no compaction folded them in.
    assert len(commits(t)) == 5
    assert archive_files(table_path)
    t.compact()
    t.upsert(trips([0], ts=100))
    assert archive_files(table_path), "the commit after the compaction archives inline"
    assert len(commits(t)) <= 5
    # A savepoint holds everything from it on.
    saved = commits(t)[-1]
    t.savepoint(saved)
    for n in range(10):
        t.upsert(trips([1], ts=200 + n))
    t.compact()
    t.upsert(trips([2], ts=300))
    assert saved in commits(t)
    assert rows(t.to_arrow(as_of=saved)) == rows(oxlake.Table(table_path).to_arrow(as_of=saved))
    expected = rows(t.scan())
    assert rows(hudi_read(table_path)) == expected


def test_the_metadata_table_timeline_is_archived_too(table_path: str) -> None:
    t = trips_table(table_path, table_version=6)
    t.build_metadata()
    t.set_archival(3, 5, inline=False)
    for n in range(14):
        t.upsert(trips([n, n + 20], ts=n))
    expected = rows(t.scan())
    t.archive()
    assert archive_files(table_path)
    mdt = Path(table_path, ".hoodie", "oxlake", "metadata")
    assert archive_files(str(mdt)), "the metadata table archives its own timeline"
    report = t.validate()
    assert report.ok, report
    t = oxlake.Table(table_path)
    assert rows(t.scan()) == expected
    t.upsert(trips([1], ts=99, name="after"))
    assert t.validate().ok
    assert rows(t.lookup(pa_keys([1])))[0]["name"] == "after1"


def pa_keys(ids: list[int]) -> Any:
    import pyarrow as pa

    return pa.table({"id": pa.array(ids, pa.int64())})


@pytest.mark.parametrize("failpoint", ["archive-after-write", "archive-after-pending"])
def test_a_crash_while_archiving_leaves_every_read(table_path: str, failpoint: str) -> None:
    t = trips_table(table_path, metadata=False, table_version=6)
    t.set_archival(2, 4, inline=False)
    for n in range(9):
        t.upsert(trips([n, 10 + n], ts=n))
    times = commits(t)
    before = every_read(t, times)
    code = "import sys, oxlake; oxlake.Table(sys.argv[1]).archive()"
    env = dict(os.environ, OXLAKE_FAILPOINT=failpoint)
    proc = subprocess.run([sys.executable, "-c", code, table_path], env=env, capture_output=True, text=True)
    assert proc.returncode != 0, proc.stderr
    t = oxlake.Table(table_path)
    assert every_read(t, times) == before
    assert not [i for i in t.timeline() if i.state != "completed"], "no archived instant reads as pending"
    # The next archival finishes; instants archived twice read once.
    t.archive()
    assert commits(t, archived=True) == times
    assert every_read(oxlake.Table(table_path), times) == before


def test_a_pending_write_holds_archival_back(table_path: str, tmp_path: Path) -> None:
    from conftest import run_paused

    t = trips_table(table_path, metadata=False, table_version=6)
    t.set_archival(2, 3, inline=False)
    for n in range(8):
        t.upsert(trips([n], ts=n))
    code = (
        "import sys, oxlake; from conftest import trips; oxlake.Table(sys.argv[1]).upsert(trips([1], ts=99))"
    )
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).parent))
    proc = run_paused(table_path, "before-commit", code, tmp_path, env)
    try:
        assert t.archive() == [], "a write under way checks conflicts against recent commits"
    finally:
        (tmp_path / "resume").touch()
        assert proc.wait(timeout=60) == 0, proc.communicate()
    assert t.archive()


def test_rolling_back_the_oldest_active_commit_after_archival_is_refused(table_path: str) -> None:
    t = trips_table(table_path, metadata=False, table_version=6)
    t.set_archival(2, 3, inline=False)
    for n in range(8):
        t.upsert(trips([n], ts=n))
    assert t.archive()
    active = commits(t)
    expected = rows(t.to_arrow(as_of=active[0]))
    for time_ in reversed(active[1:]):
        t.rollback(time_)
    with pytest.raises(oxlake.InvalidArgumentError, match="archived"):
        t.rollback(active[0])
    assert rows(oxlake.Table(table_path).scan()) == expected
    assert rows(hudi_read(table_path)) == expected


def test_a_writer_slow_between_claiming_its_time_and_its_requested_file_is_never_archived_past(
    table_path: str, tmp_path: Path
) -> None:
    """The race inline archival must survive: a writer claims an instant time, then stalls
    before its requested file exists; meanwhile enough commits land for archival to move the
    timeline's start past that time. The writer must take a later time, never commit below
    the start of the active timeline (where its files would read as committed before it
    completes, and its commit would hide archived ones)."""
    from conftest import run_paused

    t = trips_table(table_path, metadata=False, table_version=6)
    t.set_archival(2, 3, inline=True)
    t.upsert(trips([0], ts=0))
    code = (
        "import sys, oxlake; from conftest import trips; "
        "oxlake.Table(sys.argv[1]).upsert(trips([1000], ts=99))"
    )
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).parent))
    proc = run_paused(table_path, "after-claim", code, tmp_path, env)
    try:
        for n in range(1, 9):
            t.upsert(trips([n], ts=n))
        assert commits(t, archived=True) != commits(t), "inline archival ran meanwhile"
    finally:
        (tmp_path / "resume").touch()
        out = proc.communicate(timeout=120)
        assert proc.returncode == 0, out
    t = oxlake.Table(table_path)
    archived = [c for c in commits(t, archived=True) if c not in commits(t)]
    last = commits(t)[-1]
    assert last > max(archived), "the slow writer committed after the archived instants"
    assert [r["id"] for r in rows(t.scan())] == [*range(9), 1000]
    assert [r["id"] for r in rows(hudi_read(table_path))] == [*range(9), 1000]
    assert all(i.state == "completed" for i in t.timeline()), "the abandoned time left nothing pending"


def test_a_writer_that_completes_while_an_archival_chooses_is_never_archived_around(
    table_path: str, tmp_path: Path
) -> None:
    """Found by the concurrency stress test: a writer that claimed its time long ago creates its
    requested file before the archival marks itself (so it sees no marker and goes on) and
    completes before the archival lists the timeline again. The archival must not delete the
    commits it chose around that one: left active after archived commits, the archived ones'
    files would read as uncommitted."""
    from conftest import run_paused

    t = trips_table(table_path, metadata=False, table_version=6)
    t.set_archival(2, 3, inline=False)
    t.upsert(trips([0], ts=0))
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).parent))
    write = (
        "import sys, oxlake; from conftest import trips; "
        "oxlake.Table(sys.argv[1]).upsert(trips([1000], ts=99))"
    )
    (tmp_path / "w").mkdir()
    (tmp_path / "a").mkdir()
    writer = run_paused(table_path, "after-claim", write, tmp_path / "w", env)
    try:
        for n in range(1, 9):
            t.upsert(trips([n], ts=n))
        archive = "import sys, oxlake; print(len(oxlake.Table(sys.argv[1]).archive()))"
        archiver = run_paused(table_path, "archive-before-mark", archive, tmp_path / "a", env)
        try:
            (tmp_path / "w" / "resume").touch()
            assert writer.wait(timeout=120) == 0, writer.communicate()
        finally:
            (tmp_path / "a" / "resume").touch()
            out = archiver.communicate(timeout=120)
            assert archiver.returncode == 0, out
    finally:
        (tmp_path / "w" / "resume").touch()
    expected = [*range(9), 1000]
    t = oxlake.Table(table_path)
    assert [r["id"] for r in rows(t.scan())] == expected
    t.archive()
    assert [r["id"] for r in rows(oxlake.Table(table_path).scan())] == expected
    assert [r["id"] for r in rows(hudi_read(table_path))] == expected


@pytest.mark.parametrize("version", [6, 8])
def test_a_merge_on_read_stream_without_compactions_archives(table_path: str, version: int) -> None:
    """A stream that never compacts (inserts write no log; or compaction runs elsewhere) kept
    every deltacommit active, so its timeline grew with every commit. Archived deltacommits whose
    logs no compaction folded in yet read as before: snapshots, time travel, windows, hudi-rs."""
    t = trips_table(table_path, metadata=False, table_type="merge_on_read", table_version=version)
    t.set_archival(3, 5, inline=False)
    t.insert(trips(list(range(6))))
    for n in range(1, 16):
        t.upsert(trips([n % 6, 10 + n], ts=n + 1, name=f"v{n}"))  # one update (a log), one insert
    times = commits(t)
    before = every_read(t, times)
    hudi_before = rows(hudi_read(table_path))
    archived = t.archive()
    assert archived and len(commits(t)) == 5
    assert commits(t, archived=True) == times
    assert every_read(oxlake.Table(table_path), times) == before
    assert rows(hudi_read(table_path)) == hudi_before
    # The logs of archived deltacommits are compacted like any other.
    t.compact()
    assert rows(t.scan()) == before["latest"]
    assert rows(t.to_arrow(query="read_optimized")) == before["latest"]
