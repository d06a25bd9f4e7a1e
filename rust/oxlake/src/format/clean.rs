//! The files of a clean instant, as Apache Hudi 0.14/0.15 writes and reads them: `.clean.requested`
//! and `.clean.inflight` hold a `HoodieCleanerPlan`, `.clean` a `HoodieCleanMetadata`, each an Avro
//! object container (`TimelineMetadataUtils.serializeCleanerPlan` / `serializeCleanMetadata`).
//! Reading also accepts the JSON plan earlier oxlake versions wrote (`{"policy",
//! "earliestInstantToRetain", "filesToDelete"}`, in the requested and the completed file alike).
//!
//! Field values follow Java: the plan names each file by its full path (`CleanPlanner` puts
//! `FileSlice` paths in `HoodieCleanFileInfo.filePath`), the metadata by its name
//! (`CleanActionExecutor` records `Path.getName()` in `deletePathPatterns` and
//! `successDeleteFiles`); policies by `HoodieCleaningPolicy` names; version 2 for both.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::format::avro;

/// Writer schema of `HoodieCleanerPlan` (Apache Hudi 0.14, `hudi-common/src/main/avro`).
pub const PLAN_SCHEMA: &str = concat!(
    r#"{"type":"record","name":"HoodieCleanerPlan","namespace":"org.apache.hudi.avro.model","fields":["#,
    r#"{"name":"earliestInstantToRetain","type":["null",{"type":"record","name":"HoodieActionInstant","fields":["#,
    r#"{"name":"timestamp","type":"string"},{"name":"action","type":"string"},{"name":"state","type":"string"}]}],"#,
    r#""default":null},"#,
    r#"{"name":"lastCompletedCommitTimestamp","type":"string","default":""},"#,
    r#"{"name":"policy","type":"string"},"#,
    r#"{"name":"filesToBeDeletedPerPartition","type":["null",{"type":"map","values":{"type":"array","items":"string"}}],"#,
    r#""default":null},"#,
    r#"{"name":"version","type":["int","null"],"default":1},"#,
    r#"{"name":"filePathsToBeDeletedPerPartition","type":["null",{"type":"map","values":{"type":"array","items":"#,
    r#"{"type":"record","name":"HoodieCleanFileInfo","fields":[{"name":"filePath","type":["null","string"],"default":null},"#,
    r#"{"name":"isBootstrapBaseFile","type":["null","boolean"],"default":null}]}}}],"default":null},"#,
    r#"{"name":"partitionsToBeDeleted","type":["null",{"type":"array","items":"string"}],"default":null}]}"#,
);

/// Writer schema of `HoodieCleanMetadata` with `HoodieCleanPartitionMetadata` (Apache Hudi 0.14).
pub const METADATA_SCHEMA: &str = concat!(
    r#"{"type":"record","name":"HoodieCleanMetadata","namespace":"org.apache.hudi.avro.model","fields":["#,
    r#"{"name":"startCleanTime","type":"string"},{"name":"timeTakenInMillis","type":"long"},"#,
    r#"{"name":"totalFilesDeleted","type":"int"},{"name":"earliestCommitToRetain","type":"string"},"#,
    r#"{"name":"lastCompletedCommitTimestamp","type":"string","default":""},"#,
    r#"{"name":"partitionMetadata","type":{"type":"map","values":{"type":"record","name":"HoodieCleanPartitionMetadata","#,
    r#""fields":[{"name":"partitionPath","type":"string"},{"name":"policy","type":"string"},"#,
    r#"{"name":"deletePathPatterns","type":{"type":"array","items":"string"}},"#,
    r#"{"name":"successDeleteFiles","type":{"type":"array","items":"string"}},"#,
    r#"{"name":"failedDeleteFiles","type":{"type":"array","items":"string"}},"#,
    r#"{"name":"isPartitionDeleted","type":["null","boolean"],"default":null}]}}},"#,
    r#"{"name":"version","type":["int","null"],"default":1},"#,
    r#"{"name":"bootstrapPartitionMetadata","type":["null",{"type":"map","values":"HoodieCleanPartitionMetadata"}],"#,
    r#""default":null}]}"#,
);

/// `CleanPlanner.LATEST_CLEAN_PLAN_VERSION` / `CleanerUtils.LATEST_CLEAN_METADATA_VERSION`.
pub const VERSION: i32 = 2;

/// `HoodieActionInstant`: the earliest instant a clean retains (`state` is `HoodieInstant.State`'s
/// name, `COMPLETED`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ActionInstant {
    /// Instant time.
    pub timestamp: String,
    /// Action name, e.g. `commit`.
    pub action: String,
    /// State name, e.g. `COMPLETED`.
    pub state: String,
}

/// `HoodieCleanFileInfo`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CleanFileInfo {
    /// Full path of the file to delete (scheme and table root included).
    #[serde(default)]
    pub file_path: Option<String>,
    /// Whether the file is a bootstrap base file, outside the table (unsupported).
    #[serde(default)]
    pub is_bootstrap_base_file: Option<bool>,
}

/// `HoodieCleanerPlan`, as the Avro record reads into JSON (null fields absent).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CleanerPlan {
    /// The earliest instant the clean retains, if its policy sets one.
    #[serde(default)]
    pub earliest_instant_to_retain: Option<ActionInstant>,
    /// Instant time of the last completed commit when the clean was planned.
    #[serde(default)]
    pub last_completed_commit_timestamp: String,
    /// `HoodieCleaningPolicy` name, e.g. `KEEP_LATEST_COMMITS`.
    pub policy: String,
    /// Version 1: file names per partition (deprecated, Java writes an empty map).
    #[serde(default)]
    pub files_to_be_deleted_per_partition: Option<BTreeMap<String, Vec<String>>>,
    /// Plan version: 1 names files in `filesToBeDeletedPerPartition`, 2 in `filePathsToBeDeletedPerPartition`.
    #[serde(default)]
    pub version: Option<i32>,
    /// Version 2: the files to delete per partition path.
    #[serde(default)]
    pub file_paths_to_be_deleted_per_partition: Option<BTreeMap<String, Vec<CleanFileInfo>>>,
    /// Partition paths deleted as a whole (oxlake writes none).
    #[serde(default)]
    pub partitions_to_be_deleted: Option<Vec<String>>,
}

/// `HoodieCleanPartitionMetadata`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CleanPartitionMetadata {
    /// Partition path, relative to the table root.
    pub partition_path: String,
    /// `HoodieCleaningPolicy` name of the clean.
    pub policy: String,
    /// File names the clean set out to delete.
    #[serde(default)]
    pub delete_path_patterns: Vec<String>,
    /// File names deleted.
    #[serde(default)]
    pub success_delete_files: Vec<String>,
    /// File names that could not be deleted.
    #[serde(default)]
    pub failed_delete_files: Vec<String>,
    /// Whether the whole partition was deleted.
    #[serde(default)]
    pub is_partition_deleted: Option<bool>,
}

/// `HoodieCleanMetadata`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CleanMetadata {
    /// Instant time of the clean.
    pub start_clean_time: String,
    /// Time the clean took, in milliseconds.
    pub time_taken_in_millis: i64,
    /// Number of files deleted.
    pub total_files_deleted: i32,
    /// Instant time of the earliest commit retained; empty if none.
    #[serde(default)]
    pub earliest_commit_to_retain: String,
    /// Instant time of the last completed commit when the clean was planned.
    #[serde(default)]
    pub last_completed_commit_timestamp: String,
    /// Per partition path, what was deleted there.
    #[serde(default)]
    pub partition_metadata: BTreeMap<String, CleanPartitionMetadata>,
    /// Metadata version ([`VERSION`]).
    #[serde(default)]
    pub version: Option<i32>,
    /// Per partition path, the bootstrap base files deleted (oxlake writes none).
    #[serde(default)]
    pub bootstrap_partition_metadata: Option<BTreeMap<String, CleanPartitionMetadata>>,
}

/// The plan (and record) earlier oxlake versions wrote as JSON: table-relative paths, the
/// policy's oxlake name (`keep_latest_commits`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LegacyPlan {
    /// oxlake's lower-case policy name, e.g. `keep_latest_commits`.
    pub policy: String,
    /// Instant time of the earliest instant retained, if any.
    pub earliest_instant_to_retain: Option<String>,
    /// Table-relative paths of the files to delete.
    pub files_to_delete: Vec<String>,
}

/// What a clean file holds, whichever way it was written.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Stored<T> {
    /// An Avro container, as Java and current oxlake versions write.
    Avro(T),
    /// The JSON plan of earlier oxlake versions.
    Legacy(LegacyPlan),
}

fn decode<T: serde::de::DeserializeOwned>(path: &str, bytes: &[u8]) -> Result<Stored<T>> {
    if avro::is_container(bytes) {
        return avro::read_timeline_record(path, bytes).map(Stored::Avro);
    }
    serde_json::from_slice(bytes).map(Stored::Legacy).map_err(|e| {
        Error::corrupt(path, format!("neither an Avro container nor the JSON plan of earlier oxlake versions: {e}"))
    })
}

/// Reads `.clean.requested` / `.clean.inflight` at `path`.
pub fn read_plan(path: &str, bytes: &[u8]) -> Result<Stored<CleanerPlan>> {
    decode(path, bytes)
}

/// Reads a completed `.clean` at `path` (oxlake's JSON: the plan it executed).
pub fn read_metadata(path: &str, bytes: &[u8]) -> Result<Stored<CleanMetadata>> {
    decode(path, bytes)
}

fn encode<T: Serialize>(schema: &str, record: &T) -> Result<Vec<u8>> {
    let json = serde_json::to_value(record).map_err(Error::invalid_data)?;
    avro::write_container(schema, &[json])
}

impl CleanerPlan {
    /// The Avro container Java writes for this plan.
    pub fn to_avro(&self) -> Result<Vec<u8>> {
        encode(PLAN_SCHEMA, self)
    }

    /// The table-relative path of every file the plan deletes: partition path and file name
    /// (Java writes full paths, whose scheme and root may differ from the URI oxlake opened the
    /// table with). A version 1 plan names files per partition. Bootstrap base files live outside
    /// the table: unsupported.
    pub fn files(&self, path: &str) -> Result<Vec<String>> {
        let mut out = Vec::new();
        match &self.file_paths_to_be_deleted_per_partition {
            Some(m) if !m.is_empty() || self.files_to_be_deleted_per_partition.is_none() => {
                for (partition, infos) in m {
                    for info in infos {
                        let Some(file) = &info.file_path else {
                            return Err(Error::corrupt(
                                path,
                                format!("a file of partition `{partition}` without a path"),
                            ));
                        };
                        if info.is_bootstrap_base_file == Some(true) {
                            return Err(Error::unsupported(format!("cleaning bootstrap base file {file} ({path})")));
                        }
                        out.push(join(partition, file_name(file)));
                    }
                }
            }
            _ => {
                for (partition, names) in self.files_to_be_deleted_per_partition.iter().flatten() {
                    out.extend(names.iter().map(|n| join(partition, file_name(n))));
                }
            }
        }
        out.sort();
        out.dedup();
        Ok(out)
    }
}

impl CleanMetadata {
    /// The Avro container Java writes for this record.
    pub fn to_avro(&self) -> Result<Vec<u8>> {
        encode(METADATA_SCHEMA, self)
    }

    /// The table-relative path of every file the clean set out to delete.
    pub fn files(&self) -> Vec<String> {
        let mut out: Vec<String> = self
            .partition_metadata
            .iter()
            .flat_map(|(partition, m)| {
                m.delete_path_patterns
                    .iter()
                    .chain(&m.success_delete_files)
                    .chain(&m.failed_delete_files)
                    .map(move |f| join(partition, file_name(f)))
            })
            .collect();
        out.sort();
        out.dedup();
        out
    }
}

/// The last segment of a path or URI.
pub fn file_name(path: &str) -> &str {
    path.rsplit('/').next().unwrap_or(path)
}

/// The partition of a table-relative file path (`""` at the root).
pub fn partition_of(rel: &str) -> &str {
    rel.rsplit_once('/').map_or("", |(p, _)| p)
}

fn join(partition: &str, name: &str) -> String {
    if partition.is_empty() { name.to_string() } else { format!("{partition}/{name}") }
}

/// Java's `HoodieCleaningPolicy` name of a policy oxlake wrote in lower case.
pub fn java_policy(name: &str) -> String {
    name.to_ascii_uppercase()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan() -> CleanerPlan {
        let info = |p: &str| CleanFileInfo { file_path: Some(p.into()), is_bootstrap_base_file: Some(false) };
        CleanerPlan {
            earliest_instant_to_retain: Some(ActionInstant {
                timestamp: "20240101000000000".into(),
                action: "commit".into(),
                state: "COMPLETED".into(),
            }),
            last_completed_commit_timestamp: "20240102000000000".into(),
            policy: "KEEP_LATEST_COMMITS".into(),
            files_to_be_deleted_per_partition: Some(BTreeMap::new()),
            version: Some(VERSION),
            file_paths_to_be_deleted_per_partition: Some(BTreeMap::from([
                ("city=sf".into(), vec![info("s3a://b/t/city=sf/f1-0_0-1-2_20231231000000000.parquet")]),
                ("".into(), vec![info("file:/tmp/t/.f2-0_20231231000000000.log.1_0-1-2")]),
            ])),
            partitions_to_be_deleted: Some(vec![]),
        }
    }

    #[test]
    fn plans_round_trip_through_avro() {
        let p = plan();
        let bytes = p.to_avro().unwrap();
        assert!(avro::is_container(&bytes));
        assert_eq!(read_plan("x", &bytes).unwrap(), Stored::Avro(p.clone()));
        assert_eq!(
            p.files("x").unwrap(),
            [".f2-0_20231231000000000.log.1_0-1-2", "city=sf/f1-0_0-1-2_20231231000000000.parquet"]
        );
    }

    #[test]
    fn version_one_plans_name_files_per_partition() {
        let p = CleanerPlan {
            policy: "KEEP_LATEST_FILE_VERSIONS".into(),
            files_to_be_deleted_per_partition: Some(BTreeMap::from([("a/b".into(), vec!["f.parquet".into()])])),
            version: Some(1),
            ..Default::default()
        };
        let back = match read_plan("x", &p.to_avro().unwrap()).unwrap() {
            Stored::Avro(p) => p,
            other => panic!("{other:?}"),
        };
        assert_eq!(back.files("x").unwrap(), ["a/b/f.parquet"]);
    }

    #[test]
    fn metadata_round_trips_and_names_its_files() {
        let m = CleanMetadata {
            start_clean_time: "20240103000000000".into(),
            time_taken_in_millis: 12,
            total_files_deleted: 1,
            earliest_commit_to_retain: String::new(),
            last_completed_commit_timestamp: "20240102000000000".into(),
            partition_metadata: BTreeMap::from([(
                "p".into(),
                CleanPartitionMetadata {
                    partition_path: "p".into(),
                    policy: "KEEP_LATEST_FILE_VERSIONS".into(),
                    delete_path_patterns: vec!["f.parquet".into()],
                    success_delete_files: vec!["f.parquet".into()],
                    failed_delete_files: vec![],
                    is_partition_deleted: Some(false),
                },
            )]),
            version: Some(VERSION),
            bootstrap_partition_metadata: Some(BTreeMap::new()),
        };
        let back = read_metadata("x", &m.to_avro().unwrap()).unwrap();
        assert_eq!(back, Stored::Avro(m.clone()));
        assert_eq!(m.files(), ["p/f.parquet"]);
    }

    #[test]
    fn legacy_json_and_garbage() {
        let legacy =
            br#"{"policy":"keep_latest_commits","earliestInstantToRetain":"2024","filesToDelete":["p/f.parquet"]}"#;
        match read_plan("x", legacy).unwrap() {
            Stored::Legacy(p) => assert_eq!(p.files_to_delete, ["p/f.parquet"]),
            other => panic!("{other:?}"),
        }
        assert!(matches!(read_plan("x", b"Obj\x01garbage"), Err(Error::CorruptTable { .. })));
        assert!(matches!(read_metadata("x", b"{"), Err(Error::CorruptTable { .. })));
    }
}
