//! Record keys and partition paths, computed from Arrow columns as Apache Hudi's key generators do.
//!
//! Simple keys are the field's value; complex keys are `f1:v1,f2:v2` with `__null__` and `__empty__`
//! standing for null and empty values. Partition paths join one segment per partition field, as
//! `field=value` (hive style) or `value`; null or empty values go to `__HIVE_DEFAULT_PARTITION__`.

use arrow::array::{Array, ArrayRef, RecordBatch, StringArray};
use arrow::compute::cast;
use arrow::datatypes::DataType;

use crate::config::TableConfig;
use crate::error::{Error, Result};

pub const NULL_KEY: &str = "__null__";
pub const EMPTY_KEY: &str = "__empty__";
pub const DEFAULT_PARTITION: &str = "__HIVE_DEFAULT_PARTITION__";

/// The partitions of a batch: distinct paths, and the index of its path for every row.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Partitions {
    pub paths: Vec<String>,
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
    pub record_key_fields: Vec<String>,
    pub partition_fields: Vec<String>,
    pub complex_keys: bool,
    pub hive_style: bool,
}

impl KeySpec {
    pub fn from_config(cfg: &TableConfig) -> Self {
        KeySpec {
            record_key_fields: cfg.record_key_fields.clone(),
            partition_fields: cfg.partition_fields.clone(),
            complex_keys: cfg.complex_keys(),
            hive_style: cfg.hive_style,
        }
    }

    /// The record key of every row. A null (or, for simple keys, empty) key is invalid data.
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
        let mut out = Vec::with_capacity(batch.num_rows());
        for row in 0..batch.num_rows() {
            let key = {
                let mut all_missing = true;
                let parts: Vec<String> = self
                    .record_key_fields
                    .iter()
                    .zip(&cols)
                    .map(|(name, c)| {
                        let v = value(c, row);
                        all_missing &= v.is_none_or(str::is_empty);
                        let v = match v {
                            None => NULL_KEY,
                            Some("") => EMPTY_KEY,
                            Some(v) => v,
                        };
                        format!("{name}:{v}")
                    })
                    .collect();
                if all_missing {
                    return Err(null_key(&self.record_key_fields, row));
                }
                parts.join(",")
            };
            out.push(key);
        }
        Ok(StringArray::from(out))
    }

    /// The partition of every row (`""` for non-partitioned tables). Each distinct combination of
    /// values is turned into a path once; rows carry the index of theirs.
    pub fn partitions(&self, batch: &RecordBatch) -> Result<Partitions> {
        let rows = batch.num_rows();
        if self.partition_fields.is_empty() {
            return Ok(Partitions { paths: vec![String::new()], ids: vec![0; rows] });
        }
        let cols = string_columns(batch, &self.partition_fields, "partition")?;
        let mut seen: hashbrown::HashMap<Vec<Option<&str>>, u32> = hashbrown::HashMap::new();
        let mut paths = Vec::new();
        let mut ids = Vec::with_capacity(rows);
        let mut values: Vec<Option<&str>> = Vec::with_capacity(cols.len());
        for row in 0..rows {
            values.clear();
            values.extend(cols.iter().map(|c| value(c, row).filter(|v| !v.is_empty())));
            let id = match seen.get(&values) {
                Some(&id) => id,
                None => {
                    let id = paths.len() as u32;
                    paths.push(self.path_of(&values, row)?);
                    seen.insert(values.clone(), id);
                    id
                }
            };
            ids.push(id);
        }
        Ok(Partitions { paths, ids })
    }

    fn path_of(&self, values: &[Option<&str>], row: usize) -> Result<String> {
        let mut segments = Vec::with_capacity(values.len());
        for (name, v) in self.partition_fields.iter().zip(values) {
            let v = match v {
                None => DEFAULT_PARTITION,
                Some(v) if v.contains('/') || *v == "." || *v == ".." => {
                    return Err(Error::invalid_data(format!(
                        "partition value `{v}` of `{name}` (row {row}) cannot be a directory name"
                    )));
                }
                Some(v) => v,
            };
            segments.push(if self.hive_style { format!("{name}={v}") } else { v.to_string() });
        }
        Ok(segments.join("/"))
    }

    /// Parses a partition path into one value per partition field (`None` for the default partition).
    pub fn parse_partition_path(&self, path: &str) -> Option<Vec<Option<String>>> {
        if self.partition_fields.is_empty() {
            return Some(vec![]);
        }
        let segments: Vec<&str> = path.split('/').collect();
        if segments.len() != self.partition_fields.len() {
            return None;
        }
        let mut values = Vec::with_capacity(segments.len());
        for (seg, name) in segments.iter().zip(&self.partition_fields) {
            let v = if self.hive_style { seg.strip_prefix(name.as_str())?.strip_prefix('=')? } else { seg };
            values.push((v != DEFAULT_PARTITION).then(|| v.to_string()));
        }
        Some(values)
    }
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
        KeySpec {
            record_key_fields: keys.iter().map(|s| s.to_string()).collect(),
            partition_fields: parts.iter().map(|s| s.to_string()).collect(),
            complex_keys: complex,
            hive_style: hive,
        }
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
    }

    #[test]
    fn missing_columns_are_invalid_data() {
        assert!(matches!(spec(&["nope"], &[], false, false).record_keys(&batch()), Err(Error::InvalidData { .. })));
    }
}
