//! The Avro binary encoding, as much of it as Hudi log blocks and timeline files use: datums of a
//! record schema (Avro data blocks) decoded into Arrow columns, the primitives the delete block is
//! made of, and object container files (timeline plans and metadata) read into and written from JSON.
//!
//! Encoding rules (Avro 1.11 specification): `int`/`long` are zig-zag varints, `float`/`double`
//! little-endian IEEE 754, `bytes`/`string` a long length then the bytes, a union the branch index
//! (a long) then the branch's value, an array blocks of `count` items ended by a zero count (a
//! negative count is followed by the block's byte size).

use arrow::array::{ArrayRef, RecordBatch, new_null_array};
use arrow::datatypes::{DataType, SchemaRef, TimeUnit};
use datafusion::common::ScalarValue;
use serde_json::Value as Json;

use crate::error::{Error, Result};

/// Reads Avro primitives from a byte slice. Every read checks bounds: malformed input is an
/// error, never a panic.
pub struct Decoder<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Decoder<'a> {
    /// A decoder at the start of `buf`.
    pub fn new(buf: &'a [u8]) -> Self {
        Decoder { buf, pos: 0 }
    }

    /// Bytes consumed so far.
    pub fn position(&self) -> usize {
        self.pos
    }

    /// Whether every byte has been consumed.
    pub fn is_empty(&self) -> bool {
        self.pos >= self.buf.len()
    }

    fn err(&self, what: &str) -> Error {
        Error::invalid_data(format!("avro: {what} at byte {}", self.pos))
    }

    /// The next `n` bytes, as they are.
    pub fn take(&mut self, n: usize) -> Result<&'a [u8]> {
        let end = self.pos.checked_add(n).filter(|&e| e <= self.buf.len()).ok_or_else(|| self.err("truncated"))?;
        let out = &self.buf[self.pos..end];
        self.pos = end;
        Ok(out)
    }

    /// A `long`: a zig-zag varint of at most 10 bytes.
    pub fn long(&mut self) -> Result<i64> {
        let mut value: u64 = 0;
        for shift in (0..64).step_by(7) {
            let b = self.take(1)?[0];
            value |= u64::from(b & 0x7f) << shift;
            if b & 0x80 == 0 {
                return Ok((value >> 1) as i64 ^ -((value & 1) as i64));
            }
        }
        Err(self.err("varint longer than 10 bytes"))
    }

    /// An `int`: a `long` that must fit 32 bits.
    pub fn int(&mut self) -> Result<i32> {
        i32::try_from(self.long()?).map_err(|_| self.err("int out of range"))
    }

    /// A `boolean`: one byte, non-zero for true.
    pub fn boolean(&mut self) -> Result<bool> {
        Ok(self.take(1)?[0] != 0)
    }

    /// A `float`: 4 bytes, little-endian.
    pub fn float(&mut self) -> Result<f32> {
        let b = self.take(4)?;
        Ok(f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }

    /// A `double`: 8 bytes, little-endian.
    pub fn double(&mut self) -> Result<f64> {
        let b = self.take(8)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(b);
        Ok(f64::from_le_bytes(a))
    }

    /// `bytes`: a `long` length, then that many bytes.
    pub fn bytes(&mut self) -> Result<&'a [u8]> {
        let n = self.long()?;
        let n = usize::try_from(n).map_err(|_| self.err("negative length"))?;
        self.take(n)
    }

    /// A `string`: as `bytes`, which must be UTF-8.
    pub fn string(&mut self) -> Result<&'a str> {
        let b = self.bytes()?;
        std::str::from_utf8(b).map_err(|_| self.err("string is not UTF-8"))
    }

    /// The item count of the next array or map block (0 ends the array).
    pub fn block_count(&mut self) -> Result<usize> {
        let n = self.long()?;
        if n < 0 {
            self.long()?; // byte size of the block, not needed to decode it
        }
        usize::try_from(n.unsigned_abs()).map_err(|_| self.err("block count"))
    }
}

/// Appends Avro primitives to a buffer.
#[derive(Default)]
pub struct Encoder {
    /// The encoded bytes so far.
    pub buf: Vec<u8>,
}

impl Encoder {
    /// Appends a `long` as a zig-zag varint.
    pub fn long(&mut self, v: i64) {
        let mut z = ((v << 1) ^ (v >> 63)) as u64;
        loop {
            let b = (z & 0x7f) as u8;
            z >>= 7;
            if z == 0 {
                self.buf.push(b);
                return;
            }
            self.buf.push(b | 0x80);
        }
    }

    /// Appends a `boolean` as one byte, 1 for true.
    pub fn boolean(&mut self, v: bool) {
        self.buf.push(u8::from(v));
    }

    /// Appends a `float`, 4 bytes little-endian.
    pub fn float(&mut self, v: f32) {
        self.buf.extend_from_slice(&v.to_le_bytes());
    }

    /// Appends a `double`, 8 bytes little-endian.
    pub fn double(&mut self, v: f64) {
        self.buf.extend_from_slice(&v.to_le_bytes());
    }

    /// Appends `bytes`: the length as a `long`, then the bytes.
    pub fn bytes(&mut self, v: &[u8]) {
        self.long(v.len() as i64);
        self.buf.extend_from_slice(v);
    }

    /// Appends a `string`: its UTF-8 bytes as `bytes`.
    pub fn string(&mut self, v: &str) {
        self.bytes(v.as_bytes());
    }
}

/// A parsed Avro schema, resolved enough to decode datums.
#[derive(Clone, Debug)]
enum Schema {
    Null,
    Boolean,
    Int,
    Long,
    Float,
    Double,
    Bytes,
    String,
    Fixed(usize),
    Enum(Vec<String>),
    Union(Vec<Schema>),
    /// Fields: name, schema, and the default a writer uses for a value without the field.
    Record(Vec<(String, Schema, Option<Json>)>),
    /// Arrays and maps: decoded into JSON (container files), not into table columns.
    Array(Box<Schema>),
    Map(Box<Schema>),
}

fn parse_schema(j: &Json, named: &mut Vec<(String, Schema)>) -> Result<Schema> {
    let bad = || Error::invalid_data(format!("avro schema: unsupported type {j}"));
    Ok(match j {
        Json::String(s) => match s.as_str() {
            "null" => Schema::Null,
            "boolean" => Schema::Boolean,
            "int" => Schema::Int,
            "long" => Schema::Long,
            "float" => Schema::Float,
            "double" => Schema::Double,
            "bytes" => Schema::Bytes,
            "string" => Schema::String,
            // A reference to a named type defined earlier (full or short name).
            name => named
                .iter()
                .rev()
                .find(|(n, _)| n == name || n.rsplit('.').next() == Some(name))
                .map(|(_, s)| s.clone())
                .ok_or_else(bad)?,
        },
        Json::Array(branches) => Schema::Union(branches.iter().map(|b| parse_schema(b, named)).collect::<Result<_>>()?),
        Json::Object(o) => {
            let t = o.get("type").ok_or_else(bad)?;
            let name = o.get("name").and_then(Json::as_str).unwrap_or_default().to_string();
            let schema = match t.as_str() {
                Some("record") | Some("error") => {
                    let fields = o.get("fields").and_then(Json::as_array).ok_or_else(bad)?;
                    let mut out = Vec::with_capacity(fields.len());
                    for f in fields {
                        let fname = f.get("name").and_then(Json::as_str).ok_or_else(bad)?;
                        let schema = parse_schema(f.get("type").ok_or_else(bad)?, named)?;
                        out.push((fname.to_string(), schema, f.get("default").cloned()));
                    }
                    Schema::Record(out)
                }
                Some("enum") => Schema::Enum(
                    o.get("symbols")
                        .and_then(Json::as_array)
                        .ok_or_else(bad)?
                        .iter()
                        .map(|s| s.as_str().unwrap_or_default().to_string())
                        .collect(),
                ),
                Some("fixed") => Schema::Fixed(o.get("size").and_then(Json::as_u64).ok_or_else(bad)? as usize),
                Some("array") => Schema::Array(Box::new(parse_schema(o.get("items").ok_or_else(bad)?, named)?)),
                Some("map") => Schema::Map(Box::new(parse_schema(o.get("values").ok_or_else(bad)?, named)?)),
                // `{"type": "long", "logicalType": ...}`: the logical type is applied on conversion.
                _ => parse_schema(t, named)?,
            };
            if !name.is_empty() {
                let full = match o.get("namespace").and_then(Json::as_str) {
                    Some(ns) if !name.contains('.') => format!("{ns}.{name}"),
                    _ => name,
                };
                named.push((full, schema.clone()));
            }
            schema
        }
        _ => return Err(bad()),
    })
}

/// A decoded Avro value.
#[derive(Clone, Debug, PartialEq)]
enum Value {
    Null,
    Boolean(bool),
    Int(i32),
    Long(i64),
    Float(f32),
    Double(f64),
    Bytes(Vec<u8>),
    String(String),
}

fn decode_value(d: &mut Decoder<'_>, s: &Schema) -> Result<Value> {
    Ok(match s {
        Schema::Null => Value::Null,
        Schema::Boolean => Value::Boolean(d.boolean()?),
        Schema::Int => Value::Int(d.int()?),
        Schema::Long => Value::Long(d.long()?),
        Schema::Float => Value::Float(d.float()?),
        Schema::Double => Value::Double(d.double()?),
        Schema::Bytes => Value::Bytes(d.bytes()?.to_vec()),
        Schema::String => Value::String(d.string()?.to_string()),
        Schema::Fixed(n) => Value::Bytes(d.take(*n)?.to_vec()),
        Schema::Enum(symbols) => {
            let i = d.int()?;
            let sym = usize::try_from(i).ok().and_then(|i| symbols.get(i));
            Value::String(sym.ok_or_else(|| Error::invalid_data(format!("avro: enum index {i}")))?.clone())
        }
        Schema::Union(branches) => {
            let i = d.long()?;
            let branch = usize::try_from(i).ok().and_then(|i| branches.get(i));
            decode_value(d, branch.ok_or_else(|| Error::invalid_data(format!("avro: union index {i}")))?)?
        }
        Schema::Record(_) | Schema::Array(_) | Schema::Map(_) => {
            return Err(Error::unsupported("nested columns in Avro log blocks"));
        }
    })
}

/// Decodes one datum into JSON: records and maps become objects (null fields left out, so that
/// serde defaults apply), arrays arrays, bytes and fixed base64 strings.
fn decode_json(d: &mut Decoder<'_>, s: &Schema) -> Result<Json> {
    use base64::Engine as _;
    Ok(match s {
        Schema::Null => Json::Null,
        Schema::Boolean => Json::Bool(d.boolean()?),
        Schema::Int => Json::from(d.int()?),
        Schema::Long => Json::from(d.long()?),
        Schema::Float => serde_json::Number::from_f64(f64::from(d.float()?)).map_or(Json::Null, Json::Number),
        Schema::Double => serde_json::Number::from_f64(d.double()?).map_or(Json::Null, Json::Number),
        Schema::Bytes => Json::String(base64::engine::general_purpose::STANDARD.encode(d.bytes()?)),
        Schema::Fixed(n) => Json::String(base64::engine::general_purpose::STANDARD.encode(d.take(*n)?)),
        Schema::String => Json::String(d.string()?.to_string()),
        Schema::Enum(_) | Schema::Union(_) => match decode_value_or_branch(d, s)? {
            Ok(v) => v,
            Err(branch) => decode_json(d, branch)?,
        },
        Schema::Record(fields) => {
            let mut out = serde_json::Map::with_capacity(fields.len());
            for (name, f, _) in fields {
                let v = decode_json(d, f)?;
                if !v.is_null() {
                    out.insert(name.clone(), v);
                }
            }
            Json::Object(out)
        }
        Schema::Array(items) => {
            let mut out = Vec::new();
            loop {
                let n = d.block_count()?;
                if n == 0 {
                    break;
                }
                for _ in 0..n {
                    out.push(decode_json(d, items)?);
                }
            }
            Json::Array(out)
        }
        Schema::Map(values) => {
            let mut out = serde_json::Map::new();
            loop {
                let n = d.block_count()?;
                if n == 0 {
                    break;
                }
                for _ in 0..n {
                    let k = d.string()?.to_string();
                    let v = decode_json(d, values)?;
                    if !v.is_null() {
                        out.insert(k, v);
                    }
                }
            }
            Json::Object(out)
        }
    })
}

/// An enum's symbol, or the branch of a union to decode next.
fn decode_value_or_branch<'s>(d: &mut Decoder<'_>, s: &'s Schema) -> Result<std::result::Result<Json, &'s Schema>> {
    match s {
        Schema::Enum(symbols) => {
            let i = d.int()?;
            let sym = usize::try_from(i).ok().and_then(|i| symbols.get(i));
            Ok(Ok(Json::String(sym.ok_or_else(|| Error::invalid_data(format!("avro: enum index {i}")))?.clone())))
        }
        Schema::Union(branches) => {
            let i = d.long()?;
            let branch = usize::try_from(i).ok().and_then(|i| branches.get(i));
            Ok(Err(branch.ok_or_else(|| Error::invalid_data(format!("avro: union index {i}")))?))
        }
        _ => Err(Error::invalid_data("avro: not an enum or union")),
    }
}

/// The magic bytes of an Avro object container file.
const CONTAINER_MAGIC: &[u8; 4] = b"Obj\x01";

/// Whether `bytes` start like an Avro object container file.
pub fn is_container(bytes: &[u8]) -> bool {
    bytes.starts_with(CONTAINER_MAGIC)
}

/// Reads an Avro object container file (codec `null`, as Apache Hudi writes its timeline files)
/// into JSON records, one per datum, in file order.
pub fn read_container(bytes: &[u8]) -> Result<Vec<Json>> {
    Ok(read_container_with_schema(bytes)?.1)
}

/// [`read_container`], with the writer schema's JSON text.
pub fn read_container_with_schema(bytes: &[u8]) -> Result<(String, Vec<Json>)> {
    let mut d = Decoder::new(bytes);
    if d.take(4)? != CONTAINER_MAGIC {
        return Err(Error::invalid_data("avro container: bad magic"));
    }
    let mut schema: Option<(String, Json)> = None;
    let mut codec = "null".to_string();
    loop {
        let n = d.block_count()?;
        if n == 0 {
            break;
        }
        for _ in 0..n {
            let key = d.string()?.to_string();
            let value = d.bytes()?;
            match key.as_str() {
                "avro.schema" => {
                    let text = std::str::from_utf8(value)
                        .map_err(|_| Error::invalid_data("avro container schema is not UTF-8"))?;
                    let json = serde_json::from_str(text)
                        .map_err(|e| Error::invalid_data(format!("avro container schema: {e}")))?;
                    schema = Some((text.to_string(), json));
                }
                "avro.codec" => codec = String::from_utf8_lossy(value).into_owned(),
                _ => {}
            }
        }
    }
    if codec != "null" {
        return Err(Error::unsupported(format!("avro container codec {codec}")));
    }
    let (text, json) = schema.ok_or_else(|| Error::invalid_data("avro container without schema"))?;
    let schema = parse_schema(&json, &mut Vec::new())?;
    let sync = d.take(16)?;
    let mut out = Vec::new();
    while !d.is_empty() {
        let count = d.long()?;
        let size = usize::try_from(d.long()?).map_err(|_| Error::invalid_data("avro container: bad block size"))?;
        let mut block = Decoder::new(d.take(size)?);
        for _ in 0..count.max(0) {
            out.push(decode_json(&mut block, &schema)?);
        }
        if d.take(16)? != sync {
            return Err(Error::invalid_data("avro container: sync marker mismatch"));
        }
    }
    Ok((text, out))
}

/// Reads the record of a timeline file that Apache Hudi writes as an Avro container (commit
/// metadata, compaction and clustering plans hold one record each) as `T`. A damaged file or a
/// record that is not a `T` is a `CorruptTable` error naming `path`.
pub fn read_timeline_record<T: serde::de::DeserializeOwned>(path: &str, bytes: &[u8]) -> Result<T> {
    let records = read_container(bytes).map_err(|e| match e {
        Error::Unsupported { .. } => e,
        e => Error::corrupt(path, e),
    })?;
    let first = records.into_iter().next().ok_or_else(|| Error::corrupt(path, "no record in the Avro container"))?;
    serde_json::from_value(first).map_err(|e| Error::corrupt(path, e))
}

/// Writes `records` (JSON values, as [`read_container`] returns them) as an Avro object container
/// file of `schema` (the JSON text of the writer schema, stored verbatim as `avro.schema`), the way
/// Apache Hudi's `TimelineMetadataUtils.serializeAvroMetadata` (Java `DataFileWriter`) does: codec
/// `null` (no `avro.codec` entry, as Java leaves it out), a random sync marker, one block.
///
/// A record field missing from a value is written as null; a value the schema cannot hold is an
/// error naming the field.
pub fn write_container(schema: &str, records: &[Json]) -> Result<Vec<u8>> {
    let json: Json = serde_json::from_str(schema).map_err(|e| Error::invalid_data(format!("avro schema: {e}")))?;
    let parsed = parse_schema(&json, &mut Vec::new())?;
    let mut body = Encoder::default();
    for r in records {
        encode_json(&mut body, &parsed, r, "")?;
    }
    let mut e = Encoder::default();
    e.buf.extend_from_slice(CONTAINER_MAGIC);
    e.long(1);
    e.string("avro.schema");
    e.bytes(schema.as_bytes());
    e.long(0);
    let sync = *uuid::Uuid::new_v4().as_bytes();
    e.buf.extend_from_slice(&sync);
    if !records.is_empty() {
        e.long(records.len() as i64);
        e.bytes(&body.buf);
        e.buf.extend_from_slice(&sync);
    }
    Ok(e.buf)
}

/// Encodes JSON values (as [`read_container`] returns them) as Avro datums of one writer schema:
/// the records of an Avro data block.
pub struct DatumWriter {
    schema: Schema,
}

impl DatumWriter {
    /// `schema`: the JSON text of the writer schema.
    pub fn new(schema: &str) -> Result<Self> {
        let json: Json = serde_json::from_str(schema).map_err(|e| Error::invalid_data(format!("avro schema: {e}")))?;
        Ok(DatumWriter { schema: parse_schema(&json, &mut Vec::new())? })
    }

    /// The binary encoding of `value`; a value the schema cannot hold is an error naming the field.
    pub fn encode(&self, value: &Json) -> Result<Vec<u8>> {
        let mut e = Encoder::default();
        encode_json(&mut e, &self.schema, value, "")?;
        Ok(e.buf)
    }
}

/// Decodes one datum of the writer schema `schema` into JSON (as [`read_container`] does).
pub fn decode_datum(schema: &str, datum: &[u8]) -> Result<Json> {
    let json: Json = serde_json::from_str(schema).map_err(|e| Error::invalid_data(format!("avro schema: {e}")))?;
    let parsed = parse_schema(&json, &mut Vec::new())?;
    let mut d = Decoder::new(datum);
    decode_json(&mut d, &parsed)
}

/// Encodes one JSON value as a datum of `s`; `at` names the field for errors.
fn encode_json(e: &mut Encoder, s: &Schema, v: &Json, at: &str) -> Result<()> {
    use base64::Engine as _;
    let mismatch = || Error::invalid_data(format!("avro: `{at}` cannot hold {v}"));
    match (s, v) {
        (Schema::Null, Json::Null) => {}
        (Schema::Boolean, Json::Bool(b)) => e.boolean(*b),
        (Schema::Int, Json::Number(n)) => {
            e.long(i64::from(n.as_i64().and_then(|l| i32::try_from(l).ok()).ok_or_else(mismatch)?))
        }
        (Schema::Long, Json::Number(n)) => e.long(n.as_i64().ok_or_else(mismatch)?),
        // f64 to f32 is the float the schema asks for; JSON holds no other precision.
        (Schema::Float, Json::Number(n)) => e.float(n.as_f64().ok_or_else(mismatch)? as f32),
        (Schema::Double, Json::Number(n)) => e.double(n.as_f64().ok_or_else(mismatch)?),
        (Schema::String, Json::String(t)) => e.string(t),
        (Schema::Bytes, Json::String(t)) => {
            e.bytes(&base64::engine::general_purpose::STANDARD.decode(t).map_err(|_| mismatch())?)
        }
        (Schema::Fixed(n), Json::String(t)) => {
            let b = base64::engine::general_purpose::STANDARD.decode(t).map_err(|_| mismatch())?;
            if b.len() != *n {
                return Err(mismatch());
            }
            e.buf.extend_from_slice(&b);
        }
        (Schema::Enum(symbols), Json::String(t)) => {
            e.long(symbols.iter().position(|x| x == t).ok_or_else(mismatch)? as i64)
        }
        (Schema::Union(branches), _) => {
            let i = branches.iter().position(|b| accepts(b, v)).ok_or_else(mismatch)?;
            e.long(i as i64);
            encode_json(e, &branches[i], v, at)?;
        }
        (Schema::Record(fields), Json::Object(o)) => {
            for (name, f, default) in fields {
                let field = if at.is_empty() { name.clone() } else { format!("{at}.{name}") };
                // A field the value lacks is null where the schema takes null, else the schema's
                // default (as Avro schema resolution fills a reader field the writer lacked).
                let value = match o.get(name) {
                    Some(v) if !v.is_null() => v,
                    _ if accepts(f, &Json::Null) => &Json::Null,
                    _ => default.as_ref().filter(|d| accepts(f, d)).unwrap_or(&Json::Null),
                };
                encode_json(e, f, value, &field)?;
            }
        }
        (Schema::Array(items), Json::Array(a)) => {
            if !a.is_empty() {
                e.long(a.len() as i64);
                for (i, x) in a.iter().enumerate() {
                    encode_json(e, items, x, &format!("{at}[{i}]"))?;
                }
            }
            e.long(0);
        }
        (Schema::Map(values), Json::Object(o)) => {
            if !o.is_empty() {
                e.long(o.len() as i64);
                for (k, x) in o {
                    e.string(k);
                    encode_json(e, values, x, &format!("{at}[{k}]"))?;
                }
            }
            e.long(0);
        }
        _ => return Err(mismatch()),
    }
    Ok(())
}

/// Whether a union branch of schema `s` takes the value `v` (the first that does is written).
fn accepts(s: &Schema, v: &Json) -> bool {
    match (s, v) {
        (Schema::Null, Json::Null) | (Schema::Boolean, Json::Bool(_)) => true,
        (Schema::Int, Json::Number(n)) => n.as_i64().is_some_and(|l| i32::try_from(l).is_ok()),
        (Schema::Long, Json::Number(n)) => n.as_i64().is_some(),
        (Schema::Float | Schema::Double, Json::Number(_)) => true,
        (Schema::String | Schema::Bytes | Schema::Fixed(_), Json::String(_)) => true,
        (Schema::Enum(symbols), Json::String(t)) => symbols.contains(t),
        (Schema::Record(_) | Schema::Map(_), Json::Object(_)) | (Schema::Array(_), Json::Array(_)) => true,
        (Schema::Union(branches), _) => branches.iter().any(|b| accepts(b, v)),
        _ => false,
    }
}

/// Decodes Avro datums of a record schema (`writer_schema`, JSON) into a batch of `target`:
/// columns are matched by name, target columns the writer did not have are null.
pub struct DatumReader {
    fields: Vec<(String, Schema, Option<Json>)>,
    target: SchemaRef,
    /// For each target column, the writer field it comes from, and the type the writer gave it
    /// where the table widened it since (decoded as written, then promoted).
    sources: Vec<Option<(usize, Option<DataType>)>>,
}

impl DatumReader {
    /// A reader of datums written with `writer_schema` (a record schema, as JSON) into batches of `target`.
    pub fn new(writer_schema: &str, target: SchemaRef) -> Result<Self> {
        let json: Json =
            serde_json::from_str(writer_schema).map_err(|e| Error::invalid_data(format!("avro schema: {e}")))?;
        let Schema::Record(fields) = parse_schema(&json, &mut Vec::new())? else {
            return Err(Error::invalid_data("avro schema of a data block is not a record"));
        };
        // A block written before a promotion holds values of the older type (a decimal's scale,
        // an int where the table now has longs or strings): decoded in it, then promoted.
        let written = crate::schema::from_avro(writer_schema).ok();
        let sources = target
            .fields()
            .iter()
            .map(|f| {
                let i = fields.iter().position(|(n, _, _)| n == f.name())?;
                let older = written.as_ref().and_then(|w| w.field_with_name(f.name()).ok()).map(|w| w.data_type());
                let older =
                    older.filter(|w| *w != f.data_type() && crate::schema::evolve::promotable(w, f.data_type()));
                Some((i, older.cloned()))
            })
            .collect();
        Ok(DatumReader { fields, target, sources })
    }

    /// Decodes the datums, each a complete record.
    pub fn read<'a>(&self, datums: impl IntoIterator<Item = &'a [u8]>) -> Result<RecordBatch> {
        let mut columns: Vec<Vec<Value>> = vec![Vec::new(); self.fields.len()];
        let mut rows = 0;
        for datum in datums {
            let mut d = Decoder::new(datum);
            for (i, (_, s, _)) in self.fields.iter().enumerate() {
                columns[i].push(decode_value(&mut d, s)?);
            }
            rows += 1;
        }
        let arrays = self
            .target
            .fields()
            .iter()
            .zip(&self.sources)
            .map(|(f, src)| match src {
                Some((i, None)) => to_array(&columns[*i], f.data_type()),
                Some((i, Some(older))) => {
                    crate::schema::evolve::project(&to_array(&columns[*i], older)?, f.data_type(), f.name())
                }
                None => Ok(new_null_array(f.data_type(), rows)),
            })
            .collect::<Result<Vec<ArrayRef>>>()?;
        let options = arrow::array::RecordBatchOptions::new().with_row_count(Some(rows));
        Ok(RecordBatch::try_new_with_options(self.target.clone(), arrays, &options)?)
    }
}

/// One column of decoded values as an Arrow array of `dt`.
fn to_array(values: &[Value], dt: &DataType) -> Result<ArrayRef> {
    let scalars = values.iter().map(|v| to_scalar(v, dt)).collect::<Result<Vec<_>>>()?;
    if scalars.is_empty() {
        return Ok(new_null_array(dt, 0));
    }
    Ok(ScalarValue::iter_to_array(scalars)?)
}

/// An Avro value as a scalar of the Arrow type the table uses for it.
fn to_scalar(v: &Value, dt: &DataType) -> Result<ScalarValue> {
    use DataType as D;
    let mismatch = || Error::invalid_data(format!("avro value {v:?} does not fit column type {dt}"));
    if *v == Value::Null {
        return Ok(ScalarValue::try_from(dt)?);
    }
    let long = match v {
        Value::Int(i) => Some(i64::from(*i)),
        Value::Long(l) => Some(*l),
        _ => None,
    };
    Ok(match (dt, v) {
        (D::Boolean, Value::Boolean(b)) => ScalarValue::Boolean(Some(*b)),
        (D::Int8, _) => ScalarValue::Int8(long.and_then(|l| i8::try_from(l).ok()).map(Some).ok_or_else(mismatch)?),
        (D::Int16, _) => ScalarValue::Int16(long.and_then(|l| i16::try_from(l).ok()).map(Some).ok_or_else(mismatch)?),
        (D::Int32, _) => ScalarValue::Int32(long.and_then(|l| i32::try_from(l).ok()).map(Some).ok_or_else(mismatch)?),
        (D::Int64, _) => ScalarValue::Int64(Some(long.ok_or_else(mismatch)?)),
        (D::Date32, _) => ScalarValue::Date32(long.and_then(|l| i32::try_from(l).ok()).map(Some).ok_or_else(mismatch)?),
        (D::Float32, Value::Float(f)) => ScalarValue::Float32(Some(*f)),
        (D::Float64, Value::Double(f)) => ScalarValue::Float64(Some(*f)),
        (D::Float64, Value::Float(f)) => ScalarValue::Float64(Some(f64::from(*f))),
        (D::Utf8, Value::String(s)) => ScalarValue::Utf8(Some(s.clone())),
        (D::LargeUtf8, Value::String(s)) => ScalarValue::LargeUtf8(Some(s.clone())),
        (D::Binary, Value::Bytes(b)) => ScalarValue::Binary(Some(b.clone())),
        (D::FixedSizeBinary(n), Value::Bytes(b)) => ScalarValue::FixedSizeBinary(*n, Some(b.clone())),
        (D::Timestamp(unit, tz), _) => {
            let l = long.ok_or_else(mismatch)?;
            match unit {
                TimeUnit::Second => ScalarValue::TimestampSecond(Some(l), tz.clone()),
                TimeUnit::Millisecond => ScalarValue::TimestampMillisecond(Some(l), tz.clone()),
                TimeUnit::Microsecond => ScalarValue::TimestampMicrosecond(Some(l), tz.clone()),
                TimeUnit::Nanosecond => ScalarValue::TimestampNanosecond(Some(l), tz.clone()),
            }
        }
        (D::Decimal128(p, s), Value::Bytes(b)) => {
            // Big-endian two's complement, sign-extended to 16 bytes.
            if b.len() > 16 {
                return Err(mismatch());
            }
            let fill = if b.first().is_some_and(|x| x & 0x80 != 0) { 0xff } else { 0 };
            let mut full = [fill; 16];
            full[16 - b.len()..].copy_from_slice(b);
            ScalarValue::Decimal128(Some(i128::from_be_bytes(full)), *p, *s)
        }
        _ => return Err(mismatch()),
    })
}

/// Convenience: the values of an `["null", T]` style field list of the same schema as Arrow
/// arrays (used by tests).
#[cfg(test)]
pub(crate) fn decode_one(schema: &str, datum: &[u8]) -> Result<Vec<String>> {
    let json: Json = serde_json::from_str(schema).map_err(Error::invalid_data)?;
    let s = parse_schema(&json, &mut Vec::new())?;
    let Schema::Record(fields) = s else { return Err(Error::invalid_data("not a record")) };
    let mut d = Decoder::new(datum);
    fields.iter().map(|(_, s, _)| decode_value(&mut d, s).map(|v| format!("{v:?}"))).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn long_round_trips(v in any::<i64>()) {
            let mut e = Encoder::default();
            e.long(v);
            let mut d = Decoder::new(&e.buf);
            prop_assert_eq!(d.long().unwrap(), v);
            prop_assert!(d.is_empty());
        }

        #[test]
        fn garbage_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..64)) {
            let schema = r#"{"type":"record","name":"r","fields":[{"name":"a","type":["null","string"]},
                {"name":"b","type":"long"},{"name":"c","type":{"type":"fixed","name":"f","size":3}}]}"#;
            let _ = decode_one(schema, &bytes);
        }
    }

    /// A container file as Apache Hudi writes timeline files: codec null, one block.
    fn container(schema: &str, datums: &[Vec<u8>]) -> Vec<u8> {
        let mut e = Encoder::default();
        e.buf.extend_from_slice(CONTAINER_MAGIC);
        e.long(2);
        e.string("avro.schema");
        e.bytes(schema.as_bytes());
        e.string("avro.codec");
        e.bytes(b"null");
        e.long(0);
        let sync = [7u8; 16];
        e.buf.extend_from_slice(&sync);
        let body: Vec<u8> = datums.concat();
        e.long(datums.len() as i64);
        e.long(body.len() as i64);
        e.buf.extend_from_slice(&body);
        e.buf.extend_from_slice(&sync);
        e.buf
    }

    #[test]
    fn containers_decode_into_json() {
        let schema = r#"{"type":"record","name":"HoodieCommitMetadata","fields":[
            {"name":"partitionToWriteStats","type":["null",{"type":"map","values":{"type":"array","items":
              {"type":"record","name":"HoodieWriteStat","fields":[{"name":"fileId","type":["null","string"]},
               {"name":"numWrites","type":["null","long"]},{"name":"baseFile","type":["null","string"]}]}}}]},
            {"name":"compacted","type":["null","boolean"]},
            {"name":"operationType","type":["null","string"]}]}"#;
        let mut d = Encoder::default();
        d.long(1); // the map branch
        d.long(1); // one entry
        d.string("city=sf");
        d.long(2); // two stats
        for (id, n) in [("f1", 4), ("f2", 6)] {
            d.long(1);
            d.string(id);
            d.long(1);
            d.long(n);
            d.long(0); // baseFile: null
        }
        d.long(0); // end of array
        d.long(0); // end of map
        d.long(1);
        d.boolean(false);
        d.long(1);
        d.string("UPSERT");
        let records = read_container(&container(schema, &[d.buf])).unwrap();
        assert_eq!(records.len(), 1);
        let m: crate::format::commit::CommitMetadata = serde_json::from_value(records[0].clone()).unwrap();
        let stats: Vec<(&str, &str, i64)> =
            m.write_stats().map(|(p, s)| (p, s.file_id.as_str(), s.num_writes)).collect();
        assert_eq!(stats, [("city=sf", "f1", 4), ("city=sf", "f2", 6)]);
        assert_eq!(m.operation_type.as_deref(), Some("UPSERT"));
        // Null fields are left out, so serde defaults apply.
        assert_eq!(records[0]["partitionToWriteStats"]["city=sf"][0].get("baseFile"), None);
    }

    #[test]
    fn damaged_containers_are_errors() {
        let schema = r#"{"type":"record","name":"r","fields":[{"name":"a","type":"long"}]}"#;
        let mut datum = Encoder::default();
        datum.long(5);
        let good = container(schema, &[datum.buf]);
        assert_eq!(read_container(&good).unwrap(), vec![serde_json::json!({"a": 5})]);
        let mut bad_sync = good.clone();
        let n = bad_sync.len();
        bad_sync[n - 1] ^= 1;
        assert!(read_container(&bad_sync).is_err());
        assert!(read_container(&good[..good.len() - 3]).is_err());
        assert!(read_container(b"Obj\x02").is_err());
    }

    proptest! {
        #[test]
        fn damaged_container_never_panics(cut in 0usize..200, flip in 0usize..200) {
            let schema = r#"{"type":"record","name":"r","fields":[{"name":"a","type":["null","string"]}]}"#;
            let mut datum = Encoder::default();
            datum.long(1);
            datum.string("x");
            let mut bytes = container(schema, &[datum.buf]);
            if flip < bytes.len() {
                bytes[flip] ^= 0x5a;
            }
            bytes.truncate(cut.max(1).min(bytes.len()));
            let _ = read_container(&bytes);
        }
    }

    #[test]
    fn written_containers_read_back() {
        let schema = r#"{"type":"record","name":"R","namespace":"org.apache.hudi.avro.model","fields":[
            {"name":"s","type":"string"},{"name":"n","type":["null","long"],"default":null},
            {"name":"i","type":["int","null"]},{"name":"m","type":{"type":"map","values":{"type":"array",
            "items":{"type":"record","name":"E","fields":[{"name":"b","type":["null","boolean"]}]}}}},
            {"name":"e","type":["null","E"]}]}"#;
        let records = vec![
            serde_json::json!({"s": "x", "n": 5, "i": 2, "m": {"p": [{"b": true}, {}], "q": []}, "e": {"b": false}}),
            serde_json::json!({"s": "", "m": {}}),
        ];
        let bytes = write_container(schema, &records).unwrap();
        // Java's layout: the schema as the only metadata entry (no codec entry for `null`).
        assert!(bytes.starts_with(b"Obj\x01\x02\x16avro.schema"));
        let (text, back) = read_container_with_schema(&bytes).unwrap();
        assert_eq!(text, schema);
        assert_eq!(back, records);
        // A value the schema cannot hold is an error naming the field.
        let err = write_container(schema, &[serde_json::json!({"s": 1, "m": {}})]).unwrap_err();
        assert!(err.to_string().contains("`s`"), "{err}");
        let err = write_container(schema, &[serde_json::json!({"s": "x"})]).unwrap_err();
        assert!(err.to_string().contains("`m`"), "{err}");
    }

    /// Timeline files Apache Hudi wrote (rollback plans and metadata, Avro commit metadata)
    /// decode, re-encode with their own schema and decode to the same values.
    #[test]
    #[cfg_attr(
        not(hudi_corpus),
        ignore = "needs the Apache Hudi corpus: set OXLAKE_SHARED to the folder holding compat/"
    )]
    fn java_timeline_files_re_encode_to_the_same_values() {
        use crate::test_support::corpus_file;
        let files = [
            ("sample_table/mor/parquet/v6_nonpartitioned_rollback.zip", ".hoodie/20250126040936578.rollback.requested"),
            ("sample_table/mor/parquet/v6_nonpartitioned_rollback.zip", ".hoodie/20250126040936578.rollback"),
            (
                "sample_table/mor/avro/v9_nonpartitioned_rollback.zip",
                ".hoodie/timeline/20260403184259077.rollback.requested",
            ),
            (
                "sample_table/mor/avro/v9_nonpartitioned_rollback.zip",
                ".hoodie/timeline/20260403184259077_20260403184300219.rollback",
            ),
            (
                "sample_table/mor/avro/v9_nonpartitioned_rollback.zip",
                ".hoodie/timeline/20260403184302162_20260403184303142.deltacommit",
            ),
        ];
        for (zip, path) in files {
            let java = corpus_file(zip, path);
            let (schema, records) = read_container_with_schema(&java).unwrap();
            assert_eq!(records.len(), 1, "{path}");
            let ours = write_container(&schema, &records).unwrap();
            let (schema_back, back) = read_container_with_schema(&ours).unwrap();
            assert_eq!((schema_back, back), (schema, records), "{path}");
        }
    }

    #[test]
    fn zigzag_matches_the_specification() {
        for (v, bytes) in [(0i64, vec![0u8]), (-1, vec![1]), (1, vec![2]), (-64, vec![0x7f]), (64, vec![0x80, 1])] {
            let mut e = Encoder::default();
            e.long(v);
            assert_eq!(e.buf, bytes, "{v}");
        }
    }

    #[test]
    fn datums_decode_into_the_target_schema() {
        use arrow::datatypes::{Field, Schema as ArrowSchema};
        use std::sync::Arc;
        let schema = r#"{"type":"record","name":"r","fields":[
            {"name":"id","type":"long"},{"name":"name","type":["null","string"]},
            {"name":"amount","type":{"type":"fixed","name":"d","size":2,"logicalType":"decimal","precision":4,"scale":2}}]}"#;
        let mut datum = Encoder::default();
        datum.long(7);
        datum.long(1);
        datum.string("x");
        datum.buf.extend_from_slice(&[0xff, 0x38]); // -200 = -2.00
        let target = Arc::new(ArrowSchema::new(vec![
            Field::new("name", DataType::Utf8, true),
            Field::new("id", DataType::Int64, false),
            Field::new("amount", DataType::Decimal128(4, 2), true),
            Field::new("absent", DataType::Int32, true),
        ]));
        let batch = DatumReader::new(schema, target).unwrap().read([datum.buf.as_slice()]).unwrap();
        let text = arrow::util::pretty::pretty_format_batches(&[batch]).unwrap().to_string();
        assert!(text.contains("| x    | 7  | -2.00  |"), "{text}");
    }

    #[test]
    fn datums_written_before_a_promotion_are_promoted() {
        use arrow::datatypes::{Field, Schema as ArrowSchema};
        use std::sync::Arc;
        // Written when `amount` was decimal(4, 2) and `n` an int; the table has since widened
        // them to decimal(6, 3) and to a double, a long and a string.
        let schema = r#"{"type":"record","name":"r","fields":[
            {"name":"n","type":"int"},{"name":"m","type":"int"},{"name":"s","type":"int"},
            {"name":"amount","type":{"type":"fixed","name":"d","size":2,"logicalType":"decimal","precision":4,"scale":2}}]}"#;
        let mut datum = Encoder::default();
        datum.long(3);
        datum.long(-4);
        datum.long(12);
        datum.buf.extend_from_slice(&[0x04, 0xd2]); // 1234 = 12.34
        let target = Arc::new(ArrowSchema::new(vec![
            Field::new("n", DataType::Float64, true),
            Field::new("m", DataType::Int64, true),
            Field::new("s", DataType::Utf8, true),
            Field::new("amount", DataType::Decimal128(6, 3), true),
        ]));
        let batch = DatumReader::new(schema, target).unwrap().read([datum.buf.as_slice()]).unwrap();
        let text = arrow::util::pretty::pretty_format_batches(&[batch]).unwrap().to_string();
        assert!(text.contains("| 3.0 | -4 | 12 | 12.340 |"), "{text}");
    }
}
