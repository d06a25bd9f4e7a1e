"""A real Apache Hudi (Java) Spark session for the tests, and the calls a Hudi user makes with it.

One JVM holds one Hudi bundle, so one pytest process tests one Hudi version: the version is
`$OXLAKE_HUDI_VERSION` (`make java-test` runs the suite once for each version of
`bundles.lock`). The session is what Hudi's quick start sets up on Spark 3.5 (`local[2]`, Kryo
with Hudi's registrar, `HoodieSparkSessionExtension`, `HoodieCatalog`, the bundle as
`spark.jars`), sized for a two-core machine; every table option is Hudi's default unless a
test passes its own (the metadata table on, the default index, single-writer concurrency).
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import pytest
from bundles import Bundle, FetchError, bundle_for, fetched_jar

VERSION_VAR = "OXLAKE_HUDI_VERSION"
#: Why the Java tests are skipped in a run that names no Hudi version (the default `make test`).
NO_VERSION = (
    f"the Java Hudi suite runs one Hudi version a process: `make java-test`, or {VERSION_VAR}=<version> "
    "with the Spark 3.5 venv (docs/JAVA_HUDI.md)"
)

TableType = Literal["COPY_ON_WRITE", "MERGE_ON_READ"]
Operation = Literal["insert", "upsert", "delete", "bulk_insert", "insert_overwrite", "insert_overwrite_table"]


@dataclass(frozen=True)
class JavaHudi:
    """The Hudi version under test: its pinned bundle and its Spark session."""

    bundle: Bundle
    spark: Any  # pyspark.sql.SparkSession (pyspark is imported only once a version is named)

    @property
    def version(self) -> str:
        return self.bundle.version

    @property
    def table_version(self) -> int:
        return self.bundle.table_version

    @property
    def is_1x(self) -> bool:
        return not self.version.startswith("0.")


def requested_version() -> str | None:
    return os.environ.get(VERSION_VAR) or None


def session_conf(jar: Path, tmp: Path) -> dict[str, str]:
    """Spark settings of a Java Hudi session: Hudi's required ones, then a small local footprint."""
    return {
        "spark.master": "local[2]",
        "spark.app.name": "oxlake-java-hudi",
        "spark.jars": str(jar),
        "spark.serializer": "org.apache.spark.serializer.KryoSerializer",
        "spark.kryo.registrator": "org.apache.spark.HoodieSparkKryoRegistrar",
        "spark.sql.extensions": "org.apache.spark.sql.hudi.HoodieSparkSessionExtension",
        "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.hudi.catalog.HoodieCatalog",
        "spark.sql.catalogImplementation": "in-memory",
        "spark.sql.warehouse.dir": str(tmp / "warehouse"),
        "spark.driver.memory": "2g",
        # Lets Hudi's object size estimator (JOL) attach to its own JVM instead of warning.
        "spark.driver.extraJavaOptions": "-Djdk.attach.allowAttachSelf=true",
        "spark.sql.shuffle.partitions": "2",
        "spark.default.parallelism": "2",
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.session.timeZone": "UTC",
    }


def start_session(version: str, tmp: Path) -> JavaHudi:
    """A Spark session with the pinned bundle of `version` (fetched by `make java-deps`)."""
    from pyspark.sql import SparkSession

    bundle = bundle_for(version)
    jar = fetched_jar(version)
    builder = SparkSession.builder
    for k, v in session_conf(jar, tmp).items():
        builder = builder.config(k, v)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return JavaHudi(bundle, spark)


@pytest.fixture(scope="session", name="hudi")
def hudi_fixture(tmp_path_factory: pytest.TempPathFactory) -> Iterator[JavaHudi]:
    """`hudi`: the Java Hudi of this process (`$OXLAKE_HUDI_VERSION`); skips every test without one.
    A test module imports `hudi_fixture` to use it (tests/java has no conftest.py: beside
    tests/conftest.py it would shadow the `conftest` module the other tests import)."""
    version = requested_version()
    if version is None:
        pytest.skip(NO_VERSION)
    try:
        java = start_session(version, tmp_path_factory.mktemp("spark"))
    except FetchError as e:
        pytest.fail(str(e), pytrace=False)
    yield java
    java.spark.stop()


# -- what a Hudi user writes ------------------------------------------------------------------------


def write_options(
    name: str,
    table_type: TableType,
    operation: Operation,
    record_key: str,
    precombine: str | None,
    partition: str | None,
    extra: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """`format("hudi")` options of a write: the table's name, type, keys and the operation.

    The ordering field goes in `hoodie.datasource.write.precombine.field`, which every version of
    the suite takes (1.1 and later also read it as `hoodie.table.ordering.fields`). A table without
    partitions names no partition field: Hudi infers its `NonpartitionedKeyGenerator`."""
    opts = {
        "hoodie.table.name": name,
        "hoodie.datasource.write.table.type": table_type,
        "hoodie.datasource.write.operation": operation,
        "hoodie.datasource.write.recordkey.field": record_key,
        "hoodie.datasource.write.partitionpath.field": partition or "",
    }
    if precombine is not None:
        opts["hoodie.datasource.write.precombine.field"] = precombine
    if partition is None:
        opts["hoodie.datasource.write.keygenerator.class"] = (
            "org.apache.hudi.keygen.NonpartitionedKeyGenerator"
        )
    opts.update(extra or {})
    return opts


def java_write(
    df: Any,
    path: str,
    *,
    table_type: TableType,
    operation: Operation,
    record_key: str = "id",
    precombine: str | None = "ts",
    partition: str | None = None,
    name: str | None = None,
    mode: Literal["append", "overwrite"] = "append",
    options: Mapping[str, str] | None = None,
) -> None:
    """Writes `df` (a Spark DataFrame) to the Hudi table at `path` as a Hudi user does."""
    opts = write_options(
        name or Path(path).name, table_type, operation, record_key, precombine, partition, options
    )
    df.write.format("hudi").options(**opts).mode(mode).save(path)


def java_read(spark: Any, path: str, **options: str) -> Any:
    """`spark.read.format("hudi")` of the table at `path`, with `hoodie.*` read options
    (`**{"hoodie.datasource.query.type": "read_optimized"}`, `**{"as.of.instant": t}`)."""
    return spark.read.format("hudi").options(**options).load(path)


def java_rows(df: Any, key: str = "id") -> list[dict[str, Any]]:
    """A Spark DataFrame's rows as dicts without Hudi's meta columns, sorted by `key`."""
    cols = [c for c in df.columns if not c.startswith("_hoodie_")]
    out = [r.asDict() for r in df.select(*cols).collect()]
    return sorted(out, key=lambda r: r[key])


def call(spark: Any, procedure: str, **args: Any) -> list[dict[str, Any]]:
    """`CALL procedure(name => value, ...)`: Hudi's table services and inspections in Spark SQL
    (`call(spark, "run_compaction", op="run", path=p)`)."""

    def literal(v: Any) -> str:
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, int | float):
            return str(v)
        return "'" + str(v).replace("'", "\\'") + "'"

    named = ", ".join(f"{k} => {literal(v)}" for k, v in args.items())
    return [r.asDict() for r in spark.sql(f"CALL {procedure}({named})").collect()]


_registered: dict[tuple[int, str], str] = {}


def register(spark: Any, path: str) -> str:
    """The catalog name of the table at `path` (`CREATE TABLE ... USING hudi LOCATION`), for the
    procedures that take a `table` rather than a `path` (`show_commits`)."""
    key = (id(spark), path)
    if key not in _registered:
        name = f"oxlake_java_{len(_registered)}"
        spark.sql(f"CREATE TABLE {name} USING hudi LOCATION '{path}'")
        _registered[key] = name
    return _registered[key]
