"""`Table.merge` (issue 31): a source matched with the table by key, clauses with conditions
and partial updates, one commit that is one transaction with its read."""

from __future__ import annotations

import dataclasses
from typing import Any

import oxlake
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from conftest import SCHEMA, rows, trips, trips_table
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

S = pc.field  # S("source", "x"), S("target", "x")


def by_id(t: oxlake.Table) -> dict[int, dict[str, Any]]:
    return {r["id"]: r for r in rows(t.scan(with_meta_columns=False))}


@pytest.fixture(params=["copy_on_write", "merge_on_read"])
def six(request: pytest.FixtureRequest, table_path: str) -> oxlake.Table:
    t = trips_table(table_path, table_type=request.param)
    t.insert(trips(list(range(6)), ts=5))
    return t


def source(ids: list[int], *, ts: int, fare: float = 100.0, name: str = "s") -> pa.Table:
    return trips(ids, ts=ts, fare=fare, name=name)


def commits(t: oxlake.Table) -> int:
    return sum(1 for i in t.timeline() if i.state == "completed")


def test_update_when_newer_and_insert_the_rest_in_one_commit(six: oxlake.Table) -> None:
    before, n = by_id(six), commits(six)
    changes = pa.concat_tables([source([0, 1], ts=9), source([2], ts=1), source([10], ts=9)])
    result = (
        six.merge(changes)
        .when_matched_update({"fare": S("source", "fare")}, condition=S("source", "ts") > S("target", "ts"))
        .when_not_matched_insert_all()
        .execute()
    )
    assert (result.num_updates, result.num_inserts) == (2, 1)
    assert commits(six) == n + 1
    after = by_id(six)
    for i in (0, 1):  # partial update: only fare set, name and ts stored
        assert after[i] == {**before[i], "fare": 100.0 + i}
    assert after[2] == before[2]  # older: no clause took it
    assert after[10] == {"id": 10, "name": "s10", "city": "nyc", "ts": 9, "fare": 110.0}
    assert six.history()[-1].operation == "UPSERT"


def test_the_first_clause_whose_condition_holds_takes_the_row(six: oxlake.Table) -> None:
    merged = (
        six.merge(source([0, 1, 2, 3], ts=5))
        .when_matched_update({"name": "low"}, condition=S("target", "fare") < 12)
        .when_matched_update({"name": S("source", "name")}, condition=S("target", "fare") < 13)
        .when_matched_update({"name": "rest"})
        .execute()
    )
    assert merged.num_updates == 4
    assert [by_id(six)[i]["name"] for i in range(4)] == ["low", "low", "s2", "rest"]


def test_a_null_condition_does_not_hold(six: oxlake.Table) -> None:
    six.update({"name": None}, predicate="id = 1")
    six.merge(source([0, 1], ts=5)).when_matched_update(
        {"fare": 0.0}, condition=S("target", "name") == "n0"
    ).execute()
    assert [by_id(six)[i]["fare"] for i in (0, 1)] == [0.0, 11.0]


def test_update_all_and_insert_with_values(six: oxlake.Table) -> None:
    partial = pa.table({"id": pa.array([0, 7], pa.int64()), "city": ["sf", "sf"], "name": ["x0", "x7"]})
    six.merge(partial).when_matched_update_all().when_not_matched_insert(
        {"name": S("source", "name"), "ts": 1, "fare": pc.scalar(1.5)}
    ).execute()
    got = by_id(six)
    assert got[0] == {"id": 0, "name": "x0", "city": "sf", "ts": 5, "fare": 10.0}
    assert got[7] == {"id": 7, "name": "x7", "city": "sf", "ts": 1, "fare": 1.5}


def test_a_delete_merge_and_a_merge_that_takes_nothing(six: oxlake.Table) -> None:
    result = (
        six.merge(source([0, 1, 2, 9], ts=5))
        .when_matched_delete(condition=S("target", "fare") > 10)
        .execute()
    )
    assert result.num_deletes == 2
    assert sorted(by_id(six)) == [0, 3, 4, 5]
    n = commits(six)
    nothing = six.merge(source([0], ts=5)).when_matched_update(
        {"name": "z"}, condition=S("target", "ts") > 99
    )
    assert nothing.execute().instant is None
    assert commits(six) == n


def test_a_merge_that_deletes_updates_and_inserts_is_one_commit(six: oxlake.Table) -> None:
    before, n = by_id(six), commits(six)
    result = (
        six.merge(source([0, 1, 2, 3, 10], ts=9))
        .when_matched_delete(condition=S("target", "fare") > 12)
        .when_matched_update({"fare": S("source", "fare")})
        .when_not_matched_insert_all()
        .execute()
    )
    assert (result.num_deletes, result.num_updates, result.num_inserts) == (1, 3, 1)
    assert commits(six) == n + 1
    after = by_id(six)
    assert sorted(after) == [0, 1, 2, 4, 5, 10]
    assert [after[i]["fare"] for i in (0, 1, 2)] == [100.0, 101.0, 102.0]
    assert after[4] == before[4] and after[5] == before[5]


def flagged(ids: list[int], deleted: list[bool | None], *, ts: int) -> pa.Table:
    return source(ids, ts=ts).append_column("_hoodie_is_deleted", pa.array(deleted, pa.bool_()))


def test_an_upsert_deletes_the_rows_flagged_hoodie_is_deleted(six: oxlake.Table) -> None:
    """Apache Hudi's delete marker: flagged rows delete their key, the others upsert; a null
    flag is false; a flagged key the table lacks deletes nothing; the column is not stored."""
    result = six.upsert(flagged([0, 1, 2, 20, 21], [True, False, None, True, False], ts=9))
    assert (result.num_deletes, result.num_updates, result.num_inserts) == (1, 2, 1)
    assert sorted(by_id(six)) == [1, 2, 3, 4, 5, 21]
    assert "_hoodie_is_deleted" not in six.schema.names
    # Flagged deletes of keys the table lacks change nothing: no instant.
    n = commits(six)
    assert six.upsert(flagged([30, 31], [True, True], ts=9)).instant is None
    assert commits(six) == n
    # Under event-time ordering a flagged delete older than the stored record loses to it.
    six.upsert(flagged([3, 4], [True, True], ts=1))
    assert sorted(by_id(six)) == [1, 2, 3, 4, 5, 21]
    with pytest.raises(oxlake.SchemaMismatchError, match="_hoodie_is_deleted"):
        six.upsert(source([5], ts=9).append_column("_hoodie_is_deleted", pa.array([1])))
    with pytest.raises(oxlake.SchemaMismatchError, match="_hoodie_is_deleted"):
        six.insert(flagged([40], [True], ts=9))


def test_merges_that_would_be_wrong_are_refused_and_leave_the_table(six: oxlake.Table) -> None:
    before, n = by_id(six), commits(six)
    m = six.merge(source([0, 1], ts=5))
    with pytest.raises(oxlake.InvalidDataError, match="more than once"):
        six.merge(source([0, 0], ts=5))
    with pytest.raises(oxlake.UnsupportedError, match="record key"):
        six.merge(source([0], ts=5), on="name")
    with pytest.raises(oxlake.SchemaMismatchError, match="lacks the key columns"):
        six.merge(pa.table({"id": pa.array([0], pa.int64())}))
    with pytest.raises(oxlake.SchemaMismatchError, match="nope"):
        six.merge(source([0], ts=5).append_column("nope", pa.array([1])))
    with pytest.raises(oxlake.SchemaMismatchError, match="lacks the table's columns"):
        six.merge(pa.table({"id": pa.array([0], pa.int64()), "city": ["sf"]})).when_not_matched_insert_all()
    with pytest.raises(oxlake.InvalidArgumentError, match="record key, partition or ordering"):
        m.when_matched_update({"ts": 1})
    with pytest.raises(oxlake.InvalidArgumentError, match="pyarrow.compute expression"):
        m.when_matched_update({"name": "a"}, condition="fare > 1")  # type: ignore[arg-type]
    with pytest.raises(oxlake.InvalidArgumentError, match="at least one"):
        m.execute()
    with pytest.raises(oxlake.SchemaMismatchError):  # a string for the double column
        m.when_matched_update({"fare": "not a number"}).execute()
    assert by_id(six) == before and commits(six) == n


def test_sources_that_cannot_be_matched_by_value_are_refused(six: oxlake.Table) -> None:
    """Null, empty and default-named partition values share one partition path, so matching by
    value would decide on the wrong row; stored duplicates of a key (bulk_insert keeps them)
    would be decided twice."""
    before, n = by_id(six), commits(six)
    for city in [None, "", "__HIVE_DEFAULT_PARTITION__"]:
        src = pa.table(
            {**{c: source([0], ts=9).column(c) for c in SCHEMA.names}, "city": pa.array([city], pa.string())}
        )
        with pytest.raises(oxlake.InvalidDataError, match="`city`"):
            six.merge(src)
    m = six.merge(source([0], ts=9))
    with pytest.raises(oxlake.InvalidArgumentError, match="cannot set `id`"):
        m.when_not_matched_insert({"id": S("source", "id") + 1000})
    with pytest.raises(oxlake.InvalidArgumentError, match="true or false"):
        m.when_matched_update({"name": "x"}, condition=S("source", "ts")).execute()
    assert by_id(six) == before and commits(six) == n
    if six.properties.get("hoodie.table.type") == "COPY_ON_WRITE":
        six.bulk_insert(trips([1], ts=5))
        with pytest.raises(oxlake.InvalidDataError, match="more than once"):
            six.merge(source([1], ts=9)).when_matched_update_all().execute()


def test_sources_of_other_engines_and_types_are_written_in_the_table_types(six: oxlake.Table) -> None:
    """A Polars frame (string_view columns) or int32 values: cast losslessly to the table's types,
    also when updated and inserted rows meet in one commit."""
    pl = pytest.importorskip("polars")
    frame = pl.DataFrame(source([0, 20], ts=9))
    six.merge(frame).when_matched_update(
        {"fare": S("source", "fare"), "name": "upd"}
    ).when_not_matched_insert_all().execute()
    got = by_id(six)
    assert (got[0]["name"], got[0]["fare"], got[20]["name"]) == ("upd", 100.0, "s20")
    with pytest.raises(oxlake.SchemaMismatchError, match="`ts`"):
        six.merge(source([30], ts=9)).when_not_matched_insert({"ts": 1.5}).execute()


def test_a_commit_between_the_read_and_the_write_makes_the_merge_decide_again(six: oxlake.Table) -> None:
    """The stored row changes after the merge read it: without retries the merge conflicts (its
    decision was taken on a stale row); with one it reads again and decides on the new row."""
    other = oxlake.Table(six.uri)
    landed: list[int] = []

    def meddle(merge: Any) -> Any:
        def lookup(keys: pa.Table) -> pa.Table:
            found = merge._lookup(keys)
            if not landed:
                landed.append(1)
                other.update({"name": "meddled"}, predicate="id = 0")
            return found

        return dataclasses.replace(merge, _lookup=lookup)

    m = six.merge(source([0], ts=5)).when_matched_update({"fare": 0.0}, condition=S("target", "name") == "n0")
    with pytest.raises(oxlake.CommitConflictError):
        meddle(m).execute()
    assert by_id(six)[0]["fare"] == 10.0  # nothing written on the stale read
    landed.clear()
    six.update({"name": "n0"}, predicate="id = 0")
    assert meddle(m).execute(conflict_retries=1).instant is None  # decided again: name is "meddled"
    assert by_id(six)[0] == {"id": 0, "name": "meddled", "city": "sf", "ts": 5, "fare": 10.0}


_IDS = st.lists(st.integers(min_value=0, max_value=11), unique=True, max_size=8)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    ids=_IDS,
    stamps=st.lists(st.integers(min_value=0, max_value=9), min_size=8, max_size=8),
    threshold=st.floats(min_value=9.0, max_value=17.0),
)
def test_merge_equals_its_model(
    six: oxlake.Table, ids: list[int], stamps: list[int], threshold: float
) -> None:
    """Update matched rows whose source is newer (fare and name), delete nothing, insert the
    unmatched rows whose fare is under a threshold: the table equals the model."""
    before = by_id(six)
    src = pa.table(
        {
            "id": pa.array(ids, pa.int64()),
            "name": [f"m{i}" for i in ids],
            "city": [["sf", "nyc", "chennai"][i % 3] for i in ids],
            "ts": pa.array(stamps[: len(ids)], pa.int64()),
            "fare": [float(i) + 8.5 for i in ids],
        },
        schema=SCHEMA,
    )
    six.merge(src).when_matched_update(
        {"fare": S("source", "fare"), "name": S("source", "name")},
        condition=S("source", "ts") > S("target", "ts"),
    ).when_not_matched_insert_all(condition=S("source", "fare") < threshold).execute()
    model = dict(before)
    for r in src.to_pylist():
        old = model.get(r["id"])
        if old is not None and r["ts"] > old["ts"]:
            model[r["id"]] = {**old, "fare": r["fare"], "name": r["name"]}
        elif old is None and r["fare"] < threshold:
            model[r["id"]] = r
    assert by_id(six) == model
    # Reset for the next example: the fixture's table is shared by the examples.
    six.insert_overwrite_table(trips(list(range(6)), ts=5))
