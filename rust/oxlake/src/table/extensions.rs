//! What the layers above the table lend it for the layers below to call.
//!
//! The commit protocol must keep the metadata table in step, a scan prunes by the metadata
//! table's indexes, and a write runs table services inline; yet the metadata table and the
//! services are built on the commit protocol, the reads and the writes. Each lower layer
//! declares the interface it calls ([`FileIndex`] here, `commit::CommitHook`,
//! `read::SlicePruner`, `write::AfterWrite`); the layer above implements it
//! (`services::hooks`), and whoever opens the table puts the implementations in
//! [`TableOptions::extensions`](super::TableOptions), keyed by interface. A table opened
//! without them (`TableOptions::default()`, the metadata table itself) keeps no metadata table
//! in step and lists storage: as correct, only slower, and the next writer with them catches the
//! metadata table up. Apache Hudi cuts the same recursion with `HoodieTableMetadataWriter`.

use std::any::{Any, TypeId};
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::sync::Arc;

use futures::future::BoxFuture;

use super::Table;
use crate::storage::FileInfo;

/// Implementations by the interface they serve (`Arc<dyn Trait>` each).
#[derive(Clone, Default)]
pub struct Extensions {
    by_type: Arc<BTreeMap<TypeId, Arc<dyn Any + Send + Sync>>>,
}

impl Extensions {
    /// These extensions with `value` serving its type (replacing any other).
    #[must_use]
    pub fn with<T: Any + Send + Sync + Clone>(&self, value: T) -> Self {
        let mut by_type = (*self.by_type).clone();
        by_type.insert(TypeId::of::<T>(), Arc::new(value));
        Extensions { by_type: Arc::new(by_type) }
    }

    /// The implementation serving `T`, if any.
    pub fn get<T: Any + Send + Sync + Clone>(&self) -> Option<T> {
        self.by_type.get(&TypeId::of::<T>())?.downcast_ref::<T>().cloned()
    }

    /// Whether none is registered.
    pub fn is_empty(&self) -> bool {
        self.by_type.is_empty()
    }
}

impl fmt::Debug for Extensions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Extensions({})", self.by_type.len())
    }
}

/// The committed files of a table from an index kept in step with its commits (the metadata
/// table's `files` partition), read instead of listing storage.
pub trait FileIndex: Send + Sync {
    /// The table's committed data files, or `None` when the index is missing, stale or
    /// unreadable (the table is then listed).
    fn files<'a>(&'a self, table: &'a Table) -> BoxFuture<'a, Option<Vec<FileInfo>>>;

    /// The committed data files of the partitions `partitions` (files of partitions nested in
    /// them may come too), or `None` as for [`FileIndex::files`]. All of them by default.
    fn files_in<'a>(
        &'a self,
        table: &'a Table,
        partitions: &'a BTreeSet<String>,
    ) -> BoxFuture<'a, Option<Vec<FileInfo>>> {
        let _ = partitions;
        self.files(table)
    }
}

/// What an extension derived from one state of a table (the metadata table opened at it),
/// shared by the table's clones and dropped when the table reloads.
pub(crate) type DerivedCache = Arc<tokio::sync::OnceCell<Option<Arc<dyn Any + Send + Sync>>>>;
