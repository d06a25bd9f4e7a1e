//! Inserts, upserts and deletes of a stream larger than memory.
//!
//! These operations combine duplicate keys across the whole input and route every key to the file
//! group holding it, so a chunk cannot be written on its own as a bulk insert's is. An input that
//! fits in one chunk is written as a whole (`Table::write`). A larger one goes through the disk:
//!
//! 1. **By key.** Each chunk is checked and keyed (bad input fails here, before the write claims
//!    an instant), and its rows are spilled by the hash of their key (of their partition and key
//!    without a global index), so every duplicate of a key lands in one file.
//! 2. **The key files** are read a part at a time (a quarter of a chunk: files split again while
//!    larger, small ones taken together), their duplicates combined and their keys looked up:
//!    in the record index where the table keeps one, else in the table's keys read once for all
//!    parts and spilled by the part they meet ([`super::held`]). Rows of keys the table holds are
//!    spilled again by the hash of their file group, the rows of new keys by the hash of their
//!    partition.
//! 3. **The group files** (split likewise, a single group never) are written a part at a time:
//!    every group's changes are in one file, so each group is rewritten, or logged to, once, by a
//!    plan that reads the keys of the part's own groups only (unless a key has copies in two).
//! 4. **Each partition file** is cut into new file groups a chunk at a time, so a partition gets
//!    files of the target size but for one per chunk.
//!
//! All files are of one instant, committed at the end. Memory holds about a chunk and what its
//! write needs, or a part and what its lookup needs; the keys written are not held (their
//! partitions are: conflict checks read them back from the files written) unless the table keeps
//! a record index, which needs them.
//! Nothing is written to the table before the input has been read whole: a failing input leaves
//! it as it was, without an instant.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::hash::BuildHasher;
use std::sync::Arc;

use arrow::array::{Array, ArrayRef, RecordBatch, UInt32Array, UInt64Array};
use arrow::compute::concat_batches;
use arrow::datatypes::{DataType, Field};

use super::held::{HeldKeys, KeyFilter};
use super::plan::{self, WriteConfig};
use super::{IS_DELETED, Incoming, WriteOperation, WriteResult, WrittenFiles, keyed, next_chunk, prepare};
use crate::error::{Error, Result};
use crate::storage::spill::{self, Spill, SpillFile};
use crate::table::Table;
use crate::table::fs_view::FileGroupId;

/// Files the input is first spilled into (more where one outgrows a part, [`Streamed::part_bytes`]).
const KEY_FILES: usize = 16;
/// Files the rows of held keys are spilled into, by file group.
const GROUP_FILES: usize = 16;
/// Files the rows of new keys are spilled into, by partition.
const PARTITION_FILES: usize = 16;
/// The least part a spilled file is split for: tiny chunks would split files down to a key each
/// (a lookup per key).
const MIN_SPLIT: usize = 64 << 10;
/// A lookup or a group write takes this share of a chunk of spilled rows at once: it holds them
/// several times over (read, combined and conformed, a hash index of their keys, the plan's map
/// of each held key to its row). Measured on a 2 GB upsert: parts of 128 MiB peaked at 1.65 GB,
/// runs of 512 MiB at 3.2 GB.
const PARTS_PER_CHUNK: usize = 4;

/// What a streamed write carries from one step to the next: the hash of rows' keys and groups,
/// and the files numbered so far (every part writes as the write's task, numbering its files
/// on from the last part's, so that no two parts write one name).
struct Streamed<'a> {
    op: WriteOperation,
    config: &'a WriteConfig,
    chunk_bytes: usize,
    dir: Arc<spill::SpillDir>,
    hasher: hashbrown::DefaultHashBuilder,
    files: usize,
    /// Whether the table keeps a record index: each run looks its keys up in it (else the
    /// table's keys are read once for all runs).
    indexed: bool,
    /// Whether the parts list every key they wrote (else only their partitions).
    keep_keys: bool,
    /// Whether a key of the input has copies in several file groups.
    copies: bool,
    /// The hashes of the input's keys, for the one pass over the table's keys (dropped after it:
    /// a retried write passes every key).
    filter: Option<KeyFilter>,
    /// The partitions of the input.
    partitions: BTreeSet<String>,
    /// The file groups holding input keys, by the hash their rows are spilled by.
    groups: HashMap<u64, FileGroupId>,
    /// Whether two of those groups share a hash: a run's groups are then not known by it.
    groups_clash: bool,
}

impl Table {
    /// `op` (insert, upsert or delete) of a stream, in bounded memory: the input is read
    /// `chunk_bytes` of Arrow data at a time. An input of one chunk is written as [`Table::write`]
    /// writes it; a larger one is spilled to local disk (`config.spill_dir`) to combine its
    /// duplicate keys and find their file groups (see the module's notes), then committed as one
    /// instant. New keys of such an input go to new file groups (an insert tops up small files
    /// with the first chunk of each partition file, an upsert does not). A write that loses a
    /// conflict is written again from the spilled input, up to `config.conflict_retries` times.
    pub async fn write_stream(
        &mut self,
        op: WriteOperation,
        input: &mut (dyn Iterator<Item = Result<RecordBatch>> + Send),
        chunk_bytes: usize,
        config: &WriteConfig,
    ) -> Result<WriteResult> {
        if !matches!(op, WriteOperation::Insert | WriteOperation::Upsert | WriteOperation::Delete)
            || config.read_from.is_some()
        {
            let mut batches = Vec::new();
            for batch in input {
                batches.push(batch?);
            }
            return self.write(op, batches, config).await;
        }
        if chunk_bytes == 0 {
            return Err(Error::invalid_arg("chunk_bytes", "must be a positive number of bytes"));
        }
        let first = next_chunk(input, chunk_bytes)?;
        if first.iter().map(RecordBatch::get_array_memory_size).sum::<usize>() < chunk_bytes {
            return self.write(op, first, config).await;
        }
        self.check_writable()?;
        let mut s = Streamed::new(self, op, config, chunk_bytes)?;
        let (by_key, only_deletes) = self.spill_by_key(&mut s, first, input)?;
        // Split once: the look-ahead for deletes and every attempt read the same parts.
        let by_key = s.leaves(by_key)?;
        let mut attempt = 0;
        loop {
            // A delete none of whose keys the table holds leaves no instant (as `write`'s).
            if only_deletes && !self.holds_any(&s, &by_key).await? {
                return Ok(WriteResult::default());
            }
            match self.write_spilled(&mut s, &by_key).await {
                Err(Error::CommitConflict { instant, detail }) if attempt < config.conflict_retries => {
                    attempt += 1;
                    log::info!("{}: {op:?} lost a conflict with {instant} ({detail}); attempt {attempt}", self.uri());
                    self.reload().await?;
                }
                outcome => return outcome,
            }
        }
    }

    /// [`Table::write_files`] of a stream (the task side of a distributed write), in bounded
    /// memory: the files [`Table::write_stream`] writes for `op`, as files of the pending
    /// `instant`, committed by the driver. An input of one chunk is written as `write_files`
    /// writes it; a larger one is spilled to combine its duplicate keys and find their file
    /// groups, and written in parts, each of which the result lists (their files numbered on
    /// under `config.task`). A bulk insert writes a chunk at a time; insert overwrites and
    /// globally sorted bulk inserts hold the input. Nothing is written before the input has
    /// been read whole (a larger input) or its first chunk (a bulk insert): a failing input
    /// leaves at most files the commit of this instant never names, which its rollback removes.
    pub async fn write_files_stream(
        &mut self,
        op: WriteOperation,
        input: &mut (dyn Iterator<Item = Result<RecordBatch>> + Send),
        instant: &str,
        chunk_bytes: usize,
        config: &WriteConfig,
    ) -> Result<Vec<WrittenFiles>> {
        if chunk_bytes == 0 {
            return Err(Error::invalid_arg("chunk_bytes", "must be a positive number of bytes"));
        }
        // A bulk insert sorted globally orders all of its input: held, as insert overwrites are.
        let streams = match op {
            WriteOperation::Insert | WriteOperation::Upsert | WriteOperation::Delete => true,
            WriteOperation::BulkInsert => config.bulk_sort != crate::BulkSort::GlobalSort,
            _ => false,
        };
        let mut first = next_chunk(input, chunk_bytes)?;
        if !streams || first.iter().map(RecordBatch::get_array_memory_size).sum::<usize>() < chunk_bytes {
            if !streams {
                for batch in input {
                    first.push(batch?);
                }
            }
            return Ok(vec![self.write_files(op, first, instant, config).await?]);
        }
        self.reload().await?;
        self.check_writable()?;
        self.check_pending(op, instant)?;
        let before = self.data_schema();
        let _beating = crate::commit::TaskHeartbeat::start(self, instant).await?;
        let indexed = crate::metadata::holds_record_index(self).await;
        let written = match op {
            WriteOperation::BulkInsert => match prepare(self, op, first, config.schema_mode)? {
                // A bulk insert's keys are for the record index only: the driver's check that
                // no two tasks wrote one key passes bulk inserts by.
                Some(first) => {
                    let strip = |files: &mut WrittenFiles| {
                        if !indexed {
                            files.keys.unlist();
                        }
                    };
                    self.bulk_insert_chunks(input, first, instant, chunk_bytes, config, strip).await
                }
                None => Ok(Vec::new()),
            },
            _ => {
                let mut s = Streamed::new(self, op, config, chunk_bytes)?;
                let (by_key, _) = self.spill_by_key(&mut s, first, input)?;
                let by_key = s.leaves(by_key)?;
                s.indexed = indexed;
                // Listed for the driver's check that no two tasks wrote one key, unless the task
                // vouches for its partitions (`own_partitions`), as `write_files` lists them.
                s.keep_keys = !config.own_partitions || self.config().global_index || indexed;
                self.write_spilled_files(&mut s, &by_key, instant).await
            }
        };
        let mut parts = self.still_pending(op, instant, written).await?;
        if self.data_schema() != before {
            let schema = crate::schema::encode_arrow_schema(&self.data_schema());
            parts.iter_mut().for_each(|p| p.schema = Some(schema.clone()));
        }
        Ok(parts)
    }

    /// A task's files, once it has written them all, if their instant is still pending: a task
    /// attempt that outlived its write (the driver committed without it, or rolled the write
    /// back, while it streamed) removes what it wrote, which no commit names, and fails. Files
    /// a failed write left are the rollback's (or the commit's removal of unreported files).
    async fn still_pending(
        &mut self,
        op: WriteOperation,
        instant: &str,
        written: Result<Vec<WrittenFiles>>,
    ) -> Result<Vec<WrittenFiles>> {
        let parts = written?;
        self.reload().await?;
        if let Err(e) = self.check_pending(op, instant) {
            for path in parts.iter().flat_map(|p| &p.stats).filter_map(|(_, stat)| stat.path.as_deref()) {
                self.storage().delete(path).await?;
            }
            return Err(Error::CommitConflict {
                instant: instant.to_string(),
                detail: format!("the write ended while this task wrote its files ({e}); they are removed"),
            });
        }
        Ok(parts)
    }

    /// Step 1: the whole input, checked, keyed and spilled by key; and whether every row of it
    /// deletes its key.
    fn spill_by_key(
        &self,
        s: &mut Streamed<'_>,
        first: Vec<RecordBatch>,
        input: &mut (dyn Iterator<Item = Result<RecordBatch>> + Send),
    ) -> Result<(Vec<SpillFile>, bool)> {
        let mut only_deletes = true;
        let schema = first.first().map(RecordBatch::schema).ok_or_else(|| Error::invalid_data("an empty stream"))?;
        let global = self.config().global_index;
        let mut spill = Spill::new(&s.dir, &schema, KEY_FILES, 0).compressed();
        let mut chunk = first;
        while !chunk.is_empty() {
            if let Some(other) = chunk.iter().find(|b| b.schema().fields() != schema.fields()) {
                return Err(Error::SchemaMismatch {
                    detail: format!(
                        "the stream's batches differ in schema: {:?}, then {:?}",
                        field_names(&schema),
                        field_names(&other.schema())
                    ),
                });
            }
            let batch = concat_batches(&schema, &chunk)?;
            drop(chunk);
            if let Some(keyed) = keyed(self, s.op, vec![batch.clone()], s.config.schema_mode)? {
                only_deletes &= s.op == WriteOperation::Delete || keyed.only_deletes();
                s.partitions.extend(keyed.partitions.paths.iter().cloned());
                let hashes = UInt64Array::from_iter_values((0..keyed.keys.len()).map(|row| {
                    let scope = if global { "" } else { keyed.partitions.path(row) };
                    s.hasher.hash_one((scope, keyed.keys.value(row)))
                }));
                if let Some(filter) = &mut s.filter {
                    hashes.values().iter().for_each(|h| filter.insert(*h));
                }
                spill.push(&batch, hashes)?;
            }
            chunk = next_chunk(input, s.chunk_bytes)?;
        }
        Ok((spill.finish()?, only_deletes))
    }

    /// Whether the table holds any key of the spilled input (looked up file by file, until one
    /// is found).
    async fn holds_any(&mut self, s: &Streamed<'_>, by_key: &[SpillFile]) -> Result<bool> {
        self.reload().await?;
        let lookup_only = WriteConfig { small_file_limit: 0, ..s.config.clone() };
        for run in s.runs(by_key) {
            let Some(incoming) = prepare(self, s.op, read_run(run)?, s.config.schema_mode)? else { continue };
            if !plan::plan(self, s.op, Some(&Arc::new(incoming)), &lookup_only).await?.work.is_empty() {
                return Ok(true);
            }
        }
        Ok(false)
    }

    /// Steps 2 to 4 under an instant of their own, committed; rolled back on failure. A write
    /// that changes nothing (deletes of keys the table lacks) leaves no instant.
    async fn write_spilled(&mut self, s: &mut Streamed<'_>, by_key: &[SpillFile]) -> Result<WriteResult> {
        let (op, config) = (s.op, s.config);
        let tx = self.begin_write(op).await?;
        // Read under the instant: an index built later fails the commit (`metadata::sync`).
        s.indexed = crate::metadata::holds_record_index(self).await;
        s.keep_keys = s.indexed;
        s.copies = false;
        s.groups.clear();
        s.groups_clash = false;
        let parts = match self.write_spilled_files(s, by_key, tx.time()).await {
            Ok(parts) => parts,
            Err(e) => {
                let e = tx.lost_to_service(self, e).await;
                return Err(tx.fail(self, e).await);
            }
        };
        if parts.iter().all(|p| p.stats.is_empty()) {
            tx.abort(self).await?;
            return Ok(WriteResult::default());
        }
        // Parts that rewrote one group (a key with copies in two groups) are merged.
        let reconcile = s.copies;
        self.commit_and_serve(tx, op, parts, reconcile, &config.extra_metadata, config).await
    }

    async fn write_spilled_files(
        &mut self,
        s: &mut Streamed<'_>,
        by_key: &[SpillFile],
        instant: &str,
    ) -> Result<Vec<WrittenFiles>> {
        let op = s.op;
        let global = self.config().global_index;
        let looks_up = op != WriteOperation::Insert || global;
        let (mut held, mut new): (Option<Spill>, Option<Spill>) = (None, None);
        let runs = s.runs(by_key);
        // Without a record index, the table's keys are read once for all runs (a grace hash
        // join, `held`); with one, each run looks its keys up in it.
        let stored = match looks_up && !s.indexed {
            true => {
                let filter = s.filter.take();
                let hasher = s.hasher;
                let parallelism = s.config.parallelism;
                Some(self.held_keys(&s.dir, &runs, &s.partitions, filter.as_ref(), hasher, parallelism).await?)
            }
            false => None,
        };
        for (number, run) in runs.into_iter().enumerate() {
            let Some(incoming) = self.spilled_incoming(s, run).await? else { continue };
            let mut new_rows = Vec::new();
            if looks_up {
                let (held_rows, hashes) = match &stored {
                    Some(stored) => self.found_in(s, stored, number, &incoming, &mut new_rows)?,
                    None => self.find_groups(s, &incoming, &mut new_rows).await?,
                };
                if !held_rows.is_empty() {
                    let rows = spillable(&incoming.take(&UInt32Array::from(held_rows))?)?;
                    let spill =
                        held.get_or_insert_with(|| Spill::new(&s.dir, &rows.schema(), GROUP_FILES, 0).compressed());
                    spill.push(&rows, UInt64Array::from(hashes))?;
                }
            } else {
                new_rows = (0..incoming.keys.len() as u32).collect();
            }
            if !new_rows.is_empty() {
                // New keys, combined and none deleting: spilled by partition (without deletion
                // flags), to be cut into files a partition at a time.
                let rows = incoming.take(&UInt32Array::from(new_rows))?;
                let hashes = (0..rows.keys.len()).map(|r| s.hasher.hash_one(rows.partitions.path(r)));
                let hashes = UInt64Array::from_iter_values(hashes);
                let spill = new
                    .get_or_insert_with(|| Spill::new(&s.dir, &rows.batch.schema(), PARTITION_FILES, 0).compressed());
                spill.push(&rows.batch, hashes)?;
            }
        }
        let mut parts = Vec::new();
        // Each file group's changes, written once; but a key with copies in several groups
        // (left by loads that look no key up) changes all of them, so its part may rewrite a
        // group another part rewrites too: the commit then merges such rewrites (which needs
        // each part's keys where the rows carry no meta fields).
        let keep_keys = s.keep_keys;
        s.keep_keys |= s.copies;
        let held = s.leaves(held.map(Spill::finish).transpose()?.unwrap_or_default())?;
        for run in s.runs(&held) {
            // Where no key has copies in two groups, each key's group is known: the run's plan
            // reads the keys of its own groups only (else those of every group it may touch).
            let within = match s.copies {
                false => s.groups_of_run(run)?,
                true => None,
            };
            let Some(incoming) = self.spilled_incoming(s, run).await? else { continue };
            parts.push(self.write_part(s, op, &incoming, instant, false, within.as_ref()).await?);
        }
        // Spills of one attempt go once written, so that the disk holds about the input twice
        // at most (its key files, kept for another attempt, and one of these steps' files).
        held.into_iter().for_each(SpillFile::remove);
        s.keep_keys = keep_keys;
        // New keys into new file groups, a chunk at a time. Without a global index they are
        // written as an insert's (the same files, without looking keys known to be new up
        // again); an insert tops up small files with its first chunk of each partition (no
        // other part of the write touches them), an upsert does not (its rewrites may have).
        let new_op = if global { op } else { WriteOperation::Insert };
        for file in s.leaves(new.map(Spill::finish).transpose()?.unwrap_or_default())? {
            let mut first = op == WriteOperation::Insert && !global;
            for chunk in file.chunks(s.chunk_bytes)? {
                // Keyed, not combined again: step 2 combined each key's rows (all of them met in
                // one run), so these keys are distinct, and a table of a chunk's keys (about
                // 400 MB for 10,000,000 integer keys, spilled out of order) would be for nothing.
                let Some(incoming) = keyed(self, new_op, chunk?, s.config.schema_mode)? else { continue };
                let incoming = Arc::new(incoming);
                parts.push(self.write_part(s, new_op, &incoming, instant, first, None).await?);
                first = false;
            }
            file.remove();
        }
        Ok(parts)
    }

    /// The rows of `incoming` whose keys the table holds, with the hash of the file group holding
    /// each; the rows of new keys that write something go to `new_rows` (a delete of a key the
    /// table lacks deletes nothing).
    async fn find_groups(
        &self,
        s: &mut Streamed<'_>,
        incoming: &Arc<Incoming>,
        new_rows: &mut Vec<u32>,
    ) -> Result<(Vec<u32>, Vec<u64>)> {
        let lookup_only = WriteConfig { small_file_limit: 0, ..s.config.clone() };
        let planned = plan::plan(self, s.op, Some(incoming), &lookup_only).await?;
        let mut group_of: Vec<Option<u64>> = vec![None; incoming.keys.len()];
        for w in &planned.work {
            let hash = s.group_hash(&(w.partition.clone(), w.file_id.clone()));
            for row in w.changes.values().chain(w.moved_out.values()).chain(w.removed.values()) {
                let before = group_of[*row as usize].replace(hash);
                s.copies |= before.is_some_and(|b| b != hash);
            }
        }
        Ok(held_or_new(s.op, incoming, group_of, new_rows))
    }

    /// [`Table::find_groups`] from the table's keys read once (`stored`, run `number`): a row is
    /// held where a group holds a key of its hash (the run's plan reads that group's keys and
    /// tells), new where none does.
    fn found_in(
        &self,
        s: &mut Streamed<'_>,
        stored: &HeldKeys,
        number: usize,
        incoming: &Arc<Incoming>,
        new_rows: &mut Vec<u32>,
    ) -> Result<(Vec<u32>, Vec<u64>)> {
        let global = self.config().global_index;
        let hashes: Vec<u64> = (0..incoming.keys.len())
            .map(|row| {
                let scope = if global { "" } else { incoming.partitions.path(row) };
                s.hasher.hash_one((scope, incoming.keys.value(row)))
            })
            .collect();
        let mut group_of: Vec<Option<u64>> = vec![None; incoming.keys.len()];
        for (row, groups) in stored.groups_of(number, &hashes)?.into_iter().enumerate() {
            for group in groups {
                let hash = s.group_hash(group);
                let before = group_of[row].replace(hash);
                s.copies |= before.is_some_and(|b| b != hash);
            }
        }
        Ok(held_or_new(s.op, incoming, group_of, new_rows))
    }

    /// The rows of a run of spilled files, checked and combined as a write's input, in the schema
    /// the write writes.
    async fn spilled_incoming(&mut self, s: &Streamed<'_>, run: &[SpillFile]) -> Result<Option<Arc<Incoming>>> {
        let Some(incoming) = prepare(self, s.op, read_run(run)?, s.config.schema_mode)? else { return Ok(None) };
        self.adopt_write_schema(s.op, Some(Arc::new(incoming)), s.config.schema_mode).await
    }

    /// One part's files, written with `op` as a task of their own (own write tokens), into
    /// small files too only where `small_files`.
    async fn write_part(
        &mut self,
        s: &mut Streamed<'_>,
        op: WriteOperation,
        incoming: &Arc<Incoming>,
        instant: &str,
        small_files: bool,
        within: Option<&HashSet<FileGroupId>>,
    ) -> Result<WrittenFiles> {
        let small_file_limit = if small_files { s.config.small_file_limit } else { 0 };
        let config = WriteConfig { first_file: s.files, small_file_limit, ..s.config.clone() };
        let mut files = self.write_files_within(op, Some(incoming), instant, &config, within).await?;
        // One stat per file planned, written or not: the next part numbers its files on.
        s.files += files.stats.len();
        if !s.keep_keys {
            files.keys.unlist();
        }
        Ok(files)
    }
}

impl<'a> Streamed<'a> {
    fn new(table: &Table, op: WriteOperation, config: &'a WriteConfig, chunk_bytes: usize) -> Result<Self> {
        Ok(Streamed {
            op,
            config,
            chunk_bytes,
            dir: spill::directory(config.spill_dir.as_deref())?,
            hasher: hashbrown::DefaultHashBuilder::default(),
            files: config.first_file,
            indexed: false,
            keep_keys: true,
            copies: false,
            // Only writes that look keys up read the table's keys.
            filter: (op != WriteOperation::Insert || table.config().global_index).then(KeyFilter::new),
            partitions: BTreeSet::new(),
            groups: HashMap::new(),
            groups_clash: false,
        })
    }

    /// The hash the rows of a file group's changes are spilled by; the group kept by it.
    fn group_hash(&mut self, group: &FileGroupId) -> u64 {
        let hash = self.hasher.hash_one((&group.0, &group.1));
        let known = self.groups.entry(hash).or_insert_with(|| group.clone());
        self.groups_clash |= known != group;
        hash
    }

    /// The file groups a run of spilled changes is for (`None`: a hash of no known group, or
    /// of two).
    fn groups_of_run(&self, run: &[SpillFile]) -> Result<Option<HashSet<FileGroupId>>> {
        if self.groups_clash {
            return Ok(None);
        }
        let mut groups = HashSet::new();
        for file in run {
            for hash in file.hashes()?.into_iter().collect::<hashbrown::HashSet<u64>>() {
                match self.groups.get(&hash) {
                    Some(group) => groups.insert(group.clone()),
                    None => return Ok(None),
                };
            }
        }
        Ok(Some(groups))
    }

    /// `files`, each split again (and its parts too) while it holds more than a part and more
    /// than one hash. A file split is removed: callers keep the leaves, and split them once.
    fn leaves(&self, files: Vec<SpillFile>) -> Result<Vec<SpillFile>> {
        let (mut queue, mut out) = (files, Vec::new());
        while let Some(file) = queue.pop() {
            match self.split(&file)? {
                Some(parts) => {
                    queue.extend(parts);
                    file.remove();
                }
                None => out.push(file),
            }
        }
        Ok(out)
    }

    /// The spilled bytes a step of the write takes at once: a part of a chunk.
    fn part_bytes(&self) -> usize {
        (self.chunk_bytes / PARTS_PER_CHUNK).max(MIN_SPLIT)
    }

    /// Leaves ([`Streamed::leaves`]) in runs of at most a part (a larger leaf, one key or group,
    /// is a run of its own), so that small files are taken together: each run looks its keys up
    /// in the table once, which without a record index reads the key columns of every file of
    /// the partitions written.
    fn runs<'f>(&self, leaves: &'f [SpillFile]) -> Vec<&'f [SpillFile]> {
        let (mut runs, mut start, mut bytes) = (Vec::new(), 0, 0);
        for (i, leaf) in leaves.iter().enumerate() {
            if i > start && bytes + leaf.bytes > self.part_bytes() {
                runs.push(&leaves[start..i]);
                (start, bytes) = (i, 0);
            }
            bytes += leaf.bytes;
        }
        if start < leaves.len() {
            runs.push(&leaves[start..]);
        }
        runs
    }

    /// The file split again when it holds more than a part (`None`: small enough, or one hash
    /// only).
    fn split(&self, file: &SpillFile) -> Result<Option<Vec<SpillFile>>> {
        let limit = self.part_bytes();
        if file.bytes <= limit || file.rows < 2 {
            return Ok(None);
        }
        file.split(limit)
    }
}

/// Which rows of `incoming` go to the groups holding their keys (with the hash of the group, from
/// `group_of`) and which, new, go to `new_rows`: a row deleting a key no group holds deletes
/// nothing.
fn held_or_new(
    op: WriteOperation,
    incoming: &Incoming,
    group_of: Vec<Option<u64>>,
    new_rows: &mut Vec<u32>,
) -> (Vec<u32>, Vec<u64>) {
    let (mut held_rows, mut hashes) = (Vec::new(), Vec::new());
    for (row, group) in group_of.into_iter().enumerate() {
        match group {
            Some(hash) => {
                held_rows.push(row as u32);
                hashes.push(hash);
            }
            None if op != WriteOperation::Delete && !incoming.is_delete(row as u32) => new_rows.push(row as u32),
            None => {}
        }
    }
    (held_rows, hashes)
}

/// The rows of a run of spilled files.
fn read_run(run: &[SpillFile]) -> Result<Vec<RecordBatch>> {
    let mut batches = Vec::new();
    for file in run {
        batches.extend(file.read()?);
    }
    Ok(batches)
}

/// An input's rows as they are spilled: the batch, with an upsert's deletion flags back in their
/// column.
fn spillable(incoming: &Incoming) -> Result<RecordBatch> {
    let Some(deleted) = &incoming.deleted else { return Ok(incoming.batch.clone()) };
    let mut fields: Vec<Arc<Field>> = incoming.batch.schema().fields().iter().cloned().collect();
    fields.push(Arc::new(Field::new(IS_DELETED, DataType::Boolean, true)));
    let mut columns: Vec<ArrayRef> = incoming.batch.columns().to_vec();
    columns.push(Arc::new(deleted.clone()));
    let schema = arrow::datatypes::Schema::new_with_metadata(fields, incoming.batch.schema().metadata().clone());
    Ok(RecordBatch::try_new(Arc::new(schema), columns)?)
}

fn field_names(schema: &arrow::datatypes::Schema) -> Vec<&str> {
    schema.fields().iter().map(|f| f.name().as_str()).collect()
}
