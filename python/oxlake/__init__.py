"""oxlake: native IO for Apache Hudi tables.

>>> import oxlake, pyarrow as pa
>>> t = oxlake.create_table("/tmp/trips", schema, record_key="id", partition_by=["city"],
...                         ordering_field="ts")                        # doctest: +SKIP
>>> t.upsert(pa.table({...}))                                           # doctest: +SKIP
>>> t.to_pandas(filter="city = 'sf'")                                   # doctest: +SKIP
"""

from oxlake._engine import MissingDependencyError
from oxlake._native import (
    CommitConflictError,
    CommitUnknownError,
    CorruptTableError,
    InvalidArgumentError,
    InvalidDataError,
    OxlakeError,
    Progress,
    SchemaMismatchError,
    StorageError,
    TableExistsError,
    TableNotFoundError,
    UnsupportedError,
    __version__,
)
from oxlake.table import (
    ArrowData,
    ArrowStreamExportable,
    ClusteringResult,
    Commit,
    CompactionResult,
    FileGroup,
    Instant,
    QueryType,
    Scan,
    SchemaMode,
    SortMode,
    Split,
    Table,
    TableType,
    ValidationReport,
    WriteMode,
    WriteResult,
    create_table,
    write_table,
)

__all__ = [
    "ArrowData",
    "ArrowStreamExportable",
    "ClusteringResult",
    "Commit",
    "CommitConflictError",
    "CommitUnknownError",
    "CompactionResult",
    "CorruptTableError",
    "FileGroup",
    "Instant",
    "InvalidArgumentError",
    "InvalidDataError",
    "MissingDependencyError",
    "OxlakeError",
    "Progress",
    "QueryType",
    "Scan",
    "Split",
    "SchemaMismatchError",
    "SchemaMode",
    "SortMode",
    "StorageError",
    "Table",
    "TableExistsError",
    "TableNotFoundError",
    "TableType",
    "UnsupportedError",
    "ValidationReport",
    "WriteMode",
    "WriteResult",
    "__version__",
    "create_table",
    "write_table",
]
