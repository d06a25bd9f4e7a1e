//! Slices read by the keys their logs hold ([`KeysOf`]): where no other key of a file group can
//! differ between what a query compares, only the base file's rows of those keys are read, so a
//! change of 1% of a large file group reads that 1% of its base file. Planning marks such slices
//! here; [`super::mor_exec`] reads the keys (of the blocks admitted up to [`KeysOf::upper`]) and
//! selects the base rows by them.

use std::collections::{HashMap, HashSet};

use serde::{Deserialize, Serialize};

use super::{CommitWindow, PlannedSlice, ScanPlan};
use crate::table::fs_view::{FileGroupId, LogFile};

/// The keys a slice reads of its base file: those of the data and delete blocks of `logs` whose
/// instants completed up to `upper` (rolled back or compacted alike). A change query reads so
/// both snapshots of a file group that share their base file (no other key can differ between
/// them: [`super::changes`]), with the later snapshot's logs and instant on both sides, so that the two
/// read the same rows; an incremental read, a slice whose base file holds no row of its window
/// (`read_older_bases_by_logged_keys`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeysOf {
    /// The log files whose blocks name the keys.
    pub logs: Vec<LogFile>,
    /// Blocks of later instants are not read.
    pub upper: String,
}

/// Marks the file groups whose two snapshots share their base file, the logs read at `start`
/// being among those read at `end`, to be read by the keys of the latter logs on both sides
/// ([`PlannedSlice::keys_of`]): the same base rows under the same log blocks merge alike, so only
/// a key some block of those logs holds (of an instant completed by `end`, rolled back or not)
/// can differ. Both sides take the keys as of `end`, so that they read the same base rows
/// whatever a rollback removes meanwhile. A change of 1% of a large file group then reads that 1%
/// of its base file, not all of it. Other groups (a new base file in the window, logs gone since
/// `start`) are read whole.
pub(super) fn read_shared_bases_by_logged_keys(before: &mut ScanPlan, after: &mut ScanPlan) {
    let mut at_start: HashMap<FileGroupId, &mut PlannedSlice> =
        before.slices.iter_mut().map(|s| (s.group_id(), s)).collect();
    let base = |s: &PlannedSlice| s.base.as_ref().map(|b| (b.path.clone(), b.rows));
    for end in after.slices.iter_mut().filter(|s| !s.logs.is_empty()) {
        let Some(start) = at_start.remove(&end.group_id()) else { continue };
        let later: HashSet<&str> = end.logs.iter().map(|l| l.path.as_str()).collect();
        if base(start) == base(end) && start.logs.iter().all(|l| later.contains(l.path.as_str())) {
            let keys = KeysOf { logs: end.logs.clone(), upper: after.upper.clone() };
            start.keys_of = Some(keys.clone());
            end.keys_of = Some(keys);
        }
    }
}

/// Marks the slices of an incremental read whose base file holds no row of the `window` to be read
/// by the keys of their logs ([`PlannedSlice::keys_of`]): a row of the window is then a log's, and
/// a key no log holds merges to its base row, which the window's filter drops anyway. A row's
/// commit time is at most the instant that wrote its base file (compactions and clusterings keep
/// earlier ones), so a base file written before every instant of the window holds none of its rows.
pub(super) fn read_older_bases_by_logged_keys(slices: &mut [PlannedSlice], window: &CommitWindow, upper: &str) {
    let before_window = |written: &str| match window {
        CommitWindow::Range(start, _) => written <= start.as_str(),
        CommitWindow::Instants(times) => times.iter().all(|t| written < t.as_str()),
    };
    for slice in slices.iter_mut().filter(|s| !s.logs.is_empty()) {
        let written = slice.base.as_ref().and_then(|b| crate::format::file_name::base_file_instant(&b.path));
        if written.is_some_and(|w| before_window(&w)) {
            slice.keys_of = Some(KeysOf { logs: slice.logs.clone(), upper: upper.to_string() });
        }
    }
}

/// About the bytes of a slice's rows a change query joins: of a slice read by keys, as many base
/// rows as its keys' logs hold records, so at most those logs' bytes of its base file.
pub(super) fn joined_bytes(slice: &PlannedSlice) -> u64 {
    match &slice.keys_of {
        Some(keys) => {
            let logs = |l: &[LogFile]| l.iter().map(|l| l.size).sum::<u64>();
            slice.base_size().min(logs(&keys.logs)) + logs(&slice.logs)
        }
        None => slice.size(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::file_name::LogFileName;
    use crate::read::PlannedFile;

    /// A log file of `group` of version `version`.
    fn log(group: &str, version: &str) -> LogFile {
        let name = format!(".{group}_20260101000000000.log.{version}_0-1-1");
        LogFile { name: LogFileName::parse(&name).unwrap(), path: format!("p/{name}"), size: 10 }
    }

    fn slice(group: &str, base: Option<&str>, logs: Vec<LogFile>) -> PlannedSlice {
        let base = base.map(|b| PlannedFile { partition: "p".into(), path: format!("p/{b}"), size: 100, rows: None });
        PlannedSlice { partition: "p".into(), file_id: group.into(), base, logs, keys_of: None }
    }

    fn plan(upper: &str, slices: Vec<PlannedSlice>) -> ScanPlan {
        ScanPlan { slices, upper: upper.into(), commit_range: None }
    }

    /// A group whose two slices share their base file, the start's logs among the end's, is read
    /// on both sides by the keys of the end's logs as of the end; no other group is.
    #[test]
    fn groups_sharing_their_base_file_with_the_starts_logs_kept_are_read_by_the_ends_logs_keys() {
        let (a1, a2, c1, c2) = (log("a", "1"), log("a", "2"), log("c", "1"), log("c", "2"));
        let mut before = plan(
            "01",
            vec![
                slice("a", Some("a_1.parquet"), vec![a1.clone()]),
                slice("b", Some("b_1.parquet"), vec![]),
                slice("c", Some("c_1.parquet"), vec![c1]),
                slice("e", Some("e_1.parquet"), vec![]),
            ],
        );
        let mut after = plan(
            "02",
            vec![
                slice("a", Some("a_1.parquet"), vec![a1, a2]),
                slice("b", Some("b_2.parquet"), vec![log("b", "1")]), // a new base file
                slice("c", Some("c_1.parquet"), vec![c2]),            // the start's log is gone
                slice("d", None, vec![log("d", "1")]),                // at the end only
                slice("e", Some("e_1.parquet"), vec![]),              // no log
            ],
        );
        read_shared_bases_by_logged_keys(&mut before, &mut after);
        let keyed = |p: &ScanPlan| -> Vec<(String, Option<KeysOf>)> {
            p.slices.iter().map(|s| (s.file_id.clone(), s.keys_of.clone())).collect()
        };
        let a = KeysOf { logs: after.slices[0].logs.clone(), upper: "02".into() };
        assert_eq!(
            keyed(&before),
            vec![("a".into(), Some(a.clone())), ("b".into(), None), ("c".into(), None), ("e".into(), None)]
        );
        assert_eq!(
            keyed(&after),
            vec![("a".into(), Some(a)), ("b".into(), None), ("c".into(), None), ("d".into(), None), ("e".into(), None)]
        );
    }

    /// An instant time: the `n`th of a day.
    fn at(n: u32) -> String {
        format!("20260101000000{n:03}")
    }

    fn slice_at(base_instant: u32, logs: &[&str]) -> PlannedSlice {
        let base_instant = at(base_instant);
        let base = PlannedFile {
            partition: "p".into(),
            path: format!("p/g_0-1-1_{base_instant}.parquet"),
            size: 100,
            rows: None,
        };
        let logs = logs
            .iter()
            .map(|i| {
                let name = format!(".g_{base_instant}.log.{i}_0-1-1");
                LogFile { name: LogFileName::parse(&name).unwrap(), path: format!("p/{name}"), size: 10 }
            })
            .collect();
        PlannedSlice { partition: "p".into(), file_id: "g".into(), base: Some(base), logs, keys_of: None }
    }

    fn keyed(slice: PlannedSlice, window: &CommitWindow) -> bool {
        let mut slices = [slice];
        read_older_bases_by_logged_keys(&mut slices, window, "30");
        let [slice] = slices;
        slice
            .keys_of
            .inspect(|k| assert_eq!((k.logs.as_slice(), k.upper.as_str()), (slice.logs.as_slice(), "30")))
            .is_some()
    }

    /// A slice with logs is read by their keys when its base file was written before every
    /// instant of the window: at or before the start of a range of requested times (whose start is
    /// outside it), strictly before each instant listed.
    #[test]
    fn a_slice_is_read_by_its_logs_keys_when_its_base_file_precedes_the_window() {
        let range = |start: u32| CommitWindow::Range(at(start), at(30));
        assert!(keyed(slice_at(10, &["1"]), &range(10)));
        assert!(keyed(slice_at(10, &["1"]), &range(20)));
        assert!(!keyed(slice_at(20, &["1"]), &range(10)));
        assert!(!keyed(slice_at(10, &[]), &range(20))); // no logs: read as a base file
        let listed = |times: &[u32]| CommitWindow::Instants(times.iter().map(|&t| at(t)).collect());
        assert!(keyed(slice_at(10, &["1"]), &listed(&[20, 30])));
        assert!(!keyed(slice_at(20, &["1"]), &listed(&[20, 30])));
        assert!(!keyed(slice_at(25, &["1"]), &listed(&[20, 30])));
    }
}
