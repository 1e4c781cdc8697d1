//! The sandbox: which real file a model-supplied path means, and refusing everything else.
//!
//! The model is untrusted input. It sees one virtual tree of relative, forward-slash paths:
//!
//! - the contents of the **output root** at the top level, readable and writable;
//! - declared **inputs**, each a real file or folder mounted read-only at a virtual path
//!   (virtual `src/domain.rs` → `/pkg/src/domain.rs`, or virtual `src` → the folder `/pkg/src`).
//!
//! Reads resolve against the inputs first (the path equals a mount or lies under a folder
//! mount, the most specific mount winning), then under the output root. Writes go only under
//! the output root and never to, or under, an input.
//!
//! Whatever the model did wrong or may not do comes back as a [`Refusal`] whose reason says
//! what it may do instead, so the conversation can carry on. Genuine I/O failures are
//! refusals too, naming the virtual path (the model can continue without that file). Only
//! setting the sandbox up can fail with a [`SandboxError`]: those are the user's problems.
//!
//! # Paths the model may give
//!
//! Relative, with forward slashes: `src/lib.rs`, `./src//lib.rs/` (normalised to
//! `src/lib.rs`). Refused: empty paths, NUL bytes and other control characters, absolute
//! paths (`/x`, `\x`), Windows prefixes (`C:\x`, `C:x`, `\\server\share`, `\\?\x`), any `..`
//! component, backslashes anywhere and `:` in a name. `.` alone means the root, for
//! [`Sandbox::list_files`] only.
//!
//! # Protected paths
//!
//! Never readable, listable or writable, wherever they are: any component starting with
//! `.env`, a component `.git` or `target`, file names ending in `.pem` or starting with
//! `id_`, and `.cargo/credentials*`. Matching ignores case (and trailing dots and spaces and
//! anything after a `:`), for case-insensitive filesystems. It applies both to the virtual
//! path and to the real path, relative to its root, that the virtual path resolves to.
//!
//! # Symbolic links
//!
//! Every existing component of a path is inspected without following it; a symbolic link is
//! resolved and must stay inside the root it sits in (the output root, or the input folder).
//! One that leads outside is refused for reading and writing and left out of listings. A write
//! through a link that stays inside writes the file it points to; missing folders are created
//! one at a time, each checked, and the folder written into is verified to be inside the
//! output root just before the write. Links to folders are listed through only in input
//! folders, and only with [`SandboxBuilder::links_within`].
//!
//! [`SandboxBuilder::links_within`] widens the rule for input folders: their links may also
//! lead anywhere inside a given folder (the package's), and every link in them is checked
//! when the sandbox is built, so that a link that leads elsewhere, to nothing, or to a folder
//! that holds it is the user's error ([`SandboxError::InputLink`]) before the model runs.
//! [`input_files`] walks an input folder by the same rule, for tools that hash what a model
//! can read.

use std::collections::BTreeSet;
use std::fmt;
use std::io;
use std::path::{Path, PathBuf};

use walkdir::WalkDir;

use crate::fs::{self as cfs, FsError};

/// How much the model may read and write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Largest file [`Sandbox::read_file`] returns, in bytes (default 256 KiB).
    pub max_read_bytes: u64,
    /// Largest content [`Sandbox::write_file`] accepts, in bytes (default 512 KiB).
    pub max_write_bytes: u64,
    /// How many distinct files one step may write (default 64). Rewriting a file already
    /// written this step does not count again.
    pub max_files_per_step: usize,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits { max_read_bytes: 256 * 1024, max_write_bytes: 512 * 1024, max_files_per_step: 64 }
    }
}

/// Declares a [`Sandbox`]: its output root, its read-only inputs and its [`Limits`].
#[derive(Debug, Clone)]
pub struct SandboxBuilder {
    output_root: PathBuf,
    inputs: Vec<(String, PathBuf)>,
    limits: Limits,
    links_within: Option<PathBuf>,
}

impl SandboxBuilder {
    /// Starts a sandbox whose writable output root is `output_root` (created by
    /// [`build`](SandboxBuilder::build) if missing).
    pub fn new(output_root: impl Into<PathBuf>) -> SandboxBuilder {
        SandboxBuilder {
            output_root: output_root.into(),
            inputs: Vec::new(),
            limits: Limits::default(),
            links_within: None,
        }
    }

    /// Mounts the real file or folder `real_path` read-only at `virtual_path` (a relative,
    /// forward-slash path such as `src/domain.rs` or `src`).
    pub fn input(mut self, virtual_path: impl Into<String>, real_path: impl Into<PathBuf>) -> SandboxBuilder {
        self.inputs.push((virtual_path.into(), real_path.into()));
        self
    }

    /// Lets symbolic links inside the input folders lead anywhere inside `folder` (the
    /// package's folder, say), besides inside their own input folder. [`build`](Self::build)
    /// then checks every link in the input folders and refuses one that leads anywhere else,
    /// to nothing, or to a folder that holds it ([`SandboxError::InputLink`]), and the model
    /// sees the files of linked folders where the links put them. Without it, a link may only
    /// lead inside its own input folder (the model is refused one that does not), and linked
    /// folders are not listed.
    pub fn links_within(mut self, folder: impl Into<PathBuf>) -> SandboxBuilder {
        self.links_within = Some(folder.into());
        self
    }

    /// Replaces the default [`Limits`].
    pub fn limits(mut self, limits: Limits) -> SandboxBuilder {
        self.limits = limits;
        self
    }

    /// Creates the output root if missing, resolves the roots to canonical paths, and checks
    /// that every virtual path follows the rules for model paths, is not protected and is
    /// declared once, and that every real input exists and is a file or a folder.
    pub fn build(self) -> Result<Sandbox, SandboxError> {
        cfs::create_dir_all(&self.output_root)?;
        let output_root = cfs::canonicalize(&self.output_root)?;
        if !cfs::symlink_metadata(&output_root)?.is_dir() {
            return Err(SandboxError::OutputRootNotAFolder { path: output_root });
        }

        let mut mounts: Vec<Mount> = Vec::new();
        for (virtual_path, real_path) in self.inputs {
            let bad = |reason: String| SandboxError::BadInputPath { virtual_path: virtual_path.clone(), reason };
            let comps = normalize(&virtual_path).map_err(bad)?;
            if comps.is_empty() {
                return Err(bad("it is the root of the tree; mount inputs at a path such as `src`".into()));
            }
            if let Some(why) = protected_reason(&comps, true) {
                return Err(bad(format!("it is a protected path ({why}), which the model can never read")));
            }
            let normalized = comps.join("/");
            if mounts.iter().any(|m| m.virtual_path == normalized) {
                return Err(SandboxError::DuplicateInput { virtual_path: normalized });
            }
            let real = match cfs::canonicalize(&real_path) {
                Ok(real) => real,
                Err(e) if is_missing(&e.source) => {
                    return Err(SandboxError::MissingInput { virtual_path, real_path });
                }
                Err(e) => return Err(e.into()),
            };
            let meta = cfs::symlink_metadata(&real)?;
            if !meta.is_dir() && !meta.is_file() {
                return Err(SandboxError::UnsupportedInput { virtual_path, real_path });
            }
            mounts.push(Mount { virtual_path: normalized, comps, real, is_dir: meta.is_dir() });
        }
        for inner in &mounts {
            if let Some(file) = mounts
                .iter()
                .find(|m| !m.is_dir && m.comps.len() < inner.comps.len() && inner.comps.starts_with(&m.comps))
            {
                return Err(SandboxError::BadInputPath {
                    virtual_path: inner.virtual_path.clone(),
                    reason: format!("it lies under the input `{}`, which is a file", file.virtual_path),
                });
            }
        }
        // Most specific first, so the first mount that claims a path is the one that owns it.
        mounts.sort_by_key(|m| std::cmp::Reverse(m.comps.len()));
        let links_within = self.links_within.as_deref().map(cfs::canonicalize).transpose()?;
        if let Some(within) = &links_within {
            for mount in mounts.iter().filter(|m| m.is_dir) {
                input_files(&mount.real, Some(within))?;
            }
        }

        Ok(Sandbox { output_root, mounts, limits: self.limits, written: Vec::new(), links_within })
    }
}

/// One step's view of the files: the output root plus read-only inputs (see the
/// [module documentation](self)).
#[derive(Debug)]
pub struct Sandbox {
    output_root: PathBuf,
    /// Most specific (longest virtual path) first.
    mounts: Vec<Mount>,
    limits: Limits,
    written: Vec<String>,
    /// Canonical: see [`SandboxBuilder::links_within`].
    links_within: Option<PathBuf>,
}

/// What [`Sandbox::write_file`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct WriteOutcome {
    /// The normalised virtual path written.
    pub path: String,
    /// The size of the content, in bytes.
    pub bytes: usize,
    /// False when the file already held exactly this content (it was left untouched).
    pub changed: bool,
}

/// What [`Sandbox::edit_file`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct EditOutcome {
    /// The write of the edited file.
    pub write: WriteOutcome,
    /// Where each edit matched.
    pub matches: Vec<crate::edit::Match>,
}

/// Why the sandbox refused a model's request. The reason says what is allowed instead; it is
/// meant to be shown to the model.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    /// The path as the model gave it (normalised when it could be).
    pub path: String,
    /// What is wrong and what to do instead.
    pub reason: String,
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "`{}`: {}", self.path, self.reason)
    }
}

impl std::error::Error for Refusal {}

/// A sandbox that cannot be set up. These are the user's problems, not the model's.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SandboxError {
    /// Creating or resolving the output root or an input failed.
    #[error(transparent)]
    Fs(#[from] FsError),
    /// The output root exists but is not a folder.
    #[error("the output root `{}` is not a folder", path.display())]
    OutputRootNotAFolder {
        /// The output root.
        path: PathBuf,
    },
    /// An input's virtual path breaks the rules for paths.
    #[error("the input path `{virtual_path}` cannot be used: {reason}")]
    BadInputPath {
        /// The virtual path as declared.
        virtual_path: String,
        /// What is wrong with it.
        reason: String,
    },
    /// Two inputs are mounted at the same virtual path.
    #[error("the input path `{virtual_path}` is declared twice")]
    DuplicateInput {
        /// The normalised virtual path.
        virtual_path: String,
    },
    /// An input's real path does not exist.
    #[error("the input `{virtual_path}` refers to `{}`, which does not exist", real_path.display())]
    MissingInput {
        /// The virtual path as declared.
        virtual_path: String,
        /// The real path as declared.
        real_path: PathBuf,
    },
    /// A symbolic link in an input folder leads where the model may not follow it.
    #[error("the symbolic link `{}` leads to `{}`, {reason}", link.display(), target.display())]
    InputLink {
        /// The link.
        link: PathBuf,
        /// Where it leads (as written in the link when that does not exist).
        target: PathBuf,
        /// Why it cannot be followed, and what to do instead.
        reason: String,
    },
    /// An input's real path is neither a file nor a folder (a device, a socket, a pipe).
    #[error("the input `{virtual_path}` refers to `{}`, which is neither a file nor a folder", real_path.display())]
    UnsupportedInput {
        /// The virtual path as declared.
        virtual_path: String,
        /// The real path as declared.
        real_path: PathBuf,
    },
}

/// A real file or folder mounted read-only at a virtual path.
#[derive(Debug, Clone)]
struct Mount {
    virtual_path: String,
    comps: Vec<String>,
    /// Canonical.
    real: PathBuf,
    is_dir: bool,
}

/// The root a virtual path lies in: the output root or one input.
#[derive(Clone, Copy)]
struct Area<'a> {
    /// Canonical; nothing may resolve outside it (or outside `bound`).
    root: &'a Path,
    /// Canonical: where the links of an input folder may also lead.
    bound: Option<&'a Path>,
    /// The virtual path of `root`.
    base: &'a [String],
    mount: Option<&'a Mount>,
}

impl Area<'_> {
    fn describe(&self) -> String {
        match self.mount {
            Some(m) => format!("the read-only input `{}`", m.virtual_path),
            None => "the output folder".to_owned(),
        }
    }

    /// The virtual path of `rest` under this area.
    fn virtual_of(&self, rest: &[String]) -> String {
        self.base.iter().chain(rest).map(String::as_str).collect::<Vec<_>>().join("/")
    }

    /// How far links may lead from this area, for a walk that leaves out what it cannot list.
    fn reach(&self) -> Reach<'_> {
        Reach { root: self.root, bound: self.bound, follow_folders: self.bound.is_some(), strict: false }
    }

    fn same(&self, other: &Area<'_>) -> bool {
        match (self.mount, other.mount) {
            (Some(a), Some(b)) => std::ptr::eq(a, b),
            (None, None) => true,
            _ => false,
        }
    }
}

/// How far a relative path resolves: the canonical path of its deepest existing part, and
/// the components after it that do not exist.
struct Resolved {
    path: PathBuf,
    missing: Vec<String>,
}

const EXAMPLE: &str = "src/lib.rs";
/// How many folders deep a written file may be, so one write cannot create folders without end.
const MAX_WRITE_DEPTH: usize = 32;
/// How long a written path may be.
const MAX_WRITE_PATH_BYTES: usize = 1024;

impl Sandbox {
    /// Same as [`SandboxBuilder::new`].
    pub fn builder(output_root: impl Into<PathBuf>) -> SandboxBuilder {
        SandboxBuilder::new(output_root)
    }

    /// The canonical output root.
    pub fn output_root(&self) -> &Path {
        &self.output_root
    }

    /// The full text of the file at the model-supplied `path`.
    ///
    /// Refused: invalid or protected paths, paths whose resolution leaves its root, missing
    /// files (with close matches when there are any), folders, non-UTF-8 files, files over
    /// [`Limits::max_read_bytes`], and I/O failures.
    pub fn read_file(&self, path: &str) -> Result<String, Refusal> {
        let comps = normalize(path).map_err(|reason| refusal(shown(path), reason))?;
        let vpath = comps.join("/");
        if comps.is_empty() {
            return Err(refusal(
                ".",
                "is the root folder, not a file; call list_files to see the files, then read one of them",
            ));
        }
        if let Some(why) = protected_reason(&comps, true) {
            return Err(refusal(
                vpath,
                format!("is protected ({why}) and cannot be read; read the project's source files instead"),
            ));
        }
        if self.is_virtual_folder(&comps) {
            return Err(folder_refusal(&vpath));
        }
        let area = self.locate(&comps);
        let rest = comps.get(area.base.len()..).unwrap_or_default();
        if let Some(m) = area.mount
            && !m.is_dir
            && !rest.is_empty()
        {
            return Err(refusal(
                vpath,
                format!(
                    "no such file: `{}` is a file, not a folder; call list_files to see the files you can read",
                    m.virtual_path
                ),
            ));
        }
        let resolved = resolve(&area, rest, &vpath)?;
        if !resolved.missing.is_empty() {
            return Err(self.missing_refusal(&vpath, &comps));
        }
        check_real_protected(&area, &resolved, &vpath, "read", true)?;
        let meta = cfs::symlink_metadata(&resolved.path).map_err(|e| io_refusal(&vpath, &e))?;
        if meta.is_dir() {
            return Err(folder_refusal(&vpath));
        }
        if !meta.is_file() {
            return Err(refusal(
                vpath,
                "is not a regular file (it is a device, a socket or a pipe); only text files can be read",
            ));
        }
        let max = self.limits.max_read_bytes;
        let too_big = |size: u64| {
            refusal(
                &vpath,
                format!(
                    "is {size} bytes, over the read limit of {max} bytes; it cannot be read, so work from the other files"
                ),
            )
        };
        if meta.len() > max {
            return Err(too_big(meta.len()));
        }
        let bytes = cfs::read(&resolved.path).map_err(|e| io_refusal(&vpath, &e))?;
        if bytes.len() as u64 > max {
            return Err(too_big(bytes.len() as u64));
        }
        String::from_utf8(bytes).map_err(|_| {
            refusal(
                &vpath,
                "is not a UTF-8 text file (it is binary or in another encoding); only text files can be read",
            )
        })
    }

    /// Writes `content` to the model-supplied `path` under the output root, atomically,
    /// creating folders as needed. Identical content leaves the file untouched
    /// (`changed: false`).
    ///
    /// Refused: invalid or protected paths, inputs and the folders that hold them, paths
    /// more than 32 folders deep or longer than 1024 bytes, paths whose resolution leaves the
    /// output root, folders, content over
    /// [`Limits::max_write_bytes`], a new file beyond [`Limits::max_files_per_step`], and I/O
    /// failures.
    pub fn write_file(&mut self, path: &str, content: &str) -> Result<WriteOutcome, Refusal> {
        let (comps, vpath) = self.writable(path)?;
        self.write_checked(&comps, &vpath, content)
    }

    /// Applies `edits` to the file at the model-supplied `path` under the output root, all or
    /// none (see [`crate::edit`]), and writes the result as [`Sandbox::write_file`] would:
    /// every rule of a write holds for it.
    ///
    /// Refused besides: a file that does not exist yet (it is written with `write_file`), and
    /// edits whose `old` matches no place or several (nothing is written then).
    pub fn edit_file(&mut self, path: &str, edits: &[crate::edit::Edit]) -> Result<EditOutcome, Refusal> {
        let (comps, vpath) = self.writable(path)?;
        if !self.output_exists(&vpath) {
            return Err(refusal(vpath, "does not exist yet, so it cannot be edited; write it whole with write_file"));
        }
        let text = self.read_file(&vpath)?;
        let applied =
            crate::edit::apply(&text, edits).map_err(|problem| refusal(&vpath, problem.describe(edits.len())))?;
        let write = self.write_checked(&comps, &vpath, &applied.text)?;
        Ok(EditOutcome { write, matches: applied.matches })
    }

    /// The normalised components and path of a file the model may write, or why it may not.
    fn writable(&self, path: &str) -> Result<(Vec<String>, String), Refusal> {
        let comps = normalize(path).map_err(|reason| refusal(shown(path), reason))?;
        let vpath = comps.join("/");
        if comps.is_empty() {
            return Err(refusal(".", format!("is the root folder, not a file; give a file path such as `{EXAMPLE}`")));
        }
        if let Some(why) = protected_reason(&comps, true) {
            return Err(refusal(
                vpath,
                format!(
                    "is protected ({why}) and cannot be written; write generated files elsewhere, e.g. `{}`",
                    self.elsewhere(&comps)
                ),
            ));
        }
        if let Some(m) = self.mounts.iter().find(|m| comps.starts_with(&m.comps)) {
            let what = if m.comps == comps {
                "is a read-only input".to_owned()
            } else {
                format!("lies under `{}`, a read-only input", m.virtual_path)
            };
            return Err(refusal(
                vpath,
                format!("{what}; write generated files elsewhere, e.g. `{}`", self.elsewhere(&comps)),
            ));
        }
        if self.is_virtual_folder(&comps) {
            return Err(refusal(
                vpath,
                format!(
                    "is a folder holding read-only inputs; write generated files elsewhere, e.g. `{}`",
                    self.elsewhere(&comps)
                ),
            ));
        }
        if comps.len().saturating_sub(1) > MAX_WRITE_DEPTH || vpath.len() > MAX_WRITE_PATH_BYTES {
            return Err(refusal(
                shown(&vpath),
                format!(
                    "is {} folders deep and {} bytes long; written files may be at most {MAX_WRITE_DEPTH} folders deep and \
                     {MAX_WRITE_PATH_BYTES} bytes long, so choose a shorter path",
                    comps.len().saturating_sub(1),
                    vpath.len()
                ),
            ));
        }
        Ok((comps, vpath))
    }

    /// Writes `content` to a path [`Sandbox::writable`] admitted, once the content is checked.
    fn write_checked(&mut self, comps: &[String], vpath: &str, content: &str) -> Result<WriteOutcome, Refusal> {
        let vpath = vpath.to_string();
        if vpath.ends_with(".rs")
            && let Some(read) = forbidden_compile_time_read(&vpath, content)
        {
            return Err(refusal(
                vpath,
                format!(
                    "was not written: {read}. Put what the code needs into the file itself (or into \
                     another file you write)"
                ),
            ));
        }
        let max = self.limits.max_write_bytes;
        if content.len() as u64 > max {
            return Err(refusal(
                vpath,
                format!(
                    "the content is {} bytes, over the write limit of {max} bytes; split it into smaller files",
                    content.len()
                ),
            ));
        }
        let already = self.written.contains(&vpath);
        let cap = self.limits.max_files_per_step;
        if !already && self.written.len() >= cap {
            return Err(refusal(
                vpath,
                format!(
                    "this step has already written {} distinct files, the limit of {cap}; rewrite one of those ({}) or finish",
                    self.written.len(),
                    quoted_list(&self.written, 5)
                ),
            ));
        }

        let target = self.prepare_write(comps, &vpath)?;
        let changed = cfs::write_if_changed(&target, content.as_bytes()).map_err(|e| io_refusal(&vpath, &e))?;
        if !already {
            self.written.push(vpath.clone());
        }
        Ok(WriteOutcome { path: vpath, bytes: content.len(), changed })
    }

    /// The sorted virtual paths of every readable file, inputs and output root alike, or only
    /// of those under the folder `dir` (`None`, `""` and `"."` mean everything). Protected
    /// paths, symbolic links that lead outside their root and names the model could not
    /// address are left out; symbolic links to folders are not followed (their files are
    /// listed where they really are, if inside the root). A `dir` that is not a folder is
    /// refused, naming the top-level folders that do exist.
    pub fn list_files(&self, dir: Option<&str>) -> Result<Vec<String>, Refusal> {
        let comps = match dir {
            None => Vec::new(),
            Some(d) if d.trim().is_empty() => Vec::new(),
            Some(d) => normalize(d).map_err(|reason| refusal(shown(d), reason))?,
        };
        let vpath = if comps.is_empty() { ".".to_owned() } else { comps.join("/") };
        if let Some(why) = protected_reason(&comps, false) {
            return Err(refusal(vpath, format!("is protected ({why}) and cannot be listed; list another folder")));
        }
        let mut out = BTreeSet::new();
        let mut found = comps.is_empty();

        for m in &self.mounts {
            let area = self.mount_area(m);
            if m.comps.starts_with(&comps) {
                // The mount is the folder asked for, or lies under it.
                if !m.is_dir {
                    if m.comps == comps {
                        return Err(file_not_folder(&vpath));
                    }
                    if is_regular_file(&m.real) {
                        out.insert(m.virtual_path.clone());
                    }
                } else {
                    self.walk(&area, &m.real, &m.comps, &mut out);
                }
                found = true;
            } else if comps.starts_with(&m.comps)
                && self.locate(&comps).mount.is_some_and(|owner| std::ptr::eq(owner, m))
            {
                // The folder asked for lies inside this mount.
                if !m.is_dir {
                    continue;
                }
                let rest = comps.get(m.comps.len()..).unwrap_or_default();
                let resolved = resolve(&area, rest, &vpath)?;
                if !resolved.missing.is_empty() {
                    continue;
                }
                check_real_protected(&area, &resolved, &vpath, "listed", false)?;
                let meta = cfs::symlink_metadata(&resolved.path).map_err(|e| io_refusal(&vpath, &e))?;
                if !meta.is_dir() {
                    return Err(file_not_folder(&vpath));
                }
                self.walk(&area, &resolved.path, &comps, &mut out);
                found = true;
            }
        }

        if self.locate(&comps).mount.is_none() {
            match self.output_folder(&comps, &vpath) {
                Ok(Some(folder)) => {
                    self.walk(&self.output_area(), &folder, &comps, &mut out);
                    found = true;
                }
                Ok(None) => {}
                // What the inputs hold is still worth showing.
                Err(refusal) if !found => return Err(refusal),
                Err(_) => {}
            }
        }

        if !found {
            let folders = self.top_folders();
            let reason = if folders.is_empty() {
                "no such folder, and there are no folders at the top level; call list_files without `dir` to see every file"
                    .to_owned()
            } else {
                format!(
                    "no such folder; the folders at the top level are {}; or call list_files without `dir` to see every file",
                    quoted_list(&folders, 20)
                )
            };
            return Err(refusal(vpath, reason));
        }
        Ok(out.into_iter().collect())
    }

    /// The real folder `comps` names in the output root: None when it does not exist, a
    /// refusal when it is not a folder or may not be listed.
    fn output_folder(&self, comps: &[String], vpath: &str) -> Result<Option<PathBuf>, Refusal> {
        let area = self.output_area();
        let resolved = resolve(&area, comps, vpath)?;
        if !resolved.missing.is_empty() {
            return Ok(None);
        }
        check_real_protected(&area, &resolved, vpath, "listed", false)?;
        let meta = cfs::symlink_metadata(&resolved.path).map_err(|e| io_refusal(vpath, &e))?;
        if !meta.is_dir() {
            return Err(file_not_folder(vpath));
        }
        Ok(Some(resolved.path))
    }

    /// Whether the output root holds a regular file at the user-declared relative `path`
    /// (reached without leaving the output root).
    pub fn output_exists(&self, path: &str) -> bool {
        let Ok(comps) = normalize(path) else { return false };
        if comps.is_empty() {
            return false;
        }
        match resolve(&self.output_area(), &comps, path) {
            Ok(resolved) => resolved.missing.is_empty() && is_regular_file(&resolved.path),
            Err(_) => false,
        }
    }

    /// The virtual paths written during this step, in first-write order.
    pub fn written(&self) -> &[String] {
        &self.written
    }

    fn output_area(&self) -> Area<'_> {
        Area { root: &self.output_root, bound: None, base: &[], mount: None }
    }

    fn mount_area<'a>(&'a self, m: &'a Mount) -> Area<'a> {
        Area { root: &m.real, bound: self.links_within.as_deref(), base: &m.comps, mount: Some(m) }
    }

    /// The area that owns `comps` when reading: the most specific mount the path equals or
    /// lies under (a file mount only when equal or under it), else the output root.
    fn locate(&self, comps: &[String]) -> Area<'_> {
        self.mounts
            .iter()
            .find(|m| comps.starts_with(&m.comps))
            .map(|m| self.mount_area(m))
            .unwrap_or_else(|| self.output_area())
    }

    /// Whether `comps` is a folder of the virtual tree made by mounts below it, e.g. `src`
    /// when `src/domain.rs` is mounted.
    fn is_virtual_folder(&self, comps: &[String]) -> bool {
        self.mounts.iter().any(|m| m.comps.len() > comps.len() && m.comps.starts_with(comps))
    }

    /// A path to suggest instead of writing to `comps`: its file name at the top level of the
    /// output, unless inputs claim that too.
    fn elsewhere(&self, comps: &[String]) -> String {
        let name = comps.last().map(String::as_str).unwrap_or("generated.rs");
        let top = [name.to_owned()];
        let claimed = |c: &[String]| {
            self.mounts.iter().any(|m| c.starts_with(&m.comps) || m.comps.starts_with(c))
                || protected_reason(c, true).is_some()
        };
        if !claimed(&top) {
            name.to_owned()
        } else if !claimed(&["generated".to_owned(), name.to_owned()]) {
            format!("generated/{name}")
        } else {
            "generated/output.rs".to_owned()
        }
    }

    /// Resolves `comps` inside the output root, creating missing folders one at a time, and
    /// returns the real path to write.
    fn prepare_write(&self, comps: &[String], vpath: &str) -> Result<PathBuf, Refusal> {
        let area = self.output_area();
        let root = area.root;
        let resolved = resolve(&area, comps, vpath)?;
        check_real_protected(&area, &resolved, vpath, "written", true)?;
        let mut planned = resolved.path.clone();
        planned.extend(&resolved.missing);
        // An input may lie inside the output root; its real path is read-only too.
        if let Some(m) = self.mounts.iter().find(|m| {
            m.real.starts_with(root) && if m.is_dir { planned.starts_with(&m.real) } else { planned == m.real }
        }) {
            return Err(refusal(
                vpath,
                format!(
                    "is the same file as the read-only input `{}`; write generated files elsewhere, e.g. `{}`",
                    m.virtual_path,
                    self.elsewhere(comps)
                ),
            ));
        }

        let target = match resolved.missing.split_last() {
            None => {
                let meta = cfs::symlink_metadata(&resolved.path).map_err(|e| io_refusal(vpath, &e))?;
                if meta.is_dir() {
                    return Err(refusal(
                        vpath,
                        format!("is a folder; give the path of a file inside it, e.g. `{vpath}/new_file.rs`"),
                    ));
                }
                if !meta.is_file() {
                    return Err(refusal(
                        vpath,
                        "is not a regular file (it is a device, a socket or a pipe); write elsewhere",
                    ));
                }
                resolved.path
            }
            Some((name, folders)) => {
                let mut dir = resolved.path;
                let existing = comps.len().saturating_sub(resolved.missing.len());
                let meta = cfs::symlink_metadata(&dir).map_err(|e| io_refusal(vpath, &e))?;
                if !meta.is_dir() {
                    let file = comps.get(..existing).unwrap_or_default().join("/");
                    return Err(refusal(vpath, format!("`{file}` is a file, not a folder; choose another path")));
                }
                for folder in folders {
                    let next = dir.join(folder);
                    cfs::create_dir_all(&next).map_err(|e| io_refusal(vpath, &e))?;
                    let meta = cfs::symlink_metadata(&next).map_err(|e| io_refusal(vpath, &e))?;
                    if !meta.is_dir() {
                        return Err(refusal(
                            vpath,
                            "a folder on the way changed while it was being created; try again",
                        ));
                    }
                    dir = next;
                }
                dir.join(name)
            }
        };

        let parent = target.parent().unwrap_or(root);
        let canonical_parent = cfs::canonicalize(parent).map_err(|e| io_refusal(vpath, &e))?;
        if !canonical_parent.starts_with(root) {
            return Err(refusal(vpath, "leads outside the output folder; write inside it"));
        }
        Ok(target)
    }

    /// Adds the files under `start` (canonical, inside `area`) to `out` as virtual paths under
    /// `vstart`.
    fn walk(&self, area: &Area<'_>, start: &Path, vstart: &[String], out: &mut BTreeSet<String>) {
        let mut found = Vec::new();
        // Not strict: what cannot be listed is left out.
        let _ = area.reach().walk(start, &mut vstart.to_vec(), &mut vec![start.to_path_buf()], &mut found);
        for (vcomps, _) in found {
            if !self.is_virtual_folder(&vcomps) && self.locate(&vcomps).same(area) {
                out.insert(vcomps.join("/"));
            }
        }
    }

    /// The folders at the top of the virtual tree.
    fn top_folders(&self) -> Vec<String> {
        let mut folders = BTreeSet::new();
        for m in &self.mounts {
            if (m.is_dir || m.comps.len() > 1)
                && let Some(first) = m.comps.first()
            {
                folders.insert(first.clone());
            }
        }
        for entry in WalkDir::new(&self.output_root).follow_links(false).min_depth(1).max_depth(1).into_iter().flatten()
        {
            if !entry.file_type().is_dir() {
                continue;
            }
            if let Some(name) = entry.file_name().to_str() {
                let comps = [name.to_owned()];
                if normalize(name).ok().as_deref() == Some(&comps[..]) && protected_reason(&comps, false).is_none() {
                    folders.insert(name.to_owned());
                }
            }
        }
        folders.into_iter().collect()
    }

    /// "No such file", naming files with the same name elsewhere.
    fn missing_refusal(&self, vpath: &str, comps: &[String]) -> Refusal {
        let name = comps.last().map(|n| fold(n)).unwrap_or_default();
        let all = self.list_files(None).unwrap_or_default();
        let similar: Vec<String> =
            all.into_iter().filter(|p| p.rsplit('/').next().is_some_and(|n| fold(n) == name)).take(5).collect();
        if similar.is_empty() {
            refusal(vpath, "no such file; call list_files to see the files you can read")
        } else {
            refusal(
                vpath,
                format!(
                    "no such file; did you mean {}? (list_files shows every file you can read)",
                    quoted_list(&similar, 5)
                ),
            )
        }
    }
}

fn refusal(path: impl Into<String>, reason: impl Into<String>) -> Refusal {
    Refusal { path: path.into(), reason: reason.into() }
}

fn folder_refusal(vpath: &str) -> Refusal {
    refusal(vpath, format!("is a folder, not a file; call list_files with dir `{vpath}` to see its files"))
}

fn file_not_folder(vpath: &str) -> Refusal {
    refusal(vpath, "is a file, not a folder; read it with read_file, or call list_files without `dir`")
}

/// An I/O failure, naming the virtual path but not the real one.
fn io_refusal(vpath: &str, e: &FsError) -> Refusal {
    refusal(
        vpath,
        format!("I/O error: failed to {}: {}; continue without this file or try another path", e.op, e.source),
    )
}

fn is_missing(e: &io::Error) -> bool {
    matches!(e.kind(), io::ErrorKind::NotFound | io::ErrorKind::NotADirectory)
}

fn is_regular_file(path: &Path) -> bool {
    cfs::symlink_metadata(path).is_ok_and(|m| m.is_file())
}

/// The files a model can read in the input folder `folder`, as a sandbox built with
/// [`SandboxBuilder::links_within`]`(links_within)` mounts it: each as its path under
/// `folder` (forward slashes) and its real, canonical path, sorted. Protected files, and
/// names a model could not write, are left out.
///
/// Symbolic links are followed when they lead inside `folder` or inside `links_within`;
/// any other link (one that leads elsewhere, to nothing, or to a folder that holds it) is an
/// error naming the link and its target. Tools that hash what a model can read use this, so
/// that they agree with the sandbox.
#[doc(hidden)]
pub fn input_files(folder: &Path, links_within: Option<&Path>) -> Result<Vec<(String, PathBuf)>, SandboxError> {
    let root = cfs::canonicalize(folder)?;
    let bound = links_within.map(cfs::canonicalize).transpose()?;
    let reach = Reach { root: &root, bound: bound.as_deref(), follow_folders: true, strict: true };
    let mut found = Vec::new();
    reach.walk(&root, &mut Vec::new(), &mut vec![root.clone()], &mut found)?;
    let mut files: Vec<(String, PathBuf)> = found.into_iter().map(|(comps, real)| (comps.join("/"), real)).collect();
    files.sort();
    Ok(files)
}

/// How far symbolic links may lead from a root, and how a walk treats them.
#[derive(Clone, Copy)]
struct Reach<'a> {
    /// Canonical.
    root: &'a Path,
    /// Canonical: where links may also lead (see [`SandboxBuilder::links_within`]).
    bound: Option<&'a Path>,
    /// Whether a walk goes into linked folders (otherwise it leaves them out).
    follow_folders: bool,
    /// Whether a link that may not be followed, or a failure to read, stops a walk (otherwise
    /// it is left out).
    strict: bool,
}

impl Reach<'_> {
    /// Whether a link may lead to the canonical path `target`.
    fn allows(&self, target: &Path) -> bool {
        target.starts_with(self.root) || self.bound.is_some_and(|b| target.starts_with(b))
    }

    /// The canonical `path` relative to the root it lies in, one string per component.
    fn rel(&self, path: &Path) -> Vec<String> {
        let root = if path.starts_with(self.root) { self.root } else { self.bound.unwrap_or(self.root) };
        real_rel(root, path)
    }

    /// Adds the readable files under the canonical folder `dir`, whose virtual path is
    /// `vcomps`, to `out`. `stack` holds the canonical folders the walk is in, to refuse a
    /// link to one of them.
    fn walk(
        &self,
        dir: &Path,
        vcomps: &mut Vec<String>,
        stack: &mut Vec<PathBuf>,
        out: &mut Vec<(Vec<String>, PathBuf)>,
    ) -> Result<(), SandboxError> {
        let entries = match cfs::read_dir_names(dir) {
            Ok(entries) => entries,
            Err(e) if self.strict => return Err(e.into()),
            Err(_) => return Ok(()),
        };
        for name in entries {
            // Names the model could not give are not shown to it.
            let Some(name) = name.to_str().filter(|n| normalize(n).ok().as_deref() == Some(&[n.to_string()][..]))
            else {
                continue;
            };
            vcomps.push(name.to_owned());
            let result = self.visit(&dir.join(name), vcomps, stack, out);
            vcomps.pop();
            if let Err(e) = result
                && self.strict
            {
                return Err(e);
            }
        }
        Ok(())
    }

    fn visit(
        &self,
        path: &Path,
        vcomps: &mut Vec<String>,
        stack: &mut Vec<PathBuf>,
        out: &mut Vec<(Vec<String>, PathBuf)>,
    ) -> Result<(), SandboxError> {
        let meta = cfs::symlink_metadata(path)?;
        // A link the model could never open (`.env`, `target`, ...) is left alone, wherever it leads.
        if meta.file_type().is_symlink() && protected_reason(vcomps, false).is_some() {
            return Ok(());
        }
        let (real, meta) = if meta.file_type().is_symlink() {
            let bad = |target: PathBuf, reason: String| SandboxError::InputLink { link: path.into(), target, reason };
            let target = match cfs::canonicalize(path) {
                Ok(target) => target,
                Err(_) => {
                    let written = std::fs::read_link(path).unwrap_or_default();
                    return Err(bad(written, "which does not exist".into()));
                }
            };
            if !self.allows(&target) {
                let within = self.bound.unwrap_or(self.root);
                let reason = format!(
                    "which is outside `{}`; a link in an input folder may only lead inside it (list the target as an input of its own, or copy it)",
                    within.display()
                );
                return Err(bad(target, reason));
            }
            let meta = cfs::metadata(&target)?;
            if meta.is_dir() && stack.contains(&target) {
                return Err(bad(target, "a folder that holds the link, so the folder would never end".into()));
            }
            (target, meta)
        } else {
            (path.to_path_buf(), meta)
        };
        let is_file = meta.is_file();
        if protected_reason(vcomps, is_file).is_some() || protected_reason(&self.rel(&real), is_file).is_some() {
            return Ok(());
        }
        if is_file {
            out.push((vcomps.clone(), real));
        } else if meta.is_dir() && (real.as_path() == path || self.follow_folders) {
            stack.push(real.clone());
            let walked = self.walk(&real, vcomps, stack, out);
            stack.pop();
            walked?;
        }
        Ok(())
    }
}

/// `path` relative to `root`, one string per component (empty when not under it).
fn real_rel(root: &Path, path: &Path) -> Vec<String> {
    path.strip_prefix(root)
        .map(|rel| rel.components().map(|c| c.as_os_str().to_string_lossy().into_owned()).collect())
        .unwrap_or_default()
}

/// Walks `rest` down from `area.root`, inspecting each existing component without following
/// it. A symbolic link is resolved and must stay inside the root. Stops at the first missing
/// component.
fn resolve(area: &Area<'_>, rest: &[String], vpath: &str) -> Result<Resolved, Refusal> {
    let mut current = area.root.to_path_buf();
    for (i, comp) in rest.iter().enumerate() {
        let next = current.join(comp);
        let meta = match cfs::symlink_metadata(&next) {
            Ok(meta) => meta,
            Err(e) if is_missing(&e.source) => {
                return Ok(Resolved { path: current, missing: rest.get(i..).unwrap_or_default().to_vec() });
            }
            Err(e) => return Err(io_refusal(vpath, &e)),
        };
        if meta.file_type().is_symlink() {
            let link = area.virtual_of(rest.get(..=i).unwrap_or_default());
            let target = match cfs::canonicalize(&next) {
                Ok(target) => target,
                Err(e) if is_missing(&e.source) => {
                    return Err(refusal(
                        vpath,
                        format!(
                            "`{link}` is a symbolic link to something that does not exist; use a path that list_files shows"
                        ),
                    ));
                }
                Err(e) => return Err(io_refusal(vpath, &e)),
            };
            if !area.reach().allows(&target) {
                return Err(refusal(
                    vpath,
                    format!(
                        "`{link}` is a symbolic link to a location outside {}; only paths inside it can be used (list_files shows them)",
                        area.describe()
                    ),
                ));
            }
            current = target;
        } else {
            current = next;
        }
    }
    Ok(Resolved { path: current, missing: Vec::new() })
}

/// Refuses when the real path `resolved` stands for, relative to its root, is protected.
fn check_real_protected(
    area: &Area<'_>,
    resolved: &Resolved,
    vpath: &str,
    verb: &str,
    file: bool,
) -> Result<(), Refusal> {
    let mut rel = area.reach().rel(&resolved.path);
    rel.extend(resolved.missing.iter().cloned());
    match protected_reason(&rel, file) {
        Some(why) => Err(refusal(vpath, format!("leads to a protected path ({why}); it cannot be {verb}"))),
        None => Ok(()),
    }
}

/// A model-supplied path as the sandbox reads it (`./a//b/` is `a/b`), or why it is not one:
/// what a write to it would be refused for before the disk is looked at.
pub(crate) fn normalized(path: &str) -> Result<String, String> {
    normalize(path).map(|components| components.join("/"))
}

/// Splits a model-supplied path into its components, or says why it is not acceptable.
/// `""`-free: `./a//b/` gives `["a", "b"]`; `.` gives no components.
fn normalize(path: &str) -> Result<Vec<String>, String> {
    if path.trim().is_empty() {
        return Err(format!("the path is empty; give a relative path such as `{EXAMPLE}`"));
    }
    if path.contains('\0') {
        return Err(format!("the path contains a NUL byte; give a plain relative path such as `{EXAMPLE}`"));
    }
    if path.starts_with("\\\\") {
        return Err(format!(
            "is a Windows network or device path; give a path relative to the project root with forward slashes, such as `{EXAMPLE}`"
        ));
    }
    if has_drive_prefix(path) {
        return Err(format!(
            "is a Windows drive path; give a path relative to the project root with forward slashes, such as `{EXAMPLE}`"
        ));
    }
    if path.starts_with('/') || path.starts_with('\\') {
        let relative = path.trim_start_matches(['/', '\\']).replace('\\', "/");
        let example = if relative.trim().is_empty() { EXAMPLE.to_owned() } else { shown(&relative) };
        return Err(format!("is an absolute path; paths are relative to the project root, e.g. `{example}`"));
    }
    if path.contains('\\') {
        return Err(format!("contains a backslash; use forward slashes, e.g. `{}`", shown(&path.replace('\\', "/"))));
    }
    if path.chars().any(char::is_control) {
        return Err(format!(
            "contains a control character such as a newline or a tab; give the path alone, e.g. `{EXAMPLE}`"
        ));
    }
    let mut comps = Vec::new();
    for comp in path.split('/') {
        match comp {
            "" | "." => continue,
            ".." => {
                return Err(format!(
                    "contains `..`; paths cannot leave the project root, so give the path from the root down, e.g. `{EXAMPLE}`"
                ));
            }
            _ if comp.contains(':') => {
                return Err(
                    "contains `:`, which file names may not contain; use letters, digits, `-`, `_` and `.`".to_owned()
                );
            }
            // A name of spaces alone (` /`) is legal on disk but a trap: `" "` alone is refused
            // as empty, so the file could be written and never named again.
            _ if comp.trim().is_empty() => {
                return Err(format!("contains a name made only of spaces; give a path such as `{EXAMPLE}`"));
            }
            _ => comps.push(comp.to_owned()),
        }
    }
    Ok(comps)
}

fn has_drive_prefix(path: &str) -> bool {
    let mut chars = path.chars();
    matches!((chars.next(), chars.next()), (Some(letter), Some(':')) if letter.is_ascii_alphabetic())
}

/// A component as a case-insensitive filesystem might see it: lower case, without trailing
/// dots and spaces (ignored by Windows) or an alternate data stream (`name:stream`).
fn fold(comp: &str) -> String {
    let comp = comp.split(':').next().unwrap_or(comp);
    comp.trim_end_matches(['.', ' '])
        .chars()
        .flat_map(char::to_lowercase)
        .map(|c| if c == 'ſ' { 's' } else { c })
        .collect()
}

/// Whether a model may never read, list or write the file at `relative_path` (forward
/// slashes), whatever root it lies under: `.env*`, `.git/`, `target/`, `*.pem`, `id_*`,
/// `.cargo/credentials*`. Other tools that walk what a model can read (to hash it, say) use
/// this to agree with the sandbox.
#[doc(hidden)]
pub fn is_protected(relative_path: &str) -> bool {
    let comps: Vec<&str> = relative_path.split('/').filter(|c| !c.is_empty()).collect();
    protected_reason(&comps, true).is_some()
}

/// The first construct of the Rust source `content`, to be written at the tree path `vpath`,
/// that would read a file at compile time outside the generated tree or a protected one
/// (see `compile_time.rs`). The lock applies the same rule to what it records.
#[doc(hidden)]
pub fn forbidden_compile_time_read(vpath: &str, content: &str) -> Option<crate::compile_time::CompileTimeRead> {
    crate::compile_time::first_forbidden_read(vpath, content, &|path| {
        let comps: Vec<&str> = path.split('/').filter(|c| !c.is_empty()).collect();
        protected_reason(&comps, true)
    })
}

/// Why the path `comps` is protected, or None. `last_is_file` applies the file-name rules
/// (`*.pem`, `id_*`) to the last component.
fn protected_reason<S: AsRef<str>>(comps: &[S], last_is_file: bool) -> Option<&'static str> {
    let folded: Vec<String> = comps.iter().map(|c| fold(c.as_ref())).collect();
    let mut previous: Option<&str> = None;
    for comp in &folded {
        if comp.starts_with(".env") {
            return Some("`.env` files hold secrets");
        }
        if comp == ".git" {
            return Some("`.git` is version control");
        }
        if comp == "target" {
            return Some("`target` is build output");
        }
        if previous == Some(".cargo") && comp.starts_with("credentials") {
            return Some("`.cargo/credentials` holds registry tokens");
        }
        previous = Some(comp);
    }
    if last_is_file && let Some(name) = folded.last() {
        if name.ends_with(".pem") {
            return Some("`.pem` files hold keys and certificates");
        }
        if name.starts_with("id_") {
            return Some("`id_*` files hold SSH keys");
        }
    }
    None
}

/// A path safe to show: control characters escaped, long paths cut short.
fn shown(path: &str) -> String {
    const MAX_CHARS: usize = 200;
    let mut out = String::new();
    for (i, c) in path.chars().enumerate() {
        if i == MAX_CHARS {
            out.push('…');
            break;
        }
        if c.is_control() {
            out.extend(c.escape_debug());
        } else {
            out.push(c);
        }
    }
    out
}

/// "`a`, `b`, `c`" with at most `max` items, then "and N more".
fn quoted_list(items: &[String], max: usize) -> String {
    let mut list: Vec<String> = items.iter().take(max).map(|i| format!("`{i}`")).collect();
    if items.len() > max {
        list.push(format!("and {} more", items.len().saturating_sub(max)));
    }
    list.join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn ok(path: &str) -> Vec<String> {
        normalize(path).unwrap_or_else(|e| panic!("{path:?} refused: {e}"))
    }

    #[test]
    fn sandbox_normalises_dots_and_repeated_slashes() {
        assert_eq!(ok("./a//b/"), ["a", "b"]);
        assert_eq!(ok("a/./b"), ["a", "b"]);
        assert!(ok(".").is_empty());
        assert!(ok("./").is_empty());
        assert_eq!(ok("src/lib.rs"), ["src", "lib.rs"]);
        assert_eq!(ok("ünïcødé/файл.rs"), ["ünïcødé", "файл.rs"]);
    }

    #[test]
    fn sandbox_refuses_each_malformed_path_with_its_reason() {
        let cases = [
            ("", "empty"),
            ("   ", "empty"),
            ("a\0b", "NUL"),
            ("/etc/passwd", "absolute"),
            ("\\etc", "absolute"),
            ("C:\\x", "drive"),
            ("C:x", "drive"),
            ("c:/x", "drive"),
            ("\\\\server\\share", "network"),
            ("\\\\?\\C:\\x", "network"),
            ("a\\b", "forward slashes"),
            ("../x", "`..`"),
            ("a/../../x", "`..`"),
            ("a/..", "`..`"),
            ("a\nb", "control character"),
            ("a/b:c", "`:`"),
        ];
        for (path, fact) in cases {
            let reason = normalize(path).expect_err(path);
            assert!(reason.contains(fact), "{path:?}: {reason}");
        }
        assert!(normalize("/src/lib.rs").unwrap_err().contains("e.g. `src/lib.rs`"));
        assert!(normalize("a\\b").unwrap_err().contains("`a/b`"));
        // Regression (found by the property test below): ` /` was written as a file named ` `
        // that no later call could name.
        assert!(normalize(" /").unwrap_err().contains("only of spaces"));
        assert!(normalize("a/ /b.rs").unwrap_err().contains("only of spaces"));
    }

    #[test]
    fn sandbox_protected_paths_match_ignoring_case() {
        for path in [
            ".env",
            ".env.local",
            "a/.ENV",
            ".git/config",
            "x/.Git/HEAD",
            "target/debug/x",
            "crate/TARGET/x.rs",
            "certs/server.pem",
            "k.PEM",
            "ssh/id_rsa",
            "ID_ed25519.pub",
            ".cargo/credentials",
            ".cargo/credentials.toml",
            ".CARGO/Credentials.TOML",
            "target./x",
            ".git. /x",
            ".cargo/credentialſ",
        ] {
            let comps = ok(path);
            assert!(protected_reason(&comps, true).is_some(), "{path} should be protected");
        }
        for path in ["src/lib.rs", "environment.rs", "targets/x.rs", ".cargo/config.toml", "pem.rs", "my_id_x.rs"] {
            assert!(protected_reason(&ok(path), true).is_none(), "{path} should not be protected");
        }
        // File-name rules only apply to files.
        assert!(protected_reason(&ok("keys.pem"), false).is_none());
        assert!(protected_reason(&ok("id_dir/x.rs"), true).is_none());
    }

    #[test]
    fn sandbox_shown_paths_escape_control_characters_and_stay_short() {
        assert_eq!(shown("a\nb"), "a\\nb");
        let long = "é".repeat(500);
        assert_eq!(shown(&long).chars().count(), 201);
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(300))]

        #[test]
        fn sandbox_never_panics_or_escapes_on_any_model_string(
            path in prop_oneof![
                any::<String>(),
                "[a-zA-Z0-9._/\\\\:\\- \u{0}\n~é]{0,24}",
                "(\\.\\.|\\.|a|link|\\.env|target|C:|/|\\\\){0,6}",
            ]
        ) {
            let outside = tempfile::tempdir().unwrap();
            let dir = tempfile::tempdir().unwrap();
            let root = dir.path().join("out");
            std::fs::create_dir_all(root.join("a")).unwrap();
            std::fs::write(root.join("a/file.rs"), "x").unwrap();
            #[cfg(unix)]
            std::os::unix::fs::symlink(outside.path(), root.join("link")).unwrap();
            let mut sandbox = Sandbox::builder(&root).build().unwrap();
            let _ = sandbox.read_file(&path);
            let _ = sandbox.list_files(Some(&path));
            let _ = sandbox.output_exists(&path);
            if let Ok(outcome) = sandbox.write_file(&path, "y") {
                prop_assert!(sandbox.output_exists(&outcome.path));
            }
            prop_assert_eq!(std::fs::read_dir(outside.path()).unwrap().count(), 0);
            prop_assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
        }
    }
}
