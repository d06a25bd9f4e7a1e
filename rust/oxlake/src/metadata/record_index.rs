//! The record index: record key and partition → the file group holding the record.
//!
//! Writers report the keys each write put into file groups and the keys it deleted
//! ([`KeyChanges`]); a clustering or an insert overwrite is read back from its files (every key of
//! a new file moved there, every key of a replaced group left it). The index is exact: upserts
//! route by it without reading a data file, and [`Table::lookup`] reads only the groups it names.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::Arc;

use arrow::array::{Array, RecordBatch, StringArray};
use datafusion::common::ScalarValue;
use datafusion::execution::SendableRecordBatchStream;
use futures::TryStreamExt;

use super::entries::{RecordEntries, record_key_of, shard_of, strings};
use super::reader::BaseRead;
use super::{Index, MetadataTable, Select};
pub use crate::commit::change::KeyChanges;
use crate::error::{Error, Result};
use crate::format::file_name::{BaseFileName, LogFileName};
use crate::keys::KeySpec;
use crate::read::splits::Split;
use crate::read::{Filter, Op, Predicate, QueryType, ScanOptions};
use crate::schema::{COMMIT_TIME, FILE_NAME, PARTITION_PATH, RECORD_KEY};
use crate::table::Table;
use crate::table::fs_view::{FileGroupId, FileSlice};

/// The file id named by a record's `_hoodie_file_name` (a base file name, a log file name, or
/// the file id itself, as log records carry).
pub(crate) fn file_id_of(file_name: &str) -> String {
    if let Some(b) = BaseFileName::parse(file_name) {
        return b.file_id;
    }
    LogFileName::parse(file_name).map_or_else(|| file_name.to_string(), |l| l.file_id)
}

/// The record index of a whole table, read from a snapshot of its meta fields, one list of
/// (key, location) per shard, each sorted by key. Locations are (partition, file id, instant).
pub(crate) async fn snapshot_entries(data: &Table, shards: u32) -> Result<Vec<Vec<RecordBatch>>> {
    let opts = ScanOptions {
        columns: Some(vec![RECORD_KEY.into(), PARTITION_PATH.into(), FILE_NAME.into(), COMMIT_TIME.into()]),
        ..ScanOptions::default()
    };
    // Locations are few (file groups × instants): rows refer to them by number.
    let mut locations: Vec<(String, String, String)> = Vec::new();
    let mut location_ids: HashMap<(String, String, String), u32> = HashMap::new();
    let mut by_shard: Vec<Vec<(String, u32)>> = vec![Vec::new(); shards as usize];
    let mut stream = data.scan(&opts).await?;
    while let Some(batch) = stream.try_next().await? {
        let cols: Vec<StringArray> = (0..4)
            .map(|i| {
                let c = arrow::compute::cast(batch.column(i), &arrow::datatypes::DataType::Utf8)?;
                c.as_any().downcast_ref::<StringArray>().cloned().ok_or_else(|| Error::invalid_data("meta field"))
            })
            .collect::<Result<_>>()?;
        for row in 0..batch.num_rows() {
            let key = cols[0].value(row);
            let location =
                (cols[1].value(row).to_string(), file_id_of(cols[2].value(row)), cols[3].value(row).to_string());
            let next = location_ids.len() as u32;
            let id = *location_ids.entry(location.clone()).or_insert_with(|| {
                locations.push(location);
                next
            });
            let composite = super::entries::record_index_key(key, &locations[id as usize].0);
            by_shard[shard_of(Index::RecordIndex, &composite, shards) as usize].push((composite, id));
        }
    }
    let mut out = Vec::with_capacity(shards as usize);
    for mut rows in by_shard {
        rows.sort_unstable();
        let mut batches = Vec::new();
        for chunk in rows.chunks(super::entries::BLOCK_ROWS) {
            let mut entries = RecordEntries::with_capacity(chunk.len());
            for (key, id) in chunk {
                let (partition, file_id, instant) = &locations[*id as usize];
                entries.push(record_key_of(key), partition, file_id, instant);
            }
            batches.push(entries.finish()?);
        }
        out.push(batches);
    }
    Ok(out)
}

/// A lookup of record keys in the record index, planned (footers and page indexes read): what it
/// will read, before it reads it.
pub(crate) struct Located<'a> {
    mdt: &'a MetadataTable,
    /// Per shard holding some of the keys: those keys, the shard's slice and how its base file
    /// is read.
    shards: Vec<(BTreeSet<String>, FileSlice, Option<BaseRead>)>,
    /// Keys looked up.
    keys: usize,
}

impl Located<'_> {
    /// Index entries the lookup decodes, and entries of the shards it reads, in base files (a log
    /// file is read whole; the metadata table compacts after a few).
    pub fn rows(&self) -> (usize, usize) {
        let bases = self.shards.iter().filter_map(|(_, _, base)| base.as_ref());
        bases.fold((0, 0), |(rows, total), b| (rows + b.rows, total + b.total))
    }

    /// Where the record index puts each key, in every partition holding it: (record key,
    /// partition) → file id.
    pub async fn read(self) -> Result<HashMap<(String, String), String>> {
        let mdt = self.mdt;
        let reads = self
            .shards
            .into_iter()
            .map(|(keys, slice, base)| async move { mdt.read_slice(&slice, base, Select::RecordKeys(&keys)).await });
        let mut out = HashMap::with_capacity(self.keys);
        for batches in futures::future::try_join_all(reads).await? {
            for batch in batches {
                let (key, partition, file) =
                    (strings(&batch, "key")?, strings(&batch, "partition")?, strings(&batch, "file")?);
                for i in 0..batch.num_rows() {
                    let location = (record_key_of(key.value(i)).to_string(), partition.value(i).to_string());
                    out.insert(location, file.value(i).to_string());
                }
            }
        }
        Ok(out)
    }
}

impl MetadataTable {
    /// Plans the lookup of `keys` (record keys) in the record index ([`Located::read`] reads it).
    pub(crate) async fn plan_locate(&self, keys: &BTreeSet<String>) -> Result<Located<'_>> {
        let shards = self.shards(Index::RecordIndex);
        let mut by_shard: Vec<BTreeSet<String>> = vec![BTreeSet::new(); shards as usize];
        for k in keys {
            by_shard[super::shard::shard_of(k, shards) as usize].insert(k.clone());
        }
        let plans = by_shard.into_iter().enumerate().filter(|(_, k)| !k.is_empty()).map(|(shard, keys)| async move {
            let planned = self.plan_shard(Index::RecordIndex, shard as u32, Select::RecordKeys(&keys)).await?;
            Ok::<_, Error>(planned.map(|(slice, base)| (keys, slice, base)))
        });
        let shards = futures::future::try_join_all(plans).await?.into_iter().flatten().collect();
        Ok(Located { mdt: self, shards, keys: keys.len() })
    }

    /// Where the record index puts each of `keys` (record keys), in every partition holding it:
    /// (record key, partition) → file id.
    pub(crate) async fn locate(&self, keys: &BTreeSet<String>) -> Result<HashMap<(String, String), String>> {
        self.plan_locate(keys).await?.read().await
    }
}

impl Table {
    /// The current rows of the records whose keys `keys` holds (rows with at least the record key
    /// columns); keys the table does not hold are absent. With the record index only the file
    /// groups holding the keys are read; else bloom filters and column statistics prune, and
    /// without a metadata table every slice is read.
    pub async fn lookup(&self, keys: &RecordBatch, columns: Option<Vec<String>>) -> Result<SendableRecordBatchStream> {
        let cfg = self.config();
        cfg.check_record_key_fields()?;
        for name in &cfg.record_key_fields {
            if keys.column_by_name(name).is_none() {
                return Err(Error::invalid_arg("keys", format!("the rows lack the record key column `{name}`")));
            }
        }
        let record_keys: BTreeSet<String> =
            KeySpec::from_config(cfg).record_keys(keys)?.iter().flatten().map(str::to_string).collect();
        if !cfg.populate_meta_fields {
            return self.lookup_virtual(keys, record_keys, columns).await;
        }
        let filter = Filter::Predicates(vec![Predicate {
            column: RECORD_KEY.into(),
            op: Op::In,
            values: record_keys.iter().map(|k| ScalarValue::Utf8(Some(k.clone()))).collect(),
        }]);
        let opts = ScanOptions { columns, filter: Some(filter.clone()), ..ScanOptions::default() };
        let mut plan = self.plan_scan(&ScanOptions { query: QueryType::Snapshot, ..ScanOptions::default() }).await?;
        let located = match self.fresh_metadata_table().await {
            Some(mdt) if mdt.has(Index::RecordIndex) => match mdt.locate(&record_keys).await {
                Ok(located) => Some(located),
                // The index only narrows the read (see `prune_by_indexes`).
                Err(e) => {
                    log::warn!("{}: record index unreadable ({e}); reading every file slice", self.uri());
                    None
                }
            },
            _ => None,
        };
        match located {
            Some(located) => {
                let groups: HashSet<FileGroupId> = located.into_iter().map(|((_, p), f)| (p, f)).collect();
                plan.slices.retain(|s| groups.contains(&s.group_id()));
            }
            None => plan.slices = self.prune_by_indexes(std::mem::take(&mut plan.slices), &filter).await?,
        }
        self.scan_split(Split::Scan(plan), &opts).await
    }
}

impl Table {
    /// [`Table::lookup`] in a table without meta fields: rows whose key fields hold the asked
    /// values are read (statistics and bloom filters prune by them), their keys made as writes
    /// make them, and only the rows of the asked keys kept; `_hoodie_record_key`, where asked for,
    /// holds the key (stored null).
    async fn lookup_virtual(
        &self,
        keys: &RecordBatch,
        record_keys: BTreeSet<String>,
        columns: Option<Vec<String>>,
    ) -> Result<SendableRecordBatchStream> {
        use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
        use futures::StreamExt;

        let stored = Arc::new(self.stored_keys()?);
        let fields: Vec<String> = stored.columns().iter().map(|c| c.to_string()).collect();
        // A superset: each key field among the values asked (a complex key's fields apart).
        let mut predicates = Vec::with_capacity(fields.len());
        for name in &fields {
            let col =
                keys.column_by_name(name).ok_or_else(|| Error::invalid_arg("keys", format!("no column `{name}`")))?;
            let mut values: Vec<ScalarValue> = Vec::new();
            for i in 0..col.len() {
                let v = ScalarValue::try_from_array(col, i)?;
                if !values.contains(&v) {
                    values.push(v);
                }
            }
            predicates.push(Predicate { column: name.clone(), op: Op::In, values });
        }
        let asked = columns.clone();
        let read: Option<Vec<String>> = columns.map(|mut c| {
            c.extend(fields.iter().filter(|f| !c.contains(f)).cloned().collect::<Vec<_>>());
            c
        });
        let filter = Filter::Predicates(predicates);
        let opts = ScanOptions { columns: read, filter: Some(filter.clone()), ..ScanOptions::default() };
        let mut plan = self.plan_scan(&ScanOptions { query: QueryType::Snapshot, ..ScanOptions::default() }).await?;
        plan.slices = self.prune_by_indexes(std::mem::take(&mut plan.slices), &filter).await?;
        let scanned = self.scan_split(Split::Scan(plan), &opts).await?;
        let schema = match &asked {
            Some(names) => {
                let s = scanned.schema();
                let picked: Vec<arrow::datatypes::FieldRef> = names
                    .iter()
                    .map(|n| s.field_with_name(n).map(|f| Arc::new(f.clone())))
                    .collect::<Result<_, _>>()?;
                Arc::new(arrow::datatypes::Schema::new(picked))
            }
            None => scanned.schema(),
        };
        let out_schema = schema.clone();
        let record_keys = Arc::new(record_keys);
        let kept = scanned.map(move |batch| {
            let batch = batch?;
            let made = stored.keys(&batch).map_err(datafusion::error::DataFusionError::from)?;
            let mask: arrow::array::BooleanArray =
                made.iter().map(|k| Some(k.is_some_and(|k| record_keys.contains(k)))).collect();
            let batch = arrow::compute::filter_record_batch(&batch, &mask)?;
            let made = arrow::compute::filter(&made, &mask)?;
            let columns = out_schema
                .fields()
                .iter()
                .map(|f| match f.name().as_str() {
                    RECORD_KEY => Ok(made.clone()),
                    name => batch.column_by_name(name).cloned().ok_or_else(|| {
                        datafusion::error::DataFusionError::Internal(format!("lookup lost column `{name}`"))
                    }),
                })
                .collect::<datafusion::error::Result<Vec<_>>>()?;
            Ok(RecordBatch::try_new(out_schema.clone(), columns)?)
        });
        Ok(Box::pin(RecordBatchStreamAdapter::new(schema, kept)))
    }
}

/// Keys of `rows` in a string array.
pub(crate) fn take_keys(keys: &StringArray, rows: &[u32]) -> Result<StringArray> {
    let indices = arrow::array::UInt32Array::from(rows.to_vec());
    let taken = arrow::compute::take(keys, &indices, None)?;
    taken.as_any().downcast_ref::<StringArray>().cloned().ok_or_else(|| Error::invalid_data("keys are not strings"))
}
