//! Validation: the metadata table against a full listing of storage and against the data, and
//! the timeline's files against damage that reads as "nothing recorded" (`damaged`).

use std::collections::{BTreeMap, HashMap};

use super::entries::{binaries, strings};
use super::{Index, Select, data_files};
use crate::error::Result;
use crate::format::file_name::BaseFileName;
use crate::table::Table;

/// What `Table::validate_metadata` found: every difference between the metadata table and
/// storage (the `files` index), the data files (`column_stats`, `bloom_filters`) and the records
/// (`record_index`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ValidationReport {
    /// Whether the table has a metadata table at all.
    pub present: bool,
    /// Completed data-timeline instants the metadata table lacks (it is stale; readers list).
    pub missing_instants: Vec<String>,
    /// One line per difference.
    pub differences: Vec<String>,
}

impl ValidationReport {
    /// Whether the metadata table exists, misses no instant and matches storage and the data.
    pub fn ok(&self) -> bool {
        self.present && self.missing_instants.is_empty() && self.differences.is_empty()
    }
}

impl Table {
    /// Compares the metadata table with a full listing of storage and with the data.
    pub async fn validate_metadata(&self) -> Result<ValidationReport> {
        // Empty timeline files first: they are damage whether or not there is a metadata table.
        let mut damaged = super::damaged::empty_timeline_files(self).await?;
        damaged.extend(super::damaged::stale_hadoop_checksums(self).await?);
        let Some(mdt) = self.metadata_table().await? else {
            return Ok(ValidationReport { differences: damaged, ..Default::default() });
        };
        damaged.extend(
            super::damaged::empty_timeline_files(&mdt.table)
                .await?
                .into_iter()
                .map(|line| format!("metadata table: {line}")),
        );
        let mut report =
            ValidationReport { present: true, missing_instants: mdt.missing.clone(), differences: damaged };
        let mut listed = BTreeMap::new();
        let committed = crate::log::CommittedLogs::load(self.storage(), self.timeline()).await?;
        for f in data_files(self.storage().list_table().await?) {
            if self.is_committed_file(&f.path, &committed).await? {
                listed.insert(f.path, f.size);
            }
        }
        let listed: BTreeMap<String, Bytes> = listed.into_iter().map(|(p, s)| (p, Bytes(s))).collect();
        // A clean in progress (one whose cleaner died is finished by the next clean) has deleted
        // some of its files already; they leave the index when it completes.
        let cleaning = crate::table::pending::pending_clean_files(self).await?;
        let gone = |path: &str, present: bool| !present && cleaning.contains(path);
        let mut indexed: BTreeMap<String, Bytes> =
            mdt.files().await?.into_iter().map(|f| (f.path, Bytes(f.size))).collect();
        indexed.retain(|p, _| !gone(p, listed.contains_key(p)));
        let d = &mut report.differences;
        compare(d, "files index", &listed, &indexed, |path, stored, actual| {
            format!("{path}: {actual} in storage, {stored} in the files index")
        });
        if !mdt.is_fresh() {
            return Ok(report);
        }
        let (stats, blooms) = (mdt.has(Index::ColumnStats), mdt.has(Index::BloomFilters));
        if stats || blooms {
            let files: Vec<_> =
                listed.iter().map(|(p, s)| crate::storage::FileInfo { path: p.clone(), size: s.0 }).collect();
            let mut actual = super::file_entries(self, &files, &[], &mdt.shards).await?;
            if let Some(entries) = actual.remove(&Index::ColumnStats) {
                let actual = by_key(&entries.to_batch(false)?, "stats")?;
                let stored: BTreeMap<String, String> = mdt
                    .read_index(Index::ColumnStats, Select::All)
                    .await?
                    .iter()
                    .map(|b| by_key(b, "stats"))
                    .collect::<Result<Vec<_>>>()?
                    .into_iter()
                    .flatten()
                    .collect();
                let mut stored = stored;
                stored.retain(|p, _| !gone(p, actual.contains_key(p)));
                compare(d, "column_stats index", &actual, &stored, |path, stored, actual| {
                    format!("{path}: statistics {actual} in the file, {stored} in the column_stats index")
                });
            }
            if let Some(entries) = actual.remove(&Index::BloomFilters) {
                let batch = entries.to_batch(false)?;
                let actual = blooms_by_key(&batch)?;
                let mut stored = BTreeMap::new();
                for b in mdt.read_index(Index::BloomFilters, Select::All).await? {
                    stored.extend(blooms_by_key(&b)?);
                }
                stored.retain(|p, _| !gone(p, actual.contains_key(p)));
                compare(d, "bloom_filters index", &actual, &stored, |path, _, _| {
                    format!("{path}: the bloom filter differs from the file's record keys")
                });
            }
        }
        if mdt.has(Index::RecordIndex) {
            // A shard at a time: the keys held are spilled by shard, as a build spills them.
            let shards = mdt.shards(Index::RecordIndex);
            let held = super::record_index::SpilledKeys::read(self, shards).await?;
            for shard in 0..shards {
                let mut stored = BTreeMap::new();
                for b in mdt.read_shard(Index::RecordIndex, shard, Select::All).await? {
                    stored.extend(locations(&b)?);
                }
                compare_record_index(d, held.held(shard as usize)?, stored);
            }
        }
        Ok(report)
    }

    /// Whether a data file holds anything committed: a base file of a committed instant, a log
    /// file with a block of one. (A pending write's files are in storage, not yet in the index.)
    /// A log file that lost what a completed instant wrote into it is an error naming it.
    pub(super) async fn is_committed_file(&self, path: &str, committed: &crate::log::CommittedLogs) -> Result<bool> {
        let name = path.rsplit('/').next().unwrap_or(path);
        if let Some(base) = BaseFileName::parse(name) {
            return Ok(self.timeline().is_committed(&base.instant));
        }
        // Gone since the listing (a clean of its slice): counted as listed, as it was.
        let Some(data) = self.storage().get_opt(path).await? else { return Ok(true) };
        let blocks = crate::log::checked_blocks(path, &data, committed.get(path))?;
        let instants: Vec<&str> = blocks.iter().filter_map(|b| b.instant()).collect();
        Ok(instants.is_empty() || instants.iter().any(|i| self.timeline().is_committed(i)))
    }
}

/// Adds a line to `out` for every key on one side only, and for every value that differs.
fn compare<V: PartialEq + std::fmt::Display>(
    out: &mut Vec<String>,
    what: &str,
    actual: &BTreeMap<String, V>,
    stored: &BTreeMap<String, V>,
    differs: impl Fn(&str, &V, &V) -> String,
) {
    for (key, value) in actual {
        match stored.get(key) {
            None => out.push(format!("{}: in storage ({value}), not in the {what}", printable(key))),
            Some(s) if s != value => out.push(differs(&printable(key), s, value)),
            Some(_) => {}
        }
    }
    for key in stored.keys().filter(|k| !actual.contains_key(*k)) {
        out.push(format!("{}: in the {what}, not in storage", printable(key)));
    }
}

/// Adds a line to `out` for every key the record index places where the files do not hold it, by
/// the rules a build follows (`record_index::shard_entries`), which writes keep
/// too. A key written in a file group must be in the index, in a group where it is written (any
/// of them: a write without a lookup may have put a copy beside it). In a table ordered by event
/// time, a key held only deleted must be in a group holding it (a later write of it must lose to
/// an event-time delete there, and a later event-time delete must reach it), but in a table with
/// a global index where the key is written in another partition. Otherwise it may be absent.
fn compare_record_index(
    out: &mut Vec<String>,
    held: super::record_index::HeldKeys,
    mut stored: BTreeMap<String, String>,
) {
    let event_time = held.event_time;
    use crate::log::KeyState;
    // Per key and partition: the groups holding it and what their logs did to it last.
    let mut holders: BTreeMap<String, Vec<(String, KeyState)>> = BTreeMap::new();
    for (key, state, slice) in held.by_shard.into_iter().flatten() {
        let (partition, file_id, _) = &held.slices[slice as usize];
        holders.entry(key).or_default().push((format!("file group {partition}/{file_id}"), state));
    }
    let written_somewhere: std::collections::HashSet<String> = holders
        .iter()
        .filter(|(_, groups)| groups.iter().any(|g| g.1 == KeyState::Written))
        .map(|(key, _)| super::entries::record_key_of(key).to_string())
        .collect();
    for (key, groups) in holders {
        let best = groups.iter().map(|g| g.1).min().unwrap_or(KeyState::Deleted);
        let named: Vec<&str> = groups.iter().filter(|g| g.1 == best).map(|g| g.0.as_str()).collect();
        let moved = held.global && written_somewhere.contains(super::entries::record_key_of(&key));
        let required = best == KeyState::Written || (event_time && !moved);
        let at = stored.remove(&key);
        let fits = |at: &str| match best {
            KeyState::Written => named.contains(&at),
            _ => groups.iter().any(|g| g.0 == at),
        };
        let held_as = match best {
            KeyState::Written => named.join(", "),
            KeyState::DeletedByOrder => format!("{} (deleted by an event-time delete)", named.join(", ")),
            KeyState::Deleted => format!("{} (deleted)", named.join(", ")),
        };
        match at {
            None if required => {
                out.push(format!("{}: in storage ({held_as}), not in the record_index", printable(&key)));
            }
            Some(at) if !fits(&at) => {
                out.push(format!("record {}: in {held_as}, the record_index says {at}", printable(&key)));
            }
            _ => {}
        }
    }
    // In a table ordered by event time a deleted key keeps its entry also once a compaction
    // dropped it from its group, and a replaced group counts as holding nothing.
    if !event_time {
        for key in stored.keys() {
            out.push(format!("{}: in the record_index, not in storage", printable(key)));
        }
    }
}

/// A metadata key as a person reads it (`record_index` keys hold a NUL before the partition).
fn printable(key: &str) -> String {
    key.replace(super::KEY_SEPARATOR, " @ ")
}

fn by_key(batch: &arrow::array::RecordBatch, column: &str) -> Result<BTreeMap<String, String>> {
    let (keys, values) = (strings(batch, "key")?, strings(batch, column)?);
    Ok((0..batch.num_rows()).map(|i| (keys.value(i).to_string(), values.value(i).to_string())).collect())
}

/// Bloom filters by path, shown by their size.
fn blooms_by_key(batch: &arrow::array::RecordBatch) -> Result<BTreeMap<String, Bloom>> {
    let (keys, blooms) = (strings(batch, "key")?, binaries(batch, "bloom")?);
    Ok((0..batch.num_rows()).map(|i| (keys.value(i).to_string(), Bloom(blooms.value(i).to_vec()))).collect())
}

/// A file size, shown with its unit.
#[derive(PartialEq)]
struct Bytes(u64);

impl std::fmt::Display for Bytes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} bytes", self.0)
    }
}

#[derive(PartialEq)]
struct Bloom(Vec<u8>);

impl std::fmt::Display for Bloom {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "bloom filter of {} bytes", self.0.len())
    }
}

/// `record_index` records as key → "partition/file id".
fn locations(batch: &arrow::array::RecordBatch) -> Result<HashMap<String, String>> {
    let (keys, partitions, files) = (strings(batch, "key")?, strings(batch, "partition")?, strings(batch, "file")?);
    Ok((0..batch.num_rows())
        .map(|i| (keys.value(i).to_string(), format!("file group {}/{}", partitions.value(i), files.value(i))))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::log::KeyState::{self, *};
    use crate::metadata::entries::record_index_key;
    use crate::metadata::record_index::HeldKeys;

    /// The differences validation finds between keys held in the slices `p/a`, `p/b` and `q/c`
    /// and a record index placing each key in one of them.
    fn differences(held: &[(&str, &str, KeyState, u32)], index: &[(&str, &str, &str)], global: bool) -> Vec<String> {
        differences_in(held, index, global, true)
    }

    /// [`differences`] in a table ordered by event time or by commit time.
    fn differences_in(
        held: &[(&str, &str, KeyState, u32)],
        index: &[(&str, &str, &str)],
        global: bool,
        event_time: bool,
    ) -> Vec<String> {
        let slice = |p: &str, f: &str| (p.to_string(), f.to_string(), "1".to_string());
        let held = HeldKeys {
            slices: vec![slice("p", "a"), slice("p", "b"), slice("q", "c")],
            by_shard: vec![held.iter().map(|&(k, p, state, s)| (record_index_key(k, p), state, s)).collect()],
            global,
            event_time,
        };
        let stored = index.iter().map(|(k, p, f)| (record_index_key(k, p), format!("file group {p}/{f}"))).collect();
        let mut out = Vec::new();
        compare_record_index(&mut out, held, stored);
        out
    }

    #[test]
    fn the_record_index_must_place_written_keys_and_deleted_keys_of_event_time_tables() {
        // A written key: where it is written (any copy).
        let copies = [("1", "p", Written, 0), ("1", "p", Written, 1)];
        assert!(differences(&copies, &[("1", "p", "b")], false).is_empty());
        assert_eq!(differences(&copies, &[], false).len(), 1);
        let deleted_there = [("1", "p", DeletedByOrder, 0), ("1", "p", Written, 1)];
        assert_eq!(differences(&deleted_there, &[("1", "p", "a")], false).len(), 1);
        // An event-time delete's key: in its group (a build from a snapshot lost it).
        let by_order = [("2", "p", DeletedByOrder, 0)];
        assert!(differences(&by_order, &[("2", "p", "a")], false).is_empty());
        let missing = differences(&by_order, &[], false);
        assert_eq!(
            missing,
            ["2 @ p: in storage (file group p/a (deleted by an event-time delete)), not in the record_index"]
        );
        assert_eq!(differences(&by_order, &[("2", "p", "b")], false).len(), 1);
        // ... but where a global index moved the key on.
        let moved = [("2", "p", DeletedByOrder, 0), ("2", "q", Written, 2)];
        assert!(differences(&moved, &[("2", "q", "c")], true).is_empty());
        assert_eq!(differences(&moved, &[("2", "q", "c")], false).len(), 1);
        // A key deleted without an ordering value: in its group too, where the table orders by
        // event time (a later event-time delete must reach it there) ...
        let deleted = [("3", "p", Deleted, 0)];
        assert_eq!(
            differences(&deleted, &[], false),
            ["3 @ p: in storage (file group p/a (deleted)), not in the record_index"]
        );
        assert!(differences(&deleted, &[("3", "p", "a")], false).is_empty());
        assert_eq!(differences(&deleted, &[("3", "p", "b")], false).len(), 1);
        // ... and absent, or in its group, where it orders by commit time.
        assert!(differences_in(&deleted, &[], false, false).is_empty());
        assert!(differences_in(&deleted, &[("3", "p", "a")], false, false).is_empty());
        assert_eq!(differences_in(&deleted, &[("3", "p", "b")], false, false).len(), 1);
        assert_eq!(differences_in(&[], &[("3", "p", "a")], false, false).len(), 1);
    }
}
