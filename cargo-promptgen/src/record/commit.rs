//! Writing the record: a step's result into the store and then its entry into the lock (the
//! lock is the commit point: a file it names is stored before the lock names it), a pending
//! result moved into the committed record, the steps the manifest no longer declares
//! forgotten, and the pending area removed.

use std::path::PathBuf;

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
    lock_path: PathBuf,
    store: Storage,
    lock: Lock,
    /// The chain's step ids, in order: the lock keeps its entries in it.
    order: Vec<String>,
}

impl Recorder {
    /// The record of `chain` at `destination`, as `records` found it.
    pub fn open(
        chain: &Chain,
        layout: &Layout,
        records: &Records,
        destination: Destination,
    ) -> Result<Recorder, Error> {
        let (lock_path, store, lock) = match destination {
            Destination::Committed => (layout.lock_path(), layout.committed()?, records.lock.clone()),
            Destination::Pending => (
                layout.pending_lock_path(),
                Storage::Folder(layout.pending_store()),
                records.pending.clone().unwrap_or_else(|| records.lock.clone()),
            ),
        };
        let order = chain.steps.iter().map(|s| s.id.clone()).collect();
        Ok(Recorder { destination, lock_path, store, lock, order })
    }

    /// Records a step that ran: its files and transcript are stored, then its entry is
    /// written to the lock.
    #[cfg(feature = "online")]
    pub fn record(&mut self, entry: &LockedStep, files: &Files, transcript: &str) -> Result<(), Error> {
        self.store.save(entry, files, Some(transcript))?;
        self.lock.upsert(entry.clone(), &self.order);
        self.lock.write(&self.lock_path)
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
                records.pending_store.copy_step(entry, files, &self.store)?;
                self.lock.upsert(entry.clone(), &self.order);
                self.lock.write(&self.lock_path)?;
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
