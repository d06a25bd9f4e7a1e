//! Reads: plan the file slices of a query, then execute them through DataFusion.
//!
//! [`Table::plan_scan`] turns a query (snapshot as of an instant, read-optimized, or the changes in
//! `(start, end]`) into the file slices to read; [`provider::HudiTableProvider`] turns those into a
//! DataFusion plan: a Parquet scan for slices that are a base file alone, and a
//! [`mor_exec::MergeOnReadExec`] for slices with log files; [`Table::scan`] adds the user's filter
//! and column selection and returns a stream of record batches.

mod adapter;
pub mod changes;
pub mod filter;
pub mod foreign;
mod in_set;
mod keyed;
pub mod merge;
pub mod mor_exec;
mod named;
pub mod provider;
pub mod pruner;
pub mod splits;

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::sync::Arc;

use datafusion::dataframe::DataFrame;
use datafusion::execution::SendableRecordBatchStream;
use datafusion::execution::context::SessionContext;
use datafusion::logical_expr::Expr;
use datafusion::prelude::SessionConfig;
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::format::file_name::{BaseFileName, LogFileName};
use crate::format::instant::{Instant, normalize_time};
use crate::table::Table;
use crate::table::fs_view::{FileGroup, FileGroupId, FileSlice, LogFile};
pub use filter::{Filter, Op, Predicate};
pub use keyed::KeysOf;
pub use provider::HudiTableProvider;

/// Which rows a scan returns.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum QueryType {
    /// The table as of an instant (the latest by default).
    #[default]
    Snapshot,
    /// Records written by the commits in `(start, end]`, in their latest state within the window.
    Incremental,
    /// Base files only: the state as of the last compaction of each file group (merge-on-read).
    ReadOptimized,
    /// Every key whose state differs between `start` and `end`: its state at `end` and a
    /// `_change_type` column (`insert`, `update`, `delete`; see [`changes`]).
    Changes,
}

impl QueryType {
    /// Parses `snapshot`, `read_optimized`, `incremental` or `changes`.
    pub fn parse(s: &str) -> Result<Self> {
        match s {
            "snapshot" => Ok(QueryType::Snapshot),
            "incremental" => Ok(QueryType::Incremental),
            "read_optimized" => Ok(QueryType::ReadOptimized),
            "changes" => Ok(QueryType::Changes),
            other => Err(Error::invalid_arg(
                "query",
                format!("`{other}` (expected snapshot, read_optimized, incremental or changes)"),
            )),
        }
    }
}

/// What to read.
#[derive(Clone, Debug, Default)]
pub struct ScanOptions {
    /// Columns to return, in this order (all by default).
    pub columns: Option<Vec<String>>,
    /// Rows to keep; also prunes file slices by their statistics.
    pub filter: Option<Filter>,
    /// Snapshot as of this instant time (time travel).
    pub as_of: Option<String>,
    /// Which query (snapshot by default).
    pub query: QueryType,
    /// Incremental window start (exclusive); the beginning of time by default.
    pub start: Option<String>,
    /// Incremental window end (inclusive); the latest commit by default.
    pub end: Option<String>,
    /// Rows per batch (DataFusion's default when `None`).
    pub batch_size: Option<usize>,
    /// Bytes the scan may hold ([`DEFAULT_MEMORY_LIMIT`] when `None`); merge-on-read slices whose
    /// logs exceed their share are merged in several passes.
    pub memory_limit: Option<usize>,
}

/// The default memory budget of a scan.
pub const DEFAULT_MEMORY_LIMIT: usize = 1 << 30;

/// A base file selected by planning.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PlannedFile {
    /// Its partition path.
    pub partition: String,
    /// Relative to the table root.
    pub path: String,
    /// Bytes (of the whole file, also when a split reads a part of it).
    pub size: u64,
    /// The part of its rows read, when a split cut the file ([`RowRange`]); all of them when `None`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rows: Option<RowRange>,
}

/// Rows `start..end` of a base file of `total` rows: a split's part of a file that is cut so that
/// several workers read it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RowRange {
    /// The first row read.
    pub start: u64,
    /// One past the last row read.
    pub end: u64,
    /// The file's rows.
    pub total: u64,
}

impl RowRange {
    /// The rows as a selection over the whole file.
    pub fn selection(&self) -> parquet::arrow::arrow_reader::RowSelection {
        self.over_file(true)
    }

    /// The other rows of the file, as a selection over the whole file.
    pub fn outside(&self) -> parquet::arrow::arrow_reader::RowSelection {
        self.over_file(false)
    }

    /// The rows before, inside and after the range, the inside ones selected or the others.
    fn over_file(&self, inside: bool) -> parquet::arrow::arrow_reader::RowSelection {
        use parquet::arrow::arrow_reader::RowSelector;
        let (start, end) = (self.start.min(self.total), self.end.min(self.total));
        let piece = |rows: u64, selected: bool| match selected {
            true => RowSelector::select(rows as usize),
            false => RowSelector::skip(rows as usize),
        };
        let parts = [
            piece(start, !inside),
            piece(end.saturating_sub(start), inside),
            piece(self.total - end.max(start), !inside),
        ];
        parts.into_iter().filter(|s| s.row_count > 0).collect::<Vec<_>>().into()
    }

    /// Its rows' share of the file's `bytes`.
    pub fn share_of(&self, bytes: u64) -> u64 {
        let rows = self.end.min(self.total).saturating_sub(self.start);
        (u128::from(bytes) * u128::from(rows) / u128::from(self.total.max(1))) as u64
    }

    /// Whether this part holds the rows of the slice's log that no row of its base file has
    /// (inserts into logs): the first part of a cut file does.
    pub fn owns_log_inserts(&self) -> bool {
        self.start == 0
    }
}

/// A file slice selected by planning: its base file and the log files read over it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PlannedSlice {
    /// The partition path of its file group.
    pub partition: String,
    /// The file id of its file group.
    pub file_id: String,
    /// Its base file (`None`: a log-only slice, or a read-optimized query's slice without one).
    pub base: Option<PlannedFile>,
    /// The log files merged over the base, oldest first.
    pub logs: Vec<LogFile>,
    /// When set, only the base file's rows whose record key some log holds are read
    /// ([`KeysOf`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub keys_of: Option<KeysOf>,
}

impl PlannedSlice {
    /// Whether the slice is read by the merge-on-read node: it has log files, or its rows are
    /// chosen by their keys.
    pub fn merged(&self) -> bool {
        !self.logs.is_empty() || self.keys_of.is_some()
    }

    /// Bytes of the files the slice reads (of a base file cut by rows, its rows' share).
    pub fn size(&self) -> u64 {
        self.base_size() + self.logs.iter().map(|l| l.size).sum::<u64>()
    }

    /// Bytes of its base file it reads (of a file cut by rows, its rows' share).
    pub fn base_size(&self) -> u64 {
        self.base.as_ref().map_or(0, |b| match b.rows {
            Some(r) => r.share_of(b.size),
            None => b.size,
        })
    }

    /// The slice with `rows` of its base file read.
    pub fn with_rows(&self, rows: RowRange) -> Self {
        let base = self.base.as_ref().map(|b| PlannedFile { rows: Some(rows), ..b.clone() });
        PlannedSlice { base, ..self.clone() }
    }

    /// Its file group.
    pub fn group_id(&self) -> FileGroupId {
        (self.partition.clone(), self.file_id.clone())
    }

    fn new(g: &FileGroup, s: &FileSlice, with_logs: bool) -> Option<Self> {
        let base = s.base.as_ref().map(|b| PlannedFile {
            partition: g.partition.clone(),
            path: b.path.clone(),
            size: b.size,
            rows: None,
        });
        let logs = if with_logs { s.logs.clone() } else { Vec::new() };
        (base.is_some() || !logs.is_empty()).then(|| PlannedSlice {
            partition: g.partition.clone(),
            file_id: g.file_id.clone(),
            base,
            logs,
            keys_of: None,
        })
    }
}

/// Which commits an incremental query's rows must come from (`_hoodie_commit_time`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum CommitWindow {
    /// Requested times in `(start, end]` (table version 6: windows bound requested times).
    Range(String, String),
    /// Exactly these instants (versions 8 and 9: the window bounds completion times, so the
    /// admitted instants are listed by their requested times).
    Instants(Vec<String>),
}

/// The slices of a query, the instant its log blocks are read up to, and the commits its rows must
/// come from.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct ScanPlan {
    /// The file slices read.
    pub slices: Vec<PlannedSlice>,
    /// Log blocks of later instants are not read.
    pub upper: String,
    /// Incremental queries: the commits whose rows are returned.
    pub commit_range: Option<CommitWindow>,
}

impl ScanPlan {
    /// Every file the plan reads, base files first in each slice.
    pub fn paths(&self) -> Vec<String> {
        self.slices
            .iter()
            .flat_map(|s| s.base.iter().map(|b| b.path.clone()).chain(s.logs.iter().map(|l| l.path.clone())))
            .collect()
    }
}

/// Which commits a read sees: its answer is a function of them alone, whatever completes later.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Seen<'a> {
    /// Those requested at or before a time (time travel; windows on timeline layout 1).
    RequestedBy(&'a str),
    /// Those completed at or before a time (windows on timeline layout 2, of completion times): a
    /// write requested before the window's end and completed after it is not seen, though its
    /// requested time is older than commits that are.
    CompletedBy(&'a str),
}

impl Seen<'_> {
    /// Whether a completed data instant is seen.
    pub(crate) fn sees(self, i: &Instant) -> bool {
        match self {
            Seen::RequestedBy(t) => i.time.as_str() <= t,
            Seen::CompletedBy(t) => i.completion.as_deref().unwrap_or(&i.time) <= t,
        }
    }

    /// What a window ending at `end` sees on a timeline of `by_completion` windows.
    pub(crate) fn window_end(end: &str, by_completion: bool) -> Seen<'_> {
        match by_completion {
            true => Seen::CompletedBy(end),
            false => Seen::RequestedBy(end),
        }
    }
}

impl Table {
    /// Chooses the file slices a query reads; no data file is opened.
    pub async fn plan_scan(&self, opts: &ScanOptions) -> Result<ScanPlan> {
        match self.plan_scan_once(opts).await {
            // An instant file listed, then gone: archived (or rolled back) by another process
            // meanwhile. Planned again on the timeline as it is now.
            Err(Error::Storage { source: object_store::Error::NotFound { .. }, .. }) => {
                let mut fresh = self.clone();
                fresh.reload().await?;
                Box::pin(fresh.plan_scan_once(opts)).await
            }
            other => other,
        }
    }

    async fn plan_scan_once(&self, opts: &ScanOptions) -> Result<ScanPlan> {
        // A read as of an archived instant, or from one, plans on the timeline with the archive.
        let from = match opts.query {
            // Without a start the window opens at the table's first commit, archived or not.
            QueryType::Incremental => {
                Some(opts.start.as_deref().map(normalize_time).transpose()?.unwrap_or_else(|| "0".repeat(17)))
            }
            _ => opts.as_of.as_deref().map(normalize_time).transpose()?,
        };
        if let Some(from) = from
            && self.reaches_archive(&from)
        {
            return Box::pin(self.with_archived_timeline().await?.plan_scan_once(opts)).await;
        }
        let timeline = self.timeline();
        let Some(latest) = timeline.latest_completed_data().map(|i| i.time.clone()) else {
            return Ok(ScanPlan::default());
        };
        match opts.query {
            QueryType::Snapshot | QueryType::ReadOptimized => {
                if opts.start.is_some() || opts.end.is_some() {
                    return Err(Error::invalid_arg("start", "start and end go with query=\"incremental\""));
                }
                let as_of = match &opts.as_of {
                    Some(t) => normalize_time(t)?,
                    None => latest.clone(),
                };
                // The archived timeline is on `timeline` when `as_of` reaches before the active one.
                if let Some(first) = timeline.completed_data().next().filter(|first| as_of < first.time) {
                    return Err(Error::invalid_arg(
                        "as_of",
                        format!(
                            "{as_of} is before the table's first commit ({}): the table held nothing then",
                            first.time
                        ),
                    ));
                }
                let with_logs = opts.query == QueryType::Snapshot;
                // As of an earlier instant, nothing requested after it is seen: on timeline layout 2
                // a log of a write completed after a later compaction joins the compaction's slice,
                // and read as of the write it would be missed (half the commit shown).
                let view = match as_of < latest {
                    true => self.file_system_view_seeing(|i| i.time <= as_of).await?,
                    false => self.file_system_view().await?,
                };
                let replaced = self.replaced_file_groups(&as_of).await?;
                if as_of < latest {
                    self.check_not_cleaned("as_of", &as_of, &view, &replaced).await?;
                }
                let slices: Vec<PlannedSlice> = view
                    .slices_as_of(&as_of, &replaced)
                    .filter_map(|(g, s)| PlannedSlice::new(g, s, with_logs))
                    .collect();
                // What completed instants wrote (read once per process, cached), against the listing.
                let committed = crate::log::CommittedLogs::load(self.storage(), self.timeline()).await?;
                check_bases_present(&committed, &view, &replaced, &as_of)?;
                if with_logs && self.config().table_type == crate::config::TableType::MergeOnRead {
                    check_logs_present(&committed, &slices, &as_of)?;
                }
                Ok(ScanPlan { slices, upper: as_of, commit_range: None })
            }
            QueryType::Changes => {
                Err(Error::invalid_arg("query", "a change query reads two snapshots: see Table::plan_changes"))
            }
            QueryType::Incremental => {
                let Some((latest, by_completion)) = self.window_latest() else {
                    return Ok(ScanPlan::default());
                };
                let (start, end) = self.window(opts, latest)?;
                let admitted = self.instants_in_window(&start, &end, by_completion);
                let Some(upper) = admitted.iter().map(|i| i.time.clone()).max() else {
                    return Ok(ScanPlan::default());
                };
                let touched = self.touched_file_groups(&admitted).await?;
                let seen = Seen::window_end(&end, by_completion);
                let mut slices = self.slices_of(&touched, &upper, seen, "end").await?;
                let window = match by_completion {
                    true => CommitWindow::Instants(admitted.iter().map(|i| i.time.clone()).collect()),
                    false => CommitWindow::Range(start, end),
                };
                // Without meta fields rows carry no commit time: whole files of the window are read.
                let commit_range = self.config().populate_meta_fields.then_some(window);
                if let Some(window) = &commit_range {
                    keyed::read_older_bases_by_logged_keys(&mut slices, window, &upper);
                }
                Ok(ScanPlan { slices, upper, commit_range })
            }
        }
    }

    /// The `(start, end]` window of an incremental or change query, checked.
    fn window(&self, opts: &ScanOptions, latest: String) -> Result<(String, String)> {
        if opts.as_of.is_some() {
            return Err(Error::invalid_arg("as_of", "as_of goes with query=\"snapshot\""));
        }
        let start = opts.start.as_deref().map(normalize_time).transpose()?.unwrap_or_else(|| "0".repeat(17));
        let end = opts.end.as_deref().map(normalize_time).transpose()?.unwrap_or(latest);
        if end < start {
            return Err(Error::invalid_arg("end", format!("{end} is before start {start}")));
        }
        Ok((start, end))
    }

    /// The latest bound a window may take, and whether windows bound completion times: version 6
    /// windows bound requested times, versions 8 and 9 completion times. `None`: no commit yet.
    fn window_latest(&self) -> Option<(String, bool)> {
        let timeline = self.timeline();
        let latest = timeline.latest_completed_data()?;
        match latest.completion.is_some() {
            true => {
                let completions = timeline.completed_data().filter_map(|i| i.completion.clone());
                Some((completions.max().unwrap_or_else(|| latest.time.clone()), true))
            }
            false => Some((latest.time.clone(), false)),
        }
    }

    /// The completed data instants of the window `(start, end]`: by requested time, or by
    /// completion time where windows bound completion times.
    fn instants_in_window(&self, start: &str, end: &str, by_completion: bool) -> Vec<Instant> {
        self.timeline()
            .completed_data()
            .filter(|i| {
                let t = match by_completion {
                    true => i.completion.as_deref().unwrap_or(&i.time),
                    false => &i.time,
                };
                t > start && t <= end
            })
            .cloned()
            .collect()
    }

    /// The latest requested time among the completed data instants `seen` sees.
    fn latest_seen(&self, seen: Seen<'_>) -> Option<String> {
        self.timeline().completed_data().filter(|i| seen.sees(i)).map(|i| i.time.clone()).max()
    }

    /// The file groups the given commits wrote into or replaced. Compactions are skipped: they
    /// rewrite slices without changing a row.
    async fn touched_file_groups(&self, instants: &[Instant]) -> Result<HashSet<FileGroupId>> {
        Ok(self.touched_and_rewritten(instants).await?.0)
    }

    /// The file groups `instants` wrote into or replaced, and sets of them between which a key
    /// may have moved, so that a change query reads each set together: every touched group of a
    /// partition where a commit deleted records or replaced file groups (a key deleted from one
    /// group, or rewritten by a clustering or an overwrite, may be in another at the end).
    async fn touched_and_rewritten(
        &self,
        instants: &[Instant],
    ) -> Result<(HashSet<FileGroupId>, Vec<Vec<FileGroupId>>)> {
        let timeline = self.timeline();
        let mut touched = HashSet::new();
        let mut emptied: HashSet<String> = HashSet::new();
        let mut blank: Vec<&Instant> = Vec::new();
        for instant in instants {
            let meta = timeline.commit_metadata(self.storage(), instant).await?;
            if meta.compacted {
                continue;
            }
            if meta == crate::format::commit::CommitMetadata::default() {
                blank.push(instant);
            }
            emptied.extend(meta.write_stats().filter(|(_, s)| s.num_deletes > 0).map(|(p, _)| p.to_string()));
            emptied.extend(meta.replaced_file_groups().map(|(p, _)| p.to_string()));
            touched.extend(meta.write_stats().map(|(p, s)| (p.to_string(), s.file_id.clone())));
            touched.extend(meta.replaced_file_groups().map(|(p, f)| (p.to_string(), f.to_string())));
        }
        self.check_blank_commits(&blank).await?;
        let mut together: BTreeMap<&str, Vec<FileGroupId>> = BTreeMap::new();
        for group in touched.iter().filter(|(p, _)| emptied.contains(p)) {
            together.entry(group.0.as_str()).or_default().push(group.clone());
        }
        let together = together.into_values().collect();
        Ok((touched, together))
    }

    /// Fails on a commit of `blank` (its completed file empty: Apache Hudi's layout 1 reads that as
    /// a commit of nothing) that wrote files all the same: its file was emptied, and a window read
    /// from it would drop the commit's rows.
    async fn check_blank_commits(&self, blank: &[&Instant]) -> Result<()> {
        if blank.is_empty() {
            return Ok(());
        }
        let view = self.file_system_view().await?;
        let wrote = |time: &str| {
            view.groups().flat_map(|g| g.slices.values()).any(|s| {
                s.base.as_ref().is_some_and(|b| b.name.instant == time) || s.logs.iter().any(|l| l.name.instant == time)
            })
        };
        match blank.iter().find(|i| wrote(&i.time)) {
            Some(i) => Err(Error::corrupt(
                self.timeline().path_of(i),
                "empty, yet the table holds files this commit wrote: its metadata is lost",
            )),
            None => Ok(()),
        }
    }

    /// The live slices, as of `as_of`, of the given file groups (with their log files) as a reader
    /// who sees the commits `seen` names sees them; fails if a clean removed some (`arg` names the
    /// argument that asked for `as_of`).
    async fn slices_of(
        &self,
        groups: &HashSet<FileGroupId>,
        as_of: &str,
        seen: Seen<'_>,
        arg: &str,
    ) -> Result<Vec<PlannedSlice>> {
        let view = match seen {
            _ if self.timeline().completed_data().all(|i| seen.sees(i)) => self.file_system_view().await?,
            _ => self.file_system_view_seeing(|i| seen.sees(i)).await?,
        };
        let replaced = self.replaced_file_groups_by(|i| seen.sees(i)).await?;
        if self.timeline().latest_completed_data().is_some_and(|l| as_of < l.time.as_str()) {
            self.check_not_cleaned(arg, as_of, &view, &replaced).await?;
        }
        let mut slices: Vec<PlannedSlice> = groups
            .iter()
            .filter(|id| !replaced.contains(*id))
            .filter_map(|id| view.get(id))
            .filter_map(|g| g.slice_as_of(as_of).and_then(|s| PlannedSlice::new(g, s, true)))
            .collect();
        slices.sort_by(|a, b| (&a.partition, &a.file_id).cmp(&(&b.partition, &b.file_id)));
        Ok(slices)
    }

    /// The latest snapshot's slices (with their logs) of the file groups `groups` alone, planned
    /// from the files of their partitions: what a lookup through the record index reads, at a
    /// cost that does not grow with the table. `None` when a group is not in its partition's
    /// files (the index spelled it otherwise): the caller plans the whole table instead.
    pub(crate) async fn plan_groups(&self, groups: &HashSet<FileGroupId>) -> Result<Option<ScanPlan>> {
        let Some(latest) = self.timeline().latest_completed_data().map(|i| i.time.clone()) else {
            return Ok(Some(ScanPlan::default()));
        };
        if groups.is_empty() {
            return Ok(Some(ScanPlan { slices: Vec::new(), upper: latest, commit_range: None }));
        }
        let partitions: BTreeSet<String> = groups.iter().map(|(p, _)| p.clone()).collect();
        let view = self.file_system_view_in(&partitions).await?;
        let replaced = self.replaced_file_groups(&latest).await?;
        let mut slices = Vec::with_capacity(groups.len());
        for id in groups.iter().filter(|id| !replaced.contains(*id)) {
            let Some(group) = view.get(id) else { return Ok(None) };
            slices.extend(group.slice_as_of(&latest).and_then(|s| PlannedSlice::new(group, s, true)));
        }
        slices.sort_by(|a, b| (&a.partition, &a.file_id).cmp(&(&b.partition, &b.file_id)));
        // The checks of a whole plan, on what completed instants wrote into these groups.
        let ids: HashSet<&str> = groups.iter().map(|(_, f)| f.as_str()).collect();
        let committed =
            crate::log::CommittedLogs::load_of(self.storage(), self.timeline(), |c| ids.contains(c.file_id.as_str()))
                .await?;
        check_bases_present(&committed, &view, &replaced, &latest)?;
        if self.config().table_type == crate::config::TableType::MergeOnRead {
            check_logs_present(&committed, &slices, &latest)?;
        }
        Ok(Some(ScanPlan { slices, upper: latest, commit_range: None }))
    }

    /// [`Table::plan_scan`], less the slices that the metadata table's `column_stats` and
    /// `bloom_filters` show cannot hold a row passing the filter.
    pub async fn plan_scan_pruned(&self, opts: &ScanOptions) -> Result<ScanPlan> {
        let mut plan = self.plan_scan(opts).await?;
        if let Some(filter) = &opts.filter {
            plan.slices = pruner::prune(self, plan.slices, filter).await?;
        }
        Ok(plan)
    }

    /// Every file a query reads (after planning and pruning by the metadata table's file indexes,
    /// before partition pruning).
    pub async fn planned_paths(&self, opts: &ScanOptions) -> Result<Vec<String>> {
        if opts.query != QueryType::Changes {
            return Ok(self.plan_scan_pruned(opts).await?.paths());
        }
        let Some(plans) = self.plan_changes(opts).await? else { return Ok(Vec::new()) };
        let mut paths = plans.before.paths();
        let seen: HashSet<String> = paths.iter().cloned().collect();
        paths.extend(plans.after.paths().into_iter().filter(|p| !seen.contains(p)));
        Ok(paths)
    }

    /// A DataFusion table provider of a query, for use in any `SessionContext`.
    pub async fn provider(&self, opts: &ScanOptions) -> Result<HudiTableProvider> {
        let plan = self.plan_scan(opts).await?;
        HudiTableProvider::try_new(self, plan)
    }

    /// Runs a query and streams its record batches.
    pub async fn scan(&self, opts: &ScanOptions) -> Result<SendableRecordBatchStream> {
        let split = match opts.query {
            QueryType::Changes => {
                self.check_changes_readable()?;
                splits::Split::Changes(self.plan_changes(opts).await?)
            }
            _ => splits::Split::Scan(self.plan_scan_pruned(opts).await?),
        };
        self.scan_split(split, opts).await
    }

    /// The table as a snapshot planned as of an earlier instant (time travel) reads it: with
    /// the columns as of that instant; `None` when the plan reads the latest columns (the
    /// latest snapshot, or a window of commits).
    pub(crate) async fn read_as(&self, plan: &ScanPlan) -> Result<Option<Table>> {
        let earlier = self.timeline().latest_completed_data().is_some_and(|l| plan.upper < l.time);
        // An incremental window that admits no instant plans nothing, as of no instant.
        if plan.commit_range.is_some() || plan.upper.is_empty() || !earlier {
            return Ok(None);
        }
        self.with_schema_as_of(&plan.upper).await
    }

    /// Plans a snapshot or read-optimized query for another engine (`what` names it in the
    /// error for any other query).
    pub(crate) async fn plan_snapshot(&self, opts: &ScanOptions, what: &str) -> Result<ScanPlan> {
        if !matches!(opts.query, QueryType::Snapshot | QueryType::ReadOptimized) {
            return Err(Error::invalid_arg("query", format!("{what} serves a snapshot or read_optimized query")));
        }
        self.plan_scan_pruned(opts).await
    }

    /// Reads a planned split (see [`Table::plan_splits`]) with the columns, filter and batch size of
    /// `opts` (its other fields went into the planning).
    pub async fn scan_split(&self, split: splits::Split, opts: &ScanOptions) -> Result<SendableRecordBatchStream> {
        let ctx = session(self, opts.batch_size, opts.memory_limit)?;
        if let splits::Split::Changes(Some(plan)) = &split {
            changes::join_by_sort_when_large(&ctx, plan, opts.memory_limit.unwrap_or(DEFAULT_MEMORY_LIMIT));
        }
        // The base files read, to name the one behind a failure that does not say (see `named`).
        let bases: Vec<(String, u64)> = match &split {
            splits::Split::Changes(Some(plans)) => {
                [&plans.before, &plans.after].into_iter().flat_map(base_files).collect()
            }
            splits::Split::Changes(None) => Vec::new(),
            splits::Split::Scan(plan) => base_files(plan).collect(),
        };
        let as_of = match &split {
            splits::Split::Scan(plan) => self.read_as(plan).await?,
            splits::Split::Changes(_) => None,
        };
        let table = as_of.as_ref().unwrap_or(self);
        let mut df = match split {
            splits::Split::Changes(plan) => self.changes_frame(&ctx, plan)?,
            splits::Split::Scan(plan) => ctx.read_table(Arc::new(HudiTableProvider::try_new(table, plan)?))?,
        };
        if let Some(f) = &opts.filter {
            let expr = f.to_expr(&df).map_err(|e| Error::invalid_arg("filter", e))?;
            df = df.filter(expr).map_err(|e| Error::invalid_arg("filter", e))?;
        }
        if let Some(cols) = &opts.columns {
            df = select(df, cols)?;
        }
        // Planning reads base file footers too: a damaged one fails here.
        let stream = match df.execute_stream().await {
            Ok(s) => s,
            Err(e) => return Err(named::name_failure(self.storage(), &bases, e.into()).await),
        };
        let schema = stream.schema();
        let named = named::name_failures(stream, self.storage().clone(), bases);
        Ok(Box::pin(datafusion::physical_plan::stream::RecordBatchStreamAdapter::new(schema, named)))
    }
}

/// `df` with the named columns in that order: top-level columns, or fields inside struct
/// columns by their dotted path (`customer.tier`: a column of that name holding the field).
fn select(df: DataFrame, names: &[String]) -> Result<DataFrame> {
    let exprs = names
        .iter()
        .map(|name| match filter::column_expr(df.schema(), name) {
            Some((Expr::Column(c), _)) => Ok(Expr::Column(c)),
            Some((expr, _)) => Ok(expr.alias(name)),
            None => {
                let known: Vec<&str> = df.schema().fields().iter().map(|f| f.name().as_str()).collect();
                Err(Error::invalid_arg("columns", format!("no column `{name}` (the table has {known:?})")))
            }
        })
        .collect::<Result<Vec<_>>>()?;
    df.select(exprs).map_err(|e| Error::invalid_arg("columns", e))
}

/// Fails if the base file a completed instant up to `upper` wrote as the latest of its file
/// group is not there: the listing would offer the group's older slice (stale rows) or none
/// (missing rows) without a word.
fn check_bases_present(
    committed: &crate::log::CommittedLogs,
    view: &crate::table::fs_view::FileSystemView,
    replaced: &HashSet<FileGroupId>,
    upper: &str,
) -> Result<()> {
    // The latest listed base instant of each file id (file ids are unique across partitions;
    // matching by id alone does not depend on how a partition path is spelled).
    let mut latest: std::collections::HashMap<&str, &str> = std::collections::HashMap::new();
    for b in view.groups().flat_map(|g| g.slices.values()).filter_map(|s| s.base.as_ref()) {
        let seen = latest.entry(b.name.file_id.as_str()).or_insert(b.name.instant.as_str());
        if *seen < b.name.instant.as_str() {
            *seen = b.name.instant.as_str();
        }
    }
    for (path, c) in committed.bases() {
        let id = (c.partition.clone(), c.file_id.clone());
        if c.instant.as_str() > upper || replaced.contains(&id) {
            continue;
        }
        let Some(name) = BaseFileName::parse(path.rsplit('/').next().unwrap_or(path)) else { continue };
        // There, or superseded by a later base file of the group (compaction, a later commit).
        let present = latest.get(name.file_id.as_str()).is_some_and(|l| *l >= name.instant.as_str());
        if !present {
            let why = format!("completed instant {} wrote this base file; it is gone", c.instant);
            let source = object_store::Error::NotFound { path: path.clone(), source: why.into() };
            return Err(Error::storage(path, source));
        }
    }
    Ok(())
}

/// Fails if a log file that a completed instant up to `upper` wrote into a planned slice is
/// not there: its rows would be missing from the read without a word.
fn check_logs_present(committed: &crate::log::CommittedLogs, slices: &[PlannedSlice], upper: &str) -> Result<()> {
    if slices.is_empty() {
        return Ok(());
    }
    let by_group: std::collections::HashMap<(&str, &str), &PlannedSlice> =
        slices.iter().map(|s| ((s.partition.as_str(), s.file_id.as_str()), s)).collect();
    for (path, c) in committed.iter() {
        let Some(slice) = by_group.get(&(c.partition.as_str(), c.file_id.as_str())) else { continue };
        if c.instant.as_str() > upper || slice.logs.iter().any(|l| &l.path == path) {
            continue;
        }
        let Some(name) = LogFileName::parse(path.rsplit('/').next().unwrap_or(path)) else { continue };
        // The log belongs to this slice when it is named like the slice's base or other logs
        // (an older slice's logs go with it; a clean removes them).
        let base = slice.base.as_ref().and_then(|b| BaseFileName::parse(b.path.rsplit('/').next().unwrap_or(&b.path)));
        let of_slice = base.is_some_and(|b| b.instant == name.instant)
            || slice.logs.iter().any(|l| l.name.instant == name.instant);
        if of_slice {
            return Err(Error::corrupt(
                path,
                format!("missing: completed instant {} wrote {} bytes into this log file", c.instant, c.end),
            ));
        }
    }
    Ok(())
}

/// `(path, size)` of the base files of a plan.
fn base_files(plan: &ScanPlan) -> impl Iterator<Item = (String, u64)> + '_ {
    plan.slices.iter().filter_map(|s| s.base.as_ref()).map(|b| (b.path.clone(), b.size))
}

/// A session that knows the table's store and returns plain (not view) string types.
pub fn session(table: &Table, batch_size: Option<usize>, memory_limit: Option<usize>) -> Result<SessionContext> {
    let mut config =
        SessionConfig::new().with_target_partitions(std::thread::available_parallelism().map_or(2, |n| n.get()));
    if let Some(n) = batch_size {
        config = config.with_batch_size(n.max(1));
    }
    let options = config.options_mut();
    options.execution.parquet.schema_force_view_types = false;
    options.execution.parquet.pushdown_filters = true;
    options.execution.parquet.reorder_filters = true;
    // Column names are case-sensitive in Hudi tables (`byteField`): no SQL identifier folding.
    options.sql_parser.enable_ident_normalization = false;
    let pool = datafusion::execution::memory_pool::FairSpillPool::new(memory_limit.unwrap_or(DEFAULT_MEMORY_LIMIT));
    let runtime =
        datafusion::execution::runtime_env::RuntimeEnvBuilder::new().with_memory_pool(Arc::new(pool)).build_arc()?;
    let ctx = SessionContext::new_with_config_rt(config, runtime);
    ctx.register_object_store(table.storage().store_url(), table.storage().object_store());
    Ok(ctx)
}
