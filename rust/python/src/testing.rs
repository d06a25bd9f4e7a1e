//! Test support: storage faults and latency injected into every store of the process
//! (`oxlake.testing`).

use std::collections::HashMap;

use pyo3::prelude::*;

use crate::errors::to_py;

/// Installs a fault plan (see `oxlake::storage::faults`); `""` removes it. Counters restart.
#[pyfunction]
pub fn inject_faults(spec: &str) -> PyResult<()> {
    oxlake::storage::faults::install(spec).map_err(to_py)
}

/// Calls per kind since the plan was installed, and `injected`: failures injected.
#[pyfunction]
pub fn fault_counts() -> HashMap<String, u64> {
    let counts = oxlake::storage::faults::counts();
    let mut out: HashMap<String, u64> = counts.calls.into_iter().map(|(k, n)| (k.to_string(), n)).collect();
    out.insert("injected".into(), counts.injected);
    out
}
