//! The commit protocol: how a write becomes visible, atomically, or not at all.
//!
//! A write of instant `t` (docs/COMMIT_PROTOCOL.md):
//! 1. `t.<action>.requested` is created with a conditional put: this claims `t`. Times are UTC
//!    `yyyyMMddHHmmssSSS`, strictly increasing; on a clash the writer takes the next one.
//!    A heartbeat file `.hoodie/.heartbeat/t` is written first and refreshed while the write runs.
//! 2. `t.<action>.inflight`, then the data files, each named with `t`.
//! 3. The conflict check ([`conflicts`]): the write's footprint (file groups, keys) is published as
//!    an intent, then every data instant completed since the writer began, and every other write
//!    committing now, must have a footprint disjoint from `t`'s; otherwise the write is rolled back
//!    and fails with [`Error::CommitConflict`] naming the other instant.
//! 4. The commit hook ([`hook`]): the metadata table's deltacommit `t` completes here, before
//!    step 5; then the fate of `t` is decided as committed ([`fate`]).
//! 5. `t.<action>`, the completed instant, created last with a conditional put. Its appearance is
//!    the commit: before it no reader sees any of `t`'s files (readers keep only files of completed
//!    instants), after it all of them.
//!
//! A crash anywhere leaves `t` pending. The next writer finds it with an expired heartbeat and rolls
//! it back: `r.rollback.requested` naming `t`, `r.rollback.inflight`, `t`'s data files deleted,
//! `r.rollback` completed, then `t`'s pending files removed. Each step is idempotent, so a crash
//! during a rollback is finished by the writer after.
//!
//! Files: `transaction` (a write in progress, steps 1-5), `claims` (instant times, kept in the
//! ten-minute buckets of `markers`), `heartbeat`,
//! `conflicts` (step 3), `fate` (completed or rolled back, decided once), `outcome` (what became of
//! a write, asked after the fact), `rollback` (recovery and
//! deliberate rollbacks), `undone` (a write beside a rollback or restore of what it read),
//! `slice_claims` (which compaction takes a file slice), [`hook`] (what the
//! layers built on the protocol do at step 3 and on recovery) and [`change`] (what an instant
//! changed, as the hook is told).

pub mod change;
mod claims;
mod completion;
mod conflicts;
mod fate;
mod heartbeat;
pub mod hook;
mod markers;
mod outcome;
mod rollback;
pub(crate) mod slice_claims;
mod transaction;
mod undone;

pub use claims::PlanFn;
pub(crate) use claims::{archival_marker, archival_past, claim, prune_claims};
pub(crate) use completion::complete;
pub(crate) use fate::{FATE_DIR, current_epoch};
pub use heartbeat::TaskHeartbeat;
pub(crate) use heartbeat::{HeartbeatWatch, beating, is_expired};
pub use outcome::Outcome;
pub(crate) use rollback::{Leftovers, remove_unreported_files, rollback_latest, rollback_pending, settle};
pub use rollback::{rollback_completed, rollback_failed, rollback_failed_completing_decided, rollbacks};
pub use transaction::{ReadState, Transaction};
pub(crate) use undone::let_committing_writes_finish;

pub(crate) use crate::failpoints::failpoint;
use crate::failpoints::{armed, stop_at};

/// Whether a fate (commit or rollback) is recorded for attempt `epoch` at `time`.
pub(crate) async fn fate_recorded(table: &crate::table::Table, time: &str, epoch: u32) -> crate::error::Result<bool> {
    Ok(fate::recorded(table.storage(), time, epoch).await?.is_some())
}

/// [`failpoint`] at a step of the commit protocol of `table`. The metadata table commits inside
/// each data commit, through the same steps: there a step is named `metadata-<step>`, so that a
/// test stopping a data commit at a step stops there, not in the metadata table's commit before.
pub(crate) fn step_failpoint(table: &crate::table::Table, name: &str) {
    match (armed(), table.is_metadata_table()) {
        (false, _) => {}
        (true, true) => stop_at(&format!("metadata-{name}")),
        (true, false) => stop_at(name),
    }
}
