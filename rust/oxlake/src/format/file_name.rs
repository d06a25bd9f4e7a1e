//! Data file names: base files `<fileId>_<writeToken>_<instant>.parquet` and log files
//! `.<fileId>_<instant>.log.<version>_<writeToken>`.

use crate::format::instant::is_instant_time;

/// Marker file Apache Hudi puts in every partition directory.
pub const PARTITION_METADATA: &str = ".hoodie_partition_metadata";

/// The path of file `name` of `partition`, relative to the table root.
pub fn file_path(partition: &str, name: &str) -> String {
    if partition.is_empty() { name.to_string() } else { format!("{partition}/{name}") }
}

/// The path, relative to the table root, of a data file that Apache Hudi's plans name by its file
/// name (plan version 2) or by its full path or URI (version 1).
pub fn planned_file_path(partition: &str, planned: &str) -> String {
    file_path(partition, planned.rsplit('/').next().unwrap_or(planned))
}

/// The full path Apache Hudi's plans and metadata give a file (clean and rollback plans, rollback
/// metadata): `rel` under the table URI, a local path qualified `file:/...` as Java's
/// `Path.toString()` spells it (a bare path would resolve against Java's default file system).
/// Object stores keep the scheme oxlake was opened with (`s3://`, where Java often has `s3a://`).
pub fn full_path(table_uri: &str, rel: &str) -> String {
    let base = table_uri.trim_end_matches('/');
    if base.starts_with('/') { format!("file:{base}/{rel}") } else { format!("{base}/{rel}") }
}

/// The instant in the name of the data file at `path`: a base file's commit, a log file's base
/// instant (`None`: neither).
pub fn data_file_instant(path: &str) -> Option<String> {
    let name = path.rsplit('/').next().unwrap_or(path);
    BaseFileName::parse(name).map(|b| b.instant).or_else(|| LogFileName::parse(name).map(|l| l.instant))
}

/// The commit instant in the name of the base file at `path` (`None`: not a base file name).
pub fn base_file_instant(path: &str) -> Option<String> {
    BaseFileName::parse(path.rsplit('/').next().unwrap_or(path)).map(|b| b.instant)
}

/// A parsed base file name.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct BaseFileName {
    /// File id of the file group.
    pub file_id: String,
    /// Write token: `<taskPartitionId>-<stageId>-<taskAttemptId>`.
    pub write_token: String,
    /// Instant time of the commit that wrote the file.
    pub instant: String,
}

impl BaseFileName {
    /// Parses `<fileId>_<writeToken>_<instant>.parquet`.
    pub fn parse(name: &str) -> Option<Self> {
        let stem = name.strip_suffix(".parquet")?;
        let mut parts = stem.split('_');
        let (file_id, write_token, instant) = (parts.next()?, parts.next()?, parts.next()?);
        if parts.next().is_some() || file_id.is_empty() || write_token.is_empty() || !is_instant_time(instant) {
            return None;
        }
        Some(BaseFileName { file_id: file_id.into(), write_token: write_token.into(), instant: instant.into() })
    }

    /// The file name.
    pub fn name(&self) -> String {
        format!("{}_{}_{}.parquet", self.file_id, self.write_token, self.instant)
    }
}

/// A parsed log file name.
#[derive(Clone, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct LogFileName {
    /// File id of the file group.
    pub file_id: String,
    /// Base instant (v6) or deltacommit instant (v8+).
    pub instant: String,
    /// Extension: `log`, or `archive` for an archive file.
    pub extension: String,
    /// Version of the log file within the file group and instant, from 1.
    pub version: u32,
    /// Write token: `<taskPartitionId>-<stageId>-<taskAttemptId>`.
    pub write_token: String,
}

impl LogFileName {
    /// Parses `.<fileId>_<instant>.<ext>.<version>_<writeToken>`.
    pub fn parse(name: &str) -> Option<Self> {
        let rest = name.strip_prefix('.')?;
        let (file_id, rest) = rest.split_once('_')?;
        let (middle, write_token) = rest.rsplit_once('_')?;
        let mut m = middle.splitn(3, '.');
        let (instant, extension, version) = (m.next()?, m.next()?, m.next()?);
        if !is_instant_time(instant) || extension.is_empty() || file_id.is_empty() {
            return None;
        }
        Some(LogFileName {
            file_id: file_id.into(),
            instant: instant.into(),
            extension: extension.into(),
            version: version.parse().ok()?,
            write_token: write_token.into(),
        })
    }

    /// The file name.
    pub fn name(&self) -> String {
        format!(".{}_{}.{}.{}_{}", self.file_id, self.instant, self.extension, self.version, self.write_token)
    }
}

/// A new file id: a UUID and a file-group index, as Apache Hudi names them.
pub fn new_file_id() -> String {
    format!("{}-0", uuid::Uuid::new_v4())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base_file_names() {
        let n = "6e1d5cc4-c487-487d-abbe-fe9b30b1c0cc-0_0-1112-3190_20240418173551906.parquet";
        let b = BaseFileName::parse(n).unwrap();
        assert_eq!(b.file_id, "6e1d5cc4-c487-487d-abbe-fe9b30b1c0cc-0");
        assert_eq!(b.write_token, "0-1112-3190");
        assert_eq!(b.instant, "20240418173551906");
        assert_eq!(b.name(), n);
        assert!(BaseFileName::parse("stray.parquet").is_none());
        assert!(BaseFileName::parse("a_b_c_20240418173551906.parquet").is_none());
    }

    #[test]
    fn log_file_names() {
        let n = ".0712b9f9-d2d5-4cae-bcf4-8fd7146af503-0_20250126040823628.log.2_1-0-1";
        let l = LogFileName::parse(n).unwrap();
        assert_eq!((l.instant.as_str(), l.version, l.write_token.as_str()), ("20250126040823628", 2, "1-0-1"));
        assert_eq!(l.name(), n);
        assert!(LogFileName::parse(PARTITION_METADATA).is_none());
    }
}
