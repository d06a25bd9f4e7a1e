//! Test helpers: the shared compatibility corpus of tables Apache Hudi wrote.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use arrow::array::{Int64Array, RecordBatch, StringArray};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef};

use crate::config::{CreateOptions, TableType};
use crate::table::{Table, TableOptions};

/// The folder holding Apache Hudi's corpus: `$OXLAKE_SHARED`, else `../shared` beside the
/// repository (as `build.rs` looks for it: the tests calling this are ignored without it).
pub(crate) fn shared_dir() -> PathBuf {
    match std::env::var("OXLAKE_SHARED") {
        Ok(dir) if !dir.is_empty() => PathBuf::from(dir),
        _ => std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared"),
    }
}

/// One file of a zipped corpus table: `zip` relative to `compat/hudi`, `path` inside the table.
pub(crate) fn corpus_file(zip: &str, path: &str) -> Vec<u8> {
    let zip_path = shared_dir().join("compat/hudi").join(zip);
    let table = zip_path.file_stem().expect("a zip name").to_string_lossy().into_owned();
    let mut archive = zip::ZipArchive::new(std::fs::File::open(&zip_path).expect("corpus zip")).expect("a zip");
    let mut entry = archive.by_name(&format!("{table}/{path}")).expect("the file in the zip");
    let mut out = Vec::new();
    entry.read_to_end(&mut out).expect("readable");
    out
}

/// The schema of the small tables of unit tests: the key `id`, the partition column `city`.
pub(crate) fn id_city_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![Field::new("id", DataType::Int64, false), Field::new("city", DataType::Utf8, true)]))
}

/// Rows of [`id_city_schema`].
pub(crate) fn id_city_rows(rows: &[(i64, &str)]) -> RecordBatch {
    let ids: Vec<i64> = rows.iter().map(|r| r.0).collect();
    let cities: Vec<&str> = rows.iter().map(|r| r.1).collect();
    RecordBatch::try_new(id_city_schema(), vec![Arc::new(Int64Array::from(ids)), Arc::new(StringArray::from(cities))])
        .expect("rows of the schema")
}

/// Rows keyed `ids`: even ones in city `a`, odd ones in city `b`.
pub(crate) fn by_parity(ids: &[i64]) -> RecordBatch {
    let rows: Vec<(i64, &str)> = ids.iter().map(|&i| (i, if i % 2 == 0 { "a" } else { "b" })).collect();
    id_city_rows(&rows)
}

/// A table of [`id_city_schema`] at `dir/t`: hive-style partitions by `city`, no ordering field.
pub(crate) async fn id_city_table(dir: &Path, table_type: TableType, options: TableOptions) -> Table {
    keyed_table(dir, table_type, options, id_city_schema()).await
}

/// A table of `schema` (which has `id` and `city`) at `dir/t`, keyed by `id`: hive-style
/// partitions by `city`, no ordering field.
pub(crate) async fn keyed_table(dir: &Path, table_type: TableType, options: TableOptions, schema: SchemaRef) -> Table {
    let create = CreateOptions {
        name: "t".into(),
        table_type,
        record_key_fields: vec!["id".into()],
        partition_fields: vec!["city".into()],
        ordering_field: None,
        hive_style: true,
        inline_compaction: None,
        table_version: 6,
        global_index: false,
        meta_fields: true,
        keygen_options: Default::default(),
        url_encode: true,
    };
    let uri = dir.join("t");
    Table::create(uri.to_str().expect("a UTF-8 path"), options, create, schema).await.expect("created")
}
