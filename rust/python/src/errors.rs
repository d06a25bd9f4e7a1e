//! The Python exception hierarchy: `OxlakeError` and one subclass per kind of `oxlake::Error`.

use pyo3::create_exception;
use pyo3::exceptions::PyException;
use pyo3::prelude::*;

create_exception!(oxlake, OxlakeError, PyException, "Base class of every oxlake error.");
create_exception!(oxlake, TableNotFoundError, OxlakeError, "No table at the given URI.");
create_exception!(oxlake, TableExistsError, OxlakeError, "A table already exists at the given URI.");
create_exception!(oxlake, SchemaMismatchError, OxlakeError, "The data does not match the table schema.");
create_exception!(
    oxlake,
    InvalidDataError,
    OxlakeError,
    "The data breaks a rule of the table (null key, missing column)."
);
create_exception!(oxlake, InvalidArgumentError, OxlakeError, "An argument is not valid (bad filter, unknown option).");
create_exception!(oxlake, CommitConflictError, OxlakeError, "Another writer changed the same file groups.");
create_exception!(
    oxlake,
    CommitUnknownError,
    OxlakeError,
    "A write could not confirm whether it committed: ask `Table.outcome(e.instant)` before retrying."
);
create_exception!(oxlake, CorruptTableError, OxlakeError, "A table file could not be understood.");
create_exception!(oxlake, UnsupportedError, OxlakeError, "The table uses a feature oxlake does not implement.");
create_exception!(oxlake, StorageError, OxlakeError, "The object store failed.");

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add("OxlakeError", py.get_type::<OxlakeError>())?;
    m.add("TableNotFoundError", py.get_type::<TableNotFoundError>())?;
    m.add("TableExistsError", py.get_type::<TableExistsError>())?;
    m.add("SchemaMismatchError", py.get_type::<SchemaMismatchError>())?;
    m.add("InvalidDataError", py.get_type::<InvalidDataError>())?;
    m.add("InvalidArgumentError", py.get_type::<InvalidArgumentError>())?;
    m.add("CommitConflictError", py.get_type::<CommitConflictError>())?;
    m.add("CommitUnknownError", py.get_type::<CommitUnknownError>())?;
    m.add("CorruptTableError", py.get_type::<CorruptTableError>())?;
    m.add("UnsupportedError", py.get_type::<UnsupportedError>())?;
    m.add("StorageError", py.get_type::<StorageError>())?;
    Ok(())
}

/// The name of the Python exception class of an oxlake error (of the one a query's error
/// carries: `Error::root`).
pub fn class_name(e: &oxlake::Error) -> &'static str {
    use oxlake::Error as E;
    match e.root() {
        E::TableNotFound { .. } => "TableNotFoundError",
        E::TableExists { .. } => "TableExistsError",
        E::SchemaMismatch { .. } => "SchemaMismatchError",
        E::InvalidData { .. } => "InvalidDataError",
        E::InvalidArgument { .. } => "InvalidArgumentError",
        E::CommitConflict { .. } => "CommitConflictError",
        E::CommitUnknown { .. } => "CommitUnknownError",
        E::CorruptTable { .. } | E::Parquet(_) => "CorruptTableError",
        E::Unsupported { .. } => "UnsupportedError",
        E::Storage { .. } => "StorageError",
        E::Arrow(_) | E::DataFusion(_) => "OxlakeError",
    }
}

/// The message of an error crossing the Arrow C stream interface, which carries text only:
/// `[oxlake.<class>] <message>`. `oxlake.table` raises the class again from the tag; other
/// consumers (pandas, Polars, DuckDB) show it in their own error.
pub fn tagged(e: &oxlake::Error) -> String {
    format!("[oxlake.{}] {}", class_name(e), e.root())
}

/// Maps an oxlake error (the one a query's error carries: `Error::root`) to its Python exception.
pub fn to_py(e: oxlake::Error) -> PyErr {
    use oxlake::Error as E;
    let e = e.root();
    let msg = e.to_string();
    match e {
        E::TableNotFound { .. } => TableNotFoundError::new_err(msg),
        E::TableExists { .. } => TableExistsError::new_err(msg),
        E::SchemaMismatch { .. } => SchemaMismatchError::new_err(msg),
        E::InvalidData { .. } => InvalidDataError::new_err(msg),
        E::InvalidArgument { .. } => InvalidArgumentError::new_err(msg),
        E::CommitConflict { instant, .. } => {
            let err = CommitConflictError::new_err(msg);
            // The instant that won, for callers that retry or report.
            Python::attach(|py| {
                if let Err(e) = err.value(py).setattr("instant", instant.as_str()) {
                    e.print(py);
                }
            });
            err
        }
        E::CommitUnknown { instant, .. } => {
            let err = CommitUnknownError::new_err(msg);
            // The instant to ask `Table.outcome` about.
            Python::attach(|py| {
                if let Err(e) = err.value(py).setattr("instant", instant.as_str()) {
                    e.print(py);
                }
            });
            err
        }
        E::CorruptTable { .. } | E::Parquet(_) => CorruptTableError::new_err(msg),
        E::Unsupported { .. } => UnsupportedError::new_err(msg),
        E::Storage { .. } => StorageError::new_err(msg),
        E::Arrow(_) | E::DataFusion(_) => OxlakeError::new_err(msg),
    }
}
