//! What the timeline reads from other writers: commit metadata (JSON and the Avro of timeline
//! layout 2), `hoodie.properties`, instant and data file names. Never a panic.

#![no_main]

use libfuzzer_sys::fuzz_target;
use oxlake::config::TableConfig;
use oxlake::format::commit::CommitMetadata;
use oxlake::format::file_name::{BaseFileName, LogFileName};
use oxlake::format::instant::{Instant, normalize_time};

fuzz_target!(|data: &[u8]| {
    if let Ok(meta) = CommitMetadata::from_json("fuzz.commit", data) {
        // What readers do with it next.
        let _ = meta.write_stats().count();
        let _ = meta.replaced_file_groups().count();
        let _ = meta.schema();
        let _ = meta.to_json();
    }
    if let Ok(meta) = CommitMetadata::from_avro("fuzz.commit", data) {
        let _ = meta.write_stats().count();
        let _ = meta.to_json();
    }
    if let Ok(text) = std::str::from_utf8(data) {
        if let Ok(config) = TableConfig::parse(text) {
            let _ = config.to_properties();
            let _ = config.timeline_dir();
        }
        for name in text.split(['/', '\n']) {
            let _ = Instant::parse_file_name(name, 1);
            let _ = Instant::parse_file_name(name, 2);
            let _ = BaseFileName::parse(name);
            let _ = LogFileName::parse(name);
            let _ = normalize_time(name);
        }
    }
});
