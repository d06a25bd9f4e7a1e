//! Completion times (timeline layout 2: table versions 8 and 9).
//!
//! A completed instant of layout 2 is named `<requested>_<completion>.<action>`. Readers put a log
//! file into the file slice its completion time falls in, and incremental queries page by
//! completion time: so completion times must become visible in their order. Once any reader may
//! have seen an instant completed at `c`, no instant may complete later at a time before `c`.
//! Apache Hudi takes the time and writes the completed file under its table lock. oxlake has no
//! lock; it claims a completion time as it claims instant times, with a conditional create of
//! `.hoodie/oxlake/claims/<bucket>/<c>` (holding `completion <t> <token>`), and orders the claims:
//! - a claim that finds a later one made already gives its time up (deletes its marker) and
//!   claims again after it;
//! - a claim kept waits, before its completed file is written, for every earlier completion
//!   claim of an instant still pending: that instant completes (or is rolled back) first.
//!
//! Each claim's marker exists before its own check lists the claims, so of two claims at least the
//! later one's check sees the other: the earlier waits for it, or was given up.
//! A committer fixes its completion time in its fate record ([`super::fate`]): a roll-forward by
//! another process completes the instant at the same time, so one instant has one completed file.

use std::collections::HashSet;

use bytes::Bytes;

use super::claims::{CLAIM_ATTEMPTS, CLAIMS};
use super::fate;
use super::heartbeat::HeartbeatWatch;
use crate::error::{Error, Result};
use crate::format::instant::{self, Action, Instant};
use crate::table::Table;
use crate::timeline::Timeline;

/// Pause between two looks at the claims of earlier completions.
const POLL: std::time::Duration = std::time::Duration::from_millis(50);

fn content(time: &str) -> Bytes {
    Bytes::from(format!("completion {time} {}", uuid::Uuid::new_v4()))
}

/// The instant time a claim marker's content names as completing, if it is a completion claim.
fn completing(bytes: &[u8]) -> Option<String> {
    let text = std::str::from_utf8(bytes).ok()?;
    let mut parts = text.split(' ');
    (parts.next()? == "completion").then(|| parts.next().map(str::to_string)).flatten()
}

/// Gives up the completion claims of the instant `target`, rolled back (timeline layout 2). A claim
/// left standing reads as an earlier completion still pending: every later committer would wait
/// for it, and then take back the next attempt at that time (a compaction plan runs again at its
/// time) as if it were the one that claimed. The marker stays, emptied of its claim, so that no
/// later claim takes a completion time a reader may have seen.
pub(crate) async fn release_claims(table: &Table, target: &str) -> Result<()> {
    if table.timeline().layout() < 2 {
        return Ok(());
    }
    let storage = table.storage();
    // A completion is later than the requested time.
    for m in CLAIMS.list_after(storage, target).await? {
        if m.name.len() != 17 {
            continue;
        }
        if let Some(bytes) = storage.get_opt(&m.path).await?
            && completing(&bytes).as_deref() == Some(target)
        {
            storage.put(&m.path, Bytes::from(format!("released {target}"))).await?;
        }
    }
    Ok(())
}

/// Claims the completion time of the pending instant `time` of `table` (timeline layout 2) and
/// waits until every earlier claimed completion is visible or given up. Returns the time; the
/// caller writes the completed file (directly, or through the fate record).
pub(crate) async fn claim(table: &Table, time: &str) -> Result<String> {
    let storage = table.storage();
    let mut floor: Option<String> = None;
    for _ in 0..CLAIM_ATTEMPTS {
        let timeline = Timeline::load(storage, table.config()).await?;
        // Only claims after every time the timeline holds can raise the floor.
        let after = [timeline.last_time(), Some(time)].into_iter().flatten().max().unwrap_or_default();
        let claims = CLAIMS.list_after(storage, after).await?;
        let latest_claim = claims.iter().map(|m| m.name.as_str()).filter(|t| t.len() == 17).max();
        let last = [timeline.last_time(), latest_claim, floor.as_deref(), Some(time)].into_iter().flatten().max();
        let candidate = instant::next_after(last)?;
        let marker = CLAIMS.path(&candidate);
        let ours = content(time);
        if !storage.put_if_absent(&marker, ours.clone()).await?
            && storage.get_opt(&marker).await?.as_ref() != Some(&ours)
        {
            floor = Some(candidate);
            continue;
        }
        if super::claims::claimed_late(&candidate) {
            // This process paused between choosing the time and claiming it: an earlier claim
            // of it may have been pruned (`claims::prune_claims`).
            storage.delete(&marker).await?;
            floor = Some(candidate);
            continue;
        }
        // A later claim made already: a reader may see its instant before this one; claim again.
        let later = CLAIMS.list_after(storage, &candidate).await?;
        let mut overtaken = None;
        for m in later.into_iter().filter(|m| m.name.len() == 17) {
            if let Some(bytes) = storage.get_opt(&m.path).await?
                && completing(&bytes).is_some()
            {
                overtaken = Some(m.name);
            }
        }
        if let Some(t) = overtaken {
            log::debug!("{}: completion time {candidate} of {time} overtaken by {t}", table.uri());
            storage.delete(&marker).await?;
            floor = Some(t);
            continue;
        }
        wait_for_earlier(table, time, &candidate).await?;
        return Ok(candidate);
    }
    Err(Error::CommitConflict { instant: time.to_string(), detail: "could not claim a completion time".into() })
}

/// Waits until no completion claimed before `completion` belongs to a data instant (other than
/// `time`) still pending. A pending instant whose heartbeat expired is settled through its fate
/// record: completed for its committer at the time it recorded, or taken back (it will never
/// complete at that claim). The completion order of cleans, rollbacks and savepoints changes no
/// read: they are not waited for.
async fn wait_for_earlier(table: &Table, time: &str, completion: &str) -> Result<()> {
    let storage = table.storage();
    let mut watch = HeartbeatWatch::default();
    let mut taken_back: HashSet<String> = HashSet::new();
    loop {
        let timeline = Timeline::load(storage, table.config()).await?;
        let pending = |t: &str| {
            timeline.pending().find(|i| i.time == t && writes_data(i.action) && !taken_back.contains(t)).cloned()
        };
        // A completion claimed for a pending instant is later than its requested time.
        let Some(first_pending) = timeline.pending().filter(|i| i.time != time).map(|i| i.time.clone()).min() else {
            return Ok(());
        };
        // Markers named with a time the timeline holds (an instant's requested time, or a
        // completion already visible) are not claims of pending completions: not read.
        let on_timeline: HashSet<&str> = timeline
            .instants()
            .iter()
            .flat_map(|i| std::iter::once(i.time.as_str()).chain(i.completion.as_deref()))
            .collect();
        let mut blocking = None;
        for m in CLAIMS.list_after(storage, &first_pending).await? {
            let c = m.name.as_str();
            if c.len() != 17 || c >= completion || on_timeline.contains(c) {
                continue;
            }
            let Some(bytes) = storage.get_opt(&m.path).await? else { continue };
            let Some(owner) = completing(&bytes) else { continue };
            if owner != time
                && let Some(p) = pending(&owner)
            {
                blocking = Some(p);
                break;
            }
        }
        let Some(other) = blocking else { return Ok(()) };
        // Its fate decides: rolled back (a deliberate rollback of it may be what is completing
        // here), it never completes at that claim; committed, it is completed now at its
        // recorded time; undecided, its writer is waited for unless gone.
        let epoch = fate::current_epoch(table, &other.time).await?;
        let decided = fate::recorded(storage, &other.time, epoch).await?;
        let settle = match decided {
            Some(fate::Fate::RolledBack { .. }) => {
                taken_back.insert(other.time.clone());
                continue;
            }
            Some(fate::Fate::Committed { .. }) => true,
            None => super::is_expired(table, &other).await?,
        };
        if settle {
            if !super::settle(table, &other).await? {
                taken_back.insert(other.time.clone());
            }
            continue;
        }
        watch.check(table, &other, &format!("the completion of {time}")).await?;
        tokio::time::sleep(POLL).await;
    }
}

fn writes_data(action: Action) -> bool {
    action.writes_data() || matches!(action, Action::Compaction | Action::Clustering | Action::LogCompaction)
}

/// Completes the pending `instant` with `content` at a claimed completion time (layout 2; on
/// layout 1 the completed file is created as it is): for the instants whose completion is not
/// decided by a fate record (cleans, rollbacks, restores, savepoints). Returns `false` when the
/// completed file was there already.
pub(crate) async fn complete(table: &Table, instant: &Instant, content: Bytes) -> Result<bool> {
    let mut completed = instant.with_state(crate::format::instant::State::Completed);
    if table.config().layout_version >= 2 {
        completed.completion = Some(claim(table, &instant.time).await?);
    }
    table.timeline().create(table.storage(), &completed, content).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn completion_claims_name_their_instant() {
        assert_eq!(completing(b"completion 20260101000000000 abc").as_deref(), Some("20260101000000000"));
        assert_eq!(completing(b"7d0c4b9e-0000-0000-0000-000000000000"), None);
    }
}
