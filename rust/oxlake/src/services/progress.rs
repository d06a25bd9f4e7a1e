//! Progress of a long table service, readable from another thread while the service runs (the
//! console script draws its progress bar from it).

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

/// Units of work planned and done. A service sets the total when it knows it (after planning) and
/// advances as units complete; readers poll [`Progress::get`].
#[derive(Debug, Default)]
pub struct Progress {
    total: AtomicU64,
    done: AtomicU64,
    unit: Mutex<&'static str>,
}

impl Progress {
    /// Nothing planned, nothing done.
    pub fn new() -> Self {
        Self::default()
    }

    /// Announces `total` more units of `unit` (called once per planned batch of work).
    pub fn plan(&self, total: u64, unit: &'static str) {
        self.total.fetch_add(total, Ordering::Relaxed);
        if let Ok(mut u) = self.unit.lock() {
            *u = unit;
        }
    }

    /// Counts `n` more units done.
    pub fn advance(&self, n: u64) {
        self.done.fetch_add(n, Ordering::Relaxed);
    }

    /// `(done, total, unit)`; `total` is 0 until the service has planned its work.
    pub fn get(&self) -> (u64, u64, &'static str) {
        let unit = self.unit.lock().map(|u| *u).unwrap_or("");
        (self.done.load(Ordering::Relaxed), self.total.load(Ordering::Relaxed), unit)
    }
}

/// Advances an optional progress.
pub(crate) fn advance(progress: &Option<std::sync::Arc<Progress>>, n: u64) {
    if let Some(p) = progress {
        p.advance(n);
    }
}

/// Plans on an optional progress.
pub(crate) fn plan(progress: &Option<std::sync::Arc<Progress>>, total: u64, unit: &'static str) {
    if let Some(p) = progress {
        p.plan(total, unit);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_across_plans() {
        let p = Progress::new();
        assert_eq!(p.get(), (0, 0, ""));
        p.plan(3, "file groups");
        p.advance(1);
        p.plan(2, "file groups");
        p.advance(4);
        assert_eq!(p.get(), (5, 5, "file groups"));
    }
}
