//! Folders of markers named by instant time, filed in ten-minute buckets.
//!
//! The claims of instant and completion times, and the marks of archivals, are kept a few
//! minutes (see `super::claims::prune_claims`): a table committing every second still holds
//! hundreds of them. Writers only ever look at the newest (claims after the latest time on the
//! timeline), so each marker `<name>` (starting with a time `yyyyMMddHHmmssSSS`) is filed under
//! `<dir>/<first 11 digits>/<name>`: a listing reads the buckets from the one of the time it
//! starts at (one or two, on a table that commits), whatever the table's age, and pruning deletes
//! whole buckets. On S3 a listing inside a bucket also starts after that time (`start-after`).
//!
//! Markers written flat (`<dir>/<name>`, before this layout) are still listed and pruned.

use futures::{StreamExt, TryStreamExt};

use crate::error::Result;
use crate::storage::{FileInfo, Storage};

/// Digits of a time that name its bucket: `yyyyMMddHHm`, ten minutes.
const BUCKET_DIGITS: usize = 11;
/// Buckets listed at once.
const LISTINGS_AT_ONCE: usize = 4;

/// A folder of markers named by time.
#[derive(Clone, Copy, Debug)]
pub(crate) struct MarkerDir(pub(crate) &'static str);

/// One marker found by a listing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Marker {
    /// Its name: a time, then anything.
    pub(crate) name: String,
    /// Its path, relative to the table root.
    pub(crate) path: String,
    /// Written flat, before buckets.
    pub(crate) flat: bool,
}

fn bucket(name: &str) -> &str {
    name.get(..BUCKET_DIGITS).unwrap_or(name)
}

fn last_part(path: &str) -> &str {
    path.trim_end_matches('/').rsplit('/').next().unwrap_or(path)
}

impl MarkerDir {
    /// Where the marker `name` is filed.
    pub(crate) fn path(self, name: &str) -> String {
        format!("{}/{}/{name}", self.0, bucket(name))
    }

    /// Every marker whose name sorts after `after` (a time, or a name), oldest first.
    pub(crate) async fn list_after(self, storage: &Storage, after: &str) -> Result<Vec<Marker>> {
        let (flat, buckets) = storage.list_level(self.0).await?;
        let first = bucket(after);
        let buckets: Vec<String> = buckets.into_iter().filter(|b| last_part(b) >= first).collect();
        let listed: Vec<Vec<FileInfo>> = futures::stream::iter(buckets)
            .map(|b| async move {
                if last_part(&b) == first {
                    storage.list_dir_after(&b, after).await
                } else {
                    storage.list_dir(&b).await
                }
            })
            .buffered(LISTINGS_AT_ONCE)
            .try_collect()
            .await?;
        let mut markers: Vec<Marker> = flat
            .into_iter()
            .map(|f| (f, true))
            .chain(listed.into_iter().flatten().map(|f| (f, false)))
            .map(|(f, flat)| Marker { name: last_part(&f.path).to_string(), path: f.path, flat })
            .filter(|m| m.name.as_str() > after)
            .collect();
        markers.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(markers)
    }

    /// Removes the markers filed before `cutoff` (a time): whole buckets older than its own, and
    /// in its own bucket and flat the markers named before it.
    pub(crate) async fn prune(self, storage: &Storage, cutoff: &str) -> Result<()> {
        let (flat, buckets) = storage.list_level(self.0).await?;
        let before = |f: &FileInfo| last_part(&f.path).get(..17).is_some_and(|t| t < cutoff);
        for f in flat.iter().filter(|f| before(f)) {
            storage.delete(&f.path).await?;
        }
        let cutoff_bucket = bucket(cutoff);
        for b in buckets.iter().filter(|b| last_part(b) <= cutoff_bucket) {
            let whole = last_part(b) < cutoff_bucket;
            for f in storage.list_dir(b).await?.iter().filter(|f| whole || before(f)) {
                storage.delete(&f.path).await?;
            }
            if whole {
                storage.remove_empty_dir(b).await;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;

    use super::*;

    const DIR: MarkerDir = MarkerDir(".hoodie/oxlake/test");

    async fn mark(s: &Storage, name: &str) {
        assert!(s.put_if_absent(&DIR.path(name), Bytes::new()).await.unwrap());
    }

    fn names(markers: &[Marker]) -> Vec<&str> {
        markers.iter().map(|m| m.name.as_str()).collect()
    }

    #[tokio::test]
    async fn a_listing_returns_the_markers_after_a_time_across_buckets_and_flat_ones() {
        let s = Storage::in_memory("t").unwrap();
        for name in ["20260101000000000", "20260101000959999", "20260101001000000", "20260101003000000002"] {
            mark(&s, name).await;
        }
        s.put(".hoodie/oxlake/test/20260101000500000", Bytes::new()).await.unwrap();
        s.put(".hoodie/oxlake/test/20251231000000000", Bytes::new()).await.unwrap();
        assert_eq!(DIR.path("20260101000959999"), ".hoodie/oxlake/test/20260101000/20260101000959999");
        let after = DIR.list_after(&s, "20260101000000000").await.unwrap();
        assert_eq!(
            names(&after),
            ["20260101000500000", "20260101000959999", "20260101001000000", "20260101003000000002"]
        );
        assert!(after[0].flat && !after[1].flat);
        assert_eq!(after[3].path, ".hoodie/oxlake/test/20260101003/20260101003000000002");
        assert!(DIR.list_after(&s, "20260101003000000002").await.unwrap().is_empty());
        assert_eq!(DIR.list_after(&s, "").await.unwrap().len(), 6);
    }

    #[tokio::test]
    async fn pruning_removes_the_markers_named_before_the_cutoff_whole_buckets_at_once() {
        let s = Storage::in_memory("t").unwrap();
        for name in ["20260101000000000", "20260101001000000", "20260101001500000"] {
            mark(&s, name).await;
        }
        s.put(".hoodie/oxlake/test/20260101000500000_x", Bytes::new()).await.unwrap();
        s.put(".hoodie/oxlake/test/20260101001200000_x", Bytes::new()).await.unwrap();
        DIR.prune(&s, "20260101001200000").await.unwrap();
        // In the bucket of the cutoff, the markers named before it.
        assert_eq!(names(&DIR.list_after(&s, "").await.unwrap()), ["20260101001200000_x", "20260101001500000"]);
    }

    #[tokio::test]
    async fn on_local_disk_pruned_buckets_leave_no_folder_behind() {
        let dir = tempfile::tempdir().unwrap();
        let s = Storage::open(dir.path().to_str().unwrap(), &Default::default()).unwrap();
        mark(&s, "20260101000000000").await;
        mark(&s, "20260102000000000").await;
        DIR.prune(&s, "20260101120000000").await.unwrap();
        let left: Vec<_> = std::fs::read_dir(dir.path().join(DIR.0)).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert_eq!(left, ["20260102000"]);
    }
}
