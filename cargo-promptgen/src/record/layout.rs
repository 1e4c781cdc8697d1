//! Where everything lives.
//!
//! ```text
//! <package>/
//! ├── Cargo.toml                 [package.metadata.promptgen]: the chain
//! ├── promptgen.lock             committed: each step's fingerprint, key and file hashes
//! └── promptgen/                 store = "repo" (the default), committed: what each step
//!     ├── 01/view.rs             wrote (not a dot-folder, so `cargo package` and vendoring
//!     ├── 01.transcript.jsonl    keep it), and its conversation without volatile fields
//!     └── ...
//! <cache>/                       store = "cache": the same files by hash, outside the package
//! ├── sha256/ab/ab3f…            (see `crate::record::cache`), and the transcripts by step key
//! └── transcripts/<key>.jsonl
//! <target>/promptgen/
//! ├── <package>.lock             process lock: one process at a time per package
//! ├── pending/<package>/         results a build generated and nobody accepted yet,
//! │   ├── promptgen.lock         laid out like the package (lock + store)
//! │   └── promptgen/...
//! ├── work/<package>/            scratch trees of running steps
//! ├── attempts/<package>/        each step's last failed, interrupted and succeeded attempt,
//! │                              with timings, for `cargo promptgen log` (see `attempts`)
//! ├── check/<package>/<step>/    the tree a step's crate check mounts
//! └── check-target/              Cargo's target folder for crate checks, of every package
//! $OUT_DIR/promptgen/            the generated tree the crate compiles
//! ```

use std::path::{Path, PathBuf};

use crate::config::{Chain, StoreMode, StoreSettings};
use crate::error::Error;
use crate::record::cache::Cache;
use crate::record::lock::LOCK_FILE;
use crate::record::store::{Storage, Store};

/// The store's folder name inside the package.
pub const STORE_DIR: &str = "promptgen";

/// The paths of one package's lock, store and work areas.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layout {
    /// The package's root.
    pub package_dir: PathBuf,
    /// `<target>/promptgen`.
    pub target_area: PathBuf,
    /// The package's name, used to keep packages apart in the target area.
    pub package_name: String,
    /// Where the outputs the lock records are kept, and the cache's folder and remote.
    pub store: StoreSettings,
}

impl Layout {
    /// The layout of `chain`'s package, with cargo's target folder `target_dir`.
    pub fn new(chain: &Chain, target_dir: &Path) -> Layout {
        Layout {
            package_dir: chain.package_dir.clone(),
            target_area: target_dir.join("promptgen"),
            package_name: chain.package_name.clone(),
            store: chain.store.clone(),
        }
    }

    /// The committed lock.
    pub fn lock_path(&self) -> PathBuf {
        self.package_dir.join(LOCK_FILE)
    }

    /// The package's `promptgen/` folder: the committed store with `store = "repo"`.
    pub fn store(&self) -> Store {
        Store { root: self.package_dir.join(STORE_DIR) }
    }

    /// The cache folder.
    pub fn cache(&self) -> Result<Cache, Error> {
        let dir =
            self.store.cache_dir.clone().ok_or_else(|| Error::NoCacheDir { package: self.package_name.clone() })?;
        Ok(Cache::new(dir))
    }

    /// Where the files the lock records are kept: the package's `promptgen/` folder, or the
    /// cache, as `store` says.
    pub fn committed(&self) -> Result<Storage, Error> {
        Ok(match self.store.mode {
            StoreMode::Repo => Storage::Folder(self.store()),
            StoreMode::Cache => Storage::Cache {
                cache: self.cache()?,
                package: self.package_name.clone(),
                remote: self.store.cache_url.as_ref().map(ToString::to_string),
            },
        })
    }

    /// The pending area's root (laid out like a package: lock and store).
    pub fn pending_dir(&self) -> PathBuf {
        self.target_area.join("pending").join(&self.package_name)
    }

    /// The pending lock.
    pub fn pending_lock_path(&self) -> PathBuf {
        self.pending_dir().join(LOCK_FILE)
    }

    /// The pending store.
    pub fn pending_store(&self) -> Store {
        Store { root: self.pending_dir().join(STORE_DIR) }
    }

    /// Cargo's target folder for the crate checks of every package: kept between runs, and
    /// shared, so that dependencies compile once per machine (per target folder).
    pub fn check_target_dir(&self) -> PathBuf {
        self.target_area.join("check-target")
    }

    /// Where step `id`'s check mounts its tree (`PROMPTGEN_TREE`).
    pub fn check_tree_dir(&self, id: &str) -> PathBuf {
        self.target_area.join("check").join(&self.package_name).join(id)
    }

    /// Where `cargo promptgen eval` keeps its runs (of every package: their names begin with
    /// the package's).
    pub fn eval_dir(&self) -> PathBuf {
        self.target_area.join("eval")
    }

    /// Where running steps keep their scratch trees.
    pub fn work_dir(&self) -> PathBuf {
        self.target_area.join("work").join(&self.package_name)
    }

    /// Where each step's last attempts are kept (see [`crate::run::attempts`]).
    pub fn attempts_dir(&self) -> PathBuf {
        self.target_area.join("attempts").join(&self.package_name)
    }

    /// The file that processes lock to take turns on this package (the mutex of
    /// [`crate::record::process_lock`], not `promptgen.lock`).
    pub fn process_lock_path(&self) -> PathBuf {
        self.target_area.join(format!("{}.lock", self.package_name))
    }
}

/// Cargo's target folder, found from a build script's `OUT_DIR`
/// (`<target>/[<triple>/]<profile>/build/<pkg>-<hash>/out`): the nearest ancestor above the
/// profile folder that holds one of the files cargo keeps at the target root
/// (`.rustc_info.json`, `CACHEDIR.TAG`).
pub fn target_dir_from_out_dir(out_dir: &Path) -> Option<PathBuf> {
    out_dir
        .ancestors()
        .skip(4)
        .find(|dir| dir.join(".rustc_info.json").is_file() || dir.join("CACHEDIR.TAG").is_file())
        .map(Path::to_path_buf)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_target_folder_is_the_nearest_root_above_the_profile_folder() {
        let dir = tempfile::tempdir().unwrap();
        let outer = dir.path().join("target");
        let inner = outer.join("nested-target");
        for root in [&outer, &inner] {
            std::fs::create_dir_all(root).unwrap();
            std::fs::write(root.join(".rustc_info.json"), "{}").unwrap();
        }
        let out = inner.join("debug/build/pkg-0123/out");
        assert_eq!(target_dir_from_out_dir(&out), Some(inner.clone()));
        let cross = inner.join("x86_64-unknown-linux-gnu/release/build/pkg-0123/out");
        assert_eq!(target_dir_from_out_dir(&cross), Some(inner));
        assert_eq!(target_dir_from_out_dir(Path::new("/nowhere/debug/build/p/out")), None);
    }
}
