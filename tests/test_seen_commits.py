"""What a read sees is a function of the commits completed by its time alone (issue 71, defect 4):
on table version 8 a write requested before a window's end and completed after it is not
half-seen. The write is paused before its commit in another process while the others run."""

from __future__ import annotations

from pathlib import Path

import oxlake
import pyarrow as pa
import pytest
from conftest import checkpoint, paused

SCHEMA = pa.schema(
    [
        pa.field("id", pa.int64(), nullable=False),
        pa.field("city", pa.string()),
        pa.field("ts", pa.int64()),
        pa.field("v", pa.string()),
    ]
)

UPSERT = """
import sys, oxlake, pyarrow as pa
from test_seen_commits import SCHEMA
rows = eval(sys.argv[2])
t = oxlake.Table(sys.argv[1])
r = t.upsert(pa.table({k: [r[k] for r in rows] for k in SCHEMA.names}, schema=SCHEMA))
print(r.instant)
"""


def batch(*rows: tuple[int, str, int, str]) -> pa.Table:
    return pa.table(
        {name: [r[i] for r in rows] for i, name in enumerate(SCHEMA.names)},
        schema=SCHEMA,
    )


def values(t: pa.Table) -> dict[int, str]:
    return dict(zip(t["id"].to_pylist(), t["v"].to_pylist(), strict=True))


def changes(t: pa.Table) -> dict[int, tuple[str, str]]:
    kinds = t["_change_type"].to_pylist()
    return {i: (k, v) for i, k, v in zip(t["id"].to_pylist(), kinds, t["v"].to_pylist(), strict=True)}


def upsert_elsewhere(path: str, rows: list[tuple[int, str, int, str]]) -> str:
    """The code of an upsert of `rows` in another process (argv[1]: the table)."""
    as_dicts = [dict(zip(SCHEMA.names, r, strict=True)) for r in rows]
    return UPSERT.replace("eval(sys.argv[2])", repr(as_dicts))


@pytest.mark.parametrize("table_type", ["merge_on_read", "copy_on_write"])
def test_a_window_ends_where_it_ends_whatever_completes_later(tmp_path: Path, table_type: str) -> None:
    """c1 writes key 1; W, requested before c1, upserts key 1 again (a later event time) and
    completes after X. The window (c0, cX] holds c1 and X, never W."""
    path = str(tmp_path / "t")
    t = oxlake.create_table(path, SCHEMA, record_key="id", ordering_field="ts", table_type=table_type)
    c0 = checkpoint(t.insert(batch((1, "sf", 1, "a1"), (2, "sf", 1, "a2"), (3, "sf", 1, "a3"))))
    code = upsert_elsewhere(path, [(1, "sf", 9, "w1")])
    (tmp_path / "w").mkdir()
    with paused(path, "before-commit", code, tmp_path / "w") as w:
        t.upsert(batch((1, "sf", 5, "c1")))
        cx = checkpoint(t.upsert(batch((3, "sf", 5, "x3"))))
        pending = values(t.to_arrow(query="incremental", start=c0, end=cx))
        pending_changes = changes(t.to_arrow(query="changes", start=c0, end=cx))
    assert pending == {1: "c1", 3: "x3"}
    assert pending_changes == {1: ("update", "c1"), 3: ("update", "x3")}
    # What the window said before W completed is what it says after.
    t = oxlake.Table(path)
    assert values(t.to_arrow(query="incremental", start=c0, end=cx)) == {1: "c1", 3: "x3"}
    assert changes(t.to_arrow(query="changes", start=c0, end=cx)) == pending_changes
    if w.returncode == 0:
        assert values(t.to_arrow()) == {1: "w1", 2: "a2", 3: "x3"}
    else:
        assert "CommitConflictError" in w.err, w.err
        assert values(t.to_arrow()) == {1: "c1", 2: "a2", 3: "x3"}
