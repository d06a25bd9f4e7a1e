"""Zero-byte files of every kind under `.hoodie/` (issue 71, "how it is verified"): each file of
a real table (versions 6 and 8, both table types, the metadata table with every index, archived
timeline on both tables) emptied in turn. Reads (snapshot, as of, incremental, changes, lookups)
give the rows they gave before or a typed error naming the file, never fewer rows; a write and
the table services either succeed with every committed row kept or fail typed leaving the table
as it was; `validate()` reports the empty file, unless Apache Hudi (or oxlake's protocol) writes
that kind of file empty itself (`WRITTEN_EMPTY`)."""

from __future__ import annotations

import atexit
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import oxlake
import pyarrow as pa
import pytest
from conftest import SCHEMA, trips

BEAT = 0.2
LAYOUTS = [(6, "copy_on_write"), (6, "merge_on_read"), (8, "copy_on_write"), (8, "merge_on_read")]


# -- the tables -----------------------------------------------------------------------------


@dataclass
class Template:
    """A built table and what every read of it gives."""

    path: Path
    version: int
    table_type: str
    #: Read name -> its arguments to `Table.to_arrow` (or "lookup").
    reads: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: Read name -> the rows it gave before any damage.
    expected: dict[str, Any] = field(default_factory=dict)
    #: The same after `WRITE`, and after the `SERVICES`.
    after_write: dict[str, Any] = field(default_factory=dict)
    after_services: dict[str, Any] = field(default_factory=dict)
    #: Its files (size, modification time): the cases share it, never change it.
    listing: dict[str, tuple[int, int]] = field(default_factory=dict)


def crash(path: str, call: str) -> None:
    """Runs `Table(path).<call>` in another process that dies right after its inflight file."""
    code = f"import oxlake, sys; oxlake.Table(sys.argv[1], heartbeat_interval={BEAT}).{call}"
    env = {**os.environ, "OXLAKE_FAILPOINT": "after-inflight", "PYTHONPATH": str(Path(__file__).parent)}
    proc = subprocess.run([sys.executable, "-c", code, path], env=env, capture_output=True)
    assert proc.returncode != 0, proc.stderr


def canon(table: pa.Table) -> list[tuple]:
    """Rows without the meta fields (`_change_type` kept), in a stable order."""
    table = table.select([n for n in table.column_names if not n.startswith("_hoodie_")])
    return sorted(tuple(sorted(r.items())) for r in table.to_pylist())


def read(t: oxlake.Table, args: dict[str, Any]) -> list[tuple]:
    """The rows of one read."""
    if args.get("lookup"):
        return canon(t.lookup(pa.table({"id": pa.array(args["lookup"], pa.int64())})))
    return canon(t.to_arrow(**args))


def read_or_error(t: oxlake.Table, args: dict[str, Any]) -> Any:
    """The rows of one read, or its typed error (class and message)."""
    try:
        return read(t, args)
    except oxlake.OxlakeError as e:
        return (type(e).__name__, str(e))


def build(path: Path, version: int, table_type: str) -> Template:
    """A table whose `.hoodie/` holds every kind of file oxlake writes: instants of every action
    (commit, deltacommit, compaction, clean, rollback, restore, savepoint, replacecommit,
    indexing) in every state, a pending write (its heartbeat) and, on merge-on-read, a pending
    compaction; the archived timeline; the metadata table with all four indexes, compacted and
    archived; oxlake's own records (fates, claims, markers)."""
    t = oxlake.create_table(
        str(path),
        SCHEMA,
        record_key="id",
        partition_by=["city"],
        ordering_field="ts",
        table_type=table_type,
        table_version=version,
        heartbeat_interval=BEAT,
    )
    mor = table_type == "merge_on_read"
    t.set_archival(2, 3, inline=False)
    t.insert(trips(list(range(6))))
    # A restore and a rollback first: each rebuilds the metadata table (its compacted and
    # archived files would go with it).
    saved = t.upsert(trips([2], ts=2, name="b")).instant
    t.savepoint(saved)
    t.upsert(trips([3], ts=3, name="c"))
    t.restore(saved)
    t.delete_savepoint(saved)
    t.rollback(t.upsert(trips([4], ts=4, name="d")).instant)
    t.build_metadata(1, column_stats_shards=1, bloom_filters_shards=1, record_index_shards=1)
    # Then commits archival moves, readable as of the last of them (`as_of`): no later commit
    # before what the clean retains touches their partitions (writes to `la` instead).
    for n in range(6):
        t.upsert(trips([n % 6, 10 + n], ts=10 + n, name=f"u{n}-"))
        if n == 4:
            # Compacted and cleaned before the schema change: `validate` takes a log holding
            # only deletes for different statistics after `add_column` (issue 71 item 7).
            t.delete(trips([5], ts=20))
        if mor and n in (2, 4):
            t.compact()
    readable = t.upsert(trips([1, 16], ts=21, name="x"))
    for n in range(8):
        t.upsert(trips([100, 101 + n], ts=30 + n, city="la", name=f"la{n}-"))
    assert t.clean(retain=2)
    assert t.archive()
    if not mor:
        # A second build: `indexing` instants on the active timeline (archival took the first).
        # The merge-on-read tables keep theirs, compacted and archived, for its kinds of files.
        t.build_metadata(1, column_stats_shards=1, bloom_filters_shards=1, record_index_shards=1)
    bulk = t.bulk_insert(trips([20, 21, 22], ts=40, name="a"))  # file groups of their own, to cluster
    assert t.cluster(small_file_limit=1 << 30).instant
    saved = t.upsert(trips([2, 23], ts=41, name="s")).instant
    if mor:
        assert t.compact().instants  # a completed compaction on the active timeline
    t.savepoint(saved)
    with t.update_schema() as u:  # `.hoodie/.schema`
        u.add_column("note", pa.string())
    t.upsert(trips([3, 24], ts=42, name="l"), schema_mode="merge")
    if mor:
        t.upsert(trips([0, 4], ts=43, name="m"), schema_mode="merge")
        crash(str(path), "compact()")  # a pending compaction, its slice claims
    crash(str(path), "upsert(__import__('conftest').trips([9], ts=99, name='p'), schema_mode='merge')")
    time.sleep(BEAT * 4)  # both writers gone: a pending write, its heartbeat

    t = oxlake.Table(str(path), heartbeat_interval=BEAT)
    report = t.validate()
    assert report.ok, report
    every = [i for i in t.timeline(include_archived=True) if i.state == "completed"]
    active = {i.time for i in t.timeline()}
    data = [i for i in every if i.action in ("commit", "deltacommit", "replacecommit")]
    archived = [i for i in data if i.time not in active]
    kept = [i for i in data if i.time in active]
    assert len(archived) >= 3 and len(kept) >= 3, (archived, kept)
    # The latest archived commit of the first partitions: nothing it reads was cleaned.
    x = [i for i in archived if i.time <= readable.instant][-1]
    later = [i for i in kept if i.time >= bulk.instant]

    def done(i: oxlake.Instant) -> str:
        return i.completion or i.time

    template = Template(path, version, table_type)
    template.reads = {
        "snapshot": {},
        "filtered": {"filter": "fare >= 0"},
        "lookup": {"lookup": list(range(25))},
        "as_of_archived": {"as_of": x.time},
        "as_of_active": {"as_of": saved},
        "incremental_archived": {"query": "incremental", "start": done(archived[0]), "end": done(x)},
        "incremental_all": {"query": "incremental", "end": done(kept[-1])},
        "incremental_active": {"query": "incremental", "start": done(later[0]), "end": done(later[-1])},
        "changes_active": {"query": "changes", "start": done(later[0]), "end": done(later[-1])},
    }
    template.expected = {name: read_or_error(t, args) for name, args in template.reads.items()}
    errors = {name: e for name, e in template.expected.items() if not isinstance(e, list)}
    assert not errors, errors
    # What the write and the services give on the undamaged table.
    write = copy(template, path.with_name(path.name + "-write"))
    oxlake.Table(str(write), heartbeat_interval=BEAT).upsert(WRITE, schema_mode="merge")
    template.after_write = reads(template, write, AFTER_WRITE)
    services = copy(template, path.with_name(path.name + "-services"))
    for name, run in SERVICES:
        if name != "compact" or mor:
            done_ = run(oxlake.Table(str(services), heartbeat_interval=BEAT))
            # Copy-on-write: the second build holds archival back until the metadata table
            # compacts (`metadata::archival_bound`); archival still reads the timeline.
            assert done_ or (name == "archive" and not mor), f"{name} does something"
    template.after_services = reads(template, services, AFTER_SERVICES)
    shutil.rmtree(write)
    shutil.rmtree(services)
    template.listing = listing(path)
    return template


#: The write: an update routed through the indexes, and an insert.
WRITE = trips([3, 40], ts=100, name="w")
#: The table services, in order: each finds something to do on every template.
SERVICES: list[tuple[str, Callable[[oxlake.Table], Any]]] = [
    ("rollback_failed", lambda t: t.rollback_failed()),
    ("compact", lambda t: t.compact().instants),
    ("clean", lambda t: t.clean(retain=2)),
    ("archive", lambda t: t.archive()),
]
#: Reads no table service changes (a service that fails leaves these as they were).
INVARIANT = ("snapshot", "filtered", "lookup", "as_of_active")
#: Reads checked again after the write (what it changes, and the history a write could lose).
AFTER_WRITE = ("snapshot", "lookup", "as_of_archived", "incremental_all")
#: Reads checked again after the services.
AFTER_SERVICES = (
    "snapshot",
    "lookup",
    "as_of_archived",
    "incremental_archived",
    "incremental_all",
    "changes_active",
)


def copy(template: Template, to: Path, damaged: str | None = None) -> Path:
    """A copy of the template's table at `to`, with the file `damaged` (relative) emptied. Files
    are hard links: storage writes a new file and renames it over the old, never in place (the
    template's listing is checked before every case). The emptied file keeps its modification
    time: what is tested is its content (a heartbeat's time is a beat of its own)."""
    shutil.copytree(template.path, to, copy_function=os.link)
    if damaged is not None:
        target = to / damaged
        stat = target.stat()
        target.unlink()
        target.write_bytes(b"")
        os.utime(target, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    return to


def listing(path: Path) -> dict[str, tuple[int, int]]:
    return {str(p.relative_to(path)): (p.stat().st_size, p.stat().st_mtime_ns) for p in path.rglob("*")}


def reads(template: Template, path: Path, only: tuple[str, ...] = ()) -> dict[str, Any]:
    """The reads of the template's list (all, or `only` these) on the table at `path`, each on
    a new handle."""
    out: dict[str, Any] = {}
    for name, args in template.reads.items():
        if only and name not in only:
            continue
        try:
            t = oxlake.Table(str(path), heartbeat_interval=BEAT)
        except oxlake.OxlakeError as e:
            out[name] = (type(e).__name__, str(e))
            continue
        out[name] = read_or_error(t, args)
    return out


_ROOT = Path(tempfile.mkdtemp(prefix="oxlake-damaged-empty-"))
atexit.register(shutil.rmtree, _ROOT, True)
_TEMPLATES: dict[tuple[int, str], Template] = {}


def template(version: int, table_type: str) -> Template:
    """The table of (version, type), built once per session (at collection: its listing makes
    the parameters)."""
    key = (version, table_type)
    if key not in _TEMPLATES:
        _TEMPLATES[key] = build(_ROOT / f"v{version}-{table_type}", version, table_type)
    return _TEMPLATES[key]


# -- the kinds of files ---------------------------------------------------------------------


def kind_of(rel: str) -> str:
    """A file's kind: its path under `.hoodie/` with times (T), file ids (F), hashes (H) and
    other numbers (N) generalized."""
    rel = rel.removeprefix(".hoodie/")
    rel = re.sub(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}-\d+", "F", rel)
    rel = re.sub(r"(?<=_)[0-9a-f]{16}$", "H", rel)
    rel = re.sub(r"\d{17,}", "T", rel)
    rel = re.sub(r"\d+", "N", rel)
    return rel


def kinds(template: Template) -> dict[str, list[Path]]:
    """Kind -> the template's files of that kind under `.hoodie/`, newest last."""
    out: dict[str, list[Path]] = {}
    files = [p for p in (template.path / ".hoodie").rglob("*") if p.is_file()]
    for p in sorted(files, key=lambda p: (p.stat().st_mtime_ns, p.name)):
        out.setdefault(kind_of(str(p.relative_to(template.path))), []).append(p)
    return out


#: Kinds of files Apache Hudi or oxlake itself writes empty (or whose emptiness nothing reads as
#: a record of anything), with why: emptied, the table is as good as before, and `validate()`
#: must not report them. Every other kind emptied is damage: `validate()` names it.
WRITTEN_EMPTY: dict[str, str] = {
    r"(timeline/)?T\.(commit|deltacommit|indexing)\.requested": "Java writes a write's requested file "
    "empty (oxlake too; its `indexing` request holds no plan)",
    r"(timeline/)?T\.(deltacommit\.|replacecommit\.|compaction\.|clustering\.|indexing\.)?inflight": "Java "
    "writes inflight files empty or with commit metadata no reader takes back (`HoodieCommitMetadata."
    "fromBytes` reads empty as empty; plans are read from the requested file)",
    r"(timeline/)?T\.(rollback|restore|savepoint)\.inflight": "written empty, by Java and oxlake",
    r"T\.replacecommit\.requested": "Java writes an insert overwrite's request empty; "
    "`ClusteringUtils.getRequestedReplaceMetadata` reads it as no clustering (the completed file "
    "names the replaced groups)",
    r"(timeline/)?T\.clean\.(requested|inflight)": "earlier Java writers left empty clean plans; Java "
    "deletes an empty pending clean (`deleteEmptyInstantIfExists`), oxlake completes it deleting nothing",
    r"\.heartbeat/T": "Java's heartbeat is an empty file, touched: its modification time is the beat",
    r"(oxlake/metadata/\.hoodie/)?oxlake/(rolled_back/T|archiving/N/T_T)": "oxlake's markers: the name is "
    "the record, written empty",
    r"oxlake/metadata/\.hoodie/T\.(deltacommit\.requested|deltacommit\.inflight|compaction\.inflight)": "the "
    "metadata table writes them empty",
    r"oxlake/claims/N/T": "a claim counts by its name (the time taken); its content only says whose "
    "completion it holds while that instant is pending (`commit/completion.rs:completing`; empty reads as "
    "none, and oxlake's earlier claims were empty): the claims emptied here are of settled instants",
    r"(oxlake/metadata/\.hoodie/)?oxlake/pruned": "when markers were last pruned: empty reads as never, "
    "and the next clean prunes and writes it again",
}


def written_empty(kind: str) -> bool:
    return any(re.fullmatch(pattern, kind) for pattern in WRITTEN_EMPTY)


#: Kinds of which the oldest file is emptied too, beside the newest: the next instants archival
#: moves, the fate of a completed instant (the newest is the pending write's), the first schema.
BOTH_ENDS = (
    r"(timeline/)?T(_T)?\.(commit|deltacommit|rollback)",
    r"oxlake/fate/T",
    r"\.schema/T\.schemacommit",
)


def cases() -> list[Any]:
    """A case per kind of file of each table (its newest file; for `BOTH_ENDS` the oldest too),
    made from the listing: a new kind of file is covered as soon as a table holds one."""
    with ThreadPoolExecutor(2) as pool:  # the core releases the GIL: two tables build at once
        list(pool.map(lambda layout: template(*layout), LAYOUTS))
    out = []
    for version, table_type in LAYOUTS:
        t = template(version, table_type)
        for kind, files in kinds(t).items():
            chosen = [("", files[-1])]
            if len(files) > 1 and any(re.fullmatch(p, kind) for p in BOTH_ENDS):
                chosen.append(("-oldest", files[0]))
            for which, target in chosen:
                if target.stat().st_size == 0:
                    continue  # written so: `test_files_written_empty_are_of_the_kinds_listed`
                rel = str(target.relative_to(t.path))
                case_id = f"v{version}-{table_type}-{kind}{which}"
                out.append(pytest.param(version, table_type, kind, rel, id=case_id))
    return out


class Findings:
    """What went wrong in one case, every step checked before the test fails. For a kind written
    empty (`strict`), no step may even fail naming the file."""

    def __init__(self, target: Path, strict: bool) -> None:
        self.name = target.name
        self.strict = strict
        self.lines: list[str] = []

    def named(self, message: str) -> bool:
        return not self.strict and self.name in message

    def typed(self, step: str, e: oxlake.OxlakeError) -> None:
        if not self.named(str(e)):
            self.lines.append(
                f"{step}: {type(e).__name__} (naming the file? {self.name in str(e)}): {str(e)[:400]}"
            )

    def reads(self, step: str, got: dict[str, Any], expected: dict[str, Any]) -> None:
        for name, value in got.items():
            want = expected[name]
            if value == want or (isinstance(value, tuple) and self.named(value[1])):
                continue
            self.lines.append(f"{step}, {name}: {describe(value)}; expected {describe(want)}")


def describe(value: Any) -> str:
    if isinstance(value, list):
        return f"{len(value)} rows"
    return f"{value[0]}: {value[1][:400]}"


def completed_data(path: Path) -> Any:
    try:
        timeline = oxlake.Table(str(path), heartbeat_interval=BEAT).timeline(include_archived=True)
    except oxlake.OxlakeError as e:
        return (type(e).__name__, str(e))
    actions = ("commit", "deltacommit", "replacecommit")
    return [(i.time, i.action) for i in timeline if i.state == "completed" and i.action in actions]


@pytest.mark.parametrize(("version", "table_type", "kind", "rel"), cases())
def test_an_emptied_file_gives_the_right_rows_or_an_error_naming_it(
    tmp_path: Path, version: int, table_type: str, kind: str, rel: str
) -> None:
    t = template(version, table_type)
    assert listing(t.path) == t.listing, "a case changed the shared table"
    legit = written_empty(kind)
    findings = Findings(Path(rel), strict=legit)
    # (a) Reads, then (d) `validate`, then (b) a write, on one copy.
    path = copy(t, tmp_path / "rw", rel)
    findings.reads("read", reads(t, path), t.expected)
    try:
        report = oxlake.Table(str(path), heartbeat_interval=BEAT).validate()
    except oxlake.OxlakeError as e:
        findings.typed("validate", e)
    else:
        lines = report.missing_instants + report.differences
        if legit and not report.ok:
            findings.lines.append(f"validate: reports a kind written empty: {lines}")
        if not legit and not any(findings.name in line for line in lines):
            findings.lines.append(f"validate: does not report it (ok={report.ok}: {lines[:3]})")
    before = completed_data(path)
    try:
        oxlake.Table(str(path), heartbeat_interval=BEAT).upsert(WRITE, schema_mode="merge")
    except oxlake.OxlakeError as e:
        findings.typed("write", e)
        findings.reads("after a failed write", reads(t, path, AFTER_WRITE), t.expected)
        if completed_data(path) != before:
            findings.lines.append("a failed write changed the completed instants")
    else:
        findings.reads("after the write", reads(t, path, AFTER_WRITE), t.after_write)
    # (c) The services, on a second copy.
    path = copy(t, tmp_path / "services", rel)
    failed = False
    for name, run in SERVICES:
        if name == "compact" and table_type != "merge_on_read":
            continue
        try:
            run(oxlake.Table(str(path), heartbeat_interval=BEAT))
        except oxlake.OxlakeError as e:
            findings.typed(name, e)
            failed = True
    if failed:
        findings.reads("after the services (one failed)", reads(t, path, INVARIANT), t.expected)
    else:
        findings.reads("after the services", reads(t, path, AFTER_SERVICES), t.after_services)
    assert not findings.lines, "\n".join(findings.lines)


@pytest.mark.parametrize(("version", "table_type"), LAYOUTS)
def test_files_written_empty_are_of_the_kinds_listed(version: int, table_type: str) -> None:
    """The sweep skips files already empty: each must be of a kind `WRITTEN_EMPTY` explains."""
    t = template(version, table_type)
    unexplained = {
        kind
        for kind, files in kinds(t).items()
        if any(f.stat().st_size == 0 for f in files) and not written_empty(kind)
    }
    assert not unexplained, unexplained


#: Kinds of files every table must hold, so that none drops out of the sweep unnoticed.
REQUIRED = [
    "hoodie.properties",
    ".heartbeat/T",
    ".schema/T.schemacommit",
    "oxlake/fate/T",
    "oxlake/claims/N/T",
    "oxlake/pruned",
    "oxlake/metadata/.hoodie/hoodie.properties",
    "oxlake/metadata/.hoodie/T.deltacommit",
    "oxlake/metadata/.hoodie/oxlake/fate/T",
    *(
        f"oxlake/metadata/{d}/.{f}-N-N_T.log.N_N-N-N"
        for d, f in (
            ("files", "files"),
            ("column_stats", "col-stats"),
            ("bloom_filters", "bloom-filters"),
            ("record_index", "record-index"),
        )
    ),
    *(
        f"oxlake/metadata/{d}/{f}-N-N_N-N-N_T.parquet"
        for d, f in (
            ("files", "files"),
            ("column_stats", "col-stats"),
            ("bloom_filters", "bloom-filters"),
            ("record_index", "record-index"),
        )
    ),
]
REQUIRED_BY_LAYOUT = {
    6: [
        "T.clean",
        "T.clean.requested",
        "T.rollback",
        "T.rollback.requested",
        "T.restore",
        "T.restore.requested",
        "T.savepoint",
        "T.replacecommit",
        "T.replacecommit.requested",
        "archived/.commits_.archive.N_N-N-N",
    ],
    8: [
        "timeline/T_T.clean",
        "timeline/T.clean.requested",
        "timeline/T_T.rollback",
        "timeline/T.rollback.requested",
        "timeline/T_T.restore",
        "timeline/T.restore.requested",
        "timeline/T_T.savepoint",
        "timeline/T_T.replacecommit",
        "timeline/T.clustering.requested",
        "timeline/history/manifest_N",
        "timeline/history/_version_",
        "timeline/history/T_T_N.parquet",
    ],
    "copy_on_write": ["{tl}T{c}.commit", "{tl}T.inflight", "{tl}T{c}.indexing"],
    "merge_on_read": [
        "{tl}T{c}.deltacommit",
        "{tl}T.deltacommit.inflight",
        "{tl}T{c}.commit",
        "{tl}T.compaction.requested",
        "oxlake/compacting/T_F_H",
        "oxlake/metadata/.hoodie/T.commit",
        "oxlake/metadata/.hoodie/T.compaction.requested",
        "oxlake/metadata/.hoodie/archived/.commits_.archive.N_N-N-N",
    ],
}


@pytest.mark.parametrize(("version", "table_type"), LAYOUTS)
def test_the_tables_hold_every_kind_of_file(version: int, table_type: str) -> None:
    t = template(version, table_type)
    tl, c = ("timeline/", "_T") if version == 8 else ("", "")
    required = (
        REQUIRED
        + REQUIRED_BY_LAYOUT[version]
        + [k.format(tl=tl, c=c) for k in REQUIRED_BY_LAYOUT[table_type]]
    )
    missing = set(required) - set(kinds(t))
    assert not missing, missing


@pytest.mark.parametrize("version", [6, 8])
def test_validate_after_add_column_beside_a_log_of_deletes_only(tmp_path: Path, version: int) -> None:
    """Found building the tables above (issue 71 item 7, one case left): a healthy table."""
    t = oxlake.create_table(
        str(tmp_path / "t"),
        SCHEMA,
        record_key="id",
        ordering_field="ts",
        table_type="merge_on_read",
        table_version=version,
    )
    t.build_metadata(1, column_stats_shards=1, bloom_filters_shards=1, record_index_shards=1)
    t.insert(trips([1, 2, 3]))
    t.delete(trips([2], ts=2))
    with t.update_schema() as u:
        u.add_column("note", pa.string())
    report = t.validate()
    assert report.ok, report
