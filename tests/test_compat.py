"""Tables written by Apache Hudi (../shared/compat): copy-on-write tables of version 6.

Every table found in the folder is read at its latest instant and at every completed instant, and
compared with hudi-rs reading the same table and with the expectations of FORMAT.md §8.
"""

from __future__ import annotations

import zipfile
from pathlib import Path

import oxlake
import pyarrow as pa
import pytest
from conftest import COMPAT, hudi_read

V6_COW = sorted((COMPAT / "sample_table" / "cow").glob("v6_*.zip")) if COMPAT.exists() else []


@pytest.fixture(scope="session")
def extracted(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("compat")
    out = {}
    for z in V6_COW:
        with zipfile.ZipFile(z) as f:
            f.extractall(root, members=[m for m in f.namelist() if not m.startswith("__MACOSX")])
        out[z.stem] = str(root / z.stem)
    return out


def plain(table: pa.Table) -> list[tuple]:
    """Comparable rows: data columns only, as Python values, sorted."""
    cols = [c for c in table.column_names if not c.startswith("_hoodie_")]
    return sorted(tuple(str(v) for v in r.values()) for r in table.select(cols).to_pylist())


def id_name_active(table: pa.Table) -> list[tuple]:
    return sorted(
        zip(table["id"].to_pylist(), table["name"].to_pylist(), table["isActive"].to_pylist(), strict=True)
    )


@pytest.mark.skipif(not V6_COW, reason="the compatibility corpus is not next to the project")
@pytest.mark.parametrize("name", [z.stem for z in V6_COW])
def test_reads_like_hudi_rs_at_every_instant(extracted: dict[str, str], name: str) -> None:
    path = extracted[name]
    t = oxlake.Table(path)
    assert plain(t.to_arrow()) == plain(hudi_read(path))
    completed = [
        i for i in t.timeline() if i.state == "completed" and i.action in ("commit", "replacecommit")
    ]
    for i in completed:
        assert plain(t.to_arrow(as_of=i.time)) == plain(hudi_read(path, as_of=i.time)), i
    for a, b in zip(completed, completed[1:], strict=False):
        ours = t.to_arrow(query="incremental", start=a.time, end=b.time)
        assert plain(ours) == plain(hudi_read(path, start=a.time, end=b.time)), (a, b)


@pytest.mark.skipif(not V6_COW, reason="the compatibility corpus is not next to the project")
def test_format_md_expectations(extracted: dict[str, str]) -> None:
    latest = [(1, "Alice", False), (2, "Bob", False), (3, "Carol", True), (4, "Diana", True)]
    first = [(1, "Alice", True), (2, "Bob", False), (3, "Carol", True)]
    for name in ("v6_nonpartitioned", "v6_complexkeygen_hivestyle", "v6_simplekeygen_nonhivestyle"):
        t = oxlake.Table(extracted[name])
        assert id_name_active(t.to_arrow()) == latest, name
        c1 = t.timeline()[0].time
        assert id_name_active(t.to_arrow(as_of=c1)) == first, name
        if name != "v6_nonpartitioned":  # the partitioned tables carry byteField 10/20/30
            filtered = t.to_arrow(filter="byteField >= 10 AND byteField < 20 AND shortField != 100")
            assert sorted(filtered["name"].to_pylist()) == ["Alice", "Carol"], name
    empty = oxlake.Table(extracted["v6_empty"])
    assert empty.to_arrow().num_rows == 0
    overwritten = oxlake.Table(extracted["v6_simplekeygen_nonhivestyle_overwritetable"])
    commits = [i.time for i in overwritten.timeline() if i.state == "completed"]

    def inc(start: str | None, end: str | None) -> list[tuple]:
        out = overwritten.to_arrow(query="incremental", start=start, end=end)
        return sorted(zip(out["name"].to_pylist(), out["isActive"].to_pylist(), strict=True))

    assert inc("19700101000000000", commits[0]) == [("Alice", True), ("Bob", False), ("Carol", True)]
    assert inc(commits[0], commits[1]) == [("Alice", False), ("Diana", True)]
    assert inc(commits[1], commits[2]) == [("Diana", False)]
    assert inc(commits[2], None) == []
    assert overwritten.to_arrow().num_rows == 1


@pytest.mark.skipif(not V6_COW, reason="the compatibility corpus is not next to the project")
def test_complex_keys_of_apache_hudi(extracted: dict[str, str]) -> None:
    keys = oxlake.Table(extracted["v6_complexkeygen_hivestyle"]).to_arrow()["_hoodie_record_key"].to_pylist()
    assert sorted(keys)[0].startswith("id:1,name:Alice")


def test_corpus_is_present() -> None:
    # The compat tests skip only when shared/ is missing; CI always has it.
    assert Path(COMPAT).exists(), f"expected the corpus at {COMPAT}"
