//! Reading the metadata table: the current records of one shard, merged from its latest slice
//! (the base file's records, then each admitted log block in order: later records replace
//! earlier ones of the same key, delete blocks remove keys).
//!
//! Reader rules (docs/METADATA_TABLE.md, "Kept in step"): the slice and the blocks are those of
//! the metadata timeline restricted to instants completed on the data timeline; nothing else is
//! read.
//!
//! A lookup of some keys (or key prefixes) reads only the base file's pages whose key range may
//! hold one of them (base files are sorted by key and carry a page index; most pages of a row
//! group selected, the row group is read whole), finds each key in them by binary search, and
//! keeps only the matching rows of the logs. Of the page index, only that of the row groups the
//! footer's statistics keep is read (docs/METADATA_TABLE.md, "A lookup's cost"). A lookup is
//! planned before it reads ([`MetadataTable::plan_base`]): a writer weighs what it would decode
//! against reading keys from data files.

use std::collections::{BTreeSet, HashMap};
use std::ops::Bound;
use std::sync::Arc;

use arrow::array::{Array, ArrayRef, AsArray, BooleanArray, RecordBatch, StringArray, UInt32Array};
use arrow::compute::{filter_record_batch, take_record_batch};
use arrow::datatypes::{DataType, Field, Schema};
use futures::StreamExt;
use parquet::arrow::ProjectionMask;
use parquet::arrow::arrow_reader::statistics::StatisticsConverter;
use parquet::arrow::arrow_reader::{ArrowReaderMetadata, ArrowReaderOptions, RowSelection, RowSelector};
use parquet::arrow::async_reader::ParquetRecordBatchStreamBuilder;
use parquet::file::metadata::{PageIndexPolicy, ParquetMetaData, ParquetMetaDataReader, ParquetStatisticsPolicy};

use super::entries::{record_key_of, record_schema, strings};
use super::{Index, MetadataTable, shard};
use crate::error::{Error, Result};
use crate::format::file_name::LogFileName;
use crate::log::{Admission, CommittedLogs, LogContent};
use crate::storage::ParquetFile;
use crate::table::fs_view::FileSlice;

/// Which records of a shard to read.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Select<'a> {
    /// Every record.
    All,
    /// Records with these keys (sorted, distinct).
    Keys(&'a BTreeSet<String>),
    /// `record_index` records of these record keys, in any partition (sorted, distinct).
    RecordKeys(&'a BTreeSet<String>),
    /// Records whose keys start with one of these.
    Prefixes(&'a BTreeSet<String>),
}

impl Select<'_> {
    fn matches(&self, key: &str) -> bool {
        match self {
            Select::All => true,
            Select::Keys(keys) => keys.contains(key),
            Select::RecordKeys(keys) => keys.contains(record_key_of(key)),
            Select::Prefixes(prefixes) => prefixes.iter().any(|p| key.starts_with(p.as_str())),
        }
    }

    /// Whether some selected key may lie in `[min, max]`.
    fn overlaps(&self, min: &str, max: &str) -> bool {
        let (keys, min, max) = match self {
            Select::All => return true,
            // The keys starting with `p` are those from `p` up to the first key past them.
            Select::Prefixes(prefixes) => {
                return prefixes
                    .iter()
                    .any(|p| p.as_str() <= max && (min <= p.as_str() || min.starts_with(p.as_str())));
            }
            Select::Keys(keys) => (keys, min, max),
            Select::RecordKeys(keys) => (keys, record_key_of(min), record_key_of(max)),
        };
        keys.range(min.to_string()..).next().is_some_and(|k| k.as_str() <= max)
    }
}

/// Fails if a log file that a completed deltacommit up to `upper` wrote into `slice` is not
/// there: the index would answer without its records (a key it holds read as absent) without a
/// word.
fn check_logs_present(committed: &CommittedLogs, slice: &FileSlice, upper: &str) -> Result<()> {
    let Some(base) = &slice.base else { return Ok(()) };
    for (path, c) in committed.iter() {
        if c.file_id != base.name.file_id || c.instant.as_str() > upper || slice.logs.iter().any(|l| &l.path == path) {
            continue;
        }
        let of_slice = LogFileName::parse(path.rsplit('/').next().unwrap_or(path))
            .is_some_and(|name| name.file_id == base.name.file_id && name.instant == base.name.instant);
        if of_slice {
            return Err(Error::corrupt(
                path,
                format!("missing: completed instant {} wrote {} bytes into this log file", c.instant, c.end),
            ));
        }
    }
    Ok(())
}

impl MetadataTable {
    /// The current records of one shard of `index` that `select` picks, as batches of
    /// [`record_schema`] (in no particular order).
    pub(crate) async fn read_shard(&self, index: Index, shard: u32, select: Select<'_>) -> Result<Vec<RecordBatch>> {
        match self.plan_shard(index, shard, select).await? {
            Some((slice, base)) => self.read_slice(&slice, base, select).await,
            None => Ok(Vec::new()),
        }
    }

    /// The slice of a shard readers use, and how to read `select` in its base file (`None`
    /// before the first instant readers may use).
    pub(super) async fn plan_shard(
        &self,
        index: Index,
        shard: u32,
        select: Select<'_>,
    ) -> Result<Option<(FileSlice, Option<BaseRead>)>> {
        let Some(upper) = &self.upper else { return Ok(None) };
        let file_id = shard::file_id(index.name(), shard);
        let Some(slice) =
            self.view.get(&(index.name().to_string(), file_id.clone())).and_then(|g| g.slice_as_of(upper))
        else {
            return Err(Error::corrupt(super::DIR, format!("file group {file_id} is missing")));
        };
        let base = match &slice.base {
            Some(base) => Some(self.plan_base(&base.path, base.size, select).await.map_err(|e| e.in_file(&base.path))?),
            None => None,
        };
        Ok(Some((slice.clone(), base)))
    }

    /// The records of `select` in a shard's `slice`, whose base file is read as `base` plans.
    pub(super) async fn read_slice(
        &self,
        slice: &FileSlice,
        base: Option<BaseRead>,
        select: Select<'_>,
    ) -> Result<Vec<RecordBatch>> {
        let mut batches = Vec::new();
        if let Some(base) = base {
            let path = slice.base.as_ref().map_or("", |b| b.path.as_str());
            batches.extend(self.read_base(base, select).await.map_err(|e| e.in_file(path))?);
        }
        let Some(upper) = self.upper.clone() else { return Ok(batches) };
        let admission = Admission::new(upper, Arc::new(self.table.timeline().clone()));
        check_logs_present(&*admission.committed(self.table.storage()).await?, slice, &admission.upper)?;
        if slice.logs.is_empty() {
            return Ok(batches);
        }
        let content =
            crate::log::read_slice(self.table.storage(), &slice.logs, &self.table.schema(), &admission, None).await?;
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

    /// What reading the records of `select` in a base file takes: the row groups whose key range
    /// may hold them (from the footer), and in them the pages (from the page index of those row
    /// groups alone). No data is read.
    pub(super) async fn plan_base(&self, path: &str, size: u64, select: Select<'_>) -> Result<BaseRead> {
        let mut reader = ParquetFile::open(self.table.storage(), path, size);
        // The footer alone: a shard's page index is large (an entry per page of every column of
        // every row group), and a lookup needs that of a few row groups. Only the key column's
        // statistics are decoded: the others' are never used, and are most of a large footer (a
        // file laid out otherwise has no key bounds then, and is read whole: never wrongly).
        let stats = match self.table.schema().index_of("key") {
            Ok(key) => ParquetStatisticsPolicy::skip_except(&[key]),
            Err(_) => ParquetStatisticsPolicy::KeepAll,
        };
        let options = ArrowReaderOptions::new()
            .with_page_index_policy(PageIndexPolicy::Skip)
            .with_column_stats_policy(stats)
            .with_size_stats_policy(ParquetStatisticsPolicy::SkipAll);
        let loaded = ArrowReaderMetadata::load_async(&mut reader, options.clone()).await?;
        let (mut parquet, schema) = (loaded.metadata().clone(), loaded.schema().clone());
        let descr = parquet.file_metadata().schema_descr_ptr();
        let converter = StatisticsConverter::try_new("key", &schema, &descr).map_err(|e| Error::corrupt(path, e))?;
        let groups = parquet.row_groups();
        let (mins, maxes) = (converter.row_group_mins(groups)?, converter.row_group_maxes(groups)?);
        let mut row_groups: Vec<usize> = overlapping(select, &mins, &maxes)?
            .into_iter()
            .enumerate()
            .filter_map(|(i, keep)| keep.then_some(i))
            .collect();
        let mut rows: usize = row_groups.iter().map(|&i| groups[i].num_rows() as usize).sum();
        let total = parquet.file_metadata().num_rows().max(0) as usize;
        let mut selection = None;
        if let (Select::Keys(_) | Select::RecordKeys(_) | Select::Prefixes(_), Some(key), false) =
            (select, converter.parquet_column_index(), row_groups.is_empty())
        {
            parquet = Arc::new(with_page_index(&reader, &parquet, &row_groups, key).await?);
            row_groups = (0..row_groups.len()).collect();
            let groups = parquet.row_groups();
            if let (Some(pages), Some(offsets)) = (parquet.column_index(), parquet.offset_index()) {
                let (mins, maxes) = (
                    converter.data_page_mins(pages, offsets, &row_groups)?,
                    converter.data_page_maxes(pages, offsets, &row_groups)?,
                );
                if let Some(counts) = converter.data_page_row_counts(offsets, groups, &row_groups)? {
                    let pages: Vec<(bool, usize)> = overlapping(select, &mins, &maxes)?
                        .into_iter()
                        .zip(counts.values().iter().map(|&n| n as usize))
                        .collect();
                    let selected: usize = pages.iter().filter(|(keep, _)| *keep).map(|(_, n)| n).sum();
                    // Selecting most pages costs more (a range and a skip per page) than reading
                    // the row groups whole.
                    if selected * 4 < rows * 3 {
                        rows = selected;
                        let selectors = pages
                            .iter()
                            .map(|&(keep, n)| if keep { RowSelector::select(n) } else { RowSelector::skip(n) });
                        selection = Some(RowSelection::from_iter(selectors));
                    }
                }
            }
        }
        // Columns of few distinct values (dictionary-encoded in the file) stay dictionaries: a read
        // decodes their indices, and only the rows kept become strings.
        let hinted: Vec<Field> = schema
            .fields()
            .iter()
            .map(|f| match f.data_type() {
                DataType::Utf8 if FEW_VALUES.contains(&f.name().as_str()) => f
                    .as_ref()
                    .clone()
                    .with_data_type(DataType::Dictionary(Box::new(DataType::Int32), Box::new(DataType::Utf8))),
                _ => f.as_ref().clone(),
            })
            .collect();
        let hinted = Arc::new(Schema::new_with_metadata(hinted, schema.metadata().clone()));
        let metadata = ArrowReaderMetadata::try_new(parquet, options.with_schema(hinted))?;
        Ok(BaseRead { file: reader, metadata, row_groups, selection, rows, total })
    }

    /// The selected records of a base file, as `plan` says to read them.
    async fn read_base(&self, plan: BaseRead, select: Select<'_>) -> Result<Vec<RecordBatch>> {
        if plan.row_groups.is_empty() {
            return Ok(Vec::new());
        }
        let builder = ParquetRecordBatchStreamBuilder::new_with_metadata(plan.file, plan.metadata);
        let names: Vec<String> = match select {
            // Where a record is: the rest of a record-index entry is not read.
            Select::RecordKeys(_) => ["key", "index", "partition", "file"].map(String::from).to_vec(),
            Select::All | Select::Keys(_) | Select::Prefixes(_) => {
                record_schema().fields().iter().map(|f| f.name().clone()).collect()
            }
        };
        let mask = ProjectionMask::columns(builder.parquet_schema(), names.iter().map(String::as_str));
        let mut builder = builder.with_projection(mask);
        if let Some(selection) = plan.selection {
            builder = builder.with_row_selection(selection);
        }
        let mut stream = builder.with_row_groups(plan.row_groups).build()?;
        let mut out = Vec::new();
        while let Some(batch) = stream.next().await {
            let batch = batch?;
            let batch = match select {
                Select::All => batch,
                // Base files are sorted by key: each selected key is found by binary search.
                _ => take_record_batch(&batch, &UInt32Array::from(sorted_matches(strings(&batch, "key")?, select)))?,
            };
            if batch.num_rows() > 0 {
                out.push(crate::schema::align(&batch, &record_schema())?);
            }
        }
        Ok(out)
    }
}

/// Metadata columns of few distinct values.
const FEW_VALUES: [&str; 4] = ["index", "file", "partition", "instant"];

/// The rows of `keys` (sorted ascending, as in a base file) that `select` picks: each selected key
/// in the batch's range is found by binary search (all rows of a record key, one per partition,
/// for [`Select::RecordKeys`]).
fn sorted_matches(keys: &StringArray, select: Select<'_>) -> Vec<u32> {
    let n = keys.len();
    if n == 0 {
        return Vec::new();
    }
    let (wanted, part): (&BTreeSet<String>, fn(&str) -> &str) = match select {
        Select::All => return (0..n as u32).collect(),
        Select::Prefixes(prefixes) => return prefixed_rows(keys, prefixes),
        Select::Keys(keys) => (keys, |k| k),
        Select::RecordKeys(keys) => (keys, record_key_of),
    };
    let at = |i: usize| part(keys.value(i));
    let (first, last) = (at(0), at(n - 1));
    let mut rows = Vec::new();
    let mut from = 0;
    for w in wanted.range::<str, _>((Bound::Included(first), Bound::Included(last))) {
        // The first row at or after `w`, searching from the previous key's.
        let (mut lo, mut hi) = (from, n);
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            if at(mid) < w.as_str() { lo = mid + 1 } else { hi = mid }
        }
        while lo < n && at(lo) == w.as_str() {
            rows.push(lo as u32);
            lo += 1;
        }
        from = lo;
    }
    rows
}

/// The rows of `keys` (sorted ascending) starting with one of `prefixes`, in order: the rows of a
/// prefix are consecutive, from the first at or after it.
fn prefixed_rows(keys: &StringArray, prefixes: &BTreeSet<String>) -> Vec<u32> {
    let mut rows = Vec::new();
    for p in prefixes {
        let (mut lo, mut hi) = (0, keys.len());
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            if keys.value(mid) < p.as_str() { lo = mid + 1 } else { hi = mid }
        }
        rows.extend((lo..keys.len()).take_while(|&i| keys.value(i).starts_with(p.as_str())).map(|i| i as u32));
    }
    // Nested prefixes (`a/`, `a/b/`) pick some rows twice.
    rows.sort_unstable();
    rows.dedup();
    rows
}

/// A planned read of a metadata base file ([`MetadataTable::plan_base`]).
pub(super) struct BaseRead {
    file: ParquetFile,
    metadata: ArrowReaderMetadata,
    row_groups: Vec<usize>,
    /// The pages to read, when the file has a page index.
    selection: Option<RowSelection>,
    /// Rows the read decodes (those of the pages or row groups selected).
    pub rows: usize,
    /// Rows of the file.
    pub total: usize,
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

/// The footer `parquet` restricted to the row groups `groups` (ascending), with their page index:
/// the page offsets of every column (reading selected pages needs them) and the page statistics
/// of the leaf column `key` alone. A file holds every column index, then every offset index, and
/// the Parquet reader fetches one range spanning what it decodes: each run of consecutive row
/// groups is fetched on its own (two ranges), all at once.
async fn with_page_index(
    reader: &ParquetFile,
    parquet: &ParquetMetaData,
    groups: &[usize],
    key: usize,
) -> Result<ParquetMetaData> {
    let runs = groups.chunk_by(|a, b| *b == a + 1).map(|run| run_page_index(reader, parquet, run, key));
    let (mut row_groups, mut pages, mut offsets) = (Vec::new(), Some(Vec::new()), Some(Vec::new()));
    for run in futures::future::try_join_all(runs).await? {
        row_groups.extend(run.row_groups().iter().cloned());
        // An index missing in one run (a file without one) is missing for all: never half of it.
        match (pages.as_mut(), run.column_index()) {
            (Some(all), Some(index)) => all.extend(index.iter().cloned()),
            _ => pages = None,
        }
        match (offsets.as_mut(), run.offset_index()) {
            (Some(all), Some(index)) => all.extend(index.iter().cloned()),
            _ => offsets = None,
        }
    }
    Ok(ParquetMetaData::new(parquet.file_metadata().clone(), row_groups)
        .into_builder()
        .set_column_index(pages)
        .set_offset_index(offsets)
        .build())
}

/// [`with_page_index`] of one run of consecutive row groups.
async fn run_page_index(
    reader: &ParquetFile,
    parquet: &ParquetMetaData,
    run: &[usize],
    key: usize,
) -> Result<ParquetMetaData> {
    let mut kept = Vec::with_capacity(run.len());
    for &g in run {
        let group = parquet.row_group(g).clone();
        let columns = group
            .columns()
            .iter()
            .enumerate()
            .map(|(c, chunk)| match c == key {
                true => Ok(chunk.clone()),
                false => {
                    chunk.clone().into_builder().set_column_index_offset(None).set_column_index_length(None).build()
                }
            })
            .collect::<parquet::errors::Result<Vec<_>>>()?;
        kept.push(group.into_builder().set_column_metadata(columns).build()?);
    }
    let subset = ParquetMetaData::new(parquet.file_metadata().clone(), kept);
    let load = |column_index: PageIndexPolicy, offset_index: PageIndexPolicy| {
        let (subset, mut reader) = (subset.clone(), reader.clone());
        async move {
            let mut loader = ParquetMetaDataReader::new_with_metadata(subset)
                .with_column_index_policy(column_index)
                .with_offset_index_policy(offset_index);
            loader.load_page_index(&mut reader).await?;
            Ok::<_, Error>(loader.finish()?)
        }
    };
    let (pages, offsets) = futures::try_join!(
        load(PageIndexPolicy::Optional, PageIndexPolicy::Skip),
        load(PageIndexPolicy::Skip, PageIndexPolicy::Optional),
    )?;
    let offsets = offsets.offset_index().cloned();
    Ok(pages.into_builder().set_offset_index(offsets).build())
}

/// The indices of the [`record_schema`] columns in a batch of the full metadata schema.
fn data_columns(batch: &RecordBatch) -> Result<Vec<usize>> {
    record_schema().fields().iter().map(|f| Ok(batch.schema().index_of(f.name())?)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metadata::record_index_key;
    use proptest::prelude::*;

    /// Sorted distinct `record_index` keys: record keys, each in one or more partitions.
    fn index_keys(records: &BTreeSet<(String, String)>) -> StringArray {
        let mut keys: Vec<String> = records.iter().map(|(k, p)| record_index_key(k, p)).collect();
        keys.sort();
        StringArray::from(keys)
    }

    proptest! {
        /// Binary search over a sorted batch finds exactly the rows a scan would keep.
        #[test]
        fn sorted_matches_equal_a_scan(
            records in proptest::collection::btree_set(("[a-c]{0,3}", "p[0-2]"), 0..60),
            wanted in proptest::collection::btree_set("[a-c]{0,3}", 0..20),
        ) {
            let keys = index_keys(&records);
            for select in [Select::RecordKeys(&wanted), Select::All] {
                let scanned: Vec<u32> =
                    (0..keys.len() as u32).filter(|&i| select.matches(keys.value(i as usize))).collect();
                prop_assert_eq!(sorted_matches(&keys, select), scanned);
            }
            let full: BTreeSet<String> = wanted.iter().map(|k| record_index_key(k, "p1")).collect();
            let scanned: Vec<u32> = (0..keys.len() as u32).filter(|&i| full.contains(keys.value(i as usize))).collect();
            prop_assert_eq!(sorted_matches(&keys, Select::Keys(&full)), scanned);
        }

        /// A prefix selection finds by binary search exactly the rows a scan keeps, and every key
        /// range holding such a row overlaps it (pages and row groups are never wrongly skipped).
        #[test]
        fn prefixes_equal_a_scan(
            keys in proptest::collection::btree_set("[ab/%]{0,5}", 0..40),
            prefixes in proptest::collection::btree_set("[ab/%]{0,3}", 0..5),
        ) {
            let sorted: Vec<&String> = keys.iter().collect();
            let array = StringArray::from(sorted.iter().map(|k| k.as_str()).collect::<Vec<_>>());
            let select = Select::Prefixes(&prefixes);
            let scanned: Vec<u32> =
                (0..array.len() as u32).filter(|&i| select.matches(array.value(i as usize))).collect();
            prop_assert_eq!(sorted_matches(&array, select), scanned);
            for i in 0..sorted.len() {
                for j in i..sorted.len() {
                    if sorted[i..=j].iter().any(|k| select.matches(k)) {
                        prop_assert!(select.overlaps(sorted[i], sorted[j]), "{:?}..{:?}", sorted[i], sorted[j]);
                    }
                }
            }
        }
    }
}
