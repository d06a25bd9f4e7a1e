//! The record keys of stored rows. A table with meta fields keeps each row's key in
//! `_hoodie_record_key`; a table without them (Apache Hudi's virtual keys,
//! `hoodie.populate.meta.fields=false`) leaves that column null, and every reader makes the key
//! again from the record key fields with the table's key generator, as Apache Hudi's readers do.
//! Whatever reads stored keys (routing a write, reconciling tasks, conflict checks, the indexes)
//! goes through [`StoredKeys`]: a key read from a virtual-key table's meta column would be no key
//! at all, and the write would put a second copy of the record beside the first.

use std::sync::Arc;

use arrow::array::{Array, RecordBatch, StringArray};
use arrow::datatypes::{DataType, Field, FieldRef, Schema, SchemaRef};
use futures::StreamExt;
use parquet::arrow::ProjectionMask;
use parquet::arrow::async_reader::ParquetRecordBatchStreamBuilder;

use super::KeySpec;
use crate::config::TableConfig;
use crate::error::{Error, Result};
use crate::schema::RECORD_KEY;
use crate::storage::{ParquetFile, Storage};

/// Where the record keys of a table's stored rows come from.
#[derive(Clone, Debug)]
pub enum StoredKeys {
    /// The `_hoodie_record_key` meta column.
    Meta,
    /// Made from the record key fields.
    Virtual {
        /// The table's key generator.
        spec: Arc<KeySpec>,
        /// The record key fields, typed as in the table schema.
        fields: Vec<FieldRef>,
    },
}

impl StoredKeys {
    /// How the rows of a table with configuration `cfg` and data schema `data` are keyed.
    pub fn of(cfg: &TableConfig, data: &Schema) -> Result<Self> {
        if cfg.populate_meta_fields {
            return Ok(StoredKeys::Meta);
        }
        cfg.check_record_key_fields()?;
        let fields = cfg
            .record_key_fields
            .iter()
            .map(|name| {
                data.field_with_name(name)
                    .map(|f| Arc::new(f.clone()))
                    .map_err(|_| Error::invalid_data(format!("record key field `{name}` is not a column of the table")))
            })
            .collect::<Result<_>>()?;
        Ok(StoredKeys::Virtual { spec: Arc::new(KeySpec::from_config(cfg)), fields })
    }

    /// Whether keys are made from the record key fields (the meta columns are null).
    pub fn is_virtual(&self) -> bool {
        matches!(self, StoredKeys::Virtual { .. })
    }

    /// The columns a key is made from.
    pub fn columns(&self) -> Vec<&str> {
        match self {
            StoredKeys::Meta => vec![RECORD_KEY],
            StoredKeys::Virtual { fields, .. } => fields.iter().map(|f| f.name().as_str()).collect(),
        }
    }

    /// [`Self::columns`] as a schema (what a decoder of records reads for their keys).
    pub fn schema(&self) -> SchemaRef {
        match self {
            StoredKeys::Meta => Arc::new(Schema::new(vec![Field::new(RECORD_KEY, DataType::Utf8, true)])),
            StoredKeys::Virtual { fields, .. } => Arc::new(Schema::new(fields.clone())),
        }
    }

    /// The key of every row of `batch`, which holds [`Self::columns`] by name. A meta column may
    /// hold nulls (rows without a key are no record); a virtual key field may not (an error, as
    /// for writes).
    pub fn keys(&self, batch: &RecordBatch) -> Result<StringArray> {
        match self {
            StoredKeys::Meta => {
                let col = batch
                    .column_by_name(RECORD_KEY)
                    .ok_or_else(|| Error::invalid_data(format!("the meta column `{RECORD_KEY}` is missing")))?;
                let text = arrow::compute::cast(col, &DataType::Utf8)?;
                text.as_any()
                    .downcast_ref::<StringArray>()
                    .cloned()
                    .ok_or_else(|| Error::invalid_data(format!("`{RECORD_KEY}` is not a string column")))
            }
            StoredKeys::Virtual { spec, .. } => spec.record_keys(batch),
        }
    }

    /// [`Self::keys`] of a batch read from the file at `path`: a row without a key there is a
    /// damaged file, named.
    pub fn keys_in(&self, batch: &RecordBatch, path: &str) -> Result<StringArray> {
        self.keys(batch).map_err(|e| match e {
            Error::InvalidData { .. } => Error::corrupt(path, e),
            other => other.in_file(path),
        })
    }

    /// Every record key of a base file, reading only the columns keys are made from.
    pub async fn of_base_file(&self, storage: &Storage, path: &str, size: u64) -> Result<StringArray> {
        let read = crate::storage::decoding(path, self.of_base_file_inner(storage, path, size)).await;
        read.map_err(|e| e.in_file(path))
    }

    async fn of_base_file_inner(&self, storage: &Storage, path: &str, size: u64) -> Result<StringArray> {
        let mut parts = Vec::new();
        let mut stream = self.base_file_batches(storage, path, size).await?;
        while let Some(batch) = stream.next().await {
            parts.push(self.keys_in(&batch?, path)?);
        }
        let refs: Vec<&dyn Array> = parts.iter().map(|a| a as &dyn Array).collect();
        match refs.is_empty() {
            true => Ok(StringArray::from(Vec::<&str>::new())),
            false => arrow::compute::concat(&refs)?
                .as_any()
                .downcast_ref::<StringArray>()
                .cloned()
                .ok_or_else(|| Error::corrupt(path, "record keys are not strings")),
        }
    }

    /// The batches of a base file projected to [`Self::columns`], for [`Self::keys`].
    pub async fn base_file_batches(
        &self,
        storage: &Storage,
        path: &str,
        size: u64,
    ) -> Result<parquet::arrow::async_reader::ParquetRecordBatchStream<ParquetFile>> {
        let builder = ParquetRecordBatchStreamBuilder::new(ParquetFile::open(storage, path, size)).await?;
        let names = self.columns();
        if let Some(missing) = names.iter().find(|n| builder.schema().index_of(n).is_err()) {
            return Err(Error::corrupt(
                path,
                format!("the base file has no column `{missing}` to read record keys from"),
            ));
        }
        let mask = ProjectionMask::columns(builder.parquet_schema(), names);
        Ok(builder.with_projection(mask).build()?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(populate: bool, fields: &str) -> TableConfig {
        let keygen = if fields.contains(',') { "COMPLEX" } else { "SIMPLE" };
        let text = format!(
            "hoodie.table.name=t\nhoodie.table.type=COPY_ON_WRITE\nhoodie.table.version=8\n\
             hoodie.table.keygenerator.type={keygen}\nhoodie.table.recordkey.fields={fields}\n\
             hoodie.populate.meta.fields={populate}\n"
        );
        TableConfig::parse(&text).expect("config")
    }

    fn data() -> Schema {
        Schema::new(vec![Field::new("id", DataType::Int64, false), Field::new("name", DataType::Utf8, true)])
    }

    #[test]
    fn virtual_keys_are_made_from_the_key_fields_as_writes_make_them() {
        let batch = RecordBatch::try_new(
            Arc::new(data()),
            vec![
                Arc::new(arrow::array::Int64Array::from(vec![7, 8])),
                Arc::new(StringArray::from(vec![Some("a"), None])),
            ],
        )
        .unwrap();
        let simple = StoredKeys::of(&config(false, "id"), &data()).unwrap();
        assert!(simple.is_virtual());
        assert_eq!(simple.columns(), vec!["id"]);
        assert_eq!(simple.keys(&batch).unwrap(), StringArray::from(vec!["7", "8"]));
        let complex = StoredKeys::of(&config(false, "id,name"), &data()).unwrap();
        assert_eq!(complex.keys(&batch).unwrap(), StringArray::from(vec!["id:7,name:a", "id:8,name:__null__"]));
        assert!(StoredKeys::of(&config(false, "nope"), &data()).is_err());
        let meta = StoredKeys::of(&config(true, "id"), &data()).unwrap();
        assert_eq!(meta.columns(), vec![RECORD_KEY]);
        assert!(meta.keys(&batch).is_err(), "a batch without the meta column has no keys");
    }
}
