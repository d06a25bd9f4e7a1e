//! Column identities: Apache Hudi's schema-on-read `InternalSchema` (`SerDeHelper`,
//! `AvroInternalSchemaConverter`, `FileBasedInternalSchemaStorageManager` in `apache/hudi`).
//!
//! Once a table's columns are renamed, dropped or moved ([`SchemaChange`]), a column is known by
//! its id, not its name: every version of the schema is kept (`.hoodie/.schema/<instant>.schemacommit`,
//! newest first, and each commit's `latestSchema` extra metadata), and a file is read through the
//! version it was written under ([`ColumnHistory::columns_at`]): a renamed column is found under
//! its old name, a dropped one is not read, a column dropped and added again under the same name
//! is a new column (null in older files).
//!
//! Ids are assigned as Apache Hudi assigns them from an Avro schema: the fields of a record take
//! consecutive ids first, then the nested types of each field in order (an array's element id, a
//! map's key and value ids, a nested record's fields); the root starts at 0 with the five meta
//! fields.

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;
use std::sync::{Arc, Mutex};

use arrow::array::{RecordBatch, RecordBatchOptions};
use arrow::datatypes::{DataType, Field, FieldRef, Fields, Schema, SchemaRef};

use crate::error::{Error, Result};

/// The folder of the schema history, relative to the table root.
pub const SCHEMA_DIR: &str = ".hoodie/.schema";
/// The suffix of a schema history file (`<instant>.schemacommit`).
pub const SCHEMA_COMMIT_SUFFIX: &str = ".schemacommit";
/// The commit extra-metadata key of the commit's `InternalSchema` (Apache Hudi's
/// `SerDeHelper.LATEST_SCHEMA`).
pub const LATEST_SCHEMA_KEY: &str = "latestSchema";
/// oxlake's table property set once the table's columns are known by id.
pub const SCHEMA_ON_READ_KEY: &str = "oxlake.table.schema.on.read";

/// The path of the schema history file written with the commit at `time`.
pub fn schema_commit_path(time: &str) -> String {
    format!("{SCHEMA_DIR}/{time}{SCHEMA_COMMIT_SUFFIX}")
}

/// One version of a table's schema with column ids.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InternalSchema {
    /// The instant time of the commit that introduced this version.
    pub version: i64,
    /// The largest id any column ever had (ids are never reused).
    pub max_column_id: i32,
    /// The top-level columns, meta fields first.
    pub fields: Vec<Column>,
}

/// A column (or a nested field) and its id.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Column {
    /// Its id, stable across renames.
    pub id: i32,
    /// Its current name.
    pub name: String,
    /// Whether it may be null.
    pub optional: bool,
    /// Its type.
    pub ty: ColumnType,
    /// Its documentation.
    pub doc: Option<String>,
}

/// The type of a column, as Apache Hudi's `Types` name them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ColumnType {
    /// A primitive type: `int`, `long`, `string`, `decimal(10, 2)`, `fixed[16]`...
    Primitive(String),
    /// A nested record.
    Record(Vec<Column>),
    /// A list.
    Array {
        /// The id of the element.
        element_id: i32,
        /// The element type.
        element: Box<ColumnType>,
        /// Whether elements may be null.
        optional: bool,
    },
    /// A map with string keys.
    Map {
        /// The id of the key.
        key_id: i32,
        /// The key type.
        key: Box<ColumnType>,
        /// The id of the value.
        value_id: i32,
        /// The value type.
        value: Box<ColumnType>,
        /// Whether values may be null.
        optional: bool,
    },
}

/// Hands out ids the way Apache Hudi's converter does.
struct Ids(i32);

impl Ids {
    fn take(&mut self, n: i32) -> i32 {
        let first = self.0;
        self.0 += n;
        first
    }
}

fn primitive_name(t: &DataType, path: &str) -> Result<String> {
    use DataType as D;
    Ok(match t {
        D::Boolean => "boolean".into(),
        D::Int8 | D::Int16 | D::Int32 | D::UInt8 | D::UInt16 => "int".into(),
        D::Int64 | D::UInt32 => "long".into(),
        D::Float32 => "float".into(),
        D::Float64 => "double".into(),
        D::Utf8 | D::LargeUtf8 | D::Utf8View => "string".into(),
        D::Binary | D::LargeBinary | D::BinaryView => "binary".into(),
        D::FixedSizeBinary(n) => format!("fixed[{n}]"),
        D::Decimal128(p, s) | D::Decimal256(p, s) => format!("decimal({p}, {s})"),
        D::Date32 | D::Date64 => "date".into(),
        D::Time32(_) | D::Time64(_) => "time".into(),
        // As Apache Hudi (0.14/0.15) derives them from the Avro schema oxlake writes: an instant
        // (`timestamp-millis/micros`) is its `timestamp`; a local date-time
        // (`local-timestamp-*`, which it does not know) the underlying `long`.
        D::Timestamp(_, Some(_)) => "timestamp".into(),
        D::Timestamp(_, None) => "long".into(),
        D::Dictionary(_, v) => return primitive_name(v, path),
        other => {
            return Err(Error::SchemaMismatch {
                detail: format!("column `{path}`: type {other} has no Apache Hudi type"),
            });
        }
    })
}

fn nested_type(t: &DataType, ids: &mut Ids, path: &str) -> Result<ColumnType> {
    Ok(match t {
        DataType::Struct(fields) => ColumnType::Record(record_columns(fields, ids, path)?),
        DataType::List(e) | DataType::LargeList(e) | DataType::FixedSizeList(e, _) => {
            let element_id = ids.take(1);
            let element = Box::new(nested_type(e.data_type(), ids, path)?);
            ColumnType::Array { element_id, element, optional: e.is_nullable() }
        }
        DataType::Map(entries, _) => {
            let DataType::Struct(kv) = entries.data_type() else {
                return Err(Error::SchemaMismatch {
                    detail: format!("column `{path}`: a map without key/value entries"),
                });
            };
            let (Some(k), Some(v)) = (kv.first(), kv.get(1)) else {
                return Err(Error::SchemaMismatch {
                    detail: format!("column `{path}`: a map without key/value entries"),
                });
            };
            let key_id = ids.take(2);
            let key = Box::new(nested_type(k.data_type(), ids, path)?);
            let value = Box::new(nested_type(v.data_type(), ids, path)?);
            ColumnType::Map { key_id, key, value_id: key_id + 1, value, optional: v.is_nullable() }
        }
        other => ColumnType::Primitive(primitive_name(other, path)?),
    })
}

fn record_columns(fields: &Fields, ids: &mut Ids, parent: &str) -> Result<Vec<Column>> {
    let first = ids.take(fields.len() as i32);
    let mut out = Vec::with_capacity(fields.len());
    for (i, f) in fields.iter().enumerate() {
        let path = if parent.is_empty() { f.name().clone() } else { format!("{parent}.{}", f.name()) };
        let ty = nested_type(f.data_type(), ids, &path)?;
        out.push(Column { id: first + i as i32, name: f.name().clone(), optional: f.is_nullable(), ty, doc: None });
    }
    Ok(out)
}

fn max_id(columns: &[Column]) -> i32 {
    fn of_type(t: &ColumnType) -> i32 {
        match t {
            ColumnType::Primitive(_) => -1,
            ColumnType::Record(c) => max_id(c),
            ColumnType::Array { element_id, element, .. } => (*element_id).max(of_type(element)),
            ColumnType::Map { key_id, key, value_id, value, .. } => {
                (*key_id).max(*value_id).max(of_type(key)).max(of_type(value))
            }
        }
    }
    columns.iter().map(|c| c.id.max(of_type(&c.ty))).max().unwrap_or(-1)
}

impl InternalSchema {
    /// Ids for `full` (meta fields first), assigned as Apache Hudi assigns them to a new table.
    pub fn from_arrow(full: &Schema, version: i64) -> Result<Self> {
        let fields = record_columns(full.fields(), &mut Ids(0), "")?;
        Ok(InternalSchema { version, max_column_id: max_id(&fields), fields })
    }

    /// The top-level column named `name`.
    pub fn column(&self, name: &str) -> Option<&Column> {
        self.fields.iter().find(|c| c.name == name)
    }

    /// The top-level column with id `id`.
    pub fn column_by_id(&self, id: i32) -> Option<&Column> {
        self.fields.iter().find(|c| c.id == id)
    }

    /// This schema following `full` (meta fields first) by name, as a write evolves it: columns
    /// and nested fields keep their ids, new ones take fresh ids, primitive types follow `full`.
    /// The version is unchanged; compare with `self` to see whether anything changed.
    pub fn follow(&self, full: &Schema) -> Result<Self> {
        let mut ids = Ids(self.max_column_id + 1);
        let fields = follow_record(&self.fields, full.fields(), &mut ids, "")?;
        Ok(InternalSchema { version: self.version, max_column_id: max_id(&fields).max(self.max_column_id), fields })
    }

    /// The same columns, recorded as the version of the commit at `time`.
    pub fn at_version(mut self, time: &str) -> Result<Self> {
        self.version = parse_version(time)?;
        Ok(self)
    }

    /// Apache Hudi's JSON of this schema (`SerDeHelper.toJson`).
    pub fn to_json(&self) -> String {
        let mut out = String::new();
        write_record(&mut out, &self.fields, Some((self.max_column_id, self.version)));
        out
    }

    /// Parses Apache Hudi's JSON of one schema.
    pub fn from_json(text: &str) -> Result<Self> {
        let value: serde_json::Value =
            serde_json::from_str(text).map_err(|e| Error::corrupt("latestSchema", format!("not JSON: {e}")))?;
        Self::from_value(&value)
    }

    fn from_value(v: &serde_json::Value) -> Result<Self> {
        let bad = |what: &str| Error::corrupt(SCHEMA_DIR, format!("InternalSchema: {what}"));
        let ColumnType::Record(fields) = parse_type(v)? else { return Err(bad("the root is not a record")) };
        let version = v.get("version-id").and_then(|x| x.as_i64()).unwrap_or(0);
        let max_column_id =
            v.get("max_column_id").and_then(|x| x.as_i64()).map_or_else(|| max_id(&fields), |m| m as i32);
        Ok(InternalSchema { version, max_column_id, fields })
    }
}

/// An instant time as a schema version (Apache Hudi parses it as a number).
pub fn parse_version(time: &str) -> Result<i64> {
    time.parse::<i64>().map_err(|_| Error::invalid_arg("instant", format!("`{time}` is not a numeric instant time")))
}

fn follow_record(old: &[Column], new: &Fields, ids: &mut Ids, parent: &str) -> Result<Vec<Column>> {
    // New fields of one record take consecutive ids before their nested types, as on creation.
    let fresh = new.iter().filter(|f| !old.iter().any(|c| &c.name == f.name())).count() as i32;
    let mut next_fresh = ids.take(fresh);
    let mut out = Vec::with_capacity(new.len());
    for f in new {
        let path = if parent.is_empty() { f.name().clone() } else { format!("{parent}.{}", f.name()) };
        match old.iter().find(|c| &c.name == f.name()) {
            Some(c) => {
                let ty = follow_type(&c.ty, f.data_type(), ids, &path)?;
                out.push(Column { ty, optional: f.is_nullable() || c.optional, ..c.clone() });
            }
            None => {
                let ty = nested_type(f.data_type(), ids, &path)?;
                out.push(Column { id: next_fresh, name: f.name().clone(), optional: f.is_nullable(), ty, doc: None });
                next_fresh += 1;
            }
        }
    }
    Ok(out)
}

fn follow_type(old: &ColumnType, new: &DataType, ids: &mut Ids, path: &str) -> Result<ColumnType> {
    Ok(match (old, new) {
        (ColumnType::Record(cols), DataType::Struct(fields)) => {
            ColumnType::Record(follow_record(cols, fields, ids, path)?)
        }
        (
            ColumnType::Array { element_id, element, .. },
            DataType::List(e) | DataType::LargeList(e) | DataType::FixedSizeList(e, _),
        ) => ColumnType::Array {
            element_id: *element_id,
            element: Box::new(follow_type(element, e.data_type(), ids, path)?),
            optional: e.is_nullable(),
        },
        (ColumnType::Map { key_id, key, value_id, value, .. }, DataType::Map(entries, _)) => {
            let DataType::Struct(kv) = entries.data_type() else { return nested_type(new, ids, path) };
            let Some(v) = kv.get(1) else { return nested_type(new, ids, path) };
            ColumnType::Map {
                key_id: *key_id,
                key: key.clone(),
                value_id: *value_id,
                value: Box::new(follow_type(value, v.data_type(), ids, path)?),
                optional: v.is_nullable(),
            }
        }
        _ => nested_type(new, ids, path)?,
    })
}

fn json_str(s: &str) -> String {
    serde_json::Value::String(s.to_string()).to_string()
}

fn write_record(out: &mut String, fields: &[Column], root: Option<(i32, i64)>) {
    out.push('{');
    if let Some((max, version)) = root {
        let _ = write!(out, "\"max_column_id\":{max},\"version-id\":{version},");
    }
    out.push_str("\"type\":\"record\",\"fields\":[");
    for (i, c) in fields.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        let _ = write!(out, "{{\"id\":{},\"name\":{},\"optional\":{},\"type\":", c.id, json_str(&c.name), c.optional);
        write_type(out, &c.ty);
        if let Some(doc) = &c.doc {
            let _ = write!(out, ",\"doc\":{}", json_str(doc));
        }
        out.push('}');
    }
    out.push_str("]}");
}

fn write_type(out: &mut String, t: &ColumnType) {
    match t {
        ColumnType::Primitive(name) => out.push_str(&json_str(name)),
        ColumnType::Record(fields) => write_record(out, fields, None),
        ColumnType::Array { element_id, element, optional } => {
            let _ = write!(out, "{{\"type\":\"array\",\"element-id\":{element_id},\"element\":");
            write_type(out, element);
            let _ = write!(out, ",\"element_optional\":{optional}}}");
        }
        ColumnType::Map { key_id, key, value_id, value, optional } => {
            let _ = write!(out, "{{\"type\":\"map\",\"key-id\":{key_id},\"key\":");
            write_type(out, key);
            let _ = write!(out, ",\"value-id\":{value_id},\"value\":");
            write_type(out, value);
            let _ = write!(out, ",\"value_optional\":{optional}}}");
        }
    }
}

fn parse_type(v: &serde_json::Value) -> Result<ColumnType> {
    let bad = |what: String| Error::corrupt(SCHEMA_DIR, format!("InternalSchema: {what}"));
    if let Some(name) = v.as_str() {
        return Ok(ColumnType::Primitive(name.to_ascii_lowercase()));
    }
    let int = |key: &str| -> Result<i32> {
        v.get(key).and_then(|x| x.as_i64()).map(|x| x as i32).ok_or_else(|| bad(format!("no `{key}`")))
    };
    let flag = |key: &str| v.get(key).and_then(|x| x.as_bool()).unwrap_or(true);
    let sub = |key: &str| v.get(key).ok_or_else(|| bad(format!("no `{key}`"))).and_then(parse_type).map(Box::new);
    match v.get("type").and_then(|t| t.as_str()) {
        Some("record") => {
            let fields =
                v.get("fields").and_then(|f| f.as_array()).ok_or_else(|| bad("a record without fields".into()))?;
            let mut out = Vec::with_capacity(fields.len());
            for f in fields {
                let id = f.get("id").and_then(|x| x.as_i64()).ok_or_else(|| bad("a field without id".into()))? as i32;
                let name = f.get("name").and_then(|x| x.as_str()).ok_or_else(|| bad("a field without name".into()))?;
                let ty = parse_type(f.get("type").ok_or_else(|| bad(format!("field `{name}` without type")))?)?;
                let optional = f.get("optional").and_then(|x| x.as_bool()).unwrap_or(true);
                let doc = f.get("doc").and_then(|x| x.as_str()).map(str::to_string);
                out.push(Column { id, name: name.to_string(), optional, ty, doc });
            }
            Ok(ColumnType::Record(out))
        }
        Some("array") => Ok(ColumnType::Array {
            element_id: int("element-id")?,
            element: sub("element")?,
            optional: flag("element_optional"),
        }),
        Some("map") => Ok(ColumnType::Map {
            key_id: int("key-id")?,
            key: sub("key")?,
            value_id: int("value-id")?,
            value: sub("value")?,
            optional: flag("value_optional"),
        }),
        other => Err(bad(format!("unknown type {other:?}"))),
    }
}

/// Apache Hudi's history JSON (`{"schemas":[...]}`, newest first) of `versions`.
pub fn history_to_json<'a>(versions: impl DoubleEndedIterator<Item = &'a InternalSchema>) -> String {
    let parts: Vec<String> = versions.rev().map(InternalSchema::to_json).collect();
    format!("{{\"schemas\":[{}]}}", parts.join(","))
}

/// Parses a history file: every version by its id.
pub fn parse_history(path: &str, text: &[u8]) -> Result<BTreeMap<i64, InternalSchema>> {
    let value: serde_json::Value =
        serde_json::from_slice(text).map_err(|e| Error::corrupt(path, format!("schema history is not JSON: {e}")))?;
    let schemas = value
        .get("schemas")
        .and_then(|s| s.as_array())
        .ok_or_else(|| Error::corrupt(path, "schema history without `schemas`"))?;
    let mut out = BTreeMap::new();
    for s in schemas {
        let schema = InternalSchema::from_value(s).map_err(|e| Error::corrupt(path, e))?;
        out.insert(schema.version, schema);
    }
    Ok(out)
}

/// What an explicit schema change does ([`apply`]).
#[derive(Clone, Debug, PartialEq)]
pub enum SchemaChange {
    /// Adds a nullable column (`path`: its name, or a struct's path then its name).
    AddColumn {
        /// The struct path of the new field, its name last.
        path: Vec<String>,
        /// Its type.
        data_type: DataType,
        /// Its documentation.
        doc: Option<String>,
    },
    /// Renames a top-level column.
    RenameColumn {
        /// The current name.
        name: String,
        /// The new name.
        new_name: String,
    },
    /// Drops a top-level column.
    DeleteColumn {
        /// Its name.
        name: String,
    },
    /// Widens a column's type (the promotions writes allow).
    UpdateColumn {
        /// The column's path.
        path: Vec<String>,
        /// The new type.
        data_type: DataType,
    },
    /// Moves a top-level column.
    Move {
        /// The column moved.
        name: String,
        /// Where it goes.
        to: Position,
    },
}

/// Where [`SchemaChange::Move`] puts a column.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Position {
    /// The first data column.
    First,
    /// Right after this column.
    After(String),
    /// Right before this column.
    Before(String),
}

fn mismatch(detail: String) -> Error {
    Error::SchemaMismatch { detail }
}

/// The data schema (no meta fields) and column ids after `changes`, applied in order to `data`
/// and `ids` (which covers `data` with the meta fields first). `fixed`: the record key, partition
/// and ordering columns, which keep their names and types. Every refusal is
/// [`Error::SchemaMismatch`] naming the column; nothing is changed.
pub fn apply(
    data: &Schema,
    ids: &InternalSchema,
    changes: &[SchemaChange],
    fixed: &[String],
) -> Result<(SchemaRef, InternalSchema)> {
    let mut fields: Vec<FieldRef> = data.fields().iter().cloned().collect();
    let mut ids = ids.clone();
    let meta = crate::schema::META_FIELDS.len();
    let top = |fields: &[FieldRef], name: &str| fields.iter().position(|f| f.name() == name);
    let check_free = |fields: &[FieldRef], name: &str| -> Result<()> {
        if name.is_empty() || name.contains('\0') || crate::schema::is_meta_field(name) {
            return Err(mismatch(format!("`{}` cannot name a column", name.escape_debug())));
        }
        match top(fields, name) {
            Some(_) => Err(mismatch(format!("column `{name}` already exists"))),
            None => Ok(()),
        }
    };
    let check_mutable = |name: &str, what: &str| -> Result<()> {
        if fixed.iter().any(|f| f == name) {
            return Err(mismatch(format!(
                "column `{name}` is a record key, partition or ordering column: it cannot be {what}"
            )));
        }
        Ok(())
    };
    for change in changes {
        match change {
            SchemaChange::AddColumn { path, data_type, doc } => {
                let Some((name, parents)) = path.split_last() else {
                    return Err(mismatch("add_column: an empty column path".into()));
                };
                let field = Arc::new(crate::schema::normalize_field(&Field::new(name, data_type.clone(), true))?);
                crate::schema::check_avro_names(&field, &parents.join("."))?;
                if parents.is_empty() {
                    check_free(&fields, name)?;
                    fields.push(field.clone());
                } else {
                    fields = add_nested(&fields, parents, field.clone(), &path.join("."))?;
                }
                let mut next = Ids(ids.max_column_id + 1);
                let column = Column {
                    id: next.take(1),
                    name: name.clone(),
                    optional: true,
                    ty: nested_type(field.data_type(), &mut next, &path.join("."))?,
                    doc: doc.clone(),
                };
                add_column_id(&mut ids.fields, parents, column)?;
                ids.max_column_id = next.0 - 1;
            }
            SchemaChange::RenameColumn { name, new_name } => {
                let i = top(&fields, name).ok_or_else(|| mismatch(format!("rename_column: no column `{name}`")))?;
                check_mutable(name, "renamed")?;
                check_free(&fields, new_name)?;
                crate::schema::check_avro_names(&Field::new(new_name, DataType::Null, true), "")?;
                fields[i] = Arc::new(fields[i].as_ref().clone().with_name(new_name));
                if let Some(c) = ids.fields.iter_mut().find(|c| &c.name == name) {
                    c.name = new_name.clone();
                }
            }
            SchemaChange::DeleteColumn { name } => {
                let i = top(&fields, name).ok_or_else(|| mismatch(format!("delete_column: no column `{name}`")))?;
                check_mutable(name, "dropped")?;
                if fields.len() == 1 {
                    return Err(mismatch(format!("delete_column: `{name}` is the last data column")));
                }
                fields.remove(i);
                ids.fields.retain(|c| &c.name != name);
            }
            SchemaChange::UpdateColumn { path, data_type } => {
                let joined = path.join(".");
                if let Some(first) = path.first() {
                    check_mutable(first, "retyped")?;
                }
                fields = update_nested(&fields, path, data_type, &joined)?;
                let updated = fields_type(&fields, path).ok_or_else(|| mismatch(format!("no column `{joined}`")))?;
                let mut next = Ids(ids.max_column_id + 1);
                retype_column_id(&mut ids.fields, path, &updated, &mut next)?;
                ids.max_column_id = ids.max_column_id.max(next.0 - 1);
            }
            SchemaChange::Move { name, to } => {
                let i = top(&fields, name).ok_or_else(|| mismatch(format!("move: no column `{name}`")))?;
                let moved = fields.remove(i);
                let at = match to {
                    Position::First => 0,
                    Position::After(other) | Position::Before(other) => {
                        let j = top(&fields, other).ok_or_else(|| mismatch(format!("move: no column `{other}`")))?;
                        if matches!(to, Position::After(_)) { j + 1 } else { j }
                    }
                };
                fields.insert(at, moved);
            }
        }
    }
    // The ids follow the data columns' order, meta fields first.
    let mut ordered: Vec<Column> = ids.fields[..meta.min(ids.fields.len())].to_vec();
    for f in &fields {
        let c = ids
            .fields
            .iter()
            .find(|c| c.name == *f.name())
            .ok_or_else(|| mismatch(format!("column `{}` has no id", f.name())))?;
        ordered.push(c.clone());
    }
    ids.fields = ordered;
    Ok((Arc::new(Schema::new_with_metadata(fields, data.metadata().clone())), ids))
}

fn struct_fields<'a>(t: &'a DataType, path: &str) -> Result<&'a Fields> {
    match t {
        DataType::Struct(f) => Ok(f),
        other => Err(mismatch(format!("`{path}` is a {other}, not a struct"))),
    }
}

fn add_nested(fields: &[FieldRef], parents: &[String], field: FieldRef, path: &str) -> Result<Vec<FieldRef>> {
    let Some((first, rest)) = parents.split_first() else {
        if fields.iter().any(|f| f.name() == field.name()) {
            return Err(mismatch(format!("column `{path}` already exists")));
        }
        let mut out = fields.to_vec();
        out.push(field);
        return Ok(out);
    };
    let i = fields
        .iter()
        .position(|f| f.name() == first)
        .ok_or_else(|| mismatch(format!("no column `{first}` for `{path}`")))?;
    let inner = struct_fields(fields[i].data_type(), first)?;
    let children = add_nested(&inner.iter().cloned().collect::<Vec<_>>(), rest, field, path)?;
    let mut out = fields.to_vec();
    out[i] = Arc::new(fields[i].as_ref().clone().with_data_type(DataType::Struct(children.into())));
    Ok(out)
}

fn update_nested(fields: &[FieldRef], path: &[String], to: &DataType, joined: &str) -> Result<Vec<FieldRef>> {
    let Some((first, rest)) = path.split_first() else { return Err(mismatch("update_column: an empty path".into())) };
    let i = fields
        .iter()
        .position(|f| f.name() == first)
        .ok_or_else(|| mismatch(format!("update_column: no column `{joined}`")))?;
    let current = fields[i].data_type();
    let new_type = if rest.is_empty() {
        let to = crate::schema::normalize_field(&Field::new(first, to.clone(), true))?.data_type().clone();
        if !crate::schema::evolve::promotable(current, &to) {
            return Err(mismatch(format!("update_column: `{joined}` cannot change from {current} to {to}")));
        }
        to
    } else {
        let inner = struct_fields(current, first)?;
        DataType::Struct(update_nested(&inner.iter().cloned().collect::<Vec<_>>(), rest, to, joined)?.into())
    };
    let mut out = fields.to_vec();
    out[i] = Arc::new(fields[i].as_ref().clone().with_data_type(new_type));
    Ok(out)
}

fn fields_type(fields: &[FieldRef], path: &[String]) -> Option<DataType> {
    let (first, rest) = path.split_first()?;
    let f = fields.iter().find(|f| f.name() == first)?;
    if rest.is_empty() {
        return Some(f.data_type().clone());
    }
    match f.data_type() {
        DataType::Struct(inner) => fields_type(&inner.iter().cloned().collect::<Vec<_>>(), rest),
        _ => None,
    }
}

fn add_column_id(columns: &mut Vec<Column>, parents: &[String], column: Column) -> Result<()> {
    let Some((first, rest)) = parents.split_first() else {
        columns.push(column);
        return Ok(());
    };
    match columns.iter_mut().find(|c| &c.name == first).map(|c| &mut c.ty) {
        Some(ColumnType::Record(inner)) => add_column_id(inner, rest, column),
        _ => Err(mismatch(format!("`{first}` is not a struct with ids"))),
    }
}

fn retype_column_id(columns: &mut [Column], path: &[String], to: &DataType, ids: &mut Ids) -> Result<()> {
    let Some((first, rest)) = path.split_first() else { return Ok(()) };
    let c = columns.iter_mut().find(|c| &c.name == first).ok_or_else(|| mismatch(format!("`{first}` has no id")))?;
    if rest.is_empty() {
        c.ty = follow_type(&c.ty, to, ids, first)?;
        return Ok(());
    }
    match &mut c.ty {
        ColumnType::Record(inner) => retype_column_id(inner, rest, to, ids),
        _ => Err(mismatch(format!("`{first}` is not a struct with ids"))),
    }
}

/// Where a file written under an older version keeps the table's current top-level columns:
/// only the columns whose name differs (renamed, or absent from the file: dropped and added
/// again, or added later).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FileColumns {
    /// Current name → the file's name for the same column (`None`: the file lacks it).
    renamed: HashMap<String, Option<String>>,
    /// The file's names that no current column has (dropped or renamed since): a column a write
    /// adds under one of them is not the file's.
    retired: Vec<String>,
}

impl FileColumns {
    /// The columns of a file written under `file` read as `current`.
    pub fn between(file: &InternalSchema, current: &InternalSchema) -> Self {
        let mut renamed = HashMap::new();
        for c in &current.fields {
            let old = file.column_by_id(c.id).map(|o| o.name.clone());
            if old.as_deref() != Some(c.name.as_str()) {
                // A column the file lacks keeps its name only if no other column of the file
                // has that name (else it would read that column's values).
                let taken = file.column(&c.name).is_some();
                if old.is_some() || taken {
                    renamed.insert(c.name.clone(), old);
                }
            }
        }
        let retired =
            file.fields.iter().filter(|f| current.column(&f.name).is_none()).map(|f| f.name.clone()).collect();
        FileColumns { renamed, retired }
    }

    /// Whether the file names every column as the table does.
    pub fn is_identity(&self) -> bool {
        self.renamed.is_empty() && self.retired.is_empty()
    }

    /// `schema` (the table's names) in the file's names: renamed columns under their old names,
    /// columns the file lacks under a name no file has (so that readers fill them with nulls).
    pub fn file_schema(&self, schema: &SchemaRef) -> SchemaRef {
        if self.is_identity() {
            return schema.clone();
        }
        let fields: Vec<FieldRef> = schema
            .fields()
            .iter()
            .map(|f| match self.renamed.get(f.name()) {
                Some(Some(old)) => Arc::new(f.as_ref().clone().with_name(old)),
                Some(None) => Arc::new(f.as_ref().clone().with_name(format!("\u{0}absent {}", f.name()))),
                None if self.retired.contains(f.name()) => {
                    Arc::new(f.as_ref().clone().with_name(format!("\u{0}absent {}", f.name())))
                }
                None => f.clone(),
            })
            .collect();
        Arc::new(Schema::new_with_metadata(fields, schema.metadata().clone()))
    }

    /// `batch`, read in [`FileColumns::file_schema`] of `schema`, under the table's names.
    pub fn relabel(batch: RecordBatch, schema: &SchemaRef) -> Result<RecordBatch> {
        if batch.schema().fields().iter().zip(schema.fields()).all(|(a, b)| a.name() == b.name()) {
            return Ok(batch);
        }
        Ok(RecordBatch::try_new_with_options(
            schema.clone(),
            batch.columns().to_vec(),
            &RecordBatchOptions::new().with_row_count(Some(batch.num_rows())),
        )?)
    }

    /// Reads a file written under these names into `schema`: `read` gets the file's names.
    pub fn read_into(
        view: Option<&FileColumns>,
        schema: &SchemaRef,
        read: impl FnOnce(&SchemaRef) -> Result<Vec<RecordBatch>>,
    ) -> Result<Vec<RecordBatch>> {
        let Some(view) = view.filter(|v| !v.is_identity()) else { return read(schema) };
        read(&view.file_schema(schema))?.into_iter().map(|b| Self::relabel(b, schema)).collect()
    }
}

/// Every version of a table's column ids, and the file views computed from them.
#[derive(Debug)]
pub struct ColumnHistory {
    versions: BTreeMap<i64, InternalSchema>,
    latest: InternalSchema,
    views: Mutex<HashMap<i64, Arc<FileColumns>>>,
}

impl ColumnHistory {
    /// The history of `versions` (not empty), read as `latest`.
    pub fn new(versions: BTreeMap<i64, InternalSchema>, latest: InternalSchema) -> Self {
        ColumnHistory { versions, latest, views: Mutex::new(HashMap::new()) }
    }

    /// The same versions, read as `ids` (a time-travel read as of an older version).
    pub fn as_of(&self, ids: InternalSchema) -> Self {
        let mut versions = self.versions.clone();
        versions.entry(ids.version).or_insert_with(|| ids.clone());
        ColumnHistory::new(versions, ids)
    }

    /// The schema reads use.
    pub fn latest(&self) -> &InternalSchema {
        &self.latest
    }

    /// Every version, oldest first.
    pub fn versions(&self) -> impl DoubleEndedIterator<Item = &InternalSchema> {
        self.versions.values()
    }

    /// The version in force at `time`: the newest at or before it (the oldest for files older
    /// than every version: those were written before the columns had ids, by name).
    pub fn version_at(&self, time: &str) -> Option<&InternalSchema> {
        let t = time.parse::<i64>().ok()?;
        self.versions.range(..=t).next_back().map(|(_, s)| s).or_else(|| self.versions.values().next())
    }

    /// Whether a data file written at `time` (a log file: its base instant; `None`: not known)
    /// may be older than the latest version.
    pub fn older_than_latest(&self, time: Option<&str>) -> bool {
        time.and_then(|t| t.parse::<i64>().ok()).is_none_or(|t| t < self.latest.version)
    }

    /// How a file written at `time` names the current columns (`None`: as the table does).
    pub fn columns_at(&self, time: &str) -> Option<Arc<FileColumns>> {
        let version = self.version_at(time)?;
        if version.version == self.latest.version {
            return None;
        }
        let mut views = self.views.lock().unwrap_or_else(|p| p.into_inner());
        let view = views
            .entry(version.version)
            .or_insert_with(|| Arc::new(FileColumns::between(version, &self.latest)))
            .clone();
        (!view.is_identity()).then_some(view)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn full() -> Schema {
        let mut fields: Vec<Field> =
            crate::schema::META_FIELDS.iter().map(|n| Field::new(*n, DataType::Utf8, true)).collect();
        fields.push(Field::new("id", DataType::Int64, false));
        fields.push(Field::new(
            "s",
            DataType::Struct(
                vec![Field::new("x", DataType::Int32, true), Field::new("y", DataType::Utf8, true)].into(),
            ),
            true,
        ));
        fields.push(Field::new("l", DataType::List(Arc::new(Field::new("item", DataType::Float64, true))), true));
        fields.push(Field::new("d", DataType::Decimal128(10, 2), true));
        Schema::new(fields)
    }

    #[test]
    fn ids_are_assigned_as_apache_hudi_assigns_them() {
        let s = InternalSchema::from_arrow(&full(), 5).unwrap();
        let ids: Vec<i32> = s.fields.iter().map(|c| c.id).collect();
        assert_eq!(ids, vec![0, 1, 2, 3, 4, 5, 6, 7, 8]);
        // The struct's fields come first, then the list's element.
        let ColumnType::Record(inner) = &s.column("s").unwrap().ty else { panic!() };
        assert_eq!(inner.iter().map(|c| c.id).collect::<Vec<_>>(), vec![9, 10]);
        assert!(matches!(&s.column("l").unwrap().ty, ColumnType::Array { element_id: 11, .. }));
        assert_eq!(s.max_column_id, 11);
        assert_eq!(s.column("d").unwrap().ty, ColumnType::Primitive("decimal(10, 2)".into()));
    }

    #[test]
    fn json_round_trips_in_apache_hudi_field_order() {
        let s = InternalSchema::from_arrow(&full(), 20260101000000000).unwrap();
        let json = s.to_json();
        assert!(json.starts_with("{\"max_column_id\":11,\"version-id\":20260101000000000,\"type\":\"record\",\"fields\":[{\"id\":0,\"name\":\"_hoodie_commit_time\",\"optional\":true,\"type\":\"string\"}"), "{json}");
        assert!(
            json.contains("{\"type\":\"array\",\"element-id\":11,\"element\":\"double\",\"element_optional\":true}"),
            "{json}"
        );
        assert_eq!(InternalSchema::from_json(&json).unwrap(), s);
        let history = history_to_json([s.clone(), s.clone().at_version("20260102000000000").unwrap()].iter());
        let parsed = parse_history("h", history.as_bytes()).unwrap();
        assert_eq!(parsed.keys().copied().collect::<Vec<_>>(), vec![20260101000000000, 20260102000000000]);
        // Newest first, as `SerDeHelper.inheritSchemas` writes it.
        assert!(history.starts_with("{\"schemas\":[{\"max_column_id\":11,\"version-id\":20260102000000000"));
    }

    #[test]
    fn renames_drops_and_moves_keep_ids() {
        let f = full();
        let ids = InternalSchema::from_arrow(&f, 1).unwrap();
        let data = crate::schema::without_meta_fields(&f);
        let changes = vec![
            SchemaChange::RenameColumn { name: "d".into(), new_name: "amount".into() },
            SchemaChange::DeleteColumn { name: "l".into() },
            SchemaChange::AddColumn { path: vec!["l".into()], data_type: DataType::Utf8, doc: None },
            SchemaChange::AddColumn { path: vec!["s".into(), "z".into()], data_type: DataType::Int64, doc: None },
            SchemaChange::UpdateColumn { path: vec!["s".into(), "x".into()], data_type: DataType::Int64 },
            SchemaChange::Move { name: "amount".into(), to: Position::First },
        ];
        let (data2, ids2) = apply(&data, &ids, &changes, &["id".into()]).unwrap();
        let names: Vec<&str> = data2.fields().iter().map(|f| f.name().as_str()).collect();
        assert_eq!(names, vec!["amount", "id", "s", "l"]);
        assert_eq!(ids2.column("amount").unwrap().id, 8);
        assert_eq!(ids2.column("l").unwrap().id, 12, "a column added again is a new column");
        let ColumnType::Record(inner) = &ids2.column("s").unwrap().ty else { panic!() };
        assert_eq!(
            inner.iter().map(|c| (c.id, c.ty.clone())).collect::<Vec<_>>()[0],
            (9, ColumnType::Primitive("long".into()))
        );
        assert_eq!(inner[2].id, 13);
        let ids2 = ids2.at_version("2").unwrap();
        let view = FileColumns::between(&ids, &ids2);
        let names = view.file_schema(&crate::schema::with_meta_fields(&data2));
        let names: Vec<&str> = names.fields().iter().skip(5).map(|f| f.name().as_str()).collect();
        assert_eq!(names, vec!["d", "id", "s", "\u{0}absent l"]);
        // A column a write adds by name under a name the file used for another column (`d`, now
        // `amount`) is not read from the file.
        let added = Arc::new(Schema::new(vec![Field::new("d", DataType::Utf8, true)]));
        assert_eq!(view.file_schema(&added).field(0).name(), "\u{0}absent d");
    }

    #[test]
    fn refusals_name_the_column() {
        let f = full();
        let ids = InternalSchema::from_arrow(&f, 1).unwrap();
        let data = crate::schema::without_meta_fields(&f);
        let refuse = |c: SchemaChange| apply(&data, &ids, &[c], &["id".into()]).unwrap_err().to_string();
        assert!(refuse(SchemaChange::RenameColumn { name: "id".into(), new_name: "k".into() }).contains("`id`"));
        assert!(
            refuse(SchemaChange::RenameColumn { name: "d".into(), new_name: "s".into() }).contains("already exists")
        );
        assert!(refuse(SchemaChange::DeleteColumn { name: "nope".into() }).contains("`nope`"));
        assert!(
            refuse(SchemaChange::UpdateColumn { path: vec!["d".into()], data_type: DataType::Int32 }).contains("`d`")
        );
        assert!(
            refuse(SchemaChange::AddColumn { path: vec!["_hoodie_x".into()], data_type: DataType::Int32, doc: None })
                .contains("cannot name")
        );
    }

    #[test]
    fn a_write_adding_columns_takes_fresh_ids() {
        let ids = InternalSchema::from_arrow(&full(), 1).unwrap();
        let mut fields: Vec<FieldRef> = full().fields().iter().cloned().collect();
        fields.push(Arc::new(Field::new("n", DataType::Utf8, true)));
        let followed = ids.follow(&Schema::new(fields)).unwrap();
        assert_eq!(followed.column("n").unwrap().id, 12);
        assert_eq!(followed.max_column_id, 12);
        assert_eq!(ids.follow(&full()).unwrap(), ids);
    }
}
