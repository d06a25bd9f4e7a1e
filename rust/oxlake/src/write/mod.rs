//! Writes: insert, upsert, delete, bulk insert and insert-overwrite.
//!
//! A write runs in three phases. **Prepare** checks the input against the table schema, computes
//! record keys and partition paths, and combines duplicate keys by the ordering field (not for a
//! bulk insert). **Plan**
//! looks the keys up in the latest file slices (reading only their `_hoodie_record_key` column) and
//! assigns every record to a file group: updates and deletes to the group holding the key, inserts to
//! small groups first and new groups beyond. **Execute** rewrites or creates one base file per group,
//! in parallel, inside a [`Transaction`], and commits them as one instant.

mod alter;
mod base_file;
mod held;
pub mod inline;
mod log_file;
mod overlaps;
mod plan;
mod stream;

use std::collections::BTreeMap;
use std::sync::Arc;

use arrow::array::make_comparator;
use arrow::array::{Array, ArrayRef, RecordBatch, StringArray, UInt32Array};
use arrow::compute::{SortOptions, concat_batches, take_record_batch};

use crate::commit::{ReadState, Transaction};
use crate::error::{Error, Result};
use crate::format::commit::CommitMetadata;
use crate::format::instant::Action;
use crate::keys::{KeySpec, Partitions};
use crate::schema;
use crate::schema::evolve::SchemaMode;
use crate::table::Table;

pub use plan::{TaskId, WriteConfig};

/// What a write does with its records.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WriteOperation {
    /// Adds records; a key already in the table gets a second row only if it is new to its file
    /// group, so use `Upsert` for data that may repeat keys.
    Insert,
    /// Updates records whose key exists, inserts the others.
    Upsert,
    /// Deletes the records with the given keys (rows hold at least the key and partition columns).
    Delete,
    /// Replaces every partition present in the input with the input.
    InsertOverwrite,
    /// Replaces the whole table with the input.
    InsertOverwriteTable,
    /// Loads records as Apache Hudi's `bulk_insert` does: no key is looked up, duplicate keys in
    /// the input are not combined (give it unique keys), and every record goes to a new file
    /// group (no small file is topped up), optionally sorted by key ([`BulkSort`], in
    /// [`WriteConfig::bulk_sort`]) so that its files are ready for key lookups.
    BulkInsert,
}

/// Input bytes (Arrow memory) a streamed bulk insert takes at a time by default
/// ([`Table::bulk_insert_stream`]); its peak memory is a few times this.
pub const STREAM_CHUNK_BYTES: usize = 512 << 20;

/// How a bulk insert orders its records (Apache Hudi's `hoodie.bulkinsert.sort.mode`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum BulkSort {
    /// As they come (the fastest; Hudi's default).
    #[default]
    None,
    /// By partition path, then record key, across the whole input: each file holds a narrow key
    /// range (a Spark write sorts the whole frame first).
    GlobalSort,
    /// By record key within each partition of each task's input (a Spark write sorts each
    /// task's rows only, with no shuffle).
    PartitionSort,
}

impl BulkSort {
    /// Parses `none`, `global_sort` or `partition_sort` (any case, as Hudi's enum names).
    pub fn parse(s: &str) -> Result<Self> {
        match s.to_ascii_lowercase().as_str() {
            "none" => Ok(BulkSort::None),
            "global_sort" => Ok(BulkSort::GlobalSort),
            "partition_sort" => Ok(BulkSort::PartitionSort),
            _ => Err(Error::invalid_arg(
                "sort_mode",
                format!("`{s}` is not a bulk insert sort mode: none, global_sort or partition_sort"),
            )),
        }
    }
}

impl WriteOperation {
    /// Parses the Python-facing name.
    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "insert" => WriteOperation::Insert,
            "upsert" => WriteOperation::Upsert,
            "delete" => WriteOperation::Delete,
            "insert_overwrite" => WriteOperation::InsertOverwrite,
            "insert_overwrite_table" => WriteOperation::InsertOverwriteTable,
            "bulk_insert" => WriteOperation::BulkInsert,
            _ => return None,
        })
    }

    /// Apache Hudi's `operationType`.
    fn hudi_name(self) -> &'static str {
        match self {
            WriteOperation::Insert => "INSERT",
            WriteOperation::Upsert => "UPSERT",
            WriteOperation::Delete => "DELETE",
            WriteOperation::InsertOverwrite => "INSERT_OVERWRITE",
            WriteOperation::InsertOverwriteTable => "INSERT_OVERWRITE_TABLE",
            WriteOperation::BulkInsert => "BULK_INSERT",
        }
    }

    fn action(self, table_type: crate::config::TableType) -> Action {
        match (self, table_type) {
            (WriteOperation::InsertOverwrite | WriteOperation::InsertOverwriteTable, _) => Action::ReplaceCommit,
            (_, crate::config::TableType::MergeOnRead) => Action::DeltaCommit,
            _ => Action::Commit,
        }
    }
}

/// What a write did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct WriteResult {
    /// The committed instant, `None` when there was nothing to write.
    pub instant: Option<String>,
    /// When it completed, as readers order commits: its completion time on timeline layout 2
    /// (table versions 8 and 9), the instant itself on version 6. Incremental queries compare
    /// against these, so this is the checkpoint to read changes after.
    pub completion: Option<String>,
    /// Records inserted.
    pub num_inserts: u64,
    /// Records updated.
    pub num_updates: u64,
    /// Records deleted.
    pub num_deletes: u64,
    /// Files written, relative to the table root.
    pub files: Vec<String>,
}

/// The files one task of a write wrote: `(partition, stat)` per file, and the file groups it
/// replaces (insert overwrite), by partition.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct WrittenFiles {
    /// File ids replaced, by partition (insert overwrite).
    pub replaced: std::collections::BTreeMap<String, Vec<String>>,
    /// `(partition, stat)` of each file written.
    pub stats: Vec<(String, crate::format::commit::WriteStat)>,
    /// The record keys the files took and the ones they deleted (for the record index).
    #[serde(default)]
    pub keys: crate::metadata::KeyChanges,
    /// What the metadata table's file-level indexes hold of the files, by path, where the writer
    /// computed it (log files; the sync reads the others back).
    #[serde(default)]
    pub entries: Vec<(String, crate::metadata::file_index::FileEntry)>,
    /// The data schema the files were written in, where a `schema_mode="merge"` write evolved
    /// it (Arrow IPC, base64; the driver records it with the commit).
    #[serde(default)]
    pub schema: Option<String>,
}

impl WrittenFiles {
    /// As a task sends them to the driver.
    pub fn to_json(&self) -> Result<Vec<u8>> {
        serde_json::to_vec(self).map_err(Error::invalid_data)
    }

    /// As the driver receives them from a task.
    pub fn from_json(bytes: &[u8]) -> Result<Self> {
        serde_json::from_slice(bytes).map_err(|e| Error::invalid_arg("written files", e))
    }
}

/// The input of a write, checked and keyed; one row per (partition, key).
pub(crate) struct Incoming {
    /// Data columns in table order (for deletes: the columns given).
    pub batch: RecordBatch,
    pub keys: StringArray,
    pub partitions: Partitions,
    /// The ordering column, when the table orders by event time and the input has it.
    pub ordering: Option<ArrayRef>,
    /// Rows of an upsert that delete their key (the input's `_hoodie_is_deleted` column, as
    /// Apache Hudi's payloads read it), `None` when the input has no such column.
    pub deleted: Option<arrow::array::BooleanArray>,
}

/// The column of an upsert's input marking rows that delete their key (Apache Hudi's
/// `HoodieRecord.HOODIE_IS_DELETED_FIELD`): a delete and upserts as one commit.
pub const IS_DELETED: &str = "_hoodie_is_deleted";

impl Incoming {
    /// Whether `row` deletes its key.
    pub(crate) fn is_delete(&self, row: u32) -> bool {
        self.deleted.as_ref().is_some_and(|d| d.is_valid(row as usize) && d.value(row as usize))
    }

    /// Whether every row deletes its key (an upsert that may change nothing).
    fn only_deletes(&self) -> bool {
        self.deleted.as_ref().is_some_and(|d| d.true_count() == d.len())
    }

    /// The rows at `indices`, in their order.
    fn take(&self, indices: &UInt32Array) -> Result<Incoming> {
        let ids = indices.values().iter().map(|&r| self.partitions.ids[r as usize]).collect();
        let take = |a: &dyn Array| arrow::compute::take(a, indices, None);
        let deleted = match &self.deleted {
            Some(d) => Some(
                take(d)?
                    .as_any()
                    .downcast_ref::<arrow::array::BooleanArray>()
                    .cloned()
                    .ok_or_else(|| Error::invalid_data("deletion flags"))?,
            ),
            None => None,
        };
        Ok(Incoming {
            batch: take_record_batch(&self.batch, indices)?,
            keys: downcast_str(take(&self.keys)?)?,
            partitions: Partitions { paths: self.partitions.paths.clone(), ids },
            ordering: self.ordering.as_ref().map(|o| take(o.as_ref())).transpose()?,
            deleted,
        })
    }
}

/// Takes the `_hoodie_is_deleted` column out of an upsert's input: the batches without it, and
/// the flags (null as false), or `None` when no batch has it. It must be boolean; every batch has
/// it or none.
fn take_deleted(batches: Vec<RecordBatch>) -> Result<(Vec<RecordBatch>, Option<arrow::array::BooleanArray>)> {
    let has = batches.iter().map(|b| b.schema().index_of(IS_DELETED).ok()).collect::<Vec<_>>();
    if has.iter().all(Option::is_none) {
        return Ok((batches, None));
    }
    let mut flags = arrow::array::BooleanBuilder::new();
    let mut out = Vec::with_capacity(batches.len());
    for (batch, at) in batches.into_iter().zip(has) {
        let Some(at) = at else {
            return Err(Error::invalid_data(format!("`{IS_DELETED}` is in some batches of the input, not all")));
        };
        let column = batch.column(at);
        let values =
            column.as_any().downcast_ref::<arrow::array::BooleanArray>().ok_or_else(|| Error::SchemaMismatch {
                detail: format!("column `{IS_DELETED}` must be boolean, not {}", column.data_type()),
            })?;
        for i in 0..values.len() {
            flags.append_value(values.is_valid(i) && values.value(i));
        }
        let mut batch = batch;
        batch.remove_column(at);
        out.push(batch);
    }
    Ok((out, Some(flags.finish())))
}

impl Table {
    /// Writes `batches` with `op` as one commit. The table is reloaded afterwards.
    ///
    /// Bad input (schema mismatch, null keys, missing columns) fails before anything is written;
    /// a failure during the write rolls the instant back, leaving the table as it was. A write that
    /// loses a conflict is written again up to `config.conflict_retries` times (inserts, upserts,
    /// deletes: their outcome does not depend on the state they were planned against).
    pub async fn write(
        &mut self,
        op: WriteOperation,
        batches: Vec<RecordBatch>,
        config: &WriteConfig,
    ) -> Result<WriteResult> {
        self.check_writable()?;
        let Some(incoming) = prepare(self, op, batches, config.schema_mode)? else {
            if op != WriteOperation::InsertOverwriteTable {
                return Ok(WriteResult::default());
            }
            return self.execute(op, None, config).await;
        };
        let incoming = Arc::new(incoming);
        let retriable = config.read_from.is_none()
            && matches!(
                op,
                WriteOperation::Insert | WriteOperation::Upsert | WriteOperation::Delete | WriteOperation::BulkInsert
            );
        let mut attempt = 0;
        loop {
            // A delete none of whose keys are in the table as it is now changes nothing: it
            // leaves no instant. Looked up before the instant is claimed (and again under it, as
            // every write does): a key a concurrent write adds after this look is that write's,
            // committed after this delete.
            if op == WriteOperation::Delete || incoming.only_deletes() {
                self.reload().await?;
                if plan::plan(self, op, Some(&incoming), config).await?.work.is_empty() {
                    return Ok(WriteResult::default());
                }
            }
            match self.execute(op, Some(incoming.clone()), config).await {
                Err(Error::CommitConflict { instant, detail }) if retriable && attempt < config.conflict_retries => {
                    attempt += 1;
                    log::info!("{}: {op:?} lost a conflict with {instant} ({detail}); attempt {attempt}", self.uri());
                }
                outcome => return outcome,
            }
        }
    }

    /// Apache Hudi's `bulk_insert` of a stream, in bounded memory: the input is taken
    /// `chunk_bytes` of Arrow data at a time (at least one batch), and each chunk is keyed, cut
    /// into files and written before the next is read; one commit names every file. Each chunk
    /// writes files of its own (a partition gets a file per chunk that holds its rows), and
    /// `partition_sort` orders each chunk's rows, as a Spark task orders its own. A failure of
    /// the input or of a file rolls everything back. Nothing is retried: a stream is read once.
    /// Unless the metadata table keeps a record index, the keys written are not held (a bulk
    /// insert looks no key up, so a concurrent write of the same new key is not a conflict
    /// either, as in Apache Hudi).
    pub async fn bulk_insert_stream(
        &mut self,
        input: &mut (dyn Iterator<Item = Result<RecordBatch>> + Send),
        chunk_bytes: usize,
        config: &WriteConfig,
    ) -> Result<WriteResult> {
        let op = WriteOperation::BulkInsert;
        if config.bulk_sort == BulkSort::GlobalSort {
            return Err(Error::invalid_arg(
                "sort_mode",
                "global_sort orders the whole input: write it with `write` (it holds the input), or use partition_sort",
            ));
        }
        self.check_writable()?;
        let first = next_chunk(input, chunk_bytes)?;
        let Some(incoming) = prepare(self, op, first, config.schema_mode)? else {
            return Ok(WriteResult::default());
        };
        let tx = self.begin_write(op).await?;
        // Read under the instant (see `write_stream`). A bulk insert conflicts with no write
        // (it looks no key up): its commit needs no partition listed where it keeps no keys.
        let keep_keys = crate::metadata::holds_record_index(self).await;
        let strip = |files: &mut WrittenFiles| {
            if !keep_keys {
                files.keys = crate::metadata::KeyChanges::default();
            }
        };
        let parts = match self.bulk_insert_chunks(input, incoming, tx.time(), chunk_bytes, config, strip).await {
            Ok(parts) => parts,
            Err(e) => {
                let e = tx.lost_to_service(self, e).await;
                return Err(tx.fail(self, e).await);
            }
        };
        self.commit_and_serve(tx, op, parts, false, &config.extra_metadata, config).await
    }

    /// A bulk insert's files of `instant`, a chunk at a time (`first` read and prepared
    /// already): each chunk's files numbered on from the last one's (one name and sequence
    /// number per file), its keys `strip`ped of what the commit need not hold.
    pub(crate) async fn bulk_insert_chunks(
        &mut self,
        input: &mut (dyn Iterator<Item = Result<RecordBatch>> + Send),
        first: Incoming,
        instant: &str,
        chunk_bytes: usize,
        config: &WriteConfig,
        strip: impl Fn(&mut WrittenFiles),
    ) -> Result<Vec<WrittenFiles>> {
        let op = WriteOperation::BulkInsert;
        let mut config = config.clone();
        let (mut parts, mut incoming) = (Vec::new(), Some(first));
        while let Some(chunk) = incoming.take() {
            let chunk = self.adopt_write_schema(op, Some(Arc::new(chunk)), config.schema_mode).await?;
            let mut files = self.write_files_in(op, chunk.as_ref(), instant, &config).await?;
            drop(chunk);
            config.first_file += files.stats.len();
            strip(&mut files);
            parts.push(files);
            incoming = prepare(self, op, next_chunk(input, chunk_bytes)?, config.schema_mode)?;
        }
        Ok(parts)
    }

    fn check_writable(&self) -> Result<()> {
        let cfg = self.config();
        if let crate::config::KeyGenerator::Other(class) = &cfg.key_generator {
            return Err(Error::unsupported(format!("writing with the key generator {class}")));
        }
        if cfg.key_generator == crate::config::KeyGenerator::Timestamp
            && (cfg.record_key_fields.len() != 1 || cfg.partition_fields.len() != 1)
        {
            return Err(Error::unsupported(format!(
                "writing with Apache Hudi's timestamp key generator and record key fields {:?}, partition fields {:?} \
                 (it takes one of each)",
                cfg.record_key_fields, cfg.partition_fields
            )));
        }
        if let Some(Err(why)) = crate::keys::KeySpec::from_config(cfg).timestamp {
            return Err(Error::unsupported(format!("writing with the table's timestamp key generator options: {why}")));
        }
        if let Some(i) = cfg.partition_kinds.iter().position(|k| *k == crate::config::PartitionKind::Unknown) {
            return Err(Error::unsupported(format!(
                "writing partition field `{}`: the table's custom key generator does not record whether it is SIMPLE \
                 or TIMESTAMP (Apache Hudi 0.x keeps that in the writer's options); set `{}` in hoodie.properties \
                 to the typed list, e.g. `{}:SIMPLE`",
                cfg.partition_fields[i],
                crate::config::keys::WRITE_PARTITION_FIELDS,
                cfg.partition_fields[i]
            )));
        }
        cfg.check_record_key_fields()?;
        if cfg.merge_mode == crate::config::MergeMode::Custom {
            return Err(Error::unsupported("writing a table with a custom payload or merge strategy"));
        }
        Ok(())
    }

    async fn execute(
        &mut self,
        op: WriteOperation,
        incoming: Option<Arc<Incoming>>,
        config: &WriteConfig,
    ) -> Result<WriteResult> {
        let tx = match &config.read_from {
            Some(read) => self.begin_write_read_from(op, read).await?,
            None => self.begin_write(op).await?,
        };
        let incoming = match self.adopt_write_schema(op, incoming, config.schema_mode).await {
            Ok(incoming) => incoming,
            Err(e) => return Err(tx.fail(self, e).await),
        };
        let files = match self.write_files_in(op, incoming.as_ref(), tx.time(), config).await {
            Ok(files) => files,
            Err(e) => {
                let e = tx.lost_to_service(self, e).await;
                return Err(tx.fail(self, e).await);
            }
        };
        self.commit_and_serve(tx, op, vec![files], false, &config.extra_metadata, config).await
    }

    /// The schema this write writes its files with: its input's (checked and evolved against the
    /// table as it was then, see `keyed`), reconciled with the table's as it is now that the
    /// write's instant is claimed (another write may have evolved it meanwhile: columns the input
    /// lacks are null in its rows). An evolving write marks the table's properties first (see
    /// `table::SCHEMA_EVOLVED_KEY`), so that every reader resolves the schema from the commits.
    /// In `Strict` mode the input must match the schema as it is now: checked against a handle's
    /// older view, a write would bring back a column another process renamed or dropped, or store
    /// nulls in one it added.
    async fn adopt_write_schema(
        &mut self,
        op: WriteOperation,
        incoming: Option<Arc<Incoming>>,
        mode: SchemaMode,
    ) -> Result<Option<Arc<Incoming>>> {
        let Some(incoming) = incoming else { return Ok(None) };
        let (current, mine) = (self.data_schema(), incoming.batch.schema());
        if op == WriteOperation::Delete || mine == current {
            return Ok(Some(incoming));
        }
        let cfg = self.config();
        let fixed: Vec<String> = cfg.record_key_fields.iter().chain(&cfg.partition_fields).cloned().collect();
        if mode == SchemaMode::Strict
            && let Err(Error::SchemaMismatch { detail }) = schema::evolve::evolve(&current, &mine, mode, &fixed)
        {
            let detail = format!("{detail} (the table's schema as of this write, changed since this handle read it)");
            return Err(Error::SchemaMismatch { detail });
        }
        let target = schema::evolve::evolve(&current, &mine, SchemaMode::Merge, &fixed)?;
        if target != current && !self.config().raw.contains_key(crate::table::SCHEMA_EVOLVED_KEY) {
            self.set_properties(&[(crate::table::SCHEMA_EVOLVED_KEY, Some("true"))]).await?;
        }
        let incoming = if target == mine {
            incoming
        } else {
            let batch = schema::conform(&incoming.batch, &target)?;
            Arc::new(Incoming {
                batch,
                keys: incoming.keys.clone(),
                partitions: incoming.partitions.clone(),
                ordering: incoming.ordering.clone(),
                deleted: incoming.deleted.clone(),
            })
        };
        self.set_write_schema(target);
        Ok(Some(incoming))
    }

    // ---- a write in three calls, for writers spread over processes (Spark) -----------------
    //
    // The driver calls `begin_write`, each task calls `write_files` for its records (the tasks'
    // records must fall in disjoint file groups: give each task whole partitions), and the driver
    // calls `commit_write` with every task's result, or aborts the transaction.

    /// Starts the instant of a write (driver side).
    pub async fn begin_write(&mut self, op: WriteOperation) -> Result<Transaction> {
        self.check_writable()?;
        Transaction::begin(self, op.action(self.config().table_type)).await
    }

    /// [`Table::begin_write`] of a write whose input was read from the table in the state `read`
    /// (what a process listed before it read): the commits completed since are checked for
    /// conflicts at its commit as those completed during the write are
    /// ([`Transaction::read_from`]). A conflict found already rolls the instant back.
    pub async fn begin_write_read_from(&mut self, op: WriteOperation, read: &ReadState) -> Result<Transaction> {
        let mut tx = self.begin_write(op).await?;
        match tx.read_from(self, read) {
            Ok(()) => Ok(tx),
            Err(e) => Err(tx.fail(self, e).await),
        }
    }

    /// Writes the files of `batches` for the pending instant `instant` (task side), commits
    /// nothing; the result goes to the driver's [`Table::commit_write`].
    pub async fn write_files(
        &mut self,
        op: WriteOperation,
        batches: Vec<RecordBatch>,
        instant: &str,
        config: &WriteConfig,
    ) -> Result<WrittenFiles> {
        self.reload().await?;
        self.check_writable()?;
        self.check_pending(op, instant)?;
        let incoming = prepare(self, op, batches, config.schema_mode)?.map(Arc::new);
        if incoming.is_none() && op != WriteOperation::InsertOverwriteTable {
            return Ok(WrittenFiles::default());
        }
        let before = self.data_schema();
        let incoming = match config.schema_mode {
            SchemaMode::Merge => self.adopt_write_schema(op, incoming, SchemaMode::Merge).await?,
            SchemaMode::Strict => incoming,
        };
        let _beating = crate::commit::TaskHeartbeat::start(self, instant).await?;
        let mut written = self.write_files_in(op, incoming.as_ref(), instant, config).await?;
        if self.data_schema() != before {
            written.schema = Some(schema::encode_arrow_schema(&self.data_schema()));
        }
        // Read after the files are written: an index built since is caught by the commit
        // (`metadata::sync` refuses unlisted keys where the index is kept).
        if config.own_partitions && !self.config().global_index && !crate::metadata::holds_record_index(self).await {
            written.keys.unlist();
        }
        Ok(written)
    }

    /// Refuses a task's write under `instant` unless it is a pending write of `op`'s action.
    fn check_pending(&self, op: WriteOperation, instant: &str) -> Result<()> {
        match self.timeline().pending().any(|i| i.time == instant && i.action == op.action(self.config().table_type)) {
            true => Ok(()),
            false => Err(Error::invalid_arg("instant", format!("{instant} is not a pending write of this table"))),
        }
    }

    /// Where each input row goes in a distributed write (task side, before a shuffle by route):
    /// `g/<partition>/<file id>` for a key the table holds (all changes of a file group then meet
    /// in one task), `k/<partition>/<key>` for a new key (each key meets its duplicates). Inserts
    /// never look keys up, so all their routes are keys.
    pub async fn route(&mut self, op: WriteOperation, batches: Vec<RecordBatch>) -> Result<Vec<String>> {
        self.reload().await?;
        self.check_writable()?;
        let Some(all) = keyed(self, op, batches, SchemaMode::Merge)? else { return Ok(Vec::new()) };
        let (keys, partitions) = (all.keys.clone(), all.partitions.clone());
        // With a global index a key is known by itself, whatever partition it names, and a
        // key moving between partitions goes with the group it leaves.
        let global = self.config().global_index;
        let scope = |partition: &str| if global { String::new() } else { partition.to_string() };
        // (partition, key) -> (partition, file id) of the group holding the key.
        let mut groups: hashbrown::HashMap<(String, String), (String, String)> = hashbrown::HashMap::new();
        let looks_up = match op {
            WriteOperation::BulkInsert => false,
            WriteOperation::Insert => global,
            _ => true,
        };
        if looks_up {
            let incoming = Arc::new(dedup(all, global, simple_key_field(self.config()))?);
            let lookup_only = WriteConfig { small_file_limit: 0, ..WriteConfig::default() };
            let plan = plan::plan(self, op, Some(&incoming), &lookup_only).await?;
            for work in plan.work.iter().filter(|w| w.old.is_some()) {
                for key in work.changes.keys().chain(work.moved_out.keys()).chain(work.removed.keys()) {
                    let group = (work.partition.clone(), work.file_id.clone());
                    groups.insert((scope(&work.partition), key.clone()), group);
                }
            }
        }
        let mut routes = Vec::with_capacity(keys.len());
        for row in 0..keys.len() {
            let (partition, key) = (scope(partitions.path(row)), keys.value(row));
            routes.push(match groups.get(&(partition.clone(), key.to_string())) {
                Some((held_in, file_id)) => format!("g/{held_in}/{file_id}"),
                None => format!("k/{partition}/{key}"),
            });
        }
        Ok(routes)
    }

    async fn write_files_in(
        &self,
        op: WriteOperation,
        incoming: Option<&Arc<Incoming>>,
        instant: &str,
        config: &WriteConfig,
    ) -> Result<WrittenFiles> {
        self.write_files_within(op, incoming, instant, config, None).await
    }

    /// [`Table::write_files_in`], looking keys up only in the file groups `within` when given
    /// ([`plan::plan_within`]).
    async fn write_files_within(
        &self,
        op: WriteOperation,
        incoming: Option<&Arc<Incoming>>,
        instant: &str,
        config: &WriteConfig,
        within: Option<&std::collections::HashSet<crate::table::fs_view::FileGroupId>>,
    ) -> Result<WrittenFiles> {
        let plan = plan::plan_within(self, op, incoming, config, within).await?;
        crate::commit::failpoint("after-plan");
        write_partition_markers(self, instant, &plan).await?;
        let plan::WritePlan { work, replaced } = plan;
        let keys = match incoming {
            Some(incoming) => {
                // A merge-on-read group ordered by event time keeps a deleted key in its logs.
                let logs_hold_deletes = self.config().merge_mode == crate::config::MergeMode::EventTime
                    && self.config().table_type == crate::config::TableType::MergeOnRead;
                key_changes(&work, incoming, logs_hold_deletes)?
            }
            None => crate::metadata::KeyChanges::default(),
        };
        let mut written = base_file::write_all(self, instant, work, incoming, config).await?;
        let entries = written.iter_mut().filter_map(|w| Some((w.stat.path.clone()?, w.entry.take()?))).collect();
        Ok(WrittenFiles {
            replaced,
            stats: written.into_iter().map(|w| (w.partition, w.stat)).collect(),
            keys,
            entries,
            schema: None,
        })
    }

    /// The schema the tasks of a distributed write wrote in: the table's, evolved by what tasks
    /// of a `schema_mode="merge"` write report.
    fn written_schema(&self, parts: &[WrittenFiles]) -> Result<arrow::datatypes::SchemaRef> {
        let mut out = self.data_schema();
        let cfg = self.config();
        let fixed: Vec<String> = cfg.record_key_fields.iter().chain(&cfg.partition_fields).cloned().collect();
        for evolved in parts.iter().filter_map(|p| p.schema.as_deref()) {
            out = schema::evolve::evolve(&out, &*schema::decode_arrow_schema(evolved)?, SchemaMode::Merge, &fixed)?;
        }
        Ok(out)
    }

    /// Completes a write with the files of all its tasks (driver side). With `reconcile` (a write
    /// spread over tasks), base files that several tasks wrote for one file group are merged into
    /// one, and files of the instant in the partitions written that no task reported (left by failed
    /// task attempts) are deleted, so that only reported files become visible. Then the services
    /// due inline run, as after a write in one process (compaction too, after a deltacommit).
    pub async fn commit_write(
        &mut self,
        tx: Transaction,
        op: WriteOperation,
        parts: Vec<WrittenFiles>,
        reconcile: bool,
    ) -> Result<WriteResult> {
        self.commit_write_with(tx, op, parts, reconcile, &WriteConfig::default()).await
    }

    /// [`Table::commit_write`], recording `config.extra_metadata` in the commit's
    /// `extraMetadata` and running a due compaction inline only if `config.compact_inline`.
    pub async fn commit_write_with(
        &mut self,
        tx: Transaction,
        op: WriteOperation,
        parts: Vec<WrittenFiles>,
        reconcile: bool,
        config: &WriteConfig,
    ) -> Result<WriteResult> {
        self.commit_and_serve(tx, op, parts, reconcile, &config.extra_metadata, config).await
    }

    /// Commits, then runs the table services due inline: cleaning and archival after every
    /// commit, compaction (writing with `config`, unless `config.compact_inline` is off) after a
    /// deltacommit, whether the files were written here or by the tasks of a distributed write.
    async fn commit_and_serve(
        &mut self,
        tx: Transaction,
        op: WriteOperation,
        parts: Vec<WrittenFiles>,
        reconcile: bool,
        extra: &BTreeMap<String, String>,
        config: &WriteConfig,
    ) -> Result<WriteResult> {
        let result = self.commit_parts(tx, op, parts, reconcile, extra).await?;
        inline::clean(self).await;
        inline::archive(self).await;
        if config.compact_inline && op.action(self.config().table_type) == Action::DeltaCommit {
            inline::compact(self, config).await;
        }
        Ok(result)
    }

    async fn commit_parts(
        &mut self,
        tx: Transaction,
        op: WriteOperation,
        mut parts: Vec<WrittenFiles>,
        reconcile: bool,
        extra: &BTreeMap<String, String>,
    ) -> Result<WriteResult> {
        if let Err(e) = check_extra_metadata(extra) {
            return Err(tx.fail(self, e).await);
        }
        // A bulk insert keeps duplicate keys, as in one process.
        if op != WriteOperation::BulkInsert
            && let Err(e) = check_keys_in_one_task(&parts, self.config().global_index)
        {
            return Err(tx.fail(self, e).await);
        }
        if reconcile
            && let Err(e) =
                overlaps::merge_overlapping_rewrites(self, tx.time(), &mut parts, &WriteConfig::default()).await
        {
            return Err(tx.fail(self, e).await);
        }
        let mut metadata = CommitMetadata {
            operation_type: Some(op.hudi_name().to_string()),
            extra_metadata: extra.clone(),
            ..Default::default()
        };
        let schema = self.written_schema(&parts).and_then(|s| metadata.set_schema(&s, &self.config().name));
        if let Err(e) = schema {
            return Err(tx.fail(self, e).await);
        }
        let mut result = WriteResult::default();
        let mut keys = crate::metadata::KeyChanges::default();
        let mut entries = Vec::new();
        for part in parts {
            keys.extend(part.keys);
            entries.extend(part.entries);
            for (partition, ids) in part.replaced {
                let entry = metadata.partition_to_replace_file_ids.entry(partition).or_default();
                entry.extend(ids);
                entry.sort();
                entry.dedup();
            }
            for (partition, stat) in part.stats {
                result.num_inserts += stat.num_inserts as u64;
                result.num_updates += stat.num_update_writes as u64;
                result.num_deletes += stat.num_deletes as u64;
                result.files.push(stat.path.clone().unwrap_or_default());
                metadata.partition_to_write_stats.entry(partition).or_default().push(stat);
            }
        }
        if reconcile {
            let kept: std::collections::HashSet<&str> = result.files.iter().map(String::as_str).collect();
            let partitions: Vec<&str> = metadata.partition_to_write_stats.keys().map(String::as_str).collect();
            let leftovers = crate::commit::Leftovers::Write;
            if let Err(e) =
                crate::commit::remove_unreported_files(self.storage(), tx.time(), &partitions, &kept, leftovers).await
            {
                return Err(tx.fail(self, e).await);
            }
        }
        let instant = tx.commit_with_keys(self, &metadata, &keys, &entries).await?;
        result.completion = Some(instant.completion.clone().unwrap_or_else(|| instant.time.clone()));
        result.instant = Some(instant.time);
        Ok(result)
    }
}

/// What the planned work does to record keys: the keys each file group takes (updates and
/// inserts), and the keys deleted. A delete carrying an ordering value may lose to the stored
/// record (event-time ordering): its key keeps its entry, which routes a later write to the same
/// group. Where the group's logs keep the deleted key (`logs_hold_deletes`: merge-on-read ordered
/// by event time) every delete keeps it, as key reads keep finding the key there: a later delete
/// carrying an ordering value must reach that group, to hide a later write with a lower one.
fn key_changes(
    work: &[plan::FileWork],
    incoming: &Incoming,
    logs_hold_deletes: bool,
) -> Result<crate::metadata::KeyChanges> {
    let mut changes = crate::metadata::KeyChanges::default();
    let keeps_deleted = logs_hold_deletes || incoming.ordering.is_some();
    for w in work {
        let mut rows: Vec<u32> = w.changes.values().copied().collect();
        let deletes = if keeps_deleted { &mut changes.ordered_deletes } else { &mut changes.deleted };
        if w.deletes {
            deletes.push((w.partition.clone(), crate::metadata::record_index::take_keys(&incoming.keys, &rows)?));
            continue;
        }
        // Flagged deletes, as a delete's.
        if !w.removed.is_empty() {
            let removed: Vec<u32> = w.removed.values().copied().collect();
            deletes.push((w.partition.clone(), crate::metadata::record_index::take_keys(&incoming.keys, &removed)?));
        }
        if !w.moved_out.is_empty() {
            let moved: Vec<u32> = w.moved_out.values().copied().collect();
            let keys = crate::metadata::record_index::take_keys(&incoming.keys, &moved)?;
            changes.deleted.push((w.partition.clone(), keys));
        }
        rows.extend(&w.inserts);
        if !rows.is_empty() {
            let keys = crate::metadata::record_index::take_keys(&incoming.keys, &rows)?;
            changes.written.push((w.partition.clone(), w.file_id.clone(), keys));
        }
    }
    Ok(changes)
}

/// Every partition directory gets `.hoodie_partition_metadata` (Apache Hudi's readers find
/// partitions by it), the root of a non-partitioned table too (depth 0): Java lists no partition
/// without it. Written once, before the first data file of the partition; a table written before
/// the root got one gets it from its next write.
async fn write_partition_markers(table: &Table, instant: &str, plan: &plan::WritePlan) -> Result<()> {
    use crate::format::file_name::{PARTITION_METADATA, file_path};
    let partitions: std::collections::BTreeSet<&str> = plan.work.iter().map(|w| w.partition.as_str()).collect();
    for partition in partitions {
        let path = file_path(partition, PARTITION_METADATA);
        // The directories below the table root, as Java counts them (`yyyy/MM/dd` is 3 deep).
        let depth = partition.split('/').filter(|s| !s.is_empty()).count();
        let text = format!(
            "#partition metadata\n#{}\ncommitTime={instant}\npartitionDepth={depth}\n",
            chrono::Utc::now().format("%a %b %d %H:%M:%S UTC %Y")
        );
        table.storage().put_if_absent(&path, bytes::Bytes::from(text)).await?;
    }
    Ok(())
}

/// The next batches of `input` holding at least `chunk_bytes` of Arrow data and at least one
/// row, or what is left (no row only at its end: a chunk without rows ends the write). Reading
/// may block on the producer (a Python generator): the runtime's other tasks (a heartbeat) move
/// to other threads meanwhile.
fn next_chunk(
    input: &mut (dyn Iterator<Item = Result<RecordBatch>> + Send),
    chunk_bytes: usize,
) -> Result<Vec<RecordBatch>> {
    let mut read = || {
        let (mut chunk, mut bytes, mut rows) = (Vec::new(), 0, 0);
        while bytes < chunk_bytes || rows == 0 {
            let Some(batch) = input.next() else { break };
            let batch = batch?;
            bytes += batch.get_array_memory_size();
            rows += batch.num_rows();
            chunk.push(batch);
        }
        Ok(chunk)
    };
    match tokio::runtime::Handle::try_current().map(|h| h.runtime_flavor()) {
        Ok(tokio::runtime::RuntimeFlavor::MultiThread) => tokio::task::block_in_place(read),
        _ => read(),
    }
}

/// Checks and keys the input; `None` when it holds no rows. Duplicate keys are combined, but for
/// a bulk insert (Apache Hudi's `hoodie.combine.before.insert`, false by default).
fn prepare(table: &Table, op: WriteOperation, batches: Vec<RecordBatch>, mode: SchemaMode) -> Result<Option<Incoming>> {
    let keyed = keyed(table, op, batches, mode)?;
    if op == WriteOperation::BulkInsert {
        return Ok(keyed);
    }
    let global = table.config().global_index;
    keyed.map(|k| dedup(k, global, simple_key_field(table.config()))).transpose()
}

/// The one field a table's record key is the text of (not a complex key), if it has one.
fn simple_key_field(cfg: &crate::config::TableConfig) -> Option<&str> {
    match cfg.record_key_fields.as_slice() {
        [field] if !cfg.complex_keys() => Some(field),
        _ => None,
    }
}

/// The key column as 64-bit integers when the key is the text of one integer column
/// (`simple_field`): two rows share a key exactly when they share the integer, and hashing and
/// comparing it costs a fraction of the text's.
fn integer_keys(batch: &RecordBatch, simple_field: Option<&str>) -> Result<Option<arrow::array::Int64Array>> {
    use arrow::datatypes::DataType::{Int8, Int16, Int32, Int64, UInt8, UInt16, UInt32};
    let Some(col) = simple_field.and_then(|f| batch.column_by_name(f)) else { return Ok(None) };
    if !matches!(col.data_type(), Int8 | Int16 | Int32 | Int64 | UInt8 | UInt16 | UInt32) {
        return Ok(None);
    }
    let ints = arrow::compute::cast(col, &arrow::datatypes::DataType::Int64)?;
    Ok(ints.as_any().downcast_ref::<arrow::array::Int64Array>().cloned())
}

/// The row holding the winning version of each distinct `(partition, key)`, in order of first
/// appearance: the greatest ordering value (`cmp`), ties to the later row.
fn winners<K: std::hash::Hash + Eq>(
    n: usize,
    key: impl Fn(usize) -> (u32, K),
    cmp: Option<&arrow::array::DynComparator>,
) -> Vec<u32> {
    let mut slot_of: hashbrown::HashMap<(u32, K), usize> = hashbrown::HashMap::with_capacity(n);
    let mut slots: Vec<u32> = Vec::with_capacity(n);
    for row in 0..n {
        match slot_of.entry(key(row)) {
            hashbrown::hash_map::Entry::Vacant(e) => {
                e.insert(slots.len());
                slots.push(row as u32);
            }
            hashbrown::hash_map::Entry::Occupied(e) => {
                let slot = *e.get();
                if cmp.is_none_or(|c| c(slots[slot] as usize, row).is_le()) {
                    slots[slot] = row as u32;
                }
            }
        }
    }
    slots
}

/// Whether the keys rise strictly from row to row (ids issued in order, time-ordered keys): then
/// no two rows share a key. Compared as the integers when the key is one integer column, else as
/// the key text; one pass, stopping at the first row that does not rise.
fn strictly_increasing(ints: Option<&arrow::array::Int64Array>, keys: &StringArray) -> bool {
    match ints {
        Some(ints) => ints.null_count() == 0 && ints.values().windows(2).all(|w| w[0] < w[1]),
        None => keys.null_count() == 0 && (1..keys.len()).all(|i| keys.value(i - 1) < keys.value(i)),
    }
}

/// The input checked against the table and keyed, every row kept.
fn keyed(table: &Table, op: WriteOperation, batches: Vec<RecordBatch>, mode: SchemaMode) -> Result<Option<Incoming>> {
    let (batches, deleted) = match op {
        WriteOperation::Upsert => take_deleted(batches)?,
        _ => (batches, None),
    };
    let Some(first) = batches.first() else { return Ok(None) };
    let source_schema = first.schema();
    let data_schema = table.data_schema();
    let batch = if op == WriteOperation::Delete {
        // Deletes need only the key, partition and (optionally) ordering columns, in the
        // table's types (exactly: a key `1.5` must not find the key `1`).
        let raw = schema::conform_known(&concat_batches(&source_schema, &batches)?, &data_schema)?;
        // With a global index a key is found wherever it is: the partition columns may be left out.
        let cfg = table.config();
        let partition_fields = if cfg.global_index { &[][..] } else { &cfg.partition_fields[..] };
        let needed: Vec<&String> = cfg.record_key_fields.iter().chain(partition_fields).collect();
        for name in &needed {
            if raw.column_by_name(name).is_none() {
                return Err(Error::invalid_data(format!("delete input lacks column `{name}`")));
            }
        }
        raw
    } else {
        // The ordering field decides between versions of a record: it must be given, not
        // filled with nulls like other absent nullable columns.
        if let Some(name) = &table.config().ordering_field
            && source_schema.column_with_name(name).is_none()
        {
            return Err(Error::invalid_data(format!("ordering column `{name}` is missing")));
        }
        // The schema this write leaves the table with (see `schema::evolve`); the table adopts it
        // when the write commits.
        let cfg = table.config();
        let fixed: Vec<String> = cfg.record_key_fields.iter().chain(&cfg.partition_fields).cloned().collect();
        let target = schema::evolve::evolve(&data_schema, &source_schema, mode, &fixed)?;
        // The input is let go as it is conformed and copied (`concat_in_parallel`).
        let conformed: Vec<RecordBatch> =
            batches.into_iter().map(|b| schema::conform(&b, &target)).collect::<Result<_>>()?;
        concat_in_parallel(&target, conformed)?
    };
    if batch.num_rows() == 0 {
        return Ok(None);
    }
    let spec = KeySpec::from_config(table.config());
    let partitionless = op == WriteOperation::Delete
        && table.config().partition_fields.iter().any(|f| batch.column_by_name(f).is_none());
    let partitions = || {
        if partitionless {
            // A delete by key alone on a table with a global index: the partition is where the key is.
            Ok(Partitions { paths: vec![String::new()], ids: vec![0; batch.num_rows()] })
        } else {
            spec.partitions(&batch)
        }
    };
    // Keys and partition paths are made side by side, each one pass over the input.
    let (keys, partitions) = if batch.get_array_memory_size() < PARALLEL_BYTES {
        (spec.record_keys(&batch), partitions())
    } else {
        std::thread::scope(|s| {
            let keys = s.spawn(|| spec.record_keys(&batch));
            let partitions = partitions();
            (joined(keys.join()), partitions)
        })
    };
    let (keys, partitions) = (keys?, partitions?);
    if !partitionless {
        spec.check_default_partition_collisions(&batch, &keys, &partitions)?;
    }
    let cfg = table.config();
    let ordering = match (&cfg.ordering_field, cfg.merge_mode) {
        (Some(name), crate::config::MergeMode::EventTime) => match batch.column_by_name(name) {
            Some(c) => Some(c.clone()),
            None if op == WriteOperation::Delete => None,
            None => return Err(Error::invalid_data(format!("ordering column `{name}` is missing"))),
        },
        _ => None,
    };
    Ok(Some(Incoming { batch, keys, partitions, ordering, deleted }))
}

/// Inputs below this many bytes of Arrow data are prepared on one thread: starting threads
/// would cost more than they save (a Spark task's small upsert, a stream's small chunk).
const PARALLEL_BYTES: usize = 16 << 20;

/// The result of a scoped thread; a panic in it (a bug, never bad input) goes on unwinding.
fn joined<T>(result: std::thread::Result<T>) -> T {
    result.unwrap_or_else(|panic| std::panic::resume_unwind(panic))
}

/// `batches` as one batch, its columns concatenated on as many threads as the machine has cores
/// (a column on one thread): the copy of a write's input is a copy of memory, and one core
/// cannot fill the memory's bandwidth.
fn concat_in_parallel(schema: &arrow::datatypes::SchemaRef, batches: Vec<RecordBatch>) -> Result<RecordBatch> {
    concat_on_threads(schema, batches, PARALLEL_BYTES, std::thread::available_parallelism().map_or(1, |n| n.get()))
}

/// [`concat_in_parallel`] on up to `threads` threads for inputs of `min_bytes` or more. A column's
/// pieces are let go as soon as it is made, so the copy holds the input and about a column per
/// thread, not the input twice (a streamed write's chunk: 512 MiB more at its peak).
fn concat_on_threads(
    schema: &arrow::datatypes::SchemaRef,
    batches: Vec<RecordBatch>,
    min_bytes: usize,
    threads: usize,
) -> Result<RecordBatch> {
    let width = schema.fields().len();
    let bytes: usize = batches.iter().map(|b| b.get_array_memory_size()).sum();
    let threads = if bytes < min_bytes { 1 } else { threads.clamp(1, width.max(1)) };
    let rows: usize = batches.iter().map(|b| b.num_rows()).sum();
    for b in &batches {
        if b.schema().fields() != schema.fields() {
            return Err(Error::invalid_data(format!("a batch of schema {} among batches of {schema}", b.schema())));
        }
    }
    // Each thread's columns with their pieces; the batches themselves are let go.
    let mut shares: Vec<Vec<(usize, Vec<ArrayRef>)>> = (0..threads).map(|_| Vec::new()).collect();
    for c in 0..width {
        shares[c % threads].push((c, batches.iter().map(|b| b.column(c).clone()).collect()));
    }
    drop(batches);
    let make = |share: Vec<(usize, Vec<ArrayRef>)>| -> Result<Vec<(usize, ArrayRef)>> {
        let mut out = Vec::with_capacity(share.len());
        for (c, pieces) in share {
            let arrays: Vec<&dyn Array> = pieces.iter().map(|a| a.as_ref()).collect();
            out.push((c, arrow::compute::concat(&arrays)?));
        }
        Ok(out)
    };
    let mut shares = shares.into_iter();
    let mine = shares.next().unwrap_or_default();
    let made: Vec<Result<Vec<(usize, ArrayRef)>>> = std::thread::scope(|s| {
        let workers: Vec<_> = shares.map(|share| s.spawn(move || make(share))).collect();
        let mine = make(mine);
        // Every worker is joined before any result is looked at.
        let mut made: Vec<_> = workers.into_iter().map(|w| joined(w.join())).collect();
        made.push(mine);
        made
    });
    let mut columns: Vec<Option<ArrayRef>> = vec![None; width];
    for share in made {
        for (c, array) in share? {
            columns[c] = Some(array);
        }
    }
    let columns = columns.into_iter().map(|c| c.ok_or_else(|| Error::invalid_data("a column was not concatenated")));
    let options = arrow::array::RecordBatchOptions::new().with_row_count(Some(rows));
    Ok(RecordBatch::try_new_with_options(schema.clone(), columns.collect::<Result<_>>()?, &options)?)
}

/// Combines rows with the same (partition, key), or the same key whatever its partition when
/// keys are `global` (see [`crate::config::TableConfig::global_index`]): the greatest ordering
/// value wins, ties and tables without ordering go to the last row.
fn dedup(input: Incoming, global: bool, simple_field: Option<&str>) -> Result<Incoming> {
    let n = input.batch.num_rows();
    let cmp = match &input.ordering {
        Some(o) => Some(make_comparator(o.as_ref(), o.as_ref(), SortOptions { descending: false, nulls_first: true })?),
        None => None,
    };
    let partition = |row: usize| if global { 0 } else { input.partitions.ids[row] };
    let ints = integer_keys(&input.batch, simple_field)?;
    if strictly_increasing(ints.as_ref(), &input.keys) {
        // Every key differs from every other: nothing to combine, and no table of keys to build.
        return Ok(input);
    }
    let kept: Vec<u32> = match ints {
        Some(ints) => winners(n, |row| (partition(row), ints.value(row)), cmp.as_ref()),
        None => winners(n, |row| (partition(row), input.keys.value(row)), cmp.as_ref()),
    };
    if kept.len() == n {
        return Ok(input);
    }
    input.take(&UInt32Array::from(kept))
}

/// Refuses a distributed write in which two tasks decided about the same record key (in one
/// partition, or anywhere with a global index) in ways the commit cannot reconcile: each planned
/// against the table alone. Two tasks writing a key into two file groups would both land (the key
/// twice in the table); one deleting a key another writes would keep or lose the row by which
/// task ran where, not by the ordering field. Two tasks writing one key into the same file group
/// are reconciled as one process would (copy-on-write rewrites merged, the greater ordering value
/// winning; merge-on-read logs merged by readers). Spark's data source hands tasks whatever rows
/// their input partitions hold; `oxlake.spark.write` routes every key to one task.
fn check_keys_in_one_task(parts: &[WrittenFiles], global: bool) -> Result<()> {
    if parts.len() < 2 {
        return Ok(());
    }
    fn scope(partition: &str, global: bool) -> &str {
        if global { "" } else { partition }
    }
    let refuse = |key: &str, what: &str| {
        Error::invalid_data(format!(
            "record key `{key}` was {what} by two tasks of this write{}: each task decides alone, so the \
             result would depend on which task ran where; repartition the rows by the record key (or use \
             oxlake.spark.write, which does)",
            if global { "" } else { " in one partition" }
        ))
    };
    // (scope, key) → (task, file id) of its write.
    let mut written: hashbrown::HashMap<(&str, &str), (usize, &str)> = hashbrown::HashMap::new();
    for (task, part) in parts.iter().enumerate() {
        for (partition, file_id, keys) in &part.keys.written {
            for key in keys.iter().flatten() {
                match written.insert((scope(partition, global), key), (task, file_id)) {
                    Some((other, file)) if other != task && file != file_id => {
                        return Err(refuse(key, "written into two file groups"));
                    }
                    _ => {}
                }
            }
        }
    }
    for (task, part) in parts.iter().enumerate() {
        for (partition, keys) in part.keys.deleted.iter().chain(&part.keys.ordered_deletes) {
            for key in keys.iter().flatten() {
                if written.get(&(scope(partition, global), key)).is_some_and(|(other, _)| *other != task) {
                    return Err(refuse(key, "deleted and written"));
                }
            }
        }
    }
    Ok(())
}

/// Refuses extra metadata under the keys the commit's schema is recorded at.
fn check_extra_metadata(extra: &BTreeMap<String, String>) -> Result<()> {
    match extra.keys().find(|k| CommitMetadata::SCHEMA_KEYS.contains(&k.as_str()) || k.is_empty()) {
        Some(k) => Err(Error::invalid_arg(
            "extra_metadata",
            format!("`{k}` is where the commit records the table's schema; choose another key"),
        )),
        None => Ok(()),
    }
}

fn downcast_str(a: ArrayRef) -> Result<StringArray> {
    a.as_any().downcast_ref::<StringArray>().cloned().ok_or_else(|| Error::invalid_data("expected strings"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::Int64Array;

    #[test]
    fn dedup_keeps_greatest_ordering_then_last() {
        let batch =
            RecordBatch::try_from_iter(vec![("v", Arc::new(Int64Array::from(vec![1, 2, 3, 4, 5])) as ArrayRef)])
                .unwrap();
        let incoming = Incoming {
            keys: StringArray::from(vec!["a", "b", "a", "a", "b"]),
            partitions: Partitions { paths: vec!["p".into()], ids: vec![0; 5] },
            ordering: Some(Arc::new(Int64Array::from(vec![Some(5), Some(1), Some(9), Some(9), None]))),
            deleted: None,
            batch,
        };
        let out = dedup(incoming, false, None).unwrap();
        let keys: Vec<_> = out.keys.iter().flatten().collect();
        assert_eq!(keys, vec!["a", "b"]);
        let v = out.batch.column(0).as_any().downcast_ref::<Int64Array>().unwrap();
        // a: ordering 9 twice, the later (row 3, v=4) wins; b: 1 beats null.
        assert_eq!(v.values(), &[4, 2]);
    }

    proptest::proptest! {
        /// Combining by an integer key column keeps the rows combining by its text keeps.
        #[test]
        fn dedup_by_integers_equals_dedup_by_their_text(
            rows in proptest::collection::vec((-3i64..4, proptest::option::of(0i64..3), 0u32..2), 0..40),
            global in proptest::prelude::any::<bool>(),
        ) {
            let ids: Vec<i64> = rows.iter().map(|r| r.0).collect();
            let incoming = || Incoming {
                keys: StringArray::from(ids.iter().map(|i| i.to_string()).collect::<Vec<_>>()),
                partitions: Partitions { paths: vec!["p".into(), "q".into()], ids: rows.iter().map(|r| r.2).collect() },
                ordering: Some(Arc::new(Int64Array::from(rows.iter().map(|r| r.1).collect::<Vec<_>>()))),
                deleted: None,
                batch: RecordBatch::try_from_iter(vec![
                    ("id", Arc::new(Int64Array::from(ids.clone())) as ArrayRef),
                    ("row", Arc::new(Int64Array::from_iter_values(0..ids.len() as i64)) as ArrayRef),
                ])
                .unwrap(),
            };
            let by_text = dedup(incoming(), global, None).unwrap();
            let by_int = dedup(incoming(), global, Some("id")).unwrap();
            proptest::prop_assert_eq!(by_text.batch, by_int.batch);
            proptest::prop_assert_eq!(by_text.keys, by_int.keys);
        }

        /// Combining keeps the rows a table of every key keeps, whether or not the keys rise
        /// (rising keys skip the table), with or without a global index and an ordering field.
        #[test]
        fn dedup_keeps_the_winners_of_every_key(
            mut rows in proptest::collection::vec((-50i64..50, proptest::option::of(0i64..3), 0u32..2), 0..40),
            rising in proptest::prelude::any::<bool>(),
            by_int in proptest::prelude::any::<bool>(),
            global in proptest::prelude::any::<bool>(),
            ordered in proptest::prelude::any::<bool>(),
        ) {
            if rising {
                rows.sort_unstable_by_key(|r| r.0);
                rows.dedup_by_key(|r| r.0);
            }
            let ids: Vec<i64> = rows.iter().map(|r| r.0).collect();
            // Text that rises with the integers, so that both ways of seeing rising keys are tried.
            let keys = StringArray::from(ids.iter().map(|i| format!("{:03}", i + 50)).collect::<Vec<_>>());
            let ordering: Option<ArrayRef> =
                ordered.then(|| Arc::new(Int64Array::from(rows.iter().map(|r| r.1).collect::<Vec<_>>())) as ArrayRef);
            let partitions = Partitions { paths: vec!["p".into(), "q".into()], ids: rows.iter().map(|r| r.2).collect() };
            let incoming = Incoming {
                keys: keys.clone(),
                partitions: partitions.clone(),
                ordering: ordering.clone(),
                deleted: None,
                batch: RecordBatch::try_from_iter(vec![
                    ("id", Arc::new(Int64Array::from(ids.clone())) as ArrayRef),
                    ("row", Arc::new(Int64Array::from_iter_values(0..ids.len() as i64)) as ArrayRef),
                ])
                .unwrap(),
            };
            let kept = dedup(incoming, global, by_int.then_some("id")).unwrap();
            let cmp = ordering
                .as_ref()
                .map(|o| make_comparator(o.as_ref(), o.as_ref(), SortOptions { descending: false, nulls_first: true }).unwrap());
            let scope = |row: usize| if global { 0 } else { partitions.ids[row] };
            let expected = winners(ids.len(), |row| (scope(row), keys.value(row)), cmp.as_ref());
            use arrow::array::AsArray;
            let got: Vec<u32> =
                kept.batch.column(1).as_primitive::<arrow::datatypes::Int64Type>().values().iter().map(|r| *r as u32).collect();
            proptest::prop_assert_eq!(got, expected);
        }

        /// Concatenating on several threads gives the batch one thread gives: dictionaries,
        /// structs and lists with nulls included.
        #[test]
        fn concat_in_parallel_equals_concat_batches(
            parts in proptest::collection::vec(proptest::collection::vec(proptest::option::of(0i32..5), 0..30), 1..5),
        ) {
            use arrow::array::{DictionaryArray, ListArray, StructArray};
            use arrow::datatypes::{Field, Int32Type};
            let batches: Vec<RecordBatch> = parts
                .iter()
                .map(|values| {
                    let ints = Arc::new(arrow::array::Int32Array::from(values.clone())) as ArrayRef;
                    let words: DictionaryArray<Int32Type> =
                        values.iter().map(|v| v.map(|v| ["a", "b", "c"][v as usize % 3])).collect();
                    let lists = ListArray::from_iter_primitive::<Int32Type, _, _>(
                        values.iter().map(|v| v.map(|v| (0..v).map(Some).collect::<Vec<_>>())),
                    );
                    let structs = StructArray::from(vec![(Arc::new(Field::new("i", arrow::datatypes::DataType::Int32, true)), ints.clone())]);
                    RecordBatch::try_from_iter_with_nullable(vec![
                        ("i", ints, true),
                        ("w", Arc::new(words) as ArrayRef, true),
                        ("l", Arc::new(lists) as ArrayRef, true),
                        ("s", Arc::new(structs) as ArrayRef, true),
                    ])
                    .unwrap()
                })
                .collect();
            let schema = batches[0].schema();
            let one = concat_batches(&schema, &batches).unwrap();
            for threads in [2, 3, 8] {
                proptest::prop_assert_eq!(&concat_on_threads(&schema, batches.clone(), 0, threads).unwrap(), &one);
                proptest::prop_assert_eq!(&concat_on_threads(&schema, batches.clone(), usize::MAX, threads).unwrap(), &one);
            }
        }

        /// A task's report survives its trip to the driver as JSON, the index entries it computed
        /// (statistics and bloom bitsets) included.
        #[test]
        fn written_files_round_trip_through_json(
            bloom in proptest::option::of(proptest::collection::vec(proptest::prelude::any::<u8>(), 0..64)),
            rows in 0u64..1_000,
            keys in proptest::collection::vec("[a-z0-9]{0,6}", 0..8),
        ) {
            use crate::metadata::file_index::{FileEntry, FileStats};
            let stats = FileStats { rows, ..FileStats::default() };
            let written = WrittenFiles {
                keys: crate::metadata::KeyChanges {
                    written: vec![("p".into(), "f".into(), StringArray::from(keys.clone()))],
                    deleted: vec![],
                    ordered_deletes: vec![("p".into(), StringArray::from(keys))],
                    unlisted: ["q".to_string()].into(),
                },
                entries: vec![("p/.f_1.log.1_0-0-1".into(), FileEntry { stats: Some(stats), bloom })],
                ..WrittenFiles::default()
            };
            proptest::prop_assert_eq!(WrittenFiles::from_json(&written.to_json().unwrap()).unwrap(), written);
        }
    }
}
