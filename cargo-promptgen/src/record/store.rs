//! Reading and writing step outputs in a [`Store`] (a folder) or the cache, through
//! [`Storage`]: every read is checked against the lock; a write is staged where no reader
//! looks, named by the lock (the commit point), then moved into place.
//!
//! ```text
//! <root>/
//! ├── 01/view.rs                 step 01's files, as the lock names them
//! ├── 01.transcript.jsonl        its conversation
//! └── .01.new-Xr4q/              a write in progress (see [`Store::stage`]):
//!     ├── files/view.rs          the new files, flushed, before the lock names them
//!     └── transcript.jsonl
//! ```
//!
//! A write is three moves: stage the new files (nothing a reader reads changes), write the
//! lock (its rename is the one moment the step changes), apply (swap the staged files in,
//! then remove the old). A kill before the lock's rename leaves the old record whole and a
//! staged folder that the next writer removes; a kill after it leaves a lock that names
//! exactly the staged files, which every reader finds there ([`Store::load`]) and the next
//! writer moves into place ([`Store::recover`]). Nothing is ever read that the lock does not
//! name with its hash.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

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

/// A step's new files (and transcript), staged beside its folder and flushed, waiting for the
/// lock to name them ([`Store::apply`] then moves them into place).
#[derive(Debug)]
#[must_use = "a staged step is applied once the lock names it, or discarded"]
pub struct Staged {
    id: String,
    dir: PathBuf,
    transcript: bool,
}

/// The name of the staged files within a staging folder, and of its transcript.
const STAGED_FILES: &str = "files";
const STAGED_TRANSCRIPT: &str = "transcript.jsonl";

/// What a write left beside a step's folder: `.<id>.new-*` (staged) or `.<id>.old-*` (the
/// folder being replaced); `None` for any other name.
fn leftover_step(name: &str) -> Option<&str> {
    let rest = name.strip_prefix('.')?;
    let (id, _) = rest.split_once(".new-").or_else(|| rest.split_once(".old-"))?;
    crate::config::is_step_id(id).then_some(id)
}

/// Whether `name` is a temporary file of an atomic write that never finished.
fn is_temporary(name: &str) -> bool {
    name.starts_with(".promptgen-tmp-")
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

    /// Step `entry`'s files, each checked against the hash the lock records: from its folder,
    /// or, when a write was stopped between the lock's commit and its apply, from the staged
    /// folder the lock names exactly (see the module documentation).
    pub fn load(&self, entry: &LockedStep) -> Result<Files, Error> {
        let damage = match read_step(&self.step_dir(&entry.id), entry) {
            Ok(files) => return Ok(files),
            Err(damage) => damage,
        };
        for candidate in self.candidates(&entry.id) {
            if let Ok(files) = read_step(&candidate, entry) {
                return Ok(files);
            }
        }
        Err(damage)
    }

    /// The folders a stopped write left for step `id` that may hold a whole result: each
    /// staged folder's files, and each old folder.
    fn candidates(&self, id: &str) -> Vec<PathBuf> {
        let mut found = Vec::new();
        for name in self.leftovers() {
            if leftover_step(&name) != Some(id) {
                continue;
            }
            let dir = self.root.join(&name);
            let files = dir.join(STAGED_FILES);
            found.push(if files.is_dir() { files } else { dir });
        }
        found
    }

    /// Stages step `id`'s `files` and transcript beside its folder, every file and folder
    /// flushed: what readers read is unchanged until the lock names the new files.
    pub fn stage(&self, id: &str, files: &Files, transcript: Option<&str>) -> Result<Staged, Error> {
        fs::create_dir_all(&self.root)?;
        let dir = fs::temp_dir_in(&self.root, &format!(".{id}.new-"))?.keep();
        let staged = Staged { id: id.to_string(), dir: dir.clone(), transcript: transcript.is_some() };
        let written = (|| -> Result<(), Error> {
            let root = dir.join(STAGED_FILES);
            fs::create_dir_all(&root)?;
            let mut folders = BTreeSet::from([root.clone()]);
            for (path, bytes) in files {
                let target = root.join(path);
                if let Some(parent) = target.parent() {
                    fs::create_dir_all(parent)?;
                    folders.insert(parent.to_path_buf());
                }
                fs::write_atomic(&target, bytes)?;
            }
            if let Some(text) = transcript {
                fs::write_atomic(&dir.join(STAGED_TRANSCRIPT), text.as_bytes())?;
            }
            for folder in folders.iter().rev() {
                fs::flush_dir(folder)?;
            }
            fs::flush_dir(&dir)?;
            Ok(fs::flush_dir(&self.root)?)
        })();
        match written {
            Ok(()) => Ok(staged),
            Err(error) => {
                self.discard(staged);
                Err(error)
            }
        }
    }

    /// Moves staged files into place, now that the lock names them: the old folder aside,
    /// the new one in, the transcript over the old one (or the old one removed), then what is
    /// left removed. Stopped anywhere, [`Store::load`] still finds what the lock names, and
    /// [`Store::recover`] finishes it.
    pub fn apply(&self, staged: Staged) -> Result<(), Error> {
        let step = self.step_dir(&staged.id);
        let old = staged.dir.with_file_name(
            staged.dir.file_name().map(|n| n.to_string_lossy().replacen(".new-", ".old-", 1)).unwrap_or_default(),
        );
        if step.exists() {
            fs::rename(&step, &old)?;
        }
        fs::rename(&staged.dir.join(STAGED_FILES), &step)?;
        let transcript = self.transcript_path(&staged.id);
        if staged.transcript {
            fs::rename(&staged.dir.join(STAGED_TRANSCRIPT), &transcript)?;
        } else if transcript.exists() {
            fs::remove_file(&transcript)?;
        }
        fs::flush_dir(&self.root)?;
        if old.exists() {
            fs::remove_dir_all(&old)?;
        }
        fs::remove_dir_all(&staged.dir)?;
        Ok(())
    }

    /// Removes staged files the lock will not name (the lock could not be written).
    pub fn discard(&self, staged: Staged) {
        let _ = std::fs::remove_dir_all(&staged.dir);
    }

    /// Stages and applies at once: for files the lock already names (a switch of stores,
    /// which changes no entry).
    pub fn save(&self, id: &str, files: &Files, transcript: Option<&str>) -> Result<(), Error> {
        let staged = self.stage(id, files, transcript)?;
        self.apply(staged)
    }

    /// Finishes what a stopped write left, as `lock` (just read) says: a step whose folder
    /// does not hold what the lock names gets the leftover folder that does (a staged one
    /// whose lock landed), and its staged transcript when the lock names that; then every
    /// leftover (staged and old folders, temporary files) goes. Only a writer, holding the
    /// process lock, may call it. Returns what it did, in words.
    pub fn recover(&self, lock: &Lock) -> Result<Vec<String>, Error> {
        let mut done = Vec::new();
        let leftovers = self.leftovers();
        if leftovers.is_empty() {
            return Ok(done);
        }
        for entry in &lock.steps {
            if !leftovers.iter().any(|name| leftover_step(name) == Some(entry.id.as_str())) {
                continue;
            }
            let step = self.step_dir(&entry.id);
            if read_step(&step, entry).is_err()
                && let Some(whole) = self.candidates(&entry.id).into_iter().find(|dir| read_step(dir, entry).is_ok())
            {
                if step.exists() {
                    let aside = self.root.join(format!(".{}.old-recovered", entry.id));
                    fs::rename(&step, &aside)?;
                }
                fs::rename(&whole, &step)?;
                done.push(format!("finished recording step {}, which a stopped run had left staged", entry.id));
            }
            if let Some(hash) = &entry.transcript
                && !file_hashes_to(&self.transcript_path(&entry.id), hash)
            {
                let staged = self.leftovers().into_iter().filter(|n| leftover_step(n) == Some(entry.id.as_str()));
                if let Some(text) = staged
                    .map(|name| self.root.join(name).join(STAGED_TRANSCRIPT))
                    .find(|path| file_hashes_to(path, hash))
                {
                    fs::rename(&text, &self.transcript_path(&entry.id))?;
                }
            }
        }
        for name in self.leftovers() {
            let path = self.root.join(&name);
            if path.is_dir() {
                fs::remove_dir_all(&path)?;
            } else {
                fs::remove_file(&path)?;
            }
        }
        for step in &lock.steps {
            for name in fs::read_dir_names(&self.step_dir(&step.id)).unwrap_or_default() {
                let name = name.to_string_lossy();
                if is_temporary(&name) {
                    fs::remove_file(&self.step_dir(&step.id).join(name.as_ref()))?;
                }
            }
        }
        if done.is_empty() {
            done.push(format!("removed what a stopped run had left in `{}`", self.root.display()));
        }
        fs::flush_dir(&self.root)?;
        Ok(done)
    }

    /// What stopped writes left in the store, by name: staged and old folders of steps, and
    /// temporary files (in the store's folder only: a step's folder is only ever renamed in
    /// whole).
    pub fn leftovers(&self) -> Vec<String> {
        let Ok(names) = fs::read_dir_names(&self.root) else { return Vec::new() };
        let mut found: Vec<String> = names
            .into_iter()
            .map(|name| name.to_string_lossy().into_owned())
            .filter(|name| leftover_step(name).is_some() || is_temporary(name))
            .collect();
        found.sort();
        found
    }

    /// Copies step `entry`'s files (as read from `self`) and transcript from `self` into
    /// `other`, for files the lock already names there (see [`Store::save`]).
    pub fn copy_step(&self, entry: &LockedStep, files: &Files, other: &Storage) -> Result<(), Error> {
        let transcript = Storage::Folder(self.clone()).transcript(entry)?;
        other.save(entry, files, transcript.as_deref())
    }

    /// Files and folders in the store that no step of `lock` owns (leftovers of stopped
    /// writes, which start with a dot, are [`Store::leftovers`]), as paths relative to the
    /// store.
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

/// The files of `entry` in folder `dir`, each checked against the hash the lock records.
fn read_step(dir: &Path, entry: &LockedStep) -> Result<Files, Error> {
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

/// Whether the file at `path` exists and its bytes hash to `hash`.
fn file_hashes_to(path: &Path, hash: &str) -> bool {
    std::fs::read(path).is_ok_and(|bytes| sha256_hex(&bytes) == hash)
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

/// What [`Storage::stage`] leaves to do once the lock names it.
#[derive(Debug)]
#[must_use = "a staged step is applied once the lock names it, or discarded"]
pub enum Pending {
    /// Move a folder's staged files into place.
    Folder(Staged),
    /// Nothing: the cache's objects are named by their hashes and are never changed.
    Cache,
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

    /// Writes step `entry`'s `files` (which must hash as `entry` says) and its transcript,
    /// when there is one, where no reader of the current lock looks: a folder's are staged,
    /// the cache's objects written (named by their hashes, they are never changed). Once the
    /// lock names `entry`, [`Storage::apply`] finishes it.
    pub fn stage(&self, entry: &LockedStep, files: &Files, transcript: Option<&str>) -> Result<Pending, Error> {
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
            Storage::Folder(store) => Ok(Pending::Folder(store.stage(&entry.id, files, transcript)?)),
            Storage::Cache { cache, .. } => {
                for file in &entry.files {
                    let bytes = files.get(&file.path).ok_or_else(|| Error::DamagedStore {
                        path: PathBuf::from(&file.path),
                        detail: format!("step {} records it, and its result does not hold it", entry.id),
                    })?;
                    cache.put(&file.sha256, bytes)?;
                }
                if let Some(text) = transcript {
                    cache.put_transcript(&entry.key, text)?;
                }
                Ok(Pending::Cache)
            }
        }
    }

    /// Finishes a write [`Storage::stage`] began, once the lock names it.
    pub fn apply(&self, pending: Pending) -> Result<(), Error> {
        match (self, pending) {
            (Storage::Folder(store), Pending::Folder(staged)) => store.apply(staged),
            _ => Ok(()),
        }
    }

    /// Drops a write [`Storage::stage`] began that the lock will not name.
    pub fn discard(&self, pending: Pending) {
        if let (Storage::Folder(store), Pending::Folder(staged)) = (self, pending) {
            store.discard(staged);
        }
    }

    /// Stages and applies at once: for files the lock already names (a switch of stores, a
    /// copy between them).
    pub fn save(&self, entry: &LockedStep, files: &Files, transcript: Option<&str>) -> Result<(), Error> {
        let pending = self.stage(entry, files, transcript)?;
        self.apply(pending)
    }

    /// The transcript of step `entry`, if one is kept and it is the one the lock records: a
    /// transcript that does not hash to the lock's `transcript` is [`Error::DamagedStore`],
    /// never shown as the conversation that made the files. (An entry recorded before the
    /// lock kept that hash has its transcript as it is.)
    pub fn transcript(&self, entry: &LockedStep) -> Result<Option<String>, Error> {
        let (path, text) = match self {
            Storage::Folder(store) => {
                let path = store.transcript_path(&entry.id);
                let mut text = read_optional(&path)?;
                // A stopped write may have left the recorded transcript staged.
                if let (Some(hash), Some(found)) = (&entry.transcript, &text)
                    && sha256_hex(found.as_bytes()) != *hash
                {
                    let staged = store
                        .candidates(&entry.id)
                        .into_iter()
                        .filter_map(|dir| dir.parent().map(|d| d.join(STAGED_TRANSCRIPT)))
                        .find(|path| file_hashes_to(path, hash));
                    if let Some(staged) = staged {
                        text = Some(fs::read_to_string(&staged)?);
                    }
                }
                (path, text)
            }
            Storage::Cache { cache, .. } => {
                (cache.transcript_path(&entry.key).unwrap_or_default(), cache.transcript(&entry.key)?)
            }
        };
        match (text, &entry.transcript) {
            (Some(text), Some(hash)) if sha256_hex(text.as_bytes()) != *hash => Err(Error::DamagedStore {
                path,
                detail: "it does not hash to the transcript promptgen.lock records for the step: it is not the \
                         conversation that made the recorded files, and was not used"
                    .into(),
            }),
            (text, _) => Ok(text),
        }
    }
}

/// The text of the file at `path`, or `None` when there is none.
fn read_optional(path: &Path) -> Result<Option<String>, Error> {
    match fs::read_to_string(path) {
        Ok(text) => Ok(Some(text)),
        Err(e) if e.source.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e.into()),
    }
}
