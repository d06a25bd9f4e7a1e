//! Table services a write runs inline once it landed (cleaning and archival after every commit,
//! compaction every few deltacommits), through the table's extensions (see `table::extensions`): the
//! services are built on writes. The write has landed by then: a service that fails is logged
//! and runs again after the next write.

use std::sync::Arc;

use futures::future::BoxFuture;

use super::WriteConfig;
use crate::table::Table;

/// The table services a write runs inline.
pub trait InlineServices: Send + Sync {
    /// After every commit of a write, before archival: cleans when the table is configured to
    /// and enough commits landed since the last clean.
    fn clean<'a>(&'a self, table: &'a mut Table) -> BoxFuture<'a, ()>;

    /// After every commit of a write: archives the timeline when it grew past what the table
    /// keeps.
    fn archive<'a>(&'a self, table: &'a mut Table) -> BoxFuture<'a, ()>;

    /// After a deltacommit: compacts when the table is configured to and enough deltacommits
    /// landed since the last compaction, writing with `config`.
    fn compact<'a>(&'a self, table: &'a mut Table, config: &'a WriteConfig) -> BoxFuture<'a, ()>;
}

fn services(table: &Table) -> Option<Arc<dyn InlineServices>> {
    table.extension::<Arc<dyn InlineServices>>()
}

/// [`InlineServices::clean`] of the table's services, if it has them.
pub(crate) async fn clean(table: &mut Table) {
    if let Some(s) = services(table) {
        s.clean(table).await;
    }
}

/// [`InlineServices::archive`] of the table's services, if it has them.
pub(crate) async fn archive(table: &mut Table) {
    if let Some(s) = services(table) {
        s.archive(table).await;
    }
}

/// [`InlineServices::compact`] of the table's services, if it has them.
pub(crate) async fn compact(table: &mut Table, config: &WriteConfig) {
    if let Some(s) = services(table) {
        s.compact(table, config).await;
    }
}
