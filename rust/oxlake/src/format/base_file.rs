//! How base files are written: the Parquet writer properties every writer of base files uses
//! (writes, compaction, clustering, the metadata table).

use parquet::basic::Compression;
use parquet::file::properties::WriterProperties;
use parquet::schema::types::ColumnPath;

use crate::schema::{COMMIT_SEQNO, RECORD_KEY};

/// The writer properties of base files with row groups of `row_group_size` rows.
pub fn writer_properties(row_group_size: usize) -> WriterProperties {
    WriterProperties::builder()
        .set_compression(Compression::SNAPPY)
        // Sequence numbers and record keys are unique per row: dictionary pages would only be
        // built to be thrown away.
        .set_column_dictionary_enabled(ColumnPath::from(COMMIT_SEQNO), false)
        .set_column_dictionary_enabled(ColumnPath::from(RECORD_KEY), false)
        .set_max_row_group_row_count(Some(row_group_size))
        .build()
}
