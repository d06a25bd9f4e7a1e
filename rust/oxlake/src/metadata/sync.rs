//! Keeping the metadata table in step: every instant that changes the data table's files is
//! recorded as a metadata deltacommit of the same time, completed before the data instant
//! completes (it counts only once the data instant completes). Inline compaction and cleaning of
//! the metadata table run here too.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use arrow::array::{BooleanArray, RecordBatch};
use arrow::compute::{concat_batches, filter_record_batch, sort_to_indices, take_record_batch};
use bytes::Bytes;
use futures::StreamExt;

use super::entries::{self, BLOCK_ROWS, Entries, RecordEntries, record_index_key, shard_of, strings};
use super::{Index, MetadataTable, Select, commit_metadata, file_entries, metadata_uri};
use crate::commit::Transaction;
use crate::commit::change::{Change, KeyChanges, KeySource};
use crate::error::{Error, Result};
use crate::format::instant::{Action, Instant, State};
use crate::storage::FileInfo;
use crate::table::Table;
use crate::table::fs_view::FileGroupId;

/// Records `change`, made by the data instant `time`, in the metadata table. Nothing to do
/// without a metadata table; a stale one is left stale (readers list storage until it is built
/// again). A rollback of an instant the record index already holds leaves it stale too: the keys
/// that instant deleted are known only to the data, so the next writer builds it again.
pub(crate) async fn sync(data: &Table, time: &str, change: Change<'_>) -> Result<()> {
    let current = match data.metadata_table().await {
        Ok(Some(current)) => current,
        Ok(None) => return Ok(()),
        // Another writer is building it: this instant will be missing from it, so readers list
        // storage until the next writer catches it up. Failing the write would gain nothing.
        Err(e) => {
            log::warn!("{}: metadata table unreadable ({e}); not updated", data.uri());
            return Ok(());
        }
    };
    if !current.is_fresh() {
        log::info!("{}: metadata table stale (missing {:?}); not updated", data.uri(), current.missing);
        return Ok(());
    }
    if let KeySource::RolledBack { target, was_completed: true } = change.keys
        && current.has(Index::RecordIndex)
    {
        // A commit rolled back had its keys indexed (by its own metadata deltacommit, perhaps
        // folded into base files by a compaction since, or by a build): the keys it deleted are
        // known only to the data. A write that never completed left nothing a reader uses: the
        // metadata table's readers ignore blocks of instants not completed on the data timeline,
        // and its compactions never fold them in.
        log::info!("{}: rollback of {target}: the metadata table is left to be built again", data.uri());
        return Ok(());
    }
    compact_if_due(data, &current, time).await?;
    let mut mdt = match Table::open(&metadata_uri(data), data.options().bare()).await {
        Ok(mdt) => mdt,
        // Cleared since it was opened above: another writer builds it again. That build counts
        // this instant as missing (it was pending when the build began, or is later than it).
        Err(e @ Error::TableNotFound { .. }) => {
            log::warn!("{}: metadata table being built again ({e}); not updated", data.uri());
            return Ok(());
        }
        Err(e) => return Err(e),
    };
    clear_failed_attempt(&mut mdt, time).await?;
    let tx = Transaction::begin_at(&mut mdt, Action::DeltaCommit, time, Bytes::new()).await?;
    if let Err(e) = settle_compactions(&mut mdt).await {
        return Err(tx.fail(&mut mdt, e).await);
    }
    match write_changes(data, &current, &mdt, time, &change).await {
        Ok(metadata) => {
            tx.commit(&mut mdt, &metadata).await?;
            Ok(())
        }
        Err(e) => Err(tx.fail(&mut mdt, e).await),
    }
}

/// Removes what an earlier, failed attempt of the data instant `time` left in the metadata table:
/// a compaction that failed after its metadata commit runs again under its own time. Readers
/// never used it (the data instant has not completed); its completed file goes first, so that
/// the rollback sees a pending instant.
async fn clear_failed_attempt(mdt: &mut Table, time: &str) -> Result<()> {
    let left: Vec<Instant> = mdt.timeline().instants_at(time).to_vec();
    if left.is_empty() {
        return Ok(());
    }
    for i in left.iter().filter(|i| i.is_completed()) {
        mdt.storage().delete(&mdt.timeline().path_of(i)).await?;
    }
    mdt.reload().await?;
    log::info!("{}: removing a failed attempt of {time}", mdt.uri());
    crate::commit::rollback_pending(mdt, &Instant::new(time, Action::DeltaCommit, State::Inflight)).await?;
    mdt.reload().await
}

/// Settles every compaction of the metadata table in flight before this deltacommit writes its
/// logs into the latest completed slice. A compaction that began before this deltacommit's
/// requested file was written may not have seen it, and would supersede that slice with base
/// files that lack this deltacommit's records (its own check for concurrent deltacommits can have
/// run just before that file appeared). So each is taken back here, and gives way when it commits;
/// or, when its committer decided first, completed here, and the logs go into its new slice. A
/// compaction that begins after this reload sees this deltacommit, and gives way by itself.
async fn settle_compactions(mdt: &mut Table) -> Result<()> {
    mdt.reload().await?;
    let mut compactions: Vec<Instant> =
        mdt.timeline().pending().filter(|i| i.action == Action::Compaction).cloned().collect();
    compactions.dedup_by(|a, b| a.time == b.time);
    if compactions.is_empty() {
        return Ok(());
    }
    for c in &compactions {
        if crate::commit::settle(mdt, c).await? {
            log::info!("{}: compaction {} completed for its writer, which had decided to commit", mdt.uri(), c.time);
        } else if crate::commit::is_expired(mdt, c).await? {
            // Taken back, and its process is gone: nobody else removes it.
            crate::commit::rollback_pending(mdt, &c.with_state(State::Inflight)).await?;
            drop_plan(mdt, &c.time).await?;
        }
    }
    mdt.reload().await
}

/// Writes one log file per shard that `change` touches, for every index; returns the commit
/// metadata naming them.
async fn write_changes(
    data: &Table,
    current: &MetadataTable,
    mdt: &Table,
    time: &str,
    change: &Change<'_>,
) -> Result<crate::format::commit::CommitMetadata> {
    let view = mdt.file_system_view().await?;
    let mut metadata = commit_metadata("UPSERT")?;
    let mut upserts: BTreeMap<Index, Entries> =
        file_entries(data, change.added, change.entries, &current.shards).await?;
    let mut files = Entries::new(Index::Files);
    for f in change.added {
        files.file(&f.path, f.size);
    }
    upserts.insert(Index::Files, files);
    for (index, entries) in upserts {
        let shards = current.shards(index);
        let batches = split_by_shard(index, &entries.to_batch(false)?, shards)?;
        let mut deletes: Vec<Vec<String>> = vec![Vec::new(); shards as usize];
        for path in change.deleted {
            deletes[shard_of(index, path, shards) as usize].push(path.clone());
        }
        for (shard, (batch, deletes)) in batches.into_iter().zip(deletes).enumerate() {
            if batch.num_rows() == 0 && deletes.is_empty() {
                continue;
            }
            let stat = write_shard_log(mdt, &view, time, (index, shard as u32), &[batch], &deletes).await?;
            metadata.partition_to_write_stats.entry(index.name().to_string()).or_default().push(stat);
        }
    }
    if current.has(Index::RecordIndex) {
        for stat in write_record_index(data, current, mdt, &view, time, change).await? {
            metadata.partition_to_write_stats.entry(Index::RecordIndex.name().to_string()).or_default().push(stat);
        }
    }
    Ok(metadata)
}

async fn write_shard_log(
    mdt: &Table,
    view: &crate::table::fs_view::FileSystemView,
    time: &str,
    (index, shard): (Index, u32),
    upserts: &[RecordBatch],
    deletes: &[String],
) -> Result<crate::format::commit::WriteStat> {
    let log = entries::encode_log((&mdt.schema(), &mdt.config().name), time, (index, shard), upserts, deletes)?;
    entries::write_log(mdt, latest_slice(view, index, shard)?, log).await
}

/// The latest slice of a shard of the metadata table.
fn latest_slice(
    view: &crate::table::fs_view::FileSystemView,
    index: Index,
    shard: u32,
) -> Result<&crate::table::fs_view::FileSlice> {
    let file_id = super::shard::file_id(index.name(), shard);
    view.get(&(index.name().to_string(), file_id.clone()))
        .and_then(|g| g.slices.values().next_back())
        .ok_or_else(|| Error::corrupt(super::DIR, format!("file group {file_id} is missing")))
}

/// The record index's share of a sync: one log file per shard whose keys moved, each in blocks
/// of [`BLOCK_ROWS`] records. Shards are encoded by tasks of the runtime (whose threads reuse the
/// memory the data write just freed), as many at a time as the machine has cores, and written in
/// order as they are ready: memory holds that many shards' records.
async fn write_record_index(
    data: &Table,
    current: &MetadataTable,
    mdt: &Table,
    view: &crate::table::fs_view::FileSystemView,
    time: &str,
    change: &Change<'_>,
) -> Result<Vec<crate::format::commit::WriteStat>> {
    let changes = match &change.keys {
        KeySource::Unchanged | KeySource::RolledBack { .. } => return Ok(Vec::new()),
        // A write that began before the record index was built and holds no keys (a streamed
        // write larger than memory) cannot tell the index what it moved: it loses, as to a
        // conflict, and its retry holds its keys.
        KeySource::Reported(changes) if !changes.unlisted.is_empty() => {
            return Err(Error::CommitConflict {
                instant: time.to_string(),
                detail: "a record index was built while this write ran without holding its keys; written again, \
                         it holds them"
                    .to_string(),
            });
        }
        KeySource::Reported(changes) => Arc::new((*changes).clone()),
        KeySource::Replaced(groups) => Arc::new(replaced_keys(data, groups, change.added).await?),
    };
    let shards = current.shards(Index::RecordIndex);
    let shard_of_key = |k: &str| super::shard::shard_of(k, shards);
    // Per shard, per written batch, the rows whose keys fall in the shard.
    let mut rows: Vec<Vec<Vec<u32>>> = vec![vec![Vec::new(); changes.written.len()]; shards as usize];
    for (b, (_, _, keys)) in changes.written.iter().enumerate() {
        for (r, k) in keys.iter().enumerate() {
            rows[shard_of_key(k.unwrap_or_default()) as usize][b].push(r as u32);
        }
    }
    let mut deletes: Vec<Vec<String>> = vec![Vec::new(); shards as usize];
    for (partition, keys) in &changes.deleted {
        for k in keys.iter().flatten() {
            deletes[shard_of_key(k) as usize].push(record_index_key(k, partition));
        }
    }
    let (schema, name) = (mdt.schema(), mdt.config().name.clone());
    let encodes = rows.into_iter().zip(deletes).enumerate().filter_map(|(shard, (rows, deletes))| {
        if rows.iter().all(Vec::is_empty) && deletes.is_empty() {
            return None;
        }
        let (changes, schema, name, time) = (changes.clone(), schema.clone(), name.clone(), time.to_string());
        Some(tokio::spawn(async move {
            let batches = record_batches(&changes, &rows, &time)?;
            entries::encode_log((&schema, &name), &time, (Index::RecordIndex, shard as u32), &batches, &deletes)
        }))
    });
    let parallel = std::thread::available_parallelism().map_or(1, |n| n.get());
    let mut logs = futures::stream::iter(encodes).buffered(parallel);
    let mut stats = Vec::new();
    while let Some(log) = logs.next().await {
        let log = log.map_err(|e| Error::invalid_data(format!("a metadata encoding task failed: {e}")))??;
        let slice = latest_slice(view, Index::RecordIndex, log.shard())?;
        stats.push(entries::write_log(mdt, slice, log).await?);
    }
    Ok(stats)
}

/// The `record_index` records of one shard's `rows` (per written batch of `changes`), in blocks
/// of [`BLOCK_ROWS`].
fn record_batches(changes: &KeyChanges, rows: &[Vec<u32>], time: &str) -> Result<Vec<RecordBatch>> {
    let total: usize = rows.iter().map(Vec::len).sum();
    let mut entries = RecordEntries::with_capacity(total.min(BLOCK_ROWS));
    let mut batches = Vec::with_capacity(total.div_ceil(BLOCK_ROWS));
    for ((partition, file_id, keys), rows) in changes.written.iter().zip(rows) {
        for &r in rows {
            entries.push(keys.value(r as usize), partition, file_id, time);
            if entries.len() == BLOCK_ROWS {
                batches.push(entries.finish()?);
            }
        }
    }
    if entries.len() > 0 {
        batches.push(entries.finish()?);
    }
    Ok(batches)
}

/// The keys a clustering or an insert overwrite moved: those of the replaced groups' latest
/// slices left; those of the instant's new base files (read back) arrived.
async fn replaced_keys(data: &Table, groups: &[FileGroupId], added: &[FileInfo]) -> Result<KeyChanges> {
    let view = data.file_system_view().await?;
    let mut changes = KeyChanges::default();
    let stored_keys = data.stored_keys()?;
    for f in added {
        let name = f.path.rsplit('/').next().unwrap_or(&f.path);
        let Some(base) = crate::format::file_name::BaseFileName::parse(name) else { continue };
        let partition = f.path.rsplit_once('/').map_or("", |(p, _)| p).to_string();
        let keys = stored_keys.of_base_file(data.storage(), &f.path, f.size).await?;
        changes.written.push((partition, base.file_id, keys));
    }
    // A damaged committed log block is an error: its keys would stay in the index otherwise.
    let committed = crate::log::CommittedLogs::load(data.storage(), data.timeline()).await?;
    for id in groups {
        let Some(slice) = view.get(id).and_then(|g| g.slices.values().next_back()) else { continue };
        let mut keys: BTreeSet<String> = BTreeSet::new();
        if let Some(base) = &slice.base {
            let stored = stored_keys.of_base_file(data.storage(), &base.path, base.size).await?;
            keys.extend(stored.iter().flatten().map(str::to_string));
        }
        let in_logs = crate::log::record_keys(data.storage(), &slice.logs, Some(&committed), &stored_keys).await?;
        keys.extend(in_logs.into_keys());
        changes.deleted.push((id.0.clone(), arrow::array::StringArray::from_iter_values(keys)));
    }
    Ok(changes)
}

/// Splits a batch of metadata records into one batch per shard (each keeping the batch's order).
pub(super) fn split_by_shard(index: Index, batch: &RecordBatch, shards: u32) -> Result<Vec<RecordBatch>> {
    let keys = strings(batch, "key")?;
    let ids: Vec<u32> = keys.iter().map(|k| shard_of(index, k.unwrap_or_default(), shards)).collect();
    (0..shards.max(1))
        .map(|s| {
            let mask: BooleanArray = ids.iter().map(|&id| Some(id == s)).collect();
            Ok(filter_record_batch(batch, &mask)?)
        })
        .collect()
}

/// Log files a shard's latest slice may gather before the metadata table is compacted.
const COMPACT_AFTER_LOGS: usize = 10;

/// Compacts the metadata table when a shard's latest slice has [`COMPACT_AFTER_LOGS`] log files:
/// new base files of every shard of every index, holding the records as readers see them (only
/// blocks of instants completed on the data timeline), at time `<latest completed data
/// instant>001`, which orders after that instant and before any later one. Runs before the
/// deltacommit of `syncing`, and only when no other data write is pending: a write that completed
/// later would have written its blocks into a slice the compaction leaves behind. Shard by shard,
/// so memory holds one shard.
async fn compact_if_due(data: &Table, current: &MetadataTable, syncing: &str) -> Result<()> {
    // After the latest data instant, and after every deltacommit and compaction the metadata table
    // holds: a rollback of the latest commit leaves a compaction (and the rollback's deltacommit)
    // at times after the latest completed commit, and the new base files must supersede them.
    let Some(data_latest) = data.timeline().latest_completed_data().map(|i| i.time.clone()) else { return Ok(()) };
    let latest = current
        .listed
        .iter()
        .filter(|i| i.is_completed() && i.time.as_str() < syncing)
        .map(|i| i.time.get(..17).unwrap_or(&i.time).to_string())
        .chain([data_latest])
        .max()
        .unwrap_or_default();
    let due = current
        .view
        .groups()
        .any(|g| g.slices.values().next_back().is_some_and(|s| s.logs.len() >= COMPACT_AFTER_LOGS));
    // Any other instant in flight may be syncing into the slices this would compact (a
    // compaction, a clean or a rollback as much as a write); a compaction plan not yet started
    // syncs into whatever slice is latest when it runs.
    let others_pending = data
        .timeline()
        .pending()
        .any(|i| i.time != syncing && !(i.action == Action::Compaction && i.state == State::Requested));
    if !due || others_pending {
        return Ok(());
    }
    let time = format!("{}001", &latest[..latest.len().min(17)]);
    if !settled(data, current, syncing).await? {
        log::info!("{}: metadata compaction at {time} gave way to a write in flight", data.uri());
        return Ok(());
    }
    let mut mdt = Table::open(&metadata_uri(data), data.options().bare()).await?;
    if !mdt.timeline().instants_at(&time).is_empty() {
        return Ok(());
    }
    // The deltacommits whose records `current` read: any other, there when this compaction is about
    // to commit, wrote into a slice it leaves behind.
    let known: BTreeSet<&str> = current.listed.iter().map(|i| i.time.as_str()).collect();
    // The plan names no file group: writers never wait for this compaction (it gives way).
    let plan = Bytes::from(crate::format::compaction_plan::CompactionPlan::default().to_avro()?);
    let tx = Transaction::begin_at(&mut mdt, Action::Compaction, &time, plan).await?;
    let mut metadata = commit_metadata("COMPACT")?;
    metadata.compacted = true;
    for index in current.indexes() {
        for shard in 0..current.shards(index) {
            let batch = match compacted_shard(current, index, shard).await {
                Ok(batch) => batch,
                // The slices `current` saw were compacted and removed by other writers since it was
                // opened (a writer stalled that long), or are damaged: this compaction gives way,
                // and the write goes on (its deltacommit goes into the latest slice).
                Err(e) => {
                    let e = tx.fail(&mut mdt, e).await;
                    log::warn!("{}: metadata compaction at {time} gave way: {e}", data.uri());
                    return drop_plan(&mdt, &time).await;
                }
            };
            match super::entries::write_base(&mdt, &time, index, shard, &[batch]).await {
                Ok(stat) => metadata.partition_to_write_stats.entry(index.name().to_string()).or_default().push(stat),
                Err(e) => return Err(tx.fail(&mut mdt, e).await),
            }
        }
    }
    crate::commit::failpoint("metadata-compaction-before-commit");
    // A writer that began its sync meanwhile may have put its log into the slice this compaction
    // leaves behind: then the compaction gives way (it runs again at a later sync).
    mdt.reload().await?;
    let raced =
        mdt.timeline().instants().iter().any(|i| i.action == Action::DeltaCommit && !known.contains(i.time.as_str()));
    if raced {
        log::info!("{}: metadata compaction at {time} gave way to a concurrent sync", data.uri());
        tx.abort(&mut mdt).await?;
        return drop_plan(&mdt, &time).await;
    }
    match tx.commit(&mut mdt, &metadata).await {
        Ok(_) => {}
        // Taken back by a deltacommit that began meanwhile (see `settle_compactions`).
        Err(Error::CommitConflict { .. }) => {
            log::info!("{}: metadata compaction at {time} gave way to a concurrent sync", data.uri());
            mdt.reload().await?;
            let pending = Instant::new(time.clone(), Action::Compaction, State::Inflight);
            crate::commit::rollback_pending(&mdt, &pending).await?;
            return drop_plan(&mdt, &time).await;
        }
        Err(e) => return Err(e),
    }
    log::info!("{}: metadata table compacted at {time}", data.uri());
    remove_old_slices(&mdt).await?;
    // The metadata table is not cleaned as a table is: its markers are pruned here.
    crate::commit::prune_claims(&mdt).await
}

/// Removes the plan of a compaction of the metadata table that gave way: an aborted compaction
/// keeps its plan to run again, and this one has none to keep.
async fn drop_plan(mdt: &Table, time: &str) -> Result<()> {
    let requested = Instant::new(time, Action::Compaction, State::Requested);
    mdt.storage().delete(&mdt.timeline().path_of(&requested)).await
}

/// Whether every data instant with a deltacommit among those `current` read is settled as it saw
/// it: completed (its records are read) or gone (a failed write: its records never count). A data
/// instant that completed after `current` was opened, or is still in flight, has records the
/// compaction would not fold in, left in the slice it supersedes. The data timeline is read again
/// for this, after the metadata table was listed: an instant that began after the data timeline
/// `current` was opened against is not on it.
async fn settled(data: &Table, current: &MetadataTable, syncing: &str) -> Result<bool> {
    let now = crate::timeline::Timeline::load(data.storage(), data.config()).await?;
    let read = current.table.timeline();
    let unsettled = current.listed.iter().filter(|i| i.action == Action::DeltaCommit && i.time != syncing).find(|i| {
        let counted = read.instants_at(&i.time).iter().any(|m| m.is_completed());
        let live = now
            .instants_at(&i.time)
            .iter()
            .any(|d| d.is_completed() || !(d.action == Action::Compaction && d.state == State::Requested));
        !counted && live
    });
    Ok(unsettled.is_none())
}

/// One shard's current records, sorted by key.
async fn compacted_shard(current: &MetadataTable, index: Index, shard: u32) -> Result<RecordBatch> {
    let batches = current.read_shard(index, shard, Select::All).await?;
    let batch = concat_batches(&entries::record_schema(), &batches)?;
    let order = sort_to_indices(strings(&batch, "key")?, None, None)?;
    Ok(take_record_batch(&batch, &order)?)
}

/// Deletes the slices of the metadata table older than the one before the latest: a reader that
/// opened the table before this compaction still reads the one before. (No instant records it:
/// an interrupted removal is finished by the next compaction.)
async fn remove_old_slices(mdt: &Table) -> Result<()> {
    let view = mdt.file_system_view().await?;
    for group in view.groups() {
        let slices: Vec<_> = group.slices.values().collect();
        for slice in &slices[..slices.len().saturating_sub(2)] {
            for path in slice.base.iter().map(|b| &b.path).chain(slice.logs.iter().map(|l| &l.path)) {
                mdt.storage().delete(path).await?;
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    //! Keeping the metadata table in step through the commit hook: every completion (commit,
    //! clean, rollback) reaches the `files` index and the record index before the data instant
    //! completes, and a table opened without the hook leaves it stale, never wrong.

    use super::*;
    use crate::config::TableType;
    use crate::metadata::MetadataConfig;
    use crate::services::CleanPolicy;
    use crate::test_support::{by_parity, id_city_table};
    use crate::write::{WriteConfig, WriteOperation};

    async fn table(dir: &std::path::Path, table_type: TableType) -> Table {
        let mut t = id_city_table(dir, table_type, crate::services::default_options()).await;
        t.build_metadata(MetadataConfig::default()).await.unwrap();
        t
    }

    /// The files the metadata table lists, sorted.
    async fn indexed(t: &Table) -> Vec<String> {
        let mdt = t.fresh_metadata_table().await.expect("a fresh metadata table");
        let mut files: Vec<String> = mdt.files().await.unwrap().into_iter().map(|f| f.path).collect();
        files.sort();
        files
    }

    /// The data files in storage, sorted.
    async fn stored(t: &Table) -> Vec<String> {
        let mut files: Vec<String> =
            crate::metadata::data_files(t.storage().list_table().await.unwrap()).into_iter().map(|f| f.path).collect();
        files.sort();
        files
    }

    #[tokio::test]
    async fn commits_cleans_and_rollbacks_reach_the_files_index_before_they_complete() {
        let dir = tempfile::tempdir().unwrap();
        let mut t = table(dir.path(), TableType::CopyOnWrite).await;
        let config = WriteConfig::default();
        t.write(WriteOperation::Insert, vec![by_parity(&[1, 2])], &config).await.unwrap();
        assert_eq!(indexed(&t).await, stored(&t).await);
        let second = t.write(WriteOperation::Upsert, vec![by_parity(&[1])], &config).await.unwrap().instant.unwrap();
        assert_eq!(indexed(&t).await.len(), 3, "a rewrite adds a file; the old one stays until a clean");
        crate::commit::rollback_completed(&mut t, &second).await.unwrap();
        assert_eq!(indexed(&t).await, stored(&t).await, "the rolled back file left the index");
        t.write(WriteOperation::Upsert, vec![by_parity(&[1])], &config).await.unwrap();
        let cleaned = t.clean(CleanPolicy::KeepLatestFileVersions(1)).await.unwrap();
        assert_eq!(cleaned.deleted.len(), 1);
        assert_eq!(indexed(&t).await, stored(&t).await, "the cleaned file left the index");
        let report = t.validate_metadata().await.unwrap();
        assert!(report.ok(), "{:?}", report.differences);
    }

    #[tokio::test]
    async fn the_record_index_follows_upserts_and_deletes_on_merge_on_read() {
        let dir = tempfile::tempdir().unwrap();
        let mut t = table(dir.path(), TableType::MergeOnRead).await;
        let config = WriteConfig::default();
        t.write(WriteOperation::Insert, vec![by_parity(&[1, 2, 3])], &config).await.unwrap();
        t.write(WriteOperation::Upsert, vec![by_parity(&[2, 4])], &config).await.unwrap();
        t.write(WriteOperation::Delete, vec![by_parity(&[3])], &config).await.unwrap();
        let report = t.validate_metadata().await.unwrap();
        assert!(report.ok(), "{:?}", report.differences);
        assert_eq!(indexed(&t).await, stored(&t).await);
    }

    #[tokio::test]
    async fn a_commit_without_the_hook_leaves_the_metadata_table_stale_and_the_next_writer_rebuilds_it() {
        let dir = tempfile::tempdir().unwrap();
        let mut t = table(dir.path(), TableType::CopyOnWrite).await;
        let config = WriteConfig::default();
        t.write(WriteOperation::Insert, vec![by_parity(&[1])], &config).await.unwrap();
        let mut bare = Table::open(t.uri(), t.options().bare()).await.unwrap();
        bare.write(WriteOperation::Insert, vec![by_parity(&[2])], &config).await.unwrap();
        // Readers ignore it (they list storage) rather than miss the bare commit's file.
        assert!(bare.fresh_metadata_table().await.is_none());
        assert_eq!(bare.file_system_view().await.unwrap().groups().count(), 2);
        // The next writer with the hook catches it up.
        t.reload().await.unwrap();
        t.write(WriteOperation::Insert, vec![by_parity(&[3])], &config).await.unwrap();
        assert_eq!(indexed(&t).await, stored(&t).await);
        assert!(t.validate_metadata().await.unwrap().ok());
    }

    /// Found by the stress test (two compactors, four writers): a write in flight while another
    /// process rebuilt the metadata table, committed without syncing (the build was under way),
    /// is among the build's pending writes, older than the rebuilt table's first instant. That
    /// table must read as stale until the write's files and keys are in it: taken for fresh, the
    /// next upsert of the write's key did not find it in the record index and inserted it into a
    /// second file group.
    #[tokio::test]
    async fn a_write_pending_during_a_rebuild_that_never_synced_leaves_the_metadata_table_stale() {
        let dir = tempfile::tempdir().unwrap();
        let mut t = table(dir.path(), TableType::MergeOnRead).await;
        let config = WriteConfig::default();
        t.write(WriteOperation::Insert, vec![by_parity(&[1, 2])], &config).await.unwrap();
        let mut bare = Table::open(t.uri(), t.options().bare()).await.unwrap();
        let tx = bare.begin_write(WriteOperation::Insert).await.unwrap();
        let time = tx.time().to_string();
        let files = bare.write_files(WriteOperation::Insert, vec![by_parity(&[3])], &time, &config).await.unwrap();
        t.reload().await.unwrap();
        t.build_metadata(MetadataConfig::default()).await.unwrap();
        bare.commit_write(tx, WriteOperation::Insert, vec![files], false).await.unwrap();
        t.reload().await.unwrap();
        assert!(t.fresh_metadata_table().await.is_none(), "the write at {time} is not in it");
        t.write(WriteOperation::Upsert, vec![by_parity(&[3])], &config).await.unwrap();
        let rows: usize = t
            .scan(&crate::read::ScanOptions::default())
            .await
            .unwrap()
            .map(|b| b.unwrap().num_rows())
            .collect::<Vec<_>>()
            .await
            .into_iter()
            .sum();
        assert_eq!(rows, 3, "key 3 once");
        let report = t.validate_metadata().await.unwrap();
        assert!(report.ok(), "{:?}", report.differences);
    }

    /// Ten commits into one partition: the `files` shard of that partition has ten logs in its
    /// latest slice, so the next sync compacts the metadata table.
    async fn due_for_compaction(dir: &std::path::Path) -> Table {
        let mut t = table(dir, TableType::CopyOnWrite).await;
        for i in 1..=10 {
            t.write(WriteOperation::Insert, vec![by_parity(&[2 * i])], &WriteConfig::default()).await.unwrap();
        }
        t
    }

    /// Another handle on `t`'s table, as another process opens it.
    async fn another(t: &Table) -> Table {
        Table::open(t.uri(), t.options().clone()).await.unwrap()
    }

    /// A syncing time later than every instant of the tests.
    const LATER: &str = "29991231235959999";

    /// Whether the metadata table has a completed compaction.
    async fn compacted(t: &Table) -> bool {
        let mdt = Table::open(&metadata_uri(t), t.options().bare()).await.unwrap();
        mdt.timeline().instants().iter().any(|i| i.action == Action::Commit && i.is_completed())
    }

    /// A compaction due on a stale handle of `t`'s table, while another writer holds a write in
    /// flight (so that the writer below does not compact the metadata table itself) and a third
    /// commits: the compaction's snapshot of the metadata table is taken before that commit
    /// (`snapshot_first`) or after it. Either way the compaction must give way.
    async fn a_compaction_beside_a_commit_gives_way(snapshot_first: bool) {
        let dir = tempfile::tempdir().unwrap();
        let mut t = due_for_compaction(dir.path()).await;
        let stale = another(&t).await;
        let early = if snapshot_first { stale.metadata_table().await.unwrap() } else { None };
        let mut holder = another(&t).await;
        let in_flight = holder.begin_write(WriteOperation::Insert).await.unwrap();
        let mut writer = another(&t).await;
        writer.write(WriteOperation::Insert, vec![by_parity(&[100])], &WriteConfig::default()).await.unwrap();
        let current = match early {
            Some(current) => current,
            None => stale.metadata_table().await.unwrap().unwrap(),
        };
        compact_if_due(&stale, &current, LATER).await.unwrap();
        assert!(!compacted(&t).await, "the compaction gave way");
        in_flight.abort(&mut holder).await.unwrap();
        t.reload().await.unwrap();
        assert_eq!(indexed(&t).await, stored(&t).await, "the later commit's file is listed");
        assert!(t.validate_metadata().await.unwrap().ok());
    }

    #[tokio::test]
    async fn a_metadata_compaction_gives_way_to_a_deltacommit_its_snapshot_lacks() {
        // Found by the stress test: a compaction folded a snapshot of the metadata table taken
        // seconds before, and took the deltacommits completed meanwhile for ones it had read.
        a_compaction_beside_a_commit_gives_way(true).await;
    }

    #[tokio::test]
    async fn a_metadata_compaction_gives_way_to_a_data_instant_it_read_before_it_completed() {
        // The metadata table listed after another writer's commit completed, the data timeline
        // before: its records are not read (not completed on that timeline), and would be lost.
        a_compaction_beside_a_commit_gives_way(false).await;
    }

    #[tokio::test]
    async fn a_metadata_compaction_whose_snapshot_was_compacted_away_gives_way() {
        // Found by the stress test (writers frozen past their heartbeat): a writer stalled long
        // enough for two compactions by others, which removed the slices its snapshot of the
        // metadata table names; its own compaction then failed its write with a storage error.
        let dir = tempfile::tempdir().unwrap();
        let mut t = due_for_compaction(dir.path()).await;
        let stale = another(&t).await;
        let current = stale.metadata_table().await.unwrap().unwrap();
        // One commit the writer's snapshot lacks (a write in flight keeps it from compacting).
        let mut holder = another(&t).await;
        let in_flight = holder.begin_write(WriteOperation::Insert).await.unwrap();
        t.write(WriteOperation::Insert, vec![by_parity(&[100])], &WriteConfig::default()).await.unwrap();
        in_flight.abort(&mut holder).await.unwrap();
        // Two compactions by others: the second removes the slices `current` reads.
        for i in 0..=COMPACT_AFTER_LOGS as i64 {
            t.write(WriteOperation::Insert, vec![by_parity(&[200 + 2 * i])], &WriteConfig::default()).await.unwrap();
        }
        let mut mdt = Table::open(&metadata_uri(&t), t.options().bare()).await.unwrap();
        let compactions = |mdt: &Table| mdt.timeline().instants().iter().filter(|i| i.action == Action::Commit).count();
        assert_eq!(compactions(&mdt), 2);
        let read = current.view.groups().flat_map(|g| g.slices.values().next_back()).flat_map(|s| &s.logs);
        let mut gone = 0;
        for log in read {
            gone += usize::from(mdt.storage().get_opt(&log.path).await.unwrap().is_none());
        }
        assert!(gone > 0, "the slices the stale snapshot reads were removed");
        compact_if_due(&stale, &current, LATER).await.expect("the compaction gives way");
        mdt.reload().await.unwrap();
        assert_eq!(compactions(&mdt), 2, "no third compaction");
        assert_eq!(mdt.timeline().pending().count(), 0, "nothing left pending");
        t.reload().await.unwrap();
        assert!(t.validate_metadata().await.unwrap().ok());
    }

    #[tokio::test]
    async fn a_write_whose_index_is_unreadable_reads_the_keys_of_the_files_instead() {
        // The metadata table narrows a write's lookup, never decides it: with the log files of its
        // record index and bloom filters gone, an upsert still finds the keys it updates.
        let dir = tempfile::tempdir().unwrap();
        let mut t = table(dir.path(), TableType::CopyOnWrite).await;
        let config = WriteConfig::default();
        t.write(WriteOperation::Insert, vec![by_parity(&[1, 2, 3, 4])], &config).await.unwrap();
        let mdt = Table::open(&metadata_uri(&t), t.options().bare()).await.unwrap();
        for f in mdt.storage().list_table().await.unwrap() {
            let index = f.path.starts_with("record_index/") || f.path.starts_with("bloom_filters/");
            if index && f.path.contains(".log.") {
                mdt.storage().delete(&f.path).await.unwrap();
            }
        }
        t.write(WriteOperation::Upsert, vec![by_parity(&[2, 3, 5])], &config).await.unwrap();
        let batches: Vec<RecordBatch> = t
            .scan(&crate::read::ScanOptions::default())
            .await
            .unwrap()
            .collect::<Vec<_>>()
            .await
            .into_iter()
            .map(|b| b.unwrap())
            .collect();
        let mut ids: Vec<i64> = batches
            .iter()
            .flat_map(|b| {
                let ids = b.column_by_name("id").unwrap();
                ids.as_any().downcast_ref::<arrow::array::Int64Array>().unwrap().values().to_vec()
            })
            .collect();
        ids.sort();
        assert_eq!(ids, [1, 2, 3, 4, 5], "updated in place, not duplicated");
    }

    #[tokio::test]
    async fn a_metadata_deltacommit_of_a_write_rolled_back_before_it_stays_unread_once_archived() {
        // Found by the stress test (writers frozen past their heartbeat): a writer rolled back by
        // another process went on to complete its metadata deltacommit, into the slice of a later
        // compaction; once archival moved the data timeline's start past its time, its records
        // read as committed (a log file in the files index, deleted keys gone from the record
        // index).
        let dir = tempfile::tempdir().unwrap();
        let mut t = table(dir.path(), TableType::MergeOnRead).await;
        let config = WriteConfig::default();
        t.write(WriteOperation::Insert, vec![by_parity(&[1, 2])], &config).await.unwrap();
        let mut frozen = another(&t).await;
        let tx = frozen.begin_write(WriteOperation::Delete).await.unwrap();
        let time = tx.time().to_string();
        let part = frozen.write_files(WriteOperation::Delete, vec![by_parity(&[1])], &time, &config).await.unwrap();
        let mut other = another(&t).await;
        let pending = other.timeline().get(&time).unwrap().with_state(State::Inflight);
        crate::commit::rollback_pending(&other, &pending).await.unwrap();
        for i in 1..=11 {
            other.write(WriteOperation::Insert, vec![by_parity(&[2 * i + 100])], &config).await.unwrap();
        }
        assert!(compacted(&t).await);
        let err = frozen.commit_write(tx, WriteOperation::Delete, vec![part], false).await.unwrap_err();
        assert!(matches!(err, Error::CommitConflict { .. }), "{err}");
        let mdt = Table::open(&metadata_uri(&t), t.options().bare()).await.unwrap();
        assert!(mdt.timeline().get(&time).is_some_and(Instant::is_completed), "its metadata deltacommit completed");
        other.reload().await.unwrap();
        // A merge-on-read table archives only what its latest compaction holds.
        other.write(WriteOperation::Upsert, vec![by_parity(&[2])], &config).await.unwrap();
        other.compact(&crate::services::CompactionConfig::default()).await.unwrap();
        other.write(WriteOperation::Insert, vec![by_parity(&[1000])], &config).await.unwrap();
        other.archive(crate::services::ArchiveConfig { min_commits: 2, max_commits: 3 }).await.unwrap();
        assert!(other.timeline().write_timeline_start().is_some_and(|s| time.as_str() < s), "archived past it");
        t.reload().await.unwrap();
        assert!(!t.timeline().is_committed(&time));
        let report = t.validate_metadata().await.unwrap();
        assert!(report.ok(), "{:?}", report.differences);
        assert_eq!(indexed(&t).await, stored(&t).await);
    }

    #[tokio::test]
    async fn a_deltacommit_takes_back_a_metadata_compaction_in_flight_before_it_writes() {
        // The compaction may have checked for concurrent deltacommits just before this one's
        // requested file appeared: it must not complete over the slice this one writes into.
        let dir = tempfile::tempdir().unwrap();
        let mut t = due_for_compaction(dir.path()).await;
        let latest = t.timeline().latest_completed_data().unwrap().time.clone();
        let mut mdt = Table::open(&metadata_uri(&t), t.options().bare()).await.unwrap();
        let plan = Bytes::from(crate::format::compaction_plan::CompactionPlan::default().to_avro().unwrap());
        let tx = Transaction::begin_at(&mut mdt, Action::Compaction, &format!("{latest}001"), plan).await.unwrap();
        another(&t)
            .await
            .write(WriteOperation::Insert, vec![by_parity(&[100])], &WriteConfig::default())
            .await
            .unwrap();
        let mut metadata = commit_metadata("COMPACT").unwrap();
        metadata.compacted = true;
        let err = tx.commit(&mut mdt, &metadata).await.unwrap_err();
        assert!(matches!(err, Error::CommitConflict { .. }), "{err}");
        t.reload().await.unwrap();
        assert_eq!(indexed(&t).await, stored(&t).await);
        assert!(t.validate_metadata().await.unwrap().ok());
    }
}
