//! Rows a streamed write keeps on local disk: Arrow IPC streams, one file per bucket of a 64-bit
//! hash carried by every row, so that all rows of one key (or one file group) meet in one file.
//! A file larger than a write should hold is split again by other bits of the same hashes.

use std::collections::BTreeSet;
use std::fs::File;
use std::io::{BufReader, BufWriter};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use arrow::array::{Array, ArrayRef, RecordBatch, UInt32Array, UInt64Array};
use arrow::compute::take_record_batch;
use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use arrow::ipc::CompressionType;
use arrow::ipc::reader::StreamReader;
use arrow::ipc::writer::{IpcWriteOptions, StreamWriter};

use crate::error::{Error, Result};

/// Numbers the spills of this process (file names: never one file twice).
static NEXT: AtomicU64 = AtomicU64::new(0);

/// The column holding each spilled row's hash (the last one).
const HASH: &str = "__oxlake_spill_hash";

/// Spill directories' names start with this.
const PREFIX: &str = "oxlake-spill-";
/// A spill directory is made under this name, and renamed to [`PREFIX`] once locked.
const MAKING: &str = ".oxlake-spilling-";
/// A spill directory is renamed to this before it is removed, so that one whose removal stopped
/// midway (its owner file gone first) is still known for what it is.
const REMOVING: &str = ".oxlake-removing-";
/// The file in a spill directory its writer holds locked while it lives.
const OWNER: &str = ".owner";

/// The spill directories of this process, live. None is ever taken for abandoned: where locks
/// belong to the process (`flock` emulated by POSIX locks over NFS), this process's own lock
/// would seem free to it.
static LIVE: Mutex<BTreeSet<PathBuf>> = Mutex::new(BTreeSet::new());

fn live() -> std::sync::MutexGuard<'static, BTreeSet<PathBuf>> {
    LIVE.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// A write's spill directory, removed with the last file that needs it. Its writer holds its
/// owner file locked; a directory whose lock is free was left by a killed process, and the next
/// write spilling beside it removes it (a killed write of 50 GB leaves as much behind).
#[derive(Debug)]
pub(crate) struct SpillDir {
    path: PathBuf,
    /// The owner file, locked (closed before the directory is removed).
    owner: Option<File>,
}

impl SpillDir {
    pub(crate) fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for SpillDir {
    fn drop(&mut self) {
        live().remove(&self.path);
        drop(self.owner.take());
        remove(&self.path);
    }
}

/// A new spill directory under `under` (`TMPDIR` by default), once the spill directories left
/// there by dead processes are gone. It is made under another name and renamed once locked, so
/// that no other write ever sees it unlocked.
pub(crate) fn directory(under: Option<&Path>) -> Result<Arc<SpillDir>> {
    let under = under.map(Path::to_path_buf).unwrap_or_else(std::env::temp_dir);
    remove_abandoned(&under);
    let made = tempfile::Builder::new().prefix(MAKING).tempdir_in(&under).map_err(|e| io(&under, e))?;
    let owner_path = made.path().join(OWNER);
    let owner = File::create_new(&owner_path).map_err(|e| io(&owner_path, e))?;
    // Where the file system has no locks, no other process can take this one's for free either:
    // the directory is then never removed by another (a killed write's stays).
    if let Err(e) = owner.lock() {
        log::warn!("{}: spill directories cannot be locked here ({e})", under.display());
    }
    let made = made.keep();
    let name = made.file_name().and_then(|n| n.to_str()).unwrap_or_default().trim_start_matches(MAKING);
    let path = under.join(format!("{PREFIX}{name}"));
    live().insert(path.clone());
    if let Err(e) = std::fs::rename(&made, &path) {
        live().remove(&path);
        let _ = std::fs::remove_dir_all(&made);
        return Err(io(&path, e));
    }
    Ok(Arc::new(SpillDir { path, owner: Some(owner) }))
}

/// Removes the spill directories under `under` whose owner is gone (their lock is free), and
/// those whose removal stopped midway. One that cannot be read or removed is left as it is:
/// spilling does not depend on it.
fn remove_abandoned(under: &Path) {
    let Ok(entries) = std::fs::read_dir(under) else { return };
    for entry in entries.flatten() {
        let path = entry.path();
        let Some(name) = entry.file_name().to_str().map(str::to_string) else { continue };
        if name.starts_with(REMOVING) && path.is_dir() {
            // Another process may be removing it right now: both get on with it.
            if let Err(e) = std::fs::remove_dir_all(&path) {
                log::debug!("could not remove {}: {e}", path.display());
            }
            continue;
        }
        if !name.starts_with(PREFIX) || !path.is_dir() || live().contains(&path) {
            continue;
        }
        // No owner file: not a directory of this version's (left as it is).
        let Ok(owner) = File::open(path.join(OWNER)) else { continue };
        if owner.try_lock().is_ok() {
            log::info!("removing {}, a spill directory a killed write left", path.display());
            drop(owner);
            remove(&path);
        }
    }
}

/// Removes a spill directory: renamed first, so that a removal stopped midway is finished by
/// the next [`remove_abandoned`].
fn remove(path: &Path) {
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or_default().trim_start_matches(PREFIX);
    let doomed = path.with_file_name(format!("{REMOVING}{name}"));
    let target = match std::fs::rename(path, &doomed) {
        Ok(()) => doomed,
        Err(_) => path.to_path_buf(),
    };
    if let Err(e) = std::fs::remove_dir_all(&target) {
        log::warn!("could not remove the spill directory {}: {e}", target.display());
    }
}

fn io(path: &Path, e: std::io::Error) -> Error {
    let source = object_store::Error::Generic { store: "local spill", source: Box::new(e) };
    Error::storage(path.display(), source)
}

/// How spilled rows are written: compressed by zstd at its fastest level where the spill asks
/// for it ([`Spill::compressed`]: a streamed write's input, about a third as large on disk for
/// the rows of `benches/stream_write.py`, so that a 50 GB write's spills fit beside its table).
/// Spills of hashes and keys across many buckets stay raw: each open bucket would keep a zstd
/// context (up to about half a MB), and hashes do not compress.
fn options(compressed: bool) -> Result<IpcWriteOptions> {
    let options = IpcWriteOptions::default();
    Ok(match compressed {
        true => options.try_with_compression(Some(CompressionType::ZSTD))?.try_with_compression_level(Some(1))?,
        false => options,
    })
}

/// The bytes of a batch's values: a batch read back from an IPC file holds slices of one message
/// buffer, which `RecordBatch::get_array_memory_size` would count once per column.
fn batch_bytes(batch: &RecordBatch) -> usize {
    batch
        .columns()
        .iter()
        .map(|c| c.to_data().get_slice_memory_size().unwrap_or_else(|_| c.get_array_memory_size()))
        .sum()
}

/// Bucket `n` of `buckets` that `hash` falls in at split `level` (each level mixes the hash
/// again, so a file's rows spread over the next level's buckets).
fn bucket(hash: u64, level: u32, buckets: usize) -> usize {
    let mut z = hash ^ u64::from(level).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    ((z ^ (z >> 31)) % buckets as u64) as usize
}

/// Rows being spilled into buckets.
pub(crate) struct Spill {
    dir: Arc<SpillDir>,
    schema: SchemaRef,
    level: u32,
    /// Where the file this spill splits sits ([`SpillFile::address`]); empty at the top.
    parent: Arc<[Step]>,
    buckets: Vec<Bucket>,
    compressed: bool,
}

/// One step of the way from the top of a spill to one of its files: at split `level`, bucket
/// `index` of `buckets`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Step {
    level: u32,
    buckets: usize,
    index: usize,
}

struct Bucket {
    path: PathBuf,
    writer: Option<StreamWriter<BufWriter<File>>>,
    rows: usize,
    bytes: usize,
}

impl Spill {
    /// A spill of rows of `schema` into `buckets` files at split `level`.
    pub(crate) fn new(dir: &Arc<SpillDir>, schema: &SchemaRef, buckets: usize, level: u32) -> Self {
        let mut fields: Vec<Arc<Field>> = schema.fields().iter().cloned().collect();
        fields.push(Arc::new(Field::new(HASH, DataType::UInt64, false)));
        let schema = Arc::new(Schema::new_with_metadata(fields, schema.metadata().clone()));
        Self::with_hashed_schema(dir, schema, buckets, level, Arc::new([]))
    }

    /// This spill's files compressed (see [`options`]).
    pub(crate) fn compressed(mut self) -> Self {
        self.compressed = true;
        self
    }

    fn with_hashed_schema(
        dir: &Arc<SpillDir>,
        schema: SchemaRef,
        buckets: usize,
        level: u32,
        parent: Arc<[Step]>,
    ) -> Self {
        let name = |b: usize| dir.path().join(format!("{}-{level}-{b}.arrows", NEXT.fetch_add(1, Ordering::Relaxed)));
        let buckets = (0..buckets.max(1)).map(|b| Bucket { path: name(b), writer: None, rows: 0, bytes: 0 }).collect();
        Spill { dir: dir.clone(), schema, level, parent, buckets, compressed: false }
    }

    /// Spills the rows of `batch`, each into the bucket of its hash in `hashes`.
    pub(crate) fn push(&mut self, batch: &RecordBatch, hashes: UInt64Array) -> Result<()> {
        let mut columns: Vec<ArrayRef> = batch.columns().to_vec();
        let mut rows: Vec<Vec<u32>> = vec![Vec::new(); self.buckets.len()];
        for (row, hash) in hashes.values().iter().enumerate() {
            rows[bucket(*hash, self.level, self.buckets.len())].push(row as u32);
        }
        columns.push(Arc::new(hashes));
        let hashed = RecordBatch::try_new(self.schema.clone(), columns)?;
        self.push_hashed(&hashed, rows)
    }

    /// Spills the rows of `batch`, each into the bucket `into` names for it (stored as its hash:
    /// all rows of one bucket share it, so such a file is never split).
    pub(crate) fn push_into(&mut self, batch: &RecordBatch, into: &[u32]) -> Result<()> {
        let mut rows: Vec<Vec<u32>> = vec![Vec::new(); self.buckets.len()];
        for (row, &b) in into.iter().enumerate() {
            let bucket = rows.get_mut(b as usize).ok_or_else(|| Error::invalid_data(format!("no spill bucket {b}")))?;
            bucket.push(row as u32);
        }
        let mut columns: Vec<ArrayRef> = batch.columns().to_vec();
        columns.push(Arc::new(UInt64Array::from_iter_values(into.iter().map(|&b| u64::from(b)))));
        let hashed = RecordBatch::try_new(self.schema.clone(), columns)?;
        self.push_hashed(&hashed, rows)
    }

    fn push_hashed(&mut self, hashed: &RecordBatch, rows: Vec<Vec<u32>>) -> Result<()> {
        for (bucket, rows) in self.buckets.iter_mut().zip(rows) {
            if rows.is_empty() {
                continue;
            }
            let part = if rows.len() == hashed.num_rows() {
                hashed.clone()
            } else {
                take_record_batch(hashed, &UInt32Array::from(rows))?
            };
            let writer = match &mut bucket.writer {
                Some(w) => w,
                None => {
                    let file = File::create_new(&bucket.path).map_err(|e| io(&bucket.path, e))?;
                    bucket.writer.insert(StreamWriter::try_new_with_options(
                        BufWriter::new(file),
                        &self.schema,
                        options(self.compressed)?,
                    )?)
                }
            };
            writer.write(&part)?;
            bucket.rows += part.num_rows();
            bucket.bytes += batch_bytes(&part);
        }
        Ok(())
    }

    /// The buckets that got rows, closed.
    pub(crate) fn finish(self) -> Result<Vec<SpillFile>> {
        Ok(self.finish_buckets()?.into_iter().flatten().collect())
    }

    /// Every bucket in order, closed: `None` where it got no rows.
    pub(crate) fn finish_buckets(self) -> Result<Vec<Option<SpillFile>>> {
        let mut files = Vec::new();
        let buckets = self.buckets.len();
        for (index, bucket) in self.buckets.into_iter().enumerate() {
            let Some(mut writer) = bucket.writer else {
                files.push(None);
                continue;
            };
            writer.finish()?;
            files.push(Some(SpillFile {
                path: bucket.path,
                rows: bucket.rows,
                bytes: bucket.bytes,
                level: self.level,
                address: self.parent.iter().copied().chain([Step { level: self.level, buckets, index }]).collect(),
                schema: self.schema.clone(),
                compressed: self.compressed,
                _dir: self.dir.clone(),
            }));
        }
        Ok(files)
    }
}

/// One bucket's rows on disk (until the write's spill directory goes: a retried write reads its
/// spilled input again).
#[derive(Clone, Debug)]
pub(crate) struct SpillFile {
    path: PathBuf,
    /// Rows in the file.
    pub rows: usize,
    /// Their Arrow bytes, as they were spilled.
    pub bytes: usize,
    level: u32,
    /// The buckets its rows' hashes fell in, from the top spill down to this file.
    address: Arc<[Step]>,
    schema: SchemaRef,
    /// Whether it was written compressed (its splits are too).
    compressed: bool,
    _dir: Arc<SpillDir>,
}

impl SpillFile {
    /// Removes the file before its directory goes (a file split into others is not read again).
    pub(crate) fn remove(self) {
        if let Err(e) = std::fs::remove_file(&self.path) {
            log::warn!("could not remove the spill file {}: {e}", self.path.display());
        }
    }

    fn batches(&self) -> Result<StreamReader<BufReader<File>>> {
        let file = File::open(&self.path).map_err(|e| io(&self.path, e))?;
        Ok(StreamReader::try_new(BufReader::new(file), None)?)
    }

    /// The rows, without their hashes.
    pub(crate) fn read(&self) -> Result<Vec<RecordBatch>> {
        let mut out = Vec::new();
        for batch in self.batches()? {
            let mut batch = batch?;
            batch.remove_column(batch.num_columns() - 1);
            out.push(batch);
        }
        Ok(out)
    }

    /// The hash each row was spilled by, in the rows' order.
    pub(crate) fn hashes(&self) -> Result<Vec<u64>> {
        let mut out = Vec::with_capacity(self.rows);
        for batch in self.batches()? {
            let batch = batch?;
            out.extend_from_slice(self.hash_column(&batch)?.values());
        }
        Ok(out)
    }

    fn hash_column<'b>(&self, batch: &'b RecordBatch) -> Result<&'b UInt64Array> {
        batch
            .column(batch.num_columns() - 1)
            .as_any()
            .downcast_ref::<UInt64Array>()
            .ok_or_else(|| Error::invalid_data(format!("spill file {} lacks its hashes", self.path.display())))
    }

    /// The rows, without their hashes, about `limit` Arrow bytes at a time (at least a batch).
    pub(crate) fn chunks(&self, limit: usize) -> Result<impl Iterator<Item = Result<Vec<RecordBatch>>>> {
        let mut batches = self.batches()?;
        Ok(std::iter::from_fn(move || {
            let (mut chunk, mut bytes) = (Vec::new(), 0);
            while bytes < limit {
                match batches.next() {
                    Some(Ok(mut batch)) => {
                        batch.remove_column(batch.num_columns() - 1);
                        bytes += batch_bytes(&batch);
                        chunk.push(batch);
                    }
                    Some(Err(e)) => return Some(Err(e.into())),
                    None => break,
                }
            }
            (!chunk.is_empty()).then_some(Ok(chunk))
        }))
    }

    /// The rows split into about `bytes / limit` files by their hashes, or `None` when they
    /// all share one hash (one key, one file group: they cannot be parted).
    pub(crate) fn split(&self, limit: usize) -> Result<Option<Vec<SpillFile>>> {
        let buckets = (self.bytes / limit.max(1) + 1).clamp(2, 256);
        let mut into =
            Spill::with_hashed_schema(&self._dir, self.schema.clone(), buckets, self.level + 1, self.address.clone());
        into.compressed = self.compressed;
        let mut first: Option<u64> = None;
        let mut one_hash = true;
        for batch in self.batches()? {
            let batch = batch?;
            let hashes = self.hash_column(&batch)?;
            let mut rows: Vec<Vec<u32>> = vec![Vec::new(); buckets];
            for (row, hash) in hashes.values().iter().enumerate() {
                one_hash &= *first.get_or_insert(*hash) == *hash;
                rows[bucket(*hash, into.level, buckets)].push(row as u32);
            }
            into.push_hashed(&batch, rows)?;
        }
        let parts = into.finish()?;
        if one_hash {
            // Copies for nothing: gone at once rather than with the directory.
            parts.into_iter().for_each(SpillFile::remove);
            return Ok(None);
        }
        Ok(Some(parts))
    }
}

/// Which of a set of files of one spill (split or not) a hash would have been spilled into: the
/// other side of a join by the same hashes is sent to the files it meets.
pub(crate) struct Router {
    root: Node,
}

enum Node {
    /// No file of the set holds this bucket.
    None,
    /// The file (its number in the set) holding every hash of this bucket.
    File(usize),
    /// A bucket split again at `level`.
    Split { level: u32, children: Vec<Node> },
}

impl Router {
    /// Routes to `files` (each named by its number, as `route` answers): files of one spill,
    /// none inside another (the leaves of its splits).
    pub(crate) fn new<'f>(files: impl IntoIterator<Item = (&'f SpillFile, usize)>) -> Result<Self> {
        let mut root = Node::None;
        for (file, number) in files {
            let mut node = &mut root;
            for step in file.address.iter() {
                if let Node::None = node {
                    let children = (0..step.buckets).map(|_| Node::None).collect();
                    *node = Node::Split { level: step.level, children };
                }
                node = match node {
                    Node::Split { level, children } if *level == step.level && children.len() == step.buckets => {
                        children
                            .get_mut(step.index)
                            .ok_or_else(|| Error::invalid_data("a spill file's bucket past its split"))?
                    }
                    _ => return Err(Error::invalid_data(format!("spill file {} inside another", file.path.display()))),
                };
            }
            match node {
                Node::None => *node = Node::File(number),
                _ => return Err(Error::invalid_data(format!("spill file {} holds another", file.path.display()))),
            }
        }
        Ok(Router { root })
    }

    /// The number of the file `hash` would be in, if one of the set holds its bucket.
    pub(crate) fn route(&self, hash: u64) -> Option<usize> {
        let mut node = &self.root;
        loop {
            match node {
                Node::None => return None,
                Node::File(number) => return Some(*number),
                Node::Split { level, children } => node = &children[bucket(hash, *level, children.len())],
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::Int64Array;

    fn batch(values: Vec<i64>) -> RecordBatch {
        RecordBatch::try_from_iter(vec![("v", Arc::new(Int64Array::from(values)) as ArrayRef)]).unwrap()
    }

    fn values(files: &[SpillFile]) -> Vec<Vec<i64>> {
        files
            .iter()
            .map(|f| {
                let mut v: Vec<i64> = f
                    .read()
                    .unwrap()
                    .iter()
                    .flat_map(|b| b.column(0).as_any().downcast_ref::<Int64Array>().unwrap().values().to_vec())
                    .collect();
                v.sort();
                v
            })
            .collect()
    }

    #[test]
    fn rows_of_one_hash_meet_in_one_file_at_every_level() {
        let dir = directory(None).unwrap();
        let schema = batch(vec![]).schema();
        let mut spill = Spill::new(&dir, &schema, 4, 0);
        for round in 0..3 {
            let v: Vec<i64> = (0..1000).map(|i| i + round * 1000).collect();
            // Rows i and i + 1000k share a hash: they must land together.
            let hashes = UInt64Array::from(v.iter().map(|i| (*i % 1000) as u64 * 7919).collect::<Vec<_>>());
            spill.push(&batch(v), hashes).unwrap();
        }
        let files = spill.finish().unwrap();
        assert!(files.len() > 1);
        assert_eq!(files.iter().map(|f| f.rows).sum::<usize>(), 3000);
        let check = |files: &[SpillFile], expected: Vec<i64>| {
            let mut all: Vec<i64> = values(files).concat();
            all.sort();
            assert_eq!(all, expected);
            for v in values(files) {
                let mut residues: Vec<i64> = v.iter().map(|i| i % 1000).collect();
                residues.sort();
                residues.dedup();
                assert_eq!(residues.len() * 3, v.len(), "every hash's three rows together");
            }
        };
        check(&files, (0..3000).collect());
        let split = files[0].split(1).unwrap().unwrap();
        assert!(split.len() > 1);
        assert_eq!(split.iter().map(|f| f.rows).sum::<usize>(), files[0].rows);
        check(&split, values(&files[..1]).concat());
    }

    #[test]
    fn spilled_rows_are_compressed_on_disk_and_read_back_as_they_were() {
        let dir = directory(None).unwrap();
        let schema = batch(vec![]).schema();
        let mut spill = Spill::new(&dir, &schema, 1, 0).compressed();
        let v: Vec<i64> = (0..100_000).map(|i| i % 97).collect();
        spill.push(&batch(v.clone()), UInt64Array::from(vec![1; v.len()])).unwrap();
        let files = spill.finish().unwrap();
        let on_disk = std::fs::metadata(&files[0].path).unwrap().len() as usize;
        // 1.6 MB of values and hashes in Arrow, written raw before; zstd took it to 134 KB.
        assert!(on_disk * 8 < files[0].bytes, "{on_disk} bytes on disk for {} in Arrow", files[0].bytes);
        let mut expected = v;
        expected.sort();
        assert_eq!(values(&files), vec![expected]);
    }

    #[test]
    fn chunks_read_back_hold_about_their_limit() {
        // Read back from an IPC file, a batch's columns are slices of one message buffer, which
        // `get_array_memory_size` counts once per column: chunks came out a fraction of their
        // limit (a streamed insert wrote 43 files of 40 MB where it meant 12 of 100 MB). Each
        // batch here is 8,000 bytes of values in two columns, one compressible, one not.
        for compressed in [false, true] {
            let dir = directory(None).unwrap();
            let schema = Arc::new(Schema::new(vec![
                Field::new("a", DataType::Int64, false),
                Field::new("b", DataType::Int64, false),
            ]));
            let mut spill = Spill::new(&dir, &schema, 1, 0);
            if compressed {
                spill = spill.compressed();
            }
            let mut z = 0x1234_5678_u64;
            for b in 0..100 {
                let a = Int64Array::from((0..500).map(|i| i % 7 + b).collect::<Vec<i64>>());
                let noise = Int64Array::from_iter_values((0..500).map(|_| {
                    z ^= z << 13;
                    z ^= z >> 7;
                    z ^= z << 17;
                    z as i64
                }));
                let batch = RecordBatch::try_new(schema.clone(), vec![Arc::new(a), Arc::new(noise)]).unwrap();
                spill.push(&batch, UInt64Array::from(vec![1; 500])).unwrap();
            }
            let files = spill.finish().unwrap();
            let chunks: Vec<Vec<RecordBatch>> = files[0].chunks(80_000).unwrap().map(Result::unwrap).collect();
            assert!(
                (9..=11).contains(&chunks.len()),
                "{} chunks of 80,000 bytes (compressed: {compressed})",
                chunks.len()
            );
            assert_eq!(chunks.iter().flatten().map(RecordBatch::num_rows).sum::<usize>(), 50_000);
        }
    }

    #[test]
    fn a_spill_directory_left_by_a_dead_writer_goes_with_the_next_and_a_live_one_stays() {
        let root = tempfile::tempdir().unwrap();
        let mut live = directory(Some(root.path())).unwrap();
        assert!(live.path().file_name().unwrap().to_str().unwrap().starts_with(PREFIX));
        // Where locks belong to the process (NFS), this process's own lock seems free to it: a
        // live directory of its own is never taken for abandoned.
        drop(Arc::get_mut(&mut live).unwrap().owner.take());
        // A removal that stopped midway (its owner file gone already).
        let stopped = root.path().join(format!("{REMOVING}stopped"));
        std::fs::create_dir(&stopped).unwrap();
        std::fs::write(stopped.join("1-0-1.arrows"), b"rows").unwrap();
        // What a killed writer leaves: its owner file, no longer locked, and its spill.
        let dead = root.path().join(format!("{PREFIX}dead"));
        std::fs::create_dir(&dead).unwrap();
        std::fs::write(dead.join(OWNER), b"").unwrap();
        std::fs::write(dead.join("0-0-0.arrows"), b"rows").unwrap();
        // Not a spill directory of this version's (no owner file): left alone.
        let foreign = root.path().join(format!("{PREFIX}foreign"));
        std::fs::create_dir(&foreign).unwrap();
        let next = directory(Some(root.path())).unwrap();
        assert!(!dead.exists() && !stopped.exists());
        assert!(live.path().exists() && foreign.exists() && next.path().exists());
        let mut left: Vec<PathBuf> = std::fs::read_dir(root.path()).unwrap().map(|e| e.unwrap().path()).collect();
        left.sort();
        let mut expected = vec![live.path().to_path_buf(), next.path().to_path_buf(), foreign.clone()];
        expected.sort();
        assert_eq!(left, expected);
        let (a, b) = (live.path().to_path_buf(), next.path().to_path_buf());
        drop((live, next));
        assert!(!a.exists() && !b.exists());
    }

    #[test]
    fn a_router_sends_each_hash_to_the_leaf_holding_it() {
        let dir = directory(None).unwrap();
        let schema = batch(vec![]).schema();
        let mut spill = Spill::new(&dir, &schema, 4, 0);
        // Hashes of values 0..4000 but those of bucket 3 at the top: that bucket gets no file.
        let hash = |v: i64| (v as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        let input: Vec<i64> = (0..4000).filter(|v| bucket(hash(*v), 0, 4) != 3).collect();
        spill.push(&batch(input.clone()), UInt64Array::from_iter_values(input.iter().map(|v| hash(*v)))).unwrap();
        let mut leaves = spill.finish().unwrap();
        assert_eq!(leaves.len(), 3);
        // One file split, one of its parts split again: leaves at three levels.
        let parts = leaves.remove(0).split(1).unwrap().unwrap();
        let mut parts = parts.into_iter();
        let again = parts.next().unwrap().split(1).unwrap().unwrap();
        leaves.extend(parts.chain(again));
        let router = Router::new(leaves.iter().enumerate().map(|(n, f)| (f, n))).unwrap();
        for (n, leaf) in leaves.iter().enumerate() {
            for v in values(std::slice::from_ref(leaf)).concat() {
                assert_eq!(router.route(hash(v)), Some(n), "value {v}");
            }
        }
        let missing = (4000..).find(|v| bucket(hash(*v), 0, 4) == 3).unwrap();
        assert_eq!(router.route(hash(missing)), None, "a bucket no file holds");
        // A file and a part of it are not leaves of one spill.
        let split = leaves[0].split(1).unwrap().unwrap();
        assert!(Router::new([(&leaves[0], 0), (&split[0], 1)]).is_err());
        assert!(Router::new([(&split[0], 1), (&leaves[0], 0)]).is_err());
        // Hashes are read back in the rows' order.
        let in_order: Vec<u64> = leaves[1]
            .read()
            .unwrap()
            .iter()
            .flat_map(|b| b.column(0).as_any().downcast_ref::<Int64Array>().unwrap().values().to_vec())
            .map(hash)
            .collect();
        assert_eq!(leaves[1].hashes().unwrap(), in_order);
    }

    #[test]
    fn rows_pushed_into_named_buckets_stay_there() {
        let dir = directory(None).unwrap();
        let schema = batch(vec![]).schema();
        let mut spill = Spill::new(&dir, &schema, 3, 0);
        spill.push_into(&batch(vec![10, 11, 12, 13]), &[2, 0, 2, 0]).unwrap();
        assert!(spill.push_into(&batch(vec![1]), &[3]).is_err(), "no bucket 3");
        let files = spill.finish_buckets().unwrap();
        assert!(files[1].is_none());
        let got: Vec<Vec<i64>> = files.iter().flatten().map(|f| values(std::slice::from_ref(f)).concat()).collect();
        assert_eq!(got, vec![vec![11, 13], vec![10, 12]]);
    }

    #[test]
    fn rows_sharing_one_hash_cannot_be_split() {
        let dir = directory(None).unwrap();
        let schema = batch(vec![]).schema();
        let mut spill = Spill::new(&dir, &schema, 8, 0);
        spill.push(&batch((0..100).collect()), UInt64Array::from(vec![42; 100])).unwrap();
        let files = spill.finish().unwrap();
        assert_eq!(files.len(), 1);
        assert!(files[0].split(1).unwrap().is_none());
        let on_disk = |dir: &SpillDir| std::fs::read_dir(dir.path()).unwrap().count();
        assert_eq!(on_disk(&dir), 2, "the owner file and the one file: the split's copy is gone");
        files[0].clone().remove();
        assert_eq!(on_disk(&dir), 1);
    }
}
