//! A write spread over processes (Spark tasks): the driver begins it and commits or aborts it
//! (`PendingWrite`); each task writes its files (`write_files`) and hands back what it wrote.
//! When the driver's steps run in different processes (Spark's data source API), the pending
//! write travels as a token (`PendingWrite.token`, `resume_write`).

use oxlake::commit::Transaction;
use oxlake::services::PendingCompaction;
use oxlake::services::compaction;
use oxlake::write::{TaskId, WrittenFiles};
use oxlake::{WriteConfig, WriteOperation};
use pyo3::prelude::*;

use crate::arrow_ffi::{PyRecordBatchStream, import_batches};
use crate::errors::{InvalidArgumentError, to_py};
use crate::runtime::run;
use crate::table::{PyTable, WriteSummary};

fn operation(name: &str) -> PyResult<WriteOperation> {
    WriteOperation::parse(name).ok_or_else(|| InvalidArgumentError::new_err(format!("unknown operation `{name}`")))
}

/// A write begun on the driver: its instant is pending (with a heartbeat) until `commit` or
/// `abort`. Dropped without either, its heartbeat stops and the next writer rolls it back.
#[pyclass(name = "PendingWrite", module = "oxlake._native")]
pub struct PyPendingWrite {
    table: PyTable,
    op: WriteOperation,
    instant: String,
    token: Vec<u8>,
    tx: std::sync::Mutex<Option<Transaction>>,
}

impl PyPendingWrite {
    fn new(table: &PyTable, op: WriteOperation, tx: Transaction) -> PyResult<Self> {
        Ok(PyPendingWrite {
            table: PyTable { inner: table.inner.clone() },
            op,
            instant: tx.time().to_string(),
            token: tx.hand_over().map_err(to_py)?,
            tx: std::sync::Mutex::new(Some(tx)),
        })
    }

    /// The transaction, once: committing or aborting ends it.
    fn take(&self) -> PyResult<Option<Transaction>> {
        let mut tx = self.tx.lock().map_err(|_| crate::errors::OxlakeError::new_err("pending write lock poisoned"))?;
        Ok(tx.take())
    }
}

/// Begins a write whose files other processes write (see `write_files`). `read_from`: the
/// timeline `(time, action, state)` listed before the write's input was read from this table
/// (a job compiling it from what the table held): the commits completed since are checked for
/// conflicts at commit (`oxlake::ReadState`).
#[pyfunction]
#[pyo3(signature = (table, operation_name, read_from=None))]
pub fn begin_write(
    py: Python<'_>,
    table: &PyTable,
    operation_name: &str,
    read_from: Option<Vec<(String, String, String)>>,
) -> PyResult<PyPendingWrite> {
    let op = operation(operation_name)?;
    let read = read_from.map(|listed| crate::table::read_state(&listed)).transpose()?;
    let inner = table.inner.clone();
    let tx = run(py, async move {
        let mut t = inner.lock().await;
        match &read {
            Some(read) => t.begin_write_read_from(op, read).await,
            None => t.begin_write(op).await,
        }
    })?;
    PyPendingWrite::new(table, op, tx)
}

/// Takes up, in this process, a write begun elsewhere (`token`: its `PendingWrite.token`).
#[pyfunction]
pub fn resume_write(py: Python<'_>, table: &PyTable, operation_name: &str, token: Vec<u8>) -> PyResult<PyPendingWrite> {
    let op = operation(operation_name)?;
    let inner = table.inner.clone();
    let tx = run(py, async move {
        let mut t = inner.lock().await;
        Transaction::take_over(&mut t, &token).await
    })?;
    PyPendingWrite::new(table, op, tx)
}

/// Writes the files of `data` for the pending write `instant`; returns what it wrote, for the
/// driver's `PendingWrite.commit`. `task` is `(task number, attempt number)` of the writing task
/// (attempts from 1): it goes into every file name, so tasks never write the same file.
/// `own_partitions`: no other task of the write writes a key in the partitions this one writes;
/// the result then names those partitions, not each key (`WriteConfig::own_partitions`).
#[pyfunction]
#[pyo3(signature = (table, operation_name, instant, data, target_file_size=None, task=None, schema_mode=None, sort_mode=None, own_partitions=false))]
#[allow(clippy::too_many_arguments)]
pub fn write_files(
    py: Python<'_>,
    table: &PyTable,
    operation_name: &str,
    instant: String,
    data: Bound<'_, PyAny>,
    target_file_size: Option<u64>,
    task: Option<(u32, u64)>,
    schema_mode: Option<&str>,
    sort_mode: Option<&str>,
    own_partitions: bool,
) -> PyResult<Vec<u8>> {
    let op = operation(operation_name)?;
    let batches = import_batches(&data)?;
    let config = task_config(target_file_size, task, schema_mode, sort_mode, own_partitions)?;
    let inner = table.inner.clone();
    run(py, async move {
        let mut t = inner.lock().await;
        t.write_files(op, batches, &instant, &config).await?.to_json()
    })
}

/// `write_files` of a stream (any `__arrow_c_stream__`), read as it is written: an input larger
/// than `chunk_bytes` is spilled to disk (to combine its duplicate keys) or, for a bulk insert,
/// written a chunk at a time, so that the task holds a bounded part of it. Returns what each part
/// of the write wrote, all for the driver's `PendingWrite.commit`.
#[pyfunction]
#[pyo3(signature = (table, operation_name, instant, data, chunk_bytes=None, target_file_size=None, task=None, schema_mode=None, sort_mode=None, own_partitions=false))]
#[allow(clippy::too_many_arguments)]
pub fn write_files_stream(
    py: Python<'_>,
    table: &PyTable,
    operation_name: &str,
    instant: String,
    data: Bound<'_, PyAny>,
    chunk_bytes: Option<usize>,
    target_file_size: Option<u64>,
    task: Option<(u32, u64)>,
    schema_mode: Option<&str>,
    sort_mode: Option<&str>,
    own_partitions: bool,
) -> PyResult<Vec<Vec<u8>>> {
    let op = operation(operation_name)?;
    let config = task_config(target_file_size, task, schema_mode, sort_mode, own_partitions)?;
    let mut input = crate::arrow_ffi::import_stream(&data)?;
    let chunk = chunk_bytes.unwrap_or(oxlake::write::STREAM_CHUNK_BYTES);
    let inner = table.inner.clone();
    run(py, async move {
        let mut t = inner.lock().await;
        let parts = t.write_files_stream(op, input.as_mut(), &instant, chunk, &config).await?;
        parts.iter().map(WrittenFiles::to_json).collect()
    })
}

/// The configuration of a task's write (`write_files`, `write_files_stream`).
fn task_config(
    target_file_size: Option<u64>,
    task: Option<(u32, u64)>,
    schema_mode: Option<&str>,
    sort_mode: Option<&str>,
    own_partitions: bool,
) -> PyResult<WriteConfig> {
    let mut config = WriteConfig::default().with_target_file_size(target_file_size);
    config.own_partitions = own_partitions;
    if let Some(mode) = schema_mode {
        config.schema_mode = oxlake::schema::evolve::SchemaMode::parse(mode).map_err(crate::errors::to_py)?;
    }
    if let Some(mode) = sort_mode {
        config.bulk_sort = oxlake::BulkSort::parse(mode).map_err(crate::errors::to_py)?;
    }
    if let Some((task, attempt)) = task {
        if attempt == 0 {
            return Err(InvalidArgumentError::new_err("task attempts are numbered from 1"));
        }
        config.task = TaskId { task, attempt };
    }
    Ok(config)
}

#[pymethods]
impl PyPendingWrite {
    #[getter]
    fn instant(&self) -> String {
        self.instant.clone()
    }

    /// What `resume_write` needs to finish this write in another process.
    #[getter]
    fn token(&self) -> Vec<u8> {
        self.token.clone()
    }

    /// Completes the write with every task's result; base files several tasks wrote for one file
    /// group are merged and files of failed task attempts removed first. On a conflict the write
    /// is rolled back and `CommitConflictError` raised. `compact_inline=False` leaves a
    /// compaction that is due to the caller (a Spark driver runs it on its executors).
    #[pyo3(signature = (parts, extra_metadata=None, compact_inline=true))]
    fn commit(
        &self,
        py: Python<'_>,
        parts: Vec<Vec<u8>>,
        extra_metadata: Option<std::collections::BTreeMap<String, String>>,
        compact_inline: bool,
    ) -> PyResult<WriteSummary> {
        let parts =
            parts.iter().map(|p| WrittenFiles::from_json(p)).collect::<oxlake::Result<Vec<_>>>().map_err(to_py)?;
        let Some(tx) = self.take()? else {
            return Err(InvalidArgumentError::new_err("the write was already committed or aborted"));
        };
        let (inner, op) = (self.table.inner.clone(), self.op);
        let config = WriteConfig {
            extra_metadata: extra_metadata.unwrap_or_default(),
            compact_inline,
            ..WriteConfig::default()
        };
        let r = run(py, async move {
            let mut t = inner.lock().await;
            t.commit_write_with(tx, op, parts, true, &config).await
        })?;
        Ok((r.instant, r.num_inserts, r.num_updates, r.num_deletes, r.files, r.completion))
    }

    /// Rolls the write back: every file its tasks wrote is deleted. Idempotent.
    fn abort(&self, py: Python<'_>) -> PyResult<()> {
        let Some(tx) = self.take()? else { return Ok(()) };
        let inner = self.table.inner.clone();
        run(py, async move {
            let mut t = inner.lock().await;
            tx.abort(&mut t).await.map(drop)
        })
    }
}

/// Where each row of `data` goes in a distributed write (see `Table::route`): an Arrow stream
/// of one string column `route`, a row per input row.
#[pyfunction]
pub fn route(
    py: Python<'_>,
    table: &PyTable,
    operation_name: &str,
    data: Bound<'_, PyAny>,
) -> PyResult<PyRecordBatchStream> {
    use arrow::array::{RecordBatch, StringArray};
    use arrow::datatypes::{DataType, Field, Schema};
    use datafusion::physical_plan::stream::RecordBatchStreamAdapter;

    let op = operation(operation_name)?;
    let batches = import_batches(&data)?;
    let inner = table.inner.clone();
    let routes = run(py, async move {
        let mut t = inner.lock().await;
        t.route(op, batches).await
    })?;
    let schema = std::sync::Arc::new(Schema::new(vec![Field::new("route", DataType::Utf8, false)]));
    let batch = RecordBatch::try_new(schema.clone(), vec![std::sync::Arc::new(StringArray::from(routes))])
        .map_err(|e| to_py(e.into()))?;
    let stream = RecordBatchStreamAdapter::new(schema, futures::stream::iter([Ok(batch)]));
    PyRecordBatchStream::new(Box::pin(stream))
}

/// A compaction begun on the driver whose slices Spark tasks write (`compact_slices`): its
/// instant is pending (with the driver's heartbeat) until `commit` or `abort`. Dropped without
/// either, its heartbeat stops and the next writer rolls it back to its plan.
#[pyclass(name = "PendingCompaction", module = "oxlake._native")]
pub struct PyPendingCompaction {
    table: PyTable,
    instant: String,
    epoch: u32,
    is_new: bool,
    operations: Vec<Vec<u8>>,
    pending: std::sync::Mutex<Option<PendingCompaction>>,
}

/// Begins the next compaction of a merge-on-read table (a plan left pending, else a new one over
/// the slices with at least `min_log_files` log files); `None` when there is nothing to compact.
#[pyfunction]
#[pyo3(signature = (table, min_log_files=1))]
pub fn begin_compaction(
    py: Python<'_>,
    table: &PyTable,
    min_log_files: usize,
) -> PyResult<Option<PyPendingCompaction>> {
    let inner = table.inner.clone();
    let pending = run(py, async move { inner.lock().await.begin_compaction(min_log_files).await })?;
    let Some(pending) = pending else { return Ok(None) };
    let operations = pending
        .operations()
        .iter()
        .map(compaction::operation_to_json)
        .collect::<oxlake::Result<Vec<_>>>()
        .map_err(to_py)?;
    Ok(Some(PyPendingCompaction {
        table: PyTable { inner: table.inner.clone() },
        instant: pending.time().to_string(),
        epoch: pending.epoch(),
        is_new: pending.is_new(),
        operations,
        pending: std::sync::Mutex::new(Some(pending)),
    }))
}

impl PyPendingCompaction {
    /// The compaction, once: committing or aborting ends it.
    fn take(&self) -> PyResult<Option<PendingCompaction>> {
        let mut pending =
            self.pending.lock().map_err(|_| crate::errors::OxlakeError::new_err("pending compaction lock poisoned"))?;
        Ok(pending.take())
    }
}

#[pymethods]
impl PyPendingCompaction {
    #[getter]
    fn instant(&self) -> String {
        self.instant.clone()
    }

    /// The attempt at the instant: `compact_slices` needs it.
    #[getter]
    fn epoch(&self) -> u32 {
        self.epoch
    }

    /// Whether the plan is new (not one found pending).
    #[getter]
    fn is_new(&self) -> bool {
        self.is_new
    }

    /// The planned slices, each as JSON, in plan order (a slice's index is its place here).
    #[getter]
    fn operations(&self) -> Vec<Vec<u8>> {
        self.operations.clone()
    }

    /// Completes the compaction with every task's result (`compact_slices`); returns (instant,
    /// file groups, records). Fails, rolled back, unless every planned slice has exactly one file.
    fn commit(&self, py: Python<'_>, parts: Vec<Vec<u8>>) -> PyResult<(String, usize, u64)> {
        let mut stats = Vec::new();
        for part in &parts {
            stats.append(&mut compaction::stats_from_json(part).map_err(to_py)?);
        }
        let Some(pending) = self.take()? else {
            return Err(InvalidArgumentError::new_err("the compaction was already committed or aborted"));
        };
        let inner = self.table.inner.clone();
        let r = run(py, async move {
            let mut t = inner.lock().await;
            pending.commit(&mut t, stats).await
        })?;
        Ok((r.instants.into_iter().next().unwrap_or_default(), r.file_groups, r.records))
    }

    /// Rolls the attempt back (its base files deleted, the plan kept for the next run). Idempotent.
    fn abort(&self, py: Python<'_>) -> PyResult<()> {
        let Some(pending) = self.take()? else { return Ok(()) };
        let inner = self.table.inner.clone();
        run(py, async move {
            let mut t = inner.lock().await;
            pending.abort(&mut t).await
        })
    }
}

/// Writes the compacted base files of the slices `operations` (each `(index, JSON)` from
/// `PendingCompaction.operations`) of the pending compaction `instant`; returns their stats, for
/// the driver's `PendingCompaction.commit`. `task` is `(task number, attempt number)` (attempts
/// from 1): the attempt goes into every file name.
#[pyfunction]
#[pyo3(signature = (table, instant, epoch, operations, task=None))]
pub fn compact_slices(
    py: Python<'_>,
    table: &PyTable,
    instant: String,
    epoch: u32,
    operations: Vec<(usize, Vec<u8>)>,
    task: Option<(u32, u64)>,
) -> PyResult<Vec<u8>> {
    let operations = operations
        .into_iter()
        .map(|(index, op)| Ok((index, compaction::operation_from_json(&op)?)))
        .collect::<oxlake::Result<Vec<_>>>()
        .map_err(to_py)?;
    let mut config = WriteConfig::default();
    if let Some((task, attempt)) = task {
        if attempt == 0 {
            return Err(InvalidArgumentError::new_err("task attempts are numbered from 1"));
        }
        config.task = TaskId { task, attempt };
    }
    let inner = table.inner.clone();
    let stats = run(py, async move {
        let mut t = inner.lock().await;
        t.compact_slices(&instant, epoch, &operations, &config).await
    })?;
    compaction::stats_to_json(&stats).map_err(to_py)
}

/// The deltacommits since the last compaction when a compaction is due (the table's
/// `inline_compaction` setting reached), else `None`.
#[pyfunction]
pub fn compaction_due(py: Python<'_>, table: &PyTable) -> PyResult<Option<usize>> {
    let inner = table.inner.clone();
    run(py, async move {
        let mut t = inner.lock().await;
        t.reload().await?;
        Ok(t.compaction_due())
    })
}
