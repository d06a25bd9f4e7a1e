"""Writes with Apache Hudi's timestamp-based and custom key generators (docs/KEY_GENERATORS.md):
partition paths as `TimestampBasedKeyGenerator` prints them, on table versions 6 and 8, read back
by oxlake and hudi-rs; options refused before anything is written."""

from __future__ import annotations

import datetime as dt
import shutil
import zipfile
from pathlib import Path

import oxlake
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import COMPAT, CORPUS_ABSENT, hudi_read, rows, snapshot

TS = "hoodie.keygen.timebased."
EVENTS = pa.schema(
    [
        pa.field("id", pa.string(), nullable=False),
        pa.field("region", pa.string()),
        pa.field("millis", pa.int64()),
        pa.field("seconds", pa.int64()),
        pa.field("text", pa.string()),
        pa.field("at", pa.timestamp("us", tz="UTC")),
        pa.field("v", pa.int64()),
    ]
)
# 2024-01-15T09:30:00Z, 2024-01-15T23:59:59.999Z, 1999-12-31T23:00:00Z
INSTANTS = [1_705_311_000_000, 1_705_363_199_999, 946_681_200_000]


def events(ids: list[int], v: int = 0, region: str | None = "eu") -> pa.Table:
    ms = [INSTANTS[i % 3] for i in ids]
    return pa.table(
        {
            "id": [f"k{i}" for i in ids],
            "region": [region] * len(ids),
            "millis": ms,
            "seconds": [m // 1000 for m in ms],
            "text": [
                dt.datetime.fromtimestamp(m / 1000, dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"
                for m in ms
            ],
            "at": pa.array([m * 1000 for m in ms], pa.timestamp("us", tz="UTC")),
            "v": [v] * len(ids),
        },
        schema=EVENTS,
    )


def partitions(t: oxlake.Table) -> dict[str, str]:
    """Record key -> `_hoodie_partition_path` of the latest rows."""
    data = t.to_arrow()
    return dict(
        zip(data["_hoodie_record_key"].to_pylist(), data["_hoodie_partition_path"].to_pylist(), strict=True)
    )


CASES = {
    "epoch millis, nested": (
        ["millis:timestamp"],
        {"timestamp.type": "EPOCHMILLISECONDS", "output.dateformat": "yyyy/MM/dd"},
        False,
        ["2024/01/15", "2024/01/15", "1999/12/31"],
    ),
    "unix seconds, a zone": (
        ["seconds:timestamp"],
        {
            "timestamp.type": "UNIX_TIMESTAMP",
            "output.dateformat": "yyyy-MM-dd HH",
            "timezone": "Asia/Shanghai",
        },
        True,
        ["2024-01-15 17", "2024-01-16 07", "2000-01-01 07"],
    ),
    "date strings, two formats, output zone": (
        ["text:timestamp"],
        {
            "timestamp.type": "DATE_STRING",
            "input.dateformat": "yyyy-MM-dd,yyyy-MM-dd'T'HH:mm:ss.SSSZ",
            "output.dateformat": "yyyyMMdd",
            "output.timezone": "EST",
        },
        True,
        ["20240115", "20240115", "19991231"],
    ),
    "arrow timestamps": (
        ["at:timestamp"],
        {"timestamp.type": "EPOCHMILLISECONDS", "output.dateformat": "yyyy-MM"},
        True,
        ["2024-01", "2024-01", "1999-12"],
    ),
}


@pytest.mark.parametrize("table_version", [6, 8])
@pytest.mark.parametrize("case", sorted(CASES))
def test_timestamp_partitions_as_apache_hudi_prints_them(
    tmp_path: Path, case: str, table_version: int
) -> None:
    fields, options, url_encode, expected = CASES[case]
    path = str(tmp_path / "t")
    t = oxlake.create_table(
        path,
        EVENTS,
        record_key="id",
        partition_by=fields,
        table_version=table_version,
        hive_style=False,
        url_encode=url_encode,
        key_generator_options={TS + k: v for k, v in options.items()},
    )
    props = t.properties
    assert props["hoodie.table.partition.fields"] == fields[0].split(":")[0]
    if table_version == 6:
        assert props["hoodie.table.keygenerator.class"] == "org.apache.hudi.keygen.TimestampBasedKeyGenerator"
    else:
        assert props["hoodie.table.keygenerator.type"] == "TIMESTAMP"
    assert all(props[TS + k] == v for k, v in options.items())
    t.insert(events([0, 1, 2]))
    assert partitions(t) == {f"k{i}": p for i, p in enumerate(expected)}
    for i, p in enumerate(expected):
        directory = p if not url_encode else p.replace("/", "%2F")
        assert list(Path(path, directory).glob("*.parquet")), (i, directory)
        # Java counts the directories below the root (`yyyy/MM/dd` is 3 deep).
        marker = Path(path, directory, ".hoodie_partition_metadata").read_text()
        assert f"partitionDepth={directory.count('/') + 1}\n" in marker, marker
    # An upsert finds its rows (simple keys, the same partitions); a delete removes one.
    assert t.upsert(events([0, 1], v=1)).num_updates == 2
    assert t.delete(events([2])).num_deletes == 1
    got = rows(t.scan(), key="id")
    assert [(r["id"], r["v"]) for r in got] == [("k0", 1), ("k1", 1)]
    assert rows(hudi_read(path), key="id") == got
    # A filter on the partition column is never answered from the path (which is not its value).
    column = fields[0].split(":")[0]
    value = events([0])[column][0].as_py()
    assert [r["id"] for r in rows(t.scan(filter=[(column, "=", value)]), key="id")] == ["k0"]


@pytest.mark.parametrize("table_type", ["copy_on_write", "merge_on_read"])
def test_a_filter_on_a_timestamp_partition_column_sees_the_version_the_merge_keeps(
    tmp_path: Path, table_type: str
) -> None:
    """Many instants print as one partition: a record moves within it between versions, so a
    filter on the column is never applied to a base row before the merge."""
    schema = pa.schema([pa.field("id", pa.string(), nullable=False), ("ms", pa.int64()), ("v", pa.int64())])
    t = oxlake.create_table(
        str(tmp_path / "t"),
        schema,
        record_key="id",
        partition_by=["ms:timestamp"],
        ordering_field="v",
        table_type=table_type,
        key_generator_options={
            TS + "timestamp.type": "EPOCHMILLISECONDS",
            TS + "output.dateformat": "yyyy/MM/dd/HH",
        },
    )
    old, new = INSTANTS[0], INSTANTS[0] + 60_000  # the same hour
    t.insert(pa.table({"id": ["a"], "ms": [old], "v": [10]}, schema=schema))
    t.upsert(pa.table({"id": ["a"], "ms": [new], "v": [5]}, schema=schema))  # loses: lower v
    kept = [{"id": "a", "ms": old, "v": 10}]
    assert rows(t.scan(), key="id") == kept
    assert rows(t.scan(filter=[("ms", "=", new)]), key="id") == []
    assert rows(t.scan(filter=[("ms", "=", old)]), key="id") == kept
    assert rows(t.scan(filter=[("ms", ">=", old)]), key="id") == kept
    t.upsert(pa.table({"id": ["a"], "ms": [new], "v": [20]}, schema=schema))  # wins
    assert rows(t.scan(filter=[("ms", "=", old)]), key="id") == []
    assert rows(t.scan(filter=[("ms", "=", new)]), key="id") == [{"id": "a", "ms": new, "v": 20}]


def test_nulls_go_where_apache_hudi_puts_them(tmp_path: Path) -> None:
    """A null timestamp takes Hudi's default instant: 1 in the type's unit (1 ms here)."""
    t = oxlake.create_table(
        str(tmp_path / "t"),
        EVENTS,
        record_key="id",
        partition_by=["millis:timestamp"],
        key_generator_options={
            TS + "timestamp.type": "EPOCHMILLISECONDS",
            TS + "output.dateformat": "yyyy-MM-dd HH:mm:ss.SSS",
        },
    )
    data = events([0]).set_column(2, "millis", pa.array([None], pa.int64()))
    t.insert(data)
    assert partitions(t) == {"k0": "millis=1970-01-01 00%3A00%3A00.001"}
    assert rows(t.scan(), key="id")[0]["millis"] is None


@pytest.mark.parametrize("table_version", [6, 8])
def test_custom_key_generator(tmp_path: Path, table_version: int) -> None:
    """`region` as text and `at` as a day: segments joined, each hive-style and escaped; keys
    complex (two key fields); the types recorded where Apache Hudi reads them."""
    path = str(tmp_path / "t")
    t = oxlake.create_table(
        path,
        EVENTS,
        record_key=["id", "region"],
        partition_by=["region", "at:timestamp"],
        table_version=table_version,
        key_generator_options={
            TS + "timestamp.type": "EPOCHMILLISECONDS",
            TS + "output.dateformat": "yyyy/MM/dd",
        },
    )
    props = t.properties
    if table_version == 6:
        assert props["hoodie.table.keygenerator.class"] == "org.apache.hudi.keygen.CustomKeyGenerator"
        assert props["hoodie.table.partition.fields"] == "region,at"
        assert props["hoodie.datasource.write.partitionpath.field"] == "region:SIMPLE,at:TIMESTAMP"
    else:
        assert props["hoodie.table.keygenerator.type"] == "CUSTOM"
        assert props["hoodie.table.partition.fields"] == "region:SIMPLE,at:TIMESTAMP"
    t.insert(pa.concat_tables([events([0, 2]), events([1], region="a/b")]))
    assert partitions(t) == {
        "id:k0,region:eu": "region=eu/at=2024%2F01%2F15",
        "id:k1,region:a/b": "region=a%2Fb/at=2024%2F01%2F15",
        "id:k2,region:eu": "region=eu/at=1999%2F12%2F31",
    }
    assert t.upsert(events([0], v=7)).num_updates == 1
    eu = rows(t.scan(filter=[("region", "=", "eu")]), key="id")
    assert [r["id"] for r in eu] == ["k0", "k2"]
    if table_version == 6:  # hudi-rs 0.5 takes `region:SIMPLE` (Apache Hudi 1.x's spelling) for a column
        assert eu == [r for r in rows(hudi_read(path), key="id") if r["region"] == "eu"]
    reopened = oxlake.Table(path)
    assert [r["v"] for r in rows(reopened.scan(), key="id")] == [7, 0, 0]
    if table_version == 6:
        reopened.upgrade(8)
        assert reopened.properties["hoodie.table.partition.fields"] == "region:SIMPLE,at:TIMESTAMP"
        assert reopened.upsert(events([2], v=9)).num_updates == 1
        assert [r["v"] for r in rows(reopened.scan(), key="id")] == [7, 0, 9]


def test_bad_options_are_refused_before_anything_is_written(tmp_path: Path) -> None:
    path = tmp_path / "t"

    def create(fields: list[str], options: dict[str, str]) -> oxlake.Table:
        return oxlake.create_table(
            str(path), EVENTS, record_key="id", partition_by=fields, key_generator_options=options
        )

    for fields, options, match in [
        (["millis:timestamp"], {}, "timestamp.type"),
        (
            ["millis:timestamp"],
            {TS + "timestamp.type": "EPOCHMILLIS", TS + "output.dateformat": "yyyy"},
            "upper case",
        ),
        (["millis:timestamp"], {TS + "timestamp.type": "SCALAR", TS + "output.dateformat": "yyyy-ww"}, "`w`"),
        (
            ["millis:timestamp"],
            {TS + "timestamp.type": "SCALAR", TS + "output.dateformat": "yyyy", TS + "timezone": "+08:00"},
            "time zone",
        ),
        (["millis:timestamp"], {"hoodie.keygen.timebased.typo": "x"}, "typo"),
        (
            ["text:timestamp"],
            {TS + "input.dateformat": "yyyy-MM-dd", TS + "output.dateformat": "yyyy"},
            "timestamp.type` is required",
        ),
        (["millis:timestamp"], {TS + "timestamp.type": "SCALAR", TS + "output.dateformat": "uuuu"}, "`u`"),
        (
            ["millis:timestamp"],
            {TS + "timestamp.type": "SCALAR", TS + "output.dateformat": "yyyy", TS + "timezone": "GMT+1é1"},
            "GMT offset",
        ),
        (["millis"], {TS + "timestamp.type": "SCALAR"}, "no partition field"),
        (["millis:date"], {}, "neither SIMPLE nor TIMESTAMP"),
        (["v:timestamp", "x"], {}, "not in the schema"),
    ]:
        with pytest.raises(oxlake.InvalidArgumentError, match=match):
            create(fields, options)
        assert not path.exists() or not any(path.rglob("*.properties"))


def test_values_that_make_no_partition_leave_the_table_as_it_was(tmp_path: Path) -> None:
    t = oxlake.create_table(
        str(tmp_path / "t"),
        EVENTS,
        record_key="id",
        partition_by=["text:timestamp"],
        key_generator_options={
            TS + "timestamp.type": "DATE_STRING",
            TS + "input.dateformat": "yyyy-MM-dd'T'HH:mm:ss.SSSZ,yyyy-dd-MM'T'HH:mm:ss.SSSZ",
            TS + "output.dateformat": "yyyy/MM/dd",
        },
    )
    t.insert(events([0]))
    before = snapshot(t)
    for text in ["15/01/2024", "2024-13-01T00:00:00.000Z"]:
        # The second: the first format matches it and it names no month (as Joda, which never
        # tries the second format then).
        bad = events([1]).set_column(4, "text", pa.array([text]))
        with pytest.raises(oxlake.InvalidDataError, match=text):
            t.upsert(bad)
        assert snapshot(t) == before


CORPUS = sorted(COMPAT.rglob("*timebasedkeygen*.zip")) if COMPAT.exists() else []


@pytest.mark.skipif(not CORPUS, reason=CORPUS_ABSENT)
@pytest.mark.parametrize("zip_path", CORPUS, ids=lambda z: f"{z.parent.name}/{z.stem}")
def test_apache_hudi_timestamp_tables_take_writes_in_their_partitions(zip_path: Path, tmp_path: Path) -> None:
    """Every row upserted again lands in the partition Apache Hudi gave it (so no key is in two
    partitions), a new row in the one Hudi would give it; oxlake and hudi-rs agree after."""
    with zipfile.ZipFile(zip_path) as f:
        f.extractall(tmp_path, members=[m for m in f.namelist() if not m.startswith("__MACOSX")])
    path = str(tmp_path / zip_path.stem)
    t = oxlake.Table(path)
    before = t.to_arrow()
    where = dict(
        zip(
            before["_hoodie_record_key"].to_pylist(),
            before["_hoodie_partition_path"].to_pylist(),
            strict=True,
        )
    )
    data = before.select([c for c in before.column_names if not c.startswith("_hoodie_")])
    t.upsert(data)
    after = t.to_arrow()
    assert after.num_rows == before.num_rows
    assert (
        dict(
            zip(
                after["_hoodie_record_key"].to_pylist(),
                after["_hoodie_partition_path"].to_pylist(),
                strict=True,
            )
        )
        == where
    )
    key = t.properties["hoodie.table.recordkey.fields"]
    # A key Apache Hudi wrote once (some it inserted twice; a delete of one copy loses to the
    # other's greater ordering value, as in Hudi).
    keys = data[key].to_pylist()
    once = next(i for i, k in enumerate(keys) if keys.count(k) == 1)
    assert t.delete(data.slice(once, 1)).num_deletes == 1
    if t.properties["hoodie.table.type"] == "MERGE_ON_READ":
        t.compact()
    t.clean(policy="keep_latest_commits", retain=1)
    ours = sorted(t.to_arrow()[key].to_pylist())
    assert len(ours) == before.num_rows - 1
    assert ours == sorted(hudi_read(path)[key].to_pylist())
    shutil.rmtree(tmp_path, ignore_errors=True)


@pytest.mark.parametrize(
    ("table_type", "class_name"),
    [
        ("copy_on_write", "com.example.lake.DayKeyGenerator"),
        ("merge_on_read", "com.example.lake.DayKeyGenerator"),
        # Named like Apache Hudi's, in a package of its own: not Hudi's.
        ("copy_on_write", "com.example.keygen.SimpleKeyGenerator"),
    ],
)
def test_a_key_generator_of_its_own_never_answers_a_filter_from_the_path(
    tmp_path: Path, table_type: str, class_name: str
) -> None:
    """A table whose key generator is a class of its own (which oxlake cannot run) reads whole:
    its partition path need not be the field's value, so a filter on the field reads every
    partition and is applied to the rows, never to the path."""
    path = tmp_path / "t"
    t = oxlake.create_table(
        str(path),
        EVENTS,
        record_key="id",
        partition_by=["millis:timestamp"],
        table_type=table_type,
        table_version=6,
        hive_style=False,
        key_generator_options={
            TS + "timestamp.type": "EPOCHMILLISECONDS",
            TS + "output.dateformat": "yyyyMMdd",
        },
    )
    t.insert(events([0, 1, 2]))
    t.upsert(events([1, 2], v=1))
    assert sorted(p.name for p in path.iterdir() if p.is_dir() and p.name != ".hoodie") == [
        "19991231",
        "20240115",
    ]
    props = path / ".hoodie" / "hoodie.properties"
    text = props.read_text().replace("org.apache.hudi.keygen.TimestampBasedKeyGenerator", class_name)
    props.write_text(text)
    own = oxlake.Table(str(path))
    assert own.properties["hoodie.table.keygenerator.class"] == class_name
    expected = {"k0": 0, "k1": 1, "k2": 1}
    assert {r["id"]: r["v"] for r in rows(own.scan(), key="id")} == expected
    for i in range(3):
        got = rows(own.scan(filter=[("millis", "=", INSTANTS[i])]), key="id")
        assert [(r["id"], r["v"]) for r in got] == [(f"k{i}", expected[f"k{i}"])], i
    got = rows(own.scan(filter=[("millis", ">", INSTANTS[2])]), key="id")
    assert [r["id"] for r in got] == ["k0", "k1"]
    # The path segment is not a value of `millis` either.
    assert rows(own.scan(filter=[("millis", "=", 20240115)]), key="id") == []
    before = snapshot(own)
    with pytest.raises(oxlake.UnsupportedError, match=class_name):
        own.upsert(events([0], v=2))
    # Its keys are not known to be the key field's text: no lookup by that field either.
    with pytest.raises(
        oxlake.UnsupportedError, match=f"looking records up by key with the key generator {class_name}"
    ):
        own.lookup(pa.table({"id": ["k0"]}))
    assert snapshot(oxlake.Table(str(path))) == before


def test_a_key_generator_of_its_own_drops_no_base_row_by_a_key_field(tmp_path: Path) -> None:
    """A class of the table's own may give two values of a key field one key (here it folds
    case): a filter on the field is applied to the merged rows, never to base rows before the
    merge, where it would drop the version that wins."""
    path = tmp_path / "t"
    schema = pa.schema([pa.field("id", pa.string(), nullable=False), ("v", pa.int64())])
    t = oxlake.create_table(
        str(path),
        schema,
        record_key="id",
        ordering_field="v",
        table_type="merge_on_read",
        table_version=6,
        metadata=False,
    )
    t.insert(pa.table({"id": ["abc"], "v": [10]}, schema=schema))
    t.upsert(pa.table({"id": ["abc"], "v": [5]}, schema=schema))  # a log version that loses by `v`
    (base,) = (p for p in path.rglob("*.parquet") if ".hoodie" not in p.parts)
    stored = pq.read_table(base)
    at = stored.schema.get_field_index("id")
    pq.write_table(stored.set_column(at, stored.schema.field(at), pa.array(["ABC"], pa.string())), base)
    props = path / ".hoodie" / "hoodie.properties"
    lines = [
        line for line in props.read_text().splitlines() if not line.startswith("hoodie.table.keygenerator.")
    ]
    props.write_text(
        "\n".join([*lines, "hoodie.table.keygenerator.class=com.example.LowerCaseKeyGenerator", ""])
    )
    own = oxlake.Table(str(path))
    assert [(r["id"], r["v"]) for r in rows(own.to_arrow(columns=["id", "v"]))] == [("ABC", 10)]
    assert rows(own.to_arrow(columns=["id", "v"], filter=[("id", "=", "abc")])) == []
    assert [r["v"] for r in rows(own.to_arrow(columns=["id", "v"], filter=[("id", "=", "ABC")]))] == [10]


def test_a_partition_old_apache_hudi_named_default_holds_nulls(tmp_path: Path) -> None:
    """Apache Hudi before 0.12 wrote null and empty partition values to `default` (its readers
    still take that segment as null): a filter on the column keeps such a partition for null,
    empty and `default` alike, and applies itself to the rows."""
    path = tmp_path / "t"
    schema = pa.schema(
        [pa.field("id", pa.string(), nullable=False), ("region", pa.string()), ("v", pa.int64())]
    )
    t = oxlake.create_table(str(path), schema, record_key="id", partition_by=["region"], metadata=False)
    t.insert(
        pa.table(
            {"id": ["a", "b", "c"], "region": ["default", "eu", "default"], "v": [1, 2, 3]}, schema=schema
        )
    )
    # What the old writer left: the rows of the `default` directory hold null and "" values.
    (old,) = (path / "region=default").glob("*.parquet")
    base = pq.read_table(old)
    column = base.schema.get_field_index("region")
    values = {"a": None, "c": ""}
    base = base.set_column(
        column, base.schema.field(column), pa.array([values[k] for k in base["id"].to_pylist()], pa.string())
    )
    pq.write_table(base, old)
    t = oxlake.Table(str(path))

    def ids(where: str) -> list[str]:
        return [r["id"] for r in rows(t.to_arrow(filter=where), key="id")]

    assert ids("region IS NULL") == ["a"]
    assert ids("region = ''") == ["c"]
    assert ids("region = 'eu'") == ["b"]
    assert ids("region = 'default'") == []
    assert ids("region IS NOT NULL") == ["b", "c"]
