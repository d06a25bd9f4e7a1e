//! The file-system view: file groups and their slices, built from one listing of the table and
//! filtered by the timeline so that files of uncommitted instants are never seen.

use std::collections::{BTreeMap, HashSet};

use crate::error::Result;
use crate::format::file_name::{BaseFileName, LogFileName, PARTITION_METADATA};
use crate::format::instant::Action;
use crate::storage::Storage;
use crate::timeline::Timeline;

/// A base file of a file slice.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BaseFile {
    pub name: BaseFileName,
    /// Path relative to the table root.
    pub path: String,
    pub size: u64,
}

/// A log file of a file slice.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LogFile {
    pub name: LogFileName,
    pub path: String,
    pub size: u64,
}

/// A base file and the log files written on top of it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FileSlice {
    /// Instant of the base file (or of the first log file for a log-only slice).
    pub base_instant: String,
    pub base: Option<BaseFile>,
    pub logs: Vec<LogFile>,
}

/// All slices of one file id in one partition.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FileGroup {
    pub partition: String,
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

    pub fn id(&self) -> FileGroupId {
        (self.partition.clone(), self.file_id.clone())
    }
}

/// The committed file groups of a table.
#[derive(Clone, Debug, Default)]
pub struct FileSystemView {
    groups: BTreeMap<FileGroupId, FileGroup>,
}

impl FileSystemView {
    /// Lists the table once and keeps the files whose instant is committed.
    pub async fn load(storage: &Storage, timeline: &Timeline, partitioned: bool) -> Result<Self> {
        let files = storage.list_recursive("").await?;
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
        view.attach_pending_logs();
        Ok(view)
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

    /// Moves each log into the slice with the greatest base instant not after the log's instant.
    fn attach_pending_logs(&mut self) {
        for g in self.groups.values_mut() {
            let parked: Vec<String> =
                g.slices.iter().filter(|(_, s)| s.base.is_none()).map(|(k, _)| k.clone()).collect();
            for key in parked {
                let target =
                    g.slices.range(..key.clone()).rev().find(|(_, s)| s.base.is_some()).map(|(k, _)| k.clone());
                if let Some(target) = target
                    && let Some(mut slice) = g.slices.remove(&key)
                    && let Some(t) = g.slices.get_mut(&target)
                {
                    t.logs.append(&mut slice.logs);
                }
            }
            for s in g.slices.values_mut() {
                s.logs.sort_by(|a, b| {
                    (&a.name.instant, a.name.version, &a.name.write_token).cmp(&(
                        &b.name.instant,
                        b.name.version,
                        &b.name.write_token,
                    ))
                });
            }
        }
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
}
