"""The Python surface of issue 31: writes by predicate (one transaction with their read), a
table's history, `write_table`, `with_meta_columns`, pinned keyword-only signatures and the CLI's
`--version` and `history`."""

from __future__ import annotations

import inspect
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import oxlake
import oxlake.dask
import oxlake.polars
import oxlake.spark
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from conftest import SCHEMA, rows, trips, trips_table


def by_id(t: oxlake.Table) -> dict[int, dict[str, Any]]:
    return {r["id"]: r for r in rows(t.scan(with_meta_columns=False))}


@pytest.fixture(params=["copy_on_write", "merge_on_read"])
def six(request: pytest.FixtureRequest, table_path: str) -> oxlake.Table:
    t = trips_table(table_path, table_type=request.param)
    t.insert(trips(list(range(6))))
    return t


# ---- delete and update by predicate -----------------------------------------------------------


def test_delete_by_predicate(six: oxlake.Table) -> None:
    result = six.delete(predicate="fare >= 13")
    assert result.num_deletes == 3
    assert sorted(by_id(six)) == [0, 1, 2]
    # Tuples as `scan` takes them; a predicate matching nothing writes nothing.
    assert six.delete(predicate=[("city", "=", "sf"), ("fare", ">", 100.0)]).instant is None
    six.delete(predicate=[("city", "=", "sf")])
    assert sorted(by_id(six)) == [1, 2]


def test_delete_takes_keys_or_a_predicate_not_both(six: oxlake.Table) -> None:
    with pytest.raises(oxlake.InvalidArgumentError, match="exactly one"):
        six.delete(trips([1]), predicate="id = 1")
    with pytest.raises(oxlake.InvalidArgumentError, match="exactly one"):
        six.delete()


def test_update_sets_literals_and_expressions_on_matched_rows(six: oxlake.Table) -> None:
    before = by_id(six)
    result = six.update({"name": "renamed", "fare": pc.field("fare") * 2}, predicate="city = 'sf'")
    assert (result.num_updates, result.num_inserts) == (2, 0)
    after = by_id(six)
    for i in range(6):
        if before[i]["city"] == "sf":
            assert (after[i]["name"], after[i]["fare"]) == ("renamed", before[i]["fare"] * 2)
        else:
            assert after[i] == before[i]
    # Without a predicate every row; None nulls a nullable column.
    six.update({"name": None})
    assert {r["name"] for r in by_id(six).values()} == {None}
    assert six.update({"name": "x"}, predicate="id > 100").instant is None


def test_update_refuses_keys_partitions_ordering_and_unknown_columns(six: oxlake.Table) -> None:
    for column in ("id", "city", "ts"):
        with pytest.raises(oxlake.InvalidArgumentError, match=f"`{column}`"):
            six.update({column: 1})
    with pytest.raises(oxlake.SchemaMismatchError, match="`nope`"):
        six.update({"nope": 1})
    # A value the column cannot hold exactly is refused as any write's would be.
    with pytest.raises(oxlake.SchemaMismatchError, match="`fare`"):
        six.update({"fare": "cheap"})
    with pytest.raises(oxlake.InvalidArgumentError, match="at least one"):
        six.update({})


def test_a_commit_between_the_read_and_the_write_is_never_overwritten(six: oxlake.Table) -> None:
    """The read and the write of an update are one transaction: another writer's upsert landing
    in between makes the update conflict (and, with retries, read again and apply to it)."""
    other = oxlake.Table(six.uri)
    original = six.to_arrow
    races = {"left": 1}

    def racing_read(**kwargs: Any) -> pa.Table:
        read = original(**kwargs)
        if races["left"]:
            races["left"] -= 1
            # Same ordering value as the stored row: the update's stale copy would win the merge.
            other.upsert(trips([0], fare=1000.0))
        return read

    six.to_arrow = racing_read  # type: ignore[method-assign]
    with pytest.raises(oxlake.CommitConflictError):
        six.update({"fare": pc.field("fare") * 2}, predicate="id = 0")
    assert by_id(six)[0]["fare"] == 1000.0, "the concurrent upsert survives"

    races["left"] = 1
    six.update({"fare": pc.field("fare") * 2}, predicate="id = 0", conflict_retries=2)
    assert by_id(six)[0]["fare"] == 2000.0, "the retry read the concurrent value"

    races["left"] = 1
    six.delete(predicate="id = 0", conflict_retries=1)
    assert 0 not in by_id(six)


# ---- history ----------------------------------------------------------------------------------


def test_history_reports_operations_metrics_and_extra_metadata(six: oxlake.Table) -> None:
    six.upsert(trips([1, 2, 9]), extra_metadata={"job": "nightly"})
    six.delete([{"id": 9, "city": "sf"}])
    history = six.history()
    assert [c.operation for c in history] == ["INSERT", "UPSERT", "DELETE"]
    first, upsert, delete = history
    assert (first.num_inserts, first.num_updates, first.num_deletes) == (6, 0, 0)
    assert (upsert.num_inserts, upsert.num_updates) == (1, 2)
    assert delete.num_deletes == 1
    # (inserts, updates, deletes) per partition path
    assert first.partitions == {f"city={c}": (2, 0, 0) for c in ["sf", "nyc", "chennai"]}
    assert upsert.partitions == {"city=sf": (1, 0, 0), "city=nyc": (0, 1, 0), "city=chennai": (0, 1, 0)}
    assert delete.partitions == {"city=sf": (0, 0, 1)}
    assert upsert.extra_metadata == {"job": "nightly"}, "the schema kept there is left out"
    assert all(c.files_written > 0 and c.bytes_written > 0 for c in history)
    assert [c.time for c in history] == [i.time for i in six.timeline() if i.state == "completed"][:3]


def test_history_includes_archived_commits(table_path: str) -> None:
    t = trips_table(table_path, metadata=False)
    for i in range(8):
        t.upsert(trips([i]))
    t.archive(min_commits=2, max_commits=3)
    assert len(t.history()) < 8
    full = t.history(include_archived=True)
    assert [c.operation for c in full] == ["UPSERT"] * 8
    assert sum(c.num_inserts for c in full) == 8


# ---- write_table ------------------------------------------------------------------------------


def test_write_table_creates_appends_upserts_and_overwrites(tmp_path: Path) -> None:
    uri = str(tmp_path / "t")
    t = oxlake.write_table(uri, trips([1, 2]), record_key="id", partition_by=["city"], ordering_field="ts")
    assert sorted(by_id(t)) == [1, 2] and t.schema.names[-5:] == SCHEMA.names
    with pytest.raises(oxlake.TableExistsError):
        oxlake.write_table(uri, trips([3]), record_key="id")
    oxlake.write_table(uri, trips([3]), mode="append")
    oxlake.write_table(uri, trips([3], name="u", ts=2), mode="upsert")
    got = by_id(oxlake.Table(uri))
    assert sorted(got) == [1, 2, 3] and got[3]["name"] == "u3"
    oxlake.write_table(uri, trips([7]), mode="overwrite")
    assert sorted(by_id(oxlake.Table(uri))) == [7]
    # Options describing another table are refused; a stream (not a pyarrow Table) is taken.
    with pytest.raises(oxlake.InvalidArgumentError, match="table_type"):
        oxlake.write_table(uri, trips([8]), mode="append", table_type="merge_on_read")
    with pytest.raises(oxlake.InvalidArgumentError, match="table_version"):
        oxlake.write_table(uri, trips([8]), mode="append", table_version=6)
    reader = pa.RecordBatchReader.from_batches(SCHEMA, trips([5, 6]).to_batches())
    m = oxlake.write_table(
        str(tmp_path / "m"),
        reader,
        mode="upsert",
        record_key="id",
        table_type="merge_on_read",
        table_version=6,
    )
    assert sorted(by_id(m)) == [5, 6] and m.properties["hoodie.table.version"] == "6"
    with pytest.raises(oxlake.InvalidArgumentError, match="record_key"):
        oxlake.write_table(str(tmp_path / "n"), trips([1]), mode="append")
    with pytest.raises(oxlake.InvalidArgumentError, match="mode"):
        oxlake.write_table(uri, trips([1]), mode="replace")  # type: ignore[arg-type]


# ---- reads without meta columns ---------------------------------------------------------------


def test_with_meta_columns_false_reads_the_data_columns(six: oxlake.Table) -> None:
    assert six.to_arrow(with_meta_columns=False).schema.names == SCHEMA.names
    first = six.timeline()[0].time
    six.upsert(trips([1], ts=5))
    bound = six.timeline()[0].completion or first  # windows of completion times on version 8
    changes = six.to_arrow(query="changes", start=bound, with_meta_columns=False)
    assert changes.schema.names == [*SCHEMA.names, "_change_type"]
    assert changes.column("_change_type").to_pylist() == ["update"]
    assert six.to_arrow(as_of=first, with_meta_columns=False).num_rows == 6


# ---- pinned signatures -----------------------------------------------------------------------


PUBLIC = {
    oxlake.Table.scan: 0,
    oxlake.Table.to_arrow: 0,
    oxlake.Table.to_pandas: 0,
    oxlake.Table.splits: 0,
    oxlake.Table.scan_split: 1,
    oxlake.Table.planned_files: 0,
    oxlake.Table.insert: 1,
    oxlake.Table.upsert: 1,
    oxlake.Table.delete: 1,
    oxlake.Table.update: 1,
    oxlake.Table.bulk_insert: 1,
    oxlake.Table.insert_overwrite: 1,
    oxlake.Table.insert_overwrite_table: 1,
    oxlake.Table.history: 0,
    oxlake.create_table: 2,
    oxlake.write_table: 2,
    oxlake.spark.read: 2,
    oxlake.spark.write: 2,
    oxlake.spark.write_batch: 3,
    oxlake.dask.read: 1,
    oxlake.Table.merge: 1,
    oxlake.Table.to_polars: 0,
    oxlake.polars.scan: 1,
}


@pytest.mark.parametrize("fn", list(PUBLIC), ids=lambda f: f.__qualname__)
def test_arguments_after_the_data_are_keyword_only(fn: Any) -> None:
    params = [p for p in inspect.signature(fn).parameters.values() if p.name != "self"]
    positional = [p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    assert len(positional) == PUBLIC[fn], f"{fn.__qualname__} takes {positional} positionally"
    assert not [p for p in params if p.kind == p.VAR_KEYWORD and p.annotation in ("Any", Any)] or fn in (
        oxlake.write_table,
        oxlake.spark.write,
        oxlake.spark.write_batch,
    ), "no **kwargs: Any outside the create-option pass-throughs"


def test_every_public_name_is_documented() -> None:
    for name in oxlake.__all__:
        obj = getattr(oxlake, name)
        if inspect.isclass(obj) or inspect.isfunction(obj):
            assert (obj.__doc__ or "").strip(), f"oxlake.{name} has no docstring"
    for name, member in inspect.getmembers(oxlake.Table):
        if not name.startswith("_") and (inspect.isfunction(member) or isinstance(member, property)):
            assert (member.__doc__ or "").strip(), f"Table.{name} has no docstring"


USER_SCRIPT = """
from __future__ import annotations

import datetime

import oxlake
import oxlake.polars
import pyarrow as pa
import pyarrow.compute as pc


def job(uri: str, data: pa.Table) -> list[oxlake.Commit]:
    t: oxlake.Table = oxlake.write_table(
        uri, data, mode="upsert", record_key="id", table_type="merge_on_read"
    )
    result: oxlake.WriteResult = t.upsert(data)
    assert result.instant is not None
    t.delete(predicate="id > 10")
    t.update({"v": pc.field("v") * 2}, predicate=[("id", "<", 3)])
    t.merge(data).when_matched_update({"v": pc.field("source", "v")}).when_not_matched_insert_all().execute()
    before: pa.Table = t.to_arrow(as_of=datetime.datetime(2026, 1, 1), columns=["id"], query="snapshot")
    scan: oxlake.Scan = t.scan(filter="v > 1", with_meta_columns=False)
    for batch in scan:
        assert batch.num_rows >= 0
    frame = oxlake.polars.scan(t).collect()
    assert frame.height >= before.num_rows
    return t.history()
"""


def mypy_strict(script: Path, cache: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "MYPYPATH": str(Path(oxlake.__file__).parent.parent)}
    command = [sys.executable, "-m", "mypy", "--strict", "--cache-dir", str(cache), str(script)]
    return subprocess.run(command, capture_output=True, text=True, check=False, timeout=600, env=env)


def test_a_typed_user_script_passes_mypy_strict(tmp_path: Path) -> None:
    """The API's types serve a user's own type checking: a script using it passes `mypy
    --strict` (Literal arguments, typed results, no Any leaking into the user's code)."""
    script = tmp_path / "job.py"
    script.write_text(USER_SCRIPT)
    checked = mypy_strict(script, tmp_path / "cache")
    assert checked.returncode == 0, checked.stdout + checked.stderr
    wrong = tmp_path / "wrong.py"
    wrong.write_text(USER_SCRIPT.replace('query="snapshot"', 'query="snapshots"'))
    refused = mypy_strict(wrong, tmp_path / "cache")
    assert refused.returncode == 1 and "snapshots" in refused.stdout, refused.stdout


# ---- the CLI ----------------------------------------------------------------------------------


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "oxlake.cli", *args], capture_output=True, text=True, check=False, timeout=120
    )


def test_cli_version_history_and_option_help(six: oxlake.Table) -> None:
    version = cli("--version")
    assert version.returncode == 0 and version.stdout.strip() == f"oxlake {oxlake.__version__}"
    six.upsert(trips([1]))
    history = cli("history", six.uri)
    assert history.returncode == 0, history.stderr
    lines = history.stdout.splitlines()
    assert "operation" in lines[0] and [line.split()[2] for line in lines[1:]] == ["INSERT", "UPSERT"]
    helped = cli("clean", "--help").stdout
    assert "--retain N" in helped and "commits (or file versions) kept" in helped


# ---- nested columns ---------------------------------------------------------------------------

NESTED = pa.schema(
    [
        pa.field("id", pa.int64(), nullable=False),
        pa.field(
            "customer",
            pa.struct(
                [("tier", pa.string()), ("age", pa.int32()), ("address", pa.struct([("city", pa.string())]))]
            ),
        ),
        # A dotted top-level name cannot be (Avro refuses it, so Hudi cannot hold it): a
        # look-alike beside the nested path.
        pa.field("customer_tier", pa.string()),
        pa.field("ts", pa.int64()),
    ]
)


def customers(ids: list[int], ts: int = 1) -> pa.Table:
    tiers = ["gold", "silver", "bronze"]
    return pa.table(
        {
            "id": ids,
            "customer": [
                None if i % 5 == 4 else {"tier": tiers[i % 3], "age": i, "address": {"city": f"c{i % 2}"}}
                for i in ids
            ],
            "customer_tier": [f"top-{i}" for i in ids],
            "ts": [ts] * len(ids),
        },
        schema=NESTED,
    )


@pytest.mark.parametrize("table_type", ["copy_on_write", "merge_on_read"])
def test_nested_fields_in_filters_and_columns(table_path: str, table_type: oxlake.TableType) -> None:
    t = oxlake.create_table(table_path, NESTED, record_key="id", ordering_field="ts", table_type=table_type)
    t.insert(customers(list(range(10))))
    t.upsert(
        customers([1, 2], ts=2).set_column(2, "customer_tier", pa.array(["new-1", "new-2"]))
    )  # logs on MOR
    expected = {r["id"]: r for r in customers(list(range(10))).to_pylist()}
    expected[1]["customer_tier"], expected[2]["customer_tier"] = "new-1", "new-2"

    def ids(filter: oxlake.table.FilterLike) -> list[int]:
        return sorted(t.to_arrow(filter=filter, columns=["id"]).column("id").to_pylist())

    gold = sorted(i for i, r in expected.items() if r["customer"] and r["customer"]["tier"] == "gold")
    assert ids("customer['tier'] = 'gold'") == gold
    assert ids("customer.tier = 'gold'") == gold  # SQL reads a dotted name as the path
    assert ids([("customer.tier", "=", "gold")]) == gold  # a tuple's dotted name is the path too
    assert ids([("customer_tier", "=", "new-2")]) == [2]
    assert ids([("customer.age", ">", 5)]) == [i for i in range(6, 10) if i % 5 != 4]
    assert ids([("customer.address.city", "=", "c1")]) == [1, 3, 5, 7]
    assert ids("customer['address']['city'] = 'c0' AND customer['age'] < 4") == [0, 2]

    got = t.to_arrow(columns=["id", "customer.address.city", "customer.age", "customer_tier"]).sort_by("id")
    assert got.column_names == ["id", "customer.address.city", "customer.age", "customer_tier"]
    assert got.schema.field("customer.age").type == pa.int32()
    for row in got.to_pylist():
        c = expected[row["id"]]["customer"]
        assert row["customer.address.city"] == (c["address"]["city"] if c else None)
        assert row["customer.age"] == (c["age"] if c else None)
        assert row["customer_tier"] == expected[row["id"]]["customer_tier"]

    with pytest.raises(oxlake.InvalidArgumentError, match="customer.zip"):
        t.to_arrow(columns=["customer.zip"])
    with pytest.raises(oxlake.InvalidArgumentError, match="customer.age.x"):
        t.to_arrow(columns=["customer.age.x"])
    with pytest.raises(oxlake.InvalidArgumentError, match="customer.zip"):
        t.to_arrow(filter=[("customer.zip", "=", "x")])

    # The engines plan the same columns: Dask's partitions and Spark's schema.
    frame = oxlake.dask.read(table_path, columns=["id", "customer.address.city"]).compute()
    assert sorted(frame.columns) == ["customer.address.city", "id"]
    assert dict(zip(frame["id"], frame["customer.address.city"], strict=True))[3] == "c1"
