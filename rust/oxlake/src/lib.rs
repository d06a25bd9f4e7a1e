//! oxlake: native IO for Apache Hudi tables.
//!
//! The crate follows the format's own concepts: [`storage`] (object stores), [`format`] (on-disk
//! models), [`timeline`], [`table`] (configuration and the file-system view), [`write`]
//! (copy-on-write writers), [`commit`] (the commit protocol and rollback) and [`read`] (scan
//! planning and DataFusion execution).
//!
//! ```no_run
//! # async fn demo() -> oxlake::Result<()> {
//! use oxlake::{ScanOptions, Table, TableOptions};
//! let table = Table::open("/data/trips", TableOptions::default()).await?;
//! let stream = table.scan(&ScanOptions::default()).await?;
//! # Ok(()) }
//! ```

pub mod commit;
pub mod config;
pub mod error;
pub mod format;
pub mod keys;
pub mod log;
pub mod metadata;
pub mod read;
pub mod schema;
pub mod services;
pub mod storage;
pub mod table;
pub mod timeline;
pub mod write;

#[cfg(test)]
mod test_support;

pub use config::{CreateOptions, MergeMode, TableType};
pub use error::{Error, Result};
pub use read::{Filter, Op, Predicate, QueryType, ScanOptions};
pub use table::{Table, TableOptions};
pub use write::{WriteConfig, WriteOperation, WriteResult};
