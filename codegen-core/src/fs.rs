//! Every file operation of the crate goes through here, so every error names its path.

use std::io::{self, Write};
use std::path::{Path, PathBuf};

/// A failed file operation: what was attempted, on which path, and why.
#[derive(Debug, thiserror::Error)]
#[error("failed to {op} `{}`: {source}", path.display())]
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
    fn new(op: &'static str, path: &Path, source: io::Error) -> FsError {
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

/// Metadata of `path` itself (a symlink is not followed).
pub fn symlink_metadata(path: &Path) -> Result<std::fs::Metadata, FsError> {
    std::fs::symlink_metadata(path).map_err(|e| FsError::new("inspect", path, e))
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
    if let Ok(meta) = std::fs::symlink_metadata(path)
        && meta.is_file() && meta.len() == bytes.len() as u64 && read(path)? == bytes {
            return Ok(false);
        }
    write_atomic(path, bytes)?;
    Ok(true)
}

/// Writes `bytes` to `path` through a temporary file and a rename (see [`write_if_changed`]).
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<(), FsError> {
    let dir = match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir,
        _ => Path::new("."),
    };
    let mut tmp = tempfile::Builder::new()
        .prefix(".promptgen-tmp-")
        .tempfile_in(dir)
        .map_err(|e| FsError::new("create a temporary file in", dir, e))?;
    tmp.write_all(bytes).map_err(|e| FsError::new("write", tmp.path(), e))?;
    tmp.as_file().sync_all().map_err(|e| FsError::new("flush", tmp.path(), e))?;
    tmp.persist(path).map_err(|e| FsError::new("replace", path, e.error))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_name_the_path_and_the_operation() {
        let err = read(Path::new("/definitely/not/here.rs")).unwrap_err();
        assert_eq!(err.path, Path::new("/definitely/not/here.rs"));
        assert!(err.to_string().starts_with("failed to read file `/definitely/not/here.rs`: "), "{err}");
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
        let names: Vec<_> = std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert_eq!(names, vec![std::ffi::OsString::from("a.rs")]);
    }
}
