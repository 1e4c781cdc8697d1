//! The rules for paths: the outputs and inputs a model sees, and files joined to their folder
//! lexically.

use std::path::{Component, Path, PathBuf};

/// The problems shared by output and input paths, which the model sees: `Err` says why.
fn path_shape(written: &str) -> Result<Vec<&str>, String> {
    if written.is_empty() {
        return Err("is empty; write a relative path such as `src/view.rs`".into());
    }
    if written.contains('\\') {
        return Err("contains a backslash; write paths with forward slashes, e.g. `src/view.rs`".into());
    }
    let bytes = written.as_bytes();
    if written.starts_with('/') || (bytes.len() >= 2 && bytes[0].is_ascii_alphabetic() && bytes[1] == b':') {
        return Err("is absolute; write a path relative to the package folder".into());
    }
    if written.chars().any(char::is_control) {
        return Err("contains a control character".into());
    }
    let components: Vec<&str> = written.split('/').filter(|c| !c.is_empty() && *c != ".").collect();
    if components.iter().any(|c| c.contains(':')) {
        return Err("contains `:` in a name, which is not portable (a Windows drive or stream)".into());
    }
    Ok(components)
}

/// `written` as an output path, normalised (no `.` or empty components), or why it is not
/// one: empty, absolute, with a backslash, a control character, a `:` or `..`.
pub fn output_path(written: &str) -> Result<String, String> {
    let components = path_shape(written)?;
    if components.contains(&"..") {
        return Err("contains `..`; outputs are written inside the output folder, e.g. `view.rs`".into());
    }
    if components.is_empty() {
        return Err("names the output folder itself; name a file, e.g. `view.rs`".into());
    }
    Ok(components.join("/"))
}

pub(super) fn input_virtual_path(written: &str) -> Result<String, String> {
    let mut stack: Vec<&str> = Vec::new();
    for component in path_shape(written)? {
        if component == ".." && stack.last().is_some_and(|last| *last != "..") {
            stack.pop();
        } else {
            stack.push(component);
        }
    }
    let visible: Vec<&str> = stack.into_iter().skip_while(|c| *c == "..").collect();
    if visible.is_empty() {
        return Err("names no file or folder the model could see (it is the package folder or above it); \
                    name a file or folder, e.g. `src` or `src/domain.rs`"
            .into());
    }
    Ok(visible.join("/"))
}

/// `base` joined with `relative`, with `.` dropped and `..` folded lexically.
pub(super) fn lexical_join(base: &Path, relative: &str) -> PathBuf {
    let joined = base.join(relative);
    let mut out = PathBuf::new();
    for component in joined.components() {
        match component {
            Component::CurDir => {}
            Component::ParentDir => match out.components().next_back() {
                Some(Component::Normal(_)) => {
                    out.pop();
                }
                Some(Component::RootDir | Component::Prefix(_)) => {}
                _ => out.push(".."),
            },
            other => out.push(other),
        }
    }
    out
}

pub(super) fn absolute(path: &Path) -> PathBuf {
    let path = std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf());
    // Fold `.` and `..` so parents walk the real folders.
    lexical_join(&path, "")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_are_normalised() {
        assert_eq!(output_path("./src//view.rs/").unwrap(), "src/view.rs");
        assert!(output_path("../x.rs").is_err());
        assert!(output_path("/x.rs").is_err());
        assert!(output_path("C:/x.rs").is_err());
        assert!(output_path("src\\x.rs").is_err());
        assert!(output_path("./").is_err());
        assert_eq!(input_virtual_path("./src/").unwrap(), "src");
        assert_eq!(input_virtual_path("../prompts/shared.md").unwrap(), "prompts/shared.md");
        assert_eq!(input_virtual_path("src/../lib.rs").unwrap(), "lib.rs");
        assert!(input_virtual_path("..").is_err());
        assert_eq!(lexical_join(Path::new("/a/b"), "../c/./d.md"), PathBuf::from("/a/c/d.md"));
        assert_eq!(lexical_join(Path::new("/"), "../x"), PathBuf::from("/x"));
    }
}
