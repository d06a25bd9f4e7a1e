//! The archived timeline of timeline layout 2 (table versions 8 and 9), as Apache Hudi 1.x writes
//! and reads it (`LSMTimelineWriter`, `LSMTimeline`, `ArchivedTimelineV2`), under
//! `.hoodie/timeline/history/`:
//! - data files `<min>_<max>_<level>.parquet`: one row per archived instant, the columns of
//!   `HoodieLSMTimelineInstant` (`instantTime`, `completionTime`, `action`: the completed action,
//!   `metadata`: the bytes of the completed file, `plan`: the bytes of a service's plan,
//!   `version`: 1); oxlake writes level 0 only (readers read every level);
//! - manifests `manifest_<n>`: JSON `{"files":[{"fileName","fileLen"}]}`, the files a snapshot
//!   of the history holds (a file no manifest lists is not read);
//! - `_version_`: the latest manifest's number, as decimal text without a newline (a reader
//!   that cannot read it takes the greatest manifest listed).

use std::sync::Arc;

use arrow::array::{Array, BinaryArray, Int32Array, RecordBatch, StringArray};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use bytes::Bytes;
use parquet::arrow::ArrowWriter;
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use parquet::basic::{Compression, GzipLevel};
use parquet::file::properties::WriterProperties;
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// The version file of the history folder.
pub const VERSION_FILE: &str = "_version_";

/// One archived instant (a row of `HoodieLSMTimelineInstant`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LsmInstant {
    /// The requested time.
    pub instant_time: String,
    /// The completion time.
    pub completion_time: String,
    /// The completed action (`commit` for a compaction, `replacecommit` for a clustering).
    pub action: String,
    /// The completed file's bytes; `None` when it was empty.
    pub metadata: Option<Bytes>,
    /// A service's plan (clean, compaction, clustering), else `None`.
    pub plan: Option<Bytes>,
}

fn schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("instantTime", DataType::Utf8, true),
        Field::new("completionTime", DataType::Utf8, true),
        Field::new("action", DataType::Utf8, true),
        Field::new("metadata", DataType::Binary, true),
        Field::new("plan", DataType::Binary, true),
        Field::new("version", DataType::Int32, false),
    ]))
}

/// The name of a data file of instants between `min` and `max` at `level`.
pub fn file_name(min: &str, max: &str, level: u32) -> String {
    format!("{min}_{max}_{level}.parquet")
}

/// Whether `name` is a data file name Apache Hudi reads (`^(\d+)_(\d+)_(\d)\.parquet`).
pub fn is_file_name(name: &str) -> bool {
    let Some(stem) = name.strip_suffix(".parquet") else { return false };
    let parts: Vec<&str> = stem.split('_').collect();
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    parts.len() == 3 && digits(parts[0]) && digits(parts[1]) && parts[2].len() == 1 && digits(parts[2])
}

/// The Parquet bytes of a data file holding `rows` (gzip, as Apache Hudi's default codec).
pub fn write_file(rows: &[LsmInstant]) -> Result<Bytes> {
    let strings = |f: fn(&LsmInstant) -> &str| StringArray::from_iter_values(rows.iter().map(f));
    let binaries =
        |f: fn(&LsmInstant) -> Option<&Bytes>| BinaryArray::from_iter(rows.iter().map(|r| f(r).map(|b| b.as_ref())));
    let batch = RecordBatch::try_new(
        schema(),
        vec![
            Arc::new(strings(|r| &r.instant_time)),
            Arc::new(strings(|r| &r.completion_time)),
            Arc::new(strings(|r| &r.action)),
            Arc::new(binaries(|r| r.metadata.as_ref())),
            Arc::new(binaries(|r| r.plan.as_ref())),
            Arc::new(Int32Array::from(vec![1; rows.len()])),
        ],
    )?;
    let props = WriterProperties::builder().set_compression(Compression::GZIP(GzipLevel::default())).build();
    let mut writer = ArrowWriter::try_new(Vec::new(), batch.schema(), Some(props))?;
    writer.write(&batch)?;
    Ok(Bytes::from(writer.into_inner()?))
}

/// The rows of a data file; a row without a time, completion time or action (Java's reader
/// needs all three) is a `CorruptTable` error naming the file.
pub fn read_file(path: &str, data: Bytes) -> Result<Vec<LsmInstant>> {
    let corrupt = |e: &dyn std::fmt::Display| Error::corrupt(path, format!("archived timeline file: {e}"));
    let reader =
        ParquetRecordBatchReaderBuilder::try_new(data).map_err(|e| corrupt(&e))?.build().map_err(|e| corrupt(&e))?;
    let mut out = Vec::new();
    for batch in reader {
        let batch = batch.map_err(|e| corrupt(&e))?;
        let column = |name: &str| batch.column_by_name(name).ok_or_else(|| corrupt(&format!("no column `{name}`")));
        let string = |name: &str| -> Result<StringArray> {
            column(name)?
                .as_any()
                .downcast_ref::<StringArray>()
                .cloned()
                .ok_or_else(|| corrupt(&format!("`{name}` is not a string")))
        };
        let binary = |name: &str| -> Result<Option<BinaryArray>> {
            match batch.column_by_name(name) {
                None => Ok(None),
                Some(c) => c
                    .as_any()
                    .downcast_ref::<BinaryArray>()
                    .cloned()
                    .map(Some)
                    .ok_or_else(|| corrupt(&format!("`{name}` is not binary"))),
            }
        };
        let (times, completions, actions) = (string("instantTime")?, string("completionTime")?, string("action")?);
        let (metadata, plan) = (binary("metadata")?, binary("plan")?);
        let bytes_at = |a: &Option<BinaryArray>, i: usize| {
            a.as_ref().filter(|a| a.is_valid(i)).map(|a| Bytes::copy_from_slice(a.value(i)))
        };
        for i in 0..batch.num_rows() {
            if !times.is_valid(i) || !completions.is_valid(i) || !actions.is_valid(i) {
                return Err(corrupt(&format!("row {i} lacks its time, completion time or action")));
            }
            out.push(LsmInstant {
                instant_time: times.value(i).to_string(),
                completion_time: completions.value(i).to_string(),
                action: actions.value(i).to_string(),
                metadata: bytes_at(&metadata, i),
                plan: bytes_at(&plan, i),
            });
        }
    }
    Ok(out)
}

/// A manifest: the data files of one version of the history.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Manifest {
    /// The files, in the order they were added.
    #[serde(default)]
    pub files: Vec<ManifestEntry>,
}

/// One file of a [`Manifest`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ManifestEntry {
    /// The data file's name.
    pub file_name: String,
    /// Its length in bytes.
    pub file_len: i64,
}

impl Manifest {
    /// Parses a manifest. Empty text is damage, not an empty manifest: Java writes a manifest
    /// only with the files of an archival (read as empty, it would drop the archived history).
    pub fn parse(path: &str, bytes: &[u8]) -> Result<Self> {
        if bytes.iter().all(u8::is_ascii_whitespace) {
            return Err(Error::corrupt(path, "archived timeline manifest: empty (a manifest names at least one file)"));
        }
        serde_json::from_slice(bytes).map_err(|e| Error::corrupt(path, format!("archived timeline manifest: {e}")))
    }

    /// The pretty-printed JSON Java writes.
    pub fn to_json(&self) -> Result<Vec<u8>> {
        serde_json::to_vec_pretty(self).map_err(|e| Error::invalid_data(format!("manifest: {e}")))
    }
}

/// The name of manifest version `n`.
pub fn manifest_name(n: u32) -> String {
    format!("manifest_{n}")
}

/// The version of a manifest file name (`^manifest_(\d+)$`).
pub fn manifest_version(name: &str) -> Option<u32> {
    let n = name.strip_prefix("manifest_")?;
    (!n.is_empty() && n.bytes().all(|b| b.is_ascii_digit())).then(|| n.parse().ok()).flatten()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_round_trip_and_names_follow_java() {
        let rows = vec![LsmInstant {
            instant_time: "20260101000000000".into(),
            completion_time: "20260101000000100".into(),
            action: "commit".into(),
            metadata: Some(Bytes::from_static(b"Obj\x01")),
            plan: None,
        }];
        assert_eq!(read_file("f", write_file(&rows).unwrap()).unwrap(), rows);
        assert!(is_file_name(&file_name("20260101000000000", "20260102000000000", 0)));
        assert!(!is_file_name("20260101000000000_20260102000000000_10.parquet"));
        assert_eq!(manifest_version("manifest_12"), Some(12));
        assert_eq!(manifest_version("manifest_"), None);
        let m = Manifest { files: vec![ManifestEntry { file_name: "a_b_0.parquet".into(), file_len: 3 }] };
        let json = String::from_utf8(m.to_json().unwrap()).unwrap();
        assert!(json.contains("\"fileName\"") && json.contains("\"fileLen\""), "{json}");
        assert_eq!(Manifest::parse("m", json.as_bytes()).unwrap(), m);
        assert!(matches!(Manifest::parse("m", b""), Err(Error::CorruptTable { .. })));
    }
}
