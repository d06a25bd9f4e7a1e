//! On-disk models of the Hudi format, kept apart from the IO that reads and writes them.

pub mod avro;
pub mod clean;
pub mod commit;
pub mod file_name;
pub mod instant;
pub mod log_block;
