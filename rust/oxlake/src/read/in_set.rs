//! `column IN (v1, ..., vn)` for long lists, as a set lookup.
//!
//! DataFusion keeps an `IN` list as one literal expression per value, and its optimizer passes
//! and physical planning copy the list and rebuild its hash set many times: a filter naming
//! 150,000 keys spent half a second in planning before reading a byte. A long list becomes a
//! scalar function holding the values once, as a hash set of their row encoding, shared by
//! every copy of the expression. Statistics still prune: a list also bounds the column by its
//! smallest and largest value (DataFusion's own pruning ignores lists longer than 20).

use std::hash::{Hash, Hasher};
use std::sync::Arc;

use arrow::array::{Array, ArrayRef, BooleanArray, StringArray};
use arrow::compute::{cast, max_string, min_string};
use arrow::datatypes::DataType;
use arrow::row::{RowConverter, SortField};
use datafusion::common::{Result as DfResult, ScalarValue};
use datafusion::logical_expr::{
    ColumnarValue, Expr, ScalarFunctionArgs, ScalarUDF, ScalarUDFImpl, Signature, Volatility, lit,
};
use hashbrown::HashSet;

/// Lists longer than this become a set lookup (DataFusion prunes by lists up to 20 values).
pub(crate) const LONG_LIST: usize = 20;

/// `col IN (values)` (or `NOT IN`) as a set lookup, bounded by the values' range when not
/// negated; `None` when the values do not cast to `data_type` (the caller keeps the plain list,
/// whose coercion reports the error).
pub(crate) fn in_set(col: Expr, data_type: &DataType, values: &[ScalarValue], negated: bool) -> Option<Expr> {
    let array = ScalarValue::iter_to_array(values.iter().cloned()).ok()?;
    in_array(col, &cast(&array, data_type).ok()?, negated)
}

/// [`in_set`] of the values of an array of the column's type; `None`, unless negated, when no
/// value bounds the column (none, or every one null).
pub(crate) fn in_array(col: Expr, array: &ArrayRef, negated: bool) -> Option<Expr> {
    let set = ValueSet::new(array).ok()?;
    let has_null = array.null_count() > 0;
    let udf = ScalarUDF::new_from_impl(InSet {
        set: Arc::new(set),
        negated,
        has_null,
        signature: Signature::any(1, Volatility::Immutable),
    });
    let lookup = udf.call(vec![col.clone()]);
    if negated {
        return Some(lookup);
    }
    let (low, high) = bounds(array)?;
    Some(col.clone().gt_eq(lit(low)).and(col.lt_eq(lit(high))).and(lookup))
}

/// The smallest and largest non-null value; `None` when every value is null or they do not
/// compare.
fn bounds(array: &ArrayRef) -> Option<(ScalarValue, ScalarValue)> {
    // Strings, the usual keys, by arrow's kernels: a scalar per value costs an allocation each.
    if let Some(strings) = array.as_any().downcast_ref::<StringArray>() {
        let (low, high) = (min_string(strings)?, max_string(strings)?);
        return Some((ScalarValue::Utf8(Some(low.to_string())), ScalarValue::Utf8(Some(high.to_string()))));
    }
    let mut range: Option<(ScalarValue, ScalarValue)> = None;
    for i in 0..array.len() {
        if array.is_null(i) {
            continue;
        }
        let v = ScalarValue::try_from_array(array, i).ok()?;
        range = Some(match range {
            None => (v.clone(), v),
            Some((low, high)) => {
                let low = if v.partial_cmp(&low)?.is_lt() { v.clone() } else { low };
                let high = if v.partial_cmp(&high)?.is_gt() { v } else { high };
                (low, high)
            }
        });
    }
    range
}

/// Values of one type, as the set of their row encodings.
#[derive(Debug)]
struct ValueSet {
    data_type: DataType,
    converter: RowConverter,
    rows: HashSet<Box<[u8]>>,
}

impl ValueSet {
    fn new(values: &ArrayRef) -> DfResult<Self> {
        let converter = RowConverter::new(vec![SortField::new(values.data_type().clone())])?;
        let encoded = converter.convert_columns(std::slice::from_ref(values))?;
        let rows =
            (0..values.len()).filter(|&i| values.is_valid(i)).map(|i| Box::from(encoded.row(i).as_ref())).collect();
        Ok(Self { data_type: values.data_type().clone(), converter, rows })
    }

    /// For each value of `column`: null when null, else whether the set holds it.
    fn contains(&self, column: &ArrayRef) -> DfResult<BooleanArray> {
        let column =
            if column.data_type() == &self.data_type { column.clone() } else { cast(column, &self.data_type)? };
        let encoded = self.converter.convert_columns(std::slice::from_ref(&column))?;
        Ok((0..column.len()).map(|i| column.is_valid(i).then(|| self.rows.contains(encoded.row(i).as_ref()))).collect())
    }
}

/// The scalar function: `in_set(col)` is `col IN (the values)`, with SQL's nulls (a null
/// column value, or no match in a list holding a null, gives null).
#[derive(Debug)]
struct InSet {
    set: Arc<ValueSet>,
    negated: bool,
    has_null: bool,
    signature: Signature,
}

impl PartialEq for InSet {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.set, &other.set) && self.negated == other.negated
    }
}

impl Eq for InSet {}

impl Hash for InSet {
    fn hash<H: Hasher>(&self, state: &mut H) {
        Arc::as_ptr(&self.set).hash(state);
        self.negated.hash(state);
    }
}

impl ScalarUDFImpl for InSet {
    fn name(&self) -> &str {
        if self.negated { "oxlake_not_in_set" } else { "oxlake_in_set" }
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, _arg_types: &[DataType]) -> DfResult<DataType> {
        Ok(DataType::Boolean)
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> DfResult<ColumnarValue> {
        let column = match args.args.into_iter().next() {
            Some(ColumnarValue::Array(a)) => a,
            Some(ColumnarValue::Scalar(s)) => s.to_array_of_size(args.number_rows)?,
            None => return Err(datafusion::error::DataFusionError::Internal("in_set takes one argument".into())),
        };
        let found = self.set.contains(&column)?;
        let out: BooleanArray = found
            .iter()
            .map(|v| match v {
                None => None,
                Some(true) => Some(!self.negated),
                Some(false) if self.has_null => None,
                Some(false) => Some(self.negated),
            })
            .collect();
        Ok(ColumnarValue::Array(Arc::new(out)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::{Int64Array, StringArray};
    use proptest::prelude::*;

    fn eval(values: &[ScalarValue], column: ArrayRef, negated: bool) -> Vec<Option<bool>> {
        let array = cast(&ScalarValue::iter_to_array(values.iter().cloned()).unwrap(), column.data_type()).unwrap();
        let set = ValueSet::new(&array).unwrap();
        let udf = InSet {
            set: Arc::new(set),
            negated,
            has_null: array.null_count() > 0,
            signature: Signature::any(1, Volatility::Immutable),
        };
        let rows = column.len();
        let field = Arc::new(arrow::datatypes::Field::new("c", column.data_type().clone(), true));
        let args = ScalarFunctionArgs {
            args: vec![ColumnarValue::Array(column)],
            arg_fields: vec![field],
            number_rows: rows,
            return_field: Arc::new(arrow::datatypes::Field::new("r", DataType::Boolean, true)),
            config_options: Default::default(),
        };
        let ColumnarValue::Array(out) = udf.invoke_with_args(args).unwrap() else { panic!("an array") };
        out.as_any().downcast_ref::<BooleanArray>().unwrap().iter().collect()
    }

    #[test]
    fn sql_nulls() {
        let column: ArrayRef = Arc::new(Int64Array::from(vec![Some(1), Some(2), None]));
        let plain = [ScalarValue::Int64(Some(1)), ScalarValue::Int64(Some(3))];
        assert_eq!(eval(&plain, column.clone(), false), vec![Some(true), Some(false), None]);
        assert_eq!(eval(&plain, column.clone(), true), vec![Some(false), Some(true), None]);
        let with_null = [ScalarValue::Int64(Some(1)), ScalarValue::Int64(None)];
        assert_eq!(eval(&with_null, column.clone(), false), vec![Some(true), None, None]);
        assert_eq!(eval(&with_null, column, true), vec![Some(false), None, None]);
    }

    #[test]
    fn values_cast_to_the_column_type() {
        // Python integers arrive as Int64; the column may be Int32 (or strings compared as such).
        let column: ArrayRef = Arc::new(arrow::array::Int32Array::from(vec![5, 6, 7]));
        let values = [ScalarValue::Int64(Some(7)), ScalarValue::Int64(Some(5))];
        assert_eq!(eval(&values, column, false), vec![Some(true), Some(false), Some(true)]);
        let expr = in_set(datafusion::prelude::col("c"), &DataType::Int32, &values, false).unwrap();
        // Bounded by the range of the values, so that statistics prune.
        let shown = expr.to_string();
        assert!(shown.contains("c >= Int32(5)") && shown.contains("c <= Int32(7)"), "{shown}");
    }

    proptest! {
        /// The set lookup answers as membership in the list does.
        #[test]
        fn answers_as_the_list(values in proptest::collection::vec("[a-d]{0,3}", 1..40),
                               column in proptest::collection::vec("[a-d]{0,3}", 0..60)) {
            let scalars: Vec<ScalarValue> = values.iter().map(|v| ScalarValue::Utf8(Some(v.clone()))).collect();
            let array: ArrayRef = Arc::new(StringArray::from_iter_values(column.iter()));
            let got = eval(&scalars, array, false);
            let want: Vec<Option<bool>> = column.iter().map(|c| Some(values.contains(c))).collect();
            prop_assert_eq!(got, want);
        }
    }
}
