//! The change stream of a window `(start, end]`: every key whose state differs between the
//! snapshot at `start` and the snapshot at `end`.
//!
//! Only the file groups the window's commits wrote into or replaced can hold a change, so both
//! snapshots are read over those groups alone (compactions change no row and are skipped). The two
//! are joined on (`_hoodie_partition_path`, `_hoodie_record_key`):
//!
//! | at `start` | at `end`                        | `_change_type` |
//! |------------|---------------------------------|----------------|
//! | absent     | present                         | `insert`       |
//! | present    | present, written in the window  | `update`       |
//! | present    | absent                          | `delete`       |
//!
//! A row present at both whose commit time is not in the window did not change (its file group was
//! rewritten around it) and is not returned. A key inserted and deleted inside the window is not
//! returned either: the stream is the net change between two table states, which is what a consumer
//! that applies it to the state at `start` needs. Updated and inserted rows carry their state at
//! `end`; deleted rows carry their key and partition (the meta columns and the record-key and
//! partition fields), other columns null.

use std::collections::HashSet;
use std::sync::Arc;

use datafusion::common::{Column, JoinType};
use datafusion::dataframe::DataFrame;
use datafusion::execution::context::SessionContext;
use datafusion::logical_expr::{Expr, lit, when};

use super::{CommitWindow, HudiTableProvider, ScanOptions, ScanPlan, keyed};
use crate::error::{Error, Result};
use crate::read::Seen;
use crate::schema::{COMMIT_TIME, PARTITION_PATH, RECORD_KEY};
use crate::table::Table;
use crate::table::fs_view::FileGroupId;

/// The column a change query adds.
pub const CHANGE_TYPE: &str = "_change_type";

/// The two snapshots a change query compares, over the file groups the window touched.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct ChangePlan {
    /// The touched groups as of `start` (empty when `start` precedes the table).
    pub before: ScanPlan,
    /// The touched groups as of `end`.
    pub after: ScanPlan,
    /// Start of the window, exclusive: an instant time (all zeros when the query gives none).
    pub start: String,
    /// End of the window, inclusive: an instant time (the latest completed commit when the query gives none).
    pub end: String,
    /// The commits whose rows changed in the window: requested times in `(start, end]` on table
    /// version 6, the instants completed in it on versions 8 and 9.
    pub window: CommitWindow,
    /// File groups that a split must not part: those of a partition where a commit of the
    /// window deleted records or replaced groups (a key may have moved between them). Planning
    /// only.
    #[serde(skip)]
    pub together: Vec<Vec<FileGroupId>>,
}

impl Table {
    /// Plans a change query; `None` when the table has no completed commit.
    pub async fn plan_changes(&self, opts: &ScanOptions) -> Result<Option<ChangePlan>> {
        // Windows of requested times on version 6, of completion times on versions 8 and 9 (as
        // incremental queries: docs/TIMELINE_FORMAT.md).
        let Some((latest, by_completion)) = self.window_latest() else {
            return Ok(None);
        };
        let (start, end) = self.window(opts, latest)?;
        if self.reaches_archive(&start) {
            return Box::pin(self.with_archived_timeline().await?.plan_changes(opts)).await;
        }
        let admitted = self.instants_in_window(&start, &end, by_completion);
        let (touched, together) = self.touched_and_rewritten(&admitted).await?;
        let (seen_start, seen_end) = (Seen::window_end(&start, by_completion), Seen::window_end(&end, by_completion));
        // The instant each side's log blocks are read up to: the bound itself, or on versions 8
        // and 9 the latest requested time among the commits completed by it.
        let upper_of = |seen: Seen<'_>, bound: &str| match by_completion {
            true => self.latest_seen(seen).unwrap_or_else(|| "0".repeat(17)),
            false => bound.to_string(),
        };
        let (upper_start, upper_end) = (upper_of(seen_start, &start), upper_of(seen_end, &end));
        let mut before = ScanPlan {
            slices: self.slices_of(&touched, &upper_start, seen_start, "start").await?,
            upper: upper_start,
            commit_range: None,
        };
        let mut after = ScanPlan {
            slices: self.slices_of(&touched, &upper_end, seen_end, "end").await?,
            upper: upper_end,
            commit_range: None,
        };
        if self.config().populate_meta_fields {
            keyed::read_shared_bases_by_logged_keys(&mut before, &mut after);
        }
        let window = match by_completion {
            true => CommitWindow::Instants(admitted.iter().map(|i| i.time.clone()).collect()),
            false => CommitWindow::Range(start.clone(), end.clone()),
        };
        Ok(Some(ChangePlan { before, after, start, end, window, together }))
    }

    /// Change queries need record keys.
    pub(crate) fn check_changes_readable(&self) -> Result<()> {
        match self.config().populate_meta_fields {
            true => Ok(()),
            false => Err(Error::unsupported("change queries on a table without meta fields (no record keys)")),
        }
    }

    /// The change stream of a plan (`None`: a table without commits) as a DataFrame of `ctx`: the
    /// table's columns and [`CHANGE_TYPE`].
    pub(crate) fn changes_frame(&self, ctx: &SessionContext, plan: Option<ChangePlan>) -> Result<DataFrame> {
        self.check_changes_readable()?;
        let schema = self.schema();
        let Some(plan) = plan else {
            let empty = ScanPlan::default();
            let frame = ctx.read_table(Arc::new(HudiTableProvider::try_new(self, empty)?))?;
            let kind = lit(datafusion::common::ScalarValue::Utf8(None)).alias(CHANGE_TYPE);
            return Ok(frame
                .select(schema.fields().iter().map(|f| Expr::Column(Column::from_name(f.name()))).chain([kind]))?);
        };

        // Columns a deleted row keeps: what identifies it.
        let cfg = self.config();
        let mut carried: Vec<&str> = vec![RECORD_KEY, PARTITION_PATH];
        for f in cfg.record_key_fields.iter().chain(&cfg.partition_fields) {
            if schema.field_with_name(f).is_ok() && !carried.contains(&f.as_str()) {
                carried.push(f);
            }
        }
        let carried_set: HashSet<&str> = carried.iter().copied().collect();

        let before = ctx
            .read_table(Arc::new(HudiTableProvider::try_new(self, plan.before)?))?
            .select_columns(&carried)?
            .alias("s")?;
        let after = ctx.read_table(Arc::new(HudiTableProvider::try_new(self, plan.after)?))?.alias("e")?;
        let s = |name: &str| Expr::Column(Column::new(Some("s"), name));
        let e = |name: &str| Expr::Column(Column::new(Some("e"), name));

        let joined = before.join_on(
            after,
            JoinType::Full,
            [s(PARTITION_PATH).eq(e(PARTITION_PATH)), s(RECORD_KEY).eq(e(RECORD_KEY))],
        )?;
        let written_in_window = match &plan.window {
            CommitWindow::Range(start, _) => e(COMMIT_TIME).gt(lit(start.as_str())),
            CommitWindow::Instants(times) => {
                e(COMMIT_TIME).in_list(times.iter().map(|t| lit(t.as_str())).collect(), false)
            }
        };
        let changed = s(RECORD_KEY).is_null().or(e(RECORD_KEY).is_null()).or(written_in_window);
        let kind = when(s(RECORD_KEY).is_null(), lit("insert"))
            .when(e(RECORD_KEY).is_null(), lit("delete"))
            .otherwise(lit("update"))?
            .alias(CHANGE_TYPE);
        // A row present at the end carries its values there, nulls included (a partition column
        // null at the end and "" at the start names the same default partition); a deleted row,
        // the start's identifying ones.
        let columns = schema
            .fields()
            .iter()
            .map(|f| {
                let name = f.name().as_str();
                let value = match carried_set.contains(name) {
                    true => when(e(RECORD_KEY).is_null(), s(name)).otherwise(e(name))?,
                    false => e(name),
                };
                Ok(value.alias(name))
            })
            .collect::<datafusion::error::Result<Vec<Expr>>>()?;
        Ok(joined.filter(changed)?.select(columns.into_iter().chain([kind]))?)
    }
}

/// A change query's full outer join keeps one side in a hash table, which DataFusion cannot
/// spill: a random change of a large table touches every file group, and the rows of both
/// snapshots then pass the memory the query may hold (at 10,000,000 keys it failed with
/// `Resources exhausted` at 1 GiB). Where the compared rows' files alone come to half of
/// `memory_limit`, both sides are sorted by key instead (sorts spill to disk) and merged.
///
/// DataFusion plans a sort-merge join only over at least two partitions with joins repartitioned
/// (else it collects one side into a hash table whatever it is told), so both are asked for.
/// Each sort (one per side and partition) sets memory aside for merging its spills, memory the
/// scans cannot take back: 10 MiB by default, here at most an eighth of the limit in all.
pub(crate) fn join_by_sort_when_large(ctx: &SessionContext, plan: &ChangePlan, memory_limit: usize) {
    let bytes: u64 = plan.before.slices.iter().chain(&plan.after.slices).map(keyed::joined_bytes).sum();
    if bytes < (memory_limit / 2) as u64 {
        return;
    }
    let state = ctx.state_ref();
    let mut state = state.write();
    let options = state.config_mut().options_mut();
    options.optimizer.prefer_hash_join = false;
    options.optimizer.repartition_joins = true;
    options.execution.target_partitions = options.execution.target_partitions.max(2);
    let sorts = 2 * options.execution.target_partitions;
    let set_aside = &mut options.execution.sort_spill_reservation_bytes;
    *set_aside = (*set_aside).min(memory_limit / (8 * sorts));
}
