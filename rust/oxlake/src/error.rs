//! One error type for the crate. Every variant carries the facts a caller needs to act on it;
//! conversions to DataFusion and Python errors happen only at the edges.

use std::fmt;
use std::sync::Arc;

/// Result alias used across the crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What went wrong, as data.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// No table at `uri` (no `.hoodie/hoodie.properties`).
    #[error("no table at {uri}: {reason}")]
    TableNotFound {
        /// Table root URI that was opened.
        uri: String,
        /// Why no table was found there.
        reason: String,
    },

    /// `create` found a table already there.
    #[error("a table already exists at {uri}")]
    TableExists {
        /// Table root URI.
        uri: String,
    },

    /// The data handed to a write does not match the table schema.
    #[error("schema mismatch: {detail}")]
    SchemaMismatch {
        /// Which columns or types differ.
        detail: String,
    },

    /// The data is well-typed but violates a rule of the table (null key, missing column...).
    #[error("invalid data: {detail}")]
    InvalidData {
        /// The rule violated and where.
        detail: String,
    },

    /// An argument of an API call is not valid (unknown option, bad filter...).
    #[error("invalid argument `{name}`: {detail}")]
    InvalidArgument {
        /// Name of the argument.
        name: String,
        /// What is wrong with its value.
        detail: String,
    },

    /// Another writer claimed or changed what this write needed.
    #[error("commit conflict at instant {instant}: {detail}")]
    CommitConflict {
        /// Instant time the conflict is about: this write's or the other writer's.
        instant: String,
        /// What the other writer claimed or changed.
        detail: String,
    },

    /// A write got past the point where its outcome is decided, but could not confirm which way
    /// it went (the store failed while it completed): it may have committed, and a retry could
    /// apply it twice. `Table::outcome` tells, once the store answers again.
    #[error("the outcome of commit {instant} is unknown: {detail}")]
    CommitUnknown {
        /// This write's instant time: ask `Table::outcome` about it.
        instant: String,
        /// What failed, and what was decided as far as known.
        detail: String,
    },

    /// A table file could not be understood.
    #[error("corrupt table file {path}: {detail}")]
    CorruptTable {
        /// Path of the file.
        path: String,
        /// What could not be understood.
        detail: String,
    },

    /// The table uses a feature oxlake does not implement.
    #[error("unsupported: {feature}")]
    Unsupported {
        /// The feature, as shown to the user.
        feature: String,
    },

    /// The object store failed (after retries for transient errors).
    #[error("storage error on {path}: {source}")]
    Storage {
        /// Path of the object concerned.
        path: String,
        /// The object store's error.
        #[source]
        source: object_store::Error,
    },

    /// Arrow failed while building or converting batches.
    #[error("arrow: {0}")]
    Arrow(#[from] arrow::error::ArrowError),

    /// Parquet failed while reading or writing a file (a store failure underneath is
    /// [`Error::Storage`] instead).
    #[error("parquet: {0}")]
    Parquet(parquet::errors::ParquetError),

    /// DataFusion failed while planning or executing a read.
    #[error("query: {0}")]
    DataFusion(Box<datafusion::error::DataFusionError>),
}

impl Error {
    pub(crate) fn invalid_data(detail: impl fmt::Display) -> Self {
        Error::InvalidData { detail: detail.to_string() }
    }

    pub(crate) fn invalid_arg(name: &str, detail: impl fmt::Display) -> Self {
        Error::InvalidArgument { name: name.to_string(), detail: detail.to_string() }
    }

    pub(crate) fn corrupt(path: impl fmt::Display, detail: impl fmt::Display) -> Self {
        Error::CorruptTable { path: path.to_string(), detail: detail.to_string() }
    }

    pub(crate) fn unsupported(feature: impl fmt::Display) -> Self {
        Error::Unsupported { feature: feature.to_string() }
    }

    pub(crate) fn storage(path: impl fmt::Display, source: object_store::Error) -> Self {
        Error::Storage { path: path.to_string(), source }
    }

    /// The oxlake error a query's error carries, wherever DataFusion wrapped it; `self` when it
    /// carries none. An error of a join's build side reaches every partition of the join behind
    /// one `Arc` (`DataFusionError::Shared`), so it cannot always be taken out by value.
    pub fn root(&self) -> &Error {
        use datafusion::error::DataFusionError as D;
        fn carried(e: &D) -> Option<&Error> {
            match e {
                D::External(inner) => match inner.downcast_ref::<Error>() {
                    Some(ours) => Some(ours.root()),
                    None => inner.downcast_ref::<D>().and_then(carried),
                },
                D::Shared(inner) => carried(inner),
                D::Context(_, inner) => carried(inner),
                _ => None,
            }
        }
        match self {
            Error::DataFusion(e) => carried(e).unwrap_or(self),
            other => other,
        }
    }

    /// This error as one of reading the file at `path`: the Parquet and Arrow decoders do not
    /// know which file they decode, so their failures become [`Error::CorruptTable`] naming it,
    /// and a store failure reported without a path gets this one.
    pub fn in_file(self, path: impl fmt::Display) -> Self {
        match self {
            Error::Parquet(e) => Error::corrupt(path, e),
            Error::Arrow(e) => Error::corrupt(path, e),
            Error::Storage { path: p, source } if p == UNNAMED_PARQUET || p == UNNAMED_DATA => {
                Error::storage(path, source)
            }
            other => other,
        }
    }
}

impl Error {
    /// Whether this is a store failure reported without the file it concerns.
    pub(crate) fn is_unnamed_storage(&self) -> bool {
        matches!(self, Error::Storage { path, .. } if path == UNNAMED_PARQUET || path == UNNAMED_DATA)
    }
}

/// The path of a store failure the Parquet reader reported without one.
const UNNAMED_PARQUET: &str = "a Parquet file";
/// The path of a store failure DataFusion reported without one.
const UNNAMED_DATA: &str = "a data file";

impl From<parquet::errors::ParquetError> for Error {
    fn from(e: parquet::errors::ParquetError) -> Self {
        use parquet::errors::ParquetError as P;
        // The Parquet readers report the store's failures as external errors: keep their kind.
        match e {
            P::External(inner) => match inner.downcast::<object_store::Error>() {
                Ok(store) => Error::storage(UNNAMED_PARQUET, *store),
                // Writers reach the store through `AsyncWrite`, whose failures are IO errors.
                Err(inner) => match inner.downcast::<std::io::Error>() {
                    Ok(io) => Error::storage(UNNAMED_PARQUET, object_store::Error::Generic { store: "io", source: io }),
                    Err(inner) => match inner.downcast::<Error>() {
                        Ok(ours) => *ours,
                        Err(other) => Error::Parquet(P::External(other)),
                    },
                },
            },
            // DataFusion's Parquet opener folds the store's error into a message.
            P::General(message) if message.contains("Object Store error") => {
                let source = object_store::Error::Generic { store: "parquet", source: message.into() };
                Error::storage(UNNAMED_PARQUET, source)
            }
            other => Error::Parquet(other),
        }
    }
}

impl From<datafusion::error::DataFusionError> for Error {
    fn from(e: datafusion::error::DataFusionError) -> Self {
        use datafusion::error::DataFusionError as D;
        // Unwrap our own errors that travelled through DataFusion, so callers see the real kind.
        match e {
            D::External(inner) => match inner.downcast::<Error>() {
                Ok(ours) => *ours,
                Err(other) => Error::DataFusion(Box::new(D::External(other))),
            },
            D::ArrowError(a, _) => Error::Arrow(*a),
            D::ObjectStore(store) => Error::storage(UNNAMED_DATA, *store),
            D::ParquetError(p) => Error::from(*p),
            D::Context(_, inner) => Error::from(*inner),
            D::Shared(shared) => match Arc::try_unwrap(shared) {
                Ok(inner) => Error::from(inner),
                Err(shared) => Error::DataFusion(Box::new(D::Shared(shared))),
            },
            other => Error::DataFusion(Box::new(other)),
        }
    }
}

impl From<Error> for datafusion::error::DataFusionError {
    fn from(e: Error) -> Self {
        datafusion::error::DataFusionError::External(Box::new(e))
    }
}
