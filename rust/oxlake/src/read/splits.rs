//! Splits: a query planned once (on a driver) and cut into pieces read independently (by Spark or
//! Dask workers). A split is a part of the query's plan (file slices, or parts of a slice's base
//! file by rows with the slice's logs merged over each part) that serializes to JSON: a worker
//! opens the table and reads the split with [`Table::scan_split`] without listing or planning
//! anything again, so every worker reads the same table state, the one the driver planned.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use arrow::datatypes::SchemaRef;
use serde::{Deserialize, Serialize};

use super::changes::ChangePlan;
use super::{HudiTableProvider, PlannedFile, PlannedSlice, QueryType, RowRange, ScanOptions, ScanPlan, session};
use crate::error::{Error, Result};
use crate::table::Table;
use crate::table::fs_view::FileGroupId;

/// A piece of a planned query.
// A change split holds two scan plans: a few hundred bytes, made once per split and moved a
// handful of times (boxing would only add an allocation).
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Debug, Serialize, Deserialize)]
pub enum Split {
    /// Slices of a snapshot, read-optimized or incremental query.
    Scan(ScanPlan),
    /// File groups of a change query (`None`: the table has no commit yet).
    Changes(Option<ChangePlan>),
}

impl Split {
    /// Bytes of the files the split reads.
    pub fn size(&self) -> u64 {
        self.slices().map(PlannedSlice::size).sum()
    }

    /// Number of files the split reads.
    pub fn files(&self) -> usize {
        self.slices().map(|s| usize::from(s.base.is_some()) + s.logs.len()).sum()
    }

    fn slices(&self) -> Box<dyn Iterator<Item = &PlannedSlice> + '_> {
        match self {
            Split::Scan(p) => Box::new(p.slices.iter()),
            Split::Changes(Some(c)) => Box::new(c.before.slices.iter().chain(&c.after.slices)),
            Split::Changes(None) => Box::new(std::iter::empty()),
        }
    }

    /// The split as JSON, for a worker.
    pub fn to_json(&self) -> Result<Vec<u8>> {
        serde_json::to_vec(self).map_err(Error::invalid_data)
    }

    /// Parses a split serialized with [`Split::to_json`].
    pub fn from_json(bytes: &[u8]) -> Result<Self> {
        let split: Split = serde_json::from_slice(bytes).map_err(|e| Error::invalid_arg("split", e))?;
        if let Some(rows) =
            split.slices().find_map(|s| s.base.as_ref()?.rows.filter(|r| r.start >= r.end || r.end > r.total))
        {
            let (start, end, total) = (rows.start, rows.end, rows.total);
            return Err(Error::invalid_arg("split", format!("rows {start}..{end} of a file of {total} rows")));
        }
        Ok(split)
    }
}

impl Table {
    /// Plans a query and cuts it into splits of about `target_bytes` each (a file slice larger
    /// than that is a split of its own). When that makes fewer than `min_splits` splits (a table
    /// of a few large files, read by more workers than it has files), base files are cut by rows
    /// ([`RowRange`]) into pieces of about the query's bytes over `min_splits`, so that every
    /// worker has a part; each part of a slice with logs merges the logs over its rows (a change
    /// query's file group is cut so where both its snapshots read the same base file). Partitions
    /// the filter rules out are dropped here, so no worker is started for them. A query with
    /// nothing to read gives one empty split, so that readers still learn the schema.
    pub async fn plan_splits(&self, opts: &ScanOptions, target_bytes: u64, min_splits: usize) -> Result<Vec<Split>> {
        if opts.query == QueryType::Changes {
            self.check_changes_readable()?;
            let Some(plan) = self.plan_changes(opts).await? else { return Ok(vec![Split::Changes(None)]) };
            return self.cut_changes(plan, target_bytes, min_splits).await;
        }
        let plan = self.plan_scan_pruned(opts).await?;
        let slices = match &opts.filter {
            Some(filter) => self.prune_partitions(&plan, filter).await?,
            None => plan.slices.clone(),
        };
        let mut parts = pack(slices, target_bytes, PlannedSlice::size);
        if parts.len() < min_splits {
            let slices: Vec<PlannedSlice> = parts.into_iter().flatten().collect();
            let total: u64 = slices.iter().map(PlannedSlice::size).sum();
            let piece = (total / min_splits as u64).max(1);
            let slices = self.cut_by_rows(slices, total, min_splits as u64).await?;
            parts = pack(slices, piece, PlannedSlice::size);
        }
        let splits: Vec<Split> = parts
            .into_iter()
            .map(|slices| {
                Split::Scan(ScanPlan { slices, upper: plan.upper.clone(), commit_range: plan.commit_range.clone() })
            })
            .collect();
        Ok(if splits.is_empty() { vec![Split::Scan(ScanPlan { slices: Vec::new(), ..plan })] } else { splits })
    }

    /// A snapshot (or read-optimized) query's slices, one split each, for a dataset that other
    /// engines read: with each, the base file (relative to the table root) when that file alone
    /// holds the slice's rows under the table's column names, so that an engine may read it
    /// itself (no log to merge over it, not cut by rows, no column renamed or dropped since it
    /// was written); `None` when only oxlake's reader gives its rows. Also the schema the slices
    /// are read with (as of the snapshot's instant).
    pub async fn plan_dataset(&self, opts: &ScanOptions) -> Result<(SchemaRef, Vec<(Split, Option<String>)>)> {
        let plan = self.plan_snapshot(opts, "a dataset").await?;
        // Time travel reads the columns as they were then: files are judged by that schema.
        let as_of = self.read_as(&plan).await?;
        let read_as = as_of.as_ref().unwrap_or(self);
        let (schema, history) = (read_as.schema(), read_as.column_history().cloned());
        let names_as_table = |path: &str| {
            history.as_ref().is_none_or(|h| {
                crate::format::file_name::base_file_instant(path).is_some_and(|t| h.columns_at(&t).is_none())
            })
        };
        let parts = plan
            .slices
            .into_iter()
            .map(|slice| {
                let direct = slice
                    .base
                    .as_ref()
                    .filter(|b| slice.logs.is_empty() && b.rows.is_none() && names_as_table(&b.path))
                    .map(|b| b.path.clone());
                let split = Split::Scan(ScanPlan {
                    slices: vec![slice],
                    upper: plan.upper.clone(),
                    commit_range: plan.commit_range.clone(),
                });
                (split, direct)
            })
            .collect();
        Ok((schema, parts))
    }

    /// `slices` with every base file cut by rows into its share of `pieces` parts of the `total`
    /// bytes (its footer tells how many rows it has); parts of fewer than [`MIN_PIECE_ROWS`] rows
    /// are not made. Every part of a slice with logs reads all of them (and its first part the
    /// rest of the base file's keys, [`RowRange::owns_log_inserts`]), so such a file is cut into
    /// no more parts than twice the times its logs fit in it ([`Table::row_ranges`]).
    async fn cut_by_rows(&self, slices: Vec<PlannedSlice>, total: u64, pieces: u64) -> Result<Vec<PlannedSlice>> {
        let mut out = Vec::with_capacity(slices.len());
        for slice in slices {
            let logs = slice.logs.iter().map(|l| l.size).sum();
            let share = share_of(slice.size(), total, pieces);
            let ranges = match &slice.base {
                Some(base) => self.row_ranges(base, logs, share).await?,
                None => Vec::new(),
            };
            match ranges.is_empty() {
                true => out.push(slice),
                false => out.extend(ranges.into_iter().map(|r| slice.with_rows(r))),
            }
        }
        Ok(out)
    }

    /// The parts `base` is cut into, at most `share`, each read with `logs` bytes of log files;
    /// none when it stays whole. Every part reads the logs again, so a base file is cut into no
    /// more parts than twice the times its logs fit in it: a slice whose logs outweigh its base
    /// twice over is read whole.
    async fn row_ranges(&self, base: &PlannedFile, logs: u64, share: u64) -> Result<Vec<RowRange>> {
        let most = base.size.saturating_mul(2).checked_div(logs).unwrap_or(u64::MAX);
        if base.rows.is_some() || share <= 1 || most <= 1 {
            return Ok(Vec::new());
        }
        let rows = self.storage().parquet_rows(&base.path, base.size).await?;
        let parts = share.min(rows / MIN_PIECE_ROWS).min(most);
        if parts <= 1 {
            return Ok(Vec::new());
        }
        Ok((0..parts).map(|k| RowRange { start: rows * k / parts, end: rows * (k + 1) / parts, total: rows }).collect())
    }

    /// A change query's splits. Both sides of each file group stay together, since the join of a
    /// change query pairs them, and so do the groups of `plan.together`: a key that a delete and
    /// a later insert, a clustering or an overwrite moved from one group to another pairs across
    /// them (split apart, it would read as a delete in one split and an insert in another).
    /// With fewer than `min_splits` groups, a group whose two snapshots read the same base file
    /// (only logs written in the window) is cut by rows, both sides alike: a key of the base is
    /// then in the same part on both sides, and a key only in logs in the first part of both.
    async fn cut_changes(&self, plan: ChangePlan, target_bytes: u64, min_splits: usize) -> Result<Vec<Split>> {
        let root = joined_groups(&plan.together);
        let mut units: BTreeMap<FileGroupId, Sides> = BTreeMap::new();
        for s in plan.before.slices {
            units.entry(root(s.group_id())).or_default().0.push(s);
        }
        for s in plan.after.slices {
            units.entry(root(s.group_id())).or_default().1.push(s);
        }
        let size = |(b, a): &Sides| b.iter().chain(a).map(PlannedSlice::size).sum::<u64>();
        let mut units: Vec<Sides> = units.into_values().collect();
        let mut target = target_bytes;
        if units.len() < min_splits {
            let total: u64 = units.iter().map(size).sum();
            let mut cut = Vec::with_capacity(units.len());
            for (before, after) in units {
                let base = match (&before[..], &after[..]) {
                    ([], [a]) => a.base.as_ref(),
                    ([b], [a]) => a.base.as_ref().filter(|f| b.base.as_ref().is_some_and(|g| g.path == f.path)),
                    _ => None,
                };
                let logs = before.iter().chain(&after).flat_map(|s| &s.logs).map(|l| l.size).sum();
                let bytes = before.iter().chain(&after).map(PlannedSlice::size).sum();
                let share = share_of(bytes, total, min_splits as u64);
                let ranges = match base {
                    Some(base) => self.row_ranges(base, logs, share).await?,
                    None => Vec::new(),
                };
                if ranges.is_empty() {
                    cut.push((before, after));
                    continue;
                }
                for r in ranges {
                    let part = |side: &[PlannedSlice]| side.iter().map(|s| s.with_rows(r)).collect::<Vec<_>>();
                    cut.push((part(&before), part(&after)));
                }
            }
            units = cut;
            target = (total / min_splits as u64).max(1);
        }
        let parts = pack(units, target, size);
        let side =
            |slices: Vec<PlannedSlice>, upper: &str| ScanPlan { slices, upper: upper.to_string(), commit_range: None };
        let splits: Vec<Split> = parts
            .into_iter()
            .map(|part| {
                let (before, after): (Vec<_>, Vec<_>) = part.into_iter().unzip();
                Split::Changes(Some(ChangePlan {
                    before: side(before.into_iter().flatten().collect(), &plan.before.upper),
                    after: side(after.into_iter().flatten().collect(), &plan.after.upper),
                    start: plan.start.clone(),
                    end: plan.end.clone(),
                    window: plan.window.clone(),
                    together: Vec::new(),
                }))
            })
            .collect();
        if splits.is_empty() {
            let (before, after) = (side(Vec::new(), &plan.before.upper), side(Vec::new(), &plan.after.upper));
            return Ok(vec![Split::Changes(Some(ChangePlan { before, after, ..plan }))]);
        }
        Ok(splits)
    }

    /// The slices of `plan` in partitions that can satisfy `filter`.
    async fn prune_partitions(&self, plan: &ScanPlan, filter: &super::Filter) -> Result<Vec<PlannedSlice>> {
        let ctx = session(self, None, None)?;
        let provider = Arc::new(HudiTableProvider::try_new(self, plan.clone())?);
        let df = ctx.read_table(provider.clone())?;
        let expr = filter.to_expr(&df).map_err(|e| Error::invalid_arg("filter", e))?;
        // Each conjunct on partition columns prunes, whatever else the filter holds.
        let conjuncts: Vec<_> = datafusion::logical_expr::utils::split_conjunction_owned(expr);
        let kept = provider.prune_partitions(&ctx.state(), &conjuncts)?;
        Ok(kept.into_iter().cloned().collect())
    }
}

/// The fewest rows of a part of a file a split cuts off: below it, a worker's start costs more
/// than its read.
const MIN_PIECE_ROWS: u64 = 10_000;

/// The parts, of `pieces` parts of `total` bytes, that `bytes` of them come to (rounded).
fn share_of(bytes: u64, total: u64, pieces: u64) -> u64 {
    let share = (u128::from(bytes) * u128::from(pieces) * 2 / u128::from(total.max(1))).div_ceil(2);
    u64::try_from(share).unwrap_or(u64::MAX)
}

/// The before and after slices of one or more file groups read together by a change query.
type Sides = (Vec<PlannedSlice>, Vec<PlannedSlice>);

/// The sets of `together` joined where they share a group: a function naming, for every file
/// group, one group of its joined set (itself when it is in none).
fn joined_groups(together: &[Vec<FileGroupId>]) -> impl Fn(FileGroupId) -> FileGroupId + use<> {
    let mut parent: HashMap<FileGroupId, FileGroupId> = HashMap::new();
    fn find(parent: &HashMap<FileGroupId, FileGroupId>, mut g: FileGroupId) -> FileGroupId {
        while let Some(p) = parent.get(&g).filter(|p| **p != g) {
            g = p.clone();
        }
        g
    }
    for set in together {
        let Some(first) = set.first() else { continue };
        let first = find(&parent, first.clone());
        for g in &set[1..] {
            let r = find(&parent, g.clone());
            if r != first {
                parent.insert(r, first.clone());
            }
        }
    }
    move |g| find(&parent, g)
}

/// Packs items, in order, into consecutive runs of about `target` bytes.
fn pack<T>(items: Vec<T>, target: u64, size: impl Fn(&T) -> u64) -> Vec<Vec<T>> {
    let mut out: Vec<Vec<T>> = Vec::new();
    let mut current: Vec<T> = Vec::new();
    let mut bytes = 0u64;
    for item in items {
        let n = size(&item);
        if !current.is_empty() && bytes + n > target.max(1) {
            out.push(std::mem::take(&mut current));
            bytes = 0;
        }
        bytes += n;
        current.push(item);
    }
    if !current.is_empty() {
        out.push(current);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn groups_moved_between_stay_together_through_chains() {
        let g = |f: &str| (String::from("p"), f.to_string());
        // a→b (one clustering), c→d (another), then b and c clustered again: a..d are one set.
        let root = joined_groups(&[vec![g("a"), g("b")], vec![g("c"), g("d")], vec![g("b"), g("c"), g("e")]]);
        let a = root(g("a"));
        for f in ["b", "c", "d", "e"] {
            assert_eq!(root(g(f)), a, "{f}");
        }
        assert_eq!(root(g("z")), g("z"), "a group in no set is its own");
        assert_eq!(joined_groups(&[vec![]])(g("a")), g("a"));
    }

    proptest! {
        /// Packing keeps every item once, in order, and a run passes the target only by its
        /// last item.
        #[test]
        fn packing_keeps_items_in_order_near_the_target(sizes in proptest::collection::vec(0u64..100, 0..50), target in 1u64..300) {
            let parts = pack(sizes.clone(), target, |s| *s);
            prop_assert_eq!(parts.iter().flatten().copied().collect::<Vec<_>>(), sizes);
            for p in &parts {
                prop_assert!(!p.is_empty());
                prop_assert!(p[..p.len() - 1].iter().sum::<u64>() <= target);
            }
        }
    }
}
