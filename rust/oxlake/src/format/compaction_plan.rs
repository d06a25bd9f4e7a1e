//! The compaction plan stored in `c.compaction.requested` (Apache Hudi's `HoodieCompactionPlan`):
//! which file slices a compaction merges. Written and read here; scheduled and executed by
//! `services/compaction.rs`, consulted by writers (new logs of a compacting group) and the
//! commit's conflict check.

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::format::file_name::planned_file_path;
use crate::format::{avro, plans};

/// One slice to compact.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CompactionOperation {
    /// Partition path of the slice.
    pub partition_path: String,
    /// File id of the file group.
    pub file_id: String,
    /// The base instant of the slice compacted.
    pub base_instant_time: String,
    /// The base file, relative to the table root (`None`: a log-only slice).
    pub data_file_path: Option<String>,
    /// The slice's log files, relative to the table root.
    pub delta_file_paths: Vec<String>,
}

/// The plan stored in `c.compaction.requested`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CompactionPlan {
    /// The slices to compact.
    pub operations: Vec<CompactionOperation>,
    /// `HoodieCompactionPlan.version`.
    pub version: u32,
}

/// `CompactionUtils.LATEST_COMPACTION_METADATA_VERSION`: operations name files by their names.
const PLAN_VERSION: u32 = 2;

impl CompactionPlan {
    /// The `HoodieCompactionPlan` Java reads (version 2: file names, not paths), as an Avro
    /// container; [`CompactionPlan::parse`] reads it back into table-relative paths.
    pub fn to_avro(&self) -> Result<Vec<u8>> {
        let name = |p: &str| p.rsplit('/').next().unwrap_or(p).to_string();
        let operations: Vec<serde_json::Value> = self
            .operations
            .iter()
            .map(|op| {
                serde_json::json!({
                    "baseInstantTime": op.base_instant_time,
                    "deltaFilePaths": op.delta_file_paths.iter().map(|p| name(p)).collect::<Vec<_>>(),
                    "dataFilePath": op.data_file_path.as_deref().map(name),
                    "fileId": op.file_id,
                    "partitionPath": op.partition_path,
                    "metrics": {},
                })
            })
            .collect();
        let plan = serde_json::json!({ "operations": operations, "version": PLAN_VERSION });
        avro::write_container(plans::COMPACTION_PLAN_SCHEMA, &[plan])
    }

    /// Reads a plan as Apache Hudi writes it (an Avro container holding a `HoodieCompactionPlan`,
    /// version 1 with paths or 2 with names), as oxlake writes it (the same), or as earlier oxlake
    /// versions wrote it (JSON with table-relative paths).
    pub fn parse(path: &str, bytes: &[u8]) -> Result<Self> {
        if !avro::is_container(bytes) {
            return serde_json::from_slice(bytes).map_err(|e| Error::corrupt(path, format!("compaction plan: {e}")));
        }
        let plan: JavaCompactionPlan = avro::read_timeline_record(path, bytes)?;
        let operations = plan
            .operations
            .into_iter()
            .map(|op| CompactionOperation {
                data_file_path: op.data_file_path.map(|f| planned_file_path(&op.partition_path, &f)),
                delta_file_paths: op
                    .delta_file_paths
                    .iter()
                    .map(|f| planned_file_path(&op.partition_path, f))
                    .collect(),
                partition_path: op.partition_path,
                file_id: op.file_id,
                base_instant_time: op.base_instant_time,
            })
            .collect();
        Ok(CompactionPlan { operations, version: plan.version.unwrap_or(1) })
    }
}

/// `HoodieCompactionPlan`, the Avro record of Apache Hudi's compaction plans (the fields oxlake uses).
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct JavaCompactionPlan {
    #[serde(default)]
    operations: Vec<JavaCompactionOperation>,
    version: Option<u32>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct JavaCompactionOperation {
    base_instant_time: String,
    #[serde(default)]
    delta_file_paths: Vec<String>,
    data_file_path: Option<String>,
    file_id: String,
    #[serde(default)]
    partition_path: String,
}
