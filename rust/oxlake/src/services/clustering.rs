//! Clustering: rewrites the small file groups of each partition into fewer, larger ones, sorted by
//! chosen columns, as one `replacecommit` that replaces the old groups. Readers see the same rows
//! before and after: records keep their commit time, sequence number, key and partition; only
//! `_hoodie_file_name` names the new file.
//!
//! The plan (which slices, which sort columns) goes into `t.replacecommit.requested` (JSON, like
//! our compaction plans). Execution reads the planned slices through the same plan as a snapshot
//! read (merge-on-read slices are merged), sorts them with DataFusion's sort (spilling to disk past
//! the memory budget), and streams the result into new base files that roll over at the target file
//! size. A writer that changes a planned file group before the clustering commits wins: the
//! clustering then fails its conflict check and is rolled back, so no update is ever lost.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;

use arrow::array::{ArrayRef, RecordBatch, StringArray};
use arrow::datatypes::SchemaRef;
use bytes::Bytes;
use datafusion::common::Column;
use datafusion::logical_expr::{Expr, SortExpr};
use futures::{StreamExt, TryStreamExt};
use object_store::buffered::BufWriter;
use parquet::arrow::AsyncArrowWriter;

use crate::commit::Transaction;
use crate::error::{Error, Result};
use crate::format::commit::{CLUSTER, CommitMetadata, WriteStat};
use crate::format::file_name::{BaseFileName, LogFileName, new_file_id};
use crate::format::instant::Action;
use crate::read::{HudiTableProvider, PlannedFile, PlannedSlice, ScanPlan};
use crate::schema::FILE_NAME;
use crate::services::progress::{self, Progress};
use crate::storage::Storage;
use crate::table::Table;
use crate::table::fs_view::{FileGroupId, LogFile};
use crate::write::WriteConfig;

/// How clustering chooses and writes file groups.
#[derive(Clone, Debug)]
pub struct ClusteringConfig {
    /// Columns the new files are sorted by (none: rows keep their order of reading).
    pub sort_by: Vec<String>,
    /// File groups whose latest slice (base and logs) is smaller than this are rewritten.
    pub small_file_limit: u64,
    /// At most this many input bytes go into one clustering group (one sorted run of output files).
    pub max_group_bytes: u64,
    /// Output file size, row groups and parallelism (`write.target_file_size` rolls files over).
    pub write: WriteConfig,
    /// The scan memory budget of each clustering group (sorting spills past it).
    pub memory_limit: Option<usize>,
    /// Counts the file groups rewritten, for a caller that shows progress.
    pub progress: Option<Arc<Progress>>,
}

impl Default for ClusteringConfig {
    fn default() -> Self {
        let write = WriteConfig::default();
        ClusteringConfig {
            sort_by: Vec::new(),
            small_file_limit: write.small_file_limit,
            max_group_bytes: 8 * write.target_file_size,
            write,
            memory_limit: None,
            progress: None,
        }
    }
}

pub use crate::format::clustering_plan::{ClusteringGroup, ClusteringPlan, ClusteringSlice};
pub use crate::table::pending::pending_clustering_groups;

/// What a clustering did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ClusteringResult {
    /// The replacecommit, `None` when no partition had file groups worth rewriting.
    pub instant: Option<String>,
    /// File groups rewritten.
    pub replaced_file_groups: usize,
    /// File groups written.
    pub new_file_groups: usize,
    /// Records rewritten.
    pub records: u64,
}

impl Table {
    /// Rewrites small file groups into fewer, sorted ones (see the module docs).
    pub async fn cluster(&mut self, config: &ClusteringConfig) -> Result<ClusteringResult> {
        match self.cluster_once(config).await {
            Err(e) if crate::timeline::archived_meanwhile(&e) => {
                log::info!("{}: clustering: {e}; again on the timeline as it is now", self.uri());
                self.cluster_once(config).await
            }
            other => other,
        }
    }

    async fn cluster_once(&mut self, config: &ClusteringConfig) -> Result<ClusteringResult> {
        self.reload().await?;
        crate::commit::rollback_failed(self).await?;
        let schema = self.data_schema();
        for c in &config.sort_by {
            if schema.field_with_name(c).is_err() {
                return Err(Error::invalid_arg("sort_by", format!("column `{c}` is not in the table")));
            }
        }
        if config.write.target_file_size == 0 {
            return Err(Error::invalid_arg("target_file_size", "must be positive"));
        }
        let plan = schedule(self, config).await?;
        if plan.input_groups.is_empty() {
            return Ok(ClusteringResult::default());
        }
        let request = Bytes::from(plan.to_avro(self.uri(), config.write.target_file_size)?);
        // Timeline layout 2 names a pending clustering `clustering`; it completes as a replacecommit.
        let action = if self.timeline().layout() >= 2 { Action::Clustering } else { Action::ReplaceCommit };
        let tx = Transaction::begin_with(self, action, |_| Ok(request.clone())).await?;
        let written = match execute(self, tx.time(), &plan, config).await {
            Ok(w) => w,
            Err(e) => return Err(tx.fail(self, e).await),
        };
        crate::commit::failpoint("cluster-before-commit");
        let mut metadata = CommitMetadata { operation_type: Some(CLUSTER.into()), ..Default::default() };
        metadata.set_schema(&schema, &self.config().name)?;
        let mut result = ClusteringResult::default();
        for (partition, id) in plan.file_groups() {
            metadata.partition_to_replace_file_ids.entry(partition).or_default().push(id);
            result.replaced_file_groups += 1;
        }
        for (partition, stat) in written {
            result.records += stat.num_writes as u64;
            result.new_file_groups += 1;
            metadata.partition_to_write_stats.entry(partition).or_default().push(stat);
        }
        let instant = tx.commit(self, &metadata).await?;
        result.instant = Some(instant.time);
        Ok(result)
    }
}

/// Groups the small file groups of each partition. A partition is clustered when it has two small
/// groups or more, or one with log files (rewriting it folds them in); groups a pending compaction
/// or clustering holds are left alone.
async fn schedule(table: &Table, config: &ClusteringConfig) -> Result<ClusteringPlan> {
    let Some(latest) = table.timeline().latest_completed_data().map(|i| i.time.clone()) else {
        return Ok(ClusteringPlan::default());
    };
    let busy: HashSet<FileGroupId> = crate::services::pending_compaction_groups(table)
        .await?
        .into_keys()
        .chain(pending_clustering_groups(table).await?)
        .collect();
    let view = table.file_system_view().await?;
    let replaced = table.replaced_file_groups(&latest).await?;
    let mut by_partition: BTreeMap<&str, Vec<(u64, ClusteringSlice, bool)>> = BTreeMap::new();
    for (g, s) in view.slices_as_of(&latest, &replaced) {
        let size = s.base.as_ref().map_or(0, |b| b.size) + s.logs.iter().map(|l| l.size).sum::<u64>();
        if size >= config.small_file_limit || busy.contains(&g.id()) {
            continue;
        }
        let slice = ClusteringSlice {
            file_id: g.file_id.clone(),
            base_instant_time: s.base_instant.clone(),
            data_file: s.base.as_ref().map(|b| (b.path.clone(), b.size)),
            delta_file_paths: s.logs.iter().map(|l| l.path.clone()).collect(),
        };
        by_partition.entry(g.partition.as_str()).or_default().push((size, slice, !s.logs.is_empty()));
    }
    let mut input_groups = Vec::new();
    for (partition, mut candidates) in by_partition {
        if candidates.len() < 2 && !candidates.iter().any(|c| c.2) {
            continue;
        }
        candidates.sort_by(|a, b| (a.0, &a.1.file_id).cmp(&(b.0, &b.1.file_id)));
        let mut current: Vec<ClusteringSlice> = Vec::new();
        let mut bytes = 0u64;
        for (size, slice, _) in candidates {
            if !current.is_empty() && bytes + size > config.max_group_bytes {
                input_groups.push(ClusteringGroup { partition_path: partition.to_string(), slices: current });
                current = Vec::new();
                bytes = 0;
            }
            bytes += size;
            current.push(slice);
        }
        input_groups.push(ClusteringGroup { partition_path: partition.to_string(), slices: current });
    }
    Ok(ClusteringPlan {
        operation_type: CLUSTER.into(),
        sort_columns: config.sort_by.clone(),
        input_groups,
        version: 1,
    })
}

/// Writes every group of the plan, `write.parallelism` groups at a time, in one session (one memory
/// pool for all of them).
async fn execute(
    table: &Table,
    instant: &str,
    plan: &ClusteringPlan,
    config: &ClusteringConfig,
) -> Result<Vec<(String, WriteStat)>> {
    let ctx = crate::read::session(table, None, config.memory_limit)?;
    progress::plan(&config.progress, plan.file_groups().count() as u64, "file groups");
    let mut jobs = Vec::with_capacity(plan.input_groups.len());
    for (index, group) in plan.input_groups.iter().enumerate() {
        let scan = ScanPlan {
            slices: planned_slices(table.storage(), group).await?,
            upper: instant.to_string(),
            commit_range: None,
        };
        let mut df = ctx.read_table(Arc::new(HudiTableProvider::try_new(table, scan)?))?;
        if !plan.sort_columns.is_empty() {
            let order: Vec<SortExpr> =
                plan.sort_columns.iter().map(|c| Expr::Column(Column::from_name(c)).sort(true, true)).collect();
            df = df.sort(order)?;
        }
        let out = RollingWriter::new(
            table.storage().clone(),
            table.schema(),
            &group.partition_path,
            instant,
            index,
            &config.write,
        );
        jobs.push((df, out, group.slices.len() as u64));
    }
    let written: Vec<Vec<(String, WriteStat)>> = futures::stream::iter(jobs)
        .map(|(df, mut out, groups)| async move {
            let mut stream = df.execute_stream().await?;
            while let Some(batch) = stream.next().await {
                out.write(batch?).await?;
            }
            let written = out.finish().await;
            progress::advance(&config.progress, groups);
            written
        })
        .buffer_unordered(config.write.parallelism.max(1))
        .try_collect()
        .await?;
    Ok(written.into_iter().flatten().collect())
}

/// The planned slices of a group, with the current sizes of their log files.
async fn planned_slices(storage: &Storage, group: &ClusteringGroup) -> Result<Vec<PlannedSlice>> {
    let partition = &group.partition_path;
    let mut slices = Vec::with_capacity(group.slices.len());
    for s in &group.slices {
        let mut logs = Vec::with_capacity(s.delta_file_paths.len());
        for path in &s.delta_file_paths {
            let name = path.rsplit('/').next().unwrap_or(path);
            let parsed = LogFileName::parse(name).ok_or_else(|| Error::corrupt(path, "not a log file name"))?;
            let size = storage.head(path).await?.map(|m| m.size).ok_or_else(|| Error::corrupt(path, "missing"))?;
            logs.push(LogFile { name: parsed, path: path.clone(), size });
        }
        slices.push(PlannedSlice {
            partition: partition.clone(),
            file_id: s.file_id.clone(),
            base: s.data_file.as_ref().map(|(path, size)| PlannedFile {
                partition: partition.clone(),
                path: path.clone(),
                size: *size,
                rows: None,
            }),
            logs,
            keys_of: None,
        });
    }
    Ok(slices)
}

/// Writes a stream of rows into base files of new file groups, starting a new one whenever the
/// current file reaches the target size.
struct RollingWriter {
    storage: Storage,
    schema: SchemaRef,
    partition: String,
    instant: String,
    task: usize,
    config: WriteConfig,
    current: Option<OpenFile>,
    done: Vec<(String, WriteStat)>,
}

struct OpenFile {
    writer: AsyncArrowWriter<BufWriter>,
    file_id: String,
    file_name: String,
    rel: String,
    rows: u64,
}

impl RollingWriter {
    fn new(
        storage: Storage,
        schema: SchemaRef,
        partition: &str,
        instant: &str,
        task: usize,
        config: &WriteConfig,
    ) -> Self {
        RollingWriter {
            storage,
            schema,
            partition: partition.to_string(),
            instant: instant.to_string(),
            task,
            config: config.clone(),
            current: None,
            done: Vec::new(),
        }
    }

    async fn write(&mut self, batch: RecordBatch) -> Result<()> {
        if batch.num_rows() == 0 {
            return Ok(());
        }
        let file = match &mut self.current {
            Some(f) => f,
            None => self.current.insert(self.open()?),
        };
        let batch = with_file_name(&batch, &file.file_name)?;
        file.rows += batch.num_rows() as u64;
        file.writer.write(&batch).await?;
        let size = file.writer.bytes_written() + file.writer.in_progress_size();
        if size as u64 >= self.config.target_file_size {
            self.close().await?;
        }
        Ok(())
    }

    fn open(&self) -> Result<OpenFile> {
        let file_id = new_file_id();
        let name = BaseFileName {
            file_id: file_id.clone(),
            write_token: format!("{}-{}-1", self.task, self.done.len()),
            instant: self.instant.clone(),
        };
        let file_name = name.name();
        let rel = if self.partition.is_empty() { file_name.clone() } else { format!("{}/{file_name}", self.partition) };
        let sink = BufWriter::new(self.storage.object_store(), self.storage.path(&rel));
        let writer = AsyncArrowWriter::try_new(
            sink,
            self.schema.clone(),
            Some(crate::format::base_file::writer_properties(self.config.row_group_size)),
        )?;
        Ok(OpenFile { writer, file_id, file_name, rel, rows: 0 })
    }

    async fn close(&mut self) -> Result<()> {
        let Some(file) = self.current.take() else { return Ok(()) };
        file.writer.close().await?;
        let size = self.storage.head(&file.rel).await?.map(|m| m.size).unwrap_or_default() as i64;
        let stat = WriteStat {
            file_id: file.file_id,
            path: Some(file.rel),
            prev_commit: Some("null".into()),
            partition_path: Some(self.partition.clone()),
            num_writes: file.rows as i64,
            num_inserts: file.rows as i64,
            total_write_bytes: size,
            file_size_in_bytes: size,
            ..Default::default()
        };
        self.done.push((self.partition.clone(), stat));
        Ok(())
    }

    async fn finish(mut self) -> Result<Vec<(String, WriteStat)>> {
        self.close().await?;
        Ok(self.done)
    }
}

/// The batch with `_hoodie_file_name` set to the file it is written to.
fn with_file_name(batch: &RecordBatch, file_name: &str) -> Result<RecordBatch> {
    // Tables without meta fields have no such column.
    let Ok(i) = batch.schema().index_of(FILE_NAME) else { return Ok(batch.clone()) };
    let mut columns: Vec<ArrayRef> = batch.columns().to_vec();
    columns[i] = Arc::new(StringArray::from(vec![file_name; batch.num_rows()]));
    Ok(RecordBatch::try_new(batch.schema(), columns)?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::avro;
    use crate::format::clustering_plan::SORT_COLUMNS_PARAM;
    use crate::format::clustering_plan::planned_file_groups;
    use crate::test_support::corpus_file;

    fn groups(table: &str, path: &str) -> Vec<FileGroupId> {
        let mut out = planned_file_groups(path, &corpus_file(table, path)).unwrap();
        out.sort();
        out
    }

    #[test]
    fn our_plans_are_java_requests_and_read_back() {
        let plan = ClusteringPlan {
            operation_type: CLUSTER.into(),
            sort_columns: vec!["ts".into(), "id".into()],
            input_groups: vec![ClusteringGroup {
                partition_path: "city=sf".into(),
                slices: vec![
                    ClusteringSlice {
                        file_id: "a-0".into(),
                        base_instant_time: "20240101000000000".into(),
                        data_file: Some(("city=sf/a-0_0-0-1_20240101000000000.parquet".into(), 300)),
                        delta_file_paths: vec![],
                    },
                    ClusteringSlice {
                        file_id: "b-0".into(),
                        base_instant_time: "20240101000000000".into(),
                        data_file: None,
                        delta_file_paths: vec!["city=sf/.b-0_20240101000000000.log.1_0-0-1".into()],
                    },
                ],
            }],
            version: 1,
        };
        let bytes = plan.to_avro("/t", 200).unwrap();
        let mut read = planned_file_groups("x", &bytes).unwrap();
        read.sort();
        assert_eq!(read, [("city=sf".to_string(), "a-0".to_string()), ("city=sf".to_string(), "b-0".to_string())]);
        let (_, records) = avro::read_container_with_schema(&bytes).unwrap();
        let r = &records[0];
        assert_eq!(r["operationType"], "CLUSTER");
        let group = &r["clusteringPlan"]["inputGroups"][0];
        assert_eq!(group["numOutputFileGroups"], 2);
        assert_eq!(group["slices"][0]["dataFilePath"], "file:/t/city=sf/a-0_0-0-1_20240101000000000.parquet");
        assert_eq!(group["slices"][1]["dataFilePath"], "");
        assert_eq!(group["slices"][1]["deltaFilePaths"][0], "file:/t/city=sf/.b-0_20240101000000000.log.1_0-0-1");
        assert_eq!(r["clusteringPlan"]["strategy"]["strategyParams"][SORT_COLUMNS_PARAM], "ts,id");
    }

    #[test]
    #[cfg_attr(
        not(hudi_corpus),
        ignore = "needs the Apache Hudi corpus: set OXLAKE_SHARED to the folder holding compat/"
    )]
    fn reads_the_file_groups_of_apache_hudi_replace_requests() {
        let table = "sample_table/mor/avro/v9_txns_simple_nometa.zip";
        let g = |p: &str, f: &str| (p.to_string(), f.to_string());
        assert_eq!(
            groups(table, ".hoodie/timeline/20260307135840454.clustering.requested"),
            vec![
                g("region=apac", "6c49c37a-faf6-4ab2-a4a7-d66e4ea05a2f-0"),
                g("region=apac", "9c6ed25b-6c9d-4793-ad27-1c8518086b6a-0"),
                g("region=eu", "7a277c43-3eaf-43af-ac23-8b8fd5af50be-0"),
                g("region=us", "8fbe3fc8-a15f-4ffe-aac5-20024bdc863d-0"),
                g("region=us", "db2fca8f-03b7-4da7-b042-4b617ab79b9d-0"),
            ]
        );
        // Insert overwrite (v9 and v6): a request without a clustering plan.
        assert_eq!(groups(table, ".hoodie/timeline/20260307135837782.replacecommit.requested"), vec![]);
        let v6 = "sample_table/cow/v6_simplekeygen_nonhivestyle_overwritetable.zip";
        assert_eq!(groups(v6, ".hoodie/20240707001303088.replacecommit.requested"), vec![]);
        assert_eq!(planned_file_groups("r", b"").unwrap(), vec![]);
        assert!(matches!(planned_file_groups("r", b"{"), Err(Error::CorruptTable { .. })));
    }
}
