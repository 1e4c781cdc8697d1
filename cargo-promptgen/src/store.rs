//! Reading and writing step outputs in a [`Store`]: every read is checked against the lock,
//! every write replaces a step's folder whole.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use codegen_core::fs;

use crate::error::Error;
use crate::layout::Store;
use crate::lock::{sha256_hex, Lock, LockedStep};

/// A generated tree or part of one: path (forward slashes) to bytes, in path order.
pub type Files = std::collections::BTreeMap<String, Vec<u8>>;

impl Store {
    /// Step `entry`'s files, each checked against the hash the lock records.
    pub fn load(&self, entry: &LockedStep) -> Result<Files, Error> {
        let dir = self.step_dir(&entry.id);
        let mut files = Files::new();
        for file in &entry.files {
            let path = dir.join(&file.path);
            let bytes = match std::fs::read(&path) {
                Ok(bytes) => bytes,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                    return Err(Error::DamagedStore { path, detail: "the file is missing".into() });
                }
                Err(e) => return Err(fs::FsError { op: "read file", path, source: e }.into()),
            };
            let actual = sha256_hex(&bytes);
            if actual != file.sha256 {
                return Err(Error::DamagedStore {
                    path,
                    detail: "its content changed since it was recorded (edited by hand?)".into(),
                });
            }
            files.insert(file.path.clone(), bytes);
        }
        Ok(files)
    }

    /// Replaces step `id`'s folder with `files` and writes its transcript. The new folder is
    /// written beside the old one and swapped in with renames, so a reader never sees a mix.
    pub fn save(&self, id: &str, files: &Files, transcript: &str) -> Result<(), Error> {
        fs::create_dir_all(&self.root)?;
        let staging = tempfile::Builder::new()
            .prefix(&format!(".{id}.new-"))
            .tempdir_in(&self.root)
            .map_err(|e| fs::FsError { op: "create a staging folder in", path: self.root.clone(), source: e })?;
        for (path, bytes) in files {
            let target = staging.path().join(path);
            if let Some(parent) = target.parent() {
                fs::create_dir_all(parent)?;
            }
            fs::write_atomic(&target, bytes)?;
        }
        let dir = self.step_dir(id);
        let old = self.root.join(format!(".{id}.old-{}", std::process::id()));
        if dir.exists() {
            rename(&dir, &old)?;
        }
        let staged = staging.keep();
        if let Err(e) = rename(&staged, &dir) {
            // Put the old folder back rather than leave the step without one.
            let _ = std::fs::rename(&old, &dir);
            let _ = std::fs::remove_dir_all(&staged);
            return Err(e);
        }
        if old.exists() {
            std::fs::remove_dir_all(&old).map_err(|e| fs::FsError { op: "remove", path: old.clone(), source: e })?;
        }
        fs::write_if_changed(&self.transcript_path(id), transcript.as_bytes())?;
        Ok(())
    }

    /// Copies step `id`'s folder and transcript from `self` into `other`.
    pub fn copy_step(&self, id: &str, files: &Files, other: &Store) -> Result<(), Error> {
        let transcript = std::fs::read_to_string(self.transcript_path(id)).unwrap_or_default();
        other.save(id, files, &transcript)
    }

    /// Files and folders in the store that no step of `lock` owns (ignoring leftovers of
    /// interrupted writes, which start with a dot), as paths relative to the store.
    pub fn unowned(&self, lock: &Lock) -> Vec<String> {
        let Ok(entries) = std::fs::read_dir(&self.root) else { return Vec::new() };
        let mut unowned = BTreeSet::new();
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if name.starts_with('.') {
                continue;
            }
            let step = lock.steps.iter().find(|s| s.id == name || format!("{}.transcript.jsonl", s.id) == name);
            match step {
                None => {
                    unowned.insert(name);
                }
                Some(step) if step.id == name => {
                    let owned: BTreeSet<&str> = step.files.iter().map(|f| f.path.as_str()).collect();
                    for file in walk_files(&entry.path()) {
                        if !owned.contains(file.as_str()) {
                            unowned.insert(format!("{name}/{file}"));
                        }
                    }
                }
                Some(_) => {}
            }
        }
        unowned.into_iter().collect()
    }
}

/// Relative paths (forward slashes) of the files under `dir`, sorted.
pub(crate) fn walk_files(dir: &Path) -> Vec<String> {
    let mut files: Vec<String> = walkdir::WalkDir::new(dir)
        .follow_links(false)
        .into_iter()
        .flatten()
        .filter(|e| !e.file_type().is_dir())
        .filter_map(|e| {
            let rel = e.path().strip_prefix(dir).ok()?;
            let parts: Vec<String> = rel.components().map(|c| c.as_os_str().to_string_lossy().into_owned()).collect();
            Some(parts.join("/"))
        })
        .collect();
    files.sort();
    files
}

fn rename(from: &Path, to: &Path) -> Result<(), Error> {
    std::fs::rename(from, to).map_err(|e| fs::FsError { op: "rename", path: PathBuf::from(from), source: e }.into())
}

/// Makes the folder `dir` hold exactly `files`: writes those whose bytes differ, removes
/// files that are not in `files`, and leaves the rest (and their mtimes) alone. Returns how
/// many files it wrote.
pub fn sync_dir(dir: &Path, files: &Files) -> Result<usize, Error> {
    fs::create_dir_all(dir)?;
    for existing in walk_files(dir) {
        if !files.contains_key(&existing) {
            let path = dir.join(&existing);
            std::fs::remove_file(&path).map_err(|e| fs::FsError { op: "remove", path, source: e })?;
        }
    }
    let mut written = 0;
    for (path, bytes) in files {
        let target = dir.join(path);
        if let Some(parent) = target.parent() {
            fs::create_dir_all(parent)?;
        }
        if fs::write_if_changed(&target, bytes)? {
            written += 1;
        }
    }
    Ok(written)
}
