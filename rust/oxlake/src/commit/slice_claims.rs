//! Which compaction owns a file slice: at most one plan ever compacts a slice.
//!
//! Two compactors that each read the timeline and then plan may both plan one slice; the one that
//! completes later then replaces the other's new slice, and the logs written into that slice are
//! lost. So a compaction, once its instant time is claimed and before its plan is visible, takes
//! each slice with a conditional create of `.hoodie/oxlake/compacting/<slice>` holding its time;
//! the slices it could not take are left out of its plan (they are another plan's, or compacted).
//!
//! A compactor that crashed between taking a slice and writing its plan leaves the slice taken
//! with no plan. It beats (a heartbeat of its instant time) from before it takes slices: once
//! that heartbeat expired with no plan on the timeline, another compactor closes that time (creating its requested file with an
//! empty plan, a conditional create: the slow owner's own create then fails, and it gives up) and
//! takes the slice at the next generation (`<slice>~<n>`), again with a conditional create.

use bytes::Bytes;
use futures::{StreamExt, TryStreamExt};

use crate::error::Result;
use crate::format::compaction_plan::{CompactionOperation, CompactionPlan};
use crate::format::instant::{Action, Instant, State};
use crate::table::Table;

const DIR: &str = ".hoodie/oxlake/compacting";
/// Generations of one slice's claim a compactor walks before it leaves the slice alone.
const MAX_GENERATIONS: u32 = 8;
/// Claims taken at once.
const PARALLEL: usize = 16;

fn claim_path(op: &CompactionOperation, generation: u32) -> String {
    // The partition path may hold any character: it is named by a stable hash.
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in op.partition_path.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    let suffix = if generation == 0 { String::new() } else { format!("~{generation}") };
    format!("{DIR}/{}_{}_{h:016x}{suffix}", op.base_instant_time, op.file_id)
}

/// Takes the slices of `ops` for the compaction at `time`; returns the operations whose slice it
/// took, in their order.
pub(crate) async fn take(table: &Table, time: &str, ops: Vec<CompactionOperation>) -> Result<Vec<CompactionOperation>> {
    let taken: Vec<Option<CompactionOperation>> = futures::stream::iter(ops)
        .map(|op| async move { Ok::<_, crate::error::Error>(take_one(table, time, &op).await?.then_some(op)) })
        .buffered(PARALLEL)
        .try_collect()
        .await?;
    let (kept, left): (Vec<_>, Vec<_>) = taken.into_iter().partition(Option::is_some);
    if !left.is_empty() {
        log::info!("{}: compaction {time} leaves {} slices to other plans", table.uri(), left.len());
    }
    Ok(kept.into_iter().flatten().collect())
}

async fn take_one(table: &Table, time: &str, op: &CompactionOperation) -> Result<bool> {
    let storage = table.storage();
    for generation in 0..MAX_GENERATIONS {
        let path = claim_path(op, generation);
        if storage.put_if_absent(&path, Bytes::from(time.to_string())).await? {
            return Ok(true);
        }
        let owner = String::from_utf8_lossy(&storage.get(&path).await?).trim().to_string();
        if owner == time {
            return Ok(true); // this compactor's own claim, whose answer was lost
        }
        if !orphaned(table, &owner, op).await? {
            return Ok(false);
        }
        log::info!("{}: the slice {path} was taken by {owner}, which is gone: compaction {time} takes it", table.uri());
    }
    Ok(false)
}

/// Whether the compaction at `owner` gave up the slice of `op`: its plan leaves it out (closed
/// with an empty plan, or removed), or it never wrote one and is too old to.
async fn orphaned(table: &Table, owner: &str, op: &CompactionOperation) -> Result<bool> {
    let at = table.timeline().instants_at(owner);
    if at.iter().any(|i| i.is_completed()) {
        return Ok(false); // compacted: the slice is old
    }
    if at.is_empty() && table.timeline().write_timeline_start().is_some_and(|s| owner < s) {
        // Older than the active timeline: archived, so it completed (archival moves completed
        // instants only). Closing it now would put a pending instant before the timeline.
        return Ok(false);
    }
    let requested = Instant::new(owner, Action::Compaction, State::Requested);
    let path = table.timeline().path_of(&requested);
    let plan = match table.storage().get_opt(&path).await? {
        Some(bytes) => bytes,
        None => {
            // The owner beats from before it takes slices until its plan is written.
            if !super::is_expired(table, &requested).await? {
                return Ok(false); // its plan may still come
            }
            let closed = Bytes::from(CompactionPlan::default().to_avro()?);
            if table.timeline().create(table.storage(), &requested, closed).await? {
                log::info!("{}: closed the instant {owner} of a compactor gone before writing its plan", table.uri());
                return Ok(true);
            }
            table.storage().get(&path).await?
        }
    };
    let plan = CompactionPlan::parse(&path, &plan)?;
    Ok(!plan.operations.iter().any(|o| o.partition_path == op.partition_path && o.file_id == op.file_id))
}

/// Gives back the slices the compaction at `time` took for its plan `plan` (stored at `path`),
/// which it abandons before anyone saw it: each claim still holding `time` is removed.
pub(crate) async fn release(table: &Table, time: &str, path: &str, plan: &[u8]) -> Result<()> {
    let storage = table.storage();
    for op in CompactionPlan::parse(path, plan)?.operations {
        for generation in 0..MAX_GENERATIONS {
            let claim = claim_path(&op, generation);
            match storage.get_opt(&claim).await? {
                Some(owner) if String::from_utf8_lossy(&owner).trim() == time => {
                    storage.delete(&claim).await?;
                    break;
                }
                Some(_) => {}
                None => break,
            }
        }
    }
    Ok(())
}

/// Removes the claims of slices compacted by instants older than `cutoff`: no compactor plans
/// from a view that old. A claim is written when its compaction is planned, after its time: only
/// claims written before the cutoff are read (a clean after every commit reads few).
pub(crate) async fn prune(table: &Table, cutoff: &str) -> Result<()> {
    let storage = table.storage();
    let written_before = crate::format::instant::parse_time(cutoff)?.and_utc();
    for f in storage.list_dir_before(DIR, written_before).await? {
        let owner = match storage.get_opt(&f.path).await? {
            Some(b) => String::from_utf8_lossy(&b).trim().to_string(),
            None => continue,
        };
        if owner.as_str() < cutoff && table.timeline().instants_at(&owner).iter().any(|i| i.is_completed()) {
            storage.delete(&f.path).await?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn claims_name_a_slice_whatever_its_partition_holds() {
        let op = |p: &str, base: &str| CompactionOperation {
            partition_path: p.into(),
            file_id: "f-0".into(),
            base_instant_time: base.into(),
            data_file_path: None,
            delta_file_paths: vec![],
        };
        let a = claim_path(&op("city=Zürich/x", "20240101000000000"), 0);
        assert!(a.starts_with(".hoodie/oxlake/compacting/20240101000000000_f-0_") && !a[26..].contains('/'));
        assert_ne!(a, claim_path(&op("city=Zurich/x", "20240101000000000"), 0), "partitions differ");
        assert_ne!(a, claim_path(&op("city=Zürich/x", "20240102000000000"), 0), "slices differ");
        assert_eq!(claim_path(&op("p", "1"), 2), format!("{}~2", claim_path(&op("p", "1"), 0)));
    }
}
