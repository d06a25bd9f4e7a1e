//! The metadata table (DESIGN.md §3, issue 4): a merge-on-read table of our own under
//! `.hoodie/oxlake/metadata/`, one partition per index, each sharded into a fixed number of file
//! groups by a stable hash. This module grows with it; for now it holds the sharding every writer
//! and reader of the metadata table must agree on.

pub mod shard;
