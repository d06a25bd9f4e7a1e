//! The outcome of a write, asked after the fact: what a caller does with
//! [`Error::CommitUnknown`], and whoever else must know whether an instant landed before writing
//! it again.

use crate::error::{Error, Result};
use crate::format::instant::{self, Action};
use crate::table::Table;

/// What became of a write.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Completed: readers see it.
    Committed,
    /// Rolled back, or bound to be (its rollback is decided): nothing of it is read, ever.
    RolledBack,
    /// Not decided yet: its writer is alive (its heartbeat beats) and may still commit it.
    Pending,
}

impl Outcome {
    /// The name Python shows: `committed`, `rolled_back` or `pending`.
    pub fn name(self) -> &'static str {
        match self {
            Outcome::Committed => "committed",
            Outcome::RolledBack => "rolled_back",
            Outcome::Pending => "pending",
        }
    }
}

impl Table {
    /// What became of the write at `time`. Settles it first where its writer is gone, as the
    /// next writer would: a write decided committed is completed (rolled forward), one never
    /// decided is rolled back. So the answer stands: `Committed` and `RolledBack` never change.
    pub async fn outcome(&mut self, time: &str) -> Result<Outcome> {
        let time = instant::normalize_time(time)?;
        super::rollback_failed_completing_decided(self).await?;
        self.reload().await?;
        let timeline = self.timeline();
        let at: Vec<_> = timeline.instants_at(&time).iter().filter(|i| i.action != Action::Savepoint).collect();
        if at.iter().any(|i| i.is_completed()) {
            return Ok(Outcome::Committed);
        }
        if !at.is_empty() {
            return Ok(Outcome::Pending);
        }
        if timeline.rolled_back().any(|t| t == time)
            || super::rollbacks(self.storage(), timeline).await?.iter().any(|(_, targets)| targets.contains(&time))
        {
            return Ok(Outcome::RolledBack);
        }
        let epoch = super::current_epoch(self, &time).await?;
        if let Some(super::fate::Fate::RolledBack { .. }) = super::fate::recorded(self.storage(), &time, epoch).await? {
            return Ok(Outcome::RolledBack);
        }
        if timeline.write_timeline_start().is_some_and(|start| time.as_str() < start) {
            let archived = self.with_archived_timeline().await?;
            if archived.timeline().instants_at(&time).iter().any(|i| i.is_completed() && i.action.writes_data()) {
                return Ok(Outcome::Committed);
            }
        }
        Err(Error::invalid_arg("instant", format!("no write at {time} on {}", self.uri())))
    }
}
