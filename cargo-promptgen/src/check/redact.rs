//! The last filter on everything a check says to the model: what goes back to the model goes,
//! through it, to the model's server.
//!
//! Two rules, applied to every check's output:
//! - **Known secrets are withheld.** The values of the environment variables whose names say
//!   they may hold a secret (the checks run without them, but a test may find another way),
//!   and the contents of the package's protected files (`.env*`, keys, `.cargo/credentials*`)
//!   are replaced by `[secret withheld]` wherever they appear.
//! - **Quotes of files the model may not read are dropped** (for command checks, whose output
//!   has no structure to go by): a line that names a protected file or an absolute path
//!   outside the package and the tree, and the source lines (`12 | ...`) that follow it.
//!
//! Compiler diagnostics are filtered before this, span by span (see `diagnostics.rs`).

use std::path::{Path, PathBuf};

use codegen_core::check::may_hold_a_secret;

/// What replaces a secret.
pub const WITHHELD: &str = "[secret withheld]";

/// Secrets shorter than this are not looked for: they would match ordinary words.
const SHORTEST: usize = 6;

/// The known secrets of a check.
#[derive(Debug, Clone, Default)]
pub struct Redactor {
    secrets: Vec<String>,
    package_dir: PathBuf,
}

impl Redactor {
    /// The secrets of this process's environment and of the protected files of `package_dir`
    /// (and of `workspace_root`, when it is another folder), and the cargo home's credentials.
    pub fn for_package(package_dir: &Path, workspace_root: Option<&Path>) -> Redactor {
        let mut secrets: Vec<String> = std::env::vars_os()
            .filter(|(name, _)| name.to_str().is_some_and(may_hold_a_secret))
            .filter_map(|(_, value)| value.into_string().ok())
            .collect();
        let mut roots = vec![package_dir.to_path_buf()];
        roots.extend(workspace_root.filter(|root| *root != package_dir).map(Path::to_path_buf));
        for root in &roots {
            for file in protected_files(root) {
                secrets.extend(secrets_in(&file));
            }
        }
        let cargo_home = std::env::var_os("CARGO_HOME")
            .map(PathBuf::from)
            .or_else(|| std::env::var_os("HOME").map(|home| PathBuf::from(home).join(".cargo")));
        if let Some(home) = cargo_home {
            for name in ["credentials.toml", "credentials"] {
                secrets.extend(secrets_in(&home.join(name)));
            }
        }
        Redactor::new(secrets, package_dir)
    }

    fn new(secrets: Vec<String>, package_dir: &Path) -> Redactor {
        let mut secrets: Vec<String> =
            secrets.into_iter().map(|s| s.trim().to_string()).filter(|s| s.chars().count() >= SHORTEST).collect();
        // The longest first, so that a secret containing another is withheld whole.
        secrets.sort_by_key(|s| std::cmp::Reverse(s.len()));
        secrets.dedup();
        Redactor { secrets, package_dir: package_dir.to_path_buf() }
    }

    /// `text` with every known secret withheld.
    pub fn withhold(&self, text: &str) -> String {
        let mut text = text.to_string();
        for secret in &self.secrets {
            if text.contains(secret.as_str()) {
                text = text.replace(secret.as_str(), WITHHELD);
            }
        }
        text
    }

    /// `text` (a command's output) without the lines that quote a file the model may not
    /// read, and with every known secret withheld.
    pub fn filter_command_output(&self, text: &str, tree: &Path) -> String {
        let mut kept = Vec::new();
        let mut dropping_snippet = false;
        for line in text.lines() {
            if self.quotes_a_hidden_file(line, tree) {
                kept.push("(a line naming a file you may not read was withheld)".to_string());
                dropping_snippet = true;
                continue;
            }
            // The source lines of a rustc-style snippet: `   |`, `12 | text`, `   = note`.
            let trimmed = line.trim_start();
            let snippet = trimmed.starts_with('|')
                || trimmed.split_once(" |").is_some_and(|(n, _)| n.chars().all(|c| c.is_ascii_digit()))
                || trimmed.starts_with("= ");
            if dropping_snippet && snippet {
                continue;
            }
            dropping_snippet = false;
            kept.push(line.to_string());
        }
        self.withhold(&kept.join("\n"))
    }

    /// Whether `line` names a protected file, or an absolute path outside the package and the
    /// tree (the toolchain's and the dependencies' own files excepted: they are public).
    fn quotes_a_hidden_file(&self, line: &str, tree: &Path) -> bool {
        for word in line.split(|c: char| c.is_whitespace() || matches!(c, '`' | '\'' | '"' | '(' | ')' | ',' | ';')) {
            let path = word.split(':').next().unwrap_or(word);
            if path.is_empty() {
                continue;
            }
            let relative = path.trim_start_matches("./");
            if codegen_core::sandbox::is_protected(relative.trim_start_matches('/')) && looks_like_a_path(path) {
                return true;
            }
            if path.starts_with('/') {
                let path = Path::new(path);
                let inside = path.starts_with(&self.package_dir) || path.starts_with(tree) || is_public(path);
                if !inside {
                    return true;
                }
                if let Ok(rest) = path.strip_prefix(&self.package_dir)
                    && codegen_core::sandbox::is_protected(&rest.to_string_lossy())
                {
                    return true;
                }
            }
        }
        false
    }
}

/// Whether `word` looks like a file path rather than a word that happens to match a
/// protected name (`target` alone, say).
fn looks_like_a_path(word: &str) -> bool {
    word.contains('/') || word.starts_with(".env") || word.ends_with(".pem") || word.contains("id_")
}

/// The toolchain's and the cargo home's files: public sources, fine to quote.
fn is_public(path: &Path) -> bool {
    let text = path.to_string_lossy();
    text.contains("/.rustup/toolchains/")
        || text.contains("/.cargo/registry/src/")
        || text.contains("/.cargo/git/checkouts/")
}

/// The protected files under `root` (not in `target/` or `.git/`, at most six folders deep).
fn protected_files(root: &Path) -> Vec<PathBuf> {
    walkdir::WalkDir::new(root)
        .max_depth(6)
        .into_iter()
        .filter_entry(|e| {
            let name = e.file_name().to_string_lossy();
            !(e.file_type().is_dir() && e.depth() > 0 && (name == "target" || name == ".git" || name == "node_modules"))
        })
        .flatten()
        .filter(|e| e.file_type().is_file())
        .filter(|e| {
            let relative = e.path().strip_prefix(root).unwrap_or(e.path()).to_string_lossy().replace('\\', "/");
            codegen_core::sandbox::is_protected(&relative)
        })
        .map(|e| e.into_path())
        .collect()
}

/// The secrets of one file: each line, and the value of each `KEY=value` line.
fn secrets_in(file: &Path) -> Vec<String> {
    let Ok(text) = std::fs::read_to_string(file) else { return Vec::new() };
    let mut secrets = Vec::new();
    for line in text.lines().map(str::trim).filter(|l| !l.is_empty() && !l.starts_with('#')) {
        secrets.push(line.to_string());
        if let Some((_, value)) = line.split_once('=') {
            secrets.push(value.trim().trim_matches(|c| c == '"' || c == '\'').to_string());
        }
    }
    secrets
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_of_protected_files_and_the_environment_are_withheld_wherever_they_appear() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(".env"), "# comment\nAPI_KEY=\"sk-live-1234567890\"\nSHORT=abc\n").unwrap();
        std::fs::create_dir_all(dir.path().join("keys")).unwrap();
        std::fs::write(dir.path().join("keys/server.pem"), "-----BEGIN KEY-----\nMIIEvQIBADANBgkq\n").unwrap();
        std::fs::create_dir_all(dir.path().join("target")).unwrap();
        std::fs::write(dir.path().join("target/.env"), "IGNORED=not-a-secret-here\n").unwrap();
        let redactor = Redactor::for_package(dir.path(), None);
        let text =
            "the key is sk-live-1234567890, the line API_KEY=\"sk-live-1234567890\", the pem MIIEvQIBADANBgkq, abc";
        let shown = redactor.withhold(text);
        assert!(!shown.contains("sk-live") && !shown.contains("MIIEvQ"), "{shown}");
        assert!(shown.contains(WITHHELD) && shown.ends_with(", abc"), "short values are left: {shown}");
        assert_eq!(redactor.withhold("not-a-secret-here"), "not-a-secret-here", "target/ is not walked");
    }

    #[test]
    fn a_command_output_line_quoting_a_hidden_file_is_dropped_with_its_snippet() {
        let package = Path::new("/work/pkg");
        let tree = Path::new("/work/target/promptgen/check/pkg/01");
        let redactor = Redactor::new(Vec::new(), package);
        let output = "error: expected item\n --> /work/pkg/.env:1:1\n  |\n1 | API_KEY=sk-live\n  | ^^^\n\
                      warning: /etc/shadow:3 looked at\nerror in /work/pkg/src/main.rs:3:1\n  |\n3 | fn main() {}\n\
                      note: /root/.cargo/registry/src/x/serde-1.0/src/lib.rs:1 is fine\n";
        let shown = redactor.filter_command_output(output, tree);
        assert!(!shown.contains("sk-live") && !shown.contains("/etc/shadow") && !shown.contains(".env"), "{shown}");
        assert!(shown.contains("src/main.rs:3:1") && shown.contains("3 | fn main() {}"), "{shown}");
        assert!(shown.contains("serde-1.0"), "dependencies are public: {shown}");
        assert!(shown.contains("withheld"), "{shown}");
    }
}
