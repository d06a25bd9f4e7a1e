"""The two engines behind one reading interface, and the checks that compare each with the model.

`JavaReader` reads as a Hudi user does (`spark.read.format("hudi")` with `hoodie.*` options),
`OxlakeReader` through `oxlake.Table`. Both read snapshots (latest, and as of an instant's
requested time, as both engines take it), incremental windows (instant times on version 6,
completion times on 8 and 9: `Step.checkpoint`) and read-optimized views.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import oxlake
from hudi_model import Row, Step, diff, plain
from hudi_session import java_read


class Reader(Protocol):
    name: str

    def snapshot(self, as_of: str | None = None) -> list[Row]: ...

    def incremental(self, start: str, end: str | None = None) -> list[Row]: ...

    def read_optimized(self) -> list[Row]: ...


class OxlakeReader:
    name = "oxlake"

    def __init__(self, path: str) -> None:
        self.path = path

    def _read(self, **kwargs: Any) -> list[Row]:
        # A new Table each read: what a reader opening the table at that moment sees.
        return plain(oxlake.Table(self.path).to_arrow(with_meta_columns=False, **kwargs).to_pylist())

    def snapshot(self, as_of: str | None = None) -> list[Row]:
        return self._read(as_of=as_of)

    def incremental(self, start: str, end: str | None = None) -> list[Row]:
        return self._read(query="incremental", start=start, end=end)

    def read_optimized(self) -> list[Row]:
        return self._read(query="read_optimized")

    def filtered(self, predicate: str) -> list[Row]:
        return self._read(filter=predicate)


class JavaReader:
    name = "java"

    def __init__(self, spark: Any, path: str) -> None:
        self.spark = spark
        self.path = path

    def frame(self, **options: str) -> Any:
        return java_read(self.spark, self.path, **options)

    def _read(self, **options: str) -> list[Row]:
        return plain(r.asDict() for r in self.frame(**options).collect())

    def snapshot(self, as_of: str | None = None) -> list[Row]:
        return self._read(**({"as.of.instant": as_of} if as_of else {}))

    def incremental(self, start: str, end: str | None = None) -> list[Row]:
        opts = {
            "hoodie.datasource.query.type": "incremental",
            "hoodie.datasource.read.begin.instanttime": start,
        }
        if end is not None:
            opts["hoodie.datasource.read.end.instanttime"] = end
        return self._read(**opts)

    def read_optimized(self) -> list[Row]:
        return self._read(**{"hoodie.datasource.query.type": "read_optimized"})

    def filtered(self, predicate: str) -> list[Row]:
        return plain(r.asDict() for r in self.frame().filter(predicate).collect())


def _check(problems: list[str], what: str, read: Any, expected: list[Row]) -> None:
    try:
        got = read()
    except Exception as e:  # an engine that fails a read is a disagreement like any other
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        problems.append(f"{what}: raised {type(e).__name__}: {first[:400]}")
        return
    if got != expected:
        problems.append(f"{what}: {diff(got, expected)}")


def snapshot_problems(reader: Reader, steps: Sequence[Step], first: int = 0) -> list[str]:
    """How `reader` disagrees with the model: the latest snapshot, then the snapshot as of every
    step from `first` on."""
    problems: list[str] = []
    _check(problems, "latest snapshot", reader.snapshot, plain(steps[-1].rows.values()))
    for s in steps[first:]:
        _check(
            problems,
            f"as of step {s.index} ({s.writer} {s.what}, {s.instant.time})",
            lambda s=s: reader.snapshot(as_of=s.instant.time),
            plain(s.rows.values()),
        )
    return problems


def incremental_problems(
    reader: Reader, steps: Sequence[Step], table_version: int, first: int = 0
) -> list[str]:
    """How `reader` disagrees with the model on incremental reads: each window between two
    consecutive steps from `first` on, and each open window from a step to the latest."""
    problems: list[str] = []
    for a, b in zip(steps[first:], steps[first + 1 :], strict=False):
        _check(
            problems,
            f"incremental ({a.index}, {b.index}] ({b.writer} {b.what})",
            lambda a=a, b=b: reader.incremental(a.checkpoint(table_version), b.checkpoint(table_version)),
            b.changed_after(a.index),
        )
    for a in steps[first:-1]:
        _check(
            problems,
            f"incremental ({a.index}, latest]",
            lambda a=a: reader.incremental(a.checkpoint(table_version)),
            steps[-1].changed_after(a.index),
        )
    return problems


def report(reader: Reader, where: str, problems: list[str]) -> str:
    return f"{reader.name} disagrees with the model on {where}:\n  " + "\n  ".join(problems)
