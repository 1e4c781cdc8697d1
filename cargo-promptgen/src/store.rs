//! Reading and writing step outputs in a [`Store`]: every read is checked against the lock,
//! every write replaces a step's folder whole.

use std::collections::BTreeSet;
use std::path::Path;

use codegen_core::__private::fs;

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
        // One buffer for the step, read into without asking each file's size first: stored
        // files are small, and a `statx` per file is a sixth of the cost of reading it.
        let mut buffer = Vec::with_capacity(64 * 1024);
        for file in &entry.files {
            let path = dir.join(&file.path);
            let read = std::fs::File::open(&path).and_then(|file| {
                buffer.clear();
                // Through `take`, `read_to_end` does not ask the file for its size first.
                std::io::Read::read_to_end(&mut std::io::Read::take(file, u64::MAX), &mut buffer)
            });
            let bytes = match read {
                Ok(_) => buffer.clone(),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                    return Err(Error::DamagedStore { path, detail: "the file is missing".into() });
                }
                Err(e) => return Err(fs::FsError::new("read file", &path, e).into()),
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
        let staging = fs::temp_dir_in(&self.root, &format!(".{id}.new-"))?;
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
            fs::rename(&dir, &old)?;
        }
        let staged = staging.keep();
        if let Err(e) = fs::rename(&staged, &dir) {
            // Put the old folder back rather than leave the step without one.
            let _ = std::fs::rename(&old, &dir);
            let _ = std::fs::remove_dir_all(&staged);
            return Err(e.into());
        }
        fs::remove_dir_all(&old)?;
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
        // Each step owns its folder and its transcript; looked up by name, not by a scan of
        // the lock per entry (500 steps would make that 500 x 1000 comparisons).
        let mut owners: std::collections::HashMap<String, &LockedStep> = std::collections::HashMap::new();
        for step in &lock.steps {
            owners.insert(format!("{}.transcript.jsonl", step.id), step);
            owners.insert(step.id.clone(), step);
        }
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if name.starts_with('.') {
                continue;
            }
            match owners.get(&name).copied() {
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
