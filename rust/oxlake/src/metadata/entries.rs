//! The records of the metadata table and the files that hold them.
//!
//! One schema serves every index; each index fills the columns it needs and leaves the others
//! null:
//!
//! | index | key | columns |
//! | --- | --- | --- |
//! | `files` | data file path | `size` |
//! | `column_stats` | data file path | `stats` (JSON: rows, and min/max/nulls per column) |
//! | `bloom_filters` | data file path | `bloom` (a Parquet split-block bloom filter of record keys) |
//! | `record_index` | `<record key>\0<partition>` | `partition`, `file` (file id), `instant` |
//!
//! Base files hold one shard's records sorted by key, in small row groups, so that a lookup of a
//! few keys reads few of them; log files hold the changes of one instant.

use std::fmt::Write;
use std::sync::Arc;

use arrow::array::{
    Array, ArrayBuilder, ArrayRef, BinaryArray, Int64Array, RecordBatch, StringArray, StringBuilder, new_null_array,
};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use object_store::buffered::BufWriter;
use parquet::arrow::AsyncArrowWriter;
use parquet::file::properties::EnabledStatistics;
use parquet::schema::types::ColumnPath;

use super::Index;
use super::shard;
use crate::error::Result;
use crate::format::commit::WriteStat;
use crate::format::file_name::{BaseFileName, file_path};
use crate::format::log_block::{DeleteRecord, LogBlock, OrderingVal};
use crate::table::Table;
use crate::table::fs_view::FileSlice;

/// Rows per row group of a metadata base file.
const ROW_GROUP_ROWS: usize = 65_536;
/// Rows per data page of a metadata base file: a lookup reads, of the row groups whose key range
/// may hold one of its keys, only the pages whose key range may (by the page index).
pub(super) const PAGE_ROWS: usize = 256;
/// Rows per data block of a metadata log file (a large commit writes several).
pub(super) const BLOCK_ROWS: usize = 65_536;

/// Separates the record key from the partition in a `record_index` key.
pub const KEY_SEPARATOR: char = '\0';

/// The data columns of a metadata record (the table adds Apache Hudi's meta fields in front).
pub(super) fn record_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("key", DataType::Utf8, false),
        Field::new("index", DataType::Utf8, false),
        Field::new("size", DataType::Int64, true),
        Field::new("file", DataType::Utf8, true),
        Field::new("partition", DataType::Utf8, true),
        Field::new("instant", DataType::Utf8, true),
        Field::new("stats", DataType::Utf8, true),
        Field::new("bloom", DataType::Binary, true),
    ]))
}

/// The `record_index` key of a record: keys of one record key are adjacent, whatever their
/// partitions.
pub fn record_index_key(record_key: &str, partition: &str) -> String {
    format!("{record_key}{KEY_SEPARATOR}{partition}")
}

/// The record key part of a `record_index` key.
pub fn record_key_of(key: &str) -> &str {
    key.split_once(KEY_SEPARATOR).map_or(key, |(k, _)| k)
}

/// The shard of a metadata key: file-level indexes shard by the data file's partition (a
/// partition's files stay together), the record index by record key.
pub(super) fn shard_of(index: Index, key: &str, shards: u32) -> u32 {
    match index {
        Index::RecordIndex => shard::shard_of(record_key_of(key), shards),
        _ => shard::shard_of(key.rsplit_once('/').map_or("", |(p, _)| p), shards),
    }
}

/// Records of a file-level index (`files`, `column_stats`, `bloom_filters`) being gathered,
/// column by column: one per data file.
#[derive(Debug)]
pub(super) struct Entries {
    index: Index,
    key: Vec<String>,
    size: Vec<Option<i64>>,
    stats: Vec<Option<String>>,
    bloom: Vec<Option<Vec<u8>>>,
}

impl Entries {
    pub fn new(index: Index) -> Self {
        Entries { index, key: Vec::new(), size: Vec::new(), stats: Vec::new(), bloom: Vec::new() }
    }

    fn push(&mut self, key: &str, size: Option<i64>, stats: Option<String>, bloom: Option<Vec<u8>>) {
        self.key.push(key.to_string());
        self.size.push(size);
        self.stats.push(stats);
        self.bloom.push(bloom);
    }

    pub fn file(&mut self, path: &str, size: u64) {
        self.push(path, Some(size as i64), None, None);
    }

    pub fn stats(&mut self, path: &str, json: String) {
        self.push(path, None, Some(json), None);
    }

    pub fn bloom(&mut self, path: &str, bitset: Vec<u8>) {
        self.push(path, None, None, Some(bitset));
    }

    /// The records, in the order given (or sorted by key), as a batch of [`record_schema`].
    pub fn to_batch(&self, sorted: bool) -> Result<RecordBatch> {
        let mut order: Vec<usize> = (0..self.key.len()).collect();
        if sorted {
            order.sort_unstable_by(|&a, &b| self.key[a].cmp(&self.key[b]));
        }
        let n = order.len();
        let columns: Vec<ArrayRef> = vec![
            Arc::new(StringArray::from_iter_values(order.iter().map(|&i| self.key[i].as_str()))),
            Arc::new(StringArray::from(vec![self.index.name(); n])),
            Arc::new(order.iter().map(|&i| self.size[i]).collect::<Int64Array>()),
            new_null_array(&DataType::Utf8, n),
            new_null_array(&DataType::Utf8, n),
            new_null_array(&DataType::Utf8, n),
            Arc::new(order.iter().map(|&i| self.stats[i].as_deref()).collect::<StringArray>()),
            Arc::new(order.iter().map(|&i| self.bloom[i].as_deref()).collect::<BinaryArray>()),
        ];
        Ok(RecordBatch::try_new(record_schema(), columns)?)
    }
}

/// `record_index` records being gathered, straight into Arrow buffers (a large commit writes
/// millions of them: no string is allocated per record).
#[derive(Debug)]
pub(super) struct RecordEntries {
    key: StringBuilder,
    file: StringBuilder,
    partition: StringBuilder,
    instant: StringBuilder,
}

impl RecordEntries {
    pub fn with_capacity(records: usize) -> Self {
        let strings = |bytes| StringBuilder::with_capacity(records, records * bytes);
        RecordEntries { key: strings(16), file: strings(40), partition: strings(8), instant: strings(17) }
    }

    pub fn len(&self) -> usize {
        self.key.len()
    }

    /// The record of `record_key` in `partition`, in the file group `file_id`, written at `instant`.
    pub fn push(&mut self, record_key: &str, partition: &str, file_id: &str, instant: &str) {
        // `record_index_key`, written in place (writing into an Arrow buffer cannot fail).
        let _ = write!(self.key, "{record_key}{KEY_SEPARATOR}");
        self.key.append_value(partition);
        self.file.append_value(file_id);
        self.partition.append_value(partition);
        self.instant.append_value(instant);
    }

    /// The records gathered so far, in the order given, as a batch of [`record_schema`]; the
    /// builder is left empty.
    pub fn finish(&mut self) -> Result<RecordBatch> {
        let n = self.len();
        let columns: Vec<ArrayRef> = vec![
            Arc::new(self.key.finish()),
            Arc::new(StringArray::from(vec![Index::RecordIndex.name(); n])),
            new_null_array(&DataType::Int64, n),
            Arc::new(self.file.finish()),
            Arc::new(self.partition.finish()),
            Arc::new(self.instant.finish()),
            new_null_array(&DataType::Utf8, n),
            new_null_array(&DataType::Binary, n),
        ];
        Ok(RecordBatch::try_new(record_schema(), columns)?)
    }
}

/// `batch` (of [`record_schema`]) with the meta fields of `time` in front, as the metadata
/// table stores it.
fn with_meta(
    schema: &SchemaRef,
    batch: &RecordBatch,
    time: &str,
    file_name: &str,
    seq: &mut usize,
) -> Result<RecordBatch> {
    let n = batch.num_rows();
    let keys = batch.column(0).clone();
    let index = batch.column(1).clone();
    let mut seqnos = StringBuilder::with_capacity(n, n * (time.len() + 8));
    for i in *seq..*seq + n {
        // `<time>_<n>`, written into one buffer.
        write!(seqnos, "{time}_{i}").map_err(|e| crate::error::Error::invalid_data(format!("sequence number: {e}")))?;
        seqnos.append_value("");
    }
    let seqnos = seqnos.finish();
    *seq += n;
    let mut columns: Vec<ArrayRef> = vec![
        Arc::new(StringArray::from(vec![time; n])),
        Arc::new(seqnos),
        keys,
        index,
        Arc::new(StringArray::from(vec![file_name; n])),
    ];
    columns.extend(batch.columns().iter().cloned());
    Ok(RecordBatch::try_new(schema.clone(), columns)?)
}

/// Writes one shard's base file at `time` from batches sorted by key (in order).
pub(super) async fn write_base(
    mdt: &Table,
    time: &str,
    index: Index,
    shard: u32,
    batches: &[RecordBatch],
) -> Result<WriteStat> {
    let file_id = shard::file_id(index.name(), shard);
    let name = BaseFileName { file_id: file_id.clone(), write_token: "0-0-1".into(), instant: time.to_string() }.name();
    let rel = file_path(index.name(), &name);
    let sink = BufWriter::new(mdt.storage().object_store(), mdt.storage().path(&rel));
    // Values unique per row: a dictionary would be read whole by every lookup, then thrown away.
    let unique = ["key", "stats", "bloom"].map(String::from);
    let props = crate::format::base_file::writer_properties_with_plain(ROW_GROUP_ROWS, &unique)
        .into_builder()
        .set_data_page_row_count_limit(PAGE_ROWS)
        .set_write_batch_size(PAGE_ROWS)
        // Page statistics (the column index) only where lookups prune by them.
        .set_statistics_enabled(EnabledStatistics::Chunk)
        .set_column_statistics_enabled(ColumnPath::from("key"), EnabledStatistics::Page)
        .build();
    let mut writer = AsyncArrowWriter::try_new(sink, mdt.schema(), Some(props))?;
    let (mut seq, mut rows, schema) = (0, 0, mdt.schema());
    for batch in batches {
        rows += batch.num_rows();
        writer.write(&with_meta(&schema, batch, time, &name, &mut seq)?).await?;
    }
    writer.close().await?;
    let size = mdt.storage().head(&rel).await?.map(|m| m.size).unwrap_or_default() as i64;
    Ok(WriteStat {
        file_id,
        path: Some(rel),
        prev_commit: Some("null".into()),
        partition_path: Some(index.name().to_string()),
        num_writes: rows as i64,
        num_inserts: rows as i64,
        total_write_bytes: size,
        file_size_in_bytes: size,
        ..WriteStat::default()
    })
}

/// One shard's changes of an instant, encoded as the blocks of a log file.
pub(super) struct ShardLog {
    index: Index,
    shard: u32,
    blocks: Vec<LogBlock>,
    rows: usize,
    deletes: usize,
}

impl ShardLog {
    pub fn shard(&self) -> u32 {
        self.shard
    }
}

/// Encodes one shard's changes (CPU work only: large ones run off the async runtime): a delete
/// block of `deletes` (first, so that a key deleted and written again in one instant stays),
/// then data blocks of `upserts`. `schema` and `table_name` are the metadata table's.
pub(super) fn encode_log(
    (schema, table_name): (&SchemaRef, &str),
    time: &str,
    (index, shard): (Index, u32),
    upserts: &[RecordBatch],
    deletes: &[String],
) -> Result<ShardLog> {
    let file_id = shard::file_id(index.name(), shard);
    let mut blocks = Vec::new();
    if !deletes.is_empty() {
        let records: Vec<DeleteRecord> = deletes
            .iter()
            .map(|key| DeleteRecord {
                record_key: Some(key.clone()),
                partition_path: Some(index.name().to_string()),
                ordering: OrderingVal::COMMIT_TIME,
            })
            .collect();
        blocks.push(crate::log::delete_block(time, &records, &record_schema(), table_name)?);
    }
    let (mut seq, mut rows) = (0, 0);
    for batch in upserts.iter().filter(|b| b.num_rows() > 0) {
        rows += batch.num_rows();
        let batch = with_meta(schema, batch, time, &file_id, &mut seq)?;
        blocks.push(crate::log::parquet_block(time, &batch, table_name, &["key"])?);
    }
    Ok(ShardLog { index, shard, blocks, rows, deletes: deletes.len() })
}

/// Writes `log` as a new log file of its shard's latest slice `slice`.
pub(super) async fn write_log(mdt: &Table, slice: &FileSlice, log: ShardLog) -> Result<WriteStat> {
    let (index, file_id) = (log.index, shard::file_id(log.index.name(), log.shard));
    let after = slice.logs.iter().filter(|l| l.name.instant == slice.base_instant).map(|l| l.name.version).max();
    let file = crate::log::write_new(
        mdt.storage(),
        index.name(),
        &file_id,
        &slice.base_instant,
        "0-0-1",
        after.unwrap_or(0),
        &log.blocks,
    )
    .await?;
    Ok(WriteStat {
        file_id,
        path: Some(file.path.clone()),
        prev_commit: Some(slice.base_instant.clone()),
        partition_path: Some(index.name().to_string()),
        num_writes: log.rows as i64,
        num_update_writes: log.rows as i64,
        num_deletes: log.deletes as i64,
        total_log_records: (log.rows + log.deletes) as i64,
        total_log_blocks: log.blocks.len() as i64,
        log_version: Some(i64::from(file.name.version)),
        log_files: Some(vec![file.name.name()]),
        total_write_bytes: file.size as i64,
        file_size_in_bytes: file.size as i64,
        ..WriteStat::default()
    })
}

/// Column `name` of a metadata batch as strings.
pub(super) fn strings<'a>(batch: &'a RecordBatch, name: &str) -> Result<&'a StringArray> {
    batch
        .column_by_name(name)
        .and_then(|c| c.as_any().downcast_ref::<StringArray>())
        .ok_or_else(|| crate::error::Error::corrupt(super::DIR, format!("column `{name}` is missing or not text")))
}

/// Column `name` of a metadata batch as integers.
pub(super) fn ints<'a>(batch: &'a RecordBatch, name: &str) -> Result<&'a Int64Array> {
    batch
        .column_by_name(name)
        .and_then(|c| c.as_any().downcast_ref::<Int64Array>())
        .ok_or_else(|| crate::error::Error::corrupt(super::DIR, format!("column `{name}` is missing or not integers")))
}

/// Column `name` of a metadata batch as bytes.
pub(super) fn binaries<'a>(batch: &'a RecordBatch, name: &str) -> Result<&'a BinaryArray> {
    batch
        .column_by_name(name)
        .and_then(|c| c.as_any().downcast_ref::<BinaryArray>())
        .ok_or_else(|| crate::error::Error::corrupt(super::DIR, format!("column `{name}` is missing or not bytes")))
}
