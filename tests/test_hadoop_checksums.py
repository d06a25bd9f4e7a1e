"""Hadoop's checksum files beside the files Java Hudi wrote on local disk (docs/FORMAT.md,
"Hadoop's checksum files"): whatever oxlake replaces or deletes loses the checksum beside it,
`validate()` names a stale one, and a write removes one an older oxlake left.

The files here are made as Hadoop's `LocalFileSystem` makes them; tests/java checks the same
with Apache Hudi's own engine reading and writing after oxlake."""

from __future__ import annotations

import struct
import zlib
from pathlib import Path

import oxlake
import pyarrow as pa
import pytest

SCHEMA = pa.schema([pa.field("id", pa.int64(), nullable=False), pa.field("ts", pa.int64())])


def hadoop_checksum(data: bytes, per_chunk: int = 512) -> bytes:
    """What Hadoop's ChecksumFileSystem writes beside `data`."""
    sums = (zlib.crc32(data[i : i + per_chunk]) for i in range(0, len(data), per_chunk))
    return b"crc\0" + struct.pack(">i", per_chunk) + b"".join(struct.pack(">I", s) for s in sums)


def checksum_of(path: Path) -> Path:
    return path.with_name(f".{path.name}.crc")


def write_checksum(path: Path, data: bytes | None = None) -> Path:
    """The checksum of `data` (the file's own bytes by default) beside `path`."""
    crc = checksum_of(path)
    crc.write_bytes(hadoop_checksum(path.read_bytes() if data is None else data))
    return crc


def upsert(t: oxlake.Table, *ids: int, ts: int = 1) -> str:
    result = t.upsert(pa.table({"id": list(ids), "ts": [ts] * len(ids)}, schema=SCHEMA))
    assert result.instant is not None
    return result.instant


@pytest.fixture(params=[6, 8])
def table(request: pytest.FixtureRequest, tmp_path: Path) -> oxlake.Table:
    t = oxlake.create_table(
        str(tmp_path / "t"), SCHEMA, record_key="id", ordering_field="ts", table_version=request.param
    )
    upsert(t, 1, 2)
    return t


def properties(t: oxlake.Table) -> Path:
    return Path(t.uri, ".hoodie", "hoodie.properties")


def test_a_rewrite_of_hoodie_properties_removes_the_checksum_beside_it(table: oxlake.Table) -> None:
    crc = write_checksum(properties(table))
    assert table.validate().ok, table.validate().differences
    before = properties(table).read_bytes()
    table.update_schema().add_column("note", pa.string()).commit()
    assert properties(table).read_bytes() != before, "the schema change rewrote hoodie.properties"
    assert not crc.exists()
    assert table.validate().ok, table.validate().differences


def test_validate_names_a_stale_checksum_and_the_next_write_removes_it(table: oxlake.Table) -> None:
    crc = write_checksum(properties(table), b"hoodie.table.name=an older text\n")
    differences = table.validate().differences
    assert len(differences) == 1, differences
    assert ".hoodie/hoodie.properties" in differences[0] and "Hadoop checksum" in differences[0]
    upsert(table, 3)
    assert not crc.exists()
    assert table.validate().ok, table.validate().differences
    assert sorted(table.to_arrow(columns=["id"])["id"].to_pylist()) == [1, 2, 3]


def test_a_checksum_that_matches_is_kept_and_is_no_difference(table: oxlake.Table) -> None:
    crc = write_checksum(properties(table))
    upsert(table, 3)
    assert table.validate().ok, table.validate().differences
    assert crc.read_bytes() == hadoop_checksum(properties(table).read_bytes())


def test_a_deleted_file_takes_its_checksum_along(tmp_path: Path) -> None:
    t = oxlake.create_table(str(tmp_path / "t"), SCHEMA, record_key="id", ordering_field="ts")
    upsert(t, 1)
    latest = upsert(t, 2)
    written = [p for p in Path(t.uri).glob("*.parquet") if latest in p.name]
    assert len(written) == 1, written
    crc = write_checksum(written[0])
    t.rollback(latest)
    assert not written[0].exists() and not crc.exists()
    assert t.to_arrow(columns=["id"])["id"].to_pylist() == [1]
    assert t.validate().ok, t.validate().differences
