"""The model the Java round trips compare both engines with: the rows a Hudi table holds after each
write, and which write last changed each row, kept as plain Python data.

Neither engine is the oracle: Java's writes and oxlake's are applied to the model by the rules of
the table's merge mode (Apache Hudi's, docs/FORMAT.md §6), and every read of either engine is
compared with it. The instants come from storage (the timeline's file names), not from either
engine's API.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

Row = dict[str, Any]
MergeMode = Literal["event_time", "commit_time"]

#: The data columns of every table of the suite (the `trips` rows of tests/conftest.py).
COLUMNS = ("id", "name", "city", "ts", "fare")
CITIES = ("sf", "nyc", "chennai")
#: Actions of completed instants that write records.
WRITE_ACTIONS = ("commit", "deltacommit", "replacecommit")


def trip_rows(ids: Iterable[int], *, ts: int = 1, name: str = "n", fare: float = 10.0) -> list[Row]:
    """`trips` rows: `name<id>`, the city by id, `fare + id`."""
    return [{"id": i, "name": f"{name}{i}", "city": CITIES[i % 3], "ts": ts, "fare": fare + i} for i in ids]


def plain(rows: Iterable[Row]) -> list[Row]:
    """Rows reduced to the data columns, sorted by key: what reads are compared as."""
    return sorted(({c: r[c] for c in COLUMNS} for r in rows), key=lambda r: r["id"])


@dataclass(frozen=True)
class Instant:
    """A completed instant as storage names it: requested time, completion time (the requested time
    on version 6, whose file names carry no other), action."""

    time: str
    completion: str
    action: str


_LAYOUT_1 = re.compile(r"^(\d{14,17})\.([a-z]+)$")
_LAYOUT_2 = re.compile(r"^(\d{14,17})_(\d{14,17})\.([a-z]+)$")


def completed_instants(table: str | Path) -> list[Instant]:
    """The completed instants of the table's active timeline, in completion order, from file names
    alone: `.hoodie/<time>.<action>` (layout 1, version 6) or
    `.hoodie/timeline/<time>_<completion>.<action>` (layout 2, versions 8 and 9)."""
    hoodie = Path(table, ".hoodie")
    out: list[Instant] = []
    layout_2 = hoodie / "timeline"
    if layout_2.is_dir():
        for p in layout_2.iterdir():
            if m := _LAYOUT_2.match(p.name):
                out.append(Instant(m[1], m[2], m[3]))
    else:
        for p in hoodie.iterdir():
            if m := _LAYOUT_1.match(p.name):
                out.append(Instant(m[1], m[1], m[2]))
    return sorted(out, key=lambda i: (i.completion, i.time))


@dataclass
class Step:
    """The table after one completed write (or compaction): the instant, who made it, the rows,
    and for each key the index of the step whose write of it is the one the table holds."""

    index: int
    instant: Instant
    writer: str
    what: str
    rows: dict[int, Row]
    written_by: dict[int, int]

    def checkpoint(self, table_version: int) -> str:
        """Where an incremental read continues after this step: its completion time on versions 8
        and 9 (windows of completion times), its instant time on version 6."""
        return self.instant.completion if table_version >= 8 else self.instant.time

    def changed_after(self, start: int) -> list[Row]:
        """The rows of this step last written by a step after `start`: an incremental read of
        `(steps[start], this step]`."""
        return plain(self.rows[k] for k, by in self.written_by.items() if by > start)


@dataclass
class Model:
    """The table's rows, applied write by write as the table's merge mode says."""

    merge_mode: MergeMode
    rows: dict[int, Row] = field(default_factory=dict)
    written_by: dict[int, int] = field(default_factory=dict)
    steps: list[Step] = field(default_factory=list)

    def _wins(self, new: Row) -> bool:
        old = self.rows.get(new["id"])
        # Event time: the later write wins when its ordering value is not smaller (ties go to it).
        return old is None or self.merge_mode == "commit_time" or new["ts"] >= old["ts"]

    def upsert(self, rows: Sequence[Row]) -> None:
        step = len(self.steps)
        for r in rows:
            if self._wins(r):
                self.rows[r["id"]] = dict(r)
                self.written_by[r["id"]] = step

    def delete(self, keys: Iterable[int]) -> None:
        for k in keys:
            self.rows.pop(k, None)
            self.written_by.pop(k, None)

    def record(self, instant: Instant, writer: str, what: str) -> Step:
        """Closes the current write as the step of `instant`."""
        step = Step(len(self.steps), instant, writer, what, dict(self.rows), dict(self.written_by))
        self.steps.append(step)
        return step

    def current(self) -> list[Row]:
        return plain(self.rows.values())

    def copy(self) -> Model:
        return Model(self.merge_mode, dict(self.rows), dict(self.written_by), list(self.steps))


def new_write_instant(
    table: str | Path, before: Sequence[Instant], actions: Sequence[str] = WRITE_ACTIONS
) -> Instant:
    """The one instant of `actions` completed since `before` was listed (services such as Java's
    inline clean may have completed instants of their own beside it)."""
    seen = set(before)
    new = [i for i in completed_instants(table) if i not in seen and i.action in actions]
    assert len(new) == 1, f"expected one new write instant in {table}, found {new}"
    return new[0]


def diff(got: Sequence[Row], expected: Sequence[Row]) -> str:
    """What differs between two sorted row lists, by key: missing, unexpected, changed."""
    g = {r["id"]: r for r in got}
    e = {r["id"]: r for r in expected}
    parts = []
    if missing := sorted(e.keys() - g.keys()):
        parts.append(f"missing {missing}")
    if extra := sorted(g.keys() - e.keys()):
        parts.append(f"unexpected {[g[k] for k in extra]}")
    if changed := [k for k in sorted(e.keys() & g.keys()) if g[k] != e[k]]:
        parts.append("changed " + ", ".join(f"{g[k]} (model {e[k]})" for k in changed))
    if len(got) != len(g):
        parts.append(f"{len(got) - len(g)} duplicate rows")
    return "; ".join(parts) or "equal"
