//! Savepoints and restores. A savepoint `<t>.savepoint` keeps the table readable as of commit `t`:
//! the cleaner never removes the files of that snapshot. A restore rolls the table back to a
//! savepoint: every data instant completed after it is rolled back, newest first, under one
//! `restore` instant whose plan names them, so an interrupted restore is finished by the next run.

use std::sync::Arc;

use bytes::Bytes;
use serde::{Deserialize, Serialize};

use crate::commit::rollback_latest;
use crate::error::{Error, Result};
use crate::format::instant::{self, Action, Instant, State};
use crate::services::progress::{self, Progress};
use crate::table::Table;

/// What `<t>.savepoint` records.
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct SavepointMetadata {
    savepointed_by: String,
    savepointed_at: i64,
    comments: String,
    /// Files of the snapshot by partition.
    partition_metadata: std::collections::BTreeMap<String, Vec<String>>,
}

/// The plan of a restore.
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct RestorePlan {
    savepoint: String,
    instants_to_rollback: Vec<String>,
}

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
        let mut partition_metadata: std::collections::BTreeMap<String, Vec<String>> = Default::default();
        for s in &plan.slices {
            let files = s.base.iter().map(|b| b.path.clone()).chain(s.logs.iter().map(|l| l.path.clone()));
            partition_metadata.entry(s.partition.clone()).or_default().extend(files);
        }
        let meta = SavepointMetadata {
            savepointed_by: "oxlake".into(),
            savepointed_at: chrono::Utc::now().timestamp(),
            comments: String::new(),
            partition_metadata,
        };
        let sp = Instant::new(time, Action::Savepoint, State::Inflight);
        let storage = self.storage().clone();
        self.timeline().create(&storage, &sp, Bytes::new()).await?;
        crate::commit::failpoint("savepoint-after-inflight");
        let meta = serde_json::to_vec_pretty(&meta).map_err(Error::invalid_data)?;
        if !self.timeline().create(&storage, &sp.with_state(State::Completed), Bytes::from(meta)).await? {
            return Err(Error::invalid_arg("instant", format!("{} is already savepointed", sp.time)));
        }
        self.reload().await
    }

    /// The savepointed instants, oldest first.
    pub fn savepoints(&self) -> Vec<String> {
        self.timeline()
            .instants()
            .iter()
            .filter(|i| i.action == Action::Savepoint && i.is_completed())
            .map(|i| i.time.clone())
            .collect()
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
        if !self.savepoints().contains(&time) {
            return Err(Error::invalid_arg("instant", format!("{time} is not a savepoint")));
        }
        let mut later: Vec<String> =
            self.timeline().completed_data().filter(|i| i.time > time).map(|i| i.time.clone()).collect();
        later.reverse();
        let plan = RestorePlan { savepoint: time, instants_to_rollback: later };
        let bytes = Bytes::from(serde_json::to_vec_pretty(&plan).map_err(Error::invalid_data)?);
        let requested = crate::commit::claim(self, Action::Restore, |_| Ok(bytes.clone())).await?;
        finish(self, &requested, &plan, &progress).await?;
        // The rollbacks of a restore leave a record index stale (see `metadata::sync`).
        Box::pin(crate::metadata::catch_up(self)).await?;
        Ok(requested.time)
    }
}

/// Rolls back what the plan names that is still completed, then completes the restore.
async fn finish(
    table: &mut Table,
    requested: &Instant,
    plan: &RestorePlan,
    progress: &Option<Arc<Progress>>,
) -> Result<()> {
    let storage = table.storage().clone();
    progress::plan(progress, plan.instants_to_rollback.len() as u64, "commits");
    table.timeline().create(&storage, &requested.with_state(State::Inflight), Bytes::new()).await?;
    for target in &plan.instants_to_rollback {
        table.reload().await?;
        if table.timeline().completed_data().any(|i| &i.time == target) {
            rollback_latest(table, target).await?;
            crate::commit::failpoint("restore-after-rollback");
        }
        progress::advance(progress, 1);
    }
    let done = serde_json::to_vec_pretty(&plan).map_err(Error::invalid_data)?;
    table.timeline().create(&storage, &requested.with_state(State::Completed), Bytes::from(done)).await?;
    table.reload().await
}

/// Finishes restores interrupted by a crash (called before every write).
pub async fn finish_interrupted(table: &mut Table) -> Result<()> {
    let pending: Vec<Instant> = table.timeline().pending().filter(|i| i.action == Action::Restore).cloned().collect();
    for r in pending {
        let path = table.timeline().path_of(&r.with_state(State::Requested));
        let bytes = table.storage().get(&path).await?;
        let plan: RestorePlan = serde_json::from_slice(&bytes).map_err(|e| Error::corrupt(&path, e))?;
        finish(table, &r, &plan, &None).await?;
    }
    Ok(())
}
