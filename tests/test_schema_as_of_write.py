"""Schemas as of the write (issue 71): a handle opened before another process changed the schema
writes against the schema as it is (defect 8); `validate` reads a log under the columns its
writer wrote (defect 7); names Apache Hudi cannot hold never enter a table."""

from __future__ import annotations

import subprocess
import sys

import oxlake
import pyarrow as pa
import pytest
from conftest import SCHEMA, trips, trips_table


def _stale_handle_after(path: str, change: list[str]) -> oxlake.Table:
    """A handle opened before another process changes the schema with `oxlake alter-schema`."""
    stale = oxlake.Table(path)
    stale.to_arrow()  # it has read the table
    done = subprocess.run(
        [sys.executable, "-m", "oxlake.cli", "alter-schema", path, *change], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    return stale


@pytest.mark.parametrize(
    ("change", "refused"),
    [
        (["--rename", "fare=price"], "price"),
        (["--drop", "fare"], "fare"),
        (["--add", "tip:double"], "tip"),
    ],
)
def test_a_strict_write_through_a_stale_handle_meets_the_schema_as_it_is(
    table_path: str, change: list[str], refused: str
) -> None:
    t = trips_table(table_path)
    t.insert(trips([1, 2]))
    stale = _stale_handle_after(table_path, change)
    schema_after = oxlake.Table(table_path).schema
    with pytest.raises(oxlake.SchemaMismatchError, match=f"`{refused}`"):
        stale.upsert(trips([1], ts=2))
    fresh = oxlake.Table(table_path)
    assert fresh.schema == schema_after, "the table's schema is as the change left it"
    assert fresh.validate().ok
    # The handle takes the new schema for the next write.
    now = [f.name for f in schema_after if not f.name.startswith("_hoodie_")]
    data = trips([1], ts=3)
    data = pa.table({n: data[n] if n in data.column_names else pa.nulls(1, pa.float64()) for n in now})
    if "price" in now:
        data = data.set_column(now.index("price"), "price", trips([1], ts=3)["fare"])
    stale.upsert(data)
    assert sorted(oxlake.Table(table_path).to_arrow(columns=["id"])["id"].to_pylist()) == [1, 2]


def test_validate_is_ok_on_merge_on_read_logs_after_add_column(table_path: str) -> None:
    t = trips_table(table_path, table_type="merge_on_read")
    t.build_metadata()
    t.insert(trips([1, 2, 3]))
    t.upsert(trips([1, 2], ts=2))  # logs, indexed with the schema of their writer
    with t.update_schema() as u:
        u.add_column("tip", pa.float64())
    assert t.validate().ok, t.validate()
    t.upsert(pa.table({**{n: trips([3], ts=3)[n] for n in SCHEMA.names}, "tip": [1.5]}))
    assert t.validate().ok, t.validate()


@pytest.mark.parametrize("name", ["a b", "ü", "a.b", "%", "日本", "a,b", "1st"])
def test_column_names_apache_hudi_cannot_hold_are_refused(table_path: str, name: str) -> None:
    schema = pa.schema([pa.field("id", pa.int64(), nullable=False), pa.field(name, pa.string())])
    with pytest.raises(oxlake.SchemaMismatchError, match="Avro"):
        oxlake.create_table(table_path, schema, record_key="id")
    t = oxlake.create_table(table_path, schema.remove(1), record_key="id")
    with pytest.raises(oxlake.SchemaMismatchError, match="Avro"):
        t.insert(pa.table({"id": [1], name: ["x"]}), schema_mode="merge")
    with pytest.raises(oxlake.SchemaMismatchError, match="Avro"):
        with t.update_schema() as u:
            u.add_column(name, pa.string())
    assert t.to_arrow().num_rows == 0 and [f.name for f in t.schema][-1] == "id"
