//! The tables checked by hand, for what serde cannot know: files that must exist, the rules
//! for paths, value ranges, unique ids; each chain-level table becomes a [`Layer`], each step a
//! [`DeclaredStep`].

use std::collections::BTreeMap;
use std::fmt;
use std::io;
use std::num::NonZeroU32;
use std::path::{Path, PathBuf};

use codegen_core::ToolProtocol;
use codegen_core::sandbox::{SandboxError, input_files};
use toml::Spanned;

use super::after::{GraphDecl, Named};
use super::error::{ConfigError, Location};
use super::paths::{input_virtual_path, lexical_join, output_path};
use super::schema::{CACHE_URL_EXPECTED, ChainTable, CheckValue, expected_of};
use super::source::{Source, closest};
use super::{CheckSpec, EvalSettings, Input, Origin, StepConfig};
use crate::cache::CacheUrl;

/// `[package.metadata.promptgen.eval]` over the workspace's: the package's `min_pass_rate`
/// beats the workspace's, and each rate of `steps` must be for a step of the chain.
pub(super) fn eval_settings(
    ctx: &Ctx<'_>,
    package: &ChainTable,
    layers: &[Layer<'_>],
    steps: &[StepConfig],
) -> Result<EvalSettings, ConfigError> {
    let min_pass_rate = layers.iter().find_map(|l| l.min_pass_rate);
    let mut per_step = BTreeMap::new();
    let declared = package.eval.as_ref().and_then(|e| e.get_ref().steps.as_ref());
    for (id, rate) in declared.map(Spanned::get_ref).into_iter().flatten() {
        let name = format!("eval.steps.{id}");
        if steps.iter().all(|s| s.id != *id) {
            let ids = || steps.iter().map(|s| s.id.as_str());
            return Err(ConfigError::UnknownKey {
                file: ctx.src.file.clone(),
                at: ctx.src.at_span(rate),
                key: ctx.key(&name),
                hint: match closest(id, ids()) {
                    Some(near) => format!(": the chain has no step `{id}`; did you mean `{near}`?"),
                    None => format!(": the chain has no step `{id}`."),
                },
                known: ids().map(|s| format!("`{s}`")).collect::<Vec<_>>().join(", "),
            });
        }
        per_step.insert(id.clone(), ctx.rate(&name, rate)?);
    }
    Ok(EvalSettings { min_pass_rate, steps: per_step })
}

/// The value of an optional key, without its span.
pub(super) fn value<T: Copy>(key: &Option<Spanned<T>>) -> Option<T> {
    key.as_ref().map(|v| *v.get_ref())
}

/// One table being checked: the manifest, the table's dotted path, and the folder its paths
/// are relative to.
pub(super) struct Ctx<'a> {
    pub(super) src: &'a Source,
    pub(super) prefix: String,
    pub(super) base: &'a Path,
}

impl Ctx<'_> {
    pub(super) fn key(&self, name: &str) -> String {
        format!("{}.{name}", self.prefix)
    }

    fn invalid<T>(&self, name: &str, at: &Spanned<T>, value: impl fmt::Display) -> ConfigError {
        ConfigError::InvalidValue {
            file: self.src.file.clone(),
            at: self.src.at_span(at),
            key: self.key(name),
            value: value.to_string(),
            expected: expected_of(&self.key(name)).unwrap_or_default(),
        }
    }

    fn missing<T>(&self, name: &str, table: &Spanned<T>, hint: String) -> ConfigError {
        ConfigError::Missing { file: self.src.file.clone(), at: self.src.at_span(table), key: self.key(name), hint }
    }

    fn bad_path(&self, key: &str, at: &Spanned<String>, reason: String) -> ConfigError {
        ConfigError::BadPath {
            file: self.src.file.clone(),
            at: self.src.at_span(at),
            key: key.into(),
            value: at.get_ref().clone(),
            reason,
        }
    }

    fn non_empty(&self, name: &str, value: &Spanned<String>) -> Result<String, ConfigError> {
        match value.get_ref() {
            s if s.trim().is_empty() => Err(self.invalid(name, value, format!("{s:?}"))),
            s => Ok(s.clone()),
        }
    }

    /// A pass rate, from 0 to 1, at the key `name`.
    fn rate(&self, name: &str, value: &Spanned<f64>) -> Result<f64, ConfigError> {
        let rate = *value.get_ref();
        if (0.0..=1.0).contains(&rate) { Ok(rate) } else { Err(self.invalid(name, value, rate)) }
    }

    fn temperature(&self, value: &Spanned<f64>) -> Result<f64, ConfigError> {
        let t = *value.get_ref();
        if (0.0..=2.0).contains(&t) { Ok(t) } else { Err(self.invalid("temperature", value, t)) }
    }

    fn check(&self, value: &Spanned<CheckValue>) -> Result<CheckSpec, ConfigError> {
        match value.get_ref() {
            CheckValue::Word(word) if word == "cargo check" => Ok(CheckSpec::CargoCheck),
            CheckValue::Word(word) if word == "cargo test" => Ok(CheckSpec::CargoTest),
            CheckValue::Word(word) if word == "rustc" => Ok(CheckSpec::Rustc),
            CheckValue::Word(word) if word == "none" => Ok(CheckSpec::None),
            CheckValue::Command(words) if words.first().is_some_and(|w| !w.trim().is_empty()) => {
                Ok(CheckSpec::Command(words.clone()))
            }
            _ => {
                let written = self.src.text.get(value.span()).unwrap_or_default().trim();
                Err(self.invalid("check", value, written))
            }
        }
    }

    /// The file the key `name` names, relative to the table's folder; it must exist.
    fn existing_file(&self, name: &str, written: &Spanned<String>, what: &str) -> Result<PathBuf, ConfigError> {
        if written.get_ref().trim().is_empty() {
            return Err(ConfigError::InvalidValue {
                file: self.src.file.clone(),
                at: self.src.at_span(written),
                key: self.key(name),
                value: "\"\"".into(),
                expected: "a path to a file".into(),
            });
        }
        self.file_at(name, written, lexical_join(self.base, written.get_ref()), what)
    }

    /// `path`, which the key `name` names (as `written`), if it is a file.
    pub(super) fn file_at(
        &self,
        name: &str,
        written: &Spanned<String>,
        path: PathBuf,
        what: &str,
    ) -> Result<PathBuf, ConfigError> {
        match std::fs::metadata(&path) {
            Ok(meta) if meta.is_file() => Ok(path),
            Ok(_) => Err(ConfigError::NotAFile {
                file: self.src.file.clone(),
                at: self.src.at_span(written),
                key: self.key(name),
                value: written.get_ref().clone(),
                path,
                what: what.into(),
            }),
            Err(e) => Err(self.not_there(self.key(name), written, path, what.into(), e)),
        }
    }

    /// `path`, named by `key` as `written`, cannot be looked at: missing, or `error`.
    fn not_there(
        &self,
        key: String,
        written: &Spanned<String>,
        path: PathBuf,
        what: String,
        error: io::Error,
    ) -> ConfigError {
        let (file, at) = (self.src.file.clone(), self.src.at_span(written));
        match error.kind() {
            io::ErrorKind::NotFound => {
                ConfigError::FileNotFound { file, at, key, path, relative_to: self.base.into(), what }
            }
            _ => ConfigError::Unreadable { file, at, key, path, what, source: error },
        }
    }

    /// Why the input folder named by `key` (as `written`) cannot be walked.
    fn walk_error(&self, key: &str, written: &Spanned<String>, step_id: &str, error: SandboxError) -> ConfigError {
        let (file, at, key) = (self.src.file.clone(), self.src.at_span(written), key.to_string());
        match error {
            SandboxError::InputLink { link, target, reason } => {
                ConfigError::InputLink { file, at, key, link, target, reason }
            }
            SandboxError::Fs(e) => self.not_there(key, written, e.path, format!("input of step `{step_id}`"), e.source),
            other => {
                ConfigError::BadPath { file, at, key, value: written.get_ref().clone(), reason: other.to_string() }
            }
        }
    }

    fn outputs(&self, list: &[Spanned<String>]) -> Result<Vec<String>, ConfigError> {
        let mut outputs: Vec<String> = Vec::new();
        for (i, written) in list.iter().enumerate() {
            let bad = |reason: String| self.bad_path(&self.key(&format!("outputs[{i}]")), written, reason);
            let normalized = output_path(written.get_ref()).map_err(bad)?;
            if outputs.contains(&normalized) {
                return Err(bad("is listed twice".into()));
            }
            outputs.push(normalized);
        }
        Ok(outputs)
    }

    fn inputs(&self, list: &[Spanned<String>], step_id: &str) -> Result<Vec<Input>, ConfigError> {
        let mut inputs: Vec<Input> = Vec::new();
        for (i, written) in list.iter().enumerate() {
            let key = self.key(&format!("inputs[{i}]"));
            let bad = |reason: String| self.bad_path(&key, written, reason);
            let virtual_path = input_virtual_path(written.get_ref()).map_err(bad)?;
            let real_path = lexical_join(self.base, written.get_ref());
            let is_dir = match std::fs::metadata(&real_path) {
                Ok(meta) if meta.is_dir() => true,
                Ok(meta) if meta.is_file() => false,
                Ok(_) => {
                    return Err(bad(format!("names `{}`, which is neither a file nor a folder", real_path.display())));
                }
                Err(e) => return Err(self.not_there(key, written, real_path, format!("input of step `{step_id}`"), e)),
            };
            if is_dir {
                // Its links are followed inside the package only, as the fingerprint and the
                // sandbox follow them.
                input_files(&real_path, Some(self.base)).map_err(|e| self.walk_error(&key, written, step_id, e))?;
            }
            if inputs.iter().any(|i| i.virtual_path == virtual_path) {
                return Err(bad(format!(
                    "is seen by the model as `{virtual_path}`, like an earlier input of the step; list each input once"
                )));
            }
            inputs.push(Input { virtual_path, real_path, is_dir });
        }
        Ok(inputs)
    }
}

/// The keys a step shares with the chain-level tables, checked; `None` where a table is silent.
#[derive(Debug, Default)]
pub(super) struct Shared {
    pub(super) model: Option<String>,
    pub(super) seed: Option<u64>,
    pub(super) temperature: Option<f64>,
    pub(super) max_model_calls: Option<u32>,
    pub(super) protocol: Option<ToolProtocol>,
    pub(super) system_prompt: Option<PathBuf>,
    pub(super) check: Option<CheckSpec>,
    pub(super) check_rounds: Option<u32>,
    pub(super) seed_retries: Option<u32>,
}

/// The shared keys of `$table` (a `ChainTable` or a `StepTable`), checked in `$ctx`;
/// `$what` names the system prompt in messages.
macro_rules! check_shared {
    ($ctx:expr, $table:expr, $what:expr) => {{
        let (ctx, table): (&Ctx<'_>, _) = ($ctx, $table);
        Shared {
            model: table.model.as_ref().map(|v| ctx.non_empty("model", v)).transpose()?,
            seed: value(&table.seed),
            temperature: table.temperature.as_ref().map(|v| ctx.temperature(v)).transpose()?,
            max_model_calls: value(&table.max_model_calls).map(NonZeroU32::get),
            protocol: value(&table.protocol),
            system_prompt: table
                .system_prompt
                .as_ref()
                .map(|v| ctx.existing_file("system_prompt", v, $what))
                .transpose()?,
            check: table.check.as_ref().map(|v| ctx.check(v)).transpose()?,
            check_rounds: value(&table.check_rounds),
            seed_retries: value(&table.seed_retries),
        }
    }};
}

/// A chain-level table, checked.
pub(super) struct Layer<'a> {
    pub(super) origin: Origin,
    pub(super) table: &'a ChainTable,
    pub(super) shared: Shared,
    /// `cache_url`, checked.
    pub(super) cache_url: Option<CacheUrl>,
    /// Where `store` is set: the manifest, the place and the full key.
    pub(super) store_at: Option<(PathBuf, Location, String)>,
    /// `eval.min_pass_rate`, checked.
    pub(super) min_pass_rate: Option<f64>,
}

impl<'a> Layer<'a> {
    pub(super) fn check(ctx: &Ctx<'_>, table: &'a ChainTable, origin: Origin) -> Result<Layer<'a>, ConfigError> {
        if let Some(url) = &table.base_url {
            ctx.non_empty("base_url", url)?;
        }
        let cache_url = match &table.cache_url {
            Some(url) => Some(CacheUrl::parse(url.get_ref()).map_err(|reason| ConfigError::InvalidValue {
                file: ctx.src.file.clone(),
                at: ctx.src.at_span(url),
                key: ctx.key("cache_url"),
                value: format!("{:?}", url.get_ref()),
                expected: format!("{CACHE_URL_EXPECTED}; {reason}"),
            })?),
            None => None,
        };
        let store_at =
            table.store.as_ref().map(|store| (ctx.src.file.clone(), ctx.src.at_span(store), ctx.key("store")));
        let eval = table.eval.as_ref().map(Spanned::get_ref);
        let min_pass_rate = eval.and_then(|e| e.min_pass_rate.as_ref()).map(|r| ctx.rate("eval.min_pass_rate", r));
        Ok(Layer {
            origin,
            table,
            shared: check_shared!(ctx, table, "system prompt"),
            cache_url,
            store_at,
            min_pass_rate: min_pass_rate.transpose()?,
        })
    }
}

/// A step as declared and checked, its own values only.
pub(super) struct DeclaredStep {
    /// `package.metadata.promptgen.steps[i]`.
    pub(super) key: String,
    /// Where the step's table starts, a byte offset: [`Source::at`] scans the text, so it is
    /// made a line and column only for an error (once per step, that scan was quadratic).
    pub(super) at: usize,
    pub(super) id: String,
    pub(super) prompt: PathBuf,
    pub(super) prompt_display: String,
    pub(super) outputs: Vec<String>,
    pub(super) inputs: Vec<Input>,
    pub(super) script: Option<PathBuf>,
    pub(super) shared: Shared,
    pub(super) graph: GraphDecl,
}

pub(super) fn check_steps(ctx: &Ctx<'_>, chain: &Spanned<ChainTable>) -> Result<Vec<DeclaredStep>, ConfigError> {
    let empty_hint = || {
        "a chain needs at least one step: add a `[[package.metadata.promptgen.steps]]` table with \
         `id = \"01\"` and `prompt = \"prompts/01.md\"`"
            .to_string()
    };
    let list = match &chain.get_ref().steps {
        None => return Err(ctx.missing("steps", chain, empty_hint())),
        Some(list) if list.get_ref().is_empty() => return Err(ctx.missing("steps", list, empty_hint())),
        Some(list) => list.get_ref(),
    };
    let mut steps = Vec::with_capacity(list.len());
    let mut seen: BTreeMap<String, String> = BTreeMap::new();
    for (index, step) in list.iter().enumerate() {
        let ctx = Ctx { src: ctx.src, prefix: ctx.key(&format!("steps[{index}]")), base: ctx.base };
        let table = step.get_ref();
        let Some(id_value) = &table.id else {
            let hint = "every step needs a unique `id` of letters, digits, `_` and `-`, e.g. `id = \"01\"`";
            return Err(ctx.missing("id", step, hint.into()));
        };
        let id = id_value.get_ref().clone();
        if id.is_empty() || !id.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-') {
            return Err(ctx.invalid("id", id_value, format!("{id:?}")));
        }
        if let Some(first_key) = seen.get(&id) {
            return Err(ConfigError::DuplicateId {
                file: ctx.src.file.clone(),
                at: ctx.src.at_span(id_value),
                key: ctx.key("id"),
                id,
                first_key: first_key.clone(),
            });
        }
        seen.insert(id.clone(), ctx.key("id"));

        let what = |thing: &str| format!("{thing} of step `{id}`");
        let Some(prompt_value) = &table.prompt else {
            let hint = format!(
                "step `{id}` needs `prompt`, a file relative to the package folder `{}`, e.g. `prompt = \"prompts/{id}.md\"`",
                ctx.base.display()
            );
            return Err(ctx.missing("prompt", step, hint));
        };
        let prompt = ctx.existing_file("prompt", prompt_value, &what("prompt"))?;
        let shared = check_shared!(&ctx, table, &what("system prompt"));
        let script = table.script.as_ref().map(|s| ctx.existing_file("script", s, &what("script"))).transpose()?;
        let outputs = ctx.outputs(table.outputs.as_ref().map_or(&[], |l| l.get_ref()))?;
        let inputs = ctx.inputs(table.inputs.as_ref().map_or(&[], |l| l.get_ref()), &id)?;
        let places = |list: &[Spanned<String>], name: &str| -> Vec<(usize, String)> {
            list.iter().enumerate().map(|(j, v)| (v.span().start, ctx.key(&format!("{name}[{j}]")))).collect()
        };
        let after = table.after.as_ref().map(|list| {
            let list = list.get_ref();
            let places = places(list, "after");
            list.iter().zip(places).map(|(id, (at, key))| Named { id: id.get_ref().clone(), at, key }).collect()
        });
        let outputs_at = places(table.outputs.as_ref().map_or(&[], |l| l.get_ref()), "outputs");
        let graph = GraphDecl { id: id.clone(), after, outputs_at };
        steps.push(DeclaredStep {
            key: ctx.prefix.clone(),
            at: step.span().start,
            id,
            prompt,
            prompt_display: prompt_value.get_ref().clone(),
            outputs,
            inputs,
            script,
            shared,
            graph,
        });
    }
    Ok(steps)
}
