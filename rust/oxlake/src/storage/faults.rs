//! Injected storage faults and latency, for the tests and the benchmarks.
//!
//! Every store oxlake opens is wrapped in a [`FaultStore`]. It does nothing until a fault plan is
//! installed, process-wide: from the `OXLAKE_FAULTS` environment variable when the first store
//! opens, or by [`install`] (`oxlake.testing.inject_faults` in Python). A plan is a comma-separated
//! list of rules:
//!
//! - `<call>@<n>:<mode>` fails the `n`-th call of that kind (counted from the plan's installation),
//!   `<call>:<mode>` every call of that kind. Calls: `list`, `get`, `head`, `put`, `put_if_absent`
//!   (the conditional create of the commit protocol), `delete`, or `any`.
//!   Modes: `once` (that call fails before reaching the store; a retry succeeds), `always` (that
//!   call and every later one of its kind fail: a permanent outage), `lost` (the call takes effect
//!   but its answer is lost, as when a connection drops after the server acted).
//! - `latency=<ms>`: every call waits that long first (a remote store's round trip), and a
//!   listing waits again for each further page of [`LIST_PAGE`] entries (S3 lists in pages,
//!   each a request made after the one before).
//! - `backoff=<ms>`: the first pause of the retry layer above (tests shorten it).
//!
//! Injected failures are generic (transient) store errors, retried like network errors.

use std::fmt;
use std::ops::Range;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use futures::stream::BoxStream;
use futures::{StreamExt, TryStreamExt};
use object_store::path::Path;
use object_store::{
    CopyOptions, GetOptions, GetResult, ListResult, MultipartUpload, ObjectMeta, ObjectStore, PutMode,
    PutMultipartOptions, PutOptions, PutPayload, PutResult, RenameOptions,
};

use crate::error::{Error, Result};

/// The kinds of store calls a rule can name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Call {
    /// Listings.
    List,
    /// Reads of an object or of byte ranges.
    Get,
    /// Metadata reads (`head`).
    Head,
    /// Other writes: plain puts, multipart uploads, copies and renames.
    Put,
    /// Writes that fail if the object exists (`PutMode::Create`).
    PutIfAbsent,
    /// Deletes.
    Delete,
}

const CALLS: [Call; 6] = [Call::List, Call::Get, Call::Head, Call::Put, Call::PutIfAbsent, Call::Delete];

impl Call {
    fn name(self) -> &'static str {
        match self {
            Call::List => "list",
            Call::Get => "get",
            Call::Head => "head",
            Call::Put => "put",
            Call::PutIfAbsent => "put_if_absent",
            Call::Delete => "delete",
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    Once,
    Always,
    Lost,
}

#[derive(Clone, Debug, PartialEq, Eq)]
struct Rule {
    /// `None`: any kind.
    call: Option<Call>,
    /// `None`: every call.
    nth: Option<u64>,
    mode: Mode,
}

/// A parsed fault plan.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FaultPlan {
    rules: Vec<Rule>,
    latency: Duration,
    backoff: Option<Duration>,
}

impl FaultPlan {
    /// Parses the plan syntax of the module documentation.
    pub fn parse(spec: &str) -> Result<Self> {
        let bad = |rule: &str, why: &str| Error::invalid_arg("faults", format!("`{rule}`: {why}"));
        let mut plan = FaultPlan::default();
        for rule in spec.split(',').map(str::trim).filter(|r| !r.is_empty()) {
            if let Some((key, value)) = rule.split_once('=') {
                let ms: u64 = value.trim().trim_end_matches("ms").parse().map_err(|_| bad(rule, "not milliseconds"))?;
                match key.trim() {
                    "latency" => plan.latency = Duration::from_millis(ms),
                    "backoff" => plan.backoff = Some(Duration::from_millis(ms)),
                    _ => return Err(bad(rule, "unknown setting (latency, backoff)")),
                }
                continue;
            }
            let (target, mode) = rule.split_once(':').ok_or_else(|| bad(rule, "expected <call>[@<n>]:<mode>"))?;
            let mode = match mode.trim() {
                "once" => Mode::Once,
                "always" => Mode::Always,
                "lost" => Mode::Lost,
                _ => return Err(bad(rule, "mode must be once, always or lost")),
            };
            let (call, nth) = match target.split_once('@') {
                Some((call, n)) => {
                    let n: u64 = n.trim().parse().map_err(|_| bad(rule, "the call number is not a number"))?;
                    if n == 0 {
                        return Err(bad(rule, "calls are numbered from 1"));
                    }
                    (call.trim(), Some(n))
                }
                None => (target.trim(), None),
            };
            let call = match call {
                "any" => None,
                name => Some(
                    CALLS
                        .into_iter()
                        .find(|c| c.name() == name)
                        .ok_or_else(|| bad(rule, "unknown call (list, get, head, put, put_if_absent, delete, any)"))?,
                ),
            };
            plan.rules.push(Rule { call, nth, mode });
        }
        Ok(plan)
    }

    fn fault(&self, call: Call, nth: u64) -> Option<Mode> {
        self.rules.iter().find_map(|r| {
            let kind = r.call.is_none_or(|c| c == call);
            let hit = match (r.nth, r.mode) {
                (None, _) => true,
                (Some(n), Mode::Always) => nth >= n,
                (Some(n), _) => nth == n,
            };
            (kind && hit).then_some(r.mode)
        })
    }
}

/// The installed plan and its counters, shared by every store of the process.
struct State {
    active: AtomicBool,
    plan: Mutex<Arc<FaultPlan>>,
    calls: [AtomicU64; 6],
    any_calls: AtomicU64,
    injected: AtomicU64,
}

fn state() -> &'static State {
    static STATE: OnceLock<State> = OnceLock::new();
    STATE.get_or_init(|| {
        let plan = std::env::var("OXLAKE_FAULTS").ok().and_then(|spec| match FaultPlan::parse(&spec) {
            Ok(plan) => Some(plan),
            Err(e) => {
                log::error!("OXLAKE_FAULTS ignored: {e}");
                None
            }
        });
        State {
            active: AtomicBool::new(plan.is_some()),
            plan: Mutex::new(Arc::new(plan.unwrap_or_default())),
            calls: Default::default(),
            any_calls: AtomicU64::new(0),
            injected: AtomicU64::new(0),
        }
    })
}

/// Installs a fault plan for every store of this process (an empty spec removes it) and resets the
/// counters.
pub fn install(spec: &str) -> Result<()> {
    let plan = FaultPlan::parse(spec)?;
    let s = state();
    let active = plan != FaultPlan::default();
    if let Ok(mut current) = s.plan.lock() {
        *current = Arc::new(plan);
    }
    s.calls.iter().for_each(|c| c.store(0, Ordering::SeqCst));
    s.any_calls.store(0, Ordering::SeqCst);
    s.injected.store(0, Ordering::SeqCst);
    s.active.store(active, Ordering::SeqCst);
    Ok(())
}

/// What the installed plan has seen so far: calls per kind, and failures injected.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FaultCounts {
    /// Calls seen, by kind name.
    pub calls: Vec<(&'static str, u64)>,
    /// Failures injected.
    pub injected: u64,
}

/// The counters since the plan was installed.
pub fn counts() -> FaultCounts {
    let s = state();
    FaultCounts {
        calls: CALLS.iter().map(|c| (c.name(), s.calls[c.index()].load(Ordering::SeqCst))).collect(),
        injected: s.injected.load(Ordering::SeqCst),
    }
}

/// The retry layer's first pause, when the plan sets one.
pub(crate) fn backoff() -> Option<Duration> {
    let s = state();
    if !s.active.load(Ordering::Relaxed) {
        return None;
    }
    s.plan.lock().ok().and_then(|p| p.backoff)
}

/// Counts a call and decides its fate, after the plan's latency.
async fn decide(call: Call) -> Option<Mode> {
    let s = state();
    if !s.active.load(Ordering::Relaxed) {
        return None;
    }
    let plan = s.plan.lock().ok()?.clone();
    let nth = s.calls[call.index()].fetch_add(1, Ordering::SeqCst) + 1;
    s.any_calls.fetch_add(1, Ordering::SeqCst);
    if !plan.latency.is_zero() {
        tokio::time::sleep(plan.latency).await;
    }
    let mode = plan.fault(call, nth);
    if mode.is_some() {
        s.injected.fetch_add(1, Ordering::SeqCst);
        log::warn!("injecting a {:?} fault into {} call #{nth}", mode, call.name());
    }
    mode
}

/// Entries per page of a listing (S3's `ListObjectsV2` returns at most 1,000 keys a request).
pub const LIST_PAGE: usize = 1000;

/// `entries` of a listing, paged: each page after the first is counted as a `list` call and waits
/// the plan's latency.
fn paged(
    entries: BoxStream<'static, object_store::Result<ObjectMeta>>,
) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
    entries
        .enumerate()
        .then(|(i, entry)| async move {
            let s = state();
            if i > 0 && i % LIST_PAGE == 0 && s.active.load(Ordering::Relaxed) {
                s.calls[Call::List.index()].fetch_add(1, Ordering::SeqCst);
                s.any_calls.fetch_add(1, Ordering::SeqCst);
                let latency = s.plan.lock().map(|p| p.latency).unwrap_or_default();
                if !latency.is_zero() {
                    tokio::time::sleep(latency).await;
                }
            }
            entry
        })
        .boxed()
}

fn injected(call: Call, location: &Path) -> object_store::Error {
    object_store::Error::Generic {
        store: "faults",
        source: format!("injected fault: {} {location}", call.name()).into(),
    }
}

/// Runs `op` under the fate the plan gives this call.
async fn guarded<T, Fut>(call: Call, location: &Path, op: impl FnOnce() -> Fut) -> object_store::Result<T>
where
    Fut: std::future::Future<Output = object_store::Result<T>>,
{
    // Each call with its path, at trace level (`OXLAKE_LOG=trace`): which step makes which calls.
    log::trace!("store call {} {location}", call.name());
    match decide(call).await {
        None => op().await,
        Some(Mode::Once | Mode::Always) => Err(injected(call, location)),
        Some(Mode::Lost) => {
            op().await?;
            Err(injected(call, location))
        }
    }
}

/// A store that injects the installed plan's faults and latency into the store it wraps.
#[derive(Debug)]
pub struct FaultStore {
    inner: Arc<dyn ObjectStore>,
}

impl FaultStore {
    /// Wraps `inner`.
    pub fn new(inner: Arc<dyn ObjectStore>) -> Self {
        FaultStore { inner }
    }
}

impl fmt::Display for FaultStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "FaultStore({})", self.inner)
    }
}

#[async_trait]
impl ObjectStore for FaultStore {
    async fn put_opts(
        &self,
        location: &Path,
        payload: PutPayload,
        opts: PutOptions,
    ) -> object_store::Result<PutResult> {
        let call = if matches!(opts.mode, PutMode::Create) { Call::PutIfAbsent } else { Call::Put };
        guarded(call, location, || self.inner.put_opts(location, payload, opts)).await
    }

    async fn put_multipart_opts(
        &self,
        location: &Path,
        opts: PutMultipartOptions,
    ) -> object_store::Result<Box<dyn MultipartUpload>> {
        guarded(Call::Put, location, || self.inner.put_multipart_opts(location, opts)).await
    }

    async fn get_opts(&self, location: &Path, options: GetOptions) -> object_store::Result<GetResult> {
        let call = if options.head { Call::Head } else { Call::Get };
        guarded(call, location, || self.inner.get_opts(location, options)).await
    }

    async fn get_ranges(&self, location: &Path, ranges: &[Range<u64>]) -> object_store::Result<Vec<Bytes>> {
        guarded(Call::Get, location, || self.inner.get_ranges(location, ranges)).await
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
                    let one = futures::stream::once(futures::future::ready(Ok(location.clone()))).boxed();
                    guarded(Call::Delete, &location, || async {
                        inner.delete_stream(one).try_collect::<Vec<_>>().await.map(|_| ())
                    })
                    .await
                    .map(|()| location)
                }
            })
            .boxed()
    }

    fn list(&self, prefix: Option<&Path>) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
        let inner = self.inner.clone();
        let prefix = prefix.cloned();
        futures::stream::once(async move {
            let at = prefix.clone().unwrap_or_default();
            guarded(Call::List, &at, || async { Ok(paged(inner.list(prefix.as_ref()))) }).await
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
            guarded(Call::List, &at, || async { Ok(paged(inner.list_with_offset(prefix.as_ref(), &offset))) }).await
        })
        .try_flatten()
        .boxed()
    }

    async fn list_with_delimiter(&self, prefix: Option<&Path>) -> object_store::Result<ListResult> {
        let at = prefix.cloned().unwrap_or_default();
        guarded(Call::List, &at, || self.inner.list_with_delimiter(prefix)).await
    }

    async fn copy_opts(&self, from: &Path, to: &Path, options: CopyOptions) -> object_store::Result<()> {
        guarded(Call::Put, to, || self.inner.copy_opts(from, to, options)).await
    }

    async fn rename_opts(&self, from: &Path, to: &Path, options: RenameOptions) -> object_store::Result<()> {
        guarded(Call::Put, to, || self.inner.rename_opts(from, to, options)).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plans_parse_and_pick_their_calls() {
        let plan = FaultPlan::parse("put@3:once, get:lost, delete@2:always, latency=20ms, backoff=1").unwrap();
        assert_eq!(plan.latency, Duration::from_millis(20));
        assert_eq!(plan.backoff, Some(Duration::from_millis(1)));
        assert_eq!(plan.fault(Call::Put, 2), None);
        assert_eq!(plan.fault(Call::Put, 3), Some(Mode::Once));
        assert_eq!(plan.fault(Call::Put, 4), None);
        assert_eq!(plan.fault(Call::Get, 1), Some(Mode::Lost));
        assert_eq!(plan.fault(Call::Delete, 1), None);
        assert_eq!(plan.fault(Call::Delete, 7), Some(Mode::Always));
        assert_eq!(plan.fault(Call::PutIfAbsent, 3), None);
        assert_eq!(FaultPlan::parse("any@5:once").unwrap().fault(Call::Head, 5), Some(Mode::Once));
        for bad in ["put", "put:sometimes", "post@1:once", "put@0:once", "put@x:once", "latency=soon", "speed=1"] {
            assert!(matches!(FaultPlan::parse(bad), Err(Error::InvalidArgument { .. })), "{bad}");
        }
        assert_eq!(FaultPlan::parse("").unwrap(), FaultPlan::default());
    }
}
