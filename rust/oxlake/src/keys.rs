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
        let mut out = Vec::with_capacity(batch.num_rows());
        for row in 0..batch.num_rows() {
            let key = if self.complex_keys {
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
            } else {
                match value(&cols[0], row) {
                    Some(v) if !v.is_empty() => v.to_string(),
                    _ => return Err(null_key(&self.record_key_fields, row)),
                }
            };
            out.push(key);
        }
        Ok(StringArray::from(out))
    }

    /// The partition path of every row (`""` for non-partitioned tables).
    pub fn partition_paths(&self, batch: &RecordBatch) -> Result<StringArray> {
        if self.partition_fields.is_empty() {
            return Ok(StringArray::from(vec![""; batch.num_rows()]));
        }
        let cols = string_columns(batch, &self.partition_fields, "partition")?;
        let mut out = Vec::with_capacity(batch.num_rows());
        for row in 0..batch.num_rows() {
            let mut segments = Vec::with_capacity(cols.len());
            for (name, c) in self.partition_fields.iter().zip(&cols) {
                let v = match value(c, row) {
                    None | Some("") => DEFAULT_PARTITION,
                    Some(v) if v.contains('/') || v == "." || v == ".." => {
                        return Err(Error::invalid_data(format!(
                            "partition value `{v}` of `{name}` (row {row}) cannot be a directory name"
                        )));
                    }
                    Some(v) => v,
                };
                segments.push(if self.hive_style { format!("{name}={v}") } else { v.to_string() });
            }
            out.push(segments.join("/"));
        }
        Ok(StringArray::from(out))
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
        let hive = spec(&["id"], &["city", "name"], false, true).partition_paths(&b).unwrap();
        assert_eq!(hive.value(0), "city=sf/name=Alice");
        assert_eq!(hive.value(1), "city=__HIVE_DEFAULT_PARTITION__/name=__HIVE_DEFAULT_PARTITION__");
        let plain = spec(&["id"], &["city"], false, false).partition_paths(&b).unwrap();
        assert_eq!(plain.value(2), "nyc");
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
