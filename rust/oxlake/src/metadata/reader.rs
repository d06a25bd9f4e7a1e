//! Reading the metadata table: the current records of one shard, merged from its latest slice
//! (the base file's records, then each admitted log block in order: later records replace
//! earlier ones of the same key, delete blocks remove keys).
//!
//! Reader rules (DESIGN.md §3): the slice and the blocks are those of the metadata timeline
//! restricted to instants completed on the data timeline; nothing else is read.
//!
//! A lookup of some keys reads only the base file's pages whose key range may hold one of them
//! (base files are sorted by key and carry a page index), and only the matching rows of the logs.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

use arrow::array::{Array, ArrayRef, AsArray, BooleanArray, RecordBatch};
use arrow::compute::filter_record_batch;
use arrow::datatypes::DataType;
use arrow::error::ArrowError;
use futures::StreamExt;
use parquet::arrow::ProjectionMask;
use parquet::arrow::arrow_reader::statistics::StatisticsConverter;
use parquet::arrow::arrow_reader::{ArrowPredicateFn, ArrowReaderOptions, RowFilter, RowSelection, RowSelector};
use parquet::arrow::async_reader::ParquetRecordBatchStreamBuilder;
use parquet::file::metadata::PageIndexPolicy;

use super::entries::{record_key_of, record_schema, strings};
use super::{Index, MetadataTable, shard};
use crate::error::{Error, Result};
use crate::log::{Admission, LogContent};
use crate::storage::ParquetFile;

/// Which records of a shard to read.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Select<'a> {
    /// Every record.
    All,
    /// Records with these keys (sorted, distinct).
    Keys(&'a BTreeSet<String>),
    /// `record_index` records of these record keys, in any partition (sorted, distinct).
    RecordKeys(&'a BTreeSet<String>),
}

impl Select<'_> {
    /// How many keys are selected (0 for every record).
    fn len(&self) -> usize {
        match self {
            Select::All => 0,
            Select::Keys(keys) | Select::RecordKeys(keys) => keys.len(),
        }
    }

    fn matches(&self, key: &str) -> bool {
        match self {
            Select::All => true,
            Select::Keys(keys) => keys.contains(key),
            Select::RecordKeys(keys) => keys.contains(record_key_of(key)),
        }
    }

    /// Whether some selected key may lie in `[min, max]`.
    fn overlaps(&self, min: &str, max: &str) -> bool {
        let (keys, min, max) = match self {
            Select::All => return true,
            Select::Keys(keys) => (keys, min, max),
            Select::RecordKeys(keys) => (keys, record_key_of(min), record_key_of(max)),
        };
        keys.range(min.to_string()..).next().is_some_and(|k| k.as_str() <= max)
    }
}

impl MetadataTable {
    /// The current records of one shard of `index` that `select` picks, as batches of
    /// [`record_schema`] (in no particular order).
    pub(crate) async fn read_shard(&self, index: Index, shard: u32, select: Select<'_>) -> Result<Vec<RecordBatch>> {
        let Some(upper) = self.upper.clone() else { return Ok(Vec::new()) };
        let file_id = shard::file_id(index.name(), shard);
        let Some(slice) =
            self.view.get(&(index.name().to_string(), file_id.clone())).and_then(|g| g.slice_as_of(&upper)).cloned()
        else {
            return Err(Error::corrupt(super::DIR, format!("file group {file_id} is missing")));
        };
        let mut batches = Vec::new();
        if let Some(base) = &slice.base {
            batches.extend(self.read_base(&base.path, base.size, select).await?);
        }
        if slice.logs.is_empty() {
            return Ok(batches);
        }
        let admission = Admission { upper, timeline: Arc::new(self.table.timeline().clone()) };
        let content =
            crate::log::read_slice(self.table.storage(), &slice.logs, &self.table.schema(), &admission).await?;
        // The latest version of each key: (batch, row), or None when deleted.
        let mut latest: HashMap<String, Option<(usize, usize)>> = HashMap::new();
        for (b, batch) in batches.iter().enumerate() {
            for (r, key) in strings(batch, "key")?.iter().enumerate() {
                latest.insert(key.unwrap_or_default().to_string(), Some((b, r)));
            }
        }
        for part in content {
            match part {
                LogContent::Records { batch, .. } => {
                    let batch = batch.project(&data_columns(&batch)?)?;
                    let keys = strings(&batch, "key")?;
                    let mask: BooleanArray = keys.iter().map(|k| Some(select.matches(k.unwrap_or_default()))).collect();
                    let batch = filter_record_batch(&batch, &mask)?;
                    let b = batches.len();
                    for (r, key) in strings(&batch, "key")?.iter().enumerate() {
                        latest.insert(key.unwrap_or_default().to_string(), Some((b, r)));
                    }
                    batches.push(batch);
                }
                LogContent::Deletes { records, .. } => {
                    for key in records.into_iter().filter_map(|d| d.record_key) {
                        if select.matches(&key) {
                            latest.insert(key, None);
                        }
                    }
                }
            }
        }
        let mut keep: Vec<Vec<bool>> = batches.iter().map(|b| vec![false; b.num_rows()]).collect();
        for (b, r) in latest.into_values().flatten() {
            keep[b][r] = true;
        }
        batches
            .iter()
            .zip(keep)
            .map(|(batch, keep)| Ok(filter_record_batch(batch, &BooleanArray::from(keep))?))
            .collect()
    }

    /// The records of `select` in every shard of `index`.
    pub(crate) async fn read_index(&self, index: Index, select: Select<'_>) -> Result<Vec<RecordBatch>> {
        let shards = (0..self.shards(index)).map(|shard| self.read_shard(index, shard, select));
        Ok(futures::future::try_join_all(shards).await?.into_iter().flatten().collect())
    }

    /// The selected records of a base file, reading only the row groups, and in them the pages,
    /// whose key range may hold them.
    async fn read_base(&self, path: &str, size: u64, select: Select<'_>) -> Result<Vec<RecordBatch>> {
        let reader = ParquetFile::open(self.table.storage(), path, size);
        let policy = match select {
            Select::All => PageIndexPolicy::Skip,
            Select::Keys(_) | Select::RecordKeys(_) => PageIndexPolicy::Optional,
        };
        let options = ArrowReaderOptions::new().with_page_index_policy(policy);
        let builder = ParquetRecordBatchStreamBuilder::new_with_options(reader, options).await?;
        let (metadata, schema) = (builder.metadata().clone(), builder.schema().clone());
        let converter = StatisticsConverter::try_new("key", &schema, metadata.file_metadata().schema_descr())
            .map_err(|e| Error::corrupt(path, e))?;
        let groups = metadata.row_groups();
        let (mins, maxes) = (converter.row_group_mins(groups)?, converter.row_group_maxes(groups)?);
        let row_groups: Vec<usize> = overlapping(select, &mins, &maxes)?
            .into_iter()
            .enumerate()
            .filter_map(|(i, keep)| keep.then_some(i))
            .collect();
        if row_groups.is_empty() {
            return Ok(Vec::new());
        }
        let names: Vec<String> = record_schema().fields().iter().map(|f| f.name().clone()).collect();
        let mask = ProjectionMask::columns(builder.parquet_schema(), names.iter().map(String::as_str));
        let mut builder = builder.with_projection(mask);
        if let (Some(pages), Some(offsets)) = (metadata.column_index(), metadata.offset_index()) {
            let (mins, maxes) = (
                converter.data_page_mins(pages, offsets, &row_groups)?,
                converter.data_page_maxes(pages, offsets, &row_groups)?,
            );
            if let Some(counts) = converter.data_page_row_counts(offsets, groups, &row_groups)? {
                let keep = overlapping(select, &mins, &maxes)?;
                let selectors = keep.iter().zip(counts.values()).map(|(&keep, &rows)| {
                    if keep { RowSelector::select(rows as usize) } else { RowSelector::skip(rows as usize) }
                });
                builder = builder.with_row_selection(RowSelection::from_iter(selectors));
            }
        }
        let row_filter = select.len() > ROW_FILTER_KEYS;
        if let Some(wanted) = Wanted::of(select).filter(|_| row_filter) {
            // The key column first; the others are decoded for the matching rows only (a lookup
            // of many keys selects most pages, of whose rows it keeps few; for a few keys the
            // pages selected are few and a second pass over them costs more than it saves).
            let key = ProjectionMask::columns(builder.parquet_schema(), ["key"]);
            let predicate = ArrowPredicateFn::new(key, move |batch: RecordBatch| {
                let keys = batch
                    .column(0)
                    .as_string_opt::<i32>()
                    .ok_or_else(|| ArrowError::SchemaError("a metadata record key is not a string".into()))?;
                Ok(keys.iter().map(|k| Some(wanted.matches(k.unwrap_or_default()))).collect::<BooleanArray>())
            });
            builder = builder.with_row_filter(RowFilter::new(vec![Box::new(predicate)]));
        }
        let mut stream = builder.with_row_groups(row_groups).build()?;
        let mut out = Vec::new();
        while let Some(batch) = stream.next().await {
            let batch = crate::schema::align(&batch?, &record_schema())?;
            let batch = match select {
                // The row filter kept only the selected keys already.
                Select::All => batch,
                _ if row_filter => batch,
                _ => {
                    let mask: BooleanArray =
                        strings(&batch, "key")?.iter().map(|k| Some(select.matches(k.unwrap_or_default()))).collect();
                    filter_record_batch(&batch, &mask)?
                }
            };
            if batch.num_rows() > 0 {
                out.push(batch);
            }
        }
        Ok(out)
    }
}

/// Above this many keys, a lookup filters rows on the key column before decoding the others.
const ROW_FILTER_KEYS: usize = 1024;

/// The keys of a [`Select`] as a hash set a Parquet row filter can own.
struct Wanted {
    keys: hashbrown::HashSet<String>,
    /// Whether the keys are record keys of `record_index` records (`partition` prefix ignored).
    record_keys: bool,
}

impl Wanted {
    fn of(select: Select<'_>) -> Option<Self> {
        match select {
            Select::All => None,
            Select::Keys(keys) => Some(Self { keys: keys.iter().cloned().collect(), record_keys: false }),
            Select::RecordKeys(keys) => Some(Self { keys: keys.iter().cloned().collect(), record_keys: true }),
        }
    }

    fn matches(&self, key: &str) -> bool {
        self.keys.contains(if self.record_keys { record_key_of(key) } else { key })
    }
}

/// Whether each `[min, max]` key range (row groups or pages; unknown bounds count as
/// everything) may hold a key of `select`.
fn overlapping(select: Select<'_>, mins: &ArrayRef, maxes: &ArrayRef) -> Result<Vec<bool>> {
    let as_strings = |a: &ArrayRef| arrow::compute::cast(a, &DataType::Utf8);
    let (mins, maxes) = (as_strings(mins)?, as_strings(maxes)?);
    let (mins, maxes) = (mins.as_string::<i32>(), maxes.as_string::<i32>());
    Ok((0..mins.len())
        .map(|i| !(mins.is_valid(i) && maxes.is_valid(i)) || select.overlaps(mins.value(i), maxes.value(i)))
        .collect())
}

/// The indices of the [`record_schema`] columns in a batch of the full metadata schema.
fn data_columns(batch: &RecordBatch) -> Result<Vec<usize>> {
    record_schema().fields().iter().map(|f| Ok(batch.schema().index_of(f.name())?)).collect()
}
