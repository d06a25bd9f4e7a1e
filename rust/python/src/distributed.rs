//! A write spread over processes (Spark tasks): the driver begins it and commits or aborts it
//! (`PendingWrite`); each task writes its files (`write_files`) and hands back what it wrote.

use oxlake::commit::Transaction;
use oxlake::write::WrittenFiles;
use oxlake::{WriteConfig, WriteOperation};
use pyo3::prelude::*;

use crate::arrow_ffi::import_batches;
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
    tx: std::sync::Mutex<Option<Transaction>>,
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
    Ok(PyPendingWrite {
        table: PyTable { inner: table.inner.clone() },
        op,
        instant: tx.time().to_string(),
        tx: std::sync::Mutex::new(Some(tx)),
    })
}

/// Writes the files of `data` for the pending write `instant`; returns what it wrote, for the
/// driver's `PendingWrite.commit`.
#[pyfunction]
#[pyo3(signature = (table, operation_name, instant, data, target_file_size=None))]
pub fn write_files(
    py: Python<'_>,
    table: &PyTable,
    operation_name: &str,
    instant: String,
    data: Bound<'_, PyAny>,
    target_file_size: Option<u64>,
) -> PyResult<Vec<u8>> {
    let op = operation(operation_name)?;
    let batches = import_batches(&data)?;
    let config = WriteConfig::default().with_target_file_size(target_file_size);
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

    /// Completes the write with every task's result; files of failed task attempts are removed
    /// first. On a conflict the write is rolled back and `CommitConflictError` raised.
    fn commit(&self, py: Python<'_>, parts: Vec<Vec<u8>>) -> PyResult<WriteSummary> {
        let parts =
            parts.iter().map(|p| WrittenFiles::from_json(p)).collect::<oxlake::Result<Vec<_>>>().map_err(to_py)?;
        let Some(tx) = self.take()? else {
            return Err(InvalidArgumentError::new_err("the write was already committed or aborted"));
        };
        let (inner, op) = (self.table.inner.clone(), self.op);
        let r = run(py, async move {
            let mut t = inner.lock().await;
            t.commit_write(tx, op, parts, true).await
        })?;
        Ok((r.instant, r.num_inserts, r.num_updates, r.num_deletes, r.files))
    }

    /// Rolls the write back: every file its tasks wrote is deleted. Idempotent.
    fn abort(&self, py: Python<'_>) -> PyResult<()> {
        let Some(tx) = self.take()? else { return Ok(()) };
        let inner = self.table.inner.clone();
        run(py, async move {
            let mut t = inner.lock().await;
            tx.abort(&mut t).await
        })
    }
}

impl PyPendingWrite {
    /// The transaction, once: committing or aborting ends it.
    fn take(&self) -> PyResult<Option<Transaction>> {
        let mut tx = self.tx.lock().map_err(|_| crate::errors::OxlakeError::new_err("pending write lock poisoned"))?;
        Ok(tx.take())
    }
}
