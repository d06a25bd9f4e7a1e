//! The file-system view: file groups and their slices, built from one listing of the table and
//! filtered by the timeline so that files of uncommitted instants are never seen.

use std::collections::{BTreeMap, HashSet};

use crate::error::Result;
use crate::format::file_name::{BaseFileName, LogFileName, PARTITION_METADATA};
use crate::format::instant::Action;
use crate::storage::{FileInfo, Storage};
use crate::timeline::Timeline;

/// A base file of a file slice.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BaseFile {
    /// The parsed file name.
    pub name: BaseFileName,
    /// Path relative to the table root.
    pub path: String,
    /// Size in bytes.
    pub size: u64,
}

/// A log file of a file slice.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct LogFile {
    /// The parsed file name.
    pub name: LogFileName,
    /// Path relative to the table root.
    pub path: String,
    /// Size in bytes.
    pub size: u64,
}

/// A base file and the log files written on top of it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FileSlice {
    /// Instant of the base file (or of the first log file for a log-only slice).
    pub base_instant: String,
    /// The base file; `None` for a log-only slice.
    pub base: Option<BaseFile>,
    /// Log files on top of the base file, in log order.
    pub logs: Vec<LogFile>,
}

/// All slices of one file id in one partition.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FileGroup {
    /// Partition path, relative to the table root.
    pub partition: String,
    /// File id of the group.
    pub file_id: String,
    /// Slices by base instant.
    pub slices: BTreeMap<String, FileSlice>,
}

/// `(partition, file id)`: the identity of a file group.
pub type FileGroupId = (String, String);

impl FileGroup {
    /// The slice visible at `as_of`: the greatest base instant not after it.
    pub fn slice_as_of(&self, as_of: &str) -> Option<&FileSlice> {
        self.slices.range(..=as_of.to_string()).next_back().map(|(_, s)| s)
    }

    /// The group's `(partition, file id)`.
    pub fn id(&self) -> FileGroupId {
        (self.partition.clone(), self.file_id.clone())
    }
}

/// The committed file groups of a table.
#[derive(Clone, Debug, Default)]
pub struct FileSystemView {
    groups: BTreeMap<FileGroupId, FileGroup>,
    /// Whether a log of an instant the timeline does not hold (archived) was placed by the time
    /// in its name: on timeline layout 2 its slice depends on its completion time, which the
    /// archived timeline holds (see [`FileSystemView::needs_archived_completions`]).
    placed_without_completion: bool,
}

impl FileSystemView {
    /// Lists the table once and keeps the files whose instant is committed.
    pub async fn load(storage: &Storage, timeline: &Timeline, partitioned: bool) -> Result<Self> {
        Ok(Self::from_files(storage.list_table().await?, timeline, partitioned))
    }

    /// The view of a listing of the table's files (from storage, or from the metadata table's
    /// `files` index): files of instants not committed on `timeline` are left out.
    pub fn from_files(files: Vec<FileInfo>, timeline: &Timeline, partitioned: bool) -> Self {
        let mut view = FileSystemView::default();
        for f in files {
            if f.path.starts_with(".hoodie/") {
                continue;
            }
            let (partition, name) = match f.path.rsplit_once('/') {
                Some((p, n)) => (p, n),
                None => ("", f.path.as_str()),
            };
            if partitioned == partition.is_empty() || name.starts_with(PARTITION_METADATA) || name.ends_with(".crc") {
                continue;
            }
            if let Some(base) = BaseFileName::parse(name) {
                if timeline.is_committed(&base.instant) {
                    view.add_base(partition, BaseFile { name: base, path: f.path.clone(), size: f.size });
                }
            } else if let Some(log) = LogFileName::parse(name) {
                // A log is named with its base instant: a committed one, or a compaction that may
                // still be pending (logs written meanwhile go to the new slice). Its blocks are
                // admitted one by one when read.
                let compaction = timeline.get(&log.instant).is_some_and(|i| i.action == Action::Compaction);
                if timeline.is_committed(&log.instant) || compaction {
                    view.add_log(partition, LogFile { name: log, path: f.path.clone(), size: f.size });
                }
            } else {
                log::debug!("ignoring {} (not a base or log file)", f.path);
            }
        }
        view.attach_pending_logs(timeline);
        view
    }

    fn group(&mut self, partition: &str, file_id: &str) -> &mut FileGroup {
        self.groups.entry((partition.to_string(), file_id.to_string())).or_insert_with(|| FileGroup {
            partition: partition.to_string(),
            file_id: file_id.to_string(),
            slices: BTreeMap::new(),
        })
    }

    fn add_base(&mut self, partition: &str, base: BaseFile) {
        let instant = base.name.instant.clone();
        let g = self.group(partition, &base.name.file_id.clone());
        let slice = g
            .slices
            .entry(instant.clone())
            .or_insert_with(|| FileSlice { base_instant: instant, ..Default::default() });
        slice.base = Some(base);
    }

    fn add_log(&mut self, partition: &str, log: LogFile) {
        let instant = log.name.instant.clone();
        let g = self.group(partition, &log.name.file_id.clone());
        // Logs are attached once all bases are known (see `attach_pending_logs`); park them in a
        // slice keyed by their own instant for now.
        g.slices
            .entry(instant.clone())
            .or_insert_with(|| FileSlice { base_instant: instant, ..Default::default() })
            .logs
            .push(log);
    }

    /// Moves each log into the slice with the greatest base instant not after the time the log
    /// joined the table: its instant's completion time where the timeline records one (table
    /// versions 8 and 9 name a log with its own deltacommit, which may complete after a compaction
    /// was requested: its records then belong to the compacted slice, docs/FORMAT.md §4), else the
    /// instant in its name (version 6 names a log with its slice's base instant). Logs are then
    /// ordered by that time, version and write token.
    fn attach_pending_logs(&mut self, timeline: &Timeline) {
        let joined = |instant: &str| -> String {
            timeline.get(instant).and_then(|i| i.completion.clone()).unwrap_or_else(|| instant.to_string())
        };
        if timeline.layout() >= 2 {
            self.placed_without_completion = self
                .groups
                .values()
                .flat_map(|g| g.slices.values())
                .any(|s| s.base.is_none() && s.logs.iter().any(|l| timeline.get(&l.name.instant).is_none()));
        }
        for g in self.groups.values_mut() {
            let parked: Vec<String> =
                g.slices.iter().filter(|(_, s)| s.base.is_none()).map(|(k, _)| k.clone()).collect();
            for key in parked {
                let target =
                    g.slices.range(..=joined(&key)).rev().find(|(_, s)| s.base.is_some()).map(|(k, _)| k.clone());
                if let Some(target) = target
                    && let Some(mut slice) = g.slices.remove(&key)
                    && let Some(t) = g.slices.get_mut(&target)
                {
                    t.logs.append(&mut slice.logs);
                }
            }
            for s in g.slices.values_mut() {
                s.logs.sort_by_cached_key(|l| (joined(&l.name.instant), l.name.version, l.name.write_token.clone()));
            }
        }
    }

    /// Whether this view placed a log of an archived instant by its requested time (timeline
    /// layout 2 without the archived timeline): it must be built again on a timeline that holds
    /// the archived completion times.
    pub fn needs_archived_completions(&self) -> bool {
        self.placed_without_completion
    }

    /// Every file group.
    pub fn groups(&self) -> impl Iterator<Item = &FileGroup> {
        self.groups.values()
    }

    /// The slices visible at `as_of`, excluding replaced file groups.
    pub fn slices_as_of<'a>(
        &'a self,
        as_of: &'a str,
        replaced: &'a HashSet<FileGroupId>,
    ) -> impl Iterator<Item = (&'a FileGroup, &'a FileSlice)> + 'a {
        self.groups
            .iter()
            .filter(move |(id, _)| !replaced.contains(*id))
            .filter_map(move |(_, g)| g.slice_as_of(as_of).map(|s| (g, s)))
    }

    /// The group of a `(partition, file id)`.
    pub fn get(&self, id: &FileGroupId) -> Option<&FileGroup> {
        self.groups.get(id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;

    #[tokio::test]
    async fn uncommitted_and_foreign_files_are_invisible() {
        let s = Storage::in_memory("t").unwrap();
        for f in [
            "p=1/fa-0_0-0-1_20240101000000000.parquet",
            "p=1/fa-0_0-0-1_20240102000000000.parquet",
            "p=1/fb-0_0-0-1_20240103000000000.parquet", // inflight instant
            "p=1/.hoodie_partition_metadata",
            "p=1/stray.txt",
            ".hoodie/20240101000000000.commit",
        ] {
            s.put(f, Bytes::from_static(b"x")).await.unwrap();
        }
        let tl = Timeline::from_file_names(
            ["20240101000000000.commit", "20240102000000000.commit", "20240103000000000.inflight"],
            ".hoodie".into(),
            1,
        );
        let view = FileSystemView::load(&s, &tl, true).await.unwrap();
        let groups: Vec<_> = view.groups().collect();
        assert_eq!(groups.len(), 1);
        let g = groups[0];
        assert_eq!(g.slices.len(), 2);
        assert_eq!(g.slice_as_of("20240101500000000").unwrap().base_instant, "20240101000000000");
        assert_eq!(g.slice_as_of("20250101000000000").unwrap().base_instant, "20240102000000000");
        assert!(g.slice_as_of("20231231000000000").is_none());
        let replaced = HashSet::from([("p=1".to_string(), "fa-0".to_string())]);
        assert_eq!(view.slices_as_of("20250101000000000", &replaced).count(), 0);
    }

    /// The example of docs/FORMAT.md §4 (table version 9): compaction `...29235` requested, completed
    /// `...29883`. The log of deltacommit `...28625` completed at `...29197`, before the request:
    /// it stays in the old slice. The log of `...30911` completed at `...31755`: it joins the
    /// compacted slice. A log of `...26000` requested before the compaction but completed after
    /// it was requested (`...29500`) joins the compacted slice too.
    #[tokio::test]
    async fn layout_2_logs_join_slices_by_completion_time() {
        let s = Storage::in_memory("t").unwrap();
        let files = [
            "p/f-0_0-1-1_20251220210120000.parquet",
            "p/f-0_0-1-1_20251220210129235.parquet",
            "p/.f-0_20251220210128625.log.1_0-1-1",
            "p/.f-0_20251220210130911.log.1_0-1-1",
            "p/.f-0_20251220210126000.log.1_0-1-1",
        ];
        for f in files {
            s.put(f, Bytes::from_static(b"x")).await.unwrap();
        }
        let tl = Timeline::from_file_names(
            [
                "20251220210120000_20251220210121000.deltacommit",
                "20251220210126000_20251220210129500.deltacommit",
                "20251220210128625_20251220210129197.deltacommit",
                "20251220210129235_20251220210129883.commit",
                "20251220210130911_20251220210131755.deltacommit",
            ],
            ".hoodie/timeline".into(),
            2,
        );
        let view = FileSystemView::load(&s, &tl, true).await.unwrap();
        let g = view.groups().next().unwrap();
        let logs = |base: &str| -> Vec<&str> { g.slices[base].logs.iter().map(|l| l.name.instant.as_str()).collect() };
        assert_eq!(g.slices.len(), 2);
        assert_eq!(logs("20251220210120000"), ["20251220210128625"]);
        // Ordered by completion: ...29500 before ...31755.
        assert_eq!(logs("20251220210129235"), ["20251220210126000", "20251220210130911"]);

        // Version 6 names logs with their base instant: attached by name.
        let tl6 = Timeline::from_file_names(
            ["20251220210120000.deltacommit", "20251220210126000.deltacommit"],
            ".hoodie".into(),
            1,
        );
        let s6 = Storage::in_memory("t6").unwrap();
        for f in ["p/f-0_0-1-1_20251220210120000.parquet", "p/.f-0_20251220210120000.log.1_0-1-1"] {
            s6.put(f, Bytes::from_static(b"x")).await.unwrap();
        }
        let view = FileSystemView::load(&s6, &tl6, true).await.unwrap();
        let g = view.groups().next().unwrap();
        assert_eq!(g.slices["20251220210120000"].logs.len(), 1);
    }
}
