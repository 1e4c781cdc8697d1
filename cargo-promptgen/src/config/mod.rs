//! The chain a package declares in its `Cargo.toml`, read, checked and fully resolved.
//!
//! [`load`] reads `[package.metadata.promptgen]` (and the defaults of
//! `[workspace.metadata.promptgen]`), applies the command line and the environment, and returns
//! a [`Chain`] in which every value is settled and every file it names exists. Every mistake is
//! a [`ConfigError`] that names the manifest with the line and column (`Cargo.toml:12:9`), the
//! exact key (a dotted path such as `package.metadata.promptgen.steps[1].prompt`) and what is
//! expected instead; nothing here panics on user input.
//!
//! # The declaration
//!
//! ```toml
//! [package.metadata.promptgen]
//! backend = "ollama"                    # "ollama" | "openai" | "scripted" (default "ollama")
//! model = "qwen2.5-coder:7b"            # required unless every step sets one
//! base_url = "http://127.0.0.1:11434"   # optional
//! seed = 123                            # optional integer >= 0
//! temperature = 0.0                     # optional number from 0 to 2
//! max_model_calls = 8                   # optional, >= 1: model calls per step, repairs included
//!                                       # (default Step::DEFAULT_MAX_MODEL_CALLS; old name: max_steps)
//! protocol = "native"                   # "native" | "json" | "blocks" (default "native")
//! constrain = "auto"                    # "auto" | "off": the server enforces the protocol where
//!                                       # it can (codegen_core::constrain); default "auto"
//! regenerate = "edit"                   # "edit" | "fresh": a stale step with recorded outputs
//!                                       # starts from them and changes what its change requires
//!                                       # ("edit", default), or writes them anew ("fresh")
//! system_prompt = "prompts/system.md"   # optional file, relative to the package directory
//! num_ctx = 16384                       # optional, >= 1: Ollama's context window
//! max_output_tokens = 4096              # optional, >= 1: the most tokens one reply may have
//! request_timeout_secs = 600            # optional, >= 1: a reply asked for whole
//! first_byte_timeout_secs = 300         # optional, >= 1: a streamed reply's silence before it
//!                                       # begins
//! idle_timeout_secs = 60                # optional, >= 1: a streamed reply's silence between
//!                                       # two of its pieces
//! check = "cargo check"                 # "cargo check" | "cargo test" | "rustc" | "none" |
//!                                       # ["cmd", "arg", ...]; default "cargo check" for steps
//!                                       # with .rs outputs, else "none"
//! check_rounds = 3                      # optional integer >= 0 (default Step::DEFAULT_CHECK_ROUNDS)
//! seed_retries = 0                      # optional integer >= 0: run a failed step again with
//!                                       # the next seed, up to this many times
//! store = "repo"                        # "repo" (default): files in promptgen/ | "cache": files in
//!                                       # the content-addressed cache, the lock alone committed
//! cache_url = "s3://bucket/prefix"      # optional: the cache's shared S3 remote (push, pull)
//! jobs = 1                              # optional, >= 1: steps `cargo promptgen` runs at once
//!                                       # (default 1; PROMPTGEN_JOBS and --jobs beat it)
//!
//! [[package.metadata.promptgen.steps]]
//! id = "01"                             # required, unique, [A-Za-z0-9_-]+
//! prompt = "../prompts/step_01_view.md" # required file, relative to the package directory
//! outputs = ["view.rs"]                 # optional relative forward-slash paths
//! inputs = ["src/domain.rs", "src"]     # optional existing files or folders
//! script = "../prompts/scripts/01.toml" # canned turns; required with backend "scripted"
//! after = ["01", "03"]                  # optional: the steps whose outputs this one builds on
//!                                       # ([] for none; default: the step before it in id order)
//! # optional per-step overrides: model, seed, temperature, max_model_calls, protocol,
//! # constrain, regenerate, system_prompt, check, check_rounds, seed_retries
//!
//! [package.metadata.promptgen.eval]     # optional: what `cargo promptgen eval` requires
//! min_pass_rate = 0.6                   # optional number from 0 to 1: the pass@1 every
//!                                       # step x model must reach
//! steps = { "01" = 0.8 }                # optional: per step, a rate that replaces it
//! ```
//!
//! `store`, `cache_url` and `jobs` never change a step's key: switching stores leaves the lock
//! as it is.
//!
//! `after` makes the chain a graph ([`crate::graph`]): every id it names must be a step of the
//! chain other than the step itself, the steps may not wait for each other in a cycle, and two
//! steps of which neither runs after the other (transitively) may not declare the same output
//! file. A step without `after` runs after the step before it in id order (the first step after
//! none), so chains written before `after` existed keep their meaning and their keys. The cache folder is `PROMPTGEN_CACHE_DIR` (an absolute path), else the user's cache
//! folder (see `store::default_dir`); `store = "cache"` without either is an error.
//!
//! `[workspace.metadata.promptgen]` may set every chain-level key except `steps` (and
//! `eval.steps`, which name one package's steps); its file paths are relative to the workspace
//! root. That root is the one cargo finds: the package's
//! own manifest if it has a `[workspace]` table, else the root `package.workspace` names, else
//! the nearest parent folder's `Cargo.toml` with a `[workspace]` table that does not `exclude`
//! the package (or that names its own root with `package.workspace`). A caller that knows the
//! root (from `cargo metadata`) passes it in [`Overrides::workspace_root`].
//!
//! Each key is declared once, in `schema.rs`'s `ChainTable` and `StepTable` (the keys they
//! share in `with_shared_keys!`); serde reads them and `serde_ignored` reports the keys nobody
//! declared. What serde cannot know is checked by hand (`tables.rs`, `after.rs`,
//! `workspace.rs`): files that must exist, the rules for paths, value ranges, the order of the
//! layers and where each value came from.
//!
//! # Precedence
//!
//! Strongest first: the command line ([`Overrides`]); `PROMPTGEN_BACKEND`, `PROMPTGEN_MODEL`,
//! `PROMPTGEN_BASE_URL`, `PROMPTGEN_JOBS`; the backend's own variables (`OLLAMA_HOST` for `ollama`, normalised
//! like Ollama's client does; `OPENAI_BASE_URL` and `OPENAI_API_KEY` for `openai`); the step's
//! own value; the package's chain-level value; the workspace's; the default. Empty (or
//! whitespace-only) flags and variables count as unset. Each resolved backend, model and base
//! URL records its [`Origin`], so messages can say where a value came from.
//!
//! # Paths
//!
//! Files named in the manifest are joined to their base folder and normalised lexically (`.`
//! dropped, `a/../b` folded), without resolving symbolic links. `..` is allowed there: prompts
//! commonly live in a sibling folder such as `../prompts`.
//!
//! An input's [`Input::virtual_path`] is the path the model sees. It is the path as written,
//! normalised (forward slashes, no `.` components, no empty components or trailing slash,
//! interior `a/..` folded); `..` components that remain at its start (an input outside the
//! package, such as `../prompts/shared.md`) are dropped from the virtual path, so that file
//! is seen as `prompts/shared.md`.
//!
//! A symbolic link inside an input folder is followed when it leads inside the package folder
//! (or inside that input folder); a link that leads anywhere else, to nothing, or to a folder
//! that holds it is a [`ConfigErrorKind::InputLink`] naming the link and its target. The
//! fingerprint and the sandbox walk input folders by the same rule
//! (`codegen_core::sandbox::input_files`).

mod after;
mod chain;
#[cfg(feature = "cli")]
mod edit;
mod error;
mod load;
mod paths;
mod schema;
mod source;
mod store;
mod tables;
mod workspace;

pub use chain::{
    Chain, CheckSpec, ENV_VARS, Origin, Overrides, PASS_RATES, Regenerate, StepConfig, TEMPERATURES, UnknownStep,
    is_step_id,
};
#[cfg(feature = "cli")]
pub use edit::with_store;
pub use error::{ConfigError, ConfigErrorKind, Location};
pub use load::{load, load_from_env};
pub use paths::output_path;
pub use store::{CacheUrl, StoreMode, StoreSettings};

#[cfg(test)]
mod tests {
    use super::schema::{ChainTable, EvalTable, StepTable};

    #[test]
    fn the_module_documentation_lists_every_key() {
        let docs = include_str!("mod.rs");
        let docs: String = docs.lines().take_while(|l| l.starts_with("//!")).collect::<Vec<_>>().join("\n");
        for key in ChainTable::KEYS.iter().chain(StepTable::KEYS) {
            let line = match *key {
                "steps" => "//! [[package.metadata.promptgen.steps]]".into(),
                "eval" => "//! [package.metadata.promptgen.eval]".into(),
                _ => format!("//! {key} = "),
            };
            assert!(docs.contains(&line), "the module documentation's schema lacks `{key}`");
        }
        for key in EvalTable::KEYS {
            assert!(docs.contains(&format!("//! {key} = ")), "the module documentation's schema lacks `eval.{key}`");
        }
    }

    /// `docs/schema.md` is the users' reference: every key is written there as `key = ` at the
    /// start of a line, and every such line under a promptgen table header is a real key.
    #[test]
    fn the_schema_page_lists_every_key_and_only_keys() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/schema.md");
        let page = std::fs::read_to_string(path)
            .unwrap_or_else(|e| panic!("cannot read {path} ({e}): docs/schema.md is the schema's reference"));
        let lines: Vec<&str> = page.lines().collect();
        for key in ChainTable::KEYS.iter().chain(StepTable::KEYS) {
            let line = match *key {
                "steps" => "[[package.metadata.promptgen.steps]]".into(),
                "eval" => "[package.metadata.promptgen.eval]".into(),
                _ => format!("{key} = "),
            };
            assert!(lines.iter().any(|l| l.starts_with(&line)), "docs/schema.md lacks `{line}`");
        }
        for key in EvalTable::KEYS {
            assert!(lines.iter().any(|l| l.starts_with(&format!("{key} = "))), "docs/schema.md lacks `eval.{key} = `");
        }
        // Under `[package.metadata.promptgen...]` and `[workspace.metadata.promptgen]` headers,
        // a `key = ` line must name a key of that table.
        let mut keys: Option<&[&str]> = None;
        for line in &lines {
            if line.starts_with('[') {
                keys = match line.trim_start_matches('[').trim_end_matches(']') {
                    "package.metadata.promptgen" | "workspace.metadata.promptgen" => Some(ChainTable::KEYS),
                    "package.metadata.promptgen.steps" => Some(StepTable::KEYS),
                    "package.metadata.promptgen.eval" => Some(EvalTable::KEYS),
                    _ => None,
                };
            } else if let (Some(keys), Some((key, _))) = (keys, line.split_once(" = ")) {
                let known = keys.contains(&key) || ChainTable::ALIASES.iter().any(|(alias, _)| *alias == key);
                assert!(
                    known || key.trim_start().starts_with('#'),
                    "docs/schema.md documents `{key}`, which is no key: {line}"
                );
            } else if line.starts_with("```") {
                keys = None;
            }
        }
    }
}
