//! Schema evolution on write, by Apache Hudi's rules (`AvroSchemaEvolutionUtils.reconcileSchema`,
//! `SchemaChangeUtils.isTypeUpdateAllow`): a write may add nullable columns (at the root or inside
//! structs, list elements and map values) and widen types; it never narrows, drops or changes a
//! column's kind. What a write does is chosen by its [`SchemaMode`].
//!
//! Reads project every file onto the query's schema ([`project`]): columns by name, promoted
//! types cast, columns a file lacks as nulls.

use std::sync::Arc;

use arrow::array::{Array, ArrayRef, AsArray, ListArray, MapArray, StructArray, new_null_array};
use arrow::compute::{CastOptions, cast_with_options};
use arrow::datatypes::{DataType, Field, FieldRef, Fields, Schema, SchemaRef};

use crate::error::{Error, Result};

/// How a write treats an input whose schema differs from the table's.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum SchemaMode {
    /// The table's schema stays: a new column, or a table column missing from the input, is an
    /// error; types are cast to the table's only where every value survives.
    #[default]
    Strict,
    /// The table's schema evolves: new nullable columns are added, types widened by the allowed
    /// promotions ([`promotable`]), table columns missing from the input are null in its rows.
    Merge,
}

impl SchemaMode {
    /// Parses the Python-facing spelling: `strict` or `merge`.
    pub fn parse(s: &str) -> Result<Self> {
        match s {
            "strict" => Ok(SchemaMode::Strict),
            "merge" => Ok(SchemaMode::Merge),
            other => Err(Error::invalid_arg("schema_mode", format!("`{other}`: expected \"strict\" or \"merge\""))),
        }
    }
}

/// Whether a column of type `from` may be widened to `to` (Apache Hudi's promotions: int → long,
/// float, double, string; long → float, double, string; float → double, string; double → string;
/// bytes ↔ string; date → string; decimals whose integer digits and scale both do not shrink).
pub fn promotable(from: &DataType, to: &DataType) -> bool {
    use DataType as D;
    match (from, to) {
        _ if from == to => true,
        (D::Int8, D::Int16) | (D::Int8 | D::Int16, D::Int32) => true,
        (D::Int8 | D::Int16 | D::Int32, D::Int64 | D::Float32 | D::Float64 | D::Utf8) => true,
        (D::Int64, D::Float32 | D::Float64 | D::Utf8) => true,
        (D::Float32, D::Float64 | D::Utf8) | (D::Float64, D::Utf8) => true,
        (D::Binary, D::Utf8) | (D::Utf8, D::Binary) | (D::Date32, D::Utf8) => true,
        (D::Decimal128(p1, s1), D::Decimal128(p2, s2)) => {
            s2 >= s1 && i16::from(*p2) - i16::from(*s2) >= i16::from(*p1) - i16::from(*s1)
        }
        _ => false,
    }
}

/// The schema a write of `incoming` (normalized, no meta fields) leaves the table with, given the
/// table's `table` schema. `fixed`: columns whose type may not change (record key and partition
/// columns: their text names records and folders). Refusals are [`Error::SchemaMismatch`]
/// naming the column and both types; nothing is written.
pub fn evolve(table: &SchemaRef, incoming: &Schema, mode: SchemaMode, fixed: &[String]) -> Result<SchemaRef> {
    let incoming: Fields =
        incoming.fields().iter().filter(|f| !crate::schema::is_meta_field(f.name())).cloned().collect();
    let fields = evolve_fields(table.fields(), &incoming, mode, "", fixed)?;
    if &fields == table.fields() {
        return Ok(table.clone());
    }
    Ok(Arc::new(Schema::new_with_metadata(fields, table.metadata().clone())))
}

fn path_of(parent: &str, name: &str) -> String {
    if parent.is_empty() { name.to_string() } else { format!("{parent}.{name}") }
}

fn evolve_fields(
    table: &Fields,
    incoming: &Fields,
    mode: SchemaMode,
    parent: &str,
    fixed: &[String],
) -> Result<Fields> {
    let mut out: Vec<FieldRef> = Vec::with_capacity(table.len());
    for t in table {
        let path = path_of(parent, t.name());
        match incoming.find(t.name()) {
            Some((_, i)) => out.push(Arc::new(evolve_field(t, i, mode, &path, fixed)?)),
            // A record key or partition field left out would key or place every row wrongly
            // (a null partition value puts the row in `__HIVE_DEFAULT_PARTITION__`).
            None if fixed.contains(&path) => {
                return Err(Error::SchemaMismatch {
                    detail: format!(
                        "column `{path}` ({}) is missing from the input: it is a record key or partition field, \
                         which every write gives",
                        t.data_type()
                    ),
                });
            }
            None if mode == SchemaMode::Merge => out.push(t.clone()),
            None => {
                return Err(Error::SchemaMismatch {
                    detail: format!(
                        "column `{path}` ({}) of the table is missing from the input; with \
                         schema_mode=\"merge\" its value in the rows written is null",
                        t.data_type()
                    ),
                });
            }
        }
    }
    for i in incoming {
        if table.find(i.name()).is_some() {
            continue;
        }
        let path = path_of(parent, i.name());
        match mode {
            SchemaMode::Strict => {
                return Err(Error::SchemaMismatch {
                    detail: format!(
                        "column `{path}` ({}) is not in the table schema; schema_mode=\"merge\" adds it",
                        i.data_type()
                    ),
                });
            }
            SchemaMode::Merge if !i.is_nullable() => {
                return Err(Error::SchemaMismatch {
                    detail: format!(
                        "new column `{path}` ({}) is not nullable: rows written before hold no value for it",
                        i.data_type()
                    ),
                });
            }
            SchemaMode::Merge => {
                crate::schema::check_typed(i, parent)?;
                crate::schema::check_avro_names(i, parent)?;
                out.push(Arc::new(crate::schema::normalize_field(i)?))
            }
        }
    }
    Ok(out.into())
}

fn evolve_field(t: &Field, i: &Field, mode: SchemaMode, path: &str, fixed: &[String]) -> Result<Field> {
    let data_type = evolve_type(t.data_type(), i.data_type(), mode, path, fixed)?;
    Ok(t.clone().with_data_type(data_type))
}

fn evolve_type(t: &DataType, i: &DataType, mode: SchemaMode, path: &str, fixed: &[String]) -> Result<DataType> {
    use DataType as D;
    if t == i {
        return Ok(t.clone());
    }
    let refuse = |why: &str| Error::SchemaMismatch {
        detail: format!("column `{path}`: the table holds {t}, the input {i}: {why}"),
    };
    Ok(match (t, i) {
        (D::Struct(tf), D::Struct(inf)) => D::Struct(evolve_fields(tf, inf, mode, path, fixed)?),
        (D::List(tf), D::List(inf)) => {
            D::List(Arc::new(evolve_field(tf, inf, mode, &format!("{path}.element"), fixed)?))
        }
        (D::Map(tf, sorted), D::Map(inf, _)) => {
            let (D::Struct(tk), D::Struct(ik)) = (tf.data_type(), inf.data_type()) else {
                return Err(refuse("a map's entries are not key/value structs"));
            };
            if tk.len() != 2 || ik.len() != 2 || tk[0].data_type() != ik[0].data_type() {
                return Err(refuse("a map's key type never changes"));
            }
            let value = evolve_field(&tk[1], &ik[1], mode, &format!("{path}.value"), fixed)?;
            let entries = D::Struct(vec![tk[0].clone(), Arc::new(value)].into());
            D::Map(Arc::new(tf.as_ref().clone().with_data_type(entries)), *sorted)
        }
        // The input is wider: the table widens (merge), or the values must fit (strict).
        _ if promotable(t, i) => match mode {
            SchemaMode::Merge if fixed.iter().any(|f| f == path) => {
                return Err(refuse("the type of a record key or partition column never changes"));
            }
            SchemaMode::Merge => i.clone(),
            SchemaMode::Strict if crate::schema::same_kind(i, t) => t.clone(),
            SchemaMode::Strict => return Err(refuse("schema_mode=\"merge\" widens the column")),
        },
        // Narrower, or of the same kind: stored in the table's type where every value fits.
        _ if promotable(i, t) || crate::schema::same_kind(i, t) => t.clone(),
        _ => return Err(refuse("not a type promotion Apache Hudi allows")),
    })
}

/// `array` (a column of a file written under an older schema) as `to`: structs field by field by
/// name (fields the file lacks as nulls), lists and maps through their items, promoted types cast
/// ([`promotable`]: widening, as Apache Hudi reads them; `long → double` rounds above 2^53 as
/// Java does), other differences cast only where every value survives.
pub fn project(array: &ArrayRef, to: &DataType, column: &str) -> Result<ArrayRef> {
    walk(array, to, column, &|array, to, column| {
        let from = array.data_type();
        if promotable(from, to) {
            let opts = CastOptions { safe: false, ..CastOptions::default() };
            return cast_with_options(array, to, &opts).map_err(|e| Error::SchemaMismatch {
                detail: format!("column `{column}`: cannot read {from} as {to}: {e}"),
            });
        }
        crate::schema::cast_exact(array, to, column)
    })
}

/// The leaf cast of [`walk`]: a column that is not a struct, list or map (or whose nesting differs).
pub(crate) type Leaf<'a> = dyn Fn(&ArrayRef, &DataType, &str) -> Result<ArrayRef> + 'a;

/// `array` as `to`, nested types walked by name and item, `leaf` casting the rest.
pub(crate) fn walk(array: &ArrayRef, to: &DataType, column: &str, leaf: &Leaf<'_>) -> Result<ArrayRef> {
    use DataType as D;
    let from = array.data_type();
    if from == to {
        return Ok(array.clone());
    }
    match (from, to) {
        (D::Struct(_), D::Struct(fields)) => {
            let s = array.as_struct();
            let columns = fields
                .iter()
                .map(|f| match s.column_by_name(f.name()) {
                    Some(c) => walk(c, f.data_type(), &path_of(column, f.name()), leaf),
                    None if f.is_nullable() => Ok(new_null_array(f.data_type(), s.len())),
                    None => Err(Error::SchemaMismatch {
                        detail: format!("required field `{}` is missing", path_of(column, f.name())),
                    }),
                })
                .collect::<Result<Vec<_>>>()?;
            Ok(Arc::new(StructArray::try_new(fields.clone(), columns, s.nulls().cloned())?))
        }
        (D::List(_), D::List(item)) => {
            let l = array.as_list::<i32>();
            let values = walk(l.values(), item.data_type(), column, leaf)?;
            Ok(Arc::new(ListArray::try_new(item.clone(), l.offsets().clone(), values, l.nulls().cloned())?))
        }
        (D::Map(_, _), D::Map(entries, sorted)) => {
            let m = array.as_map();
            let D::Struct(fields) = entries.data_type() else {
                return Err(Error::invalid_data(format!("column `{column}`: map entries are not a struct")));
            };
            let keys = walk(m.keys(), fields[0].data_type(), column, leaf)?;
            let values = walk(m.values(), fields[1].data_type(), column, leaf)?;
            let entries_array = StructArray::try_new(fields.clone(), vec![keys, values], None)?;
            Ok(Arc::new(MapArray::try_new(
                entries.clone(),
                m.offsets().clone(),
                entries_array,
                m.nulls().cloned(),
                *sorted,
            )?))
        }
        _ => leaf(array, to, column),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::{Float64Array, Int32Array, Int64Array, StringArray};
    use arrow::datatypes::DataType as D;

    fn schema(fields: Vec<Field>) -> SchemaRef {
        Arc::new(Schema::new(fields))
    }

    #[test]
    fn promotions_are_apache_hudis() {
        let allowed = [
            (D::Int32, D::Int64),
            (D::Int32, D::Float64),
            (D::Int32, D::Utf8),
            (D::Int64, D::Float32),
            (D::Int64, D::Utf8),
            (D::Float32, D::Float64),
            (D::Float64, D::Utf8),
            (D::Binary, D::Utf8),
            (D::Utf8, D::Binary),
            (D::Date32, D::Utf8),
            (D::Decimal128(5, 2), D::Decimal128(7, 3)),
            (D::Decimal128(5, 2), D::Decimal128(6, 2)),
        ];
        for (a, b) in allowed {
            assert!(promotable(&a, &b), "{a} -> {b}");
        }
        let refused = [
            (D::Int64, D::Int32),
            (D::Float64, D::Float32),
            (D::Utf8, D::Int64),
            (D::Utf8, D::Date32),
            (D::Boolean, D::Int32),
            (D::Int32, D::Boolean),
            (D::Decimal128(5, 2), D::Decimal128(5, 3)), // one integer digit fewer
            (D::Decimal128(5, 2), D::Decimal128(9, 1)), // scale shrinks
            (D::Float64, D::Int64),
        ];
        for (a, b) in refused {
            assert!(!promotable(&a, &b), "{a} -> {b}");
        }
    }

    #[test]
    fn merge_adds_nullable_columns_nested_too_and_widens() {
        let inner = Fields::from(vec![Field::new("a", D::Int32, true)]);
        let table = schema(vec![
            Field::new("id", D::Int64, false),
            Field::new("n", D::Int32, true),
            Field::new("s", D::Struct(inner.clone()), true),
            Field::new("l", D::List(Arc::new(Field::new("item", D::Struct(inner), true))), true),
        ]);
        let wider = Fields::from(vec![Field::new("a", D::Int64, true), Field::new("b", D::Utf8, true)]);
        let incoming = Schema::new(vec![
            Field::new("id", D::Int64, false),
            Field::new("n", D::Float64, true),
            Field::new("s", D::Struct(wider.clone()), true),
            Field::new("l", D::List(Arc::new(Field::new("item", D::Struct(wider.clone()), true))), true),
            Field::new("new", D::Utf8, true),
        ]);
        let out = evolve(&table, &incoming, SchemaMode::Merge, &["id".into()]).unwrap();
        assert_eq!(out.field(1).data_type(), &D::Float64);
        assert_eq!(out.field(2).data_type(), &D::Struct(wider.clone()));
        assert_eq!(out.field(4).name(), "new");
        assert!(!out.field(0).is_nullable(), "the table's nullability stays");
        // Strict: a new field is refused, naming it; a wider number keeps the table's type (the
        // values must then fit it exactly, see `schema::conform`); text for a number is refused.
        let err = evolve(&table, &incoming, SchemaMode::Strict, &[]).unwrap_err().to_string();
        assert!(err.contains("`s.b`"), "{err}");
        let wider_n = Schema::new(vec![Field::new("id", D::Int64, false), Field::new("n", D::Float64, true)]);
        let two = schema(vec![Field::new("id", D::Int64, false), Field::new("n", D::Int32, true)]);
        assert_eq!(evolve(&two, &wider_n, SchemaMode::Strict, &[]).unwrap(), two);
        let text_n = Schema::new(vec![Field::new("id", D::Int64, false), Field::new("n", D::Utf8, true)]);
        let err = evolve(&two, &text_n, SchemaMode::Strict, &[]).unwrap_err().to_string();
        assert!(err.contains("`n`") && err.contains("Int32") && err.contains("Utf8"), "{err}");
    }

    #[test]
    fn refusals_name_the_column_and_both_types() {
        let table = schema(vec![Field::new("id", D::Int64, false), Field::new("x", D::Int64, true)]);
        let cases = [
            (Schema::new(vec![Field::new("id", D::Int64, false), Field::new("x", D::Boolean, true)]), "`x`"),
            (Schema::new(vec![Field::new("id", D::Utf8, false), Field::new("x", D::Int64, true)]), "`id`"),
            (
                Schema::new(vec![
                    Field::new("id", D::Int64, false),
                    Field::new("x", D::Int64, true),
                    Field::new("y", D::Int64, false),
                ]),
                "not nullable",
            ),
        ];
        for (incoming, needle) in cases {
            let err = evolve(&table, &incoming, SchemaMode::Merge, &["id".into()]).unwrap_err();
            assert!(matches!(err, Error::SchemaMismatch { .. }));
            assert!(err.to_string().contains(needle), "{err}");
        }
        // A missing column: null in merge mode, an error in strict mode.
        let partial = Schema::new(vec![Field::new("id", D::Int64, false)]);
        assert_eq!(evolve(&table, &partial, SchemaMode::Merge, &[]).unwrap(), table);
        assert!(evolve(&table, &partial, SchemaMode::Strict, &[]).unwrap_err().to_string().contains("missing"));
    }

    #[test]
    fn project_casts_promotions_and_fills_absent_fields() {
        let big = (1i64 << 53) + 1;
        let col: ArrayRef = Arc::new(Int64Array::from(vec![Some(big), None]));
        let out = project(&col, &D::Float64, "x").unwrap();
        assert_eq!(out.as_any().downcast_ref::<Float64Array>().unwrap().value(0), big as f64);
        let ints: ArrayRef = Arc::new(Int32Array::from(vec![7, -1]));
        let text = project(&ints, &D::Utf8, "x").unwrap();
        assert_eq!(text.as_any().downcast_ref::<StringArray>().unwrap().value(1), "-1");
        let old = Fields::from(vec![Field::new("a", D::Int32, true)]);
        let new = Fields::from(vec![Field::new("a", D::Int64, true), Field::new("b", D::Utf8, true)]);
        let s: ArrayRef = Arc::new(StructArray::new(old, vec![ints], None));
        let out = project(&s, &D::Struct(new), "s").unwrap();
        let out = out.as_struct();
        assert_eq!(out.column(0).data_type(), &D::Int64);
        assert_eq!(out.column(1).null_count(), 2);
        // Not a promotion: exact casts only.
        let wide: ArrayRef = Arc::new(Int64Array::from(vec![1i64 << 40]));
        assert!(project(&wide, &D::Int32, "x").is_err());
    }
}
