//! Crash and interleaving points for the tests, at steps of writes and reads. With
//! `OXLAKE_FAILPOINT=<name>` in the environment the process aborts at that step, as a `kill -9`
//! would stop it there. With `OXLAKE_PAUSEPOINT=<name>` and `OXLAKE_PAUSE_DIR=<dir>` it creates
//! `<dir>/reached` there and waits until `<dir>/resume` exists, so that a test can run another
//! writer in between. Unset, a point costs two environment lookups.

use std::time::Duration;

/// Stops or pauses at the step `name` when a test asked for it.
pub(crate) fn failpoint(name: &str) {
    if armed() {
        stop_at(name);
    }
}

/// Whether a failpoint or a pausepoint is set at all.
pub(crate) fn armed() -> bool {
    std::env::var_os("OXLAKE_FAILPOINT").is_some() || std::env::var_os("OXLAKE_PAUSEPOINT").is_some()
}

/// Aborts at `name` if it is the failpoint, pauses there if it is the pausepoint.
pub(crate) fn stop_at(name: &str) {
    if std::env::var("OXLAKE_FAILPOINT").is_ok_and(|v| v == name) {
        log::error!("failpoint {name}: aborting the process");
        std::process::abort();
    }
    if std::env::var("OXLAKE_PAUSEPOINT").is_ok_and(|v| v == name)
        && let Ok(dir) = std::env::var("OXLAKE_PAUSE_DIR")
    {
        let dir = std::path::Path::new(&dir);
        if let Err(e) = std::fs::write(dir.join("reached"), name) {
            log::error!("pausepoint {name}: {e}");
            return;
        }
        while !dir.join("resume").exists() {
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}
