//! A manifest's text: reading it, parsing it with `serde_ignored`, pointing into it (a byte
//! offset made a line and column), and the errors that name a key: serde's refusals and the
//! keys nobody declared.

use std::ops::Range;
use std::path::{Path, PathBuf};

use serde::de::DeserializeOwned;
use toml::Spanned;
use toml::de::{DeTable, DeValue};

use super::chain::{PACKAGE_PREFIX, WORKSPACE_PREFIX};
use super::error::{ConfigError, ConfigErrorKind, Location};
use super::schema::{ChainTable, EvalTable, StepTable, expected_of};

/// A manifest and its text, so that errors can say where.
pub(super) struct Source {
    pub(super) file: PathBuf,
    pub(super) text: String,
}

/// Where a table sits, for the hints of unknown keys.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Level {
    Package,
    Workspace,
    Step,
    /// `[package.metadata.promptgen.eval]`.
    Eval,
    /// `[workspace.metadata.promptgen.eval]`, where `steps` is an error.
    WorkspaceEval,
}

impl Source {
    pub(super) fn read(file: &Path) -> Result<Source, ConfigError> {
        let text = std::fs::read_to_string(file)
            .map_err(|source| ConfigError::new(file, None, None, ConfigErrorKind::Read { source }))?;
        Ok(Source { file: file.into(), text })
    }

    /// The line and column of the byte `offset`.
    pub(super) fn at(&self, offset: usize) -> Location {
        let before = self.text.get(..offset.min(self.text.len())).unwrap_or(&self.text);
        let line_start = before.rfind('\n').map_or(0, |i| i + 1);
        let count = |n: usize| u32::try_from(n).unwrap_or(u32::MAX).saturating_add(1);
        Location { line: count(before.matches('\n').count()), column: count(before[line_start..].chars().count()) }
    }

    /// The mistake `kind` about `key`, at the byte `offset`.
    pub(super) fn error(&self, offset: usize, key: impl Into<String>, kind: ConfigErrorKind) -> ConfigError {
        ConfigError::new(&self.file, Some(self.at(offset)), Some(key.into()), kind)
    }

    /// The text is not TOML (or not what serde expects where no key can be named).
    fn not_toml(&self, offset: usize, message: impl Into<String>) -> ConfigError {
        ConfigError::new(&self.file, Some(self.at(offset)), None, ConfigErrorKind::Parse { message: message.into() })
    }

    /// The document as `T`, reporting the first key nobody declared under one of `watched`
    /// (dotted prefixes such as `package.metadata.promptgen`) as [`ConfigErrorKind::UnknownKey`].
    pub(super) fn parse<T: DeserializeOwned>(&self, watched: &[&str]) -> Result<T, ConfigError> {
        let deserializer = toml::de::Deserializer::parse(&self.text).map_err(|e| self.syntax(&e))?;
        let mut unknown = Vec::new();
        let result = serde_ignored::deserialize(deserializer, |path| {
            let key = dotted(&path);
            if watched.iter().any(|prefix| key.strip_prefix(prefix).is_some_and(|rest| rest.starts_with('.'))) {
                unknown.push(key);
            }
        });
        // A misspelt key explains more than what follows from it.
        if let Some(key) = unknown.first() {
            return Err(self.unknown_key(key, 0));
        }
        result.map_err(|e| self.mistake(&e))
    }

    /// A TOML syntax error.
    fn syntax(&self, error: &toml::de::Error) -> ConfigError {
        self.not_toml(error.span().map_or(0, |s| s.start), error.to_string().trim_end())
    }

    /// The key `key`, which nobody declared, at its place (else at the byte `fallback`): the
    /// error lists the keys known in its table and suggests the one meant.
    pub(super) fn unknown_key(&self, key: &str, fallback: usize) -> ConfigError {
        let (table, name) = key.rsplit_once('.').unwrap_or(("", key));
        let level = if table.contains(".steps[") {
            Level::Step
        } else if table == format!("{WORKSPACE_PREFIX}.eval") {
            Level::WorkspaceEval
        } else if table == format!("{PACKAGE_PREFIX}.eval") {
            Level::Eval
        } else if table.starts_with("workspace.") {
            Level::Workspace
        } else {
            Level::Package
        };
        let (known, aliases) = match level {
            Level::Step => (StepTable::KEYS, StepTable::ALIASES),
            Level::Eval | Level::WorkspaceEval => (EvalTable::KEYS, EvalTable::ALIASES),
            Level::Package | Level::Workspace => (ChainTable::KEYS, ChainTable::ALIASES),
        };
        let in_workspace = matches!(level, Level::Workspace | Level::WorkspaceEval);
        let known: Vec<&str> = known.iter().copied().filter(|k| !in_workspace || *k != "steps").collect();
        let hint = unknown_key_hint(level, name, &known, aliases);
        let offset = Doc::parse(&self.text).and_then(|doc| doc.key_span(key)).map_or(fallback, |span| span.start);
        self.error(offset, key, ConfigErrorKind::UnknownKey { hint, known: quoted(known) })
    }

    /// A value serde refused, as the error that names its key and says what it must be.
    fn mistake(&self, error: &toml::de::Error) -> ConfigError {
        let span = error.span().unwrap_or(0..0);
        let message = error.message();
        let Some(doc) = Doc::parse(&self.text) else { return self.syntax(error) };
        let Some((key, value)) = doc.value_at(&span) else { return self.not_toml(span.start, message) };
        if message.starts_with("duplicate field") {
            // TOML refuses a key set twice, so serde sees one only when a key meets its old name.
            let aliases = if key.contains(".steps[") { StepTable::ALIASES } else { ChainTable::ALIASES };
            if let Some((old, new)) = aliases.iter().find(|(_, new)| message.contains(&format!("`{new}`"))) {
                let (old, new) = (format!("{key}.{old}"), format!("{key}.{new}"));
                let second = [&old, &new].iter().filter_map(|k| doc.key_span(k)).map(|s| s.start).max();
                return self.error(second.unwrap_or(span.start), new, ConfigErrorKind::SetTwice { old });
            }
        }
        // serde's own words for what it wanted, kept when the key has no description.
        let serde_expected = message.rsplit_once(", expected ").map(|(_, e)| e.to_string());
        let expected = expected_of(&key).or(serde_expected).unwrap_or_else(|| message.to_string());
        let raw = self.text.get(value.span()).unwrap_or_default().trim().to_string();
        let wrong_value = message.starts_with("invalid value")
            || message.starts_with("unknown variant")
            // An untagged value (`check`) of a type it can take, with the wrong contents.
            || (!message.starts_with("invalid type")
                && matches!(value.get_ref(), DeValue::String(_) | DeValue::Array(_)));
        let kind = if wrong_value {
            ConfigErrorKind::InvalidValue { value: raw, expected }
        } else {
            ConfigErrorKind::WrongType { expected, found: describe(value.get_ref()) }
        };
        self.error(span.start, key, kind)
    }
}

/// `package.metadata.promptgen.steps[0].promt`: a path as serde_ignored reports it, without
/// the wrappers (`Option`, `Spanned`) it passes through.
fn dotted(path: &serde_ignored::Path<'_>) -> String {
    use serde_ignored::Path as P;
    match path {
        P::Root => String::new(),
        P::Seq { parent, index } => format!("{}[{index}]", dotted(parent)),
        P::Map { parent, key } if key.starts_with("$__serde_spanned_private") => dotted(parent),
        P::Map { parent, key } => match dotted(parent) {
            parent if parent.is_empty() => key.clone(),
            parent => format!("{parent}.{key}"),
        },
        P::Some { parent } | P::NewtypeStruct { parent } | P::NewtypeVariant { parent } => dotted(parent),
    }
}

/// What to say of the key `name` that nobody declared in a table at `level`, where `known`
/// are the keys (and `aliases` the old names): ``; did you mean `x`?``, where it belongs, or `.`.
fn unknown_key_hint(
    level: Level,
    name: &str,
    known: &[&'static str],
    aliases: &[(&'static str, &'static str)],
) -> String {
    let step_only = |k: &&str| StepTable::KEYS.contains(k) && !ChainTable::KEYS.contains(k);
    let chain_only = |k: &&str| ChainTable::KEYS.contains(k) && !StepTable::KEYS.contains(k);
    if name == "api_key" {
        "; API keys do not belong in Cargo.toml: set OPENAI_API_KEY in the environment.".to_string()
    } else if matches!(level, Level::Package | Level::Workspace) && step_only(&name) {
        format!("; `{name}` belongs to a step: put it under `[[package.metadata.promptgen.steps]]`.")
    } else if level == Level::Step && chain_only(&name) {
        format!("; `{name}` applies to the whole chain: set it in `[package.metadata.promptgen]`.")
    } else if level == Level::Workspace && name == "steps" {
        "; steps are declared by each package, in `[[package.metadata.promptgen.steps]]`.".to_string()
    } else if level == Level::WorkspaceEval && name == "steps" {
        "; per-step rates name one package's steps: set them in that package's `[package.metadata.promptgen.eval]`."
            .to_string()
    } else {
        let candidates = known.iter().copied().chain(aliases.iter().map(|(old, _)| *old));
        match closest(name, candidates) {
            Some(candidate) => {
                let new = aliases.iter().find(|(old, _)| *old == candidate).map_or(candidate, |(_, new)| *new);
                format!("; did you mean `{new}`?")
            }
            None => ".".to_string(),
        }
    }
}

/// `` `a`, `b` ``: a list of keys or ids for a message.
pub(super) fn quoted<'s>(names: impl IntoIterator<Item = &'s str>) -> String {
    names.into_iter().map(|name| format!("`{name}`")).collect::<Vec<_>>().join(", ")
}

/// The known key nearest to `name`, if it is at most 2 edits away.
pub(super) fn closest<'k>(name: &str, known: impl Iterator<Item = &'k str>) -> Option<&'k str> {
    known
        .map(|k| (edit_distance(&name.to_ascii_lowercase(), k), k))
        .filter(|(d, _)| *d <= 2)
        .min_by_key(|(d, _)| *d)
        .map(|(_, k)| k)
}

fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut cur = vec![i + 1; b.len() + 1];
        for (j, cb) in b.iter().enumerate() {
            let cost = usize::from(ca != *cb);
            cur[j + 1] = (prev[j] + cost).min(prev[j + 1] + 1).min(cur[j] + 1);
        }
        prev = cur;
    }
    prev[b.len()]
}

fn describe(value: &DeValue<'_>) -> String {
    match value {
        DeValue::String(s) => format!("the string {s:?}"),
        DeValue::Integer(i) => format!("the integer {}", i.as_str()),
        DeValue::Float(f) => format!("the float {}", f.as_str()),
        DeValue::Boolean(b) => format!("the boolean {b}"),
        DeValue::Datetime(d) => format!("the datetime {d}"),
        DeValue::Array(_) => "an array".into(),
        DeValue::Table(_) => "a table".into(),
    }
}

/// A manifest parsed with the span of every key and value, to find what an error is about
/// (only errors need it).
pub(super) struct Doc<'t> {
    root: Spanned<DeValue<'t>>,
}

/// A key's dotted path (`a.steps[0].b`; an array's items are `a[0]`), its span, its value.
pub(super) type Entry<'a, 't> = (String, Range<usize>, &'a Spanned<DeValue<'t>>);

impl<'t> Doc<'t> {
    pub(super) fn parse(text: &'t str) -> Option<Doc<'t>> {
        let root = DeTable::parse(text).ok()?;
        Some(Doc { root: Spanned::new(root.span(), DeValue::Table(root.into_inner())) })
    }

    pub(super) fn entries(&self) -> Vec<Entry<'_, 't>> {
        fn walk<'a, 't>(
            path: String,
            key: Range<usize>,
            value: &'a Spanned<DeValue<'t>>,
            out: &mut Vec<Entry<'a, 't>>,
        ) {
            match value.get_ref() {
                DeValue::Table(table) => {
                    for (k, v) in table.iter() {
                        let inner =
                            if path.is_empty() { k.get_ref().to_string() } else { format!("{path}.{}", k.get_ref()) };
                        walk(inner, k.span(), v, out);
                    }
                }
                DeValue::Array(items) => {
                    for (i, item) in items.iter().enumerate() {
                        walk(format!("{path}[{i}]"), item.span(), item, out);
                    }
                }
                _ => {}
            }
            out.push((path, key, value));
        }
        let mut out = Vec::new();
        walk(String::new(), 0..0, &self.root, &mut out);
        out
    }

    /// The span of the key at the dotted path `key`.
    pub(super) fn key_span(&self, key: &str) -> Option<Range<usize>> {
        self.entries().into_iter().find(|(path, _, _)| path == key).map(|(_, span, _)| span)
    }

    /// The dotted path and the value of the smallest value whose span holds `span`.
    pub(super) fn value_at(&self, span: &Range<usize>) -> Option<(String, &Spanned<DeValue<'t>>)> {
        let holds = |s: &Range<usize>| s.start <= span.start && span.end <= s.end && !s.is_empty();
        let entries = self.entries().into_iter().filter(|(path, _, v)| !path.is_empty() && holds(&v.span()));
        // A value comes after what it holds, so of equal spans (an array of tables and its
        // item) the first, the deepest, wins.
        entries.min_by_key(|(_, _, v)| v.span().len()).map(|(path, _, value)| (path, value))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn edit_distance_and_suggestions() {
        assert_eq!(edit_distance("max_step", "max_steps"), 1);
        assert_eq!(edit_distance("", "abc"), 3);
        let keys = || ChainTable::KEYS.iter().copied();
        assert_eq!(closest("max_model_call", keys()), Some("max_model_calls"));
        assert_eq!(ChainTable::ALIASES, [("max_steps", "max_model_calls")]);
        assert!(StepTable::expected("max_steps").is_some());
        assert_eq!(closest("Model", keys()), Some("model"));
        assert_eq!(closest("completely_else", keys()), None);
    }

    #[test]
    fn locations_count_lines_and_characters_from_one() {
        let src = Source { file: "Cargo.toml".into(), text: "a = 1\nbé = 2\n".into() };
        assert_eq!(src.at(0), Location { line: 1, column: 1 });
        assert_eq!(src.at(6), Location { line: 2, column: 1 });
        assert_eq!(src.at(10), Location { line: 2, column: 4 });
        assert_eq!(src.at(999).line, 3);
    }
}
