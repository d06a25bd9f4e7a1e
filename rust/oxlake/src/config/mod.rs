//! `hoodie.properties`: the table's configuration, typed, validated on open, written once on create.
//!
//! Keys are defined here once. Values are kept ASCII and free of backslashes because hudi-rs does not
//! decode Java `.properties` escapes (docs/FORMAT.md §1); oxlake decodes all of them ([`properties`]):
//! Apache Hudi's Java engine rewrites the file with `Properties.store`. Unknown keys written by other engines are kept
//! verbatim so that a rewrite of the file (e.g. to un-advertise a metadata table) loses nothing.

use std::collections::BTreeMap;
use std::fmt;

use crate::error::{Error, Result};

pub mod properties;

/// Path of the properties file, relative to the table root.
pub const PROPERTIES_FILE: &str = ".hoodie/hoodie.properties";

/// The keys oxlake reads or writes.
pub mod keys {
    /// Table name.
    pub const NAME: &str = "hoodie.table.name";
    /// Table type: `COPY_ON_WRITE` or `MERGE_ON_READ`.
    pub const TYPE: &str = "hoodie.table.type";
    /// Table version (6, 8 or 9 are supported).
    pub const VERSION: &str = "hoodie.table.version";
    /// Timeline layout version: 1 for table version 6, 2 for later versions.
    pub const LAYOUT_VERSION: &str = "hoodie.timeline.layout.version";
    /// Comma-separated record key fields.
    pub const RECORD_KEY_FIELDS: &str = "hoodie.table.recordkey.fields";
    /// Comma-separated partition fields.
    pub const PARTITION_FIELDS: &str = "hoodie.table.partition.fields";
    /// The ordering (precombine) field, before table version 9.
    pub const PRECOMBINE_FIELD: &str = "hoodie.table.precombine.field";
    /// Comma-separated ordering fields, table version 9 and later; replaces the precombine field.
    pub const ORDERING_FIELDS: &str = "hoodie.table.ordering.fields";
    /// Whether partition directories are named `field=value`.
    pub const HIVE_STYLE: &str = "hoodie.datasource.write.hive_style_partitioning";
    /// Whether partition values are URL-encoded in partition paths.
    pub const URL_ENCODE: &str = "hoodie.datasource.write.partitionpath.urlencode";
    /// Whether partition columns are left out of the data files (`true` is not supported).
    pub const DROP_PARTITION_COLUMNS: &str = "hoodie.datasource.write.drop.partition.columns";
    /// Base file format; only `PARQUET` is supported.
    pub const BASE_FILE_FORMAT: &str = "hoodie.table.base.file.format";
    /// Timezone of instant times: `UTC` or `LOCAL`.
    pub const TIMEZONE: &str = "hoodie.table.timeline.timezone";
    /// Fully qualified Java class name of the key generator.
    pub const KEYGEN_CLASS: &str = "hoodie.table.keygenerator.class";
    /// Key generator type (e.g. `SIMPLE`, `COMPLEX`); takes precedence over the class name.
    pub const KEYGEN_TYPE: &str = "hoodie.table.keygenerator.type";
    /// Java payload class, used to infer the merge mode of older tables.
    pub const PAYLOAD_CLASS: &str = "hoodie.compaction.payload.class";
    /// Explicit merge mode: `EVENT_TIME_ORDERING`, `COMMIT_TIME_ORDERING` or `CUSTOM`.
    pub const MERGE_MODE: &str = "hoodie.record.merge.mode";
    /// Merge strategy id (table version 8 and later).
    pub const MERGE_STRATEGY_ID: &str = "hoodie.record.merge.strategy.id";
    /// Whether the `_hoodie_*` meta fields are written into data files.
    pub const POPULATE_META_FIELDS: &str = "hoodie.populate.meta.fields";
    /// Database name, part of the table checksum.
    pub const DATABASE_NAME: &str = "hoodie.database.name";
    /// Checksum of the database and table names.
    pub const CHECKSUM: &str = "hoodie.table.checksum";
    /// Directory of the archived timeline, relative to `.hoodie`.
    pub const ARCHIVELOG_FOLDER: &str = "hoodie.archivelog.folder";
    /// Directory of the active timeline under `.hoodie` (timeline layout 2; default `timeline`).
    pub const TIMELINE_PATH: &str = "hoodie.timeline.path";
    /// Directory of the archived (LSM) timeline under the active one (layout 2; default `history`).
    pub const TIMELINE_HISTORY_PATH: &str = "hoodie.timeline.history.path";
    /// The version a table was created at (table version 8 and later).
    pub const INITIAL_VERSION: &str = "hoodie.table.initial.version";
    /// Avro schema the table was created with.
    pub const CREATE_SCHEMA: &str = "hoodie.table.create.schema";
    /// Apache Hudi's metadata table: the partitions it holds (built and being built), and the switch.
    pub const METADATA_PARTITIONS: &str = "hoodie.table.metadata.partitions";
    /// Metadata table partitions still being built.
    pub const METADATA_PARTITIONS_INFLIGHT: &str = "hoodie.table.metadata.partitions.inflight";
    /// Whether the metadata table is enabled.
    pub const METADATA_ENABLE: &str = "hoodie.metadata.enable";
    /// The partition fields with their types (`ts:timestamp,region:simple`), as Apache Hudi 0.x's
    /// custom key generator takes them from the writer's options; oxlake records them here on
    /// version 6 tables, whose `hoodie.table.partition.fields` holds the names only.
    pub const WRITE_PARTITION_FIELDS: &str = "hoodie.datasource.write.partitionpath.field";
    /// oxlake's own: compact a merge-on-read table after this many deltacommits (unset: never inline).
    pub const INLINE_COMPACTION: &str = "oxlake.compaction.inline.max.delta.commits";
    /// oxlake's own: record keys are unique across partitions (see [`super::TableConfig::global_index`]).
    pub const GLOBAL_INDEX: &str = "oxlake.index.global";
}

const DEFAULT_PAYLOAD: &str = "org.apache.hudi.common.model.DefaultHoodieRecordPayload";
const OVERWRITE_PAYLOAD: &str = "org.apache.hudi.common.model.OverwriteWithLatestAvroPayload";
/// Merge strategy ids of tables of version 8 and later (docs/FORMAT.md §1).
pub(crate) const EVENT_TIME_STRATEGY: &str = "eeb8d96f-b1e4-49fd-bbf8-28ac514178e5";
pub(crate) const COMMIT_TIME_STRATEGY: &str = "ce9acb64-bde0-424c-9b91-f6ebba25356d";

/// Copy-on-write or merge-on-read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TableType {
    /// `COPY_ON_WRITE`: updates rewrite base files.
    CopyOnWrite,
    /// `MERGE_ON_READ`: updates go to log files, merged on read and by compaction.
    MergeOnRead,
}

impl TableType {
    /// Parses the Python-facing spelling (`copy_on_write`, `merge_on_read`) or Hudi's.
    pub fn parse(s: &str) -> Option<Self> {
        match s.to_ascii_lowercase().as_str() {
            "copy_on_write" | "cow" => Some(TableType::CopyOnWrite),
            "merge_on_read" | "mor" => Some(TableType::MergeOnRead),
            _ => None,
        }
    }

    fn hudi_name(self) -> &'static str {
        match self {
            TableType::CopyOnWrite => "COPY_ON_WRITE",
            TableType::MergeOnRead => "MERGE_ON_READ",
        }
    }
}

impl fmt::Display for TableType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            TableType::CopyOnWrite => "copy_on_write",
            TableType::MergeOnRead => "merge_on_read",
        })
    }
}

/// How two versions of one record are reconciled.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MergeMode {
    /// The record with the greater ordering value wins; ties go to the later commit.
    EventTime,
    /// The later commit wins.
    CommitTime,
    /// A payload class or merge strategy of the user's (Java code): oxlake cannot merge such records;
    /// reads that need no merge (copy-on-write, read-optimized, slices without logs) still work.
    Custom,
}

/// Which key generator wrote the table: decides the record-key format and the partition path.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KeyGenerator {
    /// One key field, value as is; at most one partition field.
    Simple,
    /// `f1:v1,f2:v2` keys; any number of partition fields.
    Complex,
    /// No partition fields; the key as `Simple` (one field) or `Complex` (several).
    NonPartitioned,
    /// Apache Hudi's `TimestampBasedKeyGenerator`: one partition field, its value an instant
    /// printed with a date pattern (`hoodie.keygen.timebased.*`); simple keys.
    Timestamp,
    /// Apache Hudi's `CustomKeyGenerator`: partition fields each simple or timestamp-based
    /// ([`PartitionKind`]); simple keys for one key field, complex ones for several.
    Custom,
    /// A key generator oxlake does not know; reads work, writes are refused.
    Other(String),
}

/// How a partition field becomes a segment of the partition path.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PartitionKind {
    /// The value as text.
    Simple,
    /// The value an instant, printed with the table's `hoodie.keygen.timebased.*` pattern.
    Timestamp,
    /// A custom key generator's field whose type the table does not record (Apache Hudi 0.x
    /// keeps it in the writer's options): readable, not writable.
    Unknown,
}

impl PartitionKind {
    /// Splits `field:type` (the custom key generator's syntax, type case-insensitive) into the
    /// field and its kind; a bare field is `None`.
    pub fn split(spec: &str) -> std::result::Result<(&str, Option<PartitionKind>), String> {
        let Some((field, kind)) = spec.split_once(':') else { return Ok((spec.trim(), None)) };
        let kind = match kind.trim().to_ascii_uppercase().as_str() {
            "SIMPLE" => PartitionKind::Simple,
            "TIMESTAMP" => PartitionKind::Timestamp,
            other => return Err(format!("`{spec}`: partition type {other:?} is neither SIMPLE nor TIMESTAMP")),
        };
        Ok((field.trim(), Some(kind)))
    }

    fn hudi_name(self) -> &'static str {
        match self {
            PartitionKind::Timestamp => "TIMESTAMP",
            _ => "SIMPLE",
        }
    }
}

/// The parsed, validated `hoodie.properties`.
#[derive(Clone, Debug, PartialEq)]
pub struct TableConfig {
    /// `hoodie.table.name`.
    pub name: String,
    /// `hoodie.table.type`.
    pub table_type: TableType,
    /// `hoodie.table.version`: 6, 8 or 9.
    pub version: u32,
    /// `hoodie.timeline.layout.version`: 1 for table version 6, 2 otherwise.
    pub layout_version: u32,
    /// `hoodie.table.recordkey.fields`; empty if the file does not name them.
    pub record_key_fields: Vec<String>,
    /// `hoodie.table.partition.fields` (names only); empty for a non-partitioned table.
    pub partition_fields: Vec<String>,
    /// How each partition field makes its path segment (aligned with `partition_fields`).
    pub partition_kinds: Vec<PartitionKind>,
    /// The ordering field (`hoodie.table.ordering.fields` or `hoodie.table.precombine.field`), if any.
    pub ordering_field: Option<String>,
    /// `hoodie.datasource.write.hive_style_partitioning`: partition directories named `field=value`.
    pub hive_style: bool,
    /// `hoodie.datasource.write.partitionpath.urlencode`: partition values URL-encoded in paths.
    pub url_encode: bool,
    /// The key generator, from `hoodie.table.keygenerator.type` or `hoodie.table.keygenerator.class`.
    pub key_generator: KeyGenerator,
    /// How versions of one record are merged, explicit or inferred from the payload class or strategy id.
    pub merge_mode: MergeMode,
    /// `hoodie.populate.meta.fields`: whether data files carry the `_hoodie_*` meta fields.
    pub populate_meta_fields: bool,
    /// Whether instant times are UTC (`hoodie.table.timeline.timezone` is not `LOCAL`).
    pub timezone_utc: bool,
    /// Merge-on-read: writers compact after this many deltacommits since the last compaction.
    pub inline_compaction: Option<u32>,
    /// Whether a record key is unique across partitions (a global index, as Apache Hudi's
    /// `GLOBAL_SIMPLE` / `RECORD_INDEX` with `update.partition.path`): a write looks keys up in
    /// every partition, and an upsert that gives a key another partition moves its record there.
    /// Without it a key is unique within its partition only (Hudi's default indexes).
    pub global_index: bool,
    /// Every key of the file, including those above and the ones oxlake does not interpret.
    pub raw: BTreeMap<String, String>,
}

/// What a caller chooses when creating a table; everything else is derived.
#[derive(Clone, Debug)]
pub struct CreateOptions {
    /// Table name (`hoodie.table.name`).
    pub name: String,
    /// Copy-on-write or merge-on-read.
    pub table_type: TableType,
    /// Record key fields; at least one.
    pub record_key_fields: Vec<String>,
    /// Partition fields; empty for a non-partitioned table. `field:timestamp` makes a field's
    /// segment its value printed as a date (the custom key generator's syntax; `field:simple` is
    /// the value as text), configured by `keygen_options`.
    pub partition_fields: Vec<String>,
    /// Apache Hudi's `hoodie.keygen.timebased.*` options, for timestamp-based partition fields.
    pub keygen_options: BTreeMap<String, String>,
    /// `hoodie.datasource.write.partitionpath.urlencode`: partition values escaped in paths.
    pub url_encode: bool,
    /// Ordering field: with one, the merge mode is event time, otherwise commit time.
    pub ordering_field: Option<String>,
    /// Whether partition directories are named `field=value`.
    pub hive_style: bool,
    /// See [`TableConfig::inline_compaction`].
    pub inline_compaction: Option<u32>,
    /// See [`TableConfig::global_index`].
    pub global_index: bool,
    /// `hoodie.populate.meta.fields`: whether data files carry the meta fields' values (without,
    /// Apache Hudi's virtual keys: they are null and readers make keys from the key fields).
    pub meta_fields: bool,
    /// `hoodie.table.version`: 6 (Apache Hudi 0.14/0.15, timeline layout 1), 8 (Hudi 1.0) or 9
    /// (Hudi 1.1); 8 and 9 use timeline layout 2.
    pub table_version: u32,
}

impl TableConfig {
    /// Derives the configuration of a new table of `opts.table_version`.
    pub fn new(opts: &CreateOptions) -> Result<Self> {
        if !matches!(opts.table_version, 6 | 8 | 9) {
            return Err(Error::invalid_arg(
                "table_version",
                format!("{} is not a table version oxlake writes (6, 8 or 9)", opts.table_version),
            ));
        }
        check_name("name", &opts.name)?;
        if opts.record_key_fields.is_empty() {
            return Err(Error::invalid_arg("record_key", "at least one record key field is required"));
        }
        let (partition_fields, partition_kinds) = opts.partition_specs()?;
        for f in opts.record_key_fields.iter().chain(&partition_fields).chain(&opts.ordering_field) {
            check_name("field", f)?;
        }
        let timestamp = partition_kinds.contains(&PartitionKind::Timestamp);
        let key_generator = if partition_fields.is_empty() {
            KeyGenerator::NonPartitioned
        } else if timestamp && opts.record_key_fields.len() == 1 && partition_fields.len() == 1 {
            KeyGenerator::Timestamp
        } else if timestamp {
            KeyGenerator::Custom
        } else if opts.record_key_fields.len() == 1 && partition_fields.len() == 1 {
            KeyGenerator::Simple
        } else {
            KeyGenerator::Complex
        };
        let merge_mode = if opts.ordering_field.is_some() { MergeMode::EventTime } else { MergeMode::CommitTime };
        let mut cfg = TableConfig {
            name: opts.name.clone(),
            table_type: opts.table_type,
            version: opts.table_version,
            layout_version: if opts.table_version == 6 { 1 } else { 2 },
            record_key_fields: opts.record_key_fields.clone(),
            partition_fields,
            partition_kinds,
            ordering_field: opts.ordering_field.clone(),
            hive_style: opts.hive_style,
            url_encode: opts.url_encode,
            key_generator,
            merge_mode,
            populate_meta_fields: opts.meta_fields,
            timezone_utc: true,
            inline_compaction: opts.inline_compaction,
            global_index: opts.global_index,
            raw: BTreeMap::new(),
        };
        if opts.inline_compaction.is_some() && opts.table_type != TableType::MergeOnRead {
            return Err(Error::invalid_arg("inline_compaction", "only merge-on-read tables are compacted"));
        }
        if opts.inline_compaction == Some(0) {
            return Err(Error::invalid_arg("inline_compaction", "must be at least 1 deltacommit"));
        }
        cfg.raw = cfg.to_map();
        cfg.raw.extend(opts.keygen_options.iter().map(|(k, v)| (k.clone(), v.trim().to_string())));
        Ok(cfg)
    }

    /// The properties of a new table, as Apache Hudi writes them for its version: version 6 names
    /// the key generator and payload classes; version 8 the key generator type, the merge mode and
    /// strategy (and the payload class Hudi 1.0 still records); version 9 the merge mode and the
    /// ordering fields only.
    fn to_map(&self) -> BTreeMap<String, String> {
        let mut m = BTreeMap::new();
        let mut set = |k: &str, v: &str| {
            m.insert(k.to_string(), v.to_string());
        };
        set(keys::NAME, &self.name);
        set(keys::TYPE, self.table_type.hudi_name());
        let version = self.version.to_string();
        set(keys::VERSION, &version);
        set(keys::LAYOUT_VERSION, &self.layout_version.to_string());
        set(keys::RECORD_KEY_FIELDS, &self.record_key_fields.join(","));
        if !self.partition_fields.is_empty() {
            let typed: Vec<String> = self
                .partition_fields
                .iter()
                .zip(&self.partition_kinds)
                .map(|(f, k)| format!("{f}:{}", k.hudi_name()))
                .collect();
            // Apache Hudi 1.x records the custom key generator's types with the fields; 0.x keeps
            // them in the writer's options, which oxlake records beside.
            match (self.key_generator == KeyGenerator::Custom, self.version) {
                (true, 6) => {
                    set(keys::PARTITION_FIELDS, &self.partition_fields.join(","));
                    set(keys::WRITE_PARTITION_FIELDS, &typed.join(","));
                }
                (true, _) => set(keys::PARTITION_FIELDS, &typed.join(",")),
                (false, _) => set(keys::PARTITION_FIELDS, &self.partition_fields.join(",")),
            }
        }
        if let Some(o) = &self.ordering_field {
            set(if self.version >= 9 { keys::ORDERING_FIELDS } else { keys::PRECOMBINE_FIELD }, o);
        }
        set(keys::HIVE_STYLE, bool_str(self.hive_style));
        set(keys::URL_ENCODE, bool_str(self.url_encode));
        set(keys::DROP_PARTITION_COLUMNS, "false");
        set(keys::BASE_FILE_FORMAT, "PARQUET");
        set(keys::TIMEZONE, "UTC");
        let (keygen_class, keygen_type) = match self.key_generator {
            KeyGenerator::Simple => ("org.apache.hudi.keygen.SimpleKeyGenerator", "SIMPLE"),
            KeyGenerator::NonPartitioned => ("org.apache.hudi.keygen.NonpartitionedKeyGenerator", "NON_PARTITION"),
            KeyGenerator::Timestamp => ("org.apache.hudi.keygen.TimestampBasedKeyGenerator", "TIMESTAMP"),
            KeyGenerator::Custom => ("org.apache.hudi.keygen.CustomKeyGenerator", "CUSTOM"),
            _ => ("org.apache.hudi.keygen.ComplexKeyGenerator", "COMPLEX"),
        };
        let (payload, strategy, mode) = match self.merge_mode {
            MergeMode::EventTime => (Some(DEFAULT_PAYLOAD), Some(EVENT_TIME_STRATEGY), "EVENT_TIME_ORDERING"),
            MergeMode::CommitTime => (Some(OVERWRITE_PAYLOAD), Some(COMMIT_TIME_STRATEGY), "COMMIT_TIME_ORDERING"),
            MergeMode::Custom => (None, None, "CUSTOM"),
        };
        if self.version == 6 {
            set(keys::KEYGEN_CLASS, keygen_class);
            if let Some(p) = payload {
                set(keys::PAYLOAD_CLASS, p);
            }
        } else {
            set(keys::INITIAL_VERSION, &version);
            set(keys::TIMELINE_PATH, "timeline");
            set(keys::TIMELINE_HISTORY_PATH, "history");
            set(keys::KEYGEN_TYPE, keygen_type);
            set(keys::MERGE_MODE, mode);
            if self.version == 8 {
                if let Some(p) = payload {
                    set(keys::PAYLOAD_CLASS, p);
                }
                if let Some(s) = strategy {
                    set(keys::MERGE_STRATEGY_ID, s);
                }
            }
        }
        set(keys::POPULATE_META_FIELDS, bool_str(self.populate_meta_fields));
        set(keys::DATABASE_NAME, "default");
        set(keys::ARCHIVELOG_FOLDER, "archived");
        set(keys::CHECKSUM, &checksum("default", &self.name).to_string());
        if let Some(n) = self.inline_compaction {
            set(keys::INLINE_COMPACTION, &n.to_string());
        }
        if self.global_index {
            set(keys::GLOBAL_INDEX, "true");
        }
        m
    }

    /// Parses and validates the text of `hoodie.properties`.
    pub fn parse(text: &str) -> Result<Self> {
        let raw = parse_properties(text);
        Self::from_map(raw)
    }

    fn from_map(raw: BTreeMap<String, String>) -> Result<Self> {
        let get = |k: &str| raw.get(k).map(|s| s.trim()).filter(|s| !s.is_empty());
        let required = |k: &str| get(k).ok_or_else(|| bad(format!("missing required key `{k}`")));
        let name = required(keys::NAME)?.to_string();
        let table_type = TableType::parse(required(keys::TYPE)?)
            .ok_or_else(|| bad(format!("`{}` must be COPY_ON_WRITE or MERGE_ON_READ", keys::TYPE)))?;
        let version: u32 =
            required(keys::VERSION)?.parse().map_err(|_| bad(format!("`{}` is not a number", keys::VERSION)))?;
        if !matches!(version, 6 | 8 | 9) {
            return Err(Error::unsupported(format!("table version {version} (supported: 6, 8, 9)")));
        }
        let layout_version: u32 = match get(keys::LAYOUT_VERSION) {
            Some(v) => v.parse().map_err(|_| bad(format!("`{}` is not a number", keys::LAYOUT_VERSION)))?,
            None if version == 6 => 1,
            None => 2,
        };
        if (version == 6) != (layout_version == 1) {
            return Err(bad(format!("timeline layout {layout_version} does not go with table version {version}")));
        }
        if get(keys::DROP_PARTITION_COLUMNS).is_some_and(|v| v.eq_ignore_ascii_case("true")) {
            return Err(Error::unsupported("hoodie.datasource.write.drop.partition.columns=true"));
        }
        if let Some(fmt) = get(keys::BASE_FILE_FORMAT)
            && !fmt.eq_ignore_ascii_case("parquet")
        {
            return Err(Error::unsupported(format!("base file format {fmt}")));
        }
        let list = |k: &str| -> Vec<String> {
            get(k)
                .map(|v| v.split(',').map(|s| s.trim().to_string()).filter(|s| !s.is_empty()).collect())
                .unwrap_or_default()
        };
        let ordering = {
            let fields = if raw.contains_key(keys::ORDERING_FIELDS) {
                list(keys::ORDERING_FIELDS)
            } else {
                list(keys::PRECOMBINE_FIELD)
            };
            if fields.len() > 1 {
                return Err(Error::unsupported(format!("several ordering fields: {}", fields.join(","))));
            }
            fields.into_iter().next()
        };
        // The class first, as Apache Hudi reads them (a `USER_PROVIDED` type names its class).
        let keygen_name = get(keys::KEYGEN_CLASS).or(get(keys::KEYGEN_TYPE)).unwrap_or("");
        let mut key_generator = key_generator_of(keygen_name);
        let (partition_fields, partition_kinds) =
            partition_fields_of(&list(keys::PARTITION_FIELDS), &list(keys::WRITE_PARTITION_FIELDS), &key_generator)?;
        // Apache Hudi's key generators without partition fields make keys as its non-partitioned
        // one does; a class of the table's own stays unknown.
        if partition_fields.is_empty()
            && !matches!(key_generator, KeyGenerator::NonPartitioned | KeyGenerator::Other(_))
        {
            key_generator = KeyGenerator::NonPartitioned;
        }
        let record_key_fields = list(keys::RECORD_KEY_FIELDS);
        let merge_mode = infer_merge_mode(&raw, version, ordering.is_some());
        let flag = |k: &str, default: bool| get(k).map(|v| v.eq_ignore_ascii_case("true")).unwrap_or(default);
        let timezone_utc = !get(keys::TIMEZONE).is_some_and(|v| v.eq_ignore_ascii_case("local"));
        let inline_compaction = match get(keys::INLINE_COMPACTION) {
            Some(v) => Some(
                v.parse::<u32>()
                    .ok()
                    .filter(|n| *n > 0)
                    .ok_or_else(|| bad(format!("`{}` is not a positive number", keys::INLINE_COMPACTION)))?,
            ),
            None => None,
        };
        Ok(TableConfig {
            name,
            table_type,
            version,
            layout_version,
            record_key_fields,
            partition_kinds: if key_generator == KeyGenerator::NonPartitioned { vec![] } else { partition_kinds },
            partition_fields: if key_generator == KeyGenerator::NonPartitioned { vec![] } else { partition_fields },
            ordering_field: ordering,
            hive_style: flag(keys::HIVE_STYLE, false),
            url_encode: flag(keys::URL_ENCODE, false),
            key_generator,
            merge_mode,
            populate_meta_fields: flag(keys::POPULATE_META_FIELDS, true),
            timezone_utc,
            inline_compaction,
            global_index: flag(keys::GLOBAL_INDEX, false),
            raw,
        })
    }

    /// The text of `hoodie.properties` (sorted keys; escapes only where meaning needs them, see
    /// [`properties`]).
    pub fn to_properties(&self) -> String {
        let mut out = String::from("#Properties saved by oxlake\n");
        for (k, v) in &self.raw {
            out.push_str(&properties::line(k, v));
            out.push('\n');
        }
        out
    }

    /// Writes and lookups key records by the record key fields: a table without them (a
    /// `hoodie.properties` lacking `hoodie.table.recordkey.fields`) can be read, not written.
    pub fn check_record_key_fields(&self) -> Result<()> {
        if self.record_key_fields.is_empty() {
            return Err(bad(format!(
                "`{}` is missing or empty: writes need the record key fields",
                keys::RECORD_KEY_FIELDS
            )));
        }
        Ok(())
    }

    /// Whether the table has partition fields.
    pub fn is_partitioned(&self) -> bool {
        !self.partition_fields.is_empty()
    }

    /// Directory of the active timeline, relative to the table root.
    pub fn timeline_dir(&self) -> String {
        if self.layout_version == 1 {
            ".hoodie".to_string()
        } else {
            format!(".hoodie/{}", self.folder(keys::TIMELINE_PATH, "timeline"))
        }
    }

    /// A folder name the properties set under `key` (blank: `default`).
    pub fn folder<'a>(&'a self, key: &str, default: &'a str) -> &'a str {
        self.raw.get(key).map(|s| s.trim()).filter(|s| !s.is_empty()).unwrap_or(default)
    }

    /// Whether keys are written `field:value,...` (complex) rather than as the bare value.
    pub fn complex_keys(&self) -> bool {
        match self.key_generator {
            // Apache Hudi's timestamp key generator takes the record key as one field.
            KeyGenerator::Simple | KeyGenerator::Timestamp => false,
            KeyGenerator::NonPartitioned | KeyGenerator::Custom => self.record_key_fields.len() > 1,
            _ => true,
        }
    }

    /// Whether a partition field is timestamp-based (its path segment is not its value).
    pub fn has_timestamp_partitions(&self) -> bool {
        self.partition_kinds.iter().any(|k| *k != PartitionKind::Simple)
    }
}

/// The key generator a table's `hoodie.table.keygenerator.type` or `.class` names: Apache Hudi's
/// types, its classes by their full name (a class of another package named like one of Hudi's is
/// the user's own, of unknown behaviour), or the bare class name.
fn key_generator_of(name: &str) -> KeyGenerator {
    let short = match name.rsplit_once('.') {
        Some(("org.apache.hudi.keygen", class)) => class,
        Some(_) => return KeyGenerator::Other(name.to_string()),
        None => name,
    };
    match short.to_ascii_uppercase().as_str() {
        "" | "SIMPLE" | "SIMPLEKEYGENERATOR" | "SIMPLE_AVRO" | "SIMPLEAVROKEYGENERATOR" => KeyGenerator::Simple,
        "COMPLEX" | "COMPLEXKEYGENERATOR" | "COMPLEX_AVRO" | "COMPLEXAVROKEYGENERATOR" => KeyGenerator::Complex,
        "NON_PARTITION" | "NON_PARTITION_AVRO" | "NONPARTITIONEDKEYGENERATOR" | "NONPARTITIONEDAVROKEYGENERATOR" => {
            KeyGenerator::NonPartitioned
        }
        "TIMESTAMP" | "TIMESTAMP_AVRO" | "TIMESTAMPBASEDKEYGENERATOR" | "TIMESTAMPBASEDAVROKEYGENERATOR" => {
            KeyGenerator::Timestamp
        }
        "CUSTOM" | "CUSTOM_AVRO" | "CUSTOMKEYGENERATOR" | "CUSTOMAVROKEYGENERATOR" => KeyGenerator::Custom,
        _ => KeyGenerator::Other(name.to_string()),
    }
}

/// The partition field names and kinds of a table: Apache Hudi 1.x writes a custom key
/// generator's fields typed (`ts:TIMESTAMP`), 0.x the names only (oxlake keeps the typed list in
/// [`keys::WRITE_PARTITION_FIELDS`]). The timestamp key generator's one field is timestamp-based;
/// those of a key generator oxlake does not know are of unknown kind.
fn partition_fields_of(
    listed: &[String],
    typed_beside: &[String],
    key_generator: &KeyGenerator,
) -> Result<(Vec<String>, Vec<PartitionKind>)> {
    let split = |specs: &[String]| -> Result<Vec<(String, Option<PartitionKind>)>> {
        specs.iter().map(|s| PartitionKind::split(s).map(|(f, k)| (f.to_string(), k)).map_err(bad)).collect()
    };
    let fields = split(listed)?;
    let names: Vec<String> = fields.iter().map(|(f, _)| f.clone()).collect();
    let kinds = match key_generator {
        KeyGenerator::Timestamp => {
            (0..names.len()).map(|i| if i == 0 { PartitionKind::Timestamp } else { PartitionKind::Unknown }).collect()
        }
        KeyGenerator::Custom => {
            let beside = split(typed_beside)?;
            let beside_names: Vec<&String> = beside.iter().map(|(f, _)| f).collect();
            fields
                .iter()
                .enumerate()
                .map(|(i, (_, kind))| {
                    kind.or_else(|| (beside_names == names.iter().collect::<Vec<_>>()).then(|| beside[i].1).flatten())
                        .unwrap_or(PartitionKind::Unknown)
                })
                .collect()
        }
        KeyGenerator::Simple | KeyGenerator::Complex | KeyGenerator::NonPartitioned => {
            vec![PartitionKind::Simple; names.len()]
        }
        // A class of the table's own: its path segments need not be the fields' values, so no
        // filter is answered from them (nor is a field taken as the same in every version).
        KeyGenerator::Other(_) => vec![PartitionKind::Unknown; names.len()],
    };
    Ok((names, kinds))
}

impl CreateOptions {
    /// The partition field names and kinds: `field`, `field:simple` or `field:timestamp`.
    pub fn partition_specs(&self) -> Result<(Vec<String>, Vec<PartitionKind>)> {
        let mut names = Vec::new();
        let mut kinds = Vec::new();
        for spec in &self.partition_fields {
            let (field, kind) = PartitionKind::split(spec).map_err(|why| Error::invalid_arg("partition_by", why))?;
            names.push(field.to_string());
            kinds.push(kind.unwrap_or(PartitionKind::Simple));
        }
        Ok((names, kinds))
    }
}

/// Apache Hudi's inference for tables before version 9: explicit merge mode, else the payload class.
fn infer_merge_mode(raw: &BTreeMap<String, String>, version: u32, has_ordering: bool) -> MergeMode {
    match raw.get(keys::MERGE_MODE).map(|s| s.trim().to_ascii_uppercase()).as_deref() {
        Some("COMMIT_TIME_ORDERING") => return MergeMode::CommitTime,
        Some("EVENT_TIME_ORDERING") => return MergeMode::EventTime,
        Some("CUSTOM") => return MergeMode::Custom,
        _ => {}
    }
    let payload = raw.get(keys::PAYLOAD_CLASS).map(|s| s.trim()).filter(|s| !s.is_empty());
    let strategy = raw.get(keys::MERGE_STRATEGY_ID).map(|s| s.trim()).filter(|s| !s.is_empty());
    match (payload, strategy) {
        (None, None) if has_ordering => MergeMode::EventTime,
        (None, None) => MergeMode::CommitTime,
        (_, Some(id)) if version >= 8 => match id {
            EVENT_TIME_STRATEGY => MergeMode::EventTime,
            COMMIT_TIME_STRATEGY => MergeMode::CommitTime,
            _ => MergeMode::Custom,
        },
        (Some(class), _) => match class.rsplit('.').next().unwrap_or(class) {
            "DefaultHoodieRecordPayload" | "EventTimeAvroPayload" => MergeMode::EventTime,
            "OverwriteWithLatestAvroPayload" => MergeMode::CommitTime,
            _ => MergeMode::Custom,
        },
        (None, Some(_)) if has_ordering => MergeMode::EventTime,
        (None, Some(_)) => MergeMode::CommitTime,
    }
}

/// The properties of a `hoodie.properties` text, with every escape Java writes decoded.
pub fn parse_properties(text: &str) -> BTreeMap<String, String> {
    properties::load(text)
}

/// `text` (a `hoodie.properties`) with each `(key, value)` set, or removed for `None`, every other
/// line kept as it was; returns the new text and the configuration it holds (checked before anything
/// is written).
pub fn edit_properties(text: &str, edits: &[(&str, Option<&str>)]) -> Result<(String, TableConfig)> {
    let out = properties::edit(text, edits);
    let config = TableConfig::parse(&out)?;
    Ok((out, config))
}

/// `CRC32("<database>.<table>")`, the checksum Apache Hudi validates.
pub fn checksum(database: &str, table: &str) -> u32 {
    crc32fast::hash(format!("{database}.{table}").as_bytes())
}

fn bool_str(b: bool) -> &'static str {
    if b { "true" } else { "false" }
}

fn bad(detail: String) -> Error {
    Error::corrupt(PROPERTIES_FILE, detail)
}

/// Names end up in properties files, paths and Avro schemas: keep them plain.
fn check_name(what: &str, s: &str) -> Result<()> {
    let ok = !s.is_empty() && s.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-' || c == '.');
    if ok {
        Ok(())
    } else {
        Err(Error::invalid_arg(what, format!("`{s}` must be non-empty ASCII letters, digits, `_`, `-` or `.`")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opts() -> CreateOptions {
        CreateOptions {
            name: "trips".into(),
            table_type: TableType::CopyOnWrite,
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

    #[test]
    fn key_generators_are_apache_hudis_by_type_or_full_class_name_only() {
        use KeyGenerator as K;
        for (name, expected) in [
            ("", K::Simple),
            ("SIMPLE", K::Simple),
            ("org.apache.hudi.keygen.SimpleKeyGenerator", K::Simple),
            ("SimpleKeyGenerator", K::Simple),
            ("org.apache.hudi.keygen.ComplexAvroKeyGenerator", K::Complex),
            ("NON_PARTITION", K::NonPartitioned),
            ("org.apache.hudi.keygen.TimestampBasedKeyGenerator", K::Timestamp),
            ("TIMESTAMP_AVRO", K::Timestamp),
            ("org.apache.hudi.keygen.CustomKeyGenerator", K::Custom),
        ] {
            assert_eq!(key_generator_of(name), expected, "{name}");
        }
        // A class of the user's own, even named like Apache Hudi's, or one oxlake does not run.
        for name in [
            "com.acme.keygen.SimpleKeyGenerator",
            "com.acme.MyTimestampKeyGenerator",
            "org.apache.hudi.keygen.GlobalDeleteKeyGenerator",
            "org.apache.spark.sql.hudi.command.SqlKeyGenerator",
            "MyTimestampThing",
        ] {
            assert_eq!(key_generator_of(name), K::Other(name.into()), "{name}");
        }
    }

    /// docs/FORMAT.md §6: Apache Hudi's inference for tables before version 9.
    #[test]
    fn merge_mode_inferred_as_apache_hudi_infers_it() {
        let m = |version: u32, ordering: bool, props: &[(&str, &str)]| {
            let raw = props.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
            infer_merge_mode(&raw, version, ordering)
        };
        use MergeMode::*;
        assert_eq!(m(6, true, &[]), EventTime);
        assert_eq!(m(6, false, &[]), CommitTime);
        assert_eq!(m(6, true, &[(keys::MERGE_MODE, "commit_time_ordering")]), CommitTime);
        assert_eq!(m(8, false, &[(keys::MERGE_MODE, "CUSTOM")]), Custom);
        assert_eq!(m(6, false, &[(keys::PAYLOAD_CLASS, DEFAULT_PAYLOAD)]), EventTime);
        assert_eq!(
            m(6, true, &[(keys::PAYLOAD_CLASS, "org.apache.hudi.common.model.EventTimeAvroPayload")]),
            EventTime
        );
        assert_eq!(m(6, true, &[(keys::PAYLOAD_CLASS, OVERWRITE_PAYLOAD)]), CommitTime);
        assert_eq!(m(6, true, &[(keys::PAYLOAD_CLASS, "com.acme.MyPayload")]), Custom);
        // From version 8 the strategy id decides, whatever the payload class says.
        let with = |id: &str| m(8, true, &[(keys::PAYLOAD_CLASS, OVERWRITE_PAYLOAD), (keys::MERGE_STRATEGY_ID, id)]);
        assert_eq!(with(EVENT_TIME_STRATEGY), EventTime);
        assert_eq!(with(COMMIT_TIME_STRATEGY), CommitTime);
        assert_eq!(with("00000000-0000-0000-0000-000000000000"), Custom);
        // Version 6 ignores a strategy id.
        assert_eq!(m(6, true, &[(keys::MERGE_STRATEGY_ID, COMMIT_TIME_STRATEGY)]), EventTime);
    }

    #[test]
    fn checksum_matches_apache_hudi() {
        assert_eq!(checksum("default", "v6_trips_8i1u"), 3843273058);
        assert_eq!(checksum("", "v8_trips_8i3u1d_metadata"), 380169000);
    }

    #[test]
    fn written_properties_parse_back() {
        let cfg = TableConfig::new(&opts()).unwrap();
        let back = TableConfig::parse(&cfg.to_properties()).unwrap();
        assert_eq!(back, cfg);
        assert_eq!(back.key_generator, KeyGenerator::Simple);
        assert_eq!(back.merge_mode, MergeMode::EventTime);
        assert_eq!(back.raw[keys::CHECKSUM], checksum("default", "trips").to_string());
    }

    #[test]
    fn key_generator_follows_the_fields() {
        let mut o = opts();
        o.record_key_fields = vec!["id".into(), "name".into()];
        assert_eq!(TableConfig::new(&o).unwrap().key_generator, KeyGenerator::Complex);
        o.partition_fields.clear();
        let cfg = TableConfig::new(&o).unwrap();
        assert_eq!(cfg.key_generator, KeyGenerator::NonPartitioned);
        assert!(cfg.complex_keys());
    }

    #[test]
    fn invalid_files_are_typed_errors() {
        assert!(matches!(TableConfig::parse("hoodie.table.name=t\n"), Err(Error::CorruptTable { .. })));
        let v7 = "hoodie.table.name=t\nhoodie.table.type=COPY_ON_WRITE\nhoodie.table.version=7\n";
        assert!(matches!(TableConfig::parse(v7), Err(Error::Unsupported { .. })));
        let garbage = "hoodie.table.name=t\nhoodie.table.type=SIDEWAYS\nhoodie.table.version=6\n";
        assert!(matches!(TableConfig::parse(garbage), Err(Error::CorruptTable { .. })));
        let layout =
            "hoodie.table.name=t\nhoodie.table.type=cow\nhoodie.table.version=8\nhoodie.timeline.layout.version=1\n";
        assert!(matches!(TableConfig::parse(layout), Err(Error::CorruptTable { .. })));
    }

    #[test]
    fn payload_class_decides_merge_mode_before_v9() {
        let text = "hoodie.table.name=t\nhoodie.table.type=MERGE_ON_READ\nhoodie.table.version=6\n\
                    hoodie.table.precombine.field=ts\n\
                    hoodie.compaction.payload.class=org.apache.hudi.common.model.OverwriteWithLatestAvroPayload\n";
        assert_eq!(TableConfig::parse(text).unwrap().merge_mode, MergeMode::CommitTime);
    }

    #[test]
    fn names_are_checked() {
        let mut o = opts();
        o.name = "a=b".into();
        assert!(matches!(TableConfig::new(&o), Err(Error::InvalidArgument { .. })));
    }
}

#[cfg(test)]
mod fixture_tests {
    use super::*;
    use crate::test_support::shared_dir;

    fn props(name: &str) -> Result<TableConfig> {
        let path = shared_dir().join("compat/hudi/unit").join(name).join(".hoodie/hoodie.properties");
        TableConfig::parse(&std::fs::read_to_string(path).expect("fixture"))
    }

    #[test]
    #[cfg_attr(
        not(hudi_corpus),
        ignore = "needs the Apache Hudi corpus: set OXLAKE_SHARED to the folder holding compat/"
    )]
    fn the_unit_property_fixtures_of_apache_hudi() {
        let valid = props("table_props_valid").unwrap();
        assert_eq!((valid.name.as_str(), valid.table_type, valid.version), ("trips", TableType::CopyOnWrite, 6));
        assert_eq!(
            (valid.record_key_fields.as_slice(), valid.partition_fields.as_slice()),
            (&["uuid".to_string()][..], &["city".to_string()][..])
        );
        assert_eq!(valid.ordering_field.as_deref(), Some("ts"));
        assert_eq!(valid.key_generator, KeyGenerator::Simple);
        assert!(!valid.hive_style && !valid.url_encode && valid.populate_meta_fields);
        assert!(!valid.timezone_utc, "hoodie.table.timeline.timezone=local");
        // Keys oxlake does not interpret are kept as they are.
        assert_eq!(valid.raw.get("hoodie.table.metadata.partitions").map(String::as_str), Some("files"));

        // No table type: refused with a typed error naming the key.
        match props("table_props_partial") {
            Err(Error::CorruptTable { detail, .. }) => assert!(detail.contains(keys::TYPE), "{detail}"),
            other => panic!("expected a corrupt-table error, got {other:?}"),
        }

        let empty = props("table_props_no_create_schema").unwrap();
        assert_eq!((empty.name.as_str(), empty.key_generator.clone()), ("v6_empty", KeyGenerator::NonPartitioned));
        assert!(empty.partition_fields.is_empty() && empty.ordering_field.is_none());
    }
}
