//! The metadata table (docs/METADATA_TABLE.md): a merge-on-read table of our own under
//! `.hoodie/oxlake/metadata/`, one partition per index, each sharded into a fixed number of file
//! groups by a stable hash ([`shard`]), keys sorted in base files. Advertised by the data table's
//! property `oxlake.metadata.partitions`, never by Apache Hudi's.
//!
//! The indexes ([`Index`]): `files` lists the table's data files (planning reads no directory);
//! `column_stats` and `bloom_filters` describe each data file (planning prunes file slices by
//! them, [`file_index`]); `record_index` maps record keys to file groups (writes route by it,
//! lookups read only the groups holding the keys, [`record_index`]).
//!
//! Reader rules: the metadata table is used only when it is fresh (every instant that changed
//! files on the data timeline after it was built is also completed on it), and only its instants
//! whose time is a completed instant of the data timeline count; anything else (a crash between
//! the two commits, a writer that ignores the metadata table) makes readers list storage instead,
//! and the next writer builds it again ([`catch_up`]).

mod damaged;
mod entries;
pub mod file_index;
mod reader;
pub mod record_index;
pub mod shard;
mod sync;
mod validate;

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::Arc;

use bytes::Bytes;
use futures::{StreamExt, TryStreamExt};

use std::any::Any;

use crate::commit::Transaction;
use crate::config::{CreateOptions, PROPERTIES_FILE, TableType};
use crate::error::{Error, Result};
use crate::format::commit::CommitMetadata;
use crate::format::file_name::{BaseFileName, LogFileName, PARTITION_METADATA};
use crate::format::instant::{Action, Instant};
use crate::schema;
use crate::storage::FileInfo;
use crate::table::Table;
use crate::table::fs_view::FileSystemView;

pub use entries::{KEY_SEPARATOR, record_index_key};
pub use file_index::{ColumnStats, FileEntry, FileStats};
pub(crate) use reader::Select;
pub use record_index::KeyChanges;
pub(crate) use sync::sync;
pub use validate::ValidationReport;

/// Where the metadata table lives, relative to the data table's root.
pub const DIR: &str = crate::table::METADATA_TABLE_DIR;
/// The data table property naming the indexes the metadata table keeps.
pub const PARTITIONS_KEY: &str = "oxlake.metadata.partitions";
/// The index of data files (always kept).
pub const FILES: &str = "files";
/// Stands in for the build time of a metadata table that does not record one (never fresh).
const UNKNOWN_BUILD_TIME: &str = "00000000000000000";
/// The build time of a metadata table made with its data table, before any instant: older than
/// every instant of the data timeline, and counted as completed though none is there (Apache
/// Hudi's own metadata table starts at such a fixed time, `00000000000000010`).
pub const AT_CREATION: &str = "00000000000000010";
/// The metadata table property recording the data instant it was built at.
const BUILT_AT_KEY: &str = "oxlake.metadata.built.at";
/// ... and the data writes pending then: their files may have missed the build's listing, so
/// they count as missing once they complete.
const BUILT_PENDING_KEY: &str = "oxlake.metadata.built.pending";

/// The indexes of the metadata table, each a partition of it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Index {
    /// Every committed data file, by partition, with its size.
    Files,
    /// Per data file: rows, and min, max and nulls of each comparable column.
    ColumnStats,
    /// Per data file: a bloom filter of its record keys.
    BloomFilters,
    /// Record key and partition to the file group holding the record.
    RecordIndex,
}

impl Index {
    /// Every index, in the order of their partitions.
    pub const ALL: [Index; 4] = [Index::Files, Index::ColumnStats, Index::BloomFilters, Index::RecordIndex];

    /// The partition name (Apache Hudi's names for the same indexes).
    pub fn name(self) -> &'static str {
        match self {
            Index::Files => FILES,
            Index::ColumnStats => "column_stats",
            Index::BloomFilters => "bloom_filters",
            Index::RecordIndex => "record_index",
        }
    }

    /// The index of a partition name.
    pub fn parse(name: &str) -> Option<Index> {
        Index::ALL.into_iter().find(|i| i.name() == name.trim())
    }

    /// The metadata table property holding the index's shard count.
    fn shards_key(self) -> String {
        format!("oxlake.metadata.{}.shards", self.name())
    }
}

/// Which indexes a metadata table keeps, and in how many file groups each.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MetadataConfig {
    /// Shards per index; `files` is always kept.
    pub shards: BTreeMap<Index, u32>,
    /// Whether a build sizes the record index from the table: a shard per
    /// [`record_index::KEYS_PER_SHARD`] keys, at least the count in `shards` (see
    /// [`record_index::sized_shards`]).
    pub size_record_index: bool,
}

impl Default for MetadataConfig {
    fn default() -> Self {
        let shards = [(Index::Files, 4), (Index::ColumnStats, 2), (Index::BloomFilters, 2), (Index::RecordIndex, 8)];
        MetadataConfig { shards: shards.into_iter().collect(), size_record_index: true }
    }
}

impl MetadataConfig {
    /// Every index with the given shard counts; a count of 0 leaves that index out (`files` needs
    /// at least one).
    pub fn new(files: u32, column_stats: u32, bloom_filters: u32, record_index: u32) -> Result<Self> {
        if files == 0 {
            return Err(Error::invalid_arg("files_shards", "the files index needs at least one shard"));
        }
        let counts = [
            (Index::Files, files),
            (Index::ColumnStats, column_stats),
            (Index::BloomFilters, bloom_filters),
            (Index::RecordIndex, record_index),
        ];
        Ok(MetadataConfig { shards: counts.into_iter().filter(|(_, n)| *n > 0).collect(), size_record_index: false })
    }

    /// The record index sized from the table at build, with at least the count given.
    pub fn sized_record_index(self) -> Self {
        MetadataConfig { size_record_index: true, ..self }
    }
}

/// The metadata table of one data table, opened at the data table's state.
#[derive(Debug)]
pub struct MetadataTable {
    /// Its timeline restricted to the instants completed on the data timeline.
    table: Table,
    /// Its file groups (one listing, at open).
    view: FileSystemView,
    /// Every instant of its timeline at that listing, whatever its state or the data timeline's:
    /// what its records were read from (see `sync::compact_if_due`).
    listed: Vec<Instant>,
    /// The latest instant readers may use.
    upper: Option<String>,
    /// The data instant the metadata table was built at.
    built_at: String,
    /// Instants that changed the data table's files after the build and that the metadata table
    /// lacks: non-empty means stale.
    missing: Vec<String>,
    shards: BTreeMap<Index, u32>,
}

/// Whether an instant of the data timeline changes the table's files (and so must reach the
/// metadata table). A restore changes them through rollback instants of its own.
fn changes_files(i: &Instant) -> bool {
    i.is_completed() && (i.action.writes_data() || matches!(i.action, Action::Clean | Action::Rollback))
}

impl Table {
    /// The metadata table, when the table advertises one; opened once per state of the table.
    pub async fn metadata_table(&self) -> Result<Option<Arc<MetadataTable>>> {
        let opened = self
            .derived_cache()
            .get_or_try_init(|| async { Ok::<_, Error>(open(self).await?.map(|m| m as Arc<dyn Any + Send + Sync>)) })
            .await?;
        // Only this module fills the cache, always with a metadata table.
        Ok(opened.clone().and_then(|m| m.downcast::<MetadataTable>().ok()))
    }

    /// The metadata table when readers may use it (advertised, readable and fresh); else `None`,
    /// and readers list storage.
    pub async fn fresh_metadata_table(&self) -> Option<Arc<MetadataTable>> {
        match self.metadata_table().await {
            Ok(mdt) => mdt.filter(|m| m.is_fresh()),
            Err(e) => {
                log::warn!("{}: metadata table unreadable, listing storage: {e}", self.uri());
                None
            }
        }
    }

    /// Builds the metadata table from a full listing of storage (and, for the record index, the
    /// record keys each latest file slice holds, deleted ones too: [`record_index::HeldKeys`]),
    /// replacing any earlier one; recorded on the data timeline as an `indexing` instant. Returns
    /// that instant.
    pub async fn build_metadata(&mut self, config: MetadataConfig) -> Result<String> {
        self.check_indexes(&config)?;
        let tx = Transaction::begin(self, Action::Indexing).await?;
        let time = tx.time().to_string();
        // Two builds would remove each other's files: a build yields to any other in progress
        // (both may yield; the metadata table then stays stale until the next writer).
        self.reload().await?;
        let other = self.timeline().pending().find(|i| i.action == Action::Indexing && i.time != time).cloned();
        if let Some(other) = other {
            let detail = "another writer is building the metadata table".to_string();
            return Err(tx.fail(self, Error::CommitConflict { instant: other.time, detail }).await);
        }
        let built = match build(self, &time, &config).await {
            // An archival moved instants it listed out of the active timeline: read it again.
            Err(e) if crate::timeline::archived_meanwhile(&e) => {
                log::info!("{}: metadata build: {e}; again on the timeline as it is now", self.uri());
                match self.reload().await {
                    Ok(()) => build(self, &time, &config).await,
                    Err(e) => Err(e),
                }
            }
            other => other,
        };
        if let Err(e) = built {
            return Err(tx.fail(self, e).await);
        }
        // The metadata table is complete; advertising it makes it count once `time` completes.
        let names: Vec<&str> = config.shards.keys().map(|i| i.name()).collect();
        if let Err(e) = self.set_property(PARTITIONS_KEY, Some(&names.join(","))).await {
            return Err(tx.fail(self, e).await);
        }
        tx.commit(self, &CommitMetadata { operation_type: Some("INDEXING".into()), ..Default::default() }).await?;
        Ok(time)
    }

    /// Gives a table without any instant yet its metadata table, holding nothing, with no instant
    /// of its own on the data timeline: built at [`AT_CREATION`], it is fresh while every later
    /// instant reaches it (as Apache Hudi starts its metadata table within the first commit, not
    /// in an instant of its own). A crash before the table advertises it leaves it unused; the
    /// next build replaces it. `false`: another writer began on the table first, which is left
    /// without one (`build_metadata` builds it).
    pub async fn create_metadata(&mut self, config: MetadataConfig) -> Result<bool> {
        self.check_indexes(&config)?;
        self.reload().await?;
        if let Some(first) = self.timeline().instants().first() {
            log::info!("{}: {} began before its metadata table was made: left without", self.uri(), first.time);
            return Ok(false);
        }
        build(self, AT_CREATION, &config).await?;
        let names: Vec<&str> = config.shards.keys().map(|i| i.name()).collect();
        self.set_property(PARTITIONS_KEY, Some(&names.join(","))).await?;
        Ok(true)
    }

    /// Refuses indexes the table cannot keep: as in Apache Hudi, the record index is kept from the
    /// rows' stored keys, which a table without meta fields does not have.
    fn check_indexes(&self, config: &MetadataConfig) -> Result<()> {
        if !self.config().populate_meta_fields && config.shards.contains_key(&Index::RecordIndex) {
            return Err(Error::unsupported(
                "the record index of a table without meta fields (`hoodie.populate.meta.fields=false`): \
                 its rows store no record key; writes look keys up in the files (or their bloom filters)",
            ));
        }
        Ok(())
    }

    /// Sets (or with `None` removes) one line of `hoodie.properties`, keeping every other line.
    async fn set_property(&mut self, key: &str, value: Option<&str>) -> Result<()> {
        self.set_properties(&[(key, value)]).await
    }
}

/// Opens the metadata table of `data` at its state (see [`Table::metadata_table`]).
async fn open(data: &Table) -> Result<Option<Arc<MetadataTable>>> {
    open_mdt(data).await.map_err(in_metadata_table)
}

/// An error of a metadata-table file, whose path is relative to the metadata table, with the
/// path from the data table's root: its `.hoodie/hoodie.properties` is not the data table's.
pub(crate) fn in_metadata_table(e: Error) -> Error {
    let inside = |path: String| match path.starts_with(DIR) || path.contains("://") || path.starts_with('/') {
        true => path,
        false => format!("{DIR}/{path}"),
    };
    match e {
        e if e.is_unnamed_storage() => e,
        Error::CorruptTable { path, detail } => Error::CorruptTable { path: inside(path), detail },
        Error::Storage { path, source } => Error::Storage { path: inside(path), source },
        other => other,
    }
}

async fn open_mdt(data: &Table) -> Result<Option<Arc<MetadataTable>>> {
    let Some(advertised) = data.config().raw.get(PARTITIONS_KEY) else { return Ok(None) };
    if Index::parse(advertised.split(',').next().unwrap_or_default()) != Some(Index::Files) {
        return Ok(None);
    }
    let (mut mdt, files) = Table::open_listed(&metadata_uri(data), data.options().bare()).await?;
    let mut shards = BTreeMap::new();
    for name in advertised.split(',') {
        let index =
            Index::parse(name).ok_or_else(|| Error::corrupt(PROPERTIES_FILE, format!("unknown index {name}")))?;
        let n = mdt.config().raw.get(&index.shards_key()).and_then(|s| s.parse().ok()).unwrap_or(1u32);
        shards.insert(index, n.max(1));
    }
    // The indexes the metadata table was built with, though the data table's properties as this
    // process read them do not advertise them yet (a build by another process since it opened the
    // table: `reload` does not read `hoodie.properties` again). A write that left them out would
    // leave them without its files and keys, yet fresh: lookups would miss its rows.
    for index in Index::ALL {
        if let Some(n) = mdt.config().raw.get(&index.shards_key()).and_then(|s| s.parse::<u32>().ok()) {
            shards.entry(index).or_insert(n.max(1));
        }
    }
    // Only instants completed on the data timeline count (a write that crashed between its
    // metadata commit and its data commit left one that must not be read).
    let timeline = data.timeline();
    let built_at = mdt.config().raw.get(BUILT_AT_KEY).cloned().unwrap_or_else(|| UNKNOWN_BUILD_TIME.to_string());
    // An instant archived from the data timeline (older than where its write timeline starts,
    // with nothing left at its time) completed: Apache Hudi archives completed instants only. A
    // time oxlake rolled back did not, however old: a writer frozen past its heartbeat may complete
    // its metadata deltacommit after the rollback, into the slice of a later compaction.
    let completed = |time: &str| time == AT_CREATION || timeline.is_committed(time);
    // The metadata table's own archived instants (older than its write timeline) completed too:
    // its archival passes data cleans and rollbacks still on the data timeline (Java's rule).
    let mdt_start = mdt.timeline().write_timeline_start().map(str::to_string);
    let listed = mdt.timeline().instants().to_vec();
    // What is withheld never reads as committed, nor what the data table rolled back: an orphan
    // deltacommit may be archived from the metadata table while its logs are still read.
    let rolled_back: Vec<String> = timeline.rolled_back().map(str::to_string).collect();
    // A compaction of the metadata table (its time that of the data instant it follows, suffixed:
    // `sync::compact_if_due`) folded in only records of data instants completed when it ran, and
    // stands once it completed, whatever happens to that data instant later: a rollback or a
    // restore taking it back removes its files from the indexes with a deltacommit of its own.
    // (Withheld with that instant, the compaction's slices were left behind while later writes
    // went into them: every file written after such a restore was missing from `files`.)
    mdt.restrict_timeline(|i| is_compaction(i) || completed(i.time.get(..17).unwrap_or(&i.time)), rolled_back);
    let have: HashSet<&str> = mdt.timeline().completed_data().map(|i| i.time.as_str()).collect();
    let pending_then: HashSet<&str> =
        mdt.config().raw.get(BUILT_PENDING_KEY).map(|p| p.split(',').collect()).unwrap_or_default();
    // A write pending during the build is older than the metadata table's first instant (the
    // build's), so the archived-instants rule would take it for one: it is had only once synced.
    // (Found by the stress test: a write that committed while another process built, without
    // syncing, left a table that read as fresh without its keys, and a later upsert of one of them
    // inserted it into a second file group.)
    let had = |time: &str| {
        have.contains(time) || (!pending_then.contains(time) && mdt_start.as_deref().is_some_and(|s| time < s))
    };
    let missing = timeline
        .instants()
        .iter()
        .filter(|i| changes_files(i) && (i.time > built_at || pending_then.contains(i.time.as_str())))
        .filter(|i| !had(&i.time))
        .map(|i| i.time.clone());
    // A build whose `indexing` instant never completed left nothing a reader may use.
    let unfinished = (!completed(&built_at)).then(|| built_at.clone());
    let missing = unfinished.into_iter().chain(missing).collect();
    let upper = mdt.timeline().latest_completed_data().map(|i| i.time.clone());
    let view = FileSystemView::from_files(files, mdt.timeline(), true);
    Ok(Some(Arc::new(MetadataTable { table: mdt, view, listed, upper, built_at, missing, shards })))
}

/// Whether `i` is a compaction of the metadata table (pending, or completed as a commit: the
/// metadata table's only commits).
fn is_compaction(i: &Instant) -> bool {
    matches!(i.action, Action::Compaction | Action::Commit)
}

/// How far the data table's archival may go (Apache Hudi's rule for its own metadata table):
/// only instants older than the metadata table's latest compaction, which holds everything
/// before it in base files; with no compaction yet, nothing. `None`: no metadata table.
pub(crate) async fn archival_bound(data: &Table) -> Result<Option<String>> {
    if !data.config().raw.contains_key(PARTITIONS_KEY) {
        return Ok(None);
    }
    let mdt = Table::open(&metadata_uri(data), data.options().bare()).await?;
    let compaction = mdt
        .timeline()
        .instants()
        .iter()
        .filter(|i| i.is_completed() && i.action == Action::Commit)
        .map(|i| i.time.get(..17).unwrap_or(&i.time).to_string())
        .next_back();
    Ok(Some(compaction.unwrap_or_else(|| "0".to_string())))
}

/// Whether the metadata table keeps a record index as it is now (by the indexes it was built
/// with, which a build by another process may have changed since this process read the table's
/// properties): a write that would drop its keys asks this under its instant. An unreadable one
/// keeps them.
pub(crate) async fn holds_record_index(table: &Table) -> bool {
    match table.metadata_table().await {
        Ok(Some(mdt)) => mdt.has(Index::RecordIndex),
        Ok(None) => keeps_record_index(table),
        Err(_) => true,
    }
}

/// Whether `table`'s properties advertise a metadata table keeping the record index.
pub(crate) fn keeps_record_index(table: &Table) -> bool {
    let advertised = table.config().raw.get(PARTITIONS_KEY).map(String::as_str).unwrap_or_default();
    advertised.split(',').any(|name| Index::parse(name) == Some(Index::RecordIndex))
}

/// Whether `table` advertises a metadata table keeping column stats, and bloom filters, of its
/// data files.
pub(crate) fn file_indexes(table: &Table) -> (bool, bool) {
    let advertised = table.config().raw.get(PARTITIONS_KEY).map(String::as_str).unwrap_or_default();
    let has = |index: Index| advertised.split(',').any(|name| Index::parse(name) == Some(index));
    (has(Index::ColumnStats), has(Index::BloomFilters))
}

pub(crate) fn metadata_uri(table: &Table) -> String {
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

/// Files whose index entries are computed at once.
const FILES_AT_ONCE: usize = 16;

/// The `column_stats` and `bloom_filters` records of some data files, by index.
async fn file_entries(
    data: &Table,
    files: &[FileInfo],
    known: &[(String, file_index::FileEntry)],
    shards: &BTreeMap<Index, u32>,
) -> Result<BTreeMap<Index, entries::Entries>> {
    let (stats, bloom) = (shards.contains_key(&Index::ColumnStats), shards.contains_key(&Index::BloomFilters));
    let mut out = BTreeMap::new();
    if !(stats || bloom) {
        return Ok(out);
    }
    let schema = data.schema();
    let keys = if bloom { Some(data.stored_keys()?) } else { None };
    let known: HashMap<&str, &file_index::FileEntry> = known.iter().map(|(p, e)| (p.as_str(), e)).collect();
    let mut computed: Vec<(String, file_index::FileEntry)> = Vec::new();
    let mut unknown: Vec<FileInfo> = Vec::new();
    for f in files {
        // An entry computed by the writer serves when it holds what the indexes kept now need.
        match known.get(f.path.as_str()).filter(|e| (!stats || e.stats.is_some()) && (!bloom || e.bloom.is_some())) {
            Some(entry) => computed.push((f.path.clone(), (*entry).clone())),
            None => unknown.push(f.clone()),
        }
    }
    // Owned futures, spawned: the stream stays `Send` for any caller.
    let tasks = unknown.into_iter().map(|f| {
        let (storage, schema, keys) = (data.storage().clone(), schema.clone(), keys.clone());
        tokio::spawn(async move {
            let entry = file_index::file_entry(&storage, &schema, &f.path, f.size, stats, keys.as_ref()).await?;
            Ok::<_, Error>((f.path, entry))
        })
    });
    let read: Vec<(String, file_index::FileEntry)> = futures::stream::iter(tasks)
        .buffer_unordered(FILES_AT_ONCE)
        .map(|joined| joined.map_err(|e| Error::invalid_data(format!("index task failed: {e}")))?)
        .try_collect()
        .await?;
    computed.extend(read);
    let (mut stat_entries, mut bloom_entries) =
        (entries::Entries::new(Index::ColumnStats), entries::Entries::new(Index::BloomFilters));
    for (path, entry) in computed {
        if let Some(s) = entry.stats {
            stat_entries.stats(&path, serde_json::to_string(&s).map_err(Error::invalid_data)?);
        }
        if let Some(b) = entry.bloom {
            bloom_entries.bloom(&path, b);
        }
    }
    if stats {
        out.insert(Index::ColumnStats, stat_entries);
    }
    if bloom {
        out.insert(Index::BloomFilters, bloom_entries);
    }
    Ok(out)
}

/// The data files of completed instants: a write pending while the table is built adds its own
/// files when it completes (its instant counts as missing until then), and a failed one never
/// does. A log file counts when any of its blocks is committed; its blocks are read only when
/// some instant is pending (otherwise every log block on storage is committed or rolled back).
async fn committed_data_files(data: &Table) -> Result<Vec<FileInfo>> {
    let listed = data_files(data.storage().list_table().await?);
    let anything_pending = data.timeline().pending().next().is_some();
    let committed = crate::log::CommittedLogs::load(data.storage(), data.timeline()).await?;
    let mut files = Vec::with_capacity(listed.len());
    for f in listed {
        let is_base = BaseFileName::parse(f.path.rsplit('/').next().unwrap_or(&f.path)).is_some();
        if (!is_base && !anything_pending) || data.is_committed_file(&f.path, &committed).await? {
            files.push(f);
        }
    }
    Ok(files)
}

/// Writes a new metadata table at `time`: one base file per shard of every index, keys sorted,
/// in one deltacommit of the metadata table's own timeline. Everything is read from the data
/// table before the old metadata table is removed.
async fn build(data: &Table, time: &str, config: &MetadataConfig) -> Result<()> {
    let mut config = config.clone();
    if config.size_record_index
        && let Some(&least) = config.shards.get(&Index::RecordIndex)
    {
        config.shards.insert(Index::RecordIndex, record_index::sized_shards(data, least).await?);
    }
    let config = &config;
    let storage = data.storage();
    let files = committed_data_files(data).await?;
    let mut by_index = file_entries(data, &files, &[], &config.shards).await?;
    let mut listing = entries::Entries::new(Index::Files);
    for f in &files {
        listing.file(&f.path, f.size);
    }
    by_index.insert(Index::Files, listing);
    crate::commit::failpoint("metadata-build-before-keys");
    // Spilled to local disk by shard: the build holds one shard's keys at a time.
    let records = match config.shards.get(&Index::RecordIndex) {
        Some(&n) => Some(record_index::SpilledKeys::read(data, n).await?),
        None => None,
    };
    for f in storage.list_recursive(DIR).await? {
        storage.delete(&f.path).await?;
    }
    crate::commit::failpoint("metadata-build-after-clear");
    // A writer that opened the old metadata table before this build may still be writing into
    // it (a sync on a slow store). Its files would be read as part of the new one: this build
    // yields, the metadata table stays unreadable (readers list storage) and the next writer
    // builds it again.
    if let Some(late) = storage.list_recursive(DIR).await?.into_iter().next() {
        let detail = format!("another writer wrote `{}` into the metadata table while it was built again", late.path);
        return Err(Error::CommitConflict { instant: time.to_string(), detail });
    }
    let create = CreateOptions {
        name: format!("{}_metadata", data.config().name),
        table_type: TableType::MergeOnRead,
        record_key_fields: vec!["key".into()],
        partition_fields: vec!["index".into()],
        ordering_field: None,
        hive_style: false,
        inline_compaction: None,
        table_version: 6,
        global_index: false,
        meta_fields: true,
        keygen_options: Default::default(),
        url_encode: true,
    };
    let mut mdt =
        match Table::create(&metadata_uri(data), data.options().bare(), create, entries::record_schema()).await {
            Ok(mdt) => mdt,
            // Written into between the check above and the create: the same yield.
            Err(Error::InvalidArgument { detail, .. }) if detail.contains("is not empty") => {
                return Err(Error::CommitConflict { instant: time.to_string(), detail });
            }
            Err(e) => return Err(e),
        };
    for (index, n) in &config.shards {
        mdt.set_property(&index.shards_key(), Some(&n.to_string())).await?;
    }
    mdt.set_property(BUILT_AT_KEY, Some(time)).await?;
    // Every instant pending now may complete later with files this build did or did not list
    // (a compaction, a clean, a rollback as much as a write): each counts as missing until the
    // metadata table has it.
    let pending: Vec<&str> = data.timeline().pending().filter(|i| i.time != time).map(|i| i.time.as_str()).collect();
    mdt.set_property(BUILT_PENDING_KEY, Some(&pending.join(","))).await?;
    let tx = Transaction::begin_at(&mut mdt, Action::DeltaCommit, time, Bytes::new()).await?;
    let mut metadata = commit_metadata("BULK_INSERT")?;
    let mut written = Vec::new();
    for (index, all) in by_index {
        let shards = config.shards.get(&index).copied().unwrap_or(1);
        for (shard, batch) in sync::split_by_shard(index, &all.to_batch(true)?, shards)?.into_iter().enumerate() {
            written.push(entries::write_base(&mdt, time, index, shard as u32, &[batch]).await);
        }
    }
    if let Some(records) = records {
        for shard in 0..records.shards() {
            let stat = match records.entries(shard) {
                Ok(batches) => entries::write_base(&mdt, time, Index::RecordIndex, shard as u32, &batches).await,
                Err(e) => Err(e),
            };
            // A shard that fails fails the build at once (the others would be built for nothing).
            if let Err(e) = stat {
                return Err(tx.fail(&mut mdt, e).await);
            }
            written.push(stat);
        }
    }
    for stat in written {
        match stat {
            Ok(stat) => metadata.partition_to_write_stats.entry(stat_partition(&stat)).or_default().push(stat),
            Err(e) => return Err(tx.fail(&mut mdt, e).await),
        }
    }
    tx.commit(&mut mdt, &metadata).await?;
    Ok(())
}

fn stat_partition(stat: &crate::format::commit::WriteStat) -> String {
    stat.partition_path.clone().unwrap_or_default()
}

/// The commit metadata of a metadata-table instant.
fn commit_metadata(operation: &str) -> Result<CommitMetadata> {
    let mut metadata = CommitMetadata { operation_type: Some(operation.into()), ..Default::default() };
    let avro = schema::to_avro(&entries::record_schema(), "metadata")?;
    metadata.extra_metadata.insert(CommitMetadata::SCHEMA_KEY.into(), avro);
    Ok(metadata)
}

/// Catches a stale metadata table up before a change of the data table (the next writer repairs
/// what another writer or a crash left, docs/METADATA_TABLE.md): built again, with the same indexes and
/// shards. An unreadable one is built again with the default layout.
pub(crate) async fn catch_up(data: &mut Table) -> Result<()> {
    // Failed writes were just rolled back: a pending build is another live writer's.
    if data.timeline().pending().any(|i| i.action == Action::Indexing) {
        log::info!("{}: another writer is building the metadata table", data.uri());
        return Ok(());
    }
    let config = match data.metadata_table().await {
        Ok(None) => return Ok(()),
        Ok(Some(mdt)) if mdt.is_fresh() => return Ok(()),
        Ok(Some(mdt)) => {
            log::info!("{}: metadata table stale (missing {:?}); building it again", data.uri(), mdt.missing);
            MetadataConfig { shards: mdt.shards.clone(), size_record_index: false }
        }
        Err(e) => {
            log::warn!("{}: metadata table unreadable ({e}); building it again", data.uri());
            MetadataConfig::default()
        }
    };
    match data.build_metadata(config).await {
        Ok(_) => Ok(()),
        // Another writer builds it; readers list storage meanwhile.
        Err(Error::CommitConflict { .. }) => Ok(()),
        Err(e) => Err(e),
    }
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

    /// Whether it keeps `index`.
    pub fn has(&self, index: Index) -> bool {
        self.shards.contains_key(&index)
    }

    /// The shard count of `index`.
    pub fn shards(&self, index: Index) -> u32 {
        self.shards.get(&index).copied().unwrap_or(0)
    }

    /// The indexes it keeps.
    pub fn indexes(&self) -> Vec<Index> {
        self.shards.keys().copied().collect()
    }

    /// The data files the `files` index lists (paths relative to the data table's root).
    pub async fn files(&self) -> Result<Vec<FileInfo>> {
        file_infos(self.read_index(Index::Files, Select::All).await?)
    }

    /// The data files the `files` index lists in the partitions `partitions` (some of partitions
    /// nested in them may come too): only the shards of those partitions are read, and in them
    /// the pages that may hold their paths.
    pub async fn files_in(&self, partitions: &BTreeSet<String>) -> Result<Vec<FileInfo>> {
        // A file's key is its path: `<partition>/<name>`, or `<name>` in an unpartitioned table;
        // its shard is that of its partition (`entries::shard_of`).
        let prefixes: BTreeSet<String> =
            partitions.iter().map(|p| if p.is_empty() { String::new() } else { format!("{p}/") }).collect();
        let count = self.shards(Index::Files);
        let shards: BTreeSet<u32> = partitions.iter().map(|p| shard::shard_of(p, count)).collect();
        let reads = shards.into_iter().map(|s| self.read_shard(Index::Files, s, Select::Prefixes(&prefixes)));
        let batches = futures::future::try_join_all(reads).await?.into_iter().flatten().collect();
        file_infos(batches)
    }
}

/// The data files of records of the `files` index.
fn file_infos(batches: Vec<arrow::array::RecordBatch>) -> Result<Vec<FileInfo>> {
    let mut out = Vec::new();
    for batch in batches {
        let (keys, sizes) = (entries::strings(&batch, "key")?, entries::ints(&batch, "size")?);
        for i in 0..batch.num_rows() {
            out.push(FileInfo { path: keys.value(i).to_string(), size: sizes.value(i).max(0) as u64 });
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_of_metadata_table_files_name_them_from_the_table_root() {
        let e = in_metadata_table(Error::corrupt(".hoodie/hoodie.properties", "missing key"));
        assert!(
            matches!(&e, Error::CorruptTable { path, .. } if path == ".hoodie/oxlake/metadata/.hoodie/hoodie.properties")
        );
        let e = in_metadata_table(Error::corrupt(".hoodie/oxlake/metadata/files/x.parquet", "bad"));
        assert!(matches!(&e, Error::CorruptTable { path, .. } if path == ".hoodie/oxlake/metadata/files/x.parquet"));
    }
}
