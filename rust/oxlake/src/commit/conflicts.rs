//! Conflicts between writers, decided at commit time (optimistic concurrency, docs/COMMIT_PROTOCOL.md).
//!
//! A write's footprint is the file groups it wrote or replaced and the record keys it wrote. Two
//! writes conflict when their footprints meet: a shared file group (except a compaction and a log
//! write, which go to different slices), or a shared key (two writers inserting one new key into
//! different file groups would otherwise leave it twice).
//!
//! Checking the instants completed since the write began is not enough: two writers may both check,
//! find nothing, and both complete. So a writer first publishes its footprint as an *intent*
//! (`.hoodie/oxlake/intents/<time>`), then checks, then completes, then removes the intent. Every
//! writer writes before it reads, so of two overlapping writers at least one sees the other's intent
//! (the store is read-after-write consistent: local disk, S3). Then:
//! - the later instant waits until the earlier one has completed (and checks it as a completed
//!   instant) or gone (rolled back, or its heartbeat expired);
//! - the earlier instant gives way to a later pending one (a conflict): the later one may be
//!   waiting for it, and one of them must yield.
//!
//! Completed instants are checked exactly: their commit metadata names their file groups, and their
//! keys are read from the files they wrote, in the partitions both wrote.

use std::collections::{BTreeSet, HashSet};
use std::time::Duration;

use arrow::array::Array;
use bytes::Bytes;
use serde::{Deserialize, Serialize};

use super::change::KeyChanges;
use crate::error::{Error, Result};
use crate::format::commit::CommitMetadata;
use crate::format::file_name::{BaseFileName, LogFileName};
use crate::format::instant::Instant;
use crate::storage::Storage;
use crate::table::Table;
use crate::table::fs_view::{FileGroupId, LogFile};

const INTENT_DIR: &str = ".hoodie/oxlake/intents";
/// Intents name keys by hash up to this many keys; beyond, by the partitions they fall in.
const MAX_INTENT_KEYS: usize = 100_000;
/// How often a writer waiting for an earlier one looks again.
const WAIT_POLL: Duration = Duration::from_millis(25);

/// What a commit touches.
#[derive(Debug, Default, Serialize, Deserialize)]
pub(crate) struct Footprint {
    groups: BTreeSet<FileGroupId>,
    /// A compaction (its base files do not conflict with log writes to the same groups).
    compacted: bool,
    /// Replaces file groups (clustering, insert overwrite): conflicts with compactions too.
    replaces: bool,
    /// Hashes of `(partition, key)` of the keys written; `None` when there were too many.
    key_hashes: Option<BTreeSet<u64>>,
    /// Partitions the written keys fall in.
    key_partitions: BTreeSet<String>,
    /// Evolves the table's schema: meets every other pending write, so that of two overlapping
    /// commits the later one records the schema with this one's change (see
    /// `Transaction::reconcile_schema`).
    #[serde(default)]
    pub(crate) evolves_schema: bool,
    /// The earlier write this one waits for because one of them changes the schema: it will not
    /// complete before that one did (see [`check_intents`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) waits_for: Option<String>,
}

impl Footprint {
    /// `global`: the table's keys are unique across partitions (a global index), so keys meet
    /// whatever partitions they were written to.
    pub(crate) fn of(metadata: &CommitMetadata, keys: &KeyChanges, global: bool) -> Self {
        let written = metadata.write_stats().map(|(p, s)| (p.to_string(), s.file_id.clone()));
        let replaced = metadata.replaced_file_groups().map(|(p, f)| (p.to_string(), f.to_string()));
        let count: usize = keys.written.iter().map(|(_, _, k)| k.len()).sum();
        let key_hashes = (count <= MAX_INTENT_KEYS && keys.unlisted.is_empty()).then(|| {
            keys.written
                .iter()
                .flat_map(|(p, _, ks)| ks.iter().flatten().map(move |k| key_hash(key_scope(p, global), k)))
                .collect()
        });
        let key_partitions =
            keys.written.iter().filter(|(_, _, k)| !k.is_empty()).map(|(p, _, _)| key_scope(p, global));
        let key_partitions = key_partitions.chain(keys.unlisted.iter().map(|p| key_scope(p, global)));
        Footprint {
            groups: written.chain(replaced).collect(),
            compacted: metadata.compacted,
            replaces: !metadata.partition_to_replace_file_ids.is_empty(),
            key_hashes,
            key_partitions: key_partitions.map(str::to_string).collect(),
            evolves_schema: false,
            waits_for: None,
        }
    }

    /// Whether two footprints meet (for a pending intent: the keys by hash, or by partition).
    fn meets(&self, other: &Footprint) -> bool {
        groups_conflict(self, other) || self.keys_may_meet(other)
    }

    fn keys_may_meet(&self, other: &Footprint) -> bool {
        match (&self.key_hashes, &other.key_hashes) {
            (Some(a), Some(b)) => !a.is_disjoint(b),
            _ => !self.key_partitions.is_disjoint(&other.key_partitions),
        }
    }
}

fn groups_conflict(a: &Footprint, b: &Footprint) -> bool {
    // A compaction and a log write on the same file group do not conflict: logs written after the
    // compaction was planned go to the compaction's new slice. A compaction and a clustering (which
    // replaces groups) do, and so do two compactions (each would replace the other's new slice;
    // `commit::slice_claims` keeps them from planning one slice twice).
    if a.compacted != b.compacted && !(a.replaces || b.replaces) {
        return false;
    }
    !a.groups.is_disjoint(&b.groups)
}

/// The partition a key is unique in: its own, or the whole table's (`""`) with a global index.
fn key_scope(partition: &str, global: bool) -> &str {
    if global { "" } else { partition }
}

/// A stable 64-bit hash (FNV-1a) of a key in its partition: the same in every process.
fn key_hash(partition: &str, key: &str) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in partition.bytes().chain([0]).chain(key.bytes()) {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

fn intent_path(time: &str) -> String {
    format!("{INTENT_DIR}/{time}")
}

/// Publishes the footprint of the write at `time`.
pub(crate) async fn publish_intent(storage: &Storage, time: &str, footprint: &Footprint) -> Result<()> {
    let bytes = serde_json::to_vec(footprint).map_err(Error::invalid_data)?;
    storage.put(&intent_path(time), Bytes::from(bytes)).await
}

/// Removes the intent of `time` (after its commit or rollback).
pub(crate) async fn withdraw_intent(storage: &Storage, time: &str) -> Result<()> {
    storage.delete(&intent_path(time)).await
}

/// What the intents of other writers say about committing now.
pub(crate) enum Verdict {
    /// Nothing pending meets this write.
    Clear,
    /// An earlier write that meets this one is committing: wait for it, then check again.
    Wait(String),
    /// A later write that meets this one is committing: this one gives way.
    GiveWay(String),
    /// A write that meets this one stopped beating: its fate must be decided (rolled back, or
    /// completed if it had decided to commit) before this one goes on; skipping it would let it
    /// complete beside this one when its process wakes up.
    Gone(Instant),
}

/// Compares `ours` (the write at `time`) with the intents of the writes still pending on
/// `table`'s (just reloaded) timeline. Intents of completed instants are stale: removed.
pub(crate) async fn check_intents(table: &Table, time: &str, ours: &Footprint) -> Result<Verdict> {
    let storage = table.storage();
    let completed: HashSet<&str> =
        table.timeline().instants().iter().filter(|i| i.is_completed()).map(|i| i.time.as_str()).collect();
    let mut others: Vec<String> = storage
        .list_dir(INTENT_DIR)
        .await?
        .into_iter()
        .filter_map(|f| f.path.rsplit('/').next().map(str::to_string))
        .filter(|t| t != time)
        .collect();
    others.sort();
    for other in others {
        if completed.contains(other.as_str()) {
            withdraw_intent(storage, &other).await?;
            continue;
        }
        let Some(bytes) = storage.get_opt(&intent_path(&other)).await? else { continue };
        let theirs: Footprint = serde_json::from_slice(&bytes).map_err(|e| Error::corrupt(intent_path(&other), e))?;
        let touches_the_same_data = ours.meets(&theirs);
        if !touches_the_same_data && !ours.evolves_schema && !theirs.evolves_schema {
            continue;
        }
        // Two writes meeting only because one changes the schema both complete, in the order of
        // their times (the latest commit's schema is the table's): the later one waits, saying
        // so; the earlier one goes on once the later one says it waits. A later one that says
        // nothing may have passed its check before this intent was published: it may be
        // completing, and this one waits for that too.
        let schema_only = !touches_the_same_data;
        if schema_only && other.as_str() > time && theirs.waits_for.as_deref() == Some(time) {
            continue;
        }
        let pending = table.timeline().pending().find(|i| i.time == other).cloned();
        if let Some(p) = &pending
            && super::is_expired(table, p).await?
        {
            return Ok(Verdict::Gone(p.clone()));
        }
        // An intent whose instant has left the timeline was rolled back (its writer published
        // the intent after its instant's files existed, and only a rollback removes them): it
        // cannot complete any more.
        if pending.is_none() && !on_timeline(table, &other).await? {
            withdraw_intent(storage, &other).await?;
            continue;
        }
        return Ok(if other.as_str() < time || schema_only { Verdict::Wait(other) } else { Verdict::GiveWay(other) });
    }
    Ok(Verdict::Clear)
}

/// The earliest write before `time` that published its intent and is still pending, its writer
/// alive: one that may be completing now (a rollback or restore at `time` waits for it).
pub(crate) async fn committing_before(table: &Table, time: &str) -> Result<Option<Instant>> {
    let mut others: Vec<String> = table
        .storage()
        .list_dir(INTENT_DIR)
        .await?
        .into_iter()
        .filter_map(|f| f.path.rsplit('/').next().map(str::to_string))
        .filter(|t| t.as_str() < time)
        .collect();
    others.sort();
    for other in others {
        if let Some(p) = table.timeline().pending().find(|i| i.time == other)
            && !super::is_expired(table, p).await?
        {
            return Ok(Some(p.clone()));
        }
    }
    Ok(None)
}

/// Whether any file of the instant `time` is on the timeline now (listed afresh: the table's view
/// may predate it).
async fn on_timeline(table: &Table, time: &str) -> Result<bool> {
    let files = table.storage().list_dir(table.timeline().dir()).await?;
    // `<time>.<action>[.<state>]`, or `<time>_<completion>.<action>` (timeline layout 2).
    let of_time = |name: &str| name.strip_prefix(time).is_some_and(|rest| rest.starts_with(['.', '_']));
    Ok(files.iter().any(|f| f.path.rsplit('/').next().is_some_and(of_time)))
}

/// Pause between two looks while waiting for an earlier writer.
pub(crate) async fn pause() {
    tokio::time::sleep(WAIT_POLL).await;
}

/// A log of `metadata` left on a slice a compaction leaves behind, or else the first data instant
/// completed since the write at `time` began (not in `seen`) whose footprint meets `ours` (when
/// given).
pub(crate) async fn find_conflict(
    table: &Table,
    time: &str,
    seen: &HashSet<String>,
    metadata: &CommitMetadata,
    keys: &KeyChanges,
    ours: Option<&Footprint>,
) -> Result<Option<String>> {
    if let Some(c) = stale_log(table, time, seen, metadata).await? {
        return Ok(Some(c));
    }
    let Some(ours) = ours else { return Ok(None) };
    for other in table.timeline().completed_data() {
        if other.time == time || seen.contains(&other.time) {
            continue;
        }
        let Some(meta) = unless_gone(table.timeline().commit_metadata(table.storage(), other).await)? else {
            return Ok(Some(other.time.clone()));
        };
        let theirs = Footprint::of(&meta, &KeyChanges::default(), false);
        if groups_conflict(ours, &theirs)
            || unless_gone(wrote_same_keys(table, keys, metadata, &meta).await)?.unwrap_or(true)
        {
            return Ok(Some(other.time.clone()));
        }
    }
    Ok(None)
}

/// `None` for what a commit completed since this write began no longer has: its instant file
/// archived, or its files cleaned (a writer stopped long enough for compaction, archival or
/// cleaning to pass it). It cannot be checked, so the caller takes it to conflict: the write is
/// retried on the table as it is now, never committed on a guess.
fn unless_gone<T>(result: Result<T>) -> Result<Option<T>> {
    match result {
        Ok(v) => Ok(Some(v)),
        Err(crate::error::Error::Storage { source: object_store::Error::NotFound { .. }, .. }) => Ok(None),
        Err(e) => Err(e),
    }
}

/// Whether the completed commit `theirs` wrote any key that `keys` holds, in the partitions both
/// wrote (in any partition with a global index): read from the files it reports (all their keys,
/// a superset of what it wrote). Keys `ours` wrote without listing them (`keys.unlisted`) are read
/// back from the files `ours` reports there, one at a time, against all of theirs: a key in both
/// files that neither wrote would be in one file group both wrote, a conflict already.
async fn wrote_same_keys(
    table: &Table,
    keys: &KeyChanges,
    ours: &CommitMetadata,
    theirs: &CommitMetadata,
) -> Result<bool> {
    if (keys.written.is_empty() && keys.unlisted.is_empty()) || theirs.compacted {
        return Ok(false);
    }
    let global = table.config().global_index;
    let stored_keys = table.stored_keys()?;
    if !keys.written.is_empty() {
        let listed: HashSet<u64> = keys
            .written
            .iter()
            .flat_map(|(p, _, ks)| ks.iter().flatten().map(move |k| key_hash(key_scope(p, global), k)))
            .collect();
        let partitions: HashSet<&str> = keys.written.iter().map(|(p, _, _)| p.as_str()).collect();
        for (partition, stat) in theirs.write_stats().filter(|(p, _)| global || partitions.contains(p)) {
            let stored = file_keys(table, &stored_keys, partition, stat, "a concurrent commit").await?;
            if stored.iter().any(|k| listed.contains(&key_hash(key_scope(partition, global), k))) {
                return Ok(true);
            }
        }
    }
    if keys.unlisted.is_empty() {
        return Ok(false);
    }
    let mut their_keys = HashSet::new();
    for (partition, stat) in theirs.write_stats().filter(|(p, _)| global || keys.unlisted.contains(*p)) {
        let stored = file_keys(table, &stored_keys, partition, stat, "a concurrent commit").await?;
        their_keys.extend(stored.iter().map(|k| key_hash(key_scope(partition, global), k)));
    }
    if their_keys.is_empty() {
        return Ok(false);
    }
    for (partition, stat) in ours.write_stats().filter(|(p, _)| keys.unlisted.contains(*p)) {
        let mine = file_keys(table, &stored_keys, partition, stat, "this write").await?;
        if mine.iter().any(|k| their_keys.contains(&key_hash(key_scope(partition, global), k))) {
            return Ok(true);
        }
    }
    Ok(false)
}

/// The record keys of the file a write stat reports: all keys of a base file, the keys of the
/// blocks a log file's write appended (`whose`: the write, in errors about them).
async fn file_keys(
    table: &Table,
    stored_keys: &crate::keys::StoredKeys,
    partition: &str,
    stat: &crate::format::commit::WriteStat,
    whose: &str,
) -> Result<Vec<String>> {
    let Some(path) = stat.path.as_deref() else { return Ok(Vec::new()) };
    let name = path.rsplit('/').next().unwrap_or(path);
    let size = stat.file_size_in_bytes.max(0) as u64;
    if BaseFileName::parse(name).is_some() {
        let keys = stored_keys.of_base_file(table.storage(), path, size).await?;
        return Ok(keys.iter().flatten().map(str::to_string).collect());
    }
    let Some(name) = LogFileName::parse(name) else { return Ok(Vec::new()) };
    let log = LogFile { name, path: path.to_string(), size };
    // The write is committed (or is this one): a damaged block of it is an error, never keys unseen.
    let end = (stat.log_offset.unwrap_or(0).max(0) as u64).saturating_add(size);
    let written = crate::log::CommittedLogs::of(path, partition, &stat.file_id, end, whose);
    Ok(crate::log::record_keys(table.storage(), &[log], Some(&written), stored_keys).await?.into_keys().collect())
}

/// The deltacommit of a log that a compaction at `time` (timeline layout 2) would leave behind:
/// completed before `time` on a slice of its plan, yet not in the plan.
pub(crate) async fn missed_logs(table: &Table, time: &str) -> Result<Option<String>> {
    let plan = crate::table::pending::read_compaction_plan(table, time).await?;
    let missing = crate::table::pending::logs_missing_from_plan(table, time, &plan).await?;
    Ok(missing.into_iter().next().map(|(_, _, instant)| instant))
}

/// The compaction (pending or completed since this write began) planned over a file group this
/// write logged to under an older base instant, if any: that log would be left behind. On
/// timeline layout 2 a log joins the slice its completion time falls in, and the compaction
/// checks its own plan instead ([`missed_logs`]).
async fn stale_log(
    table: &Table,
    time: &str,
    seen: &HashSet<String>,
    metadata: &CommitMetadata,
) -> Result<Option<String>> {
    let logged: Vec<(FileGroupId, &str)> = metadata
        .write_stats()
        .filter(|(_, s)| s.log_files.is_some())
        .filter_map(|(p, s)| Some(((p.to_string(), s.file_id.clone()), s.prev_commit.as_deref()?)))
        .collect();
    if logged.is_empty() || table.timeline().layout() >= 2 {
        return Ok(None);
    }
    // A pending compaction planned after this write began waits for it and takes its logs (see
    // `services::compaction`); one planned before it does not wait.
    let mut compactions: Vec<(FileGroupId, String)> = crate::table::pending::pending_compaction_groups(table)
        .await?
        .into_iter()
        .filter(|(_, c)| c.as_str() < time)
        .collect();
    let since: Vec<&Instant> = table.timeline().completed_data().filter(|i| !seen.contains(&i.time)).collect();
    for other in since {
        let Some(meta) = unless_gone(table.timeline().commit_metadata(table.storage(), other).await)? else {
            return Ok(Some(other.time.clone()));
        };
        if meta.compacted {
            compactions
                .extend(meta.write_stats().map(|(p, s)| ((p.to_string(), s.file_id.clone()), other.time.clone())));
        }
    }
    Ok(logged.iter().find_map(|(group, base)| {
        compactions.iter().find(|(g, c)| g == group && c.as_str() > *base && c.as_str() != time).map(|(_, c)| c.clone())
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::StringArray;

    fn footprint(groups: &[(&str, &str)], keys: &[(&str, &[&str])]) -> Footprint {
        let mut metadata = CommitMetadata::default();
        for (p, f) in groups {
            let stat = crate::format::commit::WriteStat { file_id: f.to_string(), ..Default::default() };
            metadata.partition_to_write_stats.entry(p.to_string()).or_default().push(stat);
        }
        let written = keys
            .iter()
            .map(|(p, ks)| (p.to_string(), "f".to_string(), StringArray::from_iter_values(ks.iter())))
            .collect();
        Footprint::of(&metadata, &KeyChanges { written, ..Default::default() }, false)
    }

    /// A writer stopped long enough for the commit it checks to be archived (its instant file
    /// gone after the timeline was listed) takes that commit to conflict: it is never skipped,
    /// and the write fails as a conflict, not a storage error.
    #[tokio::test]
    async fn a_commit_archived_meanwhile_is_taken_to_conflict() {
        use crate::config::TableType;
        use crate::table::TableOptions;
        use crate::test_support::{by_parity, id_city_table};
        use crate::write::{WriteConfig, WriteOperation};
        let dir = tempfile::tempdir().unwrap();
        let mut t = id_city_table(dir.path(), TableType::CopyOnWrite, TableOptions::default()).await;
        let other = t.write(WriteOperation::Insert, vec![by_parity(&[1, 2])], &WriteConfig::default()).await.unwrap();
        let other = other.instant.unwrap();
        t.reload().await.unwrap();
        let completed = t.timeline().get(&other).unwrap().clone();
        t.storage().delete(&t.timeline().path_of(&completed)).await.unwrap();
        let ours = footprint(&[("elsewhere", "g9")], &[]);
        let found = find_conflict(
            &t,
            "99990101000000000",
            &HashSet::new(),
            &CommitMetadata::default(),
            &KeyChanges::default(),
            Some(&ours),
        )
        .await
        .unwrap();
        assert_eq!(found, Some(other));
    }

    #[test]
    fn footprints_meet_on_groups_or_keys_only() {
        let a = footprint(&[("p", "g1")], &[("p", &["k1", "k2"])]);
        let b = footprint(&[("p", "g2")], &[("p", &["k3"])]);
        let c = footprint(&[("p", "g3")], &[("p", &["k2"])]);
        let d = footprint(&[("p", "g1")], &[]);
        let e = footprint(&[("q", "g4")], &[("q", &["k1"])]);
        assert!(!a.meets(&b), "disjoint groups and keys");
        assert!(a.meets(&c), "one key inserted twice");
        assert!(a.meets(&d), "one file group");
        assert!(!a.meets(&e), "the same key in another partition is another record");
        // A serialized intent means the same.
        let back: Footprint = serde_json::from_slice(&serde_json::to_vec(&c).unwrap()).unwrap();
        assert!(a.meets(&back) && !b.meets(&back));
        // Without key hashes (too many keys), keys meet by partition.
        let coarse = Footprint { key_hashes: None, ..footprint(&[("p", "g9")], &[("p", &["k9"])]) };
        assert!(coarse.meets(&b) && !coarse.meets(&e));
    }

    #[test]
    fn key_hashes_are_stable() {
        assert_eq!(key_hash("", ""), 0xaf63_bd4c_8601_b7df);
        assert_ne!(key_hash("a", "b"), key_hash("ab", ""));
    }
}
