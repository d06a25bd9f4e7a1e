//! Claiming an instant time: a conditional create of its `.requested` file after a claim
//! marker, checked against archivals that run meanwhile.

use std::time::Duration;

use bytes::Bytes;
use futures::future::BoxFuture;

use super::markers::{Marker, MarkerDir};
use super::{fate, slice_claims, step_failpoint};
use crate::error::{Error, Result};
use crate::format::instant::{self, Action, Instant, State};
use crate::table::Table;

/// How many instant times a writer tries before giving up on a busy table.
pub(super) const CLAIM_ATTEMPTS: usize = 20;
/// Markers of the instant times claimed (see [`claim`]), and of completion times
/// (`super::completion`).
pub(super) const CLAIMS: MarkerDir = MarkerDir(".hoodie/oxlake/claims");
/// Markers of archivals, `<cutoff>_<when>` (see [`claim_with`] and `services::archive`).
pub(crate) const ARCHIVING: MarkerDir = MarkerDir(".hoodie/oxlake/archiving");
/// How long markers are kept, and how late claims may come (clocks must agree within the
/// difference between the two). Every retention below is a multiple of [`Retention::kept`].
#[derive(Clone, Copy, Debug)]
struct Retention {
    /// Claim markers named before this long ago are removed by cleans. A claim counts only when
    /// its marker was made within half of it ([`claimed_late`]): so no claim takes a time whose
    /// marker was pruned. Fate records of completed instants are kept as long.
    kept: Duration,
}

impl Retention {
    /// Two minutes; `OXLAKE_CLAIMS_KEPT_MS` sets it for a test that races pruning against
    /// writers (the stress suite).
    fn get() -> Self {
        static KEPT: std::sync::OnceLock<Duration> = std::sync::OnceLock::new();
        let kept = *KEPT.get_or_init(|| {
            let ms = std::env::var("OXLAKE_CLAIMS_KEPT_MS").ok().and_then(|v| v.parse::<u64>().ok());
            ms.map_or(Duration::from_secs(120), Duration::from_millis)
        });
        Retention { kept }
    }

    /// How long after a time its claim may still be made.
    fn claim_lease(self) -> Duration {
        self.kept / 2
    }

    /// Cleans prune markers at most this often: a table committing every second must not list
    /// the marker folders at every commit.
    fn prune_every(self) -> Duration {
        self.kept / 2
    }

    /// Archival marks named before this long ago are removed. A writer checks them after its
    /// requested file exists, which may come long after its claim (a compaction takes its slices
    /// in between): its time counts only if that check came within [`Retention::request_lease`].
    fn archivals_kept(self) -> Duration {
        self.kept * 30
    }

    /// How long after a time the check of archivals that follows its requested file may come.
    fn request_lease(self) -> Duration {
        self.kept * 15
    }
}

/// Fate records of instants rolled back and gone from the timeline are kept this long (see
/// [`fate::prune`]).
const FATES_KEPT: Duration = Duration::from_secs(24 * 3600);
/// When markers were last pruned: an instant time.
const PRUNED: &str = ".hoodie/oxlake/pruned";

/// The time `d` ago, as an instant time.
fn ago(d: Duration) -> String {
    let now = chrono::Utc::now().naive_utc();
    (now - chrono::TimeDelta::from_std(d).unwrap_or_default()).format("%Y%m%d%H%M%S%3f").to_string()
}

/// Whether a claim of `time` whose marker was just made came too late to count: a marker of an
/// earlier claim of that time may have been pruned, so the create proves nothing. The claimer
/// gives the time up (a process paused between choosing a time and claiming it).
pub(super) fn claimed_late(time: &str) -> bool {
    older_than(time, Retention::get().claim_lease())
}

fn older_than(time: &str, d: Duration) -> bool {
    time.get(..17).unwrap_or(time) < ago(d).as_str()
}

/// Removes the markers named before [`Retention::kept`] ago, unless that was done in the last
/// [`Retention::prune_every`] (two processes pruning at once delete the same files: harmless). The claims of
/// completion times after the first pending instant's time stay: its committer, or a process
/// completing it for its committer, may still complete it at a time claimed long ago, and every
/// later completion must wait for it (`super::completion`).
pub(crate) async fn prune_claims(table: &Table) -> Result<()> {
    let storage = table.storage();
    let retention = Retention::get();
    let last = storage.get_opt(PRUNED).await?;
    if last.is_some_and(|t| t.as_ref() > ago(retention.prune_every()).as_bytes()) {
        return Ok(());
    }
    storage.put(PRUNED, Bytes::from(instant::now())).await?;
    let cutoff = ago(retention.kept);
    let first_pending = table.timeline().pending().map(|i| i.time.get(..17).unwrap_or(&i.time)).min();
    let claims_cutoff = first_pending.filter(|p| *p < cutoff.as_str()).unwrap_or(&cutoff);
    let long_ago = ago(FATES_KEPT);
    fate::prune(table, &cutoff, &long_ago).await?;
    slice_claims::prune(table, &long_ago).await?;
    CLAIMS.prune(storage, claims_cutoff).await?;
    ARCHIVING.prune(storage, &ago(retention.archivals_kept())).await
}

/// The name of an archival's marker (filed by its cutoff: claims look at recent cutoffs only).
pub(crate) fn archival_marker(cutoff: &str) -> String {
    ARCHIVING.path(&format!("{cutoff}_{}", instant::now()))
}

/// The cutoff an archival's marker names: `<cutoff>_<when>`, or `<when>_<cutoff>` written flat.
fn archival_cutoff(marker: &Marker) -> Option<&str> {
    let (first, second) = marker.name.split_once('_')?;
    Some(if marker.flat { second } else { first })
}

/// The latest cutoff at or after `time` of an archival marked in [`ARCHIVING`], if any.
pub(crate) async fn archival_past(table: &Table, time: &str) -> Result<Option<String>> {
    // A marker's name starts with its cutoff, or (flat) with when it was made, which is later.
    let markers = ARCHIVING.list_after(table.storage(), time.get(..17).unwrap_or(time)).await?;
    Ok(markers.iter().filter_map(archival_cutoff).filter(|cutoff| *cutoff >= time).map(str::to_string).max())
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
        if !table.storage().put_if_absent(&CLAIMS.path(&time), token).await? {
            continue;
        }
        if claimed_late(&time) {
            log::info!("{}: the claim of {time} came too late to count: claiming a later time", table.uri());
            continue;
        }
        step_failpoint(table, "after-claim");
        let Some(content) = plan(table, &time).await? else { return Ok(None) };
        // The time is this writer's now: a requested file already there is its own, from an
        // attempt whose answer was lost, unless another process took this writer for dead
        // before it got here (see `services::compaction`): then it has another content.
        let requested = Instant::new(time.clone(), action, State::Requested);
        let path = table.timeline().path_of(&requested);
        if !table.timeline().create(table.storage(), &requested, content.clone()).await?
            && table.storage().get_opt(&path).await?.as_ref() != Some(&content)
        {
            let detail = "another process took this writer for gone and closed its instant".into();
            return Err(Error::CommitConflict { instant: time, detail });
        }
        // An archival that began before the requested file existed may not have seen it, and
        // may be moving the timeline's start past `time` (this writer was slow between reading
        // the timeline and here): then `time` is given up for one after that archival's cutoff.
        // The archival marks itself before it lists the timeline a last time, and this check
        // follows the requested file: one of the two sees the other.
        // Past its lease, the marks of archivals it must see may be pruned: as if one passed.
        let archival = match archival_past(table, &time).await? {
            None if older_than(&time, Retention::get().request_lease()) => Some(instant::now()),
            found => found,
        };
        if let Some(cutoff) = archival {
            log::info!(
                "{}: an archival up to {cutoff} passed the claimed time {time} (or it came too late to tell): claiming a later one",
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::TableType;
    use crate::services::clean::CleanPolicy;
    use crate::table::TableOptions;
    use crate::test_support::id_city_table;

    fn secs_ago(secs: i64) -> String {
        (chrono::Utc::now().naive_utc() - chrono::TimeDelta::seconds(secs)).format("%Y%m%d%H%M%S%3f").to_string()
    }

    #[tokio::test]
    async fn cleans_prune_markers_older_than_two_minutes_at_most_once_a_minute() {
        let dir = tempfile::tempdir().unwrap();
        let mut t = id_city_table(dir.path(), TableType::CopyOnWrite, TableOptions::default()).await;
        let s = t.storage().clone();
        let (old, recent) = (secs_ago(300), secs_ago(10));
        for name in [&old, &recent] {
            s.put(&CLAIMS.path(name), Bytes::new()).await.unwrap();
            s.put(&ARCHIVING.path(&format!("{name}_{name}")), Bytes::new()).await.unwrap();
        }
        s.put(&format!("{}/{old}", CLAIMS.0), Bytes::new()).await.unwrap(); // written flat
        let ancient = secs_ago(2 * 3600);
        s.put(&ARCHIVING.path(&format!("{ancient}_{ancient}")), Bytes::new()).await.unwrap();
        let all = |m: MarkerDir| {
            let s = s.clone();
            async move { m.list_after(&s, "").await.unwrap().into_iter().map(|m| m.name).collect::<Vec<_>>() }
        };
        t.clean(CleanPolicy::KeepLatestCommits(10)).await.unwrap();
        assert_eq!(all(CLAIMS).await, std::slice::from_ref(&recent));
        // Archival marks stay an hour.
        assert_eq!(all(ARCHIVING).await, [format!("{old}_{old}"), format!("{recent}_{recent}")]);
        // Pruned a moment ago: the next clean lists nothing.
        s.put(&CLAIMS.path(&old), Bytes::new()).await.unwrap();
        t.clean(CleanPolicy::KeepLatestCommits(10)).await.unwrap();
        assert_eq!(all(CLAIMS).await.len(), 2);
        // An instant pending since before the cutoff keeps the claims after its time: one of
        // them may be its completion, which later completions wait for.
        let (pending, before, completion) = (secs_ago(400), secs_ago(500), secs_ago(350));
        let requested = Instant::new(&pending, Action::Commit, State::Requested);
        s.put(&t.timeline().path_of(&requested), Bytes::new()).await.unwrap();
        for name in [&before, &completion] {
            s.put(&CLAIMS.path(name), Bytes::new()).await.unwrap();
        }
        s.put(PRUNED, Bytes::from(secs_ago(120))).await.unwrap();
        t.reload().await.unwrap();
        prune_claims(&t).await.unwrap();
        assert_eq!(all(CLAIMS).await, [completion, old, recent]);
    }

    #[test]
    fn a_claim_made_long_after_its_time_does_not_count() {
        assert!(!claimed_late(&instant::now()));
        assert!(!claimed_late(&secs_ago(30)));
        assert!(claimed_late(&secs_ago(90)));
        assert!(claimed_late(&format!("{}002", secs_ago(90))), "a metadata table's own time");
    }

    #[tokio::test]
    async fn a_claim_sees_archivals_whose_cutoff_is_at_or_after_its_time() {
        let dir = tempfile::tempdir().unwrap();
        let t = id_city_table(dir.path(), TableType::CopyOnWrite, TableOptions::default()).await;
        let s = t.storage();
        let time = "20260101001000000";
        s.put(&ARCHIVING.path("20260101000959999_20260101001100000"), Bytes::new()).await.unwrap();
        assert_eq!(archival_past(&t, time).await.unwrap(), None);
        s.put(&ARCHIVING.path("20260101001000000_20260101001100000"), Bytes::new()).await.unwrap();
        // Written flat: `<when>_<cutoff>`.
        s.put(".hoodie/oxlake/archiving/20260101002000000_20260101001500000", Bytes::new()).await.unwrap();
        assert_eq!(archival_past(&t, time).await.unwrap().as_deref(), Some("20260101001500000"));
        assert_eq!(archival_past(&t, "20260101001500001").await.unwrap(), None);
    }
}
