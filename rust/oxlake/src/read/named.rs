//! Naming the file behind a failed scan. DataFusion's Parquet scan reports a damaged base file
//! (a bad footer, a page that does not decompress) without saying which file it read; when a scan
//! fails so, the base files it read are checked one by one and the first that fails names the
//! error. This runs on the failure path only.

use futures::{Stream, StreamExt, TryStreamExt};
use parquet::arrow::ParquetRecordBatchStreamBuilder;

use crate::error::{Error, Result};
use crate::storage::{ParquetFile, Storage};

/// Bytes of base files decoded again to find a damaged one; past this the error is returned as
/// it came, with the number of files it may concern.
const DECODE_BUDGET: u64 = 1 << 30;

/// `stream`, whose errors that do not name a file are named after the base file that fails.
pub fn name_failures<S>(
    stream: S,
    storage: Storage,
    files: Vec<(String, u64)>,
) -> impl Stream<Item = datafusion::error::Result<arrow::array::RecordBatch>>
where
    S: Stream<Item = datafusion::error::Result<arrow::array::RecordBatch>>,
{
    stream.then(move |r| {
        let (storage, files) = (storage.clone(), files.clone());
        async move {
            match r {
                Ok(b) => Ok(b),
                Err(e) => Err(name_failure(&storage, &files, Error::from(e)).await.into()),
            }
        }
    })
}

/// The error of a failed scan of `files`, naming the file it concerns where it did not.
pub async fn name_failure(storage: &Storage, files: &[(String, u64)], err: Error) -> Error {
    if !matches!(err, Error::Parquet(_) | Error::Arrow(_)) {
        return err;
    }
    // Footers first (cheap), then the data, within the budget.
    for (path, size) in files {
        if let Err(e) = ParquetRecordBatchStreamBuilder::new(ParquetFile::open(storage, path, *size)).await {
            return Error::from(e).in_file(path);
        }
    }
    let mut spent = 0u64;
    for (path, size) in files {
        spent += size;
        if spent > DECODE_BUDGET {
            break;
        }
        if let Err(e) = decode(storage, path, *size).await {
            return e.in_file(path);
        }
    }
    match err {
        Error::Parquet(e) => Error::corrupt(format!("one of {} base files", files.len()), e),
        other => other,
    }
}

async fn decode(storage: &Storage, path: &str, size: u64) -> Result<()> {
    let stream = ParquetRecordBatchStreamBuilder::new(ParquetFile::open(storage, path, size)).await?.build()?;
    stream.map_err(Error::from).try_for_each(|_| async { Ok(()) }).await
}
