//! The DataFusion table provider of a planned scan.

use std::collections::BTreeMap;
use std::sync::Arc;

use arrow::array::{Array, ArrayRef, BooleanArray, RecordBatch, StringArray};
use arrow::compute::cast;
use arrow::datatypes::{Field, Schema, SchemaRef};
use async_trait::async_trait;
use datafusion::catalog::Session;
use datafusion::catalog::TableProvider;
use datafusion::common::{DFSchema, ToDFSchema};
use datafusion::datasource::TableType;
use datafusion::datasource::file_format::FileFormat;
use datafusion::datasource::file_format::parquet::ParquetFormat;
use datafusion::datasource::listing::PartitionedFile;
use datafusion::datasource::physical_plan::parquet::ParquetRowSelection;
use datafusion::datasource::physical_plan::{FileGroup, FileScanConfigBuilder, ParquetSource};
use datafusion::error::Result as DfResult;
use datafusion::execution::object_store::ObjectStoreUrl;
use datafusion::logical_expr::utils::conjunction;
use datafusion::logical_expr::{Expr, TableProviderFilterPushDown, col, lit};
use datafusion::physical_plan::ExecutionPlan;
use datafusion::physical_plan::empty::EmptyExec;
use datafusion::physical_plan::filter::FilterExec;
use datafusion::physical_plan::projection::ProjectionExec;
use datafusion::physical_plan::union::UnionExec;

use super::merge::MergeSpec;
use super::mor_exec::{MergeContext, MergeOnReadExec, SliceScan};
use super::{CommitWindow, PlannedFile, PlannedSlice, ScanPlan};
use crate::error::{Error, Result};
use crate::keys::KeySpec;
use crate::log::Admission;
use crate::schema::internal::{ColumnHistory, FileColumns};
use crate::schema::{COMMIT_TIME, PARTITION_PATH, RECORD_KEY};
use crate::storage::Storage;
use crate::table::Table;
use crate::timeline::Timeline;

/// A Hudi table (at one snapshot or one incremental window) as a DataFusion table.
#[derive(Debug)]
pub struct HudiTableProvider {
    schema: SchemaRef,
    slices: Vec<PlannedSlice>,
    upper: String,
    commit_range: Option<CommitWindow>,
    keys: KeySpec,
    store_url: ObjectStoreUrl,
    storage: Storage,
    timeline: Arc<Timeline>,
    /// The table's merge, columns indexed into the table schema (when a slice has logs to merge).
    merge: Option<MergeSpec>,
    /// How files of older schema versions name the columns (`None`: as the table does).
    columns: Option<Arc<ColumnHistory>>,
    /// Whether the table's key generator is one oxlake knows: its record key fields then make
    /// the key one to one (an unknown one may derive the key from them some other way).
    known_keys: bool,
}

impl HudiTableProvider {
    /// A provider reading the slices of `plan` from `table`.
    pub fn try_new(table: &Table, plan: ScanPlan) -> Result<Self> {
        let url = table.storage().store_url();
        let store_url = ObjectStoreUrl::parse(&url[..url::Position::BeforePath]).map_err(Error::from)?;
        let cfg = table.config();
        let schema = table.schema();
        Ok(HudiTableProvider {
            merge: match plan.slices.iter().any(PlannedSlice::merged) {
                true => Some(MergeSpec::of_table(cfg, &schema)?),
                false => None,
            },
            schema,
            slices: plan.slices,
            upper: plan.upper,
            commit_range: plan.commit_range,
            keys: KeySpec::from_config(cfg),
            store_url,
            storage: table.storage().clone(),
            timeline: Arc::new(table.timeline().clone()),
            columns: table.column_history().cloned(),
            known_keys: !matches!(cfg.key_generator, crate::config::KeyGenerator::Other(_)),
        })
    }

    /// The slices the scan will read (before partition pruning).
    pub fn slices(&self) -> &[PlannedSlice] {
        &self.slices
    }

    /// Keeps the files whose partition values can satisfy the filters that use only partition
    /// columns. A partition path that does not parse is kept (never drop data on a doubt).
    pub fn prune_partitions(&self, state: &dyn Session, filters: &[Expr]) -> DfResult<Vec<&PlannedSlice>> {
        let part_names = &self.keys.partition_fields;
        let usable: Vec<Expr> = filters
            .iter()
            .filter(|f| {
                let cols = f.column_refs();
                !cols.is_empty() && cols.iter().all(|c| part_names.contains(&c.name))
            })
            .cloned()
            .collect();
        let Some(predicate) = conjunction(usable) else { return Ok(self.slices.iter().collect()) };
        let mut partitions: BTreeMap<&str, Option<bool>> = BTreeMap::new();
        for f in &self.slices {
            partitions.insert(&f.partition, None);
        }
        let paths: Vec<&str> = partitions.keys().copied().collect();
        let parsed: Vec<Option<Vec<Option<String>>>> =
            paths.iter().map(|p| self.keys.parse_partition_path(p)).collect();
        // One row per value combination a partition can hold: a default partition holds null,
        // empty and the literal of its name alike (either name: old Apache Hudi wrote `default`),
        // so each is tried.
        let default_values = [
            None,
            Some(String::new()),
            Some(crate::keys::DEFAULT_PARTITION.to_string()),
            Some(crate::keys::DEPRECATED_DEFAULT_PARTITION.to_string()),
        ];
        let mut rows: Vec<(usize, Vec<Option<String>>)> = Vec::new();
        for (i, values) in parsed.iter().enumerate() {
            let Some(values) = values else { continue };
            let mut combos: Vec<Vec<Option<String>>> = vec![vec![]];
            for v in values {
                let choices: Vec<Option<String>> = match v {
                    Some(v) => vec![Some(v.clone())],
                    None => default_values.to_vec(),
                };
                combos = combos
                    .into_iter()
                    .flat_map(|c| {
                        choices.iter().map(move |x| {
                            let mut c = c.clone();
                            c.push(x.clone());
                            c
                        })
                    })
                    .collect();
            }
            rows.extend(combos.into_iter().map(|c| (i, c)));
        }
        let fields: Vec<Field> = part_names
            .iter()
            .map(|n| self.schema.field_with_name(n).map(|f| f.clone().with_nullable(true)))
            .collect::<std::result::Result<_, _>>()?;
        let part_schema = Arc::new(Schema::new(fields));
        let mut columns: Vec<ArrayRef> = Vec::with_capacity(part_names.len());
        for (i, field) in part_schema.fields().iter().enumerate() {
            let strings: StringArray = rows.iter().map(|(_, vals)| vals[i].clone()).collect();
            // A value that does not cast to the column type is unknown: the partition is kept.
            columns.push(
                cast(&strings, field.data_type())
                    .unwrap_or_else(|_| arrow::array::new_null_array(field.data_type(), rows.len())),
            );
        }
        let batch = RecordBatch::try_new(part_schema.clone(), columns)?;
        let df_schema: DFSchema = part_schema.to_dfschema()?;
        let physical = state.create_physical_expr(predicate, &df_schema)?;
        let result = physical.evaluate(&batch)?.into_array(batch.num_rows())?;
        let mask = result
            .as_any()
            .downcast_ref::<BooleanArray>()
            .cloned()
            .unwrap_or_else(|| BooleanArray::from(vec![true; rows.len()]));
        // A partition whose path does not parse is kept (never drop data on a doubt).
        let mut keep: Vec<bool> = parsed.iter().map(|p| p.is_none()).collect();
        for (r, (i, _)) in rows.iter().enumerate() {
            keep[*i] |= mask.is_null(r) || mask.value(r);
        }
        for (i, p) in paths.iter().enumerate() {
            partitions.insert(p, Some(keep[i]));
        }
        Ok(self
            .slices
            .iter()
            .filter(|f| partitions.get(f.partition.as_str()).copied().flatten().unwrap_or(true))
            .collect())
    }
}

impl HudiTableProvider {
    /// The merge-on-read node of the slices that have log files.
    fn merge_plan(
        &self,
        state: &dyn Session,
        slices: &[&PlannedSlice],
        scan_projection: &[usize],
        filters: &[Expr],
    ) -> DfResult<MergeOnReadExec> {
        let merge = self.merge.as_ref().ok_or_else(|| {
            datafusion::error::DataFusionError::Internal("merge-on-read slices planned without a merge".into())
        })?;
        let mut scan_columns: Vec<usize> = scan_projection.iter().copied().chain(merge.columns()).collect();
        scan_columns.sort_unstable();
        scan_columns.dedup();
        let position = |i: usize| scan_columns.iter().position(|&c| c == i).unwrap_or_default();
        let output: Vec<usize> = scan_projection.iter().map(|&i| position(i)).collect();
        let spec = merge.project(position);
        // Only filters on columns that are the same in every version of a record in one file group
        // (the key, the partition path) may drop base rows before the merge (docs/ARCHITECTURE.md,
        // "Merge-on-read reads"): a base row failing another filter may still win over its log
        // version, which would then come out alone. Not the partition columns: Apache Hudi's
        // global indexes keep an update in the record's old file group while its partition column
        // names the new partition.
        // Without meta fields (virtual keys) the meta columns of base files are null.
        let meta: &[&str] = if merge.virtual_keys.is_some() { &[] } else { &[RECORD_KEY, PARTITION_PATH] };
        // A key generator of the table's own may give two values of a key field one key.
        let key_columns: Vec<&str> = meta
            .iter()
            .copied()
            .chain(self.keys.record_key_fields.iter().map(String::as_str).filter(|_| self.known_keys))
            .collect();
        let on = |columns: &[&str]| -> Vec<Expr> {
            filters
                .iter()
                .flat_map(|f| datafusion::logical_expr::utils::split_conjunction(f))
                .filter(|f| {
                    let cols = f.column_refs();
                    !cols.is_empty() && cols.iter().all(|c| columns.contains(&c.name.as_str()))
                })
                .map(|f| (*f).clone())
                .collect()
        };
        let physical = |conjuncts: Vec<Expr>| -> DfResult<Option<Arc<dyn datafusion::physical_expr::PhysicalExpr>>> {
            match conjunction(conjuncts) {
                Some(e) => Ok(Some(state.create_physical_expr(e, &self.schema.clone().to_dfschema()?)?)),
                None => Ok(None),
            }
        };
        let base_predicate = physical(on(&key_columns))?;
        // Log versions are dropped only by the key itself: the record key (meta column, and its
        // fields where a known key generator makes the key from them one to one). Not by partition
        // columns: Apache Hudi's global indexes keep an update in the record's old partition while
        // its partition column says the new one, so versions of a key there may differ in it.
        let log_key_columns: Vec<&str> = meta
            .iter()
            .copied()
            .filter(|c| *c == RECORD_KEY)
            .chain(self.keys.record_key_fields.iter().map(String::as_str).filter(|_| self.known_keys))
            .collect();
        let log_predicate = physical(on(&log_key_columns))?;
        let scans: Vec<SliceScan> = slices
            .iter()
            .map(|s| SliceScan {
                partition: s.partition.clone(),
                file_id: s.file_id.clone(),
                base: s.base.as_ref().map(|b| (b.path.clone(), b.size)),
                rows: s.base.as_ref().and_then(|b| b.rows),
                logs: s.logs.clone(),
                keys_of: s.keys_of.clone(),
            })
            .collect();
        let groups = balance_slices(scans, state.config().target_partitions());
        let ctx = MergeContext {
            storage: self.storage.clone(),
            store_url: self.store_url.clone(),
            table_schema: self.schema.clone(),
            scan_columns,
            output,
            spec,
            admission: Admission::new(self.upper.clone(), self.timeline.clone()),
            base_predicate,
            log_predicate,
            parquet_options: super::filter::nan_safe(
                state.table_options().parquet.clone(),
                filters.iter().any(|f| super::filter::reads_floats(f, &self.schema)),
            ),
            columns: self.columns.clone(),
        };
        Ok(MergeOnReadExec::try_new(groups, ctx)?)
    }
}

/// `plan` (columns named as in `file`) with the columns named as in `table` (same order).
fn relabel(plan: Arc<dyn ExecutionPlan>, file: &Schema, table: &Schema) -> DfResult<Arc<dyn ExecutionPlan>> {
    let exprs: Vec<(Arc<dyn datafusion::physical_expr::PhysicalExpr>, String)> = file
        .fields()
        .iter()
        .zip(table.fields())
        .enumerate()
        .map(|(i, (f, t))| {
            let c: Arc<dyn datafusion::physical_expr::PhysicalExpr> =
                Arc::new(datafusion::physical_expr::expressions::Column::new(f.name(), i));
            (c, t.name().clone())
        })
        .collect();
    Ok(Arc::new(ProjectionExec::try_new(exprs, plan)?))
}

/// Splits slices into at most `n` groups of similar total size.
fn balance_slices(mut slices: Vec<SliceScan>, n: usize) -> Vec<Vec<SliceScan>> {
    slices.sort_by_key(|s| std::cmp::Reverse(s.size()));
    let n = n.max(1).min(slices.len().max(1));
    let mut groups: Vec<(u64, Vec<SliceScan>)> = (0..n).map(|_| (0, Vec::new())).collect();
    for s in slices {
        if let Some(g) = groups.iter_mut().min_by_key(|g| g.0) {
            g.0 += s.size();
            g.1.push(s);
        }
    }
    groups.into_iter().map(|g| g.1).filter(|g| !g.is_empty()).collect()
}

/// The DataFusion file of a table-relative path. Built from the store path itself:
/// `PartitionedFile::new` parses a string with `Path::from`, which would percent-encode an
/// escaped partition directory (`city=a%3Ab`) a second time and name a file that is not there.
pub(super) fn partitioned_file(storage: &Storage, rel: &str, size: u64) -> PartitionedFile {
    PartitionedFile::new_from_meta(object_store::ObjectMeta {
        location: storage.path(rel),
        last_modified: chrono::DateTime::<chrono::Utc>::UNIX_EPOCH,
        size,
        e_tag: None,
        version: None,
    })
}

/// Splits files into `n` groups of similar total size (largest first onto the lightest group).
fn balance(storage: &Storage, files: &[&PlannedFile], n: usize) -> Vec<FileGroup> {
    let mut sorted: Vec<&&PlannedFile> = files.iter().collect();
    sorted.sort_by_key(|f| std::cmp::Reverse(f.size));
    let n = n.max(1).min(files.len().max(1));
    let mut groups: Vec<(u64, Vec<PartitionedFile>)> = (0..n).map(|_| (0, Vec::new())).collect();
    for f in sorted {
        if let Some(g) = groups.iter_mut().min_by_key(|g| g.0) {
            g.0 += f.size;
            let file = partitioned_file(storage, &f.path, f.size);
            g.1.push(match f.rows {
                Some(rows) => file.with_extension(ParquetRowSelection::new(rows.selection())),
                None => file,
            });
        }
    }
    groups.into_iter().filter(|g| !g.1.is_empty()).map(|g| FileGroup::new(g.1)).collect()
}

#[async_trait]
impl TableProvider for HudiTableProvider {
    fn schema(&self) -> SchemaRef {
        self.schema.clone()
    }

    fn table_type(&self) -> TableType {
        TableType::Base
    }

    fn supports_filters_pushdown(&self, filters: &[&Expr]) -> DfResult<Vec<TableProviderFilterPushDown>> {
        // Filters prune partitions and row groups; DataFusion still applies them to the rows.
        Ok(vec![TableProviderFilterPushDown::Inexact; filters.len()])
    }

    async fn scan(
        &self,
        state: &dyn Session,
        projection: Option<&Vec<usize>>,
        filters: &[Expr],
        limit: Option<usize>,
    ) -> DfResult<Arc<dyn ExecutionPlan>> {
        let slices = self.prune_partitions(state, filters)?;
        let projected = match projection {
            Some(p) => Arc::new(self.schema.project(p)?),
            None => self.schema.clone(),
        };
        if slices.is_empty() {
            return Ok(Arc::new(EmptyExec::new(projected)));
        }
        // Incremental reads filter on the commit time, so the scan must read that column.
        let commit_idx = self.schema.index_of(COMMIT_TIME)?;
        let mut scan_projection: Vec<usize> =
            projection.cloned().unwrap_or_else(|| (0..self.schema.fields().len()).collect());
        let extra = self.commit_range.is_some() && !scan_projection.contains(&commit_idx);
        if extra {
            scan_projection.push(commit_idx);
        }
        let (merged, plain): (Vec<&PlannedSlice>, Vec<&PlannedSlice>) = slices.into_iter().partition(|s| s.merged());
        let limit = if self.commit_range.is_some() || !merged.is_empty() { None } else { limit };
        let mut plans: Vec<Arc<dyn ExecutionPlan>> = Vec::new();
        // Files of one schema version are read together, under their own column names.
        let mut by_names: Vec<(Option<Arc<FileColumns>>, Vec<&PlannedFile>)> = Vec::new();
        for file in plain.iter().filter_map(|s| s.base.as_ref()) {
            let view = self
                .columns
                .as_ref()
                .and_then(|c| crate::format::file_name::base_file_instant(&file.path).and_then(|t| c.columns_at(&t)));
            match by_names.iter_mut().find(|(v, _)| *v == view) {
                Some((_, files)) => files.push(file),
                None => by_names.push((view, vec![file])),
            }
        }
        for (view, files) in by_names {
            let groups = balance(&self.storage, &files, state.config().target_partitions());
            let file_schema = view.as_ref().map_or_else(|| self.schema.clone(), |v| v.file_schema(&self.schema));
            let source = Arc::new(ParquetSource::new(file_schema.clone()));
            let config = FileScanConfigBuilder::new(self.store_url.clone(), source)
                .with_file_groups(groups)
                .with_projection_indices(Some(scan_projection.clone()))?
                .with_limit(limit)
                .with_expr_adapter(Some(Arc::new(super::adapter::EvolvedFiles)))
                .build();
            let format = ParquetFormat::default().with_options(super::filter::nan_safe(
                state.table_options().parquet.clone(),
                filters.iter().any(|f| super::filter::reads_floats(f, &self.schema)),
            ));
            let scan = format.create_physical_plan(state, config).await?;
            plans.push(match view {
                None => scan,
                Some(_) => {
                    relabel(scan, &file_schema.project(&scan_projection)?, &self.schema.project(&scan_projection)?)?
                }
            });
        }
        if !merged.is_empty() {
            plans.push(Arc::new(self.merge_plan(state, &merged, &scan_projection, filters)?));
        }
        let mut plan: Arc<dyn ExecutionPlan> = match plans.len() {
            1 => plans.remove(0),
            _ => UnionExec::try_new(plans)?,
        };
        if let Some(commits) = &self.commit_range {
            let scanned = Arc::new(self.schema.project(&scan_projection)?);
            let df_schema = scanned.clone().to_dfschema()?;
            let window = match commits {
                CommitWindow::Range(start, end) => {
                    col(COMMIT_TIME).gt(lit(start.as_str())).and(col(COMMIT_TIME).lt_eq(lit(end.as_str())))
                }
                CommitWindow::Instants(times) => {
                    col(COMMIT_TIME).in_list(times.iter().map(|t| lit(t.as_str())).collect(), false)
                }
            };
            let predicate = state.create_physical_expr(window, &df_schema)?;
            plan = Arc::new(FilterExec::try_new(predicate, plan)?);
            if extra {
                let exprs: Vec<(Arc<dyn datafusion::physical_expr::PhysicalExpr>, String)> = (0..scan_projection.len()
                    - 1)
                    .map(|i| {
                        let f = scanned.field(i);
                        let c: Arc<dyn datafusion::physical_expr::PhysicalExpr> =
                            Arc::new(datafusion::physical_expr::expressions::Column::new(f.name(), i));
                        (c, f.name().clone())
                    })
                    .collect();
                plan = Arc::new(ProjectionExec::try_new(exprs, plan)?);
            }
        }
        Ok(plan)
    }
}

#[cfg(test)]
mod tests {
    //! The provider under DataFusion SQL over a partitioned merge-on-read table: projection,
    //! filters that must not see stale base rows, and partition pruning.

    use arrow::array::Int64Array;
    use arrow::datatypes::DataType;
    use datafusion::execution::context::SessionContext;
    use datafusion::physical_plan::displayable;

    use super::*;
    use crate::config::TableType as HudiTableType;
    use crate::read::ScanOptions;
    use crate::table::TableOptions;
    use crate::write::{WriteConfig, WriteOperation};

    fn schema() -> SchemaRef {
        Arc::new(Schema::new(vec![
            Field::new("id", DataType::Int64, false),
            Field::new("city", DataType::Utf8, true),
            Field::new("v", DataType::Int64, true),
        ]))
    }

    /// `(id, city, v)`.
    type Row = (i64, &'static str, i64);

    fn batch(rows: &[Row]) -> RecordBatch {
        RecordBatch::try_new(
            schema(),
            vec![
                Arc::new(Int64Array::from(rows.iter().map(|r| r.0).collect::<Vec<_>>())),
                Arc::new(StringArray::from(rows.iter().map(|r| r.1).collect::<Vec<_>>())),
                Arc::new(Int64Array::from(rows.iter().map(|r| r.2).collect::<Vec<_>>())),
            ],
        )
        .unwrap()
    }

    /// A merge-on-read table partitioned by `city` whose latest state is
    /// `(1, a, 15) (3, a, 30) (4, b, 45) (5, b, 50) (6, b, 60) (7, c, 70)`: partitions `a` and `b`
    /// have log files (an update in each, a delete in `a`), `c` is a base file alone.
    async fn table(dir: &std::path::Path) -> Table {
        let mut t =
            crate::test_support::keyed_table(dir, HudiTableType::MergeOnRead, TableOptions::default(), schema()).await;
        let writes: [(WriteOperation, &[Row]); 4] = [
            (
                WriteOperation::Insert,
                &[(1, "a", 10), (2, "a", 20), (3, "a", 30), (4, "b", 40), (5, "b", 50), (6, "b", 60)],
            ),
            (WriteOperation::Upsert, &[(1, "a", 15), (4, "b", 45)]),
            (WriteOperation::Delete, &[(2, "a", 20)]),
            (WriteOperation::Insert, &[(7, "c", 70)]),
        ];
        for (op, rows) in writes {
            t.write(op, vec![batch(rows)], &WriteConfig::default()).await.unwrap();
        }
        t
    }

    /// A session with the table's snapshot registered as `t`, and the provider.
    async fn register(t: &Table) -> (SessionContext, Arc<HudiTableProvider>) {
        let ctx = crate::read::session(t, None, None).unwrap();
        let provider = Arc::new(t.provider(&ScanOptions::default()).await.unwrap());
        ctx.register_table("t", provider.clone()).unwrap();
        (ctx, provider)
    }

    /// The values of an integer column over all batches, in order.
    fn ints(batches: &[RecordBatch], name: &str) -> Vec<i64> {
        batches
            .iter()
            .flat_map(|b| {
                let c = b.column_by_name(name).unwrap().as_any().downcast_ref::<Int64Array>().unwrap();
                c.values().to_vec()
            })
            .collect()
    }

    async fn sql(ctx: &SessionContext, query: &str) -> Vec<RecordBatch> {
        ctx.sql(query).await.unwrap().collect().await.unwrap()
    }

    async fn plan_text(ctx: &SessionContext, query: &str) -> String {
        let plan = ctx.sql(query).await.unwrap().create_physical_plan().await.unwrap();
        displayable(plan.as_ref()).indent(true).to_string()
    }

    #[tokio::test]
    async fn sql_projection_and_filters_return_the_merged_rows_and_only_the_projected_columns() {
        let dir = tempfile::tempdir().unwrap();
        let t = table(dir.path()).await;
        let (ctx, _) = register(&t).await;
        let batches = sql(&ctx, "SELECT v, id FROM t WHERE v > 20 ORDER BY id").await;
        let names: Vec<String> = batches[0].schema().fields().iter().map(|f| f.name().clone()).collect();
        assert_eq!(names, ["v", "id"]);
        assert_eq!(ints(&batches, "id"), [3, 4, 5, 6, 7]);
        assert_eq!(ints(&batches, "v"), [30, 45, 50, 60, 70]);
        // A filter on a data column sees merged rows only: not the replaced base row of 1, nor the
        // deleted 2.
        assert!(ints(&sql(&ctx, "SELECT id FROM t WHERE v = 10 OR v = 20 OR v = 40").await, "id").is_empty());
        assert_eq!(ints(&sql(&ctx, "SELECT id FROM t WHERE v < 20").await, "id"), [1]);
        // Filters on the key (pushed below the merge) return the merged version.
        let batches = sql(&ctx, "SELECT id, v FROM t WHERE id IN (1, 2, 4) ORDER BY id").await;
        assert_eq!(ints(&batches, "id"), [1, 4]);
        assert_eq!(ints(&batches, "v"), [15, 45]);
        let batches = sql(&ctx, "SELECT v FROM t WHERE _hoodie_record_key = '4'").await;
        assert_eq!(ints(&batches, "v"), [45]);
    }

    #[tokio::test]
    async fn the_provider_scan_projects_its_output() {
        let dir = tempfile::tempdir().unwrap();
        let t = table(dir.path()).await;
        let (ctx, provider) = register(&t).await;
        let state = ctx.state();
        let full = provider.schema();
        let projection = vec![full.index_of("v").unwrap(), full.index_of("id").unwrap()];
        let plan = provider.scan(&state, Some(&projection), &[], None).await.unwrap();
        let names: Vec<String> = plan.schema().fields().iter().map(|f| f.name().clone()).collect();
        assert_eq!(names, ["v", "id"]);
        let batches = datafusion::physical_plan::collect(plan, ctx.task_ctx()).await.unwrap();
        assert!(batches.iter().all(|b| b.num_columns() == 2));
        let mut rows: Vec<(i64, i64)> = ints(&batches, "id").into_iter().zip(ints(&batches, "v")).collect();
        rows.sort();
        assert_eq!(rows, [(1, 15), (3, 30), (4, 45), (5, 50), (6, 60), (7, 70)]);
    }

    #[tokio::test]
    async fn a_filter_on_the_partition_column_prunes_slices() {
        let dir = tempfile::tempdir().unwrap();
        let t = table(dir.path()).await;
        let (ctx, provider) = register(&t).await;
        let state = ctx.state();
        let mut partitions: Vec<&str> = provider.slices().iter().map(|s| s.partition.as_str()).collect();
        partitions.sort();
        assert_eq!(partitions, ["city=a", "city=b", "city=c"]);
        let kept = |filters: Vec<Expr>| -> Vec<String> {
            let mut p: Vec<String> =
                provider.prune_partitions(&state, &filters).unwrap().iter().map(|s| s.partition.clone()).collect();
            p.sort();
            p
        };
        assert_eq!(kept(vec![col("city").eq(lit("a"))]), ["city=a"]);
        assert_eq!(kept(vec![col("city").in_list(vec![lit("b"), lit("c")], false)]), ["city=b", "city=c"]);
        assert_eq!(kept(vec![col("city").eq(lit("zz"))]), Vec::<String>::new());
        // A filter on another column, or one mixing columns, prunes nothing.
        assert_eq!(kept(vec![col("v").gt(lit(0i64))]), ["city=a", "city=b", "city=c"]);
        assert_eq!(kept(vec![col("city").eq(lit("a")).or(col("v").eq(lit(70i64)))]), ["city=a", "city=b", "city=c"]);

        // Through SQL: the merge node reads the slices of the selected partitions only.
        let all = plan_text(&ctx, "SELECT id FROM t").await;
        assert!(all.contains("MergeOnReadExec: slices=2"), "{all}");
        let a = plan_text(&ctx, "SELECT id FROM t WHERE city = 'a'").await;
        assert!(a.contains("MergeOnReadExec: slices=1"), "{a}");
        let c = plan_text(&ctx, "SELECT id FROM t WHERE city = 'c'").await;
        assert!(!c.contains("MergeOnReadExec") && c.contains("DataSourceExec"), "{c}");
        let none = plan_text(&ctx, "SELECT id FROM t WHERE city = 'zz'").await;
        assert!(!none.contains("MergeOnReadExec") && !none.contains("DataSourceExec"), "{none}");
        let batches = sql(&ctx, "SELECT id, v FROM t WHERE city = 'a' ORDER BY id").await;
        assert_eq!((ints(&batches, "id"), ints(&batches, "v")), (vec![1, 3], vec![15, 30]));
        assert_eq!(ints(&sql(&ctx, "SELECT id FROM t WHERE city = 'c'").await, "id"), [7]);
        assert!(sql(&ctx, "SELECT id FROM t WHERE city = 'zz'").await.iter().all(|b| b.num_rows() == 0));
    }
}
