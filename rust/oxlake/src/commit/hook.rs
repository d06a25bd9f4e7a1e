//! The commit hook: what the commit protocol asks of the layers built on it (see
//! `table::extensions`). The metadata table records every change before the data instant
//! completes, and catches up when a writer begins; a restore left half done is finished before
//! anything else changes the table. Tables opened without a hook (the metadata table itself)
//! skip these steps.

use std::sync::Arc;

use futures::future::BoxFuture;

use super::change::Change;
use crate::error::Result;
use crate::table::Table;

/// Called by the commit protocol at each completion and recovery.
pub trait CommitHook: Send + Sync {
    /// Before `time` completes on `table` (a commit of any action, a rollback): records what it
    /// changed. An error fails the commit, which is then rolled back.
    fn before_complete<'a>(&'a self, table: &'a Table, time: &'a str, change: Change<'a>) -> BoxFuture<'a, Result<()>>;

    /// When a writer begins (after failed writes were rolled back) and after a rollback of a
    /// completed instant: brings what is derived from the timeline up to it.
    fn catch_up<'a>(&'a self, table: &'a mut Table) -> BoxFuture<'a, Result<()>>;

    /// First thing in recovery: finishes what a process left half done above the commit
    /// protocol (an interrupted restore).
    fn recover<'a>(&'a self, table: &'a mut Table) -> BoxFuture<'a, Result<()>>;
}

fn hook(table: &Table) -> Option<Arc<dyn CommitHook>> {
    table.extension::<Arc<dyn CommitHook>>()
}

/// [`CommitHook::before_complete`] of the table's hook, if it has one.
pub(crate) async fn before_complete(table: &Table, time: &str, change: Change<'_>) -> Result<()> {
    match hook(table) {
        Some(h) => h.before_complete(table, time, change).await,
        None => Ok(()),
    }
}

/// [`CommitHook::catch_up`] of the table's hook, if it has one.
pub(crate) async fn catch_up(table: &mut Table) -> Result<()> {
    match hook(table) {
        Some(h) => h.catch_up(table).await,
        None => Ok(()),
    }
}

/// [`CommitHook::recover`] of the table's hook, if it has one.
pub(crate) async fn recover(table: &mut Table) -> Result<()> {
    match hook(table) {
        Some(h) => h.recover(table).await,
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    //! The commit protocol against a recording hook, and against one that refuses: no metadata
    //! table involved.

    use std::sync::Mutex;

    use futures::FutureExt;

    use super::*;
    use crate::commit::change::KeySource;
    use crate::config::TableType;
    use crate::error::Error;
    use crate::format::instant::Action;
    use crate::table::TableOptions;
    use crate::table::extensions::Extensions;
    use crate::test_support::{by_parity, id_city_table};
    use crate::write::{WriteConfig, WriteOperation};

    /// Records every call, with whether the instant's completed file existed then; refuses the
    /// completion of writes (not of rollbacks) when `refuse` is set.
    #[derive(Default)]
    struct Recording {
        calls: Mutex<Vec<String>>,
        refuse: bool,
    }

    impl Recording {
        fn calls(&self) -> Vec<String> {
            self.calls.lock().unwrap().clone()
        }
    }

    impl CommitHook for Recording {
        fn before_complete<'a>(
            &'a self,
            table: &'a Table,
            time: &'a str,
            change: Change<'a>,
        ) -> BoxFuture<'a, Result<()>> {
            async move {
                let listing = table.storage().list_dir(".hoodie").await?;
                let completed = listing.iter().any(|f| {
                    let name = f.path.rsplit('/').next().unwrap_or_default();
                    name.starts_with(time) && [".commit", ".rollback", ".clean"].iter().any(|s| name.ends_with(s))
                });
                let keys = match &change.keys {
                    KeySource::Unchanged => "unchanged".to_string(),
                    KeySource::Reported(k) => format!("reported {}", k.written.len()),
                    KeySource::Replaced(g) => format!("replaced {}", g.len()),
                    KeySource::RolledBack { target, was_completed } => format!("rolled back {target} {was_completed}"),
                };
                let call = format!(
                    "complete {time}: +{} -{} {keys}{}",
                    change.added.len(),
                    change.deleted.len(),
                    if completed { " (already completed!)" } else { "" }
                );
                self.calls.lock().unwrap().push(call);
                if self.refuse && matches!(change.keys, KeySource::Reported(_)) {
                    return Err(Error::invalid_data("the hook refuses"));
                }
                Ok(())
            }
            .boxed()
        }

        fn catch_up<'a>(&'a self, _table: &'a mut Table) -> BoxFuture<'a, Result<()>> {
            self.calls.lock().unwrap().push("catch up".into());
            async { Ok(()) }.boxed()
        }

        fn recover<'a>(&'a self, _table: &'a mut Table) -> BoxFuture<'a, Result<()>> {
            self.calls.lock().unwrap().push("recover".into());
            async { Ok(()) }.boxed()
        }
    }

    async fn table(dir: &std::path::Path, hook: Arc<Recording>) -> Table {
        let extensions = Extensions::default().with::<Arc<dyn CommitHook>>(hook);
        id_city_table(dir, TableType::CopyOnWrite, TableOptions { extensions, ..TableOptions::default() }).await
    }

    fn parquet_files(dir: &std::path::Path) -> usize {
        let mut n = 0;
        for partition in ["city=a", "city=b"] {
            let Ok(entries) = std::fs::read_dir(dir.join("t").join(partition)) else { continue };
            n += entries.filter(|e| e.as_ref().unwrap().file_name().to_string_lossy().ends_with(".parquet")).count();
        }
        n
    }

    #[tokio::test]
    async fn a_commit_tells_the_hook_what_it_wrote_before_it_completes() {
        let dir = tempfile::tempdir().unwrap();
        let hook = Arc::new(Recording::default());
        let mut t = table(dir.path(), hook.clone()).await;
        let result =
            t.write(WriteOperation::Insert, vec![by_parity(&[1, 2, 3])], &WriteConfig::default()).await.unwrap();
        let time = result.instant.unwrap();
        // Catch-up as the writer begins; the completion with the two files (one per partition)
        // and the keys of each, while the instant was still pending.
        assert_eq!(hook.calls(), vec!["catch up".to_string(), format!("complete {time}: +2 -0 reported 2")]);
        assert!(t.timeline().get(&time).is_some_and(|i| i.is_completed()));
    }

    #[tokio::test]
    async fn a_hook_that_refuses_fails_the_commit_and_the_write_is_rolled_back() {
        let dir = tempfile::tempdir().unwrap();
        let hook = Arc::new(Recording { refuse: true, ..Recording::default() });
        let mut t = table(dir.path(), hook.clone()).await;
        let err = t.write(WriteOperation::Insert, vec![by_parity(&[1, 2])], &WriteConfig::default()).await.unwrap_err();
        assert!(matches!(err, Error::InvalidData { .. }), "{err}");
        t.reload().await.unwrap();
        // Nothing completed, nothing pending; the files are gone; a rollback records it, and told
        // the hook which instant it took back.
        assert_eq!(t.timeline().completed_data().count(), 0);
        assert_eq!(t.timeline().pending().count(), 0);
        assert_eq!(parquet_files(dir.path()), 0);
        let rollback = t.timeline().instants().iter().find(|i| i.action == Action::Rollback).unwrap().time.clone();
        let calls = hook.calls();
        let refused = calls[1].strip_prefix("complete ").unwrap().split(':').next().unwrap().to_string();
        assert_eq!(calls[2], format!("complete {rollback}: +0 -2 rolled back {refused} false"));
        assert_eq!(calls.len(), 3, "{calls:?}");
    }

    #[tokio::test]
    async fn a_rollback_of_a_completed_commit_tells_the_hook_then_catches_up() {
        let dir = tempfile::tempdir().unwrap();
        let hook = Arc::new(Recording::default());
        let mut t = table(dir.path(), hook.clone()).await;
        t.write(WriteOperation::Insert, vec![by_parity(&[1, 2])], &WriteConfig::default()).await.unwrap();
        let second = t.write(WriteOperation::Upsert, vec![by_parity(&[1])], &WriteConfig::default()).await.unwrap();
        let second = second.instant.unwrap();
        let before = hook.calls().len();
        let rollback = crate::commit::rollback_completed(&mut t, &second).await.unwrap();
        let calls = hook.calls()[before..].to_vec();
        assert_eq!(
            calls,
            vec![format!("complete {rollback}: +0 -1 rolled back {second} true"), "catch up".to_string()]
        );
        assert_eq!(parquet_files(dir.path()), 2, "the first commit's files stay");
    }

    #[tokio::test]
    async fn a_clean_tells_the_hook_what_it_deleted() {
        let dir = tempfile::tempdir().unwrap();
        let hook = Arc::new(Recording::default());
        let mut t = table(dir.path(), hook.clone()).await;
        for _ in 0..3 {
            t.write(WriteOperation::Upsert, vec![by_parity(&[1])], &WriteConfig::default()).await.unwrap();
        }
        let before = hook.calls().len();
        let cleaned = t.clean(crate::services::CleanPolicy::KeepLatestFileVersions(1)).await.unwrap();
        let calls = hook.calls()[before..].to_vec();
        let clean = calls.iter().find(|c| c.ends_with("unchanged")).unwrap();
        assert!(clean.contains(&format!("-{} unchanged", cleaned.deleted.len())), "{calls:?}");
        assert_eq!(cleaned.deleted.len(), 2);
        assert_eq!(parquet_files(dir.path()), 1);
    }

    #[tokio::test]
    async fn a_table_without_a_hook_commits_all_the_same() {
        let dir = tempfile::tempdir().unwrap();
        let hook = Arc::new(Recording::default());
        let t = table(dir.path(), hook.clone()).await;
        let mut bare = Table::open(t.uri(), t.options().bare()).await.unwrap();
        bare.write(WriteOperation::Insert, vec![by_parity(&[1])], &WriteConfig::default()).await.unwrap();
        assert!(hook.calls().is_empty());
        assert_eq!(bare.timeline().completed_data().count(), 1);
    }
}
