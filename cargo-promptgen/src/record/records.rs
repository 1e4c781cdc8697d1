//! A package's records as one value: the committed lock and where its files are kept, and
//! the pending lock and store a build left, read once.

use crate::error::Error;
use crate::record::layout::Layout;
use crate::record::lock::Lock;
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
}
