//! Record keys and partition paths, computed from Arrow columns as Apache Hudi's key generators do.
//!
//! Simple keys are the field's value; complex keys are `f1:v1,f2:v2` with `__null__` and `__empty__`
//! standing for null and empty values. A complex key value that would make two different records
//! share a key (it holds `,f:` for a key field `f`, or is one of the placeholders) is refused.
//! Partition paths join one segment per partition field, as `field=value` (hive style) or `value`;
//! null or empty values go to `__HIVE_DEFAULT_PARTITION__`. With
//! `hoodie.datasource.write.partitionpath.urlencode` (every table oxlake creates) a value is
//! escaped as Hive and Hudi's `PartitionPathEncodeUtils.escapePathName` do, and unescaped when read
//! back from a path: the escaped segment is the directory name on disk and the object key on S3,
//! with no further encoding by the storage layer.
//!
//! A timestamp-based partition field (Apache Hudi's timestamp-based and custom key generators)
//! has for its segment the value read as an instant and printed with a date pattern
//! ([`timestamp`]); without url encoding a `/` in the pattern makes nested directories. Such a
//! path does not give the value back, so readers never prune by it.

use std::sync::Arc;

use arrow::array::{Array, ArrayRef, RecordBatch, StringArray};
use arrow::compute::cast;
use arrow::datatypes::DataType;

use crate::config::{PartitionKind, TableConfig};
use crate::error::{Error, Result};

pub mod joda;
pub mod stored;
pub mod timestamp;

pub use stored::StoredKeys;
use timestamp::TimestampFormat;

/// Complex-key placeholder for a null value.
pub const NULL_KEY: &str = "__null__";
/// Complex-key placeholder for an empty value.
pub const EMPTY_KEY: &str = "__empty__";
/// Partition path segment of a null or empty partition value.
pub const DEFAULT_PARTITION: &str = "__HIVE_DEFAULT_PARTITION__";
/// The segment Apache Hudi before 0.12 wrote for null and empty values (its readers still take it
/// as null, `PartitionPathParser.DEPRECATED_DEFAULT_PARTITION_PATH`). oxlake never writes it for
/// them, but reads a partition so named as one that may hold them.
pub const DEPRECATED_DEFAULT_PARTITION: &str = "default";

/// Whether a partition segment's value is a default partition's, old or new.
fn is_default_value(v: &str) -> bool {
    v == DEFAULT_PARTITION || v == DEPRECATED_DEFAULT_PARTITION
}

/// Whether a partition path has a default segment (either name): it holds null and empty values
/// alike, so versions of one record there may differ in that field.
pub fn has_default_segment(partition: &str) -> bool {
    partition.split('/').any(|s| is_default_value(s) || s.split_once('=').is_some_and(|(_, v)| is_default_value(v)))
}

/// The partitions of a batch: distinct paths, and the index of its path for every row.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Partitions {
    /// Distinct partition paths of the batch.
    pub paths: Vec<String>,
    /// For every row, the index of its path in `paths`.
    pub ids: Vec<u32>,
}

impl Partitions {
    /// The partition path of a row.
    pub fn path(&self, row: usize) -> &str {
        &self.paths[self.ids[row] as usize]
    }
}

/// How a table derives keys and partition paths from a record.
#[derive(Clone, Debug)]
pub struct KeySpec {
    /// Record key fields (`hoodie.table.recordkey.fields`).
    pub record_key_fields: Vec<String>,
    /// Partition fields (`hoodie.table.partition.fields`); empty for a non-partitioned table.
    pub partition_fields: Vec<String>,
    /// Whether keys are `f1:v1,f2:v2` (complex) rather than the bare value.
    pub complex_keys: bool,
    /// `hoodie.datasource.write.hive_style_partitioning`: path segments are `field=value`.
    pub hive_style: bool,
    /// `hoodie.datasource.write.partitionpath.urlencode`: partition values are escaped in paths.
    pub url_encode: bool,
    /// How each partition field makes its segment (aligned with `partition_fields`).
    pub partition_kinds: Vec<PartitionKind>,
    /// The table's timestamp format, when a partition field is timestamp-based; `Err` says why the
    /// table's `hoodie.keygen.timebased.*` options make none (writes are refused with it).
    pub timestamp: Option<std::result::Result<Arc<TimestampFormat>, String>>,
}

impl KeySpec {
    /// The key spec of a table's configuration.
    pub fn from_config(cfg: &TableConfig) -> Self {
        let timestamp = cfg
            .partition_kinds
            .contains(&PartitionKind::Timestamp)
            .then(|| TimestampFormat::from_options(&cfg.raw).map(Arc::new));
        KeySpec {
            record_key_fields: cfg.record_key_fields.clone(),
            partition_fields: cfg.partition_fields.clone(),
            complex_keys: cfg.complex_keys(),
            hive_style: cfg.hive_style,
            url_encode: cfg.url_encode,
            partition_kinds: cfg.partition_kinds.clone(),
            timestamp,
        }
    }

    /// A spec of simple partition fields (tests, and tables oxlake creates without timestamps).
    pub fn simple(
        record_key_fields: Vec<String>,
        partition_fields: Vec<String>,
        complex_keys: bool,
        hive_style: bool,
        url_encode: bool,
    ) -> Self {
        let partition_kinds = vec![PartitionKind::Simple; partition_fields.len()];
        KeySpec {
            record_key_fields,
            partition_fields,
            complex_keys,
            hive_style,
            url_encode,
            partition_kinds,
            timestamp: None,
        }
    }

    fn kind(&self, i: usize) -> PartitionKind {
        self.partition_kinds.get(i).copied().unwrap_or(PartitionKind::Simple)
    }

    /// The text each partition field's segment is made from: the value as text for simple
    /// fields, the printed instant for timestamp-based ones (never null: Hudi's default instant).
    fn segment_columns(&self, batch: &RecordBatch) -> Result<Vec<StringArray>> {
        let mut out = Vec::with_capacity(self.partition_fields.len());
        for (i, name) in self.partition_fields.iter().enumerate() {
            out.push(match self.kind(i) {
                PartitionKind::Simple => string_columns(batch, std::slice::from_ref(name), "partition")?.remove(0),
                PartitionKind::Timestamp => {
                    let format = match &self.timestamp {
                        Some(Ok(f)) => f,
                        Some(Err(why)) => {
                            return Err(Error::unsupported(format!(
                                "partitioning by `{name}` by time: the table's key generator options are not usable: {why}"
                            )));
                        }
                        None => return Err(Error::unsupported(format!("partitioning by `{name}` by time: no format"))),
                    };
                    let col = batch
                        .column_by_name(name)
                        .ok_or_else(|| Error::invalid_data(format!("partition column `{name}` is missing")))?;
                    format.segments(col, name)?
                }
                PartitionKind::Unknown => {
                    return Err(Error::unsupported(format!(
                        "writing partition field `{name}`: the table's custom key generator does not record whether                          it is SIMPLE or TIMESTAMP (Apache Hudi 0.x keeps that in the writer's options); set `{}`                          in hoodie.properties to the typed list, e.g. `{name}:SIMPLE`",
                        crate::config::keys::WRITE_PARTITION_FIELDS
                    )));
                }
            });
        }
        Ok(out)
    }

    /// The record key of every row. A null or empty simple key is invalid data (as in Hudi); so is
    /// a complex key whose values are all null or empty, or a value that would be ambiguous.
    pub fn record_keys(&self, batch: &RecordBatch) -> Result<StringArray> {
        let cols = string_columns(batch, &self.record_key_fields, "record key")?;
        if cols.is_empty() {
            return Err(Error::invalid_data("the table declares no record key fields"));
        }
        if !self.complex_keys {
            // Simple keys are the column's text as is: no per-row work beyond the checks.
            let col = &cols[0];
            if let Some(row) = (0..col.len()).find(|&r| col.is_null(r) || col.value(r).is_empty()) {
                return Err(null_key(&self.record_key_fields, row));
            }
            return Ok(col.clone());
        }
        // `,f:` for every key field f: a value holding one could be read as the start of the next
        // field (`a:1,b:2,b:3` is both ("1,b:2", "3") and ("1", "2,b:3")). Field names hold no
        // `,` or `:`, so without these substrings the key splits back into its values one way only.
        let separators: Vec<String> = self.record_key_fields.iter().map(|f| format!(",{f}:")).collect();
        let mut out = Vec::with_capacity(batch.num_rows());
        let mut key = String::new();
        for row in 0..batch.num_rows() {
            key.clear();
            let mut all_missing = true;
            for (i, (name, c)) in self.record_key_fields.iter().zip(&cols).enumerate() {
                let v = match value(c, row) {
                    None => NULL_KEY,
                    Some("") => EMPTY_KEY,
                    Some(v) => {
                        check_key_value(name, v, row, &separators)?;
                        all_missing = false;
                        v
                    }
                };
                if i > 0 {
                    key.push(',');
                }
                key.push_str(name);
                key.push(':');
                key.push_str(v);
            }
            if all_missing {
                return Err(null_key(&self.record_key_fields, row));
            }
            out.push(key.clone());
        }
        Ok(StringArray::from(out))
    }

    /// The partition of every row (`""` for non-partitioned tables). Each distinct combination of
    /// values is turned into a path once; rows carry the index of theirs. Different values with
    /// the same path (null, `""` and the literal `__HIVE_DEFAULT_PARTITION__`) share one index.
    pub fn partitions(&self, batch: &RecordBatch) -> Result<Partitions> {
        let rows = batch.num_rows();
        if self.partition_fields.is_empty() {
            return Ok(Partitions { paths: vec![String::new()], ids: vec![0; rows] });
        }
        let cols = self.segment_columns(batch)?;
        // Two spellings of values can make one path (null and the default partition's name).
        let mut id_of_path: hashbrown::HashMap<String, u32> = hashbrown::HashMap::new();
        let mut paths = Vec::new();
        let mut id_of = |path: String| {
            let next = paths.len() as u32;
            let id = *id_of_path.entry(path.clone()).or_insert(next);
            if id == next {
                paths.push(path);
            }
            id
        };
        let mut ids = Vec::with_capacity(rows);
        if let [col] = cols.as_slice() {
            // One partition column: its value is the key (no vector of values made per row).
            let mut seen: hashbrown::HashMap<Option<&str>, u32> = hashbrown::HashMap::new();
            for row in 0..rows {
                let v = value(col, row);
                let id = match seen.get(&v) {
                    Some(&id) => id,
                    None => *seen.entry(v).or_insert(id_of(self.path_of(&[v], row)?)),
                };
                ids.push(id);
            }
        } else {
            let mut seen: hashbrown::HashMap<Vec<Option<&str>>, u32> = hashbrown::HashMap::new();
            let mut values: Vec<Option<&str>> = Vec::with_capacity(cols.len());
            for row in 0..rows {
                values.clear();
                values.extend(cols.iter().map(|c| value(c, row)));
                let id = match seen.get(&values) {
                    Some(&id) => id,
                    None => *seen.entry(values.clone()).or_insert(id_of(self.path_of(&values, row)?)),
                };
                ids.push(id);
            }
        }
        Ok(Partitions { paths, ids })
    }

    /// Refuses two rows of one batch with the same record key whose partition values differ but
    /// whose partition path is the same (null, `""` and `__HIVE_DEFAULT_PARTITION__` all go to the
    /// default partition): Hudi would make them one record and keep only one of the rows.
    pub fn check_default_partition_collisions(
        &self,
        batch: &RecordBatch,
        keys: &StringArray,
        partitions: &Partitions,
    ) -> Result<()> {
        let shared: Vec<bool> = partitions.paths.iter().map(|p| self.has_default_segment(p)).collect();
        if !shared.iter().any(|s| *s) {
            return Ok(());
        }
        let cols = string_columns(batch, &self.partition_fields, "partition")?;
        // A timestamp-based field's values differ within one partition by design.
        let compared: Vec<usize> =
            (0..self.partition_fields.len()).filter(|&i| self.kind(i) == PartitionKind::Simple).collect();
        let mut first: hashbrown::HashMap<(u32, &str), usize> = hashbrown::HashMap::new();
        for (row, &id) in partitions.ids.iter().enumerate() {
            if !shared[id as usize] {
                continue;
            }
            let prev = *first.entry((id, keys.value(row))).or_insert(row);
            for &i in &compared {
                let (name, c) = (&self.partition_fields[i], &cols[i]);
                let (a, b) = (value(c, prev), value(c, row));
                if a != b {
                    return Err(Error::invalid_data(format!(
                        "record key `{}` is given twice for partition `{}` with different values of \
                         partition column `{name}` ({} in row {prev}, {} in row {row}): Hudi stores null, \
                         empty and `{DEFAULT_PARTITION}` values in the same default partition, so the two \
                         rows would be one record",
                        keys.value(row),
                        partitions.paths[id as usize],
                        shown(a),
                        shown(b),
                    )));
                }
            }
        }
        Ok(())
    }

    fn has_default_segment(&self, path: &str) -> bool {
        path.split('/').any(|seg| {
            let v = if self.hive_style { seg.split_once('=').map_or(seg, |(_, v)| v) } else { seg };
            v == DEFAULT_PARTITION
        })
    }

    fn path_of(&self, values: &[Option<&str>], row: usize) -> Result<String> {
        const MAX_DIRECTORY_NAME: usize = 255;
        let mut segments = Vec::with_capacity(values.len());
        for (i, (name, v)) in self.partition_fields.iter().zip(values).enumerate() {
            let timestamp = self.kind(i) == PartitionKind::Timestamp;
            let v: std::borrow::Cow<'_, str> = match v {
                None | Some("") if !timestamp => DEFAULT_PARTITION.into(),
                Some(v) if self.url_encode => escape_path_name(v),
                Some(v) if timestamp => {
                    // A date pattern's `/` makes nested directories (Apache Hudi's `yyyy/MM/dd`);
                    // each must still be a directory name.
                    if let Some(bad) = v
                        .split('/')
                        .find(|d| d.is_empty() || *d == "." || *d == ".." || d.chars().any(|c| c.is_ascii_control()))
                    {
                        return Err(Error::invalid_data(format!(
                            "partition `{v}` of `{name}` (row {row}): {bad:?} cannot be a directory name"
                        )));
                    }
                    (*v).into()
                }
                None => {
                    return Err(Error::invalid_data(format!("partition field `{name}` (row {row}) has no segment")));
                }
                Some(v) => {
                    // Without url encoding the value is the directory name as it is (Hudi's default):
                    // one that cannot be a single directory name is refused, not written elsewhere.
                    if let Some(c) = v.chars().find(|c| *c == '/' || c.is_ascii_control()) {
                        return Err(Error::invalid_data(format!(
                            "partition value {v:?} of `{name}` (row {row}) holds {c:?}, which a table without \
                             `{}=true` cannot store in a directory name",
                            crate::config::keys::URL_ENCODE
                        )));
                    }
                    (*v).into()
                }
            };
            let segment = if self.hive_style { format!("{name}={v}") } else { v.into_owned() };
            // `.` and `..` are never escaped (Hudi refuses `..` as path traversal).
            if segment == "." || segment == ".." {
                return Err(Error::invalid_data(format!(
                    "partition value `{segment}` of `{name}` (row {row}) cannot be a directory name"
                )));
            }
            // File systems take names of at most 255 bytes (ext4, XFS, HDFS's default limit): a
            // longer one would fail the write half-way with "File name too long".
            if let Some(long) = segment.split('/').find(|d| d.len() > MAX_DIRECTORY_NAME) {
                return Err(Error::invalid_data(format!(
                    "partition value of `{name}` (row {row}) makes a directory name of {} bytes ({}...): at most \
                     {MAX_DIRECTORY_NAME} are stored",
                    long.len(),
                    long.chars().take(40).collect::<String>()
                )));
            }
            segments.push(segment);
        }
        Ok(segments.join("/"))
    }

    /// Parses a partition path into one value per partition field (`None` for a default
    /// partition, which holds null and empty values and the literal of its name: see
    /// [`DEFAULT_PARTITION`] and [`DEPRECATED_DEFAULT_PARTITION`]).
    pub fn parse_partition_path(&self, path: &str) -> Option<Vec<Option<String>>> {
        if self.partition_fields.is_empty() {
            return Some(vec![]);
        }
        // A printed instant is not the field's value (and may span several directories).
        if self.partition_kinds.iter().any(|k| *k != PartitionKind::Simple) {
            return None;
        }
        let segments: Vec<&str> = path.split('/').collect();
        if segments.len() != self.partition_fields.len() {
            return None;
        }
        let mut values = Vec::with_capacity(segments.len());
        for (seg, name) in segments.iter().zip(&self.partition_fields) {
            let v = if self.hive_style { seg.strip_prefix(name.as_str())?.strip_prefix('=')? } else { seg };
            values.push(match v {
                v if is_default_value(v) => None,
                v if self.url_encode => Some(unescape_path_name(v)),
                v => Some(v.to_string()),
            });
        }
        Some(values)
    }
}

/// Whether Hudi (as Hive) escapes `c` in a partition path: ASCII controls, DEL and
/// `"#%'*/:=?\{[]^` (`PartitionPathEncodeUtils.charToEscape`). Spaces and non-ASCII characters
/// are kept as they are.
fn needs_escaping(c: char) -> bool {
    matches!(
        c,
        '\u{0}'
            ..='\u{1f}'
                | '\u{7f}'
                | '"'
                | '#'
                | '%'
                | '\''
                | '*'
                | '/'
                | ':'
                | '='
                | '?'
                | '\\'
                | '{'
                | '['
                | ']'
                | '^'
    )
}

/// Hudi's `PartitionPathEncodeUtils.escapePathName`: every escaped character as `%XX` (upper-case
/// hex of its code).
pub fn escape_path_name(v: &str) -> std::borrow::Cow<'_, str> {
    if !v.chars().any(needs_escaping) {
        return v.into();
    }
    let mut out = String::with_capacity(v.len() + 8);
    for c in v.chars() {
        if needs_escaping(c) {
            out.push_str(&format!("%{:02X}", c as u32));
        } else {
            out.push(c);
        }
    }
    out.into()
}

/// Hudi's `PartitionPathEncodeUtils.unescapePathName`: `%XX` (two hex digits) is the character of
/// that code; any other `%` stays as it is.
pub fn unescape_path_name(v: &str) -> String {
    let mut out = String::with_capacity(v.len());
    let mut rest = v;
    while let Some(i) = rest.find('%') {
        out.push_str(&rest[..i]);
        let code = rest.get(i + 1..i + 3).filter(|h| h.bytes().all(|b| b.is_ascii_hexdigit()));
        match code.and_then(|h| u32::from_str_radix(h, 16).ok()).and_then(char::from_u32) {
            Some(c) => {
                out.push(c);
                rest = &rest[i + 3..];
            }
            None => {
                out.push('%');
                rest = &rest[i + 1..];
            }
        }
    }
    out.push_str(rest);
    out
}

/// A complex key value that would collide with another record's key is refused, naming it.
fn check_key_value(name: &str, v: &str, row: usize, separators: &[String]) -> Result<()> {
    let why = if v == NULL_KEY || v == EMPTY_KEY {
        Some(format!("it is the placeholder Hudi writes for a {} value", if v == NULL_KEY { "null" } else { "empty" }))
    } else {
        separators.iter().find(|s| v.contains(s.as_str())).map(|s| format!("it holds `{s}`, a separator of the key"))
    };
    match why {
        None => Ok(()),
        Some(why) => Err(Error::invalid_data(format!(
            "record key column `{name}` has value {v:?} in row {row}, which cannot be part of a complex record key \
             (`field:value,...`) without colliding with another record's key: {why}"
        ))),
    }
}

fn shown(v: Option<&str>) -> String {
    v.map_or_else(|| "null".to_string(), |v| format!("{v:?}"))
}

fn null_key(fields: &[String], row: usize) -> Error {
    Error::invalid_data(format!("record key ({}) is null or empty in row {row}", fields.join(", ")))
}

fn value(col: &StringArray, row: usize) -> Option<&str> {
    col.is_valid(row).then(|| col.value(row))
}

/// The named columns cast to strings (the textual form key generators use).
fn string_columns(batch: &RecordBatch, names: &[String], what: &str) -> Result<Vec<StringArray>> {
    names
        .iter()
        .map(|name| {
            let col: &ArrayRef = batch
                .column_by_name(name)
                .ok_or_else(|| Error::invalid_data(format!("{what} column `{name}` is missing")))?;
            let s =
                cast(col, &DataType::Utf8).map_err(|e| Error::invalid_data(format!("{what} column `{name}`: {e}")))?;
            s.as_any()
                .downcast_ref::<StringArray>()
                .cloned()
                .ok_or_else(|| Error::invalid_data(format!("{what} column `{name}` is not textual")))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    use arrow::array::{Int32Array, StringArray};

    fn batch() -> RecordBatch {
        RecordBatch::try_from_iter(vec![
            ("id", Arc::new(Int32Array::from(vec![Some(1), Some(2), None])) as ArrayRef),
            ("name", Arc::new(StringArray::from(vec![Some("Alice"), Some(""), Some("Carol")])) as ArrayRef),
            ("city", Arc::new(StringArray::from(vec![Some("sf"), None, Some("nyc")])) as ArrayRef),
        ])
        .unwrap()
    }

    fn spec(keys: &[&str], parts: &[&str], complex: bool, hive: bool) -> KeySpec {
        KeySpec::simple(
            keys.iter().map(|s| s.to_string()).collect(),
            parts.iter().map(|s| s.to_string()).collect(),
            complex,
            hive,
            false,
        )
    }

    #[test]
    fn complex_keys_mark_null_and_empty() {
        let keys = spec(&["id", "name"], &[], true, false).record_keys(&batch()).unwrap();
        let got: Vec<_> = keys.iter().map(|k| k.unwrap()).collect();
        assert_eq!(got, vec!["id:1,name:Alice", "id:2,name:__empty__", "id:__null__,name:Carol"]);
    }

    #[test]
    fn simple_keys_refuse_nulls() {
        let err = spec(&["id"], &[], false, false).record_keys(&batch()).unwrap_err();
        assert!(matches!(err, Error::InvalidData { .. }), "{err}");
    }

    #[test]
    fn partition_paths_hive_and_plain() {
        let b = batch();
        let hive = spec(&["id"], &["city", "name"], false, true).partitions(&b).unwrap();
        assert_eq!(hive.path(0), "city=sf/name=Alice");
        assert_eq!(hive.path(1), "city=__HIVE_DEFAULT_PARTITION__/name=__HIVE_DEFAULT_PARTITION__");
        assert_eq!(hive.paths.len(), 3);
        let plain = spec(&["id"], &["city"], false, false).partitions(&b).unwrap();
        assert_eq!(plain.path(2), "nyc");
        assert_eq!(plain.ids, vec![0, 1, 2]);
        let s = spec(&["id"], &["city", "name"], false, true);
        assert_eq!(
            s.parse_partition_path("city=sf/name=__HIVE_DEFAULT_PARTITION__"),
            Some(vec![Some("sf".into()), None])
        );
        assert_eq!(s.parse_partition_path("sf/x"), None);
        // Apache Hudi before 0.12 named the default partition `default`.
        assert_eq!(s.parse_partition_path("city=default/name=Bo"), Some(vec![None, Some("Bo".into())]));
        assert!(has_default_segment("city=sf/name=default") && has_default_segment("default"));
        assert!(!has_default_segment("city=defaults") && !has_default_segment("city=sf"));
    }

    fn strings<'a>(name: &'a str, v: Vec<Option<&str>>) -> (&'a str, ArrayRef) {
        (name, Arc::new(StringArray::from(v)) as ArrayRef)
    }

    #[test]
    fn escaping_is_hudis() {
        assert_eq!(escape_path_name("Zürich y"), "Zürich y");
        assert_eq!(escape_path_name("a/b:c=d"), "a%2Fb%3Ac%3Dd");
        assert_eq!(escape_path_name("100%"), "100%25");
        assert_eq!(escape_path_name("\t\n\u{7f}#?\\\"'*{[]^&"), "%09%0A%7F%23%3F%5C%22%27%2A%7B%5B%5D%5E&");
        assert_eq!(unescape_path_name("a%2Fb%3Ac%25"), "a/b:c%");
        // A `%` not followed by two hex digits (a table Hudi wrote without escaping) stays.
        assert_eq!(unescape_path_name("100%"), "100%");
        assert_eq!(unescape_path_name("%zz%4"), "%zz%4");
    }

    proptest::proptest! {
        #[test]
        fn escaping_round_trips_every_string(v in "\\PC*|[%/=:,\\x00-\\x1f]*|.*") {
            let e = escape_path_name(&v);
            proptest::prop_assert!(!e.contains('/') && !e.chars().any(|c| c.is_ascii_control()));
            proptest::prop_assert_eq!(unescape_path_name(&e), v);
        }
    }

    #[test]
    fn hostile_partition_values_parse_back() {
        let values = vec![Some("Zürich"), Some("a/b"), Some("100%"), Some("k=v"), Some("t\tn\n"), Some("..")];
        let b = RecordBatch::try_from_iter(vec![strings("city", values.clone())]).unwrap();
        for hive in [true, false] {
            let mut s = spec(&["id"], &["city"], false, hive);
            s.url_encode = true;
            if !hive {
                assert!(matches!(s.partitions(&b), Err(Error::InvalidData { .. })), "`..` is no directory");
                continue;
            }
            let p = s.partitions(&b).unwrap();
            assert_eq!(p.path(0), "city=Zürich");
            assert_eq!(p.path(1), "city=a%2Fb");
            for (row, v) in values.iter().enumerate() {
                assert_eq!(s.parse_partition_path(p.path(row)), Some(vec![v.map(String::from)]));
            }
        }
    }

    #[test]
    fn null_empty_and_default_literal_share_one_partition() {
        let b = RecordBatch::try_from_iter(vec![
            strings("id", vec![Some("1"), Some("2"), Some("3")]),
            strings("city", vec![None, Some(DEFAULT_PARTITION), Some("")]),
        ])
        .unwrap();
        let s = spec(&["id"], &["city"], false, true);
        let p = s.partitions(&b).unwrap();
        assert_eq!(p.paths, vec![format!("city={DEFAULT_PARTITION}")]);
        assert_eq!(p.ids, vec![0, 0, 0]);
        let keys = s.record_keys(&b).unwrap();
        s.check_default_partition_collisions(&b, &keys, &p).unwrap();
        let same_key = StringArray::from(vec!["1", "1", "3"]);
        let err = s.check_default_partition_collisions(&b, &same_key, &p).unwrap_err();
        assert!(err.to_string().contains("`city`"), "{err}");
    }

    #[test]
    fn ambiguous_complex_key_values_are_refused() {
        let s = spec(&["a", "b"], &[], true, false);
        let key = |a: Option<&str>, b: Option<&str>| {
            let batch = RecordBatch::try_from_iter(vec![strings("a", vec![a]), strings("b", vec![b])]).unwrap();
            s.record_keys(&batch).map(|k| k.value(0).to_string())
        };
        for (a, b) in [("1,b:2", "3"), ("1", "2,b:3"), ("__null__", "x"), ("x", "__empty__"), ("1", "x,a:y")] {
            let err = key(Some(a), Some(b)).unwrap_err();
            assert!(matches!(err, Error::InvalidData { .. }), "{err}");
        }
        assert_eq!(key(Some("10:30"), Some("x,y")).unwrap(), "a:10:30,b:x,y");
        assert!(key(None, Some("")).unwrap_err().to_string().contains("null or empty"));
        assert_eq!(key(Some(""), Some("2")).unwrap(), "a:__empty__,b:2");
    }

    #[test]
    fn missing_columns_are_invalid_data() {
        assert!(matches!(spec(&["nope"], &[], false, false).record_keys(&batch()), Err(Error::InvalidData { .. })));
    }
}
