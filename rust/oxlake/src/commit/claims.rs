//! Claiming an instant time: a conditional create of its `.requested` file after a claim
//! marker, checked against archivals that run meanwhile.

use std::time::Duration;

use bytes::Bytes;
use futures::future::BoxFuture;

use super::{failpoint, fate, slice_claims};
use crate::error::{Error, Result};
use crate::format::instant::{self, Action, Instant, State};
use crate::table::Table;

/// How many instant times a writer tries before giving up on a busy table.
pub(super) const CLAIM_ATTEMPTS: usize = 20;
/// Markers of the instant times claimed (see [`claim`]).
pub(super) const CLAIMS_DIR: &str = ".hoodie/oxlake/claims";
/// Markers of archivals, `<when>_<cutoff>` (see [`claim_with`] and `services::archive`).
pub(crate) const ARCHIVING_DIR: &str = ".hoodie/oxlake/archiving";
/// Claim markers older than this are removed by cleans: instant times follow the clock, so no
/// writer claims a time that old.
pub(super) const CLAIMS_KEPT: Duration = Duration::from_secs(24 * 3600);

/// Removes the claim markers older than [`CLAIMS_KEPT`].
pub(crate) async fn prune_claims(table: &Table) -> Result<()> {
    let cutoff = chrono::Utc::now().naive_utc() - chrono::TimeDelta::from_std(CLAIMS_KEPT).unwrap_or_default();
    let cutoff = cutoff.format("%Y%m%d%H%M%S%3f").to_string();
    fate::prune(table, &cutoff).await?;
    slice_claims::prune(table, &cutoff).await?;
    for dir in [CLAIMS_DIR, ARCHIVING_DIR] {
        for f in table.storage().list_dir(dir).await? {
            let name = f.path.rsplit('/').next().unwrap_or_default();
            if name.get(..17).is_some_and(|t| t < cutoff.as_str()) {
                table.storage().delete(&f.path).await?;
            }
        }
    }
    Ok(())
}

/// The latest cutoff at or after `time` of an archival marked in [`ARCHIVING_DIR`], if any.
pub(super) async fn archival_past(table: &Table, time: &str) -> Result<Option<String>> {
    let markers = table.storage().list_dir(ARCHIVING_DIR).await?;
    Ok(markers
        .iter()
        .filter_map(|f| f.path.rsplit('/').next()?.split_once('_').map(|(_, cutoff)| cutoff.to_string()))
        .filter(|cutoff| cutoff.as_str() >= time)
        .max())
}

/// Makes the plan of an instant once its time is claimed (see [`claim_with`]); `None`: nothing
/// to do. The future owns what it uses besides the table and the time.
pub trait PlanFn: for<'a> Fn(&'a Table, &'a str) -> BoxFuture<'a, Result<Option<Bytes>>> + Send + Sync {}
impl<F> PlanFn for F where F: for<'a> Fn(&'a Table, &'a str) -> BoxFuture<'a, Result<Option<Bytes>>> + Send + Sync {}

/// A plan already made, as a [`PlanFn`]'s future.
pub(super) fn ready<'a>(plan: Result<Option<Bytes>>) -> BoxFuture<'a, Result<Option<Bytes>>> {
    Box::pin(std::future::ready(plan))
}

/// Claims a new instant for `action`: creates its requested file, holding `plan(time)`, at the
/// first free time after the latest instant. Writers race for times, and the requested files of
/// two actions at one time have different names: so a time is first claimed by the conditional
/// create of a marker `.hoodie/oxlake/claims/<time>`, whatever the action. A metadata table's
/// plain times belong to the data instants it mirrors, so the instants of its own services
/// (rollbacks, cleans) take a `002` suffix no data instant has.
pub(crate) async fn claim(
    table: &Table,
    action: Action,
    plan: impl Fn(&str) -> Result<Bytes> + Send + Sync,
) -> Result<Instant> {
    let claimed = claim_with(table, action, |_, time| ready(plan(time).map(Some))).await?;
    claimed.ok_or_else(|| Error::invalid_data("a plan came out empty"))
}

/// [`claim`] with a plan made once the time is this writer's (a compaction first takes the
/// slices it compacts, see `services::compaction`); `None` from `plan`: nothing to do, no
/// instant is created.
pub(crate) async fn claim_with(table: &Table, action: Action, plan: impl PlanFn) -> Result<Option<Instant>> {
    Ok(claim_checked(table, action, plan).await?.map(|(requested, _)| requested))
}

/// [`claim_with`], also saying whether an archival passed a time first claimed: then `table`'s
/// timeline is stale (instants on it are archived) and the caller reloads it.
pub(super) async fn claim_checked(table: &Table, action: Action, plan: impl PlanFn) -> Result<Option<(Instant, bool)>> {
    let mut archived_past = false;
    let own_suffix = if table.is_metadata_table() { "002" } else { "" };
    let mut last = table.timeline().last_time().map(|t| t.get(..17).unwrap_or(t).to_string());
    for _ in 0..CLAIM_ATTEMPTS {
        let base = instant::next_after(last.as_deref())?;
        let time = format!("{base}{own_suffix}");
        last = Some(base);
        // The marker holds a token of this claim: a create whose answer was lost reads it back.
        let token = Bytes::from(uuid::Uuid::new_v4().to_string());
        if !table.storage().put_if_absent(&format!("{CLAIMS_DIR}/{time}"), token).await? {
            continue;
        }
        failpoint("after-claim");
        let Some(content) = plan(table, &time).await? else { return Ok(None) };
        // The time is this writer's now: a requested file already there is its own, from an
        // attempt whose answer was lost, unless another process took this writer for dead
        // before it got here (see `services::compaction`): then it has another content.
        let requested = Instant::new(time.clone(), action, State::Requested);
        let path = table.timeline().path_of(&requested);
        if !table.timeline().create(table.storage(), &requested, content.clone()).await?
            && table.storage().get(&path).await? != content
        {
            let detail = "another process took this writer for gone and closed its instant".into();
            return Err(Error::CommitConflict { instant: time, detail });
        }
        // An archival that began before the requested file existed may not have seen it, and
        // may be moving the timeline's start past `time` (this writer was slow between reading
        // the timeline and here): then `time` is given up for one after that archival's cutoff.
        // The archival marks itself before it lists the timeline a last time, and this check
        // follows the requested file: one of the two sees the other.
        if let Some(cutoff) = archival_past(table, &time).await? {
            log::info!(
                "{}: an archival up to {cutoff} passed the claimed time {time}: claiming a later one",
                table.uri()
            );
            table.storage().delete(&path).await?;
            if action == Action::Compaction {
                slice_claims::release(table, &time, &path, &content).await?;
            }
            last = Some(cutoff.get(..17).unwrap_or(&cutoff).to_string()).max(last);
            archived_past = true;
            continue;
        }
        return Ok(Some((requested, archived_past)));
    }
    Err(Error::CommitConflict { instant: last.unwrap_or_default(), detail: "could not claim an instant time".into() })
}
