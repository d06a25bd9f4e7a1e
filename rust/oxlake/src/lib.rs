//! oxlake: native IO for Apache Hudi tables.
//!
//! The crate follows the format's own concepts, in layers: each module uses only those listed
//! before it (`make lint` checks it with `rust/tools/module_graph.py`).
//!
//! - [`error`]: the typed errors every layer returns.
//! - `failpoints`: crash and pause points at steps of writes and reads, for the tests.
//! - [`config`]: `hoodie.properties`, parsed and validated ([`config::TableConfig`]).
//! - [`schema`]: Arrow schemas, Hudi's meta fields, schema evolution.
//! - [`format`]: on-disk models, free of IO: instants, file names, commit metadata, the Avro
//!   records of plans and the archived timeline, log blocks, base-file writer properties.
//! - [`storage`]: object stores (local, S3, in memory, the fault store), Parquet reads.
//! - [`keys`]: record keys and partition paths of incoming rows.
//! - [`timeline`]: the active timeline and which instants' files are committed.
//! - [`table`]: an open table (configuration, timeline, file-system view), what pending services
//!   hold, its savepoints and archived timeline, and the extension points the layers above fill.
//! - [`log`]: Hudi log files: reading blocks, which are committed.
//! - [`read`]: scan planning, merge-on-read as DataFusion plans, incremental and change queries.
//! - [`commit`]: the commit protocol (claims, heartbeats, conflicts, fate, rollback) and its hook.
//! - [`metadata`]: oxlake's metadata table (files, column stats, bloom filters, record index),
//!   kept in step with every commit through the commit hook.
//! - [`write`]: inserts, upserts, deletes and overwrites on both table types.
//! - [`services`]: compaction, clustering, clean, archival, savepoints and restore, and
//!   [`services::hooks`], which lends the metadata table and the inline services to the layers
//!   below ([`services::default_options`]).
//!
//! ```no_run
//! # async fn demo() -> oxlake::Result<()> {
//! use oxlake::{ScanOptions, Table};
//! // With the metadata table kept in step and inline table services (see `table::extensions`).
//! let table = Table::open("/data/trips", oxlake::services::default_options()).await?;
//! let stream = table.scan(&ScanOptions::default()).await?;
//! # Ok(()) }
//! ```

#![warn(missing_docs)]

pub mod commit;
pub mod config;
pub mod error;
mod failpoints;
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

pub use commit::ReadState;
pub use config::{CreateOptions, MergeMode, TableType};
pub use error::{Error, Result};
pub use read::{Filter, Op, Predicate, QueryType, ScanOptions};
pub use table::{Table, TableOptions};
pub use write::{BulkSort, WriteConfig, WriteOperation, WriteResult};
