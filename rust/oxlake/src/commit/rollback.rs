//! Rollbacks: of failed writes (recovery), of completed instants (deliberate), and what they
//! undo.

use std::collections::HashSet;

use bytes::Bytes;

use super::claims::claim;
use super::heartbeat::{beating, heartbeat_path, is_expired, spawn_heartbeat};
use super::{change, conflicts, fate, hook, step_failpoint};
use crate::error::{Error, Result};
use crate::format::commit::CommitMetadata;
use crate::format::file_name::{self, BaseFileName, LogFileName};
use crate::format::instant::{self, Action, Instant, State};
use crate::format::rollback::{
    self, InstantInfo, RollbackMetadata, RollbackPartitionMetadata, RollbackPlan, RollbackRequest,
};
use crate::storage::{FileInfo, Storage};
use crate::table::Table;
use crate::timeline::Timeline;

/// Rolls back every pending data instant whose writer is gone, and finishes interrupted rollbacks.
/// Returns the instants rolled back. Every change of a table starts here, so this is also where
/// tables oxlake cannot change are refused, and Apache Hudi's metadata table is retired (see
/// `Table::retire_apache_hudi_metadata_table`).
pub async fn rollback_failed(table: &mut Table) -> Result<Vec<String>> {
    Ok(settle_failed(table, false).await?.into_iter().map(|(time, _)| time).collect())
}

/// [`rollback_failed`], returning only the pending writes whose writer was gone and that it
/// rolled back (not the targets of interrupted rollbacks it finished, which may have completed
/// before): writes that no reader ever saw anything of.
pub(crate) async fn rollback_failed_writes(table: &mut Table) -> Result<Vec<String>> {
    Ok(settle_failed(table, false)
        .await?
        .into_iter()
        .filter(|(_, failed_write)| *failed_write)
        .map(|(t, _)| t)
        .collect())
}

/// [`rollback_failed`], and completes the pending writes whose writers decided to commit them
/// (their fate), alive or not: the completion is the same whoever creates it
/// (`fate::roll_forward`). For a streaming sink asking which batch the table holds: a driver
/// killed after that decision committed its batch, and its heartbeat has not expired yet when
/// the query restarts; the batch must be seen, not written again.
pub async fn rollback_failed_completing_decided(table: &mut Table) -> Result<Vec<String>> {
    Ok(settle_failed(table, true).await?.into_iter().map(|(time, _)| time).collect())
}

/// The instants rolled back, each with whether it was a pending write whose writer was gone
/// (`false`: the target of an interrupted rollback, finished here).
async fn settle_failed(table: &mut Table, complete_decided_writes: bool) -> Result<Vec<(String, bool)>> {
    table.check_changeable()?;
    table.retire_apache_hudi_metadata_table().await?;
    let mut done = Vec::new();
    for left in table.timeline().leftovers().to_vec() {
        if is_expired(table, &left).await? {
            table.storage().delete(&table.timeline().path_of(&left)).await?;
            table.storage().delete(&heartbeat_path(&left.time)).await?;
            log::info!(
                "{}: removed the inflight file of {} {}, left without its plan by a process that died",
                table.uri(),
                left.action,
                left.time
            );
        }
    }
    if table.timeline().pending().any(|i| i.action == Action::Restore) {
        hook::recover(table).await?;
    }
    // Interrupted rollbacks first: they name their target.
    let pending_rollbacks: Vec<Instant> =
        table.timeline().pending().filter(|i| i.action == Action::Rollback).cloned().collect();
    // A rollback whose process is alive is left to it, and so is its target.
    let mut taken = HashSet::new();
    for r in pending_rollbacks {
        let path = table.timeline().path_of(&r.with_state(State::Requested));
        // A plan that does not parse (a damaged file) is dropped: its target, still pending, is
        // rolled back below like any failed write.
        let plan = table.storage().get_opt(&path).await?.and_then(|b| RollbackPlan::read(&path, &b).ok());
        match plan {
            Some(plan) if !is_expired(table, &r).await? => {
                taken.insert(plan.instant_to_rollback.commit_time);
                continue;
            }
            Some(plan) => {
                let target = plan.instant_to_rollback.commit_time;
                let action = Action::parse(&plan.instant_to_rollback.action)
                    .ok_or_else(|| Error::corrupt(&path, "the rollback plan names an unknown action"))?;
                let how =
                    if plan.oxlake_was_completed { Undo::Deliberate { was_completed: true } } else { Undo::Failed };
                if rollback(table, &Instant::new(target.clone(), action, State::Inflight), Some(r), how).await? {
                    done.push((target, false));
                }
            }
            None => table.timeline().remove_pending(table.storage(), &r).await?,
        }
        table.reload().await?;
    }
    let failed: Vec<Instant> = table
        .timeline()
        .pending()
        // A compaction that never started keeps its plan; one that started is undone and rerun.
        // A metadata table build that never completed is dropped (the next writer builds again).
        .filter(|i| {
            i.action.writes_data()
                || i.action == Action::Indexing
                || (i.action == Action::Compaction && i.state == State::Inflight)
        })
        .cloned()
        .collect();
    for instant in failed {
        if taken.contains(&instant.time) {
            continue;
        }
        if is_expired(table, &instant).await? {
            if rollback(table, &instant, None, Undo::Failed).await? {
                done.push((instant.time.clone(), true));
            }
            table.reload().await?;
        } else if complete_decided_writes && complete_decided(table, &instant).await? {
            table.reload().await?;
        }
    }
    Ok(done)
}

/// Completes `instant`, pending, when its writer recorded the decision to commit it (its fate):
/// from then on it is committed, and its writer, alive or not, only creates the completed file,
/// which the first to come creates (`fate::roll_forward`). `true` when it was decided so.
async fn complete_decided(table: &Table, instant: &Instant) -> Result<bool> {
    if !instant.action.writes_data() {
        return Ok(false);
    }
    let epoch = fate::current_epoch(table, &instant.time).await?;
    match fate::recorded(table.storage(), &instant.time, epoch).await? {
        Some(fate::Fate::Committed { action, metadata, completion }) => {
            fate::roll_forward(table, instant, epoch, action, metadata, completion).await?;
            Ok(true)
        }
        _ => Ok(false),
    }
}

/// Rolls back the latest completed data instant (a commit, deltacommit, replacecommit or
/// compaction); returns the rollback instant. The completed file goes first, so readers stop seeing
/// the instant before any of its files disappear; a crash after that is finished by the next writer
/// like any interrupted rollback. A rolled-back compaction keeps its plan, to run again.
pub async fn rollback_completed(table: &mut Table, time: &str) -> Result<String> {
    table.reload().await?;
    rollback_failed(table).await?;
    let time = instant::normalize_time(time)?;
    // The table goes back to the previous data instant: a clean must not have removed its files.
    let data: Vec<String> = table.timeline().completed_data().rev().take(2).map(|i| i.time.clone()).collect();
    if let [latest, previous] = data.as_slice()
        && *latest == time
    {
        let view = table.file_system_view().await?;
        let replaced = table.replaced_file_groups(previous).await?;
        table.check_not_cleaned("instant", previous, &view, &replaced).await?;
    }
    // The first commit of the active timeline, with older ones archived: rolling it back would
    // leave no commit to start the timeline, and the archived commits' files would read as
    // uncommitted.
    let first = table.timeline().completed_data().next().map(|i| i.time.clone());
    if first.as_deref() == Some(time.as_str()) && !crate::table::history::archive_files(table).await?.is_empty() {
        return Err(Error::invalid_arg(
            "instant",
            format!(
                "{time} is the oldest commit on the active timeline and older ones are archived; restore a savepoint instead"
            ),
        ));
    }
    let r = rollback_latest(table, &time).await?;
    // A rollback the record index could not follow left the metadata table stale: build it now
    // rather than have readers list storage until the next write.
    hook::catch_up(table).await?;
    Ok(r)
}

/// [`rollback_completed`] without the recovery of failed writes first and without the clean check
/// (restores call it in turn: the states between are not kept, the savepoint is).
pub(crate) async fn rollback_latest(table: &mut Table, time: &str) -> Result<String> {
    let time = instant::normalize_time(time)?;
    let latest = table.timeline().latest_completed_data().cloned();
    let Some(latest) = latest.filter(|l| l.time == time) else {
        return Err(Error::invalid_arg(
            "instant",
            format!("{time} is not the latest completed commit; roll back newer ones first, or restore a savepoint"),
        ));
    };
    if table.timeline().instants_at(&time).iter().any(|i| i.action == Action::Savepoint) {
        return Err(Error::invalid_arg("instant", format!("{time} is savepointed; delete the savepoint first")));
    }
    let meta = table.timeline().commit_metadata(table.storage(), &latest).await?;
    // The target as it was pending: a compaction completes as a commit, and on timeline layout 2
    // a clustering as a replacecommit (its plan stays under `clustering`).
    let action = match latest.action {
        _ if meta.compacted => Action::Compaction,
        Action::ReplaceCommit
            if table.timeline().layout() >= 2
                && meta.operation_type.as_deref() == Some(crate::format::commit::CLUSTER) =>
        {
            Action::Clustering
        }
        other => other,
    };
    let storage = table.storage().clone();
    let plan = rollback_plan(&time, action, true, rollback_requests(table, &meta))?;
    let requested = claim(table, Action::Rollback, |_| Ok(plan.clone())).await?;
    let r = requested.time.clone();
    // A write that read the target and checked for conflicts before this rollback was on the
    // timeline may be completing: its files carry the target's rows on (`undone`).
    let beat = spawn_heartbeat(storage.clone(), r.clone(), table.options().heartbeat_interval);
    let waited = super::let_committing_writes_finish(table, &r).await;
    beat.abort();
    waited?;
    if let Some(newer) = table.timeline().latest_completed_data().filter(|l| l.time != time).cloned() {
        storage.delete(&table.timeline().path_of(&requested)).await?;
        storage.delete(&heartbeat_path(&r)).await?;
        return Err(Error::invalid_arg(
            "instant",
            format!(
                "{time} is no longer the latest completed commit: {} completed while this rollback began; \
                 roll back newer ones first, or restore a savepoint",
                newer.time
            ),
        ));
    }
    // The commit recorded as the target's fate gives way to this rollback first: otherwise a
    // process finding the target pending would complete it again.
    let epoch = fate::current_epoch(table, &time).await?;
    fate::overrule(&storage, &time, epoch, &r).await?;
    // The target reads as pending from here on (its requested and inflight files remain).
    let target = Instant::new(time.clone(), action, State::Inflight);
    for pending in [target.with_state(State::Requested), target.clone()] {
        table.timeline().create(&storage, &pending, Bytes::new()).await?;
    }
    storage.delete(&table.timeline().path_of(&latest)).await?;
    step_failpoint(table, "rollback-after-uncommit");
    table.reload().await?;
    rollback(table, &target, Some(requested), Undo::Deliberate { was_completed: true }).await?;
    table.reload().await?;
    Ok(r)
}

/// Rolls back the pending instant `target` of a failed write, whatever its heartbeat says,
/// finishing a rollback of it that was interrupted (the write's own, when storage failed).
pub(crate) async fn rollback_pending(table: &Table, target: &Instant) -> Result<()> {
    for r in table.timeline().pending().filter(|i| i.action == Action::Rollback) {
        let path = table.timeline().path_of(&r.with_state(State::Requested));
        let Some(bytes) = table.storage().get_opt(&path).await? else { continue };
        let plan = RollbackPlan::read(&path, &bytes)?;
        if plan.instant_to_rollback.commit_time == target.time {
            let how = Undo::Deliberate { was_completed: plan.oxlake_was_completed };
            return rollback(table, target, Some(r.clone()), how).await.map(drop);
        }
    }
    rollback(table, target, None, Undo::Deliberate { was_completed: false }).await.map(drop)
}

/// Whether `error` is a data file found missing (what a concurrent rollback leaves a write).
pub(super) fn is_gone(error: &Error) -> bool {
    matches!(error, Error::Storage { source: object_store::Error::NotFound { .. }, .. })
}

/// How a rollback treats the fate of its target (see [`fate`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Undo {
    /// A write taken for failed: the rollback records the target's fate, and yields when a commit
    /// (or another rollback) was recorded first.
    Failed,
    /// A deliberate rollback (of a completed commit, of a failed attempt of the metadata table):
    /// it overrules a recorded commit. `was_completed`: the target had completed before (see
    /// [`rollback_completed`]).
    Deliberate { was_completed: bool },
}

/// Rolls back one pending instant, resuming `existing` when a rollback of it was interrupted.
/// Returns whether it did: `false` when the target's fate was decided otherwise (it committed, and
/// is completed now; or another rollback owns it).
pub(super) async fn rollback(table: &Table, target: &Instant, existing: Option<Instant>, how: Undo) -> Result<bool> {
    rollback_at(table, target, existing, how, None).await
}

/// [`rollback`] of the attempt `epoch` at the target's time (`None`: the current attempt). A
/// failed attempt rolls back itself, never a later attempt at the same time.
pub(super) async fn rollback_at(
    table: &Table,
    target: &Instant,
    existing: Option<Instant>,
    how: Undo,
    epoch: Option<u32>,
) -> Result<bool> {
    let was_completed = matches!(how, Undo::Deliberate { was_completed: true });
    let resumed = existing.is_some();
    let r = match existing {
        Some(r) => r,
        None => {
            // A failed write's files are found when the rollback runs (`undo_files_of`): no
            // request names them ahead (Java, finishing such a plan, deletes nothing it would need).
            let plan = rollback_plan(&target.time, target.action, was_completed, Vec::new())?;
            claim(table, Action::Rollback, |_| Ok(plan.clone())).await?
        }
    };
    // A rollback taken for interrupted (its heartbeat gone) may have finished instead, after this
    // process listed it pending: run again, it would complete a second time, and behind archival
    // (its completed file moved) write a metadata deltacommit behind the metadata table's archive.
    if resumed && finished(table, &r).await? {
        log::info!("{}: rollback {} of {} finished meanwhile", table.uri(), r.time, target.time);
        return Ok(false);
    }
    let epoch = match epoch {
        Some(e) => e,
        None => fate::current_epoch(table, &target.time).await?,
    };
    if let Undo::Deliberate { .. } = how {
        fate::overrule(table.storage(), &target.time, epoch, &r.time).await?;
    } else {
        let ours = fate::Fate::RolledBack { by: r.time.clone() };
        match fate::decide(table.storage(), &target.time, epoch, ours.clone()).await? {
            // The target's record is pruned once it completed: a rollback that took it for
            // pending long ago (a paused process) decides first then, and so does a process that
            // resumes that rollback; each looks again.
            d if d == ours && committed_now(table, target).await? => {
                fate::withdraw(table.storage(), &target.time, epoch, &ours).await?;
                table.timeline().remove_pending(table.storage(), &r).await?;
                log::info!(
                    "{}: {} {} is not rolled back: it completed{}",
                    table.uri(),
                    target.action,
                    target.time,
                    if resumed { " (found resuming the rollback)" } else { "" }
                );
                return Ok(false);
            }
            d if d == ours => {}
            // Taken back by its own writer (it could not complete): any rollback finishes it.
            fate::Fate::RolledBack { by } if by == target.time => {
                fate::overrule(table.storage(), &target.time, epoch, &r.time).await?;
            }
            decided => {
                table.timeline().remove_pending(table.storage(), &r).await?;
                match decided {
                    fate::Fate::Committed { action, metadata, completion } => {
                        fate::roll_forward(table, target, epoch, action, metadata, completion).await?;
                        table.storage().delete(&heartbeat_path(&target.time)).await?;
                        conflicts::withdraw_intent(table.storage(), &target.time).await?;
                    }
                    // Another rollback owns it. When that one's process is gone (killed before
                    // it finished), this process finishes it: nobody else would, and a writer
                    // waiting on the target would wait for ever.
                    fate::Fate::RolledBack { by } => {
                        let now = crate::timeline::Timeline::load(table.storage(), table.config()).await?;
                        let owner = now.pending().find(|i| i.time == by && i.action == Action::Rollback).cloned();
                        if let Some(owner) = owner
                            && is_expired(table, &owner).await?
                        {
                            log::info!(
                                "{}: finishing rollback {by} of {}: its process is gone",
                                table.uri(),
                                target.time
                            );
                            return Box::pin(rollback_at(table, target, Some(owner), how, Some(epoch))).await;
                        }
                    }
                }
                log::info!(
                    "{}: {} {} is not rolled back: its fate was decided first",
                    table.uri(),
                    target.action,
                    target.time
                );
                return Ok(false);
            }
        }
    }
    if target.action != Action::Compaction {
        // Files its writer may still write are never committed, however old (a compaction plan
        // runs again at its time: its files are told apart by the timeline).
        table.storage().put(&crate::timeline::rolled_back_marker(&target.time), Bytes::new()).await?;
    }
    step_failpoint(table, "rollback-after-fate");
    // A rollback beats like a write: another process finishes it only once this one is gone.
    beating(table, &r.time, undo(table, target, &r, was_completed)).await?;
    Ok(true)
}

/// Whether the rollback `r` finished on the timeline as it is now: completed, or archived since.
async fn finished(table: &Table, r: &Instant) -> Result<bool> {
    committed_now(table, r).await
}

/// Whether `target` is committed on the timeline as it is now: completed, or archived.
async fn committed_now(table: &Table, target: &Instant) -> Result<bool> {
    let now = crate::timeline::Timeline::load(table.storage(), table.config()).await?;
    Ok(now.is_committed(&target.time))
}

/// Settles the fate of the pending instant `target` from outside, for a process that must know
/// it before it acts (a metadata deltacommit about to write into the slice a compaction would
/// leave behind): taken back unless its committer decided first, when it is completed here for
/// it (its committer goes on to find it completed). Returns whether `target` completed. A taken
/// back instant fails to commit with a conflict and is rolled back by its own process (or by the
/// next rollback of failed writes).
pub(crate) async fn settle(table: &Table, target: &Instant) -> Result<bool> {
    let epoch = fate::current_epoch(table, &target.time).await?;
    let taken_back = fate::Fate::RolledBack { by: target.time.clone() };
    match fate::decide(table.storage(), &target.time, epoch, taken_back.clone()).await? {
        fate::Fate::Committed { action, metadata, completion } => {
            fate::roll_forward(table, target, epoch, action, metadata, completion).await?;
            Ok(true)
        }
        // Decided here, for an instant that completed since `table` saw it pending and whose
        // record was pruned since: it stays completed.
        d if d == taken_back && committed_now(table, target).await? => {
            fate::withdraw(table.storage(), &target.time, epoch, &taken_back).await?;
            Ok(true)
        }
        fate::Fate::RolledBack { .. } => Ok(false),
    }
}

/// The steps of a rollback `r` of `target`, each idempotent.
pub(super) async fn undo(table: &Table, target: &Instant, r: &Instant, was_completed: bool) -> Result<()> {
    let started = std::time::Instant::now();
    let storage = table.storage();
    let timeline = table.timeline();
    // A rollback taken up from a process gone may have finished after all, and been archived
    // since it was listed: its inflight file made again would read as pending once more.
    if timeline.start(storage, r, Bytes::new()).await?.is_none() {
        log::info!("{}: rollback {} of {} finished and was archived meanwhile", table.uri(), r.time, target.time);
        return Ok(());
    }
    step_failpoint(table, "rollback-after-inflight");
    let (deleted, added) = undo_files_of(storage, target, &r.time).await?;
    super::completion::release_claims(table, &target.time).await?;
    step_failpoint(table, "rollback-after-delete");
    let change = change::Change {
        added: &added,
        deleted: &deleted,
        keys: change::KeySource::RolledBack { target: &target.time, was_completed },
        entries: &[],
    };
    // The last look before the metadata table and the timeline take it (see `rollback_at`).
    if finished(table, r).await? {
        log::info!("{}: rollback {} of {} finished meanwhile", table.uri(), r.time, target.time);
        return Ok(());
    }
    hook::before_complete(table, &r.time, change).await?;
    let millis = i64::try_from(started.elapsed().as_millis()).unwrap_or(i64::MAX);
    let meta = rollback_metadata(table.uri(), target, &r.time, millis, &deleted, &added)?;
    super::completion::complete(table, r, Bytes::from(meta)).await?;
    if target.action == Action::Compaction {
        // A compaction plan stays: it is executed again by the next compaction run.
        storage.delete(&timeline.path_of(&target.with_state(State::Inflight))).await?;
    } else {
        timeline.remove_pending(storage, target).await?;
    }
    storage.delete(&heartbeat_path(&target.time)).await?;
    conflicts::withdraw_intent(storage, &target.time).await?;
    log::info!("rolled back instant {} as rollback {}", target.time, r.time);
    Ok(())
}

/// Whose files of an instant [`remove_unreported_files`] looks for.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Leftovers<'a> {
    /// A write's: base files named with its instant, and logs of the file groups it reported
    /// whose blocks are all of its instant.
    Write,
    /// One attempt of a compaction's: base files named with its instant whose write token
    /// carries `epoch` (another attempt's, a stale driver's after a rollback, carry another);
    /// logs are never a compaction's.
    Compaction { epoch: &'a str },
}

/// Deletes the data files an instant at `time` left in `partitions` that are not in `kept`
/// (files of failed task attempts, or of tasks that lost to a speculative copy); returns the
/// paths deleted. `whose` says which files are the instant's.
pub(crate) async fn remove_unreported_files(
    storage: &Storage,
    time: &str,
    partitions: &[&str],
    kept: &HashSet<&str>,
    whose: Leftovers<'_>,
) -> Result<Vec<String>> {
    let groups: HashSet<(&str, String)> = match whose {
        Leftovers::Compaction { .. } => HashSet::new(),
        Leftovers::Write => kept
            .iter()
            .filter_map(|path| {
                let (dir, name) = path.rsplit_once('/').unwrap_or(("", path));
                let file_id = BaseFileName::parse(name)
                    .map(|b| b.file_id)
                    .or_else(|| LogFileName::parse(name).map(|l| l.file_id))?;
                Some((dir, file_id))
            })
            .collect(),
    };
    let mut deleted = Vec::new();
    for partition in partitions {
        for f in storage.list_dir(partition).await? {
            if kept.contains(f.path.as_str()) {
                continue;
            }
            let name = f.path.rsplit('/').next().unwrap_or(&f.path);
            let unreported = if let Some(b) = BaseFileName::parse(name) {
                b.instant == time
                    && match whose {
                        Leftovers::Write => true,
                        Leftovers::Compaction { epoch } => b.write_token.split('-').nth(1) == Some(epoch),
                    }
            } else if LogFileName::parse(name).is_some_and(|l| groups.contains(&(*partition, l.file_id))) {
                let instants = crate::log::block_instants(storage, &f.path).await?;
                !instants.is_empty() && instants.iter().all(|i| i == time)
            } else {
                false
            };
            if unreported {
                storage.delete(&f.path).await?;
                deleted.push(f.path);
            }
        }
    }
    if !deleted.is_empty() {
        log::info!("instant {time}: removed {} files of failed task attempts", deleted.len());
    }
    Ok(deleted)
}

/// Deletes the data files of `metadata`, a write at `time` that another process rolled back:
/// its base files, and its logs that hold blocks of `time` only.
pub(super) async fn remove_reported_files(storage: &Storage, time: &str, metadata: &CommitMetadata) -> Result<()> {
    for (_, stat) in metadata.write_stats() {
        let Some(path) = stat.path.as_deref() else { continue };
        let name = path.rsplit('/').next().unwrap_or(path);
        let ours = if BaseFileName::parse(name).is_some() {
            BaseFileName::parse(name).is_some_and(|b| b.instant == time)
        } else if LogFileName::parse(name).is_some() {
            let instants = crate::log::block_instants(storage, path).await?;
            !instants.is_empty() && instants.iter().all(|i| i == time)
        } else {
            false
        };
        if ours {
            storage.delete(path).await?;
        }
    }
    Ok(())
}

/// Undoes the data files of a failed instant; returns the paths deleted.
///
/// Base files named with the instant are deleted. Log files are named with their slice's base
/// instant, so they are recognised by their blocks: a log holding only blocks of the instant is
/// deleted; one that also holds other instants' blocks (written by another writer that appends) gets
/// a rollback command block in a new log version. A failed compaction keeps every log: they belong
/// to committed writes.
pub(super) async fn undo_files_of(
    storage: &Storage,
    target: &Instant,
    rollback_time: &str,
) -> Result<(Vec<String>, Vec<FileInfo>)> {
    let time = target.time.as_str();
    let (mut deleted, mut added) = (Vec::new(), Vec::new());
    let files = storage.list_table().await?;
    let mut max_versions: std::collections::HashMap<(String, String, String), u32> = Default::default();
    let mut logs = Vec::new();
    for f in &files {
        if f.path.starts_with(".hoodie/") {
            continue;
        }
        let (dir, name) = f.path.rsplit_once('/').unwrap_or(("", f.path.as_str()));
        if BaseFileName::parse(name).is_some_and(|b| b.instant == time) {
            storage.delete(&f.path).await?;
            deleted.push(f.path.clone());
        } else if let Some(l) = LogFileName::parse(name) {
            let key = (dir.to_string(), l.file_id.clone(), l.instant.clone());
            let v = max_versions.entry(key).or_default();
            *v = (*v).max(l.version);
            if l.instant.as_str() <= time && target.action != Action::Compaction {
                logs.push((dir.to_string(), l, f.path.clone()));
            }
        }
    }
    for (dir, name, path) in logs {
        let instants = crate::log::block_instants(storage, &path).await?;
        if !instants.iter().any(|i| i == time) {
            continue;
        }
        if instants.iter().all(|i| i == time) {
            storage.delete(&path).await?;
            deleted.push(path);
        } else {
            let after = max_versions.get(&(dir.clone(), name.file_id.clone(), name.instant.clone())).copied();
            let block = crate::format::log_block::LogBlock::rollback(rollback_time, time);
            let written = crate::log::write_new(
                storage,
                &dir,
                &name.file_id,
                &name.instant,
                &name.write_token,
                after.unwrap_or(name.version),
                &[block],
            )
            .await?;
            max_versions.insert((dir, name.file_id.clone(), name.instant.clone()), written.name.version);
            added.push(FileInfo { path: written.path, size: written.size });
        }
    }
    Ok((deleted, added))
}

/// The `HoodieRollbackPlan` of a rollback of `time` (`action`): `requests` name the files it
/// deletes where they are known ahead.
pub(super) fn rollback_plan(
    time: &str,
    action: Action,
    was_completed: bool,
    requests: Vec<RollbackRequest>,
) -> Result<Bytes> {
    let plan = RollbackPlan {
        instant_to_rollback: InstantInfo { commit_time: time.to_string(), action: action.to_string() },
        rollback_requests: Some(requests),
        version: Some(rollback::ROLLBACK_PLAN_VERSION),
        oxlake_was_completed: was_completed,
    };
    Ok(Bytes::from(plan.to_avro()?))
}

/// The requests of a rollback of the completed write `meta` (as Java's listing of the instant's
/// files would plan it), one per file group: its base files of the write's instant to delete (full
/// paths), its log files as logs to mark with a rollback block (another writer may have appended to
/// them; oxlake deletes a log whose blocks are all the write's when it runs).
pub(super) fn rollback_requests(table: &Table, meta: &CommitMetadata) -> Vec<RollbackRequest> {
    let mut out: std::collections::BTreeMap<(String, String), RollbackRequest> = Default::default();
    for (partition, stat) in meta.write_stats() {
        let Some(path) = stat.path.as_deref() else { continue };
        let name = path.rsplit('/').next().unwrap_or(path);
        let (file_id, base) = match (BaseFileName::parse(name), LogFileName::parse(name)) {
            (Some(b), _) => (b.file_id, true),
            (None, Some(l)) => (l.file_id, false),
            (None, None) => continue,
        };
        let request = out.entry((partition.to_string(), file_id.clone())).or_insert_with(|| RollbackRequest {
            partition_path: partition.to_string(),
            file_id: Some(file_id),
            latest_base_instant: stat.prev_commit.clone().filter(|p| p != "null"),
            files_to_be_deleted: Vec::new(),
            log_blocks_to_be_deleted: Some(Default::default()),
        });
        let full = file_name::full_path(table.uri(), path);
        if base {
            request.files_to_be_deleted.push(full);
        } else {
            let size = stat.file_size_in_bytes.max(0);
            request.log_blocks_to_be_deleted.get_or_insert_with(Default::default).insert(full, size);
        }
    }
    out.into_values().collect()
}

/// The `HoodieRollbackMetadata` of rollback `r_time` of `target`: per partition the files deleted
/// and the logs given a rollback block, by full path.
pub(super) fn rollback_metadata(
    uri: &str,
    target: &Instant,
    r_time: &str,
    millis: i64,
    deleted: &[String],
    added: &[FileInfo],
) -> Result<Vec<u8>> {
    let mut partitions: std::collections::BTreeMap<String, RollbackPartitionMetadata> = Default::default();
    let partition_of = |rel: &str| rel.rsplit_once('/').map_or("", |(p, _)| p).to_string();
    for rel in deleted {
        let p = partition_of(rel);
        partitions
            .entry(p.clone())
            .or_insert_with(|| empty_partition(&p))
            .success_delete_files
            .push(file_name::full_path(uri, rel));
    }
    for f in added {
        let p = partition_of(&f.path);
        let size = i64::try_from(f.size).unwrap_or(i64::MAX);
        partitions
            .entry(p.clone())
            .or_insert_with(|| empty_partition(&p))
            .rollback_log_files
            .get_or_insert_with(Default::default)
            .insert(file_name::full_path(uri, &f.path), size);
    }
    let total = i32::try_from(deleted.len())
        .map_err(|_| Error::invalid_data(format!("rollback {r_time}: too many files for one rollback")))?;
    let meta = RollbackMetadata {
        start_rollback_time: r_time.to_string(),
        time_taken_in_millis: millis,
        total_files_deleted: total,
        commits_rollback: vec![target.time.clone()],
        partition_metadata: partitions,
        version: Some(rollback::METADATA_VERSION),
        instants_rollback: vec![InstantInfo { commit_time: target.time.clone(), action: target.action.to_string() }],
    };
    meta.to_avro()
}

pub(super) fn empty_partition(partition: &str) -> RollbackPartitionMetadata {
    RollbackPartitionMetadata {
        partition_path: partition.to_string(),
        rollback_log_files: Some(Default::default()),
        written_log_files: Some(Default::default()),
        ..Default::default()
    }
}

/// Timeline helper for tests and tools: the rollback instants and what each rolled back.
pub async fn rollbacks(storage: &Storage, timeline: &Timeline) -> Result<Vec<(String, Vec<String>)>> {
    let mut out = Vec::new();
    for r in timeline.instants().iter().filter(|i| i.action == Action::Rollback && i.is_completed()) {
        let path = timeline.path_of(r);
        let meta = RollbackMetadata::read(&path, &storage.get(&path).await?)?;
        out.push((r.time.clone(), meta.commits_rollback));
    }
    Ok(out)
}
