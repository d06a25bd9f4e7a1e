//! The cleaner: deletes the files of file slices no query within the retention needs. A clean is
//! an instant: its plan (`r.clean.requested`) lists the files, executing it deletes them (deleting a
//! deleted file is a no-op, so a crashed clean is simply run again), and `r.clean` records it.
//!
//! Never deleted: the latest slice of every live file group, every slice a savepoint reads, the
//! slices a pending compaction reads, and (keep-latest-commits) every slice a time-travel read to one
//! of the retained commits reads.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::sync::Arc;

use bytes::Bytes;

use crate::commit::change::{Change, KeySource};
use crate::error::{Error, Result};
use crate::format::clean::{
    self, ActionInstant, CleanFileInfo, CleanMetadata, CleanPartitionMetadata, CleanerPlan, Stored,
};
use crate::format::file_name;
use crate::format::instant::{Action, Instant, State};
use crate::services::progress::{self, Progress};
use crate::table::Table;
use crate::table::fs_view::{FileGroupId, FileSlice};

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

/// Table properties of inline cleaning, named as Apache Hudi's writer options: whether writes
/// clean (`true`/`false`), by which policy, keeping how much, and every how many commits.
pub const AUTOMATIC_KEY: &str = "hoodie.clean.automatic";
/// See [`AUTOMATIC_KEY`]: `KEEP_LATEST_COMMITS` or `KEEP_LATEST_FILE_VERSIONS`.
pub const POLICY_KEY: &str = "hoodie.cleaner.policy";
/// See [`AUTOMATIC_KEY`].
pub const COMMITS_RETAINED_KEY: &str = "hoodie.cleaner.commits.retained";
/// See [`AUTOMATIC_KEY`].
pub const FILE_VERSIONS_RETAINED_KEY: &str = "hoodie.cleaner.fileversions.retained";
/// See [`AUTOMATIC_KEY`].
pub const EVERY_KEY: &str = "hoodie.clean.max.commits";

/// How the writes of a table clean once they landed (Apache Hudi's `hoodie.clean.automatic`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct InlineClean {
    /// What a clean keeps.
    pub policy: CleanPolicy,
    /// A write cleans once at least this many data commits landed since the last clean.
    pub every: usize,
}

impl InlineClean {
    /// The inline cleaning the table's properties ask for: `None` unless `hoodie.clean.automatic`
    /// is `true`. A property that does not parse is an error naming it.
    pub fn of(table: &Table) -> Result<Option<Self>> {
        let raw = &table.config().raw;
        if !raw.get(AUTOMATIC_KEY).is_some_and(|v| v.trim().eq_ignore_ascii_case("true")) {
            return Ok(None);
        }
        let count = |key: &str, default: usize| -> Result<usize> {
            match raw.get(key) {
                None => Ok(default),
                Some(v) => match v.trim().parse::<usize>() {
                    Ok(n) if n > 0 => Ok(n),
                    _ => Err(Error::corrupt(
                        crate::config::PROPERTIES_FILE,
                        format!("{key}={v} (expected a whole number of at least 1)"),
                    )),
                },
            }
        };
        let policy = match raw.get(POLICY_KEY).map(|v| v.trim()).unwrap_or("KEEP_LATEST_COMMITS") {
            "KEEP_LATEST_COMMITS" => CleanPolicy::KeepLatestCommits(count(COMMITS_RETAINED_KEY, 10)?),
            "KEEP_LATEST_FILE_VERSIONS" => CleanPolicy::KeepLatestFileVersions(count(FILE_VERSIONS_RETAINED_KEY, 3)?),
            other => {
                return Err(Error::corrupt(
                    crate::config::PROPERTIES_FILE,
                    format!("{POLICY_KEY}={other} (oxlake cleans by KEEP_LATEST_COMMITS or KEEP_LATEST_FILE_VERSIONS)"),
                ));
            }
        };
        Ok(Some(InlineClean { policy, every: count(EVERY_KEY, 1)? }))
    }

    /// Whether a clean is due: `every` data commits completed since the latest completed clean.
    pub fn is_due(&self, table: &Table) -> bool {
        let since = table
            .timeline()
            .instants()
            .iter()
            .rev()
            .filter(|i| i.is_completed())
            .take_while(|i| i.action != Action::Clean)
            .filter(|i| i.action.writes_data())
            .count();
        since >= self.every
    }
}

/// The plan of a clean, whichever way it was stored (see [`crate::format::clean`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CleanPlan {
    /// Java's `HoodieCleaningPolicy` name: `KEEP_LATEST_COMMITS`, `KEEP_LATEST_FILE_VERSIONS`.
    pub policy: String,
    /// The earliest data instant whose snapshot stays readable (keep-latest-commits only).
    pub earliest_instant_to_retain: Option<ActionInstant>,
    /// The latest completed data instant when the clean was planned (`""`: none).
    pub last_completed_commit: String,
    /// Table-relative paths.
    pub files_to_delete: Vec<String>,
}

impl CleanPlan {
    /// The `HoodieCleanerPlan` Java reads: files by full path under the table URI, per partition.
    fn to_avro(&self, table: &Table) -> Result<Bytes> {
        let mut per_partition: BTreeMap<String, Vec<CleanFileInfo>> = BTreeMap::new();
        for f in &self.files_to_delete {
            per_partition.entry(clean::partition_of(f).to_string()).or_default().push(CleanFileInfo {
                file_path: Some(file_name::full_path(table.uri(), f)),
                is_bootstrap_base_file: Some(false),
            });
        }
        let plan = CleanerPlan {
            earliest_instant_to_retain: self.earliest_instant_to_retain.clone(),
            last_completed_commit_timestamp: self.last_completed_commit.clone(),
            policy: self.policy.clone(),
            files_to_be_deleted_per_partition: Some(BTreeMap::new()),
            version: Some(clean::VERSION),
            file_paths_to_be_deleted_per_partition: Some(per_partition),
            partitions_to_be_deleted: Some(Vec::new()),
        };
        Ok(Bytes::from(plan.to_avro()?))
    }

    /// The `HoodieCleanMetadata` of this plan executed at `time` in `millis`: every file deleted
    /// (deleting a file already gone succeeds), by name per partition as `CleanActionExecutor`
    /// records them.
    fn metadata(&self, time: &str, millis: i64) -> Result<Bytes> {
        let mut partitions: BTreeMap<String, CleanPartitionMetadata> = BTreeMap::new();
        for f in &self.files_to_delete {
            let p = clean::partition_of(f);
            let m = partitions.entry(p.to_string()).or_insert_with(|| CleanPartitionMetadata {
                partition_path: p.to_string(),
                policy: self.policy.clone(),
                is_partition_deleted: Some(false),
                ..Default::default()
            });
            m.delete_path_patterns.push(clean::file_name(f).to_string());
            m.success_delete_files.push(clean::file_name(f).to_string());
        }
        let total = i32::try_from(self.files_to_delete.len())
            .map_err(|_| Error::invalid_data(format!("clean {time}: too many files for one clean")))?;
        let metadata = CleanMetadata {
            start_clean_time: time.to_string(),
            time_taken_in_millis: millis,
            total_files_deleted: total,
            earliest_commit_to_retain: self
                .earliest_instant_to_retain
                .as_ref()
                .map(|i| i.timestamp.clone())
                .unwrap_or_default(),
            last_completed_commit_timestamp: self.last_completed_commit.clone(),
            partition_metadata: partitions,
            version: Some(clean::VERSION),
            bootstrap_partition_metadata: Some(BTreeMap::new()),
        };
        Ok(Bytes::from(metadata.to_avro()?))
    }
}

/// What a clean did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CleanResult {
    /// The clean instant, `None` when nothing was to be deleted.
    pub instant: Option<String>,
    /// The files deleted, relative to the table root.
    pub deleted: Vec<String>,
}

impl Table {
    /// Sets whether and how writes clean once they land (`None`: they do not), as the table
    /// properties of [`AUTOMATIC_KEY`]; every later writer of the table follows them.
    pub async fn set_cleaning(&mut self, clean: Option<InlineClean>) -> Result<()> {
        self.reload().await?;
        self.check_changeable()?;
        let Some(clean) = clean else { return self.set_properties(&[(AUTOMATIC_KEY, Some("false"))]).await };
        if clean.every == 0 {
            return Err(Error::invalid_arg("every", "must be at least 1 commit"));
        }
        let (policy, key, retain) = match clean.policy {
            CleanPolicy::KeepLatestCommits(n) => ("KEEP_LATEST_COMMITS", COMMITS_RETAINED_KEY, n),
            CleanPolicy::KeepLatestFileVersions(n) => ("KEEP_LATEST_FILE_VERSIONS", FILE_VERSIONS_RETAINED_KEY, n),
        };
        if retain == 0 {
            return Err(Error::invalid_arg("retain", "must be at least 1"));
        }
        let (retain, every) = (retain.to_string(), clean.every.to_string());
        self.set_properties(&[
            (AUTOMATIC_KEY, Some("true")),
            (POLICY_KEY, Some(policy)),
            (key, Some(&retain)),
            (EVERY_KEY, Some(&every)),
        ])
        .await
    }

    /// Deletes the files the policy no longer needs; finishes interrupted cleans first.
    pub async fn clean(&mut self, policy: CleanPolicy) -> Result<CleanResult> {
        self.clean_with(policy, None).await
    }

    /// [`Table::clean`], counting the files deleted on `progress`.
    pub async fn clean_with(&mut self, policy: CleanPolicy, progress: Option<Arc<Progress>>) -> Result<CleanResult> {
        match self.clean_once(policy, progress.clone()).await {
            Err(e) if crate::timeline::archived_meanwhile(&e) => {
                log::info!("{}: clean: {e}; again on the timeline as it is now", self.uri());
                self.clean_once(policy, progress).await
            }
            other => other,
        }
    }

    async fn clean_once(&mut self, policy: CleanPolicy, progress: Option<Arc<Progress>>) -> Result<CleanResult> {
        self.reload().await?;
        crate::commit::rollback_failed(self).await?;
        let mut result = CleanResult::default();
        let pending: Vec<Instant> = self.timeline().pending().filter(|i| i.action == Action::Clean).cloned().collect();
        // What cleans left to their cleaners delete: the files index still lists a file such a
        // clean deleted until it completes, and a new plan must not take it again.
        let mut theirs: HashSet<String> = HashSet::new();
        for r in pending {
            // One whose cleaner is alive is left to it.
            if !crate::commit::is_expired(self, &r).await? {
                match load_plan(self, &r).await {
                    Ok((plan, _)) => theirs.extend(plan.files_to_delete),
                    // Unreadable here (another engine's): a new plan may name its files again,
                    // which deletes nothing twice.
                    Err(e) => log::info!("{}: clean {}: its plan: {e}", self.uri(), r.time),
                }
                continue;
            }
            let (plan, inflight) = load_plan(self, &r).await?;
            let deleted = crate::commit::beating(self, &r.time, execute(self, &r, &plan, inflight, &progress)).await?;
            result.deleted.extend(deleted);
            result.instant = Some(r.time.clone());
        }
        if result.instant.is_some() {
            // Planned on the table as those cleans left it (its files index no longer lists
            // what they deleted).
            self.reload().await?;
        }
        crate::commit::prune_claims(self).await?;
        let mut plan = plan(self, policy).await?;
        plan.files_to_delete.retain(|f| !theirs.contains(f));
        if plan.files_to_delete.is_empty() {
            return Ok(result);
        }
        let bytes = plan.to_avro(self)?;
        let requested = crate::commit::claim(self, Action::Clean, |_| Ok(bytes.clone())).await?;
        let time = requested.time.clone();
        let deleted = crate::commit::beating(self, &time, execute(self, &requested, &plan, bytes, &progress)).await?;
        result.deleted.extend(deleted);
        result.instant = Some(time);
        self.reload().await?;
        Ok(result)
    }
}

/// The plan of the clean `instant` (Java's Avro, oxlake's Avro, or the JSON of earlier oxlake
/// versions), and what its `.clean.inflight` holds: the plan in Avro, as Java writes it.
async fn load_plan(table: &Table, instant: &Instant) -> Result<(CleanPlan, Bytes)> {
    let path = table.timeline().path_of(&instant.with_state(State::Requested));
    let bytes = table.storage().get(&path).await?;
    // The latest completed data instant before the clean: what Java would have recorded.
    let last_before = || {
        let mut data = table.timeline().completed_data().filter(|i| i.time < instant.time);
        data.next_back().map(|i| i.time.clone()).unwrap_or_default()
    };
    if bytes.is_empty() {
        // Java deletes an empty pending clean; completing it with nothing deleted is as harmless.
        let plan = CleanPlan { last_completed_commit: last_before(), ..Default::default() };
        let avro = plan.to_avro(table)?;
        return Ok((plan, avro));
    }
    match clean::read_plan(&path, &bytes)? {
        Stored::Avro(p) => {
            let files_to_delete = p.files(&path)?;
            let plan = CleanPlan {
                policy: p.policy,
                earliest_instant_to_retain: p.earliest_instant_to_retain,
                last_completed_commit: p.last_completed_commit_timestamp,
                files_to_delete,
            };
            Ok((plan, bytes))
        }
        Stored::Legacy(p) => {
            let earliest = p.earliest_instant_to_retain.map(|t| ActionInstant {
                action: table.timeline().get(&t).map_or("commit", |i| i.action.name()).to_string(),
                timestamp: t,
                state: "COMPLETED".into(),
            });
            let plan = CleanPlan {
                policy: clean::java_policy(&p.policy),
                earliest_instant_to_retain: earliest,
                last_completed_commit: last_before(),
                files_to_delete: p.files_to_delete,
            };
            let avro = plan.to_avro(table)?;
            Ok((plan, avro))
        }
    }
}

async fn execute(
    table: &Table,
    requested: &Instant,
    plan: &CleanPlan,
    inflight: Bytes,
    progress: &Option<Arc<Progress>>,
) -> Result<Vec<String>> {
    let started = std::time::Instant::now();
    let storage = table.storage();
    // Java's inflight holds the plan too (`transitionCleanRequestedToInflight`). A clean taken
    // up from a cleaner gone (its heartbeat expired) may have finished after all, and been
    // archived since it was listed: then nothing is left to do.
    if table.timeline().start(storage, requested, inflight).await?.is_none() {
        log::info!("{}: clean {} completed and was archived since it was listed", table.uri(), requested.time);
        return Ok(Vec::new());
    }
    progress::plan(progress, plan.files_to_delete.len() as u64, "files");
    for f in &plan.files_to_delete {
        storage.delete(f).await?;
        progress::advance(progress, 1);
    }
    crate::commit::step_failpoint(table, "clean-after-delete");
    let change = Change { added: &[], deleted: &plan.files_to_delete, keys: KeySource::Unchanged, entries: &[] };
    crate::commit::hook::before_complete(table, &requested.time, change).await?;
    let millis = i64::try_from(started.elapsed().as_millis()).unwrap_or(i64::MAX);
    let record = plan.metadata(&requested.time, millis)?;
    crate::commit::complete(table, requested, record).await?;
    Ok(plan.files_to_delete.clone())
}

/// The files of slices the policy does not retain.
async fn plan(table: &Table, policy: CleanPolicy) -> Result<CleanPlan> {
    let timeline = table.timeline();
    let instants: Vec<&Instant> = timeline.completed_data().collect();
    let data: Vec<String> = instants.iter().map(|i| i.time.clone()).collect();
    let Some(latest) = data.last().cloned() else { return Ok(CleanPlan::default()) };
    let view = table.file_system_view().await?;
    // Snapshots that must stay readable: savepoints, and the retained commits.
    let mut keep_as_of: BTreeSet<String> = table.savepoints().into_iter().collect();
    keep_as_of.insert(latest.clone());
    let (name, earliest) = match policy {
        CleanPolicy::KeepLatestCommits(n) => {
            let from = data.len().saturating_sub(n);
            keep_as_of.extend(data[from..].iter().cloned());
            let earliest = instants.get(from).map(|i| ActionInstant {
                timestamp: i.time.clone(),
                action: i.action.name().to_string(),
                state: "COMPLETED".into(),
            });
            ("KEEP_LATEST_COMMITS", earliest)
        }
        CleanPolicy::KeepLatestFileVersions(_) => ("KEEP_LATEST_FILE_VERSIONS", None),
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
    Ok(CleanPlan {
        policy: name.into(),
        earliest_instant_to_retain: earliest,
        last_completed_commit: latest,
        files_to_delete: files,
    })
}

fn slice_files(s: &FileSlice) -> Vec<String> {
    s.base.iter().map(|b| b.path.clone()).chain(s.logs.iter().map(|l| l.path.clone())).collect()
}
