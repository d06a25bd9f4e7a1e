//! Compaction of merge-on-read file groups: a plan (`c.compaction.requested`) names the slices to
//! compact; executing it writes one new base file per slice, named with `c`, holding the slice's
//! merged records, and completes `c` as a commit. Writers keep writing meanwhile: a log written after
//! `c` was planned is named with `c` and joins the new slice.

use std::collections::HashMap;

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::format::instant::{Action, State};
use crate::table::Table;
use crate::table::fs_view::FileGroupId;

/// One slice to compact.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CompactionOperation {
    pub partition_path: String,
    pub file_id: String,
    /// The base instant of the slice compacted.
    pub base_instant_time: String,
    /// The base file, relative to the table root (`None`: a log-only slice).
    pub data_file_path: Option<String>,
    pub delta_file_paths: Vec<String>,
}

/// The plan stored in `c.compaction.requested`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CompactionPlan {
    pub operations: Vec<CompactionOperation>,
    pub version: u32,
}

impl CompactionPlan {
    pub fn to_json(&self) -> Result<Vec<u8>> {
        serde_json::to_vec_pretty(self).map_err(Error::invalid_data)
    }

    pub fn from_json(path: &str, bytes: &[u8]) -> Result<Self> {
        serde_json::from_slice(bytes).map_err(|e| {
            Error::unsupported(format!("compaction plan {path} ({e}): plans written by Apache Hudi are Avro"))
        })
    }
}

/// Reads the plan of a compaction instant.
pub async fn read_plan(table: &Table, time: &str) -> Result<CompactionPlan> {
    let instant = crate::format::instant::Instant::new(time, Action::Compaction, State::Requested);
    let path = table.timeline().path_of(&instant);
    CompactionPlan::from_json(&path, &table.storage().get(&path).await?)
}

/// The file groups of every pending compaction, with the compaction's instant: new logs of those
/// groups are named with it.
pub async fn pending_compaction_groups(table: &Table) -> Result<HashMap<FileGroupId, String>> {
    let mut out = HashMap::new();
    let pending: Vec<String> = table
        .timeline()
        .pending()
        .filter(|i| i.action == Action::Compaction)
        .map(|i| i.time.clone())
        .collect();
    for time in pending {
        for op in read_plan(table, &time).await?.operations {
            out.insert((op.partition_path, op.file_id), time.clone());
        }
    }
    Ok(out)
}
