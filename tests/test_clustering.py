"""Clustering: small file groups rewritten into fewer, sorted ones as a replacecommit; readers see
the same rows before and after, hudi-rs too; writers that race a clustering never lose an update."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import oxlake
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import SCHEMA, data_paths, hudi_read, rows, run_paused, trips

HEARTBEAT = 0.2


@pytest.fixture(params=["copy_on_write", "merge_on_read"])
def t(request: pytest.FixtureRequest, table_path: str) -> oxlake.Table:
    return oxlake.create_table(
        table_path,
        SCHEMA,
        record_key="id",
        partition_by=["city"],
        ordering_field="ts",
        table_type=request.param,
        heartbeat_interval=HEARTBEAT,
        table_version=6,
    )


def scattered(t: oxlake.Table, n: int = 30) -> None:
    """`n` rows in one file group each (a tiny target size), fares in descending id order."""
    data = trips(list(range(n)))
    data = data.set_column(4, "fare", pa.array([1000.0 - i for i in range(n)]))
    t.insert(data, target_file_size=1)


def base_files(t: oxlake.Table) -> list[str]:
    return [g.base_file for g in t.file_groups()]


def test_rewrites_small_groups_sorted(t: oxlake.Table) -> None:
    scattered(t)
    t.upsert(trips([3, 4], ts=2, name="u"))  # merge-on-read: into log files
    before = t.to_arrow()
    assert len(t.file_groups()) == 30
    r = t.cluster(sort_by=["fare"])
    assert (r.replaced_file_groups, r.new_file_groups, r.records) == (30, 3, 30)
    timeline = t.timeline()
    assert (timeline[-1].time, timeline[-1].action, timeline[-1].state) == (
        r.instant,
        "replacecommit",
        "completed",
    )

    after = t.to_arrow()
    # The same records, meta columns included (commit times are kept), only file names differ.
    keep = [n for n in after.column_names if n != "_hoodie_file_name"]
    assert rows(after.select(keep), keep_meta=True) == rows(before.select(keep), keep_meta=True)
    groups = t.file_groups()
    assert sorted(g.partition for g in groups) == ["city=chennai", "city=nyc", "city=sf"]
    for g in groups:
        data = pq.read_table(Path(t.uri) / g.base_file)
        fares = data.column("fare").to_pylist()
        assert fares == sorted(fares)
        assert set(data.column("_hoodie_file_name").to_pylist()) == {Path(g.base_file).name}
    # Merge-on-read: the logs were folded in; read-optimized now equals the snapshot.
    assert rows(t.to_arrow(query="read_optimized")) == rows(after)
    # Time travel before the clustering, and hudi-rs, read the same rows.
    assert rows(t.to_arrow(as_of=timeline[-2].time)) == rows(after)
    assert rows(hudi_read(t.uri)) == rows(after)
    assert rows(hudi_read(t.uri, as_of=timeline[-2].time)) == rows(after)
    # No record changed: the window of the clustering is empty.
    assert t.to_arrow(query="incremental", start=timeline[-2].time).num_rows == 0
    assert t.to_arrow(query="changes", start=timeline[-2].time).num_rows == 0
    # Nothing left to do.
    assert t.cluster(sort_by=["fare"]).instant is None


def test_output_rolls_over_at_the_target_size(t: oxlake.Table) -> None:
    n = 60_000
    data = trips(list(range(n)))
    t.insert(
        data.set_column(4, "fare", pa.array([float((i * 7919) % n) for i in range(n)])),
        target_file_size=200_000,
    )
    assert len(t.file_groups()) > 3
    r = t.cluster(sort_by=["fare"], target_file_size=300_000)
    assert r.records == n and r.new_file_groups > 3
    # Each clustering group (at most 8 target sizes of input) is one sorted run of files; the
    # write token `<group>-<n>-1` orders the files of a run.
    runs: dict[tuple[str, int], list[tuple[int, str]]] = {}
    for g in t.file_groups():
        group, k, _ = g.base_file.rsplit("_", 2)[1].split("-")
        runs.setdefault((g.partition, int(group)), []).append((int(k), g.base_file))
    assert any(len(files) > 1 for files in runs.values())
    per_partition: dict[str, int] = {}
    for (partition, _), files in runs.items():
        fares = [
            x for _, f in sorted(files) for x in pq.read_table(Path(t.uri) / f).column("fare").to_pylist()
        ]
        assert fares == sorted(fares)
        per_partition[partition] = per_partition.get(partition, 0) + len(fares)
    assert per_partition == {"city=sf": n // 3, "city=nyc": n // 3, "city=chennai": n // 3}
    assert t.to_arrow().num_rows == n


def test_writes_after_clustering_and_clean(t: oxlake.Table) -> None:
    scattered(t, 12)
    t.cluster()
    t.upsert(trips([1, 40], ts=5, name="w"))
    t.delete(trips([2]).select(["id", "city"]))
    out = {r["id"]: r["name"] for r in rows(t.scan())}
    assert out[1] == "w1" and out[40] == "w40" and 2 not in out and len(out) == 12
    t.clean(retain=1)
    # The replaced groups are gone from disk once no retained read needs them.
    assert len(data_paths(t.uri, "*.parquet")) == len(t.file_groups())
    assert {r["id"]: r["name"] for r in rows(t.scan())} == out
    assert rows(hudi_read(t.uri)) == rows(t.to_arrow())


def test_bad_arguments(t: oxlake.Table) -> None:
    scattered(t, 4)
    with pytest.raises(oxlake.InvalidArgumentError, match="nope"):
        t.cluster(sort_by=["nope"])
    with pytest.raises(oxlake.InvalidArgumentError, match="target_file_size"):
        t.cluster(target_file_size=0)
    assert len(t.file_groups()) == 4 and [i.action for i in t.timeline()] != ["replacecommit"]


def test_a_write_during_clustering_wins(t: oxlake.Table, tmp_path: Path) -> None:
    scattered(t, 9)
    code = (
        "import oxlake, sys\n"
        f"t = oxlake.Table(sys.argv[1], heartbeat_interval={HEARTBEAT})\n"
        "try:\n"
        "    t.cluster(sort_by=['fare'])\n"
        "except oxlake.CommitConflictError as e:\n"
        "    print('conflict', e)\n"
    )
    proc = run_paused(t.uri, "cluster-before-commit", code, tmp_path)
    # The clustering wrote its files and waits to commit; a writer updates a group it rewrote, and
    # inserts (which stay out of the groups being clustered).
    t.upsert(trips([4, 50], ts=9, name="w"))
    (tmp_path / "resume").touch()
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert out.startswith("conflict")
    got = {r["id"]: r["name"] for r in rows(t.scan())}
    assert got[4] == "w4" and got[50] == "w50" and len(got) == 10
    assert not [i for i in t.timeline() if i.state != "completed"]
    assert "replacecommit" not in [i.action for i in t.timeline() if i.state == "completed"]
    # The clustering's files were removed by its rollback; a new clustering succeeds.
    assert t.cluster(sort_by=["fare"]).new_file_groups == 3
    assert {r["id"]: r["name"] for r in rows(t.scan())} == got


@pytest.mark.parametrize(
    "point", ["after-requested", "after-inflight", "cluster-before-commit", "after-commit"]
)
def test_a_crashed_clustering(t: oxlake.Table, point: str) -> None:
    """Killed at each step: readers see the committed rows throughout; the next writer rolls an
    unfinished clustering back (its files go), and a finished one simply stands."""
    scattered(t, 9)
    before = rows(t.to_arrow())
    files = set(data_paths(t.uri, "*.parquet"))
    code = f"import oxlake, sys; oxlake.Table(sys.argv[1], heartbeat_interval={HEARTBEAT}).cluster()"
    proc = subprocess.run(
        [sys.executable, "-c", code, t.uri],
        env={**os.environ, "OXLAKE_FAILPOINT": point},
        capture_output=True,
    )
    assert proc.returncode != 0
    assert rows(oxlake.Table(t.uri).to_arrow()) == before
    time.sleep(HEARTBEAT * 4)
    writer = oxlake.Table(t.uri, heartbeat_interval=HEARTBEAT)
    w = writer.upsert(trips([1], ts=3, name="x"))
    timeline = writer.timeline()
    assert not [i for i in timeline if i.state != "completed"]
    new_files = set(data_paths(t.uri, "*.parquet")) - files
    if point == "after-commit":
        assert "replacecommit" in [i.action for i in timeline] and len(writer.file_groups()) == 3
    else:
        assert "replacecommit" not in [i.action for i in timeline]
        assert [i.action for i in timeline][-2] == "rollback"
        # The clustering's files are gone; what is new on disk is the upsert's.
        assert all(w.instant in p.name for p in new_files)
    expected = {r["id"]: r["name"] for r in before}
    expected[1] = "x1"
    assert {r["id"]: r["name"] for r in rows(writer.scan())} == expected


def test_console_script(table_path: str) -> None:
    t = oxlake.create_table(table_path, SCHEMA, record_key="id", partition_by=["city"], table_version=6)
    scattered(t, 6)
    out = subprocess.run(
        [sys.executable, "-m", "oxlake.cli", "cluster", table_path, "--sort-by", "fare"],
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("cluster: 6 file groups into 3, 6 records, sorted by fare, instant ")
    assert len(t.file_groups()) == 3
