//! Pruning by indexes: what a scan asks of the layers that keep file-level indexes (the
//! metadata table's `column_stats` and `bloom_filters`), through the table's extensions (see
//! `table::extensions`). Without one, a scan reads every planned slice.

use std::sync::Arc;

use futures::future::BoxFuture;

use super::{Filter, PlannedSlice};
use crate::error::Result;
use crate::table::Table;

/// Drops the planned slices an index shows cannot hold a row passing a filter.
pub trait SlicePruner: Send + Sync {
    /// `slices` less those that cannot hold a row passing `filter` (all of them when no index
    /// can tell).
    fn prune<'a>(
        &'a self,
        table: &'a Table,
        slices: Vec<PlannedSlice>,
        filter: &'a Filter,
    ) -> BoxFuture<'a, Result<Vec<PlannedSlice>>>;
}

/// [`SlicePruner::prune`] of the table's pruner, if it has one.
pub(crate) async fn prune(table: &Table, slices: Vec<PlannedSlice>, filter: &Filter) -> Result<Vec<PlannedSlice>> {
    match table.extension::<Arc<dyn SlicePruner>>() {
        Some(p) => p.prune(table, slices, filter).await,
        None => Ok(slices),
    }
}
