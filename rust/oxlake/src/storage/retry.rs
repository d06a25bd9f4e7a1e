//! Retries of transient store failures, below everything that reads or writes a table (the
//! timeline, the writers, DataFusion's scans): a generic error (I/O, network, an injected fault) is
//! retried with exponential backoff a bounded number of times; an error that says something about
//! the object (absent, present, changed, refused) is final.
//!
//! A conditional create whose earlier attempt failed may have taken effect anyway (the answer was
//! lost, not the request). When the retry then finds the object present, the store is read back:
//! the same non-empty content means the first attempt won. Empty content proves nothing (another
//! writer's claim looks the same), so it counts as lost: the caller takes another instant time, and
//! the orphaned claim is rolled back as a crashed write.

use std::fmt;
use std::future::Future;
use std::ops::Range;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use futures::stream::BoxStream;
use futures::{StreamExt, TryStreamExt};
use object_store::path::Path;
use object_store::{
    CopyOptions, GetOptions, GetResult, ListResult, MultipartUpload, ObjectMeta, ObjectStore, ObjectStoreExt, PutMode,
    PutMultipartOptions, PutOptions, PutPayload, PutResult, RenameOptions,
};

/// How many times a transient failure is retried, and the first pause (doubled each time).
const RETRIES: u32 = 4;
const FIRST_BACKOFF: Duration = Duration::from_millis(50);

/// A store that retries the transient failures of the store it wraps.
#[derive(Debug)]
pub struct RetryStore {
    inner: Arc<dyn ObjectStore>,
}

impl RetryStore {
    pub fn new(inner: Arc<dyn ObjectStore>) -> Self {
        RetryStore { inner }
    }
}

impl fmt::Display for RetryStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "RetryStore({})", self.inner)
    }
}

/// Errors that say something about the object (absent, present, changed, not allowed) are final;
/// anything generic (I/O, network) may pass.
pub(crate) fn is_transient(e: &object_store::Error) -> bool {
    use object_store::Error as E;
    !matches!(
        e,
        E::NotFound { .. }
            | E::AlreadyExists { .. }
            | E::Precondition { .. }
            | E::NotModified { .. }
            | E::NotImplemented { .. }
            | E::NotSupported { .. }
            | E::InvalidPath { .. }
            | E::PermissionDenied { .. }
            | E::Unauthenticated { .. }
            | E::UnknownConfigurationKey { .. }
    )
}

/// Runs `op` until it succeeds, fails finally, or the retries are spent. Also says whether an
/// attempt failed transiently before the outcome.
async fn retry<T, F, Fut>(what: &Path, mut op: F) -> (object_store::Result<T>, bool)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = object_store::Result<T>>,
{
    let mut pause = super::faults::backoff().unwrap_or(FIRST_BACKOFF);
    let mut attempt = 0;
    loop {
        match op().await {
            Err(e) if attempt < RETRIES && is_transient(&e) => {
                log::warn!("retrying {what} after a transient storage error: {e}");
                tokio::time::sleep(pause).await;
                pause *= 2;
                attempt += 1;
            }
            outcome => return (outcome, attempt > 0),
        }
    }
}

#[async_trait]
impl ObjectStore for RetryStore {
    async fn put_opts(
        &self,
        location: &Path,
        payload: PutPayload,
        opts: PutOptions,
    ) -> object_store::Result<PutResult> {
        let create = matches!(opts.mode, PutMode::Create);
        let (outcome, retried) = retry(location, || self.inner.put_opts(location, payload.clone(), opts.clone())).await;
        match outcome {
            Err(object_store::Error::AlreadyExists { .. } | object_store::Error::Precondition { .. })
                if create && retried && payload.content_length() > 0 =>
            {
                // Did the attempt whose answer was lost create it?
                let (existing, _) = retry(location, || async { self.inner.get(location).await?.bytes().await }).await;
                let ours: Vec<u8> = payload.iter().flat_map(|b| b.iter().copied()).collect();
                match existing {
                    Ok(bytes) if bytes.as_ref() == ours.as_slice() => Ok(PutResult { e_tag: None, version: None }),
                    _ => outcome,
                }
            }
            other => other,
        }
    }

    async fn put_multipart_opts(
        &self,
        location: &Path,
        opts: PutMultipartOptions,
    ) -> object_store::Result<Box<dyn MultipartUpload>> {
        retry(location, || self.inner.put_multipart_opts(location, opts.clone())).await.0
    }

    async fn get_opts(&self, location: &Path, options: GetOptions) -> object_store::Result<GetResult> {
        retry(location, || self.inner.get_opts(location, options.clone())).await.0
    }

    async fn get_ranges(&self, location: &Path, ranges: &[Range<u64>]) -> object_store::Result<Vec<Bytes>> {
        retry(location, || self.inner.get_ranges(location, ranges)).await.0
    }

    fn delete_stream(
        &self,
        locations: BoxStream<'static, object_store::Result<Path>>,
    ) -> BoxStream<'static, object_store::Result<Path>> {
        let inner = self.inner.clone();
        locations
            .and_then(move |location| {
                let inner = inner.clone();
                async move {
                    let (outcome, _) = retry(&location, || async {
                        let one = futures::stream::once(futures::future::ready(Ok(location.clone()))).boxed();
                        inner.delete_stream(one).try_collect::<Vec<_>>().await
                    })
                    .await;
                    outcome.map(|_| location)
                }
            })
            .boxed()
    }

    fn list(&self, prefix: Option<&Path>) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
        // A listing that fails part way is started again: collected, then handed out.
        let inner = self.inner.clone();
        let prefix = prefix.cloned();
        futures::stream::once(async move {
            let at = prefix.clone().unwrap_or_default();
            let (outcome, _) = retry(&at, || inner.list(prefix.as_ref()).try_collect::<Vec<_>>()).await;
            outcome.map(|all| futures::stream::iter(all.into_iter().map(Ok)))
        })
        .try_flatten()
        .boxed()
    }

    fn list_with_offset(
        &self,
        prefix: Option<&Path>,
        offset: &Path,
    ) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
        let inner = self.inner.clone();
        let (prefix, offset) = (prefix.cloned(), offset.clone());
        futures::stream::once(async move {
            let at = prefix.clone().unwrap_or_default();
            let (outcome, _) =
                retry(&at, || inner.list_with_offset(prefix.as_ref(), &offset).try_collect::<Vec<_>>()).await;
            outcome.map(|all| futures::stream::iter(all.into_iter().map(Ok)))
        })
        .try_flatten()
        .boxed()
    }

    async fn list_with_delimiter(&self, prefix: Option<&Path>) -> object_store::Result<ListResult> {
        let at = prefix.cloned().unwrap_or_default();
        retry(&at, || self.inner.list_with_delimiter(prefix)).await.0
    }

    async fn copy_opts(&self, from: &Path, to: &Path, options: CopyOptions) -> object_store::Result<()> {
        retry(to, || self.inner.copy_opts(from, to, options.clone())).await.0
    }

    async fn rename_opts(&self, from: &Path, to: &Path, options: RenameOptions) -> object_store::Result<()> {
        retry(to, || self.inner.rename_opts(from, to, options.clone())).await.0
    }
}
