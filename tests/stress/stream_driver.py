"""One run of the streaming pipeline that `test_stress_streaming.py` kills: a Spark driver
(`local[2]`) whose first query upserts the new files of a JSON file source into an oxlake table,
one file per micro-batch (`maxFilesPerTrigger=1`, `availableNow`), through the sink named by the
spec (`data_source`: `writeStream.format("oxlake")`; `foreach_batch`: `oxlake.spark.write_batch`),
and whose second query copies that table's commits into a second table through the oxlake stream
source. Both restart from their checkpoints; the run prints `done` once both have caught up.
The tables may live on an S3 server (the spec's `storage_options`).

Usage: stream_driver.py '<spec as JSON>'"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

import oxlake.spark
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import types as T

EVENT = T.StructType(
    [
        T.StructField("id", T.LongType(), False),
        T.StructField("city", T.StringType(), True),
        T.StructField("ts", T.LongType(), True),
        T.StructField("v", T.StringType(), True),
    ]
)
KEYS: dict[str, Any] = {"record_key": "id", "partition_by": ["city"], "ordering_field": "ts"}


def main(spec: dict[str, Any]) -> None:
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    spark = (
        SparkSession.builder.master("local[2]")
        .appName("oxlake-stream-kills")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.driver.memory", "1g")
        .getOrCreate()
    )
    oxlake.spark.register(spark)
    storage: dict[str, str] = spec.get("storage_options") or {}
    storage_options = {f"storage.{k}": v for k, v in storage.items()}
    events = spark.readStream.schema(EVENT).option("maxFilesPerTrigger", 1).json(spec["source"])
    if spec["sink"] == "data_source":
        writer = events.writeStream.format("oxlake").option("operation", "upsert").options(**storage_options)
        writer = (
            writer.option("record_key", "id").option("partition_by", "city").option("ordering_field", "ts")
        )
        query = (
            writer.option("checkpointLocation", spec["checkpoint"])
            .trigger(availableNow=True)
            .start(spec["table"])
        )
    else:

        def sink(df: DataFrame, batch_id: int) -> None:
            oxlake.spark.write_batch(df, batch_id, spec["table"], storage_options=storage or None, **KEYS)

        query = (
            events.writeStream.foreachBatch(sink)
            .option("checkpointLocation", spec["checkpoint"])
            .trigger(availableNow=True)
            .start()
        )
    query.awaitTermination()
    if query.exception() is not None:
        raise SystemExit(f"sink query failed: {query.exception()}")

    def copy(df: DataFrame, batch_id: int) -> None:
        oxlake.spark.write_batch(
            df.drop("_change_type"), batch_id, spec["copy"], storage_options=storage or None, **KEYS
        )

    downstream = (
        spark.readStream.format("oxlake")
        .option("with_meta_columns", "false")
        .options(**storage_options)
        .load(spec["table"])
        .writeStream.foreachBatch(copy)
        .option("checkpointLocation", spec["copy_checkpoint"])
        .trigger(availableNow=True)
        .start()
    )
    downstream.awaitTermination()
    if downstream.exception() is not None:
        raise SystemExit(f"source query failed: {downstream.exception()}")
    print("done", flush=True)
    spark.stop()


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
