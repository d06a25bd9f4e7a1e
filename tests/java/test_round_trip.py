"""Round trips between Apache Hudi's own Spark engine and oxlake, for the Hudi version of this
process (`$OXLAKE_HUDI_VERSION`; `make java-test` runs each), copy-on-write and merge-on-read,
partitioned by `city` and not.

Each table goes through three phases, each checked against the model (hudi_model.py) by both
engines, at every completed instant and in every incremental window:
1. `java`: Java inserts, upserts (updates and new keys), deletes, and upserts a lower ordering
   value (which the table's merge mode decides: commit time on Hudi 0.15's version 6 tables,
   event time on 1.x);
2. `oxlake`: oxlake upserts and deletes on a copy of Java's table, and compacts a merge-on-read
   one (Hadoop's checksum of `hoodie.properties` goes with each rewrite: no hand work between);
3. `java-again`: Java upserts and deletes on top of a copy of phase 2, and compacts a
   merge-on-read table with `CALL run_compaction`.

Every disagreement is listed in DISAGREEMENTS (the test it makes fail, strict xfail, and why) or
pinned by a test naming the Java version (docs/JAVA_HUDI.md lists them all).
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from fnmatch import fnmatch
from pathlib import Path
from typing import Any

import oxlake
import pyarrow as pa
import pytest
from engines import JavaReader, OxlakeReader, Reader, incremental_problems, report, snapshot_problems
from hudi_model import WRITE_ACTIONS, Model, Row, completed_instants, new_write_instant, plain, trip_rows
from hudi_session import (  # noqa: F401 (hudi_fixture: the `hudi` fixture)
    NO_VERSION,
    JavaHudi,
    Operation,
    TableType,
    call,
    hudi_fixture,
    java_write,
    register,
    requested_version,
)

if requested_version() is None:  # the default `make test`: one skip, the reason naming the target
    pytest.skip(NO_VERSION, allow_module_level=True)


@dataclass(frozen=True)
class Layout:
    table_type: TableType
    partition: str | None

    @property
    def id(self) -> str:
        kind = "cow" if self.table_type == "COPY_ON_WRITE" else "mor"
        return f"{kind}-{'partitioned' if self.partition else 'unpartitioned'}"

    @property
    def mor(self) -> bool:
        return self.table_type == "MERGE_ON_READ"


LAYOUTS = [
    Layout("COPY_ON_WRITE", "city"),
    Layout("COPY_ON_WRITE", None),
    Layout("MERGE_ON_READ", "city"),
    Layout("MERGE_ON_READ", None),
]
PHASES = ["java", "oxlake", "java-again"]
ENGINES = ["java", "oxlake"]

#: Java 1.0.2 reads an incremental window's start inclusively (pinned by
#: test_java_1_0_2_incremental_start_is_inclusive).
INCLUSIVE_START = (
    "Java 1.0.2 includes the commit completing at hoodie.datasource.read.begin.instanttime in the window "
    "(the model, oxlake and Java 0.15.0, 1.1.1, 1.2.0 exclude it)"
)
#: Java 1.x's merge-on-read incremental reads return an update that lost to the stored ordering
#: value (pinned by test_java_1x_mor_incremental_returns_an_update_that_lost).
LOST_UPDATE = (
    "Java 1.x merge-on-read incremental reads return the log record of an upsert whose ordering value "
    "lost (the snapshot keeps the stored row; the model and oxlake return nothing for that window)"
)

#: oxlake's merge mode on a 0.15.0 copy-on-write table.
OXLAKE_EVENT_TIME_ON_015_COW = (
    "oxlake orders a Hudi 0.15.0 copy-on-write table by event time (it records no payload class, and "
    "has an ordering field: docs/FORMAT.md §6 rule 2), so oxlake's upsert of a lower ordering value "
    "keeps the stored row; Java 0.15.0 writes the table by commit time (its default "
    "OverwriteWithLatestAvroPayload: the upsert wins), as the model does"
)
#: Java 0.15.0 combines two log records of a key by ordering value (pinned by
#: test_java_0_15_mor_combines_log_records_by_ordering_value).
JAVA_015_LOG_PRECOMBINE = (
    "Java 0.15.0 merge-on-read snapshots combine two log records of a key by ordering value "
    "(OverwriteWithLatestAvroPayload.preCombine), not by commit time as base and log are merged: the "
    "later upsert with a lower ordering value is hidden while the earlier update is in a log too"
)

#: Disagreements found: (test, Hudi version, layout id, phase, engine) as fnmatch patterns -> why.
#: Each makes its test a strict xfail, so a fix (in oxlake, or a Java version that behaves) turns
#: it into a failure that asks for the entry to go. Java's own wrong answers are also pinned by
#: a test of their own (below), which asserts the wrong answer exactly.
DISAGREEMENTS: dict[tuple[str, str, str, str, str], str] = {
    ("test_incremental", "1.0.2", "*", "*", "java"): INCLUSIVE_START,
    ("test_incremental", "1.*", "mor-*", "java", "java"): LOST_UPDATE,
    (
        "test_oxlake_upsert_of_a_lower_ordering_value",
        "0.15.0",
        "cow-*",
        "*",
        "*",
    ): OXLAKE_EVENT_TIME_ON_015_COW,
    ("test_oxlake_upsert_of_a_lower_ordering_value", "0.15.0", "mor-partitioned", "*", "java"): (
        JAVA_015_LOG_PRECOMBINE
    ),
}


def known(test: str, version: str, layout: Layout, phase: str, engine: str) -> str | None:
    """Every reason DISAGREEMENTS gives for this test's case, joined; None when it has none."""
    case = (test, version, layout.id, phase, engine)
    whys = [
        why
        for pattern, why in DISAGREEMENTS.items()
        if all(fnmatch(v, p) for v, p in zip(case, pattern, strict=True))
    ]
    return "; ".join(whys) or None


def mark_known(
    request: pytest.FixtureRequest, hudi: JavaHudi, layout: Layout, phase: str, engine: str
) -> None:
    test = request.node.originalname
    if why := known(test, hudi.version, layout, phase, engine):
        request.applymarker(pytest.mark.xfail(strict=True, reason=f"Hudi {hudi.version} {layout.id}: {why}"))


# -- building the tables --------------------------------------------------------------------------


@dataclass
class Built:
    """A table of the suite: where it is, how Java writes it, and the model of its steps."""

    path: str
    name: str
    layout: Layout
    model: Model
    notes: dict[str, Any] = field(default_factory=dict)

    def copy_to(self, path: Path) -> Built:
        shutil.copytree(self.path, path)
        return Built(str(path), self.name, self.layout, self.model.copy())


def spark_frame(spark: Any, rows: list[Row]) -> Any:
    from pyspark.sql.types import DoubleType, LongType, StringType, StructField, StructType

    schema = StructType(
        [
            StructField("id", LongType(), False),
            StructField("name", StringType()),
            StructField("city", StringType()),
            StructField("ts", LongType()),
            StructField("fare", DoubleType()),
        ]
    )
    return spark.createDataFrame([tuple(r[c] for c in schema.fieldNames()) for r in rows], schema)


def java_step(hudi: JavaHudi, t: Built, operation: Operation, rows: list[Row], what: str, **kw: Any) -> None:
    """A Java write of `rows`, applied to the model and recorded as the step of its instant."""
    before = completed_instants(t.path) if Path(t.path, ".hoodie").is_dir() else []
    java_write(
        spark_frame(hudi.spark, rows),
        t.path,
        table_type=t.layout.table_type,
        operation=operation,
        partition=t.layout.partition,
        name=t.name,
        **kw,
    )
    if operation == "delete":
        t.model.delete(r["id"] for r in rows)
    else:
        t.model.upsert(rows)
    # A merge-on-read write may compact inline after it (a `commit`, which changes no row).
    actions = [a for a in WRITE_ACTIONS if not (t.layout.mor and a == "commit")]
    t.model.record(new_write_instant(t.path, before, actions), "java", what)


def arrow_rows(table: oxlake.Table, rows: list[Row], columns: list[str] | None = None) -> pa.Table:
    """`rows` in the table's own data schema (writes are strict about types and nullability)."""
    schema = pa.schema([f for f in table.schema if not f.name.startswith("_hoodie_")])
    if columns is not None:
        schema = pa.schema([schema.field(c) for c in columns])
    return pa.Table.from_pylist([{c: r[c] for c in schema.names} for r in rows], schema=schema)


def oxlake_step(t: Built, what: str, write: Callable[[oxlake.Table], object]) -> None:
    """An oxlake write or service on the table, recorded as the step of its instant (the model
    is changed by the caller, before)."""
    before = completed_instants(t.path)
    result = write(oxlake.Table(t.path))
    instant = new_write_instant(t.path, before)
    if isinstance(result, oxlake.WriteResult):
        assert result.instant == instant.time, (result, instant)
    t.model.record(instant, "oxlake", what)


def crc(path: str) -> Path:
    return Path(path, ".hoodie", ".hoodie.properties.crc")


def stale_crc(path: str) -> bool:
    """Whether Hadoop's checksum file of `hoodie.properties` is not the checksum of its text."""
    import struct
    import zlib

    f = crc(path)
    if not f.exists():
        return False
    raw = f.read_bytes()  # "crc\0", bytes per checksum (int32), then one CRC32 per chunk
    per = struct.unpack(">i", raw[4:8])[0]
    data = Path(path, ".hoodie", "hoodie.properties").read_bytes()
    sums = [zlib.crc32(data[i : i + per]) for i in range(0, max(len(data), 1), per)]
    return raw[8:] != b"".join(struct.pack(">I", s) for s in sums)


@pytest.fixture(scope="module", params=LAYOUTS, ids=lambda lay: lay.id)
def layout(request: pytest.FixtureRequest) -> Layout:
    return request.param  # type: ignore[no-any-return]


@pytest.fixture(scope="module")
def java_table(hudi: JavaHudi, layout: Layout, tmp_path_factory: pytest.TempPathFactory) -> Built:
    """Phase 1: a table Java wrote."""
    path = tmp_path_factory.mktemp("java") / f"trips_{layout.id.replace('-', '_')}"
    t = Built(str(path), path.name, layout, Model("event_time" if hudi.is_1x else "commit_time"))
    java_step(hudi, t, "insert", trip_rows(range(10)), "insert 0-9", mode="overwrite")
    updates = trip_rows([1, 2, 3], ts=2, name="upd") + trip_rows([10, 11], ts=2)
    java_step(hudi, t, "upsert", updates, "upsert 1-3, insert 10-11")
    java_step(hudi, t, "delete", [t.model.rows[4], t.model.rows[10]], "delete 4, 10")
    java_step(hudi, t, "upsert", trip_rows([1], ts=0, name="low"), "upsert 1 with a lower ordering value")
    return t


@pytest.fixture(scope="module")
def oxlake_on_java(java_table: Built, tmp_path_factory: pytest.TempPathFactory) -> Built:
    """Phase 2: oxlake writes (and compacts) a copy of Java's table."""
    t = java_table.copy_to(tmp_path_factory.mktemp("oxlake") / java_table.name)
    first = len(t.model.steps)
    ups = trip_rows([2, 5], ts=5, name="ox") + trip_rows([20, 21], ts=5, name="ox")
    t.model.upsert(ups)
    oxlake_step(t, "upsert 2, 5, insert 20, 21", lambda ox: ox.upsert(arrow_rows(ox, ups)))
    gone = [t.model.rows[0], t.model.rows[21]]
    t.model.delete(r["id"] for r in gone)
    oxlake_step(t, "delete 0, 21", lambda ox: ox.delete(arrow_rows(ox, gone, key_columns(t.layout))))
    if t.layout.mor:
        oxlake_step(t, "compaction", lambda ox: ox.compact())
    t.notes["first"] = first
    t.notes["stale_crc"] = stale_crc(t.path)
    return t


@pytest.fixture(scope="module")
def java_on_oxlake(hudi: JavaHudi, oxlake_on_java: Built, tmp_path_factory: pytest.TempPathFactory) -> Built:
    """Phase 3: Java writes (and compacts) on top of a copy of phase 2."""
    t = oxlake_on_java.copy_to(tmp_path_factory.mktemp("again") / oxlake_on_java.name)
    first = len(t.model.steps)
    java_step(hudi, t, "upsert", trip_rows([5, 30], ts=6, name="jv"), "upsert 5, insert 30")
    java_step(hudi, t, "delete", [t.model.rows[20]], "delete 20")
    if t.layout.mor:
        before = completed_instants(t.path)
        # Java schedules a compaction after 5 deltacommits by default: this table has had 2.
        options = "hoodie.compact.inline.max.delta.commits=1"
        call(hudi.spark, "run_compaction", op="scheduleAndExecute", path=t.path, options=options)
        t.model.record(new_write_instant(t.path, before), "java", "run_compaction")
    t.notes["first"] = first
    return t


def key_columns(layout: Layout) -> list[str]:
    return ["id", "city"] if layout.partition else ["id"]


@pytest.fixture(params=PHASES)
def phase(request: pytest.FixtureRequest) -> str:
    return request.param  # type: ignore[no-any-return]


@pytest.fixture
def table(phase: str, request: pytest.FixtureRequest) -> Built:
    name = {"java": "java_table", "oxlake": "oxlake_on_java", "java-again": "java_on_oxlake"}[phase]
    return request.getfixturevalue(name)  # type: ignore[no-any-return]


def reader(hudi: JavaHudi, engine: str, path: str) -> Reader:
    return JavaReader(hudi.spark, path) if engine == "java" else OxlakeReader(path)


# -- the round trips ------------------------------------------------------------------------------


def test_java_writes_its_table_version_and_the_models_merge_mode(hudi: JavaHudi, java_table: Built) -> None:
    """The table version of bundles.lock, and the merge mode the model applies: 0.15.0's default
    payload orders by commit time (docs/FORMAT.md §1), 1.x records event-time ordering."""
    props = dict(
        line.split("=", 1)
        for line in Path(java_table.path, ".hoodie", "hoodie.properties").read_text().splitlines()
        if "=" in line and not line.startswith("#")
    )
    assert props["hoodie.table.version"] == str(hudi.table_version)
    assert oxlake.Table(java_table.path).properties["hoodie.table.version"] == str(hudi.table_version)
    if hudi.is_1x:
        assert java_table.model.merge_mode == "event_time"
        assert props["hoodie.record.merge.mode"] == "EVENT_TIME_ORDERING"
    else:
        # 0.15.0 records its writers' default payload on merge-on-read tables only.
        assert java_table.model.merge_mode == "commit_time"
        payload = props.get("hoodie.compaction.payload.class")
        if java_table.layout.mor:
            assert payload == "org.apache.hudi.common.model.OverwriteWithLatestAvroPayload"
        else:
            assert payload is None


@pytest.mark.parametrize("engine", ENGINES)
def test_timeline(
    request: pytest.FixtureRequest, hudi: JavaHudi, layout: Layout, table: Built, phase: str, engine: str
) -> None:
    """Each engine's completed write instants are the ones storage holds, in completion order."""
    mark_known(request, hudi, layout, phase, engine)
    # Completion times as storage names them (versions 8 and 9; version 6 has none).
    done = hudi.table_version >= 8
    expected = [
        (s.instant.time, s.instant.completion if done else "", s.instant.action) for s in table.model.steps
    ]
    if engine == "oxlake":
        got = [
            (i.time, (i.completion or "") if done else "", i.action)
            for i in sorted(
                oxlake.Table(table.path).timeline(), key=lambda i: (i.completion or i.time, i.time)
            )
            if i.state == "completed" and i.action in WRITE_ACTIONS
        ]
    else:
        rows = call(hudi.spark, "show_commits", table=register(hudi.spark, table.path), limit=100)
        got = [(r["commit_time"], r["state_transition_time"] if done else "", r["action"]) for r in rows]
        got.sort(key=lambda r: (r[1], r[0]))
        expected.sort(key=lambda r: (r[1], r[0]))
    assert got == expected


@pytest.mark.parametrize("engine", ENGINES)
def test_snapshot_at_every_instant(
    request: pytest.FixtureRequest, hudi: JavaHudi, layout: Layout, table: Built, phase: str, engine: str
) -> None:
    mark_known(request, hudi, layout, phase, engine)
    first = table.notes.get("first", 0)
    problems = snapshot_problems(reader(hudi, engine, table.path), table.model.steps, first)
    assert not problems, report(reader(hudi, engine, table.path), f"the {phase} phase", problems)


@pytest.mark.parametrize("engine", ENGINES)
def test_incremental(
    request: pytest.FixtureRequest, hudi: JavaHudi, layout: Layout, table: Built, phase: str, engine: str
) -> None:
    mark_known(request, hudi, layout, phase, engine)
    first = max(table.notes.get("first", 0) - 1, 0)  # from the step before the phase's first
    r = reader(hudi, engine, table.path)
    problems = incremental_problems(r, table.model.steps, hudi.table_version, first)
    assert not problems, report(r, f"the {phase} phase", problems)


@pytest.mark.parametrize("engine", ENGINES)
def test_read_optimized_after_compaction(
    request: pytest.FixtureRequest, hudi: JavaHudi, layout: Layout, table: Built, phase: str, engine: str
) -> None:
    """Read-optimized reads see the model once every file group is compacted (copy-on-write
    tables: always)."""
    if layout.mor and table.model.steps[-1].what not in ("compaction", "run_compaction"):
        pytest.skip("merge-on-read: this phase ends with updates in log files")
    mark_known(request, hudi, layout, phase, engine)
    r = reader(hudi, engine, table.path)
    assert r.read_optimized() == table.model.current()


@pytest.fixture(scope="module")
def oxlake_lower_ordering(java_table: Built, tmp_path_factory: pytest.TempPathFactory) -> Built:
    """A copy of Java's table after oxlake's upsert of key 3 (updated by Java to `ts=2`) with
    `ts=0`: the table's merge mode decides."""
    t = java_table.copy_to(tmp_path_factory.mktemp("lower") / java_table.name)
    low = trip_rows([3], ts=0, name="oxlow")
    t.model.upsert(low)
    oxlake_step(t, "upsert 3 with a lower ordering value", lambda ox: ox.upsert(arrow_rows(ox, low)))
    return t


@pytest.mark.parametrize("engine", ENGINES)
def test_oxlake_upsert_of_a_lower_ordering_value(
    request: pytest.FixtureRequest, hudi: JavaHudi, layout: Layout, oxlake_lower_ordering: Built, engine: str
) -> None:
    """Commit time on 0.15.0's tables (the upsert wins), event time on 1.x's (the stored row)."""
    mark_known(request, hudi, layout, "oxlake", engine)
    t = oxlake_lower_ordering
    assert t.model.rows[3]["name"] == ("upd3" if hudi.is_1x else "oxlow3")
    r = reader(hudi, engine, t.path)
    problems = snapshot_problems(r, t.model.steps, len(t.model.steps) - 1)
    assert not problems, report(r, "an upsert of a lower ordering value", problems)


def test_oxlake_leaves_no_stale_properties_crc(hudi: JavaHudi, layout: Layout, oxlake_on_java: Built) -> None:
    """issue 73 item 0: oxlake rewrites `hoodie.properties` (retiring Java's metadata table) and
    removes Hadoop's checksum of the old text beside it, which Java's `LocalFileSystem` would
    refuse (`HoodieIOException: Could not load Hoodie properties`)."""
    assert not oxlake_on_java.notes["stale_crc"]


@pytest.fixture(scope="module")
def table_oxlake_rewrote(java_table: Built, tmp_path_factory: pytest.TempPathFactory) -> Built:
    """A copy of Java's table after one oxlake upsert."""
    t = java_table.copy_to(tmp_path_factory.mktemp("crc") / java_table.name)
    ups = trip_rows([7], ts=9, name="ox")
    t.model.upsert(ups)
    oxlake_step(t, "upsert 7", lambda ox: ox.upsert(arrow_rows(ox, ups)))
    return t


def test_java_reads_after_an_oxlake_write(hudi: JavaHudi, table_oxlake_rewrote: Built) -> None:
    t = table_oxlake_rewrote
    assert JavaReader(hudi.spark, t.path).snapshot() == t.model.current()


def test_java_writes_after_an_oxlake_write(
    hudi: JavaHudi, table_oxlake_rewrote: Built, tmp_path_factory: pytest.TempPathFactory
) -> None:
    t = table_oxlake_rewrote.copy_to(tmp_path_factory.mktemp("crcw") / table_oxlake_rewrote.name)
    java_step(hudi, t, "upsert", trip_rows([8], ts=9, name="jv"), "upsert 8")
    assert OxlakeReader(t.path).snapshot() == t.model.current()


# -- Java's own wrong answers, pinned ----------------------------------------------------------------


@pytest.fixture(scope="module")
def updated_in_logs(hudi: JavaHudi, tmp_path_factory: pytest.TempPathFactory) -> Built:
    """A merge-on-read table whose 10 rows were all updated once, the updates in log files."""
    path = tmp_path_factory.mktemp("logs") / "trips_updated_in_logs"
    t = Built(str(path), path.name, Layout("MERGE_ON_READ", None), Model("event_time"))
    java_step(hudi, t, "insert", trip_rows(range(10)), "insert 0-9", mode="overwrite")
    java_step(hudi, t, "upsert", trip_rows(range(10), ts=2, name="upd"), "upsert 0-9")
    return t


def test_java_1x_filter_misses_rows_updated_in_log_files(hudi: JavaHudi, updated_in_logs: Built) -> None:
    """Hudi 1.0.2, 1.1.1 and 1.2.0 return none of the 10 rows for `name like 'upd%'` on a
    merge-on-read table whose updates are in log files, while the unfiltered read shows them all;
    Hudi 0.15.0 and oxlake return the 10 rows of the model."""
    t = updated_in_logs
    assert any(p.name.startswith(".") and ".log." in p.name for p in Path(t.path).iterdir())
    expected = [r for r in t.model.current() if r["name"].startswith("upd")]
    assert len(expected) == 10
    java = JavaReader(hudi.spark, t.path)
    assert java.snapshot() == t.model.current()
    assert OxlakeReader(t.path).filtered("name like 'upd%'") == expected
    got = java.filtered("name like 'upd%'")
    if hudi.is_1x:
        assert got == [], f"Hudi {hudi.version} no longer misses the rows in log files: unpin"
    else:
        assert got == expected


def test_java_1_0_2_incremental_start_is_inclusive(hudi: JavaHudi, java_table: Built) -> None:
    """Hudi 1.0.2 returns the records of the commit whose completion time is the window's start
    (`hoodie.datasource.read.begin.instanttime`) as well as the later ones; 0.15.0 (instant times),
    1.1.1, 1.2.0 and oxlake start after it, as the model does."""
    a, b = java_table.model.steps[:2]
    v = hudi.table_version
    got = JavaReader(hudi.spark, java_table.path).incremental(a.checkpoint(v), b.checkpoint(v))
    assert OxlakeReader(java_table.path).incremental(a.checkpoint(v), b.checkpoint(v)) == b.changed_after(0)
    if hudi.version == "1.0.2":
        assert got == b.changed_after(-1), (
            "Hudi 1.0.2 starts incremental windows after their start now: unpin"
        )
    else:
        assert got == b.changed_after(0)


def test_java_1x_mor_incremental_returns_an_update_that_lost(
    hudi: JavaHudi, layout: Layout, java_table: Built
) -> None:
    """The window of the upsert of key 1 with a lower ordering value (step 3): on 1.x tables
    (event time) the stored row wins, so nothing changed; Hudi 1.0.2, 1.1.1 and 1.2.0 return the
    losing record from a merge-on-read table's log all the same, while their snapshot keeps the
    winner. Copy-on-write tables, 0.15.0 (commit time: the upsert wins) and oxlake agree with the
    model."""
    steps = java_table.model.steps
    a, b = steps[2], steps[3]
    assert b.what.startswith("upsert 1 with a lower")
    v = hudi.table_version
    java = JavaReader(hudi.spark, java_table.path)
    assert java.snapshot(as_of=b.instant.time) == plain(b.rows.values())
    assert OxlakeReader(java_table.path).incremental(a.checkpoint(v), b.checkpoint(v)) == b.changed_after(2)
    got = java.incremental(a.checkpoint(v), b.checkpoint(v))
    if hudi.is_1x and layout.mor:
        assert b.changed_after(2) == []
        assert got == plain(trip_rows([1], ts=0, name="low")), (
            f"Hudi {hudi.version} no longer returns it: unpin"
        )
    else:
        assert got == b.changed_after(2)


@pytest.fixture(scope="module")
def java_lower_in_logs(
    updated_in_logs: Built, tmp_path_factory: pytest.TempPathFactory, hudi: JavaHudi
) -> Built:
    """A copy of `updated_in_logs` after Java's upsert of key 0 with `ts=0`: its update (`ts=2`)
    and this upsert are both log records."""
    t = updated_in_logs.copy_to(tmp_path_factory.mktemp("lowlogs") / updated_in_logs.name)
    t.model.merge_mode = "event_time" if hudi.is_1x else "commit_time"
    java_step(hudi, t, "upsert", trip_rows([0], ts=0, name="low"), "upsert 0 with a lower ordering value")
    return t


def test_java_0_15_mor_combines_log_records_by_ordering_value(
    hudi: JavaHudi, java_lower_in_logs: Built
) -> None:
    """Hudi 0.15.0 (commit time: `OverwriteWithLatestAvroPayload`) lets a later upsert with a
    lower ordering value win over a row in a base file (phase 1 of the round trips), but not over
    an update in an earlier log file: its log scanner combines the two log records with
    `preCombine`, which orders by the ordering field, so the snapshot shows `upd0` (ts 2) where the
    model and oxlake show `low0`. On 1.x (event time) the stored row wins everywhere."""
    t = java_lower_in_logs
    expected = t.model.current()
    assert OxlakeReader(t.path).snapshot() == expected
    got = JavaReader(hudi.spark, t.path).snapshot()
    if hudi.is_1x:
        assert expected[0]["name"] == "upd0"
        assert got == expected
    else:
        assert expected[0]["name"] == "low0"
        hidden = [dict(expected[0], name="upd0", ts=2), *expected[1:]]
        assert got == hidden, "Hudi 0.15.0 merges log records by commit time now: unpin"
