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

use std::collections::VecDeque;
use std::fmt;
use std::sync::Arc;

use arrow::array::{Array, BooleanArray, RecordBatch, StringArray};
use arrow::compute::filter_record_batch;
use arrow::datatypes::SchemaRef;
use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::datasource::physical_plan::{FileScanConfigBuilder, ParquetSource};
use datafusion::datasource::source::DataSourceExec;
use datafusion::error::Result as DfResult;
use datafusion::execution::memory_pool::{MemoryConsumer, MemoryReservation};
use datafusion::execution::object_store::ObjectStoreUrl;
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::physical_expr::{EquivalenceProperties, PhysicalExpr};
use datafusion::physical_plan::execution_plan::{Boundedness, EmissionType};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{DisplayAs, DisplayFormatType, ExecutionPlan, Partitioning, PlanProperties};
use futures::{FutureExt, StreamExt};

use super::merge::{LogSide, MergeSpec};
use crate::error::{Error, Result};
use crate::format::log_block::DeleteRecord;
use crate::log::{self, Admission, LogContent};
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
    /// The slice's log files.
    pub logs: Vec<LogFile>,
}

impl SliceScan {
    /// Bytes of the slice's files, for balancing.
    pub fn size(&self) -> u64 {
        self.base.as_ref().map_or(0, |b| b.1) + self.logs.iter().map(|l| l.size).sum::<u64>()
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
    /// A predicate on key and partition columns only, safe below the merge.
    pub base_predicate: Option<Arc<dyn PhysicalExpr>>,
    /// Options of the Parquet reader of base files.
    pub parquet_options: datafusion::config::TableParquetOptions,
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
            parquet_options,
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
                        let batch = in_pass(&batch, self.ctx.spec.key, cur.pass)?;
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
                cur.rest = Some(cur.log.remaining(self.task.session_config().batch_size())?.into());
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

    /// Opens a slice with `passes` passes, doubling them while the pool refuses the log side.
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
        let ctx = &self.ctx;
        let scanned = Arc::new(ctx.table_schema.project(&ctx.scan_columns)?);
        let mut log = LogSide::new(ctx.spec.clone(), &scanned)?;
        let contents = log::read_slice(&ctx.storage, &slice.logs, &ctx.table_schema, &ctx.admission).await?;
        let key = ctx.spec.key;
        let project = |b: &RecordBatch| -> Result<RecordBatch> { in_pass(&b.project(&ctx.scan_columns)?, key, pass) };
        for content in contents {
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
            self.reservation.try_grow(added)?;
        }
        let base = match &slice.base {
            Some((path, size)) => Some(self.base_stream(path, *size)?),
            None => None,
        };
        Ok(SliceState { slice, pass, log, base, merged: VecDeque::new(), rest: None })
    }

    /// The Parquet scan of a base file: projected, with the key-only predicate pushed down.
    fn base_stream(&self, path: &str, size: u64) -> Result<SendableRecordBatchStream> {
        let ctx = &self.ctx;
        let mut source =
            ParquetSource::new(ctx.table_schema.clone()).with_table_parquet_options(ctx.parquet_options.clone());
        if let Some(p) = &ctx.base_predicate {
            source = source.with_predicate(p.clone());
        }
        let config = FileScanConfigBuilder::new(ctx.store_url.clone(), Arc::new(source))
            .with_file(super::provider::partitioned_file(&ctx.storage, path, size))
            .with_projection_indices(Some(ctx.scan_columns.clone()))?
            .build();
        let exec = DataSourceExec::from_data_source(config);
        Ok(exec.execute(0, self.task.clone())?)
    }
}

/// The pass of a key (a stable hash, so that the base and the logs agree).
fn key_pass(key: &str, passes: u32) -> u32 {
    crc32fast::hash(key.as_bytes()) % passes
}

/// The rows of `batch` whose key belongs to `pass` (all rows with one pass).
fn in_pass(batch: &RecordBatch, key: usize, (pass, passes): (u32, u32)) -> Result<RecordBatch> {
    if passes <= 1 {
        return Ok(batch.clone());
    }
    let keys = batch
        .column(key)
        .as_any()
        .downcast_ref::<StringArray>()
        .ok_or_else(|| Error::invalid_data("the record key column is not a string"))?;
    // Rows without a key (append-only tables) all go to the first pass.
    let mask: BooleanArray = (0..keys.len())
        .map(|i| Some(if keys.is_valid(i) { key_pass(keys.value(i), passes) == pass } else { pass == 0 }))
        .collect();
    Ok(filter_record_batch(batch, &mask)?)
}
