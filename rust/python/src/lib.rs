//! Python bindings of oxlake: `oxlake._native`. Bindings only; all logic lives in the `oxlake`
//! crate. The Pythonic API (`oxlake.Table`, `oxlake.create_table`) wraps this module.

mod arrow_ffi;
mod datafusion_ffi;
mod distributed;
mod errors;
mod logging;
mod runtime;
mod services;
mod table;
mod testing;

use pyo3::prelude::*;

/// The extension's own allocations (Arrow buffers, Parquet pages, spill batches) come from
/// mimalloc, not glibc's malloc: a streamed write frees and reallocates chunks of hundreds of MiB
/// from many threads, which glibc's per-thread arenas kept fragmented (the resident floor between
/// chunks rose chunk after chunk). Python's own objects keep Python's allocator.
///
/// mimalloc is built without its transparent-huge-page advice (`no_thp` in Cargo.toml): with it,
/// every first touch of its memory zeroed a 2 MiB page and every purge split one, which made an
/// in-memory insert of 10,000,000 rows 5–9% slower (benches/README.md, "Huge pages"). The
/// process's own THP setting is left alone.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    logging::init();
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    errors::register(m)?;
    m.add_class::<table::PyTable>()?;
    m.add_class::<distributed::PyPendingWrite>()?;
    m.add_function(wrap_pyfunction!(distributed::begin_write, m)?)?;
    m.add_function(wrap_pyfunction!(distributed::write_files, m)?)?;
    m.add_function(wrap_pyfunction!(distributed::write_files_stream, m)?)?;
    m.add_function(wrap_pyfunction!(distributed::resume_write, m)?)?;
    m.add_function(wrap_pyfunction!(distributed::route, m)?)?;
    m.add_class::<distributed::PyPendingCompaction>()?;
    m.add_function(wrap_pyfunction!(distributed::begin_compaction, m)?)?;
    m.add_function(wrap_pyfunction!(distributed::compact_slices, m)?)?;
    m.add_function(wrap_pyfunction!(distributed::compaction_due, m)?)?;
    m.add_class::<arrow_ffi::PyRecordBatchStream>()?;
    m.add_class::<arrow_ffi::PySchema>()?;
    m.add_function(wrap_pyfunction!(table::create_table, m)?)?;
    m.add_function(wrap_pyfunction!(services::compact, m)?)?;
    m.add_function(wrap_pyfunction!(services::rollback, m)?)?;
    m.add_function(wrap_pyfunction!(services::alter_schema, m)?)?;
    m.add_function(wrap_pyfunction!(services::savepoint, m)?)?;
    m.add_function(wrap_pyfunction!(services::delete_savepoint, m)?)?;
    m.add_function(wrap_pyfunction!(services::outcome, m)?)?;
    m.add_function(wrap_pyfunction!(services::archive, m)?)?;
    m.add_function(wrap_pyfunction!(services::upgrade, m)?)?;
    m.add_function(wrap_pyfunction!(services::set_archival, m)?)?;
    m.add_function(wrap_pyfunction!(services::set_cleaning, m)?)?;
    m.add_function(wrap_pyfunction!(services::restore, m)?)?;
    m.add_function(wrap_pyfunction!(services::clean, m)?)?;
    m.add_function(wrap_pyfunction!(services::cluster, m)?)?;
    m.add_class::<services::PyProgress>()?;
    m.add_function(wrap_pyfunction!(testing::inject_faults, m)?)?;
    m.add_function(wrap_pyfunction!(testing::fault_counts, m)?)?;
    Ok(())
}
