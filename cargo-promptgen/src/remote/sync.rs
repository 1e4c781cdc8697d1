//! Moving the files a lock records between the package, the local cache and the remote:
//! `cargo promptgen push`, `pull` and `store --to` (the `cli` feature).
//!
//! All three are idempotent and resumable: each object is checked and moved on its own, and a
//! moved object is whole (an upload is one `PUT`, a download is written under a temporary
//! name and renamed), so running a command again after any failure moves only what is still
//! missing. Hashes are checked on the way out (a local object that does not hash to its name is
//! never uploaded) and on the way in (a downloaded one that does not is never stored). None of
//! them calls a model or writes the lock.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use codegen_core::fs;

use std::path::PathBuf;

use crate::config::{self, Chain, StoreMode};
use crate::error::{Error, MissingFile};
use crate::files::Files;
use crate::hash::{sha256_hex, short};
use crate::record::cache::{Cache, Lookup};
use crate::record::layout::Layout;
use crate::record::lock::{Lock, LockedStep};
use crate::record::store::Storage;
use crate::remote::s3::{Remote, RemoteError};

/// Why `push`, `pull` or `store --to` stopped.
#[derive(Debug, thiserror::Error)]
pub enum SyncError {
    /// The remote failed.
    #[error(transparent)]
    Remote(Box<RemoteError>),
    /// `store --to` cannot set `store` in the manifest by itself.
    #[error("cannot set the store in `{}` by itself: {what}; then run the command again. Nothing was moved.", manifest.display())]
    ManifestEdit {
        /// The manifest.
        manifest: PathBuf,
        /// What to change by hand.
        what: String,
    },
    /// The lock, the store or the local cache failed.
    #[error(transparent)]
    Local(#[from] Error),
}

impl From<RemoteError> for SyncError {
    fn from(error: RemoteError) -> SyncError {
        SyncError::Remote(Box::new(error))
    }
}

impl From<codegen_core::FsError> for SyncError {
    fn from(error: codegen_core::FsError) -> SyncError {
        SyncError::Local(error.into())
    }
}

/// How many transfers run at once.
const PARALLEL: usize = 8;

/// What a `push` or `pull` did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Transfer {
    /// Distinct files (objects) the lock names.
    pub objects: usize,
    /// Objects moved by this call (the others were already there).
    pub moved: usize,
    /// Their bytes.
    pub bytes: u64,
    /// Transcripts moved.
    pub transcripts: usize,
}

/// One object the lock names: its hash, and the first step and path that name it.
fn objects(lock: &Lock) -> Vec<MissingFile> {
    let mut seen = BTreeMap::new();
    for step in &lock.steps {
        for file in &step.files {
            seen.entry(file.sha256.clone()).or_insert_with(|| MissingFile {
                step: step.id.clone(),
                path: file.path.clone(),
                sha256: file.sha256.clone(),
                damaged: false,
            });
        }
    }
    seen.into_values().collect()
}

/// What became of one item of a parallel transfer.
enum Outcome {
    /// Moved, with its size.
    Moved(u64),
    /// Already where it should be.
    Present,
    /// Could not be moved, for a reason that concerns it alone.
    Refused(String),
}

/// Runs `work` on every item, [`PARALLEL`] at a time. The first error stops the others (each
/// finishes the item it is on); refusals are collected and the rest go on.
fn each<T: Sync>(
    items: &[T],
    work: impl Fn(&T) -> Result<Outcome, SyncError> + Sync,
) -> Result<(Transfer, Vec<String>), SyncError> {
    let next = AtomicUsize::new(0);
    let stop = AtomicBool::new(false);
    let results = Mutex::new((Transfer::default(), Vec::new(), None::<SyncError>));
    std::thread::scope(|scope| {
        for _ in 0..PARALLEL.min(items.len()) {
            scope.spawn(|| {
                while !stop.load(Ordering::Relaxed) {
                    let Some(item) = items.get(next.fetch_add(1, Ordering::Relaxed)) else { break };
                    let outcome = work(item);
                    let mut results = results.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
                    match outcome {
                        Ok(Outcome::Moved(bytes)) => {
                            results.0.moved += 1;
                            results.0.bytes += bytes;
                        }
                        Ok(Outcome::Present) => {}
                        Ok(Outcome::Refused(why)) => results.1.push(why),
                        Err(error) => {
                            stop.store(true, Ordering::Relaxed);
                            results.2.get_or_insert(error);
                        }
                    }
                }
            });
        }
    });
    let (transfer, refused, error) = results.into_inner().unwrap_or_else(|poisoned| poisoned.into_inner());
    match error {
        Some(error) => Err(error),
        None => Ok((transfer, refused)),
    }
}

/// Uploads every file `lock` names that the remote lacks, and the transcripts the local cache
/// has for its steps. Every file must be sound in the local cache first: one that is missing
/// or damaged stops the push before any upload ([`Error::NotInCache`]).
pub fn push(lock: &Lock, cache: &Cache, remote: &Remote, package: &str) -> Result<Transfer, SyncError> {
    let wanted = objects(lock);
    let mut sound = Vec::with_capacity(wanted.len());
    let mut unsound = Vec::new();
    for object in wanted {
        match cache.get(&object.sha256)? {
            Lookup::Found(bytes) => sound.push((object.sha256, bytes)),
            Lookup::Missing => unsound.push(object),
            Lookup::Damaged { .. } => unsound.push(MissingFile { damaged: true, ..object }),
        }
    }
    if !unsound.is_empty() {
        return Err(Error::NotInCache {
            package: package.to_string(),
            cache_dir: cache.dir.clone(),
            remote: Some(remote.url().to_string()),
            missing: unsound,
        }
        .into());
    }
    remote.probe()?;
    let (mut transfer, _) = each(&sound, |(sha256, bytes)| {
        let name = format!("sha256/{sha256}");
        // A partial object cannot exist (an upload is one PUT); one of another size is not ours.
        if remote.head(&name)? == Some(bytes.len() as u64) {
            return Ok(Outcome::Present);
        }
        remote.put(&name, bytes)?;
        Ok(Outcome::Moved(bytes.len() as u64))
    })?;
    transfer.objects = sound.len();
    // Only a transcript the lock records the hash of is shared, and only when it has it.
    let mut transcripts = Vec::new();
    for step in &lock.steps {
        if let (Some(hash), Some(text)) = (&step.transcript, cache.transcript(&step.key)?)
            && sha256_hex(text.as_bytes()) == *hash
        {
            transcripts.push((step.key.clone(), text));
        }
    }
    let (moved, _) = each(&transcripts, |(key, text)| {
        let name = format!("transcripts/{key}.jsonl");
        if remote.head(&name)?.is_some() {
            return Ok(Outcome::Present);
        }
        remote.put(&name, text.as_bytes())?;
        Ok(Outcome::Moved(text.len() as u64))
    })?;
    transfer.transcripts = moved.moved;
    Ok(transfer)
}

/// Downloads every file `lock` names that the local cache lacks or holds damaged, checking
/// each against its hash, and the transcripts of their steps when the remote has them. With
/// nothing missing it makes no request. Files the remote lacks or holds damaged are listed in
/// one error after the others are fetched.
pub fn pull(lock: &Lock, cache: &Cache, remote: &Remote, package: &str) -> Result<Transfer, SyncError> {
    let wanted = objects(lock);
    let total = wanted.len();
    let mut needed = Vec::new();
    for object in wanted {
        if !matches!(cache.get(&object.sha256)?, Lookup::Found(_)) {
            needed.push(object);
        }
    }
    if needed.is_empty() {
        return Ok(Transfer { objects: total, ..Transfer::default() });
    }
    remote.probe()?;
    let (mut transfer, refused) = each(&needed, |object| match remote.get_object(&object.sha256) {
        Ok(Some(bytes)) => {
            cache.put(&object.sha256, &bytes)?;
            Ok(Outcome::Moved(bytes.len() as u64))
        }
        Ok(None) => Ok(Outcome::Refused(format!("{}: the remote does not have it", shown(object)))),
        Err(error @ RemoteError::Damaged { .. }) => Ok(Outcome::Refused(format!("{}: {error}", shown(object)))),
        Err(error) => Err(error.into()),
    })?;
    transfer.objects = total;
    // The transcripts of the steps whose files came, when the remote has them.
    let steps: Vec<&LockedStep> = lock
        .steps
        .iter()
        .filter(|step| step.files.iter().any(|f| needed.iter().any(|n| n.sha256 == f.sha256)))
        .collect();
    // Each checked against the hash the lock records, like a file: one that does not have it
    // is refused, and one the lock records no hash of is not fetched (nothing could vouch
    // for it).
    let (moved, refused_transcripts) = each(&steps, |step| {
        let Some(hash) = &step.transcript else { return Ok(Outcome::Present) };
        if cache.transcript(&step.key)?.is_some_and(|text| sha256_hex(text.as_bytes()) == *hash) {
            return Ok(Outcome::Present);
        }
        match remote.get(&format!("transcripts/{}.jsonl", step.key))? {
            Some(bytes) if sha256_hex(&bytes) == *hash => {
                cache.put_transcript(&step.key, &String::from_utf8_lossy(&bytes))?;
                Ok(Outcome::Moved(bytes.len() as u64))
            }
            Some(bytes) => Ok(Outcome::Refused(format!(
                "the transcript of step {} hashes to {}, not to what promptgen.lock records ({}): it was not used",
                step.id,
                short(&sha256_hex(&bytes)),
                short(hash)
            ))),
            None => Ok(Outcome::Present),
        }
    })?;
    transfer.transcripts = moved.moved;
    let refused: Vec<String> = refused.into_iter().chain(refused_transcripts).collect();
    if !refused.is_empty() {
        return Err(RemoteError::Incomplete {
            remote: remote.describe(),
            package: package.to_string(),
            fetched: transfer.moved,
            problems: refused,
        }
        .into());
    }
    Ok(transfer)
}

fn shown(object: &MissingFile) -> String {
    format!("step {}: `{}` (sha256 {})", object.step, object.path, short(&object.sha256))
}

/// What `store --to` did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Switch {
    /// The mode the package was in.
    pub from: StoreMode,
    /// The mode it is in now.
    pub to: StoreMode,
    /// Steps whose files were moved.
    pub steps: usize,
    /// Files written at the destination.
    pub files: usize,
    /// Whether `Cargo.toml` was changed (it already said so otherwise, maybe through the
    /// workspace's table).
    pub manifest_changed: bool,
    /// Files fetched from the remote first.
    pub pulled: usize,
}

/// Moves a package's recorded files to the store `to` (its `promptgen/` folder or the cache)
/// and sets `store` in its `Cargo.toml`, without calling a model and without touching the
/// lock. Every file is read and checked first, from wherever a sound copy is (the folder, the
/// local cache, else the remote when one is given); when some cannot be had, nothing is
/// changed. Then the destination is written, then the manifest, then (to the cache) the
/// package's step folders are removed; an interrupted switch is finished by running it again.
pub fn switch(chain: &Chain, layout: &Layout, to: StoreMode, remote: Option<&Remote>) -> Result<Switch, SyncError> {
    let lock = Lock::read(&layout.lock_path())?;
    let manifest = fs::read_to_string(&chain.manifest_path)?;
    let new_manifest = if chain.store.mode == to {
        None
    } else {
        Some(
            config::with_store(&manifest, to)
                .map_err(|what| SyncError::ManifestEdit { manifest: chain.manifest_path.clone(), what })?,
        )
    };
    let cache = layout.cache()?;
    let folder = layout.store();
    let gather = |entry: &LockedStep| -> Result<Result<Files, Vec<MissingFile>>, Error> {
        match folder.load(entry) {
            Ok(files) => Ok(Ok(files)),
            Err(Error::DamagedStore { .. }) => cache.load(entry),
            Err(other) => Err(other),
        }
    };
    let mut pulled = 0;
    let mut missing: Vec<MissingFile> = Vec::new();
    for entry in &lock.steps {
        if let Err(files) = gather(entry)? {
            missing.extend(files);
        }
    }
    if !missing.is_empty()
        && let Some(remote) = remote
    {
        pulled = pull(&lock, &cache, remote, &chain.package_name)?.moved;
        missing.clear();
    }
    let mut steps = Vec::with_capacity(lock.steps.len());
    for entry in &lock.steps {
        match gather(entry)? {
            Ok(files) => steps.push((entry, files)),
            Err(files) => missing.extend(files),
        }
    }
    if !missing.is_empty() {
        return Err(Error::NotInCache {
            package: chain.package_name.clone(),
            cache_dir: cache.dir.clone(),
            remote: chain.store.cache_url.as_ref().map(ToString::to_string),
            missing,
        }
        .into());
    }
    let in_cache = Storage::Cache {
        cache: cache.clone(),
        package: chain.package_name.clone(),
        remote: chain.store.cache_url.as_ref().map(ToString::to_string),
    };
    let in_folder = Storage::Folder(folder.clone());
    let (source, destination) = match to {
        StoreMode::Cache => (&in_folder, &in_cache),
        StoreMode::Repo => (&in_cache, &in_folder),
    };
    let mut files = 0;
    for (entry, step_files) in &steps {
        let transcript = match source.transcript(entry)? {
            Some(text) => Some(text),
            None => destination.transcript(entry)?,
        };
        destination.save(entry, step_files, transcript.as_deref())?;
        files += step_files.len();
    }
    if let Some(text) = &new_manifest {
        fs::write_atomic(&chain.manifest_path, text.as_bytes())?;
    }
    if to == StoreMode::Cache {
        for entry in &lock.steps {
            fs::remove_dir_all(&folder.step_dir(&entry.id))?;
            let transcript = folder.transcript_path(&entry.id);
            if transcript.exists() {
                fs::remove_file(&transcript)?;
            }
        }
        if folder.root.is_dir() && fs::read_dir_names(&folder.root)?.is_empty() {
            fs::remove_dir_all(&folder.root)?;
        }
    }
    Ok(Switch {
        from: chain.store.mode,
        to,
        steps: steps.len(),
        files,
        manifest_changed: new_manifest.is_some(),
        pulled,
    })
}
