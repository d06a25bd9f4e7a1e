//! Writer schemas of the table-service plans Apache Hudi reads from `.requested` files: compaction
//! (`HoodieCompactionPlan`) and clustering (`HoodieRequestedReplaceMetadata`). The services fill
//! them (`services/compaction.rs`, `services/clustering.rs`); the archiver nests them.

/// Writer schema of `HoodieCompactionPlan` (in Apache Hudi's `HoodieCompactionOperation.avsc`).
pub const COMPACTION_PLAN_SCHEMA: &str = concat!(
    r#"{"type":"record","name":"HoodieCompactionPlan","namespace":"org.apache.hudi.avro.model","fields":["#,
    r#"{"name":"operations","type":["null",{"type":"array","items":{"type":"record","name":"HoodieCompactionOperation","fields":["#,
    r#"{"name":"baseInstantTime","type":["null","string"]},"#,
    r#"{"name":"deltaFilePaths","type":["null",{"type":"array","items":"string"}],"default":null},"#,
    r#"{"name":"dataFilePath","type":["null","string"],"default":null},"#,
    r#"{"name":"fileId","type":["null","string"]},"#,
    r#"{"name":"partitionPath","type":["null","string"],"default":null},"#,
    r#"{"name":"metrics","type":["null",{"type":"map","values":"double"}],"default":null},"#,
    r#"{"name":"externalDataFilePath","type":["null","string"],"default":null}]}}],"default":null},"#,
    r#"{"name":"extraMetadata","type":["null",{"type":"map","values":"string"}],"default":null},"#,
    r#"{"name":"version","type":["int","null"],"default":1}]}"#,
);

/// Writer schema of `HoodieRequestedReplaceMetadata` with `HoodieClusteringPlan`,
/// `HoodieClusteringGroup`, `HoodieSliceInfo` and `HoodieClusteringStrategy` (Apache Hudi 0.14).
pub const REPLACE_REQUEST_SCHEMA: &str = concat!(
    r#"{"type":"record","name":"HoodieRequestedReplaceMetadata","namespace":"org.apache.hudi.avro.model","fields":["#,
    r#"{"name":"operationType","type":["null","string"],"default":null},"#,
    r#"{"name":"clusteringPlan","type":["null",{"type":"record","name":"HoodieClusteringPlan","fields":["#,
    r#"{"name":"inputGroups","type":["null",{"type":"array","items":{"type":"record","name":"HoodieClusteringGroup","fields":["#,
    r#"{"name":"slices","type":["null",{"type":"array","items":{"type":"record","name":"HoodieSliceInfo","fields":["#,
    r#"{"name":"dataFilePath","type":["null","string"],"default":null},"#,
    r#"{"name":"deltaFilePaths","type":["null",{"type":"array","items":"string"}],"default":null},"#,
    r#"{"name":"fileId","type":["null","string"]},"#,
    r#"{"name":"partitionPath","type":["null","string"],"default":null},"#,
    r#"{"name":"bootstrapFilePath","type":["null","string"],"default":null},"#,
    r#"{"name":"version","type":["int","null"],"default":1}]}}],"default":null},"#,
    r#"{"name":"metrics","type":["null",{"type":"map","values":"double"}],"default":null},"#,
    r#"{"name":"numOutputFileGroups","type":["int","null"],"default":1},"#,
    r#"{"name":"version","type":["int","null"],"default":1}]}}],"default":null},"#,
    r#"{"name":"strategy","type":["null",{"type":"record","name":"HoodieClusteringStrategy","fields":["#,
    r#"{"name":"strategyClassName","type":["null","string"],"default":null},"#,
    r#"{"name":"strategyParams","type":["null",{"type":"map","values":"string"}],"default":null},"#,
    r#"{"name":"version","type":["int","null"],"default":1}]}],"default":null},"#,
    r#"{"name":"extraMetadata","type":["null",{"type":"map","values":"string"}],"default":null},"#,
    r#"{"name":"version","type":["int","null"],"default":1}]}],"default":null},"#,
    r#"{"name":"extraMetadata","type":["null",{"type":"map","values":"string"}],"default":null},"#,
    r#"{"name":"version","type":["int","null"],"default":1}]}"#,
);
