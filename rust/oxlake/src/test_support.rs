//! Test helpers: the shared compatibility corpus of tables Apache Hudi wrote.

use std::io::Read;
use std::path::PathBuf;

/// The shared folder: `$OXLAKE_SHARED`, else `../shared` beside the project, else `/work/shared`.
pub(crate) fn shared_dir() -> PathBuf {
    let beside = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared");
    std::env::var("OXLAKE_SHARED")
        .map(PathBuf::from)
        .into_iter()
        .chain([beside, "/work/shared".into()])
        .find(|p| p.join("compat").is_dir())
        .expect("the shared folder with compat/")
}

/// One file of a zipped corpus table: `zip` relative to `compat/hudi`, `path` inside the table.
pub(crate) fn corpus_file(zip: &str, path: &str) -> Vec<u8> {
    let zip_path = shared_dir().join("compat/hudi").join(zip);
    let table = zip_path.file_stem().expect("a zip name").to_string_lossy().into_owned();
    let mut archive = zip::ZipArchive::new(std::fs::File::open(&zip_path).expect("corpus zip")).expect("a zip");
    let mut entry = archive.by_name(&format!("{table}/{path}")).expect("the file in the zip");
    let mut out = Vec::new();
    entry.read_to_end(&mut out).expect("readable");
    out
}
