//! A write beside a rollback or restore of a commit it read.
//!
//! A copy-on-write write rewrites each file group it touches from the slice it read. Had it read a
//! commit that a rollback or restore then undoes, its new base file carries that commit's rows on:
//! once it completes, the undone rows are back. So the two sides look at each other:
//! - the write, at its conflict check (after publishing its intent), fails when a rollback or
//!   restore that had not finished when it began names a commit it saw ([`undoing_seen`]);
//! - the rollback or restore, once its instant is on the timeline and before it undoes anything,
//!   waits for the earlier writes that published their intent and are still pending
//!   ([`let_committing_writes_finish`]). Such a write either checked before the rollback's
//!   instant appeared, and completes (the rollback then finds its target no longer the latest,
//!   the restore a commit its plan lacks), or checks after, sees it, and fails.

use std::collections::HashSet;

use crate::error::Result;
use crate::format::instant::{Action, Instant, State};
use crate::format::rollback::{RestoreMetadata, RestorePlan, RollbackMetadata, RollbackPlan};
use crate::table::Table;

use super::HeartbeatWatch;

/// The rollbacks and restores completed on `table`'s timeline: a write beginning now counts
/// only the others (a rollback finished before it began undid nothing it read, even when its
/// target's time completed again since, as a compaction run again does).
pub(super) fn finished_undoers(table: &Table) -> HashSet<String> {
    undoers(table).filter(|i| i.is_completed()).map(|i| i.time.clone()).collect()
}

/// The first rollback or restore on the timeline (but those in `finished`) that undoes a commit
/// of `seen`: pending, or completed with that commit gone from the timeline. Returns the undoer's
/// time and the commit's.
pub(super) async fn undoing_seen(
    table: &Table,
    seen: &HashSet<String>,
    finished: &HashSet<String>,
) -> Result<Option<(String, String)>> {
    let timeline = table.timeline();
    for undoer in undoers(table).filter(|i| !finished.contains(&i.time)) {
        for target in targets(table, undoer).await? {
            if !seen.contains(&target) {
                continue;
            }
            let still_completed = timeline.completed_data().any(|i| i.time == target);
            if !undoer.is_completed() || !still_completed {
                return Ok(Some((undoer.time.clone(), target)));
            }
        }
    }
    Ok(None)
}

fn undoers(table: &Table) -> impl Iterator<Item = &Instant> {
    table.timeline().instants().iter().filter(|i| matches!(i.action, Action::Rollback | Action::Restore))
}

/// The commits a rollback or restore undoes, from its plan (or, with the plan gone, from what it
/// recorded on completing). A damaged plan names none: the rollback of such a plan is dropped and
/// its target rolled back as a failed write (`rollback_failed`).
async fn targets(table: &Table, undoer: &Instant) -> Result<Vec<String>> {
    let timeline = table.timeline();
    let storage = table.storage();
    let plan_path = timeline.path_of(&undoer.with_state(State::Requested));
    if let Some(bytes) = storage.get_opt(&plan_path).await?.filter(|b| !b.is_empty()) {
        let planned = match undoer.action {
            Action::Rollback => RollbackPlan::read(&plan_path, &bytes).map(|p| vec![p.instant_to_rollback.commit_time]),
            _ => RestorePlan::read(&plan_path, &bytes)
                .map(|p| p.instants_to_rollback.into_iter().map(|i| i.commit_time).collect()),
        };
        if let Ok(times) = planned {
            return Ok(times);
        }
    }
    if !undoer.is_completed() {
        return Ok(Vec::new());
    }
    let path = timeline.path_of(undoer);
    let Some(bytes) = storage.get_opt(&path).await? else { return Ok(Vec::new()) };
    Ok(match undoer.action {
        Action::Rollback => RollbackMetadata::read(&path, &bytes).map(|m| m.commits_rollback).unwrap_or_default(),
        _ => RestoreMetadata::read(&path, &bytes).map(|m| m.instants_to_rollback).unwrap_or_default(),
    })
}

/// Waits, for the rollback or restore at `own` (its instant on the timeline, beating), until no
/// earlier write that published its intent is pending with its writer alive; `table` is
/// reloaded on return.
pub(crate) async fn let_committing_writes_finish(table: &mut Table, own: &str) -> Result<()> {
    let mut watch = HeartbeatWatch::default();
    loop {
        table.reload().await?;
        let Some(write) = super::conflicts::committing_before(table, own).await? else { return Ok(()) };
        log::debug!("{own}: waiting for the write {} completing beside it", write.time);
        watch.check(table, &write, &format!("{} {own}", Action::Rollback)).await?;
        super::conflicts::pause().await;
    }
}
