//! How base files are written: the Parquet writer properties every writer of base files uses
//! (writes, compaction, clustering, the metadata table).

use arrow::array::{Array, RecordBatch};
use arrow::row::{RowConverter, SortField};
use parquet::basic::Compression;
use parquet::file::properties::WriterProperties;
use parquet::schema::types::ColumnPath;

use crate::error::Result;
use crate::schema::{COMMIT_SEQNO, META_FIELDS, RECORD_KEY};

/// Rows of a write's input sampled to find its columns of distinct values.
const SAMPLE_ROWS: usize = 8192;

/// The writer properties of base files with row groups of `row_group_size` rows.
pub fn writer_properties(row_group_size: usize) -> WriterProperties {
    WriterProperties::builder()
        .set_compression(Compression::SNAPPY)
        // Sequence numbers and record keys are unique per row: dictionary pages would only be
        // built to be thrown away.
        .set_column_dictionary_enabled(ColumnPath::from(COMMIT_SEQNO), false)
        .set_column_dictionary_enabled(ColumnPath::from(RECORD_KEY), false)
        .set_max_row_group_row_count(Some(row_group_size))
        .build()
}

/// [`writer_properties`], with no dictionary for the `plain` columns.
pub fn writer_properties_with_plain(row_group_size: usize, plain: &[String]) -> WriterProperties {
    plain
        .iter()
        .fold(writer_properties(row_group_size).into_builder(), |props, name| {
            props.set_column_dictionary_enabled(ColumnPath::from(name.as_str()), false)
        })
        .build()
}

/// The data columns of `batch` (flat ones, at the top level) whose sampled rows hold no value
/// twice: ids, timestamps, measurements. A dictionary of such a column holds every value of a
/// row group once more and indexes it from every row, so it is larger than the values written
/// plainly, and it costs a hash of every value to build; arrow-rs gives it up only once the
/// dictionary page (1 MiB a row group) is full.
///
/// [`SAMPLE_ROWS`] rows are sampled at an even stride over the whole batch (none taken below half
/// that many rows), so that an input cycling through a short list of values (sensors, in time
/// order) shows its repeats. A column is taken for distinct when 99 in 100 of its sampled values
/// are. Drawn at random from a column of `d` distinct values, 8,192 rows repeat about
/// `8192² / 2d` of them: 1 in 100 or more for `d` below about 400,000. A column of more is still
/// smaller plain, or nearly (its dictionary holds almost a value per row). Columns of long
/// values (over 256 bytes on average) are left to the writer: sampling them would copy
/// megabytes, and their dictionary is the writer's business.
pub fn distinct_columns(batch: &RecordBatch) -> Result<Vec<String>> {
    let rows = batch.num_rows();
    if rows < SAMPLE_ROWS / 2 {
        return Ok(Vec::new());
    }
    let n = rows.min(SAMPLE_ROWS);
    let stride = rows / n;
    let sampled = arrow::array::UInt32Array::from_iter_values((0..n).map(|i| (i * stride) as u32));
    let mut distinct = Vec::new();
    for (field, column) in batch.schema().fields().iter().zip(batch.columns()) {
        let dt = field.data_type();
        if META_FIELDS.contains(&field.name().as_str())
            || dt.is_nested()
            || column.get_buffer_memory_size() / rows > 256
            || !RowConverter::supports_fields(&[SortField::new(dt.clone())])
        {
            continue;
        }
        let sample = arrow::compute::take(column.as_ref(), &sampled, None)?;
        let values = n - sample.logical_null_count();
        if values < n / 2 {
            continue;
        }
        let encoded =
            RowConverter::new(vec![SortField::new(dt.clone())])?.convert_columns(std::slice::from_ref(&sample))?;
        let valid = sample.logical_nulls();
        let seen: hashbrown::HashSet<_> =
            (0..n).filter(|i| valid.as_ref().is_none_or(|v| v.is_valid(*i))).map(|i| encoded.row(i)).collect();
        if seen.len() * 100 >= values * 99 {
            distinct.push(field.name().clone());
        }
    }
    Ok(distinct)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow::array::{ArrayRef, Float64Array, Int64Array, StringArray, StructArray};
    use arrow::datatypes::{DataType, Field};

    use super::*;

    fn batch(rows: usize) -> RecordBatch {
        // A fixed pseudo-random walk: no dependency on a generator's version.
        let mut x: u64 = 7;
        let mut next = move || {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            x >> 33
        };
        let ids = Int64Array::from_iter_values((0..rows as i64).map(|i| i * 3));
        let riders = StringArray::from_iter_values((0..rows).map(|_| format!("rider-{}", next() % 50_000)));
        let fares = Float64Array::from_iter_values((0..rows).map(|_| (next() % 11_700) as f64 / 100.0));
        let stamps = Int64Array::from_iter_values((0..rows).map(|_| (next() % 100_000_000_000) as i64));
        let mostly_null = Int64Array::from_iter((0..rows as i64).map(|i| (i % 3 == 0).then_some(i)));
        let nested = StructArray::from(vec![(
            Arc::new(Field::new("a", DataType::Int64, false)),
            Arc::new(Int64Array::from_iter_values(0..rows as i64)) as ArrayRef,
        )]);
        RecordBatch::try_from_iter(vec![
            (COMMIT_SEQNO, Arc::new(StringArray::from_iter_values((0..rows).map(|i| i.to_string()))) as ArrayRef),
            ("id", Arc::new(ids) as ArrayRef),
            ("rider", Arc::new(riders) as ArrayRef),
            ("fare", Arc::new(fares) as ArrayRef),
            ("ts", Arc::new(stamps) as ArrayRef),
            ("mostly_null", Arc::new(mostly_null) as ArrayRef),
            ("nested", Arc::new(nested) as ArrayRef),
        ])
        .unwrap()
    }

    #[test]
    fn columns_of_distinct_values_are_found_by_a_sample_and_others_keep_their_dictionary() {
        // Ids and timestamps hold no value twice; 50,000 riders and 11,700 fares repeat within
        // 8,192 rows; a mostly null column and a nested one are left to the writer's default.
        assert_eq!(distinct_columns(&batch(20_000)).unwrap(), ["id", "ts"]);
        // Too few rows to tell a column of distinct values from a short one.
        assert!(distinct_columns(&batch(1_000)).unwrap().is_empty());
        // Sensors read in time order: each of 10,000 appears once per round, so the first rows
        // hold no sensor twice; rows sampled over the whole batch do.
        let rounds = RecordBatch::try_from_iter(vec![(
            "sensor",
            Arc::new(Int64Array::from_iter_values((0..200_000).map(|i| i % 10_000))) as ArrayRef,
        )])
        .unwrap();
        assert!(distinct_columns(&rounds).unwrap().is_empty());
        // Long values are not sampled.
        let long = RecordBatch::try_from_iter(vec![(
            "blob",
            Arc::new(StringArray::from_iter_values((0..5_000).map(|i| format!("{i:0>300}")))) as ArrayRef,
        )])
        .unwrap();
        assert!(distinct_columns(&long).unwrap().is_empty());
        let props = writer_properties_with_plain(1024, &["id".to_string()]);
        assert!(!props.dictionary_enabled(&ColumnPath::from("id")));
        assert!(props.dictionary_enabled(&ColumnPath::from("rider")));
        assert!(!props.dictionary_enabled(&ColumnPath::from(RECORD_KEY)));
    }
}
