//! Reading and writing step outputs in a [`Store`] (a folder) or the cache, through
//! [`Storage`]: every read is checked against the lock, every write replaces a step's folder
//! whole (or adds objects that are never changed).

use std::collections::BTreeSet;
use std::path::PathBuf;

use codegen_core::fs;

use crate::error::Error;
use crate::files::{Files, walk_files};
use crate::hash::sha256_hex;
use crate::record::cache::Cache;
use crate::record::lock::{Lock, LockedStep};

/// A folder of step outputs: `<root>/<id>/<files>` and `<root>/<id>.transcript.jsonl`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Store {
    /// The folder.
    pub root: PathBuf,
}

impl Store {
    /// The folder of step `id`'s files.
    pub fn step_dir(&self, id: &str) -> PathBuf {
        self.root.join(id)
    }

    /// The transcript of step `id`.
    pub fn transcript_path(&self, id: &str) -> PathBuf {
        self.root.join(format!("{id}.transcript.jsonl"))
    }
}

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

    /// Replaces step `id`'s folder with `files` and writes its transcript (when given). The
    /// new folder is written beside the old one and swapped in with renames, so a reader never
    /// sees a mix.
    pub fn save(&self, id: &str, files: &Files, transcript: Option<&str>) -> Result<(), Error> {
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
        if let Some(transcript) = transcript {
            fs::write_if_changed(&self.transcript_path(id), transcript.as_bytes())?;
        }
        Ok(())
    }

    /// Copies step `entry`'s files (as read from `self`) and transcript from `self` into `other`.
    pub fn copy_step(&self, entry: &LockedStep, files: &Files, other: &Storage) -> Result<(), Error> {
        let transcript = Storage::Folder(self.clone()).transcript(entry)?;
        other.save(entry, files, transcript.as_deref())
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

/// Where the files a lock records are kept: a folder laid out as a [`Store`] (the package's
/// `promptgen/` with `store = "repo"`, and the pending area in both modes), or the
/// content-addressed [`Cache`] (`store = "cache"`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Storage {
    /// A folder: `<root>/<id>/<files>` and `<root>/<id>.transcript.jsonl`.
    Folder(Store),
    /// The cache folder, as one package uses it.
    Cache {
        /// The cache.
        cache: Cache,
        /// The package, for messages.
        package: String,
        /// Its remote (`cache_url`), for messages.
        remote: Option<String>,
    },
}

impl Storage {
    /// Step `entry`'s files, each checked against the hash the lock records. A folder's
    /// missing or changed file is [`Error::DamagedStore`]; the cache's are listed, all of the
    /// step's at once, in [`Error::NotInCache`].
    pub fn load(&self, entry: &LockedStep) -> Result<Files, Error> {
        match self {
            Storage::Folder(store) => store.load(entry),
            Storage::Cache { cache, package, remote } => cache.load(entry)?.map_err(|missing| Error::NotInCache {
                package: package.clone(),
                cache_dir: cache.dir.clone(),
                remote: remote.clone(),
                missing,
            }),
        }
    }

    /// Records step `entry`'s `files` (which must hash as `entry` says) and its transcript,
    /// when there is one.
    pub fn save(&self, entry: &LockedStep, files: &Files, transcript: Option<&str>) -> Result<(), Error> {
        // The sandbox refuses these at write time; the record refuses them whatever wrote them
        // (a script, a hand edit of a pending result).
        for (path, bytes) in files {
            if path.ends_with(".rs")
                && let Some(read) =
                    codegen_core::sandbox::forbidden_compile_time_read(path, &String::from_utf8_lossy(bytes))
            {
                return Err(Error::CompileTimeRead {
                    id: entry.id.clone(),
                    path: path.clone(),
                    detail: read.to_string(),
                });
            }
        }
        match self {
            Storage::Folder(store) => store.save(&entry.id, files, transcript),
            Storage::Cache { cache, .. } => {
                for file in &entry.files {
                    let bytes = files.get(&file.path).ok_or_else(|| Error::DamagedStore {
                        path: PathBuf::from(&file.path),
                        detail: format!("step {} records it, and its result does not hold it", entry.id),
                    })?;
                    cache.put(&file.sha256, bytes)?;
                }
                match transcript {
                    Some(text) => cache.put_transcript(&entry.key, text),
                    None => Ok(()),
                }
            }
        }
    }

    /// The transcript of step `entry`, if it is kept.
    pub fn transcript(&self, entry: &LockedStep) -> Result<Option<String>, Error> {
        match self {
            Storage::Folder(store) => match fs::read_to_string(&store.transcript_path(&entry.id)) {
                Ok(text) => Ok(Some(text)),
                Err(e) if e.source.kind() == std::io::ErrorKind::NotFound => Ok(None),
                Err(e) => Err(e.into()),
            },
            Storage::Cache { cache, .. } => cache.transcript(&entry.key),
        }
    }
}
