//! The tables checked by hand, for what serde cannot know: files that must exist, the rules
//! for paths, value ranges, unique ids; each chain-level table becomes a [`Layer`], each step a
//! [`DeclaredStep`].

use std::collections::BTreeMap;
use std::fmt;
use std::io;
use std::num::NonZeroU32;
use std::ops::RangeInclusive;
use std::path::{Path, PathBuf};

use codegen_core::sandbox::{SandboxError, input_files};
use codegen_core::{Constrain, ToolProtocol};

use super::chain::Regenerate;
use toml::Spanned;

use super::after::{GraphDecl, Written};
use super::chain::{CheckSpec, EvalSettings, Input, Origin, PASS_RATES, StepConfig, TEMPERATURES, is_step_id};
use super::error::{ConfigError, ConfigErrorKind};
use super::paths::{input_virtual_path, lexical_join, output_path};
use super::schema::{CACHE_URL_EXPECTED, ChainTable, CheckValue, expected_of};
use super::source::{Source, closest, quoted};
use super::store::CacheUrl;

/// `[package.metadata.promptgen.eval]` over the workspace's (`layers`, the package's first):
/// the package's `min_pass_rate` beats the workspace's, and each rate of `steps` must be for a
/// step of the chain.
pub(super) fn eval_settings(layers: &[Layer<'_>], steps: &[StepConfig]) -> Result<EvalSettings, ConfigError> {
    let min_pass_rate = layers.iter().find_map(|l| l.min_pass_rate);
    let mut per_step = BTreeMap::new();
    let Some(package) = layers.first() else { return Ok(EvalSettings { min_pass_rate, steps: per_step }) };
    let declared = package.table.eval.as_ref().and_then(|e| e.get_ref().steps.as_ref());
    for (id, rate) in declared.map(Spanned::get_ref).into_iter().flatten() {
        let name = format!("eval.steps.{id}");
        if steps.iter().all(|s| s.id != *id) {
            let ids = || steps.iter().map(|s| s.id.as_str());
            let hint = match closest(id, ids()) {
                Some(near) => format!(": the chain has no step `{id}`; did you mean `{near}`?"),
                None => format!(": the chain has no step `{id}`."),
            };
            return Err(package.ctx.error(rate, &name, ConfigErrorKind::UnknownKey { hint, known: quoted(ids()) }));
        }
        per_step.insert(id.clone(), package.ctx.in_range(&name, rate, PASS_RATES)?);
    }
    Ok(EvalSettings { min_pass_rate, steps: per_step })
}

/// The value of an optional key, without its span.
pub(super) fn value<T: Copy>(key: &Option<Spanned<T>>) -> Option<T> {
    key.as_ref().map(|v| *v.get_ref())
}

/// The items of an optional list key; none when it is absent.
fn items(list: &Option<Spanned<Vec<Spanned<String>>>>) -> &[Spanned<String>] {
    list.as_ref().map_or(&[], |l| l.get_ref())
}

/// One table being checked: the manifest, the table's dotted path, and the folder its paths
/// are relative to. Its methods take the name of a key in the table (`prompt`, `outputs[0]`).
pub(super) struct Ctx<'a> {
    pub(super) src: &'a Source,
    pub(super) prefix: String,
    pub(super) base: &'a Path,
}

impl Ctx<'_> {
    /// The full key of `name`.
    pub(super) fn key(&self, name: &str) -> String {
        format!("{}.{name}", self.prefix)
    }

    /// The mistake `kind` at the key `name`, whose value (or table) is `at`.
    pub(super) fn error<T>(&self, at: &Spanned<T>, name: &str, kind: ConfigErrorKind) -> ConfigError {
        self.src.error(at.span().start, self.key(name), kind)
    }

    /// `value`, at the key `name`, is not what the key expects.
    fn invalid<T>(&self, name: &str, at: &Spanned<T>, value: impl fmt::Display) -> ConfigError {
        let expected = expected_of(&self.key(name)).unwrap_or_default();
        self.error(at, name, ConfigErrorKind::InvalidValue { value: value.to_string(), expected })
    }

    fn missing<T>(&self, name: &str, table: &Spanned<T>, hint: String) -> ConfigError {
        self.error(table, name, ConfigErrorKind::Missing { hint })
    }

    fn bad_path(&self, name: &str, written: &Spanned<String>, reason: String) -> ConfigError {
        self.error(written, name, ConfigErrorKind::BadPath { value: written.get_ref().clone(), reason })
    }

    fn non_empty(&self, name: &str, value: &Spanned<String>) -> Result<String, ConfigError> {
        match value.get_ref() {
            s if s.trim().is_empty() => Err(self.invalid(name, value, format!("{s:?}"))),
            s => Ok(s.clone()),
        }
    }

    /// A number in `range` at the key `name`.
    fn in_range(&self, name: &str, value: &Spanned<f64>, range: RangeInclusive<f64>) -> Result<f64, ConfigError> {
        let number = *value.get_ref();
        if range.contains(&number) { Ok(number) } else { Err(self.invalid(name, value, number)) }
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
            let kind = ConfigErrorKind::InvalidValue { value: "\"\"".into(), expected: "a path to a file".into() };
            return Err(self.error(written, name, kind));
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
            Ok(_) => {
                let kind = ConfigErrorKind::NotAFile { value: written.get_ref().clone(), path, what: what.into() };
                Err(self.error(written, name, kind))
            }
            Err(e) => Err(self.not_there(name, written, path, what.into(), e)),
        }
    }

    /// `path`, named by the key `name` as `written`, cannot be looked at: missing, or `error`.
    fn not_there(
        &self,
        name: &str,
        written: &Spanned<String>,
        path: PathBuf,
        what: String,
        error: io::Error,
    ) -> ConfigError {
        let kind = match error.kind() {
            io::ErrorKind::NotFound => ConfigErrorKind::FileNotFound { path, relative_to: self.base.into(), what },
            _ => ConfigErrorKind::Unreadable { path, what, source: error },
        };
        self.error(written, name, kind)
    }

    /// Why the input folder named by the key `name` (as `written`) cannot be walked.
    fn walk_error(&self, name: &str, written: &Spanned<String>, step_id: &str, error: SandboxError) -> ConfigError {
        match error {
            SandboxError::InputLink { link, target, reason } => {
                self.error(written, name, ConfigErrorKind::InputLink { link, target, reason })
            }
            SandboxError::Fs(e) => {
                self.not_there(name, written, e.path, format!("input of step `{step_id}`"), e.source)
            }
            other => self.bad_path(name, written, other.to_string()),
        }
    }

    fn outputs(&self, list: &[Spanned<String>]) -> Result<Vec<String>, ConfigError> {
        let mut outputs: Vec<String> = Vec::new();
        for (i, written) in list.iter().enumerate() {
            let bad = |reason: String| self.bad_path(&format!("outputs[{i}]"), written, reason);
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
            let name = format!("inputs[{i}]");
            let bad = |reason: String| self.bad_path(&name, written, reason);
            let virtual_path = input_virtual_path(written.get_ref()).map_err(bad)?;
            let real_path = lexical_join(self.base, written.get_ref());
            let is_dir = match std::fs::metadata(&real_path) {
                Ok(meta) if meta.is_dir() => true,
                Ok(meta) if meta.is_file() => false,
                Ok(_) => {
                    return Err(bad(format!("names `{}`, which is neither a file nor a folder", real_path.display())));
                }
                Err(e) => {
                    return Err(self.not_there(&name, written, real_path, format!("input of step `{step_id}`"), e));
                }
            };
            if is_dir {
                // Its links are followed inside the package only, as the fingerprint and the
                // sandbox follow them.
                input_files(&real_path, Some(self.base)).map_err(|e| self.walk_error(&name, written, step_id, e))?;
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
    pub(super) constrain: Option<Constrain>,
    pub(super) regenerate: Option<Regenerate>,
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
            temperature: table
                .temperature
                .as_ref()
                .map(|v| ctx.in_range("temperature", v, TEMPERATURES))
                .transpose()?,
            max_model_calls: value(&table.max_model_calls).map(NonZeroU32::get),
            protocol: value(&table.protocol),
            constrain: value(&table.constrain),
            regenerate: value(&table.regenerate),
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
    /// Where it is: its manifest and dotted path, and the folder its paths are relative to.
    pub(super) ctx: Ctx<'a>,
    pub(super) origin: Origin,
    pub(super) table: &'a ChainTable,
    pub(super) shared: Shared,
    /// `cache_url`, checked.
    pub(super) cache_url: Option<CacheUrl>,
    /// `eval.min_pass_rate`, checked.
    pub(super) min_pass_rate: Option<f64>,
}

impl<'a> Layer<'a> {
    pub(super) fn check(ctx: Ctx<'a>, table: &'a ChainTable, origin: Origin) -> Result<Layer<'a>, ConfigError> {
        if let Some(url) = &table.base_url {
            ctx.non_empty("base_url", url)?;
        }
        let cache_url = match &table.cache_url {
            Some(url) => Some(CacheUrl::parse(url.get_ref()).map_err(|reason| {
                let (value, expected) = (format!("{:?}", url.get_ref()), format!("{CACHE_URL_EXPECTED}; {reason}"));
                ctx.error(url, "cache_url", ConfigErrorKind::InvalidValue { value, expected })
            })?),
            None => None,
        };
        let shared = check_shared!(&ctx, table, "system prompt");
        let eval = table.eval.as_ref().map(Spanned::get_ref);
        let min_pass_rate = eval
            .and_then(|e| e.min_pass_rate.as_ref())
            .map(|r| ctx.in_range("eval.min_pass_rate", r, PASS_RATES))
            .transpose()?;
        Ok(Layer { ctx, origin, table, shared, cache_url, min_pass_rate })
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
        if !is_step_id(&id) {
            return Err(ctx.invalid("id", id_value, format!("{id:?}")));
        }
        if let Some(first_key) = seen.get(&id) {
            return Err(ctx.error(id_value, "id", ConfigErrorKind::DuplicateId { id, first_key: first_key.clone() }));
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
        let outputs = ctx.outputs(items(&table.outputs))?;
        let inputs = ctx.inputs(items(&table.inputs), &id)?;
        let written = |list: &[Spanned<String>], name: &str| -> Vec<Written> {
            let item = |(j, v): (usize, &Spanned<String>)| Written {
                value: v.get_ref().clone(),
                at: v.span().start,
                key: ctx.key(&format!("{name}[{j}]")),
            };
            list.iter().enumerate().map(item).collect()
        };
        let after = table.after.as_ref().map(|list| written(list.get_ref(), "after"));
        let graph = GraphDecl { after, outputs: written(items(&table.outputs), "outputs") };
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
