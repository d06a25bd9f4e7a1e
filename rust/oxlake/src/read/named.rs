//! Naming the file behind a failed scan. DataFusion's Parquet scan reports a damaged base file
//! (a bad footer, a page that does not decompress) without saying which file it read; when a scan
//! fails so, the base files it read are checked one by one and the first that fails names the
//! error. This runs on the failure path only.
//!
//! Panics: the Parquet decoders assert on some damaged footers (a metadata length past the start
//! of the file) instead of returning an error. A panic while the scan is polled is caught here and
//! named like any other decoding failure: a damaged file must never abort the process.

use std::panic::AssertUnwindSafe;

use futures::{Stream, StreamExt, TryStreamExt};
use parquet::arrow::ParquetRecordBatchStreamBuilder;

use crate::error::{Error, Result};
use crate::storage::{ParquetFile, Storage, decoding, panic_message};

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
    // After a panic the stream ends: its state is not to be trusted any more.
    AssertUnwindSafe(stream).catch_unwind().then(move |r| {
        let (storage, files) = (storage.clone(), files.clone());
        async move {
            let err = match r {
                Ok(Ok(b)) => return Ok(b),
                Ok(Err(e)) => Error::from(e),
                Err(panic) => Error::Parquet(parquet::errors::ParquetError::General(format!(
                    "the decoder failed: {}",
                    panic_message(panic.as_ref())
                ))),
            };
            Err(name_failure(&storage, &files, err).await.into())
        }
    })
}

/// The error of a failed scan of `files`, naming the file it concerns where it did not.
pub async fn name_failure(storage: &Storage, files: &[(String, u64)], err: Error) -> Error {
    if !matches!(err, Error::Parquet(_) | Error::Arrow(_)) && !err.is_unnamed_storage() {
        return err;
    }
    // Footers first (cheap), then the data, within the budget.
    for (path, size) in files {
        let footer = async { Ok(ParquetRecordBatchStreamBuilder::new(ParquetFile::open(storage, path, *size)).await?) };
        if let Err(e) = decoding(path, footer).await {
            return e.in_file(path);
        }
    }
    let mut spent = 0u64;
    for (path, size) in files {
        spent += size;
        if spent > DECODE_BUDGET {
            break;
        }
        if let Err(e) = decoding(path, decode(storage, path, *size)).await {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_decoder_panic_is_an_error_naming_the_file() {
        // As the Parquet footer decoder does on a metadata length past the start of the file.
        let failing = async { panic!("range start must not be greater than end: 18446744073703651030 <= 0") };
        let err = decoding::<()>("p=1/f.parquet", failing).await.unwrap_err();
        assert!(
            matches!(&err, Error::CorruptTable { path, detail } if path == "p=1/f.parquet" && detail.contains("range start")),
            "{err}"
        );
        assert_eq!(decoding("f.parquet", async { Ok(7) }).await.unwrap(), 7);
    }

    #[tokio::test]
    async fn a_stream_that_panics_ends_with_the_error_of_the_damaged_file() {
        let s = Storage::in_memory("t").unwrap();
        s.put("good.parquet", bytes::Bytes::from_static(b"PAR1")).await.unwrap();
        let stream = futures::stream::poll_fn(|_| -> std::task::Poll<Option<datafusion::error::Result<_>>> {
            panic!("a decoder assertion")
        });
        let named = name_failures(stream, s, vec![("good.parquet".into(), 4)]);
        let got: Vec<_> = named.collect().await;
        assert_eq!(got.len(), 1, "the stream ends after the panic");
        let err = Error::from(got.into_iter().next().unwrap().unwrap_err());
        assert!(matches!(&err, Error::CorruptTable { path, .. } if path == "good.parquet"), "{err}");
    }
}
