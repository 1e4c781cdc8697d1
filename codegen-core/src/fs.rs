//! Every file operation goes through here, so every error names its path: this crate's, and
//! cargo-promptgen's. Writes are atomic (a temporary file in the same folder, renamed over
//! the target), and `write_if_changed` leaves a file whose bytes are already right alone, so
//! its modification time stays put.

use std::io::{self, Write};
use std::path::{Path, PathBuf};

/// A failed file operation: what was attempted, on which path, and why.
#[derive(Debug, thiserror::Error)]
#[error("failed to {op} `{}`", path.display())]
pub struct FsError {
    /// What was attempted, e.g. "read file".
    pub op: &'static str,
    /// The path it was attempted on.
    pub path: PathBuf,
    /// The operating system's reason.
    #[source]
    pub source: io::Error,
}

impl FsError {
    /// The error of operation `op` on `path`, for the few operations this module does not
    /// wrap (a file lock, a walk).
    pub fn new(op: &'static str, path: &Path, source: io::Error) -> FsError {
        FsError { op, path: path.to_owned(), source }
    }
}

/// Reads a whole file.
pub fn read(path: &Path) -> Result<Vec<u8>, FsError> {
    std::fs::read(path).map_err(|e| FsError::new("read file", path, e))
}

/// Reads a whole UTF-8 file.
pub fn read_to_string(path: &Path) -> Result<String, FsError> {
    std::fs::read_to_string(path).map_err(|e| FsError::new("read file", path, e))
}

/// Creates a folder and its parents.
pub fn create_dir_all(path: &Path) -> Result<(), FsError> {
    std::fs::create_dir_all(path).map_err(|e| FsError::new("create folder", path, e))
}

/// Renames `from` to `to` (atomically, within one file system).
pub fn rename(from: &Path, to: &Path) -> Result<(), FsError> {
    std::fs::rename(from, to).map_err(|e| FsError::new("rename", from, e))
}

/// Removes a file, or a symlink without following it.
pub fn remove_file(path: &Path) -> Result<(), FsError> {
    std::fs::remove_file(path).map_err(|e| FsError::new("remove", path, e))
}

/// Removes a folder and everything in it; a folder that is already gone is not an error.
pub fn remove_dir_all(path: &Path) -> Result<(), FsError> {
    match std::fs::remove_dir_all(path) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(FsError::new("remove", path, e)),
        _ => Ok(()),
    }
}

/// A new, uniquely named folder in `dir` whose name starts with `prefix`, removed when the
/// returned handle is dropped.
pub fn temp_dir_in(dir: &Path, prefix: &str) -> Result<tempfile::TempDir, FsError> {
    tempfile::Builder::new().prefix(prefix).tempdir_in(dir).map_err(|e| FsError::new("create a folder in", dir, e))
}

/// Metadata of `path` itself (a symlink is not followed).
pub fn symlink_metadata(path: &Path) -> Result<std::fs::Metadata, FsError> {
    std::fs::symlink_metadata(path).map_err(|e| FsError::new("inspect", path, e))
}

/// Metadata of what `path` leads to (a symlink is followed).
pub fn metadata(path: &Path) -> Result<std::fs::Metadata, FsError> {
    std::fs::metadata(path).map_err(|e| FsError::new("inspect", path, e))
}

/// The names in the folder `path`, sorted.
pub fn read_dir_names(path: &Path) -> Result<Vec<std::ffi::OsString>, FsError> {
    let names = std::fs::read_dir(path).and_then(|entries| entries.map(|e| e.map(|e| e.file_name())).collect());
    let mut names: Vec<std::ffi::OsString> = names.map_err(|e| FsError::new("list folder", path, e))?;
    names.sort();
    Ok(names)
}

/// The absolute path with every symlink resolved.
pub fn canonicalize(path: &Path) -> Result<PathBuf, FsError> {
    std::fs::canonicalize(path).map_err(|e| FsError::new("resolve", path, e))
}

/// Writes `bytes` to `path` atomically: a temporary file in the same folder, flushed, then
/// renamed over the target, so a reader sees the old content or the new, never a mix. A file
/// whose bytes are already `bytes` is left alone (its mtime too). Returns whether it wrote.
///
/// The rename replaces a symlink at `path` rather than writing through it.
pub fn write_if_changed(path: &Path, bytes: &[u8]) -> Result<bool, FsError> {
    if is_same_file_content(path, bytes)? {
        return Ok(false);
    }
    write_atomic(path, bytes)?;
    Ok(true)
}

/// [`write_if_changed`] without waiting for the disk: see [`write_atomic_unsynced`].
pub fn write_if_changed_unsynced(path: &Path, bytes: &[u8]) -> Result<bool, FsError> {
    if is_same_file_content(path, bytes)? {
        return Ok(false);
    }
    write_atomic_unsynced(path, bytes)?;
    Ok(true)
}

/// Whether `path` is a regular file holding exactly `bytes`.
fn is_same_file_content(path: &Path, bytes: &[u8]) -> Result<bool, FsError> {
    Ok(match std::fs::symlink_metadata(path) {
        Ok(meta) => meta.is_file() && meta.len() == bytes.len() as u64 && read(path)? == bytes,
        Err(_) => false,
    })
}

/// Writes `bytes` to `path` through a temporary file and a rename (see [`write_if_changed`]).
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<(), FsError> {
    write_through_temporary(path, bytes, true)
}

/// Like [`write_atomic`] (a reader still sees the old content or the new, never a mix), but
/// leaves flushing to the operating system: for files rebuilt from durable ones whenever
/// they are lost or wrong, such as a build's `OUT_DIR`, where a flush per file would cost
/// more than everything else the build does (the lock and the store keep the flush).
pub fn write_atomic_unsynced(path: &Path, bytes: &[u8]) -> Result<(), FsError> {
    write_through_temporary(path, bytes, false)
}

fn write_through_temporary(path: &Path, bytes: &[u8], flush: bool) -> Result<(), FsError> {
    let dir = match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir,
        _ => Path::new("."),
    };
    let mut tmp = tempfile::Builder::new()
        .prefix(".promptgen-tmp-")
        .tempfile_in(dir)
        .map_err(|e| FsError::new("create a temporary file in", dir, e))?;
    tmp.write_all(bytes).map_err(|e| FsError::new("write", tmp.path(), e))?;
    // A temporary file is private (0600); the file it replaces should keep its own mode, and
    // a new one get the ordinary 0644, as if written in place.
    let permissions = match std::fs::metadata(path) {
        Ok(meta) if meta.is_file() => Some(meta.permissions()),
        _ => default_permissions(),
    };
    if let Some(permissions) = permissions {
        tmp.as_file()
            .set_permissions(permissions)
            .map_err(|e| FsError::new("set the permissions of", tmp.path(), e))?;
    }
    if flush {
        tmp.as_file().sync_all().map_err(|e| FsError::new("flush", tmp.path(), e))?;
    }
    tmp.persist(path).map_err(|e| FsError::new("replace", path, e.error))?;
    if flush {
        // The rename itself must reach the disk before what it replaced is let go.
        flush_dir(dir)?;
    }
    Ok(())
}

/// Flushes folder `path`'s entries to the disk: the names made, renamed or removed in it
/// (a file's own flush does not cover its name). Nothing to do where folders cannot be
/// opened (Windows).
pub fn flush_dir(path: &Path) -> Result<(), FsError> {
    #[cfg(unix)]
    std::fs::File::open(path).and_then(|dir| dir.sync_all()).map_err(|e| FsError::new("flush the folder", path, e))?;
    #[cfg(not(unix))]
    let _ = path;
    Ok(())
}

#[cfg(unix)]
fn default_permissions() -> Option<std::fs::Permissions> {
    use std::os::unix::fs::PermissionsExt;
    Some(std::fs::Permissions::from_mode(0o644))
}

#[cfg(not(unix))]
fn default_permissions() -> Option<std::fs::Permissions> {
    // Elsewhere a temporary file is an ordinary one: keep what it has.
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_name_the_path_and_the_operation() {
        let err = read(Path::new("/definitely/not/here.rs")).unwrap_err();
        assert_eq!(err.path, Path::new("/definitely/not/here.rs"));
        assert_eq!(err.to_string(), "failed to read file `/definitely/not/here.rs`");
        // The operating system's reason is the cause, shown once by the reports.
        let shown = crate::error_with_causes(&err, "\ncaused by: ");
        assert_eq!(shown.matches("No such file or directory").count(), 1, "{shown}");
    }

    #[test]
    fn write_if_changed_skips_identical_bytes_and_leaves_no_temporary_files() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.rs");
        assert!(write_if_changed(&path, b"one").unwrap());
        let mtime = std::fs::metadata(&path).unwrap().modified().unwrap();
        std::thread::sleep(std::time::Duration::from_millis(20));
        assert!(!write_if_changed(&path, b"one").unwrap());
        assert_eq!(std::fs::metadata(&path).unwrap().modified().unwrap(), mtime);
        assert!(write_if_changed(&path, b"two").unwrap());
        assert_eq!(std::fs::read(&path).unwrap(), b"two");
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            assert_eq!(
                std::fs::metadata(&path).unwrap().permissions().mode() & 0o777,
                0o644,
                "not the temporary file's 0600"
            );
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o640)).unwrap();
            assert!(write_if_changed(&path, b"three").unwrap());
            assert_eq!(
                std::fs::metadata(&path).unwrap().permissions().mode() & 0o777,
                0o640,
                "an existing mode is kept"
            );
        }
        let names: Vec<_> = std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert_eq!(names, vec![std::ffi::OsString::from("a.rs")]);
    }
}
