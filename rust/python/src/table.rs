//! `oxlake._native.Table`: one open table, its operations grouped by topic.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use datafusion::common::ScalarValue;
use oxlake::read::{Filter, Op, Predicate, QueryType, ScanOptions};
use oxlake::{CreateOptions, Table, TableOptions, TableType, WriteConfig, WriteOperation};
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyDict, PyFloat, PyInt, PyList, PySet, PyString, PyTuple};
use tokio::sync::Mutex;

use crate::arrow_ffi::{PyRecordBatchStream, PySchema, import_batches, import_schema};
use crate::errors::InvalidArgumentError;
use crate::runtime::run;

/// What a write did: (instant, inserts, updates, deletes, files); `oxlake.WriteResult` in Python.
/// A write's result: instant, inserts, updates, deletes, files, completion time.
pub(crate) type WriteSummary = (Option<String>, u64, u64, u64, Vec<String>, Option<String>);

/// A slice of a dataset: its split as JSON, and its base file when an engine may read it alone.
type DatasetSlice = (Vec<u8>, Option<String>);

#[pyclass(name = "Table", module = "oxlake._native")]
pub struct PyTable {
    pub(crate) inner: Arc<Mutex<Table>>,
}

fn table_options(storage_options: Option<HashMap<String, String>>, heartbeat_interval: f64) -> PyResult<TableOptions> {
    if !(heartbeat_interval.is_finite() && heartbeat_interval > 0.0) {
        return Err(InvalidArgumentError::new_err("heartbeat_interval must be a positive number of seconds"));
    }
    Ok(TableOptions {
        storage_options: storage_options.unwrap_or_default(),
        heartbeat_interval: Duration::from_secs_f64(heartbeat_interval),
        // The metadata table kept in step, index pruning, inline table services.
        extensions: oxlake::services::hooks::extensions(),
    })
}

/// Creates a table and returns it open.
#[pyfunction]
#[pyo3(signature = (uri, schema, record_key, partition_by, ordering_field, table_type, name, hive_style, storage_options=None, heartbeat_interval=10.0, inline_compaction=None, table_version=8, key_generator_options=None, url_encode=true, global_index=false, meta_fields=true, metadata=true))]
#[allow(clippy::too_many_arguments)]
pub fn create_table(
    py: Python<'_>,
    uri: String,
    schema: Bound<'_, PyAny>,
    record_key: Vec<String>,
    partition_by: Vec<String>,
    ordering_field: Option<String>,
    table_type: String,
    name: String,
    hive_style: bool,
    storage_options: Option<HashMap<String, String>>,
    heartbeat_interval: f64,
    inline_compaction: Option<u32>,
    table_version: u32,
    key_generator_options: Option<std::collections::BTreeMap<String, String>>,
    url_encode: bool,
    global_index: bool,
    meta_fields: bool,
    metadata: bool,
) -> PyResult<PyTable> {
    let schema = import_schema(&schema)?;
    let table_type = TableType::parse(&table_type).ok_or_else(|| {
        InvalidArgumentError::new_err(format!("table_type `{table_type}`: expected copy_on_write or merge_on_read"))
    })?;
    let create = CreateOptions {
        name,
        table_type,
        record_key_fields: record_key,
        partition_fields: partition_by,
        ordering_field,
        hive_style,
        inline_compaction,
        table_version,
        global_index,
        meta_fields,
        keygen_options: key_generator_options.unwrap_or_default(),
        url_encode,
    };
    let options = table_options(storage_options, heartbeat_interval)?;
    let table = run(py, async move {
        let mut table = Table::create(&uri, options, create, schema).await?;
        if metadata {
            // The `files` index alone, in one shard (Apache Hudi's default).
            table.create_metadata(oxlake::metadata::MetadataConfig::new(1, 0, 0, 0)?).await?;
        }
        Ok::<_, oxlake::Error>(table)
    })?;
    Ok(PyTable { inner: Arc::new(Mutex::new(table)) })
}

/// An instant as Python's `Instant`: time, action, state, completion time (layout 2).
type InstantTuple = (String, String, String, Option<String>);
/// One commit of `Table.commits`: time, action, completion, operation, (inserts, updates,
/// deletes), (files written, bytes written, file groups replaced), extra metadata, (inserts,
/// updates, deletes) per partition path.
type CommitTuple = (
    String,
    String,
    Option<String>,
    Option<String>,
    (i64, i64, i64),
    (usize, i64, usize),
    std::collections::BTreeMap<String, String>,
    std::collections::BTreeMap<String, (i64, i64, i64)>,
);

#[pymethods]
impl PyTable {
    /// Opens an existing table.
    #[new]
    #[pyo3(signature = (uri, storage_options=None, heartbeat_interval=10.0))]
    fn new(
        py: Python<'_>,
        uri: String,
        storage_options: Option<HashMap<String, String>>,
        heartbeat_interval: f64,
    ) -> PyResult<Self> {
        let options = table_options(storage_options, heartbeat_interval)?;
        let table = run(py, async move { Table::open(&uri, options).await })?;
        Ok(PyTable { inner: Arc::new(Mutex::new(table)) })
    }

    // ---- metadata -------------------------------------------------------------------------

    #[getter]
    fn uri(&self, py: Python<'_>) -> PyResult<String> {
        self.with(py, |t| Ok(t.uri().to_string()))
    }

    /// The schema of reads: meta fields, then the data columns.
    #[getter]
    fn schema(&self, py: Python<'_>) -> PyResult<PySchema> {
        let inner = self.inner.clone();
        run(py, async move {
            let mut t = inner.lock().await;
            t.reload().await?;
            Ok(PySchema(t.schema()))
        })
    }

    /// The schema of reads as of the commit at `as_of` (time travel returns its columns).
    fn schema_as_of(&self, py: Python<'_>, as_of: String) -> PyResult<PySchema> {
        let inner = self.inner.clone();
        run(py, async move {
            let mut t = inner.lock().await;
            t.reload().await?;
            let schema = match t.with_schema_as_of(&as_of).await? {
                Some(older) => older.schema(),
                None => t.schema(),
            };
            Ok(PySchema(schema))
        })
    }

    /// `hoodie.properties` as a dict.
    #[getter]
    fn properties(&self, py: Python<'_>) -> PyResult<HashMap<String, String>> {
        self.with(py, |t| Ok(t.config().raw.clone().into_iter().collect()))
    }

    /// The instants: (time, action, state), oldest first.
    #[pyo3(signature = (include_archived=false))]
    fn timeline(&self, py: Python<'_>, include_archived: bool) -> PyResult<Vec<InstantTuple>> {
        let inner = self.inner.clone();
        run(py, async move {
            let mut t = inner.lock().await;
            t.reload().await?;
            let merged;
            let t = if include_archived {
                merged = t.with_archived_timeline().await?;
                &merged
            } else {
                &*t
            };
            Ok(t.timeline()
                .instants()
                .iter()
                .map(|i| (i.time.clone(), i.action.to_string(), i.state.to_string(), i.completion.clone()))
                .collect())
        })
    }

    /// File groups at the latest instant: (partition, file id, base file path, size in bytes).
    fn file_groups(&self, py: Python<'_>) -> PyResult<Vec<(String, String, String, u64)>> {
        let inner = self.inner.clone();
        run(py, async move {
            let mut t = inner.lock().await;
            t.reload().await?;
            let Some(latest) = t.timeline().latest_completed_data().map(|i| i.time.clone()) else { return Ok(vec![]) };
            let view = t.file_system_view().await?;
            let replaced = t.replaced_file_groups(&latest).await?;
            Ok(view
                .slices_as_of(&latest, &replaced)
                .filter_map(|(g, s)| {
                    s.base.as_ref().map(|b| (g.partition.clone(), g.file_id.clone(), b.path.clone(), b.size))
                })
                .collect())
        })
    }

    /// Rolls back writes whose writer is gone; returns the instants rolled back. With
    /// `complete_decided`, also completes the writes whose writers decided to commit, alive or not.
    #[pyo3(signature = (complete_decided=false))]
    fn rollback_failed(&self, py: Python<'_>, complete_decided: bool) -> PyResult<Vec<String>> {
        let inner = self.inner.clone();
        run(py, async move {
            let mut t = inner.lock().await;
            t.reload().await?;
            match complete_decided {
                true => oxlake::commit::rollback_failed_completing_decided(&mut t).await,
                false => oxlake::commit::rollback_failed(&mut t).await,
            }
        })
    }

    /// Builds the metadata table; returns its `indexing` instant. A shard count of 0 leaves an
    /// index out (`files` needs one); `size_record_index` sizes the record index from the table,
    /// with at least `record_index_shards`.
    #[pyo3(signature = (files_shards=4, column_stats_shards=2, bloom_filters_shards=2, record_index_shards=8, size_record_index=false))]
    fn build_metadata(
        &self,
        py: Python<'_>,
        files_shards: u32,
        column_stats_shards: u32,
        bloom_filters_shards: u32,
        record_index_shards: u32,
        size_record_index: bool,
    ) -> PyResult<String> {
        let mut config = oxlake::metadata::MetadataConfig::new(
            files_shards,
            column_stats_shards,
            bloom_filters_shards,
            record_index_shards,
        )
        .map_err(crate::errors::to_py)?;
        if size_record_index {
            config = config.sized_record_index();
        }
        let inner = self.inner.clone();
        run(py, async move {
            let mut t = inner.lock().await;
            t.reload().await?;
            t.build_metadata(config).await
        })
    }

    /// The current rows of the keys `keys` holds (rows with the record key columns).
    #[pyo3(signature = (keys, columns=None))]
    fn lookup(
        &self,
        py: Python<'_>,
        keys: Bound<'_, PyAny>,
        columns: Option<Vec<String>>,
    ) -> PyResult<PyRecordBatchStream> {
        let batches = import_batches(&keys)?;
        let inner = self.inner.clone();
        let stream = run(py, async move {
            let mut t = inner.lock().await;
            t.reload().await?;
            let schema = match batches.first() {
                Some(b) => b.schema(),
                None => t.data_schema(),
            };
            let keys = arrow::compute::concat_batches(&schema, &batches)?;
            t.lookup(&keys, columns).await
        })?;
        PyRecordBatchStream::new(stream)
    }

    /// Compares the metadata table with a full listing: (present, missing instants, differences).
    fn validate(&self, py: Python<'_>) -> PyResult<(bool, Vec<String>, Vec<String>)> {
        let inner = self.inner.clone();
        run(py, async move {
            let mut t = inner.lock().await;
            t.reload().await?;
            let r = t.validate_metadata().await?;
            Ok((r.present, r.missing_instants, r.differences))
        })
    }

    // ---- writes ---------------------------------------------------------------------------

    /// Writes Arrow data with an operation; returns (instant, inserts, updates, deletes, files).
    /// `read_from`: the timeline `(time, action, state)` listed before `data` was read from the
    /// table (a write by predicate), see `oxlake::ReadState`.
    #[pyo3(signature = (operation, data, target_file_size=None, conflict_retries=0, schema_mode="strict", extra_metadata=None, sort_mode=None, read_from=None, chunk_bytes=None))]
    #[allow(clippy::too_many_arguments)]
    fn write(
        &self,
        py: Python<'_>,
        operation: &str,
        data: Bound<'_, PyAny>,
        target_file_size: Option<u64>,
        conflict_retries: u32,
        schema_mode: &str,
        extra_metadata: Option<std::collections::BTreeMap<String, String>>,
        sort_mode: Option<&str>,
        read_from: Option<Vec<(String, String, String)>>,
        chunk_bytes: Option<usize>,
    ) -> PyResult<WriteSummary> {
        let op = WriteOperation::parse(operation)
            .ok_or_else(|| InvalidArgumentError::new_err(format!("unknown operation `{operation}`")))?;
        let schema_mode = oxlake::schema::evolve::SchemaMode::parse(schema_mode).map_err(crate::errors::to_py)?;
        let bulk_sort = sort_mode.map(oxlake::BulkSort::parse).transpose().map_err(crate::errors::to_py)?;
        // A bulk insert streams its input, unless it orders all of it or may write it again;
        // inserts, upserts and deletes stream theirs (spilling it when it is larger than a
        // chunk), unless it was read from the table (a write by predicate: held, and small).
        let streamed_bulk = op == WriteOperation::BulkInsert
            && conflict_retries == 0
            && read_from.is_none()
            && bulk_sort != Some(oxlake::BulkSort::GlobalSort);
        let streamed = matches!(op, WriteOperation::Insert | WriteOperation::Upsert | WriteOperation::Delete)
            && read_from.is_none();
        let config = WriteConfig {
            conflict_retries,
            schema_mode,
            extra_metadata: extra_metadata.unwrap_or_default(),
            bulk_sort: bulk_sort.unwrap_or_default(),
            read_from: read_from.map(|listed| read_state(&listed)).transpose()?,
            ..WriteConfig::default().with_target_file_size(target_file_size)
        };
        let inner = self.inner.clone();
        let chunk = chunk_bytes.unwrap_or(oxlake::write::STREAM_CHUNK_BYTES);
        let r = if streamed_bulk || streamed {
            let mut input = crate::arrow_ffi::import_stream(&data)?;
            run(py, async move {
                let mut t = inner.lock().await;
                match streamed_bulk {
                    true => t.bulk_insert_stream(input.as_mut(), chunk, &config).await,
                    false => t.write_stream(op, input.as_mut(), chunk, &config).await,
                }
            })?
        } else {
            let batches = import_batches(&data)?;
            run(py, async move {
                let mut t = inner.lock().await;
                t.write(op, batches, &config).await
            })?
        };
        Ok((r.instant, r.num_inserts, r.num_updates, r.num_deletes, r.files, r.completion))
    }

    /// The completed data commits, oldest first: (time, action, completion, operation, inserts,
    /// updates, deletes, files written, bytes written, file groups replaced, extra metadata).
    fn commits(&self, py: Python<'_>, include_archived: bool) -> PyResult<Vec<CommitTuple>> {
        let inner = self.inner.clone();
        run(py, async move {
            let mut t = inner.lock().await;
            t.reload().await?;
            let commits = t.commits(include_archived).await?;
            Ok(commits
                .into_iter()
                .map(|c| {
                    (
                        c.instant.time,
                        c.instant.action.to_string(),
                        c.instant.completion,
                        c.operation,
                        (c.num_inserts, c.num_updates, c.num_deletes),
                        (c.files_written, c.bytes_written, c.files_replaced),
                        c.extra_metadata,
                        c.partitions.into_iter().map(|(p, n)| (p, (n.inserts, n.updates, n.deletes))).collect(),
                    )
                })
                .collect())
        })
    }

    /// The `extraMetadata` of the completed commit at `instant`.
    fn extra_metadata(&self, py: Python<'_>, instant: String) -> PyResult<std::collections::BTreeMap<String, String>> {
        let inner = self.inner.clone();
        run(py, async move {
            let mut t = inner.lock().await;
            t.reload().await?;
            t.extra_metadata(&instant).await
        })
    }

    // ---- reads ----------------------------------------------------------------------------

    /// Scans the table; returns a stream exporting `__arrow_c_stream__`.
    #[pyo3(signature = (columns=None, filter=None, as_of=None, query="snapshot", start=None, end=None, batch_size=None, memory_limit=None))]
    #[allow(clippy::too_many_arguments)]
    fn scan(
        &self,
        py: Python<'_>,
        columns: Option<Vec<String>>,
        filter: Option<Bound<'_, PyAny>>,
        as_of: Option<String>,
        query: &str,
        start: Option<String>,
        end: Option<String>,
        batch_size: Option<usize>,
        memory_limit: Option<usize>,
    ) -> PyResult<PyRecordBatchStream> {
        let opts =
            ScanOptions { batch_size, memory_limit, ..query_options(columns, filter, as_of, query, start, end)? };
        let inner = self.inner.clone();
        let stream = run(py, async move {
            let mut t = inner.lock().await;
            t.reload().await?;
            t.scan(&opts).await
        })?;
        PyRecordBatchStream::new(stream)
    }

    /// Plans a query and cuts it into splits of about `target_bytes`, at least `min_splits` where
    /// base files can be cut by rows; returns each as `(json, bytes, files)` for a worker's
    /// `scan_split`.
    #[pyo3(signature = (columns=None, filter=None, as_of=None, query="snapshot", start=None, end=None, target_bytes=134217728, min_splits=1))]
    #[allow(clippy::too_many_arguments)]
    fn splits(
        &self,
        py: Python<'_>,
        columns: Option<Vec<String>>,
        filter: Option<Bound<'_, PyAny>>,
        as_of: Option<String>,
        query: &str,
        start: Option<String>,
        end: Option<String>,
        target_bytes: u64,
        min_splits: usize,
    ) -> PyResult<Vec<(Vec<u8>, u64, usize)>> {
        let opts = query_options(columns, filter, as_of, query, start, end)?;
        let inner = self.inner.clone();
        run(py, async move {
            let mut t = inner.lock().await;
            t.reload().await?;
            let splits = t.plan_splits(&opts, target_bytes, min_splits).await?;
            splits.iter().map(|s| Ok((s.to_json()?, s.size(), s.files()))).collect()
        })
    }

    /// A snapshot's slices for a dataset other engines read, and the schema they are read with:
    /// `(split json, base file)` each, the base file (relative to the table root) when an engine
    /// may read that file alone.
    #[pyo3(signature = (as_of=None, query="snapshot"))]
    fn dataset_slices(
        &self,
        py: Python<'_>,
        as_of: Option<String>,
        query: &str,
    ) -> PyResult<(PySchema, Vec<DatasetSlice>)> {
        let opts = query_options(None, None, as_of, query, None, None)?;
        let inner = self.inner.clone();
        run(py, async move {
            let mut t = inner.lock().await;
            t.reload().await?;
            let (schema, parts) = t.plan_dataset(&opts).await?;
            let parts = parts
                .into_iter()
                .map(|(split, direct)| Ok((split.to_json()?, direct)))
                .collect::<oxlake::Result<_>>()?;
            Ok((PySchema(schema), parts))
        })
    }

    /// The latest snapshot as a DataFusion table provider for datafusion-python
    /// (`SessionContext.register_table(name, table)`): a capsule of DataFusion's FFI, planned now,
    /// scanned with oxlake's own session (its store, memory pool and options) while the asking
    /// session's projection, filters and limit are pushed into it.
    fn __datafusion_table_provider__<'py>(
        &self,
        py: Python<'py>,
        session: Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, pyo3::types::PyCapsule>> {
        let codec = crate::datafusion_ffi::logical_codec(&session)?;
        let inner = self.inner.clone();
        let provider = run(py, async move {
            let mut t = inner.lock().await;
            t.reload().await?;
            t.foreign_provider(&ScanOptions::default()).await
        })?;
        crate::datafusion_ffi::provider_capsule(py, Arc::new(provider), codec)
    }

    /// The storage options the table was opened with (a dataset's file system takes them).
    #[getter]
    fn storage_options(&self, py: Python<'_>) -> PyResult<HashMap<String, String>> {
        self.with(py, |t| Ok(t.options().storage_options.clone()))
    }

    /// Reads one split planned by `splits`, with a column selection and a filter.
    #[pyo3(signature = (split, columns=None, filter=None, batch_size=None, memory_limit=None))]
    fn scan_split(
        &self,
        py: Python<'_>,
        split: Vec<u8>,
        columns: Option<Vec<String>>,
        filter: Option<Bound<'_, PyAny>>,
        batch_size: Option<usize>,
        memory_limit: Option<usize>,
    ) -> PyResult<PyRecordBatchStream> {
        let split = oxlake::read::splits::Split::from_json(&split).map_err(crate::errors::to_py)?;
        let opts = ScanOptions {
            columns,
            filter: filter.map(|f| parse_filter(&f)).transpose()?,
            batch_size,
            memory_limit,
            ..Default::default()
        };
        let inner = self.inner.clone();
        let stream = run(py, async move {
            let t = inner.lock().await;
            t.scan_split(split, &opts).await
        })?;
        PyRecordBatchStream::new(stream)
    }

    /// The files a scan would read (after planning and pruning by the metadata table's file
    /// indexes, before partition pruning).
    #[pyo3(signature = (as_of=None, query="snapshot", start=None, end=None, filter=None))]
    fn planned_files(
        &self,
        py: Python<'_>,
        as_of: Option<String>,
        query: &str,
        start: Option<String>,
        end: Option<String>,
        filter: Option<Bound<'_, PyAny>>,
    ) -> PyResult<Vec<String>> {
        let opts = query_options(None, filter, as_of, query, start, end)?;
        let inner = self.inner.clone();
        run(py, async move {
            let mut t = inner.lock().await;
            t.reload().await?;
            t.planned_paths(&opts).await
        })
    }
}

impl PyTable {
    fn with<T: Send + 'static>(
        &self,
        py: Python<'_>,
        f: impl FnOnce(&Table) -> oxlake::Result<T> + Send + 'static,
    ) -> PyResult<T> {
        let inner = self.inner.clone();
        run(py, async move {
            let t = inner.lock().await;
            f(&t)
        })
    }
}

/// The query part of a scan's options, as the Python methods take it.
fn query_options(
    columns: Option<Vec<String>>,
    filter: Option<Bound<'_, PyAny>>,
    as_of: Option<String>,
    query: &str,
    start: Option<String>,
    end: Option<String>,
) -> PyResult<ScanOptions> {
    Ok(ScanOptions {
        columns,
        filter: filter.map(|f| parse_filter(&f)).transpose()?,
        as_of,
        query: QueryType::parse(query).map_err(crate::errors::to_py)?,
        start,
        end,
        ..Default::default()
    })
}

/// A SQL string, or a list of `(column, op, value)` tuples.
fn parse_filter(obj: &Bound<'_, PyAny>) -> PyResult<Filter> {
    if let Ok(s) = obj.cast::<PyString>() {
        return Ok(Filter::Sql(s.to_str()?.to_string()));
    }
    let list = obj.cast::<PyList>().map_err(|_| {
        InvalidArgumentError::new_err("filter must be a SQL string or a list of (column, op, value) tuples")
    })?;
    let mut preds = Vec::with_capacity(list.len());
    for item in list.iter() {
        let t = item
            .cast::<PyTuple>()
            .map_err(|_| InvalidArgumentError::new_err("each filter item must be a (column, op, value) tuple"))?;
        if t.len() != 3 {
            return Err(InvalidArgumentError::new_err("each filter item must be a (column, op, value) tuple"));
        }
        let column: String = t.get_item(0)?.extract()?;
        let op: String = t.get_item(1)?.extract()?;
        let op = Op::parse(&op).map_err(crate::errors::to_py)?;
        let value = t.get_item(2)?;
        let values = if matches!(op, Op::In | Op::NotIn) {
            if !(value.is_instance_of::<PyList>()
                || value.is_instance_of::<PyTuple>()
                || value.is_instance_of::<PySet>())
            {
                return Err(InvalidArgumentError::new_err(format!("`{column}`: in / not in take a list of values")));
            }
            value.try_iter()?.map(|v| scalar(&v?)).collect::<PyResult<Vec<_>>>()?
        } else {
            vec![scalar(&value)?]
        };
        preds.push(Predicate { column, op, values });
    }
    Ok(Filter::Predicates(preds))
}

fn scalar(v: &Bound<'_, PyAny>) -> PyResult<ScalarValue> {
    if v.is_none() {
        Ok(ScalarValue::Null)
    } else if v.is_instance_of::<PyBool>() {
        Ok(ScalarValue::Boolean(Some(v.extract()?)))
    } else if v.is_instance_of::<PyInt>() {
        Ok(ScalarValue::Int64(Some(v.extract()?)))
    } else if v.is_instance_of::<PyFloat>() {
        Ok(ScalarValue::Float64(Some(v.extract()?)))
    } else if v.is_instance_of::<PyString>() {
        Ok(ScalarValue::Utf8(Some(v.extract()?)))
    } else if v.is_instance_of::<PyDict>() {
        Err(InvalidArgumentError::new_err("filter values must be None, bool, int, float or str"))
    } else {
        Ok(ScalarValue::Utf8(Some(v.str()?.to_string())))
    }
}

/// The [`oxlake::ReadState`] of a timeline as `Table.timeline` gives it: `(time, action, state)`.
pub(crate) fn read_state(listed: &[(String, String, String)]) -> PyResult<oxlake::ReadState> {
    use oxlake::format::instant::{Action, Instant, State};
    let instants = listed
        .iter()
        .map(|(time, action, state)| {
            let action = Action::parse(action)
                .ok_or_else(|| InvalidArgumentError::new_err(format!("unknown action `{action}` of instant {time}")))?;
            let state = match state.as_str() {
                "requested" => State::Requested,
                "inflight" => State::Inflight,
                "completed" => State::Completed,
                other => {
                    return Err(InvalidArgumentError::new_err(format!("unknown state `{other}` of instant {time}")));
                }
            };
            Ok(Instant::new(time.clone(), action, state))
        })
        .collect::<PyResult<Vec<_>>>()?;
    Ok(oxlake::ReadState::of(&instants))
}
