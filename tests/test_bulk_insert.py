"""`bulk_insert`: Apache Hudi's loading operation. No key lookup, no small-file handling, duplicate
keys kept as they come, optional sort by key; from Python and the CLI (Spark: test_spark.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import fastavro
import oxlake
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import pytest
from conftest import SCHEMA, data_files, hudi_avro_schema, rows, snapshot, trips, trips_table


def commit_metadata(t: oxlake.Table, instant: str) -> dict:
    """The completed commit file of `instant` as a dict (version 6 tables: JSON)."""
    timeline = Path(t.uri) / ".hoodie"
    (path,) = [
        p
        for p in timeline.iterdir()
        if p.name.startswith(instant) and p.suffix in (".commit", ".deltacommit")
    ]
    return json.loads(path.read_bytes())


@pytest.mark.parametrize("table_type", ["copy_on_write", "merge_on_read"])
def test_a_bulk_insert_writes_new_files_only_and_keeps_every_row(table_path: str, table_type: str) -> None:
    t = trips_table(table_path, table_type=table_type, table_version=6)
    t.insert(trips([1, 2, 3]))
    before = data_files(t)
    # Key 2 again (in the table and twice in the input): a bulk insert looks nothing up and
    # combines nothing, as Apache Hudi's does.
    result = t.bulk_insert(pa.concat_tables([trips([2, 4, 5], ts=2), trips([4], ts=3)]))
    assert result.num_inserts == 4 and result.num_updates == 0
    after = data_files(t)
    assert before <= after, "no file of the table was rewritten or replaced"
    assert set(result.files) == after - before
    got = [(r["id"], r["ts"]) for r in rows(t.scan())]
    assert sorted(got) == [(1, 1), (2, 1), (2, 2), (3, 1), (4, 2), (4, 3), (5, 2)]
    meta = commit_metadata(t, result.instant)
    assert meta["operationType"] == "BULK_INSERT"
    action = "deltacommit" if table_type == "merge_on_read" else "commit"
    assert [i.action for i in t.timeline() if i.time == result.instant] == [action]
    assert all(p.endswith(".parquet") for p in result.files), "new file groups: base files, never logs"


def test_an_upsert_after_a_bulk_insert_finds_its_keys(table_path: str) -> None:
    t = trips_table(table_path)
    t.build_metadata()
    t.bulk_insert(trips(list(range(100))), sort_mode="global_sort")
    t.upsert(trips([5, 50, 500], ts=2, name="u"))
    got = {r["id"]: r["name"] for r in rows(t.scan())}
    assert len(got) == 101 and got[5] == "u5" and got[50] == "u50" and got[6] == "n6"
    assert t.validate().ok


def keys_per_file(t: oxlake.Table) -> dict[str, list[str]]:
    """The record keys of each base file, in file order."""
    out = {}
    for f in sorted(data_files(t)):
        keys = pq.read_table(Path(t.uri) / f, columns=["_hoodie_record_key"]).column(0).to_pylist()
        out[f] = keys
    return out


@pytest.mark.parametrize("sort_mode", ["global_sort", "partition_sort", "GLOBAL_SORT"])
def test_sorted_bulk_inserts_cut_files_of_disjoint_key_ranges(table_path: str, sort_mode: str) -> None:
    t = trips_table(table_path)
    ids = [(i * 7919) % 3000 for i in range(3000)]  # every key once, out of order
    t.bulk_insert(trips(ids, city="sf"), sort_mode=sort_mode, target_file_size=20_000)
    files = keys_per_file(t)
    assert len(files) > 2
    ranges = []
    for keys in files.values():
        assert keys == sorted(keys), "each file is sorted by key"
        ranges.append((keys[0], keys[-1]))
    ranges.sort()
    assert all(a[1] < b[0] for a, b in zip(ranges, ranges[1:], strict=False)), f"ranges overlap: {ranges}"
    assert sorted(r["id"] for r in rows(t.scan())) == list(range(3000))


def test_an_unsorted_bulk_insert_keeps_the_input_order(table_path: str) -> None:
    t = trips_table(table_path)
    ids = [5, 3, 9, 1]
    t.bulk_insert(trips(ids, city="sf"))
    (keys,) = keys_per_file(t).values()
    assert keys == [str(i) for i in ids]


def test_a_bad_sort_mode_is_refused_and_leaves_the_table(table_path: str) -> None:
    t = trips_table(table_path)
    t.insert(trips([1]))
    before = snapshot(t)
    with pytest.raises(oxlake.InvalidArgumentError, match="sort_mode.*`by_key`.*global_sort"):
        t.bulk_insert(trips([2]), sort_mode="by_key")
    assert snapshot(t) == before


def test_a_bulk_insert_of_bad_rows_names_the_column_and_leaves_the_table(table_path: str) -> None:
    t = trips_table(table_path)
    t.insert(trips([1]))
    before = snapshot(t)
    bad = trips([2]).set_column(0, "id", pa.array([None], pa.int64()))
    with pytest.raises(oxlake.OxlakeError, match="id"):
        t.bulk_insert(bad)
    assert snapshot(t) == before


def test_a_version_8_bulk_insert_decodes_as_java_reads_it(table_path: str) -> None:
    t = trips_table(table_path, table_type="merge_on_read")
    result = t.bulk_insert(trips(list(range(10))))
    timeline = Path(t.uri) / ".hoodie" / "timeline"
    (path,) = [p for p in timeline.iterdir() if p.name.startswith(f"{result.instant}_")]
    with path.open("rb") as f:
        (record,) = list(fastavro.reader(f, reader_schema=hudi_avro_schema("HoodieCommitMetadata")))
    assert record["operationType"] == "BULK_INSERT"
    assert sum(s["numInserts"] for stats in record["partitionToWriteStats"].values() for s in stats) == 10


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "oxlake.cli", *args], capture_output=True, text=True, env=os.environ
    )


def test_the_cli_loads_files_into_a_new_table_and_then_into_it_again(table_path: str, tmp_path: Path) -> None:
    pq.write_table(trips([1, 2, 3]), tmp_path / "a.parquet")
    pq.write_table(trips([4, 5]), tmp_path / "b.parquet")
    files = [str(tmp_path / "a.parquet"), str(tmp_path / "b.parquet")]
    create = ["--record-key", "id", "--partition-by", "city", "--ordering-field", "ts"]
    done = cli("bulk-insert", table_path, *files, *create, "--sort-mode", "global_sort")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("bulk_insert: 5 rows into "), done.stdout
    t = oxlake.Table(table_path)
    assert t.properties["hoodie.table.partition.fields"] == "city"
    pacsv.write_csv(trips([6, 7]), tmp_path / "c.csv")
    done = cli("bulk-insert", table_path, str(tmp_path / "c.csv"))
    assert done.returncode == 0, done.stderr
    assert [r["id"] for r in rows(oxlake.Table(table_path).scan())] == [1, 2, 3, 4, 5, 6, 7]


def test_the_cli_says_what_is_missing_to_create_a_table(table_path: str, tmp_path: Path) -> None:
    pq.write_table(trips([1]), tmp_path / "a.parquet")
    done = cli("bulk-insert", table_path, str(tmp_path / "a.parquet"))
    assert done.returncode == 1
    assert "InvalidArgumentError" in done.stderr and "--record-key" in done.stderr
    assert not Path(table_path).exists()
    done = cli("bulk-insert", table_path, str(tmp_path / "missing.parquet"), "--record-key", "id")
    assert done.returncode == 1 and "missing.parquet" in done.stderr
    assert SCHEMA.names == pq.read_schema(tmp_path / "a.parquet").names


# ---- streamed input ---------------------------------------------------------------------------


def batches(ids: list[int], size: int, fail_after: int | None = None) -> pa.RecordBatchReader:
    """`trips(ids)` as a stream of `size`-row batches made one at a time (a generator, as a job
    reading a large source hands them); with `fail_after`, the source fails after that many."""

    def gen():  # type: ignore[no-untyped-def]
        for n, lo in enumerate(range(0, len(ids), size)):
            if fail_after is not None and n == fail_after:
                raise ValueError("the source broke")
            yield from trips(ids[lo : lo + size]).to_batches()

    return pa.RecordBatchReader.from_batches(SCHEMA, gen())


def parquet_files(path: str) -> list[Path]:
    return [p for p in Path(path).rglob("*.parquet") if ".hoodie" not in p.parts]


@pytest.mark.parametrize("sort_mode", ["none", "partition_sort"])
@pytest.mark.parametrize(("rows_", "size", "chunk"), [(3000, 100, 8 << 10), (500, 7, 1), (40, 1000, 1 << 30)])
def test_a_streamed_bulk_insert_equals_its_input_taken_whole(
    table_path: str, tmp_path: Path, sort_mode: str, rows_: int, size: int, chunk: int
) -> None:
    """Chunk by chunk (`chunk_bytes`), one commit: the rows, the files' order and what hudi-rs
    reads are those of the same input taken whole."""
    ids = list(range(rows_))
    t = trips_table(table_path)
    result = t.bulk_insert(batches(ids, size), sort_mode=sort_mode, chunk_bytes=chunk)
    assert result.num_inserts == rows_
    whole = trips_table(str(tmp_path / "whole"))
    whole.bulk_insert(trips(ids), sort_mode=sort_mode, conflict_retries=1)  # held whole
    assert rows(t.to_arrow()) == rows(whole.to_arrow())
    assert [i.action for i in t.timeline()] == ["commit"]
    if sort_mode == "partition_sort":
        for f in parquet_files(table_path):
            keys = [str(k) for k in pq.read_table(f)["id"].to_pylist()]
            assert keys == sorted(keys), f"{f}: record keys (text) in order"
    files = parquet_files(table_path)
    if chunk < 1 << 20:
        assert len(files) > 3, "each chunk writes files of its own"
    # Each chunk numbers its files on from the last one's: no write token or record sequence
    # number repeats (`<instant>_<task>-<file>_<record>`).
    tokens = [f.name.split("_")[1] for f in files]
    assert len(set(tokens)) == len(tokens)
    seqnos = t.to_arrow().column("_hoodie_commit_seqno").to_pylist()
    assert len(set(seqnos)) == len(seqnos) == rows_
    from conftest import hudi_read

    assert rows(hudi_read(table_path)) == rows(t.to_arrow())


def test_a_stream_failing_midway_leaves_the_table_as_it_was(table_path: str) -> None:
    t = trips_table(table_path)
    t.insert(trips([1000, 1001]))
    before, files = rows(t.to_arrow()), set(parquet_files(table_path))
    with pytest.raises(oxlake.InvalidArgumentError, match="the source broke"):
        t.bulk_insert(batches(list(range(600)), 100, fail_after=4), chunk_bytes=1)
    assert rows(oxlake.Table(table_path).to_arrow()) == before
    assert set(parquet_files(table_path)) == files, "the chunks written were rolled back"
    assert all(i.state == "completed" for i in oxlake.Table(table_path).timeline())


def test_a_streamed_bulk_insert_killed_midway_is_rolled_back_by_the_next_writer(
    table_path: str, tmp_path: Path
) -> None:
    """The writer dies (SIGKILL) with some chunks' files written: the next writer, once the
    heartbeat expires, rolls the instant back; no row of it is ever read."""
    import signal
    import time

    t = trips_table(table_path, heartbeat_interval=0.2)
    t.insert(trips([1000]))
    before = rows(t.to_arrow())
    code = (
        "import sys, time, oxlake, pyarrow as pa\n"
        f"sys.path.insert(0, {str(Path(__file__).parent)!r})\n"
        "from conftest import SCHEMA, trips\n"
        "def gen():\n"
        "    for lo in range(0, 10**6, 100):\n"
        "        yield from trips(list(range(lo, lo + 100))).to_batches()\n"
        "        time.sleep(0.01)\n"
        "t = oxlake.Table(sys.argv[1], heartbeat_interval=0.2)\n"
        "t.bulk_insert(pa.RecordBatchReader.from_batches(SCHEMA, gen()), chunk_bytes=1)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code, table_path])
    deadline = time.monotonic() + 60
    while len(parquet_files(table_path)) < 8:
        assert proc.poll() is None and time.monotonic() < deadline
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert rows(oxlake.Table(table_path).to_arrow()) == before, "an inflight instant is never read"
    time.sleep(1.0)  # the dead writer's heartbeat expires
    t = oxlake.Table(table_path, heartbeat_interval=0.2)
    t.upsert(trips([1000], ts=5, name="after"))
    assert [(r["id"], r["name"]) for r in rows(t.to_arrow())] == [(1000, "after1000")]
    assert len(parquet_files(table_path)) <= 3, "the dead writer's files were removed"
    assert all(i.state == "completed" for i in t.timeline())


@pytest.mark.parametrize("chunk", [0, -1, 1.5, True])
def test_a_chunk_size_that_is_no_byte_count_is_refused(table_path: str, chunk: object) -> None:
    t = trips_table(table_path)
    with pytest.raises(oxlake.InvalidArgumentError, match="chunk_bytes"):
        t.bulk_insert(trips([1]), chunk_bytes=chunk)  # type: ignore[arg-type]
    assert t.timeline() == []
