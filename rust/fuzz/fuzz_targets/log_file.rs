//! The log-file reader on arbitrary bytes: block framing, headers, Avro and Parquet data blocks,
//! delete blocks. Any input is either decoded or rejected with an error; never a panic.

#![no_main]

use std::sync::Arc;

use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use bytes::Bytes;
use libfuzzer_sys::fuzz_target;
use oxlake::format::log_block::HeaderKey;
use oxlake::format::log_block::{Parsed, parse_blocks};

/// The schema a table would read into when a block names none (or an unreadable one).
fn fallback_schema() -> SchemaRef {
    let data = Schema::new(vec![
        Field::new("id", DataType::Int64, false),
        Field::new("name", DataType::Utf8, true),
        Field::new("ts", DataType::Int64, true),
        Field::new("fare", DataType::Float64, true),
    ]);
    oxlake::schema::with_meta_fields(&data)
}

fuzz_target!(|data: &[u8]| {
    // oxlake turns a panic of the Parquet decoder on a damaged block into an error (it catches
    // it); libfuzzer's hook would abort on it before that. A panic that reaches this closure still
    // fails the run (libfuzzer-sys aborts on an unwind out of it).
    static QUIET: std::sync::Once = std::sync::Once::new();
    QUIET.call_once(|| std::panic::set_hook(Box::new(|_| {})));
    let data = Bytes::copy_from_slice(data);
    // Read into the schema the first data block declares, as a table of that schema would.
    let declared = parse_blocks(&data).into_iter().find_map(|p| match p {
        Parsed::Block { block, .. } => block.header.get(&HeaderKey::Schema).cloned(),
        Parsed::Corrupt { .. } => None,
    });
    let schema = declared.and_then(|s| oxlake::schema::from_avro(&s).ok()).unwrap_or_else(fallback_schema);
    let schema: SchemaRef = Arc::new(Schema::new(schema.fields().clone()));
    let _ = oxlake::log::decode_file("fuzz.log", &data, &schema);
});
