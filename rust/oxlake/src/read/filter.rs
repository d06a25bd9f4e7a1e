//! User filters: a SQL boolean expression, or a conjunction of `(column, op, value)` predicates.

use arrow::datatypes::DataType;
use datafusion::common::{Column, DFSchema, ScalarValue};
use datafusion::dataframe::DataFrame;
use datafusion::error::{DataFusionError, Result as DfResult};
use datafusion::functions::core::expr_fn::get_field;
use datafusion::logical_expr::{Expr, lit};

use super::in_set;
use crate::error::{Error, Result};

/// A filter on the rows of a scan.
#[derive(Clone, Debug, PartialEq)]
pub enum Filter {
    /// A SQL boolean expression, e.g. `city = 'sf' AND fare > 10`.
    Sql(String),
    /// Predicates that must all hold.
    Predicates(Vec<Predicate>),
}

/// `column op value`.
#[derive(Clone, Debug, PartialEq)]
pub struct Predicate {
    /// Column name.
    pub column: String,
    /// Comparison operator.
    pub op: Op,
    /// One value, or several for `In` and `NotIn`.
    pub values: Vec<ScalarValue>,
}

/// Comparison operators of predicates.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    /// `=`.
    Eq,
    /// `!=`.
    NotEq,
    /// `<`.
    Lt,
    /// `<=`.
    LtEq,
    /// `>`.
    Gt,
    /// `>=`.
    GtEq,
    /// `in`: equal to one of the values.
    In,
    /// `not in`: equal to none of the values.
    NotIn,
}

impl Op {
    /// Parses `=`, `==`, `!=`, `<`, `<=`, `>`, `>=`, `in`, `not in`.
    pub fn parse(s: &str) -> Result<Self> {
        Ok(match s.trim().to_ascii_lowercase().as_str() {
            "=" | "==" => Op::Eq,
            "!=" | "<>" => Op::NotEq,
            "<" => Op::Lt,
            "<=" => Op::LtEq,
            ">" => Op::Gt,
            ">=" => Op::GtEq,
            "in" => Op::In,
            "not in" => Op::NotIn,
            other => return Err(Error::invalid_arg("filter", format!("unknown operator `{other}`"))),
        })
    }
}

impl Filter {
    /// The filter as a DataFusion expression over the columns of `df`.
    pub fn to_expr(&self, df: &DataFrame) -> DfResult<Expr> {
        match self {
            Filter::Sql(sql) => df.parse_sql_expr(sql),
            Filter::Predicates(preds) => {
                let schema = df.schema();
                let mut exprs = Vec::with_capacity(preds.len());
                for p in preds {
                    let Some((col, data_type)) = column_expr(schema, &p.column) else {
                        return Err(DataFusionError::Plan(format!("no column `{}`", p.column)));
                    };
                    exprs.push(p.to_expr(col, &data_type)?);
                }
                Ok(exprs.into_iter().reduce(Expr::and).unwrap_or_else(|| lit(true)))
            }
        }
    }
}

/// Whether `expr` reads a floating-point value (a float column, or a struct, list or map holding
/// one). Parquet statistics, page indexes and bloom filters leave NaN out, while DataFusion orders
/// NaN above every number: pruning by them would drop rows that `x > 5` or `x != 3` hold when `x`
/// is NaN. Scans and index pruning do not prune by statistics for such a filter.
pub fn reads_floats(expr: &Expr, schema: &arrow::datatypes::Schema) -> bool {
    expr.column_refs().iter().any(|c| schema.field_with_name(&c.name).map_or(true, |f| holds_floats(f.data_type())))
}

fn holds_floats(t: &DataType) -> bool {
    match t {
        DataType::Float16 | DataType::Float32 | DataType::Float64 => true,
        DataType::Struct(fields) => fields.iter().any(|f| holds_floats(f.data_type())),
        DataType::List(f) | DataType::LargeList(f) | DataType::FixedSizeList(f, _) | DataType::Map(f, _) => {
            holds_floats(f.data_type())
        }
        DataType::Dictionary(_, v) => holds_floats(v),
        _ => false,
    }
}

/// `options` that do not prune by statistics, page indexes or bloom filters when `floats` (the
/// scan's filters read a floating-point value, see [`reads_floats`]).
pub fn nan_safe(
    mut options: datafusion::config::TableParquetOptions,
    floats: bool,
) -> datafusion::config::TableParquetOptions {
    if floats {
        options.global.pruning = false;
        options.global.enable_page_index = false;
        options.global.bloom_filter_on_read = false;
    }
    options
}

/// A column of a scan by name, and its type: a top-level column (whose name may itself hold
/// dots), else a field inside struct columns named by a dotted path (`customer.tier`, read with
/// `get_field`; the longest top-level name that is a prefix wins). `None`: no such column.
pub fn column_expr(schema: &DFSchema, name: &str) -> Option<(Expr, DataType)> {
    if let Ok(field) = schema.field_with_unqualified_name(name) {
        return Some((Expr::Column(Column::new_unqualified(name)), field.data_type().clone()));
    }
    let parts: Vec<&str> = name.split('.').collect();
    (1..parts.len()).rev().find_map(|cut| {
        let top = parts[..cut].join(".");
        let field = schema.field_with_unqualified_name(&top).ok()?;
        let start = (Expr::Column(Column::new_unqualified(&top)), field.data_type().clone());
        parts[cut..].iter().try_fold(start, |(expr, data_type), part| match &data_type {
            DataType::Struct(children) => {
                let (_, child) = children.find(part)?;
                Some((get_field(expr, *part), child.data_type().clone()))
            }
            _ => None,
        })
    })
}

impl Predicate {
    fn to_expr(&self, col: Expr, data_type: &DataType) -> DfResult<Expr> {
        let one = || {
            self.values
                .first()
                .cloned()
                .map(lit)
                .ok_or_else(|| DataFusionError::Plan(format!("predicate on `{}` has no value", self.column)))
        };
        Ok(match self.op {
            Op::Eq => col.eq(one()?),
            Op::NotEq => col.not_eq(one()?),
            Op::Lt => col.lt(one()?),
            Op::LtEq => col.lt_eq(one()?),
            Op::Gt => col.gt(one()?),
            Op::GtEq => col.gt_eq(one()?),
            Op::In | Op::NotIn => {
                let negated = self.op == Op::NotIn;
                let long = (self.values.len() > in_set::LONG_LIST)
                    .then(|| in_set::in_set(col.clone(), data_type, &self.values, negated))
                    .flatten();
                long.unwrap_or_else(|| col.in_list(self.values.iter().cloned().map(lit).collect(), negated))
            }
        })
    }
}
