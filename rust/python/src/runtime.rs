//! One Tokio runtime per process, recreated in a child after `fork`, and a blocking call that
//! releases the GIL and honours Ctrl-C.

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use pyo3::prelude::*;
use tokio::runtime::Runtime;

use crate::errors::{OxlakeError, to_py};

static RUNTIME: Mutex<Option<(u32, Arc<Runtime>)>> = Mutex::new(None);

/// The process's runtime. After a fork the parent's worker threads do not exist in the child, so
/// the child builds its own (the parent's copy is leaked: dropping it would wait on dead threads).
pub fn runtime() -> PyResult<Arc<Runtime>> {
    let pid = std::process::id();
    let mut guard = RUNTIME.lock().map_err(|_| OxlakeError::new_err("runtime lock poisoned"))?;
    if let Some((owner, rt)) = guard.as_ref()
        && *owner == pid
    {
        return Ok(rt.clone());
    }
    if let Some((_, stale)) = guard.take() {
        std::mem::forget(stale);
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("oxlake")
        .build()
        .map_err(|e| OxlakeError::new_err(format!("cannot start the runtime: {e}")))?;
    let rt = Arc::new(rt);
    *guard = Some((pid, rt.clone()));
    Ok(rt)
}

/// Runs `fut` on the runtime without the GIL, waking every 100 ms to let Python deliver signals:
/// Ctrl-C cancels the call and raises `KeyboardInterrupt`.
pub fn run<F, T>(py: Python<'_>, fut: F) -> PyResult<T>
where
    F: Future<Output = oxlake::Result<T>> + Send + 'static,
    T: Send + 'static,
{
    let rt = runtime()?;
    let mut handle = rt.spawn(fut);
    loop {
        let waited =
            py.detach(|| rt.block_on(async { tokio::time::timeout(Duration::from_millis(100), &mut handle).await }));
        match waited {
            Ok(Ok(result)) => return result.map_err(to_py),
            Ok(Err(join)) => return Err(OxlakeError::new_err(format!("oxlake task failed: {join}"))),
            Err(_elapsed) => {
                if let Err(interrupt) = py.check_signals() {
                    handle.abort();
                    return Err(interrupt);
                }
            }
        }
    }
}
