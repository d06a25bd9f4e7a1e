//! The fate of a pending instant: completed or rolled back, decided once.
//!
//! A writer about to complete instant `t` and another process about to roll `t` back (it took the
//! writer for dead: a paused process, a slow store) must exclude each other. Checking the timeline
//! and then acting lets both win: the writer reports a commit whose files the rollback deletes.
//! So each first records its decision with a conditional create of `.hoodie/oxlake/fate/<t>`; the
//! one that creates it decides, the other yields:
//! - a committer that finds a rollback recorded fails with a conflict and leaves the rollback to
//!   its owner;
//! - a rollback that finds a commit recorded deletes nothing; when the committer is gone before it
//!   created the completed file, the rollback completes the instant for it (rolls it forward) from
//!   the commit metadata kept in the record: every check of the commit had passed.
//!
//! Compaction plans outlive a rollback of their run (the plan runs again at the same time), and the
//! metadata table retries a failed deltacommit at the same time: each attempt at a time has an
//! *epoch*, the number of finished rollbacks before it, and records its fate under
//! `<t>` (epoch 0) or `<t>~<epoch>`. A stale actor of an earlier attempt finds that attempt's
//! fate decided.

use bytes::Bytes;

use crate::error::{Error, Result};
use crate::format::instant::{Action, Instant, State};
use crate::storage::Storage;
use crate::table::Table;

/// Where the fate records are.
pub(crate) const FATE_DIR: &str = ".hoodie/oxlake/fate";

/// What was decided for one attempt at an instant time.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Fate {
    /// The attempt completes as `action`, with this commit metadata, at `completion` (timeline
    /// layout 2: the completion time claimed before the decision, [`super::completion`]).
    Committed { action: Action, metadata: Bytes, completion: Option<String> },
    /// The rollback instant `by` undoes the attempt.
    RolledBack { by: String },
}

impl Fate {
    fn encode(&self) -> Bytes {
        match self {
            Fate::Committed { action, metadata, completion } => {
                let mut out = match completion {
                    Some(c) => format!("commit {action} {c}\n").into_bytes(),
                    None => format!("commit {action}\n").into_bytes(),
                };
                out.extend_from_slice(metadata);
                Bytes::from(out)
            }
            Fate::RolledBack { by } => Bytes::from(format!("rollback {by}\n")),
        }
    }

    fn decode(path: &str, bytes: &Bytes) -> Result<Self> {
        let end = bytes.iter().position(|b| *b == b'\n').unwrap_or(bytes.len());
        let head = std::str::from_utf8(&bytes[..end]).map_err(|e| Error::corrupt(path, e))?;
        let rest = bytes.slice((end + 1).min(bytes.len())..);
        match head.split_once(' ') {
            Some(("commit", rest_of_head)) => {
                let (action, completion) = match rest_of_head.split_once(' ') {
                    Some((a, c)) if crate::format::instant::is_instant_time(c) => (a, Some(c.to_string())),
                    Some(_) => return Err(Error::corrupt(path, "not a completion time")),
                    None => (rest_of_head, None),
                };
                let action = Action::parse(action).ok_or_else(|| Error::corrupt(path, "unknown action"))?;
                Ok(Fate::Committed { action, metadata: rest, completion })
            }
            Some(("rollback", by)) if !by.is_empty() => Ok(Fate::RolledBack { by: by.to_string() }),
            _ => Err(Error::corrupt(path, "not an instant's fate record")),
        }
    }
}

fn path(time: &str, epoch: u32) -> String {
    match epoch {
        0 => format!("{FATE_DIR}/{time}"),
        n => format!("{FATE_DIR}/{time}~{n}"),
    }
}

/// The fate recorded for attempt `epoch` at `time`, if any.
pub(crate) async fn recorded(storage: &Storage, time: &str, epoch: u32) -> Result<Option<Fate>> {
    let p = path(time, epoch);
    storage.get_opt(&p).await?.map(|b| Fate::decode(&p, &b)).transpose()
}

/// The epoch of the current attempt at `time` on `table`'s (just reloaded) timeline: the first
/// whose fate is not a rollback that finished.
pub(crate) async fn current_epoch(table: &Table, time: &str) -> Result<u32> {
    let mut epoch = 0;
    while let Some(Fate::RolledBack { by }) = recorded(table.storage(), time, epoch).await? {
        // A rollback archived by Apache Hudi (older than the active timeline) finished too.
        let finished = match table.timeline().instants_at(&by) {
            [] => table.timeline().earliest_time().is_some_and(|e| by.as_str() < e),
            at => at.iter().any(|i| i.action == Action::Rollback && i.is_completed()),
        };
        if !finished {
            break;
        }
        epoch += 1;
    }
    Ok(epoch)
}

/// Records `fate` for attempt `epoch` at `time` unless a fate is recorded there already; returns
/// the fate that holds (ours, or the one recorded first).
///
/// A record found present may be gone by the time it is read: pruned (its instant completed) or
/// withdrawn (by a rollback that found its target completed). Then nothing is decided and the
/// decision is tried again; every party that acts on a decision looks at the timeline after it.
pub(crate) async fn decide(storage: &Storage, time: &str, epoch: u32, fate: Fate) -> Result<Fate> {
    const ATTEMPTS: usize = 8;
    let p = path(time, epoch);
    for _ in 0..ATTEMPTS {
        if storage.put_if_absent(&p, fate.encode()).await? {
            return Ok(fate);
        }
        if let Some(bytes) = storage.get_opt(&p).await? {
            return Fate::decode(&p, &bytes);
        }
    }
    Err(Error::CommitConflict {
        instant: time.to_string(),
        detail: format!("its fate record {p} was removed under each of {ATTEMPTS} attempts to decide it"),
    })
}

/// Whether `fate` is still what is recorded for attempt `epoch` at `time` (a deliberate rollback
/// may have overruled it since).
pub(crate) async fn still(storage: &Storage, time: &str, epoch: u32, fate: &Fate) -> Result<bool> {
    Ok(recorded(storage, time, epoch).await?.as_ref() == Some(fate))
}

/// The line after an overrule's `rollback <by>` that marks it deliberate ([`overrule`]).
const OVERRULE_MARK: &[u8] = b"overrule\n";

/// Whether a deliberate rollback overruled attempt `epoch` at `time` ([`overrule`]). Nothing else
/// counts: records of completed instants are pruned ([`prune`]), and a rollback that took the
/// instant for pending long before may then win `decide(RolledBack)` on the empty record; it
/// withdraws once it sees the instant completed, and a committer or roll-forward that just
/// created the completed file must not take that passing record for an overrule.
pub(crate) async fn overruled(storage: &Storage, time: &str, epoch: u32) -> Result<bool> {
    let p = path(time, epoch);
    let Some(bytes) = storage.get_opt(&p).await? else { return Ok(false) };
    let end = bytes.iter().position(|b| *b == b'\n').map_or(bytes.len(), |e| e + 1);
    Ok(matches!(Fate::decode(&p, &bytes)?, Fate::RolledBack { .. }) && bytes[end..].starts_with(OVERRULE_MARK))
}

/// Removes the record of attempt `epoch` at `time` if it is still `fate` (a rollback that
/// found its target completed after it decided, see `super::rollback`).
pub(crate) async fn withdraw(storage: &Storage, time: &str, epoch: u32, fate: &Fate) -> Result<()> {
    if still(storage, time, epoch, fate).await? {
        storage.delete(&path(time, epoch)).await?;
    }
    Ok(())
}

/// Records that rollback `by` undoes attempt `epoch` at `time`, over whatever was recorded: for
/// a deliberate rollback of a completed instant (nobody races to complete it).
pub(crate) async fn overrule(storage: &Storage, time: &str, epoch: u32, by: &str) -> Result<()> {
    let mut record = Fate::RolledBack { by: by.to_string() }.encode().to_vec();
    record.extend_from_slice(OVERRULE_MARK);
    storage.put(&path(time, epoch), Bytes::from(record)).await
}

/// Completes `target` for its committer, from the commit recorded as its fate (the committer
/// decided to complete and is gone before it created the completed file).
pub(crate) async fn roll_forward(
    table: &Table,
    target: &Instant,
    epoch: u32,
    action: Action,
    metadata: Bytes,
    completion: Option<String>,
) -> Result<()> {
    let mut completed = Instant::new(target.time.clone(), action, State::Completed);
    completed.completion = completion;
    if epoch > 0 {
        table.storage().delete(&crate::timeline::rolled_back_marker(&target.time)).await?;
    }
    // Completed by its writer and archived since this process saw it pending: creating the
    // completed file again would leave it active among archived commits, whose files would
    // then read as uncommitted. Archival deletes the pending files first, the completed last.
    if !has_pending_files(table, target).await? {
        return Ok(());
    }
    if !table.timeline().create(table.storage(), &completed, metadata).await? {
        return Ok(()); // completed already, by its writer or another roll-forward
    }
    if !has_pending_files(table, target).await? {
        // Archived between the look and the create (the create found the completed file gone).
        table.storage().delete(&table.timeline().path_of(&completed)).await?;
        return Ok(());
    }
    // A deliberate rollback overrules the record before it deletes the completed file: a create
    // that came after that delete must not stand.
    if overruled(table.storage(), &target.time, epoch).await? {
        table.storage().delete(&table.timeline().path_of(&completed)).await?;
        return Ok(());
    }
    log::info!("{}: completed {} {} for its writer, which had decided to commit", table.uri(), action, target.time);
    Ok(())
}

/// Whether the requested or inflight file of `target` is still on the timeline.
async fn has_pending_files(table: &Table, target: &Instant) -> Result<bool> {
    let timeline = table.timeline();
    let requested = timeline.path_of(&target.with_state(State::Requested));
    let inflight = timeline.path_of(&target.with_state(State::Inflight));
    let (requested, inflight) = futures::try_join!(table.storage().head(&requested), table.storage().head(&inflight))?;
    Ok(requested.is_some() || inflight.is_some())
}

/// Removes the fate records nothing reads any more: those of instants completed (or archived)
/// before `cutoff` (a rollback that took such an instant for pending long ago finds it completed after it
/// decides, and gives up: see `super::rollback`), and of instants rolled back and gone from the
/// timeline before `long_ago`. A pending instant keeps its records, however old (a
/// compaction plan may run days after it was made). Records older than the cutoffs are listed
/// only.
pub(crate) async fn prune(table: &Table, cutoff: &str, long_ago: &str) -> Result<()> {
    let storage = table.storage();
    let cutoff_time = crate::format::instant::parse_time(cutoff)?.and_utc();
    for f in storage.list_dir_before(FATE_DIR, cutoff_time).await? {
        let name = f.path.rsplit('/').next().unwrap_or_default();
        // `<time>` or `<time>~<epoch>`; a metadata table's own times have a suffix.
        let time = name.split('~').next().unwrap_or(name);
        let Some(clock) = time.get(..17).filter(|t| *t < cutoff) else { continue };
        let at = table.timeline().instants_at(time);
        let done = if at.is_empty() {
            // Archived (committed, older than the active timeline): as completed.
            table.timeline().is_committed(time) || clock < long_ago
        } else {
            at.iter().all(Instant::is_completed) && at.iter().any(|i| i.action != Action::Savepoint)
        };
        if done {
            storage.delete(&f.path).await?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_first_decision_holds_and_records_round_trip() {
        let s = Storage::in_memory("t").unwrap();
        let t = "20240101000000000";
        let commit = Fate::Committed {
            action: Action::DeltaCommit,
            metadata: Bytes::from_static(b"{\"a\":\n1}"),
            completion: None,
        };
        let rollback = Fate::RolledBack { by: "20240101000000100".into() };
        assert_eq!(decide(&s, t, 0, commit.clone()).await.unwrap(), commit);
        assert_eq!(decide(&s, t, 0, rollback.clone()).await.unwrap(), commit, "the rollback yields");
        assert_eq!(decide(&s, t, 1, rollback.clone()).await.unwrap(), rollback, "another epoch is free");
        assert_eq!(decide(&s, t, 1, commit.clone()).await.unwrap(), rollback, "the stale committer yields");
        overrule(&s, t, 0, "20240101000000200").await.unwrap();
        assert_eq!(recorded(&s, t, 0).await.unwrap(), Some(Fate::RolledBack { by: "20240101000000200".into() }));
        s.put(&path(t, 2), Bytes::from_static(b"garbage")).await.unwrap();
        assert!(matches!(recorded(&s, t, 2).await, Err(Error::CorruptTable { .. })));
        assert!(still(&s, t, 1, &rollback).await.unwrap() && !still(&s, t, 1, &commit).await.unwrap());
        // Only a deliberate overrule overrules: not a rollback's decision (one that won on a
        // pruned record withdraws), not a record pruned (its instant completed).
        assert!(overruled(&s, t, 0).await.unwrap());
        assert!(!overruled(&s, t, 1).await.unwrap(), "a decided rollback");
        assert!(!overruled(&s, t, 5).await.unwrap(), "no record");
        decide(&s, t, 6, commit.clone()).await.unwrap();
        assert!(!overruled(&s, t, 6).await.unwrap(), "a commit");
    }
}
