//! Keeping the LSM timeline (timeline layout 2, `.hoodie/timeline/history/`) small, as Apache
//! Hudi's `LSMTimelineWriter.compactAndClean` does after every archival.
//!
//! Each archival adds one level-0 file and one manifest. Compaction merges the oldest
//! [`BATCH`] files of a level into one file of the next level, named `<min>_<max>_<level+1>`,
//! and publishes a manifest without them; cleaning then deletes the manifests older than the
//! newest [`MANIFESTS_KEPT`] (plus one per compaction of the run) and the data files none of the
//! kept manifests lists. So after `n` archivals the folder holds about `9 * log10(n)` data files.
//!
//! Races: a manifest is created with a conditional create, so of two runs one publishes each
//! version and the other stops (its merged file, listed by no manifest, is cleaned later).
//! Cleaning deletes only files older than [`GRACE`]: a file another run wrote and has not yet
//! listed stays. A reader whose manifest's files were cleaned under it reads again from the
//! latest manifest (`table::history`).

use std::time::Duration;

use bytes::Bytes;

use crate::error::Result;
use crate::format::lsm;
use crate::table::Table;
use crate::table::history::{history_dir, latest_manifest, publish_manifest};

/// Files of one level merged at once (`hoodie.timeline.compaction.batch.size`, default 10).
const BATCH: usize = 10;
/// Bytes of one merged file at most (Apache Hudi 1.0's `MAX_FILE_SIZE_IN_BYTES`).
const MAX_MERGED_BYTES: i64 = 1000 * 1024 * 1024;
/// Manifests kept besides one per compaction of the run (Apache Hudi keeps 3).
const MANIFESTS_KEPT: u32 = 3;
/// Unlisted files younger than this are another run's, not yet published: never cleaned.
const GRACE: Duration = Duration::from_secs(600);
/// The highest level a file name can hold (one digit).
const MAX_LEVEL: u32 = 9;

/// The level of an LSM data file name (`<min>_<max>_<level>.parquet`).
fn level(name: &str) -> Option<u32> {
    if !lsm::is_file_name(name) {
        return None;
    }
    name.strip_suffix(".parquet")?.rsplit('_').next()?.parse().ok()
}

/// The time range of an LSM data file name.
fn range(name: &str) -> Option<(&str, &str)> {
    let mut parts = name.split('_');
    Some((parts.next()?, parts.next()?))
}

/// Compacts the LSM timeline, then cleans it. Returns how many merged files were published.
pub(crate) async fn compact_and_clean(table: &Table) -> Result<u32> {
    let compactions = compact(table).await?;
    clean(table, compactions).await?;
    Ok(compactions)
}

/// Merges the oldest [`BATCH`] files of each level holding at least that many, level by level,
/// publishing a manifest after each merge. Stops when another run published first.
async fn compact(table: &Table) -> Result<u32> {
    let storage = table.storage();
    let dir = history_dir(table);
    let mut published = 0;
    for lvl in 0..MAX_LEVEL {
        loop {
            let (version, manifest) = latest_manifest(table).await?;
            let mut of_level: Vec<&lsm::ManifestEntry> =
                manifest.files.iter().filter(|f| level(&f.file_name) == Some(lvl)).collect();
            if of_level.len() < BATCH {
                break;
            }
            of_level.sort_by(|a, b| a.file_name.cmp(&b.file_name));
            let mut candidates = Vec::new();
            let mut bytes = 0;
            for f in of_level.into_iter().take(BATCH) {
                if !candidates.is_empty() && bytes + f.file_len > MAX_MERGED_BYTES {
                    break;
                }
                bytes += f.file_len;
                candidates.push(f.clone());
            }
            if candidates.len() < 2 {
                break;
            }
            let mut rows = Vec::new();
            for f in &candidates {
                let path = format!("{dir}/{}", f.file_name);
                rows.extend(lsm::read_file(&path, storage.get(&path).await?)?);
            }
            let min = candidates.iter().filter_map(|f| range(&f.file_name)).map(|r| r.0).min().unwrap_or_default();
            let max = candidates.iter().filter_map(|f| range(&f.file_name)).map(|r| r.1).max().unwrap_or_default();
            let name = lsm::file_name(min, max, lvl + 1);
            let data = lsm::write_file(&rows)?;
            let merged = lsm::ManifestEntry { file_name: name.clone(), file_len: data.len() as i64 };
            storage.put(&format!("{dir}/{name}"), data).await?;
            let mut files: Vec<lsm::ManifestEntry> =
                manifest.files.iter().filter(|f| !candidates.contains(f)).cloned().collect();
            files.push(merged);
            let next = lsm::manifest_name(version + 1);
            let json = Bytes::from(lsm::Manifest { files }.to_json()?);
            if !storage.put_if_absent(&format!("{dir}/{next}"), json).await? {
                log::info!("{}: the archived timeline's {next} was written by another run first", table.uri());
                return Ok(published);
            }
            crate::commit::failpoint("history-after-manifest");
            publish_manifest(table, version + 1).await?;
            published += 1;
            log::info!("{}: merged {} archived-timeline files into {name}", table.uri(), candidates.len());
        }
    }
    Ok(published)
}

/// Deletes the manifests older than the newest `MANIFESTS_KEPT + compactions`, then the data
/// files older than [`GRACE`] that no kept manifest lists.
async fn clean(table: &Table, compactions: u32) -> Result<()> {
    let storage = table.storage();
    let dir = history_dir(table);
    let (latest, _) = latest_manifest(table).await?;
    let keep_from = latest.saturating_sub(MANIFESTS_KEPT + compactions - 1).max(1);
    let listing = storage.list_dir(&dir).await?;
    let mut kept_files = std::collections::HashSet::new();
    for f in &listing {
        let Some(v) = f.path.rsplit('/').next().and_then(lsm::manifest_version) else { continue };
        if v >= keep_from {
            let bytes = storage.get(&f.path).await?;
            for entry in lsm::Manifest::parse(&f.path, &bytes)?.files {
                kept_files.insert(entry.file_name);
            }
        }
    }
    for f in &listing {
        let Some(v) = f.path.rsplit('/').next().and_then(lsm::manifest_version) else { continue };
        if v < keep_from {
            storage.delete(&f.path).await?;
        }
    }
    let written_before = chrono::Utc::now() - chrono::TimeDelta::from_std(GRACE).unwrap_or_default();
    for f in storage.list_dir_before(&dir, written_before).await? {
        let name = f.path.rsplit('/').next().unwrap_or_default();
        if lsm::is_file_name(name) && !kept_files.contains(name) {
            storage.delete(&f.path).await?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_give_their_level_and_range() {
        assert_eq!(level("20240101000000000_20240101000100000_0.parquet"), Some(0));
        assert_eq!(level("20240101000000000_20240101000100000_3.parquet"), Some(3));
        assert_eq!(level("manifest_3"), None);
        assert_eq!(
            range("20240101000000000_20240101000100000_0.parquet"),
            Some(("20240101000000000", "20240101000100000"))
        );
    }
}
