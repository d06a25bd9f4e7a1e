//! A write spread over processes (Spark tasks): the driver begins it and commits or aborts it
//! (`PendingWrite`); each task writes its files (`write_files`) and hands back what it wrote.
//! When the driver's steps run in different processes (Spark's data source API), the pending
//! write travels as a token (`PendingWrite.token`, `resume_write`).

use oxlake::commit::Transaction;
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

/// Begins a write whose files other processes write (see `write_files`).
#[pyfunction]
pub fn begin_write(py: Python<'_>, table: &PyTable, operation_name: &str) -> PyResult<PyPendingWrite> {
    let op = operation(operation_name)?;
    let inner = table.inner.clone();
    let tx = run(py, async move {
        let mut t = inner.lock().await;
        t.begin_write(op).await
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
    let inner = table.inner.clone();
    run(py, async move {
        let mut t = inner.lock().await;
        t.write_files(op, batches, &instant, &config).await?.to_json()
    })
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
    /// is rolled back and `CommitConflictError` raised.
    #[pyo3(signature = (parts, extra_metadata=None))]
    fn commit(
        &self,
        py: Python<'_>,
        parts: Vec<Vec<u8>>,
        extra_metadata: Option<std::collections::BTreeMap<String, String>>,
    ) -> PyResult<WriteSummary> {
        let parts =
            parts.iter().map(|p| WrittenFiles::from_json(p)).collect::<oxlake::Result<Vec<_>>>().map_err(to_py)?;
        let Some(tx) = self.take()? else {
            return Err(InvalidArgumentError::new_err("the write was already committed or aborted"));
        };
        let (inner, op) = (self.table.inner.clone(), self.op);
        let r = run(py, async move {
            let mut t = inner.lock().await;
            t.commit_write_with(tx, op, parts, true, &extra_metadata.unwrap_or_default()).await
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
