"""The `oxlake` console script: `oxlake show URI`, `oxlake timeline URI`."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from oxlake import OxlakeError, Table


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


def _timeline(table: Table) -> None:
    for i in table.timeline():
        print(f"{i.time}  {i.action:<14} {i.state}")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="oxlake", description="Inspect Apache Hudi tables.")
    sub = parser.add_subparsers(dest="command", required=True)
    for name, help_text in (("show", "properties, schema, file groups"), ("timeline", "the instants")):
        p = sub.add_parser(name, help=help_text)
        p.add_argument("uri")
    args = parser.parse_args(argv)
    try:
        table = Table(args.uri)
        _show(table) if args.command == "show" else _timeline(table)
    except OxlakeError as e:
        print(f"oxlake: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
