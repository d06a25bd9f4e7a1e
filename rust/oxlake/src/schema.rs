//! Table schemas: Hudi's meta fields, the Avro schema Hudi readers expect in every commit, and the
//! exact Arrow schema oxlake keeps in `hoodie.properties` so that reads return what was written.

use std::sync::Arc;

use arrow::array::{ArrayRef, RecordBatch, new_null_array};
use arrow::compute::{CastOptions, cast_with_options};
use arrow::datatypes::{DataType, Field, Fields, Schema, SchemaRef, TimeUnit};
use arrow::ipc::convert::{IpcSchemaEncoder, fb_to_schema};
use base64::Engine;
use base64::engine::general_purpose::STANDARD as BASE64;
use serde_json::{Value, json};

use crate::error::{Error, Result};

pub const COMMIT_TIME: &str = "_hoodie_commit_time";
pub const COMMIT_SEQNO: &str = "_hoodie_commit_seqno";
pub const RECORD_KEY: &str = "_hoodie_record_key";
pub const PARTITION_PATH: &str = "_hoodie_partition_path";
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

fn normalize_field(f: &Field) -> Result<Field> {
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
pub fn to_avro(data: &Schema, table_name: &str) -> Result<String> {
    let table_name = &avro_name(table_name);
    let fields = avro_fields(data.fields(), &format!("hoodie.{table_name}"))?;
    let record = json!({
        "type": "record",
        "name": format!("{table_name}_record"),
        "namespace": format!("hoodie.{table_name}"),
        "fields": fields,
    });
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

fn avro_fields(fields: &Fields, namespace: &str) -> Result<Vec<Value>> {
    fields
        .iter()
        .filter(|f| !is_meta_field(f.name()))
        .map(|f| {
            let t = avro_type(f.data_type(), &format!("{namespace}.{}", f.name()), f.name())?;
            Ok(if f.is_nullable() {
                json!({"name": f.name(), "type": ["null", t], "default": null})
            } else {
                json!({"name": f.name(), "type": t})
            })
        })
        .collect()
}

fn avro_type(t: &DataType, namespace: &str, name: &str) -> Result<Value> {
    use DataType as D;
    let logical = |base: &str, lt: &str| json!({"type": base, "logicalType": lt});
    Ok(match t {
        D::Null => json!("null"),
        D::Boolean => json!("boolean"),
        D::Int8 | D::Int16 | D::Int32 | D::UInt8 | D::UInt16 => json!("int"),
        D::Int64 | D::UInt32 => json!("long"),
        D::Float32 => json!("float"),
        D::Float64 => json!("double"),
        D::Utf8 | D::LargeUtf8 | D::Utf8View => json!("string"),
        D::Binary | D::LargeBinary | D::BinaryView => json!("bytes"),
        D::FixedSizeBinary(n) => json!({"type": "fixed", "name": name, "namespace": namespace, "size": n}),
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
        D::Decimal128(p, s) => json!({"type": "fixed", "name": name, "namespace": namespace,
            "size": decimal_size(*p), "logicalType": "decimal", "precision": p, "scale": s}),
        D::List(f) | D::LargeList(f) | D::FixedSizeList(f, _) => {
            let item = avro_type(f.data_type(), namespace, "element")?;
            json!({"type": "array", "items": if f.is_nullable() { json!(["null", item]) } else { item }})
        }
        D::Struct(fs) => json!({"type": "record", "name": name, "namespace": namespace,
            "fields": avro_fields(fs, namespace)?}),
        D::Map(entries, _) => {
            let value = match entries.data_type() {
                D::Struct(kv) if kv.len() == 2 => &kv[1],
                _ => return Err(Error::SchemaMismatch { detail: format!("map column `{name}` has no value field") }),
            };
            let v = avro_type(value.data_type(), namespace, "value")?;
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

/// Makes a batch of an older file (or a log block) match the table schema: columns by name, cast
/// where types differ, absent columns as nulls.
pub fn align(batch: &RecordBatch, schema: &SchemaRef) -> Result<RecordBatch> {
    if batch.schema() == *schema {
        return Ok(batch.clone());
    }
    let columns = schema
        .fields()
        .iter()
        .map(|f| match batch.column_by_name(f.name()) {
            Some(c) if c.data_type() == f.data_type() => Ok(c.clone()),
            Some(c) => arrow::compute::cast(c, f.data_type()).map_err(Error::from),
            None => Ok(new_null_array(f.data_type(), batch.num_rows())),
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(RecordBatch::try_new(schema.clone(), columns)?)
}

/// Makes `batch` match the data schema `target` (no meta fields): columns by name, in order;
/// lossless casts (`safe`) where types differ; absent nullable columns as nulls.
/// Extra columns, absent non-null columns and lossy casts are schema mismatches.
pub fn conform(batch: &RecordBatch, target: &SchemaRef) -> Result<RecordBatch> {
    let source = batch.schema();
    for f in source.fields() {
        if !is_meta_field(f.name()) && target.field_with_name(f.name()).is_err() {
            return Err(Error::SchemaMismatch { detail: format!("column `{}` is not in the table schema", f.name()) });
        }
    }
    let opts = CastOptions { safe: false, ..CastOptions::default() };
    let mut columns: Vec<ArrayRef> = Vec::with_capacity(target.fields().len());
    for f in target.fields() {
        let col = match source.index_of(f.name()) {
            Ok(i) => {
                let c = batch.column(i);
                if c.data_type() == f.data_type() {
                    c.clone()
                } else {
                    cast_with_options(c, f.data_type(), &opts).map_err(|e| Error::SchemaMismatch {
                        detail: format!(
                            "column `{}`: cannot store {} as {}: {e}",
                            f.name(),
                            c.data_type(),
                            f.data_type()
                        ),
                    })?
                }
            }
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

    #[test]
    fn normalize_drops_view_types_and_refuses_the_unstorable() {
        let s = Schema::new(vec![Field::new("s", DataType::Utf8View, true)]);
        assert_eq!(normalize(&s).unwrap().field(0).data_type(), &DataType::Utf8);
        let s = Schema::new(vec![Field::new("u", DataType::UInt64, true)]);
        assert!(matches!(normalize(&s), Err(Error::SchemaMismatch { .. })));
    }
}
