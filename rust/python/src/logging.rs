//! oxlake's log messages on stderr when `OXLAKE_LOG` names a level (`error`, `warn`, `info`,
//! `debug`, `trace`): what a writer decided (rollbacks, catch-ups, retries, conflicts) and why.

use std::io::Write;

use log::{LevelFilter, Log, Metadata, Record};

struct Stderr;

impl Log for Stderr {
    fn enabled(&self, metadata: &Metadata<'_>) -> bool {
        metadata.target().starts_with("oxlake")
    }

    fn log(&self, record: &Record<'_>) {
        if self.enabled(record.metadata()) {
            let now = chrono::Utc::now().format("%H:%M:%S%.3f");
            let pid = std::process::id();
            let _ = writeln!(std::io::stderr(), "{now} [{pid}] {} {}", record.level(), record.args());
        }
    }

    fn flush(&self) {}
}

/// Installs the stderr logger when `OXLAKE_LOG` asks for one (once per process).
pub fn init() {
    let Ok(level) = std::env::var("OXLAKE_LOG") else { return };
    let Ok(level) = level.parse::<LevelFilter>() else { return };
    static LOGGER: Stderr = Stderr;
    if log::set_logger(&LOGGER).is_ok() {
        log::set_max_level(level);
    }
}
