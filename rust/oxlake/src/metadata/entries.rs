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

use std::sync::Arc;

use arrow::array::{Array, ArrayRef, BinaryArray, Int64Array, RecordBatch, StringArray};
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
use crate::format::log_block::{DeleteRecord, OrderingVal};
use crate::table::Table;
use crate::table::fs_view::FileSlice;
use crate::write::{WriteConfig, base_file_properties};

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

/// Records of one index being gathered, column by column.
#[derive(Debug)]
pub(super) struct Entries {
    index: Index,
    key: Vec<String>,
    size: Vec<Option<i64>>,
    file: Vec<Option<String>>,
    partition: Vec<Option<String>>,
    instant: Vec<Option<String>>,
    stats: Vec<Option<String>>,
    bloom: Vec<Option<Vec<u8>>>,
}

impl Entries {
    pub fn new(index: Index) -> Self {
        Entries {
            index,
            key: Vec::new(),
            size: Vec::new(),
            file: Vec::new(),
            partition: Vec::new(),
            instant: Vec::new(),
            stats: Vec::new(),
            bloom: Vec::new(),
        }
    }

    pub fn len(&self) -> usize {
        self.key.len()
    }

    #[allow(clippy::too_many_arguments)]
    fn push(
        &mut self,
        key: String,
        size: Option<i64>,
        file: Option<&str>,
        partition: Option<&str>,
        instant: Option<&str>,
        stats: Option<String>,
        bloom: Option<Vec<u8>>,
    ) {
        self.key.push(key);
        self.size.push(size);
        self.file.push(file.map(str::to_string));
        self.partition.push(partition.map(str::to_string));
        self.instant.push(instant.map(str::to_string));
        self.stats.push(stats);
        self.bloom.push(bloom);
    }

    pub fn file(&mut self, path: &str, size: u64) {
        self.push(path.to_string(), Some(size as i64), None, None, None, None, None);
    }

    pub fn stats(&mut self, path: &str, json: String) {
        self.push(path.to_string(), None, None, None, None, Some(json), None);
    }

    pub fn bloom(&mut self, path: &str, bitset: Vec<u8>) {
        self.push(path.to_string(), None, None, None, None, None, Some(bitset));
    }

    pub fn record(&mut self, record_key: &str, partition: &str, file_id: &str, instant: &str) {
        let key = record_index_key(record_key, partition);
        self.push(key, None, Some(file_id), Some(partition), Some(instant), None, None);
    }

    /// The records, in the order given (or sorted by key), as a batch of [`record_schema`].
    pub fn to_batch(&self, sorted: bool) -> Result<RecordBatch> {
        let mut order: Vec<usize> = (0..self.key.len()).collect();
        if sorted {
            order.sort_unstable_by(|&a, &b| self.key[a].cmp(&self.key[b]));
        }
        let strings = |v: &Vec<Option<String>>| -> ArrayRef {
            Arc::new(order.iter().map(|&i| v[i].as_deref()).collect::<StringArray>())
        };
        let columns: Vec<ArrayRef> = vec![
            Arc::new(StringArray::from_iter_values(order.iter().map(|&i| self.key[i].as_str()))),
            Arc::new(StringArray::from(vec![self.index.name(); order.len()])),
            Arc::new(order.iter().map(|&i| self.size[i]).collect::<Int64Array>()),
            strings(&self.file),
            strings(&self.partition),
            strings(&self.instant),
            strings(&self.stats),
            Arc::new(order.iter().map(|&i| self.bloom[i].as_deref()).collect::<BinaryArray>()),
        ];
        Ok(RecordBatch::try_new(record_schema(), columns)?)
    }
}

/// `batch` (of [`record_schema`]) with the meta fields of `time` in front, as the metadata
/// table stores it.
fn with_meta(mdt: &Table, batch: &RecordBatch, time: &str, file_name: &str, seq: &mut usize) -> Result<RecordBatch> {
    let n = batch.num_rows();
    let keys = batch.column(0).clone();
    let index = batch.column(1).clone();
    let seqnos = StringArray::from_iter_values((*seq..*seq + n).map(|i| format!("{time}_{i}")));
    *seq += n;
    let mut columns: Vec<ArrayRef> = vec![
        Arc::new(StringArray::from(vec![time; n])),
        Arc::new(seqnos),
        keys,
        index,
        Arc::new(StringArray::from(vec![file_name; n])),
    ];
    columns.extend(batch.columns().iter().cloned());
    Ok(RecordBatch::try_new(mdt.schema(), columns)?)
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
    let config = WriteConfig { row_group_size: ROW_GROUP_ROWS, ..WriteConfig::default() };
    let mut props = base_file_properties(&config)
        .into_builder()
        .set_data_page_row_count_limit(PAGE_ROWS)
        .set_write_batch_size(PAGE_ROWS)
        // Page statistics (the column index) only where lookups prune by them.
        .set_statistics_enabled(EnabledStatistics::Chunk)
        .set_column_statistics_enabled(ColumnPath::from("key"), EnabledStatistics::Page);
    // Values unique per row: a dictionary would be read whole by every lookup, then thrown away.
    for unique in ["key", "stats", "bloom"] {
        props = props.set_column_dictionary_enabled(ColumnPath::from(unique), false);
    }
    let props = props.build();
    let mut writer = AsyncArrowWriter::try_new(sink, mdt.schema(), Some(props))?;
    let (mut seq, mut rows) = (0, 0);
    for batch in batches {
        rows += batch.num_rows();
        writer.write(&with_meta(mdt, batch, time, &name, &mut seq)?).await?;
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

/// One shard's changes as a new log file of its latest slice: a delete block of `deletes`
/// (first, so that a key deleted and written again in one instant stays), then data blocks of
/// `upserts`.
pub(super) async fn write_log(
    mdt: &Table,
    time: &str,
    index: Index,
    shard: u32,
    slice: &FileSlice,
    upserts: &[RecordBatch],
    deletes: &[String],
) -> Result<WriteStat> {
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
        blocks.push(crate::log::delete_block(time, &records, &record_schema(), &mdt.config().name)?);
    }
    let mut seq = 0;
    let mut rows = 0;
    for batch in upserts.iter().filter(|b| b.num_rows() > 0) {
        rows += batch.num_rows();
        let batch = with_meta(mdt, batch, time, &file_id, &mut seq)?;
        blocks.push(crate::log::parquet_block(time, &batch, &mdt.config().name)?);
    }
    let after = slice.logs.iter().filter(|l| l.name.instant == slice.base_instant).map(|l| l.name.version).max();
    let file = crate::log::write_new(
        mdt.storage(),
        index.name(),
        &file_id,
        &slice.base_instant,
        "0-0-1",
        after.unwrap_or(0),
        &blocks,
    )
    .await?;
    Ok(WriteStat {
        file_id,
        path: Some(file.path.clone()),
        prev_commit: Some(slice.base_instant.clone()),
        partition_path: Some(index.name().to_string()),
        num_writes: rows as i64,
        num_update_writes: rows as i64,
        num_deletes: deletes.len() as i64,
        total_log_records: (rows + deletes.len()) as i64,
        total_log_blocks: blocks.len() as i64,
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
