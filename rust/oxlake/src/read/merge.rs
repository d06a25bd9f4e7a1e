//! The merge of one file slice: log records over base records, key by key.
//!
//! The log side is folded first, in log order, into the latest version of every key (a record or a
//! delete); the base file then streams past it batch by batch. Each base row is kept, replaced by
//! its log version, or dropped by a delete; the log versions no base row claimed are emitted last
//! (inserts that live in the logs). Memory: the log side plus one base batch.
//!
//! Which version wins (docs/FORMAT.md §6, Apache Hudi's rules):
//! - commit-time ordering: the later version always wins;
//! - event-time ordering: the later version wins when its ordering value is at least the earlier
//!   one's; a delete without an ordering value (null or Apache Hudi's default `Int(0)`) always wins
//!   over what came before and loses to anything after.
//!
//! The result equals applying the versions one by one in commit order (base first): a key's log
//! versions fold into one, and a commit-time delete among them cuts the key off from its base row.

use arrow::array::{Array, RecordBatch, StringArray};
use arrow::compute::interleave_record_batch;
use arrow::datatypes::{DataType, SchemaRef};
use arrow::row::{OwnedRow, Row, RowConverter, Rows, SortField};

use crate::config::MergeMode;
use crate::error::{Error, Result};
use crate::format::log_block::OrderingVal;
use crate::log::LogContent;

/// How one slice's records are merged.
#[derive(Clone, Debug)]
pub struct MergeSpec {
    /// How two versions of one record are reconciled.
    pub mode: MergeMode,
    /// Index of `_hoodie_record_key` in the merged batches.
    pub key: usize,
    /// Index of the ordering column (event-time ordering only).
    pub ordering: Option<usize>,
    /// Tables without meta fields (Apache Hudi's virtual keys): keys are made from the record key
    /// fields, at these indexes, as the table's key generator makes them (Apache Hudi's readers
    /// do the same: `HoodieReaderContext`'s virtual key extractor, `simpleKeyGenFields` in 0.x).
    pub virtual_keys: Option<VirtualKeys>,
}

/// How a table without meta fields keys its records.
#[derive(Clone, Debug)]
pub struct VirtualKeys {
    /// The key generator's rules.
    pub keys: std::sync::Arc<crate::keys::KeySpec>,
    /// Indexes of the record key fields.
    pub fields: Vec<usize>,
}

impl MergeSpec {
    /// The merge of a table's records, with columns indexed into `schema` (the table schema).
    pub fn of_table(cfg: &crate::config::TableConfig, schema: &arrow::datatypes::Schema) -> Result<Self> {
        if cfg.merge_mode == MergeMode::Custom && cfg.populate_meta_fields {
            return Err(crate::error::Error::unsupported(format!(
                "merging records with a custom payload or merge strategy ({}: {}); read_optimized reads the base files",
                crate::config::keys::PAYLOAD_CLASS,
                cfg.raw.get(crate::config::keys::PAYLOAD_CLASS).map_or("-", String::as_str)
            )));
        }
        let ordering = match (cfg.merge_mode, &cfg.ordering_field) {
            (MergeMode::EventTime, Some(f)) => schema.index_of(f).ok(),
            _ => None,
        };
        let virtual_keys = match cfg.populate_meta_fields {
            true => None,
            false => {
                cfg.check_record_key_fields()?;
                let fields = cfg.record_key_fields.iter().map(|f| schema.index_of(f)).collect::<Result<_, _>>()?;
                Some(VirtualKeys { keys: std::sync::Arc::new(crate::keys::KeySpec::from_config(cfg)), fields })
            }
        };
        Ok(MergeSpec { mode: cfg.merge_mode, key: schema.index_of(crate::schema::RECORD_KEY)?, ordering, virtual_keys })
    }

    /// The same merge over a projection: `position` maps a table column to its index there.
    pub fn project(&self, position: impl Fn(usize) -> usize) -> Self {
        let virtual_keys = self
            .virtual_keys
            .as_ref()
            .map(|v| VirtualKeys { keys: v.keys.clone(), fields: v.fields.iter().map(|&i| position(i)).collect() });
        MergeSpec { key: position(self.key), ordering: self.ordering.map(&position), virtual_keys, ..self.clone() }
    }

    /// The columns a merge reads besides those asked for: the key (made from the record key
    /// fields without meta fields) and the ordering field.
    pub fn columns(&self) -> impl Iterator<Item = usize> + '_ {
        let virtual_fields = self.virtual_keys.iter().flat_map(|v| v.fields.iter().copied());
        [self.key].into_iter().chain(self.ordering).chain(virtual_fields)
    }

    /// The record key of every row of `batch` (a projection of the merged columns).
    pub fn keys(&self, batch: &RecordBatch) -> Result<StringArray> {
        match &self.virtual_keys {
            None => Ok(key_column(batch, self.key)?.clone()),
            Some(v) => {
                let fields: Vec<arrow::datatypes::FieldRef> =
                    v.fields.iter().map(|&i| batch.schema().field(i).clone().into()).collect();
                let columns = v.fields.iter().map(|&i| batch.column(i).clone()).collect();
                let only = RecordBatch::try_new(std::sync::Arc::new(arrow::datatypes::Schema::new(fields)), columns)?;
                v.keys.record_keys(&only)
            }
        }
    }
}

/// The ordering value of a version, in a form that compares across batches.
#[derive(Clone, Copy)]
enum Order<'a> {
    Value(Row<'a>),
    /// A delete that wins over whatever came before it.
    CommitTimeDelete,
    /// No ordering (commit-time tables).
    None,
}

#[derive(Clone, Debug)]
enum Version {
    Row { batch: u32, row: u32 },
    Delete { ordering: Option<OwnedRow> },
}

#[derive(Debug)]
struct Entry {
    version: Version,
    /// First appearance, for a stable output order of log-only records.
    seq: u32,
    /// Claimed by a base row (merged or overridden there).
    claimed: bool,
    /// A commit-time delete is among the folded versions: the base row no longer counts.
    reset: bool,
}

/// The latest version of every key in a slice's admitted log blocks.
pub struct LogSide {
    spec: MergeSpec,
    batches: Vec<RecordBatch>,
    orderings: Vec<Option<Rows>>,
    converter: Option<RowConverter>,
    ordering_type: Option<DataType>,
    entries: hashbrown::HashMap<Box<str>, Entry>,
    /// Bytes held, for the memory reservation.
    bytes: usize,
}

impl LogSide {
    /// An empty log side for batches of `schema`.
    pub fn new(spec: MergeSpec, schema: &SchemaRef) -> Result<Self> {
        let ordering_type = spec.ordering.map(|i| schema.field(i).data_type().clone());
        let converter = match (&ordering_type, spec.mode) {
            (Some(t), MergeMode::EventTime) => Some(RowConverter::new(vec![SortField::new(t.clone())])?),
            _ => None,
        };
        Ok(LogSide {
            spec,
            batches: Vec::new(),
            orderings: Vec::new(),
            converter,
            ordering_type,
            entries: hashbrown::HashMap::new(),
            bytes: 0,
        })
    }

    /// Bytes held by the log side.
    pub fn memory_size(&self) -> usize {
        self.bytes
    }

    /// Whether the log side holds no records and no deletes.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty() && self.batches.is_empty()
    }

    /// Folds one log content into the log side. `project` maps a table-schema batch to the
    /// merged columns. Returns the bytes added.
    pub fn add(&mut self, content: LogContent, project: &dyn Fn(&RecordBatch) -> Result<RecordBatch>) -> Result<usize> {
        let before = self.bytes;
        match content {
            LogContent::Records { batch, .. } => {
                let batch = project(&batch)?;
                if batch.num_rows() == 0 {
                    return Ok(0);
                }
                let idx = self.batches.len() as u32;
                let rows = match (&self.converter, self.spec.ordering) {
                    (Some(c), Some(o)) => Some(c.convert_columns(&[batch.column(o).clone()])?),
                    _ => None,
                };
                self.bytes += batch.get_array_memory_size() + rows.as_ref().map_or(0, Rows::size);
                let keys = self.spec.keys(&batch)?;
                for row in 0..batch.num_rows() {
                    if keys.is_null(row) {
                        continue;
                    }
                    let order = rows.as_ref().map_or(Order::None, |r| Order::Value(r.row(row)));
                    self.offer(keys.value(row), Version::Row { batch: idx, row: row as u32 }, order);
                }
                self.batches.push(batch);
                self.orderings.push(rows);
            }
            LogContent::Deletes { records, .. } => {
                for r in records {
                    let Some(key) = r.record_key.as_deref() else { continue };
                    let ordering = self.delete_ordering(&r.ordering)?;
                    let owned = ordering.clone();
                    let order = match &ordering {
                        Some(o) => Order::Value(o.row()),
                        None if self.converter.is_some() => Order::CommitTimeDelete,
                        None => Order::None,
                    };
                    self.offer(key, Version::Delete { ordering: owned }, order);
                }
            }
        }
        Ok(self.bytes - before)
    }

    /// A delete's ordering value in the ordering column's row format; `None` for a commit-time
    /// delete (or one whose value does not convert: Apache Hudi keeps the newer on type mismatch).
    fn delete_ordering(&self, v: &OrderingVal) -> Result<Option<OwnedRow>> {
        let (Some(conv), Some(t)) = (&self.converter, &self.ordering_type) else { return Ok(None) };
        if v.is_commit_time() {
            return Ok(None);
        }
        let Ok(scalar) = v.to_scalar().cast_to(t) else { return Ok(None) };
        let rows = conv.convert_columns(&[scalar.to_array()?])?;
        Ok(Some(rows.row(0).owned()))
    }

    /// Records `version` for `key` if it wins over the version already there.
    fn offer(&mut self, key: &str, version: Version, order: Order<'_>) {
        let seq = self.entries.len() as u32;
        let reset = matches!(order, Order::CommitTimeDelete);
        match self.entries.get_mut(key) {
            None => {
                self.bytes += key.len() + 64;
                self.entries.insert(key.into(), Entry { version, seq, claimed: false, reset });
            }
            Some(e) => {
                let old = order_of(&e.version, &self.orderings);
                if newer_wins(self.spec.mode, old, order) {
                    e.version = version;
                    e.reset |= reset;
                }
            }
        }
    }

    /// Merges one base batch (already projected to the merged columns) with the log side.
    pub fn merge_base(&mut self, base: &RecordBatch) -> Result<Vec<RecordBatch>> {
        if self.entries.is_empty() {
            return Ok(vec![base.clone()]);
        }
        let keys = self.spec.keys(base)?;
        let base_rows = match (&self.converter, self.spec.ordering) {
            (Some(c), Some(o)) => Some(c.convert_columns(&[base.column(o).clone()])?),
            _ => None,
        };
        // Base rows that stay go through the filter kernel; the log versions that win are gathered
        // apart (output order is not significant), so unchanged rows are never gathered one by one.
        let mut keep: Vec<bool> = Vec::with_capacity(base.num_rows());
        let mut from_log: Vec<(usize, usize)> = Vec::new();
        let mut changed = false;
        for row in 0..base.num_rows() {
            let entry = if keys.is_null(row) { None } else { self.entries.get_mut(keys.value(row)) };
            let Some(entry) = entry else {
                keep.push(true);
                continue;
            };
            entry.claimed = true;
            let base_order = base_rows.as_ref().map_or(Order::None, |r| Order::Value(r.row(row)));
            if !entry.reset && !newer_wins(self.spec.mode, base_order, order_of(&entry.version, &self.orderings)) {
                keep.push(true);
                continue;
            }
            changed = true;
            keep.push(false);
            if let Version::Row { batch, row: r } = entry.version {
                from_log.push((batch as usize, r as usize));
            }
        }
        if !changed {
            return Ok(vec![base.clone()]);
        }
        let mut out = vec![arrow::compute::filter_record_batch(base, &arrow::array::BooleanArray::from(keep))?];
        if !from_log.is_empty() {
            let sources: Vec<&RecordBatch> = self.batches.iter().collect();
            out.push(interleave_record_batch(&sources, &from_log)?);
        }
        Ok(out)
    }

    /// Claims the log versions of `keys` for base rows merged elsewhere (another part of a base
    /// file cut by rows): [`LogSide::remaining`] leaves them out.
    pub fn claim(&mut self, keys: &StringArray) {
        for key in keys.iter().flatten() {
            if let Some(entry) = self.entries.get_mut(key) {
                entry.claimed = true;
            }
        }
    }

    /// The log versions no base row claimed, in batches of at most `batch_size` rows.
    pub fn remaining(&self, batch_size: usize) -> Result<Vec<RecordBatch>> {
        let mut left: Vec<(u32, usize, usize)> = self
            .entries
            .values()
            .filter(|e| !e.claimed)
            .filter_map(|e| match e.version {
                Version::Row { batch, row } => Some((e.seq, batch as usize, row as usize)),
                Version::Delete { .. } => None,
            })
            .collect();
        left.sort_unstable();
        let sources: Vec<&RecordBatch> = self.batches.iter().collect();
        left.chunks(batch_size.max(1))
            .map(|chunk| {
                let picks: Vec<(usize, usize)> = chunk.iter().map(|&(_, b, r)| (b, r)).collect();
                Ok(interleave_record_batch(&sources, &picks)?)
            })
            .collect()
    }
}

fn order_of<'a>(v: &'a Version, orderings: &'a [Option<Rows>]) -> Order<'a> {
    match v {
        Version::Row { batch, row } => match orderings.get(*batch as usize) {
            Some(Some(rows)) => Order::Value(rows.row(*row as usize)),
            _ => Order::None,
        },
        Version::Delete { ordering: Some(o) } => Order::Value(o.row()),
        Version::Delete { ordering: None } => Order::CommitTimeDelete,
    }
}

/// Whether the later of two versions of a record replaces the earlier.
fn newer_wins(mode: MergeMode, old: Order<'_>, new: Order<'_>) -> bool {
    match (mode, old, new) {
        (MergeMode::CommitTime, _, _) => true,
        (_, _, Order::CommitTimeDelete) | (_, Order::CommitTimeDelete, _) => true,
        (_, Order::Value(a), Order::Value(b)) => b >= a,
        _ => true,
    }
}

fn key_column(batch: &RecordBatch, index: usize) -> Result<&StringArray> {
    batch
        .column(index)
        .as_any()
        .downcast_ref::<StringArray>()
        .ok_or_else(|| Error::invalid_data("the record key column is not a string"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::log_block::DeleteRecord;
    use arrow::array::Int64Array;
    use arrow::datatypes::{Field, Schema};
    use proptest::prelude::*;
    use std::collections::BTreeMap;
    use std::sync::Arc;

    fn schema() -> SchemaRef {
        Arc::new(Schema::new(vec![
            Field::new("key", DataType::Utf8, true),
            Field::new("ts", DataType::Int64, true),
            Field::new("v", DataType::Int64, true),
        ]))
    }

    fn batch(rows: &[(&str, i64, i64)]) -> RecordBatch {
        RecordBatch::try_new(
            schema(),
            vec![
                Arc::new(StringArray::from(rows.iter().map(|r| r.0).collect::<Vec<_>>())),
                Arc::new(Int64Array::from(rows.iter().map(|r| r.1).collect::<Vec<_>>())),
                Arc::new(Int64Array::from(rows.iter().map(|r| r.2).collect::<Vec<_>>())),
            ],
        )
        .unwrap()
    }

    fn spec(mode: MergeMode) -> MergeSpec {
        MergeSpec { mode, key: 0, ordering: Some(1), virtual_keys: None }
    }

    fn rows_of(batches: &[RecordBatch]) -> BTreeMap<String, (i64, i64)> {
        let mut out = BTreeMap::new();
        for b in batches {
            let k = b.column(0).as_any().downcast_ref::<StringArray>().unwrap();
            let t = b.column(1).as_any().downcast_ref::<Int64Array>().unwrap();
            let v = b.column(2).as_any().downcast_ref::<Int64Array>().unwrap();
            for i in 0..b.num_rows() {
                assert!(out.insert(k.value(i).to_string(), (t.value(i), v.value(i))).is_none(), "duplicate key");
            }
        }
        out
    }

    fn delete(key: &str, ordering: OrderingVal) -> LogContent {
        LogContent::Deletes {
            instant: "2".into(),
            records: vec![DeleteRecord { record_key: Some(key.into()), partition_path: None, ordering }],
        }
    }

    fn run(mode: MergeMode, base: &[(&str, i64, i64)], logs: Vec<LogContent>) -> BTreeMap<String, (i64, i64)> {
        let mut side = LogSide::new(spec(mode), &schema()).unwrap();
        for c in logs {
            side.add(c, &|b| Ok(b.clone())).unwrap();
        }
        let mut out = side.merge_base(&batch(base)).unwrap();
        out.extend(side.remaining(2).unwrap());
        rows_of(&out)
    }

    fn records(rows: &[(&str, i64, i64)]) -> LogContent {
        LogContent::Records { instant: "2".into(), batch: batch(rows) }
    }

    #[test]
    fn event_time_keeps_the_greater_ordering_value() {
        let out = run(
            MergeMode::EventTime,
            &[("a", 5, 1), ("b", 5, 1), ("c", 5, 1)],
            vec![records(&[("a", 4, 2), ("b", 5, 2), ("d", 1, 2)]), delete("c", OrderingVal::Long(3))],
        );
        let expected = BTreeMap::from([
            ("a".to_string(), (5, 1)), // lower ordering loses
            ("b".to_string(), (5, 2)), // equal ordering: the later wins
            ("c".to_string(), (5, 1)), // delete with a lower ordering value loses
            ("d".to_string(), (1, 2)), // insert that lives in the log
        ]);
        assert_eq!(out, expected);
    }

    #[test]
    fn commit_time_deletes_always_win_and_commit_time_mode_ignores_ordering() {
        let out = run(MergeMode::EventTime, &[("a", 9, 1)], vec![delete("a", OrderingVal::COMMIT_TIME)]);
        assert!(out.is_empty());
        let out = run(MergeMode::CommitTime, &[("a", 9, 1)], vec![records(&[("a", 1, 2)])]);
        assert_eq!(out["a"], (1, 2));
        // A record after a commit-time delete brings the key back.
        let out = run(
            MergeMode::EventTime,
            &[("a", 9, 1)],
            vec![delete("a", OrderingVal::COMMIT_TIME), records(&[("a", 0, 3)])],
        );
        assert_eq!(out["a"], (0, 3));
    }

    /// The law: merging the log side over the base equals applying every version in order.
    fn model(
        mode: MergeMode,
        base: &[(String, i64, i64)],
        ops: &[(String, Option<i64>, i64)],
    ) -> BTreeMap<String, (i64, i64)> {
        // State per key: Some(row) or a delete with its ordering (None = commit-time).
        #[derive(Clone)]
        enum S {
            Row(i64, i64),
            Del(Option<i64>),
        }
        let wins = |old: &S, new: &S| -> bool {
            if mode == MergeMode::CommitTime {
                return true;
            }
            let o = match old {
                S::Row(t, _) => Some(*t),
                S::Del(None) => return true,
                S::Del(Some(t)) => Some(*t),
            };
            let n = match new {
                S::Row(t, _) => Some(*t),
                S::Del(None) => return true,
                S::Del(Some(t)) => Some(*t),
            };
            n >= o
        };
        // Every version applied in order, the base first.
        let mut state: BTreeMap<String, S> = base.iter().map(|(k, t, v)| (k.clone(), S::Row(*t, *v))).collect();
        for (k, ts, v) in ops {
            let new = match ts {
                Some(t) if *v >= 0 => S::Row(*t, *v),
                t => S::Del(*t),
            };
            match state.get(k) {
                Some(old) if !wins(old, &new) => {}
                _ => {
                    state.insert(k.clone(), new);
                }
            }
        }
        state
            .into_iter()
            .filter_map(|(k, s)| match s {
                S::Row(t, v) => Some((k, (t, v))),
                S::Del(_) => None,
            })
            .collect()
    }

    proptest! {
        #[test]
        fn merge_equals_the_model(
            event in any::<bool>(),
            base_keys in proptest::collection::btree_set("[a-f]", 0..6),
            base_ts in proptest::collection::vec(0i64..4, 6),
            ops in proptest::collection::vec(("[a-h]", proptest::option::of(0i64..4), -1i64..5), 0..12),
        ) {
            let mode = if event { MergeMode::EventTime } else { MergeMode::CommitTime };
            let base: Vec<(String, i64, i64)> =
                base_keys.iter().enumerate().map(|(i, k)| (k.clone(), base_ts[i], 100)).collect();
            let mut contents = Vec::new();
            for (k, ts, v) in &ops {
                match ts {
                    Some(t) if *v >= 0 => contents.push(records(&[(k.as_str(), *t, *v)])),
                    Some(t) => contents.push(delete(k, OrderingVal::Long(*t))),
                    None => contents.push(delete(k, OrderingVal::COMMIT_TIME)),
                }
            }
            let base_refs: Vec<(&str, i64, i64)> = base.iter().map(|(k, t, v)| (k.as_str(), *t, *v)).collect();
            let got = run(mode, &base_refs, contents);
            prop_assert_eq!(got, model(mode, &base, &ops));
        }
    }
}
