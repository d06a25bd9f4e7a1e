"""The `oxlake` console script.

Inspect: `oxlake show URI`, `oxlake timeline URI`, `oxlake history URI` (operations and metrics of
the commits), `oxlake --version`. Table services: `oxlake compact URI`,
`oxlake clean URI [--policy P] [--retain N]`, `oxlake rollback URI INSTANT`,
`oxlake savepoint [--delete] URI INSTANT`, `oxlake restore URI INSTANT`,
`oxlake cluster URI [--sort-by COL ...] [--target-file-size BYTES]`,
`oxlake archive URI [--min-commits N --max-commits M]`; `oxlake timeline URI --archived` lists the
archived instants too. Schema changes: `oxlake alter-schema URI --rename OLD=NEW --drop COL
--add COL:TYPE --update COL:TYPE --move-first COL --move-after COL=OTHER --move-before COL=OTHER`
(applied in the order given, committed together; a struct field as `parent.field`). Loading:
`oxlake bulk-insert URI FILE... [--sort-mode M] [--record-key F,.. --partition-by F,..
--ordering-field F --table-type T]` loads Parquet, CSV or JSON-lines files (by extension, or
`--format`) with Apache Hudi's `bulk_insert`, creating the table from the files' schema when it
does not exist. A service shows its progress on stderr (on a terminal) and ends with a one-line
summary on stdout.
"""

from __future__ import annotations

import argparse
import re
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from types import TracebackType

import pyarrow as pa

from oxlake import (
    InvalidArgumentError,
    OxlakeError,
    Progress,
    Table,
    TableNotFoundError,
    __version__,
    create_table,
)


class _Progress:
    """A progress bar on stderr (a terminal only) while a native call runs: it releases the GIL,
    and counts its work on `self.native`, which this thread reads. Until the service has planned
    its work the bar is a spinner."""

    WIDTH = 30
    FRAMES = "|/-\\"

    def __init__(self, label: str) -> None:
        self.label = label
        self.native = Progress()
        self.start = time.monotonic()
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def line(self, tick: int) -> str:
        elapsed = time.monotonic() - self.start
        done, total = self.native.done, self.native.total
        if total == 0:
            return f"{self.FRAMES[tick % 4]} {self.label} {elapsed:6.1f}s"
        filled = self.WIDTH * min(done, total) // total
        bar = "#" * filled + "-" * (self.WIDTH - filled)
        return f"{self.label} [{bar}] {done:,}/{total:,} {self.native.unit} {elapsed:6.1f}s"

    def _run(self) -> None:
        tick = 0
        while not self._done.wait(0.1):
            print(f"\r{self.line(tick)}\033[K", end="", file=sys.stderr, flush=True)
            tick += 1

    def __enter__(self) -> _Progress:
        if sys.stderr.isatty():
            self._thread.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._done.set()
        if self._thread.is_alive():
            self._thread.join()
            print("\r\033[K", end="", file=sys.stderr, flush=True)

    @property
    def elapsed(self) -> float:
        return time.monotonic() - self.start


def _service(label: str, work: Callable[[Progress], str]) -> None:
    with _Progress(label) as p:
        summary = work(p.native)
    print(f"{summary} in {p.elapsed:.1f}s")


def _compact(table: Table, args: argparse.Namespace, progress: Progress) -> str:
    r = table.compact(min_log_files=args.min_log_files, progress=progress)
    if not r.instants:
        return "compact: nothing to compact"
    return f"compact: {r.file_groups} file groups, {r.records:,} records, instants {', '.join(r.instants)}"


def _clean(table: Table, args: argparse.Namespace, progress: Progress) -> str:
    deleted = table.clean(policy=args.policy, retain=args.retain, progress=progress)
    return f"clean: {len(deleted)} files deleted ({args.policy}, retain {args.retain})"


def _rollback(table: Table, args: argparse.Namespace, progress: Progress) -> str:
    return f"rollback: {args.instant} rolled back by {table.rollback(args.instant)}"


def _savepoint(table: Table, args: argparse.Namespace, progress: Progress) -> str:
    if args.delete:
        table.delete_savepoint(args.instant)
        return f"savepoint: savepoint {args.instant} deleted"
    table.savepoint(args.instant)
    return f"savepoint: {args.instant} savepointed"


def _restore(table: Table, args: argparse.Namespace, progress: Progress) -> str:
    return f"restore: table restored to {args.instant} by {table.restore(args.instant, progress=progress)}"


def _archive(table: Table, args: argparse.Namespace, progress: Progress) -> str:
    archived = table.archive(min_commits=args.min_commits, max_commits=args.max_commits)
    if not archived:
        return "archive: nothing to archive"
    return f"archive: {len(archived)} instants archived, {archived[0].time} to {archived[-1].time}"


def _cluster(table: Table, args: argparse.Namespace, progress: Progress) -> str:
    r = table.cluster(sort_by=args.sort_by, target_file_size=args.target_file_size, progress=progress)
    if r.instant is None:
        return "cluster: nothing to cluster"
    order = f", sorted by {', '.join(args.sort_by)}" if args.sort_by else ""
    return (
        f"cluster: {r.replaced_file_groups} file groups into {r.new_file_groups}, "
        f"{r.records:,} records{order}, instant {r.instant}"
    )


def _upgrade(table: Table, args: argparse.Namespace, progress: Progress) -> str:
    before, after = table.upgrade(args.to)
    if before == after:
        return f"upgrade: the table is at version {after}"
    return f"upgrade: table version {before} -> {after}"


SERVICES: dict[str, tuple[str, Callable[[Table, argparse.Namespace, Progress], str]]] = {
    "compact": ("compact merge-on-read file slices", _compact),
    "clean": ("delete file slices no longer needed", _clean),
    "rollback": ("roll back the latest commit", _rollback),
    "savepoint": ("savepoint a commit", _savepoint),
    "restore": ("restore the table to a savepoint", _restore),
    "cluster": ("rewrite small file groups into fewer, sorted ones", _cluster),
    "archive": ("move the oldest instants to the archived timeline", _archive),
    "upgrade": ("upgrade a version 6 table to version 8 or 9 (Apache Hudi 1.x)", _upgrade),
}


def _show(table: Table) -> None:
    print(f"table      {table.uri}")
    props = table.properties
    for key in (
        "hoodie.table.name",
        "hoodie.table.type",
        "hoodie.table.version",
        "hoodie.table.recordkey.fields",
        "hoodie.table.partition.fields",
        "hoodie.table.precombine.field",
    ):
        if key in props:
            print(f"  {key} = {props[key]}")
    print("schema")
    for field in table.schema:
        print(f"  {field.name}: {field.type}{'' if field.nullable else ' not null'}")
    groups = table.file_groups()
    total = sum(g.size for g in groups)
    print(f"file groups ({len(groups)}, {total:,} bytes)")
    for g in groups:
        print(f"  {g.partition or '.'}  {g.file_id}  {g.size:,} B  {g.base_file}")


def _timeline(table: Table, archived: bool) -> None:
    for i in table.timeline(include_archived=archived):
        print(f"{i.time}  {i.action:<14} {i.state}")


def _validate(table: Table) -> bool:
    report = table.validate()
    if not report.present:
        print("no metadata table (build one with `oxlake build-metadata URI`)")
        return False
    for instant in report.missing_instants:
        print(f"stale: instant {instant} is not in the metadata table (readers list storage)")
    for line in report.differences:
        print(f"differs: {line}")
    print("ok" if report.ok else "not ok")
    return report.ok


#: Arrow types by the names `alter-schema` takes (and `decimal(P, S)`, `timestamp[UNIT]`).
_TYPES: dict[str, pa.DataType] = {
    "bool": pa.bool_(),
    "boolean": pa.bool_(),
    "int": pa.int32(),
    "int32": pa.int32(),
    "long": pa.int64(),
    "int64": pa.int64(),
    "float": pa.float32(),
    "float32": pa.float32(),
    "double": pa.float64(),
    "float64": pa.float64(),
    "string": pa.string(),
    "binary": pa.binary(),
    "date": pa.date32(),
    "date32": pa.date32(),
}


def _arrow_type(text: str) -> pa.DataType:
    name = text.strip().lower()
    if name in _TYPES:
        return _TYPES[name]
    decimal = re.fullmatch(r"decimal\(\s*(\d+)\s*,\s*(\d+)\s*\)", name)
    if decimal:
        return pa.decimal128(int(decimal[1]), int(decimal[2]))
    timestamp = re.fullmatch(r"timestamp(?:\[(s|ms|us|ns)(?:,\s*tz=(.+))?\])?", text.strip())
    if timestamp:
        return pa.timestamp(timestamp[1] or "us", tz=timestamp[2])
    raise InvalidArgumentError(
        f"unknown type `{text}` (one of {', '.join(sorted(_TYPES))}, decimal(P, S), timestamp[us])"
    )


class _Change(argparse.Action):
    """Collects schema changes in the order given on the command line."""

    def __call__(
        self, parser: argparse.ArgumentParser, ns: argparse.Namespace, value: object, flag: object = None
    ) -> None:
        ns.changes = [*(getattr(ns, "changes", None) or []), (self.dest, str(value))]


def _split(value: str, sep: str, flag: str) -> tuple[str, str]:
    left, found, right = value.partition(sep)
    if not found or not left or not right:
        raise InvalidArgumentError(f"--{flag} takes `A{sep}B`, not `{value}`")
    return left, right


def _alter(table: Table, changes: list[tuple[str, str]]) -> None:
    if not changes:
        raise InvalidArgumentError(
            "alter-schema: no change given (--add, --rename, --drop, --update, --move-*)"
        )
    with table.update_schema() as u:
        for kind, value in changes:
            if kind in ("add", "update"):
                name, type_text = _split(value, ":", kind)
                path = tuple(name.split("."))
                if kind == "add":
                    u.add_column(path, _arrow_type(type_text))
                else:
                    u.update_column(path, _arrow_type(type_text))
            elif kind == "rename":
                u.rename_column(*_split(value, "=", kind))
            elif kind == "drop":
                u.delete_column(value)
            elif kind == "move_first":
                u.move_first(value)
            elif kind == "move_after":
                u.move_after(*_split(value, "=", "move-after"))
            else:
                u.move_before(*_split(value, "=", "move-before"))
    if u.instant is None:
        print("schema unchanged")
    else:
        print(f"schema changed, instant {u.instant}")
        print(table.schema)


_FORMATS = {".parquet": "parquet", ".pq": "parquet", ".csv": "csv", ".json": "json", ".jsonl": "json"}


def _bulk_insert(args: argparse.Namespace) -> None:
    """Loads files into the table with a bulk insert, creating it from their schema if needed."""
    import pyarrow.dataset as ds

    fmt = args.format
    if fmt is None:
        found = {_FORMATS.get(Path(f).suffix.lower(), "parquet") for f in args.files}
        if len(found) > 1:
            raise InvalidArgumentError(
                f"files of several formats ({', '.join(sorted(found))}): give --format"
            )
        fmt = found.pop()
    try:
        source = ds.dataset(args.files, format=fmt)
    except (OSError, pa.ArrowInvalid) as e:
        raise InvalidArgumentError(f"cannot read {', '.join(args.files)} as {fmt}: {e}") from e
    try:
        table = Table(args.uri)
    except TableNotFoundError:
        if not args.record_key:
            raise InvalidArgumentError(
                f"{args.uri} is not a table yet: give --record-key (and --partition-by) to create it"
            ) from None
        table = create_table(
            args.uri,
            source.schema,
            record_key=args.record_key.split(","),
            partition_by=[f for f in (args.partition_by or "").split(",") if f],
            ordering_field=args.ordering_field,
            table_type=args.table_type,
            table_version=args.table_version,
            global_index=args.global_index,
            meta_fields=not args.no_meta_fields,
            metadata=not args.no_metadata,
        )
    start = time.monotonic()
    result = table.bulk_insert(source.scanner().to_reader(), sort_mode=args.sort_mode)
    elapsed = time.monotonic() - start
    print(
        f"bulk_insert: {result.num_inserts:,} rows into {len(result.files):,} files, "
        f"instant {result.instant} in {elapsed:.1f}s"
    )


URI_HELP = "the table: a path, file:// or s3://bucket/prefix URL"


def _history(table: Table, archived: bool) -> None:
    print(
        f"{'instant':<18} {'action':<14} {'operation':<22} {'inserts':>9} {'updates':>9} {'deletes':>9} "
        f"{'files':>6} {'bytes':>12}"
    )
    for c in table.history(include_archived=archived):
        print(
            f"{c.time:<18} {c.action:<14} {c.operation or '':<22} {c.num_inserts:>9,} {c.num_updates:>9,} "
            f"{c.num_deletes:>9,} {c.files_written:>6,} {c.bytes_written:>12,}"
        )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="oxlake", description="Inspect and maintain Apache Hudi tables.")
    parser.add_argument("--version", action="version", version=f"oxlake {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    plain = (
        ("show", "properties, schema, file groups"),
        ("timeline", "the instants"),
        ("history", "the completed commits: operation, rows inserted/updated/deleted, files, bytes"),
        ("build-metadata", "build the metadata table from a full listing"),
        ("validate", "compare the metadata table with a full listing (exit 1 on a difference)"),
    )
    for name, help_text in plain:
        p = sub.add_parser(name, help=help_text)
        p.add_argument("uri", help=URI_HELP)
    for name, (help_text, _) in SERVICES.items():
        p = sub.add_parser(name, help=help_text)
        p.add_argument("uri", help=URI_HELP)
        if name in ("rollback", "savepoint", "restore"):
            p.add_argument("instant", help="an instant time, e.g. 20260201103000000")
    sub.choices["compact"].add_argument(
        "--min-log-files",
        type=int,
        default=1,
        metavar="N",
        help="compact file slices with at least N log files",
    )
    sub.choices["clean"].add_argument(
        "--policy",
        default="keep_latest_commits",
        choices=["keep_latest_commits", "keep_latest_file_versions"],
        help="what a clean keeps (Apache Hudi's cleaner policies)",
    )
    sub.choices["clean"].add_argument(
        "--retain", type=int, default=10, metavar="N", help="commits (or file versions) kept, by the policy"
    )
    sub.choices["cluster"].add_argument(
        "--sort-by",
        nargs="*",
        default=[],
        metavar="COLUMN",
        help="order rows of the new files by these columns",
    )
    sub.choices["cluster"].add_argument(
        "--target-file-size", type=int, default=None, metavar="BYTES", help="size of the new files"
    )
    sub.choices["archive"].add_argument(
        "--min-commits", type=int, default=None, metavar="N", help="commits the active timeline keeps"
    )
    sub.choices["archive"].add_argument(
        "--max-commits", type=int, default=None, metavar="M", help="archive once the timeline holds more"
    )
    sub.choices["savepoint"].add_argument(
        "--delete", action="store_true", help="delete the savepoint at INSTANT instead of making one"
    )
    sub.choices["upgrade"].add_argument("--to", type=int, default=8, choices=[8, 9], help="the table version")
    for name in ("timeline", "history"):
        sub.choices[name].add_argument("--archived", action="store_true", help="archived instants too")
    bulk = sub.add_parser("bulk-insert", help="load Parquet, CSV or JSON-lines files (Hudi's bulk_insert)")
    bulk.add_argument("uri", help=URI_HELP + " (created when absent, with --record-key)")
    bulk.add_argument("files", nargs="+", metavar="FILE", help="files or folders of files")
    bulk.add_argument(
        "--format",
        choices=["parquet", "csv", "json"],
        default=None,
        help="the files' format (default: by extension)",
    )
    bulk.add_argument(
        "--sort-mode",
        default="none",
        choices=["none", "global_sort", "partition_sort"],
        help="order records by key before cutting files (Hudi's hoodie.bulkinsert.sort.mode)",
    )
    bulk.add_argument("--record-key", default=None, metavar="F[,F]", help="to create the table")
    bulk.add_argument("--partition-by", default=None, metavar="F[,F]", help="to create the table")
    bulk.add_argument("--ordering-field", default=None, metavar="F", help="to create the table")
    bulk.add_argument(
        "--table-type",
        default="copy_on_write",
        choices=["copy_on_write", "merge_on_read"],
        help="to create the table",
    )
    bulk.add_argument(
        "--table-version", type=int, default=8, choices=[6, 8, 9], help="to create the table (6: Hudi 0.x)"
    )
    bulk.add_argument(
        "--global-index",
        action="store_true",
        help="to create the table: record keys unique across partitions (upserts move keys)",
    )
    bulk.add_argument(
        "--no-meta-fields",
        action="store_true",
        help="to create the table without meta fields (Apache Hudi's virtual keys: _hoodie_* columns null)",
    )
    bulk.add_argument(
        "--no-metadata",
        action="store_true",
        help="to create the table without its metadata table (planning then lists directories)",
    )
    alter = sub.add_parser("alter-schema", help="rename, drop, add, widen and move columns (one commit)")
    alter.add_argument("uri", help=URI_HELP)
    alter.set_defaults(changes=[])
    for flag, meta in (
        ("add", "COL:TYPE"),
        ("rename", "OLD=NEW"),
        ("drop", "COL"),
        ("update", "COL:TYPE"),
        ("move-first", "COL"),
        ("move-after", "COL=OTHER"),
        ("move-before", "COL=OTHER"),
    ):
        alter.add_argument(
            f"--{flag}",
            action=_Change,
            metavar=meta,
            dest=flag.replace("-", "_"),
            default=None,
            help=f"{flag.replace('-', ' ')} a column (repeatable; applied in order)",
        )
    args = parser.parse_args(argv)
    try:
        if args.command == "bulk-insert":
            _bulk_insert(args)
            return 0
        table = Table(args.uri)
        if args.command in SERVICES:
            fn = SERVICES[args.command][1]
            _service(args.command, lambda progress: fn(table, args, progress))
        elif args.command == "validate":
            return 0 if _validate(table) else 1
        elif args.command == "alter-schema":
            _alter(table, args.changes)
        elif args.command == "build-metadata":
            print(f"metadata table built, instant {table.build_metadata()}")
        elif args.command == "history":
            _history(table, args.archived)
        else:
            _show(table) if args.command == "show" else _timeline(table, args.archived)
    except OxlakeError as e:
        print(f"oxlake: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
