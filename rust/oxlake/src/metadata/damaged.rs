//! Files under `.hoodie/` that are there but empty where Apache Hudi never leaves one empty: read
//! as "nothing recorded", each would drop what it records (a commit's rows from windows, an
//! archived history from time travel, a plan from its service). Readers refuse them where they
//! read them; `validate` names them all, for the data table and its metadata table alike. It
//! also names the files beside which Hadoop's checksum (Java Hudi's, on local disk) no longer
//! matches: Java cannot read them.

use crate::error::Result;
use crate::format::instant::{Action, Instant, State};
use crate::format::lsm;
use crate::table::Table;

/// One line per empty file under `.hoodie/` that must hold something:
/// - a completed instant (the requested and inflight files of writes are empty in Java too);
/// - the requested file of an action whose plan is never empty (compaction, log compaction,
///   clustering on layout 2, rollback, restore);
/// - an archive file (layout 1), or a manifest, data file or `_version_` of the LSM history;
/// - a committed schema history file (`.hoodie/.schema`);
/// - oxlake's records: a commit's fate, a slice's compaction claim.
pub(crate) async fn empty_timeline_files(table: &Table) -> Result<Vec<String>> {
    let storage = table.storage();
    let layout = table.timeline().layout();
    let mut out = Vec::new();
    for f in storage.list_dir(&table.config().timeline_dir()).await?.into_iter().filter(|f| f.size == 0) {
        let name = f.path.rsplit('/').next().unwrap_or(&f.path);
        match Instant::parse_file_name(name, layout) {
            Some(i) if i.state == State::Completed => {
                out.push(format!("{}: empty, though a completed instant records what it did", f.path));
            }
            Some(i) if i.state == State::Requested && holds_a_plan(i.action, layout) => {
                out.push(format!("{}: empty, though a requested {} holds its plan", f.path, i.action.name()));
            }
            _ => {}
        }
    }
    let history = crate::table::history::history_dir(table);
    out.extend(empty_files(table, &history, "file of the archived timeline", is_lsm_file).await?);
    let archive = crate::table::history::archive_dir(table);
    out.extend(empty_files(table, &archive, "archive file of the timeline", is_archive_file).await?);
    let schemas = crate::schema::internal::SCHEMA_DIR;
    out.extend(empty_files(table, schemas, "schema history file", is_schema_commit).await?);
    out.extend(empty_files(table, crate::commit::FATE_DIR, "record of a commit's fate", |_| true).await?);
    let claims = crate::commit::slice_claims::DIR;
    out.extend(empty_files(table, claims, "claim of a slice by a compaction", |_| true).await?);
    Ok(out)
}

/// Whether the requested file of `action` always holds a plan (Java writes it with one).
fn holds_a_plan(action: Action, layout: u32) -> bool {
    match action {
        Action::Compaction | Action::LogCompaction | Action::Rollback | Action::Restore => true,
        // Java writes an index plan there; oxlake's own builds leave it empty.
        Action::Indexing => false,
        // Layout 1 clusters under `replacecommit`, whose requested file an insert overwrite leaves empty.
        Action::Clustering => layout >= 2,
        _ => false,
    }
}

/// A line for each empty file of `dir` whose name `kept` picks.
async fn empty_files(table: &Table, dir: &str, what: &str, kept: fn(&str) -> bool) -> Result<Vec<String>> {
    let files = table.storage().list_dir(dir).await?;
    let empty = files.into_iter().filter(|f| f.size == 0 && kept(f.path.rsplit('/').next().unwrap_or(&f.path)));
    Ok(empty.map(|f| format!("{}: empty {what}", f.path)).collect())
}

fn is_lsm_file(name: &str) -> bool {
    lsm::manifest_version(name).is_some() || lsm::is_file_name(name) || name == lsm::VERSION_FILE
}

fn is_archive_file(name: &str) -> bool {
    crate::table::history::archive_version(name).is_some()
}

fn is_schema_commit(name: &str) -> bool {
    name.ends_with(crate::schema::internal::SCHEMA_COMMIT_SUFFIX)
}

/// One line per file of `.hoodie/`, the timeline and the archived timeline whose Hadoop checksum
/// (`.NAME.crc` beside it, written by Java Hudi on local disk) no longer matches it: Java refuses
/// to read such a file. oxlake removes the checksum of every file it replaces
/// (`Storage::put`); one left by an older oxlake is removed by the next write.
pub(crate) async fn stale_hadoop_checksums(table: &Table) -> Result<Vec<String>> {
    let storage = table.storage();
    if !storage.is_local() {
        return Ok(Vec::new());
    }
    let dirs = [".hoodie".to_string(), table.config().timeline_dir(), crate::table::history::history_dir(table)];
    let mut out = Vec::new();
    for dir in dirs.iter().collect::<std::collections::BTreeSet<_>>() {
        for f in storage.list_dir(dir).await? {
            let name = f.path.rsplit('/').next().unwrap_or(&f.path);
            let Some(checked) = name.strip_prefix('.').and_then(|n| n.strip_suffix(".crc")) else { continue };
            let checked = format!("{dir}/{checked}");
            if storage.has_stale_hadoop_checksum(&checked).await? {
                out.push(format!(
                    "{checked}: the Hadoop checksum beside it ({}) no longer matches, so Java Hudi cannot read it; \
                     the next write removes it",
                    f.path
                ));
            }
        }
    }
    Ok(out)
}
