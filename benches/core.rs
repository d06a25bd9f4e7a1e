//! Criterion benches of the Rust core: key generation, a copy-on-write insert and upsert, a full
//! scan, and timeline parsing.
//!
//!     cargo bench -p oxlake-benches --bench core

use std::hint::black_box;
use std::sync::Arc;

use arrow::array::{ArrayRef, Float64Array, Int64Array, RecordBatch, StringArray};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use futures::TryStreamExt;
use oxlake::keys::KeySpec;
use oxlake::timeline::Timeline;
use oxlake::{CreateOptions, ScanOptions, Table, TableType, WriteConfig, WriteOperation};

const ROWS: usize = 200_000;

fn schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("id", DataType::Int64, false),
        Field::new("city", DataType::Utf8, true),
        Field::new("ts", DataType::Int64, true),
        Field::new("fare", DataType::Float64, true),
    ]))
}

fn batch(n: usize, ts: i64) -> RecordBatch {
    let cities = ["sf", "nyc", "chicago", "chennai"];
    RecordBatch::try_new(
        schema(),
        vec![
            Arc::new(Int64Array::from_iter_values(0..n as i64)) as ArrayRef,
            Arc::new(StringArray::from_iter_values((0..n).map(|i| cities[i % 4]))),
            Arc::new(Int64Array::from(vec![ts; n])),
            Arc::new(Float64Array::from_iter_values((0..n).map(|i| i as f64 * 0.5))),
        ],
    )
    .expect("valid batch")
}

async fn new_table(dir: &std::path::Path) -> Table {
    let opts = CreateOptions {
        name: "bench".into(),
        table_type: TableType::CopyOnWrite,
        record_key_fields: vec!["id".into()],
        partition_fields: vec!["city".into()],
        ordering_field: Some("ts".into()),
        hive_style: true,
        inline_compaction: None,
        table_version: 6,
    };
    let uri = dir.join(format!("t{}", rand_suffix()));
    Table::create(uri.to_str().expect("utf-8 path"), oxlake::services::default_options(), opts, schema())
        .await
        .expect("create")
}

fn rand_suffix() -> u128 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or_default()
}

fn benches(c: &mut Criterion) {
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let dir = tempfile::tempdir().expect("tempdir");
    let data = batch(ROWS, 1);

    let mut g = c.benchmark_group("core");
    g.sample_size(10);
    g.throughput(Throughput::Elements(ROWS as u64));

    let spec = KeySpec {
        record_key_fields: vec!["id".into()],
        partition_fields: vec!["city".into()],
        complex_keys: false,
        hive_style: true,
    };
    g.bench_function("record_keys_and_partitions", |b| {
        b.iter(|| {
            black_box(spec.record_keys(&data).expect("keys"));
            black_box(spec.partitions(&data).expect("partitions"));
        })
    });

    g.bench_function("insert", |b| {
        b.iter(|| {
            rt.block_on(async {
                let mut t = new_table(dir.path()).await;
                t.write(WriteOperation::Insert, vec![data.clone()], &WriteConfig::default()).await.expect("insert")
            })
        })
    });

    let mut table = rt.block_on(new_table(dir.path()));
    rt.block_on(table.write(WriteOperation::Insert, vec![data.clone()], &WriteConfig::default())).expect("insert");
    g.bench_function("full_scan", |b| {
        b.iter(|| {
            rt.block_on(async {
                let batches: Vec<RecordBatch> =
                    table.scan(&ScanOptions::default()).await.expect("scan").try_collect().await.expect("batches");
                black_box(batches.iter().map(RecordBatch::num_rows).sum::<usize>())
            })
        })
    });

    let updates = batch(ROWS / 10, 2);
    g.throughput(Throughput::Elements((ROWS / 10) as u64));
    g.bench_function("upsert_10_percent", |b| {
        b.iter(|| {
            rt.block_on(table.write(WriteOperation::Upsert, vec![updates.clone()], &WriteConfig::default()))
                .expect("upsert")
        })
    });

    let names: Vec<String> = (0..10_000u64)
        .flat_map(|i| {
            let t = format!("2024{:013}", i);
            [format!("{t}.commit.requested"), format!("{t}.inflight"), format!("{t}.commit")]
        })
        .collect();
    g.throughput(Throughput::Elements(names.len() as u64));
    g.bench_function("timeline_from_30k_file_names", |b| {
        b.iter(|| black_box(Timeline::from_file_names(names.iter().map(String::as_str), ".hoodie".into(), 1)))
    });
    g.finish();
}

criterion_group!(core, benches);
criterion_main!(core);
