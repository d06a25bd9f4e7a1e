"""`Table.to_pyarrow_dataset`: a snapshot of a table as a `pyarrow.dataset.Dataset`, the reusable
source DuckDB, Polars (`pl.scan_pyarrow_dataset`) and pyarrow push projections and filters into.

A file slice whose base file holds its rows as they are (no log file to merge over it, the
columns under the table's names and types) is a Parquet fragment that pyarrow reads itself: its
footer is read once here and kept, so a query's filter skips row groups (and whole files) by their
statistics without opening them again, and only the projected columns are read. Every other slice
(merge-on-read logs to merge, a file written before a column was renamed, a type pyarrow would read
differently, a store pyarrow cannot open) is merged by oxlake's reader here and held in memory.
The dataset is the table as of its creation: later commits are not in it."""

from __future__ import annotations

import os
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.dataset as pa_ds
import pyarrow.fs as pa_fs

from oxlake._engine import META_PREFIX, native

if TYPE_CHECKING:
    from oxlake.table import Table

#: Footers read at once (pyarrow releases the GIL; on S3 each is a round trip).
_FOOTER_THREADS = 16


def to_dataset(table: Table, as_of: str | None, query: str, with_meta_columns: bool) -> pa_ds.Dataset:
    t = native(table)
    # The schema comes with the plan, from the same view of the table.
    planned, parts = t.dataset_slices(as_of, query)
    schema = pa.schema(planned)
    if not with_meta_columns:
        schema = pa.schema(
            [f for f in schema if not f.name.startswith(META_PREFIX)], metadata=schema.metadata
        )
    fs, root = filesystem(t.uri, t.storage_options)
    fmt = pa_ds.ParquetFileFormat()
    partition_columns = _partition_columns(table.properties)

    def fragment(part: tuple[bytes, str | None]) -> pa_ds.Fragment | None:
        _, base = part
        if base is None or fs is None:
            return None
        frag = fmt.make_fragment(f"{root}/{base}", filesystem=fs)
        # Reads the footer (row group statistics included) and keeps it with the fragment.
        physical = frag.physical_schema
        return frag if _reads_as(physical, schema, partition_columns) else None

    with ThreadPoolExecutor(_FOOTER_THREADS) as pool:
        fragments = list(pool.map(fragment, parts))
    direct = [f for f in fragments if f is not None]
    merged = [split for (split, _), f in zip(parts, fragments, strict=True) if f is None]
    files = pa_ds.FileSystemDataset(direct, schema, fmt, fs or pa_fs.LocalFileSystem())
    if not merged:
        return files
    columns = schema.names
    rows = [
        pa.RecordBatchReader.from_stream(t.scan_split(split, columns, None, None, None)).read_all()
        for split in merged
    ]
    in_memory = pa_ds.InMemoryDataset(pa.concat_tables(rows), schema=schema)
    return in_memory if not direct else pa_ds.dataset([files, in_memory])


def _reads_as(physical: pa.Schema, schema: pa.Schema, partition_columns: set[str]) -> bool:
    """Whether pyarrow reads a file of `physical` columns as oxlake does under `schema`: every
    column the file has under the table's type, and any it lacks one that a reader fills with
    nulls (a column added after the file was written: not a meta or partition column, whose
    values come from elsewhere when a file leaves them out)."""
    for field in schema:
        index = physical.get_field_index(field.name)
        if index < 0:
            if field.name.startswith(META_PREFIX) or field.name in partition_columns:
                return False
        elif not physical.field(index).type.equals(field.type):
            return False
    return True


def _partition_columns(properties: Mapping[str, str]) -> set[str]:
    fields = properties.get("hoodie.table.partition.fields", "")
    return {f.split(":", 1)[0].strip() for f in fields.split(",") if f.strip()}


def filesystem(uri: str, options: Mapping[str, str]) -> tuple[pa_fs.FileSystem | None, str]:
    """The pyarrow file system of a table's store and the table's root in it; `None` for a store
    pyarrow has no file system for (its slices are read by oxlake)."""
    scheme, sep, rest = uri.partition("://")
    if not sep:
        return pa_fs.LocalFileSystem(), uri.rstrip("/")
    if scheme in ("s3", "s3a"):
        return _s3(options), rest.rstrip("/")
    return None, uri


def _s3(options: Mapping[str, str]) -> pa_fs.S3FileSystem:
    """A pyarrow S3 file system configured as oxlake's store is (`storage_options`, then the
    `AWS_*` environment variables pyarrow does not read itself)."""
    given = {k.lower().removeprefix("aws_"): v for k, v in options.items()}
    endpoint = given.get("endpoint") or given.get("endpoint_url") or os.environ.get("AWS_ENDPOINT")
    kwargs: dict[str, object] = {}
    if endpoint:
        scheme, sep, host = endpoint.partition("://")
        kwargs["endpoint_override"] = host if sep else endpoint
        if sep:
            kwargs["scheme"] = scheme
        elif given.get("allow_http", "").lower() == "true":
            kwargs["scheme"] = "http"
    if "region" in given:
        kwargs["region"] = given["region"]
    if "access_key_id" in given:
        kwargs["access_key"] = given["access_key_id"]
        kwargs["secret_key"] = given.get("secret_access_key", "")
    if "session_token" in given:
        kwargs["session_token"] = given["session_token"]
    if given.get("virtual_hosted_style_request", "").lower() == "true":
        kwargs["force_virtual_addressing"] = True
    return pa_fs.S3FileSystem(**kwargs)
