//! Object storage behind one type.
//!
//! A [`Storage`] is an `object_store` store plus the table's root inside it. Paths handed to its
//! methods are relative to the table root (`.hoodie/hoodie.properties`, `city=sf/f1_0-1-0_t.parquet`).
//! Timeline transitions use [`Storage::put_if_absent`], a conditional create that is atomic on local
//! disk and on S3 (`If-None-Match: *`). Every store is wrapped twice: [`retry::RetryStore`] retries
//! transient failures (for every reader and writer, DataFusion's scans included), above
//! [`faults::FaultStore`], which injects the faults and latency the tests ask for.

pub mod faults;
mod hadoop_checksum;
mod parquet_read;
mod retry;
pub(crate) mod spill;

use std::collections::HashMap;
use std::sync::Arc;

use bytes::Bytes;
use futures::{StreamExt, TryStreamExt};
use object_store::aws::AmazonS3Builder;
use object_store::local::LocalFileSystem;
use object_store::memory::InMemory;
use object_store::path::{Path, PathPart};
use object_store::{ObjectMeta, ObjectStore, ObjectStoreExt, PutMode, PutOptions, PutPayload, RetryConfig};

use self::faults::FaultStore;
pub(crate) use self::parquet_read::{decoding, panic_message};

/// Listings of partition folders run at once by [`Storage::list_table`].
const LISTINGS_AT_ONCE: usize = 16;
use self::retry::RetryStore;
use url::Url;

use crate::error::{Error, Result};

/// A table's storage: the store, the table root inside it, and the URL DataFusion knows it by.
#[derive(Clone, Debug)]
pub struct Storage {
    store: Arc<dyn ObjectStore>,
    root: Path,
    /// `file:///`, `s3://bucket/` or `memory:///`: the key under which DataFusion finds `store`.
    store_url: Url,
    uri: String,
}

/// A file found by a listing, with its path relative to the table root.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FileInfo {
    /// Path relative to the table root, `/`-separated.
    pub path: String,
    /// Size in bytes.
    pub size: u64,
}

impl Storage {
    /// Opens the storage for a table URI.
    ///
    /// Accepts plain paths and `file://` URLs (local disk), `s3://bucket/prefix` and `memory://name`.
    /// S3 options (`endpoint`, `region`, `access_key_id`, `secret_access_key`, `session_token`,
    /// `allow_http`, or their `aws_*` spellings) come from `options`, then from the usual
    /// `AWS_*` environment variables.
    pub fn open(uri: &str, options: &HashMap<String, String>) -> Result<Self> {
        let uri = uri.trim_end_matches('/');
        if uri.is_empty() {
            return Err(Error::invalid_arg("uri", "empty table URI"));
        }
        match uri.split_once("://") {
            Some(("s3" | "s3a", rest)) => Self::open_s3(uri, rest, options),
            Some(("memory", rest)) => Self::in_memory(rest),
            // A `file://` URI is a URL: `%XX` is decoded (`file:///x/a%20b` is `/x/a b`); a plain
            // path is taken as it is.
            Some(("file", rest)) => Self::open_local(uri, &decode_uri_path(uri, rest)?),
            Some((scheme, _)) => Err(Error::invalid_arg("uri", format!("unsupported scheme `{scheme}`"))),
            None => Self::open_local(uri, uri),
        }
    }

    /// A fresh in-memory store (unit tests).
    pub fn in_memory(root: &str) -> Result<Self> {
        Ok(Storage {
            store: layered(Arc::new(InMemory::new())),
            root: root_path(root)?,
            store_url: url_of("memory:///")?,
            uri: format!("memory://{}", root.trim_matches('/')),
        })
    }

    fn open_local(uri: &str, path: &str) -> Result<Self> {
        let abs = normalize_local(&std::path::absolute(path).map_err(|e| Error::invalid_arg("uri", e))?);
        let root = Path::from_absolute_path(&abs).map_err(|e| Error::invalid_arg("uri", format!("{uri}: {e}")))?;
        Ok(Storage {
            store: layered(Arc::new(LocalFileSystem::new())),
            root,
            store_url: url_of("file:///")?,
            uri: abs.to_string_lossy().into_owned(),
        })
    }

    fn open_s3(uri: &str, rest: &str, options: &HashMap<String, String>) -> Result<Self> {
        let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
        if bucket.is_empty() {
            return Err(Error::invalid_arg("uri", format!("{uri}: no bucket")));
        }
        let mut builder = AmazonS3Builder::from_env()
            .with_bucket_name(bucket)
            .with_retry(RetryConfig { max_retries: 3, ..RetryConfig::default() });
        for (key, value) in options {
            let key = key.to_ascii_lowercase();
            let key = key.strip_prefix("aws_").unwrap_or(&key);
            let config_key = match key {
                "endpoint" | "endpoint_url" => "aws_endpoint",
                "region" => "aws_region",
                "access_key_id" => "aws_access_key_id",
                "secret_access_key" => "aws_secret_access_key",
                "session_token" => "aws_session_token",
                "allow_http" => "aws_allow_http",
                "virtual_hosted_style_request" => "aws_virtual_hosted_style_request",
                other => return Err(Error::invalid_arg("storage_options", format!("unknown key `{other}`"))),
            };
            let parsed =
                config_key.parse().map_err(|e| Error::invalid_arg("storage_options", format!("{key}: {e}")))?;
            builder = builder.with_config(parsed, value.clone());
        }
        let store = builder.build().map_err(|e| Error::invalid_arg("storage_options", format!("{uri}: {e}")))?;
        Ok(Storage {
            store: layered(Arc::new(store)),
            root: root_path(prefix)?,
            store_url: url_of(&format!("s3://{bucket}/"))?,
            uri: uri.to_string(),
        })
    }

    /// The table URI as given (local paths made absolute).
    pub fn uri(&self) -> &str {
        &self.uri
    }

    /// The underlying store, for DataFusion's registry.
    pub fn object_store(&self) -> Arc<dyn ObjectStore> {
        self.store.clone()
    }

    /// The URL DataFusion registers the store under.
    pub fn store_url(&self) -> &Url {
        &self.store_url
    }

    /// The full store path of a table-relative path.
    ///
    /// Table-relative paths are the names as they are on disk and in object keys (partition
    /// values are escaped once, by [`crate::keys`]), so each segment is taken as it is:
    /// `Path::from` would percent-encode `%` and non-ASCII characters a second time and name
    /// another file. A segment no store can hold as it is (`.`, `..`, an ASCII control character,
    /// which no listing returns and no writer makes) is encoded, so it names nothing outside
    /// the table.
    pub fn path(&self, rel: &str) -> Path {
        let rel =
            rel.split('/').filter(|s| !s.is_empty()).map(|s| PathPart::parse(s).unwrap_or_else(|_| PathPart::from(s)));
        Path::from_iter(self.root.parts().chain(rel))
    }

    /// Reads a whole file.
    pub async fn get(&self, rel: &str) -> Result<Bytes> {
        let path = self.path(rel);
        let get = async { self.store.get(&path).await?.bytes().await };
        get.await.map_err(|e| Error::storage(rel, e))
    }

    /// Reads a file, or `None` when it does not exist.
    pub async fn get_opt(&self, rel: &str) -> Result<Option<Bytes>> {
        match self.get(rel).await {
            Ok(b) => Ok(Some(b)),
            Err(Error::Storage { source: object_store::Error::NotFound { .. }, .. }) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// The rows of the Parquet file `rel` of `size` bytes, from its footer.
    pub async fn parquet_rows(&self, rel: &str, size: u64) -> Result<u64> {
        let mut file = ParquetFile::open(self, rel, size);
        let meta =
            parquet::arrow::async_reader::AsyncFileReader::get_metadata(&mut file, None).await.map_err(
                |e| match e {
                    parquet::errors::ParquetError::External(_) => Error::from(e),
                    e => Error::corrupt(rel, format!("Parquet footer: {e}")),
                },
            )?;
        Ok(meta.file_metadata().num_rows().max(0) as u64)
    }

    /// Size and modification time of a file, or `None` when it does not exist.
    pub async fn head(&self, rel: &str) -> Result<Option<ObjectMeta>> {
        let path = self.path(rel);
        match self.store.head(&path).await.map_err(|e| Error::storage(rel, e)) {
            Ok(m) => Ok(Some(m)),
            Err(Error::Storage { source: object_store::Error::NotFound { .. }, .. }) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Writes a file, replacing any previous content (and the Hadoop checksum beside it, see
    /// [`hadoop_checksum`]).
    pub async fn put(&self, rel: &str, data: Bytes) -> Result<()> {
        self.forget_hadoop_checksum(rel)?;
        let path = self.path(rel);
        self.store.put(&path, PutPayload::from(data)).await.map_err(|e| Error::storage(rel, e))?;
        Ok(())
    }

    /// Creates a file only if nothing is there yet. Returns `false` when it already existed.
    ///
    /// This is the one primitive the commit protocol relies on: at most one caller wins.
    pub async fn put_if_absent(&self, rel: &str, data: Bytes) -> Result<bool> {
        let path = self.path(rel);
        let opts = PutOptions { mode: PutMode::Create, ..PutOptions::default() };
        let result = self.store.put_opts(&path, PutPayload::from(data), opts).await.map_err(|e| Error::storage(rel, e));
        match result {
            Ok(_) => Ok(true),
            Err(Error::Storage { source: object_store::Error::AlreadyExists { .. }, .. }) => Ok(false),
            // S3 reports a lost race on `If-None-Match` as a failed precondition.
            Err(Error::Storage { source: object_store::Error::Precondition { .. }, .. }) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Deletes a file (and the Hadoop checksum beside it); a file that is already gone is not an
    /// error.
    pub async fn delete(&self, rel: &str) -> Result<()> {
        self.forget_hadoop_checksum(rel)?;
        let path = self.path(rel);
        match self.store.delete(&path).await.map_err(|e| Error::storage(rel, e)) {
            Ok(()) | Err(Error::Storage { source: object_store::Error::NotFound { .. }, .. }) => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// Lists the files directly inside a directory (not recursive), paths relative to the root.
    pub async fn list_dir(&self, rel_dir: &str) -> Result<Vec<FileInfo>> {
        let prefix = self.path(rel_dir);
        let listing = self.store.list_with_delimiter(Some(&prefix)).await.map_err(|e| Error::storage(rel_dir, e))?;
        Ok(Self::files_of(&prefix, listing.objects).map(|m| self.file_info(&m)).collect())
    }

    /// [`Self::list_dir`], each file with the store's version tag (its ETag) where it gives one.
    pub async fn list_dir_tagged(&self, rel_dir: &str) -> Result<Vec<(FileInfo, Option<String>)>> {
        let prefix = self.path(rel_dir);
        let listing = self.store.list_with_delimiter(Some(&prefix)).await.map_err(|e| Error::storage(rel_dir, e))?;
        Ok(Self::files_of(&prefix, listing.objects).map(|m| (self.file_info(&m), m.e_tag.clone())).collect())
    }

    /// Lists the files inside a directory of flat files whose names sort after `after` (a name
    /// in that directory): on an object store, a listing that starts there (S3's `start-after`),
    /// so that a directory of markers named by time costs what is newer than `after`, not its age.
    pub async fn list_dir_after(&self, rel_dir: &str, after: &str) -> Result<Vec<FileInfo>> {
        use futures::TryStreamExt;
        let prefix = self.path(rel_dir);
        let offset = self.path(&format!("{}/{after}", rel_dir.trim_end_matches('/')));
        let listed: Vec<object_store::ObjectMeta> = self
            .store
            .list_with_offset(Some(&prefix), &offset)
            .try_collect()
            .await
            .map_err(|e| Error::storage(rel_dir, e))?;
        Ok(Self::files_of(&prefix, listed).map(|m| self.file_info(&m)).collect())
    }

    /// Lists the files directly inside a directory last modified before `before`.
    pub async fn list_dir_before(&self, rel_dir: &str, before: chrono::DateTime<chrono::Utc>) -> Result<Vec<FileInfo>> {
        let prefix = self.path(rel_dir);
        let listing = self.store.list_with_delimiter(Some(&prefix)).await.map_err(|e| Error::storage(rel_dir, e))?;
        Ok(Self::files_of(&prefix, listing.objects)
            .filter(|m| m.last_modified < before)
            .map(|m| self.file_info(&m))
            .collect())
    }

    /// Lists one level of a directory: the files directly inside it, and its sub-directories.
    pub async fn list_level(&self, rel_dir: &str) -> Result<(Vec<FileInfo>, Vec<String>)> {
        let prefix = self.path(rel_dir);
        let listing = self.store.list_with_delimiter(Some(&prefix)).await.map_err(|e| Error::storage(rel_dir, e))?;
        let files = Self::files_of(&prefix, listing.objects).map(|m| self.file_info(&m)).collect();
        Ok((files, listing.common_prefixes.iter().map(|p| self.relative(p)).collect()))
    }

    /// Removes a directory left empty on local disk (object stores have none), if it is empty:
    /// a folder of markers pruned whole would otherwise stay in every listing of its parent.
    pub async fn remove_empty_dir(&self, rel_dir: &str) {
        if self.store_url.scheme() == "file" {
            // Not removed: still holds a file, or already gone; either way nothing to do.
            let _ = std::fs::remove_dir(format!("/{}", self.path(rel_dir)));
        }
    }

    /// Whether the table is on local disk (where Java Hudi keeps Hadoop's checksum files).
    pub fn is_local(&self) -> bool {
        self.store_url.scheme() == "file"
    }

    /// The file's path on local disk; `None` on an object store.
    fn local_path(&self, rel: &str) -> Option<String> {
        self.is_local().then(|| format!("/{}", self.path(rel)))
    }

    /// Removes the checksum Hadoop's local file system (Java Hudi's) keeps beside `rel`, before
    /// `rel` is replaced or deleted: Java reads a file without one as it is, but refuses one
    /// whose checksum no longer matches.
    fn forget_hadoop_checksum(&self, rel: &str) -> Result<()> {
        let Some(path) = self.local_path(rel) else { return Ok(()) };
        match std::fs::remove_file(hadoop_checksum::checksum_path(&path)) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                Err(Error::storage(rel, object_store::Error::Generic { store: "LocalFileSystem", source: Box::new(e) }))
            }
            _ => Ok(()),
        }
    }

    /// Whether the Hadoop checksum beside `rel` no longer matches it (a file Java wrote on local
    /// disk, replaced by an oxlake older than the removal of checksums, or by hand). `false`
    /// when either is missing or the checksum file is no checksum.
    pub async fn has_stale_hadoop_checksum(&self, rel: &str) -> Result<bool> {
        let Some(path) = self.local_path(rel) else { return Ok(false) };
        let Ok(checksum) = std::fs::read(hadoop_checksum::checksum_path(&path)) else { return Ok(false) };
        let Some(data) = self.get_opt(rel).await? else { return Ok(false) };
        Ok(hadoop_checksum::matches(&data, &checksum) == Some(false))
    }

    /// Removes the Hadoop checksum beside `rel` if it no longer matches the file; whether it did.
    pub async fn repair_hadoop_checksum(&self, rel: &str) -> Result<bool> {
        if !self.has_stale_hadoop_checksum(rel).await? {
            return Ok(false);
        }
        self.forget_hadoop_checksum(rel)?;
        Ok(true)
    }

    /// Lists the sub-directories directly inside a directory, paths relative to the root.
    pub async fn list_subdirs(&self, rel_dir: &str) -> Result<Vec<String>> {
        let prefix = self.path(rel_dir);
        let listing = self.store.list_with_delimiter(Some(&prefix)).await.map_err(|e| Error::storage(rel_dir, e))?;
        Ok(listing.common_prefixes.iter().map(|p| self.relative(p)).collect())
    }

    /// Lists every file of the table outside `.hoodie/` (data files and partition markers): the
    /// root's own level, then each folder in it but `.hoodie` recursively, side by side. The
    /// timeline's folder holds oxlake's and Apache Hudi's bookkeeping (claims, heartbeats,
    /// archives, the metadata table), which grows with the table's age and never holds data.
    pub async fn list_table(&self) -> Result<Vec<FileInfo>> {
        let prefix = self.path("");
        let root = self.store.list_with_delimiter(Some(&prefix)).await.map_err(|e| Error::storage("", e))?;
        let mut files: Vec<FileInfo> = Self::files_of(&prefix, root.objects).map(|m| self.file_info(&m)).collect();
        let dirs: Vec<String> =
            root.common_prefixes.iter().map(|p| self.relative(p)).filter(|d| d != ".hoodie").collect();
        let nested: Vec<Vec<FileInfo>> = futures::stream::iter(dirs)
            .map(|d| async move { self.list_recursive(&d).await })
            .buffered(LISTINGS_AT_ONCE)
            .try_collect()
            .await?;
        files.extend(nested.into_iter().flatten());
        Ok(files)
    }

    /// Lists every file under a directory, recursively.
    pub async fn list_recursive(&self, rel_dir: &str) -> Result<Vec<FileInfo>> {
        let prefix = self.path(rel_dir);
        let listing = self.store.list(Some(&prefix)).try_collect::<Vec<_>>();
        let listed = listing.await.map_err(|e| Error::storage(rel_dir, e))?;
        Ok(Self::files_of(&prefix, listed).map(|m| self.file_info(&m)).collect())
    }

    /// The files of a listing of `prefix`: an S3 server that keeps folders (SeaweedFS) lists a
    /// folder emptied of its files as an object of its own name, which is no file.
    fn files_of(prefix: &Path, listed: Vec<ObjectMeta>) -> impl Iterator<Item = ObjectMeta> + '_ {
        listed.into_iter().filter(move |m| m.location != *prefix)
    }

    fn file_info(&self, meta: &ObjectMeta) -> FileInfo {
        FileInfo { path: self.relative(&meta.location), size: meta.size }
    }

    fn relative(&self, path: &Path) -> String {
        let full = path.as_ref();
        let root = self.root.as_ref();
        if root.is_empty() {
            return full.to_string();
        }
        full.strip_prefix(root).map(|r| r.trim_start_matches('/')).unwrap_or(full).to_string()
    }
}

/// The path part of a URI with `%XX` decoded, as object_store and hudi-rs read URIs (a space or a
/// non-ASCII character written as it is stays as it is).
fn decode_uri_path(uri: &str, rest: &str) -> Result<String> {
    percent_encoding::percent_decode_str(rest)
        .decode_utf8()
        .map(|s| s.into_owned())
        .map_err(|e| Error::invalid_arg("uri", format!("{uri}: {e}")))
}

/// The table root inside a bucket (or the in-memory store): the URI's path, `%XX` decoded, each
/// segment as it is.
fn root_path(prefix: &str) -> Result<Path> {
    let prefix = prefix.trim_matches('/');
    Path::from_url_path(prefix).map_err(|e| Error::invalid_arg("uri", format!("{prefix}: {e}")))
}

fn url_of(s: &str) -> Result<Url> {
    Url::parse(s).map_err(|e| Error::invalid_arg("uri", format!("{s}: {e}")))
}

/// The layers every store gets: retries above injected faults above the real store.
fn layered(store: Arc<dyn ObjectStore>) -> Arc<dyn ObjectStore> {
    Arc::new(RetryStore::new(Arc::new(FaultStore::new(store))))
}

/// Resolves `.` and `..` in an absolute local path by its components (the table may not exist
/// yet, so the file system is not asked; object store paths refuse `..`).
fn normalize_local(path: &std::path::Path) -> std::path::PathBuf {
    use std::path::Component;
    let mut out = std::path::PathBuf::new();
    for c in path.components() {
        match c {
            Component::CurDir => {}
            Component::ParentDir => {
                out.pop();
            }
            other => out.push(other),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn put_if_absent_admits_one_writer() {
        let s = Storage::in_memory("t").unwrap();
        assert!(s.put_if_absent(".hoodie/1.commit", Bytes::from_static(b"a")).await.unwrap());
        assert!(!s.put_if_absent(".hoodie/1.commit", Bytes::from_static(b"b")).await.unwrap());
        assert_eq!(s.get(".hoodie/1.commit").await.unwrap(), Bytes::from_static(b"a"));
    }

    #[tokio::test]
    async fn local_paths_with_dot_dot_open_the_folder_they_name() {
        let dir = tempfile::tempdir().unwrap();
        let direct = Storage::open(dir.path().join("t").to_str().unwrap(), &HashMap::new()).unwrap();
        direct.put(".hoodie/x", Bytes::from_static(b"x")).await.unwrap();
        let roundabout = dir.path().join("a/../b/./../t");
        let s = Storage::open(roundabout.to_str().unwrap(), &HashMap::new()).unwrap();
        assert_eq!(s.uri(), direct.uri());
        assert_eq!(s.get(".hoodie/x").await.unwrap(), Bytes::from_static(b"x"));
    }

    #[tokio::test]
    async fn listings_are_relative_to_the_root() {
        let s = Storage::in_memory("base/t").unwrap();
        s.put("a/x.parquet", Bytes::from_static(b"1")).await.unwrap();
        s.put("a/b/y.parquet", Bytes::from_static(b"22")).await.unwrap();
        s.put("z", Bytes::from_static(b"333")).await.unwrap();
        let mut all: Vec<_> = s.list_recursive("").await.unwrap().into_iter().map(|f| (f.path, f.size)).collect();
        all.sort();
        assert_eq!(all, vec![("a/b/y.parquet".into(), 2), ("a/x.parquet".into(), 1), ("z".into(), 3)]);
        assert_eq!(s.list_subdirs("a").await.unwrap(), vec!["a/b".to_string()]);
        assert_eq!(s.list_dir("a").await.unwrap(), vec![FileInfo { path: "a/x.parquet".into(), size: 1 }]);
        assert_eq!(s.get_opt("missing").await.unwrap(), None);
        s.delete("missing").await.unwrap();
    }

    #[tokio::test]
    async fn local_paths_and_file_urls_agree() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("t");
        let a = Storage::open(p.to_str().unwrap(), &HashMap::new()).unwrap();
        let b = Storage::open(&format!("file://{}", p.display()), &HashMap::new()).unwrap();
        a.put("x/y", Bytes::from_static(b"v")).await.unwrap();
        assert_eq!(b.get("x/y").await.unwrap(), Bytes::from_static(b"v"));
        assert!(p.join("x/y").exists());
    }

    #[tokio::test]
    async fn names_are_stored_as_they_are_once() {
        // The table root and the escaped partition directory are the names on disk: no
        // percent-encoding by object_store (`Z%C3%BCrich`), none twice when read back.
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("Zürich 100%");
        let s = Storage::open(root.to_str().unwrap(), &HashMap::new()).unwrap();
        s.put("city=a%2Fb ü/f.parquet", Bytes::from_static(b"v")).await.unwrap();
        assert!(root.join("city=a%2Fb ü").join("f.parquet").exists());
        let listed = s.list_recursive("").await.unwrap();
        assert_eq!(listed, vec![FileInfo { path: "city=a%2Fb ü/f.parquet".into(), size: 1 }]);
        assert_eq!(s.get(&listed[0].path).await.unwrap(), Bytes::from_static(b"v"));
        assert_eq!(s.list_subdirs("").await.unwrap(), vec!["city=a%2Fb ü".to_string()]);
        // A file:// URI is a URL: `%XX` decoded, so it names the same folder.
        let url =
            Storage::open(&format!("file://{}/Z%C3%BCrich%20100%25", dir.path().display()), &HashMap::new()).unwrap();
        assert_eq!(url.get("city=a%2Fb ü/f.parquet").await.unwrap(), Bytes::from_static(b"v"));
        // A segment no store holds as it is names nothing outside the table.
        assert_eq!(s.path("a/../b").as_ref(), format!("{}/a/%2E%2E/b", s.root));
    }

    #[test]
    fn unknown_schemes_and_options_are_refused() {
        assert!(matches!(Storage::open("gs://b/t", &HashMap::new()), Err(Error::InvalidArgument { .. })));
        let opts = HashMap::from([("colour".to_string(), "blue".to_string())]);
        assert!(matches!(Storage::open("s3://b/t", &opts), Err(Error::InvalidArgument { .. })));
    }
}

/// A Parquet file in a [`Storage`], read with ranged gets (footer first, then the column chunks
/// a reader asks for).
#[derive(Clone, Debug)]
pub struct ParquetFile {
    store: Arc<dyn ObjectStore>,
    path: Path,
    size: u64,
    /// The end of the file, as read with the footer: later reads inside it cost no request (the
    /// whole of a file smaller than [`FOOTER_HINT`]).
    tail: Option<(u64, Bytes)>,
}

/// Bytes read with the footer on the first request: enough for the footer of most files.
const FOOTER_HINT: usize = 64 * 1024;

impl ParquetFile {
    /// A reader of `rel` (table-relative) whose size is known from a listing.
    pub fn open(storage: &Storage, rel: &str, size: u64) -> Self {
        ParquetFile { store: storage.object_store(), path: storage.path(rel), size, tail: None }
    }

    /// `range` from the tail read with the footer, when it lies there.
    fn cached(&self, range: &std::ops::Range<u64>) -> Option<Bytes> {
        let (start, bytes) = self.tail.as_ref()?;
        let end = start + bytes.len() as u64;
        (range.start >= *start && range.end <= end)
            .then(|| bytes.slice((range.start - start) as usize..(range.end - start) as usize))
    }
}

impl parquet::arrow::async_reader::AsyncFileReader for ParquetFile {
    fn get_bytes(
        &mut self,
        range: std::ops::Range<u64>,
    ) -> futures::future::BoxFuture<'_, parquet::errors::Result<Bytes>> {
        Box::pin(async move {
            if let Some(bytes) = self.cached(&range) {
                return Ok(bytes);
            }
            let bytes = self
                .store
                .get_range(&self.path, range.clone())
                .await
                .map_err(|e| parquet::errors::ParquetError::External(Box::new(e)))?;
            if range.end == self.size {
                self.tail = Some((range.start, bytes.clone()));
            }
            Ok(bytes)
        })
    }

    fn get_byte_ranges(
        &mut self,
        ranges: Vec<std::ops::Range<u64>>,
    ) -> futures::future::BoxFuture<'_, parquet::errors::Result<Vec<Bytes>>> {
        Box::pin(async move {
            if let Some(all) = ranges.iter().map(|r| self.cached(r)).collect::<Option<Vec<Bytes>>>() {
                return Ok(all);
            }
            self.store
                .get_ranges(&self.path, &ranges)
                .await
                .map_err(|e| parquet::errors::ParquetError::External(Box::new(e)))
        })
    }

    fn get_metadata<'a>(
        &'a mut self,
        options: Option<&'a parquet::arrow::arrow_reader::ArrowReaderOptions>,
    ) -> futures::future::BoxFuture<'a, parquet::errors::Result<Arc<parquet::file::metadata::ParquetMetaData>>> {
        Box::pin(async move {
            let size = self.size;
            // "PAR1", a footer length and "PAR1": an empty or truncated file is damage, not a
            // store failure (the ranged read of its footer would fail as one).
            if size < 12 {
                let detail = format!("{size} bytes: too small for a Parquet file (at least 12)");
                return Err(parquet::errors::ParquetError::General(detail));
            }
            let mut reader =
                parquet::file::metadata::ParquetMetaDataReader::new().with_prefetch_hint(Some(FOOTER_HINT));
            // The page index only when asked for (point lookups in the metadata table).
            if let Some(options) = options {
                reader = reader
                    .with_column_index_policy(options.column_index_policy())
                    .with_offset_index_policy(options.offset_index_policy())
                    .with_metadata_options(Some(options.metadata_options().clone()));
            }
            let meta = reader.load_and_finish(self, size).await?;
            Ok(Arc::new(meta))
        })
    }
}
