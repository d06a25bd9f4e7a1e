"""Damaged files: every kind of table file truncated, emptied and garbled. Each read, write,
table service and `validate` gives a typed error naming the file, or the correct rows; never the
stale rows of an older commit, never a hang (issue 22, items 6 and 7)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import oxlake
import pyarrow as pa
import pytest
from conftest import SCHEMA, rows, trips

# The rows of the table `damaged_table` builds: 1 updated, 2 deleted, 3 as inserted.
EXPECTED = {1: "u1", 3: "n3"}


def truncate(p: Path) -> None:
    data = p.read_bytes()
    p.write_bytes(data[: len(data) // 2])


def empty(p: Path) -> None:
    p.write_bytes(b"")


def garble(p: Path) -> None:
    """Flips bytes of the first quarter (magic, lengths, header or footer)."""
    data = bytearray(p.read_bytes())
    if len(data) < 8:  # an empty marker file: garbage instead
        p.write_bytes(b"\x00#garbled\xff")
        return
    for i in range(4, max(5, len(data) // 4), 7):
        data[i] ^= 0x5A
    p.write_bytes(bytes(data))


def garble_tail(p: Path) -> None:
    """Flips bytes of the last quarter (a Parquet footer, a log block's content and footer)."""
    data = bytearray(p.read_bytes())
    for i in range(len(data) * 3 // 4, len(data) - 1, 5):
        data[i] ^= 0x5A
    p.write_bytes(bytes(data))


DAMAGES: dict[str, Callable[[Path], None]] = {
    "truncated": truncate,
    "emptied": empty,
    "garbled": garble,
    "garbled-tail": garble_tail,
}


def damaged_table(path: str, table_type: str = "merge_on_read", metadata: bool = False) -> oxlake.Table:
    """A table to damage. Without a metadata table by default: planning lists storage, and the
    damage is found against what the timeline says was written."""
    t = oxlake.create_table(
        path,
        SCHEMA,
        record_key="id",
        ordering_field="ts",
        table_type=table_type,
        table_version=6,
        metadata=metadata,
    )
    t.insert(trips([1, 2, 3], city="sf"))
    t.upsert(trips([1], ts=2, name="u", city="sf"))
    t.delete(trips([2], ts=3, city="sf"))
    return t


def log_files(t: oxlake.Table) -> list[Path]:
    return sorted(p for p in Path(t.uri).glob(".*.log.*"))


def base_files(t: oxlake.Table) -> list[Path]:
    return sorted(Path(t.uri).glob("*.parquet"))


def names(t: oxlake.Table) -> dict[int, str]:
    got = rows(t.scan())
    ids = [r["id"] for r in got]
    assert len(ids) == len(set(ids)), f"a key twice: {sorted(ids)}"  # a write routed it wrongly
    return {r["id"]: r["name"] for r in got}


def typed_or_correct(t: oxlake.Table, damaged: Path) -> None:
    """A read gives the correct rows or a typed error naming the damaged file."""
    try:
        got = names(oxlake.Table(t.uri))
    except oxlake.OxlakeError as e:
        assert damaged.name in str(e), str(e)
        return
    assert got == EXPECTED


def assert_names(e: pytest.ExceptionInfo[BaseException], path: Path) -> None:
    assert path.name in str(e.value), str(e.value)


# -- log files ------------------------------------------------------------------------------


@pytest.mark.parametrize("damage", DAMAGES)
@pytest.mark.parametrize("which", ["first", "last"])
def test_a_damaged_committed_log_is_an_error_for_reads_and_services(
    table_path: str, damage: str, which: str
) -> None:
    t = damaged_table(table_path)
    assert names(t) == EXPECTED
    first, last = log_files(t)
    target = first if which == "first" else last
    DAMAGES[damage](target)
    t = oxlake.Table(table_path)
    # Never the older values (the update undone) or the deleted row back.
    with pytest.raises(oxlake.CorruptTableError) as e:
        t.to_arrow()
    assert_names(e, target)
    with pytest.raises(oxlake.CorruptTableError) as e:
        list(t.scan())
    assert_names(e, target)
    # Compaction and clustering never write what they could not read.
    with pytest.raises(oxlake.CorruptTableError) as e:
        t.compact()
    assert_names(e, target)
    try:
        clustered = t.cluster()
    except oxlake.CorruptTableError as err:
        assert target.name in str(err), str(err)
    else:
        assert clustered.instant is None  # nothing worth rewriting: nothing read
    t = oxlake.Table(table_path)
    assert not any(i.action in ("commit", "compaction") and i.state == "completed" for i in t.timeline())
    with pytest.raises(oxlake.CorruptTableError):
        t.to_arrow()


def test_a_deleted_committed_log_is_an_error(table_path: str) -> None:
    t = damaged_table(table_path)
    last = log_files(t)[-1]
    last.unlink()
    with pytest.raises(oxlake.CorruptTableError) as e:
        oxlake.Table(table_path).to_arrow()
    assert_names(e, last)


@pytest.mark.parametrize("kind", ["log", "base"])
def test_a_deleted_committed_file_the_files_index_names_is_an_error(table_path: str, kind: str) -> None:
    """Planning from the files index offers the file; reading it finds it gone: an error naming
    it (a storage `NotFound`, as when a clean removes it under a read), never a read without it."""
    t = damaged_table(table_path, metadata=True)
    assert t.validate().ok
    gone = (log_files(t) if kind == "log" else base_files(t))[-1]
    gone.unlink()
    with pytest.raises(oxlake.OxlakeError) as e:
        oxlake.Table(table_path).to_arrow()
    assert_names(e, gone)
    assert not oxlake.Table(table_path).validate().ok


def test_a_torn_tail_of_an_uncommitted_writer_is_skipped(table_path: str) -> None:
    t = damaged_table(table_path)
    last = log_files(t)[-1]
    # Bytes past what the completed instants wrote: a writer that crashed mid-append.
    last.write_bytes(last.read_bytes() + b"#HUDI#\x00\x00\x00\x00\x00\x00\x10\x00garbage")
    assert names(oxlake.Table(table_path)) == EXPECTED
    # An uncommitted writer's whole log file, damaged: skipped too.
    stray = last.with_name(last.name.replace(".log.", ".log.9"))
    stray.write_bytes(b"#HUDI#\x00\x00")
    assert names(oxlake.Table(table_path)) == EXPECTED
    assert oxlake.Table(table_path).compact().instants
    assert names(oxlake.Table(table_path)) == EXPECTED


@pytest.mark.parametrize("consumer", ["pyarrow", "iter", "pandas", "c-stream"])
def test_scan_errors_are_oxlake_errors_for_every_consumer(table_path: str, consumer: str) -> None:
    t = damaged_table(table_path)
    last = log_files(t)[-1]
    truncate(last)
    scan = oxlake.Table(table_path).scan()
    if consumer == "pyarrow":
        with pytest.raises(oxlake.CorruptTableError) as e:
            scan.to_arrow()
    elif consumer == "iter":
        with pytest.raises(oxlake.CorruptTableError) as e:
            list(scan)
    elif consumer == "pandas":
        with pytest.raises(oxlake.CorruptTableError) as e:
            scan.to_pandas()
    else:
        # Consumers of the C stream see the error's class and file in the message.
        with pytest.raises(Exception) as e:
            pa.RecordBatchReader.from_stream(scan._native).read_all()
        assert "[oxlake.CorruptTableError]" in str(e.value)
    assert_names(e, last)


# -- base files -----------------------------------------------------------------------------


@pytest.mark.parametrize("damage", DAMAGES)
@pytest.mark.parametrize("table_type", ["copy_on_write", "merge_on_read"])
def test_a_damaged_base_file_is_an_error_naming_it(table_path: str, damage: str, table_type: str) -> None:
    t = damaged_table(table_path, table_type)
    assert names(t) == EXPECTED
    base = base_files(t)[-1]
    DAMAGES[damage](base)
    t = oxlake.Table(table_path)
    with pytest.raises((oxlake.CorruptTableError, oxlake.StorageError)) as e:
        t.to_arrow()
    assert_names(e, base)
    with pytest.raises(oxlake.OxlakeError) as e:
        t.upsert(trips([3], ts=5, name="w", city="sf"))
        t.to_arrow()
    assert_names(e, base)


def test_a_missing_base_file_is_a_storage_error_naming_it(table_path: str) -> None:
    t = damaged_table(table_path, "copy_on_write")
    base = base_files(t)[-1]
    base.unlink()
    with pytest.raises((oxlake.StorageError, oxlake.CorruptTableError)) as e:
        oxlake.Table(table_path).to_arrow()
    assert_names(e, base)


# -- timeline files -------------------------------------------------------------------------


def timeline_files(t: oxlake.Table, suffix: str) -> list[Path]:
    return sorted(p for p in (Path(t.uri) / ".hoodie").iterdir() if p.name.endswith(suffix))


#: Every kind of timeline file the table `timeline_template` builds holds.
TIMELINE_KINDS = [
    f"{action}{state}"
    for action in (".deltacommit", ".commit", ".compaction", ".clean", ".rollback", ".replacecommit")
    for state in (".requested", ".inflight", "")
    if f"{action}{state}" not in (".compaction", ".commit.requested", ".commit.inflight")
]


@pytest.fixture(scope="module")
def timeline_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A merge-on-read table whose timeline holds every kind of instant file, built once."""
    path = str(tmp_path_factory.mktemp("timeline") / "t")
    t = damaged_table(path)
    t.compact()  # .compaction.requested/.inflight, .commit
    t.upsert(trips([3], ts=4, name="x", city="sf"))
    crash(path, "upsert(__import__('conftest').trips([9], ts=9, city='sf'))", "after-inflight")
    time.sleep(BEAT * 4)
    assert oxlake.Table(path, heartbeat_interval=BEAT).rollback_failed()  # .rollback.*
    assert oxlake.Table(path).cluster(small_file_limit=1 << 30).instant  # .replacecommit.*
    t = oxlake.Table(path)
    t.upsert(trips([3], ts=4, name="x", city="sf"))
    assert t.clean(retain=1)  # .clean.*
    assert names(oxlake.Table(path)) == TIMELINE_ROWS
    return Path(path)


TIMELINE_ROWS = {1: "u1", 3: "x3"}


@pytest.mark.parametrize("damage", DAMAGES)
@pytest.mark.parametrize("suffix", TIMELINE_KINDS)
def test_damaged_timeline_files_give_correct_rows_or_an_error(
    timeline_template: Path, table_path: str, damage: str, suffix: str
) -> None:
    shutil.copytree(timeline_template, table_path)
    t = oxlake.Table(table_path)
    expected = dict(TIMELINE_ROWS)
    files = timeline_files(t, suffix)
    assert files, suffix
    target = files[-1]
    DAMAGES[damage](target)
    for action in ("read", "write", "compact", "clean", "cluster", "rollback_failed"):
        try:
            t = oxlake.Table(table_path, heartbeat_interval=BEAT)
            if action == "write":
                t.upsert(trips([5], ts=5, name="y", city="sf"))
                expected = {**expected, 5: "y5"}
            elif action == "compact":
                t.compact()
            elif action == "clean":
                t.clean(retain=1)
            elif action == "cluster":
                t.cluster(small_file_limit=1 << 30)
            elif action == "rollback_failed":
                t.rollback_failed()
            got = names(oxlake.Table(table_path))
        except oxlake.OxlakeError as e:
            assert target.name in str(e), f"{action}: {e}"
            continue
        assert got == expected, action


@pytest.mark.parametrize("damage", DAMAGES)
def test_damaged_properties_are_an_error_naming_the_file(table_path: str, damage: str) -> None:
    t = damaged_table(table_path)
    props = Path(t.uri) / ".hoodie" / "hoodie.properties"
    DAMAGES[damage](props)
    try:
        got = names(oxlake.Table(table_path))
    except oxlake.OxlakeError as e:
        assert "hoodie.properties" in str(e), str(e)
        return
    assert got == EXPECTED


# -- the metadata table ---------------------------------------------------------------------


def metadata_files(t: oxlake.Table) -> list[Path]:
    root = Path(t.uri) / ".hoodie" / "oxlake" / "metadata"
    return sorted(p for p in root.rglob("*") if p.is_file() and ".heartbeat" not in p.parts)


@pytest.mark.parametrize("damage", ["truncated", "emptied", "garbled"])
def test_every_damaged_metadata_table_file_gives_correct_rows_or_an_error(
    table_path: str, damage: str
) -> None:
    t = damaged_table(table_path)
    t.build_metadata()
    t.upsert(trips([3], ts=4, name="x", city="sf"))
    expected = {1: "u1", 3: "x3"}
    files = metadata_files(t)
    kinds = {p.name.rsplit(".", 1)[-1] for p in files}
    assert files and "parquet" in kinds, kinds
    originals = {p: p.read_bytes() for p in files}
    for target in files:
        if not target.exists():  # a marker an earlier step's write removed
            continue
        DAMAGES[damage](target)
        try:
            for step in ("read", "lookup", "write", "validate"):
                t = oxlake.Table(table_path)
                try:
                    if step == "read":
                        assert names(t) == expected, target
                    elif step == "lookup":
                        got = t.lookup(pa.table({"id": pa.array([1, 2, 3], pa.int64())}))
                        assert {r["id"]: r["name"] for r in got.to_pylist()} == expected, target
                    elif step == "write":
                        t.upsert(trips([3], ts=4, name="x", city="sf"))
                        assert names(oxlake.Table(table_path)) == expected, target
                    else:
                        t.validate()
                except oxlake.OxlakeError as e:
                    assert target.name in str(e) or "metadata" in str(e), f"{step} {target}: {e}"
        finally:
            for p, data in originals.items():
                if p.exists():
                    p.write_bytes(data)


@pytest.mark.parametrize("damage", ["truncated", "emptied"])
def test_damaged_metadata_table_properties_are_reported_as_its_own(table_path: str, damage: str) -> None:
    t = damaged_table(table_path)
    t.build_metadata()
    props = Path(t.uri) / ".hoodie" / "oxlake" / "metadata" / ".hoodie" / "hoodie.properties"
    DAMAGES[damage](props)
    # Readers list storage instead of reading it: the right rows.
    assert names(oxlake.Table(table_path)) == EXPECTED
    with pytest.raises(oxlake.CorruptTableError) as e:
        oxlake.Table(table_path).validate()
    # The metadata table's file, not the data table's `.hoodie/hoodie.properties`.
    assert ".hoodie/oxlake/metadata/.hoodie/hoodie.properties" in str(e.value), str(e.value)


def test_a_damaged_metadata_files_log_is_never_stale(table_path: str) -> None:
    t = damaged_table(table_path)
    t.build_metadata()
    t.upsert(trips([4], ts=4, name="z", city="sf"))  # a new file group, named only in the index
    root = Path(t.uri) / ".hoodie" / "oxlake" / "metadata" / "files"
    logs = sorted(root.rglob(".*.log.*"))
    assert logs
    for log in logs:
        truncate(log)
    try:
        got = names(oxlake.Table(table_path))
    except oxlake.OxlakeError as e:
        assert any(log.name in str(e) for log in logs) or "metadata" in str(e), str(e)
        return
    assert got == {**EXPECTED, 4: "z4"}


def test_validate_names_a_damaged_base_file(table_path: str) -> None:
    t = damaged_table(table_path, "copy_on_write")
    t.build_metadata()
    base = base_files(t)[-1]
    garble_tail(base)
    try:
        report = oxlake.Table(table_path).validate()
    except oxlake.OxlakeError as e:
        assert base.name in str(e), str(e)
        return
    assert not report.ok


# -- writes that route keys through logs ----------------------------------------------------


def data_files(t: oxlake.Table) -> dict[str, bytes]:
    root = Path(t.uri)
    return {
        str(p.relative_to(root)): p.read_bytes()
        for p in root.rglob("*")
        if p.is_file() and ".hoodie" not in p.relative_to(root).parts
    }


def completed(t: oxlake.Table) -> list[tuple[str, str]]:
    """The completed instants that change data (a failed write's rollback does not)."""
    timeline = oxlake.Table(t.uri).timeline()
    return [(i.time, i.action) for i in timeline if i.state == "completed" and i.action != "rollback"]


@pytest.mark.parametrize("damage", DAMAGES)
@pytest.mark.parametrize("which", ["first", "last"])
def test_an_upsert_routed_through_a_damaged_committed_log_is_an_error(
    table_path: str, damage: str, which: str
) -> None:
    t = damaged_table(table_path)
    first, last = log_files(t)
    target = first if which == "first" else last
    DAMAGES[damage](target)
    before_files, before_timeline = data_files(t), completed(t)
    # The write reads the slice's logs to find which group holds key 3 (and 2, deleted there):
    # a damaged committed block would hide keys and put them in a second group.
    with pytest.raises(oxlake.CorruptTableError) as e:
        oxlake.Table(table_path).upsert(trips([2, 3], ts=5, name="w", city="sf"))
    assert_names(e, target)
    assert completed(t) == before_timeline
    assert data_files(t) == before_files


# -- heartbeats and pending plans -----------------------------------------------------------

BEAT = 0.2


def pending_write(t: oxlake.Table, time: str, heartbeat: bytes | None) -> Path:
    """A write at `time` that is inflight (as one that is running or crashed), with `heartbeat`."""
    hoodie = Path(t.uri) / ".hoodie"
    (hoodie / f"{time}.deltacommit.requested").write_bytes(b"")
    inflight = hoodie / f"{time}.deltacommit.inflight"
    inflight.write_bytes(b"")
    if heartbeat is not None:
        (hoodie / ".heartbeat").mkdir(exist_ok=True)
        (hoodie / ".heartbeat" / time).write_bytes(heartbeat)
    return inflight


@pytest.mark.parametrize("heartbeat", [b"", b"\x00\xffgarbage", b"12ab", None])
def test_a_damaged_heartbeat_counts_as_no_sign_of_life(table_path: str, heartbeat: bytes | None) -> None:
    t = damaged_table(table_path)
    time_ = "29990101000000000"
    inflight = pending_write(t, time_, heartbeat)
    # A fresh instant file: its writer may be alive, whatever its heartbeat holds.
    live = oxlake.Table(table_path, heartbeat_interval=60)
    assert live.rollback_failed() == []
    assert any(i.time == time_ for i in oxlake.Table(table_path).timeline())
    assert names(live) == EXPECTED
    # A heartbeat that does not parse counts by its modification time (Apache Hudi's writers
    # leave it empty and touch it), else the instant's own file: past the tolerance, the writer is
    # gone and the instant rolled back.
    old = inflight.stat().st_mtime - 3600
    os.utime(inflight, (old, old))
    os.utime(inflight.with_name(f"{time_}.deltacommit.requested"), (old, old))
    beat = Path(t.uri) / ".hoodie" / ".heartbeat" / time_
    if beat.exists():
        os.utime(beat, (old, old))
    assert oxlake.Table(table_path, heartbeat_interval=BEAT).rollback_failed() == [time_]
    assert not any(i.time == time_ for i in oxlake.Table(table_path).timeline())
    assert names(oxlake.Table(table_path)) == EXPECTED


def test_compaction_past_a_damaged_heartbeat_never_hangs(table_path: str) -> None:
    t = damaged_table(table_path)
    time_ = "29990101000000000"
    pending_write(t, time_, b"\x00garbled")
    start = time.monotonic()
    # The pending write precedes nothing here (its time is later), and a garbled heartbeat is
    # never read as a future beat: the compaction ends, with the rows kept.
    oxlake.Table(table_path, heartbeat_interval=BEAT).compact()
    assert time.monotonic() - start < 30
    assert names(oxlake.Table(table_path)) == EXPECTED


def crash(table_path: str, call: str, point: str) -> None:
    code = f"import oxlake, sys; oxlake.Table(sys.argv[1], heartbeat_interval={BEAT}).{call}"
    proc = subprocess.run(
        [sys.executable, "-c", code, table_path],
        env={**os.environ, "OXLAKE_FAILPOINT": point, "PYTHONPATH": str(Path(__file__).parent)},
        capture_output=True,
    )
    assert proc.returncode != 0, proc.stderr


@pytest.mark.parametrize("damage", DAMAGES)
def test_a_damaged_pending_compaction_plan_is_an_error_naming_it(table_path: str, damage: str) -> None:
    t = damaged_table(table_path)
    crash(table_path, "compact()", "after-inflight")
    plan = timeline_files(t, ".compaction.requested")[-1]
    DAMAGES[damage](plan)
    before = data_files(t)
    time.sleep(BEAT * 4)
    t = oxlake.Table(table_path, heartbeat_interval=BEAT)
    with pytest.raises(oxlake.OxlakeError) as e:
        t.compact()
    assert_names(e, plan)
    # Nothing read or deleted on the strength of a plan that could not be read.
    assert {k: v for k, v in data_files(t).items() if k in before} == before
    assert names(oxlake.Table(table_path)) == EXPECTED


@pytest.mark.parametrize("damage", DAMAGES)
def test_a_damaged_pending_clean_plan_is_an_error_naming_it(table_path: str, damage: str) -> None:
    t = oxlake.create_table(table_path, SCHEMA, record_key="id", ordering_field="ts", table_version=6)
    for ts in range(3):
        t.upsert(trips([1, 2], ts=ts))
    crash(table_path, "clean(retain=1)", "clean-after-delete")
    plan = timeline_files(t, ".clean.requested")[-1]
    DAMAGES[damage](plan)
    before = data_files(t)
    time.sleep(BEAT * 4)
    t = oxlake.Table(table_path, heartbeat_interval=BEAT)
    if damage == "emptied":
        # An empty plan is Apache Hudi's "nothing to clean": it completes, deleting nothing
        # it did not name, and the next clean runs as usual.
        t.clean(retain=1)
    else:
        with pytest.raises(oxlake.OxlakeError) as e:
            t.clean(retain=1)
        assert_names(e, plan)
        assert data_files(t) == before
    assert rows(t.scan()) == rows(trips([1, 2], ts=2))
