"""The Python surface: console script, fork safety, the GIL released during Rust work."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

import oxlake
import pytest
from conftest import rows, trips


def test_cli_show_and_timeline(table: oxlake.Table) -> None:
    res = table.insert(trips(list(range(6))))
    show = subprocess.run(
        [sys.executable, "-m", "oxlake.cli", "show", table.uri], capture_output=True, text=True
    )
    assert show.returncode == 0, show.stderr
    assert "hoodie.table.recordkey.fields = id" in show.stdout
    assert "fare: double" in show.stdout
    group_lines = [line for line in show.stdout.splitlines() if line.startswith("  city=")]
    assert sorted(line.split()[0] for line in group_lines) == ["city=chennai", "city=nyc", "city=sf"]
    tl = subprocess.run(
        [sys.executable, "-m", "oxlake.cli", "timeline", table.uri], capture_output=True, text=True
    )
    assert tl.stdout.split() == [res.instant, "commit", "completed"]
    bad = subprocess.run(
        [sys.executable, "-m", "oxlake.cli", "show", table.uri + "-missing"], capture_output=True, text=True
    )
    assert bad.returncode == 1 and "TableNotFoundError" in bad.stderr


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_usable_after_fork(table: oxlake.Table) -> None:
    table.insert(trips([1, 2, 3]))
    assert len(rows(table.scan())) == 3  # the parent's runtime exists before the fork
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: a new runtime is built for it
        try:
            n = len(rows(oxlake.Table(table.uri).scan()))
            os.write(w, str(n).encode())
        finally:
            os._exit(0)
    os.close(w)
    os.waitpid(pid, 0)
    assert os.read(r, 16) == b"3"


def test_gil_is_released_while_rust_works(table: oxlake.Table) -> None:
    data = trips(list(range(200_000)))
    ticks = 0
    done = threading.Event()

    def count() -> None:
        nonlocal ticks
        while not done.is_set():
            ticks += 1
            time.sleep(0.001)

    t = threading.Thread(target=count)
    t.start()
    start = time.perf_counter()
    table.insert(data)
    elapsed = time.perf_counter() - start
    done.set()
    t.join()
    # The counting thread ran during the write: at least a few ticks per 10 ms of writing.
    assert ticks > elapsed * 100 / 4
