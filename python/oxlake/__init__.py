"""oxlake: native IO for Apache Hudi tables.

>>> import oxlake, pyarrow as pa
>>> t = oxlake.create_table("/tmp/trips", schema, record_key="id", partition_by=["city"],
...                         ordering_field="ts")                        # doctest: +SKIP
>>> t.upsert(pa.table({...}))                                           # doctest: +SKIP
>>> t.to_pandas(filter="city = 'sf'")                                   # doctest: +SKIP
"""

from oxlake._native import (
    CommitConflictError,
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
    ClusteringResult,
    CompactionResult,
    FileGroup,
    Instant,
    Scan,
    Split,
    Table,
    ValidationReport,
    WriteResult,
    create_table,
)

__all__ = [
    "ClusteringResult",
    "CommitConflictError",
    "CompactionResult",
    "CorruptTableError",
    "FileGroup",
    "Instant",
    "InvalidArgumentError",
    "InvalidDataError",
    "OxlakeError",
    "Progress",
    "Scan",
    "Split",
    "SchemaMismatchError",
    "StorageError",
    "Table",
    "TableExistsError",
    "TableNotFoundError",
    "UnsupportedError",
    "ValidationReport",
    "WriteResult",
    "__version__",
    "create_table",
]
