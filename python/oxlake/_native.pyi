"""Type stubs of the native extension `oxlake._native` (bindings of the Rust core)."""

from typing import Any

__version__: str

class OxlakeError(Exception): ...
class TableNotFoundError(OxlakeError): ...
class TableExistsError(OxlakeError): ...
class SchemaMismatchError(OxlakeError): ...
class InvalidDataError(OxlakeError): ...
class InvalidArgumentError(OxlakeError): ...
class CommitConflictError(OxlakeError): ...

class CommitUnknownError(OxlakeError):
    instant: str

class CorruptTableError(OxlakeError): ...
class UnsupportedError(OxlakeError): ...
class StorageError(OxlakeError): ...

class Schema:
    def __arrow_c_schema__(self) -> object: ...

class RecordBatchStream:
    @property
    def schema(self) -> Schema: ...
    def __arrow_c_stream__(self, requested_schema: object | None = None) -> object: ...

class Table:
    def __init__(
        self, uri: str, storage_options: dict[str, str] | None = None, heartbeat_interval: float = 10.0
    ) -> None: ...
    @property
    def uri(self) -> str: ...
    @property
    def schema(self) -> Schema: ...
    @property
    def properties(self) -> dict[str, str]: ...
    def schema_as_of(self, as_of: str) -> Schema: ...
    def timeline(self, include_archived: bool = False) -> list[tuple[str, str, str, str | None]]: ...
    def file_groups(self) -> list[tuple[str, str, str, int]]: ...
    def rollback_failed(self, complete_decided: bool = False) -> list[str]: ...
    def build_metadata(
        self,
        files_shards: int = 4,
        column_stats_shards: int = 2,
        bloom_filters_shards: int = 2,
        record_index_shards: int = 8,
        size_record_index: bool = False,
    ) -> str: ...
    def lookup(self, keys: object, columns: list[str] | None = None) -> RecordBatchStream: ...
    def validate(self) -> tuple[bool, list[str], list[str]]: ...
    def write(
        self,
        operation: str,
        data: Any,
        target_file_size: int | None = None,
        conflict_retries: int = 0,
        schema_mode: str = "strict",
        extra_metadata: dict[str, str] | None = None,
        sort_mode: str | None = None,
        read_from: list[tuple[str, str, str]] | None = None,
        chunk_bytes: int | None = None,
    ) -> tuple[str | None, int, int, int, list[str], str | None]: ...
    def extra_metadata(self, instant: str) -> dict[str, str]: ...
    def commits(
        self, include_archived: bool
    ) -> list[
        tuple[
            str,
            str,
            str | None,
            str | None,
            tuple[int, int, int],
            tuple[int, int, int],
            dict[str, str],
            dict[str, tuple[int, int, int]],
        ]
    ]: ...
    def scan(
        self,
        columns: list[str] | None = None,
        filter: str | list[tuple[str, str, Any]] | None = None,
        as_of: str | None = None,
        query: str = "snapshot",
        start: str | None = None,
        end: str | None = None,
        batch_size: int | None = None,
        memory_limit: int | None = None,
    ) -> RecordBatchStream: ...
    def splits(
        self,
        columns: list[str] | None,
        filter: str | list[tuple[str, str, Any]] | None,
        as_of: str | None,
        query: str,
        start: str | None,
        end: str | None,
        target_bytes: int,
        min_splits: int = 1,
    ) -> list[tuple[bytes, int, int]]: ...
    def scan_split(
        self,
        split: bytes,
        columns: list[str] | None = None,
        filter: str | list[tuple[str, str, Any]] | None = None,
        batch_size: int | None = None,
        memory_limit: int | None = None,
    ) -> RecordBatchStream: ...
    def dataset_slices(
        self, as_of: str | None = None, query: str = "snapshot"
    ) -> tuple[Schema, list[tuple[bytes, str | None]]]: ...
    @property
    def storage_options(self) -> dict[str, str]: ...
    def __datafusion_table_provider__(self, session: object) -> object: ...
    def planned_files(
        self,
        as_of: str | None = None,
        query: str = "snapshot",
        start: str | None = None,
        end: str | None = None,
        filter: object = None,
    ) -> list[str]: ...

class Progress:
    def __init__(self) -> None: ...
    @property
    def done(self) -> int: ...
    @property
    def total(self) -> int: ...
    @property
    def unit(self) -> str: ...

def compact(
    table: Table, min_log_files: int = 1, progress: Progress | None = None
) -> tuple[list[str], int, int]: ...
def rollback(table: Table, instant: str) -> str: ...
def alter_schema(
    table: Table, changes: list[tuple[str, list[str], str | None, int | None]], types: Any
) -> str | None: ...
def savepoint(table: Table, instant: str) -> None: ...
def delete_savepoint(table: Table, instant: str) -> None: ...
def outcome(table: Table, instant: str) -> str: ...
def upgrade(table: Table, to: int) -> tuple[int, int, int, int]: ...
def archive(
    table: Table, min_commits: int | None = None, max_commits: int | None = None
) -> list[tuple[str, str]]: ...
def set_archival(table: Table, min_commits: int, max_commits: int, inline: bool = True) -> None: ...
def set_cleaning(
    table: Table, retain: int | None, policy: str = "keep_latest_commits", every: int = 1
) -> None: ...
def restore(table: Table, instant: str, progress: Progress | None = None) -> str: ...
def clean(
    table: Table, policy: str = "keep_latest_commits", retain: int = 10, progress: Progress | None = None
) -> tuple[str | None, list[str]]: ...
def cluster(
    table: Table,
    sort_by: list[str] = ...,
    small_file_limit: int | None = None,
    target_file_size: int | None = None,
    memory_limit: int | None = None,
    progress: Progress | None = None,
) -> tuple[str | None, int, int, int]: ...
def create_table(
    uri: str,
    schema: Any,
    record_key: list[str],
    partition_by: list[str],
    ordering_field: str | None,
    table_type: str,
    name: str,
    hive_style: bool,
    storage_options: dict[str, str] | None = None,
    heartbeat_interval: float = 10.0,
    inline_compaction: int | None = None,
    table_version: int = 8,
    key_generator_options: dict[str, str] | None = None,
    url_encode: bool = True,
    global_index: bool = False,
    meta_fields: bool = True,
    metadata: bool = True,
) -> Table: ...

class PendingWrite:
    @property
    def instant(self) -> str: ...
    @property
    def token(self) -> bytes: ...
    def commit(
        self, parts: list[bytes], extra_metadata: dict[str, str] | None = None, compact_inline: bool = True
    ) -> tuple[str | None, int, int, int, list[str], str | None]: ...
    def abort(self) -> None: ...

class PendingCompaction:
    @property
    def instant(self) -> str: ...
    @property
    def epoch(self) -> int: ...
    @property
    def is_new(self) -> bool: ...
    @property
    def operations(self) -> list[bytes]: ...
    def commit(self, parts: list[bytes]) -> tuple[str, int, int]: ...
    def abort(self) -> None: ...

def begin_compaction(table: Table, min_log_files: int = 1) -> PendingCompaction | None: ...
def compact_slices(
    table: Table,
    instant: str,
    epoch: int,
    operations: list[tuple[int, bytes]],
    task: tuple[int, int] | None = None,
) -> bytes: ...
def compaction_due(table: Table) -> int | None: ...
def begin_write(
    table: Table, operation_name: str, read_from: list[tuple[str, str, str]] | None = None
) -> PendingWrite: ...
def route(table: Table, operation_name: str, data: object) -> RecordBatchStream: ...
def resume_write(table: Table, operation_name: str, token: bytes) -> PendingWrite: ...
def write_files(
    table: Table,
    operation_name: str,
    instant: str,
    data: object,
    target_file_size: int | None = None,
    task: tuple[int, int] | None = None,
    schema_mode: str | None = None,
    sort_mode: str | None = None,
    own_partitions: bool = False,
) -> bytes: ...
def write_files_stream(
    table: Table,
    operation_name: str,
    instant: str,
    data: object,
    chunk_bytes: int | None = None,
    target_file_size: int | None = None,
    task: tuple[int, int] | None = None,
    schema_mode: str | None = None,
    sort_mode: str | None = None,
    own_partitions: bool = False,
) -> list[bytes]: ...
def inject_faults(spec: str) -> None: ...
def fault_counts() -> dict[str, int]: ...
