//! Log files: reading the blocks of a file slice's logs and writing new log files.
//!
//! Reading applies the admission rules of docs/FORMAT.md §6 in Apache Hudi's order: a data or delete
//! block is admitted when its instant is completed on the timeline, not after the read's upper
//! bound, and not cancelled by a rollback command block found anywhere in the slice.
//!
//! Damage: Apache Hudi skips a block that does not parse. oxlake skips it only past the extent
//! completed instants wrote (a torn tail of a writer that never committed); the commit metadata
//! records that extent (`logOffset` + `fileSizeInBytes` of each write stat). A log file shorter
//! than its extent, or a block inside it that does not parse, is a [`Error::CorruptTable`]: the
//! rows of a committed write are never silently left out of a read or a table service. Admitted blocks are decoded into Arrow batches of the table schema
//! (Parquet and Avro data blocks) and delete records.
//!
//! Writing never appends: every write creates the next log version of the file group
//! (`.<fileId>_<baseInstant>.log.<version>_<token>`) with a conditional create, as Apache Hudi does
//! on object stores. A failed write's log file can then be deleted whole.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use arrow::array::RecordBatch;
use arrow::datatypes::SchemaRef;
use bytes::Bytes;
use parquet::arrow::ArrowWriter;
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use parquet::basic::Compression;
use parquet::file::properties::{EnabledStatistics, WriterProperties};
use parquet::schema::types::ColumnPath;

use crate::error::{Error, Result};
use crate::format::avro::DatumReader;
use crate::format::file_name::LogFileName;
use crate::format::log_block::{self, BlockType, DeleteRecord, HeaderKey, LogBlock, Parsed};
use crate::schema;
use crate::schema::internal::{ColumnHistory, FileColumns};
use crate::storage::Storage;
use crate::table::fs_view::LogFile;
use crate::timeline::Timeline;

/// Rows per batch decoded from a data block.
const DECODE_BATCH: usize = 8192;

/// Which blocks a read admits.
#[derive(Clone, Debug)]
pub struct Admission {
    /// Blocks of instants after this one are not read (the snapshot's instant).
    pub upper: String,
    /// The timeline that decides whether a block's instant is committed.
    pub timeline: Arc<Timeline>,
    /// What completed instants wrote into log files, loaded once per read.
    committed: Arc<tokio::sync::OnceCell<Arc<CommittedLogs>>>,
}

impl Admission {
    /// Admits the blocks of instants up to \`upper\` that \`timeline\` shows committed.
    pub fn new(upper: impl Into<String>, timeline: Arc<Timeline>) -> Self {
        Admission { upper: upper.into(), timeline, committed: Arc::default() }
    }

    /// The same admission up to another instant (the write stats it loaded are shared).
    pub fn up_to(&self, upper: impl Into<String>) -> Self {
        Admission { upper: upper.into(), timeline: self.timeline.clone(), committed: self.committed.clone() }
    }

    fn admits(&self, instant: &str) -> bool {
        instant <= self.upper.as_str() && self.timeline.is_committed(instant)
    }

    /// The log extents of the completed instants of the timeline.
    ///
    /// An instant file gone since the timeline was listed was archived meanwhile: a scan whose
    /// planning met that was planned again on the timeline as it is now (`Table::plan_scan`), and
    /// its files were checked against the instants of that timeline; those are read here then.
    pub async fn committed(&self, storage: &Storage) -> Result<Arc<CommittedLogs>> {
        let load = || async {
            match CommittedLogs::load(storage, &self.timeline).await {
                Err(e) if crate::timeline::archived_meanwhile(&e) => {
                    log::info!("the timeline changed under this read ({e}): its write stats are read again");
                    CommittedLogs::load(storage, &self.timeline.relisted(storage).await?).await
                }
                other => other,
            }
            .map(Arc::new)
        };
        self.committed.get_or_try_init(load).await.cloned()
    }
}

/// One log file as a completed instant's write stat describes it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CommittedLog {
    /// Partition path of the file group.
    pub partition: String,
    /// File id of the file group.
    pub file_id: String,
    /// The byte after the instant's last block (`logOffset` + `fileSizeInBytes`).
    pub end: u64,
    /// Instant time of the write.
    pub instant: String,
}

/// The log files completed instants wrote, by path: what a read must find in them.
#[derive(Clone, Debug, Default)]
pub struct CommittedLogs {
    /// Per path, the instant that wrote furthest into it.
    by_path: HashMap<String, CommittedLog>,
    /// The base files completed instants wrote (`end` is the file's size).
    bases: Vec<(String, CommittedLog)>,
}

/// Log write stats of completed instants, by URI and version of the instant's file: a completed
/// instant file never changes, so each is read once per process.
type StatCache = std::sync::Mutex<HashMap<String, InstantLogs>>;
/// The files one completed instant wrote, by path.
type InstantLogs = Arc<Vec<(String, CommittedLog)>>;
static STAT_CACHE: std::sync::OnceLock<StatCache> = std::sync::OnceLock::new();
/// Instants held in [`STAT_CACHE`] before it starts over.
const STAT_CACHE_LIMIT: usize = 100_000;

impl CommittedLogs {
    /// Reads the write stats of every completed data instant of `timeline` (cached).
    pub async fn load(storage: &Storage, timeline: &Timeline) -> Result<Self> {
        Self::load_of(storage, timeline, |_| true).await
    }

    /// [`CommittedLogs::load`], keeping only the files `keep` picks (those of some file groups):
    /// a plan of a few groups in a large table copies their files alone.
    pub async fn load_of(storage: &Storage, timeline: &Timeline, keep: impl Fn(&CommittedLog) -> bool) -> Result<Self> {
        use futures::{StreamExt, TryStreamExt};
        let cache = STAT_CACHE.get_or_init(Default::default);
        let instants: Vec<_> = timeline.completed_data().collect();
        let cached: Vec<Option<InstantLogs>> = {
            let cache = cache.lock().map_err(|_| Error::invalid_data("log stat cache poisoned"))?;
            instants.iter().map(|i| cache.get(&stat_key(storage, timeline, i)).cloned()).collect()
        };
        let missing: Vec<crate::format::instant::Instant> =
            instants.iter().zip(&cached).filter(|(_, c)| c.is_none()).map(|(i, _)| (*i).clone()).collect();
        // Futures collected first: a stream of closures borrowing here would not be `Send`.
        let fetches: Vec<_> = missing.into_iter().map(|i| fetch_log_stats(storage, timeline, i)).collect();
        let fetched: Vec<(String, InstantLogs)> =
            futures::stream::iter(fetches).buffer_unordered(16).try_collect().await?;
        if !fetched.is_empty() {
            let mut cache = cache.lock().map_err(|_| Error::invalid_data("log stat cache poisoned"))?;
            if cache.len() + fetched.len() > STAT_CACHE_LIMIT {
                cache.clear();
            }
            cache.extend(fetched.iter().cloned());
        }
        let mut by_path: HashMap<String, CommittedLog> = HashMap::new();
        let mut bases = Vec::new();
        for logs in cached.into_iter().flatten().chain(fetched.into_iter().map(|(_, l)| l)) {
            for (path, log) in logs.iter().filter(|(_, log)| keep(log)) {
                if !is_log(path) {
                    bases.push((path.clone(), log.clone()));
                    continue;
                }
                match by_path.get(path) {
                    Some(seen) if seen.end >= log.end => {}
                    _ => {
                        by_path.insert(path.clone(), log.clone());
                    }
                }
            }
        }
        Ok(CommittedLogs { by_path, bases })
    }

    /// One log file a completed instant wrote `end` bytes into (a commit not on the caller's
    /// timeline yet).
    pub fn of(path: &str, partition: &str, file_id: &str, end: u64, instant: &str) -> Self {
        let log = CommittedLog {
            partition: partition.to_string(),
            file_id: file_id.to_string(),
            end,
            instant: instant.to_string(),
        };
        CommittedLogs { by_path: HashMap::from([(path.to_string(), log)]), bases: Vec::new() }
    }

    /// Every base file completed instants wrote, with its path.
    pub fn bases(&self) -> impl Iterator<Item = &(String, CommittedLog)> {
        self.bases.iter()
    }

    /// What completed instants wrote into a log file, if any did.
    pub fn get(&self, path: &str) -> Option<&CommittedLog> {
        self.by_path.get(path)
    }

    /// Every committed log file, with its path.
    pub fn iter(&self) -> impl Iterator<Item = (&String, &CommittedLog)> {
        self.by_path.iter()
    }
}

/// Whether a path names a log file.
fn is_log(path: &str) -> bool {
    LogFileName::parse(path.rsplit('/').next().unwrap_or(path)).is_some()
}

/// The key of an instant in [`STAT_CACHE`].
fn stat_key(storage: &Storage, timeline: &Timeline, instant: &crate::format::instant::Instant) -> String {
    // With the file's version: a completed instant written again under the same name (version 6
    // names it by its requested time alone) has other contents.
    let version = timeline.version_of(instant).unwrap_or_default();
    format!("{}/{}#{version}", storage.uri(), timeline.path_of(instant))
}

/// The log files a completed instant's write stats name, keyed for [`STAT_CACHE`].
async fn fetch_log_stats(
    storage: &Storage,
    timeline: &Timeline,
    i: crate::format::instant::Instant,
) -> Result<(String, InstantLogs)> {
    let meta = timeline.commit_metadata(storage, &i).await?;
    let logs = meta
        .write_stats()
        .filter_map(|(partition, s)| {
            let path = s.path.as_deref()?;
            // Log files, and the base files a read checks are there (see `bases`).
            let name = path.rsplit('/').next().unwrap_or(path);
            if !is_log(path) && crate::format::file_name::BaseFileName::parse(name).is_none() {
                return None;
            }
            let end = s.log_offset.unwrap_or(0).max(0).saturating_add(s.file_size_in_bytes.max(0));
            let log = CommittedLog {
                partition: partition.to_string(),
                file_id: s.file_id.clone(),
                end: end as u64,
                instant: i.time.clone(),
            };
            Some((path.to_string(), log))
        })
        .collect();
    Ok((stat_key(storage, timeline, &i), Arc::new(logs)))
}

/// The admitted content of a slice's logs, in log order.
#[derive(Debug)]
pub enum LogContent {
    /// Records of a data block, in the table schema.
    Records {
        /// Instant time of the block (its \`INSTANT_TIME\` header).
        instant: String,
        /// The records.
        batch: RecordBatch,
    },
    /// Keys deleted by a delete block.
    Deletes {
        /// Instant time of the block (its \`INSTANT_TIME\` header).
        instant: String,
        /// The deleted keys.
        records: Vec<DeleteRecord>,
    },
}

/// One block with where it came from (for messages).
struct Located {
    path: String,
    block: LogBlock,
}

/// The blocks of a log file's bytes. `committed` is what completed instants wrote into it: the
/// file must hold all of it, and every block inside it must parse. A damaged span past it is the
/// torn tail of a writer that never committed: skipped, as Apache Hudi skips corrupt blocks.
pub fn checked_blocks(path: &str, data: &Bytes, committed: Option<&CommittedLog>) -> Result<Vec<LogBlock>> {
    if let Some(c) = committed
        && (data.len() as u64) < c.end
    {
        return Err(Error::corrupt(
            path,
            format!(
                "the log file holds {} bytes, but instant {} wrote {} into it (truncated)",
                data.len(),
                c.instant,
                c.end
            ),
        ));
    }
    let mut out = Vec::new();
    for parsed in log_block::parse_blocks(data) {
        match parsed {
            Parsed::Block { block, .. } => out.push(block),
            Parsed::Corrupt { offset, len, reason } => match committed {
                Some(c) if (offset as u64) < c.end => {
                    return Err(Error::corrupt(
                        path,
                        format!(
                            "damaged log block at byte {offset} ({len} bytes: {reason}) inside the {} bytes \
                             completed instant {} wrote",
                            c.end, c.instant
                        ),
                    ));
                }
                _ => log::warn!(
                    "{path}: skipping a damaged log block at byte {offset} ({len} bytes: {reason}), written by \
                     no completed instant (a torn write)"
                ),
            },
        }
    }
    Ok(out)
}

/// Reads the blocks of every log file, in order, checked against `committed` (without it, damaged
/// blocks are skipped: for callers that only route or inspect, never return rows).
async fn read_blocks(storage: &Storage, logs: &[LogFile], committed: Option<&CommittedLogs>) -> Result<Vec<Located>> {
    let mut out = Vec::new();
    for log in logs {
        let written = committed.and_then(|c| c.get(&log.path));
        let data = match storage.get_opt(&log.path).await? {
            Some(data) => data,
            // A log file a write wrote and its rollback deleted after this read listed it held
            // nothing committed: no completed instant names it.
            None if committed.is_some() && written.is_none() => {
                log::info!("{}: gone since it was listed, and never committed: skipped", log.path);
                continue;
            }
            None => {
                let why = "gone while this read ran (a clean that keeps fewer commits than the read takes?)";
                let source = object_store::Error::NotFound { path: log.path.clone(), source: why.into() };
                return Err(Error::storage(&log.path, source));
            }
        };
        out.extend(
            checked_blocks(&log.path, &data, written)?
                .into_iter()
                .map(|block| Located { path: log.path.clone(), block }),
        );
    }
    Ok(out)
}

/// The instants of the log-compacted blocks among `blocks` that `admitted` admits and a read skips.
/// Apache Hudi's log compaction writes the merged records of a slice's blocks as blocks of its own
/// instant, whose header `COMPACTED_BLOCK_TIMES` lists the instants merged, and leaves those blocks
/// in place. Reads skip the compacted blocks and merge the originals, in commit order as every
/// other block: a compacted block read after them would put its merged rows over a block it never
/// saw (one whose instant completed after the log compaction was planned), where Apache Hudi puts
/// it in the place of the newest block it merged. One none of whose originals are in the slice (a
/// log compaction completing after a compaction of its slice was planned: on timeline layout 2 its
/// file joins the new slice) stands for nothing there, and Apache Hudi skips it too. One only some
/// of whose originals are admitted in the slice cannot be read in their place: with `strict`, an
/// `UnsupportedError` naming its file; without, it is read (not skipped).
fn log_compacted(blocks: &[Located], admitted: impl Fn(&str) -> bool, strict: bool) -> Result<HashSet<String>> {
    let present: HashSet<&str> = blocks
        .iter()
        .filter(|b| matches!(b.block.block_type, BlockType::AvroData | BlockType::ParquetData | BlockType::Delete))
        .filter_map(|b| b.block.instant())
        .filter(|i| admitted(i))
        .collect();
    let mut skipped = HashSet::new();
    for Located { path, block } in blocks {
        let (Some(instant), Some(times)) = (block.instant(), block.header.get(&HeaderKey::CompactedBlockTimes)) else {
            continue;
        };
        if !admitted(instant) {
            continue;
        }
        let times: Vec<&str> = times.split(',').map(str::trim).filter(|t| !t.is_empty()).collect();
        match times.iter().find(|t| !present.contains(**t)) {
            Some(missing) if times.iter().any(|t| present.contains(*t)) => {
                if strict {
                    return Err(Error::unsupported(format!(
                        "{path}: a log-compacted block of instant {instant} merges the blocks of {missing}, which are \
                         not in its file slice, with others that are: it cannot be read in their place"
                    )));
                }
            }
            _ => {
                skipped.insert(instant.to_string());
            }
        }
    }
    Ok(skipped)
}

/// Reads and decodes the admitted blocks of a slice's logs into `schema` (the full table schema).
/// `columns`: how blocks of older schema versions name the columns (see [`ColumnHistory`]).
pub async fn read_slice(
    storage: &Storage,
    logs: &[LogFile],
    schema: &SchemaRef,
    admission: &Admission,
    columns: Option<&ColumnHistory>,
) -> Result<Vec<LogContent>> {
    let mut out = Vec::new();
    for_each_in_slice(storage, logs, schema, admission, columns, |content| {
        out.push(content);
        Ok(())
    })
    .await?;
    Ok(out)
}

/// [`read_slice`], handing each decoded block to `each` in log order as it is decoded: only one
/// block's records are decoded at a time (the log files' bytes are read first, whole).
pub async fn for_each_in_slice(
    storage: &Storage,
    logs: &[LogFile],
    schema: &SchemaRef,
    admission: &Admission,
    columns: Option<&ColumnHistory>,
    mut each: impl FnMut(LogContent) -> Result<()>,
) -> Result<()> {
    let committed = admission.committed(storage).await?;
    let blocks = read_blocks(storage, logs, Some(committed.as_ref())).await?;
    let rolled_back: HashSet<String> =
        blocks.iter().filter_map(|b| b.block.rollback_target().map(str::to_string)).collect();
    let compacted = log_compacted(&blocks, |i| admission.admits(i) && !rolled_back.contains(i), true)?;
    for Located { path, block } in blocks {
        let Some(instant) = block.instant().map(str::to_string) else {
            log::warn!("{path}: skipping a {:?} block without an instant time", block.block_type);
            continue;
        };
        if !matches!(block.block_type, BlockType::AvroData | BlockType::ParquetData | BlockType::Delete)
            || !admission.admits(&instant)
            || rolled_back.contains(&instant)
            || compacted.contains(&instant)
        {
            if matches!(block.block_type, BlockType::HFileData | BlockType::CdcData | BlockType::Corrupt) {
                log::warn!("{path}: skipping a {:?} block (not a record block)", block.block_type);
            }
            continue;
        }
        let view = columns.and_then(|c| c.columns_at(&instant));
        decode_block(&path, &block, instant, schema, view.as_deref(), &mut each)?;
    }
    Ok(())
}

/// Every record and delete of a log file's bytes, of any instant (no admission rules): what the
/// file could contribute to a read. Damaged blocks are skipped as reads skip them; a block that
/// parses but does not decode is an error. Pure, without IO: the fuzz target drives it.
pub fn decode_file(path: &str, data: &Bytes, schema: &SchemaRef) -> Result<Vec<LogContent>> {
    let mut out = Vec::new();
    for parsed in log_block::parse_blocks(data) {
        if let Parsed::Block { block, .. } = parsed {
            let instant = block.instant().unwrap_or_default().to_string();
            decode_block(path, &block, instant, schema, None, &mut |content| {
                out.push(content);
                Ok(())
            })?;
        }
    }
    Ok(out)
}

/// Decodes a data or delete block, handing its contents to `each` (other blocks hold no records).
fn decode_block(
    path: &str,
    block: &LogBlock,
    instant: String,
    schema: &SchemaRef,
    view: Option<&FileColumns>,
    each: &mut impl FnMut(LogContent) -> Result<()>,
) -> Result<()> {
    if block.block_type == BlockType::Delete {
        let records = log_block::decode_deletes(&block.content).map_err(|e| Error::corrupt(path, e))?;
        return each(LogContent::Deletes { instant, records });
    }
    // Apache Hudi 1.x's partial updates hold only the columns they change: read as whole rows,
    // the others would come out null (and a compaction would write those nulls for good).
    if block.header.get(&HeaderKey::IsPartial).is_some_and(|v| v.eq_ignore_ascii_case("true")) {
        return Err(Error::unsupported(format!(
            "{path}: a partial-update log block (IS_PARTIAL) of instant {instant}: its records hold only \
             the columns they change"
        )));
    }
    for batch in FileColumns::read_into(view, schema, |s| decode_records(path, block, s))? {
        each(LogContent::Records { instant: instant.clone(), batch })?;
    }
    Ok(())
}

/// A reader of the Parquet file a data block holds, once its footer has been checked against the
/// block: every column chunk must lie inside it (the Parquet reader asserts that, and a damaged
/// block must be an error, not a panic).
fn parquet_block_reader(path: &str, content: &Bytes) -> Result<ParquetRecordBatchReaderBuilder<Bytes>> {
    let builder = ParquetRecordBatchReaderBuilder::try_new(content.clone()).map_err(|e| Error::corrupt(path, e))?;
    let len = i64::try_from(content.len()).unwrap_or(i64::MAX);
    for column in builder.metadata().row_groups().iter().flat_map(|rg| rg.columns()) {
        let start = column.dictionary_page_offset().unwrap_or_else(|| column.data_page_offset());
        let size = column.compressed_size();
        if start < 0 || size < 0 || start.checked_add(size).is_none_or(|end| end > len) {
            return Err(Error::corrupt(
                path,
                format!("a column chunk at {start} of {size} bytes lies outside the block"),
            ));
        }
    }
    Ok(builder)
}

/// What `decode` makes of a Parquet data block of the log file at `path`. A damaged block can make
/// the Parquet decoder panic (arrow's bounds checks on definition levels): that is an error
/// naming the file, never a crash.
fn parquet_block_decoded(path: &str, decode: impl FnOnce() -> Result<Vec<RecordBatch>>) -> Result<Vec<RecordBatch>> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(decode))
        .map_err(|_| Error::corrupt(path, "the Parquet decoder failed on a damaged log block"))?
}

/// The records of a data block (Parquet or Avro) decoded into `schema`; none for other blocks.
fn decode_records(path: &str, block: &LogBlock, schema: &SchemaRef) -> Result<Vec<RecordBatch>> {
    let mut out = Vec::new();
    match block.block_type {
        BlockType::ParquetData => {
            out = parquet_block_decoded(path, || {
                let reader = parquet_block_reader(path, &block.content)?
                    .with_batch_size(DECODE_BATCH)
                    .build()
                    .map_err(|e| Error::corrupt(path, e))?;
                reader.map(|batch| schema::align(&batch.map_err(|e| Error::corrupt(path, e))?, schema)).collect()
            })?;
        }
        BlockType::AvroData => {
            let writer_schema = block
                .header
                .get(&HeaderKey::Schema)
                .ok_or_else(|| Error::corrupt(path, "Avro data block without a schema header"))?;
            let reader = DatumReader::new(writer_schema, schema.clone()).map_err(|e| Error::corrupt(path, e))?;
            let datums = log_block::avro_datums(&block.content).map_err(|e| Error::corrupt(path, e))?;
            for chunk in datums.chunks(DECODE_BATCH) {
                out.push(reader.read(chunk.iter().copied()).map_err(|e| Error::corrupt(path, e))?);
            }
        }
        _ => {}
    }
    Ok(out)
}

/// Every record of a log file's data blocks, of any instant, decoded into the columns of `schema`
/// that the blocks were written with (the bounds of what the file may contribute to a read: the
/// file-level indexes describe it as its writer did; a column added to the table since is not in
/// the file). A column some blocks lack is null in their rows. With the records, the columns
/// they were decoded into.
pub async fn file_records(storage: &Storage, path: &str, schema: &SchemaRef) -> Result<(SchemaRef, Vec<RecordBatch>)> {
    let log = LogFile {
        name: LogFileName::parse(path.rsplit('/').next().unwrap_or(path))
            .ok_or_else(|| Error::corrupt(path, "not a log file name"))?,
        path: path.to_string(),
        size: 0,
    };
    let blocks = read_blocks(storage, std::slice::from_ref(&log), None).await?;
    let mut written: HashSet<String> = HashSet::new();
    for Located { path, block } in &blocks {
        written.extend(written_columns(path, block)?);
    }
    let fields: Vec<_> = schema.fields().iter().filter(|f| written.contains(f.name())).cloned().collect();
    let own: SchemaRef = Arc::new(arrow::datatypes::Schema::new(fields));
    let mut out = Vec::new();
    for Located { path, block } in &blocks {
        out.extend(decode_records(path, block, &own)?);
    }
    Ok((own, out))
}

/// The top-level columns a data or delete block was written with (none for other blocks).
fn written_columns(path: &str, block: &LogBlock) -> Result<Vec<String>> {
    match block.block_type {
        BlockType::ParquetData => {
            let reader = parquet_block_reader(path, &block.content)?;
            Ok(reader.schema().fields().iter().map(|f| f.name().clone()).collect())
        }
        // A delete block names the schema of its writer too (a log of deletes alone has no other).
        BlockType::Delete if !block.header.contains_key(&HeaderKey::Schema) => Ok(Vec::new()),
        BlockType::AvroData | BlockType::Delete => {
            let writer = block
                .header
                .get(&HeaderKey::Schema)
                .ok_or_else(|| Error::corrupt(path, "Avro data block without a schema header"))?;
            let parsed: serde_json::Value = serde_json::from_str(writer).map_err(|e| Error::corrupt(path, e))?;
            let fields = parsed["fields"].as_array().ok_or_else(|| Error::corrupt(path, "block schema: no fields"))?;
            Ok(fields.iter().filter_map(|f| f["name"].as_str().map(str::to_string)).collect())
        }
        _ => Ok(Vec::new()),
    }
}

/// The record keys of the data and delete blocks of some log files, each with whether its last
/// block (in log order) wrote it (`true`) or deleted it (`false`). Any instant counts: a key found in
/// a block that never committed only routes a write to the group that would have held it. With
/// `committed`, a damaged block inside what completed instants wrote is an error, as for reads (a
/// key left out would be routed to a second file group).
pub async fn record_keys(
    storage: &Storage,
    logs: &[LogFile],
    committed: Option<&CommittedLogs>,
    stored: &crate::keys::StoredKeys,
) -> Result<HashMap<String, bool>> {
    let blocks = read_blocks(storage, logs, committed).await?;
    // Any instant counts here; a compacted block that cannot stand for its originals is kept (its
    // keys route writes to its group).
    let compacted = log_compacted(&blocks, |_| true, false)?;
    let blocks = blocks.into_iter().filter(|b| b.block.instant().is_none_or(|i| !compacted.contains(i))).collect();
    let keys = keys_of_blocks(blocks, stored, |_| true)?;
    Ok(keys.into_iter().map(|(k, state)| (k, state == KeyState::Written)).collect())
}

/// The record keys of the data and delete blocks of some log files that `admission` admits
/// (instants up to its upper that its timeline shows completed), rolled back or compacted alike:
/// every key a merge of those files up to that instant, or up to an earlier one, may return or
/// hide (tables with meta fields), those `keep` keeps. What completed instants wrote must be there
/// and whole, as for a merge; a file no completed instant wrote is not needed, so a rollback
/// deleting a failed write's file while a read runs leaves the keys as they were.
pub async fn admitted_record_keys(
    storage: &Storage,
    logs: &[LogFile],
    admission: &Admission,
    keep: impl Fn(&str) -> bool,
) -> Result<HashSet<String>> {
    let committed = admission.committed(storage).await?;
    let blocks = read_blocks(storage, logs, Some(committed.as_ref())).await?;
    let admitted = blocks.into_iter().filter(|b| b.block.instant().is_some_and(|i| admission.admits(i))).collect();
    Ok(keys_of_blocks(admitted, &crate::keys::StoredKeys::Meta, keep)?.into_keys().collect())
}

/// What the last block of a slice's logs holding a key did to it. Ordered from the state a write
/// finds most to its liking: a key written beats one held deleted.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum KeyState {
    /// Wrote it (an insert or an update).
    Written,
    /// Deleted it with an ordering value (event-time ordering: the delete may lose to the record
    /// before it, and hides a later version with a lower ordering value).
    DeletedByOrder,
    /// Deleted it whatever came before (no ordering value, or Apache Hudi's default `Int(0)`).
    Deleted,
}

/// [`record_keys`] of the blocks a snapshot's merge reads (instants `timeline` shows committed,
/// no rollback block cancels), with what the last of them did to each key: the keys a reader
/// sees, and those it sees deleted (the record index is built from them).
pub async fn committed_record_keys(
    storage: &Storage,
    logs: &[LogFile],
    committed: &CommittedLogs,
    stored: &crate::keys::StoredKeys,
    timeline: &Timeline,
) -> Result<HashMap<String, KeyState>> {
    let blocks = read_blocks(storage, logs, Some(committed)).await?;
    let rolled_back: HashSet<String> =
        blocks.iter().filter_map(|b| b.block.rollback_target().map(str::to_string)).collect();
    let admits = |i: &str| timeline.is_committed(i) && !rolled_back.contains(i);
    let compacted = log_compacted(&blocks, admits, true)?;
    let admitted =
        blocks.into_iter().filter(|b| b.block.instant().is_some_and(|i| admits(i) && !compacted.contains(i))).collect();
    keys_of_blocks(admitted, stored, |_| true)
}

/// The keys of the data and delete blocks among `blocks` (in log order) that `keep` keeps, each
/// with what the last of them did to it.
fn keys_of_blocks(
    blocks: Vec<Located>,
    stored: &crate::keys::StoredKeys,
    keep: impl Fn(&str) -> bool,
) -> Result<HashMap<String, KeyState>> {
    let mut keys = HashMap::new();
    for Located { path, block } in blocks {
        let batches: Vec<RecordBatch> = match block.block_type {
            BlockType::Delete => {
                let deletes = log_block::decode_deletes(&block.content).map_err(|e| Error::corrupt(&path, e))?;
                keys.extend(deletes.into_iter().filter_map(|d| {
                    let state = if d.ordering.is_commit_time() { KeyState::Deleted } else { KeyState::DeletedByOrder };
                    d.record_key.filter(|k| keep(k)).map(|k| (k, state))
                }));
                continue;
            }
            BlockType::ParquetData => parquet_block_decoded(&path, || {
                let builder = parquet_block_reader(&path, &block.content)?;
                let mask = parquet::arrow::ProjectionMask::columns(builder.parquet_schema(), stored.columns());
                let reader = builder.with_projection(mask).build().map_err(|e| Error::corrupt(&path, e))?;
                reader.map(|batch| batch.map_err(|e| Error::corrupt(&path, e))).collect()
            })?,
            BlockType::AvroData => {
                let Some(writer_schema) = block.header.get(&HeaderKey::Schema) else { continue };
                let reader = DatumReader::new(writer_schema, stored.schema()).map_err(|e| Error::corrupt(&path, e))?;
                let datums = log_block::avro_datums(&block.content).map_err(|e| Error::corrupt(&path, e))?;
                vec![reader.read(datums).map_err(|e| Error::corrupt(&path, e))?]
            }
            _ => continue,
        };
        for b in batches {
            let written = stored.keys_in(&b, &path)?;
            keys.extend(written.iter().flatten().filter(|k| keep(k)).map(|k| (k.to_string(), KeyState::Written)));
        }
    }
    Ok(keys)
}

/// The instants whose blocks a log file holds, reading headers only as far as needed.
pub async fn block_instants(storage: &Storage, path: &str) -> Result<Vec<String>> {
    // A file removed since it was listed (a clean of its slice) holds no blocks any more.
    let Some(data) = storage.get_opt(path).await? else { return Ok(Vec::new()) };
    Ok(log_block::parse_blocks(&data)
        .into_iter()
        .filter_map(|p| match p {
            Parsed::Block { block, .. } => block.instant().map(str::to_string),
            Parsed::Corrupt { .. } => None,
        })
        .collect())
}

/// A Parquet data block of `batch` (the full table schema, meta fields first). Columns unique per
/// row (sequence numbers, record keys, and the columns `unique` names) are written without
/// dictionaries: one would be built only to be thrown away. Blocks are read whole: no statistics.
pub fn parquet_block(instant: &str, batch: &RecordBatch, table_name: &str, unique: &[&str]) -> Result<LogBlock> {
    let props = [schema::COMMIT_SEQNO, schema::RECORD_KEY]
        .iter()
        .chain(unique)
        .fold(
            WriterProperties::builder()
                .set_compression(Compression::SNAPPY)
                .set_statistics_enabled(EnabledStatistics::None),
            |props, column| props.set_column_dictionary_enabled(ColumnPath::from(*column), false),
        )
        .build();
    let mut writer = ArrowWriter::try_new(Vec::new(), batch.schema(), Some(props))?;
    writer.write(batch)?;
    let bytes = writer.into_inner()?;
    let mut block = LogBlock::new(BlockType::ParquetData, instant, Bytes::from(bytes));
    let data = schema::without_meta_fields(&batch.schema());
    block.header.insert(HeaderKey::Schema, schema::to_avro_with_meta(&data, table_name)?);
    Ok(block)
}

/// A delete block.
pub fn delete_block(instant: &str, records: &[DeleteRecord], data_schema: &SchemaRef, table: &str) -> Result<LogBlock> {
    let mut block = LogBlock::new(BlockType::Delete, instant, log_block::encode_deletes(records));
    block.header.insert(HeaderKey::Schema, schema::to_avro_with_meta(data_schema, table)?);
    Ok(block)
}

/// Writes `blocks` as a new log file of a file group: the version after `after_version`, or the
/// next free one if another writer took it. Returns the file written.
pub async fn write_new(
    storage: &Storage,
    partition: &str,
    file_id: &str,
    base_instant: &str,
    write_token: &str,
    after_version: u32,
    blocks: &[LogBlock],
) -> Result<LogFile> {
    let mut data = Vec::new();
    for b in blocks {
        data.extend_from_slice(&b.encode());
    }
    let data = Bytes::from(data);
    for version in (after_version + 1..).take(100) {
        let name = LogFileName {
            file_id: file_id.to_string(),
            instant: base_instant.to_string(),
            extension: "log".into(),
            version,
            write_token: write_token.to_string(),
        };
        let path = crate::format::file_name::file_path(partition, &name.name());
        if storage.put_if_absent(&path, data.clone()).await? {
            return Ok(LogFile { name, path, size: data.len() as u64 });
        }
    }
    Err(Error::CommitConflict {
        instant: base_instant.to_string(),
        detail: format!("no free log version for file group {file_id}"),
    })
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow::datatypes::{DataType, Field, Schema};

    use super::*;

    /// A read whose table listed the timeline before an archival moved instants it reads into
    /// the archive answers as a read planned after it: the write stats of a snapshot's instants
    /// are not checked any more, and an incremental window's file groups come from the archive.
    /// (Seen in the stress suite: a reader failing on an instant file archived under it.)
    #[tokio::test]
    async fn a_read_planned_before_an_archival_reads_the_instants_it_archived() {
        use arrow::array::{Array, Int64Array};
        use futures::TryStreamExt;

        use crate::config::TableType;
        use crate::read::{QueryType, ScanOptions};
        use crate::services::{ArchiveConfig, CompactionConfig};
        use crate::table::{Table, TableOptions};
        use crate::test_support::{by_parity, id_city_table};
        use crate::write::{WriteConfig, WriteOperation};

        async fn ids(table: &Table, opts: &ScanOptions) -> Vec<i64> {
            let batches: Vec<RecordBatch> = table.scan(opts).await.unwrap().try_collect().await.unwrap();
            let mut ids: Vec<i64> = batches
                .iter()
                .flat_map(|b| {
                    let col = b.column_by_name("id").unwrap().as_any().downcast_ref::<Int64Array>().unwrap();
                    (0..col.len()).map(|i| col.value(i)).collect::<Vec<_>>()
                })
                .collect();
            ids.sort();
            ids
        }

        let dir = tempfile::tempdir().unwrap();
        let mut t = id_city_table(dir.path(), TableType::MergeOnRead, TableOptions::default()).await;
        let config = WriteConfig::default();
        let first = t.write(WriteOperation::Insert, vec![by_parity(&[1, 2, 3, 4])], &config).await.unwrap();
        for id in 1..=4 {
            t.write(WriteOperation::Upsert, vec![by_parity(&[id])], &config).await.unwrap();
        }
        t.compact(&CompactionConfig::default()).await.unwrap();
        t.write(WriteOperation::Upsert, vec![by_parity(&[1])], &config).await.unwrap();
        t.write(WriteOperation::Insert, vec![by_parity(&[5])], &config).await.unwrap();
        let stale = Table::open(t.uri(), t.options().clone()).await.unwrap();
        let first = first.instant.unwrap();
        let since_first =
            ScanOptions { query: QueryType::Incremental, start: Some(first.clone()), ..Default::default() };
        t.archive(ArchiveConfig { min_commits: 2, max_commits: 3 }).await.unwrap();
        assert!(t.timeline().write_timeline_start().is_some_and(|s| first.as_str() < s), "archived past {first}");
        STAT_CACHE.get_or_init(Default::default).lock().unwrap().clear();
        assert_eq!(ids(&stale, &ScanOptions::default()).await, vec![1, 2, 3, 4, 5]);
        let fresh = Table::open(t.uri(), t.options().clone()).await.unwrap();
        assert_eq!(ids(&stale, &since_first).await, ids(&fresh, &since_first).await);
        assert_eq!(ids(&fresh, &since_first).await, vec![1, 2, 3, 4, 5]);
    }

    /// Apache Hudi's log compaction writes the merged records of some blocks as blocks of its own
    /// instant listing theirs (`COMPACTED_BLOCK_TIMES`), and leaves them in place. A deltacommit
    /// that completed after it was planned is not in its blocks but comes before them in the log:
    /// read after it, the compacted rows would bring a deleted row back and an older version over
    /// a newer one. Reads take the blocks it merged instead, in commit order.
    #[tokio::test]
    async fn a_log_compacted_block_is_read_as_the_blocks_it_merged() {
        use arrow::array::{Array, Int64Array, StringArray};
        use arrow::compute::concat_batches;
        use futures::TryStreamExt;

        use crate::config::TableType;
        use crate::format::commit::CommitMetadata;
        use crate::format::instant::{Action, Instant, State};
        use crate::format::log_block::OrderingVal;
        use crate::read::ScanOptions;
        use crate::services::CompactionConfig;
        use crate::table::{Table, TableOptions};
        use crate::write::{WriteConfig, WriteOperation};

        let schema: SchemaRef = Arc::new(Schema::new(vec![
            Field::new("id", DataType::Int64, false),
            Field::new("city", DataType::Utf8, true),
            Field::new("v", DataType::Int64, true),
        ]));
        let rows = |r: &[(i64, i64)]| {
            let ids: Vec<i64> = r.iter().map(|x| x.0).collect();
            let vs: Vec<i64> = r.iter().map(|x| x.1).collect();
            let columns: Vec<arrow::array::ArrayRef> = vec![
                Arc::new(Int64Array::from(ids)),
                Arc::new(StringArray::from(vec!["b"; r.len()])),
                Arc::new(Int64Array::from(vs)),
            ];
            RecordBatch::try_new(schema.clone(), columns).unwrap()
        };
        async fn values(t: &Table, as_of: Option<&str>) -> crate::error::Result<Vec<(i64, i64)>> {
            let opts = ScanOptions { as_of: as_of.map(str::to_string), ..Default::default() };
            let batches: Vec<RecordBatch> = t.scan(&opts).await?.try_collect().await?;
            let mut out: Vec<(i64, i64)> = batches
                .iter()
                .flat_map(|b| {
                    let id = b.column_by_name("id").unwrap().as_any().downcast_ref::<Int64Array>().unwrap().clone();
                    let v = b.column_by_name("v").unwrap().as_any().downcast_ref::<Int64Array>().unwrap().clone();
                    (0..id.len()).map(move |i| (id.value(i), v.value(i)))
                })
                .collect();
            out.sort();
            Ok(out)
        }
        /// Writes a log-compacted file of instant `time` merging `times` ((1, `v`) written, 3 deleted)
        /// after the slice's last log file, and completes `time` as Apache Hudi does.
        async fn log_compaction(t: &mut Table, time: &str, times: &str, merged: &RecordBatch, schema: &SchemaRef) {
            let view = t.file_system_view().await.unwrap();
            let latest = t.timeline().latest_completed_data().unwrap().time.clone();
            let replaced = HashSet::new();
            let (group, slice) = view.slices_as_of(&latest, &replaced).next().unwrap();
            let mut data = parquet_block(time, merged, "t", &[]).unwrap();
            let delete = DeleteRecord {
                record_key: Some("3".into()),
                partition_path: Some("city=b".into()),
                ordering: OrderingVal::COMMIT_TIME,
            };
            let mut deletes = delete_block(time, &[delete], schema, "t").unwrap();
            for block in [&mut data, &mut deletes] {
                block.header.insert(HeaderKey::CompactedBlockTimes, times.to_string());
            }
            let last = slice.logs.last().unwrap().name.version;
            write_new(
                t.storage(),
                &group.partition,
                &group.file_id,
                &slice.base_instant,
                "1-0-1",
                last,
                &[data, deletes],
            )
            .await
            .unwrap();
            for state in [State::Requested, State::Inflight] {
                let path = t.timeline().path_of(&Instant::new(time, Action::LogCompaction, state));
                t.storage().put(&path, Bytes::new()).await.unwrap();
            }
            let meta = CommitMetadata { operation_type: Some("LOG_COMPACT".into()), ..Default::default() };
            let path = t.timeline().path_of(&Instant::new(time, Action::DeltaCommit, State::Completed));
            t.storage().put(&path, Bytes::from(meta.to_json().unwrap())).await.unwrap();
            t.reload().await.unwrap();
        }

        let dir = tempfile::tempdir().unwrap();
        let options = TableOptions::default();
        let mut t = crate::test_support::keyed_table(dir.path(), TableType::MergeOnRead, options, schema.clone()).await;
        let config = WriteConfig::default();
        t.write(WriteOperation::Insert, vec![rows(&[(1, 0), (3, 0)])], &config).await.unwrap();
        let i1 = t.write(WriteOperation::Upsert, vec![rows(&[(1, 10)])], &config).await.unwrap().instant.unwrap();
        let i2 = t.write(WriteOperation::Delete, vec![rows(&[(3, 0)])], &config).await.unwrap().instant.unwrap();
        // What a log compaction planned here merges: the logs' records (id 1 at 10; 3 deleted).
        let merged: Vec<RecordBatch> = t
            .scan(&ScanOptions { as_of: Some(i2.clone()), ..Default::default() })
            .await
            .unwrap()
            .try_collect()
            .await
            .unwrap();
        let merged = concat_batches(&merged[0].schema(), &merged).unwrap();
        assert_eq!(merged.num_rows(), 1, "id 1 only");
        // A deltacommit completing before the log compaction writes: id 1 updated, 3 inserted again.
        t.write(WriteOperation::Upsert, vec![rows(&[(1, 20), (3, 30)])], &config).await.unwrap();
        let i3 = crate::format::instant::now();
        log_compaction(&mut t, &i3, &format!("{i1},{i2}"), &merged, &schema).await;
        assert_eq!(values(&t, None).await.unwrap(), vec![(1, 20), (3, 30)]);
        assert_eq!(values(&t, Some(&i2)).await.unwrap(), vec![(1, 10)]);
        t.compact(&CompactionConfig::default()).await.unwrap();
        assert_eq!(values(&t, None).await.unwrap(), vec![(1, 20), (3, 30)]);

        t.write(WriteOperation::Upsert, vec![rows(&[(1, 40)])], &config).await.unwrap();
        // One none of whose merged blocks are in the slice (a log compaction of the slice before
        // the compaction, completing after it was planned) stands for nothing here: skipped.
        let i4 = crate::format::instant::now();
        log_compaction(&mut t, &i4, &format!("{i1},{i2}"), &merged, &schema).await;
        assert_eq!(values(&t, None).await.unwrap(), vec![(1, 40), (3, 30)]);
        // One only some of whose merged blocks are in the slice cannot stand for them.
        let i5 = crate::format::instant::now();
        log_compaction(&mut t, &i5, &format!("19990101000000000,{i4}"), &merged, &schema).await;
        match values(&t, None).await {
            Err(Error::Unsupported { feature }) => {
                assert!(feature.contains(".log.") && feature.contains("19990101000000000"), "{feature}")
            }
            other => panic!("expected an unsupported-feature error, got {other:?}"),
        }
    }

    #[test]
    fn a_partial_update_block_is_refused_naming_the_file() {
        let fields = vec![Field::new("id", DataType::Int64, false), Field::new("name", DataType::Utf8, true)];
        let schema: SchemaRef = crate::schema::with_meta_fields(&Schema::new(fields));
        let columns: Vec<arrow::array::ArrayRef> = schema
            .fields()
            .iter()
            .map(|f| match f.data_type() {
                DataType::Int64 => Arc::new(arrow::array::Int64Array::from(vec![1])) as _,
                _ => Arc::new(arrow::array::StringArray::from(vec!["x"])) as _,
            })
            .collect();
        let batch = RecordBatch::try_new(schema.clone(), columns).unwrap();
        let mut block = parquet_block("20260101000000000", &batch, "t", &[]).unwrap();
        let whole = Bytes::from(block.encode());
        assert_eq!(decode_file("p.log", &whole, &schema).unwrap().len(), 1);
        block.header.insert(HeaderKey::IsPartial, "true".into());
        let partial = Bytes::from(block.encode());
        match decode_file("p.log", &partial, &schema) {
            Err(Error::Unsupported { feature }) => assert!(feature.contains("p.log") && feature.contains("IS_PARTIAL")),
            other => panic!("expected an unsupported-feature error, got {:?}", other.map(|b| b.len())),
        }
    }

    #[test]
    fn a_block_that_makes_the_parquet_decoder_panic_is_an_error_naming_the_file() {
        // Found by the `log_file` fuzz target: a Parquet data block whose definition levels make
        // arrow's bit-chunk iterator panic.
        let data = Bytes::from_static(include_bytes!("../../tests/data/fuzz-parquet-def-levels.log"));
        let fields = vec![
            Field::new("id", DataType::Int64, false),
            Field::new("name", DataType::Utf8, true),
            Field::new("ts", DataType::Int64, true),
            Field::new("fare", DataType::Float64, true),
        ];
        let schema = crate::schema::with_meta_fields(&Schema::new(fields));
        let schema: SchemaRef = Arc::new(Schema::new(schema.fields().clone()));
        match decode_file("fuzz.log", &data, &schema) {
            Err(Error::CorruptTable { path, .. }) => assert_eq!(path, "fuzz.log"),
            other => panic!("expected a corrupt-table error, got {:?}", other.map(|b| b.len())),
        }
    }
}
