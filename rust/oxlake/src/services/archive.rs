//! Timeline archival, as Apache Hudi 0.14 does it (`HoodieTimelineArchiver`): once a table holds
//! more than `max_commits` completed commits, the oldest are moved from the active timeline into
//! `.hoodie/archived/` (see [`crate::format::archived`]) until `min_commits` remain, together with
//! the cleans, rollbacks and oxlake's metadata-table builds before them. The active timeline, which
//! every open and plan lists, stays short however long the table lives.
//!
//! Never archived: anything at or after the earliest pending instant (and the last commit before
//! it), the first savepoint and later, the earliest commit the latest clean retains and later (a
//! time-travel read the clean allows stays planned from the active timeline), on merge-on-read
//! the latest compaction and the deltacommits since that the next inline compaction counts (the
//! last `inline_compaction`, 5 by default), anything the metadata table has not compacted past,
//! savepoints and restores.
//!
//! Order, so that a crash at any step leaves a readable table: the archive file is written first
//! (a crash before the deletions archives the same instants again; readers drop duplicates), then
//! every requested and inflight file of the archived instants, then their completed files oldest
//! first: an instant never reads as pending once archived, and whatever was deleted is older than
//! what remains (files older than the active timeline count as committed).

use bytes::Bytes;

use crate::error::{Error, Result};
use crate::format::archived::{self, StateFile};
use crate::format::file_name::LogFileName;
use crate::format::instant::{Action, Instant, State};
use crate::format::log_block::LogBlock;
use crate::format::lsm;
use crate::table::Table;
pub use crate::table::history::{archive_dir, archive_files, history_dir, latest_manifest, read_archived};
use crate::table::history::{named_version, publish_manifest};

/// `hoodie.keep.min.commits` / `hoodie.keep.max.commits`: table properties, Apache Hudi's defaults.
pub const MIN_COMMITS_KEY: &str = "hoodie.keep.min.commits";
/// See [`MIN_COMMITS_KEY`].
pub const MAX_COMMITS_KEY: &str = "hoodie.keep.max.commits";
/// oxlake's own: `false` stops archiving inline after every commit of a write (on by default, as
/// in Apache Hudi; `archive()` then archives on demand).
pub const INLINE_KEY: &str = "oxlake.archive.inline";
const DEFAULT_MIN_COMMITS: usize = 20;
const DEFAULT_MAX_COMMITS: usize = 30;

/// How many commits the active timeline keeps.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ArchiveConfig {
    /// Commits an archival leaves active (`hoodie.keep.min.commits`, 20).
    pub min_commits: usize,
    /// Commits past which the timeline is archived (`hoodie.keep.max.commits`, 30).
    pub max_commits: usize,
}

impl ArchiveConfig {
    /// The table's settings (its properties), Apache Hudi's defaults where unset.
    pub fn of(table: &Table) -> Result<Self> {
        let get = |key: &str, default: usize| -> Result<usize> {
            match table.config().raw.get(key).map(|v| v.trim()) {
                None | Some("") => Ok(default),
                Some(v) => v.parse().map_err(|_| {
                    Error::corrupt(crate::config::PROPERTIES_FILE, format!("`{key}` is not a number: {v}"))
                }),
            }
        };
        Self::new(get(MIN_COMMITS_KEY, DEFAULT_MIN_COMMITS)?, get(MAX_COMMITS_KEY, DEFAULT_MAX_COMMITS)?)
    }

    /// Checked: `1 <= min < max`.
    pub fn new(min_commits: usize, max_commits: usize) -> Result<Self> {
        if min_commits == 0 || max_commits <= min_commits {
            return Err(Error::invalid_arg(
                "min_commits",
                format!(
                    "archival keeps at least 1 commit and max_commits > min_commits (got {min_commits}, {max_commits})"
                ),
            ));
        }
        Ok(ArchiveConfig { min_commits, max_commits })
    }
}

/// What an archival did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ArchiveResult {
    /// The archived instants (time and action), oldest first.
    pub archived: Vec<Instant>,
    /// The archive file written, relative to the table root.
    pub file: Option<String>,
}

impl Table {
    /// Archives the oldest instants of the active timeline (see the module docs), then those of
    /// the metadata table's timeline.
    pub async fn archive(&mut self, config: ArchiveConfig) -> Result<ArchiveResult> {
        self.reload().await?;
        self.check_changeable()?;
        let result = self.archive_before(config, None).await?;
        archive_metadata_timeline(self, config).await?;
        Ok(result)
    }

    /// [`Table::archive`] of this table's timeline only, never at or after `before`.
    pub(crate) async fn archive_before(
        &mut self,
        config: ArchiveConfig,
        before: Option<&str>,
    ) -> Result<ArchiveResult> {
        self.reload().await?;
        let chosen = self.instants_to_archive(config, before).await?;
        if chosen.is_empty() {
            return Ok(ArchiveResult::default());
        }
        let timeline_dir = self.config().timeline_dir();
        let listing = self.storage().list_dir(&timeline_dir).await?;
        // Every state file of each chosen instant, in Java's order: requested, inflight, completed.
        let mut files: Vec<(Instant, String)> = Vec::new();
        for f in &listing {
            let name = f.path.rsplit('/').next().unwrap_or(&f.path);
            let Some(i) = Instant::parse_file_name(name, self.config().layout_version) else { continue };
            if chosen.iter().any(|c| c.time == i.time && same_kind(c.action, i.action)) {
                files.push((i, f.path.clone()));
            }
        }
        files.sort_by(|a, b| (&a.0.time, a.0.state).cmp(&(&b.0.time, b.0.state)));
        let mut read = Vec::with_capacity(files.len());
        for (i, path) in &files {
            read.push((i.clone(), self.storage().get(path).await?));
        }
        let cutoff = chosen.iter().map(|i| i.time.as_str()).max().unwrap_or_default().to_string();
        // Marked before the timeline is listed a last time: a writer that claimed a time at or
        // before the cutoff and creates its requested file after that listing sees the marker
        // and takes a later time (`commit::claim_with`). Markers are pruned with claim markers.
        crate::commit::step_failpoint(self, "archive-before-mark");
        let marker = crate::commit::archival_marker(&cutoff);
        self.storage().put(&marker, Bytes::new()).await?;
        let file = match self.timeline().layout() {
            1 => {
                let mut entries = Vec::with_capacity(read.len());
                for ((i, bytes), (_, path)) in read.iter().zip(&files) {
                    let file = StateFile { action: i.action, state: i.state, bytes };
                    entries.push(archived::entry(&i.time, &file, path)?);
                }
                let blocks: Vec<LogBlock> =
                    entries.chunks(archived::BATCH).map(archived::block).collect::<Result<_>>()?;
                write_archive_file(self, &blocks).await?
            }
            _ => match write_history(self, &lsm_rows(&read)).await? {
                Some(file) => file,
                // A run that died before publishing its manifest was published first.
                None => return Ok(ArchiveResult::default()),
            },
        };
        crate::commit::step_failpoint(self, "archive-after-write");
        // What another process did since the choice: a savepoint of an archived commit, or an
        // instant claimed before the cutoff (a writer slow between its claim and its requested
        // file). Then nothing is deleted; the archive's entries of instants still active are
        // ignored by readers, and the next run archives them again.
        let chosen_from = self.timeline().clone();
        self.reload().await?;
        // Also an instant at or before the cutoff that was not on the timeline the choice was
        // made from, even completed since: a writer that claimed its time before the cutoff,
        // then created its requested file (before this archival's marker, so it went on) and
        // completed, all between the choice and this listing. Archiving past it would leave it
        // active after archived commits, whose files would then read as uncommitted.
        let blocked = self.timeline().instants().iter().find(|i| {
            i.time.as_str() <= cutoff.as_str()
                && (!i.is_completed() || i.action == Action::Savepoint || !chosen_from.instants().contains(i))
        });
        if let Some(b) = blocked.cloned() {
            log::info!(
                "{}: archival stopped: {} {} {} appeared at or before {cutoff}",
                self.uri(),
                b.time,
                b.action,
                b.state
            );
            // Nothing was deleted: its marker would only make claims and savepoints at or before
            // the cutoff give way for as long as it is kept.
            self.storage().delete(&marker).await?;
            return Ok(ArchiveResult { archived: Vec::new(), file: Some(file) });
        }
        for (i, path) in files.iter().filter(|(i, _)| i.state != State::Completed) {
            self.storage().delete(path).await?;
            log::debug!("archived {} {} {}", i.time, i.action, i.state);
        }
        crate::commit::step_failpoint(self, "archive-after-pending");
        for (_, path) in files.iter().filter(|(i, _)| i.state == State::Completed) {
            self.storage().delete(path).await?;
        }
        log::info!("{}: archived {} instants into {file}", self.uri(), chosen.len());
        if self.timeline().layout() >= 2
            && let Err(e) = super::lsm_compaction::compact_and_clean(self).await
        {
            // The archival is done; the next one compacts again.
            log::warn!("{}: the archived timeline was not compacted: {e}", self.uri());
        }
        self.reload().await?;
        Ok(ArchiveResult { archived: chosen, file: Some(file) })
    }

    /// Sets how many commits the active timeline keeps (`hoodie.keep.min.commits`,
    /// `hoodie.keep.max.commits`, as Apache Hudi names them) and whether commits archive inline.
    pub async fn set_archival(&mut self, config: ArchiveConfig, inline: bool) -> Result<()> {
        self.reload().await?;
        self.check_changeable()?;
        let (min, max) = (config.min_commits.to_string(), config.max_commits.to_string());
        let inline = if inline { None } else { Some("false") };
        self.set_properties(&[(MIN_COMMITS_KEY, Some(&min)), (MAX_COMMITS_KEY, Some(&max)), (INLINE_KEY, inline)]).await
    }

    /// Apache Hudi 0.14's choice (`getCommitInstantsToArchive`, `getCleanInstantsToArchive`),
    /// bounded as the module docs say.
    async fn instants_to_archive(&self, config: ArchiveConfig, before: Option<&str>) -> Result<Vec<Instant>> {
        let timeline = self.timeline();
        let commits: Vec<&Instant> = timeline.completed_data().collect();
        if commits.len() <= config.max_commits {
            return Ok(Vec::new());
        }
        let mut bound: Option<String> = before.map(str::to_string);
        let mut lower = |t: &str| {
            if bound.as_deref().is_none_or(|b| t < b) {
                bound = Some(t.to_string());
            }
        };
        // A write, compaction or clustering under way: it checks for conflicts against (or folds
        // in the logs of) commits that completed after it began, whatever their times, so none
        // may leave the active timeline meanwhile. Archival waits for a moment without one.
        if timeline.pending().any(|i| {
            i.action.writes_data()
                || matches!(i.action, Action::Compaction | Action::LogCompaction | Action::Clustering)
        }) {
            return Ok(Vec::new());
        }
        // The earliest pending instant of any other action, and the last commit before it.
        if let Some(p) = timeline.pending().next() {
            lower(&p.time);
            if let Some(before) = commits.iter().rev().find(|c| c.time < p.time) {
                lower(&before.time);
            }
        }
        if let Some(s) = timeline.instants().iter().find(|i| i.action == Action::Savepoint) {
            lower(&s.time);
        }
        match latest_clean_retains(self).await? {
            Some(retain) => lower(&retain),
            // Without a clean the file groups replacecommits replaced are all still there: the
            // replacecommits must stay to hide them (Java: `getOldestInstantToRetainForClustering`).
            None => {
                if let Some(r) = timeline.completed_of(Action::ReplaceCommit).next() {
                    lower(&r.time);
                }
            }
        }
        if self.config().table_type == crate::config::TableType::MergeOnRead {
            // The next inline compaction counts the deltacommits since the latest one: the last
            // `inline_compaction` of them stay, with that compaction while fewer landed (Apache
            // Hudi's `CompactionUtils.getEarliestInstantToRetainForCompaction`, whose count
            // defaults to 5). Older ones may go although their logs are not compacted yet (a
            // stream of inserts writes none, and would never archive): readers place the logs of
            // archived deltacommits by the archived completion times.
            let last_compaction = self.latest_compaction().await?;
            let open: Vec<&Instant> = completed(self, Action::DeltaCommit)
                .filter(|d| last_compaction.as_deref().is_none_or(|c| d.time.as_str() > c))
                .collect();
            let keep = self.config().inline_compaction.map_or(DEFAULT_DELTA_COMMITS_KEPT, |n| n.max(1) as usize);
            match open.len().checked_sub(keep) {
                Some(from) => lower(&open[from].time),
                None => match (&last_compaction, open.first()) {
                    (Some(c), _) => lower(c),
                    (None, Some(d)) => lower(&d.time),
                    (None, None) => {}
                },
            }
        }
        if let Some(m) = crate::metadata::archival_bound(self).await? {
            lower(&m);
        }
        let excess = commits.len() - config.min_commits;
        let mut chosen: Vec<Instant> = commits
            .iter()
            .take(excess)
            .filter(|c| bound.as_deref().is_none_or(|b| c.time.as_str() < b))
            .map(|c| (*c).clone())
            .collect();
        let Some(cutoff) = chosen.last().map(|c| c.time.clone()) else { return Ok(Vec::new()) };
        // Cleans and rollbacks: each kept at min..max like commits; never past the commits kept.
        for action in [Action::Clean, Action::Rollback] {
            let done: Vec<&Instant> = completed(self, action).collect();
            if done.len() > config.max_commits {
                let over = done.len() - config.min_commits;
                chosen.extend(done.iter().take(over).filter(|i| i.time <= cutoff).map(|i| (*i).clone()));
            }
        }
        // oxlake's metadata-table builds (Apache Hudi never archives `indexing` instants itself).
        chosen.extend(completed(self, Action::Indexing).filter(|i| i.time <= cutoff).cloned());
        chosen.sort_by(|a, b| a.time.cmp(&b.time));
        Ok(chosen)
    }

    /// The latest completed compaction (a commit with `compacted`), if any.
    async fn latest_compaction(&self) -> Result<Option<String>> {
        for c in completed(self, Action::Commit).rev() {
            if self.timeline().commit_metadata(self.storage(), c).await?.compacted {
                return Ok(Some(c.time.clone()));
            }
        }
        Ok(None)
    }
}

/// Deltacommits after the latest compaction that archival keeps on a merge-on-read table without
/// inline compaction (Apache Hudi's `hoodie.compact.inline.max.delta.commits`).
const DEFAULT_DELTA_COMMITS_KEPT: usize = 5;

/// The completed instants of one action, oldest first.
fn completed(table: &Table, action: Action) -> impl DoubleEndedIterator<Item = &Instant> {
    table.timeline().instants().iter().filter(move |i| i.action == action && i.is_completed())
}

/// Whether two actions name the same instant kind (a compaction completes as a commit).
fn same_kind(a: Action, b: Action) -> bool {
    let kind = |a: Action| match a {
        Action::Compaction => Action::Commit,
        Action::LogCompaction => Action::DeltaCommit,
        Action::Clustering => Action::ReplaceCommit,
        other => other,
    };
    kind(a) == kind(b)
}

/// The earliest commit the latest completed clean retains (its `earliestCommitToRetain`).
async fn latest_clean_retains(table: &Table) -> Result<Option<String>> {
    let timeline = table.timeline();
    let Some(clean) = completed(table, Action::Clean).next_back() else { return Ok(None) };
    let path = timeline.path_of(clean);
    let bytes = table.storage().get(&path).await?;
    Ok(match crate::format::clean::read_metadata(&path, &bytes)? {
        crate::format::clean::Stored::Avro(m) => Some(m.earliest_commit_to_retain).filter(|t| !t.is_empty()),
        crate::format::clean::Stored::Legacy(p) => p.earliest_instant_to_retain,
    }
    // A clean by file versions retains no commit: keep what it ran beside.
    .or(Some(clean.time.clone())))
}

/// Writes `blocks` as the next archive file (`.commits_.archive.<n+1>_1-0-1`): a new version, as
/// Java does on stores without append.
async fn write_archive_file(table: &Table, blocks: &[LogBlock]) -> Result<String> {
    let dir = archive_dir(table);
    let latest = archive_files(table).await?.into_iter().map(|(v, _)| v).max().unwrap_or(0);
    let mut data = Vec::new();
    for b in blocks {
        data.extend_from_slice(&b.encode());
    }
    let data = Bytes::from(data);
    for version in (latest + 1..).take(100) {
        let name = LogFileName {
            file_id: archived::FILE_ID.into(),
            instant: String::new(),
            extension: archived::EXTENSION.into(),
            version,
            write_token: archived::WRITE_TOKEN.into(),
        };
        let path = format!("{dir}/{}", name.name());
        if table.storage().put_if_absent(&path, data.clone()).await? {
            return Ok(path);
        }
    }
    Err(Error::CommitConflict { instant: String::new(), detail: format!("no free archive file version in {dir}") })
}

/// The rows of the LSM timeline (layout 2) for the state files of the archived instants, read as
/// `(instant, bytes)` in time and state order: one row per completed instant, its plan from the
/// pending files as `MetadataConversionUtils.createLSMTimelineInstant` takes it (a clean's
/// plan; a clustering's or replacecommit's requested plan, or its inflight one where that is
/// not empty; a compaction's requested plan).
fn lsm_rows(read: &[(Instant, Bytes)]) -> Vec<lsm::LsmInstant> {
    let mut rows = Vec::new();
    for (completed, bytes) in read.iter().filter(|(i, _)| i.is_completed()) {
        let pending = read
            .iter()
            .filter(|(i, _)| i.time == completed.time && !i.is_completed() && same_kind(i.action, completed.action));
        let mut plan: Option<Bytes> = None;
        for (i, b) in pending {
            let takes = match i.action {
                Action::Clean | Action::Compaction | Action::LogCompaction => i.state == State::Requested,
                Action::ReplaceCommit | Action::Clustering => true,
                _ => false,
            };
            if takes && !b.is_empty() {
                plan = Some(b.clone());
            }
        }
        rows.push(lsm::LsmInstant {
            instant_time: completed.time.clone(),
            completion_time: completed.completion.clone().unwrap_or_else(|| completed.time.clone()),
            action: completed.action.name().to_string(),
            metadata: (!bytes.is_empty()).then(|| bytes.clone()),
            plan,
        });
    }
    rows
}

/// Writes `rows` into the LSM timeline (`.hoodie/timeline/history/`, see [`lsm`]) as Apache Hudi
/// 1.x does: the data file, then the next manifest listing it, then `_version_`. Returns the data
/// file's path, or `None` when an earlier run's manifest was written but never published: it is
/// published now (the table is readable either way) and this run archives nothing.
pub(crate) async fn write_history(table: &Table, rows: &[lsm::LsmInstant]) -> Result<Option<String>> {
    let storage = table.storage();
    let dir = history_dir(table);
    let (version, manifest) = latest_manifest(table).await?;
    let next = lsm::manifest_name(version + 1);
    if let Some(unpublished) = storage.get_opt(&format!("{dir}/{next}")).await? {
        let m = lsm::Manifest::parse(&next, &unpublished)?;
        // A run's new file added, or (a compaction of the archived timeline) files merged.
        let mut listed = true;
        for f in &m.files {
            listed &= storage.head(&format!("{dir}/{}", f.file_name)).await?.is_some();
        }
        if listed {
            log::info!("{}: publishing the archived timeline's {next}, written by an earlier run", table.uri());
            publish_manifest(table, version + 1).await?;
            return Ok(None);
        }
        return Err(Error::corrupt(format!("{dir}/{next}"), "a manifest that lists files storage does not hold"));
    }
    let min = rows.iter().map(|r| r.instant_time.as_str()).min().unwrap_or_default();
    let max = rows.iter().map(|r| r.instant_time.as_str()).max().unwrap_or_default();
    let name = lsm::file_name(min, max, 0);
    let path = format!("{dir}/{name}");
    let data = lsm::write_file(rows)?;
    let len = data.len() as i64;
    if !manifest.files.iter().any(|f| f.file_name == name) {
        // A file of that name no manifest lists is a dead run's: readers never saw it.
        storage.put(&path, data.clone()).await?;
        let mut files = manifest.files.clone();
        files.push(lsm::ManifestEntry { file_name: name.clone(), file_len: len });
        let json = lsm::Manifest { files }.to_json()?;
        if !storage.put_if_absent(&format!("{dir}/{next}"), Bytes::from(json)).await? {
            let detail = format!("another archival wrote {dir}/{next} first");
            return Err(Error::CommitConflict { instant: max.to_string(), detail });
        }
        super::lsm_compaction::check_created(table, version + 1, &name, data).await?;
        crate::commit::step_failpoint(table, "archive-after-manifest");
        publish_manifest(table, version + 1).await?;
    } else if named_version(table).await? != Some(version) {
        // Listed by a manifest a dead run wrote last (readers found it by listing): named now.
        publish_manifest(table, version).await?;
    }
    Ok(Some(path))
}

/// Archives the metadata table's own timeline past `config`, never at or after the earliest
/// instant of the data timeline (its instants count only while the data instant of their time
/// does, or lies before the data timeline: Apache Hudi's `getEarliestInstantForMetadataArchival`).
async fn archive_metadata_timeline(data: &Table, config: ArchiveConfig) -> Result<Vec<Instant>> {
    if !data.config().raw.contains_key(crate::metadata::PARTITIONS_KEY) {
        return Ok(Vec::new());
    }
    // Java's `getEarliestInstantForMetadataArchival`: the earlier of the data timeline's first
    // commit, deltacommit or replacecommit (any state) and its first pending instant. Not its
    // first instant of any action: cleans and rollbacks stay active for up to 30 runs of their
    // own, which would hold the metadata timeline back by hundreds of commits.
    let timeline = data.timeline();
    let first_commit = timeline.instants().iter().find(|i| {
        matches!(
            i.action,
            Action::Commit
                | Action::DeltaCommit
                | Action::ReplaceCommit
                | Action::Compaction
                | Action::Clustering
                | Action::LogCompaction
        )
    });
    let first_pending = timeline.instants().iter().find(|i| !i.is_completed());
    let Some(earliest) = [first_commit, first_pending].into_iter().flatten().map(|i| i.time.clone()).min() else {
        return Ok(Vec::new());
    };
    let mut mdt = Table::open(&crate::metadata::metadata_uri(data), data.options().bare()).await?;
    Ok(mdt.archive_before(config, Some(&earliest)).await?.archived)
}
