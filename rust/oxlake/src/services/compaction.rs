//! Compaction of merge-on-read file groups: a plan (`c.compaction.requested`) names the slices to
//! compact; executing it writes one new base file per slice, named with `c`, holding the slice's
//! merged records, and completes `c` as a commit. Writers keep writing meanwhile: a log written after
//! `c` was planned is named with `c` and joins the new slice.

use std::sync::Arc;

use bytes::Bytes;
use datafusion::physical_plan::ExecutionPlan;
use futures::{StreamExt, TryStreamExt};
use object_store::buffered::BufWriter;
use parquet::arrow::AsyncArrowWriter;
use parquet::file::properties::WriterProperties;

use crate::commit::Transaction;
use crate::config::TableType;
use crate::error::{Error, Result};
use crate::format::commit::{CommitMetadata, WriteStat};
use crate::format::file_name::{BaseFileName, LogFileName, file_path};
use crate::format::instant::{Action, Instant, State};
use crate::read::mor_exec::{MergeContext, MergeOnReadExec, SliceScan};
use crate::services::progress::{self, Progress};
use crate::storage::Storage;
use crate::table::Table;
use crate::table::fs_view::LogFile;
use crate::write::WriteConfig;

pub use crate::format::compaction_plan::{CompactionOperation, CompactionPlan};
pub use crate::table::pending::{pending_compaction_groups, read_compaction_plan as read_plan};

/// How compaction chooses its slices.
#[derive(Clone, Debug)]
pub struct CompactionConfig {
    /// Slices with at least this many log files are compacted (1: every slice with logs).
    pub min_log_files: usize,
    /// How the new base files are written.
    pub write: WriteConfig,
    /// Counts file groups compacted, for a caller that shows progress.
    pub progress: Option<Arc<Progress>>,
}

impl Default for CompactionConfig {
    fn default() -> Self {
        CompactionConfig { min_log_files: 1, write: WriteConfig::default(), progress: None }
    }
}

/// What a compaction did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CompactionResult {
    /// Compaction instants completed by this call (pending plans first, then a new one).
    pub instants: Vec<String>,
    /// File slices compacted.
    pub file_groups: usize,
    /// Records written into the new base files.
    pub records: u64,
}

impl Table {
    /// Compacts merge-on-read file slices: executes pending compaction plans, then schedules and
    /// executes a new one over every slice with enough log files. Returns what was compacted.
    pub async fn compact(&mut self, config: &CompactionConfig) -> Result<CompactionResult> {
        match self.compact_once(config).await {
            Err(e) if crate::timeline::archived_meanwhile(&e) => {
                log::info!("{}: compaction: {e}; again on the timeline as it is now", self.uri());
                self.compact_once(config).await
            }
            other => other,
        }
    }

    async fn compact_once(&mut self, config: &CompactionConfig) -> Result<CompactionResult> {
        let mut result = CompactionResult::default();
        // Plans not started, or left by a run that is gone, first; then at most one new plan.
        while let Some(pending) = self.begin_compaction(config.min_log_files).await? {
            let fresh = pending.fresh;
            progress::plan(&config.progress, pending.plan.operations.len() as u64, "file groups");
            let operations: Vec<_> = pending.plan.operations.iter().cloned().enumerate().collect();
            let stats = match write_compacted(self, pending.time(), pending.epoch(), &operations, config).await {
                Ok(stats) => stats,
                Err(e) => return Err(pending.fail(self, e).await),
            };
            let done = pending.commit_in(self, stats, false).await?;
            result.file_groups += done.file_groups;
            result.records += done.records;
            result.instants.extend(done.instants);
            if fresh {
                break;
            }
        }
        Ok(result)
    }

    /// Begins the next compaction whose slices this process or others (the tasks of a Spark
    /// job, [`Table::compact_slices`]) write: the oldest plan not started, or left by a run that
    /// is gone (`rollback_failed` undid its files), else a new plan over the latest slice of
    /// every file group with at least `min_log_files` log files that no other plan holds. `None`
    /// when there is nothing to compact. The instant stays pending, with this process's
    /// heartbeat, until [`PendingCompaction::commit`] or [`PendingCompaction::abort`].
    pub async fn begin_compaction(&mut self, min_log_files: usize) -> Result<Option<PendingCompaction>> {
        if self.config().table_type != TableType::MergeOnRead {
            return Err(Error::invalid_arg("compact", "only merge-on-read tables have log files to compact"));
        }
        self.reload().await?;
        crate::commit::rollback_failed(self).await?;
        // An inflight plan with a live heartbeat belongs to another compactor. A plan closed by
        // another compactor (its owner was gone before it wrote one, see `slice_claims`) is
        // empty: it completes as an empty compaction, so that no plan stays pending for ever
        // (holding archival back); its requested file stays, so the owner's late create still
        // fails.
        let requested: Vec<Instant> = self
            .timeline()
            .pending()
            .filter(|i| i.action == Action::Compaction && i.state == State::Requested)
            .cloned()
            .collect();
        for requested in requested {
            let plan = read_plan(self, &requested.time).await?;
            let tx = match Transaction::resume(self, &requested.with_state(State::Requested)).await {
                Ok(tx) => tx,
                // Another compactor took the plan up between our look and our inflight file (or ran
                // it to completion, and an archival took it).
                Err(Error::CommitConflict { .. }) => continue,
                Err(e) => return Err(e),
            };
            return match settle(self, &requested.time, tx.epoch(), plan).await {
                Ok(plan) => Ok(Some(PendingCompaction { tx, plan, fresh: false })),
                Err(e) => Err(tx.fail(self, e).await),
            };
        }
        let plan = schedule(self, min_log_files).await?;
        if plan.operations.is_empty() {
            return Ok(None);
        }
        // The plan keeps the slices this compaction takes once its time is claimed: no slice is in
        // two plans, however many compactors run at once (`slice_claims`).
        let taken = Arc::new(std::sync::Mutex::new(CompactionPlan::default()));
        let (wanted, out) = (plan, taken.clone());
        let planned = Transaction::begin_planned(self, Action::Compaction, move |table, time| {
            let (wanted, out) = (wanted.clone(), out.clone());
            Box::pin(async move {
                // Beats while it takes slices: another compactor takes this one for gone only
                // once it stops (see `slice_claims`).
                let _beat = crate::commit::TaskHeartbeat::start(table, time).await?;
                let operations = crate::commit::slice_claims::take(table, time, wanted.operations).await?;
                let operations = crate::commit::slice_claims::keep_latest(table, time, operations).await?;
                if operations.is_empty() {
                    return Ok(None);
                }
                let ours = CompactionPlan { operations, version: wanted.version };
                let bytes = Bytes::from(ours.to_avro()?);
                *out.lock().map_err(|_| Error::invalid_data("a compaction plan's lock was poisoned"))? = ours;
                Ok(Some(bytes))
            })
        })
        .await?;
        let Some(tx) = planned else { return Ok(None) };
        let plan = std::mem::take(
            &mut *taken.lock().map_err(|_| Error::invalid_data("a compaction plan's lock was poisoned"))?,
        );
        // Writes that began after this compaction see its plan and name their logs with it (the
        // new slice); one that missed the plan fails its commit with a conflict. Writes that began
        // before it may still add logs to the slices it compacts: wait for them, then take their
        // logs in.
        match settle(self, tx.time(), tx.epoch(), plan).await {
            Ok(plan) => Ok(Some(PendingCompaction { tx, plan, fresh: true })),
            Err(e) => Err(tx.fail(self, e).await),
        }
    }

    /// The deltacommits since the last compaction, when they reach the table's `inline_compaction`
    /// setting: a write that lands then compacts (inline, or on a Spark driver's executors).
    pub fn compaction_due(&self) -> Option<usize> {
        let every = self.config().inline_compaction?;
        // On a merge-on-read table every completed `commit` is a compaction.
        let since = self
            .timeline()
            .completed_data()
            .rev()
            .take_while(|i| i.action != Action::Commit)
            .filter(|i| i.action == Action::DeltaCommit)
            .count();
        (since >= every as usize).then_some(since)
    }

    /// Writes the compacted base files of `operations` (each with its index in the plan) of the
    /// pending compaction `time`, attempt `epoch` ([`PendingCompaction::epoch`]): the task side
    /// of a compaction spread over processes. Commits nothing; the stats go to the driver's
    /// [`PendingCompaction::commit`]. `config.task` names the attempt, so that two attempts at
    /// one slice never write the same file.
    pub async fn compact_slices(
        &mut self,
        time: &str,
        epoch: u32,
        operations: &[(usize, CompactionOperation)],
        config: &WriteConfig,
    ) -> Result<Vec<(String, WriteStat)>> {
        self.check_compacting(time, epoch).await?;
        let _beating = crate::commit::TaskHeartbeat::start(self, time).await?;
        let config = CompactionConfig { write: config.clone(), ..CompactionConfig::default() };
        let stats = write_compacted(self, time, epoch, operations, &config).await?;
        // A task that outlived its attempt (rolled back while it wrote: a slow task, a
        // speculative copy) removes what it wrote: nobody else knows of those files.
        if let Err(e) = self.check_compacting(time, epoch).await {
            for path in stats.iter().filter_map(|(_, s)| s.path.as_deref()) {
                if let Err(gone) = self.storage().delete(path).await {
                    log::warn!("{}: {path} of a stale compaction attempt left behind: {gone}", self.uri());
                }
            }
            return Err(e);
        }
        Ok(stats)
    }

    /// Fails unless the compaction `time` is running (inflight) at attempt `epoch`.
    async fn check_compacting(&mut self, time: &str, epoch: u32) -> Result<()> {
        self.reload().await?;
        let running = self
            .timeline()
            .pending()
            .any(|i| i.time == time && i.action == Action::Compaction && i.state == State::Inflight);
        if !running {
            return Err(Error::invalid_arg("instant", format!("{time} is not a running compaction of this table")));
        }
        let current = crate::commit::current_epoch(self, time).await?;
        if current != epoch {
            return Err(Error::CommitConflict {
                instant: time.to_string(),
                detail: format!("attempt {epoch} of compaction {time} was rolled back (now attempt {current})"),
            });
        }
        Ok(())
    }
}

/// A compaction begun by [`Table::begin_compaction`]: its plan is settled and its instant pending
/// (inflight) until it is committed or aborted. Dropped without either, its heartbeat stops and
/// the next writer rolls it back to its plan, which a later compaction runs.
pub struct PendingCompaction {
    tx: Transaction,
    plan: CompactionPlan,
    fresh: bool,
}

impl PendingCompaction {
    /// The compaction's instant time.
    pub fn time(&self) -> &str {
        self.tx.time()
    }

    /// The attempt at the instant (see [`Transaction::epoch`]); goes into the names of the files.
    pub fn epoch(&self) -> u32 {
        self.tx.epoch()
    }

    /// The slices to compact: one new base file each.
    pub fn operations(&self) -> &[CompactionOperation] {
        &self.plan.operations
    }

    /// Whether the plan is new (not one found pending).
    pub fn is_new(&self) -> bool {
        self.fresh
    }

    /// Completes the compaction with the stats of the base files the tasks wrote, one per
    /// planned slice; any other base file of this attempt in those partitions (a failed or
    /// duplicate task's) is deleted first. A slice without its file, or with two, fails
    /// the compaction (rolled back, the plan kept for the next run): completing it would leave
    /// the file group's new slice without the records of the old one.
    pub async fn commit(self, table: &mut Table, stats: Vec<(String, WriteStat)>) -> Result<CompactionResult> {
        self.commit_in(table, stats, true).await
    }

    /// Rolls the attempt back: its base files are deleted, every log stays (they belong to
    /// committed writes), and the plan waits for the next compaction.
    pub async fn abort(self, table: &mut Table) -> Result<()> {
        self.tx.abort(table).await.map(drop)
    }

    async fn fail(self, table: &mut Table, error: Error) -> Error {
        // A planned log of a write rolled back since (its writer failed while this waited): a
        // conflict, retried, not a storage failure.
        let error = self.tx.lost_to_service(table, error).await;
        self.tx.fail(table, error).await
    }

    async fn commit_in(
        self,
        table: &mut Table,
        stats: Vec<(String, WriteStat)>,
        reconcile: bool,
    ) -> Result<CompactionResult> {
        if let Err(e) = check_one_file_per_slice(&self.plan, &stats) {
            return Err(self.tx.fail(table, e).await);
        }
        if reconcile && let Err(e) = self.remove_unreported(table, &stats).await {
            return Err(self.tx.fail(table, e).await);
        }
        let mut result = CompactionResult { file_groups: self.plan.operations.len(), ..Default::default() };
        let mut metadata =
            CommitMetadata { operation_type: Some("COMPACT".into()), compacted: true, ..Default::default() };
        if let Err(e) = metadata.set_schema(&table.data_schema(), &table.config().name) {
            return Err(self.tx.fail(table, e).await);
        }
        for (partition, stat) in stats {
            result.records += stat.num_writes as u64;
            metadata.partition_to_write_stats.entry(partition).or_default().push(stat);
        }
        let instant = self.tx.commit(table, &metadata).await?;
        if let Err(e) = crate::commit::slice_claims::forget(table, &instant.time, &self.plan).await {
            log::warn!("{}: the claims of compaction {} stay until pruned: {e}", table.uri(), instant.time);
        }
        result.instants.push(instant.time);
        Ok(result)
    }
}

/// A planned slice as it travels to the task that compacts it ([`Table::compact_slices`]).
pub fn operation_to_json(op: &CompactionOperation) -> Result<Vec<u8>> {
    serde_json::to_vec(op).map_err(Error::invalid_data)
}

/// [`operation_to_json`] read back.
pub fn operation_from_json(bytes: &[u8]) -> Result<CompactionOperation> {
    serde_json::from_slice(bytes).map_err(|e| Error::invalid_arg("compaction operation", e))
}

/// A task's compacted files as they travel to the driver ([`PendingCompaction::commit`]).
pub fn stats_to_json(stats: &[(String, WriteStat)]) -> Result<Vec<u8>> {
    serde_json::to_vec(stats).map_err(Error::invalid_data)
}

/// [`stats_to_json`] read back.
pub fn stats_from_json(bytes: &[u8]) -> Result<Vec<(String, WriteStat)>> {
    serde_json::from_slice(bytes).map_err(|e| Error::invalid_arg("compacted files", e))
}

impl PendingCompaction {
    /// Deletes the base files this attempt's tasks wrote that `stats` does not report (tasks that
    /// died, or lost to a speculative copy): base files in the planned partitions named with this
    /// instant and this attempt's epoch. Another attempt's files (a stale driver's, after a
    /// rollback) carry another epoch; logs are never a compaction's.
    async fn remove_unreported(&self, table: &Table, stats: &[(String, WriteStat)]) -> Result<()> {
        let kept: std::collections::HashSet<&str> = stats.iter().filter_map(|(_, s)| s.path.as_deref()).collect();
        let partitions: std::collections::BTreeSet<&str> =
            self.plan.operations.iter().map(|op| op.partition_path.as_str()).collect();
        let partitions: Vec<&str> = partitions.into_iter().collect();
        let epoch = self.tx.epoch().to_string();
        let whose = crate::commit::Leftovers::Compaction { epoch: &epoch };
        crate::commit::remove_unreported_files(table.storage(), self.tx.time(), &partitions, &kept, whose).await?;
        Ok(())
    }
}

/// Refuses stats that do not name exactly one new base file for every planned slice, and
/// nothing else.
fn check_one_file_per_slice(plan: &CompactionPlan, stats: &[(String, WriteStat)]) -> Result<()> {
    let mut planned: std::collections::HashMap<(&str, &str), usize> =
        plan.operations.iter().map(|op| ((op.partition_path.as_str(), op.file_id.as_str()), 0)).collect();
    for (partition, stat) in stats {
        match planned.get_mut(&(partition.as_str(), stat.file_id.as_str())) {
            Some(count) => *count += 1,
            None => {
                return Err(Error::invalid_data(format!(
                    "compaction stats name file group {} in partition `{partition}`, which the plan does not compact",
                    stat.file_id
                )));
            }
        }
    }
    match planned.iter().find(|(_, count)| **count != 1) {
        Some(((partition, file_id), count)) => Err(Error::invalid_data(format!(
            "compaction stats name {count} new base files for file group {file_id} in partition `{partition}`, \
             which needs exactly one"
        ))),
        None => Ok(()),
    }
}

/// How often a new compaction looks again at the writes that began before it.
const SETTLE_POLL: std::time::Duration = std::time::Duration::from_millis(25);

/// Waits until no write that may still add a log to the slices `plan` compacts is pending
/// (rolling back those whose writer is gone): every write that began before the compaction
/// `time`, and every deltacommit pending when the plan became visible, whatever its time (its
/// time is claimed before its plan is visible, so a later write may have planned and checked
/// without seeing it). Returns the plan with every log that completed writes added to those
/// slices, and records it when it changed (a write that committed while the plan was being made;
/// a plan resumed later).
async fn settle(table: &mut Table, time: &str, epoch: u32, mut plan: CompactionPlan) -> Result<CompactionPlan> {
    let mut watch = crate::commit::HeartbeatWatch::default();
    // The deltacommits later than `time` pending at the first look: those that appear afterwards
    // check their logs against this plan (`commit::conflicts`), which they can see.
    let mut later: Option<std::collections::HashSet<String>> = None;
    loop {
        table.reload().await?;
        let pending: Vec<Instant> = table.timeline().pending().filter(|i| i.action.writes_data()).cloned().collect();
        let later = later.get_or_insert_with(|| {
            let deltas = pending.iter().filter(|i| i.action == Action::DeltaCommit && i.time.as_str() > time);
            deltas.map(|i| i.time.clone()).collect()
        });
        let earlier: Vec<Instant> =
            pending.into_iter().filter(|i| i.time.as_str() < time || later.contains(&i.time)).collect();
        if earlier.is_empty() {
            break;
        }
        crate::commit::rollback_failed(table).await?;
        // A writer that is alive refreshes its heartbeat; one whose heartbeat stands still but
        // never expires (a time in the future: clock skew, a damaged file) would be waited for
        // forever.
        for other in &earlier {
            watch.check(table, other, &format!("compaction {time}")).await?;
        }
        tokio::time::sleep(SETTLE_POLL).await;
    }
    // Logs join a slice after its base instant: only the writes since the oldest base may have
    // added one the plan lacks, later than this compaction's time too (see above); a log a later
    // write named for this compaction's slice records this time as its base, not the planned one.
    let changed = match table.timeline().layout() {
        1 => take_logs_by_base(table, &mut plan).await?,
        _ => {
            // Layout 2: the logs completed before this compaction's time on its slices.
            let missing = crate::table::pending::logs_missing_from_plan(table, time, &plan).await?;
            for (index, path, _) in &missing {
                if let Some(op) = plan.operations.get_mut(*index) {
                    op.delta_file_paths.push(path.clone());
                }
            }
            !missing.is_empty()
        }
    };
    check_latest(table, time, &plan).await?;
    if changed {
        log::info!("{}: compaction {time} takes the logs that concurrent writes added", table.uri());
        // This attempt may have stalled here past its heartbeat (a paused process): rolled back
        // since, its plan run by another compactor and archived, the plan written again would
        // bring a pending compaction back before the archived commits. So the attempt must
        // still be running: its inflight file there, no fate recorded for it.
        let requested = Instant::new(time, Action::Compaction, State::Requested);
        let inflight = table.timeline().path_of(&requested.with_state(State::Inflight));
        let decided = crate::commit::fate_recorded(table, time, epoch).await?;
        if decided || table.storage().head(&inflight).await?.is_none() {
            let detail = format!("compaction {time} was rolled back while it waited for earlier writes");
            return Err(Error::CommitConflict { instant: time.to_string(), detail });
        }
        table.storage().put(&table.timeline().path_of(&requested), Bytes::from(plan.to_avro()?)).await?;
    }
    Ok(plan)
}

/// Timeline layout 1: adds to `plan` the logs completed writes named for a planned slice (their
/// `prevCommit` is its base instant) that it lacks. Returns whether it added any.
async fn take_logs_by_base(table: &Table, plan: &mut CompactionPlan) -> Result<bool> {
    let oldest = plan.operations.iter().map(|op| op.base_instant_time.as_str()).min().unwrap_or_default().to_string();
    let since: Vec<Instant> = table
        .timeline()
        .completed_data()
        .filter(|i| i.action == Action::DeltaCommit && i.time >= oldest)
        .cloned()
        .collect();
    let mut changed = false;
    for other in since {
        let meta = table.timeline().commit_metadata(table.storage(), &other).await?;
        for (partition, stat) in meta.write_stats().filter(|(_, s)| s.log_files.is_some()) {
            let op = plan.operations.iter_mut().find(|op| {
                op.partition_path == partition
                    && op.file_id == stat.file_id
                    && stat.prev_commit.as_deref() == Some(op.base_instant_time.as_str())
            });
            if let (Some(op), Some(path)) = (op, stat.path.as_ref())
                && !op.delta_file_paths.contains(path)
            {
                op.delta_file_paths.push(path.clone());
                changed = true;
            }
        }
    }
    Ok(changed)
}

/// Fails with a conflict when a slice of `plan` is no longer the latest of its file group: storage
/// holds a base file of the group written by a committed instant after the slice's base. A plan
/// made from a listing that missed that file (a stale metadata table) would compact the older
/// slice and supersede the later one's rows. One listing per planned partition, from storage.
async fn check_latest(table: &Table, time: &str, plan: &CompactionPlan) -> Result<()> {
    let newer = crate::commit::slice_claims::newer_bases(table, table.timeline(), &plan.operations, Some(time)).await?;
    let Some((op, path)) = newer.first().and_then(|(i, path)| Some((plan.operations.get(*i)?, path))) else {
        return Ok(());
    };
    log::warn!(
        "{}: compaction {time} planned slice {} of file group {}, which {path} superseded",
        table.uri(),
        op.base_instant_time,
        op.file_id
    );
    let detail = format!(
        "compaction {time} planned slice {} of file group {} from a listing without the later base file {path}",
        op.base_instant_time, op.file_id
    );
    let instant = BaseFileName::parse(path.rsplit('/').next().unwrap_or(path)).map(|b| b.instant).unwrap_or_default();
    Err(Error::CommitConflict { instant, detail })
}

/// The latest slice of every file group with enough log files, not already in a pending plan.
async fn schedule(table: &Table, min_log_files: usize) -> Result<CompactionPlan> {
    let Some(latest) = table.timeline().latest_completed_data().map(|i| i.time.clone()) else {
        return Ok(CompactionPlan::default());
    };
    let pending = pending_compaction_groups(table).await?;
    let clustering = crate::services::pending_clustering_groups(table).await?;
    let view = table.file_system_view().await?;
    let replaced = table.replaced_file_groups(&latest).await?;
    let mut operations = Vec::new();
    for (g, s) in view.slices_as_of(&latest, &replaced) {
        if s.logs.len() < min_log_files.max(1) || pending.contains_key(&g.id()) || clustering.contains(&g.id()) {
            continue;
        }
        operations.push(CompactionOperation {
            partition_path: g.partition.clone(),
            file_id: g.file_id.clone(),
            base_instant_time: s.base_instant.clone(),
            data_file_path: s.base.as_ref().map(|b| b.path.clone()),
            delta_file_paths: s.logs.iter().map(|l| l.path.clone()).collect(),
        });
    }
    Ok(CompactionPlan { operations, version: 1 })
}

/// One merged base file per operation, `config.write.parallelism` at a time.
async fn write_compacted(
    table: &Table,
    instant: &str,
    epoch: u32,
    operations: &[(usize, CompactionOperation)],
    config: &CompactionConfig,
) -> Result<Vec<(String, WriteStat)>> {
    // Every log block of a committed instant before the compaction belongs to the old slice.
    let ctx = MergeContext::all_columns(table, instant)?;
    let ctx = Arc::new(ctx);
    let session = crate::read::session(table, None, None)?;
    let task = session.task_ctx();
    let ops = operations.iter().cloned();
    let storage = table.storage().clone();
    futures::stream::iter(ops)
        .map(|(index, op)| {
            let (ctx, task, storage) = (ctx.clone(), task.clone(), storage.clone());
            let props = crate::format::base_file::writer_properties(config.write.row_group_size);
            let progress = config.progress.clone();
            async move {
                let slice = SliceScan {
                    partition: op.partition_path.clone(),
                    file_id: op.file_id.clone(),
                    base: match &op.data_file_path {
                        Some(p) => Some((p.clone(), planned_base_size(&storage, p).await?)),
                        None => None,
                    },
                    rows: None,
                    logs: logs_of(&storage, &op).await?,
                    keys_of: None,
                };
                let exec = MergeOnReadExec::try_new(vec![vec![slice]], (*ctx).clone())?;
                let stream = exec.execute(0, task)?;
                let name = BaseFileName {
                    file_id: op.file_id.clone(),
                    // Each attempt at the instant, and each task attempt of a distributed one,
                    // writes files of its own: a stale earlier attempt (rolled back while paused)
                    // cleans up only what it wrote.
                    write_token: format!("{index}-{epoch}-{}", config.write.task.attempt),
                    instant: instant.to_string(),
                };
                let rel = file_path(&op.partition_path, &name.name());
                let rows = write_stream(&storage, &rel, ctx.table_schema.clone(), props, stream).await?;
                let size = storage.head(&rel).await?.map(|m| m.size).unwrap_or_default() as i64;
                let stat = WriteStat {
                    file_id: op.file_id.clone(),
                    path: Some(rel),
                    prev_commit: Some(op.base_instant_time.clone()),
                    partition_path: Some(op.partition_path.clone()),
                    num_writes: rows as i64,
                    total_write_bytes: size,
                    file_size_in_bytes: size,
                    ..Default::default()
                };
                progress::advance(&progress, 1);
                Ok::<_, Error>((op.partition_path, stat))
            }
        })
        .buffer_unordered(config.write.parallelism.max(1))
        .try_collect()
        .await
}

/// The size of a planned slice's base file. Gone, it is a storage `NotFound` (read as a file of
/// zero bytes it was a corrupt Parquet file): a compactor that lost its plan to another (its
/// heartbeat missed, the other completed the plan and a clean then removed the old slice) reads
/// that as a conflict (`Transaction::lost_to_service`), not as damage.
async fn planned_base_size(storage: &Storage, path: &str) -> Result<u64> {
    match storage.head(path).await? {
        Some(meta) => Ok(meta.size),
        None => {
            let why = "a planned base file gone before the compaction read it";
            let source = object_store::Error::NotFound { path: path.to_string(), source: why.into() };
            Err(Error::storage(path, source))
        }
    }
}

/// The planned log files, with their sizes.
async fn logs_of(storage: &Storage, op: &CompactionOperation) -> Result<Vec<LogFile>> {
    let mut out = Vec::new();
    for path in &op.delta_file_paths {
        let name = path.rsplit('/').next().unwrap_or(path);
        let name = LogFileName::parse(name).ok_or_else(|| Error::corrupt(path, "not a log file name"))?;
        // A planned log may be gone if an interrupted run already finished it: then it is skipped.
        if let Some(meta) = storage.head(path).await? {
            out.push(LogFile { name, path: path.clone(), size: meta.size });
        }
    }
    Ok(out)
}

/// Streams record batches into a new Parquet file; returns the rows written.
pub(crate) async fn write_stream(
    storage: &Storage,
    rel: &str,
    schema: arrow::datatypes::SchemaRef,
    props: WriterProperties,
    mut stream: datafusion::execution::SendableRecordBatchStream,
) -> Result<u64> {
    let sink = BufWriter::new(storage.object_store(), storage.path(rel));
    let mut writer = AsyncArrowWriter::try_new(sink, schema, Some(props))?;
    let mut rows = 0u64;
    while let Some(batch) = stream.next().await {
        let batch = batch?;
        rows += batch.num_rows() as u64;
        writer.write(&batch).await?;
    }
    writer.close().await?;
    Ok(rows)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::avro;
    use crate::services::ArchiveConfig;
    use crate::table::TableOptions;
    use crate::test_support::{corpus_file, id_city_rows, id_city_table};
    use crate::write::WriteOperation;

    /// Found by the stress suite: a compactor listed a plan pending; another ran it, and an
    /// archival took it; the first then took the plan up, made an inflight file and completed
    /// the instant again. Active again, it was older than every commit archived with it, whose
    /// files then read as uncommitted: their rows vanished from reads.
    #[tokio::test]
    async fn a_plan_completed_and_archived_since_it_was_listed_is_not_taken_up_again() {
        let dir = tempfile::tempdir().unwrap();
        let options = TableOptions { heartbeat_interval: std::time::Duration::from_millis(20), ..Default::default() };
        let mut t = id_city_table(dir.path(), TableType::MergeOnRead, options).await;
        let config = WriteConfig::default();
        let write = |rows: &[(i64, &str)]| vec![id_city_rows(rows)];
        t.write(WriteOperation::Insert, write(&[(1, "sf"), (2, "nyc")]), &config).await.unwrap();
        t.write(WriteOperation::Upsert, write(&[(1, "sf")]), &config).await.unwrap();
        let first = t.compact(&CompactionConfig::default()).await.unwrap().instants.remove(0);
        t.write(WriteOperation::Upsert, write(&[(2, "nyc"), (3, "la")]), &config).await.unwrap();
        t.compact(&CompactionConfig::default()).await.unwrap();
        t.write(WriteOperation::Upsert, write(&[(4, "sf")]), &config).await.unwrap();
        let archived = t.archive(ArchiveConfig::new(1, 2).unwrap()).await.unwrap().archived;
        assert!(archived.iter().any(|i| i.time == first), "{archived:?}");
        let rows = id_and_city(&t).await;
        assert_eq!(rows.len(), 4);

        let listed = Instant::new(first.clone(), Action::Compaction, State::Requested);
        let taken = Transaction::resume(&mut t, &listed).await;
        assert!(matches!(taken, Err(Error::CommitConflict { .. })), "{:?}", taken.map(|_| ()));
        t.reload().await.unwrap();
        assert!(t.timeline().instants_at(&first).is_empty(), "the archived instant stays archived");
        let names: Vec<String> = t.storage().list_dir(".hoodie").await.unwrap().into_iter().map(|f| f.path).collect();
        assert!(!names.iter().any(|n| n.contains(first.as_str())), "{names:?}");
        assert_eq!(id_and_city(&t).await, rows, "every committed row still reads");
        // A compactor that died between that create and its delete leaves the inflight file
        // alone: it is no instant (pending, it would move the write timeline's start back before
        // the archived commits), and nothing of the archived compaction is undone for it.
        let lone = t.timeline().path_of(&listed.with_state(State::Inflight));
        t.storage().put(&lone, Bytes::new()).await.unwrap();
        t.reload().await.unwrap();
        assert!(t.timeline().instants_at(&first).is_empty());
        assert_eq!(t.timeline().leftovers().len(), 1);
        assert_eq!(id_and_city(&t).await, rows);
        // Once its heartbeat expired, the next writer's recovery deletes the file, and only it.
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        crate::commit::rollback_failed(&mut t).await.unwrap();
        assert!(t.storage().head(&lone).await.unwrap().is_none(), "the leftover is removed");
        t.reload().await.unwrap();
        assert!(t.timeline().leftovers().is_empty());
        assert_eq!(id_and_city(&t).await, rows);
    }

    async fn id_and_city(table: &Table) -> Vec<(i64, String)> {
        use arrow::array::{AsArray, RecordBatch};
        use arrow::datatypes::Int64Type;
        let scan = table.scan(&crate::read::ScanOptions::default()).await.unwrap();
        let batches: Vec<RecordBatch> = scan.try_collect().await.unwrap();
        let mut rows: Vec<(i64, String)> = batches
            .iter()
            .flat_map(|b| {
                let ids = b.column_by_name("id").unwrap().as_primitive::<Int64Type>().clone();
                let cities = b.column_by_name("city").unwrap().as_string::<i32>().clone();
                (0..b.num_rows()).map(move |i| (ids.value(i), cities.value(i).to_string()))
            })
            .collect();
        rows.sort();
        rows
    }

    #[test]
    #[cfg_attr(
        not(hudi_corpus),
        ignore = "needs the Apache Hudi corpus: set OXLAKE_SHARED to the folder holding compat/"
    )]
    fn reads_the_avro_plans_apache_hudi_writes() {
        let table = "sample_table/mor/avro/v9_txns_simple_nometa.zip";
        let path = ".hoodie/timeline/20260307135839895.compaction.requested";
        let plan = CompactionPlan::parse(path, &corpus_file(table, path)).unwrap();
        let us = "db2fca8f-03b7-4da7-b042-4b617ab79b9d-0";
        let apac = "9c6ed25b-6c9d-4793-ad27-1c8518086b6a-0";
        let op = |file_id: &str| plan.operations.iter().find(|o| o.file_id == file_id).unwrap().clone();
        assert_eq!(plan.operations.len(), 2, "{plan:?}");
        assert_eq!(
            op(us),
            CompactionOperation {
                partition_path: "region=us".into(),
                file_id: us.into(),
                base_instant_time: "20260307135827749".into(),
                data_file_path: Some(format!("region=us/{us}_1-3-7_20260307135827749.parquet")),
                delta_file_paths: vec![
                    format!("region=us/.{us}_20260307135830801.log.1_0-10-23"),
                    format!("region=us/.{us}_20260307135832616.log.1_0-17-38"),
                ],
            }
        );
        assert_eq!(op(apac).delta_file_paths, vec![format!("region=apac/.{apac}_20260307135835748.log.1_0-38-83")]);
        assert_eq!(op(apac).partition_path, "region=apac");
        // Every planned log parses as a log file of its group, written after the slice's base
        // (table version 9 names a log with its own deltacommit).
        for op in &plan.operations {
            for log in &op.delta_file_paths {
                let name = LogFileName::parse(log.rsplit('/').next().unwrap()).unwrap();
                assert_eq!(name.file_id, op.file_id);
                assert!(name.instant > op.base_instant_time, "{log}");
            }
        }
    }

    #[test]
    #[cfg_attr(
        not(hudi_corpus),
        ignore = "needs the Apache Hudi corpus: set OXLAKE_SHARED to the folder holding compat/"
    )]
    fn our_avro_plans_round_trip_and_damaged_plans_are_typed_errors() {
        let plan = CompactionPlan {
            operations: vec![CompactionOperation {
                partition_path: "p=1".into(),
                file_id: "f".into(),
                base_instant_time: "20240101000000000".into(),
                data_file_path: None,
                delta_file_paths: vec!["p=1/.f_20240101000000000.log.1_0-1-1".into()],
            }],
            version: 2,
        };
        let avro = plan.to_avro().unwrap();
        assert!(avro::is_container(&avro));
        assert_eq!(CompactionPlan::parse("p", &avro).unwrap(), plan);
        // Java's reader finds file names (version 2), not paths.
        let (_, records) = avro::read_container_with_schema(&avro).unwrap();
        assert_eq!(records[0]["operations"][0]["deltaFilePaths"][0], ".f_20240101000000000.log.1_0-1-1");
        assert_eq!(records[0]["version"], 2);
        // The JSON plans of earlier oxlake versions still read.
        let json = serde_json::to_vec(&plan).unwrap();
        assert_eq!(CompactionPlan::parse("p", &json).unwrap(), plan);
        let avro = corpus_file(
            "sample_table/mor/avro/v9_txns_simple_nometa.zip",
            ".hoodie/timeline/20260307135839895.compaction.requested",
        );
        for damaged in [&b"{nope"[..], &avro[..avro.len() / 2]] {
            assert!(matches!(CompactionPlan::parse("p", damaged), Err(Error::CorruptTable { .. })));
        }
    }
}
