//! What the layers below the services ask of them and of the metadata table (see
//! `table::extensions`): [`Hooks`] keeps the metadata table in step with every commit
//! ([`CommitHook`]), lists and prunes through it ([`FileIndex`], [`SlicePruner`]), finishes
//! interrupted restores and runs the inline table services ([`InlineServices`]).
//! [`default_options`] lends them to a table; the metadata table itself is opened without them.

use std::collections::BTreeSet;
use std::sync::Arc;

use futures::FutureExt;
use futures::future::BoxFuture;

use super::clean::InlineClean;
use super::{ArchiveConfig, CompactionConfig};
use crate::commit::change::Change;
use crate::commit::hook::CommitHook;
use crate::error::Result;
use crate::read::pruner::SlicePruner;
use crate::read::{Filter, PlannedSlice};
use crate::storage::FileInfo;
use crate::table::extensions::{Extensions, FileIndex};
use crate::table::{Table, TableOptions};
use crate::write::WriteConfig;
use crate::write::inline::InlineServices;

/// The metadata table and the table services, for the layers below.
#[derive(Clone, Copy, Debug, Default)]
pub struct Hooks;

/// The extensions every table oxlake opens for its users carries.
pub fn extensions() -> Extensions {
    Extensions::default()
        .with::<Arc<dyn CommitHook>>(Arc::new(Hooks))
        .with::<Arc<dyn FileIndex>>(Arc::new(Hooks))
        .with::<Arc<dyn SlicePruner>>(Arc::new(Hooks))
        .with::<Arc<dyn InlineServices>>(Arc::new(Hooks))
}

/// [`TableOptions::default`] with [`extensions`]: how users' tables are opened.
pub fn default_options() -> TableOptions {
    TableOptions { extensions: extensions(), ..TableOptions::default() }
}

impl CommitHook for Hooks {
    fn before_complete<'a>(&'a self, table: &'a Table, time: &'a str, change: Change<'a>) -> BoxFuture<'a, Result<()>> {
        crate::metadata::sync(table, time, change).boxed()
    }

    fn catch_up<'a>(&'a self, table: &'a mut Table) -> BoxFuture<'a, Result<()>> {
        crate::metadata::catch_up(table).boxed()
    }

    fn recover<'a>(&'a self, table: &'a mut Table) -> BoxFuture<'a, Result<()>> {
        super::restore::finish_interrupted(table).boxed()
    }
}

impl FileIndex for Hooks {
    fn files<'a>(&'a self, table: &'a Table) -> BoxFuture<'a, Option<Vec<FileInfo>>> {
        async move {
            let mdt = table.fresh_metadata_table().await?;
            listed(table, mdt.files().await)
        }
        .boxed()
    }

    fn files_in<'a>(
        &'a self,
        table: &'a Table,
        partitions: &'a BTreeSet<String>,
    ) -> BoxFuture<'a, Option<Vec<FileInfo>>> {
        async move {
            let mdt = table.fresh_metadata_table().await?;
            listed(table, mdt.files_in(partitions).await)
        }
        .boxed()
    }
}

/// The files the metadata table listed; `None` (storage is listed instead) when it is unreadable.
fn listed(table: &Table, files: Result<Vec<FileInfo>>) -> Option<Vec<FileInfo>> {
    files.map_err(|e| log::warn!("{}: metadata table unreadable, listing storage: {e}", table.uri())).ok()
}

impl SlicePruner for Hooks {
    fn prune<'a>(
        &'a self,
        table: &'a Table,
        slices: Vec<PlannedSlice>,
        filter: &'a Filter,
    ) -> BoxFuture<'a, Result<Vec<PlannedSlice>>> {
        table.prune_by_indexes(slices, filter).boxed()
    }
}

impl InlineServices for Hooks {
    fn clean<'a>(&'a self, table: &'a mut Table) -> BoxFuture<'a, ()> {
        clean_inline(table).boxed()
    }

    fn archive<'a>(&'a self, table: &'a mut Table) -> BoxFuture<'a, ()> {
        archive_inline(table).boxed()
    }

    fn compact<'a>(&'a self, table: &'a mut Table, config: &'a WriteConfig) -> BoxFuture<'a, ()> {
        compact_inline(table, config).boxed()
    }
}

/// Inline cleaning, as Apache Hudi's writers clean after a commit with `hoodie.clean.automatic`
/// (see `Table::set_cleaning`). The write has landed by then: a failed clean is logged, and the
/// next commit tries again (a clean that lost a race leaves nothing half done).
async fn clean_inline(table: &mut Table) {
    let clean = match InlineClean::of(table) {
        Ok(Some(clean)) => clean,
        Ok(None) => return,
        Err(e) => return log::warn!("inline clean skipped (the write landed): {e}"),
    };
    if !clean.is_due(table) {
        return;
    }
    match table.clean(clean.policy).await {
        Ok(r) if !r.deleted.is_empty() => log::info!("{}: inline clean deleted {} files", table.uri(), r.deleted.len()),
        Ok(_) => {}
        Err(e) => log::warn!("{}: inline clean failed (the write landed): {e}", table.uri()),
    }
}

/// Inline archival, as Apache Hudi archives after every commit (off with
/// `oxlake.archive.inline=false`, see `Table::set_archival`): once the active timeline holds
/// more commits than the table keeps (`hoodie.keep.max.commits`), the oldest are archived.
/// The write has landed by then: a failed archival is logged, and the next commit tries again.
async fn archive_inline(table: &mut Table) {
    if table.config().raw.get(super::archive::INLINE_KEY).is_some_and(|v| v.trim() == "false") {
        return;
    }
    let config = match ArchiveConfig::of(table) {
        Ok(c) => c,
        Err(e) => return log::warn!("archival skipped (the write landed): {e}"),
    };
    if table.timeline().completed_data().count() <= config.max_commits {
        return;
    }
    match table.archive(config).await {
        Ok(r) if !r.archived.is_empty() => log::info!("archived {} instants", r.archived.len()),
        Ok(_) => {}
        Err(e) => log::warn!("archival failed (the write landed): {e}"),
    }
}

/// Inline compaction: after a deltacommit, compacts when the table is configured to and enough
/// deltacommits landed since the last compaction. The write has landed by then, so a failed
/// compaction does not fail it: it is logged, and its plan (if scheduled) runs next time.
async fn compact_inline(table: &mut Table, config: &WriteConfig) {
    let Some(since) = table.compaction_due() else { return };
    let compaction = CompactionConfig { min_log_files: 1, write: config.clone(), progress: None };
    match table.compact(&compaction).await {
        Ok(r) => log::info!("inline compaction after {since} deltacommits: {:?}", r.instants),
        Err(e) => log::warn!("inline compaction after {since} deltacommits failed (the write landed): {e}"),
    }
}
