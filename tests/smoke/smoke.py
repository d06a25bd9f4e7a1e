"""The smoke suite of the installed wheel (`make wheel-test`, tests/smoke/run): run by a brand-new
venv's python from a directory outside the source tree, against the package pip installed.

    python smoke.py core   SOURCE_ROOT   # only the runtime dependencies (pyarrow) installed
    python smoke.py extras SOURCE_ROOT   # then with the pandas, spark and dask extras

It fails if `oxlake` (or anything else) is imported from the source tree, so it can only pass
against what the wheel installed. Plain Python, no pytest: the venv holds only what a user installs.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import oxlake
import pyarrow as pa


def main() -> None:
    stage, source = sys.argv[1], Path(sys.argv[2]).resolve()
    installed_from_wheel(source)
    with tempfile.TemporaryDirectory(prefix="oxlake-smoke-") as tmp:
        if stage == "core":
            core(Path(tmp))
        elif stage == "extras":
            extras(Path(tmp))
        else:
            raise SystemExit(f"unknown stage {stage!r}: core or extras")
    print(f"smoke {stage}: ok (oxlake {oxlake.__version__} from {Path(oxlake.__file__).parent})")


def installed_from_wheel(source: Path) -> None:
    """oxlake comes from this venv's site-packages, and nothing on sys.path is in the source tree."""
    package = Path(oxlake.__file__).resolve()
    assert Path(sys.prefix).resolve() in package.parents, f"oxlake imported from {package}, not {sys.prefix}"
    assert source not in package.parents, f"oxlake imported from the source tree: {package}"
    for entry in sys.path:
        path = Path(entry or ".").resolve()
        assert path != source and source not in path.parents, f"{entry} of sys.path is in the source tree"
    native = list(package.parent.glob("_native*.so"))
    assert len(native) == 1 and native[0].name == "_native.abi3.so", native


SCHEMA = pa.schema(
    [
        pa.field("id", pa.int64(), nullable=False),
        ("city", pa.string()),
        ("ts", pa.int64()),
        ("fare", pa.float64()),
    ]
)


def rows(n: int, start: int = 0, city: str = "sf") -> pa.Table:
    ids = list(range(start, start + n))
    return pa.table(
        {"id": ids, "city": [city] * n, "ts": [1] * n, "fare": [float(i) for i in ids]}, schema=SCHEMA
    )


def core(tmp: Path) -> None:
    # Copy-on-write: create, insert, upsert, delete, read back.
    cow = oxlake.create_table(
        str(tmp / "cow"), SCHEMA, record_key="id", partition_by=["city"], ordering_field="ts"
    )
    cow.insert(rows(100))
    cow.insert(rows(50, start=1000, city="nyc"))
    cow.upsert(
        rows(10)
        .set_column(2, "ts", pa.array([2] * 10, pa.int64()))
        .set_column(3, "fare", pa.array([-1.0] * 10))
    )
    cow.delete(rows(5, start=1000, city="nyc").select(["id", "city"]))
    got = cow.to_arrow(columns=["id", "fare"]).sort_by("id")
    assert got.num_rows == 145, got.num_rows
    assert got.column("fare").to_pylist()[:10] == [-1.0] * 10
    assert cow.to_arrow(filter="city = 'nyc'").num_rows == 45

    # Merge-on-read: upserts into log files, then a compaction; the rows are the same before and after.
    mor = oxlake.create_table(
        str(tmp / "mor"), SCHEMA, record_key="id", ordering_field="ts", table_type="merge_on_read"
    )
    mor.insert(rows(200))
    mor.build_metadata()  # the metadata table: kept in step by the writes and the compaction below
    mor.upsert(rows(20, start=190).set_column(2, "ts", pa.array([3] * 20, pa.int64())))
    before = mor.to_arrow(with_meta_columns=False).sort_by("id")
    assert before.num_rows == 210 and before.column("ts").to_pylist()[195] == 3
    assert any(i.action == "deltacommit" for i in mor.timeline())
    mor.compact()
    assert any(i.action == "commit" for i in mor.timeline()), mor.timeline()
    assert mor.to_arrow(with_meta_columns=False).sort_by("id").equals(before)
    assert mor.validate().ok

    # The console script this wheel installed.
    cli = Path(sys.executable).parent / "oxlake"
    version = subprocess.run([cli, "--version"], capture_output=True, text=True, check=True).stdout
    assert oxlake.__version__ in version, version
    show = subprocess.run(
        [cli, "history", str(tmp / "mor")], capture_output=True, text=True, check=True
    ).stdout
    assert "compaction" in show or "commit" in show, show

    # Optional dependencies are absent here: the error names the extra that brings each.
    for module in ("pandas", "pyspark", "dask"):
        assert not importable(module), f"{module} is installed in the runtime-only venv"
    expect_missing(lambda: cow.to_pandas(), "pandas")
    expect_missing(lambda: __import__("oxlake.spark"), "spark")
    expect_missing(lambda: __import__("oxlake.dask").dask.read(cow.uri), "dask")
    demo = demo_run(tmp)
    assert demo.returncode != 0 and "pip install 'oxlake[pandas]'" in demo.stderr, demo.stderr[-2000:]


def demo_run(tmp: Path) -> subprocess.CompletedProcess[str]:
    """The demo pipeline (`python -m oxlake.demo`), as `make demo` runs it, on fewer rows."""
    command = [sys.executable, "-m", "oxlake.demo", "--rows", "20000", "--path", str(tmp / "demo")]
    return subprocess.run(command, capture_output=True, text=True, timeout=600)


def importable(module: str) -> bool:
    try:
        __import__(module)
    except ImportError:
        return False
    return True


def expect_missing(call: object, extra: str) -> None:
    try:
        call()  # type: ignore[operator]
    except oxlake.MissingDependencyError as e:
        assert f"pip install 'oxlake[{extra}]'" in str(e), str(e)
        return
    raise AssertionError(f"no MissingDependencyError naming oxlake[{extra}]")


def extras(tmp: Path) -> None:
    import oxlake.dask
    import oxlake.spark
    from pyspark.sql import SparkSession

    uri = str(tmp / "trips")
    t = oxlake.create_table(uri, SCHEMA, record_key="id", partition_by=["city"], ordering_field="ts")
    t.insert(rows(300))
    t.insert(rows(100, start=1000, city="nyc"))
    assert len(t.to_pandas()) == 400

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    spark = (
        SparkSession.builder.master("local[2]")
        .appName("oxlake-smoke")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .getOrCreate()
    )
    try:
        df = oxlake.spark.read(spark, uri, with_meta_columns=False)  # mapInArrow on the executors
        assert df.count() == 400
        assert df.filter("city = 'nyc'").count() == 100
        out = str(tmp / "out")
        oxlake.spark.write(
            df.filter("fare < 50"),
            out,
            operation="upsert",
            record_key="id",
            partition_by=["city"],
            ordering_field="ts",
        )
        written = oxlake.Table(out).to_arrow(columns=["id"]).column("id").to_pylist()
        assert sorted(written) == list(range(50)), written
    finally:
        stop(spark)

    demo = demo_run(tmp)
    assert demo.returncode == 0 and "timeline" in demo.stdout, demo.stderr[-2000:]

    ddf = oxlake.dask.read(uri, columns=["id", "fare"])
    assert int(ddf["id"].count().compute()) == 400
    assert float(ddf["fare"].sum().compute()) == float(sum(range(300)) + sum(range(1000, 1100)))


def stop(spark: Any) -> None:
    """Stops Spark and waits for its JVM to exit (it exits when its stdin closes; left running,
    its shutdown hooks would read jars the runner is already deleting)."""
    jvm = getattr(spark.sparkContext._gateway, "proc", None)
    spark.stop()
    if jvm is not None:
        jvm.stdin.close()
        jvm.wait(timeout=120)


if __name__ == "__main__":
    main()
