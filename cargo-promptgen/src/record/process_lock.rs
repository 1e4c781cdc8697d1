//! One process at a time per package: builds and the subcommand take turns on a file lock.

use std::fs::File;

use codegen_core::fs::{self, FsError};

use crate::error::Error;
use crate::record::layout::Layout;

/// Held while a process reads or writes a package's lock, store or pending area; released
/// when dropped (and by the OS if the process dies).
#[derive(Debug)]
pub struct ProcessLock {
    _file: File,
}

impl ProcessLock {
    /// Waits until no other process holds the package's lock, then takes it.
    pub fn acquire(layout: &Layout) -> Result<ProcessLock, Error> {
        fs::create_dir_all(&layout.target_area)?;
        let path = layout.process_lock_path();
        let file = File::options()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .map_err(|e| FsError::new("open", &path, e))?;
        match file.try_lock() {
            Ok(()) => {}
            Err(std::fs::TryLockError::WouldBlock) => {
                // As cargo says "Blocking waiting for file lock": a silent wait looks like a hang.
                eprintln!(
                    "promptgen: waiting for another process working on {} (it holds `{}`)",
                    layout.package_name,
                    path.display()
                );
                file.lock().map_err(|e| FsError::new("lock", &path, e))?;
            }
            Err(std::fs::TryLockError::Error(e)) => return Err(FsError::new("lock", &path, e).into()),
        }
        Ok(ProcessLock { _file: file })
    }
}
