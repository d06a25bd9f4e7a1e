//! The file-level indexes: `column_stats` (per data file: rows, and min, max and nulls of each
//! column of a comparable type) and `bloom_filters` (per data file: a bloom filter of its record
//! keys), and how planning prunes file slices with them.
//!
//! Base files give their statistics from the Parquet footer (no data is read); log files from
//! their data blocks. A log file's statistics cover every record it holds, whatever later blocks
//! do: a bound on what the file can contribute to a read. A slice is pruned only when every file
//! in it is: the rows a merge returns come from those files, so when none of their rows can pass
//! a filter, no merged row can either (whatever the ordering rules).

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use arrow::array::{Array, ArrayRef, BooleanArray, RecordBatch, StringArray, UInt64Array};
use arrow::compute::cast;
use arrow::datatypes::{DataType, Schema, SchemaRef};
use datafusion::common::pruning::PruningStatistics;
use datafusion::common::{Column, ScalarValue};
use datafusion::functions_aggregate::min_max::{MaxAccumulator, MinAccumulator};
use datafusion::logical_expr::Accumulator;
use datafusion::physical_optimizer::pruning::PruningPredicateBuilder;
use parquet::arrow::arrow_reader::statistics::StatisticsConverter;
use parquet::arrow::async_reader::ParquetRecordBatchStreamBuilder;
use parquet::bloom_filter::Sbbf;

use super::entries::{binaries, strings};
use super::{Index, MetadataTable, Select};
pub use crate::commit::change::{ColumnStats, FileEntry, FileStats};
use crate::error::{Error, Result};
use crate::format::file_name::BaseFileName;
use crate::keys::StoredKeys;
use crate::read::{Filter, PlannedSlice};
use crate::schema::RECORD_KEY;
use crate::storage::{ParquetFile, Storage};
use crate::table::Table;

/// False positive rate of the bloom filters.
const BLOOM_FPP: f64 = 0.01;

/// Types whose bounds survive a round trip through text and order as their values do.
fn has_bounds(t: &DataType) -> bool {
    t.is_integer()
        || t.is_floating()
        || matches!(
            t,
            DataType::Utf8
                | DataType::LargeUtf8
                | DataType::Boolean
                | DataType::Date32
                | DataType::Date64
                | DataType::Timestamp(_, _)
                | DataType::Decimal128(_, _)
        )
}

fn text(value: &ScalarValue) -> Result<Option<String>> {
    if value.is_null() {
        return Ok(None);
    }
    let array = cast(&value.to_array()?, &DataType::Utf8)?;
    Ok(array.as_any().downcast_ref::<StringArray>().filter(|a| a.is_valid(0)).map(|a| a.value(0).to_string()))
}

/// Folds arrays of one column into its bounds.
struct Bounds {
    min: MinAccumulator,
    max: MaxAccumulator,
    kind: String,
}

impl Bounds {
    fn new(t: &DataType) -> Result<Self> {
        Ok(Bounds { min: MinAccumulator::try_new(t)?, max: MaxAccumulator::try_new(t)?, kind: t.to_string() })
    }

    fn update(&mut self, values: &ArrayRef) -> Result<()> {
        self.min.update_batch(std::slice::from_ref(values))?;
        self.max.update_batch(std::slice::from_ref(values))?;
        Ok(())
    }

    fn finish(mut self, nulls: u64) -> Result<ColumnStats> {
        let (min, max) = (text(&self.min.evaluate()?)?, text(&self.max.evaluate()?)?);
        Ok(ColumnStats { min, max, nulls, kind: Some(self.kind) })
    }
}

/// Computes the index entries of a data file: statistics when `stats`, a bloom filter of record
/// keys (read as `bloom` says) when asked. `schema` is the table's read schema (log blocks are
/// decoded into it).
pub(crate) async fn file_entry(
    storage: &Storage,
    schema: &SchemaRef,
    path: &str,
    size: u64,
    stats: bool,
    bloom: Option<&StoredKeys>,
) -> Result<FileEntry> {
    let name = path.rsplit('/').next().unwrap_or(path);
    if BaseFileName::parse(name).is_some() {
        return base_file_entry(storage, path, size, stats, bloom).await.map_err(|e| e.in_file(path));
    }
    // The columns the file was written with (see `log::file_records`).
    let (written, batches) = crate::log::file_records(storage, path, schema).await?;
    log_entry(&written, &batches, stats, bloom)
}

/// The entry of a log file whose data records are `batches` (of the table `schema`): computed
/// from a log file read back, or by its writer from the batches it wrote.
pub(crate) fn log_entry(
    schema: &SchemaRef,
    batches: &[RecordBatch],
    stats: bool,
    bloom: Option<&StoredKeys>,
) -> Result<FileEntry> {
    let mut entry = FileEntry::default();
    if stats {
        let mut out = FileStats { rows: batches.iter().map(|b| b.num_rows() as u64).sum(), ..Default::default() };
        for (i, field) in schema.fields().iter().enumerate().filter(|(_, f)| has_bounds(f.data_type())) {
            let mut bounds = Bounds::new(field.data_type())?;
            let mut nulls = 0;
            for b in batches {
                bounds.update(b.column(i))?;
                nulls += b.column(i).null_count() as u64;
            }
            out.columns.insert(field.name().clone(), bounds.finish(nulls)?);
        }
        entry.stats = Some(out);
    }
    if let Some(stored) = bloom {
        let keys: Vec<ArrayRef> =
            batches.iter().map(|b| stored.keys(b).map(|k| Arc::new(k) as ArrayRef)).collect::<Result<_>>()?;
        entry.bloom = Some(bloom_of(&keys)?);
    }
    Ok(entry)
}

async fn base_file_entry(
    storage: &Storage,
    path: &str,
    size: u64,
    stats: bool,
    bloom: Option<&StoredKeys>,
) -> Result<FileEntry> {
    let builder = ParquetRecordBatchStreamBuilder::new(ParquetFile::open(storage, path, size)).await?;
    let mut entry = FileEntry::default();
    if stats {
        let groups = builder.metadata().row_groups();
        let rows: u64 = groups.iter().map(|g| g.num_rows().max(0) as u64).sum();
        let mut out = FileStats { rows, ..Default::default() };
        for field in builder.schema().fields().iter().filter(|f| has_bounds(f.data_type())) {
            let Ok(converter) = StatisticsConverter::try_new(field.name(), builder.schema(), builder.parquet_schema())
            else {
                continue;
            };
            let (mins, maxes) = (converter.row_group_mins(groups)?, converter.row_group_maxes(groups)?);
            let nulls = converter.row_group_null_counts(groups)?;
            let counts = converter.row_group_row_counts(groups)?;
            // A row group with values but no bounds leaves the file's bounds unknown.
            let known = (0..groups.len()).all(|g| {
                let all_null = nulls.is_valid(g) && counts.as_ref().is_some_and(|c| c.value(g) == nulls.value(g));
                (mins.is_valid(g) && maxes.is_valid(g)) || all_null
            });
            if !known || nulls.null_count() > 0 {
                continue;
            }
            let mut bounds = Bounds::new(field.data_type())?;
            bounds.update(&mins)?;
            bounds.update(&maxes)?;
            out.columns.insert(field.name().clone(), bounds.finish(nulls.iter().flatten().sum())?);
        }
        entry.stats = Some(out);
    }
    if let Some(stored) = bloom {
        let keys: ArrayRef = Arc::new(stored.of_base_file(storage, path, size).await?);
        entry.bloom = Some(bloom_of(&[keys])?);
    }
    Ok(entry)
}

/// A bloom filter of the keys in `arrays` (strings).
fn bloom_of(arrays: &[ArrayRef]) -> Result<Vec<u8>> {
    let n: usize = arrays.iter().map(|a| a.len()).sum();
    let mut filter = Sbbf::new_with_ndv_fpp(n.max(1) as u64, BLOOM_FPP)?;
    for a in arrays {
        if let Some(keys) = a.as_any().downcast_ref::<StringArray>() {
            keys.iter().flatten().for_each(|k| filter.insert(k));
        }
    }
    let mut bitset = Vec::new();
    filter.write_bitset(&mut bitset)?;
    Ok(bitset)
}

/// Whether a bloom filter's bitset may hold `key`.
pub(crate) fn may_contain(bitset: &[u8], key: &str) -> bool {
    Sbbf::new(bitset).check(key)
}

impl MetadataTable {
    /// The statistics of every data file the `column_stats` index holds, by path.
    pub(crate) async fn column_stats(&self) -> Result<HashMap<String, FileStats>> {
        let mut out = HashMap::new();
        for batch in self.read_index(Index::ColumnStats, Select::All).await? {
            let (keys, stats) = (strings(&batch, "key")?, strings(&batch, "stats")?);
            for i in 0..batch.num_rows() {
                let parsed: FileStats =
                    serde_json::from_str(stats.value(i)).map_err(|e| Error::corrupt(super::DIR, e))?;
                out.insert(keys.value(i).to_string(), parsed);
            }
        }
        Ok(out)
    }

    /// The bloom filters (bitsets) of the given data files, by path.
    pub(crate) async fn bloom_filters(&self, paths: &[&str]) -> Result<HashMap<String, Vec<u8>>> {
        let wanted: std::collections::BTreeSet<String> = paths.iter().map(|p| p.to_string()).collect();
        let mut shards: Vec<u32> = paths
            .iter()
            .map(|p| super::entries::shard_of(Index::BloomFilters, p, self.shards(Index::BloomFilters)))
            .collect();
        shards.sort_unstable();
        shards.dedup();
        let mut out = HashMap::new();
        for shard in shards {
            for batch in self.read_shard(Index::BloomFilters, shard, Select::Keys(&wanted)).await? {
                let (keys, blooms) = (strings(&batch, "key")?, binaries(&batch, "bloom")?);
                for i in 0..batch.num_rows() {
                    out.insert(keys.value(i).to_string(), blooms.value(i).to_vec());
                }
            }
        }
        Ok(out)
    }
}

/// Whether bounds taken in the type named `kind` order values as the column's type `now` does
/// once cast to it: the same type, or numbers of any width (a promoted int's `"5"` is `5.0`). An
/// int promoted to a string does not: `"100" < "50"` would prune a file holding 50. Statistics that
/// name no type (written before oxlake recorded it) count only for columns whose type never
/// changes (meta, key and partition columns).
fn comparable(kind: Option<&str>, now: &DataType, never_retyped: bool) -> bool {
    let numeric = |t: &DataType| t.is_integer() || t.is_floating() || matches!(t, DataType::Decimal128(_, _));
    match kind {
        None => never_retyped,
        Some(kind) if kind == now.to_string() => true,
        Some(kind) => numeric(now) && kind.parse::<DataType>().is_ok_and(|k| numeric(&k)),
    }
}

/// Prunable statistics of data files (DataFusion's containers are files).
struct FilesStatistics<'a> {
    schema: &'a Schema,
    stats: Vec<Option<&'a FileStats>>,
    blooms: Vec<Option<&'a Vec<u8>>>,
    /// Columns whose values are the record keys (bloom filters answer for them).
    key_columns: Vec<String>,
    /// Columns whose type no evolution changes: statistics that name no type count for them.
    never_retyped: HashSet<String>,
}

impl FilesStatistics<'_> {
    fn bounds(&self, column: &Column, pick: impl Fn(&ColumnStats) -> Option<&String>) -> Option<ArrayRef> {
        let t = self.schema.field_with_name(&column.name).ok()?.data_type();
        let never_retyped = self.never_retyped.contains(&column.name);
        let values: StringArray = self
            .stats
            .iter()
            .map(|s| s.and_then(|s| s.columns.get(&column.name)))
            .map(|c| c.filter(|c| comparable(c.kind.as_deref(), t, never_retyped)).and_then(&pick))
            .collect();
        cast(&values, t).ok()
    }
}

impl PruningStatistics for FilesStatistics<'_> {
    fn min_values(&self, column: &Column) -> Option<ArrayRef> {
        self.bounds(column, |c| c.min.as_ref())
    }

    fn max_values(&self, column: &Column) -> Option<ArrayRef> {
        self.bounds(column, |c| c.max.as_ref())
    }

    fn num_containers(&self) -> usize {
        self.stats.len()
    }

    fn null_counts(&self, column: &Column) -> Option<ArrayRef> {
        let counts: UInt64Array =
            self.stats.iter().map(|s| s.and_then(|s| s.columns.get(&column.name)).map(|c| c.nulls)).collect();
        Some(Arc::new(counts))
    }

    fn row_counts(&self) -> Option<ArrayRef> {
        Some(Arc::new(self.stats.iter().map(|s| s.map(|s| s.rows)).collect::<UInt64Array>()))
    }

    fn contained(&self, column: &Column, values: &HashSet<ScalarValue>) -> Option<BooleanArray> {
        if !self.key_columns.contains(&column.name) {
            return None;
        }
        let keys: Vec<String> = values.iter().filter_map(|v| text(v).ok().flatten()).collect();
        if keys.len() != values.len() {
            return None;
        }
        // `false`: no value is in the file; null: it may be.
        Some(
            self.blooms
                .iter()
                .map(|b| match b {
                    Some(bitset) if !keys.iter().any(|k| may_contain(bitset, k)) => Some(false),
                    _ => None,
                })
                .collect(),
        )
    }
}

impl Table {
    /// Drops the slices that the metadata table's `column_stats` and `bloom_filters` show cannot
    /// hold a row passing `filter`. Without a fresh metadata table holding them, keeps all.
    pub(crate) async fn prune_by_indexes(
        &self,
        slices: Vec<PlannedSlice>,
        filter: &Filter,
    ) -> Result<Vec<PlannedSlice>> {
        let Some(mdt) = self.fresh_metadata_table().await else { return Ok(slices) };
        let (has_stats, has_blooms) = (mdt.has(Index::ColumnStats), mdt.has(Index::BloomFilters));
        if slices.is_empty() || !(has_stats || has_blooms) {
            return Ok(slices);
        }
        let schema = self.schema();
        let ctx = crate::read::session(self, None, None)?;
        let df =
            ctx.read_table(Arc::new(crate::read::HudiTableProvider::try_new(self, crate::read::ScanPlan::default())?))?;
        // A filter the latest columns do not take (a time-travel read names that instant's
        // columns) prunes nothing here; the read itself checks it.
        let Ok(expr) = filter.to_expr(&df) else { return Ok(slices) };
        // Column statistics leave NaN out: the conjuncts reading a float do not prune.
        let kept = datafusion::logical_expr::utils::split_conjunction_owned(expr)
            .into_iter()
            .filter(|e| !crate::read::filter::reads_floats(e, &schema));
        let Some(expr) = datafusion::logical_expr::utils::conjunction(kept) else { return Ok(slices) };
        let physical = ctx.state().create_physical_expr(expr, df.schema())?;
        // `None`: the filter cannot prune (always true, or not understood).
        let Some(predicate) = PruningPredicateBuilder::new().with_file_schema(schema.clone()).build(physical) else {
            return Ok(slices);
        };
        // Bloom filters hold record keys: a key field's values are keys only where the key is
        // the field's text (not `field:value`, not a key generator of the table's own).
        let mut key_columns = vec![RECORD_KEY.to_string()];
        if let [single] = self.config().record_key_fields.as_slice()
            && !self.config().complex_keys()
        {
            key_columns.push(single.clone());
        }
        let paths: Vec<&str> = slices
            .iter()
            .flat_map(|s| s.base.iter().map(|b| b.path.as_str()).chain(s.logs.iter().map(|l| l.path.as_str())))
            .collect();
        let uses_keys = predicate.literal_columns().iter().any(|c| key_columns.contains(c));
        let read = async {
            let stats = if has_stats { mdt.column_stats().await? } else { HashMap::new() };
            let blooms = if has_blooms && uses_keys { mdt.bloom_filters(&paths).await? } else { HashMap::new() };
            Ok::<_, Error>((stats, blooms))
        };
        // The indexes only narrow the read: unreadable (a slow reader's snapshot of them compacted
        // and removed meanwhile, a damaged file), every slice is read.
        let (stats, blooms) = match read.await {
            Ok(read) => read,
            Err(e) => {
                log::warn!("{}: metadata table unreadable ({e}); reading every file slice", self.uri());
                return Ok(slices);
            }
        };
        // Column stats are kept by column name: a file older than the latest schema version
        // may hold a renamed or dropped column under a name the table now gives another one.
        let current = |path: &str| {
            let time = crate::format::file_name::data_file_instant(path);
            self.column_history().is_none_or(|h| !h.older_than_latest(time.as_deref()))
        };
        let config = self.config();
        let never_retyped = (config.record_key_fields.iter().chain(&config.partition_fields).cloned())
            .chain(schema.fields().iter().map(|f| f.name().clone()).filter(|n| n.starts_with("_hoodie_")))
            .collect();
        let statistics = FilesStatistics {
            schema: &schema,
            stats: paths.iter().map(|p| stats.get(*p).filter(|_| current(p))).collect(),
            blooms: paths.iter().map(|p| blooms.get(*p)).collect(),
            key_columns,
            never_retyped,
        };
        let keep = predicate.prune(&statistics)?;
        let mut keep = keep.into_iter();
        Ok(slices
            .into_iter()
            .filter(|s| {
                let n = usize::from(s.base.is_some()) + s.logs.len();
                // Every file's answer is consumed, in order; a slice stays if any file may match.
                keep.by_ref().take(n).fold(false, |any, k| any | k)
            })
            .collect())
    }
}

/// Files per batch of `RecordBatch`es; used by tests.
#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// A bloom filter holds every key put in it (no false negatives), whatever the keys.
        #[test]
        fn bloom_filters_have_no_false_negatives(keys in proptest::collection::vec(".{0,12}", 1..200)) {
            let array: ArrayRef = Arc::new(StringArray::from_iter_values(keys.iter()));
            let bitset = bloom_of(&[array]).unwrap();
            for k in &keys {
                prop_assert!(may_contain(&bitset, k));
            }
        }

        /// Bounds written as text read back as the same values.
        #[test]
        fn bounds_round_trip_through_text(v in any::<i64>(), f in any::<f64>().prop_filter("finite", |f| f.is_finite())) {
            for value in [ScalarValue::Int64(Some(v)), ScalarValue::Float64(Some(f))] {
                let t = value.data_type();
                let s = text(&value).unwrap().unwrap();
                let back = cast(&StringArray::from(vec![s]), &t).unwrap();
                prop_assert_eq!(ScalarValue::try_from_array(&back, 0).unwrap(), value);
            }
        }
    }

    #[test]
    fn a_bloom_filter_rejects_most_absent_keys() {
        let present: Vec<String> = (0..10_000).map(|i| format!("key-{i}")).collect();
        let array: ArrayRef = Arc::new(StringArray::from_iter_values(present.iter()));
        let bitset = bloom_of(&[array]).unwrap();
        let false_positives = (0..10_000).filter(|i| may_contain(&bitset, &format!("absent-{i}"))).count();
        assert!(false_positives < 300, "{false_positives} false positives in 10,000");
    }
}
