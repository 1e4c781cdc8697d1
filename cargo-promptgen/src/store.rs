//! Reading and writing step outputs in a [`Store`]: every read is checked against the lock,
//! every write replaces a step's folder whole.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

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

fn rename(from: &Path, to: &Path) -> Result<(), Error> {
    std::fs::rename(from, to).map_err(|e| fs::FsError { op: "rename", path: PathBuf::from(from), source: e }.into())
}

/// Makes the folder `dir` hold exactly `files`: writes those whose bytes differ, removes
/// files that are not in `files`, and leaves the rest (and their mtimes) alone. Returns how
/// many files it wrote.
///
/// `dir` is always something rebuilt from the lock and the store when lost (a build's
/// `OUT_DIR`, a step's scratch tree), so files are replaced atomically but not flushed one by
/// one ([`fs::write_atomic_unsynced`]): the flushes cost more than the rest of a build.
pub fn sync_dir(dir: &Path, files: &Files) -> Result<usize, Error> {
    let snapshot = Snapshot::of(dir, false, None)?;
    sync(dir, snapshot, files, None)
}

/// [`sync_dir`] for a folder that nothing else writes (a build's `$OUT_DIR/promptgen`), given
/// each file's SHA-256 as the lock records it (`hashes`, by path).
///
/// It keeps a record, in the file `record` outside `dir`, of each file it leaves in `dir`:
/// its hash, length and modification time. A later call trusts a file whose length and
/// modification time are still the recorded ones, and whose recorded hash is the one wanted,
/// without reading it; every other file is compared byte for byte as [`sync_dir`] does. So a
/// build with nothing to write reads each stored file once (to check it against the lock)
/// and each generated file not at all. A missing or damaged record only makes a call slower.
/// (A file rewritten with the same length that keeps its modification time to the
/// nanosecond would go unnoticed; nothing writes into `OUT_DIR` that way.)
pub fn sync_dir_recorded(
    dir: &Path,
    files: &Files,
    hashes: &HashMap<&str, &str>,
    record: &Path,
) -> Result<usize, Error> {
    sync_dir_from(Snapshot::take(dir, record)?, dir, files, hashes, record)
}

/// [`sync_dir_recorded`] with a [`Snapshot`] of `dir` and `record` taken earlier (while the
/// store was being read, say). Nothing may have written either since.
pub fn sync_dir_from(
    snapshot: Snapshot,
    dir: &Path,
    files: &Files,
    hashes: &HashMap<&str, &str>,
    record: &Path,
) -> Result<usize, Error> {
    sync(dir, snapshot, files, Some((hashes, record)))
}

/// What a folder holds, for [`sync_dir_from`]: each file's length and mtime, the folders,
/// and the record [`sync_dir_recorded`] left.
#[derive(Debug, Default)]
pub struct Snapshot {
    /// Every file (anything but a folder) by relative path, with what its metadata says
    /// (when asked for).
    existing: HashMap<String, Option<Seen>>,
    /// Every folder, by relative path (`""` for the root).
    folders: HashSet<String>,
    /// The text of the record.
    record: String,
}

impl Snapshot {
    /// Looks at `dir` (missing is empty) and reads `record` (missing is empty).
    pub fn take(dir: &Path, record: &Path) -> Result<Snapshot, Error> {
        Snapshot::of(dir, true, Some(record))
    }

    fn of(dir: &Path, with_metadata: bool, record: Option<&Path>) -> Result<Snapshot, Error> {
        let mut snapshot = Snapshot::default();
        // One walk finds what is there and which folders exist, so nothing after it looks a
        // path up twice.
        if dir.is_dir() {
            snapshot.folders.insert(String::new());
            scan(dir, "", with_metadata, &mut snapshot.existing, &mut snapshot.folders)?;
        }
        snapshot.record = record.and_then(|path| std::fs::read_to_string(path).ok()).unwrap_or_default();
        Ok(snapshot)
    }
}

/// The first line of a [`sync_dir_recorded`] record; then one line per file:
/// `<sha256> <length> <mtime seconds> <mtime nanoseconds> <path>`.
const RECORD_HEADER: &str = "# cargo-promptgen: the generated tree as last written (sha256, length, mtime s, mtime ns, path)\n";

/// One line of a record, borrowed from its text.
struct RecordedFile<'a> {
    sha256: &'a str,
    len: u64,
    mtime: SystemTime,
}

fn parse_record(text: &str) -> HashMap<&str, RecordedFile<'_>> {
    let Some(body) = text.strip_prefix(RECORD_HEADER) else { return HashMap::new() };
    body.lines()
        .filter_map(|line| {
            let mut parts = line.splitn(5, ' ');
            let (sha256, len, secs, nanos, path) = (parts.next()?, parts.next()?, parts.next()?, parts.next()?, parts.next()?);
            let mtime = UNIX_EPOCH.checked_add(std::time::Duration::new(secs.parse().ok()?, nanos.parse().ok()?))?;
            Some((path, RecordedFile { sha256, len: len.parse().ok()?, mtime }))
        })
        .collect()
}

/// What the walk saw of a file.
#[derive(Debug)]
struct Seen {
    /// A regular file (not a symlink or anything else).
    is_file: bool,
    len: u64,
    mtime: Option<SystemTime>,
}

impl Seen {
    fn of(meta: &std::fs::Metadata) -> Seen {
        Seen { is_file: meta.is_file(), len: meta.len(), mtime: meta.modified().ok() }
    }
}

fn sync(
    dir: &Path,
    snapshot: Snapshot,
    files: &Files,
    recorded: Option<(&HashMap<&str, &str>, &Path)>,
) -> Result<usize, Error> {
    let Snapshot { existing, mut folders, record: previous_text } = snapshot;
    let mut removed = false;
    for rel in existing.keys().filter(|rel| !files.contains_key(rel.as_str())) {
        let path = dir.join(rel);
        std::fs::remove_file(&path).map_err(|e| fs::FsError { op: "remove", path, source: e })?;
        removed = true;
    }
    let previous = parse_record(&previous_text);
    let trusted = |path: &str, bytes: &[u8]| -> bool {
        let (Some(Some(seen)), Some(hash), Some(before)) =
            (existing.get(path), recorded.and_then(|(hashes, _)| hashes.get(path)), previous.get(path))
        else {
            return false;
        };
        seen.is_file
            && seen.len == bytes.len() as u64
            && before.len == seen.len
            && before.sha256 == *hash
            && seen.mtime == Some(before.mtime)
    };
    // Nothing to do, and the record already says so: the common case of a build.
    if recorded.is_some()
        && !removed
        && previous.len() == files.len()
        && files.iter().all(|(path, bytes)| trusted(path, bytes))
    {
        return Ok(0);
    }
    if !folders.contains("") {
        fs::create_dir_all(dir)?;
        folders.insert(String::new());
    }
    let mut record = String::from(RECORD_HEADER);
    let mut written = 0;
    for (path, bytes) in files {
        let found = existing.get(path.as_str());
        let mut seen = None;
        if !trusted(path, bytes) {
            let target = dir.join(path);
            let wrote = if found.is_some() {
                fs::write_if_changed_unsynced(&target, bytes)?
            } else {
                if let Some((parent, _)) = path.rsplit_once('/')
                    && !folders.contains(parent)
                {
                    fs::create_dir_all(&dir.join(parent))?;
                    let mut folder = parent;
                    while folders.insert(folder.to_string()) {
                        let Some((up, _)) = folder.rsplit_once('/') else { break };
                        folder = up;
                    }
                }
                fs::write_atomic_unsynced(&target, bytes)?;
                true
            };
            written += usize::from(wrote);
            if recorded.is_some() && (wrote || !matches!(found, Some(Some(_)))) {
                seen = std::fs::symlink_metadata(&target).ok().map(|m| Seen::of(&m));
            }
        }
        let seen = seen.as_ref().or(found.and_then(Option::as_ref));
        if let (Some(hash), Some(Seen { len, mtime: Some(mtime), .. })) =
            (recorded.and_then(|(hashes, _)| hashes.get(path.as_str())), seen)
            && let Ok(since) = mtime.duration_since(UNIX_EPOCH)
        {
            use std::fmt::Write as _;
            let _ = writeln!(record, "{hash} {len} {} {} {path}", since.as_secs(), since.subsec_nanos());
        }
    }
    if let Some((_, path)) = recorded {
        fs::write_if_changed_unsynced(path, record.as_bytes())?;
    }
    Ok(written)
}

/// Every file (anything but a folder) under `dir`, by path relative to the walk's root
/// (`prefix` is `dir`'s own; forward slashes), with what its metadata says when
/// `with_metadata`; and every folder.
fn scan(
    dir: &Path,
    prefix: &str,
    with_metadata: bool,
    files: &mut HashMap<String, Option<Seen>>,
    folders: &mut HashSet<String>,
) -> Result<(), Error> {
    let error = |e| fs::FsError { op: "list", path: dir.to_path_buf(), source: e };
    for entry in std::fs::read_dir(dir).map_err(error)? {
        let entry = entry.map_err(error)?;
        let name = entry.file_name();
        let name = name.to_string_lossy();
        let rel = if prefix.is_empty() { name.into_owned() } else { format!("{prefix}/{name}") };
        if entry.file_type().map_err(error)?.is_dir() {
            scan(&entry.path(), &rel, with_metadata, files, folders)?;
            folders.insert(rel);
        } else {
            // On Unix this is an fstatat in the open folder: no second walk down the path.
            let seen = if with_metadata { entry.metadata().ok().map(|m| Seen::of(&m)) } else { None };
            files.insert(rel, seen);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tree(files: &[(&str, &str)]) -> (Files, Vec<(String, String)>) {
        let files: Files = files.iter().map(|(p, t)| (p.to_string(), t.as_bytes().to_vec())).collect();
        let hashes = files.iter().map(|(p, b)| (p.clone(), sha256_hex(b))).collect();
        (files, hashes)
    }

    fn sync(dir: &Path, files: &Files, hashes: &[(String, String)]) -> usize {
        let hashes: HashMap<&str, &str> = hashes.iter().map(|(p, h)| (p.as_str(), h.as_str())).collect();
        sync_dir_recorded(&dir.join("tree"), files, &hashes, &dir.join("tree.record")).unwrap()
    }

    #[test]
    fn a_recorded_sync_writes_what_differs_and_sees_every_change_made_behind_its_back() {
        let dir = tempfile::tempdir().unwrap();
        let (files, hashes) = tree(&[("a.rs", "fn a() {}\n"), ("deep/er/b.rs", "fn b() {}\n")]);
        assert_eq!(sync(dir.path(), &files, &hashes), 2);
        assert_eq!(sync(dir.path(), &files, &hashes), 0, "nothing changed");
        let record = std::fs::read_to_string(dir.path().join("tree.record")).unwrap();
        assert!(record.starts_with(RECORD_HEADER) && record.contains(" deep/er/b.rs\n"), "{record}");

        // Edited in place (same length), removed, and a stranger added: all put right.
        std::thread::sleep(std::time::Duration::from_millis(20));
        std::fs::write(dir.path().join("tree/a.rs"), "fn x() {}\n").unwrap();
        std::fs::remove_file(dir.path().join("tree/deep/er/b.rs")).unwrap();
        std::fs::write(dir.path().join("tree/stray.rs"), "").unwrap();
        assert_eq!(sync(dir.path(), &files, &hashes), 2);
        assert_eq!(std::fs::read_to_string(dir.path().join("tree/a.rs")).unwrap(), "fn a() {}\n");
        assert_eq!(std::fs::read_to_string(dir.path().join("tree/deep/er/b.rs")).unwrap(), "fn b() {}\n");
        assert!(!dir.path().join("tree/stray.rs").exists());
        assert_eq!(sync(dir.path(), &files, &hashes), 0);

        // The lock changed a file: rewritten; a damaged record only costs a comparison.
        let (changed, changed_hashes) = tree(&[("a.rs", "fn a2() {}\n"), ("deep/er/b.rs", "fn b() {}\n")]);
        assert_eq!(sync(dir.path(), &changed, &changed_hashes), 1);
        std::fs::write(dir.path().join("tree.record"), "garbage").unwrap();
        assert_eq!(sync(dir.path(), &changed, &changed_hashes), 0);
        assert_eq!(sync(dir.path(), &changed, &changed_hashes), 0);
        assert_eq!(std::fs::read_to_string(dir.path().join("tree/a.rs")).unwrap(), "fn a2() {}\n");
    }

    #[test]
    fn a_snapshot_taken_before_the_folder_exists_is_an_empty_one() {
        let dir = tempfile::tempdir().unwrap();
        let snapshot = Snapshot::take(&dir.path().join("tree"), &dir.path().join("tree.record")).unwrap();
        let (files, hashes) = tree(&[("a/b.rs", "fn b() {}\n")]);
        let hashes: HashMap<&str, &str> = hashes.iter().map(|(p, h)| (p.as_str(), h.as_str())).collect();
        let written =
            sync_dir_from(snapshot, &dir.path().join("tree"), &files, &hashes, &dir.path().join("tree.record")).unwrap();
        assert_eq!(written, 1);
        assert_eq!(std::fs::read_to_string(dir.path().join("tree/a/b.rs")).unwrap(), "fn b() {}\n");
    }
}
