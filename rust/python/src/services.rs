//! Table services, as module functions taking the table (the `#[pymethods]` of `PyTable` stay
//! about reads and writes).

use pyo3::prelude::*;

use crate::runtime::run;
use crate::table::PyTable;
use oxlake::services::CompactionConfig;

/// Compacts merge-on-read slices with at least `min_log_files` log files; returns
/// (instants, file groups, records).
#[pyfunction]
#[pyo3(signature = (table, min_log_files=1))]
pub fn compact(py: Python<'_>, table: &PyTable, min_log_files: usize) -> PyResult<(Vec<String>, usize, u64)> {
    let inner = table.inner.clone();
    run(py, async move {
        let mut t = inner.lock().await;
        let config = CompactionConfig { min_log_files, ..Default::default() };
        let r = t.compact(&config).await?;
        Ok((r.instants, r.file_groups, r.records))
    })
}
