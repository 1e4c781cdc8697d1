//! The build-script entry: materialise the chain's generated tree into `$OUT_DIR/promptgen/`.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use crate::config::{self, Chain, Overrides};
use crate::error::Error;
use crate::generate::{regenerate, Destination, Progress};
use crate::layout::{target_dir_from_out_dir, Layout};
use crate::lock::LockedStep;
use crate::plan::{plan, stale_steps, Records, StepState};
use crate::store::{sync_dir_from, sync_dir_recorded, Files, Snapshot};
use crate::lock_file::PackageLock;

/// The subfolder of `OUT_DIR` that holds the generated tree.
pub const OUT_SUBDIR: &str = "promptgen";

/// The file in `OUT_DIR` that mounts every generated `.rs` file as a module (see
/// [`module_tree`]): `include!(concat!(env!("OUT_DIR"), "/promptgen.rs"));`.
pub const MODULES_FILE: &str = "promptgen.rs";

/// The file in `OUT_DIR` that records what the generated tree holds (each file's hash,
/// length and mtime), so that a build with nothing to write need not read it back (see
/// [`crate::store::sync_dir_recorded`]).
pub const RECORD_FILE: &str = "promptgen.record";

/// Variables that switch a build to offline mode: any non-empty value but `0` or `false`
/// for `PROMPTGEN_OFFLINE`, any value at all for `CI`.
pub const OFFLINE_VARS: &[&str] = &["PROMPTGEN_OFFLINE", "CI"];

/// Configures and runs the build-script entry. [`build`] is the one-call form.
#[derive(Debug, Clone, Default)]
pub struct Builder {
    manifest_dir: Option<PathBuf>,
    out_dir: Option<PathBuf>,
    target_dir: Option<PathBuf>,
    offline: Option<bool>,
    emit_cargo_directives: bool,
}

/// What a build did.
#[derive(Debug, Clone, PartialEq)]
pub struct BuildReport {
    /// Where the generated tree is.
    pub generated_dir: PathBuf,
    /// Files written this time (unchanged ones are left alone).
    pub files_written: usize,
    /// Steps that ran in this build (their results wait in the pending area).
    pub regenerated: Vec<String>,
    /// Steps whose results come from the pending area.
    pub pending: Vec<String>,
}

impl Builder {
    /// A builder that reads everything from the environment Cargo gives a build script.
    pub fn new() -> Builder {
        Builder { emit_cargo_directives: true, ..Builder::default() }
    }

    /// The package root (default: `CARGO_MANIFEST_DIR`).
    pub fn manifest_dir(&mut self, dir: impl Into<PathBuf>) -> &mut Builder {
        self.manifest_dir = Some(dir.into());
        self
    }

    /// Where the generated tree goes, under `promptgen/` (default: `OUT_DIR`).
    pub fn out_dir(&mut self, dir: impl Into<PathBuf>) -> &mut Builder {
        self.out_dir = Some(dir.into());
        self
    }

    /// Cargo's target folder, for the pending area and the file lock (default: found from
    /// `OUT_DIR`).
    pub fn target_dir(&mut self, dir: impl Into<PathBuf>) -> &mut Builder {
        self.target_dir = Some(dir.into());
        self
    }

    /// Forbids (or allows) model calls, whatever `PROMPTGEN_OFFLINE` and `CI` say.
    pub fn offline(&mut self, offline: bool) -> &mut Builder {
        self.offline = Some(offline);
        self
    }

    /// Whether to print `cargo:` directives (on by default; off for use outside build scripts).
    pub fn emit_cargo_directives(&mut self, emit: bool) -> &mut Builder {
        self.emit_cargo_directives = emit;
        self
    }

    /// Materialises the generated tree, regenerating stale steps when allowed.
    pub fn run(&self) -> Result<BuildReport, Error> {
        let manifest_dir = match &self.manifest_dir {
            Some(dir) => dir.clone(),
            None => env_path("CARGO_MANIFEST_DIR")?,
        };
        let out_dir = match &self.out_dir {
            Some(dir) => dir.clone(),
            None => env_path("OUT_DIR")?,
        };
        // What OUT_DIR holds is looked at on another thread while the store is read and
        // checked (nothing else writes OUT_DIR meanwhile).
        let generated_dir = out_dir.join(OUT_SUBDIR);
        let record = out_dir.join(RECORD_FILE);
        let look = {
            let (dir, record) = (generated_dir.clone(), record.clone());
            std::thread::Builder::new().name("promptgen-out-dir".into()).spawn(move || Snapshot::take(&dir, &record))
        };
        let chain = config::load_from_env(&manifest_dir.join("Cargo.toml"), &Overrides::default())?;
        if self.emit_cargo_directives {
            emit_rerun_directives(&chain);
        }
        let target_dir = match &self.target_dir {
            Some(dir) => dir.clone(),
            None => target_dir_from_out_dir(&out_dir).unwrap_or_else(|| out_dir.join("promptgen-target")),
        };
        let layout = Layout::new(&chain.package_dir, &chain.package_name, &target_dir);
        let _guard = PackageLock::acquire(&layout)?;

        let records = Records::read(&layout)?;
        let assessed = plan(&chain, &records)?;
        let stale = stale_steps(&assessed);
        // The tree, and each of its files' hash as the lock records it (a later step's file
        // replaces an earlier step's at the same path, in both: steps are in order).
        let mut assessed = assessed;
        let mut result;
        let (tree, entries, regenerated, pending) = if stale.is_empty() {
            let pending: Vec<String> =
                assessed.iter().filter(|a| a.state == StepState::Pending).map(|a| a.id.clone()).collect();
            let mut tree = Files::new();
            for step in &mut assessed {
                tree.extend(std::mem::take(&mut step.files));
            }
            let entries: Vec<&LockedStep> = assessed.iter().filter_map(|a| a.entry.as_ref()).collect();
            (tree, entries, Vec::new(), pending)
        } else {
            if let Some(reason) = self.offline_reason() {
                return Err(Error::Stale { package: chain.package_name.clone(), steps: stale, reason });
            }
            let mut show = |p: Progress| {
                if let Progress::StepStarted { id, .. } = p {
                    eprintln!("promptgen: regenerating step {id} of {}", layout.package_name);
                }
            };
            result = regenerate(&chain, &layout, &[], Destination::Pending, &mut show)?;
            let pending = result
                .steps
                .iter()
                .filter(|(_, state)| *state == StepState::Pending)
                .map(|(entry, _)| entry.id.clone())
                .collect();
            let (tree, regenerated) = (std::mem::take(&mut result.tree), std::mem::take(&mut result.regenerated));
            (tree, result.steps.iter().map(|(entry, _)| entry).collect(), regenerated, pending)
        };
        let hashes: HashMap<&str, &str> =
            entries.iter().flat_map(|e| &e.files).map(|f| (f.path.as_str(), f.sha256.as_str())).collect();

        // After a regeneration (minutes), look again rather than trust an old snapshot.
        let snapshot = look.ok().filter(|_| regenerated.is_empty()).and_then(|l| l.join().ok()).and_then(Result::ok);
        let files_written = match snapshot {
            Some(snapshot) => sync_dir_from(snapshot, &generated_dir, &tree, &hashes, &record)?,
            None => sync_dir_recorded(&generated_dir, &tree, &hashes, &record)?,
        };
        let modules = module_tree(&tree, &|file| format!("concat!(env!(\"OUT_DIR\"), \"/{OUT_SUBDIR}/{file}\")"));
        codegen_core::fs::write_if_changed_unsynced(&out_dir.join(MODULES_FILE), modules.as_bytes())?;
        if self.emit_cargo_directives && !pending.is_empty() {
            let list: Vec<&str> = pending.iter().map(String::as_str).collect();
            let verb = if regenerated.is_empty() { "come from" } else { "were regenerated by this build into" };
            println!(
                "cargo:warning=promptgen: steps {} of {} {verb} the pending area, not the lock; review them with `cargo promptgen diff -p {}` and record them with `cargo promptgen accept -p {}`",
                list.join(", "),
                chain.package_name,
                chain.package_name,
                chain.package_name,
            );
        }
        Ok(BuildReport { generated_dir, files_written, regenerated, pending })
    }

    fn offline_reason(&self) -> Option<String> {
        match self.offline {
            Some(true) => return Some("this build is offline".into()),
            Some(false) => return None,
            None => {}
        }
        let var = |name: &str| std::env::var(name).ok();
        if let Some(value) = var("PROMPTGEN_OFFLINE") {
            let value = value.trim();
            if !value.is_empty() && value != "0" && !value.eq_ignore_ascii_case("false") {
                return Some("PROMPTGEN_OFFLINE is set, so the build may not call a model".into());
            }
        }
        if var("CI").is_some() {
            return Some("CI is set, so the build may not call a model (CI builds only from the committed lock)".into());
        }
        None
    }
}

/// The one-call build-script entry: `fn main() -> Result<(), cargo_promptgen::Error> { cargo_promptgen::build() }`.
pub fn build() -> Result<(), Error> {
    Builder::new().run().map(|_| ())
}

fn env_path(name: &'static str) -> Result<PathBuf, Error> {
    std::env::var_os(name)
        .map(PathBuf::from)
        .ok_or(Error::Env { name, hint: "call cargo_promptgen::build() from a build script, or set the path on the Builder" })
}

/// Tells Cargo to run the build script again when anything that can change the tree changes.
fn emit_rerun_directives(chain: &Chain) {
    let mut paths: Vec<&Path> = vec![&chain.manifest_path];
    let lock = chain.package_dir.join(crate::lock::LOCK_FILE);
    let store = chain.package_dir.join(crate::layout::STORE_DIR);
    paths.push(&lock);
    paths.push(&store);
    for step in &chain.steps {
        paths.push(&step.prompt);
        paths.extend(step.system_prompt.as_deref());
        paths.extend(step.script.as_deref());
        paths.extend(step.inputs.iter().map(|i| i.real_path.as_path()));
    }
    let mut seen = std::collections::BTreeSet::new();
    for path in paths {
        if seen.insert(path) {
            println!("cargo:rerun-if-changed={}", path.display());
        }
    }
    for var in config::ENV_VARS.iter().chain(OFFLINE_VARS) {
        println!("cargo:rerun-if-env-changed={var}");
    }
}

/// The module-mounting convention, in one place: every generated `dir/name.rs` whose path
/// parts are Rust identifiers becomes `pub mod dir { pub mod name { ... } }`, its text
/// `include!`d from the path expression `source(file)` gives (in a build,
/// `concat!(env!("OUT_DIR"), "/promptgen/dir/name.rs")`; in the compile check, the file in
/// the step's scratch tree). A crate mounts them all with
///
/// ```ignore
/// mod generated {
///     include!(concat!(env!("OUT_DIR"), "/promptgen.rs"));
/// }
/// ```
///
/// so generated files refer to each other as siblings (`super::view::View`). Because they
/// are `include!`d, they must not contain inner attributes or `//!` comments.
pub fn module_tree(tree: &Files, source: &dyn Fn(&str) -> String) -> String {
    #[derive(Default)]
    struct Node {
        file: Option<String>,
        children: std::collections::BTreeMap<String, Node>,
    }
    let mut root = Node::default();
    for path in tree.keys() {
        let Some(stem_path) = path.strip_suffix(".rs") else { continue };
        let parts: Vec<&str> = stem_path.split('/').collect();
        if !parts.iter().all(|p| is_identifier(p)) {
            continue;
        }
        let mut node = &mut root;
        for part in parts {
            node = node.children.entry(part.to_string()).or_default();
        }
        node.file = Some(path.clone());
    }
    fn render(node: &Node, depth: usize, source: &dyn Fn(&str) -> String, out: &mut String) {
        use std::fmt::Write as _;
        let indent = "    ".repeat(depth);
        for (name, child) in &node.children {
            let _ = writeln!(out, "{indent}pub mod {name} {{");
            if let Some(file) = &child.file {
                let _ = writeln!(out, "{indent}    include!({});", source(file));
            }
            render(child, depth + 1, source, out);
            let _ = writeln!(out, "{indent}}}");
        }
    }
    let mut out = String::from("// @generated by cargo-promptgen: one module per generated .rs file.\n");
    render(&root, 0, source, &mut out);
    out
}

fn is_identifier(word: &str) -> bool {
    const KEYWORDS: &[&str] = &[
        "as", "async", "await", "break", "const", "continue", "crate", "dyn", "else", "enum", "extern", "false", "fn",
        "for", "gen", "if", "impl", "in", "let", "loop", "match", "mod", "move", "mut", "pub", "ref", "return", "self",
        "static", "struct", "super", "trait", "true", "type", "unsafe", "use", "where", "while", "abstract", "become",
        "box", "do", "final", "macro", "override", "priv", "try", "typeof", "unsized", "virtual", "yield",
    ];
    let mut chars = word.chars();
    let starts_well = chars.next().is_some_and(|c| c == '_' || c.is_ascii_alphabetic());
    starts_well && word != "_" && chars.all(|c| c == '_' || c.is_ascii_alphanumeric()) && !KEYWORDS.contains(&word)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_rust_file_becomes_a_module_and_nothing_else_does() {
        let mut tree = Files::new();
        for path in ["view.rs", "ui/terminal.rs", "ui.rs", "README.md", "my-file.rs", "type.rs"] {
            tree.insert(path.to_string(), Vec::new());
        }
        let text = module_tree(&tree, &|file| format!("concat!(env!(\"OUT_DIR\"), \"/promptgen/{file}\")"));
        assert_eq!(
            text,
            "// @generated by cargo-promptgen: one module per generated .rs file.\n\
             pub mod ui {\n    include!(concat!(env!(\"OUT_DIR\"), \"/promptgen/ui.rs\"));\n    \
             pub mod terminal {\n        include!(concat!(env!(\"OUT_DIR\"), \"/promptgen/ui/terminal.rs\"));\n    }\n}\n\
             pub mod view {\n    include!(concat!(env!(\"OUT_DIR\"), \"/promptgen/view.rs\"));\n}\n"
        );
    }
}
