//! On-disk models of the Hudi format, kept apart from the IO that reads and writes them.

pub mod archived;
pub mod avro;
pub mod base_file;
pub mod clean;
pub mod clustering_plan;
pub mod commit;
pub mod compaction_plan;
pub mod file_name;
pub mod instant;
pub mod log_block;
pub mod lsm;
pub mod plans;
pub mod rollback;
