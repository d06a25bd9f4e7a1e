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
//!
//! Once a compaction completed, whoever completed it removes its claims ([`forget`]): a table
//! compacting every few commits would otherwise pile up a file per slice compacted. A compactor
//! that planned from a view read before that compaction completed then takes the old slice again;
//! so after taking its slices a compactor looks at the table as it is now ([`keep_latest`]) and
//! gives back every slice that a committed base file has superseded. The claims it took were
//! created after the removal, which followed the completion: that look sees the completed instant.

use bytes::Bytes;
use futures::{StreamExt, TryStreamExt};

use crate::error::Result;
use crate::format::compaction_plan::{CompactionOperation, CompactionPlan};
use crate::format::file_name::BaseFileName;
use crate::format::instant::{Action, Instant, State};
use crate::table::Table;
use crate::timeline::Timeline;

pub(crate) const DIR: &str = ".hoodie/oxlake/compacting";
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
    // A claim found present may be gone when read: its compaction completed and forgot its
    // claims, or gave the slice back. Then the same generation is tried again, a few times.
    let (mut generation, mut vanished) = (0, 0);
    while generation < MAX_GENERATIONS {
        let path = claim_path(op, generation);
        if storage.put_if_absent(&path, Bytes::from(time.to_string())).await? {
            return Ok(true);
        }
        let Some(owner) = storage.get_opt(&path).await? else {
            vanished += 1;
            if vanished > MAX_GENERATIONS {
                return Ok(false);
            }
            continue;
        };
        generation += 1;
        let owner = String::from_utf8_lossy(&owner).trim().to_string();
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
    for op in CompactionPlan::parse(path, plan)?.operations {
        release_one(table, time, &op).await?;
    }
    Ok(())
}

/// Gives back the slice of `op` if the compaction at `time` holds it.
async fn release_one(table: &Table, time: &str, op: &CompactionOperation) -> Result<()> {
    let storage = table.storage();
    for generation in 0..MAX_GENERATIONS {
        let claim = claim_path(op, generation);
        match storage.get_opt(&claim).await? {
            Some(owner) if String::from_utf8_lossy(&owner).trim() == time => return storage.delete(&claim).await,
            Some(_) => {}
            None => return Ok(()),
        }
    }
    Ok(())
}

/// Of `ops`, the slices the compaction at `time` took, those still the latest of their file
/// group on the table as it is now; the others (a compaction completed since this compactor read
/// its view, and its claims were removed) are given back.
pub(crate) async fn keep_latest(
    table: &Table,
    time: &str,
    ops: Vec<CompactionOperation>,
) -> Result<Vec<CompactionOperation>> {
    if ops.is_empty() {
        return Ok(ops);
    }
    let timeline = Timeline::load(table.storage(), table.config()).await?;
    let superseded = newer_bases(table, &timeline, &ops, None).await?;
    let mut kept = Vec::with_capacity(ops.len());
    for (index, op) in ops.into_iter().enumerate() {
        match superseded.iter().find(|(i, _)| *i == index) {
            Some((_, by)) => {
                log::info!(
                    "{}: compaction {time} gives back slice {} of file group {}: {by} superseded it",
                    table.uri(),
                    op.base_instant_time,
                    op.file_id
                );
                release_one(table, time, &op).await?;
            }
            None => kept.push(op),
        }
    }
    Ok(kept)
}

/// The operations of `ops` (by index) whose file group has a base file newer than the slice, of
/// an instant committed on `timeline` (and earlier than `before`), with that file's path. One
/// listing per partition, from storage: a view of the metadata table may lag.
pub(crate) async fn newer_bases(
    table: &Table,
    timeline: &Timeline,
    ops: &[CompactionOperation],
    before: Option<&str>,
) -> Result<Vec<(usize, String)>> {
    let partitions: std::collections::BTreeSet<String> = ops.iter().map(|op| op.partition_path.clone()).collect();
    let listings: Vec<(String, Vec<crate::storage::FileInfo>)> = futures::stream::iter(partitions)
        .map(|p| async move {
            let files = table.storage().list_dir(&p).await?;
            Ok::<_, crate::error::Error>((p, files))
        })
        .buffered(PARALLEL)
        .try_collect()
        .await?;
    let mut found = Vec::new();
    for (partition, files) in listings {
        for file in files {
            let Some(base) = BaseFileName::parse(file.path.rsplit('/').next().unwrap_or(&file.path)) else {
                continue;
            };
            let newer = ops.iter().position(|op| {
                op.partition_path == partition
                    && op.file_id == base.file_id
                    && base.instant > op.base_instant_time
                    && before.is_none_or(|b| base.instant.as_str() < b)
                    && timeline.is_committed(&base.instant)
            });
            if let Some(index) = newer {
                found.push((index, file.path));
            }
        }
    }
    Ok(found)
}

/// Removes the claims on the slices of `plan`, which the compaction at `time` completed: no plan
/// takes them again (see [`keep_latest`]). A claim left behind (a crash before this) is pruned
/// with the markers.
pub(crate) async fn forget(table: &Table, time: &str, plan: &CompactionPlan) -> Result<()> {
    futures::stream::iter(plan.operations.clone())
        .map(|op| async move {
            // Generations are taken in order: the first one missing ends the slice's claims.
            for generation in 0..MAX_GENERATIONS {
                let claim = claim_path(&op, generation);
                if table.storage().get_opt(&claim).await?.is_none() {
                    break;
                }
                table.storage().delete(&claim).await?;
            }
            log::debug!("{}: compaction {time} removed its claim on {}", table.uri(), op.file_id);
            Ok::<_, crate::error::Error>(())
        })
        .buffer_unordered(PARALLEL)
        .try_collect::<Vec<()>>()
        .await?;
    Ok(())
}

/// Removes the claims of slices compacted by instants older than `cutoff`: no compactor plans
/// from a view that old. A claim is written when its compaction is planned, after its time: only
/// slices whose claims were all written before the cutoff are read (a clean after every commit
/// reads few).
///
/// A slice's claims go together, the latest generation first, and only once every generation's
/// owner completed: a compactor walks the generations from the first, so an earlier one removed
/// while a later one is still pending would let it take the slice beside that later owner.
pub(crate) async fn prune(table: &Table, cutoff: &str) -> Result<()> {
    let storage = table.storage();
    let written_before = crate::format::instant::parse_time(cutoff)?.and_utc();
    let old: std::collections::HashSet<String> =
        storage.list_dir_before(DIR, written_before).await?.into_iter().map(|f| f.path).collect();
    if old.is_empty() {
        return Ok(());
    }
    let mut slices: std::collections::BTreeMap<String, Vec<(u32, String)>> = std::collections::BTreeMap::new();
    for f in storage.list_dir(DIR).await? {
        let (stem, generation) = match f.path.rsplit_once('~') {
            Some((stem, n)) => (stem.to_string(), n.parse().unwrap_or(u32::MAX)),
            None => (f.path.clone(), 0),
        };
        slices.entry(stem).or_default().push((generation, f.path));
    }
    'slices: for (_, mut claims) in slices {
        if !claims.iter().all(|(_, path)| old.contains(path)) {
            continue;
        }
        for (_, path) in &claims {
            let owner = match storage.get_opt(path).await? {
                Some(b) => String::from_utf8_lossy(&b).trim().to_string(),
                None => continue 'slices, // forgotten meanwhile by its compaction
            };
            let completed = table.timeline().instants_at(&owner).iter().any(|i| i.is_completed());
            if owner.as_str() >= cutoff || !completed {
                continue 'slices;
            }
        }
        claims.sort_unstable_by_key(|c| std::cmp::Reverse(c.0));
        for (_, path) in &claims {
            storage.delete(path).await?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::TableType;
    use crate::services::CompactionConfig;
    use crate::table::TableOptions;
    use crate::test_support::{id_city_rows, id_city_table};
    use crate::write::{WriteConfig, WriteOperation};

    async fn claims(table: &Table) -> Vec<String> {
        table.storage().list_dir(DIR).await.unwrap().into_iter().map(|f| f.path).collect()
    }

    #[tokio::test]
    async fn a_completed_compaction_removes_its_claims_and_a_stale_plan_gives_its_slices_back() {
        let dir = tempfile::tempdir().unwrap();
        let mut t = id_city_table(dir.path(), TableType::MergeOnRead, TableOptions::default()).await;
        let config = WriteConfig::default();
        t.write(WriteOperation::Insert, vec![id_city_rows(&[(1, "sf"), (2, "nyc")])], &config).await.unwrap();
        t.write(WriteOperation::Upsert, vec![id_city_rows(&[(1, "sf"), (2, "nyc")])], &config).await.unwrap();
        // What a compactor that read the table now plans, and then pauses.
        let latest = t.timeline().latest_completed_data().unwrap().time.clone();
        let view = t.file_system_view().await.unwrap();
        let replaced = t.replaced_file_groups(&latest).await.unwrap();
        let stale: Vec<CompactionOperation> = view
            .slices_as_of(&latest, &replaced)
            .map(|(g, s)| CompactionOperation {
                partition_path: g.partition.clone(),
                file_id: g.file_id.clone(),
                base_instant_time: s.base_instant.clone(),
                data_file_path: s.base.as_ref().map(|b| b.path.clone()),
                delta_file_paths: s.logs.iter().map(|l| l.path.clone()).collect(),
            })
            .collect();
        assert_eq!(stale.len(), 2);
        let done = t.compact(&CompactionConfig::default()).await.unwrap();
        assert_eq!((done.instants.len(), done.file_groups), (1, 2));
        assert!(claims(&t).await.is_empty(), "a completed compaction leaves no claim");
        // The paused compactor wakes: its claims succeed (nothing holds the old slices now), and
        // its look at the table as it is gives them back.
        let time = crate::format::instant::now();
        let taken = take(&t, &time, stale).await.unwrap();
        assert_eq!(taken.len(), 2, "the old slices' claims were removed");
        assert!(keep_latest(&t, &time, taken).await.unwrap().is_empty(), "both slices were compacted since");
        assert!(claims(&t).await.is_empty());
        // A compaction of the slices as they are still takes them.
        t.write(WriteOperation::Upsert, vec![id_city_rows(&[(1, "sf")])], &config).await.unwrap();
        let done = t.compact(&CompactionConfig::default()).await.unwrap();
        assert_eq!(done.file_groups, 1);
        assert!(claims(&t).await.is_empty());
    }

    #[tokio::test]
    async fn pruning_keeps_every_generation_of_a_slice_until_all_owners_completed() {
        let dir = tempfile::tempdir().unwrap();
        let mut t = id_city_table(dir.path(), TableType::MergeOnRead, TableOptions::default()).await;
        let config = WriteConfig::default();
        t.write(WriteOperation::Insert, vec![id_city_rows(&[(1, "sf")])], &config).await.unwrap();
        t.write(WriteOperation::Upsert, vec![id_city_rows(&[(1, "sf")])], &config).await.unwrap();
        let done: Vec<String> = t.timeline().completed_data().map(|i| i.time.clone()).collect();
        let pending = "20500101000000000"; // a compaction still planning: not on the timeline
        let op = |file_id: &str| CompactionOperation {
            partition_path: "city=sf".into(),
            file_id: file_id.into(),
            base_instant_time: done[0].clone(),
            data_file_path: None,
            delta_file_paths: vec![],
        };
        let put = |path: String, owner: String| {
            let t = &t;
            async move { t.storage().put(&path, Bytes::from(owner)).await.unwrap() }
        };
        // Slice a: its first owner completed, the one that took it over after it is pending.
        put(claim_path(&op("a"), 0), done[0].clone()).await;
        put(claim_path(&op("a"), 1), pending.to_string()).await;
        // Slice b: both owners completed.
        put(claim_path(&op("b"), 0), done[0].clone()).await;
        put(claim_path(&op("b"), 1), done[1].clone()).await;
        prune(&t, "20991231235959999").await.unwrap();
        let mut left = claims(&t).await;
        left.sort();
        assert_eq!(left, vec![claim_path(&op("a"), 0), claim_path(&op("a"), 1)], "slice a stays whole, b goes");
    }

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
