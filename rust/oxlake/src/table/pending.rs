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
    let pending: Vec<Instant> =
        table.timeline().pending().filter(|i| i.action == Action::ReplaceCommit).cloned().collect();
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
    let mut out = HashSet::new();
    for clean in table.timeline().pending().filter(|i| i.action == Action::Clean) {
        let path = table.timeline().path_of(&clean.with_state(State::Requested));
        let bytes = table.storage().get(&path).await?;
        if bytes.is_empty() {
            continue; // Java deletes an empty pending clean: nothing to delete
        }
        match clean::read_plan(&path, &bytes)? {
            Stored::Avro(p) => out.extend(p.files(&path)?),
            Stored::Legacy(p) => out.extend(p.files_to_delete),
        }
    }
    Ok(out)
}
