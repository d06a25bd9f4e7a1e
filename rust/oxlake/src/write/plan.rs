//! Planning a write: index lookup and file-group assignment.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::hash::BuildHasher;
use std::sync::Arc;

use arrow::array::{Array, StringArray};

use crate::keys::Partitions;
use futures::StreamExt;

use super::{Incoming, WriteOperation};
use crate::error::{Error, Result};
use crate::format::file_name::new_file_id;
use crate::schema::RECORD_KEY;
use crate::storage::Storage;
use crate::table::Table;
use crate::table::fs_view::{BaseFile, FileGroupId, LogFile};

/// Sizing of the files a write produces.
#[derive(Clone, Debug)]
pub struct WriteConfig {
    /// Base files are filled up to about this size (bytes).
    pub target_file_size: u64,
    /// Base files below this size take inserts until they reach the target.
    pub small_file_limit: u64,
    /// Bytes per record assumed before the table has a commit to learn from.
    pub default_record_size: u64,
    /// Rows per Parquet row group.
    pub row_group_size: usize,
    /// Files written at once.
    pub parallelism: usize,
    /// The task writing, in a write spread over tasks (Spark): part of every file name and
    /// sequence number it writes, so that two tasks, or two attempts of one, never write the same
    /// name. One process writing alone is task 0, attempt 1.
    pub task: TaskId,
    /// The number this call gives its first file (its files are numbered on from it): a task
    /// that writes in several calls (a streamed write's parts) starts each where the last one
    /// stopped, so that its file names and sequence numbers never repeat.
    pub first_file: usize,
    /// How many times a write that lost a conflict (another writer committed the same file groups
    /// or keys first) is planned and written again against the table as it is then. Only for
    /// inserts, upserts and deletes; 0: the conflict is the caller's.
    pub conflict_retries: u32,
    /// Whether the write may evolve the table's schema (see [`crate::schema::evolve`]).
    pub schema_mode: crate::schema::evolve::SchemaMode,
    /// Recorded in the commit's `extraMetadata` (a streaming sink's checkpoint, a job's name);
    /// the keys oxlake and Apache Hudi keep the schema under are refused.
    pub extra_metadata: std::collections::BTreeMap<String, String>,
    /// How a bulk insert orders its records (other operations ignore it).
    pub bulk_sort: super::BulkSort,
    /// The table state the input was read from, when the input was read from the table itself
    /// (a delete or an update by predicate: rows read, then written): a commit completed since
    /// that read is checked for conflicts as one completed during the write is, so that the
    /// write never overwrites a change it did not read. Such a write is not retried here (its
    /// input would be stale): the caller reads again.
    pub read_from: Option<crate::commit::ReadState>,
    /// Where a streamed write larger than one chunk keeps its input while it combines duplicate
    /// keys and finds their file groups ([`crate::table::Table::write_stream`]); the system's
    /// temporary directory (`TMPDIR`) when `None`.
    pub spill_dir: Option<std::path::PathBuf>,
    /// A task of a distributed write vouches that no other task of the write writes a key in
    /// the partitions it writes (the pipeline gives each task whole layers): its result then
    /// names the partitions written rather than each key ([`crate::metadata::KeyChanges::unlist`]),
    /// so that the driver does not hold every key of a large write, unless the table keeps a
    /// record index (which needs them) or a global index (a key may sit in any partition). The
    /// commit's check that no key was written by two tasks then has nothing to check, and a
    /// concurrent commit's keys are compared by reading back the files both wrote in a partition.
    pub own_partitions: bool,
    /// Whether the commit runs a compaction that is due inline, in this process (the default).
    /// A Spark driver turns it off and runs the compaction on its executors instead
    /// ([`crate::table::Table::begin_compaction`], `oxlake.spark.compact`).
    pub compact_inline: bool,
}

/// A task of a distributed write: its number and its attempt (Apache Hudi's write tokens are
/// `<file index>-<task>-<attempt>`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TaskId {
    /// The task's number (Spark's partition id).
    pub task: u32,
    /// Its attempt (Spark's attempt number), from 1.
    pub attempt: u64,
}

impl TaskId {
    /// A single-process write.
    pub const ALONE: TaskId = TaskId { task: 0, attempt: 1 };
    /// The driver of a distributed write (Spark attempts are numbered from 1 here).
    pub const DRIVER: TaskId = TaskId { task: 0, attempt: 0 };

    /// The write token of the `index`-th file this task writes.
    pub fn write_token(self, index: usize) -> String {
        format!("{index}-{}-{}", self.task, self.attempt)
    }
}

impl Default for WriteConfig {
    fn default() -> Self {
        WriteConfig {
            target_file_size: 120 * 1024 * 1024,
            small_file_limit: 100 * 1024 * 1024,
            default_record_size: 1024,
            row_group_size: 128 * 1024,
            parallelism: std::thread::available_parallelism().map_or(2, |n| n.get()),
            task: TaskId::ALONE,
            first_file: 0,
            conflict_retries: 0,
            schema_mode: crate::schema::evolve::SchemaMode::Strict,
            extra_metadata: std::collections::BTreeMap::new(),
            bulk_sort: super::BulkSort::None,
            read_from: None,
            spill_dir: None,
            own_partitions: false,
            compact_inline: true,
        }
    }
}

impl WriteConfig {
    /// The default configuration with base files filled up to `size` bytes (when given); files
    /// under five sixths of it take inserts.
    pub fn with_target_file_size(self, size: Option<u64>) -> Self {
        match size {
            Some(size) => WriteConfig { target_file_size: size.max(1), small_file_limit: size.max(1) * 5 / 6, ..self },
            None => self,
        }
    }
}

/// Where a merge-on-read write puts a file group's changes: a new log file of the slice.
#[derive(Clone, Debug)]
pub(crate) struct LogTarget {
    /// The instant the log is named with: the slice's base instant, or a pending compaction's.
    pub base_instant: String,
    /// The greatest log version of that slice so far (0: none).
    pub after_version: u32,
}

/// Keys of a file changed by a write, with the incoming row that changes each.
pub(crate) type Changes = hashbrown::HashMap<String, u32>;

/// One file to write: a new file group, a rewrite of an existing one, or a log on one.
#[derive(Debug)]
pub(crate) struct FileWork {
    pub partition: String,
    pub file_id: String,
    /// The base file rewritten by this work (copy-on-write), if the group exists.
    pub old: Option<BaseFile>,
    /// Merge-on-read: the changes go to a log file instead of a rewrite of `old`.
    pub log: Option<LogTarget>,
    /// Keys of the old file changed by this write, with the incoming row that changes them.
    pub changes: Changes,
    /// Whether `changes` are deletes (else updates).
    pub deletes: bool,
    /// Keys of the old file deleted from it because this write moves them to another partition
    /// (a table with a global index), with the incoming row that moves each: the incoming
    /// version was found to win, so these deletes are unconditional.
    pub moved_out: Changes,
    /// Keys of the old file an upsert's rows flagged `_hoodie_is_deleted` delete, with those
    /// rows: deleted as a delete's rows are (a row with a lower ordering value than the stored
    /// record's loses to it).
    pub removed: Changes,
    /// Incoming rows appended as new records.
    pub inserts: Vec<u32>,
}

/// Everything a write will do.
#[derive(Debug, Default)]
pub(crate) struct WritePlan {
    pub work: Vec<FileWork>,
    /// Replaced file groups by partition (insert overwrite).
    pub replaced: BTreeMap<String, Vec<String>>,
}

pub(crate) async fn plan(
    table: &Table,
    op: WriteOperation,
    incoming: Option<&Arc<Incoming>>,
    config: &WriteConfig,
) -> Result<WritePlan> {
    plan_within(table, op, incoming, config, None).await
}

/// [`plan`], looking the incoming keys up only in the file groups `within` (when given): the
/// caller knows no other group holds any of them (a streamed write that found each key's group
/// beforehand). New keys still go where `plan` puts them.
pub(crate) async fn plan_within(
    table: &Table,
    op: WriteOperation,
    incoming: Option<&Arc<Incoming>>,
    config: &WriteConfig,
    within: Option<&HashSet<FileGroupId>>,
) -> Result<WritePlan> {
    let timeline = table.timeline();
    let latest = timeline.latest_completed_data().map(|i| i.time.clone());
    let mor = table.config().table_type == crate::config::TableType::MergeOnRead;
    // The latest slice of every live file group, by partition; for merge-on-read, where each
    // group's next log goes and which groups may take inserts (base files without logs).
    let mut live: HashMap<String, Vec<BaseFile>> = HashMap::new();
    let mut targets: HashMap<FileGroupId, LogTarget> = HashMap::new();
    let mut small_candidates: HashMap<String, Vec<BaseFile>> = HashMap::new();
    let mut slice_logs: HashMap<FileGroupId, Vec<LogFile>> = HashMap::new();
    // A bulk insert only makes new file groups: the table's are not looked at.
    if let Some(latest) = latest.as_ref().filter(|_| op != WriteOperation::BulkInsert) {
        let view = table.file_system_view().await?;
        let replaced = table.replaced_file_groups(latest).await?;
        let compacting =
            if mor { crate::table::pending::pending_compaction_groups(table).await? } else { HashMap::new() };
        // Inserts stay out of groups a clustering is rewriting (they would fail its commit).
        let clustering = crate::table::pending::pending_clustering_groups(table).await?;
        for (g, s) in view.slices_as_of(latest, &replaced) {
            let Some(base) = &s.base else { continue };
            if within.is_none_or(|groups| groups.contains(&g.id())) {
                live.entry(g.partition.clone()).or_default().push(base.clone());
            }
            if !mor {
                if !clustering.contains(&g.id()) {
                    small_candidates.entry(g.partition.clone()).or_default().push(base.clone());
                }
                continue;
            }
            let base_instant = compacting.get(&g.id()).cloned().unwrap_or_else(|| s.base_instant.clone());
            let after_version =
                s.logs.iter().filter(|l| l.name.instant == base_instant).map(|l| l.name.version).max().unwrap_or(0);
            targets.insert(g.id(), LogTarget { base_instant, after_version });
            if !s.logs.is_empty() {
                slice_logs.insert(g.id(), s.logs.clone());
            }
        }
    }
    let mut plan = WritePlan::default();
    let rows_by_partition = incoming.map(|i| group_by_partition(&i.partitions)).unwrap_or_default();
    let per_file = records_per_file(table, incoming, config).await?;

    match op {
        WriteOperation::InsertOverwriteTable | WriteOperation::InsertOverwrite => {
            for (partition, files) in &live {
                if op == WriteOperation::InsertOverwriteTable || rows_by_partition.contains_key(partition) {
                    plan.replaced.insert(partition.clone(), files.iter().map(|f| f.name.file_id.clone()).collect());
                }
            }
            for (partition, rows) in rows_by_partition {
                assign_inserts(&mut plan, &partition, rows, &[], per_file, config);
            }
        }
        WriteOperation::BulkInsert => {
            let Some(incoming) = incoming else { return Ok(plan) };
            for (partition, mut rows) in rows_by_partition {
                // Within one input, both sorts order each partition's rows by key: files are
                // cut from that order, so each holds a narrow key range.
                if config.bulk_sort != super::BulkSort::None {
                    let keys = &incoming.keys;
                    rows.sort_by(|a, b| keys.value(*a as usize).cmp(keys.value(*b as usize)));
                }
                assign_inserts(&mut plan, &partition, rows, &[], per_file, config);
            }
        }
        // With a global index an insert looks its keys up too (an existing key is updated where
        // it is, or moved): keys stay unique. A bulk insert never looks keys up.
        WriteOperation::Insert | WriteOperation::Upsert | WriteOperation::Delete if table.config().global_index => {
            let Some(incoming) = incoming else { return Ok(plan) };
            let rows: Vec<u32> = (0..incoming.keys.len() as u32).collect();
            let scope = Scope::Global(&rows);
            let hits = index_lookup(table, scope, &live, &slice_logs, incoming, config.parallelism).await?;
            let routed = Routed { targets: &targets, small: &small_candidates, per_file };
            plan_global(table, op, incoming, hits, &routed, config, &mut plan).await?;
        }
        WriteOperation::Insert | WriteOperation::Upsert | WriteOperation::Delete => {
            let Some(incoming) = incoming else { return Ok(plan) };
            let mut looked_up = if op == WriteOperation::Insert {
                HashMap::new()
            } else {
                let scope = Scope::Partitions(&rows_by_partition);
                let hits = index_lookup(table, scope, &live, &slice_logs, incoming, config.parallelism).await?;
                hits.by_partition(&rows_by_partition)
            };
            for (partition, rows) in rows_by_partition {
                let (found, missing) = looked_up.remove(&partition).unwrap_or((Vec::new(), rows));
                let deletes = op == WriteOperation::Delete;
                for (file, changes) in found {
                    let log = targets.get(&(partition.clone(), file.name.file_id.clone())).cloned();
                    let (changes, removed): (Changes, Changes) =
                        changes.into_iter().partition(|(_, r)| deletes || !incoming.is_delete(*r));
                    plan.work.push(FileWork {
                        partition: partition.clone(),
                        file_id: file.name.file_id.clone(),
                        old: Some(file),
                        log,
                        changes,
                        deletes,
                        moved_out: Changes::new(),
                        removed,
                        inserts: vec![],
                    });
                }
                // A row deleting a key no file holds deletes nothing.
                let missing: Vec<u32> = missing.into_iter().filter(|r| !incoming.is_delete(*r)).collect();
                if !deletes {
                    let small = small_candidates.get(&partition).map(Vec::as_slice).unwrap_or(&[]);
                    assign_inserts(&mut plan, &partition, missing, small, per_file, config);
                }
            }
        }
    }
    Ok(plan)
}

/// Where a write's rows may go besides the groups holding their keys.
struct Routed<'a> {
    /// The log each merge-on-read file group's changes go to.
    targets: &'a HashMap<FileGroupId, LogTarget>,
    /// Small base files that take inserts, by partition.
    small: &'a HashMap<String, Vec<BaseFile>>,
    /// Records a new base file holds.
    per_file: u64,
}

/// The plan of an upsert or a delete on a table with a global index, from where the lookup found
/// each incoming key (in any partition). An update stays in the group holding its key when it
/// names the same partition; one naming another partition moves the record, as Apache Hudi's
/// global indexes do with `update.partition.path`: deleted from its group and inserted into the
/// new partition, in this one commit. Under event-time ordering a record moves only when the
/// incoming version wins (its ordering value at least the stored one's); else the incoming row is
/// dropped, as an older update in the same partition would lose. A delete deletes the key where
/// it is, whatever partition the input names.
async fn plan_global(
    table: &Table,
    op: WriteOperation,
    incoming: &Arc<Incoming>,
    hits: Hits,
    routed: &Routed<'_>,
    config: &WriteConfig,
    plan: &mut WritePlan,
) -> Result<()> {
    let deletes = op == WriteOperation::Delete;
    let target = |row: u32| incoming.partitions.path(row as usize);
    let flagged = |row: u32| !deletes && incoming.is_delete(row);
    let mut moving: Vec<u32> = match deletes {
        true => Vec::new(),
        false => hits
            .found
            .iter()
            .flat_map(|(p, files)| {
                files.iter().flat_map(move |(_, c)| c.values().copied().filter(move |&r| target(r) != p))
            })
            .filter(|&r| !flagged(r))
            .collect(),
    };
    moving.sort_unstable();
    moving.dedup();
    let stale = older_than_stored(table, incoming, &moving).await?;
    let mut inserts: BTreeMap<&str, Vec<u32>> = BTreeMap::new();
    // A row leaving several groups (copies of its key) is inserted once.
    let mut moved: hashbrown::HashSet<u32> = hashbrown::HashSet::new();
    let mut found: Vec<(String, Vec<(BaseFile, Changes)>)> = hits.found.into_iter().collect();
    found.sort_by(|a, b| a.0.cmp(&b.0));
    for (partition, files) in found {
        for (file, changes) in files {
            let (mut stays, mut leaves, mut removed) = (Changes::new(), Changes::new(), Changes::new());
            for (key, row) in changes {
                if flagged(row) {
                    removed.insert(key, row);
                } else if deletes || target(row) == partition {
                    stays.insert(key, row);
                } else if !stale.contains(&row) {
                    leaves.insert(key, row);
                    if moved.insert(row) {
                        inserts.entry(target(row)).or_default().push(row);
                    }
                }
            }
            if stays.is_empty() && leaves.is_empty() && removed.is_empty() {
                continue;
            }
            let log = routed.targets.get(&(partition.clone(), file.name.file_id.clone())).cloned();
            plan.work.push(FileWork {
                partition: partition.clone(),
                file_id: file.name.file_id.clone(),
                old: Some(file),
                log,
                changes: stays,
                deletes,
                moved_out: leaves,
                removed,
                inserts: vec![],
            });
        }
    }
    if deletes {
        return Ok(());
    }
    for row in (0..incoming.keys.len() as u32).filter(|&r| !hits.taken.contains(&r) && !flagged(r)) {
        inserts.entry(target(row)).or_default().push(row);
    }
    for (partition, mut rows) in inserts {
        rows.sort_unstable();
        let small = routed.small.get(partition).map(Vec::as_slice).unwrap_or(&[]);
        assign_inserts(plan, partition, rows, small, routed.per_file, config);
    }
    Ok(())
}

/// The rows of `rows` (incoming upserts of stored keys) whose ordering value is below the stored
/// record's, under event-time ordering: they lose to it. Read from the table's current records
/// of those keys (a lookup: the record index narrows it to their file groups).
async fn older_than_stored(table: &Table, incoming: &Incoming, rows: &[u32]) -> Result<hashbrown::HashSet<u32>> {
    let mut stale = hashbrown::HashSet::new();
    let (Some(ordering), Some(field)) = (&incoming.ordering, &table.config().ordering_field) else {
        return Ok(stale);
    };
    if rows.is_empty() {
        return Ok(stale);
    }
    let row_of: HashMap<&str, u32> = rows.iter().map(|&r| (incoming.keys.value(r as usize), r)).collect();
    let keys = arrow::compute::take_record_batch(&incoming.batch, &arrow::array::UInt32Array::from(rows.to_vec()))?;
    let mut stored = table.lookup(&keys, Some(vec![RECORD_KEY.to_string(), field.clone()])).await?;
    while let Some(batch) = stored.next().await {
        let batch = batch?;
        let key = arrow::compute::cast(batch.column(0), &arrow::datatypes::DataType::Utf8)?;
        let key = key.as_any().downcast_ref::<StringArray>().ok_or_else(|| Error::invalid_data("record keys"))?;
        let old = arrow::compute::cast(batch.column(1), ordering.data_type())?;
        let options = arrow::compute::SortOptions { descending: false, nulls_first: true };
        let cmp = arrow::array::make_comparator(old.as_ref(), ordering.as_ref(), options)?;
        for i in 0..batch.num_rows() {
            if let Some(&row) = key.is_valid(i).then(|| row_of.get(key.value(i))).flatten()
                && cmp(i, row as usize).is_gt()
            {
                stale.insert(row);
            }
        }
    }
    Ok(stale)
}

fn group_by_partition(partitions: &Partitions) -> BTreeMap<String, Vec<u32>> {
    let mut rows: Vec<Vec<u32>> = vec![Vec::new(); partitions.paths.len()];
    for (row, &id) in partitions.ids.iter().enumerate() {
        rows[id as usize].push(row as u32);
    }
    partitions.paths.iter().cloned().zip(rows).filter(|(_, r)| !r.is_empty()).collect()
}

/// Parquet (snappy) bytes per byte of Arrow memory, to size the first files of a table.
const PARQUET_PER_ARROW_BYTE: f64 = 0.4;

/// Records a new base file should hold: from the bytes per record of the latest commit, else
/// estimated from the input's Arrow size, else the configured default.
async fn records_per_file(table: &Table, incoming: Option<&Arc<Incoming>>, config: &WriteConfig) -> Result<u64> {
    let mut record_size = config.default_record_size;
    if let Some(i) = incoming
        && i.batch.num_rows() > 0
    {
        let arrow_bytes = i.batch.get_array_memory_size() as f64 / i.batch.num_rows() as f64;
        record_size = ((arrow_bytes * PARQUET_PER_ARROW_BYTE) as u64).max(1);
    }
    if let Some(latest) = table.timeline().latest_completed_data() {
        let meta = table.timeline().commit_metadata(table.storage(), latest).await?;
        let (bytes, records) =
            meta.write_stats().fold((0i64, 0i64), |(b, r), (_, s)| (b + s.total_write_bytes, r + s.num_writes));
        if bytes > 0 && records > 0 {
            record_size = (bytes / records).max(1) as u64;
        }
    }
    Ok((config.target_file_size / record_size).max(1))
}

/// Inserts go to small files of the partition first (merged into work already planned for them),
/// then to new file groups of `per_file` records. Always into base files, never logs: Java's
/// default indexes (bloom, simple) look up keys in base files only and would duplicate a key kept
/// in a log. On merge-on-read tables inserts go to new file groups only (no small files are
/// given; Java may also rewrite a small base file without logs): a rewrite must fold in every
/// log of its group, and under the concurrency stress test (writers, compactors) one dropped a
/// log written beside it. New groups cannot lose anything; clustering merges small groups.
fn assign_inserts(
    plan: &mut WritePlan,
    partition: &str,
    rows: Vec<u32>,
    files: &[BaseFile],
    per_file: u64,
    config: &WriteConfig,
) {
    let mut rows = rows.into_iter().peekable();
    for f in files.iter().filter(|f| f.size < config.small_file_limit) {
        if rows.peek().is_none() {
            break;
        }
        let room = config.target_file_size.saturating_sub(f.size) * per_file / config.target_file_size.max(1);
        let take: Vec<u32> = rows.by_ref().take(room as usize).collect();
        if take.is_empty() {
            continue;
        }
        match plan.work.iter_mut().find(|w| w.partition == partition && w.file_id == f.name.file_id) {
            Some(w) => {
                w.inserts.extend(take);
                w.log = None;
            }
            None => plan.work.push(FileWork {
                partition: partition.to_string(),
                file_id: f.name.file_id.clone(),
                old: Some(f.clone()),
                log: None,
                changes: Changes::new(),
                deletes: false,
                moved_out: Changes::new(),
                removed: Changes::new(),
                inserts: take,
            }),
        }
    }
    loop {
        let chunk: Vec<u32> = rows.by_ref().take(per_file as usize).collect();
        if chunk.is_empty() {
            break;
        }
        plan.work.push(FileWork {
            partition: partition.to_string(),
            file_id: new_file_id(),
            old: None,
            log: None,
            changes: Changes::new(),
            deletes: false,
            moved_out: Changes::new(),
            removed: Changes::new(),
            inserts: chunk,
        });
    }
}

/// Per partition: the changes per file, and the rows whose key no file holds.
type LookedUp = HashMap<String, (Vec<(BaseFile, Changes)>, Vec<u32>)>;

/// Which incoming rows a lookup looks for in which partitions' files.
#[derive(Clone, Copy)]
enum Scope<'a> {
    /// Each partition's rows in its own files: a key is unique within its partition (Apache
    /// Hudi's default indexes).
    Partitions(&'a BTreeMap<String, Vec<u32>>),
    /// Every row in every partition's files: a key is unique in the table (a global index).
    Global(&'a [u32]),
}

impl<'a> Scope<'a> {
    /// The rows looked for in the files of `partition`, if any.
    fn rows(self, partition: &str) -> Option<&'a [u32]> {
        match self {
            Scope::Partitions(by_partition) => by_partition.get(partition).map(Vec::as_slice),
            Scope::Global(rows) => Some(rows),
        }
    }

    /// Every row looked up.
    fn all_rows(self) -> Box<dyn Iterator<Item = u32> + 'a> {
        match self {
            Scope::Partitions(by_partition) => Box::new(by_partition.values().flatten().copied()),
            Scope::Global(rows) => Box::new(rows.iter().copied()),
        }
    }

    /// Whether `row`'s key is looked for in `partition`'s files.
    fn looks_in(self, incoming: &Incoming, row: u32, partition: &str) -> bool {
        match self {
            Scope::Partitions(_) => incoming.partitions.path(row as usize) == partition,
            Scope::Global(_) => true,
        }
    }
}

/// What a lookup found: per partition, the live files holding incoming keys, each with its
/// changes (key → incoming row); and every row found.
struct Hits {
    found: HashMap<String, Vec<(BaseFile, Changes)>>,
    taken: hashbrown::HashSet<u32>,
}

impl Hits {
    /// Per partition written: its changes per file, and its rows no file holds.
    fn by_partition(mut self, rows_by_partition: &BTreeMap<String, Vec<u32>>) -> LookedUp {
        rows_by_partition
            .iter()
            .map(|(partition, rows)| {
                let missing = rows.iter().copied().filter(|r| !self.taken.contains(r)).collect();
                (partition.clone(), (self.found.remove(partition).unwrap_or_default(), missing))
            })
            .collect()
    }
}

/// The index lookup of a write: the record index of a fresh metadata table when it keeps one
/// (no data file is read); else the key columns of the live files, skipping those whose bloom
/// filters (and those of their logs) hold none of the partition's incoming keys.
///
/// The metadata table only narrows what is read: when reading it fails (a slow writer's snapshot
/// of it compacted and removed meanwhile, a damaged file), the keys of every live file in the
/// partitions written are read instead, which gives the same answer.
async fn index_lookup(
    table: &Table,
    scope: Scope<'_>,
    live: &HashMap<String, Vec<BaseFile>>,
    slice_logs: &HashMap<FileGroupId, Vec<LogFile>>,
    incoming: &Arc<Incoming>,
    parallelism: usize,
) -> Result<Hits> {
    let answer = match table.fresh_metadata_table().await {
        Some(mdt) => match indexed(table, &mdt, scope, live, slice_logs, incoming).await {
            Ok(answer) => answer,
            Err(e) => {
                log::warn!("{}: metadata table unreadable ({e}); reading the keys of the files written", table.uri());
                Indexed::Unknown
            }
        },
        None => Indexed::Unknown,
    };
    match answer {
        Indexed::Located(located) => Ok(record_index_lookup(located, scope, live, incoming)),
        Indexed::Candidates(candidates) => lookup(table, scope, &candidates, slice_logs, incoming, parallelism).await,
        Indexed::Unknown => lookup(table, scope, live, slice_logs, incoming, parallelism).await,
    }
}

/// What the metadata table's indexes tell a write's lookup.
enum Indexed {
    /// The record index's answer: the file group of each (partition, key) it holds.
    Located(HashMap<(String, String), String>),
    /// The live files whose bloom filters may hold an incoming key (or that have none).
    Candidates(HashMap<String, Vec<BaseFile>>),
    /// Nothing: every live file of the partitions written is read.
    Unknown,
}

/// Reads what the indexes of `mdt` tell the lookup of the incoming keys.
async fn indexed(
    table: &Table,
    mdt: &crate::metadata::MetadataTable,
    scope: Scope<'_>,
    live: &HashMap<String, Vec<BaseFile>>,
    slice_logs: &HashMap<FileGroupId, Vec<LogFile>>,
    incoming: &Arc<Incoming>,
) -> Result<Indexed> {
    use crate::metadata::Index;
    if mdt.has(Index::RecordIndex) {
        let keys: std::collections::BTreeSet<String> =
            scope.all_rows().map(|r| incoming.keys.value(r as usize).to_string()).collect();
        let located = mdt.plan_locate(&keys).await?;
        if record_index_pays(&located, scope, live) {
            return Ok(Indexed::Located(located.read().await?));
        }
        log::info!(
            "{}: {} keys: reading the keys of the files written beats the record index",
            table.uri(),
            keys.len()
        );
        return Ok(Indexed::Unknown);
    }
    if !mdt.has(Index::BloomFilters) {
        return Ok(Indexed::Unknown);
    }
    let mut paths: Vec<&str> = Vec::new();
    for (partition, files) in live.iter().filter(|(p, _)| scope.rows(p).is_some()) {
        for f in files {
            paths.push(&f.path);
            let logs = slice_logs.get(&(partition.clone(), f.name.file_id.clone()));
            paths.extend(logs.into_iter().flatten().map(|l| l.path.as_str()));
        }
    }
    let blooms: HashMap<String, parquet::bloom_filter::Sbbf> = mdt
        .bloom_filters(&paths)
        .await?
        .into_iter()
        .map(|(p, bits)| (p, parquet::bloom_filter::Sbbf::new(&bits)))
        .collect();
    // A slice is read when some file of it lacks a bloom filter or may hold one of the keys.
    let mut candidates: HashMap<String, Vec<BaseFile>> = HashMap::new();
    for (partition, files) in live {
        let Some(rows) = scope.rows(partition) else { continue };
        for f in files {
            let logs = slice_logs.get(&(partition.clone(), f.name.file_id.clone()));
            let slice_paths =
                std::iter::once(f.path.as_str()).chain(logs.into_iter().flatten().map(|l| l.path.as_str()));
            let may_hold = slice_paths.into_iter().any(|p| match blooms.get(p) {
                Some(bloom) => rows.iter().any(|&r| bloom.check(incoming.keys.value(r as usize))),
                None => true,
            });
            if may_hold {
                candidates.entry(partition.clone()).or_default().push(f.clone());
            }
        }
    }
    Ok(Indexed::Candidates(candidates))
}

/// An index entry costs about this many times a record key of a data file to find (a longer key,
/// its file and partition, fewer files to spread over the cores): measured by routing the same
/// random upserts both ways, 10,000 to 100,000 keys of 10,000,000 (benches/README.md).
const INDEX_ENTRY_COST: f64 = 2.5;
/// A lookup decoding at most this many index entries takes the record index whatever key reads
/// would cost (one log block's worth: too little to be worth a second thought).
const INDEX_ALWAYS_ROWS: usize = 65_536;

/// Whether the record index finds the keys of a write for less than reading the record keys of
/// the live files in the partitions written. A lookup of many keys spread over the index reads
/// most of it (each 256-entry page holding a key is decoded), while key reads decode the files
/// of the partitions written, a share of the table's records estimated from their sizes.
fn record_index_pays(
    located: &crate::metadata::record_index::Located<'_>,
    scope: Scope<'_>,
    live: &HashMap<String, Vec<BaseFile>>,
) -> bool {
    let (rows, entries) = located.rows();
    if rows <= INDEX_ALWAYS_ROWS {
        return true;
    }
    let bytes = |written_only: bool| -> u64 {
        let files = live.iter().filter(|(p, _)| !written_only || scope.rows(p).is_some());
        files.flat_map(|(_, files)| files).map(|f| f.size).sum()
    };
    let key_rows = entries as f64 * bytes(true) as f64 / bytes(false).max(1) as f64;
    rows as f64 * INDEX_ENTRY_COST <= key_rows
}

/// The lookup of a write through the record index: which file group holds each incoming key
/// (in its partition, or any with a global scope), without reading a data file, from the index's
/// answer `located`. A group the index names that is not live (replaced meanwhile) holds nothing.
/// A key the index places in several partitions (a global table written before it was global,
/// or by a writer without a global index) is taken by its own partition's group, else by the
/// first partition in order. The index places a key in one group per partition: of copies of a
/// key a write without a lookup put in two groups of one partition, the one it names (where key
/// reads take every copy, `lookup`).
fn record_index_lookup(
    located: HashMap<(String, String), String>,
    scope: Scope<'_>,
    live: &HashMap<String, Vec<BaseFile>>,
    incoming: &Arc<Incoming>,
) -> Hits {
    let mut rows_of_key: HashMap<&str, Vec<u32>> = HashMap::new();
    for r in scope.all_rows() {
        rows_of_key.entry(incoming.keys.value(r as usize)).or_default().push(r);
    }
    let mut entries: Vec<((String, String), String)> = located.into_iter().collect();
    entries.sort();
    // The live groups by (partition, file id): one probe per index entry.
    let groups: HashMap<(&str, &str), &BaseFile> = live
        .iter()
        .flat_map(|(p, files)| files.iter().map(move |f| ((p.as_str(), f.name.file_id.as_str()), f)))
        .collect();
    let mut hits: Vec<(u32, bool, String, String, String)> = Vec::new();
    for ((key, partition), file_id) in entries {
        let Some(rows) = rows_of_key.get(key.as_str()) else { continue };
        let is_live = groups.contains_key(&(partition.as_str(), file_id.as_str()));
        for &r in rows.iter().filter(|&&r| is_live && scope.looks_in(incoming, r, &partition)) {
            let own = incoming.partitions.path(r as usize) == partition;
            hits.push((r, !own, partition.clone(), file_id.clone(), key.clone()));
        }
    }
    // Its own partition first, then partitions in order.
    hits.sort();
    let mut taken = hashbrown::HashSet::new();
    let mut by_file: HashMap<(String, String), Changes> = HashMap::new();
    for (r, _, partition, file_id, key) in hits {
        if taken.insert(r) {
            by_file.entry((partition, file_id)).or_default().insert(key, r);
        }
    }
    let mut found: HashMap<String, Vec<(BaseFile, Changes)>> = HashMap::new();
    for ((partition, file_id), changes) in by_file {
        let file = groups.get(&(partition.as_str(), file_id.as_str())).map(|f| (*f).clone());
        if let Some(file) = file {
            found.entry(partition).or_default().push((file, changes));
        }
    }
    Hits { found, taken }
}

/// A stored key matching an incoming row, and whether it is live in its file group.
type Hit = (String, u32, bool);

/// The incoming keys of one partition, probed by stored keys. It indexes rows of the input (held
/// by the `Arc`), so lookup tasks on other threads share it without copying a key.
struct KeyIndex {
    incoming: Arc<Incoming>,
    rows: hashbrown::HashTable<u32>,
    hasher: hashbrown::DefaultHashBuilder,
}

impl KeyIndex {
    /// `rows` hold distinct keys (the input is combined by key before planning).
    fn new(incoming: Arc<Incoming>, rows: &[u32]) -> Self {
        let hasher = hashbrown::DefaultHashBuilder::default();
        let mut table = hashbrown::HashTable::with_capacity(rows.len());
        for &r in rows {
            let h = hasher.hash_one(incoming.keys.value(r as usize));
            table.insert_unique(h, r, |&r| hasher.hash_one(incoming.keys.value(r as usize)));
        }
        KeyIndex { incoming, rows: table, hasher }
    }

    fn get(&self, key: &str) -> Option<u32> {
        let h = self.hasher.hash_one(key);
        self.rows.find(h, |&r| self.incoming.keys.value(r as usize) == key).copied()
    }
}

/// Finds which incoming keys each live file group already holds, reading only the record key
/// column of its base file (and the keys of its slice's log data blocks), every file of every
/// partition at once, `parallelism` files at a time on the runtime's threads. Returns, per
/// partition, the changes per file and the rows whose key is in none of them.
async fn lookup(
    table: &Table,
    scope: Scope<'_>,
    live: &HashMap<String, Vec<BaseFile>>,
    slice_logs: &HashMap<FileGroupId, Vec<LogFile>>,
    incoming: &Arc<Incoming>,
    parallelism: usize,
) -> Result<Hits> {
    let storage = table.storage();
    let stored_keys = Arc::new(table.stored_keys()?);
    // What completed instants wrote into the logs: a damaged block of theirs is an error, never a
    // key left out of routing (the write would then put the key in a second file group).
    let committed = match slice_logs.values().any(|l| !l.is_empty()) {
        true => Some(Arc::new(crate::log::CommittedLogs::load(storage, table.timeline()).await?)),
        false => None,
    };
    let permits = Arc::new(tokio::sync::Semaphore::new(parallelism.max(1)));
    let mut tasks = tokio::task::JoinSet::new();
    // One index of every row for a global scope; one per partition's rows otherwise.
    let shared = match scope {
        Scope::Global(rows) => Some(Arc::new(KeyIndex::new(incoming.clone(), rows))),
        Scope::Partitions(_) => None,
    };
    let mut partitions: Vec<&String> = live.keys().filter(|p| scope.rows(p).is_some()).collect();
    partitions.sort();
    for (p, partition) in partitions.iter().enumerate() {
        let (Some(files), Some(rows)) = (live.get(*partition), scope.rows(partition)) else { continue };
        let index = match &shared {
            Some(index) => index.clone(),
            None => Arc::new(KeyIndex::new(incoming.clone(), rows)),
        };
        for (f, file) in files.iter().enumerate() {
            let logs = slice_logs.get(&((*partition).clone(), file.name.file_id.clone())).cloned().unwrap_or_default();
            let (storage, file, index, permits) = (storage.clone(), file.clone(), index.clone(), permits.clone());
            let (committed, stored_keys) = (committed.clone(), stored_keys.clone());
            tasks.spawn(async move {
                let _permit = permits.acquire_owned().await.map_err(Error::invalid_data)?;
                let held = matching_keys(&storage, &file, &index, &stored_keys).await?;
                let mut hits: Vec<Hit> = held.into_iter().map(|(k, r)| (k, r, true)).collect();
                // Merge-on-read: records inserted into the slice's logs belong to the group too, and
                // a key whose last log block deleted it is held but not live.
                if !logs.is_empty() {
                    let mut in_logs =
                        crate::log::record_keys(&storage, &logs, committed.as_deref(), &stored_keys).await?;
                    for hit in &mut hits {
                        if let Some(live) = in_logs.remove(&hit.0) {
                            hit.2 = live;
                        }
                    }
                    hits.extend(in_logs.into_iter().filter_map(|(k, live)| index.get(&k).map(|r| (k, r, live))));
                }
                Ok::<_, Error>(((p, f), file, hits))
            });
        }
    }
    let mut results = Vec::new();
    while let Some(joined) = tasks.join_next().await {
        results.push(joined.map_err(|e| Error::invalid_data(format!("lookup task failed: {e}")))??);
    }
    // A key is live in one file group of its partition, unless a write without a lookup (an insert
    // into a merge-on-read table, a bulk insert) put a copy beside it. It may also be held, deleted,
    // by another (an insert after a merge-on-read delete lands in a new group), and with a global
    // scope be live in two partitions (written before the table was global, or by a bulk insert).
    // Each row goes to every group holding it live in its own partition, else to every group
    // holding it live in the first partition listed (the partition `record_index_lookup` picks),
    // else to the first file holding it deleted. Every copy, as Apache Hudi's simple and bloom
    // indexes tag every location of a key: a delete leaves none, an upsert none stale, whatever
    // the order of the files.
    results.sort_by_key(|r| r.0);
    let choice = |p: usize, i: usize, r: u32, live: bool| -> (u8, usize) {
        let own = incoming.partitions.path(r as usize) == partitions[p].as_str();
        match (live, own) {
            (true, true) => (0, p),
            (true, false) => (1, p),
            (false, _) => (2, i),
        }
    };
    let mut best: hashbrown::HashMap<u32, (u8, usize)> = hashbrown::HashMap::new();
    for (i, ((p, _), _, hits)) in results.iter().enumerate() {
        for &(_, r, live) in hits {
            let this = choice(*p, i, r, live);
            let entry = best.entry(r).or_insert(this);
            *entry = (*entry).min(this);
        }
    }
    let mut found: HashMap<String, Vec<(BaseFile, Changes)>> = HashMap::new();
    for (i, ((p, _), file, hits)) in results.into_iter().enumerate() {
        let changes: Changes = hits
            .into_iter()
            .filter(|&(_, r, live)| best.get(&r) == Some(&choice(p, i, r, live)))
            .map(|(k, r, _)| (k, r))
            .collect();
        if !changes.is_empty() {
            found.entry(partitions[p].clone()).or_default().push((file, changes));
        }
    }
    Ok(Hits { found, taken: best.keys().copied().collect() })
}

/// The keys of a base file that are in `index`, with their incoming rows, reading only the
/// columns keys are made from.
async fn matching_keys(
    storage: &Storage,
    file: &BaseFile,
    index: &KeyIndex,
    stored: &crate::keys::StoredKeys,
) -> Result<Vec<(String, u32)>> {
    // The Parquet reader does not know which file it decodes: its errors are named here.
    let keys = crate::storage::decoding(&file.path, matching_keys_of(storage, file, index, stored)).await;
    keys.map_err(|e| e.in_file(&file.path))
}

async fn matching_keys_of(
    storage: &Storage,
    file: &BaseFile,
    index: &KeyIndex,
    stored: &crate::keys::StoredKeys,
) -> Result<Vec<(String, u32)>> {
    let mut stream = stored.base_file_batches(storage, &file.path, file.size).await?;
    let mut hits = Vec::new();
    while let Some(batch) = stream.next().await {
        let keys = stored.keys_in(&batch?, &file.path)?;
        hits.extend(keys.iter().flatten().filter_map(|k| index.get(k).map(|r| (k.to_string(), r))));
    }
    Ok(hits)
}

#[cfg(test)]
mod tests {
    //! The planner's routing: which file group each incoming row goes to, as a base-file
    //! rewrite, a log, or a new group, on both table types and beside pending services.

    use bytes::Bytes;

    use super::*;
    use crate::config::TableType;
    use crate::format::compaction_plan::{CompactionOperation, CompactionPlan};
    use crate::format::file_name::BaseFileName;
    use crate::format::instant::{Action, Instant, State};
    use crate::schema::evolve::SchemaMode;
    use crate::table::TableOptions;
    use crate::test_support::{id_city_rows, id_city_table};

    async fn table(dir: &std::path::Path, table_type: TableType) -> Table {
        id_city_table(dir, table_type, TableOptions::default()).await
    }

    /// The plan of `op` with `input` on the table as it is.
    async fn planned(t: &Table, op: WriteOperation, input: &[(i64, &str)]) -> WritePlan {
        let incoming = super::super::prepare(t, op, vec![id_city_rows(input)], SchemaMode::Strict).unwrap().unwrap();
        plan(t, op, Some(&Arc::new(incoming)), &WriteConfig::default()).await.unwrap()
    }

    /// Where one work goes: (partition, existing group or "new", updated or deleted keys,
    /// inserted rows, the log's base instant if a log).
    type Route = (String, String, Vec<String>, usize, Option<String>);

    /// The route of each work, sorted.
    fn routes(plan: &WritePlan) -> Vec<Route> {
        let mut out: Vec<_> = plan
            .work
            .iter()
            .map(|w| {
                let mut keys: Vec<String> = w.changes.keys().cloned().collect();
                keys.sort();
                let group = if w.old.is_some() { w.file_id.clone() } else { "new".into() };
                (w.partition.clone(), group, keys, w.inserts.len(), w.log.as_ref().map(|l| l.base_instant.clone()))
            })
            .collect();
        out.sort();
        out
    }

    async fn write(t: &mut Table, op: WriteOperation, input: &[(i64, &str)]) -> String {
        t.write(op, vec![id_city_rows(input)], &WriteConfig::default()).await.unwrap().instant.unwrap()
    }

    fn group_of(t_files: &[String], partition: &str) -> String {
        let path = t_files.iter().find(|f| f.starts_with(&format!("{partition}/"))).unwrap();
        BaseFileName::parse(path.rsplit('/').next().unwrap()).unwrap().file_id
    }

    #[tokio::test]
    async fn a_bulk_insert_makes_new_groups_only_and_keeps_duplicate_keys() {
        let dir = tempfile::tempdir().unwrap();
        let mut t = table(dir.path(), TableType::CopyOnWrite).await;
        write(&mut t, WriteOperation::Insert, &[(1, "a"), (2, "b")]).await;
        // Key 1 is in the table and twice in the input: nothing is looked up or combined, and
        // the small files of both partitions take nothing.
        let p = planned(&t, WriteOperation::BulkInsert, &[(1, "a"), (1, "a"), (3, "b")]).await;
        let new = |partition: &str, rows| (partition.to_string(), "new".to_string(), vec![], rows, None);
        assert_eq!(routes(&p), [new("city=a", 2), new("city=b", 1)]);
    }

    #[tokio::test]
    async fn a_key_live_in_two_groups_of_its_partition_is_routed_to_both() {
        // Two bulk inserts (no lookup) leave key 1 in two groups of city=a, in either file order.
        for table_type in [TableType::CopyOnWrite, TableType::MergeOnRead] {
            let dir = tempfile::tempdir().unwrap();
            let mut t = table(dir.path(), table_type).await;
            write(&mut t, WriteOperation::BulkInsert, &[(1, "a"), (2, "a")]).await;
            write(&mut t, WriteOperation::BulkInsert, &[(1, "a")]).await;
            for op in [WriteOperation::Upsert, WriteOperation::Delete] {
                let r = routes(&planned(&t, op, &[(1, "a")]).await);
                assert_eq!(r.len(), 2, "{op:?}: {r:?}");
                assert!(r.iter().all(|route| route.1 != "new" && route.2 == ["1"]), "{op:?}: {r:?}");
                assert_ne!(r[0].1, r[1].1, "two groups");
            }
        }
    }

    #[tokio::test]
    async fn a_plan_within_named_groups_finds_their_keys_and_takes_keys_of_no_named_group_for_new() {
        // What a streamed write relies on: its one pass over the table's keys names each key's
        // group, or (two keys of one hash) a group that lacks the key.
        for table_type in [TableType::CopyOnWrite, TableType::MergeOnRead] {
            let dir = tempfile::tempdir().unwrap();
            let mut t = table(dir.path(), table_type).await;
            // Group 0 holds keys 1 and 2, group 1 key 3.
            let mut groups = Vec::new();
            for rows in [&[(1, "a"), (2, "a")][..], &[(3, "a")]] {
                let config = WriteConfig::default();
                let written = t.write(WriteOperation::BulkInsert, vec![id_city_rows(rows)], &config).await.unwrap();
                groups.push(group_of(&written.files, "city=a"));
            }
            let input = vec![id_city_rows(&[(1, "a"), (3, "a")])];
            let incoming =
                super::super::prepare(&t, WriteOperation::Upsert, input, SchemaMode::Strict).unwrap().unwrap();
            let incoming = Arc::new(incoming);
            let all = plan(&t, WriteOperation::Upsert, Some(&incoming), &WriteConfig::default()).await.unwrap();
            for named in [vec![groups[0].clone()], vec![groups[1].clone()], groups.clone()] {
                let within: HashSet<FileGroupId> = named.iter().map(|g| ("city=a".to_string(), g.clone())).collect();
                let config = WriteConfig { small_file_limit: 0, ..WriteConfig::default() };
                let p = plan_within(&t, WriteOperation::Upsert, Some(&incoming), &config, Some(&within)).await.unwrap();
                // Each key is updated in its group when that group is named, else inserted anew;
                // none is lost or written twice.
                let mut updated: Vec<String> = Vec::new();
                let mut inserted = 0;
                for w in &p.work {
                    match &w.old {
                        Some(_) => {
                            assert!(named.contains(&w.file_id), "{table_type:?}: only named groups are read");
                            updated.extend(w.changes.keys().cloned());
                        }
                        None => inserted += w.inserts.len(),
                    }
                }
                updated.sort();
                let expected: Vec<String> = [("1", 0), ("3", 1)]
                    .iter()
                    .filter(|(_, g)| named.contains(&groups[*g]))
                    .map(|(k, _)| k.to_string())
                    .collect();
                assert_eq!(updated, expected, "{table_type:?} {named:?}: {:?}", routes(&p));
                assert_eq!(inserted, 2 - expected.len(), "{table_type:?} {named:?}: the key of no named group is new");
                if named.len() == 2 {
                    assert_eq!(routes(&p), routes(&all));
                }
            }
        }
    }

    #[tokio::test]
    async fn copy_on_write_rewrites_the_group_holding_a_key_and_fills_small_files_with_new_keys() {
        let dir = tempfile::tempdir().unwrap();
        let mut t = table(dir.path(), TableType::CopyOnWrite).await;
        let config = WriteConfig::default();
        let files =
            t.write(WriteOperation::Insert, vec![id_city_rows(&[(1, "a"), (2, "b")])], &config).await.unwrap().files;
        let (a, b) = (group_of(&files, "city=a"), group_of(&files, "city=b"));
        let p = planned(&t, WriteOperation::Upsert, &[(1, "a"), (3, "a"), (4, "c")]).await;
        // Key 1 updates group a, which takes the new key 3 too (a small file); key 4 starts a
        // group in a partition of its own. Group b is untouched.
        assert_eq!(
            routes(&p),
            vec![
                ("city=a".into(), a.clone(), vec!["1".into()], 1, None),
                ("city=c".into(), "new".into(), vec![], 1, None),
            ]
        );
        assert!(!routes(&p).iter().any(|r| r.1 == b));
        let d = planned(&t, WriteOperation::Delete, &[(2, "b"), (9, "b")]).await;
        assert_eq!(routes(&d), vec![("city=b".into(), b, vec!["2".into()], 0, None)], "absent keys plan nothing");
        assert!(d.work.iter().all(|w| w.deletes));
    }

    #[tokio::test]
    async fn merge_on_read_logs_changes_on_their_slice_and_puts_new_keys_in_new_groups() {
        let dir = tempfile::tempdir().unwrap();
        let mut t = table(dir.path(), TableType::MergeOnRead).await;
        let first = write(&mut t, WriteOperation::Insert, &[(1, "a"), (2, "a")]).await;
        let p = planned(&t, WriteOperation::Upsert, &[(1, "a"), (3, "a")]).await;
        let r = routes(&p);
        assert_eq!(r.len(), 2, "{r:?}");
        let (update, insert) = (&r[0], &r[1]);
        assert_eq!((update.2.clone(), update.3, update.4.clone()), (vec!["1".to_string()], 0, Some(first.clone())));
        // A new key never goes to a log (Java's default index reads base files only), nor into
        // the existing group (a rewrite would have to fold in its logs).
        assert_eq!((insert.1.as_str(), insert.3, insert.4.clone()), ("new", 1, None));
        // The next log of the slice comes after the one written now.
        write(&mut t, WriteOperation::Upsert, &[(2, "a")]).await;
        let p = planned(&t, WriteOperation::Upsert, &[(2, "a")]).await;
        assert_eq!(p.work[0].log.as_ref().map(|l| l.after_version), Some(1));
    }

    #[tokio::test]
    async fn a_log_for_a_group_being_compacted_is_named_with_the_compaction() {
        let dir = tempfile::tempdir().unwrap();
        let mut t = table(dir.path(), TableType::MergeOnRead).await;
        let first = write(&mut t, WriteOperation::Insert, &[(1, "a")]).await;
        write(&mut t, WriteOperation::Upsert, &[(1, "a")]).await;
        let view = t.file_system_view().await.unwrap();
        let g = view.groups().next().unwrap();
        let s = g.slices.values().next_back().unwrap();
        // A compaction of that slice planned (requested) after the last commit.
        let time = crate::format::instant::now();
        let op = CompactionOperation {
            partition_path: g.partition.clone(),
            file_id: g.file_id.clone(),
            base_instant_time: first.clone(),
            data_file_path: s.base.as_ref().map(|b| b.path.clone()),
            delta_file_paths: s.logs.iter().map(|l| l.path.clone()).collect(),
        };
        let requested = Instant::new(time.clone(), Action::Compaction, State::Requested);
        let bytes = Bytes::from(CompactionPlan { operations: vec![op], version: 2 }.to_avro().unwrap());
        assert!(t.timeline().create(t.storage(), &requested, bytes).await.unwrap());
        t.reload().await.unwrap();
        let p = planned(&t, WriteOperation::Upsert, &[(1, "a")]).await;
        let log = p.work[0].log.clone().unwrap();
        assert_eq!((log.base_instant, log.after_version), (time, 0), "the new slice the compaction starts");
    }

    #[tokio::test]
    async fn inserts_stay_out_of_groups_a_clustering_is_rewriting() {
        let dir = tempfile::tempdir().unwrap();
        let mut t = table(dir.path(), TableType::CopyOnWrite).await;
        let config = WriteConfig::default();
        let files = t.write(WriteOperation::Insert, vec![id_city_rows(&[(1, "a")])], &config).await.unwrap().files;
        let a = group_of(&files, "city=a");
        let p = planned(&t, WriteOperation::Insert, &[(2, "a")]).await;
        assert_eq!(routes(&p), vec![("city=a".into(), a.clone(), vec![], 1, None)], "a small file takes it");
        // A clustering of that group requested (JSON, as earlier oxlake versions wrote it).
        let plan = crate::format::clustering_plan::ClusteringPlan {
            operation_type: "CLUSTER".into(),
            sort_columns: vec![],
            input_groups: vec![crate::format::clustering_plan::ClusteringGroup {
                partition_path: "city=a".into(),
                slices: vec![crate::format::clustering_plan::ClusteringSlice {
                    file_id: a.clone(),
                    base_instant_time: String::new(),
                    data_file: None,
                    delta_file_paths: vec![],
                }],
            }],
            version: 1,
        };
        let requested = Instant::new(crate::format::instant::now(), Action::ReplaceCommit, State::Requested);
        let bytes = Bytes::from(serde_json::to_vec(&plan).unwrap());
        assert!(t.timeline().create(t.storage(), &requested, bytes).await.unwrap());
        t.reload().await.unwrap();
        let p = planned(&t, WriteOperation::Insert, &[(2, "a")]).await;
        assert_eq!(routes(&p), vec![("city=a".into(), "new".into(), vec![], 1, None)]);
    }
}
