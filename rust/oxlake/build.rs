//! Sets `cfg(hudi_corpus)` when Apache Hudi's corpus (`compat/`: tables and timeline files Apache
//! Hudi wrote) is found: `$OXLAKE_SHARED`, else `../shared` beside the repository. The unit tests
//! that read it are ignored without it, each with the reason (`cargo test` counts them).

use std::path::PathBuf;

fn main() {
    println!("cargo::rustc-check-cfg=cfg(hudi_corpus)");
    println!("cargo::rerun-if-env-changed=OXLAKE_SHARED");
    println!("cargo::rerun-if-changed=build.rs");
    let beside = std::env::var_os("CARGO_MANIFEST_DIR").map(|d| PathBuf::from(d).join("../../../shared"));
    let shared = std::env::var_os("OXLAKE_SHARED").filter(|s| !s.is_empty()).map(PathBuf::from).or(beside);
    if shared.is_some_and(|s| s.join("compat").is_dir()) {
        println!("cargo::rustc-cfg=hudi_corpus");
    }
}
