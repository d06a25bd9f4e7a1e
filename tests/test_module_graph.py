"""`rust/tools/module_graph.py`, the lint that keeps the core's modules layered (issue 25): it
passes on the crate, and fails on a use of a higher layer, whether by path or by a method a
higher module adds to `Table`."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TOOL = ROOT / "rust" / "tools" / "module_graph.py"
SRC = ROOT / "rust" / "oxlake" / "src"


def check(src: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(TOOL), str(src)], capture_output=True, text=True, check=False)


def add_code(file: Path, code: str) -> None:
    """`code` added before the file's test module (which the tool skips), else at its end."""
    text = file.read_text()
    at = text.find("#[cfg(test)]")
    file.write_text(text + code if at < 0 else text[:at] + code + text[at:])


def test_the_crate_is_layered() -> None:
    result = check(SRC)
    assert result.returncode == 0, result.stderr


def test_a_path_to_a_higher_layer_fails(tmp_path: Path) -> None:
    src = tmp_path / "src"
    shutil.copytree(SRC, src)
    view = src / "table" / "fs_view.rs"
    add_code(view, "\nfn sneaky() { let _ = crate::services::hooks::extensions(); }\n")
    result = check(src)
    assert result.returncode == 1
    assert "table uses services, a layer above it: table/fs_view.rs" in result.stderr


def test_a_call_of_a_method_a_higher_layer_adds_to_table_fails(tmp_path: Path) -> None:
    src = tmp_path / "src"
    shutil.copytree(SRC, src)
    # `set_archival` is added to `Table` by services/archive.rs.
    add_code(src / "log" / "mod.rs", "\nfn sneaky(t: &mut Table) { let _ = t.set_archival(c, true); }\n")
    result = check(src)
    assert result.returncode == 1
    assert "log uses services" in result.stderr and "(.set_archival)" in result.stderr
