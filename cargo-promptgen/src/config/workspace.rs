//! The workspace a package belongs to, found as cargo finds it, and what the package inherits
//! from it (its edition).

use std::path::{Path, PathBuf};

use toml::Spanned;

use super::chain::WORKSPACE_PREFIX;
use super::error::{ConfigError, ConfigErrorKind};
use super::paths::{absolute, lexical_join};
use super::schema::{Edition, Manifest, PackageTable, Probe, ProbeWorkspace, RootManifest, WorkspaceTable};
use super::source::Source;
use super::tables::Ctx;

/// `package.edition`, or the workspace's `workspace.package.edition` when the package
/// inherits it; `2015` when absent, as cargo does.
pub(super) fn package_edition(
    src: &Source,
    package: &PackageTable,
    workspace: Option<&WorkspaceTable>,
) -> Result<String, ConfigError> {
    let Some(edition) = &package.edition else { return Ok("2015".into()) };
    let error = |kind| src.error(edition.span().start, "package.edition", kind);
    match edition.get_ref() {
        Edition::Named(name) => Ok(name.clone()),
        Edition::Inherited { workspace: true } => {
            workspace.and_then(|ws| ws.package.as_ref()?.edition.clone()).ok_or_else(|| {
                let hint =
                    "`edition.workspace = true` needs `[workspace.package] edition = ...` in the workspace's Cargo.toml";
                error(ConfigErrorKind::Missing { hint: hint.into() })
            })
        }
        Edition::Inherited { workspace: false } => Err(error(ConfigErrorKind::WrongType {
            expected: "a string such as \"2021\", or `{ workspace = true }`".into(),
            found: "`{ workspace = false }`".into(),
        })),
    }
}

/// The workspace a package belongs to: its root folder, and the root's manifest when it is
/// not the package's own.
pub(super) struct WorkspaceRoot {
    pub(super) dir: PathBuf,
    pub(super) manifest: Option<(Source, RootManifest)>,
}

impl WorkspaceRoot {
    /// The workspace whose root is `dir`, if `dir/Cargo.toml` has a `[workspace]` table.
    fn open(dir: &Path) -> Result<Option<WorkspaceRoot>, ConfigError> {
        let src = Source::read(&dir.join("Cargo.toml"))?;
        let root: RootManifest = src.parse(&[WORKSPACE_PREFIX])?;
        Ok(root.workspace.is_some().then(|| WorkspaceRoot { dir: dir.to_path_buf(), manifest: Some((src, root)) }))
    }
}

/// Finds the workspace of the package in `package_dir` the way cargo does:
///
/// 1. the root the caller was told ([`Overrides::workspace_root`](super::chain::Overrides::workspace_root),
///    from `cargo metadata`);
/// 2. else the package's own manifest, when it has a `[workspace]` table;
/// 3. else the root that `package.workspace = "path"` names;
/// 4. else the nearest manifest in the parent folders with a `[workspace]` table that does not
///    exclude the package (cargo walks on past a workspace that excludes it), or that itself
///    names its root with `package.workspace`. The walk stops below a `target/package` folder,
///    as cargo's does.
pub(super) fn find_workspace(
    src: &Source,
    manifest: &Manifest,
    package_dir: &Path,
    told: Option<&Path>,
) -> Result<Option<WorkspaceRoot>, ConfigError> {
    let own = || WorkspaceRoot { dir: package_dir.to_path_buf(), manifest: None };
    if let Some(root) = told.map(absolute) {
        return if root == package_dir {
            Ok(manifest.workspace.is_some().then(own))
        } else {
            WorkspaceRoot::open(&root)
        };
    }
    if manifest.workspace.is_some() {
        return Ok(Some(own()));
    }
    if let Some(pointer) = manifest.package.as_ref().and_then(|p| p.get_ref().workspace.as_ref()) {
        return named_root(src, pointer, package_dir).map(Some);
    }
    let package_manifest = package_dir.join("Cargo.toml");
    for dir in package_dir.ancestors().skip(1).take_while(|dir| !dir.ends_with("target/package")) {
        let candidate = dir.join("Cargo.toml");
        if !candidate.is_file() {
            continue;
        }
        let ancestor = Source::read(&candidate)?;
        let probe: Probe = ancestor.parse(&[])?;
        match (probe.workspace, probe.package.and_then(|p| p.workspace)) {
            (Some(ws), _) if !ws.excludes(dir, &package_manifest) => return WorkspaceRoot::open(dir),
            (Some(_), _) => {}
            (None, Some(pointer)) => return named_root(&ancestor, &pointer, dir).map(Some),
            (None, None) => {}
        }
    }
    Ok(None)
}

/// The workspace whose root `package.workspace = pointer` names, in the manifest `src` of the
/// folder `dir`.
fn named_root(src: &Source, pointer: &Spanned<String>, dir: &Path) -> Result<WorkspaceRoot, ConfigError> {
    let ctx = Ctx { src, prefix: "package".into(), base: dir };
    let root = lexical_join(dir, pointer.get_ref());
    ctx.file_at("workspace", pointer, root.join("Cargo.toml"), "workspace root's manifest")?;
    WorkspaceRoot::open(&root)?.ok_or_else(|| {
        let value = format!("{:?}", pointer.get_ref());
        let expected = format!(
            "the folder of a workspace root, but `{}` has no `[workspace]` table",
            root.join("Cargo.toml").display()
        );
        ctx.error(pointer, "workspace", ConfigErrorKind::InvalidValue { value, expected })
    })
}

impl ProbeWorkspace {
    /// Whether this workspace, rooted in `root`, leaves out the package whose manifest is
    /// `package_manifest`. Cargo's rule: an `exclude` entry holds it and no `members` entry
    /// does (both compared as paths, globs unexpanded).
    fn excludes(&self, root: &Path, package_manifest: &Path) -> bool {
        let holds = |paths: &[String]| paths.iter().any(|path| package_manifest.starts_with(lexical_join(root, path)));
        holds(&self.exclude) && !holds(&self.members)
    }
}
