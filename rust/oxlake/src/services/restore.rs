//! Savepoints and restores. A savepoint `<t>.savepoint` keeps the table readable as of commit `t`:
//! the cleaner never removes the files of that snapshot. A restore rolls the table back to a
//! savepoint: every data instant completed after it is rolled back, newest first, under one
//! `restore` instant whose plan names them, so an interrupted restore is finished by the next run.

use std::sync::Arc;

use std::collections::BTreeMap;

use bytes::Bytes;

use crate::commit::rollback_latest;
use crate::error::{Error, Result};
use crate::format::instant::{self, Action, Instant, State};
use crate::format::rollback::{
    self, InstantInfo, RestoreMetadata, RestorePlan, RollbackMetadata, SavepointMetadata, SavepointPartitionMetadata,
};
use crate::services::progress::{self, Progress};
use crate::table::Table;

impl Table {
    /// Savepoints the completed data instant `time`.
    pub async fn savepoint(&mut self, time: &str) -> Result<()> {
        self.reload().await?;
        self.check_changeable()?;
        let time = instant::normalize_time(time)?;
        if !self.timeline().completed_data().any(|i| i.time == time) {
            return Err(Error::invalid_arg("instant", format!("{time} is not a completed commit")));
        }
        let plan =
            self.plan_scan(&crate::read::ScanOptions { as_of: Some(time.clone()), ..Default::default() }).await?;
        // File names per partition, base and log files of the snapshot's slices, as Java's
        // `SavepointActionExecutor` records them (its cleaner keeps files by these names).
        let mut partition_metadata: BTreeMap<String, SavepointPartitionMetadata> = BTreeMap::new();
        for s in &plan.slices {
            for path in s.base.iter().map(|b| &b.path).chain(s.logs.iter().map(|l| &l.path)) {
                let (partition, name) = path.rsplit_once('/').unwrap_or(("", path));
                partition_metadata
                    .entry(partition.to_string())
                    .or_insert_with(|| SavepointPartitionMetadata {
                        partition_path: partition.to_string(),
                        savepoint_data_file: Vec::new(),
                    })
                    .savepoint_data_file
                    .push(name.to_string());
            }
        }
        let meta = SavepointMetadata {
            savepointed_by: "oxlake".into(),
            savepointed_at: chrono::Utc::now().timestamp_millis(),
            comments: String::new(),
            partition_metadata,
            version: Some(rollback::METADATA_VERSION),
        };
        let sp = Instant::new(time.clone(), Action::Savepoint, State::Inflight);
        let storage = self.storage().clone();
        let made = self.timeline().create(&storage, &sp, Bytes::new()).await?;
        crate::commit::failpoint("savepoint-after-inflight");
        // An archival holds back at a savepoint it sees. One that listed the timeline before this
        // inflight file existed may be deleting the commit now: it marked itself before that
        // listing, so its marker is seen here. A savepoint of an archived commit would read as
        // a savepoint of nothing (and hold archival back for ever).
        let looked = async {
            let archival = crate::commit::archival_past(self, &time).await?;
            let listed = crate::timeline::Timeline::load(&storage, self.config()).await?;
            Ok::<_, Error>((archival, listed))
        };
        let (archival, listed) = match looked.await {
            Ok(found) => found,
            Err(e) => {
                if made {
                    storage.delete(&self.timeline().path_of(&sp)).await?;
                }
                return Err(e);
            }
        };
        let kept = listed.completed_data().any(|i| i.time == time);
        if archival.is_some() || !kept {
            if made {
                storage.delete(&self.timeline().path_of(&sp)).await?;
            }
            let by = archival.map_or_else(String::new, |cutoff| format!(" (an archival up to {cutoff})"));
            return Err(Error::CommitConflict {
                instant: time.clone(),
                detail: format!("{time} is being archived{by}: savepoint a later commit"),
            });
        }
        let meta = meta.to_avro()?;
        let savepointed =
            listed.instants_at(&sp.time).iter().any(|i| i.action == Action::Savepoint && i.is_completed());
        if savepointed || !crate::commit::complete(self, &sp, Bytes::from(meta)).await? {
            return Err(Error::invalid_arg("instant", format!("{} is already savepointed", sp.time)));
        }
        self.reload().await
    }

    /// Deletes the savepoint at `time` (its completed and inflight files, as Java's
    /// `SavepointHelpers.deleteSavepoint` does): the cleaner may then remove what only it kept,
    /// and a restore may go past it.
    pub async fn delete_savepoint(&mut self, time: &str) -> Result<()> {
        self.reload().await?;
        self.check_changeable()?;
        let time = instant::normalize_time(time)?;
        if !self.savepoints().contains(&time) {
            return Err(Error::invalid_arg("instant", format!("{time} is not a savepoint")));
        }
        remove_savepoint(self, &time).await?;
        self.reload().await
    }

    /// Restores the table to the savepoint at `time`: every data instant completed after it is
    /// rolled back. Returns the restore instant.
    pub async fn restore(&mut self, time: &str) -> Result<String> {
        self.restore_with(time, None).await
    }

    /// [`Table::restore`], counting the instants rolled back on `progress`.
    pub async fn restore_with(&mut self, time: &str, progress: Option<Arc<Progress>>) -> Result<String> {
        self.reload().await?;
        crate::commit::rollback_failed(self).await?;
        let time = instant::normalize_time(time)?;
        let savepoints = self.savepoints();
        if !savepoints.contains(&time) {
            return Err(Error::invalid_arg("instant", format!("{time} is not a savepoint")));
        }
        // A newer savepoint promises its snapshot stays: refused before anything is touched (Java's
        // restore fails half-way on it, at the rollback of its commit).
        let newer: Vec<&String> = savepoints.iter().filter(|s| **s > time).collect();
        if !newer.is_empty() {
            let names = newer.iter().map(|s| s.as_str()).collect::<Vec<_>>().join(", ");
            return Err(Error::invalid_arg(
                "instant",
                format!(
                    "savepoint{} {names} newer than {time} would be undone by this restore: delete {} first \
                     (`Table.delete_savepoint`, `oxlake savepoint --delete`)",
                    if newer.len() > 1 { "s" } else { "" },
                    if newer.len() > 1 { "them" } else { "it" },
                ),
            ));
        }
        let mut later: Vec<InstantInfo> = self
            .timeline()
            .completed_data()
            .filter(|i| i.time > time)
            .map(|i| InstantInfo { commit_time: i.time.clone(), action: i.action.to_string() })
            .collect();
        // Compaction plans made after the savepoint name slices the restore takes back: they go
        // too (Java's restore rolls back every instant of the write timeline after it), or they
        // would stay pending for ever, failing each time they run.
        later.extend(
            self.timeline()
                .pending()
                .filter(|i| i.action == Action::Compaction && i.time > time)
                .map(|i| InstantInfo { commit_time: i.time.clone(), action: i.action.to_string() }),
        );
        later.sort_by(|a, b| b.commit_time.cmp(&a.commit_time));
        let plan = RestorePlan {
            instants_to_rollback: later,
            version: Some(rollback::RESTORE_PLAN_VERSION),
            savepoint_to_restore_timestamp: Some(time),
        };
        let bytes = Bytes::from(plan.to_avro()?);
        let requested = crate::commit::claim(self, Action::Restore, |_| Ok(bytes.clone())).await?;
        finish(self, &requested, &plan, &progress).await?;
        // The rollbacks of a restore leave a record index stale (see `metadata::sync`).
        crate::commit::hook::catch_up(self).await?;
        Ok(requested.time)
    }
}

/// Rolls back what the plan names that is still completed, then completes the restore with the
/// metadata of each rollback nested (Java's `HoodieRestoreMetadata`). Each target is also rolled
/// back as a `rollback` instant of its own, so an interrupted restore knows what it did.
async fn finish(
    table: &mut Table,
    requested: &Instant,
    plan: &RestorePlan,
    progress: &Option<Arc<Progress>>,
) -> Result<()> {
    let started = std::time::Instant::now();
    let storage = table.storage().clone();
    let plan = &with_writes_completed_since(table, requested, plan).await?;
    progress::plan(progress, plan.instants_to_rollback.len() as u64, "commits");
    table.timeline().create(&storage, &requested.with_state(State::Inflight), Bytes::new()).await?;
    for target in &plan.instants_to_rollback {
        table.reload().await?;
        // A savepoint on a commit the plan takes back: one made while this restore ran, or left by
        // an older oxlake that planned restores past newer savepoints (their restores then stayed
        // pending for ever). The restore was asked for and has begun: it goes on past it.
        if table.savepoints().contains(&target.commit_time) {
            log::warn!(
                "{}: restore {} to {} removes savepoint {}, which it takes back",
                table.uri(),
                requested.time,
                plan.savepoint_to_restore_timestamp.as_deref().unwrap_or("?"),
                target.commit_time
            );
            remove_savepoint(table, &target.commit_time).await?;
            table.reload().await?;
        }
        if table.timeline().completed_data().any(|i| i.time == target.commit_time) {
            rollback_latest(table, &target.commit_time).await?;
            crate::commit::failpoint("restore-after-rollback");
        }
        // A compaction's plan outlives a rollback of its commit (to run again); under a restore
        // it goes, whether it was pending or completed, as Java's restore removes it.
        let pending = table
            .timeline()
            .pending()
            .find(|i| i.time == target.commit_time && i.action == Action::Compaction)
            .cloned();
        if let Some(pending) = pending {
            remove_compaction_plan(table, &pending).await?;
        }
        progress::advance(progress, 1);
    }
    let meta = restore_metadata(table, requested, plan, started).await?;
    crate::commit::complete(table, requested, Bytes::from(meta)).await?;
    table.reload().await
}

/// `plan` with the writes that completed after the savepoint while the restore began: a write
/// that checked for conflicts before the restore's instant was on the timeline, and completed
/// after its plan was made. Those the restore waits for first (`commit::undone`); a write that
/// checks later sees the restore and fails. Every data instant between the savepoint and the
/// restore goes, newest first.
async fn with_writes_completed_since(
    table: &mut Table,
    requested: &Instant,
    plan: &RestorePlan,
) -> Result<RestorePlan> {
    crate::commit::let_committing_writes_finish(table, &requested.time).await?;
    let Some(savepoint) = plan.savepoint_to_restore_timestamp.as_deref() else { return Ok(plan.clone()) };
    let planned: std::collections::HashSet<&str> =
        plan.instants_to_rollback.iter().map(|i| i.commit_time.as_str()).collect();
    let missed: Vec<InstantInfo> = table
        .timeline()
        .completed_data()
        .filter(|i| i.time.as_str() > savepoint && i.time < requested.time && !planned.contains(i.time.as_str()))
        .map(|i| InstantInfo { commit_time: i.time.clone(), action: i.action.to_string() })
        .collect();
    if missed.is_empty() {
        return Ok(plan.clone());
    }
    log::info!(
        "{}: restore {} also takes back {} write(s) completed as it began",
        table.uri(),
        requested.time,
        missed.len()
    );
    let mut extended = plan.clone();
    extended.instants_to_rollback.extend(missed);
    extended.instants_to_rollback.sort_by(|a, b| b.commit_time.cmp(&a.commit_time));
    Ok(extended)
}

/// Removes the savepoint at `time`: its completed file first (from then on it is no savepoint),
/// then its inflight file.
async fn remove_savepoint(table: &Table, time: &str) -> Result<()> {
    let storage = table.storage();
    let timeline = table.timeline();
    for i in timeline.instants_at(time).iter().filter(|i| i.action == Action::Savepoint) {
        // The timeline lists an instant once, in its latest state: every earlier file goes too.
        storage.delete(&timeline.path_of(i)).await?;
        storage.delete(&timeline.path_of(&i.with_state(State::Inflight))).await?;
    }
    log::info!("{}: savepoint {time} deleted", table.uri());
    Ok(())
}

/// Removes a pending compaction plan: the files of a run that started are undone first (a
/// rollback, which keeps the plan), then the plan itself.
async fn remove_compaction_plan(table: &mut Table, pending: &Instant) -> Result<()> {
    if pending.state == State::Inflight {
        crate::commit::rollback_pending(table, pending).await?;
    }
    let storage = table.storage().clone();
    // Its slices are given back first: a claim outliving its plan would have the next compactor
    // of those slices close the plan's time with an empty plan, pending for ever.
    let path = table.timeline().path_of(&pending.with_state(State::Requested));
    if let Some(plan) = storage.get_opt(&path).await? {
        crate::commit::slice_claims::release(table, &pending.time, &path, &plan).await?;
    }
    table.timeline().remove_pending(&storage, pending).await?;
    log::info!("{}: the restore removed compaction plan {}", table.uri(), pending.time);
    table.reload().await
}

/// The `HoodieRestoreMetadata` of restore `requested`: for each instant of the plan, the metadata
/// of the rollback (newer than the restore) that rolled it back.
async fn restore_metadata(
    table: &Table,
    requested: &Instant,
    plan: &RestorePlan,
    started: std::time::Instant,
) -> Result<Vec<u8>> {
    let timeline = table.timeline();
    let mut nested: BTreeMap<String, Vec<RollbackMetadata>> = BTreeMap::new();
    let rollbacks = timeline
        .instants()
        .iter()
        .filter(|i| i.action == Action::Rollback && i.is_completed() && i.time > requested.time);
    for r in rollbacks {
        let path = timeline.path_of(r);
        let meta = RollbackMetadata::read(&path, &table.storage().get(&path).await?)?;
        for t in &meta.commits_rollback {
            if plan.instants_to_rollback.iter().any(|i| &i.commit_time == t) {
                nested.entry(t.clone()).or_default().push(meta.clone());
            }
        }
    }
    // Instants of an earlier oxlake JSON plan carry no action: the rollback recorded it.
    let info: Vec<InstantInfo> = plan
        .instants_to_rollback
        .iter()
        .map(|i| {
            let recorded = nested.get(&i.commit_time).and_then(|m| m.iter().flat_map(|m| &m.instants_rollback).next());
            match recorded {
                Some(r) if i.action.is_empty() => r.clone(),
                _ => i.clone(),
            }
        })
        .collect();
    let meta = RestoreMetadata {
        start_restore_time: requested.time.clone(),
        time_taken_in_millis: i64::try_from(started.elapsed().as_millis()).unwrap_or(i64::MAX),
        instants_to_rollback: info.iter().map(|i| i.commit_time.clone()).collect(),
        hoodie_restore_metadata: nested,
        version: Some(rollback::METADATA_VERSION),
        restore_instant_info: info,
        extra_metadata: None,
    };
    meta.to_avro()
}

/// Finishes restores interrupted by a crash (called before every write).
pub async fn finish_interrupted(table: &mut Table) -> Result<()> {
    let pending: Vec<Instant> = table.timeline().pending().filter(|i| i.action == Action::Restore).cloned().collect();
    for r in pending {
        let path = table.timeline().path_of(&r.with_state(State::Requested));
        let plan = RestorePlan::read(&path, &table.storage().get(&path).await?)?;
        finish(table, &r, &plan, &None).await?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::TableType;
    use crate::table::TableOptions;
    use crate::test_support::{id_city_rows, id_city_table};
    use crate::write::{WriteConfig, WriteOperation};

    /// An archival that listed the timeline before a savepoint's inflight file existed deletes
    /// the commit without seeing the savepoint: its marker (made before that listing) makes the
    /// savepoint give way, leaving nothing of itself.
    #[tokio::test]
    async fn a_savepoint_gives_way_to_an_archival_taking_its_commit() {
        let dir = tempfile::tempdir().unwrap();
        let mut t = id_city_table(dir.path(), TableType::CopyOnWrite, TableOptions::default()).await;
        let config = WriteConfig::default();
        for city in ["sf", "nyc", "la"] {
            t.write(WriteOperation::Upsert, vec![id_city_rows(&[(1, city)])], &config).await.unwrap();
        }
        let times: Vec<String> = t.timeline().completed_data().map(|i| i.time.clone()).collect();
        // An archival up to the second commit, under way.
        t.storage().put(&crate::commit::archival_marker(&times[1]), Bytes::new()).await.unwrap();
        for taken in &times[..2] {
            let refused = t.savepoint(taken).await;
            assert!(matches!(refused, Err(Error::CommitConflict { .. })), "{refused:?}");
        }
        t.reload().await.unwrap();
        assert!(t.savepoints().is_empty());
        assert!(!t.timeline().instants().iter().any(|i| i.action == Action::Savepoint), "nothing is left");
        // A commit after the cutoff is savepointed.
        t.savepoint(&times[2]).await.unwrap();
        assert_eq!(t.savepoints(), vec![times[2].clone()]);
    }
}
