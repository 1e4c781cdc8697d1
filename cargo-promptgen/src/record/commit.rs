//! Writing the record: a step's result staged in the store, its entry written to the lock
//! (the lock's rename is the commit point), then the staged files moved into place (see
//! `store.rs`); a pending result moved into the committed record the same way; the steps the
//! manifest no longer declares forgotten; the pending area removed; and what a stopped writer
//! left finished or removed before anything else is written ([`Recorder::open`]).

use std::path::{Path, PathBuf};

use codegen_core::fs;

use crate::config::Chain;
use crate::error::Error;
use crate::files::Files;
use crate::record::layout::Layout;
use crate::record::lock::{Lock, LockedStep};
use crate::record::records::Records;
use crate::record::store::Storage;

/// Where regenerated steps are recorded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Destination {
    /// The committed lock and store (`cargo promptgen`).
    Committed,
    /// The pending area (a build script, which must not write the package).
    Pending,
}

/// The record a run writes, one step at a time: the lock it is writing (the committed one, or
/// the pending one seeded from it) and where that lock's files are kept.
#[derive(Debug)]
pub struct Recorder {
    destination: Destination,
    /// What [`Recorder::open`] found a stopped writer had left, and did about it.
    pub recovered: Vec<String>,
    lock_path: PathBuf,
    store: Storage,
    lock: Lock,
    /// The chain's step ids, in order: the lock keeps its entries in it.
    order: Vec<String>,
}

impl Recorder {
    /// The record of `chain` at `destination`, as `records` found it, after what a stopped
    /// writer left there is finished or removed (see [`recover`]). The caller holds the
    /// process lock.
    pub fn open(
        chain: &Chain,
        layout: &Layout,
        records: &Records,
        destination: Destination,
    ) -> Result<Recorder, Error> {
        let recovered = match destination {
            Destination::Committed => recover(layout.package_dir.as_path(), &records.store, &records.lock)?,
            Destination::Pending => match &records.pending {
                Some(pending) => {
                    recover(&layout.pending_dir(), &Storage::Folder(records.pending_store.clone()), pending)?
                }
                None => Vec::new(),
            },
        };
        let (lock_path, store, lock) = match destination {
            Destination::Committed => (layout.lock_path(), layout.committed()?, records.lock.clone()),
            Destination::Pending => (
                layout.pending_lock_path(),
                Storage::Folder(layout.pending_store()),
                records.pending.clone().unwrap_or_else(|| records.lock.clone()),
            ),
        };
        let order = chain.steps.iter().map(|s| s.id.clone()).collect();
        Ok(Recorder { destination, recovered, lock_path, store, lock, order })
    }

    /// Records a step that ran: its files and transcript are staged, its entry is written to
    /// the lock (the commit point), then the staged files are moved into place. A result the
    /// lock already records, with its files sound where they are kept (the same key and the
    /// same files), changes nothing: the record, and the conversation it names, stay as they
    /// are.
    #[cfg(feature = "online")]
    pub fn record(&mut self, entry: &LockedStep, files: &Files, transcript: &str) -> Result<(), Error> {
        let kept = |recorded: &LockedStep| {
            recorded.key == entry.key && recorded.files == entry.files && self.store.load(recorded).is_ok()
        };
        if self.lock.step(&entry.id).is_some_and(kept) {
            return Ok(());
        }
        self.commit(entry, files, Some(transcript))
    }

    /// Stage, commit, apply: see the module documentation.
    fn commit(&mut self, entry: &LockedStep, files: &Files, transcript: Option<&str>) -> Result<(), Error> {
        let pending = self.store.stage(entry, files, transcript)?;
        let before = self.lock.clone();
        self.lock.upsert(entry.clone(), &self.order);
        if let Err(error) = self.lock.write(&self.lock_path) {
            self.lock = before;
            self.store.discard(pending);
            return Err(error);
        }
        self.store.apply(pending)
    }

    /// Takes a step that did not run as it is recorded (`pending`: in `records`' pending
    /// area, else in the committed record). Into the committed record, a pending result is
    /// recorded as `accept` would record it, its transcript with it; into the pending area, a
    /// committed entry joins the pending lock (written at [`Recorder::finish`], so that the
    /// pending lock stays whole: it is accepted as one). Returns whether a pending result was
    /// recorded.
    pub fn take(&mut self, records: &Records, entry: &LockedStep, files: &Files, pending: bool) -> Result<bool, Error> {
        match (self.destination, pending) {
            (Destination::Pending, false) => {
                self.lock.upsert(entry.clone(), &self.order);
                Ok(false)
            }
            (Destination::Committed, true) => {
                let transcript = Storage::Folder(records.pending_store.clone()).transcript(entry)?;
                self.commit(entry, files, transcript.as_deref())?;
                Ok(true)
            }
            (Destination::Pending, true) | (Destination::Committed, false) => Ok(false),
        }
    }

    /// Ends a run: into the pending area, when a step ran, the pending lock is written without
    /// the steps the manifest no longer declares; into the committed record, when no step
    /// failed, those steps are forgotten (see [`forget_removed_steps`]), whose ids it returns.
    pub fn finish(mut self, chain: &Chain, layout: &Layout, ran: bool, failed: bool) -> Result<Vec<String>, Error> {
        match self.destination {
            Destination::Pending if ran => {
                self.lock.steps.retain(|s| self.order.contains(&s.id));
                self.lock.write(&self.lock_path)?;
                Ok(Vec::new())
            }
            Destination::Committed if !failed => forget_removed_steps(chain, layout, &mut self.lock),
            Destination::Committed | Destination::Pending => Ok(Vec::new()),
        }
    }
}

/// Finishes or removes what a stopped writer left of the record whose lock (`lock`, just
/// read) is in `lock_dir` and whose files are in `store`: a staged step the lock names is
/// moved into place, every other leftover removed, and temporary files beside the lock too.
/// In the cache nothing is staged (objects are written whole under their hash), and its
/// temporary files may be another process's: they are left alone. Returns what it did.
pub fn recover(lock_dir: &Path, store: &Storage, lock: &Lock) -> Result<Vec<String>, Error> {
    let mut done = match store {
        Storage::Folder(store) => store.recover(lock)?,
        Storage::Cache { .. } => Vec::new(),
    };
    for name in fs::read_dir_names(lock_dir).unwrap_or_default() {
        let name = name.to_string_lossy();
        if name.starts_with(".promptgen-tmp-") {
            fs::remove_file(&lock_dir.join(name.as_ref()))?;
            if done.is_empty() {
                done.push(format!("removed a temporary file a stopped run had left in `{}`", lock_dir.display()));
            }
        }
    }
    Ok(done)
}

/// Drops the steps that the manifest no longer declares from `lock` (written back) and
/// their folders and transcripts from the committed store; returns their ids.
pub fn forget_removed_steps(chain: &Chain, layout: &Layout, lock: &mut Lock) -> Result<Vec<String>, Error> {
    let removed: Vec<String> =
        lock.steps.iter().filter(|s| chain.step(&s.id).is_none()).map(|s| s.id.clone()).collect();
    lock.steps.retain(|s| chain.step(&s.id).is_some());
    lock.write(&layout.lock_path())?;
    let store = layout.store();
    for id in &removed {
        fs::remove_dir_all(&store.step_dir(id))?;
        let transcript = store.transcript_path(id);
        if transcript.exists() {
            fs::remove_file(&transcript)?;
        }
    }
    Ok(removed)
}

/// Removes the pending area of the package.
pub fn discard_pending(layout: &Layout) -> Result<(), Error> {
    Ok(fs::remove_dir_all(&layout.pending_dir())?)
}
