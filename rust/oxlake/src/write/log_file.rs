//! Merge-on-read writes: a file group's updates, inserts and deletes go to a new log file of its
//! slice (a Parquet data block and a delete block) instead of a rewrite of its base file. Which
//! version of a record wins is decided by the reader's merge, by the table's ordering rules.

use arrow::array::{Array, RecordBatch};
use datafusion::common::ScalarValue;

use super::base_file::{Context, MetaWriter, Written};
use super::plan::FileWork;
use crate::error::{Error, Result};
use crate::format::commit::WriteStat;
use crate::format::log_block::{DeleteRecord, LogBlock, OrderingVal};
use crate::log;
use crate::metadata::file_index;

/// Writes the log file of one file group.
pub(super) async fn write_log(ctx: &Context, index: usize, work: FileWork) -> Result<Written> {
    let target = work.log.as_ref().ok_or_else(|| Error::invalid_data("log work without a target slice"))?;
    let incoming = ctx.incoming.as_ref().ok_or_else(|| Error::invalid_data("log work without input"))?;
    let mut stat = WriteStat {
        file_id: work.file_id.clone(),
        prev_commit: Some(target.base_instant.clone()),
        partition_path: Some(work.partition.clone()),
        base_file: work.old.as_ref().map(|b| b.name.name()),
        ..WriteStat::default()
    };
    let mut blocks: Vec<LogBlock> = Vec::new();
    // The data records written, for the metadata table's file-level indexes.
    let mut records: Vec<RecordBatch> = Vec::new();
    let delete_records = |changes: &super::plan::Changes| -> Result<Vec<DeleteRecord>> {
        let mut rows: Vec<u32> = changes.values().copied().collect();
        rows.sort_unstable();
        rows.iter()
            .map(|&row| {
                let row = row as usize;
                let ordering = match &incoming.ordering {
                    Some(col) if col.is_valid(row) => OrderingVal::from_scalar(&ScalarValue::try_from_array(col, row)?),
                    _ => OrderingVal::COMMIT_TIME,
                };
                Ok(DeleteRecord {
                    record_key: Some(incoming.keys.value(row).to_string()),
                    partition_path: Some(work.partition.clone()),
                    ordering,
                })
            })
            .collect()
    };
    let data_schema = crate::schema::without_meta_fields(&ctx.schema);
    if work.deletes {
        let records = delete_records(&work.changes)?;
        stat.num_deletes = records.len() as i64;
        blocks.push(log::delete_block(&ctx.instant, &records, &data_schema, &ctx.table_name)?);
    } else {
        let mut rows: Vec<u32> = work.changes.values().copied().collect();
        rows.sort_unstable();
        stat.num_update_writes = rows.len() as i64;
        stat.num_inserts = work.inserts.len() as i64;
        rows.extend(work.inserts.iter().copied());
        if !rows.is_empty() {
            let mut meta = MetaWriter::new(ctx, index, &work.partition, &work.file_id);
            let batch: RecordBatch = meta.new_rows(ctx, &rows)?;
            stat.num_writes = batch.num_rows() as i64;
            blocks.push(log::parquet_block(&ctx.instant, &batch, &ctx.table_name, &[])?);
            records.push(batch);
        }
        // Keys this write moves to another partition (global index): deleted here, carrying
        // the incoming version's ordering value, which was found to win.
        // and keys the rows flagged `_hoodie_is_deleted` delete.
        if !work.moved_out.is_empty() || !work.removed.is_empty() {
            let mut gone = delete_records(&work.moved_out)?;
            gone.extend(delete_records(&work.removed)?);
            stat.num_deletes = gone.len() as i64;
            blocks.push(log::delete_block(&ctx.instant, &gone, &data_schema, &ctx.table_name)?);
        }
    }
    stat.total_log_blocks = blocks.len() as i64;
    stat.total_log_records = stat.num_writes + stat.num_deletes;
    // Version 6 names a log with its slice's base instant, after the slice's last log; version 8
    // with this write's own instant, as the first log of that instant.
    let (named, after_version) = match ctx.logs_named_by_writer {
        true => (&ctx.instant, 0),
        false => (&target.base_instant, target.after_version),
    };
    let token = ctx.task.write_token(index);
    let file =
        log::write_new(&ctx.storage, &work.partition, &work.file_id, named, &token, after_version, &blocks).await?;
    stat.path = Some(file.path.clone());
    stat.log_version = Some(i64::from(file.name.version));
    stat.log_files = Some(vec![file.name.name()]);
    stat.total_write_bytes = file.size as i64;
    stat.file_size_in_bytes = file.size as i64;
    let entry = match ctx.file_indexes {
        (false, false) => None,
        (stats, bloom) => Some(file_index::log_entry(&ctx.schema, &records, stats, bloom.then_some(&ctx.keys))?),
    };
    Ok(Written { partition: work.partition, stat, entry })
}
