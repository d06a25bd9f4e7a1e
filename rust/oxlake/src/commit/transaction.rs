//! A write in progress ([`Transaction`]): begin, conflict check, the hook, the fate record,
//! completion; or failure and rollback of itself.

use std::collections::HashSet;

use bytes::Bytes;
use serde::{Deserialize, Serialize};
use tokio::task::JoinHandle;

use super::claims::{PlanFn, claim_checked, ready};
use super::heartbeat::{HeartbeatWatch, heartbeat_path, spawn_heartbeat, write_heartbeat};
use super::rollback::{Undo, is_gone, remove_reported_files, rollback, rollback_at, rollback_failed_writes};
use super::{change, conflicts, failpoint, fate, hook, step_failpoint};
use crate::error::{Error, Result};
use crate::format::commit::CommitMetadata;
use crate::format::instant::{Action, Instant, State};
use crate::schema::internal::{self, InternalSchema};
use crate::storage::{FileInfo, Storage};
use crate::table::Table;
use crate::table::fs_view::FileGroupId;

/// The data instants (commits, deltacommits, replacecommits, compactions) a read saw, listed
/// before it planned: what a write of what it read checks conflicts against.
#[derive(Clone, Debug, Default)]
pub struct ReadState {
    /// The completed ones.
    pub completed: std::collections::BTreeSet<String>,
    /// All of them, pending ones too: one gone when the write begins was archived (or rolled
    /// back) since, and what completed after the read may have gone with it: the write then
    /// conflicts, never guesses.
    pub listed: std::collections::BTreeSet<String>,
}

impl ReadState {
    /// What a read planned on a timeline of `instants` saw.
    pub fn of<'a>(instants: impl IntoIterator<Item = &'a Instant>) -> Self {
        let mut state = ReadState::default();
        for i in instants {
            let data = i.action.writes_data()
                || matches!(i.action, Action::Compaction | Action::LogCompaction | Action::Clustering);
            if data {
                if i.is_completed() {
                    state.completed.insert(i.time.clone());
                }
                state.listed.insert(i.time.clone());
            }
        }
        state
    }
}

/// A write in progress: an instant claimed on the timeline and its heartbeat.
#[derive(Debug)]
pub struct Transaction {
    instant: Instant,
    /// The completed data instants when the write began; anything completed later is checked.
    seen: HashSet<String>,
    /// The completed cleans and the rollbacks when the write began: a data file gone since was
    /// removed by a later one.
    services: HashSet<String>,
    /// The attempt at this instant time (see [`fate`]): rollbacks of earlier attempts finished.
    epoch: u32,
    /// The table's schema when the write began: a commit recording another evolves it.
    schema_at_begin: arrow::datatypes::SchemaRef,
    /// The column ids when the write began (see [`crate::schema::internal`]): a commit whose
    /// columns were renamed or dropped meanwhile conflicts.
    ids_at_begin: Option<InternalSchema>,
    heartbeat: Option<JoinHandle<()>>,
    /// The table version when the write began: an upgrade that switched it meanwhile moved the
    /// timeline this write would complete on (see `services::upgrade`).
    version: u32,
    /// The crashed writes its beginning rolled back (pending writes whose writer was gone, not
    /// the targets of interrupted rollbacks, which may have completed): no read saw anything of
    /// them.
    undone_at_begin: HashSet<String>,
    /// The rollbacks and restores completed when the write began: any other that undoes a commit
    /// of `seen` fails it (see [`super::undone`]).
    undoers_finished: HashSet<String>,
}

#[derive(Serialize)]
pub(super) struct HandOver<'a> {
    time: String,
    action: &'a str,
    seen: &'a HashSet<String>,
}

#[derive(Deserialize)]
pub(super) struct HandOverOwned {
    time: String,
    action: String,
    seen: HashSet<String>,
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
        crate::table::history::repair_hadoop_checksums(table).await?;
        let undone = rollback_failed_writes(table).await?;
        if action != Action::Indexing {
            hook::catch_up(table).await?;
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
        step_failpoint(table, "after-requested");
        // A time just claimed has no fate, unless this writer paused between its claim and its
        // heartbeat for longer than a heartbeat lasts: then another process rolled the instant
        // back (the requested file's age stands in for the heartbeat until it exists), and
        // archival may have passed its time since. It must not start at a later attempt.
        let rolled_back = || Error::CommitConflict {
            instant: time.clone(),
            detail: format!("{time} was taken for a failed write and rolled back before this write started"),
        };
        if fate::recorded(&storage, &time, 0).await?.is_some() {
            storage.delete(&heartbeat_path(&time)).await?;
            return Err(rolled_back());
        }
        let mut tx = Transaction::starting(table, requested, 0);
        tx.undone_at_begin = undone.into_iter().collect();
        let marker = CommitMetadata { operation_type: None, ..Default::default() }
            .to_timeline_bytes(table.timeline().layout(), action)?;
        if table.timeline().start(&storage, &tx.instant, Bytes::from(marker)).await?.is_none() {
            drop(tx);
            storage.delete(&heartbeat_path(&time)).await?;
            return Err(rolled_back());
        }
        step_failpoint(table, "after-inflight");
        Ok(Some(tx))
    }

    /// A transaction of `instant` beginning now, its heartbeat beating: what the table shows
    /// at this moment is what its commit checks against.
    fn starting(table: &Table, instant: Instant, epoch: u32) -> Self {
        let beat = spawn_heartbeat(table.storage().clone(), instant.time.clone(), table.options().heartbeat_interval);
        Transaction {
            seen: table.timeline().completed_data().map(|i| i.time.clone()).collect(),
            services: services_seen(table),
            epoch,
            schema_at_begin: table.data_schema(),
            ids_at_begin: begin_ids(table),
            heartbeat: Some(beat),
            version: table.config().version,
            undone_at_begin: HashSet::new(),
            undoers_finished: super::undone::finished_undoers(table),
            instant,
        }
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
        let epoch = fate::current_epoch(table, time).await?;
        let tx = Transaction::starting(table, requested, epoch);
        table.timeline().create(&storage, &tx.instant.with_state(State::Inflight), Bytes::new()).await?;
        Ok(tx)
    }

    /// Takes up a requested instant whose plan is already on the timeline (a compaction scheduled
    /// earlier, or one whose failed run was rolled back): heartbeat, then inflight. The inflight
    /// file is a conditional create: a process that finds it made by another (both saw the plan
    /// requested) has lost the plan to it, a [`Error::CommitConflict`].
    pub async fn resume(table: &mut Table, requested: &Instant) -> Result<Self> {
        let storage = table.storage().clone();
        write_heartbeat(&storage, &requested.time).await?;
        let epoch = fate::current_epoch(table, &requested.time).await?;
        let tx = Transaction::starting(table, requested.with_state(State::Requested), epoch);
        match table.timeline().start(&storage, &tx.instant, Bytes::new()).await? {
            Some(true) => {}
            Some(false) => {
                return Err(Error::CommitConflict {
                    instant: requested.time.clone(),
                    detail: format!("{} was taken up by another process", requested.time),
                });
            }
            // Another process ran the plan to completion and an archival took it since it was
            // listed. Going on would complete the instant a second time, active after the
            // commits archived with it, whose files would then read as uncommitted.
            None => {
                drop(tx);
                storage.delete(&heartbeat_path(&requested.time)).await?;
                return Err(Error::CommitConflict {
                    instant: requested.time.clone(),
                    detail: format!("{} completed and was archived since its plan was listed", requested.time),
                });
            }
        }
        step_failpoint(table, "after-inflight");
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
        let mut tx = Transaction::starting(table, instant, epoch);
        // Cleans since the hand-over are not known: every completed one counts as possibly later.
        tx.seen = token.seen;
        tx.services = HashSet::new();
        tx.undoers_finished = HashSet::new();
        Ok(tx)
    }

    /// The attempt at this instant time: 0 unless earlier attempts were rolled back (a compaction
    /// plan runs again at its time). Files an attempt names must differ from earlier attempts'.
    pub fn epoch(&self) -> u32 {
        self.epoch
    }

    /// The instant time claimed.
    pub fn time(&self) -> &str {
        &self.instant.time
    }

    /// Declares that this write's input was read from `table` in the state `read`: the commits
    /// completed since are checked for conflicts as commits completed during the write are (see
    /// `WriteConfig::read_from`). A conflict when an instant the read listed has left the active
    /// timeline (archived or rolled back since): what completed after the read may have been
    /// archived with it, out of this write's sight. A crashed write the read listed pending and
    /// this write's beginning rolled back is not one: the read saw nothing of it (the first write
    /// after a crash would otherwise always conflict).
    pub fn read_from(&mut self, table: &Table, read: &ReadState) -> Result<()> {
        let undone = |time: &str| self.undone_at_begin.contains(time) && !read.completed.contains(time);
        let gone = |time: &&String| table.timeline().instants_at(time).is_empty() && !undone(time);
        if let Some(gone) = read.listed.iter().find(gone) {
            return Err(Error::CommitConflict {
                instant: gone.clone(),
                detail: format!("the instant {gone} left the active timeline since this write's input was read"),
            });
        }
        self.seen.retain(|time| read.completed.contains(time));
        Ok(())
    }

    /// The action of the instant.
    pub fn action(&self) -> Action {
        self.instant.action
    }

    /// Checks for conflicts and makes the write visible. On a conflict the write is rolled back.
    pub async fn commit(self, table: &mut Table, metadata: &CommitMetadata) -> Result<Instant> {
        self.commit_with_keys(table, metadata, &change::KeyChanges::default(), &[]).await
    }

    /// [`Transaction::commit`] of a write that moved record keys (`keys`: what the record index
    /// learns; clusterings and insert overwrites are read back from their files instead), with
    /// the file-level index `entries` its writers computed (other files are read back).
    pub async fn commit_with_keys(
        mut self,
        table: &mut Table,
        metadata: &CommitMetadata,
        keys: &change::KeyChanges,
        entries: &[(String, change::FileEntry)],
    ) -> Result<Instant> {
        step_failpoint(table, "before-commit");
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
                Action::Compaction => change::KeySource::Unchanged,
                Action::Clustering | Action::ReplaceCommit => change::KeySource::Replaced(replaced),
                _ => change::KeySource::Reported(keys),
            };
            let change = change::Change { added: &added, deleted: &[], keys, entries };
            if let Err(e) = hook::before_complete(table, &self.instant.time, change).await {
                return Err(self.fail_written(table, e, Some(metadata)).await);
            }
            failpoint("after-metadata-sync");
        }
        if let Err(e) = self.check_version(table).await {
            return Err(self.fail_written(table, e, Some(metadata)).await);
        }
        // A compaction completes as a commit (a clustering as a replacecommit).
        let mut completed = match self.instant.action {
            Action::Compaction => Instant::new(self.instant.time.clone(), Action::Commit, State::Completed),
            Action::Clustering => Instant::new(self.instant.time.clone(), Action::ReplaceCommit, State::Completed),
            _ => self.instant.with_state(State::Completed),
        };
        // Timeline layout 2: the completion time, claimed in order with every other completion
        // (after the checks: a claim held while waiting for an earlier writer would stall it).
        if table.timeline().layout() >= 2 {
            match self.claim_completion(table).await {
                Ok(c) => {
                    completed.completion = Some(c);
                    step_failpoint(table, "after-completion-claim");
                }
                Err(e) => return Err(self.fail_written(table, e, Some(metadata)).await),
            }
        }
        let json = Bytes::from(metadata.to_timeline_bytes(table.timeline().layout(), completed.action)?);
        // A process that took this writer for dead (no heartbeat for three intervals: a paused
        // process, a slow store) may be rolling it back: the fate record decides which of the two
        // goes on, whatever the timing.
        let ours = fate::Fate::Committed {
            action: completed.action,
            metadata: json.clone(),
            completion: completed.completion.clone(),
        };
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
            // Undecided: nothing is visible, roll back as after any failure. The record may have
            // been written all the same (the store failed after taking it): then the rollback
            // finds this commit decided, and the write is committed though it failed here.
            Err(e) => {
                let (time, epoch) = (self.instant.time.clone(), self.epoch);
                let e = self.fail(table, e).await;
                return Err(match fate::recorded(table.storage(), &time, epoch).await {
                    Ok(Some(fate::Fate::Committed { .. })) => {
                        unknown(&time, "it was decided committed, then failed", &e)
                    }
                    Ok(_) => e,
                    Err(looked) => unknown(&time, &format!("its fate could not be read ({looked})"), &e),
                });
            }
        }
        step_failpoint(table, "after-fate");
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
                let outcome = match retracted {
                    // Taken back: not committed (a rollback that fails here is finished by the
                    // next writer, as the record says).
                    Ok(()) => {
                        if let Err(undo) = rollback_at(table, &pending, None, how, Some(self.epoch)).await {
                            log::warn!(
                                "{}: {time} taken back; its rollback is left to the next writer ({undo})",
                                table.uri()
                            );
                        }
                        e
                    }
                    // Still decided committed, as far as anyone can tell: the next writer completes it.
                    Err(undo) => {
                        let how =
                            format!("its completed file could not be written nor its decision taken back ({undo})");
                        unknown(&time, &how, &e)
                    }
                };
                self.stop_heartbeat(table.storage()).await.ok();
                return Err(outcome);
            }
        }
        // A deliberate rollback of this instant (by a process that saw it completed after a
        // roll-forward) overrules the record before it deletes the completed file: a create that
        // came after that delete must not stand.
        let overruled = match fate::overruled(table.storage(), &self.instant.time, self.epoch).await {
            Ok(overruled) => overruled,
            Err(e) => {
                return Err(unknown(&self.instant.time, "it completed, but its record could not be read again", &e));
            }
        };
        if overruled {
            table.storage().delete(&table.timeline().path_of(&completed)).await?;
            self.stop_heartbeat(table.storage()).await?;
            let detail = "this write was rolled back by another process as it completed".into();
            return Err(Error::CommitConflict { instant: self.instant.time.clone(), detail });
        }
        step_failpoint(table, "after-commit");
        // Committed: what is left is tidying, which the next writer does when it fails here (an
        // error now would report a commit that landed as a failure).
        let time = self.instant.time.clone();
        let tidied = async {
            self.stop_heartbeat(table.storage()).await?;
            conflicts::withdraw_intent(table.storage(), &time).await?;
            table.reload().await
        };
        if let Err(e) = tidied.await {
            log::warn!("{}: {time} committed; tidying after it failed ({e}), left to the next writer", table.uri());
        }
        Ok(completed)
    }

    /// Fails when the table's version changed since this write began (an upgrade moved the
    /// timeline: completing on the old one would be invisible). The metadata table keeps its own.
    async fn check_version(&self, table: &Table) -> Result<()> {
        if table.is_metadata_table() {
            return Ok(());
        }
        // Apache Hudi rewrites the file by deleting and creating it: gone for a moment, it is
        // not an upgrade by oxlake (a single put).
        let Some(text) = table.storage().get_opt(crate::config::PROPERTIES_FILE).await? else { return Ok(()) };
        let now = crate::config::TableConfig::parse(&crate::config::properties::decode(&text))?.version;
        if now != self.version {
            let detail = format!("the table was upgraded to version {now} while this write ran: write again");
            return Err(Error::CommitConflict { instant: self.instant.time.clone(), detail });
        }
        Ok(())
    }

    /// Claims this instant's completion time (timeline layout 2, [`super::completion`]). A
    /// compaction then checks that every log completed before its time on the slices it compacts
    /// is in its plan: such a log belongs to the slice it replaces.
    async fn claim_completion(&self, table: &mut Table) -> Result<String> {
        let completion = super::completion::claim(table, &self.instant.time).await?;
        if self.instant.action == Action::Compaction {
            table.reload().await?;
            if let Some(other) = conflicts::missed_logs(table, &self.instant.time).await? {
                let detail = "a log completed before this compaction's time is not in its plan".into();
                return Err(Error::CommitConflict { instant: other, detail });
            }
        }
        Ok(completion)
    }

    /// `error` as the conflict it is when it is a data file gone while this write read it and a
    /// table service completed since the write began (a compaction, clustering or clean removed
    /// or replaced what the write planned against), or the plan of a clean still running names
    /// it (a clean deletes its files before it completes), or a timeline file of an instant
    /// archived meanwhile: a conflict is retried (`conflict_retries`), a storage error is not.
    pub async fn lost_to_service(&self, table: &mut Table, error: Error) -> Error {
        let gone = match &error {
            Error::Storage { path, source: object_store::Error::NotFound { .. } } => path.clone(),
            _ => return error,
        };
        if table.reload().await.is_err() {
            return error;
        }
        if gone.starts_with(".hoodie/") {
            // A completed instant's file archived while this write read it (its view of the
            // timeline predates the archival: a writer paused between its reload and its reads).
            let name = gone.rsplit('/').next().unwrap_or(&gone);
            let time: String = name.chars().take_while(char::is_ascii_digit).collect();
            let archived = time.len() >= 14 && !table.timeline().instants().iter().any(|i| i.time == time);
            return match archived {
                true => Error::CommitConflict {
                    instant: time.clone(),
                    detail: format!("{gone} was archived while this write read it"),
                },
                false => error,
            };
        }
        let timeline = table.timeline();
        // A rollback (even one still running) deletes the files of the write it undoes: a log a
        // compaction planned before that write failed is gone when the compaction reads it.
        let service = timeline.instants().iter().find(|i| match i.action {
            Action::Clean => i.is_completed() && !self.services.contains(&i.time),
            Action::Rollback => !self.services.contains(&i.time),
            Action::Commit | Action::ReplaceCommit => {
                i.is_completed() && !self.seen.contains(&i.time) && i.time != self.instant.time
            }
            _ => false,
        });
        if let Some(s) = service {
            return Error::CommitConflict {
                instant: s.time.clone(),
                detail: format!("{} {} removed or replaced {gone} while this write read it", s.action, s.time),
            };
        }
        // A clean deletes its files before it completes: one still running whose plan names the
        // file took it from under this write, and a retry plans on what the table holds now.
        // (A clean this write saw completed is not a cause: its view already left out what that
        // clean deleted, so such a file gone is damage, and retrying would only meet it again.)
        let running: Vec<Instant> =
            timeline.instants().iter().filter(|i| i.action == Action::Clean && !i.is_completed()).cloned().collect();
        for clean in running.iter().rev() {
            if plans_to_delete(table, clean, &gone).await {
                return Error::CommitConflict {
                    instant: clean.time.clone(),
                    detail: format!("clean {} (running) deleted {gone} while this write read it", clean.time),
                };
            }
        }
        error
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
    async fn check(&self, table: &mut Table, metadata: &CommitMetadata, keys: &change::KeyChanges) -> Result<()> {
        let time = self.instant.time.as_str();
        let mut footprint = conflicts::Footprint::of(metadata, keys, table.config().global_index);
        footprint.evolves_schema = metadata.arrow_schema()?.is_some_and(|s| s != self.schema_at_begin)
            || metadata.extra_metadata.contains_key(internal::LATEST_SCHEMA_KEY);
        // The metadata table's deltacommits only append log files, each its own: they never
        // overlap (its writers are serialized by the data table's commits).
        let appends_only = table.is_metadata_table() && self.instant.action == Action::DeltaCommit;
        if !appends_only {
            conflicts::publish_intent(table.storage(), time, &footprint).await?;
            step_failpoint(table, "after-intent");
        }
        let mut watch = HeartbeatWatch::default();
        loop {
            table.reload().await?;
            let (seen, compare) = (&self.seen, if appends_only { None } else { Some(&footprint) });
            if let Some(other) = conflicts::find_conflict(table, time, seen, metadata, keys, compare).await? {
                return Err(conflict(&other, "completed since this write began"));
            }
            if !appends_only {
                self.check_nothing_read_is_undone(table).await?;
            }
            if appends_only {
                return Ok(());
            }
            step_failpoint(table, "before-intents");
            match conflicts::check_intents(table, time, &footprint).await? {
                conflicts::Verdict::Clear => {
                    // An overlapping write may have completed, and withdrawn its intent, between
                    // the reload above and the listing of the intents: neither saw it. An intent
                    // is withdrawn only once its instant completed, so the timeline read after
                    // the listing has it (found by the stress suite: two upserts of one new key
                    // both landed).
                    table.reload().await?;
                    if let Some(other) = conflicts::find_conflict(table, time, seen, metadata, keys, compare).await? {
                        return Err(conflict(&other, "completed since this write began"));
                    }
                    return self.check_nothing_read_is_undone(table).await;
                }
                conflicts::Verdict::GiveWay(other) => return Err(conflict(&other, "is committing")),
                conflicts::Verdict::Gone(other) => {
                    log::info!("{time}: the overlapping write {} is gone: deciding its fate first", other.time);
                    if !rollback(table, &other, None, Undo::Failed).await? {
                        // Decided otherwise: by a rollback still at work, or a commit.
                        conflicts::pause().await;
                    }
                }
                conflicts::Verdict::Wait(other) => {
                    log::debug!("{time}: waiting for the overlapping commit of {other}");
                    // Said in the intent: an earlier schema change goes on once it reads it.
                    if other.as_str() < time && footprint.waits_for.as_deref() != Some(other.as_str()) {
                        footprint.waits_for = Some(other.clone());
                        conflicts::publish_intent(table.storage(), time, &footprint).await?;
                    }
                    if let Some(p) = table.timeline().pending().find(|i| i.time == other).cloned() {
                        watch.check(table, &p, &format!("commit {time}")).await?;
                    }
                    conflicts::pause().await;
                }
            }
        }
    }

    /// Fails when a rollback or restore undoes a commit this write saw when it began: its files
    /// carry that commit's rows on (see [`super::undone`]).
    async fn check_nothing_read_is_undone(&self, table: &Table) -> Result<()> {
        match super::undone::undoing_seen(table, &self.seen, &self.undoers_finished).await? {
            None => Ok(()),
            Some((undoer, target)) => Err(Error::CommitConflict {
                instant: undoer.clone(),
                detail: format!(
                    "the commit {target}, which this write read, is undone by the rollback or restore {undoer} \
                     since this write began"
                ),
            }),
        }
    }

    /// The schema this commit records, once its checks passed: the table's as the latest commit
    /// left it, with this write's evolution (`schema::evolve`) on top. `None`: `metadata` records
    /// it already (or records none: the metadata table's commits). A write that evolves the schema
    /// conflicts with a later instant that completed first (that one's schema lacks the change,
    /// and the latest commit's schema is the table's); overlapping pending commits were ordered by
    /// [`conflicts::check_intents`] (a schema-evolving footprint meets every other).
    ///
    /// On a table whose columns have ids ([`crate::schema::internal`]) every commit records them
    /// (`latestSchema`) and the whole history (`.hoodie/.schema/<time>.schemacommit`), as Apache
    /// Hudi does; a write during which columns were renamed or dropped conflicts (its files name
    /// them the old way), and so does an explicit change during which the schema changed.
    async fn reconcile_schema(&self, table: &Table, metadata: &CommitMetadata) -> Result<Option<CommitMetadata>> {
        let Some(mine) = metadata.arrow_schema()? else { return Ok(None) };
        if table.is_metadata_table() {
            return Ok(None);
        }
        let explicit = match metadata.extra_metadata.get(internal::LATEST_SCHEMA_KEY) {
            Some(json) => Some(InternalSchema::from_json(json)?),
            None => None,
        };
        let on_read = explicit.is_some()
            || self.ids_at_begin.is_some()
            || table.config().raw.contains_key(internal::SCHEMA_ON_READ_KEY);
        // A table whose schema never evolved, and a write that does not evolve it: nothing to
        // read (the check's reloads re-read the properties, so an evolution that completed
        // before this commit's last look has set the flag; one still pending met this commit's
        // intent, see above).
        let evolved = table.config().raw.contains_key(crate::table::SCHEMA_EVOLVED_KEY);
        if !on_read && !evolved && mine == self.schema_at_begin {
            return Ok(None);
        }
        let (committed, committed_ids) = crate::table::committed(table.storage(), table.config(), table.timeline())
            .await?
            .unwrap_or_else(|| (self.schema_at_begin.clone(), None));
        // The latest commit records ids: another process changed columns explicitly (this one
        // may not have re-read the properties that say so).
        let on_read = on_read || committed_ids.is_some();
        let time = self.instant.time.clone();
        if !on_read && mine == committed {
            return Ok(None);
        }
        // The ids this write's files were written under; a column renamed or dropped since, and
        // they name it wrongly.
        let begin = match &self.ids_at_begin {
            Some(ids) => ids.clone(),
            None => InternalSchema::from_arrow(&crate::schema::with_meta_fields(&self.schema_at_begin), 0)?,
        };
        let base = committed_ids.clone().unwrap_or_else(|| begin.clone());
        let changed_meanwhile = |what: &str| Error::CommitConflict {
            instant: time.clone(),
            detail: format!("{what} while this commit was being written; nothing was changed, try it again"),
        };
        if on_read
            && let Some(moved) = begin.fields.iter().find(|c| base.column_by_id(c.id).is_none_or(|b| b.name != c.name))
        {
            return Err(changed_meanwhile(&format!("column `{}` was renamed or dropped", moved.name)));
        }
        let mut out = metadata.clone();
        let merged = match &explicit {
            Some(_) => mine.clone(),
            None => self.merge_schema(table, &mine, &committed)?,
        };
        if merged != mine {
            out.set_schema(&merged, &table.config().name)?;
        }
        if !on_read {
            return Ok((merged != mine).then_some(out));
        }
        let had_ids = committed_ids.is_some() || self.ids_at_begin.is_some();
        let ids = match explicit {
            Some(ids) => {
                if committed != self.schema_at_begin
                    || committed_ids.map(|c| c.version) != self.ids_at_begin.as_ref().map(|b| b.version)
                {
                    return Err(changed_meanwhile("the table's schema changed"));
                }
                // The latest commit's schema is the table's: a later instant that completed first
                // would hide this change.
                if let Some(later) = table.timeline().completed_data().find(|i| i.time > time) {
                    return Err(Error::CommitConflict {
                        instant: later.time.clone(),
                        detail: format!(
                            "the later write {} completed first, with the schema before this change, and the \
                             latest commit's schema is the table's; nothing was changed, try it again",
                            later.time
                        ),
                    });
                }
                ids
            }
            None => {
                let followed = base.follow(&crate::schema::with_meta_fields(&merged))?;
                if followed == base { base } else { followed.at_version(&time)? }
            }
        };
        let mut versions: std::collections::BTreeMap<i64, InternalSchema> = if had_ids {
            let history = crate::table::load_column_history(table.storage(), table.timeline(), ids.clone()).await?;
            history.versions().map(|v| (v.version, v.clone())).collect()
        } else {
            // The first change: the schema until now is the first version, in force from the
            // table's first commit on.
            [(0, begin.clone())].into_iter().collect()
        };
        versions.insert(ids.version, ids.clone());
        let history = internal::history_to_json(versions.values());
        table.storage().put(&internal::schema_commit_path(&time), Bytes::from(history)).await?;
        out.extra_metadata.insert(internal::LATEST_SCHEMA_KEY.into(), ids.to_json());
        Ok(Some(out))
    }

    /// `mine` merged into the latest committed schema (see [`Transaction::reconcile_schema`]).
    fn merge_schema(
        &self,
        table: &Table,
        mine: &arrow::datatypes::SchemaRef,
        committed: &arrow::datatypes::SchemaRef,
    ) -> Result<arrow::datatypes::SchemaRef> {
        if mine == committed {
            return Ok(committed.clone());
        }
        let time = self.instant.time.clone();
        let cfg = table.config();
        let fixed: Vec<String> = cfg.record_key_fields.iter().chain(&cfg.partition_fields).cloned().collect();
        let merged = crate::schema::evolve::evolve(committed, mine, crate::schema::evolve::SchemaMode::Merge, &fixed)
            .map_err(|e| Error::CommitConflict {
            instant: time.clone(),
            detail: format!("another commit changed the schema meanwhile: {e}"),
        })?;
        if &merged != committed
            && let Some(later) = table.timeline().completed_data().find(|i| i.time > time)
        {
            return Err(conflict(&later.time, "completed first without this write's schema change"));
        }
        Ok(merged)
    }

    async fn stop_heartbeat(&mut self, storage: &Storage) -> Result<()> {
        if let Some(h) = self.heartbeat.take() {
            h.abort();
        }
        storage.delete(&heartbeat_path(&self.instant.time)).await
    }
}

/// The error of a write whose outcome is not known: `how` it got there, `cause` the failure.
fn unknown(time: &str, how: &str, cause: &Error) -> Error {
    Error::CommitUnknown {
        instant: time.to_string(),
        detail: format!(
            "{how}: {cause}. It may be committed; `Table::outcome(\"{time}\")` tells, and completes or rolls it back \
             when its writer is gone; do not write it again before"
        ),
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

/// The column ids a write starts from (`None`: columns are known by name).
fn begin_ids(table: &Table) -> Option<InternalSchema> {
    table.column_history().map(|c| c.latest().clone())
}

/// Whether the plan of the pending clean `clean` names the table-relative `file` (an
/// unreadable plan names nothing: the error stays what it was).
async fn plans_to_delete(table: &Table, clean: &Instant, file: &str) -> bool {
    let path = table.timeline().path_of(&clean.with_state(State::Requested));
    let Ok(bytes) = table.storage().get(&path).await else {
        return false;
    };
    match crate::format::clean::read_plan(&path, &bytes) {
        Ok(crate::format::clean::Stored::Avro(plan)) => plan.files(&path).is_ok_and(|f| f.iter().any(|f| f == file)),
        Ok(crate::format::clean::Stored::Legacy(plan)) => plan.files_to_delete.iter().any(|f| f == file),
        Err(_) => false,
    }
}

pub(super) fn services_seen(table: &Table) -> HashSet<String> {
    table
        .timeline()
        .instants()
        .iter()
        .filter(|i| (i.is_completed() && i.action == Action::Clean) || i.action == Action::Rollback)
        .map(|i| i.time.clone())
        .collect()
}

pub(super) fn conflict(other: &str, what: &str) -> Error {
    Error::CommitConflict {
        instant: other.to_string(),
        detail: format!("instant {other} {what} and touched the same file groups or record keys"),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow::array::{Int64Array, RecordBatch, StringArray};
    use arrow::datatypes::{DataType, Field, Schema};

    use super::*;
    use crate::config::TableType;
    use crate::read::ScanOptions;
    use crate::table::TableOptions;
    use crate::test_support::{by_parity, id_city_table, keyed_table};
    use crate::write::{WriteConfig, WriteOperation};

    fn parquet_files(dir: &std::path::Path) -> Vec<String> {
        let mut out = Vec::new();
        for partition in ["city=a", "city=b"] {
            let Ok(entries) = std::fs::read_dir(dir.join("t").join(partition)) else { continue };
            out.extend(
                entries
                    .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                    .filter(|n| n.ends_with(".parquet")),
            );
        }
        out.sort();
        out
    }

    async fn rows(t: &Table) -> usize {
        let stream = t.scan(&ScanOptions::default()).await.unwrap();
        datafusion::physical_plan::common::collect(stream).await.unwrap().iter().map(|b| b.num_rows()).sum()
    }

    /// Found by the stress suite: a write's read met a file a clean had deleted while the clean
    /// was still running (a clean deletes before it completes), and failed as damage. A file the
    /// plan of a running clean names is a conflict (retried on what the table holds now); once
    /// the clean completed it is one for a write that began before (the existing rule); a file
    /// no plan names, or one a clean the write saw completed deleted, stays a storage error.
    #[tokio::test]
    async fn a_file_a_clean_deleted_is_a_conflict_while_the_clean_runs_and_after() {
        use crate::services::clean::CleanPolicy;
        let dir = tempfile::tempdir().unwrap();
        let mut t = id_city_table(dir.path(), TableType::CopyOnWrite, TableOptions::default()).await;
        let config = WriteConfig::default();
        t.write(WriteOperation::Insert, vec![by_parity(&[1, 2])], &config).await.unwrap();
        t.write(WriteOperation::Upsert, vec![by_parity(&[1])], &config).await.unwrap();
        let mut writer = Table::open(t.uri(), t.options().clone()).await.unwrap();
        let tx = writer.begin_write(WriteOperation::Upsert).await.unwrap();
        let cleaned = t.clean(CleanPolicy::KeepLatestFileVersions(1)).await.unwrap();
        let [gone] = cleaned.deleted.as_slice() else { panic!("one old version deleted: {cleaned:?}") };
        let clean = Instant::new(cleaned.instant.as_deref().unwrap(), Action::Clean, State::Completed);
        let not_found = |path: &str| {
            let source = object_store::Error::NotFound { path: path.into(), source: "gone".into() };
            Error::storage(path, source)
        };
        // Running: its files deleted, its completed file not yet written.
        let completed = t.timeline().path_of(&clean);
        let record = t.storage().get(&completed).await.unwrap();
        t.storage().delete(&completed).await.unwrap();
        let err = tx.lost_to_service(&mut writer, not_found(gone)).await;
        assert!(
            matches!(&err, Error::CommitConflict { instant, detail } if *instant == clean.time && detail.contains("(running)")),
            "{err}"
        );
        // A file no plan names: damage, not a conflict.
        let err = tx.lost_to_service(&mut writer, not_found("city=a/other.parquet")).await;
        assert!(matches!(err, Error::Storage { .. }), "{err}");
        // Completed: a conflict for the write that began while it ran; damage for one that
        // began after (its view left the file out).
        t.storage().put(&completed, record).await.unwrap();
        let err = tx.lost_to_service(&mut writer, not_found(gone)).await;
        assert!(matches!(&err, Error::CommitConflict { instant, .. } if *instant == clean.time), "{err}");
        tx.fail(&mut writer, Error::invalid_arg("test", "done")).await;
        let tx = writer.begin_write(WriteOperation::Upsert).await.unwrap();
        let err = tx.lost_to_service(&mut writer, not_found(gone)).await;
        assert!(matches!(err, Error::Storage { .. }), "{err}");
        tx.fail(&mut writer, Error::invalid_arg("test", "done")).await;
    }

    #[tokio::test]
    async fn settling_an_instant_its_committer_decided_to_complete_completes_it() {
        let dir = tempfile::tempdir().unwrap();
        let mut t = id_city_table(dir.path(), TableType::CopyOnWrite, TableOptions::default()).await;
        let tx = t.begin_write(WriteOperation::Insert).await.unwrap();
        let pending = Instant::new(tx.time(), Action::Commit, State::Inflight);
        let metadata = Bytes::from(CommitMetadata::default().to_json().unwrap());
        let decided = fate::Fate::Committed { action: Action::Commit, metadata, completion: None };
        fate::decide(t.storage(), tx.time(), tx.epoch(), decided).await.unwrap();
        assert!(super::super::settle(&t, &pending).await.unwrap(), "completed for its committer");
        t.reload().await.unwrap();
        assert!(t.timeline().get(tx.time()).is_some_and(Instant::is_completed));
        // One undecided is taken back: its committer finds a conflict.
        let tx = t.begin_write(WriteOperation::Insert).await.unwrap();
        let pending = Instant::new(tx.time(), Action::Commit, State::Inflight);
        assert!(!super::super::settle(&t, &pending).await.unwrap());
        let config = WriteConfig::default();
        let part = t.write_files(WriteOperation::Insert, vec![by_parity(&[7])], tx.time(), &config).await.unwrap();
        let err = t.commit_write(tx, WriteOperation::Insert, vec![part], false).await.unwrap_err();
        assert!(matches!(err, Error::CommitConflict { .. }), "{err}");
    }

    #[tokio::test]
    async fn a_rollback_that_took_a_completed_instant_for_pending_gives_up_once_its_fate_is_pruned() {
        let dir = tempfile::tempdir().unwrap();
        let mut t = id_city_table(dir.path(), TableType::CopyOnWrite, TableOptions::default()).await;
        let config = WriteConfig::default();
        let tx = t.begin_write(WriteOperation::Insert).await.unwrap();
        let time = tx.time().to_string();
        let part = t.write_files(WriteOperation::Insert, vec![by_parity(&[1, 2])], &time, &config).await.unwrap();
        // Another process sees the write pending and pauses; the write completes, and its fate
        // record is pruned.
        let stale = Table::open(t.uri(), t.options().clone()).await.unwrap();
        let pending = stale.timeline().get(&time).unwrap().clone();
        t.commit_write(tx, WriteOperation::Insert, vec![part], false).await.unwrap();
        t.reload().await.unwrap();
        fate::prune(&t, "29991231235959999", "").await.unwrap();
        assert!(fate::recorded(t.storage(), &time, 0).await.unwrap().is_none());
        let files = parquet_files(dir.path());
        // The paused process wakes and rolls the write back, as failed: it decides first, and
        // then finds the write completed.
        let undo = super::super::rollback::Undo::Failed;
        assert!(!super::super::rollback::rollback(&stale, &pending, None, undo).await.unwrap());
        assert_eq!(parquet_files(dir.path()), files);
        t.reload().await.unwrap();
        assert_eq!(rows(&t).await, 2);
        assert!(t.timeline().pending().next().is_none(), "no rollback instant left");
        assert!(fate::recorded(t.storage(), &time, 0).await.unwrap().is_none(), "its record withdrawn");
        // Paused instead right after it decided: a process that resumes its rollback (its
        // heartbeat never started) finds the write completed too.
        let plan = super::super::rollback::rollback_plan(&time, Action::Commit, false, Vec::new()).unwrap();
        let r = super::super::claim(&stale, Action::Rollback, |_| Ok(plan.clone())).await.unwrap();
        let ours = fate::Fate::RolledBack { by: r.time.clone() };
        assert_eq!(fate::decide(t.storage(), &time, 0, ours.clone()).await.unwrap(), ours);
        let mut options = t.options().clone();
        options.heartbeat_interval = std::time::Duration::from_millis(1);
        let mut resumer = Table::open(t.uri(), options).await.unwrap();
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        crate::commit::rollback_failed(&mut resumer).await.unwrap();
        assert_eq!(parquet_files(dir.path()), files);
        t.reload().await.unwrap();
        assert_eq!(rows(&t).await, 2);
        assert!(t.timeline().pending().next().is_none(), "the rollback instant is removed");
        assert!(fate::recorded(t.storage(), &time, 0).await.unwrap().is_none());
    }

    /// Found by the stress suite: a process on a slow store listed a rollback while it ran, found
    /// its heartbeat gone (it had finished, not died) and ran it again: a second completion, and
    /// once archival had moved the first, a metadata deltacommit behind the metadata table's
    /// archive (which then reads as stale). A rollback that finished is never run again.
    #[tokio::test]
    async fn a_rollback_that_finished_is_not_run_again_by_a_process_that_listed_it_pending() {
        let dir = tempfile::tempdir().unwrap();
        let options = TableOptions { heartbeat_interval: std::time::Duration::from_millis(20), ..Default::default() };
        let mut t = id_city_table(dir.path(), TableType::CopyOnWrite, options.clone()).await;
        t.write(WriteOperation::Insert, vec![by_parity(&[1, 2])], &WriteConfig::default()).await.unwrap();
        let before = parquet_files(dir.path());
        // A write whose process dies after writing its files.
        let tx = t.begin_write(WriteOperation::Upsert).await.unwrap();
        let time = tx.time().to_string();
        let written =
            t.write_files(WriteOperation::Upsert, vec![by_parity(&[1, 3])], &time, &WriteConfig::default()).await;
        drop(written.unwrap());
        drop(tx);
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        // Its rollback is requested; a slow process lists the table then.
        let plan = super::super::rollback::rollback_plan(&time, Action::Commit, false, Vec::new()).unwrap();
        let r = super::super::claim(&t, Action::Rollback, |_| Ok(plan.clone())).await.unwrap();
        let mut slow = Table::open(t.uri(), options).await.unwrap();
        assert!(slow.timeline().pending().any(|i| i.time == r.time), "the slow process sees it pending");
        // The rollback finishes; its heartbeat is gone, as a dead process's would be.
        let target = Instant::new(time.clone(), Action::Commit, State::Inflight);
        let undo = super::super::rollback::Undo::Failed;
        assert!(super::super::rollback::rollback(&t, &target, Some(r.clone()), undo).await.unwrap());
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        // The slow process takes it for interrupted: it leaves it be.
        assert_eq!(crate::commit::rollback_failed(&mut slow).await.unwrap(), Vec::<String>::new());
        t.reload().await.unwrap();
        let at_r: Vec<&Instant> = t.timeline().instants().iter().filter(|i| i.time == r.time).collect();
        assert!(at_r.len() == 1 && at_r[0].is_completed(), "{at_r:?}");
        assert!(t.timeline().pending().next().is_none());
        assert_eq!(parquet_files(dir.path()), before);
        assert_eq!(rows(&t).await, 2);
        // Later in `undo`, right before the metadata table and the timeline take it: the same.
        let r_done = t.timeline().instants().iter().find(|i| i.time == r.time).unwrap().clone();
        super::super::rollback::undo(&t, &target, &r_done.with_state(State::Requested), false).await.unwrap();
        t.reload().await.unwrap();
        assert_eq!(t.timeline().instants().iter().filter(|i| i.time == r.time).count(), 1);
        // Being archived (its requested file deleted, the others next): the slow process's undo
        // finds the inflight file there, but not the plan, and does nothing.
        t.storage().delete(&t.timeline().path_of(&r_done.with_state(State::Requested))).await.unwrap();
        super::super::rollback::undo(&t, &target, &r_done.with_state(State::Requested), false).await.unwrap();
        t.reload().await.unwrap();
        let at_r: Vec<&Instant> = t.timeline().instants().iter().filter(|i| i.time == r.time).collect();
        assert!(at_r.len() == 1 && at_r[0].is_completed(), "{at_r:?}");
        // Archived (its requested, inflight and completed files deleted, in that order): the
        // slow process's undo makes no file of it again.
        for state in [State::Requested, State::Inflight, State::Completed] {
            t.storage().delete(&t.timeline().path_of(&r_done.with_state(state))).await.unwrap();
        }
        super::super::rollback::undo(&t, &target, &r_done.with_state(State::Requested), false).await.unwrap();
        t.reload().await.unwrap();
        assert!(t.timeline().instants_at(&r.time).is_empty(), "{:?}", t.timeline().instants());
    }

    /// A writer paused between its claim and its heartbeat for longer than a heartbeat lasts is
    /// taken for failed, and a rollback decides its fate: the writer finds the record and gives
    /// its time up, whatever became of that rollback (finished, it would have started at the
    /// next attempt, after archival may have passed the time).
    #[tokio::test]
    async fn a_claim_rolled_back_before_its_write_started_is_given_up() {
        let dir = tempfile::tempdir().unwrap();
        let mut t = id_city_table(dir.path(), TableType::CopyOnWrite, TableOptions::default()).await;
        t.write(WriteOperation::Insert, vec![by_parity(&[1, 2])], &WriteConfig::default()).await.unwrap();
        let plan = CommitMetadata::default().to_timeline_bytes(t.timeline().layout(), Action::Commit).unwrap();
        let begun = Transaction::begin_planned(&mut t, Action::Commit, move |table, time| {
            let plan = Bytes::from(plan.clone());
            Box::pin(async move {
                // Another process's rollback decides while this writer is paused.
                let by = fate::Fate::RolledBack { by: format!("{time}9") };
                fate::decide(table.storage(), time, 0, by).await?;
                Ok(Some(plan))
            })
        })
        .await;
        let time = match begun {
            Err(Error::CommitConflict { instant, .. }) => instant,
            other => panic!("{:?}", other.map(|tx| tx.map(|tx| tx.time().to_string()))),
        };
        let inflight = Instant::new(time.clone(), Action::Commit, State::Inflight);
        assert!(t.storage().head(&t.timeline().path_of(&inflight)).await.unwrap().is_none(), "no inflight file");
    }

    /// A write whose input was read while a crashed write was pending: its own beginning rolls
    /// the crashed one back, which the read saw nothing of, so it is no conflict. A pending write
    /// the read listed and that another process rolled back is one (what completed after the
    /// read cannot be told apart from it then), and so is a commit completed since the read.
    #[tokio::test]
    async fn a_write_read_beside_a_crashed_write_conflicts_only_with_what_completed_since() {
        let dir = tempfile::tempdir().unwrap();
        let options = TableOptions { heartbeat_interval: std::time::Duration::from_millis(20), ..Default::default() };
        let mut t = id_city_table(dir.path(), TableType::CopyOnWrite, options.clone()).await;
        t.write(WriteOperation::Insert, vec![by_parity(&[1, 2])], &WriteConfig::default()).await.unwrap();
        let crash = |t: &mut Table| {
            let mut t = t.clone();
            async move {
                let tx = t.begin_write(WriteOperation::Upsert).await.unwrap();
                let time = tx.time().to_string();
                t.write_files(WriteOperation::Upsert, vec![by_parity(&[1])], &time, &WriteConfig::default())
                    .await
                    .unwrap();
                drop(tx);
                tokio::time::sleep(std::time::Duration::from_millis(200)).await;
                time
            }
        };
        let crashed = crash(&mut t).await;
        t.reload().await.unwrap();
        let read = ReadState::of(t.timeline().instants());
        assert!(read.listed.contains(&crashed) && !read.completed.contains(&crashed));
        let tx = t.begin_write_read_from(WriteOperation::Upsert, &read).await.unwrap();
        assert!(t.timeline().instants_at(&crashed).is_empty(), "the beginning rolled it back");
        drop(tx);
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        crate::commit::rollback_failed(&mut t).await.unwrap();

        // Rolled back by another process after the read: a conflict.
        let crashed = crash(&mut t).await;
        t.reload().await.unwrap();
        let read = ReadState::of(t.timeline().instants());
        let mut other = Table::open(t.uri(), options).await.unwrap();
        assert_eq!(crate::commit::rollback_failed(&mut other).await.unwrap(), vec![crashed]);
        let e = t.begin_write_read_from(WriteOperation::Upsert, &read).await.unwrap_err();
        assert!(matches!(e, Error::CommitConflict { .. }), "{e}");

        // A commit completed since the read: a conflict at commit.
        t.reload().await.unwrap();
        let read = ReadState::of(t.timeline().instants());
        other.reload().await.unwrap();
        other.write(WriteOperation::Upsert, vec![by_parity(&[2])], &WriteConfig::default()).await.unwrap();
        let tx = t.begin_write_read_from(WriteOperation::Upsert, &read).await.unwrap();
        let time = tx.time().to_string();
        let files =
            t.write_files(WriteOperation::Upsert, vec![by_parity(&[2])], &time, &WriteConfig::default()).await.unwrap();
        let e = t.commit_write(tx, WriteOperation::Upsert, vec![files], false).await.unwrap_err();
        assert!(matches!(e, Error::CommitConflict { .. }), "{e}");
    }

    /// The steps of a write a process may die after (a dropped transaction stops its heartbeat
    /// and leaves storage as a `kill -9` there would).
    #[derive(Clone, Copy, Debug)]
    enum DiesAfter {
        /// `t.commit.requested` and the heartbeat.
        Claim,
        /// The inflight file and the data files.
        Files,
        /// Its own check refused the commit (a conflict) and recorded its fate as taken back.
        Verdict,
    }

    #[tokio::test]
    async fn a_writer_that_dies_after_any_step_is_rolled_back_by_the_next_and_leaves_nothing() {
        for step in [DiesAfter::Claim, DiesAfter::Files, DiesAfter::Verdict] {
            let dir = tempfile::tempdir().unwrap();
            let options =
                TableOptions { heartbeat_interval: std::time::Duration::from_millis(20), ..Default::default() };
            let mut t = id_city_table(dir.path(), TableType::CopyOnWrite, options.clone()).await;
            t.write(WriteOperation::Insert, vec![by_parity(&[1, 2])], &WriteConfig::default()).await.unwrap();
            let before = parquet_files(dir.path());
            let tx = t.begin_write(WriteOperation::Upsert).await.unwrap();
            let time = tx.time().to_string();
            if !matches!(step, DiesAfter::Claim) {
                let written = t
                    .write_files(WriteOperation::Upsert, vec![by_parity(&[1, 3])], &time, &WriteConfig::default())
                    .await
                    .unwrap();
                assert!(parquet_files(dir.path()).len() > before.len(), "{step:?}");
                if matches!(step, DiesAfter::Verdict) {
                    let taken_back = fate::Fate::RolledBack { by: time.clone() };
                    fate::decide(t.storage(), &time, tx.epoch(), taken_back).await.unwrap();
                }
                drop(written);
            }
            drop(tx);
            tokio::time::sleep(std::time::Duration::from_millis(200)).await;
            let mut next = Table::open(t.uri(), options).await.unwrap();
            let rolled = crate::commit::rollback_failed(&mut next).await.unwrap();
            assert_eq!(rolled, vec![time.clone()], "{step:?}");
            next.reload().await.unwrap();
            assert!(next.timeline().get(&time).is_none(), "{step:?}: neither pending nor completed");
            assert!(next.timeline().pending().next().is_none(), "{step:?}: no rollback left pending");
            assert_eq!(parquet_files(dir.path()), before, "{step:?}: its files are gone");
            assert_eq!(rows(&next).await, 2, "{step:?}");
            // The table takes writes again.
            next.write(WriteOperation::Upsert, vec![by_parity(&[1, 3])], &WriteConfig::default()).await.unwrap();
            assert_eq!(rows(&next).await, 3, "{step:?}");
        }
    }

    /// Found by the streaming kill test: a rollback killed after deciding its target's fate owned
    /// it for ever; every writer meeting the target's intent started a rollback of its own, found
    /// the fate decided, and tried again (a new claim each time, without end). The next rollback
    /// finishes the dead one's work instead.
    #[tokio::test]
    async fn a_rollback_whose_process_died_after_deciding_the_fate_is_finished_by_the_next() {
        let dir = tempfile::tempdir().unwrap();
        let options = TableOptions { heartbeat_interval: std::time::Duration::from_millis(20), ..Default::default() };
        let mut t = id_city_table(dir.path(), TableType::CopyOnWrite, options.clone()).await;
        t.write(WriteOperation::Insert, vec![by_parity(&[1, 2])], &WriteConfig::default()).await.unwrap();
        let before = parquet_files(dir.path());
        let tx = t.begin_write(WriteOperation::Upsert).await.unwrap();
        let time = tx.time().to_string();
        let written = t
            .write_files(WriteOperation::Upsert, vec![by_parity(&[1, 3])], &time, &WriteConfig::default())
            .await
            .unwrap();
        let epoch = tx.epoch();
        drop((written, tx));
        // A rollback claims its instant and decides the fate, then its process dies.
        let plan = super::super::rollback::rollback_plan(&time, Action::Commit, false, Vec::new()).unwrap();
        let dead = super::super::claims::claim(&t, Action::Rollback, |_| Ok(plan.clone())).await.unwrap();
        fate::decide(t.storage(), &time, epoch, fate::Fate::RolledBack { by: dead.time.clone() }).await.unwrap();
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        let next = Table::open(t.uri(), options).await.unwrap();
        let target = Instant::new(time.clone(), Action::Commit, State::Inflight);
        let done = super::super::rollback::rollback(&next, &target, None, Undo::Failed).await.unwrap();
        assert!(done, "the dead rollback is finished");
        let mut next = next;
        next.reload().await.unwrap();
        assert!(next.timeline().get(&time).is_none(), "the target is gone");
        assert!(next.timeline().pending().next().is_none(), "no rollback left pending");
        assert!(next.timeline().instants_at(&dead.time).iter().all(|i| i.is_completed()));
        assert_eq!(parquet_files(dir.path()), before, "its files are gone");
        assert_eq!(rows(&next).await, 2);
    }

    #[tokio::test]
    async fn a_write_another_process_rolled_back_fails_and_removes_its_files() {
        let dir = tempfile::tempdir().unwrap();
        let mut t = id_city_table(dir.path(), TableType::CopyOnWrite, TableOptions::default()).await;
        t.write(WriteOperation::Insert, vec![by_parity(&[1, 2])], &WriteConfig::default()).await.unwrap();
        let before = parquet_files(dir.path());
        let tx = t.begin_write(WriteOperation::Upsert).await.unwrap();
        let time = tx.time().to_string();
        let part = t
            .write_files(WriteOperation::Upsert, vec![by_parity(&[1, 3])], &time, &WriteConfig::default())
            .await
            .unwrap();
        assert!(parquet_files(dir.path()).len() > before.len());
        // Another process took this writer for dead and recorded its fate first.
        fate::decide(t.storage(), &time, tx.epoch(), fate::Fate::RolledBack { by: "x".into() }).await.unwrap();
        let err = t.commit_write(tx, WriteOperation::Upsert, vec![part], false).await.unwrap_err();
        assert!(
            matches!(&err, Error::CommitConflict { detail, .. } if detail.contains("rolled back by another process")),
            "{err}"
        );
        assert_eq!(parquet_files(dir.path()), before, "the files it wrote are gone");
        t.reload().await.unwrap();
        assert!(t.timeline().get(&time).is_none_or(|i| !i.is_completed()));
        assert_eq!(rows(&t).await, 2);
    }

    #[tokio::test]
    async fn a_commit_a_later_write_of_the_same_file_group_overtook_conflicts_and_is_rolled_back() {
        let dir = tempfile::tempdir().unwrap();
        let mut a = id_city_table(dir.path(), TableType::CopyOnWrite, TableOptions::default()).await;
        a.write(WriteOperation::Insert, vec![by_parity(&[1, 2])], &WriteConfig::default()).await.unwrap();
        let tx = a.begin_write(WriteOperation::Upsert).await.unwrap();
        let time = tx.time().to_string();
        let part =
            a.write_files(WriteOperation::Upsert, vec![by_parity(&[1])], &time, &WriteConfig::default()).await.unwrap();
        let mut b = Table::open(a.uri(), TableOptions::default()).await.unwrap();
        let other = b.write(WriteOperation::Upsert, vec![by_parity(&[1])], &WriteConfig::default()).await.unwrap();
        let other = other.instant.unwrap();
        let err = a.commit_write(tx, WriteOperation::Upsert, vec![part], false).await.unwrap_err();
        assert!(matches!(&err, Error::CommitConflict { instant, .. } if *instant == other), "{err}");
        a.reload().await.unwrap();
        // Rolled back: neither pending nor completed, its file gone; the other write's stays.
        assert!(a.timeline().get(&time).is_none());
        assert!(parquet_files(dir.path()).iter().all(|f| !f.ends_with(&format!("_{time}.parquet"))));
        assert!(parquet_files(dir.path()).iter().any(|f| f.ends_with(&format!("_{other}.parquet"))));
        assert_eq!(rows(&a).await, 2);
    }

    #[tokio::test]
    async fn a_write_during_which_a_column_was_renamed_conflicts() {
        let dir = tempfile::tempdir().unwrap();
        let schema = Arc::new(Schema::new(vec![
            Field::new("id", DataType::Int64, false),
            Field::new("city", DataType::Utf8, true),
            Field::new("v", DataType::Int64, true),
        ]));
        let mut a = keyed_table(dir.path(), TableType::MergeOnRead, TableOptions::default(), schema.clone()).await;
        let uri = a.uri().to_string();
        let uri = uri.as_str();
        let batch = |ids: &[i64], v: i64| {
            let cities: Vec<&str> = ids.iter().map(|i| if i % 2 == 0 { "a" } else { "b" }).collect();
            let columns: Vec<arrow::array::ArrayRef> = vec![
                Arc::new(Int64Array::from(ids.to_vec())),
                Arc::new(StringArray::from(cities)),
                Arc::new(Int64Array::from(vec![v; ids.len()])),
            ];
            RecordBatch::try_new(schema.clone(), columns).unwrap()
        };
        a.write(WriteOperation::Insert, vec![batch(&[1, 2], 10)], &WriteConfig::default()).await.unwrap();
        let tx = a.begin_write(WriteOperation::Upsert).await.unwrap();
        let time = tx.time().to_string();
        let part =
            a.write_files(WriteOperation::Upsert, vec![batch(&[1], 20)], &time, &WriteConfig::default()).await.unwrap();
        let mut b = Table::open(uri, TableOptions::default()).await.unwrap();
        let rename = crate::schema::internal::SchemaChange::RenameColumn { name: "v".into(), new_name: "w".into() };
        b.alter_schema(&[rename]).await.unwrap().unwrap();
        // The log block names the column `v` under an instant the new version would read as `w`.
        let err = a.commit_write(tx, WriteOperation::Upsert, vec![part], false).await.unwrap_err();
        assert!(
            matches!(&err, Error::CommitConflict { detail, .. } if detail.contains("`v` was renamed or dropped")),
            "{err}"
        );
        b.reload().await.unwrap();
        assert!(b.timeline().get(&time).is_none());
        let stream = b.scan(&ScanOptions { columns: Some(vec!["w".into()]), ..Default::default() }).await.unwrap();
        let batches = datafusion::physical_plan::common::collect(stream).await.unwrap();
        let values: Vec<i64> = batches
            .iter()
            .flat_map(|b| b.column(0).as_any().downcast_ref::<Int64Array>().unwrap().values().to_vec())
            .collect();
        assert_eq!(values, vec![10, 10]);
    }
}
