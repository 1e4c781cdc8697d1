//! [`load`]: the manifest (and its workspace's) read as layers, the chain-level settings
//! resolved over the layers, the command line and the environment, then the steps over them.

use std::num::{NonZeroU32, NonZeroU64};
use std::path::{Path, PathBuf};
use std::time::Duration;

use codegen_core::backend::ollama::parse_host;
use codegen_core::backend::{BackendConfig, BackendKind, HttpConfig};
use toml::Spanned;

use super::after::{GraphDecl, resolve_graph};
use super::chain::{Chain, CheckSpec, Origin, Overrides, PACKAGE_PREFIX, StepConfig, WORKSPACE_PREFIX, from_phrase};
use super::error::{ConfigError, ConfigErrorKind};
use super::paths::absolute;
use super::schema::{ChainTable, JOBS_EXPECTED, Manifest, one_of, parse_word};
use super::source::Source;
use super::store::{StoreMode, StoreSettings, default_dir};
use super::tables::{Ctx, DeclaredStep, Layer, check_steps, eval_settings, value};
use super::workspace::{find_workspace, package_edition};

/// Loads with `std::env::var` as the environment.
pub fn load_from_env(manifest_path: &Path, overrides: &Overrides) -> Result<Chain, ConfigError> {
    load(manifest_path, overrides, &|name| std::env::var(name).ok())
}

/// Reads the package manifest at `manifest_path` (a `Cargo.toml`, or the folder holding one)
/// and the workspace's, applies `overrides` and the variables of
/// [`ENV_VARS`](super::chain::ENV_VARS) as `env` returns them, and checks the result.
pub fn load(
    manifest_path: &Path,
    overrides: &Overrides,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Chain, ConfigError> {
    let mut manifest_path = absolute(manifest_path);
    if manifest_path.is_dir() {
        manifest_path.push("Cargo.toml");
    }
    let src = Source::read(&manifest_path)?;
    let package_dir = manifest_path.parent().map(Path::to_path_buf).unwrap_or_else(|| PathBuf::from("."));
    let manifest: Manifest = src.parse(&[PACKAGE_PREFIX, WORKSPACE_PREFIX])?;

    // The layers: the package's table, then the workspace's.
    let no_package = |offset| src.error(offset, "package.name", ConfigErrorKind::NoPackage);
    let package = manifest.package.as_ref().ok_or_else(|| no_package(0))?;
    let package_at = package.span().start;
    let package_name = package.get_ref().name.as_ref().ok_or_else(|| no_package(package_at))?.get_ref().clone();
    let chain_table = package.get_ref().metadata.as_ref().and_then(|m| m.promptgen.as_ref());
    let chain_table = chain_table.ok_or_else(|| src.error(package_at, PACKAGE_PREFIX, ConfigErrorKind::NoChain))?;
    let package_ctx = Ctx { src: &src, prefix: PACKAGE_PREFIX.into(), base: &package_dir };
    let package_layer = Layer::check(package_ctx, chain_table.get_ref(), Origin::Package)?;
    let declared = check_steps(&package_layer.ctx, chain_table)?;

    let workspace = find_workspace(&src, &manifest, &package_dir, overrides.workspace_root.as_deref())?;
    let workspace_table = workspace.as_ref().and_then(|ws| {
        let (ws_src, table) = match &ws.manifest {
            None => (&src, manifest.workspace.as_ref()?),
            Some((ws_src, root)) => (ws_src, root.workspace.as_ref()?),
        };
        Some((ws_src, table.get_ref(), ws.dir.as_path()))
    });
    let mut layers = vec![package_layer];
    if let Some((ws_src, table, root)) = workspace_table
        && let Some(chain) = table.metadata.as_ref().and_then(|m| m.promptgen.as_ref())
    {
        layers.push(workspace_layer(ws_src, chain, root)?);
    }

    // The chain, then its steps.
    let given = Given { overrides, env, manifest_path: &manifest_path };
    let (backend, backend_origin, base_url_origin) = backend(&layers, &given)?;
    let jobs = jobs(&layers, &given)?;
    let steps = steps(&src, &layers, &given, &backend, backend_origin, declared, chain_table)?;
    let (mut steps, declared): (Vec<StepConfig>, Vec<GraphDecl>) = steps.into_iter().unzip();
    let graph = resolve_graph(&src, &mut steps, &declared)?;
    let eval = eval_settings(&layers, &steps)?;
    let edition = package_edition(&src, package.get_ref(), workspace_table.map(|(_, table, _)| table))?;
    let store = store(&layers, &given)?;

    Ok(Chain {
        package_name,
        package_dir,
        manifest_path: manifest_path.clone(),
        workspace_root: workspace.map(|ws| ws.dir),
        backend,
        backend_origin,
        base_url_origin,
        edition,
        steps,
        graph,
        jobs,
        store,
        eval,
    })
}

/// `[workspace.metadata.promptgen]`, checked: every chain-level key, and no steps (they, and
/// the pass rates of steps, belong to one package).
fn workspace_layer<'a>(
    src: &'a Source,
    chain: &'a Spanned<ChainTable>,
    root: &'a Path,
) -> Result<Layer<'a>, ConfigError> {
    let ctx = Ctx { src, prefix: WORKSPACE_PREFIX.into(), base: root };
    if let Some(steps) = &chain.get_ref().steps {
        return Err(src.unknown_key(&ctx.key("steps"), steps.span().start));
    }
    if let Some(steps) = chain.get_ref().eval.as_ref().and_then(|e| e.get_ref().steps.as_ref()) {
        return Err(src.unknown_key(&ctx.key("eval.steps"), steps.span().start));
    }
    Layer::check(ctx, chain.get_ref(), Origin::Workspace)
}

/// What beats the layers: the command line and the environment.
struct Given<'a> {
    overrides: &'a Overrides,
    env: &'a dyn Fn(&str) -> Option<String>,
    manifest_path: &'a Path,
}

impl Given<'_> {
    /// The variable `name`, trimmed; empty counts as unset.
    fn var(&self, name: &str) -> Option<String> {
        (self.env)(name).map(|v| v.trim().to_string()).filter(|v| !v.is_empty())
    }

    /// The flag's value, else the variable's, with its origin.
    fn flag_or_var(&self, flag: &Option<String>, name: &'static str) -> Option<(String, Origin)> {
        let flag = flag.as_deref().map(str::trim).filter(|v| !v.is_empty()).map(str::to_string);
        flag.map(|v| (v, Origin::Flag)).or_else(|| self.var(name).map(|v| (v, Origin::Env(name))))
    }

    /// A flag or a variable (`key`) whose value cannot be used: it is not in the file.
    fn refused(&self, key: &str, kind: ConfigErrorKind) -> ConfigError {
        ConfigError::new(self.manifest_path, None, Some(key.into()), kind)
    }
}

/// The first layer that sets a chain-level value, with its origin.
fn pick<T>(layers: &[Layer<'_>], get: impl Fn(&ChainTable) -> Option<T>) -> Option<(T, Origin)> {
    layers.iter().find_map(|layer| get(layer.table).map(|v| (v, layer.origin)))
}

/// The first layer's value of a key, alone.
fn first<T: Copy>(layers: &[Layer<'_>], key: impl Fn(&ChainTable) -> &Option<Spanned<T>>) -> Option<T> {
    layers.iter().find_map(|layer| value(key(layer.table)))
}

/// The backend every step talks to, with where its kind and its URL came from.
fn backend(layers: &[Layer<'_>], given: &Given<'_>) -> Result<(BackendConfig, Origin, Origin), ConfigError> {
    let (kind, kind_origin) = match given.flag_or_var(&given.overrides.backend, "PROMPTGEN_BACKEND") {
        Some((value, origin)) => {
            let kind = parse_word::<BackendKind>(&value).map_err(|_| {
                let expected = one_of::<BackendKind>();
                match origin {
                    Origin::Env(name) => given.refused(name, ConfigErrorKind::Env { value: value.clone(), expected }),
                    _ => given.refused("--backend", ConfigErrorKind::Flag { value: value.clone(), expected }),
                }
            })?;
            (kind, origin)
        }
        None => pick(layers, |t| value(&t.backend)).unwrap_or((BackendKind::Ollama, Origin::Default)),
    };
    let backend_url = || {
        let name = match kind {
            BackendKind::Ollama => "OLLAMA_HOST",
            BackendKind::OpenAi => "OPENAI_BASE_URL",
            BackendKind::Scripted => return None,
        };
        let value = given.var(name)?;
        Some((if kind == BackendKind::Ollama { parse_host(&value) } else { value }, Origin::Env(name)))
    };
    let (base_url, url_origin) = match given
        .flag_or_var(&given.overrides.base_url, "PROMPTGEN_BASE_URL")
        .or_else(backend_url)
        .or_else(|| pick(layers, |t| t.base_url.as_ref().map(|u| u.get_ref().clone())))
    {
        Some((url, origin)) => (Some(url), origin),
        None => (None, Origin::Default),
    };
    let http = HttpConfig::default();
    let secs = |secs: Option<NonZeroU64>, default| secs.map_or(default, |s| Duration::from_secs(s.get()));
    let mut config = BackendConfig::new(kind);
    config.base_url = base_url;
    config.api_key = if kind == BackendKind::OpenAi { given.var("OPENAI_API_KEY") } else { None };
    config.num_ctx = first(layers, |t| &t.num_ctx).map_or(BackendConfig::DEFAULT_NUM_CTX, NonZeroU32::get);
    config.max_output_tokens =
        first(layers, |t| &t.max_output_tokens).map_or(BackendConfig::DEFAULT_MAX_OUTPUT_TOKENS, NonZeroU32::get);
    config.http.request_timeout = secs(first(layers, |t| &t.request_timeout_secs), http.request_timeout);
    config.http.first_byte_timeout = secs(first(layers, |t| &t.first_byte_timeout_secs), http.first_byte_timeout);
    config.http.idle_timeout = secs(first(layers, |t| &t.idle_timeout_secs), http.idle_timeout);
    Ok((config, kind_origin, url_origin))
}

/// The steps `cargo promptgen` runs at once: `--jobs`, `PROMPTGEN_JOBS`, `jobs`.
fn jobs(layers: &[Layer<'_>], given: &Given<'_>) -> Result<usize, ConfigError> {
    let jobs = if let Some(jobs) = given.overrides.jobs {
        jobs.get()
    } else if let Some(value) = given.var("PROMPTGEN_JOBS") {
        let expected = JOBS_EXPECTED.into();
        let jobs = value.parse::<NonZeroU32>();
        jobs.map_err(|_| given.refused("PROMPTGEN_JOBS", ConfigErrorKind::Env { value: value.clone(), expected }))?
            .get()
    } else {
        first(layers, |t| &t.jobs).map_or(Chain::DEFAULT_JOBS as u32, NonZeroU32::get)
    };
    Ok(usize::try_from(jobs).unwrap_or(usize::MAX))
}

/// Where the outputs live, and the cache folder (needed in cache mode, and to switch to it).
fn store(layers: &[Layer<'_>], given: &Given<'_>) -> Result<StoreSettings, ConfigError> {
    let mode = first(layers, |t| &t.store).unwrap_or(StoreMode::Repo);
    let cache_url = layers.iter().find_map(|l| l.cache_url.clone());
    let cache_dir = default_dir(given.env).map_err(|(key, value)| {
        given.refused(key, ConfigErrorKind::Env { value, expected: "an absolute path to the cache folder".into() })
    })?;
    if mode == StoreMode::Cache
        && cache_dir.is_none()
        && let Some((layer, set)) = layers.iter().find_map(|l| Some((l, l.table.store.as_ref()?)))
    {
        return Err(layer.ctx.error(set, "store", ConfigErrorKind::NoCacheDir));
    }
    Ok(StoreSettings { mode, cache_dir, cache_url })
}

/// Each declared step with every value settled: its own, else the first layer's, else the
/// default; and what it declares of the graph, resolved once every step is known.
fn steps(
    src: &Source,
    layers: &[Layer<'_>],
    given: &Given<'_>,
    backend: &BackendConfig,
    backend_origin: Origin,
    declared: Vec<DeclaredStep>,
    chain_table: &Spanned<ChainTable>,
) -> Result<Vec<(StepConfig, GraphDecl)>, ConfigError> {
    let model_override = given.flag_or_var(&given.overrides.model, "PROMPTGEN_MODEL");
    let mut steps = Vec::with_capacity(declared.len());
    let mut without_model = Vec::new();
    for step in declared {
        let own = &step.shared;
        macro_rules! layered {
            ($key:ident) => {
                own.$key.clone().or_else(|| layers.iter().find_map(|l| l.shared.$key.clone()))
            };
        }
        let model = model_override
            .clone()
            .or_else(|| own.model.clone().map(|m| (m, Origin::Step)))
            .or_else(|| layers.iter().find_map(|l| l.shared.model.clone().map(|m| (m, l.origin))));
        let Some((model, model_origin)) = model else {
            without_model.push(step.id.clone());
            continue;
        };
        if backend.kind == BackendKind::Scripted && step.script.is_none() {
            let backend = format!("backend `scripted` {}", from_phrase(backend_origin, &step.id));
            let kind = ConfigErrorKind::MissingScript { step: step.id.clone(), backend };
            return Err(src.error(step.at, format!("{}.script", step.key), kind));
        }
        let check = layered!(check).unwrap_or_else(|| {
            if step.outputs.iter().any(|o| o.ends_with(".rs")) { CheckSpec::CargoCheck } else { CheckSpec::None }
        });
        let mut step_backend = backend.clone();
        step_backend.script = step.script;
        let config = StepConfig {
            system_prompt: layered!(system_prompt),
            seed: layered!(seed),
            temperature: layered!(temperature),
            max_model_calls: layered!(max_model_calls).unwrap_or(codegen_core::Step::DEFAULT_MAX_MODEL_CALLS),
            protocol: layered!(protocol).unwrap_or_default(),
            constrain: layered!(constrain).unwrap_or_default(),
            regenerate: layered!(regenerate).unwrap_or_default(),
            check,
            check_rounds: layered!(check_rounds).unwrap_or(codegen_core::Step::DEFAULT_CHECK_ROUNDS),
            seed_retries: layered!(seed_retries).unwrap_or(0),
            id: step.id,
            prompt: step.prompt,
            prompt_display: step.prompt_display,
            model,
            model_origin,
            outputs: step.outputs,
            inputs: step.inputs,
            backend: step_backend,
            // Set with the graph, once every step is known.
            after: Vec::new(),
            after_declared: false,
        };
        steps.push((config, step.graph));
    }
    if !without_model.is_empty() {
        let kind = ConfigErrorKind::MissingModel { steps: without_model };
        return Err(src.error(chain_table.span().start, format!("{PACKAGE_PREFIX}.model"), kind));
    }
    steps.sort_by(|(a, _), (b, _)| a.id.cmp(&b.id));
    Ok(steps)
}
