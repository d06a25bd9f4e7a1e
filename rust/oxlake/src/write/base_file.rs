//! Writing base files: new file groups, and copy-on-write rewrites that merge changes into the
//! previous base file while streaming it (memory: the changes plus one batch).

use std::fmt::Write as _;
use std::sync::Arc;

use arrow::array::{
    Array, ArrayRef, BooleanArray, RecordBatch, StringArray, StringBuilder, UInt32Array, make_comparator,
};
use arrow::compute::{SortOptions, cast, filter_record_batch, take, take_record_batch};
use arrow::datatypes::SchemaRef;
use futures::{FutureExt, StreamExt};
use object_store::buffered::BufWriter;
use parquet::arrow::AsyncArrowWriter;
use parquet::arrow::async_reader::ParquetRecordBatchStreamBuilder;
use parquet::file::properties::WriterProperties;
use tokio::sync::Semaphore;

use super::Incoming;
use super::plan::{FileWork, TaskId, WriteConfig};
use crate::error::{Error, Result};
use crate::format::commit::WriteStat;
use crate::format::file_name::BaseFileName;
use crate::storage::{ParquetFile, Storage};
use crate::table::Table;

/// Rows per batch when appending inserts.
const INSERT_BATCH: usize = 8192;

/// A base file written by this instant, with its write stat.
#[derive(Debug)]
pub(crate) struct Written {
    pub partition: String,
    pub stat: WriteStat,
    /// What the metadata table's file-level indexes hold of the file, when its writer computed it
    /// (log files, from the batches written; else the sync reads the file back).
    pub entry: Option<crate::metadata::file_index::FileEntry>,
}

/// Everything a file task needs, shareable across tasks.
pub(super) struct Context {
    pub storage: Storage,
    pub schema: SchemaRef,
    pub instant: String,
    pub incoming: Option<Arc<Incoming>>,
    pub ordering_field: Option<String>,
    /// The properties of new files: no dictionary for the input's columns of distinct values.
    pub props: WriterProperties,
    /// The properties of files rewritten with an older file's rows (copy-on-write).
    pub rewrite_props: WriterProperties,
    pub table_name: String,
    pub task: TaskId,
    /// Whether the metadata table keeps column stats and bloom filters of data files (log
    /// writers then compute theirs from the batches they write).
    pub file_indexes: (bool, bool),
    /// How files of older schema versions name the columns (`None`: as the table does).
    pub columns: Option<Arc<crate::schema::internal::ColumnHistory>>,
    /// Where stored rows' keys come from; with virtual keys the meta columns are written null.
    pub keys: crate::keys::StoredKeys,
    /// Whether a log file is named with the instant writing it (table version 8 and later: it
    /// joins the slice its completion time falls in) rather than its slice's base instant.
    pub logs_named_by_writer: bool,
}

/// Writes every planned file, `config.parallelism` at a time.
pub(crate) async fn write_all(
    table: &Table,
    instant: &str,
    work: Vec<FileWork>,
    incoming: Option<&Arc<Incoming>>,
    config: &WriteConfig,
) -> Result<Vec<Written>> {
    let ordering_field = match table.config().merge_mode {
        crate::config::MergeMode::EventTime => table.config().ordering_field.clone(),
        crate::config::MergeMode::CommitTime | crate::config::MergeMode::Custom => None,
    };
    // The input's columns of distinct values are written without a dictionary in new files (see
    // `distinct_columns`). The choice only tunes the encoding: a sample that cannot be taken
    // leaves the writer's defaults.
    let plain = match incoming.map(|i| crate::format::base_file::distinct_columns(&i.batch)) {
        Some(Ok(plain)) => plain,
        Some(Err(e)) => {
            log::debug!("{}: no sample of the input's columns ({e}); every column keeps its dictionary", table.uri());
            Vec::new()
        }
        None => Vec::new(),
    };
    let ctx = Arc::new(Context {
        storage: table.storage().clone(),
        schema: table.schema(),
        instant: instant.to_string(),
        incoming: incoming.cloned(),
        columns: table.column_history().cloned(),
        ordering_field,
        table_name: table.config().name.clone(),
        props: crate::format::base_file::writer_properties_with_plain(config.row_group_size, &plain),
        rewrite_props: crate::format::base_file::writer_properties(config.row_group_size),
        task: config.task,
        file_indexes: crate::metadata::file_indexes(table),
        logs_named_by_writer: table.config().layout_version >= 2,
        keys: table.stored_keys()?,
    });
    let permits = Arc::new(Semaphore::new(config.parallelism.max(1)));
    let mut tasks = tokio::task::JoinSet::new();
    let count = work.len();
    for (index, work) in (config.first_file..).zip(work) {
        let ctx = ctx.clone();
        let permits = permits.clone();
        tasks.spawn(async move {
            let _permit = permits.acquire_owned().await.map_err(Error::invalid_data)?;
            if work.log.is_some() {
                super::log_file::write_log(&ctx, index, work).await
            } else {
                write_file(&ctx, index, work).await
            }
        });
    }
    let mut written = Vec::with_capacity(count);
    while let Some(joined) = tasks.join_next().await {
        let result = joined.map_err(|e| Error::invalid_data(format!("writer task failed: {e}")))?;
        written.push(result?);
    }
    written.sort_by(|a, b| (&a.partition, &a.stat.file_id).cmp(&(&b.partition, &b.stat.file_id)));
    Ok(written)
}

async fn write_file(ctx: &Context, index: usize, work: FileWork) -> Result<Written> {
    let name = BaseFileName {
        file_id: work.file_id.clone(),
        write_token: ctx.task.write_token(index),
        instant: ctx.instant.clone(),
    };
    let file_name = name.name();
    let rel = crate::format::file_name::file_path(&work.partition, &file_name);
    let sink = BufWriter::new(ctx.storage.object_store(), ctx.storage.path(&rel));
    // A rewritten file keeps the writer's defaults: the input's values can be distinct where
    // the old file's kept rows repeat.
    let props = if work.old.is_some() { &ctx.rewrite_props } else { &ctx.props };
    let mut writer = AsyncArrowWriter::try_new(sink, ctx.schema.clone(), Some(props.clone()))?;
    let mut meta = MetaWriter::new(ctx, index, &work.partition, &file_name);
    let mut stat = WriteStat {
        file_id: work.file_id.clone(),
        path: Some(rel.clone()),
        prev_commit: Some(work.old.as_ref().map_or("null".to_string(), |o| o.name.instant.clone())),
        partition_path: Some(work.partition.clone()),
        ..WriteStat::default()
    };

    // Changes whose key the old file turns out not to hold (an index entry of a key an event-time
    // delete removed keeps its group) are written as new records, never dropped.
    let mut matched: hashbrown::HashSet<u32> = hashbrown::HashSet::new();
    if let Some(old) = &work.old {
        // The Parquet reader does not know which file it decodes: its errors are named here.
        let named = |e: parquet::errors::ParquetError| Error::from(e).in_file(&old.path);
        let reader = ParquetFile::open(&ctx.storage, &old.path, old.size);
        let open = async { ParquetRecordBatchStreamBuilder::new(reader).await.and_then(|b| b.build()).map_err(named) };
        let mut stream = crate::storage::decoding(&old.path, open).await?;
        let view = ctx
            .columns
            .as_ref()
            .and_then(|c| crate::format::file_name::base_file_instant(&old.path).and_then(|t| c.columns_at(&t)));
        while let Some(batch) = crate::storage::decoding(&old.path, stream.next().map(Ok)).await? {
            let batch = batch.map_err(named)?;
            let batch = crate::schema::internal::FileColumns::read_into(view.as_deref(), &ctx.schema, |s| {
                Ok(vec![crate::schema::align(&batch, s)?])
            })?
            .remove(0);
            let (kept, replaced) = merge_batch(ctx, &work, &batch, &old.path, &mut stat, &mut matched)?;
            if kept.num_rows() > 0 {
                writer.write(&kept).await?;
            }
            if !replaced.is_empty() {
                writer.write(&meta.new_rows(ctx, &replaced)?).await?;
            }
            stat.num_writes += (kept.num_rows() + replaced.len()) as i64;
        }
    }
    let mut unmatched: Vec<u32> = match work.deletes {
        true => Vec::new(),
        false => work.changes.values().copied().filter(|r| !matched.contains(r)).collect(),
    };
    unmatched.sort_unstable();
    for chunk in unmatched.chunks(INSERT_BATCH).chain(work.inserts.chunks(INSERT_BATCH)) {
        writer.write(&meta.new_rows(ctx, chunk)?).await?;
        stat.num_inserts += chunk.len() as i64;
        stat.num_writes += chunk.len() as i64;
    }
    writer.close().await?;
    let size = ctx.storage.head(&rel).await?.map(|m| m.size).unwrap_or_default() as i64;
    stat.total_write_bytes = size;
    stat.file_size_in_bytes = size;
    Ok(Written { partition: work.partition, stat, entry: None })
}

/// Splits one batch of the old file into the rows kept as they were and the incoming rows that
/// replace the others. Under event-time ordering an incoming row (or a delete carrying an ordering
/// value) with a lower ordering value than the stored row loses, and the stored row is kept.
fn merge_batch(
    ctx: &Context,
    work: &FileWork,
    batch: &RecordBatch,
    path: &str,
    stat: &mut WriteStat,
    matched: &mut hashbrown::HashSet<u32>,
) -> Result<(RecordBatch, Vec<u32>)> {
    if work.changes.is_empty() && work.moved_out.is_empty() && work.removed.is_empty() {
        return Ok((batch.clone(), vec![]));
    }
    let keys = ctx.keys.keys_in(batch, path)?;
    let incoming = ctx.incoming.as_ref().ok_or_else(|| Error::invalid_data("changes without input"))?;
    let cmp = match (&ctx.ordering_field, &incoming.ordering) {
        (Some(field), Some(new)) => match batch.column_by_name(field) {
            Some(old) => {
                let old = cast(old, new.data_type())?;
                Some((
                    make_comparator(old.as_ref(), new.as_ref(), SortOptions { descending: false, nulls_first: true })?,
                    old,
                ))
            }
            None => None,
        },
        _ => None,
    };
    let mut keep = Vec::with_capacity(batch.num_rows());
    let mut replaced = Vec::new();
    for row in 0..batch.num_rows() {
        if keys.is_valid(row) && work.moved_out.contains_key(keys.value(row)) {
            // Moved to another partition by this write (the incoming version won: see `plan`).
            keep.push(false);
            stat.num_deletes += 1;
            continue;
        }
        let key = keys.is_valid(row).then(|| keys.value(row));
        let removal = key.and_then(|k| work.removed.get(k));
        let change = key.and_then(|k| work.changes.get(k)).or(removal);
        let Some(&new_row) = change else {
            keep.push(true);
            continue;
        };
        matched.insert(new_row);
        let stored_wins = cmp.as_ref().is_some_and(|(c, _)| c(row, new_row as usize).is_gt());
        if stored_wins {
            keep.push(true);
        } else if work.deletes || removal.is_some() {
            keep.push(false);
            stat.num_deletes += 1;
        } else {
            keep.push(false);
            replaced.push(new_row);
            stat.num_update_writes += 1;
        }
    }
    let kept = filter_record_batch(batch, &BooleanArray::from(keep))?;
    Ok((kept, replaced))
}

/// Fills the meta fields of incoming rows as Apache Hudi does: null in a table without meta
/// fields (its readers make keys from the record key fields).
pub(super) struct MetaWriter<'a> {
    instant: &'a str,
    /// `<task>-<file index>`: sequence numbers are unique across the tasks of a write.
    writer: String,
    partition: &'a str,
    /// The base file name (the file id in log blocks).
    file_name: &'a str,
    seq: u64,
}

impl<'a> MetaWriter<'a> {
    pub(super) fn new(ctx: &'a Context, index: usize, partition: &'a str, file_name: &'a str) -> Self {
        MetaWriter { instant: &ctx.instant, writer: format!("{}-{index}", ctx.task.task), partition, file_name, seq: 0 }
    }

    pub(super) fn new_rows(&mut self, ctx: &Context, rows: &[u32]) -> Result<RecordBatch> {
        let incoming = ctx.incoming.as_ref().ok_or_else(|| Error::invalid_data("rows without input"))?;
        let indices = UInt32Array::from(rows.to_vec());
        let data = take_record_batch(&incoming.batch, &indices)?;
        let n = rows.len();
        if ctx.keys.is_virtual() {
            let meta = ctx.schema.fields().iter().take(crate::schema::META_FIELDS.len());
            let mut columns: Vec<ArrayRef> = meta.map(|f| arrow::array::new_null_array(f.data_type(), n)).collect();
            columns.extend(data.columns().iter().cloned());
            return Ok(RecordBatch::try_new(ctx.schema.clone(), columns)?);
        }
        // `<instant>_<task>-<file>_<n>`, written into one buffer (no string per row).
        let mut seqnos = StringBuilder::with_capacity(n, n * (self.instant.len() + 12));
        for i in 0..n {
            write!(seqnos, "{}_{}_{}", self.instant, self.writer, self.seq + i as u64)
                .map_err(|e| Error::invalid_data(format!("sequence number: {e}")))?;
            seqnos.append_value("");
        }
        let seqnos = seqnos.finish();
        self.seq += n as u64;
        let mut columns: Vec<ArrayRef> = vec![
            Arc::new(StringArray::from(vec![self.instant; n])),
            Arc::new(seqnos),
            take(&incoming.keys, &indices, None)?,
            Arc::new(StringArray::from(vec![self.partition; n])),
            Arc::new(StringArray::from(vec![self.file_name; n])),
        ];
        columns.extend(data.columns().iter().cloned());
        Ok(RecordBatch::try_new(ctx.schema.clone(), columns)?)
    }
}
