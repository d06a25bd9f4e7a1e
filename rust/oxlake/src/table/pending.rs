//! What pending table services hold: the plan of a pending compaction, and the file groups of
//! every pending compaction and clustering (writers route their logs and inserts by them, the
//! conflict check compares against them).

use std::collections::{HashMap, HashSet};

use crate::error::Result;
use crate::format::clean::{self, Stored};
use crate::format::clustering_plan::planned_file_groups;
use crate::format::compaction_plan::CompactionPlan;
use crate::format::instant::{Action, Instant, State};
use crate::table::Table;
use crate::table::fs_view::FileGroupId;

/// Reads the plan of a compaction instant.
pub async fn read_compaction_plan(table: &Table, time: &str) -> Result<CompactionPlan> {
    let instant = crate::format::instant::Instant::new(time, Action::Compaction, State::Requested);
    let path = table.timeline().path_of(&instant);
    CompactionPlan::parse(&path, &table.storage().get(&path).await?)
}

/// The file groups of every pending compaction, with the compaction's instant: new logs of those
/// groups are named with it.
pub async fn pending_compaction_groups(table: &Table) -> Result<HashMap<FileGroupId, String>> {
    let mut out = HashMap::new();
    let pending: Vec<String> =
        table.timeline().pending().filter(|i| i.action == Action::Compaction).map(|i| i.time.clone()).collect();
    for time in pending {
        // A plan removed since the timeline was read gave way (the metadata table's compactions
        // do): it has no slice to write into.
        let path = table.timeline().path_of(&Instant::new(time.clone(), Action::Compaction, State::Requested));
        let Some(bytes) = table.storage().get_opt(&path).await? else { continue };
        for op in CompactionPlan::parse(&path, &bytes)?.operations {
            out.insert((op.partition_path, op.file_id), time.clone());
        }
    }
    Ok(out)
}

/// The file groups of every pending clustering (writers keep their inserts out of them).
pub async fn pending_clustering_groups(table: &Table) -> Result<HashSet<FileGroupId>> {
    let mut out = HashSet::new();
    let pending: Vec<Instant> = table
        .timeline()
        .pending()
        .filter(|i| matches!(i.action, Action::ReplaceCommit | Action::Clustering))
        .cloned()
        .collect();
    for instant in pending {
        let path = table.timeline().path_of(&instant.with_state(State::Requested));
        let Some(bytes) = table.storage().get_opt(&path).await? else { continue };
        out.extend(planned_file_groups(&path, &bytes)?);
    }
    Ok(out)
}

/// The files the pending cleans plan to delete (Java's Avro plans, and the JSON earlier oxlake
/// versions wrote).
pub async fn pending_clean_files(table: &Table) -> Result<HashSet<String>> {
    Ok(pending_cleans(table).await?.into_iter().flat_map(|(_, files)| files).collect())
}

/// Each pending clean's time and the files its plan deletes (some may be gone already: a cleaner
/// that died after deleting them).
pub async fn pending_cleans(table: &Table) -> Result<Vec<(String, Vec<String>)>> {
    let mut out = Vec::new();
    for clean in table.timeline().pending().filter(|i| i.action == Action::Clean) {
        let path = table.timeline().path_of(&clean.with_state(State::Requested));
        let bytes = table.storage().get(&path).await?;
        if bytes.is_empty() {
            continue; // Java deletes an empty pending clean: nothing to delete
        }
        let files = match clean::read_plan(&path, &bytes)? {
            Stored::Avro(p) => p.files(&path)?,
            Stored::Legacy(p) => p.files_to_delete,
        };
        out.push((clean.time.clone(), files));
    }
    Ok(out)
}

/// The logs of completed deltacommits that belong to a slice `plan` compacts at `time` but are
/// not in it, by the slicing rule of timeline layout 2 (a log joins the slice whose base instant
/// is the latest not after the log's completion time: docs/FORMAT.md §4), as `(operation index,
/// log path, deltacommit time)`. Logs completed after `time` join the compacted slice instead.
pub async fn logs_missing_from_plan(
    table: &Table,
    time: &str,
    plan: &CompactionPlan,
) -> Result<Vec<(usize, String, String)>> {
    let oldest = plan.operations.iter().map(|op| op.base_instant_time.as_str()).min().unwrap_or(time);
    let mut out = Vec::new();
    let deltas = table.timeline().completed_data().filter(|i| i.action == Action::DeltaCommit);
    for d in deltas {
        let Some(completion) = d.completion.as_deref() else { continue };
        if completion >= time || completion < oldest {
            continue;
        }
        let meta = table.timeline().commit_metadata(table.storage(), d).await?;
        for (partition, stat) in meta.write_stats() {
            let (Some(_), Some(path)) = (&stat.log_files, &stat.path) else { continue };
            let name = path.rsplit('/').next().unwrap_or(path);
            for (index, op) in plan.operations.iter().enumerate() {
                let same_group = op.partition_path == partition && op.file_id == stat.file_id;
                let joined = op.base_instant_time.as_str() <= completion;
                let listed = op.delta_file_paths.iter().any(|p| p.rsplit('/').next() == Some(name));
                if same_group && joined && !listed {
                    out.push((index, path.clone(), d.time.clone()));
                }
            }
        }
    }
    Ok(out)
}
