//! The commit protocol: how a write becomes visible, atomically, or not at all.
//!
//! A write of instant `t` (DESIGN.md §3):
//! 1. `t.<action>.requested` is created with a conditional put: this claims `t`. Times are UTC
//!    `yyyyMMddHHmmssSSS`, strictly increasing; on a clash the writer takes the next one.
//!    A heartbeat file `.hoodie/.heartbeat/t` is written first and refreshed while the write runs.
//! 2. `t.<action>.inflight`, then the data files, each named with `t`.
//! 3. (Seam for the metadata table: its deltacommit `t` completes here, before step 4.)
//! 4. The conflict check ([`conflicts`]): the write's footprint (file groups, keys) is published as
//!    an intent, then every data instant completed since the writer began, and every other write
//!    committing now, must have a footprint disjoint from `t`'s; otherwise the write is rolled back
//!    and fails with [`Error::CommitConflict`] naming the other instant.
//! 5. `t.<action>`, the completed instant, created last with a conditional put. Its appearance is
//!    the commit: before it no reader sees any of `t`'s files (readers keep only files of completed
//!    instants), after it all of them.
//!
//! A crash anywhere leaves `t` pending. The next writer finds it with an expired heartbeat and rolls
//! it back: `r.rollback.requested` naming `t`, `r.rollback.inflight`, `t`'s data files deleted,
//! `r.rollback` completed, then `t`'s pending files removed. Each step is idempotent, so a crash
//! during a rollback is finished by the writer after.

mod conflicts;
mod fate;
pub(crate) mod slice_claims;

use std::collections::HashSet;
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use futures::future::BoxFuture;
use serde::{Deserialize, Serialize};
use tokio::task::JoinHandle;

use crate::error::{Error, Result};
use crate::format::commit::CommitMetadata;
use crate::format::file_name::{self, BaseFileName, LogFileName};
use crate::format::instant::{self, Action, Instant, State};
use crate::format::rollback::{
    self, InstantInfo, RollbackMetadata, RollbackPartitionMetadata, RollbackPlan, RollbackRequest,
};
use crate::storage::{FileInfo, Storage};
use crate::table::Table;
use crate::table::fs_view::FileGroupId;
use crate::timeline::Timeline;

const HEARTBEAT_DIR: &str = ".hoodie/.heartbeat";
/// A heartbeat older than this many intervals means the writer is gone.
const HEARTBEAT_TOLERANCE: u32 = 3;
/// How many instant times a writer tries before giving up on a busy table.
const CLAIM_ATTEMPTS: usize = 20;
/// Markers of the instant times claimed (see [`claim`]).
const CLAIMS_DIR: &str = ".hoodie/oxlake/claims";
/// Markers of archivals, `<when>_<cutoff>` (see [`claim_with`] and `services::archive`).
pub(crate) const ARCHIVING_DIR: &str = ".hoodie/oxlake/archiving";
/// Claim markers older than this are removed by cleans: instant times follow the clock, so no
/// writer claims a time that old.
const CLAIMS_KEPT: Duration = Duration::from_secs(24 * 3600);

/// Removes the claim markers older than [`CLAIMS_KEPT`].
pub(crate) async fn prune_claims(table: &Table) -> Result<()> {
    let cutoff = chrono::Utc::now().naive_utc() - chrono::TimeDelta::from_std(CLAIMS_KEPT).unwrap_or_default();
    let cutoff = cutoff.format("%Y%m%d%H%M%S%3f").to_string();
    fate::prune(table, &cutoff).await?;
    slice_claims::prune(table, &cutoff).await?;
    for dir in [CLAIMS_DIR, ARCHIVING_DIR] {
        for f in table.storage().list_dir(dir).await? {
            let name = f.path.rsplit('/').next().unwrap_or_default();
            if name.get(..17).is_some_and(|t| t < cutoff.as_str()) {
                table.storage().delete(&f.path).await?;
            }
        }
    }
    Ok(())
}

/// The latest cutoff at or after `time` of an archival marked in [`ARCHIVING_DIR`], if any.
async fn archival_past(table: &Table, time: &str) -> Result<Option<String>> {
    let markers = table.storage().list_dir(ARCHIVING_DIR).await?;
    Ok(markers
        .iter()
        .filter_map(|f| f.path.rsplit('/').next()?.split_once('_').map(|(_, cutoff)| cutoff.to_string()))
        .filter(|cutoff| cutoff.as_str() >= time)
        .max())
}

/// Makes the plan of an instant once its time is claimed (see [`claim_with`]); `None`: nothing
/// to do. The future owns what it uses besides the table and the time.
pub trait PlanFn: for<'a> Fn(&'a Table, &'a str) -> BoxFuture<'a, Result<Option<Bytes>>> + Send + Sync {}
impl<F> PlanFn for F where F: for<'a> Fn(&'a Table, &'a str) -> BoxFuture<'a, Result<Option<Bytes>>> + Send + Sync {}

/// A plan already made, as a [`PlanFn`]'s future.
fn ready<'a>(plan: Result<Option<Bytes>>) -> BoxFuture<'a, Result<Option<Bytes>>> {
    Box::pin(std::future::ready(plan))
}

/// A write in progress: an instant claimed on the timeline and its heartbeat.
#[derive(Debug)]
pub struct Transaction {
    instant: Instant,
    /// The completed data instants when the write began; anything completed later is checked.
    seen: HashSet<String>,
    /// The completed cleans when the write began: a data file gone since was removed by one.
    services: HashSet<String>,
    /// The attempt at this instant time (see [`fate`]): rollbacks of earlier attempts finished.
    epoch: u32,
    /// The table's schema when the write began: a commit recording another evolves it.
    schema_at_begin: arrow::datatypes::SchemaRef,
    heartbeat: Option<JoinHandle<()>>,
}

#[derive(Serialize)]
struct HandOver<'a> {
    time: String,
    action: &'a str,
    seen: &'a HashSet<String>,
}

#[derive(Deserialize)]
struct HandOverOwned {
    time: String,
    action: String,
    seen: HashSet<String>,
}

/// Keeps the heartbeat of a pending instant beating while a task of a distributed write works
/// on it (the driver may be idle meanwhile); stops when dropped.
pub struct TaskHeartbeat(JoinHandle<()>);

impl TaskHeartbeat {
    pub async fn start(table: &Table, time: &str) -> Result<Self> {
        write_heartbeat(table.storage(), time).await?;
        Ok(TaskHeartbeat(spawn_heartbeat(
            table.storage().clone(),
            time.to_string(),
            table.options().heartbeat_interval,
        )))
    }
}

impl Drop for TaskHeartbeat {
    fn drop(&mut self) {
        self.0.abort();
    }
}

impl Transaction {
    /// Rolls back crashed writes, then claims a new instant for `action` and marks it inflight.
    pub async fn begin(table: &mut Table, action: Action) -> Result<Self> {
        Self::begin_with(table, action, |_| Ok(Bytes::new())).await
    }

    /// [`Transaction::begin`] with the requested file holding a plan made for the claimed time
    /// (compaction, clustering, clean).
    pub async fn begin_with(
        table: &mut Table,
        action: Action,
        plan: impl Fn(&str) -> Result<Bytes> + Send + Sync,
    ) -> Result<Self> {
        let tx = Self::begin_planned(table, action, |_, time| ready(plan(time).map(Some))).await?;
        tx.ok_or_else(|| Error::invalid_data("a plan came out empty"))
    }

    /// [`Transaction::begin_with`] with a plan made once the instant time is claimed (see
    /// [`claim_with`]); `None` when the plan came out empty (no instant is created).
    pub async fn begin_planned(table: &mut Table, action: Action, plan: impl PlanFn) -> Result<Option<Self>> {
        table.reload().await?;
        rollback_failed(table).await?;
        if action != Action::Indexing {
            // Boxed: catching up builds the metadata table, which begins a transaction of its own.
            Box::pin(crate::metadata::catch_up(table)).await?;
        }
        let storage = table.storage().clone();
        let Some((requested, archived_past)) = claim_checked(table, action, plan).await? else { return Ok(None) };
        if archived_past {
            // What this write saw is partly archived: it checks conflicts against the rest.
            table.reload().await?;
        }
        let time = requested.time.clone();
        // The heartbeat follows the claim: a writer that lost the race for `time` must not touch
        // the winner's heartbeat. Until it exists, the requested file's own age stands in for it
        // (see `is_expired`).
        write_heartbeat(&storage, &time).await?;
        failpoint("after-requested");
        let seen = table.timeline().completed_data().map(|i| i.time.clone()).collect();
        let epoch = fate::current_epoch(table, &time).await?;
        let heartbeat = Some(spawn_heartbeat(storage.clone(), time, table.options().heartbeat_interval));
        let services = services_seen(table);
        let schema_at_begin = table.data_schema();
        let tx = Transaction { instant: requested, seen, services, epoch, schema_at_begin, heartbeat };
        let inflight = tx.instant.with_state(State::Inflight);
        let marker = CommitMetadata { operation_type: None, ..Default::default() }.to_json()?;
        table.timeline().create(&storage, &inflight, Bytes::from(marker)).await?;
        failpoint("after-inflight");
        Ok(Some(tx))
    }

    /// Claims the instant `time` (not a new one) for `action`, its requested file holding `plan`:
    /// the metadata table's commits carry the time of the data instant they belong to. Fails when
    /// `time` is taken.
    pub async fn begin_at(table: &mut Table, action: Action, time: &str, plan: Bytes) -> Result<Self> {
        table.reload().await?;
        let storage = table.storage().clone();
        let requested = Instant::new(time, action, State::Requested);
        if !table.timeline().instants_at(time).is_empty() {
            return Err(Error::CommitConflict { instant: time.to_string(), detail: "the instant is taken".into() });
        }
        // `time` belongs to this writer (it holds the data instant of that time): a create that
        // finds the file there is its own earlier attempt whose answer was lost.
        if !table.timeline().create(&storage, &requested, plan).await? {
            log::info!("{}: the requested file of {time} was there already: an earlier attempt's", table.uri());
        }
        write_heartbeat(&storage, time).await?;
        let seen = table.timeline().completed_data().map(|i| i.time.clone()).collect();
        let epoch = fate::current_epoch(table, time).await?;
        let heartbeat = Some(spawn_heartbeat(storage.clone(), time.to_string(), table.options().heartbeat_interval));
        let services = services_seen(table);
        let schema_at_begin = table.data_schema();
        let tx = Transaction { instant: requested, seen, services, epoch, schema_at_begin, heartbeat };
        table.timeline().create(&storage, &tx.instant.with_state(State::Inflight), Bytes::new()).await?;
        Ok(tx)
    }

    /// Takes up a requested instant whose plan is already on the timeline (a compaction scheduled
    /// earlier, or one whose failed run was rolled back): heartbeat, then inflight.
    pub async fn resume(table: &mut Table, requested: &Instant) -> Result<Self> {
        let storage = table.storage().clone();
        write_heartbeat(&storage, &requested.time).await?;
        let seen = table.timeline().completed_data().map(|i| i.time.clone()).collect();
        let epoch = fate::current_epoch(table, &requested.time).await?;
        let heartbeat =
            Some(spawn_heartbeat(storage.clone(), requested.time.clone(), table.options().heartbeat_interval));
        let services = services_seen(table);
        let schema_at_begin = table.data_schema();
        let tx = Transaction {
            instant: requested.with_state(State::Requested),
            seen,
            services,
            epoch,
            schema_at_begin,
            heartbeat,
        };
        table.timeline().create(&storage, &tx.instant.with_state(State::Inflight), Bytes::new()).await?;
        failpoint("after-inflight");
        Ok(tx)
    }

    /// What another process needs to finish this transaction ([`Transaction::take_over`]): a
    /// distributed write whose driver-side steps run in different processes (Spark's data source
    /// API plans a write in one Python worker and commits it in another).
    pub fn hand_over(&self) -> Result<Vec<u8>> {
        let token = HandOver { time: self.instant.time.clone(), action: self.instant.action.name(), seen: &self.seen };
        serde_json::to_vec(&token).map_err(Error::invalid_data)
    }

    /// Takes up a transaction handed over by [`Transaction::hand_over`] (its instant still
    /// pending), with its own heartbeat from now on.
    pub async fn take_over(table: &mut Table, token: &[u8]) -> Result<Self> {
        let token: HandOverOwned = serde_json::from_slice(token).map_err(|e| Error::invalid_arg("transaction", e))?;
        table.reload().await?;
        let Some(pending) =
            table.timeline().pending().find(|i| i.time == token.time && i.action.name() == token.action)
        else {
            return Err(Error::invalid_arg(
                "transaction",
                format!("{} is not a pending write of this table", token.time),
            ));
        };
        let instant = pending.with_state(State::Requested);
        let storage = table.storage().clone();
        write_heartbeat(&storage, &instant.time).await?;
        let epoch = fate::current_epoch(table, &instant.time).await?;
        let heartbeat = Some(spawn_heartbeat(storage, instant.time.clone(), table.options().heartbeat_interval));
        // Cleans since the hand-over are not known: every completed one counts as possibly later.
        let schema_at_begin = table.data_schema();
        Ok(Transaction { instant, seen: token.seen, services: HashSet::new(), epoch, schema_at_begin, heartbeat })
    }

    /// The attempt at this instant time: 0 unless earlier attempts were rolled back (a compaction
    /// plan runs again at its time). Files an attempt names must differ from earlier attempts'.
    pub fn epoch(&self) -> u32 {
        self.epoch
    }

    /// The instant time of this write.
    pub fn time(&self) -> &str {
        &self.instant.time
    }

    pub fn action(&self) -> Action {
        self.instant.action
    }

    /// Checks for conflicts and makes the write visible. On a conflict the write is rolled back.
    pub async fn commit(self, table: &mut Table, metadata: &CommitMetadata) -> Result<Instant> {
        self.commit_with_keys(table, metadata, &crate::metadata::KeyChanges::default(), &[]).await
    }

    /// [`Transaction::commit`] of a write that moved record keys (`keys`: what the record index
    /// learns; clusterings and insert overwrites are read back from their files instead), with
    /// the file-level index `entries` its writers computed (other files are read back).
    pub async fn commit_with_keys(
        mut self,
        table: &mut Table,
        metadata: &CommitMetadata,
        keys: &crate::metadata::KeyChanges,
        entries: &[(String, crate::metadata::file_index::FileEntry)],
    ) -> Result<Instant> {
        failpoint("before-commit");
        if let Err(e) = self.check(table, metadata, keys).await {
            let e = self.lost_to_service(table, e).await;
            return Err(self.fail_written(table, e, Some(metadata)).await);
        }
        let reconciled = match self.reconcile_schema(table, metadata).await {
            Ok(r) => r,
            Err(e) => return Err(self.fail_written(table, e, Some(metadata)).await),
        };
        let metadata = reconciled.as_ref().unwrap_or(metadata);
        if self.instant.action != Action::Indexing {
            let added: Vec<FileInfo> = metadata
                .write_stats()
                .filter_map(|(_, s)| {
                    let path = s.path.clone()?;
                    Some(FileInfo { path, size: s.file_size_in_bytes.max(0) as u64 })
                })
                .collect();
            let replaced: Vec<FileGroupId> =
                metadata.replaced_file_groups().map(|(p, f)| (p.to_string(), f.to_string())).collect();
            let keys = match self.instant.action {
                Action::Compaction => crate::metadata::KeySource::Unchanged,
                Action::Clustering | Action::ReplaceCommit => crate::metadata::KeySource::Replaced(replaced),
                _ => crate::metadata::KeySource::Reported(keys),
            };
            let change = crate::metadata::Change { added: &added, deleted: &[], keys, entries };
            if let Err(e) = Box::pin(crate::metadata::sync(table, &self.instant.time, change)).await {
                return Err(self.fail_written(table, e, Some(metadata)).await);
            }
            failpoint("after-metadata-sync");
        }
        // A compaction completes as a commit (a clustering as a replacecommit).
        let completed = match self.instant.action {
            Action::Compaction => Instant::new(self.instant.time.clone(), Action::Commit, State::Completed),
            Action::Clustering => Instant::new(self.instant.time.clone(), Action::ReplaceCommit, State::Completed),
            _ => self.instant.with_state(State::Completed),
        };
        let json = Bytes::from(metadata.to_json()?);
        // A process that took this writer for dead (no heartbeat for three intervals: a paused
        // process, a slow store) may be rolling it back: the fate record decides which of the two
        // goes on, whatever the timing.
        let ours = fate::Fate::Committed { action: completed.action, metadata: json.clone() };
        let decided = match fate::decide(table.storage(), &self.instant.time, self.epoch, ours.clone()).await {
            // A store failure leaves it unknown whether the record was written: look again.
            Err(e) => match fate::recorded(table.storage(), &self.instant.time, self.epoch).await {
                Ok(Some(recorded)) => Ok(recorded),
                _ => Err(e),
            },
            decided => decided,
        };
        match decided {
            Ok(d) if d == ours => {
                if self.epoch > 0 {
                    // An attempt at a time rolled back before (the metadata table retries there).
                    table.storage().delete(&crate::timeline::rolled_back_marker(&self.instant.time)).await?;
                }
            }
            Ok(fate::Fate::RolledBack { by }) => {
                self.stop_heartbeat(table.storage()).await?;
                // Files written after that rollback listed the table would be left behind, and
                // so would the intent published after it withdrew the intents.
                remove_reported_files(table.storage(), &self.instant.time, metadata).await?;
                conflicts::withdraw_intent(table.storage(), &self.instant.time).await?;
                let detail = format!("this write was rolled back by another process (rollback {by})");
                return Err(Error::CommitConflict { instant: by, detail });
            }
            Ok(fate::Fate::Committed { .. }) => {
                self.stop_heartbeat(table.storage()).await?;
                let detail = "the instant was completed by another writer".into();
                return Err(Error::CommitConflict { instant: self.instant.time.clone(), detail });
            }
            // Undecided: nothing is visible, roll back as after any failure.
            Err(e) => return Err(self.fail(table, e).await),
        }
        failpoint("after-fate");
        // From here the write is committed: a rollback that comes now completes it instead (a file
        // found there is that roll-forward, of the same metadata).
        if let Err(e) = table.timeline().create(table.storage(), &completed, json).await {
            // The completed file could not be written (a roll-forward may have written it). If it
            // is not there, the decision is taken back, so that the error means "not committed"
            // (a caller that retries an insert must not find it landed later).
            let there = table.storage().head(&table.timeline().path_of(&completed)).await.ok().flatten().is_some();
            if !there {
                // Taken back first with a plain put (the conditional creates may be what fails),
                // then rolled back; a rollback that cannot run now is finished by the next writer.
                let time = self.instant.time.clone();
                let pending = self.instant.with_state(State::Inflight);
                let how = Undo::Deliberate { was_completed: false };
                let retracted = fate::overrule(table.storage(), &time, self.epoch, &time).await;
                let undone = match retracted {
                    Ok(()) => rollback_at(table, &pending, None, how, Some(self.epoch)).await.map(drop),
                    Err(e) => Err(e),
                };
                if let Err(undo) = undone {
                    log::error!(
                        "{}: {} {} could not be completed nor taken back ({undo}): the next writer completes it",
                        table.uri(),
                        self.instant.action,
                        self.instant.time
                    );
                }
                self.stop_heartbeat(table.storage()).await.ok();
                return Err(e);
            }
        }
        // A deliberate rollback of this instant (by a process that saw it completed after a
        // roll-forward) overrules the record before it deletes the completed file: a create that
        // came after that delete must not stand.
        if !fate::still(table.storage(), &self.instant.time, self.epoch, &ours).await? {
            table.storage().delete(&table.timeline().path_of(&completed)).await?;
            self.stop_heartbeat(table.storage()).await?;
            let detail = "this write was rolled back by another process as it completed".into();
            return Err(Error::CommitConflict { instant: self.instant.time.clone(), detail });
        }
        failpoint("after-commit");
        self.stop_heartbeat(table.storage()).await?;
        conflicts::withdraw_intent(table.storage(), &self.instant.time).await?;
        table.reload().await?;
        Ok(completed)
    }

    /// `error` as the conflict it is when it is a data file gone while this write read it and a
    /// table service completed since the write began (a compaction, clustering or clean removed
    /// or replaced what the write planned against): a conflict is retried (`conflict_retries`),
    /// a storage error is not.
    pub async fn lost_to_service(&self, table: &mut Table, error: Error) -> Error {
        let gone = match &error {
            Error::Storage { path, source: object_store::Error::NotFound { .. } } => path.clone(),
            _ => return error,
        };
        if gone.starts_with(".hoodie/") || table.reload().await.is_err() {
            return error;
        }
        let timeline = table.timeline();
        let service = timeline.instants().iter().filter(|i| i.is_completed()).find(|i| match i.action {
            Action::Clean => !self.services.contains(&i.time),
            Action::Commit | Action::ReplaceCommit => !self.seen.contains(&i.time) && i.time != self.instant.time,
            _ => false,
        });
        match service {
            Some(s) => Error::CommitConflict {
                instant: s.time.clone(),
                detail: format!("{} {} removed or replaced {gone} while this write read it", s.action, s.time),
            },
            None => error,
        }
    }

    /// Rolls the transaction back after `error` ended it, and returns `error` (a failed rollback
    /// is logged: the next writer finishes it).
    pub async fn fail(self, table: &mut Table, error: Error) -> Error {
        self.fail_written(table, error, None).await
    }

    /// [`Transaction::fail`] of a write that wrote the files `written` reports: when another
    /// process rolled it back while it ran, the files it wrote after that rollback listed the
    /// table are removed here (nobody else knows of them).
    async fn fail_written(self, table: &mut Table, error: Error, written: Option<&CommitMetadata>) -> Error {
        let instant = self.instant.clone();
        let epoch = self.epoch;
        match self.abort(table).await {
            Ok(true) => error,
            // Another process took this write for failed and rolled it back while it ran (a paused
            // process, a slow store): a file it read was gone because of that rollback. The
            // write did not land; it is a conflict, retried like any other.
            Ok(false) => match fate::recorded(table.storage(), &instant.time, epoch).await {
                Ok(Some(fate::Fate::RolledBack { by })) if by != instant.time => {
                    if let Some(metadata) = written
                        && let Err(e) = remove_reported_files(table.storage(), &instant.time, metadata).await
                    {
                        log::warn!("{}: files of the rolled back {} left behind: {e}", table.uri(), instant.time);
                    }
                    if !is_gone(&error) {
                        return error;
                    }
                    let detail = format!("this write was rolled back by another process (rollback {by}): {error}");
                    Error::CommitConflict { instant: by, detail }
                }
                _ => error,
            },
            Err(rollback_err) => {
                log::error!("rollback of the failed {} {} also failed: {rollback_err}", instant.action, instant.time);
                error
            }
        }
    }

    /// Rolls this write back (its files and its pending instant) and records a rollback instant.
    /// Returns whether it did: `false` when another process decided the instant's fate first.
    pub async fn abort(mut self, table: &mut Table) -> Result<bool> {
        table.reload().await?;
        let pending = self.instant.with_state(State::Inflight);
        let result = rollback_at(table, &pending, None, Undo::Failed, Some(self.epoch)).await;
        self.stop_heartbeat(table.storage()).await?;
        result
    }

    /// Decides whether this write may complete: publishes its footprint, then waits for earlier
    /// overlapping writes that are committing, and fails with [`Error::CommitConflict`] when a
    /// write completed since this one began, or a later one committing now, overlaps it.
    async fn check(
        &self,
        table: &mut Table,
        metadata: &CommitMetadata,
        keys: &crate::metadata::KeyChanges,
    ) -> Result<()> {
        let time = self.instant.time.as_str();
        let mut footprint = conflicts::Footprint::of(metadata, keys);
        footprint.evolves_schema = metadata.arrow_schema()?.is_some_and(|s| s != self.schema_at_begin);
        // The metadata table's deltacommits only append log files, each its own: they never
        // overlap (its writers are serialized by the data table's commits).
        let appends_only = table.is_metadata_table() && self.instant.action == Action::DeltaCommit;
        if !appends_only {
            conflicts::publish_intent(table.storage(), time, &footprint).await?;
            failpoint("after-intent");
        }
        let mut watch = HeartbeatWatch::default();
        loop {
            table.reload().await?;
            let (seen, compare) = (&self.seen, if appends_only { None } else { Some(&footprint) });
            if let Some(other) = conflicts::find_conflict(table, time, seen, metadata, keys, compare).await? {
                return Err(conflict(&other, "completed since this write began"));
            }
            if appends_only {
                return Ok(());
            }
            match conflicts::check_intents(table, time, &footprint).await? {
                conflicts::Verdict::Clear => return Ok(()),
                conflicts::Verdict::GiveWay(other) => return Err(conflict(&other, "is committing")),
                conflicts::Verdict::Gone(other) => {
                    log::info!("{time}: the overlapping write {} is gone: deciding its fate first", other.time);
                    rollback(table, &other, None, Undo::Failed).await?;
                }
                conflicts::Verdict::Wait(other) => {
                    log::debug!("{time}: waiting for the overlapping commit of {other}");
                    if let Some(p) = table.timeline().pending().find(|i| i.time == other).cloned() {
                        watch.check(table, &p, &format!("commit {time}")).await?;
                    }
                    conflicts::pause().await;
                }
            }
        }
    }

    /// The schema this commit records, once its checks passed: the table's as the latest commit
    /// left it, with this write's evolution (`schema::evolve`) on top. `None`: `metadata` records
    /// it already (or records none: the metadata table's commits). A write that evolves the schema
    /// conflicts with a later instant that completed first (that one's schema lacks the change,
    /// and the latest commit's schema is the table's); overlapping pending commits were ordered by
    /// [`conflicts::check_intents`] (a schema-evolving footprint meets every other).
    async fn reconcile_schema(&self, table: &Table, metadata: &CommitMetadata) -> Result<Option<CommitMetadata>> {
        let Some(mine) = metadata.arrow_schema()? else { return Ok(None) };
        // A table whose schema never evolved, and a write that does not evolve it: nothing to
        // read (the check's reloads re-read the properties, so an evolution that completed
        // before this commit's last look has set the flag; one still pending met this commit's
        // intent, see above).
        let evolved = table.config().raw.contains_key(crate::table::SCHEMA_EVOLVED_KEY);
        if table.is_metadata_table() || (!evolved && mine == self.schema_at_begin) {
            return Ok(None);
        }
        let committed = crate::table::committed_schema(table.storage(), table.config(), table.timeline())
            .await?
            .unwrap_or_else(|| self.schema_at_begin.clone());
        if mine == committed {
            return Ok(None);
        }
        let time = self.instant.time.clone();
        let cfg = table.config();
        let fixed: Vec<String> = cfg.record_key_fields.iter().chain(&cfg.partition_fields).cloned().collect();
        let merged = crate::schema::evolve::evolve(&committed, &mine, crate::schema::evolve::SchemaMode::Merge, &fixed)
            .map_err(|e| Error::CommitConflict {
                instant: time.clone(),
                detail: format!("another commit changed the schema meanwhile: {e}"),
            })?;
        if merged != committed
            && let Some(later) = table.timeline().completed_data().find(|i| i.time > time)
        {
            return Err(conflict(&later.time, "completed first without this write's schema change"));
        }
        let mut out = metadata.clone();
        out.set_schema(&merged, &cfg.name)?;
        Ok(Some(out))
    }

    async fn stop_heartbeat(&mut self, storage: &Storage) -> Result<()> {
        if let Some(h) = self.heartbeat.take() {
            h.abort();
        }
        storage.delete(&heartbeat_path(&self.instant.time)).await
    }
}

impl Drop for Transaction {
    fn drop(&mut self) {
        // A transaction dropped without commit or abort (an error, a cancelled call) stops beating,
        // so that the next writer can roll it back once the heartbeat expires.
        if let Some(h) = self.heartbeat.take() {
            h.abort();
        }
    }
}

fn services_seen(table: &Table) -> HashSet<String> {
    table
        .timeline()
        .instants()
        .iter()
        .filter(|i| i.is_completed() && i.action == Action::Clean)
        .map(|i| i.time.clone())
        .collect()
}

fn conflict(other: &str, what: &str) -> Error {
    Error::CommitConflict {
        instant: other.to_string(),
        detail: format!("instant {other} {what} and touched the same file groups or record keys"),
    }
}

fn heartbeat_path(time: &str) -> String {
    format!("{HEARTBEAT_DIR}/{time}")
}

async fn write_heartbeat(storage: &Storage, time: &str) -> Result<()> {
    let now = SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default().as_millis();
    storage.put(&heartbeat_path(time), Bytes::from(now.to_string())).await
}

fn spawn_heartbeat(storage: Storage, time: String, interval: Duration) -> JoinHandle<()> {
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(interval).await;
            if let Err(e) = write_heartbeat(&storage, &time).await {
                log::warn!("heartbeat of {time} failed: {e}");
            }
        }
    })
}

/// Watches the heartbeats of pending instants that a process waits for (a compaction for the
/// writes that began before it, a commit for an earlier overlapping one), so that no wait is
/// endless: a writer that is alive refreshes its heartbeat; one whose heartbeat stands still yet
/// never expires (a time ahead of this clock: clock skew, a damaged file) is reported.
#[derive(Default)]
pub(crate) struct HeartbeatWatch {
    seen: std::collections::HashMap<String, (Option<Bytes>, std::time::Instant)>,
}

impl HeartbeatWatch {
    /// Notes the heartbeat of `instant`, which `waiter` waits for; fails when it has stood still
    /// far longer than a live writer lets it.
    pub(crate) async fn check(&mut self, table: &Table, instant: &Instant, waiter: &str) -> Result<()> {
        let path = heartbeat_path(&instant.time);
        let beat = table.storage().get_opt(&path).await?;
        let now = std::time::Instant::now();
        let limit = (table.options().heartbeat_interval * HEARTBEAT_TOLERANCE * 3).max(HEARTBEAT_STILL_LIMIT);
        let (last, since) = self.seen.entry(instant.time.clone()).or_insert_with(|| {
            let shown = beat.as_ref().map(|b| String::from_utf8_lossy(b).into_owned());
            log::info!(
                "{}: {waiter} waits for the pending {} {} (heartbeat {shown:?})",
                table.uri(),
                instant.action,
                instant.time
            );
            (beat.clone(), now)
        });
        if *last != beat {
            (*last, *since) = (beat, now);
            return Ok(());
        }
        if now.duration_since(*since) > limit {
            let shown = beat.as_ref().map(|b| String::from_utf8_lossy(b).into_owned()).unwrap_or_else(|| "none".into());
            let detail = format!(
                "{waiter} waited {}s for the pending {} {}, whose heartbeat {path} ({shown}) has not changed: its writer is gone, but the heartbeat does not expire (a clock ahead of this one, or a damaged file); the instant is rolled back once its heartbeat is older than {} intervals by this clock",
                limit.as_secs(),
                instant.action,
                instant.time,
                HEARTBEAT_TOLERANCE
            );
            log::warn!("{}: {detail}", table.uri());
            return Err(Error::CommitConflict { instant: instant.time.clone(), detail });
        }
        Ok(())
    }
}

/// The shortest time a heartbeat may stand still before a waiter gives up on its instant.
const HEARTBEAT_STILL_LIMIT: Duration = Duration::from_secs(10);

/// Whether the writer of a pending instant is gone: its last sign of life (the heartbeat, or the
/// instant's own timeline file before the first heartbeat) is older than the tolerance.
pub(crate) async fn is_expired(table: &Table, instant: &Instant) -> Result<bool> {
    let now = SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default().as_millis();
    let limit = table.options().heartbeat_interval.as_millis() * u128::from(HEARTBEAT_TOLERANCE);
    let path = heartbeat_path(&instant.time);
    let last_sign = match table.storage().get_opt(&path).await? {
        Some(bytes) => match std::str::from_utf8(&bytes).ok().and_then(|s| s.trim().parse().ok()) {
            Some(millis) => millis,
            // Apache Hudi's writers leave the file empty and go by its modification time; a
            // damaged one counts by its age too.
            None => match table.storage().head(&path).await? {
                Some(meta) => u128::try_from(meta.last_modified.timestamp_millis()).unwrap_or(0),
                None => 0,
            },
        },
        None => match table.storage().head(&table.timeline().path_of(instant)).await? {
            Some(meta) => u128::try_from(meta.last_modified.timestamp_millis()).unwrap_or(0),
            None => 0,
        },
    };
    Ok(now.saturating_sub(last_sign) > limit)
}

/// Claims a new instant for `action`: creates its requested file, holding `plan(time)`, at the
/// first free time after the latest instant. Writers race for times, and the requested files of
/// two actions at one time have different names: so a time is first claimed by the conditional
/// create of a marker `.hoodie/oxlake/claims/<time>`, whatever the action. A metadata table's
/// plain times belong to the data instants it mirrors, so the instants of its own services
/// (rollbacks, cleans) take a `002` suffix no data instant has.
pub(crate) async fn claim(
    table: &Table,
    action: Action,
    plan: impl Fn(&str) -> Result<Bytes> + Send + Sync,
) -> Result<Instant> {
    let claimed = claim_with(table, action, |_, time| ready(plan(time).map(Some))).await?;
    claimed.ok_or_else(|| Error::invalid_data("a plan came out empty"))
}

/// [`claim`] with a plan made once the time is this writer's (a compaction first takes the
/// slices it compacts, see `services::compaction`); `None` from `plan`: nothing to do, no
/// instant is created.
pub(crate) async fn claim_with(table: &Table, action: Action, plan: impl PlanFn) -> Result<Option<Instant>> {
    Ok(claim_checked(table, action, plan).await?.map(|(requested, _)| requested))
}

/// [`claim_with`], also saying whether an archival passed a time first claimed: then `table`'s
/// timeline is stale (instants on it are archived) and the caller reloads it.
async fn claim_checked(table: &Table, action: Action, plan: impl PlanFn) -> Result<Option<(Instant, bool)>> {
    let mut archived_past = false;
    let own_suffix = if table.is_metadata_table() { "002" } else { "" };
    let mut last = table.timeline().last_time().map(|t| t.get(..17).unwrap_or(t).to_string());
    for _ in 0..CLAIM_ATTEMPTS {
        let base = instant::next_after(last.as_deref())?;
        let time = format!("{base}{own_suffix}");
        last = Some(base);
        // The marker holds a token of this claim: a create whose answer was lost reads it back.
        let token = Bytes::from(uuid::Uuid::new_v4().to_string());
        if !table.storage().put_if_absent(&format!("{CLAIMS_DIR}/{time}"), token).await? {
            continue;
        }
        failpoint("after-claim");
        let Some(content) = plan(table, &time).await? else { return Ok(None) };
        // The time is this writer's now: a requested file already there is its own, from an
        // attempt whose answer was lost, unless another process took this writer for dead
        // before it got here (see `services::compaction`): then it has another content.
        let requested = Instant::new(time.clone(), action, State::Requested);
        let path = table.timeline().path_of(&requested);
        if !table.timeline().create(table.storage(), &requested, content.clone()).await?
            && table.storage().get(&path).await? != content
        {
            let detail = "another process took this writer for gone and closed its instant".into();
            return Err(Error::CommitConflict { instant: time, detail });
        }
        // An archival that began before the requested file existed may not have seen it, and
        // may be moving the timeline's start past `time` (this writer was slow between reading
        // the timeline and here): then `time` is given up for one after that archival's cutoff.
        // The archival marks itself before it lists the timeline a last time, and this check
        // follows the requested file: one of the two sees the other.
        if let Some(cutoff) = archival_past(table, &time).await? {
            log::info!(
                "{}: an archival up to {cutoff} passed the claimed time {time}: claiming a later one",
                table.uri()
            );
            table.storage().delete(&path).await?;
            if action == Action::Compaction {
                slice_claims::release(table, &time, &path, &content).await?;
            }
            last = Some(cutoff.get(..17).unwrap_or(&cutoff).to_string()).max(last);
            archived_past = true;
            continue;
        }
        return Ok(Some((requested, archived_past)));
    }
    Err(Error::CommitConflict { instant: last.unwrap_or_default(), detail: "could not claim an instant time".into() })
}

/// Rolls back every pending data instant whose writer is gone, and finishes interrupted rollbacks.
/// Returns the instants rolled back. Every change of a table starts here, so this is also where
/// tables oxlake cannot change are refused, and Apache Hudi's metadata table is retired (see
/// `Table::retire_apache_hudi_metadata_table`).
pub async fn rollback_failed(table: &mut Table) -> Result<Vec<String>> {
    table.check_changeable()?;
    table.retire_apache_hudi_metadata_table().await?;
    let mut done = Vec::new();
    if table.timeline().pending().any(|i| i.action == Action::Restore) {
        Box::pin(crate::services::restore::finish_interrupted(table)).await?;
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
                    done.push(target);
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
        if !taken.contains(&instant.time) && is_expired(table, &instant).await? {
            if rollback(table, &instant, None, Undo::Failed).await? {
                done.push(instant.time.clone());
            }
            table.reload().await?;
        }
    }
    Ok(done)
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
    Box::pin(crate::metadata::catch_up(table)).await?;
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
    let action = if meta.compacted { Action::Compaction } else { latest.action };
    let storage = table.storage().clone();
    let plan = rollback_plan(&time, action, true, rollback_requests(table, &meta))?;
    let requested = claim(table, Action::Rollback, |_| Ok(plan.clone())).await?;
    let r = requested.time.clone();
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
    failpoint("rollback-after-uncommit");
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
fn is_gone(error: &Error) -> bool {
    matches!(error, Error::Storage { source: object_store::Error::NotFound { .. }, .. })
}

/// How a rollback treats the fate of its target (see [`fate`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Undo {
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
async fn rollback(table: &Table, target: &Instant, existing: Option<Instant>, how: Undo) -> Result<bool> {
    rollback_at(table, target, existing, how, None).await
}

/// [`rollback`] of the attempt `epoch` at the target's time (`None`: the current attempt). A
/// failed attempt rolls back itself, never a later attempt at the same time.
async fn rollback_at(
    table: &Table,
    target: &Instant,
    existing: Option<Instant>,
    how: Undo,
    epoch: Option<u32>,
) -> Result<bool> {
    let was_completed = matches!(how, Undo::Deliberate { was_completed: true });
    let r = match existing {
        Some(r) => r,
        None => {
            // A failed write's files are found when the rollback runs (`undo_files_of`): no
            // request names them ahead (Java, finishing such a plan, deletes nothing it would need).
            let plan = rollback_plan(&target.time, target.action, was_completed, Vec::new())?;
            claim(table, Action::Rollback, |_| Ok(plan.clone())).await?
        }
    };
    let epoch = match epoch {
        Some(e) => e,
        None => fate::current_epoch(table, &target.time).await?,
    };
    if let Undo::Deliberate { .. } = how {
        fate::overrule(table.storage(), &target.time, epoch, &r.time).await?;
    } else {
        let ours = fate::Fate::RolledBack { by: r.time.clone() };
        match fate::decide(table.storage(), &target.time, epoch, ours.clone()).await? {
            d if d == ours => {}
            // Taken back by its own writer (it could not complete): any rollback finishes it.
            fate::Fate::RolledBack { by } if by == target.time => {
                fate::overrule(table.storage(), &target.time, epoch, &r.time).await?;
            }
            decided => {
                if let fate::Fate::Committed { action, metadata } = decided {
                    fate::roll_forward(table, target, epoch, action, metadata).await?;
                    table.storage().delete(&heartbeat_path(&target.time)).await?;
                    conflicts::withdraw_intent(table.storage(), &target.time).await?;
                }
                log::info!(
                    "{}: {} {} is not rolled back: its fate was decided first",
                    table.uri(),
                    target.action,
                    target.time
                );
                table.timeline().remove_pending(table.storage(), &r).await?;
                return Ok(false);
            }
        }
    }
    if target.action != Action::Compaction {
        // Files its writer may still write are never committed, however old (a compaction plan
        // runs again at its time: its files are told apart by the timeline).
        table.storage().put(&crate::timeline::rolled_back_marker(&target.time), Bytes::new()).await?;
    }
    failpoint("rollback-after-fate");
    // A rollback beats like a write: another process finishes it only once this one is gone.
    beating(table, &r.time, undo(table, target, &r, was_completed)).await?;
    Ok(true)
}

/// Runs `work` for the pending instant `time` with a heartbeat, so that other processes leave
/// the instant to this one while it runs (and take it over once the heartbeat expires).
pub(crate) async fn beating<T>(table: &Table, time: &str, work: impl Future<Output = Result<T>>) -> Result<T> {
    let storage = table.storage();
    write_heartbeat(storage, time).await?;
    let beat = spawn_heartbeat(storage.clone(), time.to_string(), table.options().heartbeat_interval);
    let out = work.await;
    beat.abort();
    let out = out?;
    storage.delete(&heartbeat_path(time)).await?;
    Ok(out)
}

/// The steps of a rollback `r` of `target`, each idempotent.
async fn undo(table: &Table, target: &Instant, r: &Instant, was_completed: bool) -> Result<()> {
    let started = std::time::Instant::now();
    let storage = table.storage();
    let timeline = table.timeline();
    timeline.create(storage, &r.with_state(State::Inflight), Bytes::new()).await?;
    failpoint("rollback-after-inflight");
    let (deleted, added) = undo_files_of(storage, target, &r.time).await?;
    failpoint("rollback-after-delete");
    // Boxed: syncing commits on the metadata table, whose failure rolls back there.
    let change = crate::metadata::Change {
        added: &added,
        deleted: &deleted,
        keys: crate::metadata::KeySource::RolledBack { target: &target.time, was_completed },
        entries: &[],
    };
    Box::pin(crate::metadata::sync(table, &r.time, change)).await?;
    let millis = i64::try_from(started.elapsed().as_millis()).unwrap_or(i64::MAX);
    let meta = rollback_metadata(table.uri(), target, &r.time, millis, &deleted, &added)?;
    timeline.create(storage, &r.with_state(State::Completed), Bytes::from(meta)).await?;
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

/// Undoes the data files of a failed instant; returns the paths deleted.
///
/// Base files named with the instant are deleted. Log files are named with their slice's base
/// instant, so they are recognised by their blocks: a log holding only blocks of the instant is
/// deleted; one that also holds other instants' blocks (written by another writer that appends) gets
/// a rollback command block in a new log version. A failed compaction keeps every log: they belong
/// to committed writes.
/// Deletes the data files a write at `time` left in `partitions` that are not in `kept` (failed
/// attempts of a distributed write's tasks): base files named with `time`, and log files of the
/// file groups the write reported whose blocks are all of `time`.
pub(crate) async fn remove_unreported_files(
    storage: &Storage,
    time: &str,
    partitions: &[&str],
    kept: &HashSet<&str>,
) -> Result<Vec<String>> {
    let groups: HashSet<(&str, String)> = kept
        .iter()
        .filter_map(|path| {
            let (dir, name) = path.rsplit_once('/').unwrap_or(("", path));
            let file_id =
                BaseFileName::parse(name).map(|b| b.file_id).or_else(|| LogFileName::parse(name).map(|l| l.file_id))?;
            Some((dir, file_id))
        })
        .collect();
    let mut deleted = Vec::new();
    for partition in partitions {
        for f in storage.list_dir(partition).await? {
            if kept.contains(f.path.as_str()) {
                continue;
            }
            let name = f.path.rsplit('/').next().unwrap_or(&f.path);
            let unreported = if let Some(b) = BaseFileName::parse(name) {
                b.instant == time
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
async fn remove_reported_files(storage: &Storage, time: &str, metadata: &CommitMetadata) -> Result<()> {
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

async fn undo_files_of(
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
fn rollback_plan(time: &str, action: Action, was_completed: bool, requests: Vec<RollbackRequest>) -> Result<Bytes> {
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
fn rollback_requests(table: &Table, meta: &CommitMetadata) -> Vec<RollbackRequest> {
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
fn rollback_metadata(
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

fn empty_partition(partition: &str) -> RollbackPartitionMetadata {
    RollbackPartitionMetadata {
        partition_path: partition.to_string(),
        rollback_log_files: Some(Default::default()),
        written_log_files: Some(Default::default()),
        ..Default::default()
    }
}

/// Crash and interleaving points for the tests. With `OXLAKE_FAILPOINT=<name>` in the environment
/// the process aborts at that step, as a `kill -9` would stop it there. With
/// `OXLAKE_PAUSEPOINT=<name>` and `OXLAKE_PAUSE_DIR=<dir>` it creates `<dir>/reached` there and
/// waits until `<dir>/resume` exists, so that a test can run another writer in between.
pub(crate) fn failpoint(name: &str) {
    if std::env::var("OXLAKE_FAILPOINT").is_ok_and(|v| v == name) {
        log::error!("failpoint {name}: aborting the process");
        std::process::abort();
    }
    if std::env::var("OXLAKE_PAUSEPOINT").is_ok_and(|v| v == name)
        && let Ok(dir) = std::env::var("OXLAKE_PAUSE_DIR")
    {
        let dir = std::path::Path::new(&dir);
        if let Err(e) = std::fs::write(dir.join("reached"), name) {
            log::error!("pausepoint {name}: {e}");
            return;
        }
        while !dir.join("resume").exists() {
            std::thread::sleep(Duration::from_millis(20));
        }
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
