//! Rust integration tests, one binary: write and read real tables on local disk.

use std::sync::Arc;

use arrow::array::{Array, ArrayRef, Int64Array, RecordBatch, StringArray};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use datafusion::prelude::SessionContext;
use futures::TryStreamExt;
use oxlake::{CreateOptions, Filter, ScanOptions, Table, TableType, WriteConfig, WriteOperation};

fn schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("id", DataType::Int64, false),
        Field::new("city", DataType::Utf8, true),
        Field::new("ts", DataType::Int64, true),
    ]))
}

fn batch(ids: &[i64], ts: i64) -> RecordBatch {
    let cities: Vec<&str> = ids.iter().map(|i| if i % 2 == 0 { "even" } else { "odd" }).collect();
    RecordBatch::try_new(
        schema(),
        vec![
            Arc::new(Int64Array::from(ids.to_vec())) as ArrayRef,
            Arc::new(StringArray::from(cities)),
            Arc::new(Int64Array::from(vec![ts; ids.len()])),
        ],
    )
    .unwrap()
}

async fn create(dir: &tempfile::TempDir) -> Table {
    let opts = CreateOptions {
        name: "t".into(),
        table_type: TableType::CopyOnWrite,
        record_key_fields: vec!["id".into()],
        partition_fields: vec!["city".into()],
        ordering_field: Some("ts".into()),
        hive_style: true,
        inline_compaction: None,
        table_version: 6,
        global_index: false,
        meta_fields: true,
        keygen_options: Default::default(),
        url_encode: true,
    };
    Table::create(dir.path().join("t").to_str().unwrap(), oxlake::services::default_options(), opts, schema())
        .await
        .unwrap()
}

async fn ids(table: &Table, opts: ScanOptions) -> Vec<i64> {
    let batches: Vec<RecordBatch> = table.scan(&opts).await.unwrap().try_collect().await.unwrap();
    let mut out: Vec<i64> = batches
        .iter()
        .flat_map(|b| {
            let c = b.column_by_name("id").unwrap().as_any().downcast_ref::<Int64Array>().unwrap().clone();
            c.values().to_vec()
        })
        .collect();
    out.sort_unstable();
    out
}

#[tokio::test]
async fn write_read_time_travel_incremental() {
    let dir = tempfile::tempdir().unwrap();
    let mut t = create(&dir).await;
    let cfg = WriteConfig::default();
    let a = t.write(WriteOperation::Insert, vec![batch(&[1, 2, 3, 4], 1)], &cfg).await.unwrap();
    let b = t.write(WriteOperation::Upsert, vec![batch(&[2, 5], 2)], &cfg).await.unwrap();
    let c = t.write(WriteOperation::Delete, vec![batch(&[1], 3)], &cfg).await.unwrap();
    assert_eq!((a.num_inserts, b.num_updates, b.num_inserts, c.num_deletes), (4, 1, 1, 1));
    assert_eq!(ids(&t, ScanOptions::default()).await, vec![2, 3, 4, 5]);
    let as_of = |time: &Option<String>| ScanOptions { as_of: time.clone(), ..Default::default() };
    assert_eq!(ids(&t, as_of(&a.instant)).await, vec![1, 2, 3, 4]);
    assert_eq!(ids(&t, as_of(&b.instant)).await, vec![1, 2, 3, 4, 5]);
    let inc = ScanOptions {
        query: oxlake::QueryType::Incremental,
        start: a.instant.clone(),
        end: b.instant.clone(),
        ..Default::default()
    };
    assert_eq!(ids(&t, inc).await, vec![2, 5]);
    let filtered = ScanOptions { filter: Some(Filter::Sql("city = 'odd' AND id > 1".into())), ..Default::default() };
    assert_eq!(ids(&t, filtered).await, vec![3, 5]);
}

#[tokio::test]
async fn table_provider_serves_sql() {
    let dir = tempfile::tempdir().unwrap();
    let mut t = create(&dir).await;
    t.write(WriteOperation::Insert, vec![batch(&[1, 2, 3, 4, 5], 1)], &WriteConfig::default()).await.unwrap();
    let ctx = SessionContext::new();
    ctx.register_object_store(t.storage().store_url(), t.storage().object_store());
    ctx.register_table("trips", Arc::new(t.provider(&ScanOptions::default()).await.unwrap())).unwrap();
    let df = ctx.sql("SELECT city, count(*) AS n FROM trips GROUP BY city ORDER BY city").await.unwrap();
    let out = df.collect().await.unwrap();
    let cities = out[0].column(0).as_any().downcast_ref::<StringArray>().unwrap();
    let counts = out[0].column(1).as_any().downcast_ref::<Int64Array>().unwrap();
    assert_eq!((cities.value(0), counts.value(0)), ("even", 2));
    assert_eq!((cities.value(1), counts.value(1)), ("odd", 3));
}

#[tokio::test]
async fn partition_pruning_skips_files() {
    let dir = tempfile::tempdir().unwrap();
    let mut t = create(&dir).await;
    t.write(WriteOperation::Insert, vec![batch(&[1, 2, 3, 4], 1)], &WriteConfig::default()).await.unwrap();
    let provider = t.provider(&ScanOptions::default()).await.unwrap();
    let ctx = SessionContext::new();
    let state = ctx.state();
    let filter = datafusion::prelude::col("city").eq(datafusion::prelude::lit("odd"));
    let kept = provider.prune_partitions(&state, &[filter]).unwrap();
    assert_eq!(kept.len(), 1);
    assert_eq!(kept[0].partition, "city=odd");
    assert_eq!(provider.slices().len(), 2);
}

#[tokio::test]
async fn schema_mismatch_leaves_no_trace() {
    let dir = tempfile::tempdir().unwrap();
    let mut t = create(&dir).await;
    let wrong = RecordBatch::try_from_iter(vec![
        ("id", Arc::new(StringArray::from(vec!["x"])) as ArrayRef),
        ("city", Arc::new(StringArray::from(vec!["odd"])) as ArrayRef),
        ("ts", Arc::new(Int64Array::from(vec![1])) as ArrayRef),
    ])
    .unwrap();
    let err = t.write(WriteOperation::Insert, vec![wrong], &WriteConfig::default()).await.unwrap_err();
    assert!(matches!(err, oxlake::Error::SchemaMismatch { .. }), "{err}");
    t.reload().await.unwrap();
    assert!(t.timeline().instants().is_empty());
    let nulls = t.scan(&ScanOptions::default()).await.unwrap().try_collect::<Vec<_>>().await.unwrap();
    assert_eq!(nulls.iter().map(|b| b.num_rows()).sum::<usize>(), 0);
    let _ = nulls.first().map(|b| b.column(0).len());
}

/// Bytes the Parquet scan of a query read, from DataFusion's metrics.
async fn bytes_scanned(table: &Table, sql_filter: Option<&str>) -> (usize, usize) {
    use datafusion::physical_plan::{ExecutionPlan, collect};
    let ctx = oxlake::read::session(table, None, None).unwrap();
    let mut df = ctx.read_table(Arc::new(table.provider(&ScanOptions::default()).await.unwrap())).unwrap();
    if let Some(f) = sql_filter {
        let expr = df.parse_sql_expr(f).unwrap();
        df = df.filter(expr).unwrap();
    }
    let plan = df.create_physical_plan().await.unwrap();
    let rows: usize = collect(plan.clone(), ctx.task_ctx()).await.unwrap().iter().map(|b| b.num_rows()).sum();
    fn find(plan: &Arc<dyn ExecutionPlan>) -> usize {
        let own = if plan.name() == "DataSourceExec" {
            plan.metrics().and_then(|m| m.sum_by_name("bytes_scanned")).map(|v| v.as_usize()).unwrap_or(0)
        } else {
            0
        };
        own + plan.children().iter().map(|c| find(c)).sum::<usize>()
    }
    (rows, find(&plan))
}

#[tokio::test]
async fn filters_prune_row_groups() {
    let dir = tempfile::tempdir().unwrap();
    let opts = CreateOptions {
        name: "t".into(),
        table_type: TableType::CopyOnWrite,
        record_key_fields: vec!["id".into()],
        partition_fields: vec![],
        ordering_field: Some("ts".into()),
        hive_style: true,
        inline_compaction: None,
        table_version: 6,
        global_index: false,
        meta_fields: true,
        keygen_options: Default::default(),
        url_encode: true,
    };
    let mut t =
        Table::create(dir.path().join("t").to_str().unwrap(), oxlake::services::default_options(), opts, schema())
            .await
            .unwrap();
    let ids: Vec<i64> = (0..100_000).collect();
    let config = WriteConfig { row_group_size: 1_000, ..WriteConfig::default() };
    t.write(WriteOperation::Insert, vec![batch(&ids, 1)], &config).await.unwrap();
    let (all_rows, all_bytes) = bytes_scanned(&t, None).await;
    let (some_rows, some_bytes) = bytes_scanned(&t, Some("id < 1500")).await;
    assert_eq!((all_rows, some_rows), (100_000, 1_500));
    // Two row groups of a hundred hold the matching ids: the rest is never read.
    assert!(some_bytes * 10 < all_bytes, "filtered scan read {some_bytes} of {all_bytes} bytes");
}
