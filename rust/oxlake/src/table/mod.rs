//! The table: its storage, configuration, timeline and schema, the entry object of every
//! operation (`Table::scan`, `Table::write`, `Table::rollback_failed`).

pub mod extensions;
pub mod fs_view;
pub mod history;
pub mod pending;

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use arrow::datatypes::{DataType, SchemaRef};
use bytes::Bytes;
use parquet::arrow::async_reader::ParquetRecordBatchStreamBuilder;

use crate::config::{CreateOptions, PROPERTIES_FILE, TableConfig, keys};
use crate::error::{Error, Result};
use crate::format::instant::{Action, Instant};
use crate::schema;
use crate::schema::internal::{self, ColumnHistory, FileColumns, InternalSchema};
use crate::storage::{FileInfo, ParquetFile, Storage};
use crate::timeline::Timeline;
use extensions::{DerivedCache, Extensions, FileIndex};
use fs_view::{FileGroupId, FileSystemView};

/// oxlake's own property holding the exact Arrow schema of the data (base64 Arrow IPC).
pub const ARROW_SCHEMA_KEY: &str = "oxlake.table.arrow.schema";
/// Set once a write evolved the table's schema: from then on the schema is the one the latest
/// commit records (see [`committed`]), and `ARROW_SCHEMA_KEY` the one the table was created with.
pub const SCHEMA_EVOLVED_KEY: &str = "oxlake.table.schema.evolved";

/// Where oxlake keeps a table's metadata table, relative to the data table's root.
pub const METADATA_TABLE_DIR: &str = ".hoodie/oxlake/metadata";

/// How a process works with a table; nothing here is stored in the table.
#[derive(Clone, Debug)]
pub struct TableOptions {
    /// Object-store options (S3 endpoint, credentials...).
    pub storage_options: HashMap<String, String>,
    /// How often a writer refreshes its heartbeat. A pending instant whose heartbeat is older than
    /// three intervals belongs to a crashed writer and is rolled back by the next one.
    pub heartbeat_interval: Duration,
    /// What the layers above lend this table (see [`extensions`]): the metadata table kept in
    /// step, index pruning, inline table services. None by default.
    pub extensions: Extensions,
}

impl Default for TableOptions {
    fn default() -> Self {
        TableOptions {
            storage_options: HashMap::new(),
            heartbeat_interval: Duration::from_secs(10),
            extensions: Extensions::default(),
        }
    }
}

impl TableOptions {
    /// These options without extensions: for the metadata table, which keeps no metadata
    /// table of its own.
    pub fn bare(&self) -> TableOptions {
        TableOptions { extensions: Extensions::default(), ..self.clone() }
    }
}

/// An open table at the state of its last (re)load.
#[derive(Clone, Debug)]
pub struct Table {
    storage: Storage,
    config: TableConfig,
    timeline: Timeline,
    data_schema: SchemaRef,
    /// The ids of the columns over the table's history, once columns were renamed, dropped or
    /// moved (see [`schema::internal`]); `None`: columns are known by name.
    columns: Option<Arc<ColumnHistory>>,
    options: TableOptions,
    /// What an extension derived from this state (the metadata table opened at it), shared by
    /// clones, dropped when the state changes.
    derived: DerivedCache,
}

impl Table {
    /// Opens an existing table.
    pub async fn open(uri: &str, options: TableOptions) -> Result<Self> {
        let storage = Storage::open(uri, &options.storage_options)?;
        let config = parse_properties(&storage, storage.get_opt(PROPERTIES_FILE).await?)?;
        let timeline = Timeline::load(&storage, &config).await?;
        let (data_schema, columns) = resolve_schema(&storage, &config, &timeline).await?;
        Ok(Table { storage, config, timeline, data_schema, columns, options, derived: DerivedCache::default() })
    }

    /// Opens the table together with a listing of its files (see [`Storage::list_table`]):
    /// `hoodie.properties`, the timeline's folder and the table's files listed side by side (two
    /// round trips where [`Table::open`] and then a listing take four). For small tables read
    /// whole, as the metadata table is.
    pub async fn open_listed(uri: &str, options: TableOptions) -> Result<(Self, Vec<FileInfo>)> {
        let storage = Storage::open(uri, &options.storage_options)?;
        let (properties, timeline_files, files, rolled_back) = futures::try_join!(
            storage.get_opt(PROPERTIES_FILE),
            storage.list_dir_tagged(".hoodie"),
            storage.list_table(),
            storage.list_dir(crate::timeline::ROLLED_BACK_DIR)
        )?;
        let config = parse_properties(&storage, properties)?;
        let dir = config.timeline_dir();
        let timeline_files = if dir == ".hoodie" { timeline_files } else { storage.list_dir_tagged(&dir).await? };
        let timeline = Timeline::from_listing(&timeline_files, config.timeline_dir(), config.layout_version)
            .with_rolled_back(&rolled_back);
        let (data_schema, columns) = resolve_schema(&storage, &config, &timeline).await?;
        let table =
            Table { storage, config, timeline, data_schema, columns, options, derived: DerivedCache::default() };
        Ok((table, files))
    }

    /// Creates a table with the given data schema (no meta fields) and returns it open.
    pub async fn create(
        uri: &str,
        options: TableOptions,
        create: CreateOptions,
        data_schema: SchemaRef,
    ) -> Result<Self> {
        let storage = Storage::open(uri, &options.storage_options)?;
        schema::check_column_names(&data_schema)?;
        data_schema.fields().iter().try_for_each(|f| schema::check_typed(f, ""))?;
        data_schema.fields().iter().try_for_each(|f| schema::check_avro_names(f, ""))?;
        let data_schema = schema::normalize(&data_schema)?;
        check_fields(&create, &data_schema)?;
        let mut config = TableConfig::new(&create)?;
        config.raw.insert(ARROW_SCHEMA_KEY.into(), schema::encode_arrow_schema(&data_schema));
        config.raw.insert(keys::CREATE_SCHEMA.into(), schema::to_avro(&data_schema, &config.name)?);
        if storage.head(PROPERTIES_FILE).await?.is_some() {
            return Err(Error::TableExists { uri: storage.uri().to_string() });
        }
        check_empty(&storage).await?;
        if !storage.put_if_absent(PROPERTIES_FILE, Bytes::from(config.to_properties())).await? {
            return Err(Error::TableExists { uri: storage.uri().to_string() });
        }
        let timeline = Timeline::from_file_names([], config.timeline_dir(), config.layout_version);
        Ok(Table { storage, config, timeline, data_schema, columns: None, options, derived: DerivedCache::default() })
    }

    /// Reloads the timeline (and the schema, which may have changed with it).
    pub async fn reload(&mut self) -> Result<()> {
        let timeline = Timeline::load(&self.storage, &self.config).await?;
        if timeline == self.timeline {
            return Ok(());
        }
        // A commit completed since: another process may have evolved the schema, which it marks
        // in the properties first (see `SCHEMA_EVOLVED_KEY`); they are read again until then.
        let completed_since = timeline.completed_data().any(|i| !self.timeline.instants().contains(i));
        if completed_since && !self.config.raw.contains_key(SCHEMA_EVOLVED_KEY) && !self.is_metadata_table() {
            let config = parse_properties(&self.storage, self.storage.get_opt(PROPERTIES_FILE).await?)?;
            if config.raw.contains_key(SCHEMA_EVOLVED_KEY) {
                self.config = config;
            }
        }
        (self.data_schema, self.columns) = resolve_schema(&self.storage, &self.config, &timeline).await?;
        self.timeline = timeline;
        self.derived = DerivedCache::default();
        Ok(())
    }

    /// The ids of the table's columns over its history (`None`: columns are known by name).
    pub fn column_history(&self) -> Option<&Arc<ColumnHistory>> {
        self.columns.as_ref()
    }

    /// This table read with the schema it had as of the commit at `as_of` (time travel reads
    /// return that instant's columns, under that instant's names); `None`: the same schema.
    pub async fn with_schema_as_of(&self, as_of: &str) -> Result<Option<Table>> {
        if !self.config.raw.contains_key(SCHEMA_EVOLVED_KEY) {
            return Ok(None);
        }
        let as_of = crate::format::instant::normalize_time(as_of)?;
        let archived;
        let table = if self.reaches_archive(&as_of) {
            archived = self.with_archived_timeline().await?;
            &archived
        } else {
            self
        };
        let Some((schema, ids)) = committed_as_of(&self.storage, &self.config, table.timeline(), Some(&as_of)).await?
        else {
            return Ok(None);
        };
        let latest = self.columns.as_ref().map(|c| c.latest());
        if schema == self.data_schema && ids.as_ref() == latest {
            return Ok(None);
        }
        let columns = match (ids, &self.columns) {
            (Some(ids), Some(history)) => Some(Arc::new(history.as_of(ids))),
            (Some(ids), None) => Some(Arc::new(load_column_history(&self.storage, table.timeline(), ids).await?)),
            // Before the first explicit change, columns were known by name.
            (None, _) => None,
        };
        Ok(Some(Table { data_schema: schema, columns, ..self.clone() }))
    }

    /// How files written at `time` name the table's columns (`None`: as the table does).
    pub fn columns_at(&self, time: &str) -> Option<Arc<FileColumns>> {
        self.columns.as_ref().and_then(|c| c.columns_at(time))
    }

    /// The store the table lives in, rooted at the table.
    pub fn storage(&self) -> &Storage {
        &self.storage
    }

    /// Its `hoodie.properties`, as of the last (re)load.
    pub fn config(&self) -> &TableConfig {
        &self.config
    }

    /// Its active timeline, as of the last (re)load.
    pub fn timeline(&self) -> &Timeline {
        &self.timeline
    }

    /// The `extraMetadata` the completed data instant at `time` recorded (its writer's schema,
    /// a streaming sink's checkpoint, ...), archived or not.
    pub async fn extra_metadata(&self, time: &str) -> Result<std::collections::BTreeMap<String, String>> {
        let time = crate::format::instant::normalize_time(time)?;
        let archived;
        let table = if self.timeline.get(&time).is_none() && self.reaches_archive(&time) {
            archived = self.with_archived_timeline().await?;
            &archived
        } else {
            self
        };
        let instant = table.timeline.get(&time).filter(|i| i.is_completed() && i.action.writes_data());
        let Some(instant) = instant else {
            return Err(Error::invalid_arg("instant", format!("{time} is not a completed commit of the table")));
        };
        Ok(table.timeline.commit_metadata(&table.storage, instant).await?.extra_metadata)
    }

    /// How this process opened it.
    pub fn options(&self) -> &TableOptions {
        &self.options
    }

    /// The table URI.
    pub fn uri(&self) -> &str {
        self.storage.uri()
    }

    /// Whether this is a metadata table (ours, under a data table's `.hoodie/oxlake/metadata`).
    pub fn is_metadata_table(&self) -> bool {
        self.uri().trim_end_matches('/').ends_with(METADATA_TABLE_DIR)
    }

    /// The data columns (no meta fields).
    pub fn data_schema(&self) -> SchemaRef {
        self.data_schema.clone()
    }

    /// Sets the schema a write in progress writes its files with (evolved from the table's, see
    /// `schema::evolve`); the next reload takes the committed one again.
    pub(crate) fn set_write_schema(&mut self, schema: SchemaRef) {
        self.data_schema = schema;
    }

    /// Where the record keys of stored rows come from: the meta column, or the record key fields
    /// of a table without meta fields.
    pub fn stored_keys(&self) -> Result<crate::keys::StoredKeys> {
        crate::keys::StoredKeys::of(self.config(), &self.data_schema)
    }

    /// The schema of the base files and of reads: meta fields, then the data columns.
    pub fn schema(&self) -> SchemaRef {
        schema::with_meta_fields(&self.data_schema)
    }

    /// The committed file groups: from the table's [`FileIndex`] (the metadata table's `files`
    /// partition) when it has a fresh one, else from one listing of storage.
    pub async fn file_system_view(&self) -> Result<FileSystemView> {
        self.view_of(None).await
    }

    /// The committed file groups of the partitions `partitions` (and of partitions nested in
    /// them; with a [`FileIndex`] only their files are read, else storage is listed).
    pub(crate) async fn file_system_view_in(&self, partitions: &BTreeSet<String>) -> Result<FileSystemView> {
        self.view_of(Some(partitions)).await
    }

    /// The committed file groups as a reader sees them who sees only the data instants `visible`
    /// accepts (of the completed ones): time travel sees no commit requested after its instant, a
    /// window of completion times none completed after its end. On timeline layout 2 a log joins
    /// the slice of the latest base file *it sees*: a deltacommit requested before a compaction and
    /// completed after it joins the compaction's slice on the whole timeline, the one before on a
    /// view as of the deltacommit (which does not see the compaction).
    pub(crate) async fn file_system_view_seeing(
        &self,
        visible: impl Fn(&Instant) -> bool + Sync,
    ) -> Result<FileSystemView> {
        let seen = |i: &Instant| !(i.is_completed() && i.action.writes_data()) || visible(i);
        self.view_of_with(None, &seen).await
    }

    async fn view_of(&self, partitions: Option<&BTreeSet<String>>) -> Result<FileSystemView> {
        self.view_of_with(partitions, &|_| true).await
    }

    async fn view_of_with(
        &self,
        partitions: Option<&BTreeSet<String>>,
        seen: &(dyn Fn(&Instant) -> bool + Sync),
    ) -> Result<FileSystemView> {
        let restricted = |timeline: &Timeline| {
            let mut timeline = timeline.clone();
            timeline.retain(seen, []);
            timeline
        };
        let partitioned = self.config.is_partitioned();
        let view = FileSystemView::from_files(self.files(partitions).await?, &restricted(&self.timeline), partitioned);
        if !view.needs_archived_completions() {
            return Ok(view);
        }
        // Timeline layout 2: a log of an archived deltacommit joins the slice its completion time
        // falls in (Apache Hudi's completion-time view reads archived completion times too). Rare:
        // the files are listed again rather than copied on every read.
        let archived = self.with_archived_timeline().await?;
        Ok(FileSystemView::from_files(self.files(partitions).await?, &restricted(archived.timeline()), partitioned))
    }

    /// The table's files (of `partitions` and those nested in them, or all): from the file index
    /// the opener lent (the metadata table), else listed.
    async fn files(&self, partitions: Option<&BTreeSet<String>>) -> Result<Vec<FileInfo>> {
        if let Some(index) = self.extension::<Arc<dyn FileIndex>>() {
            let files = match partitions {
                Some(partitions) => index.files_in(self, partitions).await,
                None => index.files(self).await,
            };
            if let Some(files) = files {
                return Ok(files);
            }
        }
        self.storage.list_table().await
    }

    /// The implementation of `T` the opener lent this table (see [`extensions`]).
    pub fn extension<T: std::any::Any + Send + Sync + Clone>(&self) -> Option<T> {
        self.options.extensions.get::<T>()
    }

    /// What an extension derived from this state of the table (see [`extensions`]).
    pub(crate) fn derived_cache(&self) -> &DerivedCache {
        &self.derived
    }

    /// Keeps only the instants `keep` accepts (the metadata table's reader rules); the others, and
    /// the times `withheld`, never read as committed ([`crate::timeline::Timeline::retain`]).
    pub(crate) fn restrict_timeline(
        &mut self,
        keep: impl Fn(&Instant) -> bool,
        withheld: impl IntoIterator<Item = String>,
    ) {
        self.timeline.retain(keep, withheld);
        self.derived = DerivedCache::default();
    }

    /// Sets (or with `None` removes) lines of `hoodie.properties`, keeping every other line as
    /// it was; the new configuration is checked before anything is written.
    pub(crate) async fn set_properties(&mut self, edits: &[(&str, Option<&str>)]) -> Result<()> {
        let text = self.storage.get(PROPERTIES_FILE).await?;
        let text = crate::config::properties::decode(&text);
        let (out, config) = crate::config::edit_properties(&text, edits)?;
        self.storage.put(PROPERTIES_FILE, Bytes::from(out)).await?;
        self.replace_config(config);
        Ok(())
    }

    /// Puts `timeline` (this table's, with more instants: see `services::archive`) in place.
    pub(crate) fn set_timeline(&mut self, timeline: Timeline) {
        self.timeline = timeline;
        self.derived = DerivedCache::default();
    }

    pub(crate) fn replace_config(&mut self, config: TableConfig) {
        self.config = config;
        self.derived = DerivedCache::default();
    }

    /// File groups replaced by completed replacecommits up to `as_of`.
    pub async fn replaced_file_groups(&self, as_of: &str) -> Result<HashSet<FileGroupId>> {
        self.replaced_file_groups_by(|i| i.time.as_str() <= as_of).await
    }

    /// The file groups that the completed replace commits `seen` picks replaced.
    pub(crate) async fn replaced_file_groups_by(
        &self,
        seen: impl Fn(&Instant) -> bool,
    ) -> Result<HashSet<FileGroupId>> {
        let mut out = HashSet::new();
        for instant in self.timeline.completed_of(Action::ReplaceCommit).filter(|i| seen(i)) {
            let meta = self.timeline.commit_metadata(&self.storage, instant).await?;
            out.extend(meta.replaced_file_groups().map(|(p, f)| (p.to_string(), f.to_string())));
        }
        Ok(out)
    }
}

/// A table is created only where nothing is: files already there would be read as part of it (a
/// Hudi table nested inside, stray Parquet files) or clash with its own. Any object under the path
/// counts; empty directories hold nothing (object stores have none).
async fn check_empty(storage: &Storage) -> Result<()> {
    use futures::StreamExt;
    let prefix = storage.path("");
    let first = storage.object_store().list(Some(&prefix)).next().await;
    match first {
        None | Some(Err(object_store::Error::NotFound { .. })) => Ok(()),
        Some(Err(e)) => Err(Error::storage(storage.uri(), e)),
        Some(Ok(meta)) => {
            let found = meta.location.as_ref().strip_prefix(prefix.as_ref()).unwrap_or(meta.location.as_ref());
            let found = found.trim_start_matches('/');
            Err(Error::invalid_arg(
                "uri",
                format!(
                    "{} is not empty (it holds `{found}`): a table is created in an empty directory",
                    storage.uri()
                ),
            ))
        }
    }
}

/// Key, partition and ordering fields must exist; keys and partitions must have a textual form.
fn check_fields(create: &CreateOptions, schema: &SchemaRef) -> Result<()> {
    let (partition_fields, kinds) = create.partition_specs()?;
    let all = create.record_key_fields.iter().map(|f| ("record_key", f));
    let all = all.chain(partition_fields.iter().map(|f| ("partition_by", f)));
    let all = all.chain(create.ordering_field.iter().map(|f| ("ordering_field", f)));
    for (arg, name) in all {
        let field = schema
            .field_with_name(name)
            .map_err(|_| Error::invalid_arg(arg, format!("column `{name}` is not in the schema")))?;
        let nested = matches!(field.data_type(), DataType::List(_) | DataType::Struct(_) | DataType::Map(_, _));
        if nested || field.data_type() == &DataType::Binary {
            return Err(Error::invalid_arg(
                arg,
                format!("column `{name}` of type {} cannot be used", field.data_type()),
            ));
        }
    }
    let timestamp = kinds.contains(&crate::config::PartitionKind::Timestamp);
    crate::keys::timestamp::check_options(&create.keygen_options, timestamp)?;
    // A timestamp-based field takes numbers, text or timestamps (and dates in days).
    for (name, _) in partition_fields.iter().zip(&kinds).filter(|(_, k)| **k == crate::config::PartitionKind::Timestamp)
    {
        let t = schema.field_with_name(name).map(|f| f.data_type().clone()).map_err(Error::from)?;
        let usable = t.is_numeric()
            || matches!(t, DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View | DataType::Timestamp(..))
            || matches!(t, DataType::Date32 | DataType::Date64);
        if !usable {
            return Err(Error::invalid_arg(
                "partition_by",
                format!("column `{name}` of type {t} cannot be partitioned by time"),
            ));
        }
    }
    Ok(())
}

/// Apache Hudi's metadata table, which oxlake does not maintain (docs/FORMAT.md §7).
const APACHE_HUDI_METADATA_TABLE: &str = ".hoodie/metadata";
/// Its properties: present while any of it is.
const APACHE_HUDI_METADATA_PROPERTIES: &str = ".hoodie/metadata/.hoodie/hoodie.properties";

impl Table {
    /// Refuses to change a table of a version oxlake does not write (it writes 6, 8 and 9).
    pub fn check_changeable(&self) -> Result<()> {
        match self.config.version {
            6 | 8 | 9 => Ok(()),
            v => Err(Error::unsupported(format!("changing a table of version {v} (oxlake writes 6, 8 and 9)"))),
        }
    }

    /// Retires Apache Hudi's metadata table before oxlake changes the table (docs/FORMAT.md §7): a
    /// writer that does not keep it in step must not leave it for readers, who would trust its
    /// stale file listing. First `hoodie.properties` stops advertising it (its other lines are
    /// kept as they are; the checksum depends only on the names), then its folder is deleted,
    /// its own properties last, so that a writer interrupted midway finds it again and finishes.
    /// Returns whether there was one.
    pub(crate) async fn retire_apache_hudi_metadata_table(&mut self) -> Result<bool> {
        const KEYS: [&str; 3] = [keys::METADATA_PARTITIONS, keys::METADATA_PARTITIONS_INFLIGHT, keys::METADATA_ENABLE];
        let advertised = KEYS.iter().any(|k| self.config.raw.contains_key(*k));
        let present = self.storage.head(APACHE_HUDI_METADATA_PROPERTIES).await?.is_some();
        if !advertised && !present {
            return Ok(false);
        }
        if advertised {
            let text = self.storage.get(PROPERTIES_FILE).await?;
            let text = crate::config::properties::decode(&text);
            let removed: Vec<(&str, Option<&str>)> = KEYS.iter().map(|k| (*k, None)).collect();
            let (kept, config) = crate::config::edit_properties(&text, &removed)?;
            self.storage.put(PROPERTIES_FILE, Bytes::from(kept)).await?;
            self.replace_config(config);
        }
        let files = self.storage.list_recursive(APACHE_HUDI_METADATA_TABLE).await?;
        for f in files.iter().filter(|f| f.path != APACHE_HUDI_METADATA_PROPERTIES) {
            self.storage.delete(&f.path).await?;
        }
        self.storage.delete(APACHE_HUDI_METADATA_PROPERTIES).await?;
        log::info!("{}: removed Apache Hudi's metadata table ({} files)", self.storage.uri(), files.len());
        Ok(true)
    }
}

/// The table's configuration from the text of `hoodie.properties` (`None`: not a table).
fn parse_properties(storage: &Storage, text: Option<Bytes>) -> Result<TableConfig> {
    let Some(text) = text else {
        let reason = format!("no {PROPERTIES_FILE}");
        return Err(Error::TableNotFound { uri: storage.uri().to_string(), reason });
    };
    TableConfig::parse(&crate::config::properties::decode(&text))
}

/// The table's data schema, and its column ids once it has them.
async fn resolve_schema(
    storage: &Storage,
    config: &TableConfig,
    timeline: &Timeline,
) -> Result<(SchemaRef, Option<Arc<ColumnHistory>>)> {
    let with_history = async |(schema, ids): (SchemaRef, Option<InternalSchema>)| -> Result<_> {
        let columns = match ids {
            Some(latest) => Some(Arc::new(load_column_history(storage, timeline, latest).await?)),
            None => None,
        };
        Ok((schema, columns))
    };
    if config.raw.contains_key(SCHEMA_EVOLVED_KEY)
        && let Some(found) = committed(storage, config, timeline).await?
    {
        return with_history(found).await;
    }
    if let Some(text) = config.raw.get(ARROW_SCHEMA_KEY) {
        return Ok((schema::decode_arrow_schema(text)?, None));
    }
    for (n, instant) in timeline.completed_data().collect::<Vec<_>>().into_iter().rev().enumerate() {
        let meta = timeline.commit_metadata(storage, instant).await?;
        // Apache Hudi's schema-on-read evolution (`hoodie.schema.on.read.enable`): every commit
        // records its column ids, and the columns may have been renamed since the last data file.
        if n == 0
            && meta.extra_metadata.contains_key(internal::LATEST_SCHEMA_KEY)
            && let Some(found) = committed(storage, config, timeline).await?
        {
            return with_history(found).await;
        }
        // The first base file of the commit still there (a clean or a replace may have removed some).
        let bases = meta.write_stats().filter_map(|(_, s)| s.path.as_deref().filter(|p| p.ends_with(".parquet")));
        for path in bases {
            let Some(head) = storage.head(path).await? else { continue };
            let reader = ParquetFile::open(storage, path, head.size);
            let builder =
                ParquetRecordBatchStreamBuilder::new(reader).await.map_err(|e| Error::from(e).in_file(path))?;
            return Ok((schema::normalize(&schema::without_meta_fields(builder.schema()))?, None));
        }
    }
    match config.raw.get(keys::CREATE_SCHEMA) {
        Some(avro) => Ok((schema::normalize(schema::from_avro(avro)?.as_ref())?, None)),
        None => Err(Error::unsupported(format!("{}: no schema (no data file and no create schema)", storage.uri()))),
    }
}

/// The table's schema as its commits record it: the latest completed commit that records
/// oxlake's exact Arrow schema ([`crate::format::commit::CommitMetadata::ARROW_SCHEMA_KEY`]; else
/// the created one, `ARROW_SCHEMA_KEY`), evolved by the Avro writer schemas of the later commits
/// that record only that (Apache Hudi's own writer: its added columns stay visible). A rollback
/// or restore of an evolving commit takes its schema back with it; with the column ids
/// (`latestSchema`) the commit it starts from records. `None`: nothing to start from.
pub(crate) async fn committed(
    storage: &Storage,
    config: &TableConfig,
    timeline: &Timeline,
) -> Result<Option<(SchemaRef, Option<InternalSchema>)>> {
    committed_as_of(storage, config, timeline, None).await
}

/// [`committed`] as of the commit at `as_of` (`None`: the latest).
async fn committed_as_of(
    storage: &Storage,
    config: &TableConfig,
    timeline: &Timeline,
    as_of: Option<&str>,
) -> Result<Option<(SchemaRef, Option<InternalSchema>)>> {
    let mut later: Vec<String> = Vec::new();
    let mut base = None;
    let mut ids = None;
    let upto = |t: &str| as_of.is_none_or(|a| t <= a);
    for instant in timeline.completed_data().filter(|i| upto(&i.time)).collect::<Vec<_>>().into_iter().rev() {
        let meta = timeline.commit_metadata(storage, instant).await?;
        let exact = meta.extra_metadata.get(crate::format::commit::CommitMetadata::ARROW_SCHEMA_KEY);
        let latest_ids = meta.extra_metadata.get(internal::LATEST_SCHEMA_KEY);
        // oxlake's exact schema; else a commit of Apache Hudi's schema-on-read evolution, whose
        // Avro schema holds the columns as its ids name them.
        let found = match (exact, meta.schema()) {
            (Some(text), _) => Some(schema::decode_arrow_schema(text)?),
            (None, Some(avro)) if latest_ids.is_some() => Some(schema::normalize(schema::from_avro(avro)?.as_ref())?),
            _ => None,
        };
        if let Some(found) = found {
            base = Some(found);
            if let Some(json) = latest_ids {
                ids = Some(InternalSchema::from_json(json).map_err(|e| e.in_file(instant.file_name()))?);
            }
            break;
        }
        if let Some(avro) = meta.schema() {
            later.push(avro.to_string());
        }
    }
    let created = config.raw.get(ARROW_SCHEMA_KEY).map(|t| schema::decode_arrow_schema(t)).transpose()?;
    let Some(mut out) = base.or(created) else { return Ok(None) };
    for avro in later.iter().rev() {
        let writer = schema::normalize(schema::from_avro(avro)?.as_ref())?;
        // A writer schema whose types Arrow spells differently (time zones) adds nothing.
        if let Ok(evolved) = schema::evolve::evolve(&out, &writer, schema::evolve::SchemaMode::Merge, &[]) {
            out = evolved;
        }
    }
    // Columns a later commit of another engine added take ids after the recorded ones.
    let ids = match ids {
        Some(ids) if !later.is_empty() => Some(ids.follow(&schema::with_meta_fields(&out))?),
        other => other,
    };
    Ok(Some((out, ids)))
}

/// Every version of the column ids: the newest history file (`.hoodie/.schema`) of a committed
/// instant, read as `latest` (the ids the latest commit records).
pub(crate) async fn load_column_history(
    storage: &Storage,
    timeline: &Timeline,
    latest: InternalSchema,
) -> Result<ColumnHistory> {
    let files = storage.list_dir(internal::SCHEMA_DIR).await?;
    let newest = files
        .iter()
        .filter_map(|f| {
            let name = f.path.rsplit('/').next()?;
            let time = name.strip_suffix(internal::SCHEMA_COMMIT_SUFFIX)?;
            timeline.is_committed(time).then_some((time.to_string(), f.path.clone()))
        })
        .max();
    let mut versions = match newest {
        Some((_, path)) => internal::parse_history(&path, &storage.get(&path).await?)?,
        None => Default::default(),
    };
    versions.entry(latest.version).or_insert_with(|| latest.clone());
    Ok(ColumnHistory::new(versions, latest))
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::datatypes::{Field, Schema};
    use std::sync::Arc;

    fn create_opts() -> CreateOptions {
        CreateOptions {
            name: "t".into(),
            table_type: crate::config::TableType::CopyOnWrite,
            record_key_fields: vec!["id".into()],
            partition_fields: vec!["city".into()],
            ordering_field: Some("ts".into()),
            hive_style: true,
            inline_compaction: None,
            table_version: 6,
            global_index: false,
            meta_fields: true,
            keygen_options: Default::default(),
            url_encode: true,
        }
    }

    fn schema() -> SchemaRef {
        Arc::new(Schema::new(vec![
            Field::new("id", DataType::Int64, false),
            Field::new("city", DataType::Utf8, true),
            Field::new("ts", DataType::Int64, true),
        ]))
    }

    #[tokio::test]
    async fn create_then_open() {
        let dir = tempfile::tempdir().unwrap();
        let uri = dir.path().join("t");
        let uri = uri.to_str().unwrap();
        let t = Table::create(uri, TableOptions::default(), create_opts(), schema()).await.unwrap();
        assert_eq!(t.data_schema(), schema());
        let again = Table::open(uri, TableOptions::default()).await.unwrap();
        assert_eq!(again.data_schema(), schema());
        assert_eq!(again.config().record_key_fields, vec!["id".to_string()]);
        let err = Table::create(uri, TableOptions::default(), create_opts(), schema()).await.unwrap_err();
        assert!(matches!(err, Error::TableExists { .. }));
    }

    #[tokio::test]
    async fn an_interrupted_retirement_of_apache_hudi_metadata_table_is_finished() {
        let dir = tempfile::tempdir().unwrap();
        let uri = dir.path().join("t");
        let mut t =
            Table::create(uri.to_str().unwrap(), TableOptions::default(), create_opts(), schema()).await.unwrap();
        // A writer stopped after un-advertising it and deleting some files: the properties of
        // the metadata table are still there (deleted last), so the next writer finds the rest.
        let left = [".hoodie/metadata/files/.files-0000_0.log.1_0-1-1", APACHE_HUDI_METADATA_PROPERTIES];
        for f in left {
            t.storage().put(f, Bytes::from_static(b"x")).await.unwrap();
        }
        assert!(t.retire_apache_hudi_metadata_table().await.unwrap());
        assert!(t.storage().list_recursive(APACHE_HUDI_METADATA_TABLE).await.unwrap().is_empty());
        assert!(!t.retire_apache_hudi_metadata_table().await.unwrap(), "nothing left to retire");
        // Our own table was never touched.
        assert_eq!(Table::open(uri.to_str().unwrap(), TableOptions::default()).await.unwrap().data_schema(), schema());
    }

    #[tokio::test]
    async fn missing_table_and_bad_fields() {
        let dir = tempfile::tempdir().unwrap();
        let err = Table::open(dir.path().to_str().unwrap(), TableOptions::default()).await.unwrap_err();
        assert!(matches!(err, Error::TableNotFound { .. }));
        let mut o = create_opts();
        o.ordering_field = Some("nope".into());
        let err = Table::create(dir.path().to_str().unwrap(), TableOptions::default(), o, schema()).await.unwrap_err();
        assert!(matches!(err, Error::InvalidArgument { .. }));
    }
}

/// The timeline fixtures of the corpus (`compat/hudi/unit/timeline`): commit metadata as Apache
/// Hudi writes it (empty, `{}`, invalid, without schema, with one), and schemas resolved from
/// base files.
#[cfg(test)]
mod fixture_tests {
    use super::*;
    use crate::format::commit::CommitMetadata;
    use crate::test_support::shared_dir;

    fn fixture(name: &str) -> String {
        shared_dir().join("compat/hudi/unit/timeline").join(name).to_string_lossy().into_owned()
    }

    /// The v6 timeline of a fixture and its commit metadata, instant by instant (most have no
    /// usable `hoodie.properties`, so the table itself cannot be opened).
    async fn commits(name: &str) -> Vec<(String, Result<CommitMetadata>)> {
        let storage = Storage::open(&fixture(name), &Default::default()).unwrap();
        let files = storage.list_dir(".hoodie").await.unwrap();
        let names = files.iter().map(|f| f.path.rsplit('/').next().unwrap());
        let timeline = Timeline::from_file_names(names, ".hoodie".into(), 1);
        let mut out = Vec::new();
        for i in timeline.completed_data() {
            out.push((i.time.clone(), timeline.commit_metadata(&storage, i).await));
        }
        out
    }

    #[tokio::test]
    #[cfg_attr(
        not(hudi_corpus),
        ignore = "needs the Apache Hudi corpus: set OXLAKE_SHARED to the folder holding compat/"
    )]
    async fn commit_metadata_as_apache_hudi_writes_it() {
        let stub = commits("commits_stub").await;
        assert_eq!(
            stub.iter().map(|(t, _)| t.as_str()).collect::<Vec<_>>(),
            ["20240402123035233", "20240402144910683"]
        );
        for (_, meta) in stub {
            assert_eq!(meta.unwrap(), CommitMetadata::default(), "an empty file is empty metadata");
        }

        let [(_, empty)] = <[_; 1]>::try_from(commits("commits_with_empty_commit_metadata").await).unwrap();
        assert_eq!(empty.unwrap(), CommitMetadata::default());

        let invalid = commits("commits_with_invalid_content").await;
        assert_eq!(invalid[0].1.as_ref().unwrap(), &CommitMetadata::default());
        match &invalid[1].1 {
            Err(Error::CorruptTable { path, .. }) => assert!(path.ends_with("20240402144910683.commit"), "{path}"),
            other => panic!("a JSON array is not commit metadata: {other:?}"),
        }

        let [(_, bare)] = <[_; 1]>::try_from(commits("commits_with_no_schema_and_write_stats").await).unwrap();
        let bare = bare.unwrap();
        assert_eq!(bare.operation_type.as_deref(), Some("BULK_INSERT"));
        assert_eq!((bare.write_stats().count(), bare.extra_metadata.len()), (0, 0));

        let [(_, with_schema)] =
            <[_; 1]>::try_from(commits("commits_with_valid_schema_in_commit_metadata").await).unwrap();
        let schema = schema::from_avro(&with_schema.unwrap().extra_metadata["schema"]).unwrap();
        let fields: Vec<_> = schema.fields().iter().map(|f| (f.name().as_str(), f.data_type().clone())).collect();
        assert_eq!(
            fields,
            [
                ("ts", DataType::Int64),
                ("uuid", DataType::Utf8),
                ("rider", DataType::Utf8),
                ("driver", DataType::Utf8),
                ("fare", DataType::Float64),
                ("city", DataType::Utf8),
            ]
        );
        assert!(schema.fields().iter().all(|f| f.is_nullable()));
    }

    #[tokio::test]
    #[cfg_attr(
        not(hudi_corpus),
        ignore = "needs the Apache Hudi corpus: set OXLAKE_SHARED to the folder holding compat/"
    )]
    async fn schema_from_the_base_file_a_commit_wrote() {
        // (fixture, type, base files its commits name, of which still on disk): the merge-on-read
        // fixture keeps only one of its three, so the schema comes from the one that is there.
        for (name, table_type, named, present) in [
            ("commits_load_schema_from_base_file_cow", crate::config::TableType::CopyOnWrite, 3, 3),
            ("commits_load_schema_from_base_file_mor", crate::config::TableType::MergeOnRead, 3, 1),
        ] {
            let t = Table::open(&fixture(name), TableOptions::default()).await.unwrap();
            assert_eq!(t.config().table_type, table_type);
            let names: Vec<_> = t.data_schema().fields().iter().map(|f| f.name().clone()).collect();
            assert_eq!(names, ["ts", "uuid", "rider", "driver", "fare", "city"], "{name}");
            // The commits name every file they wrote, in its partition.
            let mut written = Vec::new();
            for i in t.timeline().completed_data() {
                let meta = t.timeline().commit_metadata(t.storage(), i).await.unwrap();
                written.extend(meta.write_stats().filter_map(|(p, s)| s.path.clone().map(|f| (p.to_string(), f))));
            }
            assert!(written.iter().all(|(p, f)| f.starts_with(&format!("{p}/"))), "{written:?}");
            let bases: Vec<_> = written.iter().filter(|(_, f)| f.ends_with(".parquet")).collect();
            let mut on_disk = 0;
            for (_, f) in &bases {
                on_disk += usize::from(t.storage().head(f).await.unwrap().is_some());
            }
            assert_eq!((bases.len(), on_disk), (named, present), "{name}");
        }
    }
}
