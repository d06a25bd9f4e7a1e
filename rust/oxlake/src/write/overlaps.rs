//! Distributed writes whose tasks did not get disjoint file groups. Spark's data source API hands
//! each task whatever rows its input partition holds, so two tasks may rewrite the same
//! copy-on-write file group. Each rewrite starts from the group's committed base file, so the
//! rewrites alone determine what the group holds after the write: every row this instant wrote
//! (in any rewrite) and every older row that all rewrites kept (a row a task deleted is missing
//! from its rewrite only). The driver merges such rewrites into one base file before the commit;
//! the rewrites become unreported files, which the commit's reconciliation deletes.
//!
//! Merge-on-read file groups need nothing of this: each task's changes are a log file of its own
//! (task-unique write tokens), and readers merge them.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

use arrow::array::{Array, ArrayRef, RecordBatch, StringArray};
use arrow::compute::{cast, concat_batches, interleave_record_batch};
use arrow::datatypes::DataType;
use datafusion::common::ScalarValue;
use futures::TryStreamExt;
use object_store::buffered::BufWriter;
use parquet::arrow::AsyncArrowWriter;
use parquet::arrow::async_reader::ParquetRecordBatchStreamBuilder;

use super::WrittenFiles;
use super::plan::{TaskId, WriteConfig};
use crate::error::{Error, Result};
use crate::format::commit::WriteStat;
use crate::format::file_name::{BaseFileName, file_path};
use crate::schema::{COMMIT_TIME, FILE_NAME};
use crate::storage::ParquetFile;
use crate::table::Table;

/// Replaces every set of base files that several tasks wrote for one file group by their merge.
pub(crate) async fn merge_overlapping_rewrites(
    table: &Table,
    instant: &str,
    parts: &mut [WrittenFiles],
    config: &WriteConfig,
) -> Result<()> {
    let mut groups: BTreeMap<(String, String), Vec<(usize, usize)>> = BTreeMap::new();
    for (p, part) in parts.iter().enumerate() {
        for (s, (partition, stat)) in part.stats.iter().enumerate() {
            let is_base = stat.path.as_deref().and_then(|path| BaseFileName::parse(file_name(path))).is_some();
            if is_base {
                groups.entry((partition.clone(), stat.file_id.clone())).or_default().push((p, s));
            }
        }
    }
    let overlapping: Vec<_> = groups.into_iter().filter(|(_, at)| at.len() > 1).collect();
    if overlapping.is_empty() {
        return Ok(());
    }
    let mut merged = Vec::with_capacity(overlapping.len());
    let mut dropped = std::collections::HashSet::new();
    let virtual_keys = table.stored_keys()?.is_virtual();
    for ((partition, file_id), at) in overlapping {
        let stats: Vec<&WriteStat> = at.iter().map(|&(p, s)| &parts[p].stats[s].1).collect();
        log::info!("{} tasks rewrote file group {partition}/{file_id}: merging their files", stats.len());
        // Without meta fields no row carries the instant that wrote it: a row is new in a
        // rewrite when its task reported writing the key into this group.
        let written = virtual_keys.then(|| {
            at.iter()
                .map(|&(p, _)| {
                    let ours = parts[p].keys.written.iter().filter(|(wp, wf, _)| *wp == partition && *wf == file_id);
                    ours.flat_map(|(_, _, keys)| keys.iter().flatten().map(str::to_string)).collect()
                })
                .collect()
        });
        let stat = merge_group(table, instant, (&partition, &file_id), &stats, written, config).await?;
        merged.push((partition, stat));
        dropped.extend(at);
    }
    for (p, part) in parts.iter_mut().enumerate() {
        let mut s = 0;
        part.stats.retain(|_| {
            s += 1;
            !dropped.contains(&(p, s - 1))
        });
    }
    if let Some(first) = parts.first_mut() {
        first.stats.extend(merged);
    }
    Ok(())
}

fn file_name(path: &str) -> &str {
    path.rsplit('/').next().unwrap_or(path)
}

/// One file group's rewrites, read whole (each is one base file, at most the target file size).
async fn merge_group(
    table: &Table,
    instant: &str,
    (partition, file_id): (&str, &str),
    stats: &[&WriteStat],
    written: Option<Vec<HashSet<String>>>,
    config: &WriteConfig,
) -> Result<WriteStat> {
    let schema = table.schema();
    let mut files = Vec::with_capacity(stats.len());
    for stat in stats {
        let path = stat.path.as_deref().ok_or_else(|| Error::invalid_data("a write stat without a path"))?;
        let reader = ParquetFile::open(table.storage(), path, stat.file_size_in_bytes.max(0) as u64);
        let read = async { Ok(ParquetRecordBatchStreamBuilder::new(reader).await?.build()?.try_collect().await?) };
        let batches: Vec<RecordBatch> = crate::storage::decoding(path, read).await.map_err(|e| e.in_file(path))?;
        let view = table
            .column_history()
            .and_then(|c| crate::format::file_name::base_file_instant(path).and_then(|t| c.columns_at(&t)));
        let batches = crate::schema::internal::FileColumns::read_into(view.as_deref(), &schema, |s| {
            batches.iter().map(|b| crate::schema::align(b, s)).collect()
        })?;
        files.push(concat_batches(&schema, &batches)?);
    }
    let ordering = match table.config().merge_mode {
        crate::config::MergeMode::EventTime => table.config().ordering_field.clone(),
        _ => None,
    };
    let stored_keys = table.stored_keys()?;
    let keys = files.iter().zip(stats).map(|(f, s)| stored_keys.keys_in(f, s.path.as_deref().unwrap_or(file_id)));
    let keys = keys.collect::<Result<Vec<_>>>()?;
    let new = match &written {
        Some(written) => Written::Keys(written),
        None => Written::At(instant, files.iter().map(|f| string_column(f, COMMIT_TIME)).collect::<Result<_>>()?),
    };
    let rows = merged_rows(&files, &keys, &new, ordering.as_deref())?;
    let name = BaseFileName {
        file_id: file_id.to_string(),
        write_token: TaskId::DRIVER.write_token(0),
        instant: instant.to_string(),
    }
    .name();
    let refs: Vec<&RecordBatch> = files.iter().collect();
    let batch = interleave_record_batch(&refs, &rows.iter().map(|r| r.at).collect::<Vec<_>>())?;
    let batch = match written {
        Some(_) => batch,
        None => with_file_name(&batch, &rows, &name)?,
    };

    let rel = file_path(partition, &name);
    let sink = BufWriter::new(table.storage().object_store(), table.storage().path(&rel));
    let mut writer = AsyncArrowWriter::try_new(
        sink,
        schema,
        Some(crate::format::base_file::writer_properties(config.row_group_size)),
    )?;
    writer.write(&batch).await?;
    writer.close().await?;
    let size = table.storage().head(&rel).await?.map(|m| m.size).unwrap_or_default() as i64;
    Ok(WriteStat {
        file_id: file_id.to_string(),
        path: Some(rel),
        prev_commit: stats[0].prev_commit.clone(),
        partition_path: Some(partition.to_string()),
        num_writes: batch.num_rows() as i64,
        num_inserts: stats.iter().map(|s| s.num_inserts).sum(),
        num_update_writes: stats.iter().map(|s| s.num_update_writes).sum(),
        num_deletes: stats.iter().map(|s| s.num_deletes).sum(),
        total_write_bytes: size,
        file_size_in_bytes: size,
        ..WriteStat::default()
    })
}

/// A row of the merged file: where it comes from, and whether this instant wrote it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Row {
    at: (usize, usize),
    new: bool,
}

/// Which rows of each rewrite this instant wrote.
enum Written<'a> {
    /// Those whose `_hoodie_commit_time` (one column per rewrite) is the instant's.
    At(&'a str, Vec<StringArray>),
    /// Those whose key the rewrite's task wrote (tables without meta fields).
    Keys(&'a [HashSet<String>]),
}

impl Written<'_> {
    fn is_new(&self, f: usize, r: usize, key: &str) -> bool {
        match self {
            Written::At(instant, times) => times[f].value(r) == *instant,
            Written::Keys(keys) => keys[f].contains(key),
        }
    }
}

/// The rows of the merged file, in the first rewrite's order, then the new rows of the others:
/// older rows that every rewrite kept, and the rows this instant wrote. When two tasks wrote the
/// same key, the greater ordering value wins, then the later task.
fn merged_rows(
    files: &[RecordBatch],
    keys: &[StringArray],
    written: &Written<'_>,
    ordering: Option<&str>,
) -> Result<Vec<Row>> {
    let order_value = |(f, r): (usize, usize)| -> Result<Option<ScalarValue>> {
        let Some(col) = ordering.and_then(|name| files[f].column_by_name(name)) else { return Ok(None) };
        Ok(Some(ScalarValue::try_from_array(col, r)?))
    };
    let mut new: HashMap<&str, (usize, usize)> = HashMap::new();
    let mut kept_by: HashMap<&str, usize> = HashMap::new();
    for (f, keys) in keys.iter().enumerate() {
        for r in 0..keys.len() {
            let key = keys.value(r);
            if !written.is_new(f, r, key) {
                *kept_by.entry(key).or_default() += 1;
                continue;
            }
            match new.get(key) {
                Some(&other) if order_value(other)? > order_value((f, r))? => {}
                _ => {
                    new.insert(key, (f, r));
                }
            }
        }
    }
    let mut rows = Vec::new();
    for (f, keys) in keys.iter().enumerate() {
        for r in 0..keys.len() {
            let key = keys.value(r);
            if !written.is_new(f, r, key) {
                if f == 0 && kept_by.get(key) == Some(&files.len()) && !new.contains_key(key) {
                    rows.push(Row { at: (f, r), new: false });
                }
            } else if new.get(key) == Some(&(f, r)) {
                rows.push(Row { at: (f, r), new: true });
            }
        }
    }
    Ok(rows)
}

/// `_hoodie_file_name` of the rows this instant wrote names the merged file.
fn with_file_name(batch: &RecordBatch, rows: &[Row], name: &str) -> Result<RecordBatch> {
    let Some(index) = batch.schema().index_of(FILE_NAME).ok() else { return Ok(batch.clone()) };
    let old = string_column(batch, FILE_NAME)?;
    let names: StringArray = rows
        .iter()
        .enumerate()
        .map(|(i, row)| if row.new { Some(name) } else { old.is_valid(i).then(|| old.value(i)) })
        .collect();
    let mut columns: Vec<ArrayRef> = batch.columns().to_vec();
    columns[index] = Arc::new(names);
    Ok(RecordBatch::try_new(batch.schema(), columns)?)
}

fn string_column(batch: &RecordBatch, name: &str) -> Result<StringArray> {
    let col = batch.column_by_name(name).ok_or_else(|| Error::corrupt(name, "meta column missing from base file"))?;
    let col = cast(col, &DataType::Utf8)?;
    col.as_any().downcast_ref::<StringArray>().cloned().ok_or_else(|| Error::corrupt(name, "not a string column"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schema::RECORD_KEY;
    use arrow::array::Int64Array;
    use arrow::datatypes::{Field, Schema};

    fn file(rows: &[(&str, &str, i64)]) -> RecordBatch {
        let schema = Arc::new(Schema::new(vec![
            Field::new(COMMIT_TIME, DataType::Utf8, false),
            Field::new(RECORD_KEY, DataType::Utf8, false),
            Field::new("ts", DataType::Int64, false),
        ]));
        RecordBatch::try_new(
            schema,
            vec![
                Arc::new(StringArray::from(rows.iter().map(|r| r.0).collect::<Vec<_>>())),
                Arc::new(StringArray::from(rows.iter().map(|r| r.1).collect::<Vec<_>>())),
                Arc::new(Int64Array::from(rows.iter().map(|r| r.2).collect::<Vec<_>>())),
            ],
        )
        .unwrap()
    }

    fn merge(files: &[RecordBatch], instant: &str, ordering: Option<&str>) -> Vec<Row> {
        let keys: Vec<StringArray> = files.iter().map(|f| string_column(f, RECORD_KEY).unwrap()).collect();
        let times = files.iter().map(|f| string_column(f, COMMIT_TIME).unwrap()).collect();
        merged_rows(files, &keys, &Written::At(instant, times), ordering).unwrap()
    }

    fn keys(files: &[RecordBatch], rows: &[Row]) -> Vec<String> {
        rows.iter().map(|r| string_column(&files[r.at.0], RECORD_KEY).unwrap().value(r.at.1).to_string()).collect()
    }

    #[test]
    fn merged_rewrites_keep_every_change_and_what_all_kept() {
        // Committed: a, b, c, d. Task 0 updated a and deleted c; task 1 updated b, inserted e.
        let t0 = file(&[("1", "b", 0), ("1", "d", 0), ("2", "a", 5)]);
        let t1 = file(&[("1", "a", 0), ("1", "c", 0), ("1", "d", 0), ("2", "b", 5), ("2", "e", 5)]);
        let files = [t0, t1];
        let rows = merge(&files, "2", None);
        assert_eq!(keys(&files, &rows), ["d", "a", "b", "e"]);
        assert_eq!(rows.iter().filter(|r| r.new).count(), 3);
        // Without meta fields the tasks' written keys say the same.
        let written = [HashSet::from(["a".to_string()]), HashSet::from(["b".to_string(), "e".to_string()])];
        let key_columns: Vec<StringArray> = files.iter().map(|f| string_column(f, RECORD_KEY).unwrap()).collect();
        assert_eq!(merged_rows(&files, &key_columns, &Written::Keys(&written), None).unwrap(), rows);
    }

    #[test]
    fn a_key_two_tasks_wrote_takes_the_greater_ordering_value() {
        let t0 = file(&[("2", "a", 9)]);
        let t1 = file(&[("2", "a", 3)]);
        let files = [t0, t1];
        assert_eq!(merge(&files, "2", Some("ts")), [Row { at: (0, 0), new: true }]);
        // Without an ordering field the later task wins.
        assert_eq!(merge(&files, "2", None), [Row { at: (1, 0), new: true }]);
    }
}
