//! What a completing instant changed, as the commit protocol hands it to the table's
//! [`CommitHook`](super::CommitHook): files added and deleted, the record keys it moved, and
//! the file-level index entries its writers computed. These describe a write; the metadata table
//! is what records them.

use std::collections::BTreeMap;

use arrow::array::StringArray;
use serde::{Deserialize, Serialize};

use crate::storage::FileInfo;
use crate::table::fs_view::FileGroupId;

/// Where the record index learns which keys an instant moved.
#[derive(Debug)]
pub enum KeySource<'a> {
    /// The instant moved no key (compaction, clean).
    Unchanged,
    /// The writer says which.
    Reported(&'a KeyChanges),
    /// A clustering or an insert overwrite: every key of the replaced groups left them, every
    /// key of the new base files is there now (read from the files).
    Replaced(Vec<FileGroupId>),
    /// A rollback of the instant `target`, which had completed or not.
    RolledBack {
        /// The instant rolled back.
        target: &'a str,
        /// Whether it had completed (a deliberate rollback) or was a failed write.
        was_completed: bool,
    },
}

/// What an instant of the data table changed.
#[derive(Debug)]
pub struct Change<'a> {
    /// Data files the instant wrote (paths relative to the table root, sizes).
    pub added: &'a [FileInfo],
    /// Data files it deleted (a clean, a rollback), relative to the table root.
    pub deleted: &'a [String],
    /// Where the record index learns which keys it moved.
    pub keys: KeySource<'a>,
    /// Entries of added files that their writers computed (the others are read back).
    pub entries: &'a [(String, FileEntry)],
}

/// The record keys a write put into file groups and the ones it deleted.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct KeyChanges {
    /// Keys written (inserted or updated) into a file group: partition, file id, keys.
    pub written: Vec<(String, String, StringArray)>,
    /// Keys deleted from a partition.
    pub deleted: Vec<(String, StringArray)>,
    /// Keys deleted by deletes carrying an ordering value, or by any delete of a merge-on-read
    /// table ordered by event time, by partition: the record index keeps their entries (such a
    /// delete may lose to the stored record, and a later delete of the key must reach its
    /// group), but a distributed write's check that no two tasks decided about one key sees them.
    pub ordered_deletes: Vec<(String, StringArray)>,
    /// Partitions the write put keys into without listing them here (a streamed write larger
    /// than memory keeps none): its conflict checks read them back from its own files there.
    /// Only for tables without a record index, which needs every key.
    pub unlisted: std::collections::BTreeSet<String>,
}

/// [`KeyChanges`] as it travels between processes (a distributed write's tasks report theirs).
#[derive(Serialize, Deserialize)]
struct KeyChangesText {
    written: Vec<(String, String, Vec<String>)>,
    deleted: Vec<(String, Vec<String>)>,
    #[serde(default)]
    ordered_deletes: Vec<(String, Vec<String>)>,
    #[serde(default)]
    unlisted: Vec<String>,
}

fn texts(a: &StringArray) -> Vec<String> {
    a.iter().map(|k| k.unwrap_or_default().to_string()).collect()
}

impl Serialize for KeyChanges {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        KeyChangesText {
            written: self.written.iter().map(|(p, f, k)| (p.clone(), f.clone(), texts(k))).collect(),
            deleted: self.deleted.iter().map(|(p, k)| (p.clone(), texts(k))).collect(),
            ordered_deletes: self.ordered_deletes.iter().map(|(p, k)| (p.clone(), texts(k))).collect(),
            unlisted: self.unlisted.iter().cloned().collect(),
        }
        .serialize(s)
    }
}

impl<'de> Deserialize<'de> for KeyChanges {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        let t = KeyChangesText::deserialize(d)?;
        Ok(KeyChanges {
            written: t.written.into_iter().map(|(p, f, k)| (p, f, StringArray::from(k))).collect(),
            deleted: t.deleted.into_iter().map(|(p, k)| (p, StringArray::from(k))).collect(),
            ordered_deletes: t.ordered_deletes.into_iter().map(|(p, k)| (p, StringArray::from(k))).collect(),
            unlisted: t.unlisted.into_iter().collect(),
        })
    }
}

impl KeyChanges {
    /// Adds the changes of another task of the same write.
    pub fn extend(&mut self, other: KeyChanges) {
        self.written.extend(other.written);
        self.deleted.extend(other.deleted);
        self.ordered_deletes.extend(other.ordered_deletes);
        self.unlisted.extend(other.unlisted);
    }

    /// These changes without their keys (kept only by the partitions written): what a write too
    /// large to hold its keys commits with when the table keeps no record index.
    pub fn unlist(&mut self) {
        let written = std::mem::take(&mut self.written).into_iter().map(|(p, _, k)| (p, k));
        let deleted = std::mem::take(&mut self.deleted).into_iter().chain(std::mem::take(&mut self.ordered_deletes));
        let moved = written.chain(deleted).filter(|(_, k)| !arrow::array::Array::is_empty(k));
        self.unlisted.extend(moved.map(|(p, _)| p));
    }

    /// Whether no key moved.
    pub fn is_empty(&self) -> bool {
        self.written.is_empty() && self.deleted.is_empty() && self.unlisted.is_empty()
    }
}

/// The statistics of one data file.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileStats {
    /// Records the file holds.
    pub rows: u64,
    /// Per column: bounds (as text, cast back to the column's type for pruning) and nulls.
    /// Columns of other types, or without statistics, are absent.
    pub columns: BTreeMap<String, ColumnStats>,
}

/// The statistics of one column of one data file.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ColumnStats {
    /// The least value, as text (`None`: no non-null value, or no statistics).
    pub min: Option<String>,
    /// The greatest value, as text.
    pub max: Option<String>,
    /// Null values.
    pub nulls: u64,
    /// The Arrow type the bounds were taken in (`Int32`, `Utf8`...): a column promoted since
    /// (an int to a string) orders its old bounds otherwise. Absent in statistics written before
    /// oxlake recorded it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
}

/// What the indexes hold of one data file (it travels from a distributed write's tasks to the
/// commit as JSON, the bitset as base64).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct FileEntry {
    /// For `column_stats` (`None` when the table keeps none).
    pub stats: Option<FileStats>,
    /// The bloom filter's bitset.
    #[serde(with = "base64_bytes")]
    pub bloom: Option<Vec<u8>>,
}

/// Optional bytes as a base64 string in JSON.
mod base64_bytes {
    use base64::Engine as _;
    use base64::engine::general_purpose::STANDARD;
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(bytes: &Option<Vec<u8>>, s: S) -> Result<S::Ok, S::Error> {
        match bytes {
            Some(b) => s.serialize_some(&STANDARD.encode(b)),
            None => s.serialize_none(),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Vec<u8>>, D::Error> {
        let text: Option<String> = Option::deserialize(d)?;
        text.map(|t| STANDARD.decode(t).map_err(serde::de::Error::custom)).transpose()
    }
}
