//! A table's snapshot as a [`TableProvider`] for another DataFusion session: datafusion-python's
//! `SessionContext`, which reaches it through DataFusion's FFI (`__datafusion_table_provider__`).
//!
//! That session has its own object stores, memory pool and options, none of which know the
//! table's store (an S3 bucket with the table's credentials). So the provider plans with oxlake's
//! own session, whatever session asks, and hands back a plan that runs with oxlake's own task
//! context: the asking session's projection, filters (partition and row-group pruning, the
//! merge-on-read merge) and limit go into oxlake's plan, and DataFusion applies the filters above.

use std::fmt;
use std::sync::Arc;

use async_trait::async_trait;
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::catalog::Session;
use datafusion::common::Result as DfResult;
use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::datasource::{TableProvider, TableType};
use datafusion::execution::context::SessionContext;
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::logical_expr::{Expr, TableProviderFilterPushDown};
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{DisplayAs, DisplayFormatType, ExecutionPlan, PlanProperties};

use super::named::name_failures;
use super::provider::HudiTableProvider;
use super::{ScanOptions, base_files, session};
use crate::error::Result;
use crate::storage::Storage;
use crate::table::Table;

/// The snapshot a scan of `opts` reads, planned once, served to foreign sessions.
pub struct ForeignProvider {
    inner: HudiTableProvider,
    ctx: SessionContext,
    storage: Storage,
    /// The base files of the snapshot, to name the one behind a failure that does not say.
    bases: Arc<Vec<(String, u64)>>,
}

impl fmt::Debug for ForeignProvider {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ForeignProvider").finish_non_exhaustive()
    }
}

impl Table {
    /// The snapshot (or read-optimized) query of `opts`, planned now, as a provider another
    /// DataFusion session can scan (see the module docs). Later commits are not seen.
    pub async fn foreign_provider(&self, opts: &ScanOptions) -> Result<ForeignProvider> {
        let plan = self.plan_snapshot(opts, "a table provider").await?;
        let as_of = self.read_as(&plan).await?;
        let table = as_of.as_ref().unwrap_or(self);
        Ok(ForeignProvider {
            bases: Arc::new(base_files(&plan).collect()),
            inner: HudiTableProvider::try_new(table, plan)?,
            ctx: session(self, opts.batch_size, opts.memory_limit)?,
            storage: self.storage().clone(),
        })
    }
}

#[async_trait]
impl TableProvider for ForeignProvider {
    fn schema(&self) -> SchemaRef {
        self.inner.schema()
    }

    fn table_type(&self) -> TableType {
        TableType::Base
    }

    fn supports_filters_pushdown(&self, filters: &[&Expr]) -> DfResult<Vec<TableProviderFilterPushDown>> {
        self.inner.supports_filters_pushdown(filters)
    }

    async fn scan(
        &self,
        _asking: &dyn Session,
        projection: Option<&Vec<usize>>,
        filters: &[Expr],
        limit: Option<usize>,
    ) -> DfResult<Arc<dyn ExecutionPlan>> {
        let state = self.ctx.state();
        let plan = self.inner.scan(&state, projection, filters, limit).await?;
        Ok(Arc::new(OwnContextExec {
            properties: plan.properties().clone(),
            plan,
            task: self.ctx.task_ctx(),
            storage: self.storage.clone(),
            bases: self.bases.clone(),
        }))
    }
}

/// A plan run with the task context it was planned for, whatever context executes it. A leaf to
/// the asking session, whose optimizer must not rewrite what it cannot run.
#[derive(Debug)]
struct OwnContextExec {
    plan: Arc<dyn ExecutionPlan>,
    properties: Arc<PlanProperties>,
    task: Arc<TaskContext>,
    storage: Storage,
    bases: Arc<Vec<(String, u64)>>,
}

impl DisplayAs for OwnContextExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "OxlakeScan")
    }
}

impl ExecutionPlan for OwnContextExec {
    fn name(&self) -> &str {
        "OxlakeScan"
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        &self.properties
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![]
    }

    fn with_new_children(self: Arc<Self>, _children: Vec<Arc<dyn ExecutionPlan>>) -> DfResult<Arc<dyn ExecutionPlan>> {
        Ok(self)
    }

    fn apply_expressions(
        &self,
        _f: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> DfResult<TreeNodeRecursion>,
    ) -> DfResult<TreeNodeRecursion> {
        // Its expressions are oxlake's, not the asking session's to rewrite.
        Ok(TreeNodeRecursion::Continue)
    }

    fn execute(&self, partition: usize, _asking: Arc<TaskContext>) -> DfResult<SendableRecordBatchStream> {
        let stream = self.plan.execute(partition, self.task.clone())?;
        let schema = stream.schema();
        let named = name_failures(stream, self.storage.clone(), self.bases.as_ref().clone());
        Ok(Box::pin(RecordBatchStreamAdapter::new(schema, named)))
    }
}
