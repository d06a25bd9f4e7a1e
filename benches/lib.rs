//! Nothing here: the crate exists for its criterion benches (`core.rs`).
