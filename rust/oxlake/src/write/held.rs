//! Which file groups hold the keys of a streamed write, found in one pass over the table's keys
//! (a grace hash join) where the table keeps no record index.
//!
//! A streamed write spills its input by the hash of each row's key and takes it a part at a time
//! ([`super::stream`]). Looking each part's keys up reads the key columns of every file of the
//! partitions written, so the cost grew with input × table. Here the keys of every live slice in
//! those partitions are read once instead: each is hashed as the input was, kept only when the
//! input may hold its hash ([`KeyFilter`]), and spilled, as its hash and its file group, to the
//! part its hash meets ([`crate::storage::spill::Router`]). A part then finds its keys' groups by
//! hash in its own file of table keys.
//!
//! Matching by a 64-bit hash may place a key in a group that does not hold it (two keys of one
//! hash), never miss one that does: the part's rows are written by a plan that reads the keys of
//! the groups named ([`super::plan::plan_within`]), where a key found nowhere is new. So a hash
//! collision costs a group read, not a wrong answer.

use std::collections::BTreeSet;
use std::hash::BuildHasher;
use std::sync::Arc;

use arrow::array::{Array, RecordBatch, UInt32Array, UInt64Array};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use futures::StreamExt;

use crate::error::{Error, Result};
use crate::storage::spill::{Router, Spill, SpillDir, SpillFile};
use crate::table::Table;
use crate::table::fs_view::{BaseFile, FileGroupId, LogFile};

/// Bits of [`KeyFilter`] (64 MiB): a 2 GB input (about 38,000,000 keys) sets 7% of them, so that
/// few of the table's keys that the input lacks are spilled.
const FILTER_BITS: u32 = 29;

/// The hashes an input's keys may have: one bit per hash prefix, set for every key spilled.
pub(super) struct KeyFilter {
    words: Vec<u64>,
}

impl KeyFilter {
    pub(super) fn new() -> Self {
        KeyFilter { words: vec![0; 1 << (FILTER_BITS - 6)] }
    }

    fn bit(hash: u64) -> (usize, u64) {
        let prefix = hash >> (64 - FILTER_BITS);
        ((prefix >> 6) as usize, 1 << (prefix & 63))
    }

    pub(super) fn insert(&mut self, hash: u64) {
        let (word, bit) = Self::bit(hash);
        self.words[word] |= bit;
    }

    fn may_hold(&self, hash: u64) -> bool {
        let (word, bit) = Self::bit(hash);
        self.words[word] & bit != 0
    }
}

/// The table's keys a streamed write may hold, spilled by the part of its input they meet.
pub(super) struct HeldKeys {
    /// For each part (run) of the input: the hashes and group numbers of the stored keys whose
    /// hash falls in it, when any does.
    per_run: Vec<Option<SpillFile>>,
    /// The file groups read, by number.
    groups: Vec<FileGroupId>,
}

/// The columns a stored key is spilled with: its hash and its group's number.
fn held_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("key_hash", DataType::UInt64, false),
        Field::new("group", DataType::UInt32, false),
    ]))
}

/// One live slice whose keys are read: its base file and its logs.
struct Slice {
    group: FileGroupId,
    base: BaseFile,
    logs: Vec<LogFile>,
}

impl HeldKeys {
    /// The file groups that may hold each of `hashes` (the hashes of run `run`'s rows, in their
    /// order): those holding a stored key of the row's hash, read from the run's file.
    pub(super) fn groups_of(&self, run: usize, hashes: &[u64]) -> Result<Vec<Vec<&FileGroupId>>> {
        let mut out: Vec<Vec<&FileGroupId>> = vec![Vec::new(); hashes.len()];
        let Some(Some(file)) = self.per_run.get(run) else { return Ok(out) };
        // The row of each hash; rows sharing a hash with an earlier row (two keys of one hash,
        // rare) beside.
        let mut first: hashbrown::HashMap<u64, u32> = hashbrown::HashMap::with_capacity(hashes.len());
        let mut more: hashbrown::HashMap<u64, Vec<u32>> = hashbrown::HashMap::new();
        for (row, hash) in hashes.iter().enumerate() {
            match first.entry(*hash) {
                hashbrown::hash_map::Entry::Vacant(slot) => {
                    slot.insert(row as u32);
                }
                hashbrown::hash_map::Entry::Occupied(_) => more.entry(*hash).or_default().push(row as u32),
            }
        }
        for batch in file.read()? {
            let (keys, groups) = held_columns(&batch)?;
            for (hash, group) in keys.values().iter().zip(groups.values()) {
                let Some(row) = first.get(hash) else { continue };
                let group = self
                    .groups
                    .get(*group as usize)
                    .ok_or_else(|| Error::invalid_data("a spilled group number past the groups read"))?;
                for row in std::iter::once(row).chain(more.get(hash).into_iter().flatten()) {
                    let of_row = &mut out[*row as usize];
                    if !of_row.contains(&group) {
                        of_row.push(group);
                    }
                }
            }
        }
        Ok(out)
    }
}

fn held_columns(batch: &RecordBatch) -> Result<(&UInt64Array, &UInt32Array)> {
    let keys = batch.column(0).as_any().downcast_ref::<UInt64Array>();
    let groups = batch.column(1).as_any().downcast_ref::<UInt32Array>();
    keys.zip(groups).ok_or_else(|| Error::invalid_data("a spill of stored keys lacks its columns"))
}

impl Table {
    /// Reads the keys of every live slice the write may touch (those of `partitions`, or every
    /// partition's with a global index) and spills each whose hash `filter` may hold into the
    /// file of the run among `runs` its hash falls in. `hasher` hashes `(scope, key)` as the
    /// input was spilled (scope: the partition, or `""` with a global index).
    pub(super) async fn held_keys(
        &self,
        dir: &Arc<SpillDir>,
        runs: &[&[SpillFile]],
        partitions: &BTreeSet<String>,
        filter: Option<&KeyFilter>,
        hasher: hashbrown::DefaultHashBuilder,
        parallelism: usize,
    ) -> Result<HeldKeys> {
        let global = self.config().global_index;
        let slices = self.slices_to_read(global, partitions).await?;
        let router =
            Arc::new(Router::new(runs.iter().enumerate().flat_map(|(r, run)| run.iter().map(move |f| (f, r))))?);
        let storage = self.storage();
        let stored_keys = Arc::new(self.stored_keys()?);
        let committed = match slices.iter().any(|s| !s.logs.is_empty()) {
            true => Some(Arc::new(crate::log::CommittedLogs::load(storage, self.timeline()).await?)),
            false => None,
        };
        let mut spill = Spill::new(dir, &held_schema(), runs.len().max(1), 0);
        let groups: Vec<FileGroupId> = slices.iter().map(|s| s.group.clone()).collect();
        let mut pending = slices.into_iter().enumerate();
        let mut tasks = tokio::task::JoinSet::new();
        // Only `parallelism` slices are read at once: each answer waits, small, to be spilled.
        loop {
            while tasks.len() < parallelism.max(1) {
                let Some((number, slice)) = pending.next() else { break };
                let (storage, stored_keys, committed, router) =
                    (storage.clone(), stored_keys.clone(), committed.clone(), router.clone());
                tasks.spawn(async move {
                    let scope = if global { String::new() } else { slice.group.0.clone() };
                    let (mut hashes, mut into) = (Vec::new(), Vec::new());
                    let each = |key: &str| {
                        let hash = hasher.hash_one((scope.as_str(), key));
                        if let Some(run) = router.route(hash) {
                            hashes.push(hash);
                            into.push(run as u32);
                        }
                    };
                    slice_keys(&storage, &slice, committed.as_deref(), &stored_keys, each).await?;
                    Ok::<_, Error>((number as u32, hashes, into))
                });
            }
            let Some(joined) = tasks.join_next().await else { break };
            let (number, hashes, into) = joined.map_err(|e| Error::invalid_data(format!("key read failed: {e}")))??;
            let kept: Vec<usize> = match filter {
                Some(filter) => (0..hashes.len()).filter(|&i| filter.may_hold(hashes[i])).collect(),
                None => (0..hashes.len()).collect(),
            };
            if kept.is_empty() {
                continue;
            }
            let batch = RecordBatch::try_new(
                held_schema(),
                vec![
                    Arc::new(UInt64Array::from_iter_values(kept.iter().map(|&i| hashes[i]))),
                    Arc::new(UInt32Array::from_iter_values(kept.iter().map(|_| number))),
                ],
            )?;
            let into: Vec<u32> = kept.iter().map(|&i| into[i]).collect();
            spill.push_into(&batch, &into)?;
        }
        let mut per_run = spill.finish_buckets()?;
        per_run.resize_with(runs.len(), || None);
        Ok(HeldKeys { per_run, groups })
    }

    /// The latest slice of every live file group with a base file (those a write's lookup reads,
    /// [`super::plan::plan`]) in `partitions`, or in every partition with a global index.
    async fn slices_to_read(&self, global: bool, partitions: &BTreeSet<String>) -> Result<Vec<Slice>> {
        let Some(latest) = self.timeline().latest_completed_data().map(|i| i.time.clone()) else {
            return Ok(Vec::new());
        };
        let view = self.file_system_view().await?;
        let replaced = self.replaced_file_groups(&latest).await?;
        let mut slices = Vec::new();
        for (g, s) in view.slices_as_of(&latest, &replaced) {
            let Some(base) = &s.base else { continue };
            if global || partitions.contains(&g.partition) {
                slices.push(Slice { group: g.id(), base: base.clone(), logs: s.logs.clone() });
            }
        }
        Ok(slices)
    }
}

/// Calls `each` with every key a slice holds, live or deleted: its base file's, then its logs'.
async fn slice_keys(
    storage: &crate::storage::Storage,
    slice: &Slice,
    committed: Option<&crate::log::CommittedLogs>,
    stored: &crate::keys::StoredKeys,
    mut each: impl FnMut(&str) + Send,
) -> Result<()> {
    let path = &slice.base.path;
    let read = async {
        let mut stream = stored.base_file_batches(storage, path, slice.base.size).await?;
        while let Some(batch) = stream.next().await {
            let column = stored.keys_in(&batch?, path)?;
            column.iter().flatten().for_each(&mut each);
        }
        Ok::<_, Error>(())
    };
    crate::storage::decoding(path, read).await.map_err(|e| e.in_file(path))?;
    if !slice.logs.is_empty() {
        crate::log::record_keys(storage, &slice.logs, committed, stored).await?.keys().for_each(|k| each(k));
    }
    Ok(())
}
