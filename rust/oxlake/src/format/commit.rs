//! Commit metadata: what a completed commit, deltacommit or replacecommit says it wrote.
//!
//! Layout 1 stores it as JSON with Apache Hudi's camelCase field names; unknown fields are ignored
//! on read so files written by any Hudi version parse.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// `HoodieCommitMetadata` / `HoodieReplaceCommitMetadata`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct CommitMetadata {
    /// Per partition path, the files written (`partitionToWriteStats`).
    pub partition_to_write_stats: BTreeMap<String, Vec<WriteStat>>,
    /// Per partition path, the file ids replaced (replacecommits: `partitionToReplaceFileIds`).
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub partition_to_replace_file_ids: BTreeMap<String, Vec<String>>,
    /// Whether the commit is a compaction.
    pub compacted: bool,
    /// Free-form key-value pairs (`extraMetadata`), e.g. the writer schema under [`Self::SCHEMA_KEY`].
    pub extra_metadata: BTreeMap<String, String>,
    /// `WriteOperationType` name, e.g. `UPSERT`, `COMPACT`.
    pub operation_type: Option<String>,
}

/// `operationType` of a clustering replacecommit (Apache Hudi's name).
pub const CLUSTER: &str = "CLUSTER";

/// `HoodieWriteStat` as Apache Hudi 1.x writes it (its writer schema in the timeline files of the
/// version 9 tables of `../shared/compat`); the fields oxlake does not fill stay null.
const WRITE_STAT_SCHEMA: &str = concat!(
    r#"{"type":"record","name":"HoodieWriteStat","fields":["#,
    r#"{"name":"fileId","type":["null","string"],"default":null},"#,
    r#"{"name":"path","type":["null","string"],"default":null},"#,
    r#"{"name":"prevCommit","type":["null","string"],"default":null},"#,
    r#"{"name":"numWrites","type":["null","long"],"default":null},"#,
    r#"{"name":"numDeletes","type":["null","long"],"default":null},"#,
    r#"{"name":"numUpdateWrites","type":["null","long"],"default":null},"#,
    r#"{"name":"totalWriteBytes","type":["null","long"],"default":null},"#,
    r#"{"name":"totalWriteErrors","type":["null","long"],"default":null},"#,
    r#"{"name":"partitionPath","type":["null","string"],"default":null},"#,
    r#"{"name":"totalLogRecords","type":["null","long"],"default":null},"#,
    r#"{"name":"totalLogFiles","type":["null","long"],"default":null},"#,
    r#"{"name":"totalUpdatedRecordsCompacted","type":["null","long"],"default":null},"#,
    r#"{"name":"numInserts","type":["null","long"],"default":null},"#,
    r#"{"name":"totalLogBlocks","type":["null","long"],"default":null},"#,
    r#"{"name":"totalCorruptLogBlock","type":["null","long"],"default":null},"#,
    r#"{"name":"totalRollbackBlocks","type":["null","long"],"default":null},"#,
    r#"{"name":"fileSizeInBytes","type":["null","long"],"default":null},"#,
    r#"{"name":"logVersion","type":["null","int"],"default":null},"#,
    r#"{"name":"logOffset","type":["null","long"],"default":null},"#,
    r#"{"name":"baseFile","type":["null","string"],"default":null},"#,
    r#"{"name":"logFiles","type":["null",{"type":"array","items":"string"}],"default":null}]}"#,
);

/// Writer schema of `HoodieCommitMetadata` on timeline layout 2.
static COMMIT_METADATA_SCHEMA: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    format!(
        concat!(
            r#"{{"type":"record","name":"HoodieCommitMetadata","namespace":"org.apache.hudi.avro.model","fields":["#,
            r#"{{"name":"partitionToWriteStats","type":["null",{{"type":"map","values":{{"type":"array","items":{stat}}}}}],"default":null}},"#,
            r#"{{"name":"compacted","type":["null","boolean"],"default":null}},"#,
            r#"{{"name":"extraMetadata","type":["null",{{"type":"map","values":"string"}}],"default":null}},"#,
            r#"{{"name":"version","type":["int","null"],"default":1}},"#,
            r#"{{"name":"operationType","type":["null","string"],"default":null}}]}}"#,
        ),
        stat = WRITE_STAT_SCHEMA
    )
});

/// Writer schema of `HoodieReplaceCommitMetadata` on timeline layout 2.
static REPLACE_COMMIT_METADATA_SCHEMA: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    let commit = COMMIT_METADATA_SCHEMA.as_str();
    let head =
        commit.strip_suffix("]}").unwrap_or(commit).replacen("HoodieCommitMetadata", "HoodieReplaceCommitMetadata", 1);
    format!(
        r#"{head},{{"name":"partitionToReplaceFileIds","type":["null",{{"type":"map","values":{{"type":"array","items":"string"}}}}],"default":null}}]}}"#
    )
});

/// `HoodieWriteStat`: one file written by a commit.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct WriteStat {
    /// File id of the file group written.
    pub file_id: String,
    /// `<partition>/<file>`, or `<file>` for a non-partitioned table.
    pub path: Option<String>,
    /// `"null"` for a new file, else the instant of the base file it replaces.
    pub prev_commit: Option<String>,
    /// Records written.
    pub num_writes: i64,
    /// Records deleted.
    pub num_deletes: i64,
    /// Records updated.
    pub num_update_writes: i64,
    /// Records inserted.
    pub num_inserts: i64,
    /// Bytes written.
    pub total_write_bytes: i64,
    /// Records that failed to write.
    pub total_write_errors: i64,
    /// Partition path, relative to the table root.
    pub partition_path: Option<String>,
    /// Size of the file written, in bytes; with `logOffset`, the bytes this write appended.
    pub file_size_in_bytes: i64,
    /// Log files: name of the base file of the slice appended to.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub base_file: Option<String>,
    /// Log files: names of the log files written.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub log_files: Option<Vec<String>>,
    /// Log files: version of the log file written.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub log_version: Option<i64>,
    /// Where in the log file this write's blocks start (Apache Hudi appends to log files;
    /// `fileSizeInBytes` then counts the bytes this write added).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub log_offset: Option<i64>,
    /// Log records written.
    pub total_log_records: i64,
    /// Log blocks written.
    pub total_log_blocks: i64,
    /// Corrupt log blocks found.
    pub total_corrupt_log_block: i64,
    /// Rollback blocks written.
    pub total_rollback_blocks: i64,
}

impl CommitMetadata {
    /// What an archived commit recorded (the Avro `HoodieCommitMetadata` of the archive, as JSON:
    /// see [`crate::format::archived`]): a compaction says so in its operation type.
    pub fn from_archived(path: &str, details: &serde_json::Value) -> Result<Self> {
        let mut meta: CommitMetadata = serde_json::from_value(details.clone())
            .map_err(|e| Error::corrupt(path, format!("archived commit metadata: {e}")))?;
        meta.compacted = meta.operation_type.as_deref() == Some("COMPACT");
        meta.extra_metadata.remove("ROLLING_STAT");
        Ok(meta)
    }

    /// Key of the writer schema in `extraMetadata`.
    pub const SCHEMA_KEY: &'static str = "schema";

    /// Key of oxlake's exact Arrow schema of the table as this commit leaves it (base64 IPC).
    pub const ARROW_SCHEMA_KEY: &'static str = "oxlake.arrow.schema";

    /// The `extraMetadata` keys a commit records the table's schema under: Apache Hudi's writer
    /// schema, oxlake's Arrow schema and its column ids (see [`crate::schema::internal`]).
    pub const SCHEMA_KEYS: [&'static str; 3] =
        [Self::SCHEMA_KEY, Self::ARROW_SCHEMA_KEY, crate::schema::internal::LATEST_SCHEMA_KEY];

    /// Records `schema` (no meta fields) as the table's schema after this commit: Apache Hudi's
    /// Avro writer schema and oxlake's exact Arrow schema.
    pub fn set_schema(&mut self, schema: &arrow::datatypes::Schema, table_name: &str) -> crate::error::Result<()> {
        self.extra_metadata.insert(Self::SCHEMA_KEY.into(), crate::schema::to_avro(schema, table_name)?);
        self.extra_metadata.insert(Self::ARROW_SCHEMA_KEY.into(), crate::schema::encode_arrow_schema(schema));
        Ok(())
    }

    /// The Arrow schema this commit records, if it records one.
    pub fn arrow_schema(&self) -> crate::error::Result<Option<arrow::datatypes::SchemaRef>> {
        self.extra_metadata.get(Self::ARROW_SCHEMA_KEY).map(|t| crate::schema::decode_arrow_schema(t)).transpose()
    }

    /// Parses layout-1 JSON metadata; an empty file gives empty metadata (a requested instant).
    pub fn from_json(path: &str, bytes: &[u8]) -> Result<Self> {
        if bytes.iter().all(u8::is_ascii_whitespace) {
            return Ok(CommitMetadata::default());
        }
        serde_json::from_slice(bytes).map_err(|e| Error::corrupt(path, format!("commit metadata: {e}")))
    }

    /// Parses layout-2 metadata: an Avro object container holding one `HoodieCommitMetadata` (or
    /// `HoodieReplaceCommitMetadata`) record, whose field names are those of the JSON form. An empty
    /// file gives empty metadata (a requested instant).
    pub fn from_avro(path: &str, bytes: &[u8]) -> Result<Self> {
        if bytes.is_empty() {
            return Ok(CommitMetadata::default());
        }
        crate::format::avro::read_timeline_record(path, bytes)
    }

    /// Serializes to the JSON Apache Hudi writes.
    pub fn to_json(&self) -> Result<Vec<u8>> {
        serde_json::to_vec_pretty(self).map_err(|e| Error::invalid_data(format!("commit metadata: {e}")))
    }

    /// Serializes as Apache Hudi 1.x writes it on timeline layout 2 (`CommitMetadataSerDeV2`): an
    /// Avro object container of one `HoodieReplaceCommitMetadata` record for a replacecommit, else
    /// one `HoodieCommitMetadata`.
    pub fn to_avro(&self, replace: bool) -> Result<Vec<u8>> {
        let record = serde_json::to_value(self).map_err(|e| Error::invalid_data(format!("commit metadata: {e}")))?;
        let schema = if replace { &*REPLACE_COMMIT_METADATA_SCHEMA } else { &*COMMIT_METADATA_SCHEMA };
        crate::format::avro::write_container(schema, &[record])
    }

    /// The bytes of this metadata in a completed instant's file of timeline `layout` (JSON on
    /// layout 1, Avro on layout 2), for an instant of `action`.
    pub fn to_timeline_bytes(&self, layout: u32, action: crate::format::instant::Action) -> Result<Vec<u8>> {
        use crate::format::instant::Action;
        match layout {
            1 => self.to_json(),
            _ => self.to_avro(matches!(action, Action::ReplaceCommit | Action::Clustering)),
        }
    }

    /// The Avro writer schema recorded by the commit.
    pub fn schema(&self) -> Option<&str> {
        self.extra_metadata.get(Self::SCHEMA_KEY).map(String::as_str)
    }

    /// Every write stat with its partition.
    pub fn write_stats(&self) -> impl Iterator<Item = (&str, &WriteStat)> {
        self.partition_to_write_stats.iter().flat_map(|(p, v)| v.iter().map(move |s| (p.as_str(), s)))
    }

    /// Every `(partition, file id)` this commit replaced.
    pub fn replaced_file_groups(&self) -> impl Iterator<Item = (&str, &str)> {
        self.partition_to_replace_file_ids.iter().flat_map(|(p, v)| v.iter().map(move |f| (p.as_str(), f.as_str())))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_a_real_v6_commit() {
        let json = r#"{"partitionToWriteStats":{"":[{"fileId":"a079bdb3-731c-4894-b855-abfcd6921007-0",
           "path":"a079bdb3-731c-4894-b855-abfcd6921007-0_0-203-274_20240418173551906.parquet",
           "prevCommit":"20240418173550988","numWrites":4,"numDeletes":0,"numUpdateWrites":1,"numInserts":1,
           "totalWriteBytes":441520,"totalWriteErrors":0,"partitionPath":"","fileSizeInBytes":441520,
           "totalLogRecords":0,"totalLogBlocks":0,"totalCorruptLogBlock":0,"totalRollbackBlocks":0,
           "runtimeStats":{"totalScanTime":0,"totalUpsertTime":105,"totalCreateTime":0}}]},
           "compacted":false,"extraMetadata":{"schema":"{}"},"operationType":"UPSERT"}"#;
        let m = CommitMetadata::from_json("c", json.as_bytes()).unwrap();
        let (p, s) = m.write_stats().next().unwrap();
        assert_eq!((p, s.num_writes, s.file_size_in_bytes), ("", 4, 441520));
        assert_eq!(m.operation_type.as_deref(), Some("UPSERT"));
        assert_eq!(m.schema(), Some("{}"));
        let again = CommitMetadata::from_json("c", &m.to_json().unwrap()).unwrap();
        assert_eq!(again, m);
    }

    fn unit_fixture(name: &str) -> Vec<u8> {
        std::fs::read(crate::test_support::shared_dir().join("compat/hudi/unit/commit_metadata").join(name)).unwrap()
    }

    /// The two commit metadata fixtures, JSON (v6) and Avro (v8), decode field by field.
    #[test]
    #[cfg_attr(
        not(hudi_corpus),
        ignore = "needs the Apache Hudi corpus: set OXLAKE_SHARED to the folder holding compat/"
    )]
    fn the_commit_metadata_fixtures_of_apache_hudi() {
        let v6 = CommitMetadata::from_json("v6_commit.json", &unit_fixture("v6_commit.json")).unwrap();
        let stats: Vec<_> = v6.write_stats().collect();
        let [("", s)] = stats[..] else { panic!("one non-partitioned stat: {stats:?}") };
        assert_eq!(s.file_id, "a079bdb3-731c-4894-b855-abfcd6921007-0");
        assert_eq!(
            s.path.as_deref(),
            Some("a079bdb3-731c-4894-b855-abfcd6921007-0_0-203-274_20240418173551906.parquet")
        );
        assert_eq!(s.prev_commit.as_deref(), Some("20240418173550988"));
        assert_eq!(
            (
                s.num_writes,
                s.num_deletes,
                s.num_update_writes,
                s.num_inserts,
                s.total_write_bytes,
                s.file_size_in_bytes
            ),
            (4, 0, 1, 1, 441520, 441520)
        );
        assert_eq!(v6.operation_type.as_deref(), Some("UPSERT"));
        let schema = crate::schema::from_avro(v6.schema().unwrap()).unwrap();
        assert_eq!(schema.field(0).name(), "id");
        assert_eq!(
            schema.field_with_name("decimalField").unwrap().data_type(),
            &arrow::datatypes::DataType::Decimal128(10, 5)
        );

        let v8 = CommitMetadata::from_avro("v8_deltacommit.avro", &unit_fixture("v8_deltacommit.avro")).unwrap();
        assert_eq!(v8.operation_type.as_deref(), Some("UPSERT"));
        let mut files: Vec<_> = v8.write_stats().map(|(p, s)| (p, s.file_id.as_str(), s.path.as_deref())).collect();
        files.sort();
        assert_eq!(
            files,
            [
                (
                    "city=chennai",
                    "58fccab1-a55c-4b22-b74e-22b747ad4a44-0",
                    Some("city=chennai/58fccab1-a55c-4b22-b74e-22b747ad4a44-0_2-252-391_20250713011913147.parquet")
                ),
                (
                    "city=san_francisco",
                    "87a4c895-1f59-4518-972f-27f49a92c7b4-0",
                    Some(
                        "city=san_francisco/87a4c895-1f59-4518-972f-27f49a92c7b4-0_0-252-389_20250713011913147.parquet"
                    )
                ),
                (
                    "city=sao_paulo",
                    "f362fd72-680f-4a16-ade8-c3e20bc2026c-0",
                    Some("city=sao_paulo/f362fd72-680f-4a16-ade8-c3e20bc2026c-0_1-252-390_20250713011913147.parquet")
                ),
            ]
        );
        for (p, s) in v8.write_stats() {
            assert_eq!((s.partition_path.as_deref(), s.prev_commit.as_deref()), (Some(p), Some("null")));
        }
        let schema = crate::schema::from_avro(v8.schema().unwrap()).unwrap();
        let names: Vec<_> = schema.fields().iter().map(|f| f.name().as_str()).collect();
        assert_eq!(names, ["ts", "uuid", "rider", "driver", "fare", "city"]);
    }

    #[test]
    fn empty_and_corrupt_files() {
        assert_eq!(CommitMetadata::from_json("c", b"").unwrap(), CommitMetadata::default());
        assert!(matches!(CommitMetadata::from_json("c", b"{nope"), Err(Error::CorruptTable { .. })));
    }
}
