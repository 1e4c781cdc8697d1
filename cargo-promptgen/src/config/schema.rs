//! The declaration as serde reads it: each key once, with its type and what it must hold.

use std::collections::BTreeMap;
use std::fmt;
use std::num::{NonZeroU32, NonZeroU64};

use codegen_core::backend::BackendKind;
use codegen_core::{Constrain, ToolProtocol};

use super::chain::Regenerate;
use serde::Deserialize;
use serde::de::DeserializeOwned;
use toml::Spanned;

use super::chain::{PACKAGE_PREFIX, WORKSPACE_PREFIX};
use super::store::StoreMode;

/// Declares a table of the metadata: each key once, with its type and what it must hold (for
/// messages). Every key is optional to serde (`Option<Spanned<T>>`, so errors can point at
/// it); a required key is required by hand, with a message that says what to write.
/// `key | "old"` also accepts the key's old name.
macro_rules! keys_table {
    (
        $(#[$meta:meta])*
        struct $name:ident {
            $( $(#[doc = $doc:literal])* $key:ident $(| $alias:literal)? : $ty:ty => $expected:expr, )*
        }
    ) => {
        #[derive(Debug, Default, Deserialize)]
        $(#[$meta])*
        pub(super) struct $name {
            $( $(#[doc = $doc])* $(#[serde(alias = $alias)])? pub(super) $key: Option<Spanned<$ty>>, )*
        }

        impl $name {
            /// Its keys, as the manifest spells them.
            pub(super) const KEYS: &'static [&'static str] = &[$(stringify!($key)),*];
            /// Old names still accepted, each with the key it stands for.
            pub(super) const ALIASES: &'static [(&'static str, &'static str)] = &[$($(($alias, stringify!($key)),)?)*];

            /// What the key `name` (or its old name) must hold.
            pub(super) fn expected(name: &str) -> Option<String> {
                $( if name == stringify!($key) $(|| name == $alias)? { return Some(($expected).to_string()); } )*
                None
            }
        }
    };
}

/// [`keys_table!`] with the keys a step shares with the chain-level tables appended.
macro_rules! with_shared_keys {
    ($(#[$meta:meta])* struct $name:ident { $($own:tt)* }) => {
        keys_table! {
            $(#[$meta])*
            struct $name {
                $($own)*
                /// The model's name.
                model: String => "a string, non-empty (the model's name, e.g. \"qwen2.5-coder:7b\")",
                /// The sampling seed.
                seed: u64 => "a non-negative integer (e.g. 123)",
                /// The sampling temperature.
                temperature: f64 => TEMPERATURE_EXPECTED,
                /// Model calls per step, repairs included.
                max_model_calls | "max_steps": NonZeroU32 => "an integer of at least 1 (the model calls the step may make, e.g. 8)",
                /// How the model calls tools.
                protocol: ToolProtocol => one_of::<ToolProtocol>(),
                /// Whether the server is asked to enforce the protocol.
                constrain: Constrain => one_of::<Constrain>(),
                /// How a step with recorded outputs runs again.
                regenerate: Regenerate => one_of::<Regenerate>(),
                /// A file of instructions sent before the prompt.
                system_prompt: String => "a string (a file, relative to the manifest's folder)",
                /// The check the output must pass.
                check: CheckValue => CHECK_EXPECTED,
                /// Failed checks answered with a repair round.
                check_rounds: u32 => "a non-negative integer (repair rounds after a failed check, e.g. 3)",
                /// Runs of a failed step with the next seed.
                seed_retries: u32 => "a non-negative integer (runs with the next seed after a failed run, e.g. 2)",
            }
        }
    };
}

pub(super) const TEMPERATURE_EXPECTED: &str = "a number from 0 to 2 (e.g. 0.0)";
pub(super) const JOBS_EXPECTED: &str = "a positive integer (the steps `cargo promptgen` runs at once, e.g. 4)";
pub(super) const CHECK_EXPECTED: &str = "\"cargo check\", \"cargo test\", \"rustc\", \"none\", or a command as an array of strings (e.g. [\"make\", \"lint\"])";
pub(super) const CACHE_URL_EXPECTED: &str = "an S3 URL such as \"s3://my-bucket/promptgen\" (a bucket of 3 to 63 lower-case letters, \
     digits, dots and hyphens, and an optional key prefix)";

with_shared_keys! {
    /// `[package.metadata.promptgen]` and `[workspace.metadata.promptgen]` (where `steps` is an
    /// error).
    #[serde(expecting = "a table")]
    struct ChainTable {
        /// Which backend every step uses.
        backend: BackendKind => one_of::<BackendKind>(),
        /// The server's URL.
        base_url: String => "a string, non-empty (the server's URL)",
        /// Ollama's context window.
        num_ctx: NonZeroU32 => "a positive integer number of tokens (e.g. 16384)",
        /// The most tokens one reply may have.
        max_output_tokens: NonZeroU32 => "a positive integer number of tokens per model reply (e.g. 4096)",
        /// Time allowed for one model request.
        request_timeout_secs: NonZeroU64 => "a positive number of seconds (e.g. 600)",
        /// How long a streamed reply may be silent before it begins.
        first_byte_timeout_secs: NonZeroU64 => "a positive number of seconds (e.g. 300)",
        /// How long a streamed reply may be silent between two of its pieces.
        idle_timeout_secs: NonZeroU64 => "a positive number of seconds (e.g. 60)",
        /// Where the outputs the lock records are kept.
        store: StoreMode => one_of::<StoreMode>(),
        /// The cache's shared S3 remote.
        cache_url: String => CACHE_URL_EXPECTED,
        /// Steps run at once.
        jobs: NonZeroU32 => JOBS_EXPECTED,
        /// What `cargo promptgen eval` requires.
        eval: EvalTable => "a table (`[package.metadata.promptgen.eval]`)",
        /// The chain's steps.
        steps: Vec<Spanned<StepTable>> => "an array of tables (`[[package.metadata.promptgen.steps]]`)",
    }
}

with_shared_keys! {
    /// One `[[package.metadata.promptgen.steps]]` table.
    #[serde(expecting = "a table (`[[package.metadata.promptgen.steps]]`)")]
    struct StepTable {
        /// The step's unique id.
        id: String => "a string of ASCII letters, digits, `_` and `-` only, non-empty (e.g. \"01\" or \"view\")",
        /// The prompt file.
        prompt: String => "a string (a file, relative to the package folder)",
        /// Files the step must write.
        outputs: Vec<Spanned<String>> => "an array of relative paths, e.g. [\"view.rs\"]",
        /// Files and folders the model may read.
        inputs: Vec<Spanned<String>> => "an array of files or folders, e.g. [\"src/domain.rs\"]",
        /// Canned turns for the `scripted` backend.
        script: String => "a string (a file, relative to the package folder)",
        /// The steps whose outputs this one builds on.
        after: Vec<Spanned<String>> => "an array of step ids, e.g. [\"01\", \"03\"] ([] for none)",
    }
}

keys_table! {
    /// `[package.metadata.promptgen.eval]` (and the workspace's, without `steps`).
    #[serde(expecting = "a table")]
    struct EvalTable {
        /// The pass rate every step × model must reach.
        min_pass_rate: f64 => RATE_EXPECTED,
        /// Per step id, a rate that replaces `min_pass_rate`.
        steps: BTreeMap<String, Spanned<f64>> => "a table of step ids and pass rates, e.g. { \"01\" = 0.8 }",
    }
}

pub(super) const RATE_EXPECTED: &str = "a number from 0 to 1 (the share of trials that must pass, e.g. 0.8)";

/// `check` as written: a word or a command.
#[derive(Debug, Deserialize)]
#[serde(
    untagged,
    expecting = "\"cargo check\", \"cargo test\", \"rustc\", \"none\", or a command as an array of strings"
)]
pub(super) enum CheckValue {
    Word(String),
    Command(Vec<String>),
}

/// The parts of a package manifest `load` reads.
#[derive(Deserialize)]
pub(super) struct Manifest {
    pub(super) package: Option<Spanned<PackageTable>>,
    /// Set when the package is its own workspace root.
    pub(super) workspace: Option<Spanned<WorkspaceTable>>,
}

#[derive(Deserialize)]
#[serde(expecting = "a table")]
pub(super) struct PackageTable {
    pub(super) name: Option<Spanned<String>>,
    pub(super) edition: Option<Spanned<Edition>>,
    /// The path of the workspace root, when the package names it.
    pub(super) workspace: Option<Spanned<String>>,
    pub(super) metadata: Option<Metadata>,
}

#[derive(Deserialize)]
#[serde(untagged, expecting = "a string such as \"2021\", or `{ workspace = true }`")]
pub(super) enum Edition {
    Named(String),
    Inherited { workspace: bool },
}

#[derive(Deserialize)]
#[serde(expecting = "a table")]
pub(super) struct Metadata {
    pub(super) promptgen: Option<Spanned<ChainTable>>,
}

/// The parts of a `[workspace]` table `load` reads.
#[derive(Deserialize)]
#[serde(expecting = "a table")]
pub(super) struct WorkspaceTable {
    pub(super) package: Option<WorkspacePackage>,
    pub(super) metadata: Option<Metadata>,
}

#[derive(Deserialize)]
#[serde(expecting = "a table")]
pub(super) struct WorkspacePackage {
    pub(super) edition: Option<String>,
}

/// The workspace root's manifest, when it is not the package's.
#[derive(Deserialize)]
pub(super) struct RootManifest {
    pub(super) workspace: Option<Spanned<WorkspaceTable>>,
}

/// What the search for the workspace root reads of the manifests it meets on its way.
#[derive(Deserialize)]
pub(super) struct Probe {
    pub(super) package: Option<ProbePackage>,
    pub(super) workspace: Option<ProbeWorkspace>,
}

#[derive(Deserialize)]
#[serde(expecting = "a table")]
pub(super) struct ProbePackage {
    pub(super) workspace: Option<Spanned<String>>,
}

#[derive(Deserialize)]
#[serde(expecting = "a table")]
pub(super) struct ProbeWorkspace {
    #[serde(default)]
    pub(super) members: Vec<String>,
    #[serde(default)]
    pub(super) exclude: Vec<String>,
}

/// `one of "a", "b", "c"`: the names `T`'s own `Deserialize` accepts.
pub(super) fn one_of<T: DeserializeOwned>() -> String {
    let names: Vec<String> = variants::<T>().iter().map(|v| format!("\"{v}\"")).collect();
    format!("one of {}", names.join(", "))
}

/// The variant names of the enum `T`, as its derived `Deserialize` lists them when it refuses
/// a name.
pub(super) fn variants<T: DeserializeOwned>() -> &'static [&'static str] {
    match parse_word::<T>("") {
        Err(Refused { variants }) => variants,
        Ok(_) => &[],
    }
}

/// `word` read by `T`'s own `Deserialize` (a unit-variant enum such as [`BackendKind`]).
pub(super) fn parse_word<T: DeserializeOwned>(word: &str) -> Result<T, Refused> {
    T::deserialize(serde::de::value::StrDeserializer::<Refused>::new(word))
}

/// Why [`parse_word`] failed: the names that would have been accepted.
#[derive(Debug)]
pub(super) struct Refused {
    variants: &'static [&'static str],
}

impl fmt::Display for Refused {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "expected one of {:?}", self.variants)
    }
}

impl std::error::Error for Refused {}

impl serde::de::Error for Refused {
    fn custom<T: fmt::Display>(_: T) -> Refused {
        Refused { variants: &[] }
    }

    fn unknown_variant(_: &str, expected: &'static [&'static str]) -> Refused {
        Refused { variants: expected }
    }
}

/// What the promptgen key at the end of the dotted path `key` must hold, if it is one.
pub(super) fn expected_of(key: &str) -> Option<String> {
    let (table, name) = key.rsplit_once('.')?;
    let in_promptgen = [PACKAGE_PREFIX, WORKSPACE_PREFIX].iter().any(|p| table.starts_with(p));
    if !in_promptgen || name.ends_with(']') {
        None
    } else if table.contains(".steps[") {
        StepTable::expected(name)
    } else if table.ends_with(".eval.steps") {
        Some(format!("{RATE_EXPECTED}: the rate step `{name}` must reach"))
    } else if table.ends_with(".eval") {
        EvalTable::expected(name)
    } else {
        ChainTable::expected(name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn enum_names_come_from_their_own_deserialize() {
        assert_eq!(variants::<BackendKind>(), ["ollama", "openai", "scripted"]);
        assert_eq!(one_of::<ToolProtocol>(), "one of \"native\", \"json\", \"blocks\"");
        assert_eq!(parse_word::<BackendKind>("openai").unwrap(), BackendKind::OpenAi);
        assert!(parse_word::<BackendKind>("Ollama").is_err());
    }

    #[test]
    fn every_key_says_what_it_expects() {
        for key in ChainTable::KEYS {
            assert!(ChainTable::expected(key).is_some_and(|e| !e.is_empty()), "{key}");
        }
        for key in StepTable::KEYS {
            assert!(StepTable::expected(key).is_some_and(|e| !e.is_empty()), "{key}");
        }
        for key in EvalTable::KEYS {
            assert!(EvalTable::expected(key).is_some_and(|e| !e.is_empty()), "{key}");
        }
    }
}
