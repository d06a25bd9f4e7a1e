//! What of a table's past is still there: its savepoints, its archived timeline (read where a
//! query reaches before the active one), and whether a clean removed files a snapshot reads.

use std::collections::{BTreeSet, HashSet};
use std::ops::Bound;

use bytes::Bytes;

use crate::error::{Error, Result};
use crate::format::archived;
use crate::format::clean::Stored;
use crate::format::file_name::{BaseFileName, LogFileName};
use crate::format::instant::{Action, Instant};
use crate::format::lsm;
use crate::table::Table;
use crate::table::fs_view::{FileGroupId, FileSystemView};

/// One completed data commit as [`Table::commits`] reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CommitSummary {
    /// The instant (completed; its completion time on timeline layout 2).
    pub instant: Instant,
    /// The write operation recorded (`UPSERT`, `INSERT`, `DELETE`, `COMPACT`, `CLUSTER`, ...).
    pub operation: Option<String>,
    /// Records inserted, as its write stats count them.
    pub num_inserts: i64,
    /// Records updated.
    pub num_updates: i64,
    /// Records deleted.
    pub num_deletes: i64,
    /// Files it wrote (base and log files).
    pub files_written: usize,
    /// Bytes it wrote.
    pub bytes_written: i64,
    /// File groups it replaced (insert overwrite, clustering).
    pub files_replaced: usize,
    /// Its `extraMetadata`, without the schema Apache Hudi and oxlake keep there.
    pub extra_metadata: std::collections::BTreeMap<String, String>,
    /// Records inserted, updated and deleted per partition path it wrote.
    pub partitions: std::collections::BTreeMap<String, RecordCounts>,
}

/// Records a commit wrote in one partition, as its write stats count them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RecordCounts {
    /// Records inserted.
    pub inserts: i64,
    /// Records updated.
    pub updates: i64,
    /// Records deleted.
    pub deletes: i64,
}

impl Table {
    /// The completed data commits (commits, deltacommits, replacecommits), oldest first, with
    /// what each did; with `include_archived` those archival moved too. Read side by side.
    pub async fn commits(&self, include_archived: bool) -> Result<Vec<CommitSummary>> {
        use futures::{StreamExt, TryStreamExt};
        let merged;
        let table = if include_archived {
            merged = self.with_archived_timeline().await?;
            &merged
        } else {
            self
        };
        let timeline = table.timeline();
        futures::stream::iter(timeline.completed_data().cloned())
            .map(|instant| async move {
                let meta = timeline.commit_metadata(table.storage(), &instant).await?;
                let mut partitions = std::collections::BTreeMap::<String, RecordCounts>::new();
                for (partition, s) in meta.write_stats() {
                    let counts = partitions.entry(partition.to_string()).or_default();
                    counts.inserts += s.num_inserts;
                    counts.updates += s.num_update_writes;
                    counts.deletes += s.num_deletes;
                }
                let stats: Vec<_> = meta.write_stats().map(|(_, s)| s).collect();
                Ok::<_, Error>(CommitSummary {
                    operation: meta.operation_type.clone(),
                    num_inserts: stats.iter().map(|s| s.num_inserts).sum(),
                    num_updates: stats.iter().map(|s| s.num_update_writes).sum(),
                    num_deletes: stats.iter().map(|s| s.num_deletes).sum(),
                    files_written: stats.iter().filter(|s| s.path.is_some()).count(),
                    bytes_written: stats.iter().map(|s| s.total_write_bytes).sum(),
                    files_replaced: meta.partition_to_replace_file_ids.values().map(Vec::len).sum(),
                    extra_metadata: meta
                        .extra_metadata
                        .iter()
                        .filter(|(k, _)| !crate::format::commit::CommitMetadata::SCHEMA_KEYS.contains(&k.as_str()))
                        .map(|(k, v)| (k.clone(), v.clone()))
                        .collect(),
                    partitions,
                    instant,
                })
            })
            .buffered(16)
            .try_collect()
            .await
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

    /// This table with its archived instants on its timeline ([`crate::timeline::Timeline::with_archived`]):
    /// for queries that reach before the active timeline, and `timeline(include_archived=True)`.
    pub async fn with_archived_timeline(&self) -> Result<Table> {
        if self.timeline().has_archived() {
            return Ok(self.clone());
        }
        let states = read_archived(self).await?;
        let mut merged = self.clone();
        merged.set_timeline(self.timeline().with_archived(states));
        Ok(merged)
    }

    /// Whether a query as of `time` (or from it) reaches before the active write timeline, where
    /// archived instants may be.
    pub fn reaches_archive(&self, time: &str) -> bool {
        !self.timeline().has_archived() && self.timeline().write_timeline_start().is_some_and(|s| time < s)
    }

    /// Fails when a clean has deleted a file that the snapshot as of `time` reads: a time-travel
    /// read, an incremental window ending at `time`, or a rollback back to `time` would otherwise
    /// return a table with rows missing. `view` and `replaced` are the table's current file groups
    /// and the groups replaced as of `time`. Cleans written by Apache Hudi are read too.
    pub async fn check_not_cleaned(
        &self,
        arg: &str,
        time: &str,
        view: &FileSystemView,
        replaced: &HashSet<FileGroupId>,
    ) -> Result<()> {
        let timeline = self.timeline();
        let any_clean = timeline.instants().iter().any(|i| i.action == Action::Clean);
        if !any_clean || self.savepoints().iter().any(|s| s == time) {
            return Ok(());
        }
        // What completed cleans deleted, and what pending ones may have deleted already (a
        // cleaner that died half-way: its files are gone, its clean completes with the next one).
        let mut cleans: Vec<(String, Vec<String>)> = Vec::new();
        for clean in timeline.instants().iter().filter(|i| i.action == Action::Clean && i.is_completed()) {
            let deleted = match timeline.clean_metadata(self.storage(), clean).await? {
                Stored::Avro(m) => m.files(),
                Stored::Legacy(p) => p.files_to_delete,
            };
            cleans.push((clean.time.clone(), deleted));
        }
        for (clean, planned) in super::pending::pending_cleans(self).await? {
            let mut gone = Vec::new();
            for file in planned {
                if self.storage().head(&file).await?.is_none() {
                    gone.push(file);
                }
            }
            cleans.push((format!("{clean} (pending)"), gone));
        }
        for (clean, deleted) in &cleans {
            for file in deleted {
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
                            "{time} is no longer readable: clean {clean} deleted {file}, which the table as of {time} \
                             reads (retain more commits, or savepoint the instants to keep)",
                        ),
                    ));
                }
            }
        }
        Ok(())
    }
}

/// The archive folder of a table, relative to its root.
pub fn archive_dir(table: &Table) -> String {
    format!(".hoodie/{}", table.config().folder(crate::config::keys::ARCHIVELOG_FOLDER, archived::DEFAULT_FOLDER))
}

/// The archive files of a table: version and path.
pub async fn archive_files(table: &Table) -> Result<Vec<(u32, String)>> {
    let dir = archive_dir(table);
    let mut out: Vec<(u32, String)> = table
        .storage()
        .list_dir(&dir)
        .await?
        .into_iter()
        .filter_map(|f| archive_version(f.path.rsplit('/').next()?).map(|v| (v, f.path.clone())))
        .collect();
    out.sort();
    Ok(out)
}

/// The version of an archive file name `.commits_.archive.<version>_<token>` (Java globs
/// `.commits_.archive*` and orders by this number).
pub(crate) fn archive_version(name: &str) -> Option<u32> {
    let prefix = format!(".{}_.{}.", archived::FILE_ID, archived::EXTENSION);
    let (version, token) = name.strip_prefix(&prefix)?.split_once('_')?;
    (!token.is_empty()).then_some(())?;
    version.parse().ok()
}

/// Every archived state, oldest first, each (time, action, state) once.
pub async fn read_archived(table: &Table) -> Result<Vec<archived::ArchivedState>> {
    if table.config().layout_version >= 2 {
        return read_history(table).await;
    }
    let mut out = Vec::new();
    for (_, path) in archive_files(table).await? {
        let data = table.storage().get(&path).await?;
        out.extend(archived::read_file(&path, &data)?);
    }
    let mut seen = BTreeSet::new();
    out.retain(|s| seen.insert((s.instant.time.clone(), s.instant.action, s.instant.state)));
    out.sort_by(|a, b| (&a.instant.time, a.instant.state).cmp(&(&b.instant.time, b.instant.state)));
    Ok(out)
}

/// The LSM timeline's folder (timeline layout 2): `hoodie.timeline.history.path` under the timeline.
pub fn history_dir(table: &Table) -> String {
    let cfg = table.config();
    format!("{}/{}", cfg.timeline_dir(), cfg.folder(crate::config::keys::TIMELINE_HISTORY_PATH, "history"))
}

/// Removes the Hadoop checksums an older oxlake left stale beside the files Java Hudi wrote and
/// oxlake rewrites in place (`hoodie.properties`, the LSM timeline's `_version_`): each keeps
/// Java out of the table (see `Storage::put`). Every write starts with it.
pub async fn repair_hadoop_checksums(table: &Table) -> Result<()> {
    let version = format!("{}/{}", history_dir(table), crate::format::lsm::VERSION_FILE);
    for rel in [crate::config::PROPERTIES_FILE, version.as_str()] {
        if table.storage().repair_hadoop_checksum(rel).await? {
            log::info!("{}: removed the stale Hadoop checksum beside {rel}", table.uri());
        }
    }
    Ok(())
}

/// The latest manifest of the LSM timeline and its number (0 and empty when there is none):
/// the one `_version_` names, else the greatest one listed, as Apache Hudi's `LSMTimeline` finds it;
/// then any written after it.
pub async fn latest_manifest(table: &Table) -> Result<(u32, lsm::Manifest)> {
    let storage = table.storage();
    let dir = history_dir(table);
    let named = named_version(table).await?;
    let mut version = match named {
        Some(v) => v,
        None => greatest_listed(table).await?,
    };
    let mut listed = named.is_none();
    loop {
        // A manifest written after the one named is complete (its files are written before it):
        // a run that died before naming it, or one whose naming another run's overtook.
        while storage.head(&format!("{dir}/{}", lsm::manifest_name(version + 1))).await?.is_some() {
            version += 1;
        }
        if version == 0 {
            return Ok((0, lsm::Manifest::default()));
        }
        let path = format!("{dir}/{}", lsm::manifest_name(version));
        match storage.get_opt(&path).await? {
            Some(bytes) => return Ok((version, lsm::Manifest::parse(&path, &bytes)?)),
            // Named by a run that stalled while later manifests were written and this one
            // cleaned (`services/lsm_compaction.rs`): the greatest listed is the latest.
            None if !listed => {
                listed = true;
                version = greatest_listed(table).await?;
            }
            None => return Err(Error::corrupt(path, "the latest manifest of the archived timeline is gone")),
        }
    }
}

/// The greatest manifest number in the LSM timeline's folder (0 for none).
async fn greatest_listed(table: &Table) -> Result<u32> {
    let listing = table.storage().list_dir(&history_dir(table)).await?;
    Ok(listing.iter().filter_map(|f| lsm::manifest_version(f.path.rsplit('/').next()?)).max().unwrap_or(0))
}

/// Names manifest `version` the latest in `_version_`, unless a later one is named already: of
/// two runs naming theirs at once, the slower must not move it back.
pub(crate) async fn publish_manifest(table: &Table, version: u32) -> Result<()> {
    if named_version(table).await?.is_none_or(|n| n < version) {
        let path = format!("{}/{}", history_dir(table), lsm::VERSION_FILE);
        table.storage().put(&path, Bytes::from(version.to_string())).await?;
    }
    Ok(())
}

/// The manifest number `_version_` names, if it is there and names one (a reader that cannot
/// read it takes the greatest manifest listed).
pub(crate) async fn named_version(table: &Table) -> Result<Option<u32>> {
    let path = format!("{}/{}", history_dir(table), lsm::VERSION_FILE);
    let text = table.storage().get_opt(&path).await?;
    Ok(text.as_deref().and_then(|b| std::str::from_utf8(b).ok()?.parse().ok()))
}

/// The archived instants of the LSM timeline, completed, with their metadata decoded. A file
/// gone while it is read (a compaction of the archived timeline published a newer manifest, and
/// cleaned this one's files) sends the read back to the latest manifest.
async fn read_history(table: &Table) -> Result<Vec<archived::ArchivedState>> {
    let mut attempt = 0;
    loop {
        match read_history_once(table).await {
            Err(e @ Error::Storage { source: object_store::Error::NotFound { .. }, .. }) if attempt < 3 => {
                log::info!("{}: the archived timeline changed while read: {e}; reading it again", table.uri());
                attempt += 1;
            }
            other => return other,
        }
    }
}

async fn read_history_once(table: &Table) -> Result<Vec<archived::ArchivedState>> {
    let (_, manifest) = latest_manifest(table).await?;
    let dir = history_dir(table);
    let mut out = Vec::new();
    for f in &manifest.files {
        let path = format!("{dir}/{}", f.file_name);
        for row in lsm::read_file(&path, table.storage().get(&path).await?)? {
            let action = Action::parse(&row.action)
                .ok_or_else(|| Error::corrupt(&path, format!("unknown action `{}`", row.action)))?;
            let details = match &row.metadata {
                Some(bytes) => crate::format::avro::read_container(bytes)
                    .map_err(|e| Error::corrupt(&path, format!("metadata of {}: {e}", row.instant_time)))?
                    .into_iter()
                    .next(),
                None => None,
            };
            let mut instant = Instant::new(row.instant_time, action, crate::format::instant::State::Completed);
            instant.completion = Some(row.completion_time);
            out.push(archived::ArchivedState { instant, details });
        }
    }
    let mut seen = BTreeSet::new();
    out.retain(|s| seen.insert((s.instant.time.clone(), s.instant.action)));
    out.sort_by(|a, b| a.instant.time.cmp(&b.instant.time));
    Ok(out)
}
