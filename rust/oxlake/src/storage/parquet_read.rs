//! Reading Parquet files safely: decoder panics become errors naming the file, and the record
//! keys of a base file read alone (conflict checks, the metadata table, key lookups).

use std::panic::AssertUnwindSafe;
use std::sync::Arc;

use arrow::array::{Array, StringArray};
use futures::{FutureExt, StreamExt};
use parquet::arrow::ProjectionMask;
use parquet::arrow::async_reader::ParquetRecordBatchStreamBuilder;

use super::{ParquetFile, Storage};
use crate::error::{Error, Result};
use crate::schema::RECORD_KEY;

/// The message of a caught panic.
pub(crate) fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    match (payload.downcast_ref::<&str>(), payload.downcast_ref::<String>()) {
        (Some(s), _) => (*s).to_string(),
        (_, Some(s)) => s.clone(),
        _ => "a panic without a message".to_string(),
    }
}

/// `fut`'s result, or a [`Error::CorruptTable`] naming `path` if a decoder panicked inside it.
/// The Parquet decoders assert on some damaged footers instead of returning an error: a damaged
/// file must never abort the process.
pub(crate) async fn decoding<T>(path: &str, fut: impl std::future::Future<Output = Result<T>>) -> Result<T> {
    match AssertUnwindSafe(fut).catch_unwind().await {
        Ok(r) => r,
        Err(panic) => {
            Err(Error::corrupt(path, format!("the Parquet decoder failed: {}", panic_message(panic.as_ref()))))
        }
    }
}

/// Every record key of a base file, reading only the key column.
pub(crate) async fn record_keys(storage: &Storage, path: &str, size: u64) -> Result<StringArray> {
    decoding(path, record_keys_of(storage, path, size)).await.map_err(|e| e.in_file(path))
}

async fn record_keys_of(storage: &Storage, path: &str, size: u64) -> Result<StringArray> {
    let reader = ParquetFile::open(storage, path, size);
    let builder = ParquetRecordBatchStreamBuilder::new(reader).await?;
    let mask = ProjectionMask::columns(builder.parquet_schema(), [RECORD_KEY]);
    let mut stream = builder.with_projection(mask).build()?;
    let mut parts = Vec::new();
    while let Some(batch) = stream.next().await {
        parts.push(arrow::compute::cast(batch?.column(0), &arrow::datatypes::DataType::Utf8)?);
    }
    let refs: Vec<&dyn Array> = parts.iter().map(|a| a.as_ref()).collect();
    let all = if refs.is_empty() {
        Arc::new(StringArray::from(Vec::<&str>::new())) as _
    } else {
        arrow::compute::concat(&refs)?
    };
    all.as_any()
        .downcast_ref::<StringArray>()
        .cloned()
        .ok_or_else(|| Error::corrupt(path, "record key column is not a string"))
}
