"""Inserts, upserts and deletes of inputs larger than a chunk: spilled to disk by key, combined,
looked up and written a file group at a time, in one commit. Every test writes the same input
whole into a twin table and asserts the two tables equal."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import oxlake
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from conftest import SCHEMA, data_files, data_paths, hudi_read, rows, run_paused, snapshot, trips
from oxlake import _native
from oxlake._engine import native

CHUNK = 2048  # Arrow bytes: a few dozen rows of `trips` per chunk


def stream(table: pa.Table, size: int = 10, fail_after: int | None = None) -> pa.RecordBatchReader:
    """`table` as a stream of `size`-row batches made one at a time; with `fail_after`, the
    source fails after that many."""

    def gen():  # type: ignore[no-untyped-def]
        for n, batch in enumerate(table.to_batches(max_chunksize=size)):
            if fail_after is not None and n == fail_after:
                raise ValueError("the source broke")
            yield batch

    return pa.RecordBatchReader.from_batches(table.schema, gen())


def twins(tmp_path: Path, **options: Any) -> tuple[oxlake.Table, oxlake.Table]:
    """Two new tables alike: one written streamed, one whole."""
    make = lambda name: oxlake.create_table(  # noqa: E731
        str(tmp_path / name), SCHEMA, record_key="id", partition_by=["city"], ordering_field="ts", **options
    )
    return make("streamed"), make("whole")


def both(streamed: oxlake.Table, whole: oxlake.Table, op: str, data: pa.Table, **kw: Any) -> None:
    """`op` of `data` on both tables: streamed in `CHUNK`s, and whole; the same counts."""
    a = getattr(streamed, op)(stream(data), chunk_bytes=CHUNK, **kw)
    b = getattr(whole, op)(data, **kw)
    assert (a.num_inserts, a.num_updates, a.num_deletes) == (b.num_inserts, b.num_updates, b.num_deletes)
    assert (a.instant is None) == (b.instant is None)


def assert_same(streamed: oxlake.Table, whole: oxlake.Table) -> None:
    assert rows(streamed.to_arrow()) == rows(whole.to_arrow())
    assert rows(hudi_read(streamed.uri)) == rows(whole.to_arrow()), "hudi-rs reads the same rows"
    assert [i.action for i in streamed.timeline()] == [i.action for i in whole.timeline()]
    assert streamed.validate().ok, streamed.validate().differences


def shuffled(ids: list[int], **kw: Any) -> pa.Table:
    import random

    ids = list(ids)
    random.Random(len(ids)).shuffle(ids)
    return trips(ids, **kw)


@pytest.mark.parametrize("table_type", ["copy_on_write", "merge_on_read"])
@pytest.mark.parametrize("table_version", [6, 8])
def test_streamed_writes_equal_the_same_writes_taken_whole(
    tmp_path: Path, table_type: str, table_version: int
) -> None:
    """Insert, upsert (duplicates across chunks, the greatest `ts` winning), upsert with
    `_hoodie_is_deleted`, delete, upsert of deleted keys: each streamed through the spill, each
    equal to its whole twin."""
    s, w = twins(tmp_path, table_type=table_type, table_version=table_version)
    first = pa.concat_tables(
        [shuffled(list(range(300)), ts=1), shuffled(list(range(0, 300, 3)), ts=2, name="dup")]
    )
    both(s, w, "insert", first)
    # Updates of held keys (each group once), new keys, and duplicates: ts=5 beats ts=3 whatever
    # the order; ties go to the later row.
    changes = pa.concat_tables(
        [
            shuffled(list(range(0, 600, 2)), ts=5, name="late"),
            shuffled(list(range(0, 600, 4)), ts=3, name="early"),
            shuffled(list(range(1, 200, 10)), ts=5, name="tie"),
        ]
    )
    both(s, w, "upsert", changes)
    assert_same(s, w)
    flagged = shuffled(list(range(100, 400)), ts=9, name="flag").append_column(
        "_hoodie_is_deleted", pa.array([i % 2 == 0 for i in range(300)])
    )
    both(s, w, "upsert", flagged)
    assert_same(s, w)
    gone = shuffled(list(range(0, 700, 7)), ts=100).select(["id", "city", "ts"])
    both(s, w, "delete", gone)
    assert_same(s, w)
    # Deletes of keys the table lacks change nothing: no instant.
    both(s, w, "delete", trips(list(range(5000, 5400)), ts=100).select(["id", "city", "ts"]))
    assert_same(s, w)
    # Keys deleted above (held deleted in merge-on-read logs), held and new ones again.
    both(s, w, "upsert", shuffled(list(range(0, 800, 3)), ts=200, name="back"))
    assert_same(s, w)


def test_a_streamed_upsert_rewrites_each_file_group_once(tmp_path: Path) -> None:
    """Every held key's group gets one new base file of the instant, however many chunks and
    spill files held its keys; new keys go to new groups."""
    s, _ = twins(tmp_path)
    s.insert(trips(list(range(600))))
    groups_before = {p.name.split("_")[0] for p in data_paths(s.uri, "*.parquet")}
    result = s.upsert(stream(shuffled(list(range(0, 900)), ts=2)), chunk_bytes=CHUNK)
    assert (result.num_updates, result.num_inserts) == (600, 300)
    written = [Path(f).name for f in result.files]
    rewritten = [n.split("_")[0] for n in written if n.split("_")[0] in groups_before]
    assert sorted(rewritten) == sorted(groups_before), "each old group rewritten exactly once"
    assert len(written) > len(groups_before), "the new keys went to new groups"


def test_a_streamed_write_with_a_global_index_moves_keys_between_partitions(tmp_path: Path) -> None:
    s, w = twins(tmp_path, global_index=True)
    both(s, w, "insert", trips(list(range(200))))
    both(s, w, "upsert", shuffled(list(range(0, 400, 2)), ts=5, city="lisbon"))
    assert_same(s, w)
    assert {r["city"] for r in rows(s.to_arrow()) if r["id"] % 2 == 0} == {"lisbon"}
    both(s, w, "delete", trips(list(range(0, 400, 3))).select(["id"]))
    assert_same(s, w)


def test_a_streamed_write_keeps_the_record_index(tmp_path: Path) -> None:
    s, w = twins(tmp_path)
    for t in (s, w):
        t.insert(trips(list(range(10))))
        t.build_metadata(record_index_shards=2)
    both(s, w, "upsert", shuffled(list(range(400)), ts=2))
    both(s, w, "delete", trips(list(range(0, 400, 5))).select(["id", "city"]))
    assert_same(s, w)
    assert rows(s.lookup(pa.table({"id": [5, 6, 399]}))) == rows(w.lookup(pa.table({"id": [5, 6, 399]})))


def test_a_streamed_write_evolves_the_schema(tmp_path: Path) -> None:
    s, w = twins(tmp_path)
    both(s, w, "insert", trips(list(range(100))))
    wider = shuffled(list(range(50, 250)), ts=2)
    wider = wider.append_column("tip", pa.array([float(i) for i in range(wider.num_rows)]))
    both(s, w, "upsert", wider, schema_mode="merge")
    assert_same(s, w)
    assert "tip" in s.schema.names


def test_a_table_in_memory_is_written_whole_unless_a_chunk_size_is_given(tmp_path: Path) -> None:
    """A pyarrow Table is in memory already: written whole (small files topped up), where the
    same rows streamed with a chunk size are spilled and written in parts, each numbering its
    files on from the last one's (the first number of a file's write token), all as one task."""
    s, w = twins(tmp_path)
    for t in (s, w):
        t.insert(trips(list(range(30))))
    whole = w.insert(shuffled(list(range(30, 600))))
    streamed = s.insert(shuffled(list(range(30, 600))), chunk_bytes=CHUNK)
    assert rows(s.to_arrow()) == rows(w.to_arrow())
    old = {p.name.split("_")[0] for p in data_paths(w.uri, "*.parquet")} & {
        Path(f).name.split("_")[0] for f in whole.files
    }
    assert old, "the whole write topped up the small files"

    tokens = [Path(f).name.split("_")[1] for f in streamed.files]
    assert len(tokens) > 1 and len(set(tokens)) == len(tokens), "no two parts write one name"
    assert {t.split("-", 1)[1] for t in tokens} == {"0-1"}


def test_a_streamed_write_of_bad_rows_fails_before_any_instant(tmp_path: Path) -> None:
    """A null key in the last chunk: a typed error naming it, the table as it was, no instant."""
    s, _ = twins(tmp_path)
    s.insert(trips(list(range(10))))
    before = snapshot(s)
    bad = shuffled(list(range(300)))
    bad = bad.set_column(0, pa.field("id", pa.int64()), pa.array(list(range(299)) + [None], pa.int64()))
    with pytest.raises(oxlake.InvalidDataError, match="id"):
        s.upsert(stream(bad), chunk_bytes=CHUNK)
    assert snapshot(oxlake.Table(s.uri)) == before


@pytest.mark.parametrize("op", ["insert", "upsert", "delete"])
def test_a_stream_failing_midway_leaves_the_table_as_it_was(tmp_path: Path, op: str) -> None:
    s, _ = twins(tmp_path)
    s.insert(trips(list(range(100))))
    before = snapshot(s)
    data = trips(list(range(600)), ts=5)
    with pytest.raises(oxlake.InvalidArgumentError, match="the source broke"):
        getattr(s, op)(stream(data, fail_after=30), chunk_bytes=CHUNK)
    assert snapshot(oxlake.Table(s.uri)) == before


def test_a_streamed_upsert_killed_after_writing_files_is_rolled_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SIGKILL once the write has files on disk: nothing of it is read, and the next writer
    rolls it back. The spilled input it left behind goes with the next write that spills there."""
    path = str(tmp_path / "t")
    spill = tmp_path / "spill"
    spill.mkdir()
    t = oxlake.create_table(
        path, SCHEMA, record_key="id", partition_by=["city"], ordering_field="ts", heartbeat_interval=0.2
    )
    t.insert(trips(list(range(50))))
    before = rows(t.to_arrow())
    files_before = len(data_paths(path, "*.parquet"))
    code = (
        "import sys, time, oxlake, pyarrow as pa\n"
        f"sys.path.insert(0, {str(Path(__file__).parent)!r})\n"
        "from conftest import SCHEMA, trips\n"
        "import oxlake._native\n"
        "def gen():\n"
        "    yield from trips(list(range(0, 3000)), ts=5).to_batches(max_chunksize=10)\n"
        "t = oxlake.Table(sys.argv[1], heartbeat_interval=0.2)\n"
        "t.upsert(pa.RecordBatchReader.from_batches(SCHEMA, gen()), chunk_bytes=2048)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code, path], env={**os.environ, "TMPDIR": str(spill)})
    deadline = time.monotonic() + 60
    while len(data_paths(path, "*.parquet")) < files_before + 4:
        assert proc.poll() is None and time.monotonic() < deadline
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert rows(oxlake.Table(path).to_arrow()) == before, "an inflight instant is never read"
    time.sleep(1.0)
    t = oxlake.Table(path, heartbeat_interval=0.2)
    t.upsert(trips([1], ts=9, name="after"))
    assert len(rows(t.to_arrow())) == 50
    assert all(i.state == "completed" for i in t.timeline())
    assert t.validate().ok
    (left,) = spill.iterdir()
    assert left.name.startswith("oxlake-spill-") and len(list(left.iterdir())) > 1
    monkeypatch.setenv("TMPDIR", str(spill))
    t.upsert(stream(trips(list(range(40, 400)), ts=10)), chunk_bytes=CHUNK)
    assert list(spill.iterdir()) == [], "the killed write's spill and this write's are gone"
    assert len(rows(t.to_arrow())) == 400


@pytest.mark.parametrize("retries", [0, 2])
def test_two_writers_of_one_new_key_conflict_though_the_streamed_one_holds_no_keys(
    tmp_path: Path, retries: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The streamed write lists no keys (only the partitions it wrote). Paused after planning,
    it waits while another writer inserts one of its new keys: at its commit, reading its own
    files back finds the key, and it loses the conflict; with retries it is written again from
    its spilled input, against the table as it is then (an update of that key)."""
    s, _ = twins(tmp_path)
    s.insert(trips(list(range(10))))
    code = (
        "import sys, random, oxlake, pyarrow as pa\n"
        f"sys.path.insert(0, {str(Path(__file__).parent)!r})\n"
        "from test_stream_write import stream, shuffled\n"
        "t = oxlake.Table(sys.argv[1])\n"
        "data = stream(shuffled(list(range(10, 400)), ts=5))\n"
        f"t.upsert(data, chunk_bytes={CHUNK}, conflict_retries={retries})\n"
    )
    (tmp_path / "pause").mkdir()
    spill = tmp_path / "spill"
    spill.mkdir()
    proc = run_paused(s.uri, "after-plan", code, tmp_path / "pause", env={**os.environ, "TMPDIR": str(spill)})
    oxlake.Table(s.uri).insert(trips([399], ts=1, name="other"))
    # A streamed write beside it, spilling into the same directory, leaves its live spill alone:
    # with retries it reads its input from there again.
    (live,) = spill.iterdir()
    monkeypatch.setenv("TMPDIR", str(spill))
    other = oxlake.create_table(str(tmp_path / "other"), SCHEMA, record_key="id", partition_by=["city"])
    other.insert(stream(trips(list(range(300)))), chunk_bytes=CHUNK)
    assert list(spill.iterdir()) == [live]
    (tmp_path / "pause" / "resume").touch()
    _, err = proc.communicate(timeout=120)
    out = rows(oxlake.Table(s.uri).to_arrow())
    if retries == 0:
        assert proc.returncode == 1 and "CommitConflictError" in err, err
        assert len(out) == 11 and [r["name"] for r in out if r["id"] == 399] == ["other399"], "not twice"
    else:
        assert proc.returncode == 0, err
        assert len(out) == 400 and [r["name"] for r in out if r["id"] == 399] == ["n399"]
    assert all(i.state == "completed" for i in oxlake.Table(s.uri).timeline())
    assert oxlake.Table(s.uri).validate().ok


@pytest.mark.parametrize("meta_fields", [True, False])
def test_streamed_writes_with_hostile_partition_values_and_keys(tmp_path: Path, meta_fields: bool) -> None:
    """Partition values with `/`, `%`, `=`, spaces and non-ASCII text, string keys with
    separators, in a table with and without meta fields: the same as the whole writes."""
    schema = pa.schema([("k", pa.string()), ("part", pa.string()), ("ts", pa.int64()), ("v", pa.float64())])
    make = lambda name: oxlake.create_table(  # noqa: E731
        str(tmp_path / name),
        schema,
        record_key="k",
        partition_by=["part"],
        ordering_field="ts",
        meta_fields=meta_fields,
    )
    s, w = make("streamed"), make("whole")
    parts = ["a/b", "50%", "x=y", "é ü", "__HIVE_DEFAULT_PARTITION__x", " "]

    def data(ids: list[int], ts: int) -> pa.Table:
        return pa.table(
            {
                "k": [f"key,{i}:é/%{i % 7}" for i in ids],
                "part": [parts[i % len(parts)] for i in ids],
                "ts": [ts] * len(ids),
                "v": [float(i * ts) for i in ids],
            },
            schema=schema,
        )

    both(s, w, "insert", data(list(range(300)), 1))
    both(s, w, "upsert", data(list(range(150, 450)), 2))
    both(s, w, "delete", data(list(range(0, 450, 4)), 3).select(["k", "part"]))
    assert rows(s.to_arrow(), key="k") == rows(w.to_arrow(), key="k")
    assert rows(hudi_read(s.uri), key="k") == rows(w.to_arrow(), key="k")
    assert s.validate().ok


@pytest.mark.parametrize(("streamed", "retries"), [(True, 0), (True, 1), (False, 0)])
def test_a_record_index_built_during_a_write_is_not_left_without_its_keys(
    tmp_path: Path, streamed: bool, retries: int
) -> None:
    """Another process builds the record index while a write runs (the writer read the table's
    properties before: they do not name the index). Written whole, the commit still gives the
    index its keys (the metadata table's own record of its indexes counts). Streamed, the write
    held no keys: its commit fails as a conflict, and its retry (holding them) commits. Either
    way lookups find every row and the index validates."""
    s, _ = twins(tmp_path)
    s.insert(trips(list(range(10))))
    write = f"stream(data), chunk_bytes={CHUNK}" if streamed else "data"
    code = (
        "import sys, oxlake\n"
        f"sys.path.insert(0, {str(Path(__file__).parent)!r})\n"
        "from test_stream_write import stream, shuffled\n"
        "t = oxlake.Table(sys.argv[1])\n"
        "data = shuffled(list(range(5, 400)), ts=5)\n"
        f"t.upsert({write}, conflict_retries={retries})\n"
    )
    (tmp_path / "pause").mkdir()
    proc = run_paused(s.uri, "after-plan", code, tmp_path / "pause")
    oxlake.Table(s.uri).build_metadata(record_index_shards=2)
    (tmp_path / "pause" / "resume").touch()
    _, err = proc.communicate(timeout=120)
    t = oxlake.Table(s.uri)
    if streamed and retries == 0:
        assert proc.returncode == 1 and "CommitConflictError" in err, err
        assert len(rows(t.to_arrow())) == 10
    else:
        assert proc.returncode == 0, err
        assert len(rows(t.to_arrow())) == 400
        assert rows(t.lookup(pa.table({"id": [7, 399]}))) == [
            r for r in rows(t.to_arrow()) if r["id"] in (7, 399)
        ]
    report = t.validate()
    assert report.ok, report.differences


@pytest.mark.parametrize("meta_fields", [True, False])
@pytest.mark.parametrize("table_type", ["copy_on_write", "merge_on_read"])
def test_a_streamed_upsert_of_keys_with_copies_in_two_groups(
    tmp_path: Path, meta_fields: bool, table_type: str
) -> None:
    """A bulk insert looks no key up: keys it loads again have copies in two file groups. A
    streamed upsert of such keys changes every copy, so two of its parts may rewrite one group:
    they are merged, and the table equals the one written whole (no update lost)."""
    s, w = twins(tmp_path, meta_fields=meta_fields, table_type=table_type)
    for t in (s, w):
        t.insert(trips(list(range(200))))
        t.bulk_insert(trips(list(range(0, 200, 3)), name="copy"))
    both(s, w, "upsert", shuffled(list(range(0, 300)), ts=5, name="new"))
    assert rows(s.to_arrow()) == rows(w.to_arrow())
    assert {r["name"] for r in rows(s.to_arrow())} == {f"new{i}" for i in range(300)}
    assert s.validate().ok


def test_spilled_files_larger_than_two_chunks_are_split_again(tmp_path: Path) -> None:
    """An input of a few MB in 64 KiB chunks: each of the 16 files it is first spilled into holds
    more than two chunks and is split again (by key, then by group, then by partition), and the
    result equals the whole write."""
    s, w = twins(tmp_path, table_type="merge_on_read")
    for t in (s, w):
        t.insert(trips(list(range(20_000))))
    data = pa.concat_tables(
        [shuffled(list(range(10_000, 60_000)), ts=3), shuffled(list(range(0, 60_000, 5)), ts=4)]
    )
    a = s.upsert(stream(data, size=1000), chunk_bytes=64 << 10)
    b = w.upsert(data)
    assert (a.num_inserts, a.num_updates) == (b.num_inserts, b.num_updates)
    assert rows(s.to_arrow()) == rows(w.to_arrow())
    assert s.validate().ok


# ---- the task side of a distributed write -----------------------------------------------------


def task_writes(table: oxlake.Table, op: str, tasks: list[pa.Table], **kw: Any) -> tuple[str, list[bytes]]:
    """`op` as a distributed write: each of `tasks` written streamed (in `CHUNK`s) by a task of
    its own under one pending instant, as Spark's tasks do; the instant and every task's parts."""
    pending = _native.begin_write(native(table), op)
    parts: list[bytes] = []
    try:
        for n, rows_of_task in enumerate(tasks, 1):
            written = _native.write_files_stream(
                native(table), op, pending.instant, stream(rows_of_task), CHUNK, task=(n, 1), **kw
            )
            parts += written
    except BaseException:
        pending.abort()
        raise
    pending.commit(parts)
    return pending.instant, parts


def by_city(data: pa.Table) -> list[pa.Table]:
    """`data` split as a write repartitioned by the partition column hands it to its tasks."""
    return [data.filter(pc.equal(data.column("city"), c)) for c in ("sf", "nyc", "chennai")]


@pytest.mark.parametrize("table_type", ["copy_on_write", "merge_on_read"])
@pytest.mark.parametrize("own_partitions", [False, True])
def test_tasks_streamed_writes_equal_the_same_writes_taken_whole(
    tmp_path: Path, table_type: str, own_partitions: bool
) -> None:
    """Each task's input is larger than a chunk: spilled, combined and written in parts, each
    part's files named on from the last's. Insert, upsert with duplicates and flagged deletes,
    delete and bulk insert through tasks equal the same writes taken whole in one process."""
    s, w = twins(tmp_path, table_type=table_type)
    kw = {"own_partitions": own_partitions}
    first = pa.concat_tables([shuffled(list(range(300)), ts=1), shuffled(list(range(0, 300, 3)), ts=2)])
    task_writes(s, "insert", by_city(first), **kw)
    w.insert(first)
    assert_same(s, w)
    changes = pa.concat_tables(
        [shuffled(list(range(0, 600, 2)), ts=5, name="late"), shuffled(list(range(0, 600, 4)), ts=3)]
    )
    flags = pa.array([i % 5 == 0 for i in range(changes.num_rows)])
    changes = changes.append_column("_hoodie_is_deleted", flags)
    _, parts = task_writes(s, "upsert", by_city(changes), **kw)
    assert len(parts) > 3, "the tasks wrote in parts"
    w.upsert(changes)
    assert_same(s, w)
    gone = shuffled(list(range(0, 700, 7)), ts=100).select(["id", "city", "ts"])
    task_writes(s, "delete", by_city(gone), **kw)
    w.delete(gone)
    assert_same(s, w)
    loaded = shuffled(list(range(1000, 1400)), ts=7)
    instant, _ = task_writes(s, "bulk_insert", by_city(loaded), sort_mode="partition_sort", **kw)
    w.bulk_insert(loaded, sort_mode="partition_sort")
    assert_same(s, w)
    names = [p.name for p in data_paths(s.uri, "*") if instant in p.name]
    tokens = [n.split("_")[1] for n in names if n.endswith(".parquet")]
    assert len(tokens) > 3 and len(set(tokens)) == len(tokens), "one name per file"


@pytest.mark.parametrize("op", ["upsert", "bulk_insert"])
def test_a_tasks_stream_failing_midway_leaves_the_table_as_it_was(tmp_path: Path, op: str) -> None:
    """A task's source breaks after some chunks (a bulk insert has written files of them by
    then): a typed error, and the aborted write (rolled back) leaves the table's rows and data
    files as they were."""
    s, _ = twins(tmp_path, table_type="merge_on_read")
    s.insert(trips(list(range(100))))
    before = (rows(s.to_arrow()), data_files(s))
    pending = _native.begin_write(native(s), op)
    with pytest.raises(oxlake.InvalidArgumentError, match="the source broke"):
        _native.write_files_stream(
            native(s), op, pending.instant, stream(trips(list(range(600)), ts=5), fail_after=40), CHUNK
        )
    if op == "bulk_insert":
        assert any(pending.instant in f for f in data_files(s)), "chunks were written before the break"
    pending.abort()
    after = oxlake.Table(s.uri)
    assert (rows(after.to_arrow()), data_files(after)) == before
    assert [i.action for i in after.timeline()] == ["deltacommit", "rollback"]


def test_a_tasks_streamed_write_refuses_an_instant_that_is_not_pending(tmp_path: Path) -> None:
    s, _ = twins(tmp_path)
    s.insert(trips(list(range(10))))
    done = s.timeline()[-1].time
    with pytest.raises(oxlake.InvalidArgumentError, match="not a pending write"):
        _native.write_files_stream(native(s), "upsert", done, stream(trips(list(range(600)))), CHUNK)
    with pytest.raises(oxlake.InvalidArgumentError, match="chunk_bytes"):
        _native.write_files_stream(native(s), "upsert", done, stream(trips(list(range(60)))), 0)


def test_a_task_whose_write_ended_while_it_streamed_removes_its_files(tmp_path: Path) -> None:
    """The driver rolls the write back while a task still reads its input (a straggling or
    speculative attempt): the task writes, finds its instant no longer pending, removes every
    file it wrote and fails with a conflict; the table is as it was."""
    import threading

    s, _ = twins(tmp_path, table_type="merge_on_read")
    s.insert(trips(list(range(100))))
    before = (rows(s.to_arrow()), data_files(s))
    driver = oxlake.Table(s.uri)  # the driver's own handle
    pending = _native.begin_write(native(driver), "upsert")
    midway, aborted = threading.Event(), threading.Event()

    def source():  # type: ignore[no-untyped-def]
        for n, batch in enumerate(trips(list(range(600)), ts=5).to_batches(max_chunksize=10)):
            if n == 30:
                midway.set()
                assert aborted.wait(60)
            yield batch

    def abort() -> None:
        assert midway.wait(60)
        pending.abort()
        aborted.set()

    helper = threading.Thread(target=abort)
    helper.start()
    reader = pa.RecordBatchReader.from_batches(SCHEMA, source())
    with pytest.raises(oxlake.CommitConflictError, match="ended while this task wrote"):
        _native.write_files_stream(native(s), "upsert", pending.instant, reader, CHUNK, task=(1, 1))
    helper.join()
    after = oxlake.Table(s.uri)
    assert (rows(after.to_arrow()), data_files(after)) == before
