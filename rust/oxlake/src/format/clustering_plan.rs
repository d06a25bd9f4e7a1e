//! The clustering plan stored in `t.replacecommit.requested` (Apache Hudi's
//! `HoodieRequestedReplaceMetadata` holding a `HoodieClusteringPlan`): which file slices a
//! clustering rewrites. Scheduled and executed by `services/clustering.rs`; writers keep their
//! inserts out of the groups of a pending one.

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::format::{avro, plans};

/// One input file slice of a clustering group.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ClusteringSlice {
    /// File id of the file group.
    pub file_id: String,
    /// Instant time of the slice's base instant.
    pub base_instant_time: String,
    /// `(path, size)` of the base file, relative to the table root.
    pub data_file: Option<(String, u64)>,
    /// Paths of the slice's log files, relative to the table root.
    pub delta_file_paths: Vec<String>,
}

/// Slices of one partition rewritten together into one sorted run of files.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ClusteringGroup {
    /// Partition path of the slices.
    pub partition_path: String,
    /// The slices, rewritten together.
    pub slices: Vec<ClusteringSlice>,
}

/// The plan stored in `t.replacecommit.requested`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ClusteringPlan {
    /// `WriteOperationType` name of the replacecommit: `CLUSTER`.
    pub operation_type: String,
    /// Columns the output is sorted by; empty for no sort.
    pub sort_columns: Vec<String>,
    /// The groups of slices to rewrite (`HoodieClusteringPlan.inputGroups`).
    pub input_groups: Vec<ClusteringGroup>,
    /// `HoodieClusteringPlan.version`.
    pub version: u32,
}

/// The execution strategy Java runs a sorted clustering plan with, and its sort-columns parameter.
const SORT_STRATEGY: &str = "org.apache.hudi.client.clustering.run.strategy.SparkSortAndSizeExecutionStrategy";
pub(crate) const SORT_COLUMNS_PARAM: &str = "hoodie.clustering.plan.strategy.sort.columns";

impl ClusteringPlan {
    /// The `HoodieRequestedReplaceMetadata` Java reads from `t.replacecommit.requested`
    /// (`ClusteringUtils.getClusteringPlan`): slices name files by full path (an empty
    /// `dataFilePath` for a slice without a base file), as `ClusteringPlanStrategy` does; each
    /// group's output count estimated from its size and `target_file_size`.
    pub fn to_avro(&self, table_uri: &str, target_file_size: u64) -> Result<Vec<u8>> {
        let full = |rel: &str| crate::format::file_name::full_path(table_uri, rel);
        let groups: Vec<serde_json::Value> = self
            .input_groups
            .iter()
            .map(|g| {
                let bytes: u64 = g.slices.iter().filter_map(|s| s.data_file.as_ref().map(|d| d.1)).sum();
                let outputs = bytes.div_ceil(target_file_size.max(1)).max(1);
                let slices: Vec<serde_json::Value> = g
                    .slices
                    .iter()
                    .map(|s| {
                        serde_json::json!({
                            "dataFilePath": s.data_file.as_ref().map_or(String::new(), |d| full(&d.0)),
                            "deltaFilePaths": s.delta_file_paths.iter().map(|p| full(p)).collect::<Vec<_>>(),
                            "fileId": s.file_id,
                            "partitionPath": g.partition_path,
                            "version": 1,
                        })
                    })
                    .collect();
                serde_json::json!({
                    "slices": slices,
                    "metrics": {},
                    "numOutputFileGroups": i32::try_from(outputs).unwrap_or(i32::MAX),
                    "version": 1,
                })
            })
            .collect();
        let mut params = serde_json::Map::new();
        if !self.sort_columns.is_empty() {
            params.insert(SORT_COLUMNS_PARAM.into(), self.sort_columns.join(",").into());
        }
        let request = serde_json::json!({
            "operationType": self.operation_type,
            "clusteringPlan": {
                "inputGroups": groups,
                "strategy": { "strategyClassName": SORT_STRATEGY, "strategyParams": params, "version": 1 },
                "extraMetadata": {},
                "version": self.version,
            },
            "version": 1,
        });
        avro::write_container(plans::REPLACE_REQUEST_SCHEMA, &[request])
    }

    /// The file groups the plan rewrites.
    pub fn file_groups(&self) -> impl Iterator<Item = (String, String)> + '_ {
        self.input_groups.iter().flat_map(|g| g.slices.iter().map(|s| (g.partition_path.clone(), s.file_id.clone())))
    }
}

/// The file groups a requested replacecommit will rewrite: those of its clustering plan, as
/// Apache Hudi and oxlake write it (an Avro `HoodieRequestedReplaceMetadata`) or as earlier oxlake
/// versions wrote it (JSON).
/// Insert-overwrite requests hold no plan (oxlake's are empty, Apache Hudi's have no
/// `clusteringPlan`): they rewrite nothing a writer must avoid.
pub fn planned_file_groups(path: &str, bytes: &[u8]) -> Result<Vec<(String, String)>> {
    if bytes.is_empty() {
        return Ok(Vec::new());
    }
    if !avro::is_container(bytes) {
        let plan: ClusteringPlan =
            serde_json::from_slice(bytes).map_err(|e| Error::corrupt(path, format!("clustering plan: {e}")))?;
        return Ok(plan.file_groups().collect());
    }
    let request: JavaReplaceRequest = avro::read_timeline_record(path, bytes)?;
    Ok(request
        .clustering_plan
        .into_iter()
        .flat_map(|p| p.input_groups)
        .flat_map(|g| g.slices)
        .map(|s| (s.partition_path, s.file_id))
        .collect())
}

/// `HoodieRequestedReplaceMetadata`, Apache Hudi's replacecommit request (the fields oxlake uses).
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct JavaReplaceRequest {
    clustering_plan: Option<JavaClusteringPlan>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct JavaClusteringPlan {
    #[serde(default)]
    input_groups: Vec<JavaClusteringGroup>,
}

#[derive(Deserialize)]
struct JavaClusteringGroup {
    #[serde(default)]
    slices: Vec<JavaSliceInfo>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct JavaSliceInfo {
    file_id: String,
    #[serde(default)]
    partition_path: String,
}
