//! Table services: compaction, clean, clustering, rollback, savepoint and restore. Each is an action
//! on the timeline with the same claim / inflight / complete protocol as a write (see
//! [`crate::commit`]), so a crash at any step leaves the table readable and the next run finishes or
//! undoes the step.

pub mod archive;
pub mod clean;
pub mod clustering;
pub mod compaction;
pub mod hooks;
pub(crate) mod lsm_compaction;
pub mod progress;
pub mod restore;
pub mod upgrade;

pub use archive::{ArchiveConfig, ArchiveResult};
pub use clean::{CleanPlan, CleanPolicy, CleanResult, InlineClean};
pub use clustering::{ClusteringConfig, ClusteringPlan, ClusteringResult, pending_clustering_groups};
pub use compaction::{
    CompactionConfig, CompactionOperation, CompactionPlan, CompactionResult, PendingCompaction,
    pending_compaction_groups,
};
pub use hooks::{Hooks, default_options};
pub use progress::Progress;
pub use upgrade::UpgradeResult;
