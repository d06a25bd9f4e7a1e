//! The cleaner: deletes the files of file slices no query within the retention needs. A clean is
//! an instant: its plan (`r.clean.requested`) lists the files, executing it deletes them (deleting a
//! deleted file is a no-op, so a crashed clean is simply run again), and `r.clean` records it.
//!
//! Never deleted: the latest slice of every live file group, every slice a savepoint reads, the
//! slices a pending compaction reads, and (keep-latest-commits) every slice a time-travel read to one
//! of the retained commits reads.

use std::collections::{BTreeSet, HashSet};
use std::ops::Bound;
use std::sync::Arc;

use bytes::Bytes;
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::format::file_name::{BaseFileName, LogFileName};
use crate::format::instant::{Action, Instant, State};
use crate::services::progress::{self, Progress};
use crate::table::Table;
use crate::table::fs_view::{FileGroupId, FileSlice, FileSystemView};

/// What the cleaner keeps.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CleanPolicy {
    /// Keep every slice needed to read as of each of the latest `n` data commits.
    KeepLatestCommits(usize),
    /// Keep the latest `n` slices of every file group.
    KeepLatestFileVersions(usize),
}

impl CleanPolicy {
    /// Parses `keep_latest_commits` / `keep_latest_file_versions` with its count.
    pub fn parse(name: &str, retain: usize) -> Result<Self> {
        if retain == 0 {
            return Err(Error::invalid_arg("retain", "must be at least 1"));
        }
        match name {
            "keep_latest_commits" => Ok(CleanPolicy::KeepLatestCommits(retain)),
            "keep_latest_file_versions" => Ok(CleanPolicy::KeepLatestFileVersions(retain)),
            other => Err(Error::invalid_arg(
                "policy",
                format!("`{other}` (expected keep_latest_commits or keep_latest_file_versions)"),
            )),
        }
    }
}

/// The plan and record of a clean.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CleanPlan {
    pub policy: String,
    pub earliest_instant_to_retain: Option<String>,
    pub files_to_delete: Vec<String>,
}

/// What a clean did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CleanResult {
    pub instant: Option<String>,
    pub deleted: Vec<String>,
}

impl Table {
    /// Deletes the files the policy no longer needs; finishes interrupted cleans first.
    pub async fn clean(&mut self, policy: CleanPolicy) -> Result<CleanResult> {
        self.clean_with(policy, None).await
    }

    /// [`Table::clean`], counting the files deleted on `progress`.
    pub async fn clean_with(&mut self, policy: CleanPolicy, progress: Option<Arc<Progress>>) -> Result<CleanResult> {
        self.reload().await?;
        crate::commit::rollback_failed(self).await?;
        let mut result = CleanResult::default();
        let pending: Vec<Instant> = self.timeline().pending().filter(|i| i.action == Action::Clean).cloned().collect();
        for r in pending {
            // One whose cleaner is alive is left to it.
            if !crate::commit::is_expired(self, &r).await? {
                continue;
            }
            let plan = read_plan(self, &r).await?;
            let deleted = crate::commit::beating(self, &r.time, execute(self, &r, &plan, &progress)).await?;
            result.deleted.extend(deleted);
            result.instant = Some(r.time.clone());
        }
        crate::commit::prune_claims(self).await?;
        let plan = plan(self, policy).await?;
        if plan.files_to_delete.is_empty() {
            return Ok(result);
        }
        let bytes = Bytes::from(serde_json::to_vec_pretty(&plan).map_err(Error::invalid_data)?);
        let requested = crate::commit::claim(self, Action::Clean, |_| Ok(bytes.clone())).await?;
        let time = requested.time.clone();
        let deleted = crate::commit::beating(self, &time, execute(self, &requested, &plan, &progress)).await?;
        result.deleted.extend(deleted);
        result.instant = Some(time);
        self.reload().await?;
        Ok(result)
    }
}

/// The plan of the clean `instant`.
pub(crate) async fn read_plan(table: &Table, instant: &Instant) -> Result<CleanPlan> {
    let path = table.timeline().path_of(&instant.with_state(State::Requested));
    serde_json::from_slice(&table.storage().get(&path).await?).map_err(|e| Error::corrupt(&path, e))
}

async fn execute(
    table: &Table,
    requested: &Instant,
    plan: &CleanPlan,
    progress: &Option<Arc<Progress>>,
) -> Result<Vec<String>> {
    let storage = table.storage();
    table.timeline().create(storage, &requested.with_state(State::Inflight), Bytes::new()).await?;
    progress::plan(progress, plan.files_to_delete.len() as u64, "files");
    for f in &plan.files_to_delete {
        storage.delete(f).await?;
        progress::advance(progress, 1);
    }
    crate::commit::failpoint("clean-after-delete");
    let change = crate::metadata::Change {
        added: &[],
        deleted: &plan.files_to_delete,
        keys: crate::metadata::KeySource::Unchanged,
        entries: &[],
    };
    Box::pin(crate::metadata::sync(table, &requested.time, change)).await?;
    let record = serde_json::to_vec_pretty(plan).map_err(Error::invalid_data)?;
    table.timeline().create(storage, &requested.with_state(State::Completed), Bytes::from(record)).await?;
    Ok(plan.files_to_delete.clone())
}

/// The files of slices the policy does not retain.
async fn plan(table: &Table, policy: CleanPolicy) -> Result<CleanPlan> {
    let timeline = table.timeline();
    let data: Vec<String> = timeline.completed_data().map(|i| i.time.clone()).collect();
    let Some(latest) = data.last().cloned() else { return Ok(CleanPlan::default()) };
    let view = table.file_system_view().await?;
    // Snapshots that must stay readable: savepoints, and the retained commits.
    let mut keep_as_of: BTreeSet<String> = table.savepoints().into_iter().collect();
    keep_as_of.insert(latest.clone());
    let (name, earliest) = match policy {
        CleanPolicy::KeepLatestCommits(n) => {
            let retained = &data[data.len().saturating_sub(n)..];
            keep_as_of.extend(retained.iter().cloned());
            ("keep_latest_commits", retained.first().cloned())
        }
        CleanPolicy::KeepLatestFileVersions(_) => ("keep_latest_file_versions", None),
    };
    let mut replaced_as_of: Vec<(String, HashSet<FileGroupId>)> = Vec::new();
    for t in &keep_as_of {
        replaced_as_of.push((t.clone(), table.replaced_file_groups(t).await?));
    }
    let mut files = Vec::new();
    for g in view.groups() {
        let id = g.id();
        let mut keep: HashSet<&str> = HashSet::new();
        for (t, replaced) in &replaced_as_of {
            if let Some(s) = g.slice_as_of(t).filter(|_| !replaced.contains(&id)) {
                keep.insert(s.base_instant.as_str());
            }
        }
        let live = replaced_as_of.iter().any(|(t, r)| *t == latest && !r.contains(&id));
        if let (CleanPolicy::KeepLatestFileVersions(n), true) = (policy, live) {
            keep.extend(g.slices.keys().rev().take(n).map(String::as_str));
        }
        for (base_instant, slice) in &g.slices {
            // Slices of instants after the latest commit (a pending compaction's) stay.
            if keep.contains(base_instant.as_str()) || base_instant.as_str() > latest.as_str() {
                continue;
            }
            files.extend(slice_files(slice));
        }
    }
    files.sort();
    Ok(CleanPlan { policy: name.into(), earliest_instant_to_retain: earliest, files_to_delete: files })
}

fn slice_files(s: &FileSlice) -> Vec<String> {
    s.base.iter().map(|b| b.path.clone()).chain(s.logs.iter().map(|l| l.path.clone())).collect()
}

impl Table {
    /// Fails when a clean has deleted a file that the snapshot as of `time` reads: a time-travel
    /// read, an incremental window ending at `time`, or a rollback back to `time` would otherwise
    /// return a table with rows missing. `view` and `replaced` are the table's current file groups
    /// and the groups replaced as of `time`. Cleans written by Apache Hudi (Avro) are not read.
    pub async fn check_not_cleaned(
        &self,
        arg: &str,
        time: &str,
        view: &FileSystemView,
        replaced: &HashSet<FileGroupId>,
    ) -> Result<()> {
        let timeline = self.timeline();
        let cleans: Vec<&Instant> =
            timeline.instants().iter().filter(|i| i.action == Action::Clean && i.is_completed()).collect();
        if cleans.is_empty() || self.savepoints().iter().any(|s| s == time) {
            return Ok(());
        }
        for clean in cleans {
            let path = timeline.path_of(clean);
            let Ok(plan) = serde_json::from_slice::<CleanPlan>(&self.storage().get(&path).await?) else {
                ::log::debug!("clean {} is not ours (Avro): not checked", clean.time);
                continue;
            };
            for file in &plan.files_to_delete {
                let (partition, name) = file.rsplit_once('/').unwrap_or(("", file.as_str()));
                let slice = BaseFileName::parse(name)
                    .map(|b| (b.file_id, b.instant))
                    .or_else(|| LogFileName::parse(name).map(|l| (l.file_id, l.instant)));
                let Some((file_id, base_instant)) = slice else { continue };
                let id = (partition.to_string(), file_id);
                if base_instant.as_str() > time || replaced.contains(&id) {
                    continue;
                }
                // The deleted slice was the one read as of `time` unless a later one (still there)
                // starts at or before `time`.
                let later = view.get(&id).is_some_and(|g| {
                    g.slices
                        .range::<str, _>((Bound::Excluded(base_instant.as_str()), Bound::Included(time)))
                        .next()
                        .is_some()
                });
                if !later {
                    return Err(Error::invalid_arg(
                        arg,
                        format!(
                            "{time} is no longer readable: clean {} deleted {file}, which the table as of {time} \
                             reads (retain more commits, or savepoint the instants to keep)",
                            clean.time
                        ),
                    ));
                }
            }
        }
        Ok(())
    }
}
