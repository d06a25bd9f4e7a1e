"""Incremental processing for PySpark pipelines (docs/PIPELINE.md).

A `Catalog` is one oxlake table whose layers are partitions; compilers (`DirectCompiler`,
`MapGroupCompiler`, `FunctionCompiler` / `@compiler`) declare input and output layers; a `Driver`
runs them on Spark, recompiling only what changed inputs affect, and publishes every changed
output partition, the state layer and the input versions in one commit.

>>> from oxlake.pipeline import Catalog, Driver                       # doctest: +SKIP
>>> report = Driver(spark, Catalog.open_or_create(out), {"roads": Catalog(src)}, [Tiles()]).run()
>>> report.mode, report.layers["tiles"].written                       # doctest: +SKIP
"""

from oxlake.pipeline.catalog import ADDED, CHANGED, REMOVED, STATE_LAYER, Catalog, Version
from oxlake.pipeline.compilers import (
    Compiler,
    DirectCompiler,
    FunctionCompiler,
    InputPartition,
    MapGroupCompiler,
    PipelineDefinitionError,
    compiler,
)
from oxlake.pipeline.driver import Driver, LayerReport, RunReport, TaskReport

__all__ = [
    "ADDED",
    "CHANGED",
    "REMOVED",
    "STATE_LAYER",
    "Catalog",
    "Compiler",
    "DirectCompiler",
    "Driver",
    "FunctionCompiler",
    "InputPartition",
    "LayerReport",
    "MapGroupCompiler",
    "PipelineDefinitionError",
    "RunReport",
    "TaskReport",
    "Version",
    "compiler",
]
