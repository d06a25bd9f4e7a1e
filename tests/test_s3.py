"""The same round trip against a real S3-compatible server (SeaweedFS on loopback)."""

from __future__ import annotations

from collections.abc import Iterator

import oxlake
import pytest
from conftest import SCHEMA, checkpoint, rows, trips
from seaweed import SeaweedS3


@pytest.fixture(scope="module")
def s3() -> Iterator[SeaweedS3]:
    with SeaweedS3() as server:
        server.create_bucket("lake")
        yield server


def test_round_trip_on_s3(s3: SeaweedS3) -> None:
    opts = s3.storage_options()
    t = oxlake.create_table(
        "s3://lake/trips",
        SCHEMA,
        record_key="id",
        partition_by=["city"],
        ordering_field="ts",
        storage_options=opts,
    )
    a = t.insert(trips(list(range(20))))
    t.upsert(trips([1, 2, 30], ts=2, name="u"))
    t.delete(trips([5]).select(["id", "city"]))
    again = oxlake.Table("s3://lake/trips", storage_options=opts)
    expect = {r["id"]: r for r in rows(trips(list(range(20))))}
    expect.update({r["id"]: r for r in rows(trips([1, 2, 30], ts=2, name="u"))})
    del expect[5]
    assert rows(again.scan()) == sorted(expect.values(), key=lambda r: r["id"])
    assert len(rows(again.scan(as_of=a.instant))) == 20
    assert sorted(r["id"] for r in rows(again.scan(query="incremental", start=checkpoint(a)))) == [1, 2, 30]
    assert [r["id"] for r in rows(again.scan(filter="city = 'nyc' AND id < 10"))] == [1, 4, 7]
    assert [i.action for i in again.timeline()] == ["commit", "commit", "commit"]


def test_second_writer_claiming_the_same_instant_is_refused(s3: SeaweedS3) -> None:
    """Instants are claimed with a conditional create: on S3 only one writer gets a given time."""
    opts = s3.storage_options()
    # Timeline layout 1: the instant files sit in `.hoodie/`.
    t = oxlake.create_table(
        "s3://lake/claims", SCHEMA, record_key="id", storage_options=opts, table_version=6
    )
    res = t.insert(trips([1]))
    requested = f"lake/claims/.hoodie/{res.instant}.commit.requested"
    # The instant is taken: another writer's conditional create of it is refused by the store.
    assert s3.put_if_absent(requested, b"") == 412
    # A time nobody holds is granted once, then refused.
    fresh = "lake/claims/.hoodie/29990101000000000.commit.requested"
    assert s3.put_if_absent(fresh, b"") == 200
    assert s3.put_if_absent(fresh, b"") == 412
    # Our next writer finds that instant held by a writer that just claimed it (too young to be
    # presumed dead): it leaves it alone and claims a later time.
    res2 = t.insert(trips([2]))
    assert res2.instant is not None and res2.instant > "29990101000000000"
    assert [(i.action, i.state) for i in t.timeline()] == [
        ("commit", "completed"),
        ("commit", "requested"),
        ("commit", "completed"),
    ]
    assert sorted(r["id"] for r in rows(t.scan())) == [1, 2]


def test_missing_bucket_is_a_storage_error(s3: SeaweedS3) -> None:
    with pytest.raises((oxlake.StorageError, oxlake.TableNotFoundError)):
        oxlake.Table("s3://no-such-bucket/t", storage_options=s3.storage_options())


def test_a_dataset_on_s3_is_read_by_pyarrow_and_duckdb(s3: SeaweedS3) -> None:
    """`to_pyarrow_dataset` opens the bucket with pyarrow's S3 file system, configured from the
    table's storage options: DuckDB's filter reaches the files there."""
    duckdb = pytest.importorskip("duckdb")
    opts = s3.storage_options()
    t = oxlake.create_table(
        "s3://lake/dataset",
        SCHEMA,
        record_key="id",
        partition_by=["city"],
        ordering_field="ts",
        storage_options=opts,
    )
    t.insert(trips(list(range(50))))
    t.upsert(trips([1, 2], ts=2, name="u"))
    t.insert(trips([60, 61], city="東京 %/"))  # a key with `%`, `/` and non-ASCII
    ds = oxlake.Table("s3://lake/dataset", storage_options=opts).to_pyarrow_dataset(with_meta_columns=False)
    assert type(ds).__name__ == "FileSystemDataset"
    assert all(f.startswith("lake/dataset/city=") for f in ds.files)
    got = duckdb.sql("select id, name from ds where city = 'nyc' and id < 10 order by id").fetchall()
    assert got == [(1, "u1"), (4, "n4"), (7, "n7")]
    assert duckdb.sql("select id from ds where city = '東京 %/' order by id").fetchall() == [(60,), (61,)]
    assert rows(ds.to_table()) == rows(t.to_arrow(with_meta_columns=False))


def test_datafusion_python_reads_a_table_on_s3_through_oxlake_s_store(s3: SeaweedS3) -> None:
    """The table provider scans with oxlake's own object store (the table's credentials and
    endpoint), not the asking session's, which knows nothing of the bucket."""
    datafusion = pytest.importorskip("datafusion")
    opts = s3.storage_options()
    t = oxlake.create_table(
        "s3://lake/fusion",
        SCHEMA,
        record_key="id",
        partition_by=["city"],
        ordering_field="ts",
        storage_options=opts,
    )
    t.insert(trips(list(range(30))))
    ctx = datafusion.SessionContext()
    ctx.register_table("trips", t)
    got = ctx.sql("select id from trips where city = 'nyc' and id < 10 order by id").to_arrow_table()
    assert got["id"].to_pylist() == [1, 4, 7]


def test_a_folder_the_server_keeps_after_its_last_file_went_is_no_file(s3: SeaweedS3) -> None:
    """SeaweedFS lists a folder emptied of its files (the compaction claims, forgotten once the
    compaction completed) as an empty object of the folder's own name: no file, nothing damaged."""
    opts = s3.storage_options()
    t = oxlake.create_table(
        "s3://lake/kept_folder",
        SCHEMA,
        record_key="id",
        ordering_field="ts",
        table_type="MERGE_ON_READ",
        storage_options=opts,
    )
    for ts in range(3):
        t.upsert(trips([1, 2], ts=ts))
    assert t.compact().records == 2
    report = t.validate()
    assert report.ok, report.differences
    assert [r["ts"] for r in rows(t.scan())] == [2, 2]
