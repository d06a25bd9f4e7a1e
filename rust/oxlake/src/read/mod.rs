//! Reads: plan the file slices of a query, then execute them through DataFusion.
//!
//! [`Table::plan_scan`] turns a query (snapshot as of an instant, or the changes in `(start, end]`)
//! into the base files to read; [`provider::HudiTableProvider`] turns those into a DataFusion scan
//! with partition pruning, projection and Parquet row-group pruning; [`Table::scan`] adds the
//! user's filter and column selection and returns a stream of record batches.

pub mod filter;
pub mod provider;

use std::collections::HashSet;
use std::sync::Arc;

use datafusion::execution::SendableRecordBatchStream;
use datafusion::execution::context::SessionContext;
use datafusion::prelude::SessionConfig;

use crate::error::{Error, Result};
use crate::format::instant::normalize_time;
use crate::table::Table;
use crate::table::fs_view::FileGroupId;
pub use filter::{Filter, Op, Predicate};
pub use provider::HudiTableProvider;

/// Which rows a scan returns.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum QueryType {
    /// The table as of an instant (the latest by default).
    #[default]
    Snapshot,
    /// Records written by the commits in `(start, end]`, in their latest state within the window.
    Incremental,
}

impl QueryType {
    pub fn parse(s: &str) -> Result<Self> {
        match s {
            "snapshot" => Ok(QueryType::Snapshot),
            "incremental" => Ok(QueryType::Incremental),
            other => Err(Error::invalid_arg("query", format!("`{other}` (expected snapshot or incremental)"))),
        }
    }
}

/// What to read.
#[derive(Clone, Debug, Default)]
pub struct ScanOptions {
    /// Columns to return, in this order (all by default).
    pub columns: Option<Vec<String>>,
    pub filter: Option<Filter>,
    /// Snapshot as of this instant time (time travel).
    pub as_of: Option<String>,
    pub query: QueryType,
    /// Incremental window start (exclusive); the beginning of time by default.
    pub start: Option<String>,
    /// Incremental window end (inclusive); the latest commit by default.
    pub end: Option<String>,
    /// Rows per batch (DataFusion's default when `None`).
    pub batch_size: Option<usize>,
}

/// A base file selected by planning.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PlannedFile {
    pub partition: String,
    pub path: String,
    pub size: u64,
}

/// The files of a query and the commit-time window their rows must fall in.
#[derive(Clone, Debug, Default)]
pub struct ScanPlan {
    pub files: Vec<PlannedFile>,
    /// `(start, end]` on `_hoodie_commit_time` (incremental queries).
    pub commit_range: Option<(String, String)>,
}

impl Table {
    /// Chooses the base files a query reads; no data file is opened.
    pub async fn plan_scan(&self, opts: &ScanOptions) -> Result<ScanPlan> {
        let timeline = self.timeline();
        let Some(latest) = timeline.latest_completed_data().map(|i| i.time.clone()) else {
            return Ok(ScanPlan::default());
        };
        match opts.query {
            QueryType::Snapshot => {
                if opts.start.is_some() || opts.end.is_some() {
                    return Err(Error::invalid_arg("start", "start and end go with query=\"incremental\""));
                }
                let as_of = match &opts.as_of {
                    Some(t) => normalize_time(t)?,
                    None => latest,
                };
                let view = self.file_system_view().await?;
                let replaced = self.replaced_file_groups(&as_of).await?;
                let files = view
                    .slices_as_of(&as_of, &replaced)
                    .filter_map(|(g, s)| planned(g.partition.as_str(), s))
                    .collect();
                Ok(ScanPlan { files, commit_range: None })
            }
            QueryType::Incremental => {
                if opts.as_of.is_some() {
                    return Err(Error::invalid_arg("as_of", "as_of goes with query=\"snapshot\""));
                }
                let start = opts.start.as_deref().map(normalize_time).transpose()?.unwrap_or_else(|| "0".repeat(17));
                let end = opts.end.as_deref().map(normalize_time).transpose()?.unwrap_or(latest);
                if end < start {
                    return Err(Error::invalid_arg("end", format!("{end} is before start {start}")));
                }
                let mut touched: HashSet<FileGroupId> = HashSet::new();
                let in_window: Vec<_> =
                    timeline.completed_data().filter(|i| i.time > start && i.time <= end).cloned().collect();
                for instant in &in_window {
                    let meta = timeline.commit_metadata(self.storage(), instant).await?;
                    touched.extend(meta.write_stats().map(|(p, s)| (p.to_string(), s.file_id.clone())));
                }
                let view = self.file_system_view().await?;
                let replaced = self.replaced_file_groups(&end).await?;
                let files = touched
                    .iter()
                    .filter(|id| !replaced.contains(*id))
                    .filter_map(|id| view.get(id))
                    .filter_map(|g| g.slice_as_of(&end).and_then(|s| planned(&g.partition, s)))
                    .collect();
                Ok(ScanPlan { files, commit_range: Some((start, end)) })
            }
        }
    }

    /// A DataFusion table provider of a query, for use in any `SessionContext`.
    pub async fn provider(&self, opts: &ScanOptions) -> Result<HudiTableProvider> {
        let plan = self.plan_scan(opts).await?;
        HudiTableProvider::try_new(self, plan)
    }

    /// Runs a query and streams its record batches.
    pub async fn scan(&self, opts: &ScanOptions) -> Result<SendableRecordBatchStream> {
        let provider = Arc::new(self.provider(opts).await?);
        let ctx = session(self, opts.batch_size);
        let mut df = ctx.read_table(provider)?;
        if let Some(f) = &opts.filter {
            let expr = f.to_expr(&df).map_err(|e| Error::invalid_arg("filter", e))?;
            df = df.filter(expr).map_err(|e| Error::invalid_arg("filter", e))?;
        }
        if let Some(cols) = &opts.columns {
            let names: Vec<&str> = cols.iter().map(String::as_str).collect();
            df = df.select_columns(&names).map_err(|e| Error::invalid_arg("columns", e))?;
        }
        Ok(df.execute_stream().await?)
    }
}

fn planned(partition: &str, slice: &crate::table::fs_view::FileSlice) -> Option<PlannedFile> {
    slice.base.as_ref().map(|b| PlannedFile { partition: partition.to_string(), path: b.path.clone(), size: b.size })
}

/// A session that knows the table's store and returns plain (not view) string types.
pub fn session(table: &Table, batch_size: Option<usize>) -> SessionContext {
    let mut config =
        SessionConfig::new().with_target_partitions(std::thread::available_parallelism().map_or(2, |n| n.get()));
    if let Some(n) = batch_size {
        config = config.with_batch_size(n.max(1));
    }
    let options = config.options_mut();
    options.execution.parquet.schema_force_view_types = false;
    options.execution.parquet.pushdown_filters = true;
    options.execution.parquet.reorder_filters = true;
    // Column names are case-sensitive in Hudi tables (`byteField`): no SQL identifier folding.
    options.sql_parser.enable_ident_normalization = false;
    let ctx = SessionContext::new_with_config(config);
    ctx.register_object_store(table.storage().store_url(), table.storage().object_store());
    ctx
}
