//! Table schemas: Hudi's meta fields, the Avro schema Hudi readers expect in every commit, and the
//! exact Arrow schema oxlake keeps in `hoodie.properties` so that reads return what was written.

use std::sync::Arc;

use arrow::array::{Array, ArrayRef, RecordBatch, new_null_array};
use arrow::compute::{CastOptions, cast_with_options};
use arrow::datatypes::{DataType, Field, Fields, Schema, SchemaRef, TimeUnit};
use arrow::ipc::convert::{IpcSchemaEncoder, fb_to_schema};
use base64::Engine;
use base64::engine::general_purpose::STANDARD as BASE64;
use serde_json::{Value, json};

use crate::error::{Error, Result};

pub mod evolve;
pub mod internal;

/// Meta field: instant time of the commit that wrote the record.
pub const COMMIT_TIME: &str = "_hoodie_commit_time";
/// Meta field: sequence number of the record within its commit (`<instant>_<writer>_<n>`).
pub const COMMIT_SEQNO: &str = "_hoodie_commit_seqno";
/// Meta field: the record key.
pub const RECORD_KEY: &str = "_hoodie_record_key";
/// Meta field: the partition path of the record.
pub const PARTITION_PATH: &str = "_hoodie_partition_path";
/// Meta field: name of the file the record was written to.
pub const FILE_NAME: &str = "_hoodie_file_name";

/// The five meta fields, first in every base file, in this order.
pub const META_FIELDS: [&str; 5] = [COMMIT_TIME, COMMIT_SEQNO, RECORD_KEY, PARTITION_PATH, FILE_NAME];

/// Whether a column is one of Hudi's meta fields.
pub fn is_meta_field(name: &str) -> bool {
    name.starts_with("_hoodie_")
}

/// The data schema with the meta fields in front: the schema of every base file.
pub fn with_meta_fields(data: &Schema) -> SchemaRef {
    let meta = META_FIELDS.iter().map(|n| Arc::new(Field::new(*n, DataType::Utf8, true)));
    let fields: Fields = meta.chain(data.fields().iter().cloned()).collect();
    Arc::new(Schema::new_with_metadata(fields, data.metadata().clone()))
}

/// The schema without the meta fields.
pub fn without_meta_fields(schema: &Schema) -> SchemaRef {
    let fields: Fields = schema.fields().iter().filter(|f| !is_meta_field(f.name())).cloned().collect();
    Arc::new(Schema::new(fields))
}

/// Whether `schema` carries Hudi's five meta fields as a read returns them (all five, as strings):
/// rows read from a table, whose meta fields a write regenerates (Apache Hudi's Spark writer drops
/// them from its input too, `HoodieSparkSqlWriter`'s `removeMetaFields`).
fn carries_read_meta_fields(schema: &Schema) -> bool {
    META_FIELDS.iter().all(|name| {
        let mut found = schema.fields().iter().filter(|f| f.name() == name);
        let text = |t: &DataType| matches!(t, DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View);
        matches!((found.next(), found.next()), (Some(f), None) if text(f.data_type()))
    })
}

/// Refuses the columns a table cannot hold, at create and at every write: two columns (or two
/// fields of a struct) of one name, whose second copy a write would drop and a read would fail
/// on; and columns named like Hudi's meta fields (`_hoodie_...`), whose values a write would
/// overwrite with its own, unless the schema carries all five as a read returns them.
pub fn check_column_names(schema: &Schema) -> Result<()> {
    check_unique(schema.fields(), "")?;
    if carries_read_meta_fields(schema) {
        if let Some(f) =
            schema.fields().iter().find(|f| is_meta_field(f.name()) && !META_FIELDS.contains(&f.name().as_str()))
        {
            return Err(reserved(f.name()));
        }
        return Ok(());
    }
    match schema.fields().iter().find(|f| is_meta_field(f.name())) {
        Some(f) => Err(reserved(f.name())),
        None => Ok(()),
    }
}

/// Refuses column names Apache Hudi cannot write or read: every Hudi engine goes through an Avro
/// schema, whose names are `[A-Za-z_][A-Za-z0-9_]*` (Avro's `Schema.Field` refuses others:
/// `SchemaParseException: Illegal character`), at any depth. Checked where a name enters a table
/// (create, a new column, a rename), not on writes to a table that has such a name already.
pub fn check_avro_names(field: &Field, parent: &str) -> Result<()> {
    let path = if parent.is_empty() { field.name().clone() } else { format!("{parent}.{}", field.name()) };
    if !is_avro_name(field.name()) {
        return Err(Error::SchemaMismatch {
            detail: format!(
                "column `{path}`: Apache Hudi's readers and writers (Avro schemas) take only names of ASCII letters, \
                 digits and `_`, not starting with a digit: rename it (e.g. `{}`)",
                avro_spelling(field.name())
            ),
        });
    }
    if let DataType::Struct(children) = element_type(field.data_type()) {
        children.iter().try_for_each(|c| check_avro_names(c, &path))?;
    }
    Ok(())
}

/// The type inside lists, maps and dictionaries of `t` (`t` itself for others): where the fields
/// of a nested struct are.
fn element_type(mut t: &DataType) -> &DataType {
    loop {
        match t {
            DataType::List(c) | DataType::LargeList(c) | DataType::FixedSizeList(c, _) | DataType::Map(c, _) => {
                t = c.data_type()
            }
            DataType::Dictionary(_, v) => t = v,
            _ => return t,
        }
    }
}

/// Whether `name` is a valid Avro name.
pub fn is_avro_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars.next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// `name` with every character Avro refuses as `_` (a suggestion in errors).
fn avro_spelling(name: &str) -> String {
    let mut out: String = name.chars().map(|c| if c.is_ascii_alphanumeric() || c == '_' { c } else { '_' }).collect();
    if !out.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_') {
        out.insert(0, '_');
    }
    out
}

fn reserved(name: &str) -> Error {
    Error::SchemaMismatch {
        detail: format!(
            "column `{name}`: names starting with `_hoodie_` are Hudi's meta fields, which every write fills \
             itself (rename the column, or pass rows read from a table with all five meta fields)"
        ),
    }
}

/// Refuses a column of Arrow's `null` type, at any depth (what pyarrow infers from an empty or
/// all-null list): no file format Hudi reads can store it, and a later write with real values
/// would be a type change. The error names the column.
pub fn check_typed(field: &Field, parent: &str) -> Result<()> {
    let path = if parent.is_empty() { field.name().clone() } else { format!("{parent}.{}", field.name()) };
    match field.data_type() {
        DataType::Null => Err(Error::SchemaMismatch {
            detail: format!(
                "column `{path}` has Arrow type null (inferred from no values, or only nulls): give it a type \
                 in the schema, e.g. pa.field(\"{}\", pa.string())",
                field.name()
            ),
        }),
        DataType::List(c) | DataType::LargeList(c) | DataType::FixedSizeList(c, _) | DataType::Map(c, _) => {
            check_typed(c, &path)
        }
        DataType::Struct(children) => children.iter().try_for_each(|c| check_typed(c, &path)),
        _ => Ok(()),
    }
}

fn check_unique(fields: &Fields, parent: &str) -> Result<()> {
    let mut seen = std::collections::HashSet::with_capacity(fields.len());
    for f in fields {
        let path = if parent.is_empty() { f.name().clone() } else { format!("{parent}.{}", f.name()) };
        if !seen.insert(f.name().as_str()) {
            return Err(Error::SchemaMismatch { detail: format!("column `{path}` appears more than once") });
        }
        if let DataType::Struct(children) = element_type(f.data_type()) {
            check_unique(children, &path)?;
        }
    }
    Ok(())
}

/// Plain Arrow types for storage: view and large string/binary types become their plain forms
/// (PySpark and Hudi readers want plain strings), and checks that every type can be stored.
pub fn normalize(schema: &Schema) -> Result<SchemaRef> {
    let mut fields = Vec::with_capacity(schema.fields().len());
    for f in schema.fields() {
        if is_meta_field(f.name()) {
            continue;
        }
        fields.push(Arc::new(normalize_field(f)?));
    }
    if fields.is_empty() {
        return Err(Error::SchemaMismatch { detail: "the schema has no data columns".into() });
    }
    Ok(Arc::new(Schema::new(fields)))
}

pub(crate) fn normalize_field(f: &Field) -> Result<Field> {
    let t = normalize_type(f.name(), f.data_type())?;
    Ok(Field::new(f.name(), t, f.is_nullable()))
}

fn normalize_type(name: &str, t: &DataType) -> Result<DataType> {
    use DataType as D;
    Ok(match t {
        D::Utf8View | D::LargeUtf8 => D::Utf8,
        D::BinaryView | D::LargeBinary => D::Binary,
        D::Dictionary(_, v) => normalize_type(name, v)?,
        D::List(f) | D::LargeList(f) | D::ListView(f) | D::LargeListView(f) | D::FixedSizeList(f, _) => {
            D::List(Arc::new(normalize_field(f)?))
        }
        D::Struct(fs) => D::Struct(fs.iter().map(|f| normalize_field(f).map(Arc::new)).collect::<Result<_>>()?),
        D::Map(f, sorted) => D::Map(Arc::new(normalize_field(f)?), *sorted),
        // Parquet's DECIMAL and Apache Hudi's `decimal(p, s)` have no negative scale.
        D::Decimal128(_, s) if *s < 0 => {
            return Err(Error::SchemaMismatch {
                detail: format!("column `{name}`: type {t} cannot be stored (a decimal's scale is never negative)"),
            });
        }
        D::Null
        | D::Boolean
        | D::Int8
        | D::Int16
        | D::Int32
        | D::Int64
        | D::UInt8
        | D::UInt16
        | D::UInt32
        | D::Float32
        | D::Float64
        | D::Utf8
        | D::Binary
        | D::FixedSizeBinary(_)
        | D::Date32
        | D::Date64
        | D::Timestamp(_, _)
        | D::Decimal128(_, _)
        | D::Time32(_)
        | D::Time64(_) => t.clone(),
        other => {
            return Err(Error::SchemaMismatch { detail: format!("column `{name}`: type {other} cannot be stored") });
        }
    })
}

/// Encodes a schema for `hoodie.properties`: Arrow IPC, base64 (ASCII, no backslashes).
pub fn encode_arrow_schema(schema: &Schema) -> String {
    let fbb = IpcSchemaEncoder::new().schema_to_fb(schema);
    BASE64.encode(fbb.finished_data())
}

/// Decodes [`encode_arrow_schema`].
pub fn decode_arrow_schema(text: &str) -> Result<SchemaRef> {
    let bytes = BASE64.decode(text.trim()).map_err(|e| Error::corrupt("hoodie.properties", format!("schema: {e}")))?;
    let fb =
        arrow::ipc::root_as_schema(&bytes).map_err(|e| Error::corrupt("hoodie.properties", format!("schema: {e}")))?;
    Ok(Arc::new(fb_to_schema(fb)))
}

/// The Avro schema (JSON) of a data schema, as Apache Hudi records it: a record named
/// `<table>_record` in namespace `hoodie.<table>`, nullable fields as `["null", T]` with default null.
///
/// Types and names follow Apache Hudi's Spark writer (`AvroConversionUtils.convertStructTypeToAvroSchema`:
/// its copy of Spark's `SchemaConverters.toAvroType`, then `getAvroSchemaWithDefaults`):
/// - a struct field `f` is a record named `f` in the namespace of the record holding it followed
///   by that record's name (`hoodie.t.t_record` for the top level); list items and map values
///   take the name and namespace of their field; a decimal is a `fixed` named `fixed` in the
///   field's namespace (`hoodie.t.t_record.amount.fixed`), sized for its precision;
/// - unions put `null` first (list items and map values too);
/// - Spark's `TimestampType` (an Arrow timestamp with a time zone) is `timestamp-micros`, its
///   `TimestampNTZType` (no time zone) `local-timestamp-micros` (Hudi 1.x, as Spark's own Avro
///   converter; Hudi 0.14/0.15's copy of the converter predates `TimestampNTZType`), dates
///   `date`, binary `bytes`.
///
/// hudi-rs 0.5 cannot read a table whose commit schema holds `local-timestamp-micros` or
/// `local-timestamp-millis`: its Avro-to-Arrow conversion panics (`not yet implemented`). That is
/// what Apache Hudi writes for a timestamp without a time zone, so oxlake writes it too, and reads
/// such tables back exactly (it keeps the Arrow schema itself, `oxlake.table.arrow.schema`);
/// `tests/test_write_validation.py::test_hudi_rs_cannot_read_local_timestamps` shows the limit.
///
/// Types Spark lacks follow Avro's own logical types: millisecond and second timestamps as
/// `*-millis` (Parquet stores both in milliseconds), nanosecond ones as `*-nanos` (Avro 1.12),
/// times of day as `time-millis` (`Time32`) or `time-micros` (`Time64`; Avro has no nanosecond
/// time, and hudi-rs reads a nanosecond column so declared as microseconds of the same times),
/// fixed-size binary as `fixed`.
pub fn to_avro(data: &Schema, table_name: &str) -> Result<String> {
    let table_name = &avro_name(table_name);
    let (name, namespace) = (format!("{table_name}_record"), format!("hoodie.{table_name}"));
    let top: Fields = data.fields().iter().filter(|f| !is_meta_field(f.name())).cloned().collect();
    let fields = avro_fields(&top, &format!("{namespace}.{name}"))?;
    let record = json!({"type": "record", "name": name, "namespace": namespace, "fields": fields});
    Ok(record.to_string())
}

/// A table name as an Avro name, as Hudi's `HoodieAvroUtils.sanitizeName` makes it: an invalid
/// first character, then every character outside `[A-Za-z0-9_]`, becomes `__` (`my-trips` is
/// `my__trips`; readers refuse the schema of `my-trips_record`).
fn avro_name(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    for (i, c) in name.chars().enumerate() {
        let ok = c.is_ascii_alphabetic() || c == '_' || (i > 0 && c.is_ascii_digit());
        if ok { out.push(c) } else { out.push_str("__") }
    }
    out
}

/// The Avro schema with the five meta fields first, as log block headers carry it.
pub fn to_avro_with_meta(data: &Schema, table_name: &str) -> Result<String> {
    let mut record: Value = serde_json::from_str(&to_avro(data, table_name)?).map_err(Error::invalid_data)?;
    let meta = META_FIELDS.iter().map(|n| json!({"name": n, "type": ["null", "string"], "doc": "", "default": null}));
    if let Some(fields) = record["fields"].as_array_mut() {
        let data_fields = std::mem::take(fields);
        fields.extend(meta);
        fields.extend(data_fields);
    }
    Ok(record.to_string())
}

/// The fields of a record whose own namespace and name make `namespace`.
fn avro_fields(fields: &Fields, namespace: &str) -> Result<Vec<Value>> {
    fields
        .iter()
        .map(|f| {
            let t = avro_type(f.data_type(), f.name(), namespace)?;
            Ok(if f.is_nullable() {
                json!({"name": f.name(), "type": ["null", t], "default": null})
            } else {
                json!({"name": f.name(), "type": t})
            })
        })
        .collect()
}

/// The Avro type of a value of field `name` of a record in `namespace` (the names Hudi gives
/// named types: records and fixed).
fn avro_type(t: &DataType, name: &str, namespace: &str) -> Result<Value> {
    use DataType as D;
    let logical = |base: &str, lt: &str| json!({"type": base, "logicalType": lt});
    let fixed_namespace = format!("{namespace}.{name}");
    Ok(match t {
        D::Null => json!("null"),
        D::Boolean => json!("boolean"),
        D::Int8 | D::Int16 | D::Int32 | D::UInt8 | D::UInt16 => json!("int"),
        D::Int64 | D::UInt32 => json!("long"),
        D::Float32 => json!("float"),
        D::Float64 => json!("double"),
        D::Utf8 | D::LargeUtf8 | D::Utf8View => json!("string"),
        D::Binary | D::LargeBinary | D::BinaryView => json!("bytes"),
        D::FixedSizeBinary(n) => json!({"type": "fixed", "name": "fixed", "namespace": fixed_namespace, "size": n}),
        D::Date32 | D::Date64 => logical("int", "date"),
        D::Time32(_) => logical("int", "time-millis"),
        D::Time64(_) => logical("long", "time-micros"),
        D::Timestamp(unit, tz) => {
            let unit = match unit {
                TimeUnit::Second | TimeUnit::Millisecond => "millis",
                TimeUnit::Microsecond => "micros",
                TimeUnit::Nanosecond => "nanos",
            };
            let prefix = if tz.is_some() { "timestamp" } else { "local-timestamp" };
            logical("long", &format!("{prefix}-{unit}"))
        }
        D::Decimal128(p, s) => json!({"type": "fixed", "name": "fixed", "namespace": fixed_namespace,
            "size": decimal_size(*p), "logicalType": "decimal", "precision": p, "scale": s}),
        D::List(f) | D::LargeList(f) | D::FixedSizeList(f, _) => {
            let item = avro_type(f.data_type(), name, namespace)?;
            json!({"type": "array", "items": if f.is_nullable() { json!(["null", item]) } else { item }})
        }
        D::Struct(fs) => json!({"type": "record", "name": name, "namespace": namespace,
            "fields": avro_fields(fs, &format!("{namespace}.{name}"))?}),
        D::Map(entries, _) => {
            let value = match entries.data_type() {
                D::Struct(kv) if kv.len() == 2 => &kv[1],
                _ => return Err(Error::SchemaMismatch { detail: format!("map column `{name}` has no value field") }),
            };
            let v = avro_type(value.data_type(), name, namespace)?;
            json!({"type": "map", "values": if value.is_nullable() { json!(["null", v]) } else { v }})
        }
        other => return Err(Error::SchemaMismatch { detail: format!("column `{name}`: no Avro type for {other}") }),
    })
}

/// The Arrow schema of an Avro record schema (JSON), for tables known only by their
/// `hoodie.table.create.schema` (no data file yet).
pub fn from_avro(text: &str) -> Result<SchemaRef> {
    let v: Value = serde_json::from_str(text).map_err(|e| Error::corrupt("avro schema", e))?;
    let fields = v["fields"].as_array().ok_or_else(|| Error::corrupt("avro schema", "not a record"))?;
    let fields = fields.iter().map(avro_field).collect::<Result<Vec<_>>>()?;
    Ok(Arc::new(Schema::new(fields)))
}

fn avro_field(f: &Value) -> Result<Field> {
    let name = f["name"].as_str().ok_or_else(|| Error::corrupt("avro schema", "field without a name"))?;
    let (t, nullable) = arrow_type(&f["type"])?;
    Ok(Field::new(name, t, nullable))
}

/// An Avro type as an Arrow type and whether it admits null.
fn arrow_type(t: &Value) -> Result<(DataType, bool)> {
    use DataType as D;
    let bad = || Error::corrupt("avro schema", format!("unsupported type {t}"));
    Ok(match t {
        Value::String(s) => (
            match s.as_str() {
                "null" => D::Null,
                "boolean" => D::Boolean,
                "int" => D::Int32,
                "long" => D::Int64,
                "float" => D::Float32,
                "double" => D::Float64,
                "bytes" => D::Binary,
                "string" => D::Utf8,
                _ => return Err(bad()),
            },
            false,
        ),
        Value::Array(branches) => {
            let non_null: Vec<&Value> = branches.iter().filter(|b| b.as_str() != Some("null")).collect();
            match non_null.as_slice() {
                [one] => (arrow_type(one)?.0, true),
                _ => return Err(bad()),
            }
        }
        Value::Object(o) => {
            let logical = o.get("logicalType").and_then(Value::as_str);
            let base = o.get("type").and_then(Value::as_str).unwrap_or("");
            let dt = match (logical, base) {
                (Some("date"), _) => D::Date32,
                (Some("timestamp-millis"), _) => D::Timestamp(TimeUnit::Millisecond, Some("UTC".into())),
                (Some("timestamp-micros"), _) => D::Timestamp(TimeUnit::Microsecond, Some("UTC".into())),
                (Some("timestamp-nanos"), _) => D::Timestamp(TimeUnit::Nanosecond, Some("UTC".into())),
                (Some("local-timestamp-millis"), _) => D::Timestamp(TimeUnit::Millisecond, None),
                (Some("local-timestamp-micros"), _) => D::Timestamp(TimeUnit::Microsecond, None),
                (Some("decimal"), _) => {
                    let p = o.get("precision").and_then(Value::as_u64).unwrap_or(38) as u8;
                    let s = o.get("scale").and_then(Value::as_i64).unwrap_or(0) as i8;
                    D::Decimal128(p, s)
                }
                (_, "record") => {
                    let fs = o.get("fields").and_then(Value::as_array).ok_or_else(bad)?;
                    D::Struct(fs.iter().map(|f| avro_field(f).map(Arc::new)).collect::<Result<Fields>>()?)
                }
                (_, "array") => {
                    let (item, nullable) = arrow_type(o.get("items").ok_or_else(bad)?)?;
                    D::List(Arc::new(Field::new("element", item, nullable)))
                }
                (_, "map") => {
                    let (value, nullable) = arrow_type(o.get("values").ok_or_else(bad)?)?;
                    let entries =
                        Fields::from(vec![Field::new("key", D::Utf8, false), Field::new("value", value, nullable)]);
                    D::Map(Arc::new(Field::new("key_value", D::Struct(entries), false)), false)
                }
                (_, "fixed") => D::FixedSizeBinary(o.get("size").and_then(Value::as_i64).unwrap_or(0) as i32),
                (_, "enum") => D::Utf8,
                (_, other) => arrow_type(&Value::String(other.to_string()))?.0,
            };
            (dt, false)
        }
        _ => return Err(bad()),
    })
}

/// Bytes needed by a fixed Avro decimal of the given precision.
fn decimal_size(precision: u8) -> usize {
    (1..=16).find(|n| 10f64.powi(precision as i32) < 2f64.powi(8 * *n as i32 - 1)).unwrap_or(16)
}

/// Makes a batch of an older file (or a log block) match the table schema: columns by name, types
/// the schema evolved by promotion cast as Apache Hudi reads them, other differences cast only
/// where every value survives (a value the cast would change is an error, never a null or a
/// rounded value), absent columns and struct fields as nulls (see [`evolve::project`]).
pub fn align(batch: &RecordBatch, schema: &SchemaRef) -> Result<RecordBatch> {
    if batch.schema() == *schema {
        return Ok(batch.clone());
    }
    let columns = schema
        .fields()
        .iter()
        .map(|f| match batch.column_by_name(f.name()) {
            Some(c) => evolve::project(c, f.data_type(), f.name()),
            None => Ok(new_null_array(f.data_type(), batch.num_rows())),
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(RecordBatch::try_new(schema.clone(), columns)?)
}

/// Makes `batch` match the data schema `target` (no meta fields): columns by name, in order;
/// exact casts where types differ (see [`cast_exact`]; the kinds must agree, see [`same_kind`]);
/// absent nullable columns as nulls. Extra, duplicate or meta-named columns, absent non-null
/// columns and casts that would change a value are schema mismatches.
pub fn conform(batch: &RecordBatch, target: &SchemaRef) -> Result<RecordBatch> {
    let source = batch.schema();
    check_column_names(&source)?;
    for f in source.fields() {
        if !is_meta_field(f.name()) && target.field_with_name(f.name()).is_err() {
            return Err(Error::SchemaMismatch { detail: format!("column `{}` is not in the table schema", f.name()) });
        }
    }
    let mut columns: Vec<ArrayRef> = Vec::with_capacity(target.fields().len());
    for f in target.fields() {
        let col = match source.index_of(f.name()) {
            Ok(i) => cast_input(batch.column(i), f)?,
            Err(_) if f.is_nullable() => new_null_array(f.data_type(), batch.num_rows()),
            Err(_) => {
                return Err(Error::SchemaMismatch { detail: format!("required column `{}` is missing", f.name()) });
            }
        };
        if !f.is_nullable() && col.null_count() > 0 {
            return Err(Error::invalid_data(format!("column `{}` is not nullable but holds nulls", f.name())));
        }
        columns.push(col);
    }
    RecordBatch::try_new(target.clone(), columns).map_err(Error::from)
}

/// The columns of `batch` that the table schema `target` knows, cast exactly to its types as
/// [`conform`] does; other columns as they are (deletes read only the key, partition and ordering
/// columns: a `1.0` given for an integer key must find the key `1`, not miss it).
pub fn conform_known(batch: &RecordBatch, target: &SchemaRef) -> Result<RecordBatch> {
    let source = batch.schema();
    check_column_names(&source)?;
    let mut fields = Vec::with_capacity(source.fields().len());
    let mut columns = Vec::with_capacity(source.fields().len());
    for (f, c) in source.fields().iter().zip(batch.columns()) {
        match target.field_with_name(f.name()) {
            Ok(t) => {
                fields.push(Arc::new(Field::new(f.name(), t.data_type().clone(), f.is_nullable())));
                columns.push(cast_input(c, t)?);
            }
            Err(_) => {
                fields.push(f.clone());
                columns.push(c.clone());
            }
        }
    }
    Ok(RecordBatch::try_new(Arc::new(Schema::new(fields)), columns)?)
}

/// A column of a write's input as the table field `to`: the kinds must agree, and every value
/// must survive the cast.
fn cast_input(c: &ArrayRef, to: &Field) -> Result<ArrayRef> {
    // Nested columns field by field by name (struct fields the input lacks are null: the table
    // evolved past it, see `evolve`), leaves exactly.
    evolve::walk(c, to.data_type(), to.name(), &|c, to, column| {
        if !same_kind(c.data_type(), to) {
            return Err(mismatch(column, c.data_type(), to, "different kinds of value"));
        }
        cast_exact(c, to, column)
    })
}

/// Whether values of type `from` may be stored in a column of type `to` at all (their exactness is
/// checked value by value): numbers as numbers, text as text, bytes as bytes, dates as dates,
/// times of day as times of day, timestamps as timestamps with a time zone only when both have
/// one (a naive timestamp is a wall-clock reading, not an instant: taking it as UTC would be a
/// guess), structs with the same fields in the same order, lists and maps by their items.
/// Strings are never parsed into numbers or timestamps.
pub fn same_kind(from: &DataType, to: &DataType) -> bool {
    use DataType as D;
    let numeric = |t: &D| t.is_numeric();
    let text = |t: &D| matches!(t, D::Utf8 | D::LargeUtf8 | D::Utf8View);
    let bytes = |t: &D| matches!(t, D::Binary | D::LargeBinary | D::BinaryView | D::FixedSizeBinary(_));
    let list = |t: &D| match t {
        D::List(f) | D::LargeList(f) | D::ListView(f) | D::LargeListView(f) | D::FixedSizeList(f, _) => {
            Some(f.data_type().clone())
        }
        _ => None,
    };
    match (from, to) {
        _ if from == to => true,
        (D::Null, _) => true,
        (D::Dictionary(_, v), _) => same_kind(v, to),
        (D::Timestamp(_, a), D::Timestamp(_, b)) => a.is_some() == b.is_some(),
        (D::Date32 | D::Date64, D::Date32 | D::Date64) => true,
        (D::Time32(_) | D::Time64(_), D::Time32(_) | D::Time64(_)) => true,
        (D::Struct(a), D::Struct(b)) => {
            a.len() == b.len()
                && a.iter().zip(b.iter()).all(|(x, y)| x.name() == y.name() && same_kind(x.data_type(), y.data_type()))
        }
        (D::Map(a, _), D::Map(b, _)) => same_kind(a.data_type(), b.data_type()),
        _ if list(from).is_some() && list(to).is_some() => {
            list(from).zip(list(to)).is_some_and(|(a, b)| same_kind(&a, &b))
        }
        _ => (numeric(from) && numeric(to)) || (text(from) && text(to)) || (bytes(from) && bytes(to)),
    }
}

/// Casts `array` to `to` only when no value changes: the cast fails on overflow, and every value
/// cast back must equal the original (`1.5` is not stored as `1`, nanoseconds are not truncated
/// to microseconds, a null never replaces a value). `column` names the column in the error.
pub fn cast_exact(array: &ArrayRef, to: &DataType, column: &str) -> Result<ArrayRef> {
    let from = array.data_type();
    let opts = CastOptions { safe: false, ..CastOptions::default() };
    let out = cast_with_options(array, to, &opts).map_err(|e| mismatch(column, from, to, e))?;
    let text_or_bytes = |t: &DataType| {
        matches!(
            t,
            DataType::Utf8
                | DataType::LargeUtf8
                | DataType::Utf8View
                | DataType::Binary
                | DataType::LargeBinary
                | DataType::BinaryView
        )
    };
    // Between string (or binary) layouts nothing can change, nor in a column of nulls;
    // elsewhere the values decide.
    if (text_or_bytes(from) && text_or_bytes(to)) || from == &DataType::Null || array.null_count() == array.len() {
        return Ok(out);
    }
    // Dictionaries compare by their values.
    let original = match from {
        DataType::Dictionary(_, v) => cast_with_options(array, v, &opts).map_err(|e| mismatch(column, from, to, e))?,
        _ => array.clone(),
    };
    let back = cast_with_options(&out, original.data_type(), &opts).map_err(|e| mismatch(column, from, to, e))?;
    if back.as_ref() == original.as_ref() {
        return Ok(out);
    }
    let row = arrow::compute::kernels::cmp::distinct(&back, &original)
        .ok()
        .and_then(|d| (0..d.len()).find(|&i| d.is_valid(i) && d.value(i)));
    let detail = match row {
        Some(row) => {
            let shown = arrow::util::display::ArrayFormatter::try_new(original.as_ref(), &Default::default())
                .map(|f| f.value(row).to_string())
                .unwrap_or_default();
            format!("row {row} holds {shown}, which {to} cannot hold exactly")
        }
        None => format!("some values cannot be held exactly by {to}"),
    };
    Err(mismatch(column, from, to, detail))
}

fn mismatch(column: &str, from: &DataType, to: &DataType, detail: impl std::fmt::Display) -> Error {
    Error::SchemaMismatch { detail: format!("column `{column}`: cannot store {from} as {to}: {detail}") }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::{Int8Array, Int32Array, StringArray, StringViewArray};

    fn schema() -> Schema {
        Schema::new(vec![
            Field::new("id", DataType::Int64, false),
            Field::new("name", DataType::Utf8, true),
            Field::new("ts", DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into())), true),
            Field::new("tags", DataType::List(Arc::new(Field::new("item", DataType::Utf8, true))), true),
            Field::new("amount", DataType::Decimal128(10, 2), true),
        ])
    }

    #[test]
    fn arrow_schema_round_trips_through_properties() {
        let s = schema();
        let text = encode_arrow_schema(&s);
        assert!(text.is_ascii() && !text.contains('\\'));
        assert_eq!(*decode_arrow_schema(&text).unwrap(), s);
    }

    #[test]
    fn avro_schema_names_and_nullability() {
        let avro: Value = serde_json::from_str(&to_avro(&schema(), "trips").unwrap()).unwrap();
        assert_eq!(avro["name"], "trips_record");
        let odd: Value = serde_json::from_str(&to_avro(&schema(), "2024-trips.v1").unwrap()).unwrap();
        assert_eq!(
            (&odd["name"], &odd["namespace"]),
            (&json!("__024__trips__v1_record"), &json!("hoodie.__024__trips__v1"))
        );
        assert_eq!(avro["namespace"], "hoodie.trips");
        assert_eq!(avro["fields"][0], json!({"name": "id", "type": "long"}));
        assert_eq!(avro["fields"][1]["type"], json!(["null", "string"]));
        assert_eq!(avro["fields"][2]["type"][1]["logicalType"], "timestamp-micros");
        assert_eq!(avro["fields"][4]["type"][1]["size"], 5);
    }

    #[test]
    fn avro_schemas_convert_back() {
        let avro = to_avro(&schema(), "trips").unwrap();
        let back = from_avro(&avro).unwrap();
        assert_eq!(back.field(0).data_type(), &DataType::Int64);
        assert!(!back.field(0).is_nullable());
        assert_eq!(back.field(2).data_type(), schema().field(2).data_type());
        assert_eq!(back.field(4).data_type(), &DataType::Decimal128(10, 2));
    }

    #[test]
    fn conform_reorders_casts_and_fills() {
        let target: SchemaRef = Arc::new(Schema::new(vec![
            Field::new("a", DataType::Int32, false),
            Field::new("b", DataType::Utf8, true),
            Field::new("c", DataType::Utf8, true),
        ]));
        let src = RecordBatch::try_from_iter(vec![
            ("b", Arc::new(StringViewArray::from(vec!["x", "y"])) as ArrayRef),
            ("a", Arc::new(Int8Array::from(vec![1, 2])) as ArrayRef),
        ])
        .unwrap();
        let out = conform(&src, &target).unwrap();
        assert_eq!(out.schema(), target);
        assert_eq!(out.column(0).as_ref(), &Int32Array::from(vec![1, 2]) as &dyn arrow::array::Array);
        assert_eq!(out.column(1).as_ref(), &StringArray::from(vec!["x", "y"]) as &dyn arrow::array::Array);
        assert_eq!(out.column(2).null_count(), 2);

        let extra = RecordBatch::try_from_iter(vec![("z", Arc::new(Int8Array::from(vec![1])) as ArrayRef)]).unwrap();
        assert!(matches!(conform(&extra, &target), Err(Error::SchemaMismatch { .. })));
        let lossy =
            RecordBatch::try_from_iter(vec![("a", Arc::new(StringArray::from(vec!["x"])) as ArrayRef)]).unwrap();
        assert!(matches!(conform(&lossy, &target), Err(Error::SchemaMismatch { .. })));
    }

    fn avro_of(fields: Vec<Field>) -> Value {
        serde_json::from_str(&to_avro(&Schema::new(fields), "t").unwrap()).unwrap()
    }

    /// Names as Apache Hudi's `SchemaConverters.toAvroType` gives them: nested records named by
    /// their field in the namespace of the enclosing record, decimals as `fixed` named `fixed`,
    /// list items and map values named by their field; `null` first in every union.
    #[test]
    fn avro_names_follow_apache_hudi() {
        let dec = DataType::Decimal128(10, 2);
        let inner = Fields::from(vec![Field::new("amount", dec.clone(), true), Field::new("s", DataType::Utf8, false)]);
        let entries =
            Fields::from(vec![Field::new("key", DataType::Utf8, false), Field::new("value", dec.clone(), true)]);
        let avro = avro_of(vec![
            Field::new("amount", dec.clone(), false),
            Field::new("addr", DataType::Struct(inner.clone()), true),
            Field::new("items", DataType::List(Arc::new(Field::new("item", DataType::Struct(inner), true))), true),
            Field::new(
                "m",
                DataType::Map(Arc::new(Field::new("entries", DataType::Struct(entries), false)), false),
                true,
            ),
        ]);
        assert_eq!(avro["name"], "t_record");
        assert_eq!(avro["namespace"], "hoodie.t");
        let fixed = |ns: &str| {
            json!({"type": "fixed", "name": "fixed", "namespace": ns, "size": 5, "logicalType": "decimal",
                "precision": 10, "scale": 2})
        };
        assert_eq!(avro["fields"][0], json!({"name": "amount", "type": fixed("hoodie.t.t_record.amount")}));
        let addr = &avro["fields"][1]["type"];
        assert_eq!(addr[0], "null");
        assert_eq!((&addr[1]["name"], &addr[1]["namespace"]), (&json!("addr"), &json!("hoodie.t.t_record")));
        assert_eq!(addr[1]["fields"][0]["type"], json!(["null", fixed("hoodie.t.t_record.addr.amount")]));
        assert_eq!(addr[1]["fields"][0]["default"], Value::Null);
        assert_eq!(addr[1]["fields"][1], json!({"name": "s", "type": "string"}));
        let items = &avro["fields"][2]["type"][1];
        assert_eq!(items["type"], "array");
        assert_eq!(items["items"][0], "null");
        assert_eq!(
            (&items["items"][1]["name"], &items["items"][1]["namespace"]),
            (&json!("items"), &json!("hoodie.t.t_record"))
        );
        assert_eq!(items["items"][1]["fields"][0]["type"][1]["namespace"], "hoodie.t.t_record.items.amount");
        let m = &avro["fields"][3]["type"][1];
        assert_eq!(m["type"], "map");
        assert_eq!(m["values"], json!(["null", fixed("hoodie.t.t_record.m")]));
        // Every named type has a distinct full name (Avro parsers refuse a redefinition).
        let mut names = Vec::new();
        fn collect(v: &Value, out: &mut Vec<String>) {
            match v {
                Value::Object(o) => {
                    if let (Some(n), Some(ns)) =
                        (o.get("name").and_then(Value::as_str), o.get("namespace").and_then(Value::as_str))
                        && matches!(o.get("type").and_then(Value::as_str), Some("record" | "fixed"))
                    {
                        out.push(format!("{ns}.{n}"));
                    }
                    o.values().for_each(|v| collect(v, out));
                }
                Value::Array(a) => a.iter().for_each(|v| collect(v, out)),
                _ => {}
            }
        }
        collect(&avro, &mut names);
        let unique: std::collections::HashSet<_> = names.iter().collect();
        assert_eq!(unique.len(), names.len(), "{names:?}");
    }

    /// Timestamps as Hudi writes Spark's: with a time zone `timestamp-micros`, without one
    /// `local-timestamp-micros`; the other units by Avro's logical types; dates, binary.
    #[test]
    fn avro_temporal_and_binary_types() {
        let ts = |unit, tz: Option<&str>| DataType::Timestamp(unit, tz.map(Into::into));
        let avro = avro_of(vec![
            Field::new("a", ts(TimeUnit::Microsecond, Some("UTC")), false),
            Field::new("b", ts(TimeUnit::Microsecond, None), false),
            Field::new("c", ts(TimeUnit::Millisecond, Some("+02:00")), false),
            Field::new("d", ts(TimeUnit::Nanosecond, None), false),
            Field::new("e", DataType::Date32, false),
            Field::new("f", DataType::Binary, false),
            Field::new("g", DataType::Time64(TimeUnit::Nanosecond), false),
            Field::new("h", DataType::Time64(TimeUnit::Microsecond), false),
        ]);
        let logical = |i: usize| avro["fields"][i]["type"]["logicalType"].clone();
        assert_eq!(logical(0), "timestamp-micros");
        assert_eq!(logical(1), "local-timestamp-micros");
        assert_eq!(logical(2), "timestamp-millis");
        assert_eq!(logical(3), "local-timestamp-nanos");
        assert_eq!(avro["fields"][4]["type"], json!({"type": "int", "logicalType": "date"}));
        assert_eq!(avro["fields"][5]["type"], "bytes");
        assert_eq!(logical(6), "time-micros");
        assert_eq!(logical(7), "time-micros");
        // Read back, the time zones' presence survives (oxlake keeps the exact Arrow schema too).
        let back = from_avro(&avro.to_string()).unwrap();
        assert_eq!(back.field(1).data_type(), &ts(TimeUnit::Microsecond, None));
        assert_eq!(back.field(0).data_type(), &ts(TimeUnit::Microsecond, Some("UTC")));
    }

    fn one(name: &str, a: ArrayRef) -> RecordBatch {
        RecordBatch::try_from_iter(vec![(name, a)]).unwrap()
    }

    fn mismatch_detail(r: Result<RecordBatch>) -> String {
        match r {
            Err(Error::SchemaMismatch { detail }) => detail,
            other => panic!("expected a schema mismatch, got {other:?}"),
        }
    }

    /// A float ordering value `1.5` is not stored as the integer `1`; `1.0` is.
    #[test]
    fn conform_casts_only_exactly() {
        use arrow::array::{Float64Array, Int64Array, TimestampNanosecondArray};
        let target: SchemaRef = Arc::new(Schema::new(vec![Field::new("ts", DataType::Int64, true)]));
        let exact = conform(&one("ts", Arc::new(Float64Array::from(vec![1.0, 2.0]))), &target).unwrap();
        assert_eq!(exact.column(0).as_ref(), &Int64Array::from(vec![1, 2]) as &dyn arrow::array::Array);
        let detail = mismatch_detail(conform(&one("ts", Arc::new(Float64Array::from(vec![1.0, 1.5]))), &target));
        assert!(detail.contains("`ts`") && detail.contains("Float64") && detail.contains("Int64"), "{detail}");
        assert!(detail.contains("row 1 holds 1.5"), "{detail}");
        let narrow: SchemaRef = Arc::new(Schema::new(vec![Field::new("n", DataType::Int32, true)]));
        mismatch_detail(conform(&one("n", Arc::new(Int64Array::from(vec![1i64 << 40]))), &narrow));
        let float: SchemaRef = Arc::new(Schema::new(vec![Field::new("f", DataType::Float64, true)]));
        mismatch_detail(conform(&one("f", Arc::new(Int64Array::from(vec![(1i64 << 53) + 1]))), &float));
        conform(&one("f", Arc::new(Int64Array::from(vec![1i64 << 53]))), &float).unwrap();

        let us = |tz: Option<&str>| DataType::Timestamp(TimeUnit::Microsecond, tz.map(Into::into));
        let naive_table: SchemaRef = Arc::new(Schema::new(vec![Field::new("t", us(None), true)]));
        let ns = TimestampNanosecondArray::from(vec![1_000, 1_001]);
        let detail = mismatch_detail(conform(&one("t", Arc::new(ns.clone())), &naive_table));
        assert!(detail.contains("row 1"), "{detail}");
        conform(&one("t", Arc::new(TimestampNanosecondArray::from(vec![1_000, 2_000]))), &naive_table).unwrap();
        // A naive timestamp is not taken as UTC, nor an instant as a wall-clock reading.
        let utc_table: SchemaRef = Arc::new(Schema::new(vec![Field::new("t", us(Some("UTC")), true)]));
        let naive = TimestampNanosecondArray::from(vec![1_000]);
        assert!(mismatch_detail(conform(&one("t", Arc::new(naive.clone())), &utc_table)).contains("`t`"));
        let aware = Arc::new(naive.with_timezone("+01:00")) as ArrayRef;
        conform(&one("t", aware.clone()), &utc_table).unwrap();
        mismatch_detail(conform(&one("t", aware), &naive_table));
        // Strings are not parsed into timestamps or numbers.
        mismatch_detail(conform(&one("t", Arc::new(StringArray::from(vec!["2024-01-01T00:00:00"]))), &utc_table));
        mismatch_detail(conform(&one("ts", Arc::new(StringArray::from(vec!["1"]))), &target));
        // Nulls fit anywhere.
        let nulls = conform(&one("t", Arc::new(arrow::array::NullArray::new(2))), &utc_table).unwrap();
        assert_eq!(nulls.column(0).null_count(), 2);
    }

    #[test]
    fn align_refuses_lossy_casts() {
        use arrow::array::Float64Array;
        let target: SchemaRef = Arc::new(Schema::new(vec![Field::new("v", DataType::Int64, true)]));
        mismatch_detail(align(&one("v", Arc::new(Float64Array::from(vec![0.5]))), &target));
        assert_eq!(align(&one("v", Arc::new(Int32Array::from(vec![7]))), &target).unwrap().num_rows(), 1);
    }

    #[test]
    fn duplicate_and_meta_named_columns_are_refused() {
        let f = |n: &str| Field::new(n, DataType::Utf8, true);
        let dup = Schema::new(vec![f("a"), f("b"), f("a")]);
        assert!(matches!(check_column_names(&dup), Err(Error::SchemaMismatch { detail }) if detail.contains("`a`")));
        let nested = Schema::new(vec![Field::new("s", DataType::Struct(Fields::from(vec![f("x"), f("x")])), true)]);
        assert!(
            matches!(check_column_names(&nested), Err(Error::SchemaMismatch { detail }) if detail.contains("`s.x`"))
        );
        for name in META_FIELDS.iter().chain(&["_hoodie_is_deleted"]) {
            let s = Schema::new(vec![f("id"), f(name)]);
            let err = check_column_names(&s).unwrap_err();
            assert!(matches!(&err, Error::SchemaMismatch { detail } if detail.contains(name)), "{err}");
        }
        // Rows read from a table carry all five: accepted, their values regenerated.
        let read = with_meta_fields(&Schema::new(vec![f("id")]));
        check_column_names(&read).unwrap();
        let mut more: Vec<Field> = read.fields().iter().map(|f| f.as_ref().clone()).collect();
        more.push(f("_hoodie_operation"));
        assert!(check_column_names(&Schema::new(more)).is_err());
        let mut typed: Vec<Field> = read.fields().iter().map(|f| f.as_ref().clone()).collect();
        typed[2] = Field::new(RECORD_KEY, DataType::Int64, true);
        assert!(check_column_names(&Schema::new(typed)).is_err());
    }

    #[test]
    fn normalize_drops_view_types_and_refuses_the_unstorable() {
        let s = Schema::new(vec![Field::new("s", DataType::Utf8View, true)]);
        assert_eq!(normalize(&s).unwrap().field(0).data_type(), &DataType::Utf8);
        let s = Schema::new(vec![Field::new("u", DataType::UInt64, true)]);
        assert!(matches!(normalize(&s), Err(Error::SchemaMismatch { .. })));
        let s = Schema::new(vec![Field::new("d", DataType::Decimal128(10, -2), true)]);
        assert!(matches!(normalize(&s), Err(Error::SchemaMismatch { detail }) if detail.contains("never negative")));
    }
}
