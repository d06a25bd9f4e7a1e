//! Base files written under an older schema, read as the query's schema.
//!
//! DataFusion's expression adapter rewrites each column reference of a Parquet scan to the file's
//! own column, cast to the query's type: promotions, and structs and lists field by field by name.
//! It does not cast maps, so a map whose values gained a struct field since a file was written
//! could not be read from that file. [`EvolvedFiles`] hands such columns (any column holding a map
//! whose type changed) to oxlake's own projection, [`crate::schema::evolve::project`], which the
//! merge-on-read reader already applies to log blocks, and leaves every other expression to
//! DataFusion's adapter.

use std::fmt;
use std::sync::Arc;

use arrow::array::RecordBatch;
use arrow::datatypes::{DataType, FieldRef, Schema, SchemaRef};
use datafusion::common::tree_node::{Transformed, TransformedResult, TreeNode, TreeNodeRecursion};
use datafusion::common::{DataFusionError, Result as DfResult};
use datafusion::logical_expr::ColumnarValue;
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_expr::expressions::Column;
use datafusion::physical_expr_adapter::{
    DefaultPhysicalExprAdapterFactory, PhysicalExprAdapter, PhysicalExprAdapterFactory,
};

/// Adapts the expressions of a scan to each file's schema (see the module docs).
#[derive(Debug)]
pub(crate) struct EvolvedFiles;

impl PhysicalExprAdapterFactory for EvolvedFiles {
    fn create(&self, logical: SchemaRef, physical: SchemaRef) -> DfResult<Arc<dyn PhysicalExprAdapter>> {
        let default = DefaultPhysicalExprAdapterFactory.create(logical.clone(), physical.clone())?;
        Ok(Arc::new(EvolvedAdapter { logical, physical, default }))
    }
}

#[derive(Debug)]
struct EvolvedAdapter {
    logical: SchemaRef,
    physical: SchemaRef,
    default: Arc<dyn PhysicalExprAdapter>,
}

impl EvolvedAdapter {
    /// The file's column and the query's field for a reference to a column holding a map whose
    /// type differs between the two.
    fn evolved_map(&self, expr: &Arc<dyn PhysicalExpr>) -> Option<(Column, FieldRef)> {
        let column = expr.downcast_ref::<Column>()?;
        let to = self.logical.field_with_name(column.name()).ok()?;
        let index = self.physical.index_of(column.name()).ok()?;
        let from = self.physical.field(index).data_type();
        (from != to.data_type() && holds_map(to.data_type()))
            .then(|| (Column::new(column.name(), index), Arc::new(to.clone())))
    }

    fn refers_to_evolved_map(&self, expr: &Arc<dyn PhysicalExpr>) -> bool {
        let mut found = false;
        let _ = expr.apply(|e| {
            found = self.evolved_map(e).is_some();
            Ok(if found { TreeNodeRecursion::Stop } else { TreeNodeRecursion::Continue })
        });
        found
    }
}

impl PhysicalExprAdapter for EvolvedAdapter {
    fn rewrite(&self, expr: Arc<dyn PhysicalExpr>) -> DfResult<Arc<dyn PhysicalExpr>> {
        expr.transform_down(|e| {
            if let Some((column, to)) = self.evolved_map(&e) {
                let projected: Arc<dyn PhysicalExpr> = Arc::new(Projected { input: Arc::new(column), to });
                return Ok(Transformed::new(projected, true, TreeNodeRecursion::Jump));
            }
            if self.refers_to_evolved_map(&e) {
                // Above an evolved map: its other children are adapted on the way down.
                return Ok(Transformed::no(e));
            }
            Ok(Transformed::new(self.default.rewrite(e)?, true, TreeNodeRecursion::Jump))
        })
        .data()
    }
}

/// Whether `t` is or holds a map.
fn holds_map(t: &DataType) -> bool {
    match t {
        DataType::Map(_, _) => true,
        DataType::Struct(fields) => fields.iter().any(|f| holds_map(f.data_type())),
        DataType::List(f) | DataType::LargeList(f) | DataType::FixedSizeList(f, _) => holds_map(f.data_type()),
        _ => false,
    }
}

/// A file's column projected onto the query's type by [`crate::schema::evolve::project`].
#[derive(Debug)]
struct Projected {
    input: Arc<dyn PhysicalExpr>,
    to: FieldRef,
}

impl PartialEq for Projected {
    fn eq(&self, other: &Self) -> bool {
        self.to == other.to && self.input.as_ref() == other.input.as_ref()
    }
}

impl Eq for Projected {}

impl std::hash::Hash for Projected {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.input.hash(state);
        self.to.hash(state);
    }
}

impl fmt::Display for Projected {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "project({} AS {})", self.input, self.to.data_type())
    }
}

impl PhysicalExpr for Projected {
    fn return_field(&self, _input_schema: &Schema) -> DfResult<FieldRef> {
        Ok(self.to.clone())
    }

    fn data_type(&self, _input_schema: &Schema) -> DfResult<DataType> {
        Ok(self.to.data_type().clone())
    }

    fn nullable(&self, _input_schema: &Schema) -> DfResult<bool> {
        Ok(self.to.is_nullable())
    }

    fn evaluate(&self, batch: &RecordBatch) -> DfResult<ColumnarValue> {
        let array = self.input.evaluate(batch)?.into_array(batch.num_rows())?;
        let projected = crate::schema::evolve::project(&array, self.to.data_type(), self.to.name())
            .map_err(|e| DataFusionError::External(Box::new(e)))?;
        Ok(ColumnarValue::Array(projected))
    }

    fn children(&self) -> Vec<&Arc<dyn PhysicalExpr>> {
        vec![&self.input]
    }

    fn with_new_children(self: Arc<Self>, children: Vec<Arc<dyn PhysicalExpr>>) -> DfResult<Arc<dyn PhysicalExpr>> {
        let [input] = <[_; 1]>::try_from(children)
            .map_err(|_| DataFusionError::Internal("a projection takes one input".to_string()))?;
        Ok(Arc::new(Projected { input, to: self.to.clone() }))
    }

    fn fmt_sql(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.to.name())
    }
}
