//! The files of rollback, restore and savepoint instants, as Apache Hudi 0.14/0.15 writes and reads
//! them (`TimelineMetadataUtils.serialize*`, each an Avro object container of one record):
//!
//! | file | record |
//! |---|---|
//! | `r.rollback.requested` | `HoodieRollbackPlan` (version 1) |
//! | `r.rollback` | `HoodieRollbackMetadata` (version 1) |
//! | `r.restore.requested` | `HoodieRestorePlan` (version 2) |
//! | `r.restore` | `HoodieRestoreMetadata` (version 1), each rollback's metadata nested |
//! | `t.savepoint` | `HoodieSavepointMetadata` (version 1), file *names* per partition |
//!
//! Paths follow Java: a rollback names each file by its full path (`BaseRollbackHelper` deletes and
//! records the plan's paths), a savepoint by its name (`SavepointActionExecutor` records
//! `getFileName()`). Reading also accepts the JSON earlier oxlake versions wrote.
//!
//! The writer schemas may carry fields of oxlake's own (prefixed `oxlake`): Avro schema resolution
//! skips a writer field the reader does not know, so Java's generated classes read past them.

use std::collections::BTreeMap;
use std::sync::LazyLock;

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::format::avro;

const INSTANT_INFO: &str = r#"{"type":"record","name":"HoodieInstantInfo","fields":[{"name":"commitTime","type":"string"},{"name":"action","type":"string"}]}"#;

/// Writer schema of `HoodieRollbackPlan`, plus `oxlakeWasCompleted` (see [`RollbackPlan`]).
pub static ROLLBACK_PLAN_SCHEMA: LazyLock<String> = LazyLock::new(|| {
    format!(
        concat!(
            r#"{{"type":"record","name":"HoodieRollbackPlan","namespace":"org.apache.hudi.avro.model","fields":["#,
            r#"{{"name":"instantToRollback","type":["null",{info}],"default":null}},"#,
            r#"{{"name":"RollbackRequests","type":["null",{{"type":"array","items":{{"type":"record","name":"HoodieRollbackRequest","fields":["#,
            r#"{{"name":"partitionPath","type":"string"}},"#,
            r#"{{"name":"fileId","type":["null","string"],"default":null}},"#,
            r#"{{"name":"latestBaseInstant","type":["null","string"],"default":null}},"#,
            r#"{{"name":"filesToBeDeleted","type":{{"type":"array","items":"string"}},"default":[]}},"#,
            r#"{{"name":"logBlocksToBeDeleted","type":["null",{{"type":"map","values":"long"}}],"default":null}}]}}}}],"default":null}},"#,
            r#"{{"name":"version","type":["int","null"],"default":1}},"#,
            r#"{{"name":"oxlakeWasCompleted","type":"boolean","default":false}}]}}"#,
        ),
        info = INSTANT_INFO
    )
});

/// The `HoodieRollbackMetadata` record (without a namespace: it is nested in restore metadata).
static ROLLBACK_METADATA_RECORD: LazyLock<String> = LazyLock::new(|| {
    format!(
        concat!(
            r#"{{"type":"record","name":"HoodieRollbackMetadata","fields":["#,
            r#"{{"name":"startRollbackTime","type":"string"}},{{"name":"timeTakenInMillis","type":"long"}},"#,
            r#"{{"name":"totalFilesDeleted","type":"int"}},"#,
            r#"{{"name":"commitsRollback","type":{{"type":"array","items":"string"}}}},"#,
            r#"{{"name":"partitionMetadata","type":{{"type":"map","values":{{"type":"record","name":"HoodieRollbackPartitionMetadata","fields":["#,
            r#"{{"name":"partitionPath","type":"string"}},"#,
            r#"{{"name":"successDeleteFiles","type":{{"type":"array","items":"string"}}}},"#,
            r#"{{"name":"failedDeleteFiles","type":{{"type":"array","items":"string"}}}},"#,
            r#"{{"name":"rollbackLogFiles","type":["null",{{"type":"map","values":"long"}}],"default":null}},"#,
            r#"{{"name":"writtenLogFiles","type":["null",{{"type":"map","values":"long"}}],"default":null}}]}}}}}},"#,
            r#"{{"name":"version","type":["int","null"],"default":1}},"#,
            r#"{{"name":"instantsRollback","type":{{"type":"array","items":{info}}},"default":[]}}]}}"#,
        ),
        info = INSTANT_INFO
    )
});

/// Writer schema of `HoodieRollbackMetadata`.
pub static ROLLBACK_METADATA_SCHEMA: LazyLock<String> = LazyLock::new(|| with_namespace(&ROLLBACK_METADATA_RECORD));

/// Writer schema of `HoodieRestorePlan`.
pub static RESTORE_PLAN_SCHEMA: LazyLock<String> = LazyLock::new(|| {
    format!(
        concat!(
            r#"{{"type":"record","name":"HoodieRestorePlan","namespace":"org.apache.hudi.avro.model","fields":["#,
            r#"{{"name":"instantsToRollback","type":{{"type":"array","items":{info}}},"default":[]}},"#,
            r#"{{"name":"version","type":["int","null"],"default":2}},"#,
            r#"{{"name":"savepointToRestoreTimestamp","type":["null","string"],"default":null}}]}}"#,
        ),
        info = INSTANT_INFO
    )
});

/// Writer schema of `HoodieRestoreMetadata`.
pub static RESTORE_METADATA_SCHEMA: LazyLock<String> = LazyLock::new(|| {
    format!(
        concat!(
            r#"{{"type":"record","name":"HoodieRestoreMetadata","namespace":"org.apache.hudi.avro.model","fields":["#,
            r#"{{"name":"startRestoreTime","type":"string"}},{{"name":"timeTakenInMillis","type":"long"}},"#,
            r#"{{"name":"instantsToRollback","type":{{"type":"array","items":"string"}}}},"#,
            r#"{{"name":"hoodieRestoreMetadata","type":{{"type":"map","values":{{"type":"array","items":["null",{rollback}]}}}}}},"#,
            r#"{{"name":"version","type":["int","null"],"default":1}},"#,
            r#"{{"name":"restoreInstantInfo","type":{{"type":"array","items":"HoodieInstantInfo"}},"default":[]}},"#,
            r#"{{"name":"extraMetadata","type":["null",{{"type":"map","values":"string"}}],"default":null}}]}}"#,
        ),
        rollback = *ROLLBACK_METADATA_RECORD
    )
});

/// Writer schema of `HoodieSavepointMetadata` (in Apache Hudi's `HoodieSavePointMetadata.avsc`).
pub const SAVEPOINT_SCHEMA: &str = concat!(
    r#"{"type":"record","name":"HoodieSavepointMetadata","namespace":"org.apache.hudi.avro.model","fields":["#,
    r#"{"name":"savepointedBy","type":"string"},{"name":"savepointedAt","type":"long"},"#,
    r#"{"name":"comments","type":"string"},"#,
    r#"{"name":"partitionMetadata","type":{"type":"map","values":{"type":"record","name":"HoodieSavepointPartitionMetadata","fields":["#,
    r#"{"name":"partitionPath","type":"string"},{"name":"savepointDataFile","type":{"type":"array","items":"string"}}]}}},"#,
    r#"{"name":"version","type":["int","null"],"default":1}]}"#,
);

/// `BaseRollbackPlanActionExecutor.LATEST_ROLLBACK_PLAN_VERSION`, `TimelineMetadataUtils`'
/// metadata version, `RestorePlanActionExecutor.RESTORE_PLAN_VERSION_2`.
pub const ROLLBACK_PLAN_VERSION: i32 = 1;
/// `HoodieRollbackMetadata`, `HoodieRestoreMetadata` and `HoodieSavepointMetadata` version.
pub const METADATA_VERSION: i32 = 1;
/// `HoodieRestorePlan` version.
pub const RESTORE_PLAN_VERSION: i32 = 2;

fn with_namespace(record: &str) -> String {
    // The record's JSON starts `{"type":"record",...`: the namespace goes in first.
    format!(r#"{{"namespace":"org.apache.hudi.avro.model",{}"#, &record[1..])
}

/// `HoodieInstantInfo`: an instant by time and action.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct InstantInfo {
    /// Instant time.
    pub commit_time: String,
    /// Action name, e.g. `deltacommit`; empty in restore plans of earlier oxlake versions.
    pub action: String,
}

/// `HoodieRollbackRequest`: the files of one file group a rollback deletes.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RollbackRequest {
    /// Partition path of the file group.
    pub partition_path: String,
    /// File id of the file group.
    #[serde(default)]
    pub file_id: Option<String>,
    /// The file group's base instant before the write (the write stat's `prevCommit`); `None` if new.
    #[serde(default)]
    pub latest_base_instant: Option<String>,
    /// Full paths.
    #[serde(default)]
    pub files_to_be_deleted: Vec<String>,
    /// Log files to mark with a rollback block: full path to size in bytes.
    #[serde(default)]
    pub log_blocks_to_be_deleted: Option<BTreeMap<String, i64>>,
}

/// `HoodieRollbackPlan`, and what earlier oxlake versions wrote as JSON (`instantToRollback`, and
/// `wasCompleted`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RollbackPlan {
    /// The instant rolled back.
    pub instant_to_rollback: InstantInfo,
    /// One request per file group the instant wrote to (`RollbackRequests`).
    #[serde(default, rename = "RollbackRequests")]
    pub rollback_requests: Option<Vec<RollbackRequest>>,
    /// Plan version ([`ROLLBACK_PLAN_VERSION`]).
    #[serde(default)]
    pub version: Option<i32>,
    /// oxlake's own: the target had completed (a rollback of a commit rather than of a failed
    /// write), so indexes may hold its keys. Absent (Java's plans, failed writes) means false.
    #[serde(default, alias = "wasCompleted")]
    pub oxlake_was_completed: bool,
}

/// `HoodieRollbackPartitionMetadata`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RollbackPartitionMetadata {
    /// Partition path, relative to the table root.
    pub partition_path: String,
    /// Full paths, as the plan named them.
    #[serde(default)]
    pub success_delete_files: Vec<String>,
    /// Full paths of the files that could not be deleted.
    #[serde(default)]
    pub failed_delete_files: Vec<String>,
    /// Log files a rollback command block was written to, with their sizes.
    #[serde(default)]
    pub rollback_log_files: Option<BTreeMap<String, i64>>,
    /// Log files the rolled back instant wrote, with their sizes (oxlake writes none).
    #[serde(default)]
    pub written_log_files: Option<BTreeMap<String, i64>>,
}

/// `HoodieRollbackMetadata`; reading also takes earlier oxlake JSON (`commitsRollback` and a flat
/// `deletedFiles`, ignored).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RollbackMetadata {
    /// Instant time of the rollback.
    pub start_rollback_time: String,
    /// Time the rollback took, in milliseconds.
    #[serde(default)]
    pub time_taken_in_millis: i64,
    /// Number of files deleted.
    #[serde(default)]
    pub total_files_deleted: i32,
    /// Instant times rolled back.
    pub commits_rollback: Vec<String>,
    /// Per partition path, what the rollback did there.
    #[serde(default)]
    pub partition_metadata: BTreeMap<String, RollbackPartitionMetadata>,
    /// Metadata version ([`METADATA_VERSION`]).
    #[serde(default)]
    pub version: Option<i32>,
    /// The instants rolled back, with their actions.
    #[serde(default)]
    pub instants_rollback: Vec<InstantInfo>,
}

/// `HoodieRestorePlan`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RestorePlan {
    /// Newest first, the order they are rolled back in.
    pub instants_to_rollback: Vec<InstantInfo>,
    /// Plan version ([`RESTORE_PLAN_VERSION`]).
    #[serde(default)]
    pub version: Option<i32>,
    /// Instant time of the savepoint restored to.
    #[serde(default)]
    pub savepoint_to_restore_timestamp: Option<String>,
}

/// The restore plan earlier oxlake versions wrote as JSON (in `.restore.requested` and `.restore`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
struct LegacyRestorePlan {
    savepoint: String,
    instants_to_rollback: Vec<String>,
}

/// `HoodieRestoreMetadata`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RestoreMetadata {
    /// Instant time of the restore.
    pub start_restore_time: String,
    /// Time the restore took, in milliseconds.
    pub time_taken_in_millis: i64,
    /// Instant times rolled back, newest first.
    pub instants_to_rollback: Vec<String>,
    /// Each instant rolled back → the metadata of its rollback.
    pub hoodie_restore_metadata: BTreeMap<String, Vec<RollbackMetadata>>,
    /// Metadata version ([`METADATA_VERSION`]).
    #[serde(default)]
    pub version: Option<i32>,
    /// The instants rolled back, with their actions.
    #[serde(default)]
    pub restore_instant_info: Vec<InstantInfo>,
    /// Free-form key-value pairs (oxlake writes none).
    #[serde(default)]
    pub extra_metadata: Option<BTreeMap<String, String>>,
}

/// `HoodieSavepointPartitionMetadata`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SavepointPartitionMetadata {
    /// Partition path, relative to the table root.
    pub partition_path: String,
    /// File names (base and log files of the snapshot's slices).
    pub savepoint_data_file: Vec<String>,
}

/// `HoodieSavepointMetadata`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SavepointMetadata {
    /// Who created the savepoint (oxlake writes `oxlake`).
    pub savepointed_by: String,
    /// Unix milliseconds.
    pub savepointed_at: i64,
    /// Free-form comment.
    pub comments: String,
    /// Per partition path, the files the savepoint keeps.
    pub partition_metadata: BTreeMap<String, SavepointPartitionMetadata>,
    /// Metadata version ([`METADATA_VERSION`]).
    #[serde(default)]
    pub version: Option<i32>,
}

fn encode<T: Serialize>(schema: &str, record: &T) -> Result<Vec<u8>> {
    let json = serde_json::to_value(record).map_err(Error::invalid_data)?;
    avro::write_container(schema, &[json])
}

/// Reads a timeline record written as Java's Avro or as earlier oxlake JSON.
fn decode<T: serde::de::DeserializeOwned>(path: &str, bytes: &[u8]) -> Result<T> {
    if avro::is_container(bytes) {
        return avro::read_timeline_record(path, bytes);
    }
    serde_json::from_slice(bytes).map_err(|e| {
        Error::corrupt(path, format!("neither an Avro container nor the JSON of earlier oxlake versions: {e}"))
    })
}

impl RollbackPlan {
    /// The Avro container Java writes for this plan.
    pub fn to_avro(&self) -> Result<Vec<u8>> {
        encode(&ROLLBACK_PLAN_SCHEMA, self)
    }

    /// Reads `r.rollback.requested` at `path`.
    pub fn read(path: &str, bytes: &[u8]) -> Result<Self> {
        decode(path, bytes)
    }
}

impl RollbackMetadata {
    /// The Avro container Java writes for this record.
    pub fn to_avro(&self) -> Result<Vec<u8>> {
        encode(&ROLLBACK_METADATA_SCHEMA, self)
    }

    /// Reads a completed `r.rollback` at `path`.
    pub fn read(path: &str, bytes: &[u8]) -> Result<Self> {
        decode(path, bytes)
    }
}

impl RestorePlan {
    /// The Avro container Java writes for this plan.
    pub fn to_avro(&self) -> Result<Vec<u8>> {
        encode(&RESTORE_PLAN_SCHEMA, self)
    }

    /// Reads `r.restore.requested` at `path`: Java's plan, oxlake's, or earlier oxlake JSON (whose
    /// instants carry no action: the caller's timeline knows them).
    pub fn read(path: &str, bytes: &[u8]) -> Result<Self> {
        if avro::is_container(bytes) {
            return avro::read_timeline_record(path, bytes);
        }
        let legacy: LegacyRestorePlan = serde_json::from_slice(bytes).map_err(|e| {
            Error::corrupt(path, format!("neither an Avro container nor the JSON of earlier oxlake versions: {e}"))
        })?;
        Ok(RestorePlan {
            instants_to_rollback: legacy
                .instants_to_rollback
                .into_iter()
                .map(|commit_time| InstantInfo { commit_time, action: String::new() })
                .collect(),
            version: None,
            savepoint_to_restore_timestamp: Some(legacy.savepoint),
        })
    }
}

impl RestoreMetadata {
    /// The Avro container Java writes for this record.
    pub fn to_avro(&self) -> Result<Vec<u8>> {
        encode(&RESTORE_METADATA_SCHEMA, self)
    }

    /// Reads a completed `r.restore` at `path` (Avro only: earlier oxlake versions wrote the plan).
    pub fn read(path: &str, bytes: &[u8]) -> Result<Self> {
        avro::read_timeline_record(path, bytes)
    }
}

impl SavepointMetadata {
    /// The Avro container Java writes for this record.
    pub fn to_avro(&self) -> Result<Vec<u8>> {
        encode(SAVEPOINT_SCHEMA, self)
    }

    /// Reads a completed `t.savepoint` at `path` (Avro only).
    pub fn read(path: &str, bytes: &[u8]) -> Result<Self> {
        avro::read_timeline_record(path, bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(t: &str, a: &str) -> InstantInfo {
        InstantInfo { commit_time: t.into(), action: a.into() }
    }

    fn rollback_metadata() -> RollbackMetadata {
        RollbackMetadata {
            start_rollback_time: "20240105000000000".into(),
            time_taken_in_millis: 7,
            total_files_deleted: 1,
            commits_rollback: vec!["20240104000000000".into()],
            partition_metadata: BTreeMap::from([(
                "city=Z%C3%BCrich".into(),
                RollbackPartitionMetadata {
                    partition_path: "city=Z%C3%BCrich".into(),
                    success_delete_files: vec!["file:/t/city=Z%C3%BCrich/f-0_0-0-1_20240104000000000.parquet".into()],
                    failed_delete_files: vec![],
                    rollback_log_files: Some(BTreeMap::from([(
                        "file:/t/city=Z%C3%BCrich/.g-0_1.log.2_0-0-1".into(),
                        99,
                    )])),
                    written_log_files: Some(BTreeMap::new()),
                },
            )]),
            version: Some(METADATA_VERSION),
            instants_rollback: vec![info("20240104000000000", "deltacommit")],
        }
    }

    #[test]
    fn rollback_plans_round_trip_and_earlier_json_reads() {
        let plan = RollbackPlan {
            instant_to_rollback: info("20240104000000000", "commit"),
            rollback_requests: Some(vec![RollbackRequest {
                partition_path: "p".into(),
                file_id: Some("f-0".into()),
                latest_base_instant: Some("20240104000000000".into()),
                files_to_be_deleted: vec!["s3://b/t/p/f-0_0-0-1_20240104000000000.parquet".into()],
                log_blocks_to_be_deleted: None,
            }]),
            version: Some(ROLLBACK_PLAN_VERSION),
            oxlake_was_completed: true,
        };
        let bytes = plan.to_avro().unwrap();
        assert!(avro::is_container(&bytes));
        assert_eq!(RollbackPlan::read("x", &bytes).unwrap(), plan);
        let legacy = br#"{"instantToRollback":{"commitTime":"1","action":"deltacommit"},"wasCompleted":true}"#;
        let read = RollbackPlan::read("x", legacy).unwrap();
        assert_eq!(read.instant_to_rollback, info("1", "deltacommit"));
        assert!(read.oxlake_was_completed);
        assert!(
            !RollbackPlan::read("x", br#"{"instantToRollback":{"commitTime":"1","action":"commit"}}"#)
                .unwrap()
                .oxlake_was_completed
        );
        assert!(matches!(RollbackPlan::read("x", b"{"), Err(Error::CorruptTable { .. })));
    }

    #[test]
    fn rollback_metadata_round_trips_and_earlier_json_reads() {
        let m = rollback_metadata();
        assert_eq!(RollbackMetadata::read("x", &m.to_avro().unwrap()).unwrap(), m);
        let legacy =
            br#"{"startRollbackTime":"2","commitsRollback":["1"],"totalFilesDeleted":1,"deletedFiles":["p/f"]}"#;
        assert_eq!(RollbackMetadata::read("x", legacy).unwrap().commits_rollback, ["1"]);
    }

    #[test]
    fn restore_records_round_trip_with_nested_rollbacks() {
        let plan = RestorePlan {
            instants_to_rollback: vec![info("3", "commit"), info("2", "deltacommit")],
            version: Some(RESTORE_PLAN_VERSION),
            savepoint_to_restore_timestamp: Some("1".into()),
        };
        assert_eq!(RestorePlan::read("x", &plan.to_avro().unwrap()).unwrap(), plan);
        let legacy = RestorePlan::read("x", br#"{"savepoint":"1","instantsToRollback":["3","2"]}"#).unwrap();
        assert_eq!(legacy.savepoint_to_restore_timestamp.as_deref(), Some("1"));
        assert_eq!(legacy.instants_to_rollback.iter().map(|i| i.commit_time.as_str()).collect::<Vec<_>>(), ["3", "2"]);
        let meta = RestoreMetadata {
            start_restore_time: "9".into(),
            time_taken_in_millis: 3,
            instants_to_rollback: vec!["20240104000000000".into()],
            hoodie_restore_metadata: BTreeMap::from([("20240104000000000".into(), vec![rollback_metadata()])]),
            version: Some(METADATA_VERSION),
            restore_instant_info: vec![info("20240104000000000", "deltacommit")],
            extra_metadata: None,
        };
        assert_eq!(RestoreMetadata::read("x", &meta.to_avro().unwrap()).unwrap(), meta);
    }

    #[test]
    fn savepoints_round_trip() {
        let m = SavepointMetadata {
            savepointed_by: "oxlake".into(),
            savepointed_at: 1_700_000_000_123,
            comments: String::new(),
            partition_metadata: BTreeMap::from([(
                String::new(),
                SavepointPartitionMetadata {
                    partition_path: String::new(),
                    savepoint_data_file: vec!["f-0_0-0-1_1.parquet".into(), ".f-0_1.log.1_0-0-1".into()],
                },
            )]),
            version: Some(METADATA_VERSION),
        };
        assert_eq!(SavepointMetadata::read("x", &m.to_avro().unwrap()).unwrap(), m);
    }
}
