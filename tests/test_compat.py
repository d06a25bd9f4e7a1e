"""Tables written by Apache Hudi (../shared/compat): every table of versions 6, 8 and 9 (Lance
tables aside), copy-on-write and merge-on-read (Avro and Parquet log blocks, delete and rollback
blocks, timeline layouts 1 and 2).

Every table found in the folder is read at its latest instant, at every completed instant,
read-optimized, and incrementally between consecutive instants, and compared with hudi-rs reading
the same table and with the expectations of docs/FORMAT.md §8.
"""

from __future__ import annotations

import io
import os
import shutil
import zipfile
from datetime import datetime, timedelta
from pathlib import Path

import oxlake
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from conftest import COMPAT, CORPUS_ABSENT, hudi_read, require_corpus

ALL = sorted(z for z in COMPAT.rglob("v[0-9]*_*.zip") if "lance" not in z.name) if COMPAT.exists() else []
V6 = [z for z in ALL if z.name.startswith("v6_")]
V6_COW = [z for z in V6 if "cow" in z.parts]


def table_id(z: Path) -> str:
    """`sample_table/mor/parquet/v6_nonpartitioned` for the zip of that table."""
    return str(z.relative_to(COMPAT).with_suffix(""))


@pytest.fixture(scope="session")
def extracted(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("compat")
    out = {}
    for z in ALL:
        dest = root / table_id(z)
        with zipfile.ZipFile(z) as f:
            f.extractall(dest, members=[m for m in f.namelist() if not m.startswith("__MACOSX")])
        out[table_id(z)] = str(dest / z.stem)
    return out


def cow(name: str) -> str:
    return f"sample_table/cow/{name}"


def mor(name: str) -> str:
    return f"sample_table/mor/parquet/{name}"


def plain(table: pa.Table) -> list[tuple]:
    """Comparable rows: data columns only, as Python values, sorted."""
    cols = [c for c in table.column_names if not c.startswith("_hoodie_")]
    return sorted(tuple(str(v) for v in r.values()) for r in table.select(cols).to_pylist())


def id_name_active(table: pa.Table) -> list[tuple]:
    return sorted(
        zip(table["id"].to_pylist(), table["name"].to_pylist(), table["isActive"].to_pylist(), strict=True)
    )


@pytest.mark.skipif(not ALL, reason=CORPUS_ABSENT)
@pytest.mark.parametrize("name", [table_id(z) for z in ALL])
def test_a_dataset_of_every_table_equals_its_scan(extracted: dict[str, str], name: str) -> None:
    """`to_pyarrow_dataset` over tables Apache Hudi wrote (merge-on-read logs, key generators
    whose partition column is not the file's, tables without meta fields): the same rows and
    types as `to_arrow`, snapshot and read-optimized."""
    t = oxlake.Table(extracted[name])
    for query in ("snapshot", "read_optimized"):
        expected = t.to_arrow(query=query)
        got = t.to_pyarrow_dataset(query=query).to_table()
        assert got.schema.equals(expected.schema)
        assert sorted(map(str, got.to_pylist())) == sorted(map(str, expected.to_pylist()))


@pytest.mark.skipif(not ALL, reason=CORPUS_ABSENT)
@pytest.mark.parametrize("name", [table_id(z) for z in ALL])
def test_reads_like_hudi_rs_at_every_instant(extracted: dict[str, str], name: str) -> None:
    """Versions 8 and 9 bound incremental windows by completion time (the instants passed are
    requested times, read as completion bounds by both readers)."""
    path = extracted[name]
    t = oxlake.Table(path)
    assert plain(t.to_arrow()) == plain(hudi_read(path))
    ro = t.to_arrow(query="read_optimized")
    assert plain(ro) == plain(hudi_read(path, read_optimized=True))
    completed = [
        i
        for i in t.timeline()
        if i.state == "completed" and i.action in ("commit", "deltacommit", "replacecommit")
    ]
    for i in completed:
        assert plain(t.to_arrow(as_of=i.time)) == plain(hudi_read(path, as_of=i.time)), i
    for a, b in zip(completed, completed[1:], strict=False):
        ours = t.to_arrow(query="incremental", start=a.time, end=b.time)
        assert plain(ours) == plain(hudi_read(path, start=a.time, end=b.time)), (a, b)


@pytest.mark.skipif(not V6, reason=CORPUS_ABSENT)
def test_format_md_expectations(extracted: dict[str, str]) -> None:
    latest = [(1, "Alice", False), (2, "Bob", False), (3, "Carol", True), (4, "Diana", True)]
    first = [(1, "Alice", True), (2, "Bob", False), (3, "Carol", True)]
    names = ("v6_nonpartitioned", "v6_complexkeygen_hivestyle", "v6_simplekeygen_nonhivestyle")
    for name in [f(n) for n in names for f in (cow, mor)]:
        t = oxlake.Table(extracted[name])
        assert id_name_active(t.to_arrow()) == latest, name
        c1 = t.timeline()[0].time
        assert id_name_active(t.to_arrow(as_of=c1)) == first, name
        if not name.endswith("v6_nonpartitioned"):  # the partitioned tables carry byteField 10/20/30
            filtered = t.to_arrow(filter="byteField >= 10 AND byteField < 20 AND shortField != 100")
            assert sorted(filtered["name"].to_pylist()) == ["Alice", "Carol"], name
    for name in (cow("v6_empty"), mor("v6_empty")):
        assert oxlake.Table(extracted[name]).to_arrow().num_rows == 0
    # Read-optimized: Alice's update lives in the log, so the base file still has her active.
    ro = oxlake.Table(extracted[mor("v6_nonpartitioned")]).to_arrow(query="read_optimized")
    assert (1, "Alice", True) in id_name_active(ro)
    # The rolled-back update is ignored.
    rolled = oxlake.Table(extracted[mor("v6_nonpartitioned_rollback")]).to_arrow()
    assert id_name_active(rolled) == [(1, "Alice", True), (2, "Bob", True), (3, "Carol", True)]
    overwritten = oxlake.Table(extracted[cow("v6_simplekeygen_nonhivestyle_overwritetable")])
    commits = [i.time for i in overwritten.timeline() if i.state == "completed"]

    def inc(start: str | None, end: str | None) -> list[tuple]:
        out = overwritten.to_arrow(query="incremental", start=start, end=end)
        return sorted(zip(out["name"].to_pylist(), out["isActive"].to_pylist(), strict=True))

    assert inc("19700101000000000", commits[0]) == [("Alice", True), ("Bob", False), ("Carol", True)]
    assert inc(commits[0], commits[1]) == [("Alice", False), ("Diana", True)]
    assert inc(commits[1], commits[2]) == [("Diana", False)]
    assert inc(commits[2], None) == []
    assert overwritten.to_arrow().num_rows == 1


@pytest.mark.skipif(not V6_COW, reason=CORPUS_ABSENT)
def test_complex_keys_of_apache_hudi(extracted: dict[str, str]) -> None:
    keys = oxlake.Table(extracted[cow("v6_complexkeygen_hivestyle")]).to_arrow()["_hoodie_record_key"]
    keys = keys.to_pylist()
    assert sorted(keys)[0].startswith("id:1,name:Alice")


def test_corpus_is_present() -> None:
    """The corpus tests skip where it is absent; CI (`.ci/run`, OXLAKE_REQUIRE_CORPUS=1) runs
    them all."""
    if os.environ.get("OXLAKE_REQUIRE_CORPUS") == "1":
        assert Path(COMPAT).is_dir(), CORPUS_ABSENT
    else:
        require_corpus()


@pytest.mark.skipif(not V6, reason=CORPUS_ABSENT)
def test_quickstart_trips_with_avro_logs(extracted: dict[str, str]) -> None:
    def fares(path: str, as_of: str | None = None) -> dict[str, float]:
        rows = oxlake.Table(path).to_arrow(as_of=as_of).to_pylist()
        return {r["rider"]: r["fare"] for r in rows}

    updated = extracted["quickstart_trips_table/mor/avro/v6_trips_8i1u"]
    first = oxlake.Table(updated).timeline()[0].time
    rider_d = {r["rider"]: r for r in oxlake.Table(updated).to_arrow().to_pylist()}
    assert len(rider_d) == 8
    assert fares(updated)["rider-D"] == 25.0
    assert fares(updated, first)["rider-D"] == 33.9
    deleted = extracted["quickstart_trips_table/mor/avro/v6_trips_8i3d"]
    latest = fares(deleted)
    assert len(latest) == 5 and not {"rider-A", "rider-C", "rider-D"} & latest.keys()
    before = fares(deleted, oxlake.Table(deleted).timeline()[0].time)
    assert (before["rider-A"], before["rider-C"], before["rider-D"]) == (19.10, 27.70, 33.90)


V9_TXNS = [table_id(z) for z in ALL if "v9_txns_" in z.name and "overwrite" not in z.name]


@pytest.mark.skipif(not ALL, reason=CORPUS_ABSENT)
def test_format_md_expectations_v8_v9(extracted: dict[str, str]) -> None:
    latest = [(1, "Alice", False), (2, "Bob", False), (3, "Carol", True), (4, "Diana", True)]
    first = [(1, "Alice", True), (2, "Bob", False), (3, "Carol", True)]
    for name in (cow("v8_nonpartitioned"), cow("v8_simplekeygen_nonhivestyle")):
        t = oxlake.Table(extracted[name])
        assert id_name_active(t.to_arrow()) == latest, name
        c1 = [i for i in t.timeline() if i.state == "completed"][0].time
        assert id_name_active(t.to_arrow(as_of=c1)) == first, name
    t = oxlake.Table(extracted[cow("v8_simplekeygen_nonhivestyle")])
    filtered = t.to_arrow(filter="byteField >= 10 AND byteField < 20 AND shortField != 100")
    assert sorted(filtered["name"].to_pylist()) == ["Alice", "Carol"]
    assert oxlake.Table(extracted[cow("v8_empty")]).to_arrow().num_rows == 0

    partitioned = ["TXN-001", "TXN-003", "TXN-007", "TXN-008"] + [f"TXN-0{i}" for i in range(11, 19)]
    assert len(V9_TXNS) == 11
    for name in V9_TXNS:
        rows = {r["txn_id"]: r for r in oxlake.Table(extracted[name]).to_arrow().to_pylist()}
        if "nonpart" in name:
            assert len(rows) == 14, name
        else:
            assert sorted(rows) == partitioned, name
        assert rows["TXN-001"]["txn_type"] == "reversal", name
        assert str(rows["TXN-007"]["fee_amount"]) == "75.00", name
    for kind in ("sample_table/cow", "sample_table/mor/avro"):
        t = oxlake.Table(extracted[f"{kind}/v9_txns_simple_overwrite"])
        assert sorted(t.to_arrow()["txn_id"].to_pylist()) == ["TXN-101", "TXN-102", "TXN-103"]


WRITABLE_V6 = [z for z in V6 if "empty" not in z.name]


@pytest.mark.skipif(not V6, reason=CORPUS_ABSENT)
@pytest.mark.parametrize("name", [table_id(z) for z in WRITABLE_V6])
def test_round_trip_into_tables_apache_hudi_wrote(
    extracted: dict[str, str], name: str, tmp_path: Path
) -> None:
    """Upsert and delete with oxlake into a copy of each writable v6 table (nested columns included,
    sliced rows of the table's own data as input), then read with oxlake and hudi-rs."""
    path = str(tmp_path / "t")
    shutil.copytree(extracted[name], path)
    t = oxlake.Table(path)
    before = t.to_arrow()
    data = before.select([c for c in before.column_names if not c.startswith("_hoodie_")])
    changed = data.slice(0, 1)
    field = "name" if "name" in changed.column_names else "rider"
    changed = changed.set_column(
        changed.schema.get_field_index(field), field, pa.array(["Zed"], changed.schema.field(field).type)
    )
    up = t.upsert(changed)
    deleted = min(1, data.num_rows - 1)  # a one-row table keeps its row
    gone = t.delete(data.slice(1, 1))
    assert gone.num_deletes == deleted
    after = t.to_arrow()
    key_changed = field in t.properties.get("hoodie.table.recordkey.fields", "").split(",")
    assert after.num_rows == before.num_rows - deleted + (1 if key_changed else 0)
    assert up.num_updates == (0 if key_changed else 1)
    assert "Zed" in after[field].to_pylist()
    assert plain(after) == plain(hudi_read(path))


def tree(path: Path) -> dict[str, bytes]:
    return {str(p.relative_to(path)): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()}


@pytest.mark.skipif(not ALL, reason=CORPUS_ABSENT)
def test_writing_retires_apache_hudi_metadata_table(extracted: dict[str, str], tmp_path: Path) -> None:
    """docs/FORMAT.md §7: a v6 table carrying Apache Hudi's metadata table (a real one, taken from a
    corpus table, advertised in hoodie.properties) keeps it through reads; the first oxlake write
    un-advertises it, keeping every other property line as it was, and deletes it."""
    path = tmp_path / "t"
    shutil.copytree(extracted[cow("v6_nonpartitioned")], path)
    shutil.copytree(
        Path(extracted[cow("v9_txns_simple_meta")]) / ".hoodie/metadata", path / ".hoodie/metadata"
    )
    props = path / ".hoodie/hoodie.properties"
    original = props.read_text()
    props.write_text(
        original + "hoodie.table.metadata.partitions=files\nhoodie.table.metadata.partitions.inflight=\n"
    )
    mdt_files = tree(path / ".hoodie/metadata")
    assert mdt_files

    t = oxlake.Table(str(path))
    before = t.to_arrow()
    assert tree(path / ".hoodie/metadata") == mdt_files, "reads leave it alone"
    data = before.select([c for c in before.column_names if not c.startswith("_hoodie_")])
    t.upsert(data.slice(0, 1).set_column(1, "name", pa.array(["Zed"])))

    assert tree(path / ".hoodie/metadata") == {}, "no file of it is left (empty local folders may stay)"
    assert props.read_text().splitlines() == original.splitlines()
    assert "hoodie.table.metadata.partitions" not in t.properties
    after = oxlake.Table(str(path)).to_arrow()
    assert sorted(after["name"].to_pylist()) == sorted(["Zed", *before["name"].to_pylist()[1:]])
    assert plain(after) == plain(hudi_read(str(path)))


def java_compaction_plan(table: Path, time: str, operations: list[dict[str, object]]) -> None:
    """Writes `<time>.compaction.requested` as Apache Hudi does: an Avro container holding a
    `HoodieCompactionPlan`, in the schema of a plan Apache Hudi wrote (taken from the corpus)."""
    import fastavro

    require_corpus()
    with zipfile.ZipFile(COMPAT / "sample_table/mor/avro/v9_txns_simple_nometa.zip") as z:
        real = z.read("v9_txns_simple_nometa/.hoodie/timeline/20260307135839895.compaction.requested")
    schema = fastavro.reader(io.BytesIO(real)).writer_schema
    out = io.BytesIO()
    fastavro.writer(out, fastavro.parse_schema(schema), [{"operations": operations, "version": 2}])
    (table / f".hoodie/{time}.compaction.requested").write_bytes(out.getvalue())


@pytest.mark.skipif(not V6, reason=CORPUS_ABSENT)
def test_compaction_apache_hudi_scheduled(extracted: dict[str, str], tmp_path: Path) -> None:
    """A v6 merge-on-read table with a compaction Apache Hudi scheduled and did not run: an oxlake
    upsert into the group sends its log to the new slice (named with the compaction's instant),
    readers see every row, and `compact()` executes Apache Hudi's plan."""
    path = tmp_path / "t"
    shutil.copytree(extracted["quickstart_trips_table/mor/avro/v6_trips_8i1u"], path)
    part = path / "city=san_francisco"
    base = next(part.glob("*.parquet")).name
    logs = sorted(p.name for p in part.glob(".*.log.*"))
    file_id, base_time = base.split("_")[0], base.rsplit("_", 1)[1].removesuffix(".parquet")
    t = oxlake.Table(str(path))
    last = max(i.time for i in t.timeline())
    time = (datetime.strptime(last[:14], "%Y%m%d%H%M%S") + timedelta(seconds=1)).strftime(
        "%Y%m%d%H%M%S"
    ) + "000"
    op = {"baseInstantTime": base_time, "deltaFilePaths": logs, "dataFilePath": base, "fileId": file_id}
    java_compaction_plan(path, time, [{**op, "partitionPath": "city=san_francisco", "metrics": {}}])

    t = oxlake.Table(str(path))
    before = t.to_arrow()
    data = before.select([c for c in before.column_names if not c.startswith("_hoodie_")])
    row = data.filter(pc.equal(data["city"], "san_francisco")).slice(0, 1)
    t.upsert(row.set_column(row.schema.get_field_index("rider"), "rider", pa.array(["Zed"])))
    new_logs = sorted(p.name for p in part.glob(f".{file_id}_{time}.log.*"))
    assert len(new_logs) == 1, "the log joins the slice of the pending compaction"
    expected = plain(oxlake.Table(str(path)).to_arrow())
    assert "Zed" in str(expected)
    # hudi-rs 0.5.0 keeps a file only when its name's instant is completed (docs/FORMAT.md §4), so
    # it drops a log named with a pending compaction and reads the table as before the upsert:
    # a bug of hudi-rs (Apache Hudi merges that log into the slice being compacted, as we do).
    assert plain(hudi_read(str(path))) == plain(before)

    done = t.compact()
    assert done.instants[0] == time
    assert [(i.action, i.state) for i in t.timeline() if i.time == time] == [("commit", "completed")]
    assert list(part.glob(f"{file_id}_*_{time}.parquet"))
    assert plain(oxlake.Table(str(path)).to_arrow()) == expected
    assert plain(hudi_read(str(path))) == expected


@pytest.mark.skipif(not V6, reason=CORPUS_ABSENT)
def test_custom_payload_is_not_merged_by_guess(extracted: dict[str, str], tmp_path: Path) -> None:
    """A table whose records merge through a Java payload class of the user's: reads that merge
    refuse with a typed error (never a guessed merge); base-file reads work; writes refuse."""
    path = tmp_path / "t"
    shutil.copytree(extracted["quickstart_trips_table/mor/avro/v6_trips_8i1u"], path)
    expected_ro = plain(oxlake.Table(str(path)).to_arrow(query="read_optimized"))
    props = path / ".hoodie/hoodie.properties"
    lines = [
        ln for ln in props.read_text().splitlines() if not ln.startswith("hoodie.compaction.payload.class")
    ]
    props.write_text("\n".join([*lines, "hoodie.compaction.payload.class=com.acme.MyPayload", ""]))
    t = oxlake.Table(str(path))
    with pytest.raises(oxlake.UnsupportedError, match="custom payload"):
        t.to_arrow()
    assert plain(t.to_arrow(query="read_optimized")) == expected_ro
    ro = t.to_arrow(query="read_optimized")
    with pytest.raises(oxlake.UnsupportedError, match="custom payload"):
        t.upsert(ro.select([c for c in ro.column_names if not c.startswith("_hoodie_")]).slice(0, 1))


def java_store(props: dict[str, str]) -> str:
    """`hoodie.properties` as `java.util.Properties.store` writes it (Apache Hudi rewrites the file
    this way): `=`, `:`, `#`, `!`, `\\` escaped, a leading or key space escaped, control and
    non-ASCII characters as `\\uXXXX` UTF-16 units, a date comment first."""

    def convert(s: str, key: bool) -> str:
        out = []
        for i, c in enumerate(s):
            if c == " " and (i == 0 or key):
                out.append("\\ ")
            elif c in "\t\n\r\f":
                out.append({"\t": "\\t", "\n": "\\n", "\r": "\\r", "\f": "\\f"}[c])
            elif c in "=:#!\\":
                out.append("\\" + c)
            elif ord(c) < 0x20 or ord(c) > 0x7E:
                units = c.encode("utf-16-be")
                out.extend(f"\\u{units[j] << 8 | units[j + 1]:04X}" for j in range(0, len(units), 2))
            else:
                out.append(c)
        return "".join(out)

    lines = ["#Updated at 2026-11-23T19:00:00.000Z", "#Mon Nov 23 19:00:00 UTC 2026"]
    lines += [f"{convert(k, True)}={convert(v, False)}" for k, v in props.items()]
    return "\n".join(lines) + "\n"


def test_a_table_whose_properties_java_rewrote_opens(tmp_path: Path) -> None:
    """Java's `Properties.store` escapes the `=` that ends oxlake's base64 Arrow schema (and `:` in
    Avro schemas): the table opens, reads and writes the same after it rewrote the file, and a
    key Java added with escapes is kept."""
    path = tmp_path / "t"
    schema = pa.schema([("id", pa.int64()), ("v", pa.string())])
    t = oxlake.create_table(str(path), schema, record_key="id")
    t.insert(pa.table({"id": [1, 2], "v": ["a", "b"]}))
    props_file = path / ".hoodie" / "hoodie.properties"
    props = {}
    for line in props_file.read_text().splitlines():
        if line and not line.startswith("#"):
            k, v = line.split("=", 1)
            props[k] = v
    assert any(v.endswith("=") for v in props.values()), "the case at stake: a value ending in `=`"
    props["hoodie.table.create.schema"] = '{"type":"record","name":"café"}'
    props_file.write_text(java_store(props))

    t = oxlake.Table(str(path))
    assert t.to_arrow().sort_by("id").column("v").to_pylist() == ["a", "b"]
    t.upsert(pa.table({"id": [2, 3], "v": ["B", "c"]}))
    t.build_metadata()  # rewrites the file itself: every property kept, decoded
    t = oxlake.Table(str(path))
    assert t.to_arrow().sort_by("id").column("v").to_pylist() == ["a", "B", "c"]
    text = props_file.read_text()
    # Lines oxlake does not change stay as Java wrote them.
    assert 'hoodie.table.create.schema={"type"\\:"record","name"\\:"caf\\u00E9"}' in text.splitlines()
