//! `MergeOnReadExec`: the DataFusion node that reads file slices with log files.
//!
//! Each output partition reads a group of slices one after the other. For one slice it builds a
//! small plan of its own: the Parquet scan of the base file (projection and the key-only predicate
//! pushed down) feeding [`LogSide::merge_base`], with the log side decoded from the slice's admitted
//! log blocks. Batches stream out as the base file is read; the log-only records follow.
//!
//! Memory: the log side is reserved in DataFusion's memory pool. When the pool refuses it, the slice
//! is merged in passes over disjoint ranges of the key hash (2, 4, 8... passes): each pass holds the
//! log versions of its keys only and streams the base file again, so memory stays bounded by the pool
//! whatever the size of the logs. The log and base files themselves are what is re-read; nothing is
//! held for a later pass.
//!
//! A split may cut a slice's base file by rows ([`RowRange`]) so that several workers merge one
//! large file group: each part merges the whole log over its rows, and the first part alone also
//! returns the log's inserts. It learns which log keys the rest of the base holds by reading that
//! rest's key column, so that no key is returned by two parts nor by none.

use std::collections::VecDeque;
use std::fmt;
use std::sync::Arc;

use arrow::array::{Array, ArrayRef, BooleanArray, RecordBatch, StringArray};
use arrow::compute::filter_record_batch;
use arrow::datatypes::SchemaRef;
use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::datasource::physical_plan::parquet::ParquetRowSelection;
use datafusion::datasource::physical_plan::{FileScanConfigBuilder, ParquetSource};
use datafusion::datasource::source::DataSourceExec;
use datafusion::error::Result as DfResult;
use datafusion::execution::memory_pool::{MemoryConsumer, MemoryReservation};
use datafusion::execution::object_store::ObjectStoreUrl;
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::logical_expr::Operator;
use datafusion::physical_expr::expressions::BinaryExpr;
use datafusion::physical_expr::{EquivalenceProperties, PhysicalExpr};
use datafusion::physical_plan::execution_plan::{Boundedness, EmissionType};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{DisplayAs, DisplayFormatType, ExecutionPlan, Partitioning, PlanProperties};
use futures::{FutureExt, StreamExt};

use super::RowRange;
use super::merge::{LogSide, MergeSpec, VirtualKeys};
use crate::error::{Error, Result};
use crate::format::log_block::DeleteRecord;
use crate::log::{self, Admission, LogContent};
use crate::schema::RECORD_KEY;
use crate::schema::internal::{ColumnHistory, FileColumns};
use crate::storage::Storage;
use crate::table::fs_view::LogFile;

/// One file slice to merge.
#[derive(Clone, Debug)]
pub struct SliceScan {
    /// Partition path of the file group.
    pub partition: String,
    /// File id of the file group.
    pub file_id: String,
    /// `(path, size)` of the base file; `None` for a log-only slice.
    pub base: Option<(String, u64)>,
    /// The part of the base file's rows merged, when a split cut it; all of them when `None`.
    pub rows: Option<RowRange>,
    /// The slice's log files.
    pub logs: Vec<LogFile>,
    /// When set, only the base file's rows of these keys are merged
    /// ([`super::PlannedSlice::keys_of`]).
    pub keys_of: Option<super::KeysOf>,
}

impl SliceScan {
    /// Bytes of the slice's files, for balancing (of a base file cut by rows, its rows' share).
    pub fn size(&self) -> u64 {
        let base = self.base.as_ref().map_or(0, |b| match self.rows {
            Some(r) => r.share_of(b.1),
            None => b.1,
        });
        base + self.logs.iter().map(|l| l.size).sum::<u64>()
    }
}

/// What every slice of a scan shares.
#[derive(Clone, Debug)]
pub struct MergeContext {
    /// The table's storage.
    pub storage: Storage,
    /// URL of the object store, for DataFusion's Parquet reader of base files.
    pub store_url: ObjectStoreUrl,
    /// The full table schema (meta fields first).
    pub table_schema: SchemaRef,
    /// Columns the merge reads, as indices into the table schema (sorted).
    pub scan_columns: Vec<usize>,
    /// Output columns, as indices into the scanned columns.
    pub output: Vec<usize>,
    /// How the slice's records are merged.
    pub spec: MergeSpec,
    /// Which log blocks the merge reads.
    pub admission: Admission,
    /// A predicate on key and partition columns only, safe below the merge: it prunes the base
    /// file's row groups and pages.
    pub base_predicate: Option<Arc<dyn PhysicalExpr>>,
    /// A predicate on the record key only, every version of a record agreeing on it: log rows it
    /// finds false are not held (a row it cannot tell, null or failing, is).
    pub log_predicate: Option<Arc<dyn PhysicalExpr>>,
    /// Options of the Parquet reader of base files.
    pub parquet_options: datafusion::config::TableParquetOptions,
    /// How files of older schema versions name the columns (`None`: as the table does).
    pub columns: Option<Arc<ColumnHistory>>,
}

impl MergeContext {
    /// A context that reads every column of the table, with log blocks admitted up to `upper`
    /// (table services: compaction and clustering rewrite whole records).
    pub fn all_columns(table: &crate::table::Table, upper: &str) -> Result<Self> {
        let schema = table.schema();
        let spec = MergeSpec::of_table(table.config(), &schema)?;
        let url = table.storage().store_url();
        let all: Vec<usize> = (0..schema.fields().len()).collect();
        let mut parquet_options = datafusion::config::TableParquetOptions::default();
        parquet_options.global.schema_force_view_types = false;
        Ok(MergeContext {
            storage: table.storage().clone(),
            store_url: ObjectStoreUrl::parse(&url[..url::Position::BeforePath]).map_err(Error::from)?,
            table_schema: schema,
            scan_columns: all.clone(),
            output: all,
            spec,
            admission: Admission::new(upper, Arc::new(table.timeline().clone())),
            base_predicate: None,
            log_predicate: None,
            parquet_options,
            columns: table.column_history().cloned(),
        })
    }
}

/// Merge-on-read over groups of file slices, one output partition per group.
#[derive(Debug)]
pub struct MergeOnReadExec {
    groups: Vec<Vec<SliceScan>>,
    ctx: Arc<MergeContext>,
    schema: SchemaRef,
    properties: Arc<PlanProperties>,
}

impl MergeOnReadExec {
    /// A plan reading each group of slices as one output partition, with the columns of `ctx.output`.
    pub fn try_new(groups: Vec<Vec<SliceScan>>, ctx: MergeContext) -> Result<Self> {
        let scanned = ctx.table_schema.project(&ctx.scan_columns)?;
        let schema = Arc::new(scanned.project(&ctx.output)?);
        let properties = PlanProperties::new(
            EquivalenceProperties::new(schema.clone()),
            Partitioning::UnknownPartitioning(groups.len().max(1)),
            EmissionType::Incremental,
            Boundedness::Bounded,
        );
        Ok(MergeOnReadExec { groups, ctx: Arc::new(ctx), schema, properties: Arc::new(properties) })
    }
}

impl DisplayAs for MergeOnReadExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let slices: usize = self.groups.iter().map(Vec::len).sum();
        write!(f, "MergeOnReadExec: slices={slices}, groups={}, mode={:?}", self.groups.len(), self.ctx.spec.mode)
    }
}

impl ExecutionPlan for MergeOnReadExec {
    fn name(&self) -> &str {
        "MergeOnReadExec"
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        &self.properties
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![]
    }

    fn apply_expressions(
        &self,
        f: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> DfResult<TreeNodeRecursion>,
    ) -> DfResult<TreeNodeRecursion> {
        match &self.ctx.base_predicate {
            Some(p) => f(p),
            None => Ok(TreeNodeRecursion::Continue),
        }
    }

    fn with_new_children(self: Arc<Self>, _children: Vec<Arc<dyn ExecutionPlan>>) -> DfResult<Arc<dyn ExecutionPlan>> {
        Ok(self)
    }

    fn execute(&self, partition: usize, task: Arc<TaskContext>) -> DfResult<SendableRecordBatchStream> {
        let slices: VecDeque<SliceScan> = self.groups.get(partition).cloned().unwrap_or_default().into();
        let reservation = MemoryConsumer::new(format!("MergeOnReadExec[{partition}]"))
            .with_can_spill(true)
            .register(task.memory_pool());
        let state = GroupState { slices, current: None, ctx: self.ctx.clone(), task, reservation };
        let stream = futures::stream::unfold(state, |mut s| async move {
            match s.next_batch().await {
                Ok(Some(b)) => Some((Ok(b), s)),
                Ok(None) => None,
                Err(e) => {
                    s.slices.clear();
                    s.current = None;
                    Some((Err(e.into()), s))
                }
            }
        });
        Ok(Box::pin(RecordBatchStreamAdapter::new(self.schema.clone(), stream)))
    }
}

/// The slices left to read in one partition and the one being read.
struct GroupState {
    slices: VecDeque<SliceScan>,
    current: Option<SliceState>,
    ctx: Arc<MergeContext>,
    task: Arc<TaskContext>,
    /// What the pass being read holds: its log side, and the keys it reads base rows of.
    reservation: MemoryReservation,
}

/// One pass over one slice.
struct SliceState {
    slice: SliceScan,
    /// `(pass, passes)`: this pass merges the keys whose hash is `pass` modulo `passes`.
    pass: (u32, u32),
    log: LogSide,
    base: Option<SendableRecordBatchStream>,
    /// Merged batches of the last base batch not yet returned.
    merged: VecDeque<RecordBatch>,
    rest: Option<VecDeque<RecordBatch>>,
    /// Which of its base file's rows the slice reads ([`base_rows`]).
    rows_read: BaseRows,
}

impl GroupState {
    async fn next_batch(&mut self) -> Result<Option<RecordBatch>> {
        loop {
            if self.current.is_none() {
                let Some(slice) = self.slices.pop_front() else { return Ok(None) };
                self.current = Some(self.open(slice, 1).await?);
            }
            let Some(cur) = self.current.as_mut() else { continue };
            if let Some(merged) = cur.merged.pop_front() {
                return Ok(Some(merged.project(&self.ctx.output)?));
            }
            if let Some(base) = cur.base.as_mut() {
                let path = cur.slice.base.as_ref().map_or("", |b| b.0.as_str());
                // The Parquet decoder panics on some damaged footers: an error naming the file.
                let next = crate::storage::decoding(path, base.next().map(Ok)).await?;
                match next {
                    Some(batch) => {
                        let batch = match batch {
                            Ok(b) => b,
                            Err(e) => return Err(Error::from(e).in_file(path)),
                        };
                        let batch = in_pass(&batch, &self.ctx.spec, cur.pass)?;
                        cur.merged.extend(cur.log.merge_base(&batch)?.into_iter().filter(|b| b.num_rows() > 0));
                        if let Some(merged) = cur.merged.pop_front() {
                            return Ok(Some(merged.project(&self.ctx.output)?));
                        }
                        continue;
                    }
                    None => cur.base = None,
                }
            }
            if cur.rest.is_none() {
                let rest = match cur.slice.rows {
                    Some(rows) if !rows.owns_log_inserts() => Vec::new(),
                    Some(rows) => {
                        claim_outside(&self.ctx, &self.task, &mut cur.log, &cur.slice, rows, &cur.rows_read).await?;
                        cur.log.remaining(self.task.session_config().batch_size())?
                    }
                    None => cur.log.remaining(self.task.session_config().batch_size())?,
                };
                cur.rest = Some(rest.into());
            }
            if let Some(batch) = cur.rest.as_mut().and_then(VecDeque::pop_front) {
                return Ok(Some(batch.project(&self.ctx.output)?));
            }
            // This pass is done: the next pass of the slice, or the next slice.
            let (pass, passes) = cur.pass;
            let slice = cur.slice.clone();
            self.current = None;
            self.reservation.free();
            if pass + 1 < passes {
                self.current = Some(self.open_pass(slice, (pass + 1, passes)).await?);
            }
        }
    }

    /// Opens a slice with `passes` passes, doubling them while the pool refuses what a pass holds.
    async fn open(&mut self, slice: SliceScan, passes: u32) -> Result<SliceState> {
        let mut passes = passes;
        loop {
            match self.open_pass(slice.clone(), (0, passes)).await {
                Err(Error::DataFusion(e))
                    if matches!(*e, datafusion::error::DataFusionError::ResourcesExhausted(_)) && passes < 1 << 16 =>
                {
                    self.reservation.free();
                    passes *= 2;
                    ::log::info!(
                        "merge of file group {} exceeds its memory budget: merging in {passes} passes",
                        slice.file_id
                    );
                }
                other => return other,
            }
        }
    }

    async fn open_pass(&mut self, slice: SliceScan, pass: (u32, u32)) -> Result<SliceState> {
        let rows_read = self.base_rows(&slice, pass).await?;
        let ctx = &self.ctx;
        let scanned = Arc::new(ctx.table_schema.project(&ctx.scan_columns)?);
        let mut log = LogSide::new(ctx.spec.clone(), &scanned)?;
        // In a default partition, null and empty values of a partition column share the slice:
        // the predicate waits for the merge there.
        let filtered = !crate::keys::has_default_segment(&slice.partition);
        // The predicate reads only the key, which every version of a record shares: a log version
        // it finds false belongs to a key whose every version fails it, so it is not held.
        let predicate = ctx.log_predicate.as_ref().filter(|_| filtered);
        let project = |b: &RecordBatch| -> Result<RecordBatch> {
            let b = match predicate {
                Some(p) => not_false(b, p)?,
                None => b.clone(),
            };
            in_pass(&b.project(&ctx.scan_columns)?, &ctx.spec, pass)
        };
        let reservation = &mut self.reservation;
        let each = |content: LogContent| -> Result<()> {
            let content = match content {
                LogContent::Deletes { instant, records } if pass.1 > 1 => {
                    let records: Vec<DeleteRecord> = records
                        .into_iter()
                        .filter(|r| r.record_key.as_deref().is_some_and(|k| key_pass(k, pass.1) == pass.0))
                        .collect();
                    LogContent::Deletes { instant, records }
                }
                other => other,
            };
            let added = log.add(content, &project)?;
            Ok(reservation.try_grow(added)?)
        };
        log::for_each_in_slice(
            &ctx.storage,
            &slice.logs,
            &ctx.table_schema,
            &ctx.admission,
            ctx.columns.as_deref(),
            each,
        )
        .await?;
        let base = match (&slice.base, &rows_read) {
            (Some((path, size)), BaseRows::All | BaseRows::OfKeys(_)) => {
                let rows = slice.rows.map(|r| r.selection());
                let predicate = scan_predicate(ctx, filtered, &rows_read);
                Some(base_stream(ctx, &self.task, path, *size, &ctx.scan_columns, rows, predicate)?)
            }
            (Some(_), BaseRows::NoRows) | (None, _) => None,
        };
        Ok(SliceState { slice, pass, log, base, merged: VecDeque::new(), rest: None, rows_read })
    }
}

/// Which of its base file's rows a slice reads.
enum BaseRows {
    /// Every row (of its row range).
    All,
    /// None: the slice is read by its logs' keys, and they hold none.
    NoRows,
    /// Those whose record key the predicate keeps (the keys of [`SliceScan::keys_of`]).
    OfKeys(Arc<dyn PhysicalExpr>),
}

impl GroupState {
    /// Which of its base file's rows a pass of a slice reads: all, or for a slice read by its
    /// logs' keys ([`SliceScan::keys_of`]) those of the keys of the pass. The keys are held in the
    /// pass's memory: past what the pool grants, more passes (never a whole read of the base
    /// file, which the other side of a change query would not make).
    async fn base_rows(&mut self, slice: &SliceScan, pass: (u32, u32)) -> Result<BaseRows> {
        let ctx = &self.ctx;
        let Some(keys_of) = &slice.keys_of else { return Ok(BaseRows::All) };
        if ctx.spec.virtual_keys.is_some() {
            return Err(Error::unsupported(format!(
                "file group {}: rows chosen by record key in a table without meta fields (no record keys)",
                slice.file_id
            )));
        }
        let admission = ctx.admission.up_to(&keys_of.upper);
        let in_pass = |key: &str| pass.1 == 1 || key_pass(key, pass.1) == pass.0;
        let keys = log::admitted_record_keys(&ctx.storage, &keys_of.logs, &admission, in_pass).await?;
        crate::failpoints::failpoint("read-after-logged-keys");
        if keys.is_empty() {
            return Ok(BaseRows::NoRows);
        }
        // The set, its array and the lookup's row encoding of it, held together for a moment.
        let bytes = 3 * keys.iter().map(|k| k.len() + 32).sum::<usize>();
        self.reservation.try_grow(bytes)?;
        let keys: ArrayRef = Arc::new(StringArray::from_iter_values(keys.iter()));
        let column = ctx.table_schema.field_with_name(RECORD_KEY)?;
        let keys = arrow::compute::cast(&keys, column.data_type())?;
        let expr = super::in_set::in_array(datafusion::prelude::col(RECORD_KEY), &keys, false).ok_or_else(|| {
            Error::invalid_data(format!(
                "file group {}: its logs' keys do not make a set of record keys",
                slice.file_id
            ))
        })?;
        let schema = datafusion::common::DFSchema::try_from(ctx.table_schema.as_ref().clone())?;
        let props = datafusion::execution::context::ExecutionProps::new();
        let planning = datafusion::logical_expr::physical_planning_context::PhysicalPlanningContext::default();
        Ok(BaseRows::OfKeys(datafusion::physical_expr::create_physical_expr(&expr, &schema, &props, &planning)?))
    }
}

/// The predicate of a base file's scan: the query's key-only predicate when `filtered`, and the
/// keys the slice reads, if any.
fn scan_predicate(ctx: &MergeContext, filtered: bool, rows_read: &BaseRows) -> Option<Arc<dyn PhysicalExpr>> {
    let query = ctx.base_predicate.clone().filter(|_| filtered);
    let keys = match rows_read {
        BaseRows::OfKeys(p) => Some(p.clone()),
        BaseRows::All | BaseRows::NoRows => None,
    };
    match (query, keys) {
        (Some(q), Some(k)) => Some(Arc::new(BinaryExpr::new(q, Operator::And, k))),
        (q, k) => q.or(k),
    }
}

/// Marks as claimed the log versions of the keys that the base file's rows outside `rows` hold
/// (another part of the cut file merges them), reading only the key columns of those rows (of
/// those `rows_read` reads).
async fn claim_outside(
    ctx: &MergeContext,
    task: &Arc<TaskContext>,
    log: &mut LogSide,
    slice: &SliceScan,
    rows: RowRange,
    rows_read: &BaseRows,
) -> Result<()> {
    let Some((path, size)) = &slice.base else { return Ok(()) };
    if log.is_empty() || matches!(rows_read, BaseRows::NoRows) {
        return Ok(());
    }
    let spec = &ctx.spec;
    // The key's columns among the scanned ones (the record key, or its fields without meta
    // fields), read in that order: the keys of a batch of them are made as the merge makes them.
    let key_columns: Vec<usize> = match &spec.virtual_keys {
        Some(v) => v.fields.clone(),
        None => vec![spec.key],
    };
    let columns = key_columns
        .iter()
        .map(|&i| ctx.scan_columns.get(i).copied())
        .collect::<Option<Vec<usize>>>()
        .ok_or_else(|| Error::invalid_data(format!("{path}: a key column is not among the merged columns")))?;
    let keys_spec = MergeSpec {
        key: 0,
        ordering: None,
        virtual_keys: spec
            .virtual_keys
            .as_ref()
            .map(|v| VirtualKeys { keys: v.keys.clone(), fields: (0..v.fields.len()).collect() }),
        ..spec.clone()
    };
    if rows.start == 0 && rows.end >= rows.total {
        return Ok(()); // no other rows
    }
    // The rows the other parts merge: those their scans keep under the same predicate.
    let filtered = !crate::keys::has_default_segment(&slice.partition);
    let predicate = scan_predicate(ctx, filtered, rows_read);
    let mut stream = base_stream(ctx, task, path, *size, &columns, Some(rows.outside()), predicate)?;
    while let Some(batch) = crate::storage::decoding(path, stream.next().map(Ok)).await? {
        let batch = batch.map_err(|e| Error::from(e).in_file(path))?;
        log.claim(&keys_spec.keys(&batch)?);
    }
    Ok(())
}

/// The Parquet scan of a base file: the table's `columns` (indices into the table schema),
/// `rows` of it (all when `None`), under `predicate` ([`scan_predicate`]).
fn base_stream(
    ctx: &MergeContext,
    task: &Arc<TaskContext>,
    path: &str,
    size: u64,
    columns: &[usize],
    rows: Option<parquet::arrow::arrow_reader::RowSelection>,
    predicate: Option<Arc<dyn PhysicalExpr>>,
) -> Result<SendableRecordBatchStream> {
    // A file of an older schema version is read under its own column names (the key and
    // partition columns the predicate uses keep theirs).
    let view = ctx
        .columns
        .as_ref()
        .and_then(|c| crate::format::file_name::base_file_instant(path).and_then(|t| c.columns_at(&t)));
    let file_schema = view.as_ref().map_or_else(|| ctx.table_schema.clone(), |v| v.file_schema(&ctx.table_schema));
    let mut source = ParquetSource::new(file_schema).with_table_parquet_options(ctx.parquet_options.clone());
    if let Some(p) = predicate {
        source = source.with_predicate(p);
    }
    let file = super::provider::partitioned_file(&ctx.storage, path, size);
    let file = match rows {
        Some(rows) => file.with_extension(ParquetRowSelection::new(rows)),
        None => file,
    };
    let config = FileScanConfigBuilder::new(ctx.store_url.clone(), Arc::new(source))
        .with_file(file)
        .with_projection_indices(Some(columns.to_vec()))?
        .with_expr_adapter(Some(Arc::new(super::adapter::EvolvedFiles)))
        .build();
    let exec = DataSourceExec::from_data_source(config);
    let stream = exec.execute(0, task.clone())?;
    if view.is_none() {
        return Ok(stream);
    }
    let scanned = Arc::new(ctx.table_schema.project(columns)?);
    let relabeled = scanned.clone();
    let stream = stream.map(move |b| Ok(FileColumns::relabel(b?, &relabeled)?));
    Ok(Box::pin(RecordBatchStreamAdapter::new(scanned, stream)))
}

/// The rows of `batch` (in the table schema) that `predicate` does not find false. A row it cannot
/// tell (null: a partial block without the key's column) stays, and so does the whole batch where
/// it fails (`1 / id` on a key later deleted): the filter above the merge decides them.
fn not_false(batch: &RecordBatch, predicate: &Arc<dyn PhysicalExpr>) -> Result<RecordBatch> {
    let verdict = match predicate.evaluate(batch).and_then(|v| v.into_array(batch.num_rows())) {
        Ok(v) => v,
        Err(_) => return Ok(batch.clone()),
    };
    let Ok(verdict) = datafusion::common::cast::as_boolean_array(&verdict) else { return Ok(batch.clone()) };
    let keep: BooleanArray = verdict.iter().map(|v| Some(v != Some(false))).collect();
    Ok(filter_record_batch(batch, &keep)?)
}

/// The pass of a key (a stable hash, so that the base and the logs agree).
fn key_pass(key: &str, passes: u32) -> u32 {
    crc32fast::hash(key.as_bytes()) % passes
}

/// The rows of `batch` whose key belongs to `pass` (all rows with one pass).
fn in_pass(batch: &RecordBatch, spec: &MergeSpec, (pass, passes): (u32, u32)) -> Result<RecordBatch> {
    if passes <= 1 {
        return Ok(batch.clone());
    }
    let keys = spec.keys(batch)?;
    // Rows without a key all go to the first pass.
    let mask: BooleanArray = (0..keys.len())
        .map(|i| Some(if keys.is_valid(i) { key_pass(keys.value(i), passes) == pass } else { pass == 0 }))
        .collect();
    Ok(filter_record_batch(batch, &mask)?)
}

#[cfg(test)]
mod tests {
    //! The merge node over real merge-on-read tables: which version of a record a scan returns,
    //! and the same rows when the log side does not fit the memory budget.

    use arrow::array::{ArrayRef, Int64Array, StringArray};
    use arrow::datatypes::{DataType, Field, Schema};
    use futures::TryStreamExt;

    use datafusion::common::ToDFSchema;
    use datafusion::prelude::lit;

    use std::collections::BTreeMap;

    use super::*;
    use crate::config::{CreateOptions, TableType};
    use crate::read::ScanOptions;
    use crate::table::{Table, TableOptions};
    use crate::write::{WriteConfig, WriteOperation};

    /// `(id, ts, v)`, as a scan returns them.
    type Row = (i64, Option<i64>, String);

    fn schema() -> SchemaRef {
        Arc::new(Schema::new(vec![
            Field::new("id", DataType::Int64, false),
            Field::new("ts", DataType::Int64, true),
            Field::new("v", DataType::Utf8, true),
        ]))
    }

    fn batch(rows: &[(i64, Option<i64>, &str)]) -> RecordBatch {
        RecordBatch::try_new(
            schema(),
            vec![
                Arc::new(Int64Array::from(rows.iter().map(|r| r.0).collect::<Vec<_>>())),
                Arc::new(Int64Array::from(rows.iter().map(|r| r.1).collect::<Vec<_>>())),
                Arc::new(StringArray::from(rows.iter().map(|r| r.2).collect::<Vec<_>>())),
            ],
        )
        .unwrap()
    }

    /// A non-partitioned merge-on-read table keyed by `id`, event-time ordered by `ordering`.
    async fn table(dir: &std::path::Path, ordering: Option<&str>) -> Table {
        let create = CreateOptions {
            name: "t".into(),
            table_type: TableType::MergeOnRead,
            record_key_fields: vec!["id".into()],
            partition_fields: vec![],
            ordering_field: ordering.map(String::from),
            hive_style: true,
            inline_compaction: None,
            table_version: 6,
            global_index: false,
            meta_fields: true,
            keygen_options: Default::default(),
            url_encode: true,
        };
        Table::create(dir.join("t").to_str().unwrap(), TableOptions::default(), create, schema()).await.unwrap()
    }

    async fn write(t: &mut Table, op: WriteOperation, rows: &[(i64, Option<i64>, &str)]) {
        t.write(op, vec![batch(rows)], &WriteConfig::default()).await.unwrap();
    }

    /// The `(id, ts, v)` of every row, sorted; fails on a key returned twice.
    fn rows_of(batches: &[RecordBatch]) -> Vec<Row> {
        let mut out = Vec::new();
        for b in batches {
            let id = b.column_by_name("id").unwrap().as_any().downcast_ref::<Int64Array>().unwrap();
            let ts = b.column_by_name("ts").unwrap().as_any().downcast_ref::<Int64Array>().unwrap();
            let v = b.column_by_name("v").unwrap().as_any().downcast_ref::<StringArray>().unwrap();
            for i in 0..b.num_rows() {
                out.push((id.value(i), ts.is_valid(i).then(|| ts.value(i)), v.value(i).to_string()));
            }
        }
        out.sort();
        let twice: Vec<&Row> = out.windows(2).filter(|w| w[0].0 == w[1].0).map(|w| &w[1]).collect();
        assert!(twice.is_empty(), "keys returned twice: {:?}", &twice[..twice.len().min(5)]);
        out
    }

    async fn scan(t: &Table, opts: &ScanOptions) -> Vec<Row> {
        let batches: Vec<RecordBatch> = t.scan(opts).await.unwrap().try_collect().await.unwrap();
        rows_of(&batches)
    }

    fn row(id: i64, ts: i64, v: &str) -> Row {
        (id, Some(ts), v.to_string())
    }

    /// The slices of the latest snapshot that have log files (what the merge node reads).
    async fn slices_with_logs(t: &Table) -> Vec<crate::read::PlannedSlice> {
        let plan = t.plan_scan(&ScanOptions::default()).await.unwrap();
        plan.slices.into_iter().filter(|s| !s.logs.is_empty()).collect()
    }

    #[tokio::test]
    async fn event_time_keeps_the_greatest_ordering_value_and_applies_deletes() {
        let dir = tempfile::tempdir().unwrap();
        let mut t = table(dir.path(), Some("ts")).await;
        let base: Vec<(i64, Option<i64>, &str)> = vec![
            (1, Some(10), "a1"),
            (2, Some(10), "a2"),
            (3, Some(10), "a3"),
            (4, Some(10), "a4"),
            (5, Some(10), "a5"),
        ];
        write(&mut t, WriteOperation::Insert, &[base.as_slice(), &[(7, Some(10), "a7")]].concat()).await;
        // 1: a lower ordering value loses; 2: an equal one wins; 3: a higher one wins, and a later
        // log version with a lower value than the earlier log version loses to it.
        write(
            &mut t,
            WriteOperation::Upsert,
            &[(1, Some(9), "lower"), (2, Some(10), "equal"), (3, Some(11), "higher")],
        )
        .await;
        write(&mut t, WriteOperation::Upsert, &[(3, Some(10), "later-lower")]).await;
        // 4: a delete without an ordering value removes the key; 5: one with a lower value loses.
        write(&mut t, WriteOperation::Delete, &[(4, None, "x"), (5, Some(9), "x")]).await;
        // 6: a key new to the table.
        write(&mut t, WriteOperation::Upsert, &[(6, Some(1), "new")]).await;
        assert!(!slices_with_logs(&t).await.is_empty(), "the upserts went to log files");
        let expected = vec![
            row(1, 10, "a1"),
            row(2, 10, "equal"),
            row(3, 11, "higher"),
            row(5, 10, "a5"),
            row(6, 1, "new"),
            row(7, 10, "a7"), // untouched by the logs: passes through
        ];
        assert_eq!(scan(&t, &ScanOptions::default()).await, expected);
        // A later version with a greater value still wins over one that lost before.
        write(&mut t, WriteOperation::Upsert, &[(1, Some(12), "higher-later")]).await;
        let rows = scan(&t, &ScanOptions::default()).await;
        assert_eq!(rows[0], row(1, 12, "higher-later"));
        assert_eq!(rows[1..], expected[1..]);
    }

    #[tokio::test]
    async fn commit_time_ordering_lets_the_latest_commit_win() {
        let dir = tempfile::tempdir().unwrap();
        let mut t = table(dir.path(), None).await;
        write(&mut t, WriteOperation::Insert, &[(1, Some(10), "a1"), (2, Some(10), "a2"), (3, Some(10), "a3")]).await;
        write(&mut t, WriteOperation::Insert, &[(4, Some(10), "a4")]).await;
        // The ordering column is just data: lower values win when they come later.
        write(&mut t, WriteOperation::Upsert, &[(1, Some(5), "second")]).await;
        write(&mut t, WriteOperation::Upsert, &[(1, Some(0), "third")]).await;
        write(&mut t, WriteOperation::Delete, &[(2, Some(99), "x"), (4, Some(99), "x")]).await;
        // A write after a delete brings the key back.
        write(&mut t, WriteOperation::Upsert, &[(4, Some(1), "back")]).await;
        assert!(!slices_with_logs(&t).await.is_empty(), "the upserts went to log files");
        assert_eq!(
            scan(&t, &ScanOptions::default()).await,
            vec![row(1, 0, "third"), row(3, 10, "a3"), row(4, 1, "back")]
        );
    }

    #[tokio::test]
    async fn a_log_only_slice_returns_the_latest_log_versions() {
        let dir = tempfile::tempdir().unwrap();
        let mut t = table(dir.path(), Some("ts")).await;
        write(&mut t, WriteOperation::Insert, &[(1, Some(10), "a1"), (2, Some(10), "a2"), (3, Some(10), "a3")]).await;
        write(&mut t, WriteOperation::Upsert, &[(1, Some(9), "lower"), (2, Some(11), "b2")]).await;
        write(&mut t, WriteOperation::Upsert, &[(2, Some(10), "c2"), (1, Some(9), "equal")]).await;
        write(&mut t, WriteOperation::Delete, &[(3, None, "x")]).await;
        let slices = slices_with_logs(&t).await;
        assert_eq!(slices.len(), 1);
        let upper = t.plan_scan(&ScanOptions::default()).await.unwrap().upper;
        // The slice's logs alone, as a slice without a base file: keys that live only in the logs.
        let s = &slices[0];
        let scan = SliceScan {
            partition: s.partition.clone(),
            file_id: s.file_id.clone(),
            base: None,
            rows: None,
            logs: s.logs.clone(),
            keys_of: None,
        };
        let exec = MergeOnReadExec::try_new(vec![vec![scan]], MergeContext::all_columns(&t, &upper).unwrap()).unwrap();
        let session = crate::read::session(&t, Some(1), None).unwrap();
        let batches = datafusion::physical_plan::collect(Arc::new(exec), session.task_ctx()).await.unwrap();
        // 1: the later of two equal values; 2: the greater value; 3: only a delete, no row.
        assert_eq!(rows_of(&batches), vec![row(1, 9, "equal"), row(2, 11, "b2")]);
    }

    #[test]
    fn log_rows_are_dropped_only_where_the_key_predicate_is_false() {
        let schema = Arc::new(Schema::new(vec![Field::new("id", DataType::Int64, true)]));
        let ids = Arc::new(Int64Array::from(vec![Some(1), None, Some(0), Some(3)])) as ArrayRef;
        let batch = RecordBatch::try_new(schema.clone(), vec![ids]).unwrap();
        let session = datafusion::prelude::SessionContext::new();
        let df_schema = schema.clone().to_dfschema().unwrap();
        let physical = |e| session.create_physical_expr(e, &df_schema).unwrap();
        let kept =
            |b: RecordBatch| b.column(0).as_any().downcast_ref::<Int64Array>().unwrap().iter().collect::<Vec<_>>();
        // A null key (a block without the column) cannot be told: it stays for the merge.
        let equal = physical(datafusion::prelude::col("id").eq(lit(1i64)));
        assert_eq!(kept(not_false(&batch, &equal).unwrap()), vec![Some(1), None]);
        // A predicate that fails on a row (division by zero) keeps the whole batch.
        let failing = physical((lit(100i64) / datafusion::prelude::col("id")).gt(lit(3i64)));
        assert!(failing.evaluate(&batch).is_err(), "the predicate fails on id 0");
        assert_eq!(not_false(&batch, &failing).unwrap().num_rows(), 4);
    }

    #[tokio::test]
    async fn a_log_side_over_the_memory_budget_is_merged_in_passes_to_the_same_rows() {
        const N: i64 = 3000;
        const BUDGET: usize = 128 << 10;
        let dir = tempfile::tempdir().unwrap();
        let mut t = table(dir.path(), Some("ts")).await;
        let pad = "x".repeat(200);
        let base: Vec<(i64, Option<i64>, String)> = (0..N).map(|i| (i, Some(10), format!("base-{i}-{pad}"))).collect();
        let as_batch = |rows: &[(i64, Option<i64>, String)]| {
            let r: Vec<(i64, Option<i64>, &str)> = rows.iter().map(|(a, b, c)| (*a, *b, c.as_str())).collect();
            batch(&r)
        };
        t.write(WriteOperation::Insert, vec![as_batch(&base)], &WriteConfig::default()).await.unwrap();
        // Every even key updated (odd ones with a losing ordering value), every tenth deleted.
        let updates: Vec<(i64, Option<i64>, String)> =
            (0..N).map(|i| (i, Some(if i % 2 == 0 { 11 } else { 9 }), format!("log-{i}-{pad}"))).collect();
        t.write(WriteOperation::Upsert, vec![as_batch(&updates)], &WriteConfig::default()).await.unwrap();
        let deletes: Vec<(i64, Option<i64>, String)> = (0..N).step_by(10).map(|i| (i, None, String::new())).collect();
        t.write(WriteOperation::Delete, vec![as_batch(&deletes)], &WriteConfig::default()).await.unwrap();

        // Even keys updated, odd ones kept, every tenth gone.
        let expected: Vec<Row> = (0..N)
            .filter(|i| i % 10 != 0)
            .map(|i| match i % 2 {
                0 => row(i, 11, &format!("log-{i}-{pad}")),
                _ => row(i, 10, &format!("base-{i}-{pad}")),
            })
            .collect();

        // The log side of the slice holds several times the budget (the only consumer of the pool).
        let slices = slices_with_logs(&t).await;
        assert_eq!(slices.len(), 1);
        let plan = t.plan_scan(&ScanOptions::default()).await.unwrap();
        let ctx = MergeContext::all_columns(&t, &plan.upper).unwrap();
        let contents =
            log::read_slice(&ctx.storage, &slices[0].logs, &ctx.table_schema, &ctx.admission, None).await.unwrap();
        let scanned = Arc::new(ctx.table_schema.project(&ctx.scan_columns).unwrap());
        let mut side = LogSide::new(ctx.spec.clone(), &scanned).unwrap();
        for c in contents {
            side.add(c, &|b| Ok(b.project(&ctx.scan_columns)?)).unwrap();
        }
        assert!(side.memory_size() > 4 * BUDGET, "log side of {} bytes", side.memory_size());

        // The node itself, with batches large enough to hold the base file whole: one pass streams
        // the base once (its kept rows and its replaced ones, two batches); more passes stream it again.
        let slice = SliceScan {
            partition: slices[0].partition.clone(),
            file_id: slices[0].file_id.clone(),
            base: slices[0].base.as_ref().map(|b| (b.path.clone(), b.size)),
            rows: None,
            logs: slices[0].logs.clone(),
            keys_of: None,
        };
        let mut outputs = Vec::new();
        for limit in [None, Some(BUDGET)] {
            let exec = MergeOnReadExec::try_new(vec![vec![slice.clone()]], ctx.clone()).unwrap();
            let session = crate::read::session(&t, Some(1 << 20), limit).unwrap();
            outputs.push(datafusion::physical_plan::collect(Arc::new(exec), session.task_ctx()).await.unwrap());
        }
        assert_eq!(outputs[0].len(), 2, "one pass");
        assert!(outputs[1].len() >= 4, "several passes: {} batches", outputs[1].len());
        assert_eq!(rows_of(&outputs[0]), expected);
        assert_eq!(rows_of(&outputs[1]), expected);

        // A predicate on the key drops log versions too, as they are decoded: the log side of two
        // keys fits the budget, so the slice merges in one pass (before, it took the passes above).
        let session = crate::read::session(&t, Some(1 << 20), Some(BUDGET)).unwrap();
        let keys = datafusion::prelude::col("id").in_list(vec![lit(4i64), lit(5i64), lit(10i64)], false);
        let predicate = session.create_physical_expr(keys, &ctx.table_schema.clone().to_dfschema().unwrap()).unwrap();
        let keyed = MergeContext { log_predicate: Some(predicate), ..ctx.clone() };
        let exec = MergeOnReadExec::try_new(vec![vec![slice.clone()]], keyed).unwrap();
        let found = datafusion::physical_plan::collect(Arc::new(exec), session.task_ctx()).await.unwrap();
        assert!(found.len() <= 2, "one pass: {} batches", found.len());
        // The predicate prunes base files but does not filter their rows; the scan's filter does.
        let found: Vec<Row> = rows_of(&found).into_iter().filter(|r| [4, 5, 10].contains(&r.0)).collect();
        // 4 updated, 5 kept, 10 deleted.
        assert_eq!(found, vec![row(4, 11, &format!("log-4-{pad}")), row(5, 10, &format!("base-5-{pad}"))]);
        let filter = crate::read::Filter::Sql("id IN (4, 5, 10)".into());
        let bounded = ScanOptions { memory_limit: Some(BUDGET), filter: Some(filter), ..ScanOptions::default() };
        assert_eq!(scan(&t, &bounded).await, found);

        // The same through a whole scan.
        let unbounded = scan(&t, &ScanOptions::default()).await;
        assert_eq!(unbounded, expected);
        let bounded = scan(&t, &ScanOptions { memory_limit: Some(BUDGET), ..ScanOptions::default() }).await;
        assert_eq!(bounded, expected);
        // Small batches too: the passes' base and log batches are split further.
        let small = ScanOptions { memory_limit: Some(BUDGET), batch_size: Some(100), ..ScanOptions::default() };
        assert_eq!(scan(&t, &small).await, expected);
    }

    /// A file group of one large base file and logs, read as the parts a split cuts it into (each
    /// part merges the logs over its rows; the first also returns the logs' inserts): together the
    /// same rows as the whole slice, every key once, with filters and in passes too.
    #[tokio::test]
    async fn parts_of_a_slice_cut_by_rows_merge_to_the_whole_slice() {
        let dir = tempfile::tempdir().unwrap();
        let mut t = table(dir.path(), Some("ts")).await;
        let n = 30_000i64;
        let names: Vec<String> = (0..n + 40).map(|i| format!("base-{i}")).collect();
        let base: Vec<(i64, Option<i64>, &str)> =
            (0..n + 40).map(|i| (i, Some(10), names[i as usize].as_str())).collect();
        // Two file groups: a large one, and a small one whose keys the large one's base lacks.
        write(&mut t, WriteOperation::Insert, &base[..n as usize]).await;
        write(&mut t, WriteOperation::Insert, &base[n as usize..]).await;
        let mut expected: BTreeMap<i64, Row> = base.iter().map(|r| (r.0, (r.0, r.1, r.2.to_string()))).collect();
        // Updates that win and lose (event time) over both halves of the large file and its first
        // and last rows, and updates of the small group.
        let mut logs: Vec<(i64, Option<i64>, String)> = Vec::new();
        for i in (0..n + 40).filter(|i| i % 97 == 0 || *i == n - 1 || *i >= n) {
            logs.push((i, Some(11), format!("won-{i}")));
        }
        for i in (0..n).filter(|i| i % 101 == 50) {
            logs.push((i, Some(9), format!("lost-{i}")));
        }
        let upsert: Vec<(i64, Option<i64>, &str)> = logs.iter().map(|(a, b, c)| (*a, *b, c.as_str())).collect();
        write(&mut t, WriteOperation::Upsert, &upsert).await;
        for (i, ts, v) in logs.iter().filter(|r| r.1 >= Some(10)) {
            expected.insert(*i, (*i, *ts, v.clone()));
        }
        let deleted: Vec<(i64, Option<i64>, &str)> =
            (0..n).filter(|i| i % 89 == 3).chain([n + 7, 0]).map(|i| (i, None, "x")).collect();
        write(&mut t, WriteOperation::Delete, &deleted).await;
        for (i, _, _) in &deleted {
            expected.remove(i);
        }
        let expected: Vec<Row> = expected.into_values().collect();
        let slices = slices_with_logs(&t).await;
        assert_eq!(slices.len(), 2, "both groups have logs");
        assert_eq!(scan(&t, &ScanOptions::default()).await, expected);

        // Splits: the large slice cut into parts, read by `scan_split` as a worker reads them.
        let filter = crate::read::Filter::Sql("id >= 29000".into());
        let filtered: Vec<Row> = expected.iter().filter(|r| r.0 >= 29_000).cloned().collect();
        for pieces in [2usize, 3] {
            let splits = t.plan_splits(&ScanOptions::default(), u64::MAX, pieces).await.unwrap();
            assert!(splits.len() >= pieces, "the large slice cut: {} splits for {pieces}", splits.len());
            for opts in [
                ScanOptions::default(),
                // Passes: the log side over a tiny budget.
                ScanOptions { memory_limit: Some(16 << 10), batch_size: Some(1000), ..ScanOptions::default() },
                ScanOptions { filter: Some(filter.clone()), ..ScanOptions::default() },
            ] {
                let mut batches = Vec::new();
                for split in &splits {
                    let stream = t.scan_split(split.clone(), &opts).await.unwrap();
                    batches.extend(stream.try_collect::<Vec<_>>().await.unwrap());
                }
                let want = if opts.filter.is_some() { &filtered } else { &expected };
                assert_eq!(&rows_of(&batches), want, "{pieces} parts, {opts:?}");
            }
        }

        // The node: the large base with both groups' logs, so that the logs hold keys its base
        // lacks (inserts, as Apache Hudi's writers put in logs); cut anywhere, the parts give the
        // whole slice's rows.
        let (large, small) = match slices[0].base.as_ref().unwrap().size > slices[1].base.as_ref().unwrap().size {
            true => (&slices[0], &slices[1]),
            false => (&slices[1], &slices[0]),
        };
        let upper = t.plan_scan(&ScanOptions::default()).await.unwrap().upper;
        let ctx = MergeContext::all_columns(&t, &upper).unwrap();
        let file = large.base.as_ref().unwrap();
        let total = t.storage().parquet_rows(&file.path, file.size).await.unwrap();
        let slice = |rows: Option<RowRange>| SliceScan {
            partition: large.partition.clone(),
            file_id: large.file_id.clone(),
            base: Some((file.path.clone(), file.size)),
            rows,
            logs: large.logs.iter().chain(&small.logs).cloned().collect(),
            keys_of: None,
        };
        let read = |slices: Vec<SliceScan>, limit: Option<usize>| {
            let exec = MergeOnReadExec::try_new(vec![slices], ctx.clone()).unwrap();
            let session = crate::read::session(&t, Some(1000), limit).unwrap();
            async move { rows_of(&datafusion::physical_plan::collect(Arc::new(exec), session.task_ctx()).await.unwrap()) }
        };
        let whole = read(vec![slice(None)], None).await;
        assert!(whole.iter().any(|r| r.0 == n + 1 && r.2 == format!("won-{}", n + 1)), "a log insert is returned");
        assert!(!whole.iter().any(|r| r.0 == n + 7), "a deleted log insert is not");
        for cuts in [vec![0, total], vec![0, 1, total], vec![0, 7_777, 15_000, total - 1, total]] {
            let parts: Vec<SliceScan> =
                cuts.windows(2).map(|w| slice(Some(RowRange { start: w[0], end: w[1], total }))).collect();
            assert_eq!(read(parts.clone(), None).await, whole, "cut at {cuts:?}");
            assert_eq!(read(parts, Some(16 << 10)).await, whole, "cut at {cuts:?}, in passes");
        }
    }
}
