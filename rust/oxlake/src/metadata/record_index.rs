//! The record index: record key and partition → the file group holding the record.
//!
//! Writers report the keys each write put into file groups and the keys it deleted
//! ([`KeyChanges`]); a clustering or an insert overwrite is read back from its files (every key of
//! a new file moved there, every key of a replaced group left it). A build reads the keys every
//! file slice holds ([`HeldKeys`]), as those writes would have left them. The index is exact:
//! upserts route by it without reading a data file, and [`Table::lookup`] reads only the groups it
//! names. It holds one file group per key and partition: of the copies of a key that a write
//! without a lookup put beside it (an insert, a bulk insert), the one written last.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::Arc;

use arrow::array::{Array, RecordBatch, StringArray};
use datafusion::common::ScalarValue;
use datafusion::execution::SendableRecordBatchStream;
use futures::StreamExt;

use super::entries::{RecordEntries, record_key_of, shard_of, strings};
use super::reader::BaseRead;
use super::{Index, MetadataTable, Select};
pub use crate::commit::change::KeyChanges;
use crate::error::{Error, Result};
use crate::keys::KeySpec;
use crate::log::KeyState;
use crate::read::splits::Split;
use crate::read::{Filter, Op, Predicate, QueryType, ScanOptions};
use crate::schema::RECORD_KEY;
use crate::storage::spill::{Spill, SpillFile};
use crate::table::Table;
use crate::table::fs_view::{FileGroupId, FileSlice};

/// The record keys the latest file slices of a table hold, read from their files: each base
/// file's keys, and those of its slice's committed log blocks with what the last of them did
/// ([`KeyState`]). What a build of the record index starts from, and what its validation checks.
pub(crate) struct HeldKeys {
    /// Each slice read: (partition, file id, base instant), the latest base instants first.
    pub slices: Vec<(String, String, String)>,
    /// Per shard: (`record_index` key, state, slice), in no order. Under commit-time ordering
    /// every delete is [`KeyState::Deleted`].
    pub by_shard: Vec<Vec<(String, KeyState, u32)>>,
    /// Whether the table has a global index (a key is one record in all partitions).
    pub global: bool,
    /// Whether the table orders by event time: a key held deleted keeps its entry.
    pub event_time: bool,
}

/// Slices whose keys are read at once.
const SLICES_AT_ONCE: usize = 16;

/// Where the keys of each slice read go: (shard, `record_index` key, state, slice) of each.
type KeySink<'a> = dyn FnMut(Vec<(u32, String, KeyState, u32)>) -> Result<()> + Send + 'a;

impl HeldKeys {
    /// The record index of the table, one list of records per shard, each sorted by key: the
    /// entries writes keep in step would hold ([`KeyChanges`]); see [`shard_entries`]. (A build
    /// takes them from [`SpilledKeys`], a shard at a time.)
    #[cfg(test)]
    pub fn entries(self) -> Result<Vec<Vec<RecordBatch>>> {
        let (slices, global, event_time) = (&self.slices, self.global, self.event_time);
        self.by_shard.into_iter().map(|rows| shard_entries(rows, slices, global, event_time)).collect()
    }
}

/// [`HeldKeys`] spilled to local disk, a file per shard, so that a build of the record index
/// holds one shard's keys at a time whatever the size of the table.
pub(crate) struct SpilledKeys {
    slices: Vec<(String, String, String)>,
    shards: Vec<Option<SpillFile>>,
    global: bool,
    event_time: bool,
}

/// Keys of slices spilled at once (a batch of the spill).
const SPILL_BATCH_KEYS: usize = 65_536;

impl SpilledKeys {
    /// The keys of every slice of the latest snapshot of `data` (replaced file groups aside), each
    /// shard's (of `shards`) spilled into a file of its own under `TMPDIR`.
    pub async fn read(data: &Table, shards: u32) -> Result<Self> {
        use arrow::datatypes::{DataType, Field, Schema};
        let schema = Arc::new(Schema::new(vec![
            Field::new("key", DataType::Utf8, false),
            Field::new("state", DataType::UInt8, false),
            Field::new("slice", DataType::UInt32, false),
        ]));
        let dir = crate::storage::spill::directory(None)?;
        let mut spill = Spill::new(&dir, &schema, shards.max(1) as usize, 0);
        let mut pending: Vec<(u32, String, KeyState, u32)> = Vec::new();
        let mut flush = |pending: &mut Vec<(u32, String, KeyState, u32)>| -> Result<()> {
            if pending.is_empty() {
                return Ok(());
            }
            let into: Vec<u32> = pending.iter().map(|k| k.0).collect();
            let keys = StringArray::from_iter_values(pending.iter().map(|k| k.1.as_str()));
            let states = arrow::array::UInt8Array::from_iter_values(pending.iter().map(|k| k.2 as u8));
            let slices = arrow::array::UInt32Array::from_iter_values(pending.iter().map(|k| k.3));
            let batch = RecordBatch::try_new(schema.clone(), vec![Arc::new(keys), Arc::new(states), Arc::new(slices)])?;
            spill.push_into(&batch, &into)?;
            pending.clear();
            Ok(())
        };
        let (slices, global, event_time) = read_keys(data, shards, &mut |keys| {
            pending.extend(keys);
            if pending.len() >= SPILL_BATCH_KEYS { flush(&mut pending) } else { Ok(()) }
        })
        .await?;
        flush(&mut pending)?;
        Ok(SpilledKeys { slices, shards: spill.finish_buckets()?, global, event_time })
    }

    /// The record index's entries of shard `shard` ([`shard_entries`]).
    pub fn entries(&self, shard: usize) -> Result<Vec<RecordBatch>> {
        shard_entries(self.rows(shard)?, &self.slices, self.global, self.event_time)
    }

    /// The keys of shard `shard` alone, as [`HeldKeys`] (validation compares them with that
    /// shard of the index).
    pub fn held(&self, shard: usize) -> Result<HeldKeys> {
        let by_shard = vec![self.rows(shard)?];
        Ok(HeldKeys { slices: self.slices.clone(), by_shard, global: self.global, event_time: self.event_time })
    }

    /// (`record_index` key, state, slice) of every key of shard `shard`, read back.
    fn rows(&self, shard: usize) -> Result<Vec<(String, KeyState, u32)>> {
        let mut rows: Vec<(String, KeyState, u32)> = Vec::new();
        if let Some(file) = self.shards.get(shard).and_then(Option::as_ref) {
            rows.reserve(file.rows);
            for batch in file.read()? {
                let keys = strings(&batch, "key")?;
                let column = |name: &str| batch.column_by_name(name).cloned();
                let states =
                    column("state").and_then(|c| c.as_any().downcast_ref::<arrow::array::UInt8Array>().cloned());
                let slices =
                    column("slice").and_then(|c| c.as_any().downcast_ref::<arrow::array::UInt32Array>().cloned());
                let (Some(states), Some(slices)) = (states, slices) else {
                    return Err(Error::invalid_data("a spill of record keys lacks its states or slices"));
                };
                for i in 0..batch.num_rows() {
                    rows.push((keys.value(i).to_string(), key_state(states.value(i))?, slices.value(i)));
                }
            }
        }
        Ok(rows)
    }

    /// The shards, with or without keys.
    pub fn shards(&self) -> usize {
        self.shards.len()
    }
}

fn key_state(code: u8) -> Result<KeyState> {
    [KeyState::Written, KeyState::DeletedByOrder, KeyState::Deleted]
        .into_iter()
        .find(|s| *s as u8 == code)
        .ok_or_else(|| Error::invalid_data(format!("no key state {code}")))
}

/// Reads the keys of every slice of the latest snapshot of `data` (replaced file groups aside),
/// handing each slice's to `sink` with its shard of `shards`; returns the slices read ((partition,
/// file id, base instant), the latest base instants first), and whether the table has a global
/// index and orders by event time. Under commit-time ordering every delete is
/// [`KeyState::Deleted`].
async fn read_keys(
    data: &Table,
    shards: u32,
    sink: &mut KeySink<'_>,
) -> Result<(Vec<(String, String, String)>, bool, bool)> {
    let global = data.config().global_index;
    let event_time = data.config().merge_mode == crate::config::MergeMode::EventTime;
    let timeline = Arc::new(data.timeline().clone());
    let mut slices = latest_slices(data).await?;
    // The latest slice first: of two copies of a key (a write without a lookup put one beside
    // the other), the one written last as far as base instants tell, which writes index.
    slices.sort_by(|(a, sa), (b, sb)| sb.base_instant.cmp(&sa.base_instant).then_with(|| a.cmp(b)));
    // A damaged committed log block is an error: its keys would be missing from the index.
    let committed = match slices.iter().any(|(_, s)| !s.logs.is_empty()) {
        true => Arc::new(crate::log::CommittedLogs::load(data.storage(), &timeline).await?),
        false => Arc::default(),
    };
    let stored = Arc::new(data.stored_keys()?);
    // Owned slices and futures, spawned: the stream stays `Send` for any caller.
    let owned: Vec<FileSlice> = slices.iter().map(|(_, s)| s.clone()).collect();
    let reads = owned.into_iter().map(|slice| {
        let (storage, stored) = (data.storage().clone(), stored.clone());
        let (committed, timeline) = (committed.clone(), timeline.clone());
        tokio::spawn(async move {
            let mut keys: HashMap<String, KeyState> = HashMap::new();
            if let Some(base) = &slice.base {
                let in_base = stored.of_base_file(&storage, &base.path, base.size).await?;
                keys.extend(in_base.iter().flatten().map(|k| (k.to_string(), KeyState::Written)));
            }
            if !slice.logs.is_empty() {
                let logs = &slice.logs;
                keys.extend(crate::log::committed_record_keys(&storage, logs, &committed, &stored, &timeline).await?);
            }
            Ok::<_, Error>(keys)
        })
    });
    let mut reads = futures::stream::iter(reads).buffered(SLICES_AT_ONCE);
    let mut index = 0;
    while let Some(keys) = reads.next().await {
        let keys = keys.map_err(|e| Error::invalid_data(format!("a key reading task failed: {e}")))??;
        let partition = &slices[index].0.0;
        let mut out = Vec::with_capacity(keys.len());
        for (key, mut state) in keys {
            if !event_time && state == KeyState::DeletedByOrder {
                state = KeyState::Deleted;
            }
            let composite = super::entries::record_index_key(&key, partition);
            out.push((shard_of(Index::RecordIndex, &composite, shards), composite, state, index as u32));
        }
        sink(out)?;
        index += 1;
    }
    let slices = slices.into_iter().map(|((partition, file_id), s)| (partition, file_id, s.base_instant)).collect();
    Ok((slices, global, event_time))
}

/// The record index entries of one shard from the keys its slices hold (`rows`: `record_index`
/// key, state, slice of `slices`), sorted by key:
/// - A key written in a group has its entry there; of several such groups in one partition (a
///   record index holds one per key and partition), the latest slice.
/// - In a table ordered by event time, a key a slice holds deleted keeps its entry: a later
///   write of it with a lower ordering value must go to that group to lose to an event-time
///   delete, and a later event-time delete must reach the group (as key reads route both).
///   Not in a table with a global index when the key is written in another partition: the
///   delete moved it there (and an entry holds no state for a lookup to pass it over).
/// - Otherwise a deleted key has none.
fn shard_entries(
    mut rows: Vec<(String, KeyState, u32)>,
    slices: &[(String, String, String)],
    global: bool,
    event_time: bool,
) -> Result<Vec<RecordBatch>> {
    // By key and partition, then by state, then the latest slice first; one of each.
    rows.sort_unstable();
    rows.dedup_by(|later, first| later.0 == first.0);
    // A shard holds every partition of its keys.
    let written: HashSet<&str> =
        rows.iter().filter(|r| r.1 == KeyState::Written).map(|r| record_key_of(&r.0)).collect();
    let kept = |(key, state, _): &&(String, KeyState, u32)| match state {
        KeyState::Written => true,
        KeyState::DeletedByOrder | KeyState::Deleted => event_time && !(global && written.contains(record_key_of(key))),
    };
    let kept: Vec<&(String, KeyState, u32)> = rows.iter().filter(kept).collect();
    let mut batches = Vec::new();
    for chunk in kept.chunks(super::entries::BLOCK_ROWS) {
        let mut entries = RecordEntries::with_capacity(chunk.len());
        for (key, _, slice) in chunk {
            let (partition, file_id, instant) = &slices[*slice as usize];
            entries.push(record_key_of(key), partition, file_id, instant);
        }
        batches.push(entries.finish()?);
    }
    Ok(batches)
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

/// Keys a shard of a record index holds at most when a build sizes it
/// ([`MetadataConfig::size_record_index`](super::MetadataConfig)): a build holds one shard's keys
/// (about 600 bytes a UUID key as it sorts and encodes them), `validate` one shard's (about
/// 1.2 KB a key), and a lookup reads a shard's footer (a row group per 65,536 keys).
pub const KEYS_PER_SHARD: u64 = 2_000_000;

/// The most shards a build gives a record index (Apache Hudi's default
/// `hoodie.metadata.record.index.max.filegroup.count`).
pub const MAX_SHARDS: u32 = 10_000;

/// Bytes of a log file counted as one key when sizing (a record's meta fields alone take more
/// uncompressed; a log is seldom more than a small part of a slice).
const LOG_BYTES_PER_KEY: u64 = 32;

/// The latest file slice of every file group of `data` (replaced groups aside): what the record
/// index holds the keys of.
async fn latest_slices(data: &Table) -> Result<Vec<(FileGroupId, FileSlice)>> {
    let Some(latest) = data.timeline().latest_completed_data().map(|i| i.time.clone()) else {
        return Ok(Vec::new());
    };
    let view = data.file_system_view().await?;
    let replaced = data.replaced_file_groups(&latest).await?;
    Ok(view.slices_as_of(&latest, &replaced).map(|(g, s)| (g.id(), s.clone())).collect())
}

/// The shard count a build gives the record index of `data` ([`shards_for`] its
/// [`estimated_keys`]).
pub(crate) async fn sized_shards(data: &Table, least: u32) -> Result<u32> {
    Ok(shards_for(estimated_keys(data).await?, least))
}

/// One shard per [`KEYS_PER_SHARD`] of `keys`, at least `least`, at most [`MAX_SHARDS`] (or
/// `least` if more).
pub(crate) fn shards_for(keys: u64, least: u32) -> u32 {
    let wanted = u32::try_from(keys.div_ceil(KEYS_PER_SHARD)).unwrap_or(u32::MAX).min(MAX_SHARDS);
    wanted.max(least)
}

/// About how many keys the latest file slices of `data` hold: a base file's rows (its footer
/// read, 16 at a time), and a log's bytes over [`LOG_BYTES_PER_KEY`].
pub(crate) async fn estimated_keys(data: &Table) -> Result<u64> {
    use futures::{StreamExt, TryStreamExt};
    let mut bases = Vec::new();
    let mut keys: u64 = 0;
    for (_, slice) in latest_slices(data).await? {
        keys += slice.logs.iter().map(|l| l.size / LOG_BYTES_PER_KEY).sum::<u64>();
        bases.extend(slice.base.as_ref().map(|b| (b.path.clone(), b.size)));
    }
    let storage = data.storage();
    let rows = futures::stream::iter(bases)
        .map(|(path, size)| async move {
            let mut file = crate::storage::ParquetFile::open(storage, &path, size);
            let footer = parquet::arrow::async_reader::AsyncFileReader::get_metadata(&mut file, None)
                .await
                .map_err(|e| Error::from(e).in_file(&path))?;
            Ok::<u64, Error>(footer.file_metadata().num_rows().max(0) as u64)
        })
        .buffer_unordered(16)
        .try_fold(0u64, |all, rows| async move { Ok(all + rows) })
        .await?;
    Ok(keys + rows)
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
        if let crate::config::KeyGenerator::Other(class) = &cfg.key_generator {
            return Err(Error::unsupported(format!(
                "looking records up by key with the key generator {class}: oxlake cannot make its keys from the \
                 key columns (filter a scan on `{RECORD_KEY}` instead)"
            )));
        }
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
        let snapshot = ScanOptions { query: QueryType::Snapshot, ..ScanOptions::default() };
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
        let plan = match located {
            Some(located) => {
                let groups: HashSet<FileGroupId> = located.into_iter().map(|((_, p), f)| (p, f)).collect();
                match self.plan_groups(&groups).await {
                    Ok(Some(plan)) => plan,
                    // A group not where the index put it, or an instant file gone meanwhile (the
                    // whole plan retries on a reloaded timeline): planned whole, then narrowed.
                    Ok(None) | Err(Error::Storage { source: object_store::Error::NotFound { .. }, .. }) => {
                        log::debug!("{}: the record index's groups planned from the whole table", self.uri());
                        let mut plan = self.plan_scan(&snapshot).await?;
                        plan.slices.retain(|s| groups.contains(&s.group_id()));
                        plan
                    }
                    Err(e) => return Err(e),
                }
            }
            None => {
                let mut plan = self.plan_scan(&snapshot).await?;
                plan.slices = self.prune_by_indexes(std::mem::take(&mut plan.slices), &filter).await?;
                plan
            }
        };
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metadata::entries::record_index_key;

    #[test]
    fn a_sized_record_index_has_a_shard_per_keys_per_shard_within_its_bounds() {
        assert_eq!(shards_for(0, 8), 8);
        assert_eq!(shards_for(16 * KEYS_PER_SHARD, 8), 16);
        assert_eq!(shards_for(16 * KEYS_PER_SHARD + 1, 8), 17);
        assert_eq!(shards_for(100_000_000, 8), 50);
        assert_eq!(shards_for(u64::MAX, 8), MAX_SHARDS);
        assert_eq!(shards_for(u64::MAX, MAX_SHARDS + 5), MAX_SHARDS + 5, "an asked count is a floor");
        for keys in [1, 999_999, 2_000_000, 2_000_001, 77_000_000, 50_000_000_000] {
            let shards = u64::from(shards_for(keys, 1));
            assert!(keys.div_ceil(shards) <= KEYS_PER_SHARD || shards == u64::from(MAX_SHARDS), "{keys}");
        }
    }

    #[tokio::test]
    async fn the_estimate_counts_base_rows_and_logs_by_their_bytes() {
        use crate::config::TableType;
        use crate::test_support::{by_parity, id_city_table};
        use crate::write::{WriteConfig, WriteOperation};
        let dir = tempfile::tempdir().unwrap();
        let mut t = id_city_table(dir.path(), TableType::MergeOnRead, crate::services::default_options()).await;
        assert_eq!(estimated_keys(&t).await.unwrap(), 0);
        let ids: Vec<i64> = (0..500).collect();
        let config = WriteConfig::default();
        t.write(WriteOperation::BulkInsert, vec![by_parity(&ids)], &config).await.unwrap();
        assert_eq!(estimated_keys(&t).await.unwrap(), 500, "base files: their rows");
        t.write(WriteOperation::Upsert, vec![by_parity(&ids[..100])], &config).await.unwrap();
        let estimate = estimated_keys(&t).await.unwrap();
        assert!(estimate > 500, "a log counts too: {estimate}");
    }

    #[test]
    fn a_spilled_key_state_reads_back_as_itself() {
        for state in [KeyState::Written, KeyState::DeletedByOrder, KeyState::Deleted] {
            assert_eq!(key_state(state as u8).unwrap(), state);
        }
        assert!(key_state(3).is_err());
    }

    /// Held keys of one shard: (record key, partition, state, slice) over the slices `p/a`
    /// (the latest), `p/b`, `q/c`.
    fn held(rows: &[(&str, &str, KeyState, u32)], global: bool) -> HeldKeys {
        let slice = |p: &str, f: &str, t: &str| (p.to_string(), f.to_string(), t.to_string());
        HeldKeys {
            slices: vec![slice("p", "a", "3"), slice("p", "b", "2"), slice("q", "c", "1")],
            by_shard: vec![rows.iter().map(|&(k, p, state, s)| (record_index_key(k, p), state, s)).collect()],
            global,
            event_time: true,
        }
    }

    /// The entries built, as (record key, partition, file id).
    fn built(held: HeldKeys) -> Vec<(String, String, String)> {
        let batches = held.entries().unwrap().into_iter().flatten();
        let mut out = Vec::new();
        for b in batches {
            let (key, partition, file) =
                (strings(&b, "key").unwrap(), strings(&b, "partition").unwrap(), strings(&b, "file").unwrap());
            for i in 0..b.num_rows() {
                out.push((
                    record_key_of(key.value(i)).to_string(),
                    partition.value(i).to_string(),
                    file.value(i).to_string(),
                ));
            }
        }
        out
    }

    fn entry(k: &str, p: &str, f: &str) -> (String, String, String) {
        (k.to_string(), p.to_string(), f.to_string())
    }

    #[test]
    fn a_build_keeps_what_writes_keep_of_each_key() {
        use KeyState::*;
        let rows = [
            // Written in two groups of `p` (an insert put a copy beside it): the latest slice.
            ("1", "p", Written, 1),
            ("1", "p", Written, 0),
            // Written beats deleted, whichever slice is later.
            ("2", "p", DeletedByOrder, 0),
            ("2", "p", Written, 1),
            // In a table ordered by event time every delete keeps its key's entry.
            ("3", "p", DeletedByOrder, 1),
            ("4", "p", Deleted, 0),
            // A key in two partitions is two records, without a global index.
            ("5", "p", DeletedByOrder, 0),
            ("5", "q", Written, 2),
        ];
        let all = vec![
            entry("1", "p", "a"),
            entry("2", "p", "b"),
            entry("3", "p", "b"),
            entry("4", "p", "a"),
            entry("5", "p", "a"),
            entry("5", "q", "c"),
        ];
        assert_eq!(built(held(&rows, false)), all);
        // With a global index the delete in `p` moved key 5 to `q`: its entry there alone.
        let moved: Vec<_> = all.iter().filter(|e| **e != entry("5", "p", "a")).cloned().collect();
        assert_eq!(built(held(&rows, true)), moved);
        // Ordered by commit time, a deleted key has no entry (a read of its keys never says
        // `DeletedByOrder` there).
        let by_commit_time = HeldKeys { event_time: false, ..held(&rows, false) };
        assert_eq!(built(by_commit_time), [entry("1", "p", "a"), entry("2", "p", "b"), entry("5", "q", "c")]);
    }
}
