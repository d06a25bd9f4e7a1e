//! Table services, as module functions taking the table (the `#[pymethods]` of `PyTable` stay
//! about reads and writes).

use std::sync::Arc;

use pyo3::prelude::*;

use crate::runtime::run;
use crate::table::PyTable;
use oxlake::services::{CleanPolicy, ClusteringConfig, CompactionConfig, Progress};

/// The progress of a table service, read from another thread while the service runs.
#[pyclass(name = "Progress", module = "oxlake._native", frozen)]
pub struct PyProgress {
    inner: Arc<Progress>,
}

#[pymethods]
impl PyProgress {
    #[new]
    fn new() -> Self {
        PyProgress { inner: Arc::new(Progress::new()) }
    }

    /// Units done so far.
    #[getter]
    fn done(&self) -> u64 {
        self.inner.get().0
    }

    /// Units planned (0 until the service has planned its work).
    #[getter]
    fn total(&self) -> u64 {
        self.inner.get().1
    }

    /// What is counted (`"file groups"`, `"files"`, `"commits"`).
    #[getter]
    fn unit(&self) -> &'static str {
        self.inner.get().2
    }
}

fn tracker(progress: Option<PyRef<'_, PyProgress>>) -> Option<Arc<Progress>> {
    progress.map(|p| p.inner.clone())
}

/// Compacts merge-on-read slices with at least `min_log_files` log files; returns
/// (instants, file groups, records).
#[pyfunction]
#[pyo3(signature = (table, min_log_files=1, progress=None))]
pub fn compact(
    py: Python<'_>,
    table: &PyTable,
    min_log_files: usize,
    progress: Option<PyRef<'_, PyProgress>>,
) -> PyResult<(Vec<String>, usize, u64)> {
    let inner = table.inner.clone();
    let progress = tracker(progress);
    run(py, async move {
        let mut t = inner.lock().await;
        let config = CompactionConfig { min_log_files, progress, ..Default::default() };
        let r = t.compact(&config).await?;
        Ok((r.instants, r.file_groups, r.records))
    })
}

/// Rolls back the latest completed commit `instant`; returns the rollback instant.
#[pyfunction]
pub fn rollback(py: Python<'_>, table: &PyTable, instant: String) -> PyResult<String> {
    let inner = table.inner.clone();
    run(py, async move {
        let mut t = inner.lock().await;
        oxlake::commit::rollback_completed(&mut t, &instant).await
    })
}

/// Savepoints the completed commit `instant`.
#[pyfunction]
pub fn savepoint(py: Python<'_>, table: &PyTable, instant: String) -> PyResult<()> {
    let inner = table.inner.clone();
    run(py, async move { inner.lock().await.savepoint(&instant).await })
}

/// What became of the write at `instant`: `committed`, `rolled_back` or `pending` (settled first
/// where its writer is gone).
#[pyfunction]
pub fn outcome(py: Python<'_>, table: &PyTable, instant: String) -> PyResult<&'static str> {
    let inner = table.inner.clone();
    run(py, async move { inner.lock().await.outcome(&instant).await.map(oxlake::commit::Outcome::name) })
}

/// Deletes the savepoint `instant`.
#[pyfunction]
pub fn delete_savepoint(py: Python<'_>, table: &PyTable, instant: String) -> PyResult<()> {
    let inner = table.inner.clone();
    run(py, async move { inner.lock().await.delete_savepoint(&instant).await })
}

/// Archives the oldest instants of the active timeline, keeping `min_commits..=max_commits`
/// commits (the table's settings where not given); returns `(time, action)` of each instant
/// archived.
#[pyfunction]
#[pyo3(signature = (table, min_commits=None, max_commits=None))]
pub fn archive(
    py: Python<'_>,
    table: &PyTable,
    min_commits: Option<usize>,
    max_commits: Option<usize>,
) -> PyResult<Vec<(String, String)>> {
    let inner = table.inner.clone();
    run(py, async move {
        let mut t = inner.lock().await;
        t.reload().await?;
        let current = oxlake::services::ArchiveConfig::of(&t)?;
        let config = oxlake::services::ArchiveConfig::new(
            min_commits.unwrap_or(current.min_commits),
            max_commits.unwrap_or(current.max_commits),
        )?;
        let result = t.archive(config).await?;
        Ok(result.archived.into_iter().map(|i| (i.time, i.action.to_string())).collect())
    })
}

/// Upgrades a version 6 table to version `to` (8 or 9); returns `(from, to, instants moved,
/// archived instants copied)`.
#[pyfunction]
pub fn upgrade(py: Python<'_>, table: &PyTable, to: u32) -> PyResult<(u32, u32, usize, usize)> {
    let inner = table.inner.clone();
    run(py, async move {
        let mut t = inner.lock().await;
        let r = t.upgrade(to).await?;
        Ok((r.from, r.to, r.instants, r.archived))
    })
}

/// Sets the table's archival settings (kept in `hoodie.properties`).
#[pyfunction]
#[pyo3(signature = (table, min_commits, max_commits, inline=true))]
pub fn set_archival(
    py: Python<'_>,
    table: &PyTable,
    min_commits: usize,
    max_commits: usize,
    inline: bool,
) -> PyResult<()> {
    let inner = table.inner.clone();
    run(py, async move {
        let config = oxlake::services::ArchiveConfig::new(min_commits, max_commits)?;
        inner.lock().await.set_archival(config, inline).await
    })
}

/// Sets whether and how the table's writes clean once they land: `retain=None` turns inline
/// cleaning off.
#[pyfunction]
#[pyo3(signature = (table, retain, policy="keep_latest_commits", every=1))]
pub fn set_cleaning(
    py: Python<'_>,
    table: &PyTable,
    retain: Option<usize>,
    policy: &str,
    every: usize,
) -> PyResult<()> {
    let clean = match retain {
        Some(retain) => {
            let policy = CleanPolicy::parse(policy, retain).map_err(crate::errors::to_py)?;
            Some(oxlake::services::InlineClean { policy, every })
        }
        None => None,
    };
    let inner = table.inner.clone();
    run(py, async move { inner.lock().await.set_cleaning(clean).await })
}

/// Restores the table to the savepoint `instant`; returns the restore instant.
#[pyfunction]
#[pyo3(signature = (table, instant, progress=None))]
pub fn restore(
    py: Python<'_>,
    table: &PyTable,
    instant: String,
    progress: Option<PyRef<'_, PyProgress>>,
) -> PyResult<String> {
    let inner = table.inner.clone();
    let progress = tracker(progress);
    run(py, async move { inner.lock().await.restore_with(&instant, progress).await })
}

/// Cleans with a policy; returns (clean instant, files deleted).
#[pyfunction]
#[pyo3(signature = (table, policy="keep_latest_commits", retain=10, progress=None))]
pub fn clean(
    py: Python<'_>,
    table: &PyTable,
    policy: &str,
    retain: usize,
    progress: Option<PyRef<'_, PyProgress>>,
) -> PyResult<(Option<String>, Vec<String>)> {
    let policy = CleanPolicy::parse(policy, retain).map_err(crate::errors::to_py)?;
    let inner = table.inner.clone();
    let progress = tracker(progress);
    run(py, async move {
        let r = inner.lock().await.clean_with(policy, progress).await?;
        Ok((r.instant, r.deleted))
    })
}

/// Rewrites small file groups into fewer ones sorted by `sort_by`; returns
/// (replacecommit, file groups replaced, file groups written, records).
#[pyfunction]
#[pyo3(signature = (table, sort_by=Vec::new(), small_file_limit=None, target_file_size=None, memory_limit=None, progress=None))]
pub fn cluster(
    py: Python<'_>,
    table: &PyTable,
    sort_by: Vec<String>,
    small_file_limit: Option<u64>,
    target_file_size: Option<u64>,
    memory_limit: Option<usize>,
    progress: Option<PyRef<'_, PyProgress>>,
) -> PyResult<(Option<String>, usize, usize, u64)> {
    let mut config = ClusteringConfig { sort_by, memory_limit, progress: tracker(progress), ..Default::default() };
    if let Some(n) = small_file_limit {
        config.small_file_limit = n;
    }
    if let Some(n) = target_file_size {
        config.write.target_file_size = n;
        config.max_group_bytes = 8 * n;
    }
    let inner = table.inner.clone();
    run(py, async move {
        let r = inner.lock().await.cluster(&config).await?;
        Ok((r.instant, r.replaced_file_groups, r.new_file_groups, r.records))
    })
}

/// One schema change as Python spells it (see `python/oxlake/table.py: UpdateSchema`).
type PyChange = (String, Vec<String>, Option<String>, Option<usize>);

/// Applies explicit schema changes as one schema version; returns the commit's instant (`None`:
/// nothing changed). `changes`: `(kind, path, argument, type index)` with kind `add`
/// (argument: the doc), `rename` (argument: the new name), `delete`, `update`, `first`,
/// `after` and `before` (argument: the other column); types are the fields of `types`.
#[pyfunction]
pub fn alter_schema(
    py: Python<'_>,
    table: &PyTable,
    changes: Vec<PyChange>,
    types: &Bound<'_, PyAny>,
) -> PyResult<Option<String>> {
    use oxlake::schema::internal::{Position, SchemaChange};
    let types = crate::arrow_ffi::import_schema(types)?;
    let type_at = |i: Option<usize>| -> PyResult<arrow::datatypes::DataType> {
        i.and_then(|i| types.fields().get(i))
            .map(|f| f.data_type().clone())
            .ok_or_else(|| crate::errors::InvalidArgumentError::new_err("a schema change without its type"))
    };
    let mut parsed = Vec::with_capacity(changes.len());
    for (kind, path, arg, ty) in changes {
        // Renames, drops and moves take top-level columns only (see `SchemaChange`).
        let name = match path.as_slice() {
            [name] => name.clone(),
            _ if kind == "add" || kind == "update" => path.first().cloned().unwrap_or_default(),
            _ => {
                return Err(crate::errors::to_py(oxlake::Error::SchemaMismatch {
                    detail: format!(
                        "{kind}: `{}` is not a top-level column (nested fields are added or widened only)",
                        path.join(".")
                    ),
                }));
            }
        };
        let other = || {
            arg.clone().ok_or_else(|| crate::errors::InvalidArgumentError::new_err(format!("`{kind}` needs a column")))
        };
        parsed.push(match kind.as_str() {
            "add" => SchemaChange::AddColumn { path, data_type: type_at(ty)?, doc: arg },
            "rename" => SchemaChange::RenameColumn { name, new_name: other()? },
            "delete" => SchemaChange::DeleteColumn { name },
            "update" => SchemaChange::UpdateColumn { path, data_type: type_at(ty)? },
            "first" => SchemaChange::Move { name, to: Position::First },
            "after" => SchemaChange::Move { name, to: Position::After(other()?) },
            "before" => SchemaChange::Move { name, to: Position::Before(other()?) },
            other => {
                return Err(crate::errors::InvalidArgumentError::new_err(format!("unknown schema change `{other}`")));
            }
        });
    }
    let inner = table.inner.clone();
    run(py, async move {
        let mut t = inner.lock().await;
        Ok(t.alter_schema(&parsed).await?.map(|i| i.time))
    })
}
