//! The table: its storage, configuration, timeline and schema, the entry object of every
//! operation (`Table::scan`, `Table::write`, `Table::rollback_failed`).

pub mod fs_view;

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use arrow::datatypes::{DataType, SchemaRef};
use bytes::Bytes;
use parquet::arrow::async_reader::ParquetRecordBatchStreamBuilder;

use crate::config::{CreateOptions, PROPERTIES_FILE, TableConfig, keys};
use crate::error::{Error, Result};
use crate::format::instant::Action;
use crate::schema;
use crate::storage::{ParquetFile, Storage};
use crate::timeline::Timeline;
use fs_view::{FileGroupId, FileSystemView};

/// oxlake's own property holding the exact Arrow schema of the data (base64 Arrow IPC).
pub const ARROW_SCHEMA_KEY: &str = "oxlake.table.arrow.schema";

/// How a process works with a table; nothing here is stored in the table.
#[derive(Clone, Debug)]
pub struct TableOptions {
    /// Object-store options (S3 endpoint, credentials...).
    pub storage_options: HashMap<String, String>,
    /// How often a writer refreshes its heartbeat. A pending instant whose heartbeat is older than
    /// three intervals belongs to a crashed writer and is rolled back by the next one.
    pub heartbeat_interval: Duration,
}

impl Default for TableOptions {
    fn default() -> Self {
        TableOptions { storage_options: HashMap::new(), heartbeat_interval: Duration::from_secs(10) }
    }
}

/// An open table at the state of its last (re)load.
#[derive(Clone, Debug)]
pub struct Table {
    storage: Storage,
    config: TableConfig,
    timeline: Timeline,
    data_schema: SchemaRef,
    options: TableOptions,
}

impl Table {
    /// Opens an existing table.
    pub async fn open(uri: &str, options: TableOptions) -> Result<Self> {
        let storage = Storage::open(uri, &options.storage_options)?;
        let text = match storage.get_opt(PROPERTIES_FILE).await? {
            Some(b) => b,
            None => {
                return Err(Error::TableNotFound {
                    uri: storage.uri().to_string(),
                    reason: format!("no {PROPERTIES_FILE}"),
                });
            }
        };
        let text = std::str::from_utf8(&text).map_err(|e| Error::corrupt(PROPERTIES_FILE, e))?;
        let config = TableConfig::parse(text)?;
        let timeline = Timeline::load(&storage, &config).await?;
        let data_schema = resolve_schema(&storage, &config, &timeline).await?;
        Ok(Table { storage, config, timeline, data_schema, options })
    }

    /// Creates a table with the given data schema (no meta fields) and returns it open.
    pub async fn create(
        uri: &str,
        options: TableOptions,
        create: CreateOptions,
        data_schema: SchemaRef,
    ) -> Result<Self> {
        let storage = Storage::open(uri, &options.storage_options)?;
        let data_schema = schema::normalize(&data_schema)?;
        check_fields(&create, &data_schema)?;
        let mut config = TableConfig::new_v6(&create)?;
        config.raw.insert(ARROW_SCHEMA_KEY.into(), schema::encode_arrow_schema(&data_schema));
        config.raw.insert(keys::CREATE_SCHEMA.into(), schema::to_avro(&data_schema, &config.name)?);
        if storage.head(PROPERTIES_FILE).await?.is_some() {
            return Err(Error::TableExists { uri: storage.uri().to_string() });
        }
        if !storage.put_if_absent(PROPERTIES_FILE, Bytes::from(config.to_properties())).await? {
            return Err(Error::TableExists { uri: storage.uri().to_string() });
        }
        let timeline = Timeline::from_file_names([], config.timeline_dir(), config.layout_version);
        Ok(Table { storage, config, timeline, data_schema, options })
    }

    /// Reloads the timeline (and the schema, which may have changed with it).
    pub async fn reload(&mut self) -> Result<()> {
        self.timeline = Timeline::load(&self.storage, &self.config).await?;
        self.data_schema = resolve_schema(&self.storage, &self.config, &self.timeline).await?;
        Ok(())
    }

    pub fn storage(&self) -> &Storage {
        &self.storage
    }

    pub fn config(&self) -> &TableConfig {
        &self.config
    }

    pub fn timeline(&self) -> &Timeline {
        &self.timeline
    }

    pub fn options(&self) -> &TableOptions {
        &self.options
    }

    /// The table URI.
    pub fn uri(&self) -> &str {
        self.storage.uri()
    }

    /// The data columns (no meta fields).
    pub fn data_schema(&self) -> SchemaRef {
        self.data_schema.clone()
    }

    /// The schema of the base files and of reads: meta fields, then the data columns.
    pub fn schema(&self) -> SchemaRef {
        schema::with_meta_fields(&self.data_schema)
    }

    /// The committed file groups, from one listing.
    pub async fn file_system_view(&self) -> Result<FileSystemView> {
        FileSystemView::load(&self.storage, &self.timeline, self.config.is_partitioned()).await
    }

    /// File groups replaced by completed replacecommits up to `as_of`.
    pub async fn replaced_file_groups(&self, as_of: &str) -> Result<HashSet<FileGroupId>> {
        let mut out = HashSet::new();
        for instant in self.timeline.completed_of(Action::ReplaceCommit).filter(|i| i.time.as_str() <= as_of) {
            let meta = self.timeline.commit_metadata(&self.storage, instant).await?;
            out.extend(meta.replaced_file_groups().map(|(p, f)| (p.to_string(), f.to_string())));
        }
        Ok(out)
    }
}

/// Key, partition and ordering fields must exist; keys and partitions must have a textual form.
fn check_fields(create: &CreateOptions, schema: &SchemaRef) -> Result<()> {
    let all = create.record_key_fields.iter().map(|f| ("record_key", f));
    let all = all.chain(create.partition_fields.iter().map(|f| ("partition_by", f)));
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
    Ok(())
}

/// The data schema: oxlake's exact copy when present, else the Arrow schema of a base file written
/// by the latest commit that wrote one (tables written by Apache Hudi).
async fn resolve_schema(storage: &Storage, config: &TableConfig, timeline: &Timeline) -> Result<SchemaRef> {
    if let Some(text) = config.raw.get(ARROW_SCHEMA_KEY) {
        return schema::decode_arrow_schema(text);
    }
    for instant in timeline.completed_data().collect::<Vec<_>>().into_iter().rev() {
        let meta = timeline.commit_metadata(storage, instant).await?;
        let base = meta.write_stats().find_map(|(_, s)| s.path.clone().filter(|p| p.ends_with(".parquet")));
        if let Some(path) = base {
            let Some(head) = storage.head(&path).await? else { continue };
            let reader = ParquetFile::open(storage, &path, head.size);
            let builder = ParquetRecordBatchStreamBuilder::new(reader).await?;
            return schema::normalize(&schema::without_meta_fields(builder.schema()));
        }
    }
    match config.raw.get(keys::CREATE_SCHEMA) {
        Some(avro) => schema::normalize(schema::from_avro(avro)?.as_ref()),
        None => Err(Error::unsupported(format!("{}: no schema (no data file and no create schema)", storage.uri()))),
    }
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
