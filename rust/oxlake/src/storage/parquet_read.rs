//! Reading Parquet files safely: decoder panics become errors naming the file.

use std::panic::AssertUnwindSafe;

use futures::FutureExt;

use crate::error::{Error, Result};

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
