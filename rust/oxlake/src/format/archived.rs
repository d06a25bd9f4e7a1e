//! The archived timeline, as Apache Hudi 0.14/0.15 writes and reads it: log files
//! `.hoodie/archived/.commits_.archive.<version>_1-0-1` of Avro data blocks, each block a batch of
//! `HoodieArchivedMetaEntry` records (the block's `SCHEMA` header is the writer schema), one record
//! per state of an archived instant (`HoodieTimelineArchiver`, `MetadataConversionUtils
//! .createMetaWrapper`):
//!
//! | action | REQUESTED | INFLIGHT | COMPLETED |
//! |---|---|---|---|
//! | commit, deltacommit | `hoodieCommitMetadata` | `hoodieCommitMetadata` | `hoodieCommitMetadata` |
//! | replacecommit | `hoodieRequestedReplaceMetadata` (a plan) | `HoodieInflightReplaceMetadata` (if not empty) | `hoodieReplaceCommitMetadata` |
//! | compaction (completes as commit) | `hoodieCompactionPlan` | — | `hoodieCommitMetadata` |
//! | clean | `hoodieCleanerPlan` | `hoodieCleanerPlan` | `hoodieCleanMetadata` |
//! | rollback | — | — | `hoodieRollbackMetadata` |
//! | indexing (oxlake's metadata-table builds) | — | — | — |
//!
//! Commit metadata, JSON on the active timeline, becomes the Avro `HoodieCommitMetadata` record as
//! Java's `convertCommitMetadata` makes it: fields matched by name (log offsets, `compacted` and
//! other JSON-only fields dropped), `operationType` `COMPACT` for a compaction, and
//! `extraMetadata.ROLLING_STAT = ""`.

use std::sync::LazyLock;

use bytes::Bytes;
use serde_json::{Value as Json, json};

use crate::error::{Error, Result};
use crate::format::avro::{self, DatumWriter};
use crate::format::instant::{Action, Instant, State};
use crate::format::log_block::{self, BlockType, HeaderKey, LogBlock};
use crate::format::{clean, plans, rollback};

/// The archive folder (`hoodie.archivelog.folder`, `archived` by default), under `.hoodie/`.
pub const DEFAULT_FOLDER: &str = "archived";
/// File id and extension of archive files: `.commits_.archive.<version>_<token>`.
pub const FILE_ID: &str = "commits";
/// Extension of archive files; see [`FILE_ID`].
pub const EXTENSION: &str = "archive";
/// `HoodieLogFormat.UNKNOWN_WRITE_TOKEN`, the token of every archive file.
pub const WRITE_TOKEN: &str = "1-0-1";
/// Records per block (`hoodie.commits.archival.batch`).
pub const BATCH: usize = 10;

/// `HoodieCommitMetadata` with `HoodieWriteStat` (Apache Hudi 0.14).
const COMMIT_METADATA: &str = concat!(
    r#"{"type":"record","name":"HoodieCommitMetadata","namespace":"org.apache.hudi.avro.model","fields":["#,
    r#"{"name":"partitionToWriteStats","type":["null",{"type":"map","values":{"type":"array","items":{"type":"record","name":"HoodieWriteStat","fields":["#,
    r#"{"name":"fileId","type":["null","string"],"default":null},{"name":"path","type":["null","string"],"default":null},"#,
    r#"{"name":"prevCommit","type":["null","string"],"default":null},"#,
    r#"{"name":"numWrites","type":["null","long"],"default":null},{"name":"numDeletes","type":["null","long"],"default":null},"#,
    r#"{"name":"numUpdateWrites","type":["null","long"],"default":null},{"name":"totalWriteBytes","type":["null","long"],"default":null},"#,
    r#"{"name":"totalWriteErrors","type":["null","long"],"default":null},{"name":"partitionPath","type":["null","string"],"default":null},"#,
    r#"{"name":"totalLogRecords","type":["null","long"],"default":null},{"name":"totalLogFiles","type":["null","long"],"default":null},"#,
    r#"{"name":"totalUpdatedRecordsCompacted","type":["null","long"],"default":null},{"name":"numInserts","type":["null","long"],"default":null},"#,
    r#"{"name":"totalLogBlocks","type":["null","long"],"default":null},{"name":"totalCorruptLogBlock","type":["null","long"],"default":null},"#,
    r#"{"name":"totalRollbackBlocks","type":["null","long"],"default":null},{"name":"fileSizeInBytes","type":["null","long"],"default":null}]}}}],"default":null},"#,
    r#"{"name":"extraMetadata","type":["null",{"type":"map","values":"string"}],"default":null},"#,
    r#"{"name":"version","type":["int","null"],"default":1},"#,
    r#"{"name":"operationType","type":["null","string"],"default":null}]}"#,
);

/// `HoodieReplaceCommitMetadata` (its write stats are `HoodieWriteStat`, defined above it).
const REPLACE_METADATA: &str = concat!(
    r#"{"type":"record","name":"HoodieReplaceCommitMetadata","namespace":"org.apache.hudi.avro.model","fields":["#,
    r#"{"name":"partitionToWriteStats","type":["null",{"type":"map","values":{"type":"array","items":"HoodieWriteStat"}}],"default":null},"#,
    r#"{"name":"extraMetadata","type":["null",{"type":"map","values":"string"}],"default":null},"#,
    r#"{"name":"version","type":["int","null"],"default":1},"#,
    r#"{"name":"operationType","type":["null","string"],"default":null},"#,
    r#"{"name":"partitionToReplaceFileIds","type":["null",{"type":"map","values":{"type":"array","items":"string"}}],"default":null}]}"#,
);

/// Writer schema of `HoodieArchivedMetaEntry` (the 0.14 record; Java resolves it by field name).
pub static ENTRY_SCHEMA: LazyLock<String> = LazyLock::new(|| {
    let nullable = |name: &str, schema: &str| format!(r#"{{"name":"{name}","type":["null",{schema}],"default":null}}"#);
    let fields = [
        nullable("hoodieCommitMetadata", COMMIT_METADATA),
        nullable("hoodieCleanMetadata", clean::METADATA_SCHEMA),
        nullable("hoodieRollbackMetadata", &rollback::ROLLBACK_METADATA_SCHEMA),
        nullable("hoodieSavePointMetadata", rollback::SAVEPOINT_SCHEMA),
        nullable("commitTime", r#""string""#),
        nullable("actionType", r#""string""#),
        r#"{"name":"version","type":["int","null"],"default":1}"#.to_string(),
        nullable("hoodieCompactionPlan", plans::COMPACTION_PLAN_SCHEMA),
        nullable("hoodieCleanerPlan", clean::PLAN_SCHEMA),
        nullable("actionState", r#""string""#),
        nullable("hoodieReplaceCommitMetadata", REPLACE_METADATA),
        nullable("hoodieRequestedReplaceMetadata", plans::REPLACE_REQUEST_SCHEMA),
        nullable("HoodieInflightReplaceMetadata", r#""HoodieCommitMetadata""#),
        nullable("stateTransitionTime", r#""string""#),
    ];
    format!(
        r#"{{"type":"record","name":"HoodieArchivedMetaEntry","namespace":"org.apache.hudi.avro.model","fields":[{}]}}"#,
        fields.join(",")
    )
});

/// Java's `HoodieInstant.State` names.
pub fn state_name(state: State) -> &'static str {
    match state {
        State::Requested => "REQUESTED",
        State::Inflight => "INFLIGHT",
        State::Completed => "COMPLETED",
    }
}

fn parse_state(name: &str) -> Option<State> {
    match name {
        "REQUESTED" => Some(State::Requested),
        "INFLIGHT" => Some(State::Inflight),
        "COMPLETED" => Some(State::Completed),
        _ => None,
    }
}

/// What one state of an instant holds on the active timeline, for its archived entry.
pub struct StateFile<'a> {
    /// The action its file is named with (`compaction` for a requested or inflight compaction,
    /// `commit` once it completed).
    pub action: Action,
    /// The state the file is of.
    pub state: State,
    /// The file's content.
    pub bytes: &'a [u8],
}

/// The `HoodieArchivedMetaEntry` of one state of instant `time`; `path` names the file for errors.
pub fn entry(time: &str, file: &StateFile<'_>, path: &str) -> Result<Json> {
    let mut e = json!({
        "commitTime": time,
        "actionType": file.action.name(),
        "actionState": state_name(file.state),
    });
    let details = details(file, path)?;
    if let Some((key, value)) = details {
        e[key] = value;
    }
    Ok(e)
}

/// The detail field of an entry and its value, `None` where Java records none.
fn details(file: &StateFile<'_>, path: &str) -> Result<Option<(&'static str, Json)>> {
    let bytes = file.bytes;
    let avro_record = || -> Result<Json> { avro::read_timeline_record::<Json>(path, bytes) };
    Ok(match (file.action, file.state) {
        (Action::Commit | Action::DeltaCommit, _) => Some(("hoodieCommitMetadata", commit_metadata(path, bytes)?)),
        (Action::ReplaceCommit, State::Completed) => {
            Some(("hoodieReplaceCommitMetadata", commit_metadata(path, bytes)?))
        }
        (Action::ReplaceCommit, State::Inflight) if !is_blank(bytes) => {
            Some(("HoodieInflightReplaceMetadata", commit_metadata(path, bytes)?))
        }
        // A plan of an earlier oxlake version (JSON) has no Avro form: the entry goes without.
        (Action::ReplaceCommit, State::Requested) if avro::is_container(bytes) => {
            Some(("hoodieRequestedReplaceMetadata", avro_record()?))
        }
        (Action::Compaction, State::Requested) if avro::is_container(bytes) => {
            Some(("hoodieCompactionPlan", avro_record()?))
        }
        (Action::Clean, State::Requested | State::Inflight) if avro::is_container(bytes) => {
            Some(("hoodieCleanerPlan", avro_record()?))
        }
        (Action::Clean, State::Completed) if avro::is_container(bytes) => Some(("hoodieCleanMetadata", avro_record()?)),
        (Action::Rollback, State::Completed) if avro::is_container(bytes) => {
            Some(("hoodieRollbackMetadata", avro_record()?))
        }
        (Action::Savepoint, State::Completed) if avro::is_container(bytes) => {
            Some(("hoodieSavePointMetadata", avro_record()?))
        }
        _ => None,
    })
}

fn is_blank(bytes: &[u8]) -> bool {
    bytes.iter().all(u8::is_ascii_whitespace)
}

/// Commit metadata JSON (or an empty file: empty metadata) as the Avro record Java archives.
fn commit_metadata(path: &str, bytes: &[u8]) -> Result<Json> {
    let mut m: Json = if is_blank(bytes) {
        json!({})
    } else {
        serde_json::from_slice(bytes).map_err(|e| Error::corrupt(path, format!("commit metadata: {e}")))?
    };
    let Some(o) = m.as_object_mut() else { return Err(Error::corrupt(path, "commit metadata is not an object")) };
    if o.get("compacted").and_then(Json::as_bool) == Some(true) {
        o.insert("operationType".into(), json!("COMPACT"));
    }
    let extra = o.entry("extraMetadata").or_insert_with(|| json!({}));
    if let Some(extra) = extra.as_object_mut() {
        extra.insert("ROLLING_STAT".into(), json!(""));
    }
    // Write stats keep only the fields of `HoodieWriteStat` (the writer drops the rest); nulls stay
    // null, and a partition `null` (Java's `convertCommitMetadata` drops it) goes.
    if let Some(stats) = o.get_mut("partitionToWriteStats").and_then(Json::as_object_mut) {
        stats.remove("null");
    }
    Ok(m)
}

/// The Avro data block of a batch of entries, as `HoodieTimelineArchiver.writeToFile` writes it:
/// the entry schema as its only header.
pub fn block(entries: &[Json]) -> Result<LogBlock> {
    let writer = DatumWriter::new(&ENTRY_SCHEMA)?;
    let datums: Vec<Vec<u8>> = entries.iter().map(|e| writer.encode(e)).collect::<Result<_>>()?;
    let mut b = LogBlock::new(BlockType::AvroData, "", log_block::encode_avro_datums(&datums));
    b.header = Default::default();
    b.header.insert(HeaderKey::Schema, ENTRY_SCHEMA.clone());
    Ok(b)
}

/// One archived state of an instant, with its details (the entry's metadata field as JSON).
#[derive(Clone, Debug, PartialEq)]
pub struct ArchivedState {
    /// The instant: time, action and state (`commitTime`, `actionType`, `actionState`).
    pub instant: Instant,
    /// The entry's metadata field (e.g. `hoodieCommitMetadata`), `None` where the entry has none.
    pub details: Option<Json>,
}

/// The entries of an archive file, in file order. A torn last block (a writer that died while
/// appending it) is skipped, as Java's reader does; a damaged block before the last one, or an
/// entry without a time, action or state, is a `CorruptTable` error naming the file.
pub fn read_file(path: &str, data: &Bytes) -> Result<Vec<ArchivedState>> {
    // Java writes a block with every archive file it creates: an empty one lost its instants.
    if data.is_empty() {
        return Err(Error::corrupt(path, "empty archive file: the instants it archived are lost"));
    }
    let parsed = log_block::parse_blocks(data);
    let mut out = Vec::new();
    let last = parsed.len().saturating_sub(1);
    for (i, p) in parsed.into_iter().enumerate() {
        let block = match p {
            log_block::Parsed::Block { block, .. } => block,
            log_block::Parsed::Corrupt { .. } if i == last => break,
            log_block::Parsed::Corrupt { offset, reason, .. } => {
                return Err(Error::corrupt(path, format!("archive block at byte {offset}: {reason}")));
            }
        };
        if block.block_type != BlockType::AvroData {
            continue;
        }
        let schema = block
            .header
            .get(&HeaderKey::Schema)
            .ok_or_else(|| Error::corrupt(path, "an archive block without its schema"))?;
        for datum in log_block::avro_datums(&block.content).map_err(|e| Error::corrupt(path, e))? {
            let record = avro::decode_datum(schema, datum).map_err(|e| Error::corrupt(path, e))?;
            out.push(state_of(path, &record)?);
        }
    }
    Ok(out)
}

fn state_of(path: &str, record: &Json) -> Result<ArchivedState> {
    let field = |k: &str| record.get(k).and_then(Json::as_str);
    let bad = || Error::corrupt(path, format!("an archived entry without time, action or state: {record}"));
    let time = field("commitTime").ok_or_else(bad)?;
    let action = Action::parse(field("actionType").ok_or_else(bad)?).ok_or_else(bad)?;
    let state = parse_state(field("actionState").ok_or_else(bad)?).ok_or_else(bad)?;
    let details = [
        "hoodieCommitMetadata",
        "hoodieReplaceCommitMetadata",
        "hoodieCleanMetadata",
        "hoodieCleanerPlan",
        "hoodieRollbackMetadata",
        "hoodieSavePointMetadata",
        "hoodieCompactionPlan",
        "hoodieRequestedReplaceMetadata",
        "HoodieInflightReplaceMetadata",
    ]
    .iter()
    .find_map(|k| record.get(*k).cloned());
    Ok(ArchivedState { instant: Instant::new(time, action, state), details })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_round_trip_through_a_block() {
        let commit = br#"{"partitionToWriteStats":{"p":[{"fileId":"f","path":"p/f_0-0-1_1.parquet","prevCommit":"null",
            "numWrites":3,"numDeletes":0,"numUpdateWrites":0,"numInserts":3,"totalWriteBytes":10,"totalWriteErrors":0,
            "partitionPath":"p","fileSizeInBytes":10,"logFiles":["x"],"logOffset":4}]},
            "compacted":true,"extraMetadata":{"schema":"{}"},"operationType":"UPSERT"}"#;
        let entries = vec![
            entry("1", &StateFile { action: Action::Commit, state: State::Requested, bytes: b"" }, "a").unwrap(),
            entry("1", &StateFile { action: Action::Commit, state: State::Completed, bytes: commit }, "b").unwrap(),
            entry("2", &StateFile { action: Action::Indexing, state: State::Completed, bytes: b"{}" }, "c").unwrap(),
        ];
        let data = Bytes::from(block(&entries).unwrap().encode());
        let read = read_file("x", &data).unwrap();
        assert_eq!(read.len(), 3);
        assert_eq!(read[1].instant, Instant::new("1", Action::Commit, State::Completed));
        let m = read[1].details.as_ref().unwrap();
        assert_eq!(m["operationType"], "COMPACT");
        assert_eq!(m["extraMetadata"]["ROLLING_STAT"], "");
        assert_eq!(m["partitionToWriteStats"]["p"][0]["path"], "p/f_0-0-1_1.parquet");
        assert!(m["partitionToWriteStats"]["p"][0].get("logOffset").is_none());
        assert_eq!(read[2].instant.action, Action::Indexing);
        assert_eq!(read[2].details, None);
        // A torn last block is skipped; a damaged earlier one is an error.
        let mut two = data.to_vec();
        two.extend_from_slice(&data[..data.len() / 2]);
        assert_eq!(read_file("x", &Bytes::from(two)).unwrap().len(), 3);
        let mut damaged = data[..data.len() / 2].to_vec();
        damaged.extend_from_slice(&data);
        assert!(matches!(read_file("x", &Bytes::from(damaged)), Err(Error::CorruptTable { .. })));
    }
}
