//! Heartbeats: a pending instant's writer shows it is alive by refreshing
//! `.hoodie/.heartbeat/<time>`; one silent for three intervals is taken for gone.

use std::time::{Duration, SystemTime};

use bytes::Bytes;
use tokio::task::JoinHandle;

use crate::error::{Error, Result};
use crate::format::instant::Instant;
use crate::storage::Storage;
use crate::table::Table;

pub(super) const HEARTBEAT_DIR: &str = ".hoodie/.heartbeat";
/// A heartbeat older than this many intervals means the writer is gone.
pub(super) const HEARTBEAT_TOLERANCE: u32 = 3;

/// Keeps the heartbeat of a pending instant beating while a task of a distributed write works
/// on it (the driver may be idle meanwhile); stops when dropped.
pub struct TaskHeartbeat(JoinHandle<()>);

impl TaskHeartbeat {
    /// Writes the heartbeat of the pending instant `time` now, then every heartbeat interval.
    pub async fn start(table: &Table, time: &str) -> Result<Self> {
        write_heartbeat(table.storage(), time).await?;
        Ok(TaskHeartbeat(spawn_heartbeat(
            table.storage().clone(),
            time.to_string(),
            table.options().heartbeat_interval,
        )))
    }
}

impl Drop for TaskHeartbeat {
    fn drop(&mut self) {
        self.0.abort();
    }
}

pub(super) fn heartbeat_path(time: &str) -> String {
    format!("{HEARTBEAT_DIR}/{time}")
}

pub(super) async fn write_heartbeat(storage: &Storage, time: &str) -> Result<()> {
    let now = SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default().as_millis();
    storage.put(&heartbeat_path(time), Bytes::from(now.to_string())).await
}

pub(super) fn spawn_heartbeat(storage: Storage, time: String, interval: Duration) -> JoinHandle<()> {
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(interval).await;
            if let Err(e) = write_heartbeat(&storage, &time).await {
                log::warn!("heartbeat of {time} failed: {e}");
            }
        }
    })
}

/// Watches the heartbeats of pending instants that a process waits for (a compaction for the
/// writes that began before it, a commit for an earlier overlapping one), so that no wait is
/// endless: a writer that is alive refreshes its heartbeat; one whose heartbeat stands still yet
/// never expires (a time ahead of this clock: clock skew, a damaged file) is reported.
#[derive(Default)]
pub(crate) struct HeartbeatWatch {
    seen: std::collections::HashMap<String, (Option<Bytes>, std::time::Instant)>,
}

impl HeartbeatWatch {
    /// Notes the heartbeat of `instant`, which `waiter` waits for; fails when it has stood still
    /// far longer than a live writer lets it.
    pub(crate) async fn check(&mut self, table: &Table, instant: &Instant, waiter: &str) -> Result<()> {
        let path = heartbeat_path(&instant.time);
        let beat = table.storage().get_opt(&path).await?;
        let now = std::time::Instant::now();
        let limit = (table.options().heartbeat_interval * HEARTBEAT_TOLERANCE * 3).max(HEARTBEAT_STILL_LIMIT);
        let (last, since) = self.seen.entry(instant.time.clone()).or_insert_with(|| {
            let shown = beat.as_ref().map(|b| String::from_utf8_lossy(b).into_owned());
            log::info!(
                "{}: {waiter} waits for the pending {} {} (heartbeat {shown:?})",
                table.uri(),
                instant.action,
                instant.time
            );
            (beat.clone(), now)
        });
        if *last != beat {
            (*last, *since) = (beat, now);
            return Ok(());
        }
        if now.duration_since(*since) > limit {
            let shown = beat.as_ref().map(|b| String::from_utf8_lossy(b).into_owned()).unwrap_or_else(|| "none".into());
            let detail = format!(
                "{waiter} waited {}s for the pending {} {}, whose heartbeat {path} ({shown}) has not changed: its writer is gone, but the heartbeat does not expire (a clock ahead of this one, or a damaged file); the instant is rolled back once its heartbeat is older than {} intervals by this clock",
                limit.as_secs(),
                instant.action,
                instant.time,
                HEARTBEAT_TOLERANCE
            );
            log::warn!("{}: {detail}", table.uri());
            return Err(Error::CommitConflict { instant: instant.time.clone(), detail });
        }
        Ok(())
    }
}

/// The shortest time a heartbeat may stand still before a waiter gives up on its instant.
pub(super) const HEARTBEAT_STILL_LIMIT: Duration = Duration::from_secs(10);

/// Whether the writer of a pending instant is gone: its last sign of life (the heartbeat, or the
/// instant's own timeline file before the first heartbeat) is older than the tolerance.
pub(crate) async fn is_expired(table: &Table, instant: &Instant) -> Result<bool> {
    let now = SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default().as_millis();
    let limit = table.options().heartbeat_interval.as_millis() * u128::from(HEARTBEAT_TOLERANCE);
    let path = heartbeat_path(&instant.time);
    let last_sign = match table.storage().get_opt(&path).await? {
        Some(bytes) => match std::str::from_utf8(&bytes).ok().and_then(|s| s.trim().parse().ok()) {
            Some(millis) => millis,
            // Apache Hudi's writers leave the file empty and go by its modification time; a
            // damaged one counts by its age too.
            None => match table.storage().head(&path).await? {
                Some(meta) => u128::try_from(meta.last_modified.timestamp_millis()).unwrap_or(0),
                None => 0,
            },
        },
        None => match table.storage().head(&table.timeline().path_of(instant)).await? {
            Some(meta) => u128::try_from(meta.last_modified.timestamp_millis()).unwrap_or(0),
            None => 0,
        },
    };
    Ok(now.saturating_sub(last_sign) > limit)
}

/// Runs `work` for the pending instant `time` with a heartbeat, so that other processes leave
/// the instant to this one while it runs (and take it over once the heartbeat expires).
pub(crate) async fn beating<T>(table: &Table, time: &str, work: impl Future<Output = Result<T>>) -> Result<T> {
    let storage = table.storage();
    write_heartbeat(storage, time).await?;
    let beat = spawn_heartbeat(storage.clone(), time.to_string(), table.options().heartbeat_interval);
    let out = work.await;
    beat.abort();
    let out = out?;
    storage.delete(&heartbeat_path(time)).await?;
    Ok(out)
}
