"""The Python surface: console script, fork safety, the GIL released during Rust work."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import oxlake
import pytest
from conftest import SCHEMA, rows, trips


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


def test_ctrl_c_interrupts_a_long_write(table_path: str) -> None:
    """SIGINT during a long write raises KeyboardInterrupt promptly; the table keeps its committed data."""
    import signal
    import textwrap

    oxlake.create_table(table_path, SCHEMA, record_key="id", partition_by=["city"], ordering_field="ts")
    oxlake.Table(table_path).insert(trips([1, 2, 3]))
    script = textwrap.dedent(
        f"""
        import sys, time
        sys.path.insert(0, {str(Path(__file__).parent)!r})
        import oxlake
        from conftest import trips
        data = trips(list(range(3_000_000)))
        t = oxlake.Table({table_path!r})
        print("writing", flush=True)
        try:
            for _ in range(20):
                t.upsert(data)
        except KeyboardInterrupt:
            print("interrupted", flush=True)
            sys.exit(3)
        """
    )
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "writing"
    time.sleep(1.0)
    sent = time.perf_counter()
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 3 and "interrupted" in out
    assert time.perf_counter() - sent < 10
    # Whatever was committed before the interrupt is readable; the interrupted instant is not visible.
    t = oxlake.Table(table_path)
    completed = [i for i in t.timeline() if i.state == "completed"]
    assert all(i.action == "commit" for i in completed)
    assert len([i for i in t.timeline() if i.state != "completed"]) <= 1
    # Before any upsert completed the table holds the 3 inserted rows; after one, all 3,000,000 ids.
    assert t.to_arrow(columns=["id"]).num_rows == (3 if len(completed) == 1 else 3_000_000)
