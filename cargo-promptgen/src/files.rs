//! Generated trees as values ([`Files`]), and on disk: listing a folder, and making a folder
//! hold exactly a tree, writing only the files whose bytes changed, so their modification
//! times stay put and Cargo recompiles nothing needlessly (what prost-build does for its
//! output).
//!
//! The folders synced this way (a build's `$OUT_DIR/promptgen/`, a step's scratch tree) are
//! rebuilt from the lock and the store whenever they are lost, so files are replaced
//! atomically but not flushed one by one: a flush per file cost more than the rest of a build.

use std::collections::BTreeSet;
use std::path::Path;

use codegen_core::fs::{self, FsError};

use crate::graph::Graph;

/// A generated tree or part of one: path (forward slashes) to bytes, in path order.
pub type Files = std::collections::BTreeMap<String, Vec<u8>>;

/// The tree that `steps` make together: each step's files over those of the steps before it
/// in the graph's order (so where two steps hold a path, the later one's bytes win, as in the
/// crate). `files_of` gives a step's files by index, `None` for a step without any.
pub fn overlay<'a>(
    graph: &Graph,
    steps: impl IntoIterator<Item = usize>,
    files_of: impl Fn(usize) -> Option<&'a Files>,
) -> Files {
    let mut ordered: Vec<usize> = steps.into_iter().collect();
    ordered.sort_by_key(|&step| graph.rank(step));
    let mut tree = Files::new();
    for step in ordered {
        if let Some(files) = files_of(step) {
            tree.extend(files.iter().map(|(path, bytes)| (path.clone(), bytes.clone())));
        }
    }
    tree
}

/// The files under `dir` (links included, never followed) as relative forward-slash paths, sorted.
pub fn walk_files(dir: &Path) -> Vec<String> {
    let mut files: Vec<String> = walkdir::WalkDir::new(dir)
        .follow_links(false)
        .into_iter()
        .flatten()
        .filter(|e| !e.file_type().is_dir())
        .map(|e| relative_path(dir, e.path()))
        .collect();
    files.sort();
    files
}

/// The files under `dir` with their bytes.
pub fn read_tree(dir: &Path) -> Result<Files, FsError> {
    walk_files(dir).into_iter().map(|path| Ok((path.clone(), fs::read(&dir.join(&path))?))).collect()
}

/// Makes the folder `dir` (created when missing) hold exactly `files`: removes every other
/// file or link, writes the files whose bytes differ, and leaves the rest alone. Returns how
/// many files it wrote.
pub fn sync_dir(dir: &Path, files: &Files) -> Result<usize, FsError> {
    fs::create_dir_all(dir)?;
    let mut folders = BTreeSet::new();
    for entry in walkdir::WalkDir::new(dir).min_depth(1).follow_links(false) {
        let entry = entry.map_err(|e| FsError::new("list", dir, e.into()))?;
        let relative = relative_path(dir, entry.path());
        if entry.file_type().is_dir() {
            folders.insert(relative);
        } else if !files.contains_key(&relative) {
            fs::remove_file(entry.path())?;
        }
    }
    let mut written = 0;
    for (path, bytes) in files {
        if let Some((parent, _)) = path.rsplit_once('/')
            && !folders.contains(parent)
        {
            fs::create_dir_all(&dir.join(parent))?;
            folders.insert(parent.to_string());
        }
        written += usize::from(fs::write_if_changed_unsynced(&dir.join(path), bytes)?);
    }
    Ok(written)
}

/// `path` below `dir`, with forward slashes.
fn relative_path(dir: &Path, path: &Path) -> String {
    let relative = path.strip_prefix(dir).unwrap_or(path);
    relative.components().map(|c| c.as_os_str().to_string_lossy()).collect::<Vec<_>>().join("/")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tree(files: &[(&str, &str)]) -> Files {
        files.iter().map(|(p, t)| (p.to_string(), t.as_bytes().to_vec())).collect()
    }

    #[test]
    fn a_sync_writes_what_differs_and_puts_right_every_change_made_behind_its_back() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("tree");
        let files = tree(&[("a.rs", "fn a() {}\n"), ("deep/er/b.rs", "fn b() {}\n")]);
        assert_eq!(sync_dir(&out, &files).unwrap(), 2);
        let mtime = std::fs::metadata(out.join("a.rs")).unwrap().modified().unwrap();
        assert_eq!(sync_dir(&out, &files).unwrap(), 0, "nothing changed");
        assert_eq!(std::fs::metadata(out.join("a.rs")).unwrap().modified().unwrap(), mtime, "left alone");

        // Edited in place (same length), removed, and strangers added: all put right.
        std::fs::write(out.join("a.rs"), "fn x() {}\n").unwrap();
        std::fs::remove_file(out.join("deep/er/b.rs")).unwrap();
        std::fs::write(out.join("stray.rs"), "").unwrap();
        #[cfg(unix)]
        std::os::unix::fs::symlink("/etc/hostname", out.join("deep/link.rs")).unwrap();
        assert_eq!(sync_dir(&out, &files).unwrap(), 2);
        assert_eq!(std::fs::read_to_string(out.join("a.rs")).unwrap(), "fn a() {}\n");
        assert_eq!(std::fs::read_to_string(out.join("deep/er/b.rs")).unwrap(), "fn b() {}\n");
        assert!(!out.join("stray.rs").exists());
        assert!(std::fs::symlink_metadata(out.join("deep/link.rs")).is_err(), "links are removed, never followed");
        assert_eq!(sync_dir(&out, &files).unwrap(), 0);
    }
}
