//! Explicit schema changes (`Table::alter_schema`): renames, drops, moves, added columns and
//! widened types, committed as Apache Hudi's `ALTER_SCHEMA` commit with the column ids
//! ([`crate::schema::internal`]), so that every file keeps being read by column id.

use crate::commit::Transaction;
use crate::error::{Error, Result};
use crate::format::commit::CommitMetadata;
use crate::format::instant::{Action, Instant};
use crate::schema::internal::{self, InternalSchema, SchemaChange};
use crate::table::{SCHEMA_EVOLVED_KEY, Table};

impl Table {
    /// Applies `changes` in order and commits them as one schema version (`None`: they change
    /// nothing). Refused, with the table unchanged: a change [`internal::apply`] refuses, and any
    /// change while a compaction or clustering is pending (its files are named by its earlier
    /// instant, whose schema version they would not match: run or roll it back first).
    pub async fn alter_schema(&mut self, changes: &[SchemaChange]) -> Result<Option<Instant>> {
        self.reload().await?;
        if let Some(service) =
            self.timeline().pending().find(|i| matches!(i.action, Action::Compaction | Action::Clustering))
        {
            return Err(Error::CommitConflict {
                instant: service.time.clone(),
                detail: format!(
                    "a {} is pending at {}: complete it (or roll it back) before changing the schema",
                    service.action.name(),
                    service.time
                ),
            });
        }
        let data = self.data_schema();
        let ids = match self.column_history() {
            Some(history) => history.latest().clone(),
            None => InternalSchema::from_arrow(&crate::schema::with_meta_fields(&data), 0)?,
        };
        let cfg = self.config();
        let fixed: Vec<String> =
            cfg.record_key_fields.iter().chain(&cfg.partition_fields).chain(&cfg.ordering_field).cloned().collect();
        let (new_data, new_ids) = internal::apply(&data, &ids, changes, &fixed)?;
        if new_data == data && new_ids.fields == ids.fields {
            return Ok(None);
        }
        let properties = [(SCHEMA_EVOLVED_KEY, Some("true")), (internal::SCHEMA_ON_READ_KEY, Some("true"))];
        if [SCHEMA_EVOLVED_KEY, internal::SCHEMA_ON_READ_KEY].iter().any(|k| !self.config().raw.contains_key(*k)) {
            self.set_properties(&properties).await?;
        }
        let action = match self.config().table_type {
            crate::config::TableType::MergeOnRead => Action::DeltaCommit,
            crate::config::TableType::CopyOnWrite => Action::Commit,
        };
        let tx = Transaction::begin(self, action).await?;
        let metadata = match alter_metadata(self, tx.time(), &new_data, new_ids) {
            Ok(m) => m,
            Err(e) => return Err(tx.fail(self, e).await),
        };
        let instant = tx.commit(self, &metadata).await?;
        self.reload().await?;
        Ok(Some(instant))
    }
}

/// The commit metadata of a schema change at `time`: no files, the new schema and ids.
fn alter_metadata(
    table: &Table,
    time: &str,
    data: &arrow::datatypes::Schema,
    ids: InternalSchema,
) -> Result<CommitMetadata> {
    let mut metadata = CommitMetadata { operation_type: Some("ALTER_SCHEMA".into()), ..Default::default() };
    metadata.set_schema(data, &table.config().name)?;
    metadata.extra_metadata.insert(internal::LATEST_SCHEMA_KEY.into(), ids.at_version(time)?.to_json());
    Ok(metadata)
}
