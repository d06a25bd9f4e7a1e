//! The active timeline: every instant of the table with its latest state.
//!
//! Loading lists the timeline directory once. Each instant time appears once, in its most advanced
//! state (a compaction requested at `t` and completed as `t.commit` is one completed instant).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use bytes::Bytes;

use crate::config::TableConfig;
use crate::error::{Error, Result};
use crate::format::commit::CommitMetadata;
use crate::format::instant::{Action, Instant, State};
use crate::storage::{FileInfo, Storage};

/// The instants of one table, sorted by time.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Timeline {
    instants: Vec<Instant>,
    dir: String,
    layout: u32,
    /// With [`Timeline::with_archived`]: what archived instants recorded, by time and kind (their
    /// files are gone from the timeline directory).
    archived: Option<Arc<BTreeMap<(String, Action), serde_json::Value>>>,
    /// Instant times that never read as committed, even once older than the active timeline:
    /// those oxlake rolled back ([`ROLLED_BACK_DIR`]), and those a restricted timeline withholds
    /// ([`Timeline::retain`]).
    rolled_back: Arc<BTreeSet<String>>,
    /// The store's version tag (ETag) of each listed instant file, by file name: a completed
    /// instant removed and written again under the same name (a layout 1 compaction or metadata
    /// deltacommit run again at its own time) is a different file to what caches its contents.
    versions: Arc<BTreeMap<String, String>>,
    /// Inflight files without their requested file, older than every completed commit: left by
    /// a process that died between the two steps of [`Timeline::start`] for a plan archived since
    /// it was listed. Not instants; `rollback_failed` deletes them once their heartbeat expired.
    leftovers: Arc<Vec<Instant>>,
}

/// oxlake's markers of the instant times it rolled back, one empty file `<time>` each, written
/// before the rollback deletes anything. A writer frozen past its heartbeat may still write files
/// of its instant after the rollback removed the others; once archival moves the timeline's start
/// past that time, Apache Hudi's rule (a file older than the active timeline is committed) would
/// show them. The marker keeps them hidden; an attempt completing at that time again removes it.
pub const ROLLED_BACK_DIR: &str = ".hoodie/oxlake/rolled_back";

/// The path of the marker of a time rolled back (see [`ROLLED_BACK_DIR`]).
pub fn rolled_back_marker(time: &str) -> String {
    format!("{ROLLED_BACK_DIR}/{time}")
}

/// One kind per instant: a compaction completes as a commit, a clustering as a replacecommit.
fn kind(a: Action) -> Action {
    match a {
        Action::Compaction => Action::Commit,
        Action::LogCompaction => Action::DeltaCommit,
        Action::Clustering => Action::ReplaceCommit,
        other => other,
    }
}

impl Timeline {
    /// Lists the timeline directory of a table.
    pub async fn load(storage: &Storage, config: &TableConfig) -> Result<Self> {
        Self::list(storage, config.timeline_dir(), config.layout_version).await
    }

    /// The timeline of the same table as it is now, listed again.
    pub async fn relisted(&self, storage: &Storage) -> Result<Self> {
        Self::list(storage, self.dir.clone(), self.layout).await
    }

    async fn list(storage: &Storage, dir: String, layout: u32) -> Result<Self> {
        // One round trip: the markers are listed beside the timeline.
        let (files, rolled_back) =
            futures::try_join!(storage.list_dir_tagged(&dir), storage.list_dir(ROLLED_BACK_DIR))?;
        Ok(Self::from_listing(&files, dir, layout).with_rolled_back(&rolled_back))
    }

    /// Builds a timeline from a listing of its folder, each file with its version tag.
    pub fn from_listing(files: &[(FileInfo, Option<String>)], dir: String, layout: u32) -> Self {
        let name = |f: &FileInfo| f.path.rsplit('/').next().unwrap_or(&f.path).to_string();
        let versions = files.iter().filter_map(|(f, tag)| Some((name(f), tag.clone()?))).collect();
        let names: Vec<String> = files.iter().map(|(f, _)| name(f)).collect();
        let mut timeline = Self::from_file_names(names.iter().map(String::as_str), dir, layout);
        timeline.versions = Arc::new(versions);
        timeline
    }

    /// The store's version tag of an instant's file as listed (`None`: not listed, or the store
    /// gives none).
    pub fn version_of(&self, instant: &Instant) -> Option<&str> {
        let path = self.path_of(instant);
        self.versions.get(path.rsplit('/').next().unwrap_or(&path)).map(String::as_str)
    }

    /// This timeline knowing the times rolled back, from a listing of [`ROLLED_BACK_DIR`].
    pub fn with_rolled_back(mut self, markers: &[FileInfo]) -> Self {
        let times = markers.iter().filter_map(|f| f.path.rsplit('/').next()).filter(|n| n.len() >= 17);
        self.rolled_back = Arc::new(times.map(str::to_string).collect());
        self
    }

    /// Builds a timeline from file names (those that are not instants are ignored).
    pub fn from_file_names<'a>(names: impl IntoIterator<Item = &'a str>, dir: String, layout: u32) -> Self {
        // One instant per time and kind of action (see [`kind`]); a savepoint shares the time of
        // the commit it keeps.
        let mut by_time: BTreeMap<(String, Action), Instant> = BTreeMap::new();
        let mut planned = std::collections::HashSet::new();
        for name in names {
            let Some(instant) = Instant::parse_file_name(name, layout) else { continue };
            let key = (instant.time.clone(), kind(instant.action));
            if instant.state == State::Requested {
                planned.insert(key.clone());
            }
            match by_time.get(&key) {
                Some(seen) if seen.state >= instant.state => {}
                _ => {
                    by_time.insert(key, instant);
                }
            }
        }
        // An inflight file without its plan, older than every completed commit, is not an
        // instant: it is what a process that took up a plan already completed and archived left
        // when it died before deleting the inflight file it made ([`Timeline::start`]). As a
        // pending instant it would move the write timeline's start back before the commits
        // archived with it, and their files would read as uncommitted. What `start` makes has a
        // requested file (savepoints have none: they are not made so).
        let first_done =
            by_time.values().filter(|i| i.is_completed() && i.action.writes_data()).map(|i| i.time.clone()).min();
        let started = |a: Action| a.writes_data() || matches!(a, Action::Compaction | Action::Clean | Action::Rollback);
        let mut leftovers = Vec::new();
        by_time.retain(|key, i| {
            let lone = i.state == State::Inflight && started(i.action) && !planned.contains(key);
            let left = lone && first_done.as_ref().is_some_and(|first| i.time < *first);
            if left {
                leftovers.push(i.clone());
            }
            !left
        });
        Timeline {
            instants: by_time.into_values().collect(),
            dir,
            layout,
            archived: None,
            rolled_back: Arc::default(),
            versions: Arc::default(),
            leftovers: Arc::new(leftovers),
        }
    }

    /// This timeline with the archived instants added (their latest archived state; an instant
    /// still on the active timeline, archived by a process that died before deleting it, keeps
    /// its active state), and what completed ones recorded.
    pub fn with_archived(&self, states: Vec<crate::format::archived::ArchivedState>) -> Timeline {
        let mut by_time: BTreeMap<(String, Action), Instant> =
            self.instants.iter().map(|i| ((i.time.clone(), kind(i.action)), i.clone())).collect();
        let active: std::collections::HashSet<(String, Action)> = by_time.keys().cloned().collect();
        let mut details = BTreeMap::new();
        for s in states {
            let key = (s.instant.time.clone(), kind(s.instant.action));
            if active.contains(&key) {
                continue;
            }
            if s.instant.state == State::Completed
                && let Some(d) = s.details
            {
                details.insert(key.clone(), d);
            }
            match by_time.get(&key) {
                Some(seen) if seen.state >= s.instant.state => {}
                _ => {
                    by_time.insert(key, s.instant);
                }
            }
        }
        Timeline {
            instants: by_time.into_values().collect(),
            dir: self.dir.clone(),
            layout: self.layout,
            archived: Some(Arc::new(details)),
            rolled_back: self.rolled_back.clone(),
            versions: self.versions.clone(),
            leftovers: self.leftovers.clone(),
        }
    }

    /// Inflight files left without their plan by a process that died in [`Timeline::start`]
    /// (see the field): not instants of this timeline.
    pub fn leftovers(&self) -> &[Instant] {
        &self.leftovers
    }

    /// Whether the archived timeline was added ([`Timeline::with_archived`]).
    pub fn has_archived(&self) -> bool {
        self.archived.is_some()
    }

    /// What an archived completed instant recorded, if `instant` is one.
    fn archived_details(&self, instant: &Instant) -> Option<&serde_json::Value> {
        let archived = self.archived.as_ref()?;
        if !instant.is_completed() {
            return None;
        }
        archived.get(&(instant.time.clone(), kind(instant.action)))
    }

    /// Keeps only the instants `keep` accepts. The times of the others, and the times `withheld`,
    /// never read as committed: not even once older than the start of the timeline, where a time
    /// with no instant left reads as archived, hence committed ([`Timeline::is_committed`]).
    pub(crate) fn retain(&mut self, keep: impl Fn(&Instant) -> bool, withheld: impl IntoIterator<Item = String>) {
        let mut never: BTreeSet<String> = self.rolled_back.as_ref().clone();
        never.extend(withheld);
        self.instants.retain(|i| {
            let kept = keep(i);
            if !kept {
                never.insert(i.time.clone());
            }
            kept
        });
        self.rolled_back = Arc::new(never);
    }

    /// The times oxlake rolled back ([`ROLLED_BACK_DIR`]; with those a restriction withheld).
    pub fn rolled_back(&self) -> impl Iterator<Item = &str> {
        self.rolled_back.iter().map(String::as_str)
    }

    /// The instants at one time (usually one; a savepoint shares its commit's time).
    pub fn instants_at(&self, time: &str) -> &[Instant] {
        let start = self.instants.partition_point(|i| i.time.as_str() < time);
        let end = self.instants.partition_point(|i| i.time.as_str() <= time);
        &self.instants[start..end]
    }

    /// All instants, oldest first.
    pub fn instants(&self) -> &[Instant] {
        &self.instants
    }

    /// The greatest instant time ever claimed, in any state, or completion time (layout 2): a new
    /// time is taken after it.
    pub fn last_time(&self) -> Option<&str> {
        let requested = self.instants.last().map(|i| i.time.as_str());
        let completed = self.instants.iter().filter_map(|i| i.completion.as_deref()).max();
        requested.max(completed)
    }

    /// The earliest instant time in the active timeline; older files count as committed (archived).
    pub fn earliest_time(&self) -> Option<&str> {
        self.instants.first().map(|i| i.time.as_str())
    }

    /// Completed commits, deltacommits and replacecommits, oldest first.
    pub fn completed_data(&self) -> impl DoubleEndedIterator<Item = &Instant> {
        self.instants.iter().filter(|i| i.is_completed() && i.action.writes_data())
    }

    /// Completed data instants with time at most `as_of`.
    pub fn completed_data_as_of<'a>(&'a self, as_of: &'a str) -> impl Iterator<Item = &'a Instant> + 'a {
        self.completed_data().filter(move |i| i.time.as_str() <= as_of)
    }

    /// The latest completed data instant: the default snapshot.
    pub fn latest_completed_data(&self) -> Option<&Instant> {
        self.completed_data().last()
    }

    /// Instants not completed, of any action.
    pub fn pending(&self) -> impl Iterator<Item = &Instant> {
        self.instants.iter().filter(|i| !i.is_completed())
    }

    /// Where the write timeline starts, as Apache Hudi's file-system view sees it: the first
    /// completed commit, deltacommit or replacecommit, or compaction (pending or done), whose time
    /// is not savepointed (`HoodieDefaultTimeline.getFirstNonSavepointCommit`). Cleans, rollbacks
    /// and savepoints kept from before it do not move it: archival keeps those longer.
    pub fn write_timeline_start(&self) -> Option<&str> {
        let savepointed: Vec<&str> =
            self.instants.iter().filter(|i| i.action == Action::Savepoint).map(|i| i.time.as_str()).collect();
        let mut writes = self
            .instants
            .iter()
            .filter(|i| (i.is_completed() && i.action.writes_data()) || i.action == Action::Compaction)
            .map(|i| i.time.as_str());
        let first = writes.clone().next();
        // Every commit savepointed (a restore to the only one left): it starts at the first.
        writes.find(|t| !savepointed.contains(t)).or(first)
    }

    /// Whether a file written at instant `time` is visible: its instant completed, or it predates
    /// the write timeline (archived, hence committed: `containsOrBeforeTimelineStarts`) and was
    /// not rolled back by oxlake ([`ROLLED_BACK_DIR`]).
    pub fn is_committed(&self, time: &str) -> bool {
        match self.instants_at(time) {
            [] => self.write_timeline_start().is_some_and(|e| time < e) && !self.rolled_back.contains(time),
            at => at.iter().any(|i| i.is_completed() && i.action != Action::Savepoint),
        }
    }

    /// The instant at a time that is not a savepoint, if any.
    pub fn get(&self, time: &str) -> Option<&Instant> {
        self.instants_at(time).iter().find(|i| i.action != Action::Savepoint)
    }

    /// Path of an instant's file, relative to the table root.
    pub fn path_of(&self, instant: &Instant) -> String {
        if self.layout >= 2 && instant.is_completed() {
            let completion = instant.completion.as_deref().unwrap_or(&instant.time);
            return format!("{}/{}_{}.{}", self.dir, instant.time, completion, instant.action);
        }
        format!("{}/{}", self.dir, instant.file_name())
    }

    /// Reads the commit metadata of a completed data instant.
    pub async fn commit_metadata(&self, storage: &Storage, instant: &Instant) -> Result<CommitMetadata> {
        let path = self.path_of(instant);
        if let Some(details) = self.archived_details(instant) {
            return CommitMetadata::from_archived(&path, details);
        }
        let bytes = storage.get(&path).await?;
        // An empty completed commit or deltacommit reads as empty metadata, as in Apache Hudi
        // (its test tables hold some). A completed replacecommit exists to name the file groups
        // it replaced: read as empty, an emptied one would bring them back into reads.
        if instant.is_completed()
            && instant.action == Action::ReplaceCommit
            && bytes.iter().all(u8::is_ascii_whitespace)
        {
            return Err(Error::corrupt(&path, "empty: a completed replacecommit names the file groups it replaced"));
        }
        if self.layout >= 2 {
            // Java 1.x writes every completed commit as an Avro container: empty is damage (read
            // as empty metadata, an incremental read would drop the commit's rows).
            if instant.is_completed() && bytes.is_empty() {
                return Err(Error::corrupt(&path, "empty: a completed commit records what it wrote"));
            }
            return CommitMetadata::from_avro(&path, &bytes);
        }
        CommitMetadata::from_json(&path, &bytes)
    }

    /// Reads what a completed clean recorded (active or archived).
    pub async fn clean_metadata(
        &self,
        storage: &Storage,
        instant: &Instant,
    ) -> Result<crate::format::clean::Stored<crate::format::clean::CleanMetadata>> {
        let path = self.path_of(instant);
        if let Some(details) = self.archived_details(instant) {
            let m = serde_json::from_value(details.clone())
                .map_err(|e| Error::corrupt(&path, format!("archived clean metadata: {e}")))?;
            return Ok(crate::format::clean::Stored::Avro(m));
        }
        crate::format::clean::read_metadata(&path, &storage.get(&path).await?)
    }

    /// Writes an instant's file with a conditional create. Returns `false` when it already existed.
    /// A completed instant of layout 2 carries its completion time ([`crate::commit`] claims it).
    pub async fn create(&self, storage: &Storage, instant: &Instant, content: Bytes) -> Result<bool> {
        if self.layout >= 2 && instant.is_completed() && instant.completion.is_none() {
            return Err(Error::invalid_data(format!("completing {instant} without a completion time")));
        }
        storage.put_if_absent(&self.path_of(instant), content).await
    }

    /// Creates the inflight file of `instant`, a plan listed requested, and says what it found:
    /// `Some(true)` made now, `Some(false)` there already (another process took the plan up, or
    /// this one's earlier attempt), `None` the plan is gone: completed and archived (archival
    /// deletes the requested file before the inflight file) or removed since it was listed. Then
    /// an inflight file just made is deleted again: left, it would be the only file of an
    /// instant older than the commits archived with it.
    pub async fn start(&self, storage: &Storage, instant: &Instant, content: Bytes) -> Result<Option<bool>> {
        let inflight = instant.with_state(State::Inflight);
        let made = self.create(storage, &inflight, content).await?;
        if storage.head(&self.path_of(&instant.with_state(State::Requested))).await?.is_some() {
            return Ok(Some(made));
        }
        // Found there already, the inflight file is another's, or an archival's to delete next.
        if made {
            storage.delete(&self.path_of(&inflight)).await?;
        }
        Ok(None)
    }

    /// The timeline layout: 1 (`.hoodie/<t>.<action>`, JSON commit metadata) or 2
    /// (`.hoodie/timeline/<t>_<completion>.<action>`, Avro).
    pub fn layout(&self) -> u32 {
        self.layout
    }

    /// Deletes the requested and inflight files of an instant (after a rollback).
    pub async fn remove_pending(&self, storage: &Storage, instant: &Instant) -> Result<()> {
        // Inflight first: a half-removed instant then still reads as requested, never as running.
        storage.delete(&self.path_of(&instant.with_state(State::Inflight))).await?;
        storage.delete(&self.path_of(&instant.with_state(State::Requested))).await
    }

    /// The directory holding the timeline.
    pub fn dir(&self) -> &str {
        &self.dir
    }

    /// Whether a data action of this timeline was ever completed.
    pub fn is_empty(&self) -> bool {
        self.completed_data().next().is_none()
    }

    /// Replacecommits and other data instants, for callers that filter by action.
    pub fn completed_of(&self, action: Action) -> impl Iterator<Item = &Instant> {
        self.completed_data().filter(move |i| i.action == action)
    }
}

/// Whether `error` is a timeline file gone between listing the timeline and reading it: archived
/// (or rolled back) by another process meanwhile. A table service that meets it starts again on
/// the timeline as it is then.
pub(crate) fn archived_meanwhile(error: &crate::error::Error) -> bool {
    matches!(error, crate::error::Error::Storage { path, source: object_store::Error::NotFound { .. } }
        if path.starts_with(".hoodie/") && !path.starts_with(".hoodie/oxlake/"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tl(names: &[&str]) -> Timeline {
        Timeline::from_file_names(names.iter().copied(), ".hoodie".into(), 1)
    }

    #[test]
    fn collapses_states_and_sorts() {
        let t = tl(&[
            "20240102000000000.commit",
            "20240101000000000.commit.requested",
            "20240101000000000.inflight",
            "20240101000000000.commit",
            "20240102000000000.inflight",
            "20240103000000000.commit.requested",
            "hoodie.properties",
        ]);
        let got: Vec<_> = t.instants().iter().map(|i| (i.time.as_str(), i.state)).collect();
        assert_eq!(
            got,
            vec![
                ("20240101000000000", State::Completed),
                ("20240102000000000", State::Completed),
                ("20240103000000000", State::Requested)
            ]
        );
        assert_eq!(t.latest_completed_data().unwrap().time, "20240102000000000");
        assert_eq!(t.pending().count(), 1);
        assert_eq!(t.last_time(), Some("20240103000000000"));
    }

    #[test]
    fn an_inflight_file_without_its_plan_older_than_every_commit_is_no_instant() {
        let t = tl(&[
            // Left by processes that died inside `Timeline::start` for plans archived since.
            "20240101000000000.compaction.inflight",
            "20240101500000000.clean.inflight",
            "20240102000000000.deltacommit.requested",
            "20240102000000000.deltacommit.inflight",
            "20240102000000000.deltacommit",
            // Younger: a pending instant, rolled back as any.
            "20240103000000000.compaction.inflight",
        ]);
        let got: Vec<_> = t.instants().iter().map(|i| (i.time.as_str(), i.state)).collect();
        assert_eq!(got, vec![("20240102000000000", State::Completed), ("20240103000000000", State::Inflight)]);
        let left: Vec<_> = t.leftovers().iter().map(|i| (i.time.as_str(), i.action)).collect();
        assert_eq!(left, vec![("20240101000000000", Action::Compaction), ("20240101500000000", Action::Clean)]);
        assert_eq!(t.write_timeline_start(), Some("20240102000000000"));
    }

    #[test]
    fn commit_visibility() {
        let t = tl(&["20240102000000000.commit", "20240103000000000.inflight"]);
        assert!(t.is_committed("20240102000000000"));
        assert!(!t.is_committed("20240103000000000"));
        assert!(!t.is_committed("20240102500000000"));
        assert!(t.is_committed("20240101000000000"), "older than the active timeline: archived");
    }

    #[tokio::test]
    async fn a_time_rolled_back_is_never_committed_even_once_archived_past() {
        let s = Storage::in_memory("t").unwrap();
        let config = TableConfig::new(&crate::config::CreateOptions {
            name: "t".into(),
            table_type: crate::config::TableType::CopyOnWrite,
            record_key_fields: vec!["id".into()],
            partition_fields: Vec::new(),
            ordering_field: None,
            hive_style: false,
            inline_compaction: None,
            table_version: 6,
            global_index: false,
            meta_fields: true,
            keygen_options: Default::default(),
            url_encode: true,
        })
        .unwrap();
        for name in ["20240102000000000.commit", "20240103000000000.commit"] {
            s.put(&format!("{}/{name}", config.timeline_dir()), Bytes::new()).await.unwrap();
        }
        s.put(&rolled_back_marker("20240101000000000"), Bytes::new()).await.unwrap();
        let t = Timeline::load(&s, &config).await.unwrap();
        assert!(!t.is_committed("20240101000000000"), "a frozen writer's late file stays hidden");
        assert!(t.is_committed("20240101500000000"), "archived commits are committed");
        assert!(!t.with_archived(Vec::new()).is_committed("20240101000000000"));
    }

    #[test]
    fn the_write_timeline_starts_at_its_first_commit_not_at_a_kept_clean() {
        // Apache Hudi archived the commits before 5; it keeps an older clean, a rollback and a
        // savepointed commit 3 (with its savepoint).
        let t = tl(&[
            "20240101000000000.clean",
            "20240102000000000.rollback",
            "20240103000000000.commit",
            "20240103000000000.savepoint",
            "20240105000000000.deltacommit",
            "20240106000000000.deltacommit.inflight",
        ]);
        assert_eq!(t.write_timeline_start(), Some("20240105000000000"));
        // Files of archived commits between the clean and the first kept commit are committed.
        assert!(t.is_committed("20240101500000000"));
        assert!(t.is_committed("20240104000000000"));
        assert!(t.is_committed("20240103000000000"));
        assert!(!t.is_committed("20240106000000000"));
        assert!(!t.is_committed("20240105500000000"), "a hole in the write timeline: rolled back");
        // A pending compaction starts it too.
        let t = tl(&["20240101000000000.clean", "20240104000000000.compaction.requested"]);
        assert_eq!(t.write_timeline_start(), Some("20240104000000000"));
        assert!(!t.is_committed("20240104000000000"));
        assert!(t.is_committed("20240102000000000"));
        // Only a savepointed commit left (a restore to it after archival): it starts there, so
        // the archived commits before it stay committed.
        let t = tl(&["20240103000000000.commit", "20240103000000000.savepoint"]);
        assert_eq!(t.write_timeline_start(), Some("20240103000000000"));
        assert!(t.is_committed("20240101000000000"));
    }

    #[tokio::test]
    async fn an_emptied_completed_instant_is_corrupt() {
        let s = Storage::in_memory("t").unwrap();
        s.put(".hoodie/20240101000000000.replacecommit", Bytes::new()).await.unwrap();
        s.put(".hoodie/20240102000000000.deltacommit.requested", Bytes::new()).await.unwrap();
        let t = tl(&["20240101000000000.replacecommit", "20240102000000000.deltacommit.requested"]);
        let err = t.commit_metadata(&s, &t.instants()[0]).await.unwrap_err();
        assert!(matches!(&err, Error::CorruptTable { path, .. } if path.ends_with("0.replacecommit")), "{err}");
        // A requested instant's file may be empty.
        assert_eq!(t.commit_metadata(&s, &t.instants()[1]).await.unwrap(), CommitMetadata::default());
    }

    #[test]
    fn compaction_completes_as_commit() {
        let t = tl(&["20240102000000000.compaction.requested", "20240102000000000.commit"]);
        let i = &t.instants()[0];
        assert_eq!((i.action, i.state), (Action::Commit, State::Completed));
    }
}
