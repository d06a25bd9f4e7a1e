"""Shared helpers: tables in temporary folders, rows as sorted plain data."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import oxlake
import pyarrow as pa
import pytest
from hypothesis import settings

ROOT = Path(__file__).resolve().parent.parent

# Property tests check results, not time: Hypothesis's default deadline (200 ms an example)
# failed a law whose example ran 277 ms on this two-core box under a benchmark.
settings.register_profile("oxlake", deadline=None)
settings.load_profile("oxlake")
#: The folder holding Apache Hudi's corpus (`compat/`: tables Apache Hudi wrote, its Avro
#: schemas): `$OXLAKE_SHARED`, else `../shared` beside the repository (CONTRIBUTING.md).
SHARED = Path(os.environ.get("OXLAKE_SHARED") or ROOT.parent / "shared")
COMPAT = SHARED / "compat" / "hudi"
AVSC = SHARED / "compat" / "avro"
#: Why the tests that need the corpus are skipped without it (`.ci/run` requires it).
CORPUS_ABSENT = (
    f"the Apache Hudi corpus is not at {SHARED / 'compat'}: set OXLAKE_SHARED to the folder holding compat/"
)


def require_corpus() -> None:
    """Skips the calling test, naming the setting, when the corpus is absent."""
    if not (COMPAT.is_dir() and AVSC.is_dir()):
        pytest.skip(CORPUS_ABSENT)


def hudi_avro_schema(name: str) -> Any:
    """Apache Hudi's reader schema of the record `name` (its `.avsc` in `../shared/compat/avro`),
    parsed with the named types the other `.avsc` files define (licence comments stripped, as
    that folder's README says)."""
    import json
    import re

    import fastavro

    require_corpus()

    raws = [
        json.loads(re.sub(r"/\*.*?\*/", "", p.read_text(), flags=re.S)) for p in sorted(AVSC.glob("*.avsc"))
    ]
    target = next(s for s in raws if s["name"] == name)
    named: dict[str, Any] = {}
    pending = [s for s in raws if s is not target]
    while pending:
        left = []
        for s in pending:
            try:
                fastavro.parse_schema(s, named_schemas=named)
            except fastavro.schema.UnknownType:
                left.append(s)  # needs a type defined later (or by `target`)
        if len(left) == len(pending):
            break
        pending = left
    return fastavro.parse_schema(target, named_schemas=named)


SCHEMA = pa.schema(
    [
        pa.field("id", pa.int64(), nullable=False),
        pa.field("name", pa.string()),
        pa.field("city", pa.string()),
        pa.field("ts", pa.int64()),
        pa.field("fare", pa.float64()),
    ]
)


def rows(
    data: pa.Table | oxlake.Scan, *, keep_meta: bool = False, key: str | tuple[str, ...] = "id"
) -> list[dict[str, Any]]:
    """Rows as dicts without meta fields, sorted by `key`."""
    table = data.to_arrow() if isinstance(data, oxlake.Scan) else data
    if not keep_meta:
        table = table.select([n for n in table.column_names if not n.startswith("_hoodie_")])
    out = table.to_pylist()
    keys = (key,) if isinstance(key, str) else key
    return sorted(out, key=lambda r: tuple((r[k] is None, r[k]) for k in keys))


def trips(
    ids: list[int], *, ts: int = 1, city: str | None = None, fare: float = 10.0, name: str = "n"
) -> pa.Table:
    cities = ["sf", "nyc", "chennai"]
    return pa.table(
        {
            "id": pa.array(ids, pa.int64()),
            "name": [f"{name}{i}" for i in ids],
            "city": [city if city is not None else cities[i % 3] for i in ids],
            "ts": pa.array([ts] * len(ids), pa.int64()),
            "fare": [fare + i for i in ids],
        },
        schema=SCHEMA,
    )


@pytest.fixture
def table_path(tmp_path: Path) -> str:
    return str(tmp_path / "t")


def checkpoint(result: oxlake.WriteResult) -> str:
    """Where an incremental read continues after the write `result`: its instant on a version 6
    table, its completion time on versions 8 and 9 (windows of completion times)."""
    assert result.instant is not None
    return result.completion or result.instant


def data_paths(root: str | Path, pattern: str) -> list[Path]:
    """The files of the data table under `root` matching `pattern`, sorted: not those of its
    metadata table (`.hoodie/oxlake/metadata`), which every new table has."""
    return sorted(p for p in Path(root).rglob(pattern) if ".hoodie" not in p.relative_to(root).parts)


def trips_table(path: str, **options: Any) -> oxlake.Table:
    """A new table for `trips` rows: keyed by id, partitioned by city, ordered by ts."""
    return oxlake.create_table(
        path, SCHEMA, record_key="id", partition_by=["city"], ordering_field="ts", **options
    )


@pytest.fixture
def table(table_path: str) -> oxlake.Table:
    return trips_table(table_path)


def snapshot(t: oxlake.Table) -> tuple[list, list, list]:
    """Rows, timeline and files (heartbeats aside): what a refused write must leave as it was."""
    files = sorted(
        str(p.relative_to(t.uri))
        for p in Path(t.uri).rglob("*")
        if p.is_file() and ".heartbeat" not in str(p)
    )
    return rows(t.scan()), t.timeline(), files


def data_files(t: oxlake.Table) -> set[str]:
    """The data files of a table (its timeline and partition markers aside)."""
    root = Path(t.uri)
    return {
        str(p.relative_to(root))
        for p in root.rglob("*")
        if p.is_file() and ".hoodie" not in p.parts and not p.name.startswith(".hoodie_partition")
    }


@pytest.fixture
def filled(table: oxlake.Table) -> oxlake.Table:
    table.insert(trips(list(range(6))))
    return table


def python() -> str:
    return sys.executable


def hudi_read(
    path: str,
    *,
    as_of: str | None = None,
    start: str | None = None,
    end: str | None = None,
    read_optimized: bool = False,
) -> pa.Table:
    """Reads a table with hudi-rs (PyPI `hudi`), the second reader of everything we write."""
    from hudi import HudiQueryType, HudiReadOptions, HudiTableBuilder

    table = HudiTableBuilder.from_base_uri(path).build()
    opts = HudiReadOptions()
    if start is not None or end is not None:
        opts = opts.with_query_type(HudiQueryType.Incremental)
        if start is not None:
            opts = opts.with_start_timestamp(start)
        if end is not None:
            opts = opts.with_end_timestamp(end)
    elif as_of is not None:
        opts = opts.with_as_of_timestamp(as_of)
    if read_optimized:
        opts = opts.with_hudi_option("hoodie.read.use.read_optimized.mode", "true")
    batches = table.read(opts)
    if not batches:
        return pa.table({})
    return pa.Table.from_batches(batches)


def run_paused(
    table_path: str, point: str, code: str, tmp: Path, env: dict[str, str] | None = None
) -> subprocess.Popen[str]:
    """Runs `code` (argv[1]: the table) in another process; returns once it waits at the pause
    point `point` (`tmp/resume` lets it go on)."""
    env = {**(env or os.environ), "OXLAKE_PAUSEPOINT": point, "OXLAKE_PAUSE_DIR": str(tmp)}
    proc = subprocess.Popen(
        [sys.executable, "-c", code, table_path],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 60
    while not (tmp / "reached").exists():
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline
        time.sleep(0.02)
    return proc


def race_past_the_intents(table_path: str, tmp_path: Path, code_a: str, code_b: str) -> tuple[int, str]:
    """Two writes in other processes (`code_*`, argv[1]: the table) interleaved at pause points:
    A passes its conflict check and waits before completing; B, later, waits between its look
    at the timeline (A pending) and its listing of the intents; A completes (asserted), then B
    goes on. Returns B's exit code and stderr."""
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).parent))
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    a = run_paused(table_path, "after-metadata-sync", code_a, tmp_path / "a", env)
    b = run_paused(table_path, "before-intents", code_b, tmp_path / "b", env)
    (tmp_path / "a" / "resume").touch()
    _, err = a.communicate(timeout=120)
    assert a.returncode == 0, err
    (tmp_path / "b" / "resume").touch()
    _, err = b.communicate(timeout=120)
    return b.returncode, err


@dataclass
class Paused:
    """A process `paused` held, then let go: its exit code and output once the block ended."""

    proc: subprocess.Popen[str]
    out: str = ""
    err: str = ""

    @property
    def returncode(self) -> int | None:
        return self.proc.returncode


@contextlib.contextmanager
def paused(table_path: str, point: str, code: str, tmp: Path) -> Iterator[Paused]:
    """`code` (argv[1]: the table) run in another process and held at the pause point `point`
    for the block; let go, and waited for, when the block ends."""
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).parent))
    held = Paused(run_paused(table_path, point, code, tmp, env))
    try:
        yield held
    finally:
        (tmp / "resume").touch()
        held.out, held.err = held.proc.communicate(timeout=120)
