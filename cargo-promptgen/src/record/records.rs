//! A package's records as one value: the committed lock and where its files are kept, and
//! the pending lock and store a build left, read once.

use crate::error::Error;
use crate::files::Files;
use crate::record::layout::Layout;
use crate::record::lock::{Lock, LockedStep};
use crate::record::store::{Storage, Store};

/// The committed and pending records of a package, read once.
#[derive(Debug, Clone)]
pub struct Records {
    /// The committed lock.
    pub lock: Lock,
    /// Where the committed lock's files are kept.
    pub store: Storage,
    /// The pending lock, when a build left one.
    pub pending: Option<Lock>,
    /// The pending store.
    pub pending_store: Store,
}

impl Records {
    /// Reads the lock and the pending lock of `layout`.
    pub fn read(layout: &Layout) -> Result<Records, Error> {
        let pending_path = layout.pending_lock_path();
        Ok(Records {
            lock: Lock::read(&layout.lock_path())?,
            store: layout.committed()?,
            pending: if pending_path.exists() { Some(Lock::read(&pending_path)?) } else { None },
            pending_store: layout.pending_store(),
        })
    }

    /// Step `id`'s recorded result whose files read whole and hash as its lock says: the
    /// pending one, else the committed one (as a build uses them); with where it was read from.
    pub fn recorded_step(&self, id: &str) -> Option<(&LockedStep, Storage, Files)> {
        let pending = self
            .pending
            .as_ref()
            .and_then(|lock| lock.step(id))
            .map(|entry| (entry, Storage::Folder(self.pending_store.clone())));
        let committed = self.lock.step(id).map(|entry| (entry, self.store.clone()));
        [pending, committed]
            .into_iter()
            .flatten()
            .find_map(|(entry, storage)| storage.load(entry).ok().map(|files| (entry, storage, files)))
    }
}
