//! The metadata table (DESIGN.md §3): a merge-on-read table of our own under
//! `.hoodie/oxlake/metadata/`, one partition per index, each sharded into a fixed number of file
//! groups by a stable hash ([`shard`]), keys sorted in base files. Advertised by the data table's
//! property `oxlake.metadata.partitions`, never by Apache Hudi's.
//!
//! The `files` index lists the table's data files (path → size), so planning reads no directory.
//!
//! Reader rules: the metadata table is used only when it is fresh (every instant that changed
//! files on the data timeline after it was built is also completed on it), and only its instants
//! whose time is a completed instant of the data timeline count; anything else (a crash between
//! the two commits, a writer that ignores the metadata table) makes readers list storage instead,
//! and the next writer builds it again ([`catch_up`]).

pub mod shard;

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;

use arrow::array::{Array, ArrayRef, Int64Array, RecordBatch, StringArray};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use bytes::Bytes;
use futures::TryStreamExt;
use object_store::buffered::BufWriter;
use parquet::arrow::AsyncArrowWriter;

use crate::commit::Transaction;
use crate::config::{CreateOptions, PROPERTIES_FILE, TableType};
use crate::error::{Error, Result};
use crate::format::commit::{CommitMetadata, WriteStat};
use crate::format::file_name::{BaseFileName, LogFileName, PARTITION_METADATA, file_path};
use crate::format::instant::{Action, Instant};
use crate::format::log_block::{DeleteRecord, OrderingVal};
use crate::read::{Filter, ScanOptions};
use crate::schema;
use crate::storage::FileInfo;
use crate::table::Table;
use crate::write::{WriteConfig, base_file_properties};

/// Where the metadata table lives, relative to the data table's root.
pub const DIR: &str = ".hoodie/oxlake/metadata";
/// The data table property naming the indexes the metadata table keeps.
pub const PARTITIONS_KEY: &str = "oxlake.metadata.partitions";
/// The metadata table's property holding the shard count of the `files` index.
const FILES_SHARDS_KEY: &str = "oxlake.metadata.files.shards";
/// The index of data files.
pub const FILES: &str = "files";
/// Stands in for the build time of a metadata table that does not record one (never fresh).
const UNKNOWN_BUILD_TIME: &str = "00000000000000000";

/// The metadata table of one data table, opened at the data table's state.
#[derive(Debug)]
pub struct MetadataTable {
    table: Table,
    /// The data instant the metadata table was built at.
    built_at: String,
    /// Instants that changed the data table's files after the build and that the metadata table
    /// lacks: non-empty means stale.
    missing: Vec<String>,
}

/// How a metadata table is laid out.
#[derive(Clone, Copy, Debug)]
pub struct MetadataConfig {
    /// File groups of the `files` index.
    pub files_shards: u32,
}

impl Default for MetadataConfig {
    fn default() -> Self {
        MetadataConfig { files_shards: 4 }
    }
}

/// What `Table::validate_metadata` found: every difference between the metadata table and a full
/// listing of storage, by file.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ValidationReport {
    /// Whether the table has a metadata table at all.
    pub present: bool,
    /// Completed data-timeline instants the metadata table lacks (it is stale; readers list).
    pub missing_instants: Vec<String>,
    /// One line per difference.
    pub differences: Vec<String>,
}

impl ValidationReport {
    pub fn ok(&self) -> bool {
        self.present && self.missing_instants.is_empty() && self.differences.is_empty()
    }
}

fn record_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("key", DataType::Utf8, false),
        Field::new("index", DataType::Utf8, false),
        Field::new("size", DataType::Int64, true),
    ]))
}

/// Whether an instant of the data timeline changes the table's files (and so must reach the
/// metadata table). A restore changes them through rollback instants of its own.
fn changes_files(i: &Instant) -> bool {
    i.is_completed() && (i.action.writes_data() || matches!(i.action, Action::Clean | Action::Rollback))
}

impl Table {
    /// The metadata table, when the table advertises one.
    pub async fn metadata_table(&self) -> Result<Option<MetadataTable>> {
        if !self.config().raw.get(PARTITIONS_KEY).is_some_and(|p| p.split(',').any(|p| p.trim() == FILES)) {
            return Ok(None);
        }
        let mut mdt = Table::open(&metadata_uri(self), self.options().clone()).await?;
        // Only instants completed on the data timeline count (a write that crashed between its
        // metadata commit and its data commit left one that must not be read).
        let data = self.timeline();
        let built_at = mdt.config().raw.get(BUILT_AT_KEY).cloned().unwrap_or_else(|| UNKNOWN_BUILD_TIME.to_string());
        let completed = |time: &str| data.instants_at(time).iter().any(|d| d.is_completed());
        // A compaction of the metadata table carries the time of the data instant it follows,
        // suffixed (see `compact_if_due`).
        mdt.restrict_timeline(|i| completed(i.time.get(..17).unwrap_or(&i.time)));
        let have: HashSet<&str> = mdt.timeline().completed_data().map(|i| i.time.as_str()).collect();
        let pending_then: HashSet<&str> =
            mdt.config().raw.get(BUILT_PENDING_KEY).map(|p| p.split(',').collect()).unwrap_or_default();
        let missing = data
            .instants()
            .iter()
            .filter(|i| changes_files(i) && (i.time > built_at || pending_then.contains(i.time.as_str())))
            .filter(|i| !have.contains(i.time.as_str()))
            .map(|i| i.time.clone());
        // A build whose `indexing` instant never completed left nothing a reader may use.
        let unfinished = (!completed(&built_at)).then(|| built_at.clone());
        let missing = unfinished.into_iter().chain(missing).collect();
        Ok(Some(MetadataTable { table: mdt, built_at, missing }))
    }

    /// Builds the metadata table from a full listing of storage, replacing any earlier one;
    /// recorded on the data timeline as an `indexing` instant. Returns that instant.
    pub async fn build_metadata(&mut self, config: MetadataConfig) -> Result<String> {
        let tx = Transaction::begin(self, Action::Indexing).await?;
        let time = tx.time().to_string();
        match build(self, &time, config).await {
            Ok(()) => {}
            Err(e) => return Err(tx.fail(self, e).await),
        }
        // The metadata table is complete; advertising it makes it count once `time` completes.
        if let Err(e) = self.set_property(PARTITIONS_KEY, Some(FILES)).await {
            return Err(tx.fail(self, e).await);
        }
        tx.commit(self, &CommitMetadata { operation_type: Some("INDEXING".into()), ..Default::default() }).await?;
        Ok(time)
    }

    /// Compares the metadata table with a full listing of storage.
    pub async fn validate_metadata(&self) -> Result<ValidationReport> {
        let Some(mdt) = self.metadata_table().await? else { return Ok(ValidationReport::default()) };
        let mut report =
            ValidationReport { present: true, missing_instants: mdt.missing.clone(), ..Default::default() };
        let mut listed = BTreeMap::new();
        for f in data_files(self.storage().list_recursive("").await?) {
            if self.is_committed_file(&f.path).await? {
                listed.insert(f.path, f.size);
            }
        }
        let indexed: BTreeMap<String, u64> = mdt.files().await?.into_iter().map(|f| (f.path, f.size)).collect();
        for (path, size) in &listed {
            match indexed.get(path) {
                None => report.differences.push(format!("{path}: in storage ({size} bytes), not in the files index")),
                Some(s) if s != size => {
                    report.differences.push(format!("{path}: {size} bytes in storage, {s} in the files index"))
                }
                Some(_) => {}
            }
        }
        for path in indexed.keys().filter(|p| !listed.contains_key(*p)) {
            report.differences.push(format!("{path}: in the files index, not in storage"));
        }
        Ok(report)
    }

    /// Whether a data file holds anything committed: a base file of a committed instant, a log
    /// file with a block of one. (A pending write's files are in storage, not yet in the index.)
    async fn is_committed_file(&self, path: &str) -> Result<bool> {
        let name = path.rsplit('/').next().unwrap_or(path);
        if let Some(base) = BaseFileName::parse(name) {
            return Ok(self.timeline().is_committed(&base.instant));
        }
        let instants = crate::log::block_instants(self.storage(), path).await?;
        Ok(instants.is_empty() || instants.iter().any(|i| self.timeline().is_committed(i)))
    }

    /// Sets (or with `None` removes) one line of `hoodie.properties`, keeping every other line.
    async fn set_property(&mut self, key: &str, value: Option<&str>) -> Result<()> {
        let text = self.storage().get(PROPERTIES_FILE).await?;
        let text = std::str::from_utf8(&text).map_err(|e| Error::corrupt(PROPERTIES_FILE, e))?;
        let mut out: String = text
            .lines()
            .filter(|line| line.split(['=', ':']).next().unwrap_or_default().trim() != key)
            .flat_map(|line| [line, "\n"])
            .collect();
        if let Some(value) = value {
            out.push_str(&format!("{key}={value}\n"));
        }
        let config = crate::config::TableConfig::parse(&out)?;
        self.storage().put(PROPERTIES_FILE, Bytes::from(out)).await?;
        self.replace_config(config);
        Ok(())
    }
}

/// The metadata table property recording the data instant it was built at.
const BUILT_AT_KEY: &str = "oxlake.metadata.built.at";
/// ... and the data writes pending then: their files may have missed the build's listing, so
/// they count as missing once they complete.
const BUILT_PENDING_KEY: &str = "oxlake.metadata.built.pending";

fn metadata_uri(table: &Table) -> String {
    format!("{}/{DIR}", table.uri().trim_end_matches('/'))
}

/// The data files of a listing of the table root (no timeline files, no partition markers).
fn data_files(files: Vec<FileInfo>) -> Vec<FileInfo> {
    files
        .into_iter()
        .filter(|f| {
            let name = f.path.rsplit('/').next().unwrap_or(&f.path);
            !f.path.starts_with(".hoodie/")
                && !name.starts_with(PARTITION_METADATA)
                && (BaseFileName::parse(name).is_some() || LogFileName::parse(name).is_some())
        })
        .collect()
}

/// Writes a new metadata table at `time`: one base file per shard of the `files` index, keys
/// sorted, in one deltacommit of the metadata table's own timeline.
async fn build(data: &Table, time: &str, config: MetadataConfig) -> Result<()> {
    let storage = data.storage();
    for f in storage.list_recursive(DIR).await? {
        storage.delete(&f.path).await?;
    }
    let create = CreateOptions {
        name: format!("{}_metadata", data.config().name),
        table_type: TableType::MergeOnRead,
        record_key_fields: vec!["key".into()],
        partition_fields: vec!["index".into()],
        ordering_field: None,
        hive_style: false,
        inline_compaction: None,
    };
    let mut mdt = Table::create(&metadata_uri(data), data.options().clone(), create, record_schema()).await?;
    mdt.set_property(FILES_SHARDS_KEY, Some(&config.files_shards.to_string())).await?;
    mdt.set_property(BUILT_AT_KEY, Some(time)).await?;
    let pending: Vec<&str> =
        data.timeline().pending().filter(|i| i.action.writes_data()).map(|i| i.time.as_str()).collect();
    mdt.set_property(BUILT_PENDING_KEY, Some(&pending.join(","))).await?;
    let shards = by_shard(data_files(storage.list_recursive("").await?), config.files_shards);
    let tx = Transaction::begin_at(&mut mdt, Action::DeltaCommit, time, Bytes::new()).await?;
    let mut metadata = CommitMetadata { operation_type: Some("BULK_INSERT".into()), ..Default::default() };
    metadata.extra_metadata.insert(CommitMetadata::SCHEMA_KEY.into(), schema::to_avro(&record_schema(), "metadata")?);
    for (n, files) in shards.into_iter().enumerate() {
        match write_base_file(&mdt, time, FILES, n as u32, &files).await {
            Ok(stat) => metadata.partition_to_write_stats.entry(FILES.to_string()).or_default().push(stat),
            Err(e) => return Err(tx.fail(&mut mdt, e).await),
        }
    }
    tx.commit(&mut mdt, &metadata).await?;
    Ok(())
}

/// One shard's base file: the meta fields Apache Hudi expects, then key, index and size.
async fn write_base_file(mdt: &Table, time: &str, index: &str, shard: u32, files: &[FileInfo]) -> Result<WriteStat> {
    let file_id = shard::file_id(index, shard);
    let name = BaseFileName { file_id: file_id.clone(), write_token: "0-0-1".into(), instant: time.to_string() }.name();
    let rel = file_path(index, &name);
    let n = files.len();
    let keys = StringArray::from_iter_values(files.iter().map(|f| f.path.as_str()));
    let seqnos = StringArray::from_iter_values((0..n).map(|i| format!("{time}_{shard}_{i}")));
    let columns: Vec<ArrayRef> = vec![
        Arc::new(StringArray::from(vec![time; n])),
        Arc::new(seqnos),
        Arc::new(keys.clone()),
        Arc::new(StringArray::from(vec![index; n])),
        Arc::new(StringArray::from(vec![name.as_str(); n])),
        Arc::new(keys),
        Arc::new(StringArray::from(vec![index; n])),
        Arc::new(Int64Array::from_iter_values(files.iter().map(|f| f.size as i64))),
    ];
    let batch = RecordBatch::try_new(mdt.schema(), columns)?;
    let sink = BufWriter::new(mdt.storage().object_store(), mdt.storage().path(&rel));
    let mut writer =
        AsyncArrowWriter::try_new(sink, mdt.schema(), Some(base_file_properties(&WriteConfig::default())))?;
    writer.write(&batch).await?;
    writer.close().await?;
    let size = mdt.storage().head(&rel).await?.map(|m| m.size).unwrap_or_default() as i64;
    Ok(WriteStat {
        file_id,
        path: Some(rel),
        prev_commit: Some("null".into()),
        partition_path: Some(index.to_string()),
        num_writes: n as i64,
        num_inserts: n as i64,
        total_write_bytes: size,
        file_size_in_bytes: size,
        ..WriteStat::default()
    })
}

/// Records the data files an instant of the data table added and deleted in the metadata table:
/// a deltacommit with the same time, completed before the data instant completes (it counts only
/// once the data instant completes). Nothing to do without a metadata table; a stale one is left
/// stale (readers list storage until it is built again).
pub(crate) async fn sync(data: &Table, time: &str, added: &[FileInfo], deleted: &[String]) -> Result<()> {
    let Some(current) = data.metadata_table().await? else { return Ok(()) };
    if !current.is_fresh() {
        log::info!("{}: metadata table stale (missing {:?}); not updated", data.uri(), current.missing);
        return Ok(());
    }
    compact_if_due(data, &current, time).await?;
    let mut mdt = Table::open(&metadata_uri(data), data.options().clone()).await?;
    let shards: u32 = mdt.config().raw.get(FILES_SHARDS_KEY).and_then(|s| s.parse().ok()).unwrap_or(1);
    let mut by_shard: BTreeMap<u32, (Vec<&FileInfo>, Vec<&str>)> = BTreeMap::new();
    let shard_of_path = |path: &str| shard::shard_of(path.rsplit_once('/').map_or("", |(p, _)| p), shards);
    for f in added {
        by_shard.entry(shard_of_path(&f.path)).or_default().0.push(f);
    }
    for path in deleted {
        by_shard.entry(shard_of_path(path)).or_default().1.push(path);
    }
    let tx = Transaction::begin_at(&mut mdt, Action::DeltaCommit, time, Bytes::new()).await?;
    let view = match mdt.file_system_view().await {
        Ok(view) => view,
        Err(e) => return Err(tx.fail(&mut mdt, e).await),
    };
    let mut metadata = CommitMetadata { operation_type: Some("UPSERT".into()), ..Default::default() };
    metadata.extra_metadata.insert(CommitMetadata::SCHEMA_KEY.into(), schema::to_avro(&record_schema(), "metadata")?);
    for (n, (upserts, deletes)) in by_shard {
        let file_id = shard::file_id(FILES, n);
        let slice = view
            .groups()
            .find(|g| g.partition == FILES && g.file_id == file_id)
            .and_then(|g| g.slices.values().next_back());
        let Some(slice) = slice else {
            let e = Error::corrupt(DIR, format!("file group {file_id} is missing"));
            return Err(tx.fail(&mut mdt, e).await);
        };
        match write_log(&mdt, time, n, slice, &upserts, &deletes).await {
            Ok(stat) => metadata.partition_to_write_stats.entry(FILES.to_string()).or_default().push(stat),
            Err(e) => return Err(tx.fail(&mut mdt, e).await),
        }
    }
    tx.commit(&mut mdt, &metadata).await?;
    Ok(())
}

/// Catches a stale metadata table up before a change of the data table (the next writer repairs
/// what another writer or a crash left, DESIGN.md §3): built again from a listing, with the same
/// shards. An unreadable one is built again too.
pub(crate) async fn catch_up(data: &mut Table) -> Result<()> {
    let shards = match data.metadata_table().await {
        Ok(None) => return Ok(()),
        Ok(Some(mdt)) if mdt.is_fresh() => return Ok(()),
        Ok(Some(mdt)) => {
            log::info!("{}: metadata table stale (missing {:?}); building it again", data.uri(), mdt.missing);
            mdt.table.config().raw.get(FILES_SHARDS_KEY).and_then(|s| s.parse().ok())
        }
        Err(e) => {
            log::warn!("{}: metadata table unreadable ({e}); building it again", data.uri());
            None
        }
    };
    let config = MetadataConfig { files_shards: shards.unwrap_or(MetadataConfig::default().files_shards) };
    data.build_metadata(config).await?;
    Ok(())
}

/// Log files a shard's latest slice may gather before the metadata table is compacted.
const COMPACT_AFTER_LOGS: usize = 10;

/// Compacts the metadata table when a shard's latest slice has [`COMPACT_AFTER_LOGS`] log files:
/// new base files of every shard, holding the index as readers see it (only blocks of instants
/// completed on the data timeline), at time `<latest completed data instant>001`, which orders
/// after that instant and before any later one. Runs before the deltacommit of `syncing`, and only
/// when no other data write is pending: a write that completed later would have written its
/// blocks into a slice the compaction leaves behind.
async fn compact_if_due(data: &Table, current: &MetadataTable, syncing: &str) -> Result<()> {
    let Some(latest) = data.timeline().latest_completed_data().map(|i| i.time.clone()) else { return Ok(()) };
    let view = current.table.file_system_view().await?;
    let due = view.groups().any(|g| g.slices.values().next_back().is_some_and(|s| s.logs.len() >= COMPACT_AFTER_LOGS));
    let others_pending = data.timeline().pending().any(|i| i.action.writes_data() && i.time != syncing);
    if !due || others_pending {
        return Ok(());
    }
    let time = format!("{}001", &latest[..latest.len().min(17)]);
    let mut mdt = Table::open(&metadata_uri(data), data.options().clone()).await?;
    if !mdt.timeline().instants_at(&time).is_empty() {
        return Ok(());
    }
    let files = current.files().await?;
    let shards: u32 = mdt.config().raw.get(FILES_SHARDS_KEY).and_then(|s| s.parse().ok()).unwrap_or(1);
    // The plan names no file group: writers never wait for this compaction (it gives way).
    let plan = Bytes::from(crate::services::CompactionPlan::default().to_json()?);
    let tx = Transaction::begin_at(&mut mdt, Action::Compaction, &time, plan).await?;
    let mut metadata = CommitMetadata { operation_type: Some("COMPACT".into()), compacted: true, ..Default::default() };
    metadata.extra_metadata.insert(CommitMetadata::SCHEMA_KEY.into(), schema::to_avro(&record_schema(), "metadata")?);
    for (n, files) in by_shard(files, shards).into_iter().enumerate() {
        match write_base_file(&mdt, &time, FILES, n as u32, &files).await {
            Ok(stat) => metadata.partition_to_write_stats.entry(FILES.to_string()).or_default().push(stat),
            Err(e) => return Err(tx.fail(&mut mdt, e).await),
        }
    }
    crate::commit::failpoint("metadata-compaction-before-commit");
    // A writer that began its sync meanwhile may have put its log into the slice this compaction
    // leaves behind: then the compaction gives way (it runs again at a later sync).
    mdt.reload().await?;
    let raced = mdt.timeline().instants().iter().any(|i| i.action == Action::DeltaCommit && i.time > latest);
    if raced {
        log::info!("{}: metadata compaction at {time} gave way to a concurrent sync", data.uri());
        tx.abort(&mut mdt).await?;
        // An aborted compaction keeps its plan to run again; this one has none to keep.
        let requested = Instant::new(time, Action::Compaction, crate::format::instant::State::Requested);
        return mdt.storage().delete(&mdt.timeline().path_of(&requested)).await;
    }
    tx.commit(&mut mdt, &metadata).await?;
    log::info!("{}: metadata table compacted at {time}", data.uri());
    remove_old_slices(&mdt).await
}

/// Deletes the slices of the metadata table older than the one before the latest: a reader that
/// opened the table before this compaction still reads the one before. (No instant records it:
/// an interrupted removal is finished by the next compaction.)
async fn remove_old_slices(mdt: &Table) -> Result<()> {
    let view = mdt.file_system_view().await?;
    for group in view.groups() {
        let slices: Vec<_> = group.slices.values().collect();
        for slice in &slices[..slices.len().saturating_sub(2)] {
            for path in slice.base.iter().map(|b| &b.path).chain(slice.logs.iter().map(|l| &l.path)) {
                mdt.storage().delete(path).await?;
            }
        }
    }
    Ok(())
}

/// Files by shard of the `files` index, each shard sorted by path.
fn by_shard(files: Vec<FileInfo>, shards: u32) -> Vec<Vec<FileInfo>> {
    let mut out: Vec<Vec<FileInfo>> = vec![Vec::new(); shards.max(1) as usize];
    for f in files {
        let partition = f.path.rsplit_once('/').map_or("", |(p, _)| p);
        out[shard::shard_of(partition, shards) as usize].push(f);
    }
    for shard in &mut out {
        shard.sort_by(|a, b| a.path.cmp(&b.path));
    }
    out
}

/// One shard's changes as a new log file of its latest slice: a data block of the files added,
/// a delete block of the files deleted.
async fn write_log(
    mdt: &Table,
    time: &str,
    shard: u32,
    slice: &crate::table::fs_view::FileSlice,
    upserts: &[&FileInfo],
    deletes: &[&str],
) -> Result<WriteStat> {
    let file_id = shard::file_id(FILES, shard);
    let mut blocks = Vec::new();
    if !upserts.is_empty() {
        let n = upserts.len();
        let keys = StringArray::from_iter_values(upserts.iter().map(|f| f.path.as_str()));
        let columns: Vec<ArrayRef> = vec![
            Arc::new(StringArray::from(vec![time; n])),
            Arc::new(StringArray::from_iter_values((0..n).map(|i| format!("{time}_{shard}_{i}")))),
            Arc::new(keys.clone()),
            Arc::new(StringArray::from(vec![FILES; n])),
            Arc::new(StringArray::from(vec![file_id.as_str(); n])),
            Arc::new(keys),
            Arc::new(StringArray::from(vec![FILES; n])),
            Arc::new(Int64Array::from_iter_values(upserts.iter().map(|f| f.size as i64))),
        ];
        let batch = RecordBatch::try_new(mdt.schema(), columns)?;
        blocks.push(crate::log::parquet_block(time, &batch, &mdt.config().name)?);
    }
    if !deletes.is_empty() {
        let records: Vec<DeleteRecord> = deletes
            .iter()
            .map(|path| DeleteRecord {
                record_key: Some(path.to_string()),
                partition_path: Some(FILES.to_string()),
                ordering: OrderingVal::COMMIT_TIME,
            })
            .collect();
        blocks.push(crate::log::delete_block(time, &records, &record_schema(), &mdt.config().name)?);
    }
    let after = slice.logs.iter().filter(|l| l.name.instant == slice.base_instant).map(|l| l.name.version).max();
    let file = crate::log::write_new(
        mdt.storage(),
        FILES,
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
        partition_path: Some(FILES.to_string()),
        num_writes: upserts.len() as i64,
        num_update_writes: upserts.len() as i64,
        num_deletes: deletes.len() as i64,
        total_log_records: (upserts.len() + deletes.len()) as i64,
        total_log_blocks: blocks.len() as i64,
        log_version: Some(i64::from(file.name.version)),
        log_files: Some(vec![file.name.name()]),
        total_write_bytes: file.size as i64,
        file_size_in_bytes: file.size as i64,
        ..WriteStat::default()
    })
}

impl MetadataTable {
    /// Whether readers may use it: nothing that changed the data table's files is missing.
    pub fn is_fresh(&self) -> bool {
        self.missing.is_empty()
    }

    /// The data instant it was built at.
    pub fn built_at(&self) -> &str {
        &self.built_at
    }

    /// The data files the `files` index lists (paths relative to the data table's root).
    pub async fn files(&self) -> Result<Vec<FileInfo>> {
        let opts = ScanOptions {
            columns: Some(vec!["key".into(), "size".into()]),
            filter: Some(Filter::Sql(format!("index = '{FILES}'"))),
            ..ScanOptions::default()
        };
        let batches: Vec<RecordBatch> = self.table.scan(&opts).await?.try_collect().await?;
        let mut out = Vec::new();
        for batch in batches {
            let keys = batch.column(0).as_any().downcast_ref::<StringArray>().cloned();
            let sizes = batch.column(1).as_any().downcast_ref::<Int64Array>().cloned();
            let (Some(keys), Some(sizes)) = (keys, sizes) else {
                return Err(Error::corrupt(DIR, "the files index has unexpected column types"));
            };
            for i in 0..batch.num_rows() {
                out.push(FileInfo { path: keys.value(i).to_string(), size: sizes.value(i).max(0) as u64 });
            }
        }
        Ok(out)
    }
}
