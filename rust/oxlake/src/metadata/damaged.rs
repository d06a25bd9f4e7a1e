//! Timeline files that are there but empty where Apache Hudi never leaves one empty: read as
//! "nothing recorded", each would drop what it records (a commit's rows from windows, an
//! archived history from time travel). Readers refuse them where they read them; `validate`
//! names them all.

use crate::error::Result;
use crate::format::instant::{Instant, State};
use crate::format::lsm;
use crate::table::Table;

/// One line per empty file under `.hoodie/` that must hold something: a completed instant (the
/// requested and inflight files of many actions are empty in Java too), a manifest, data file
/// or `_version_` of the archived timeline, a fate record of oxlake's commit protocol.
pub(crate) async fn empty_timeline_files(table: &Table) -> Result<Vec<String>> {
    let storage = table.storage();
    let layout = table.timeline().layout();
    let mut out = Vec::new();
    for f in storage.list_dir(&table.config().timeline_dir()).await? {
        let name = f.path.rsplit('/').next().unwrap_or(&f.path);
        let completed = Instant::parse_file_name(name, layout).is_some_and(|i| i.state == State::Completed);
        if f.size == 0 && completed {
            out.push(format!("{}: empty, though a completed instant records what it did", f.path));
        }
    }
    let history = crate::table::history::history_dir(table);
    for f in storage.list_dir(&history).await? {
        let name = f.path.rsplit('/').next().unwrap_or(&f.path);
        let kept = lsm::manifest_version(name).is_some() || lsm::is_file_name(name) || name == lsm::VERSION_FILE;
        if f.size == 0 && kept {
            out.push(format!("{}: empty file of the archived timeline", f.path));
        }
    }
    for f in storage.list_dir(crate::commit::FATE_DIR).await? {
        if f.size == 0 {
            out.push(format!("{}: empty record of a commit's fate", f.path));
        }
    }
    Ok(out)
}
