//! Keeping the LSM timeline (timeline layout 2, `.hoodie/timeline/history/`) small, as Apache
//! Hudi's `LSMTimelineWriter.compactAndClean` does after every archival.
//!
//! Each archival adds one level-0 file and one manifest. Compaction merges the oldest
//! [`BATCH`] files of a level into one file of the next level, named `<min>_<max>_<level+1>`,
//! and publishes a manifest without them; cleaning then deletes the manifests older than the
//! newest [`MANIFESTS_KEPT`] (plus one per compaction of the run) and the data files only they
//! list. So after `n` archivals the folder holds about `9 * log10(n)` data files.
//!
//! Races: a manifest is created with a conditional create, so of two runs one publishes each
//! version and the other stops (its merged file, listed by no manifest, stays: a file no
//! manifest lists is never deleted, it may be a paused run's). A run that finds a later manifest
//! after creating its own (its number was free again because a clean deleted it while the run
//! was paused) removes its manifest and fails ([`check_created`]). Cleaning deletes dropped files
//! only once older than [`GRACE`]; a reader whose manifest's files were cleaned under it reads
//! again from the latest manifest (`table::history`).

use std::collections::HashSet;
use std::time::Duration;

use bytes::Bytes;

use crate::error::{Error, Result};
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
            storage.put(&format!("{dir}/{name}"), data.clone()).await?;
            let mut files: Vec<lsm::ManifestEntry> =
                manifest.files.iter().filter(|f| !candidates.contains(f)).cloned().collect();
            files.push(merged);
            let next = lsm::manifest_name(version + 1);
            let json = Bytes::from(lsm::Manifest { files }.to_json()?);
            if !storage.put_if_absent(&format!("{dir}/{next}"), json).await? {
                log::info!("{}: the archived timeline's {next} was written by another run first", table.uri());
                return Ok(published);
            }
            check_created(table, version + 1, &name, data).await?;
            crate::commit::step_failpoint(table, "history-after-manifest");
            publish_manifest(table, version + 1).await?;
            published += 1;
            log::info!("{}: merged {} archived-timeline files into {name}", table.uri(), candidates.len());
        }
    }
    Ok(published)
}

/// Deletes the manifests older than the newest `MANIFESTS_KEPT + compactions`, and the data
/// files only they list, once older than [`GRACE`] (a reader of an old manifest that finds a
/// file gone reads again from the latest). A file no manifest lists is never deleted: it may be
/// a paused run's, about to be listed. An old manifest goes only with its last dropped file, so
/// that no dropped file is left behind unlisted.
async fn clean(table: &Table, compactions: u32) -> Result<()> {
    let storage = table.storage();
    let dir = history_dir(table);
    let (latest, _) = latest_manifest(table).await?;
    let keep_from = latest.saturating_sub(MANIFESTS_KEPT + compactions - 1).max(1);
    let listing = storage.list_dir(&dir).await?;
    let mut kept_files = HashSet::new();
    let mut old: Vec<(u32, String)> = Vec::new();
    for f in &listing {
        let Some(v) = f.path.rsplit('/').next().and_then(lsm::manifest_version) else { continue };
        if v >= keep_from {
            let Some(bytes) = storage.get_opt(&f.path).await? else { continue }; // cleaned by another run
            kept_files.extend(lsm::Manifest::parse(&f.path, &bytes)?.files.into_iter().map(|e| e.file_name));
        } else {
            old.push((v, f.path.clone()));
        }
    }
    // Oldest first, stopping at the first kept: the manifests left are always a run of
    // consecutive numbers, which [`check_created`] relies on.
    old.sort();
    let written_before = chrono::Utc::now() - chrono::TimeDelta::from_std(GRACE).unwrap_or_default();
    let aged: HashSet<String> = storage
        .list_dir_before(&dir, written_before)
        .await?
        .into_iter()
        .filter_map(|f| Some(f.path.rsplit('/').next()?.to_string()))
        .collect();
    let present: HashSet<&str> = listing.iter().filter_map(|f| f.path.rsplit('/').next()).collect();
    let mut deleted: HashSet<String> = HashSet::new();
    // Old manifests are read one at a time, up to the first that stays: a stream archiving every
    // few seconds leaves ten minutes of them (`GRACE`), which a clean reading them all would read
    // again at every archival.
    for (_, manifest) in &old {
        let Some(bytes) = storage.get_opt(manifest).await? else { continue }; // cleaned by another run
        let files: Vec<String> =
            lsm::Manifest::parse(manifest, &bytes)?.files.into_iter().map(|e| e.file_name).collect();
        let dropped: Vec<&String> = files.iter().filter(|f| !kept_files.contains(*f)).collect();
        if dropped.iter().any(|f| present.contains(f.as_str()) && !aged.contains(*f)) {
            break; // a dropped file is still young: the manifest goes with it, later
        }
        for f in dropped {
            if present.contains(f.as_str()) && deleted.insert(f.clone()) {
                storage.delete(&format!("{dir}/{f}")).await?;
            }
        }
        storage.delete(manifest).await?;
    }
    Ok(())
}

/// After a run created manifest `version` from the manifest before it: fails, removing it, if
/// that one is gone (cleaned while this run was paused, and so was `version` before: the
/// conditional create found the number free again, and what it lists may be gone; cleans delete
/// the oldest manifests first, so a manifest before it is gone only then, or once later ones
/// made it old, when removing it loses nothing). Otherwise makes sure its new file `name` is
/// there from `data`.
pub(crate) async fn check_created(table: &Table, version: u32, name: &str, data: Bytes) -> Result<()> {
    let storage = table.storage();
    let dir = history_dir(table);
    if version > 1 && storage.head(&format!("{dir}/{}", lsm::manifest_name(version - 1))).await?.is_none() {
        storage.delete(&format!("{dir}/{}", lsm::manifest_name(version))).await?;
        return Err(Error::CommitConflict {
            instant: name.to_string(),
            detail: format!("the archived timeline moved past manifest {version} while this run wrote it"),
        });
    }
    let path = format!("{dir}/{name}");
    if storage.head(&path).await?.is_none() {
        storage.put(&path, data).await?;
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
