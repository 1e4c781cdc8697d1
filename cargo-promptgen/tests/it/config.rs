//! `config::load`: the declaration in Cargo metadata, its layers, and every mistake's message.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use cargo_promptgen::__private::{self as config, Chain, Origin, Overrides};
use cargo_promptgen::{ConfigError, ConfigErrorKind};
use codegen_core::ToolProtocol;
use codegen_core::backend::{BackendConfig, BackendKind};
use tempfile::TempDir;

/// A workspace in a temporary folder: `Cargo.toml` with `[workspace]`, `prompts/` with a few
/// prompt files, and a package `pkg/` whose manifest each test writes.
struct Fixture {
    dir: TempDir,
}

impl Fixture {
    /// The workspace with no `[workspace.metadata.promptgen]`.
    fn new() -> Fixture {
        Fixture::with_workspace_metadata("")
    }

    /// The workspace with `metadata` appended to its manifest.
    fn with_workspace_metadata(metadata: &str) -> Fixture {
        let fixture = Fixture { dir: tempfile::tempdir().expect("tempdir") };
        fixture.write("Cargo.toml", &format!("[workspace]\nmembers = [\"pkg\"]\n\n{metadata}"));
        for name in ["01.md", "02.md", "10.md", "a.md", "system.md", "ws_system.md"] {
            fixture.write(&format!("prompts/{name}"), "Write the file.");
        }
        fixture.write("prompts/scripts/01.toml", "# turns");
        fixture.write("prompts/shared/types.md", "types");
        fixture.write("pkg/src/domain.rs", "pub struct Domain;");
        fixture.write("pkg/src/lib.rs", "");
        fixture.write("pkg/prompts/local.md", "Local system prompt.");
        fixture
    }

    fn root(&self) -> PathBuf {
        self.dir.path().to_path_buf()
    }

    fn path(&self, rel: &str) -> PathBuf {
        self.dir.path().join(rel)
    }

    fn write(&self, rel: &str, text: &str) -> PathBuf {
        let path = self.path(rel);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, text).unwrap();
        path
    }

    /// Writes `pkg/Cargo.toml`: a package `demo` followed by `rest`.
    fn package(&self, rest: &str) -> PathBuf {
        self.write("pkg/Cargo.toml", &format!("[package]\nname = \"demo\"\nversion = \"0.1.0\"\n\n{rest}"))
    }
}

/// A package whose chain-level table holds `chain` and whose single step `01` holds `step`.
fn one_step(chain: &str, step: &str) -> String {
    format!(
        "[package.metadata.promptgen]\n{chain}\n\n[[package.metadata.promptgen.steps]]\nid = \"01\"\nprompt = \"../prompts/01.md\"\n{step}\n"
    )
}

fn env_of(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
    let map: HashMap<String, String> = pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
    move |name| map.get(name).cloned()
}

fn load(manifest: &Path, overrides: &Overrides, env: &[(&str, &str)]) -> Chain {
    match config::load(manifest, overrides, &env_of(env)) {
        Ok(chain) => chain,
        Err(e) => panic!("load failed: {e}"),
    }
}

fn load_err(manifest: &Path, overrides: &Overrides, env: &[(&str, &str)]) -> ConfigError {
    match config::load(manifest, overrides, &env_of(env)) {
        Ok(chain) => panic!("load succeeded: {chain:?}"),
        Err(e) => e,
    }
}

/// The error as a user sees it (its message and causes) contains every one of `parts`.
fn assert_mentions(err: &ConfigError, parts: &[&str]) {
    let message = codegen_core::error_with_causes(err, "\ncaused by: ");
    for part in parts {
        assert!(message.contains(part), "message lacks {part:?}:\n{message}");
    }
}

fn flags(backend: Option<&str>, model: Option<&str>, base_url: Option<&str>) -> Overrides {
    Overrides {
        backend: backend.map(str::to_string),
        model: model.map(str::to_string),
        base_url: base_url.map(str::to_string),
        ..Overrides::default()
    }
}

const NONE: &[(&str, &str)] = &[];

#[test]
fn a_minimal_chain_gets_every_default() {
    let fx = Fixture::new();
    let manifest = fx.package(&one_step("model = \"m\"", ""));
    let chain = load(&manifest, &Overrides::default(), NONE);

    assert_eq!(chain.package_name, "demo");
    assert_eq!(chain.manifest_path, manifest);
    assert_eq!(chain.package_dir, fx.path("pkg"));
    assert_eq!(chain.workspace_root, Some(fx.root()));
    assert_eq!((chain.backend.kind, chain.backend_origin), (BackendKind::Ollama, Origin::Default));
    assert_eq!((chain.backend.base_url.as_deref(), chain.base_url_origin), (None, Origin::Default));
    assert_eq!(chain.effective_base_url().as_deref(), Some("http://127.0.0.1:11434"));
    assert_eq!(chain.backend.api_key, None);
    assert_eq!(chain.backend.num_ctx, BackendConfig::DEFAULT_NUM_CTX);
    assert_eq!(chain.backend.http.request_timeout, Duration::from_secs(600));
    assert_eq!(
        (chain.backend.http.first_byte_timeout, chain.backend.http.idle_timeout),
        (Duration::from_secs(300), Duration::from_secs(60))
    );

    let step = &chain.steps[0];
    assert_eq!(step.id, "01");
    assert_eq!(step.prompt, fx.path("prompts/01.md"));
    assert_eq!(step.prompt_display, "../prompts/01.md");
    assert_eq!((step.model.as_str(), step.model_origin), ("m", Origin::Package));
    assert_eq!(step.max_model_calls, codegen_core::Step::DEFAULT_MAX_MODEL_CALLS);
    assert_eq!(step.protocol, ToolProtocol::Native);
    assert_eq!((step.seed, step.temperature, &step.system_prompt), (None, None, &None));
    assert!(step.outputs.is_empty() && step.inputs.is_empty() && step.backend.script.is_none());
    assert_eq!(chain.step("01"), Some(step));
    assert_eq!(chain.step("02"), None);
    assert_eq!(step.describe_model(), "model `m` (from package metadata)");
    assert_eq!(chain.describe_backend(), "backend `ollama` (default)");
}

#[test]
fn the_folder_of_a_manifest_is_accepted_and_relative_paths_are_made_absolute() {
    let fx = Fixture::new();
    let manifest = fx.package(&one_step("model = \"m\"", ""));
    let chain = load(&fx.path("pkg"), &Overrides::default(), NONE);
    assert_eq!(chain.manifest_path, manifest);
    let chain = load(&fx.path("pkg/./../pkg/Cargo.toml"), &Overrides::default(), NONE);
    assert_eq!(chain.manifest_path, manifest);
    assert_eq!(chain.workspace_root, Some(fx.root()));
}

#[test]
fn backend_precedence_flag_env_package_workspace_default() {
    // Workspace only.
    let fx = Fixture::with_workspace_metadata("[workspace.metadata.promptgen]\nbackend = \"openai\"\n");
    let manifest = fx.package(&one_step("model = \"m\"", ""));
    let chain = load(&manifest, &Overrides::default(), NONE);
    assert_eq!((chain.backend.kind, chain.backend_origin), (BackendKind::OpenAi, Origin::Workspace));

    // The package beats the workspace.
    let manifest = fx.package(&one_step("model = \"m\"\nbackend = \"ollama\"", ""));
    let chain = load(&manifest, &Overrides::default(), NONE);
    assert_eq!((chain.backend.kind, chain.backend_origin), (BackendKind::Ollama, Origin::Package));

    // PROMPTGEN_BACKEND beats the package; empty counts as unset.
    let chain = load(&manifest, &Overrides::default(), &[("PROMPTGEN_BACKEND", "openai")]);
    assert_eq!((chain.backend.kind, chain.backend_origin), (BackendKind::OpenAi, Origin::Env("PROMPTGEN_BACKEND")));
    assert_eq!(chain.describe_backend(), "backend `openai` (from PROMPTGEN_BACKEND)");
    let chain = load(&manifest, &Overrides::default(), &[("PROMPTGEN_BACKEND", "  ")]);
    assert_eq!(chain.backend_origin, Origin::Package);

    // The flag beats everything; an empty flag counts as unset.
    let chain = load(&manifest, &flags(Some("openai"), None, None), &[("PROMPTGEN_BACKEND", "ollama")]);
    assert_eq!((chain.backend.kind, chain.backend_origin), (BackendKind::OpenAi, Origin::Flag));
    let chain = load(&manifest, &flags(Some(""), None, None), &[("PROMPTGEN_BACKEND", "openai")]);
    assert_eq!(chain.backend_origin, Origin::Env("PROMPTGEN_BACKEND"));
}

#[test]
fn model_precedence_flag_env_step_package_workspace() {
    let fx = Fixture::with_workspace_metadata("[workspace.metadata.promptgen]\nmodel = \"ws-model\"\n");
    let steps = "[package.metadata.promptgen]\n{chain}\n\
                 [[package.metadata.promptgen.steps]]\nid = \"01\"\nprompt = \"../prompts/01.md\"\nmodel = \"step-model\"\n\
                 [[package.metadata.promptgen.steps]]\nid = \"02\"\nprompt = \"../prompts/02.md\"\n";

    let manifest = fx.package(&steps.replace("{chain}", ""));
    let chain = load(&manifest, &Overrides::default(), NONE);
    let models = |c: &Chain| c.steps.iter().map(|s| (s.model.clone(), s.model_origin)).collect::<Vec<_>>();
    assert_eq!(models(&chain), [("step-model".to_string(), Origin::Step), ("ws-model".to_string(), Origin::Workspace)]);
    assert_eq!(chain.steps[0].describe_model(), "model `step-model` (from step `01`)");
    assert_eq!(Origin::Step.describe("01"), "step `01`");

    let manifest = fx.package(&steps.replace("{chain}", "model = \"pkg-model\""));
    let chain = load(&manifest, &Overrides::default(), NONE);
    assert_eq!(models(&chain), [("step-model".to_string(), Origin::Step), ("pkg-model".to_string(), Origin::Package)]);

    // PROMPTGEN_MODEL applies to every step, over the step's own model.
    let chain = load(&manifest, &Overrides::default(), &[("PROMPTGEN_MODEL", "env-model")]);
    let env = ("env-model".to_string(), Origin::Env("PROMPTGEN_MODEL"));
    assert_eq!(models(&chain), [env.clone(), env]);
    assert_eq!(chain.steps[1].describe_model(), "model `env-model` (from PROMPTGEN_MODEL)");
    let chain = load(&manifest, &Overrides::default(), &[("PROMPTGEN_MODEL", "")]);
    assert_eq!(chain.steps[1].model_origin, Origin::Package);

    let chain = load(&manifest, &flags(None, Some("flag-model"), None), &[("PROMPTGEN_MODEL", "env-model")]);
    let flag = ("flag-model".to_string(), Origin::Flag);
    assert_eq!(models(&chain), [flag.clone(), flag]);
    assert_eq!(chain.steps[0].describe_model(), "model `flag-model` (from command line)");
}

#[test]
fn base_url_precedence_for_ollama() {
    let fx = Fixture::with_workspace_metadata("[workspace.metadata.promptgen]\nbase_url = \"http://ws:1\"\n");
    let manifest = fx.package(&one_step("model = \"m\"", ""));
    let chain = load(&manifest, &Overrides::default(), NONE);
    assert_eq!((chain.backend.base_url.as_deref(), chain.base_url_origin), (Some("http://ws:1"), Origin::Workspace));

    let manifest = fx.package(&one_step("model = \"m\"\nbase_url = \"http://pkg:2\"", ""));
    let chain = load(&manifest, &Overrides::default(), NONE);
    assert_eq!((chain.backend.base_url.as_deref(), chain.base_url_origin), (Some("http://pkg:2"), Origin::Package));

    // OLLAMA_HOST, in any form Ollama accepts, beats the manifest; OPENAI_BASE_URL does not
    // apply to the ollama backend.
    let env = [("OLLAMA_HOST", "0.0.0.0"), ("OPENAI_BASE_URL", "http://openai:4/v1"), ("OPENAI_API_KEY", "sk-x")];
    let chain = load(&manifest, &Overrides::default(), &env);
    assert_eq!(
        (chain.backend.base_url.as_deref(), chain.base_url_origin),
        (Some("http://127.0.0.1:11434"), Origin::Env("OLLAMA_HOST"))
    );
    assert_eq!(chain.backend.api_key, None, "the key is for the openai backend only");
    let chain = load(&manifest, &Overrides::default(), &[("OLLAMA_HOST", "gpu-box:9999")]);
    assert_eq!(chain.backend.base_url.as_deref(), Some("http://gpu-box:9999"));
    let chain = load(&manifest, &Overrides::default(), &[("OLLAMA_HOST", "")]);
    assert_eq!(chain.base_url_origin, Origin::Package);

    // PROMPTGEN_BASE_URL beats OLLAMA_HOST.
    let env = [("OLLAMA_HOST", "gpu-box:9999"), ("PROMPTGEN_BASE_URL", "http://env:3")];
    let chain = load(&manifest, &Overrides::default(), &env);
    assert_eq!(
        (chain.backend.base_url.as_deref(), chain.base_url_origin),
        (Some("http://env:3"), Origin::Env("PROMPTGEN_BASE_URL"))
    );

    // The flag beats everything.
    let chain = load(&manifest, &flags(None, None, Some("http://flag:5")), &env);
    assert_eq!((chain.backend.base_url.as_deref(), chain.base_url_origin), (Some("http://flag:5"), Origin::Flag));
}

#[test]
fn base_url_and_key_precedence_for_openai() {
    let fx = Fixture::new();
    let manifest = fx.package(&one_step("model = \"m\"\nbackend = \"openai\"\nbase_url = \"http://pkg:8080/v1\"", ""));
    let chain = load(&manifest, &Overrides::default(), &[("OLLAMA_HOST", "gpu-box")]);
    assert_eq!(
        (chain.backend.base_url.as_deref(), chain.base_url_origin),
        (Some("http://pkg:8080/v1"), Origin::Package)
    );

    let env = [("OPENAI_BASE_URL", "http://llama:8080/v1"), ("OPENAI_API_KEY", "sk-test"), ("OLLAMA_HOST", "x")];
    let chain = load(&manifest, &Overrides::default(), &env);
    assert_eq!(
        (chain.backend.base_url.as_deref(), chain.base_url_origin),
        (Some("http://llama:8080/v1"), Origin::Env("OPENAI_BASE_URL"))
    );
    assert_eq!(chain.backend.api_key.as_deref(), Some("sk-test"));

    let env = [("OPENAI_BASE_URL", "http://llama:8080/v1"), ("PROMPTGEN_BASE_URL", "http://env:1/v1")];
    let chain = load(&manifest, &Overrides::default(), &env);
    assert_eq!(chain.base_url_origin, Origin::Env("PROMPTGEN_BASE_URL"));

    // Without any URL the backend's default applies.
    let manifest = fx.package(&one_step("model = \"m\"\nbackend = \"openai\"", ""));
    let chain = load(&manifest, &Overrides::default(), NONE);
    assert_eq!((chain.backend.base_url.as_deref(), chain.base_url_origin), (None, Origin::Default));
    assert_eq!(chain.effective_base_url().as_deref(), Some("https://api.openai.com/v1"));

    // The backend's variables follow the backend as overridden.
    let manifest = fx.package(&one_step("model = \"m\"", ""));
    let env = [("PROMPTGEN_BACKEND", "openai"), ("OPENAI_BASE_URL", "http://llama:8080/v1"), ("OLLAMA_HOST", "x")];
    let chain = load(&manifest, &Overrides::default(), &env);
    assert_eq!(chain.base_url_origin, Origin::Env("OPENAI_BASE_URL"));
}

#[test]
fn workspace_defaults_with_workspace_relative_system_prompt() {
    let fx = Fixture::with_workspace_metadata(
        "[workspace.metadata.promptgen]\n\
         model = \"ws-model\"\nseed = 7\ntemperature = 1\nmax_model_calls = 3\nprotocol = \"blocks\"\n\
         system_prompt = \"prompts/ws_system.md\"\nnum_ctx = 4096\nrequest_timeout_secs = 30\n",
    );
    let manifest = fx.package(&one_step("", ""));
    let chain = load(&manifest, &Overrides::default(), NONE);
    let step = &chain.steps[0];
    assert_eq!(step.system_prompt, Some(fx.path("prompts/ws_system.md")));
    assert_eq!((step.model.as_str(), step.model_origin), ("ws-model", Origin::Workspace));
    assert_eq!(
        (step.seed, step.temperature, step.max_model_calls, step.protocol),
        (Some(7), Some(1.0), 3, ToolProtocol::Blocks)
    );
    assert_eq!((chain.backend.num_ctx, chain.backend.http.request_timeout), (4096, Duration::from_secs(30)));

    // The package beats the workspace; its paths are relative to the package.
    let manifest = fx.package(&one_step(
        "seed = 8\ntemperature = 0.5\nmax_model_calls = 4\nprotocol = \"json\"\nsystem_prompt = \"prompts/local.md\"\n\
         num_ctx = 8192\nrequest_timeout_secs = 60",
        "",
    ));
    let chain = load(&manifest, &Overrides::default(), NONE);
    let step = &chain.steps[0];
    assert_eq!(step.system_prompt, Some(fx.path("pkg/prompts/local.md")));
    assert_eq!(
        (step.seed, step.temperature, step.max_model_calls, step.protocol),
        (Some(8), Some(0.5), 4, ToolProtocol::Json)
    );
    assert_eq!((chain.backend.num_ctx, chain.backend.http.request_timeout), (8192, Duration::from_secs(60)));

    // The step beats the package.
    let manifest = fx.package(&one_step(
        "seed = 8\ntemperature = 0.5\nmax_model_calls = 4\nprotocol = \"json\"\nsystem_prompt = \"prompts/local.md\"",
        "seed = 0\ntemperature = 2.0\nmax_model_calls = 1\nprotocol = \"native\"\nsystem_prompt = \"../prompts/system.md\"",
    ));
    let chain = load(&manifest, &Overrides::default(), NONE);
    let step = &chain.steps[0];
    assert_eq!(step.system_prompt, Some(fx.path("prompts/system.md")));
    assert_eq!(
        (step.seed, step.temperature, step.max_model_calls, step.protocol),
        (Some(0), Some(2.0), 1, ToolProtocol::Native)
    );
}

#[test]
fn a_package_that_is_its_own_workspace_root_and_one_without_workspace() {
    let fx = Fixture::new();
    // Its own root: workspace metadata in the same file, relative to the same folder.
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("prompts")).unwrap();
    std::fs::write(dir.path().join("prompts/01.md"), "p").unwrap();
    std::fs::write(dir.path().join("prompts/sys.md"), "s").unwrap();
    let manifest = dir.path().join("Cargo.toml");
    std::fs::write(
        &manifest,
        "[package]\nname = \"solo\"\n\n[workspace]\n\n[workspace.metadata.promptgen]\nmodel = \"w\"\nsystem_prompt = \"prompts/sys.md\"\n\n\
         [[package.metadata.promptgen.steps]]\nid = \"01\"\nprompt = \"prompts/01.md\"\n",
    )
    .unwrap();
    let chain = load(&manifest, &Overrides::default(), NONE);
    assert_eq!(chain.workspace_root, Some(dir.path().to_path_buf()));
    assert_eq!(chain.steps[0].model_origin, Origin::Workspace);
    assert_eq!(chain.steps[0].system_prompt, Some(dir.path().join("prompts/sys.md")));

    // A parent manifest without `[workspace]` is skipped.
    fx.write("Cargo.toml", "[package]\nname = \"not-a-workspace\"\n");
    let manifest = fx.package(&one_step("model = \"m\"", ""));
    let chain = load(&manifest, &Overrides::default(), NONE);
    assert_eq!(chain.workspace_root, None);
}

#[test]
fn steps_are_sorted_by_id_in_string_order() {
    let fx = Fixture::new();
    let manifest = fx.package(
        "[package.metadata.promptgen]\nmodel = \"m\"\n\
         [[package.metadata.promptgen.steps]]\nid = \"a\"\nprompt = \"../prompts/a.md\"\n\
         [[package.metadata.promptgen.steps]]\nid = \"10\"\nprompt = \"../prompts/10.md\"\n\
         [[package.metadata.promptgen.steps]]\nid = \"02\"\nprompt = \"../prompts/02.md\"\n\
         [[package.metadata.promptgen.steps]]\nid = \"01\"\nprompt = \"../prompts/01.md\"\n",
    );
    let chain = load(&manifest, &Overrides::default(), NONE);
    let ids: Vec<&str> = chain.steps.iter().map(|s| s.id.as_str()).collect();
    assert_eq!(ids, ["01", "02", "10", "a"]);
    assert_eq!(chain.step("10").unwrap().prompt, fx.path("prompts/10.md"));
}

#[test]
fn inputs_are_files_and_folders_and_outputs_are_normalised() {
    let fx = Fixture::new();
    let manifest = fx.package(&one_step(
        "model = \"m\"",
        "inputs = [\"src/domain.rs\", \"./src/\", \"../prompts/shared\"]\noutputs = [\"view.rs\", \"./gen//model.rs\"]",
    ));
    let chain = load(&manifest, &Overrides::default(), NONE);
    let step = &chain.steps[0];
    let inputs: Vec<(&str, &Path, bool)> =
        step.inputs.iter().map(|i| (i.virtual_path.as_str(), i.real_path.as_path(), i.is_dir)).collect();
    assert_eq!(
        inputs,
        [
            ("src/domain.rs", fx.path("pkg/src/domain.rs").as_path(), false),
            ("src", fx.path("pkg/src").as_path(), true),
            ("prompts/shared", fx.path("prompts/shared").as_path(), true),
        ]
    );
    assert_eq!(step.outputs, ["view.rs", "gen/model.rs"]);
}

#[test]
fn backend_config_carries_the_chain_and_the_step_script() {
    let fx = Fixture::new();
    let manifest = fx.package(&one_step(
        "model = \"m\"\nbackend = \"scripted\"\nnum_ctx = 2048\nrequest_timeout_secs = 5\nfirst_byte_timeout_secs = 4\nidle_timeout_secs = 3",
        "script = \"../prompts/scripts/01.toml\"",
    ));
    let chain = load(&manifest, &Overrides::default(), NONE);
    let step = &chain.steps[0];
    assert_eq!(step.backend.script, Some(fx.path("prompts/scripts/01.toml")));
    let config = &step.backend;
    assert_eq!(config.kind, BackendKind::Scripted);
    assert_eq!(config.script, step.backend.script);
    assert_eq!(config.num_ctx, 2048);
    assert_eq!(config.http.request_timeout, Duration::from_secs(5));
    assert_eq!(
        (config.http.first_byte_timeout, config.http.idle_timeout),
        (Duration::from_secs(4), Duration::from_secs(3))
    );
    assert_eq!(config.base_url, None);
    assert_eq!(chain.effective_base_url(), None);

    let chain = load(&manifest, &flags(Some("openai"), None, Some("http://x/v1")), &[("OPENAI_API_KEY", "k")]);
    let config = &chain.steps[0].backend;
    assert_eq!(
        (config.kind, config.base_url.as_deref(), config.api_key.as_deref()),
        (BackendKind::OpenAi, Some("http://x/v1"), Some("k"))
    );
}

#[test]
fn env_vars_lists_every_variable_read() {
    for name in [
        "PROMPTGEN_BACKEND",
        "PROMPTGEN_MODEL",
        "PROMPTGEN_BASE_URL",
        "OLLAMA_HOST",
        "OPENAI_BASE_URL",
        "OPENAI_API_KEY",
    ] {
        assert!(config::ENV_VARS.contains(&name), "{name}");
    }
}

// ---- errors ----

#[test]
fn an_unreadable_manifest_names_the_file() {
    let fx = Fixture::new();
    let missing = fx.path("nowhere/Cargo.toml");
    let err = load_err(&missing, &Overrides::default(), NONE);
    assert!(matches!(err.kind(), ConfigErrorKind::Read { .. }), "{err:?}");
    assert_mentions(&err, &["nowhere/Cargo.toml", "cannot read"]);
    assert_eq!(err.file(), missing);
    assert_eq!(err.key(), None);
}

#[test]
fn a_manifest_that_is_not_toml_gives_the_line() {
    let fx = Fixture::new();
    let manifest = fx.package("[package.metadata.promptgen]\nmodel = \n");
    let err = load_err(&manifest, &Overrides::default(), NONE);
    assert!(matches!(err.kind(), ConfigErrorKind::Parse { .. }), "{err:?}");
    assert_mentions(&err, &["pkg/Cargo.toml", "not valid TOML", "line 6"]);
}

#[test]
fn a_broken_workspace_manifest_names_its_file() {
    let fx = Fixture::new();
    fx.write("Cargo.toml", "[workspace\n");
    let manifest = fx.package(&one_step("model = \"m\"", ""));
    let err = load_err(&manifest, &Overrides::default(), NONE);
    assert!(matches!(err.kind(), ConfigErrorKind::Parse { .. }), "{err:?}");
    assert_eq!(err.file(), fx.path("Cargo.toml"));
}

#[test]
fn a_manifest_without_package_name() {
    let fx = Fixture::new();
    let manifest = fx.write("pkg/Cargo.toml", "[package]\nversion = \"0.1.0\"\n");
    let err = load_err(&manifest, &Overrides::default(), NONE);
    assert!(matches!(err.kind(), ConfigErrorKind::NoPackage), "{err:?}");
    assert_mentions(&err, &["pkg/Cargo.toml", "`package.name`", "package manifest"]);

    let err = load_err(&fx.path("Cargo.toml"), &Overrides::default(), NONE);
    assert!(matches!(err.kind(), ConfigErrorKind::NoPackage), "{err:?}");
}

#[test]
fn a_package_without_a_chain_is_told_how_to_declare_one() {
    let fx = Fixture::new();
    let manifest = fx.package("[package.metadata.other]\nx = 1\n");
    let err = load_err(&manifest, &Overrides::default(), NONE);
    assert!(matches!(err.kind(), ConfigErrorKind::NoChain), "{err:?}");
    assert_mentions(&err, &["pkg/Cargo.toml", "[package.metadata.promptgen]", "[[package.metadata.promptgen.steps]]"]);
    assert_eq!(err.key(), Some("package.metadata.promptgen"));

    let manifest = fx.package("");
    assert!(matches!(load_err(&manifest, &Overrides::default(), NONE).kind(), ConfigErrorKind::NoChain));

    let manifest = fx.package("[package.metadata]\npromptgen = true\n");
    let err = load_err(&manifest, &Overrides::default(), NONE);
    assert!(matches!(err.kind(), ConfigErrorKind::WrongType { .. }), "{err:?}");
    assert_mentions(&err, &["`package.metadata.promptgen`", "a table", "boolean"]);
}

#[test]
fn unknown_keys_list_the_known_ones_and_suggest_the_closest() {
    let fx = Fixture::new();
    let manifest = fx.package(&one_step("model = \"m\"\nmax_step = 3", ""));
    let err = load_err(&manifest, &Overrides::default(), NONE);
    assert!(matches!(err.kind(), ConfigErrorKind::UnknownKey { .. }), "{err:?}");
    assert_mentions(
        &err,
        &[
            "pkg/Cargo.toml",
            "package.metadata.promptgen.max_step",
            "did you mean `max_model_calls`?",
            "`request_timeout_secs`",
        ],
    );

    // At step level.
    let manifest = fx.package(&one_step("model = \"m\"", "promt = \"x\""));
    let err = load_err(&manifest, &Overrides::default(), NONE);
    assert_mentions(&err, &["package.metadata.promptgen.steps[0].promt", "did you mean `prompt`?", "`outputs`"]);
    assert_eq!(err.key(), Some("package.metadata.promptgen.steps[0].promt"));

    // Nothing close: no suggestion, but the list.
    let manifest = fx.package(&one_step("model = \"m\"\nflavour = \"x\"", ""));
    let err = load_err(&manifest, &Overrides::default(), NONE);
    assert!(!err.to_string().contains("did you mean"), "{err}");
    assert_mentions(&err, &["promptgen.flavour`", "Known keys here:", "`backend`"]);

    // Keys of the other level are explained.
    let manifest = fx.package(&one_step("model = \"m\"", "backend = \"openai\""));
    assert_mentions(&load_err(&manifest, &Overrides::default(), NONE), &["steps[0].backend", "whole chain"]);
    let manifest = fx.package(&one_step("model = \"m\"\nprompt = \"x\"", ""));
    assert_mentions(&load_err(&manifest, &Overrides::default(), NONE), &["promptgen.prompt", "belongs to a step"]);
    let manifest = fx.package(&one_step("model = \"m\"\napi_key = \"sk\"", ""));
    assert_mentions(&load_err(&manifest, &Overrides::default(), NONE), &["promptgen.api_key", "OPENAI_API_KEY"]);
}

#[test]
fn unknown_workspace_keys_name_the_workspace_manifest() {
    let fx = Fixture::with_workspace_metadata("[workspace.metadata.promptgen]\nmodle = \"m\"\n");
    let manifest = fx.package(&one_step("model = \"m\"", ""));
    let err = load_err(&manifest, &Overrides::default(), NONE);
    assert!(matches!(err.kind(), ConfigErrorKind::UnknownKey { .. }), "{err:?}");
    assert_mentions(&err, &["workspace.metadata.promptgen.modle", "did you mean `model`?"]);
    assert_eq!(err.file(), fx.path("Cargo.toml"));

    let fx = Fixture::with_workspace_metadata("[[workspace.metadata.promptgen.steps]]\nid = \"01\"\n");
    let manifest = fx.package(&one_step("model = \"m\"", ""));
    let err = load_err(&manifest, &Overrides::default(), NONE);
    assert_mentions(&err, &["workspace.metadata.promptgen.steps", "declared by each package"]);
}

#[test]
fn wrong_types_say_what_is_expected() {
    let fx = Fixture::new();
    let cases = [
        ("seed = \"x\"", "package.metadata.promptgen.seed", "a non-negative integer", "the string \"x\""),
        ("seed = 1.5", "package.metadata.promptgen.seed", "a non-negative integer", "the float 1.5"),
        ("temperature = \"hot\"", "package.metadata.promptgen.temperature", "a number from 0 to 2", "string"),
        ("max_model_calls = true", "package.metadata.promptgen.max_model_calls", "at least 1", "boolean"),
        ("model = 3", "package.metadata.promptgen.model", "a string", "the integer 3"),
        ("num_ctx = \"big\"", "package.metadata.promptgen.num_ctx", "positive integer", "string"),
        ("steps = \"01\"", "package.metadata.promptgen.steps", "an array of tables", "string"),
    ];
    for (line, key, expected, found) in cases {
        // A TOML key may not be defined twice, so the step table is left out where `steps` is set.
        let text = if line.starts_with("steps") {
            format!("[package.metadata.promptgen]\nmodel = \"m\"\n{line}\n")
        } else {
            one_step(
                if line.starts_with("model") { line.to_string() } else { format!("model = \"m\"\n{line}") }.as_str(),
                "",
            )
        };
        let manifest = fx.package(&text);
        let err = load_err(&manifest, &Overrides::default(), NONE);
        assert!(matches!(err.kind(), ConfigErrorKind::WrongType { .. }), "{line}: {err:?}");
        assert_mentions(&err, &["pkg/Cargo.toml", &format!("`{key}`"), expected, found]);
    }

    // In a step, and in a list.
    let manifest = fx.package(&one_step("model = \"m\"", "outputs = [\"a.rs\", 3]"));
    let err = load_err(&manifest, &Overrides::default(), NONE);
    assert_mentions(&err, &["`package.metadata.promptgen.steps[0].outputs[1]`", "a string"]);
    let manifest = fx.package(&one_step("model = \"m\"", "inputs = \"src\""));
    let err = load_err(&manifest, &Overrides::default(), NONE);
    assert_mentions(&err, &["`package.metadata.promptgen.steps[0].inputs`", "an array"]);
    let manifest = fx.package(&one_step("model = \"m\"", "id = 1"));
    // `id` is set twice there; build the step by hand instead.
    assert!(matches!(load_err(&manifest, &Overrides::default(), NONE).kind(), ConfigErrorKind::Parse { .. }));
    let manifest = fx.package(
        "[package.metadata.promptgen]\nmodel = \"m\"\n[[package.metadata.promptgen.steps]]\nid = 1\nprompt = \"../prompts/01.md\"\n",
    );
    let err = load_err(&manifest, &Overrides::default(), NONE);
    assert_mentions(&err, &["`package.metadata.promptgen.steps[0].id`", "a string", "the integer 1"]);
}

#[test]
fn bad_enum_values_list_the_allowed_ones() {
    let fx = Fixture::new();
    let manifest = fx.package(&one_step("model = \"m\"\nbackend = \"llamacpp\"", ""));
    let err = load_err(&manifest, &Overrides::default(), NONE);
    assert!(matches!(err.kind(), ConfigErrorKind::InvalidValue { .. }), "{err:?}");
    assert_mentions(
        &err,
        &[
            "pkg/Cargo.toml",
            "`package.metadata.promptgen.backend`",
            "\"llamacpp\"",
            "\"ollama\", \"openai\", \"scripted\"",
        ],
    );

    let manifest = fx.package(&one_step("model = \"m\"", "protocol = \"xml\""));
    let err = load_err(&manifest, &Overrides::default(), NONE);
    assert_mentions(
        &err,
        &["`package.metadata.promptgen.steps[0].protocol`", "\"xml\"", "\"native\", \"json\", \"blocks\""],
    );
}

#[test]
fn out_of_range_numbers() {
    let fx = Fixture::new();
    let cases = [
        ("max_model_calls = 0", "`package.metadata.promptgen.max_model_calls` = 0", "at least 1"),
        ("temperature = 2.5", "`package.metadata.promptgen.temperature` = 2.5", "from 0 to 2"),
        ("temperature = -1", "`package.metadata.promptgen.temperature` = -1", "from 0 to 2"),
        ("temperature = nan", "`package.metadata.promptgen.temperature` = NaN", "from 0 to 2"),
        ("seed = -3", "`package.metadata.promptgen.seed` = -3", "a non-negative integer"),
        ("num_ctx = 0", "`package.metadata.promptgen.num_ctx` = 0", "positive"),
        ("request_timeout_secs = 0", "`package.metadata.promptgen.request_timeout_secs` = 0", "positive"),
        ("idle_timeout_secs = 0", "`package.metadata.promptgen.idle_timeout_secs` = 0", "positive"),
        ("model = \"\"", "`package.metadata.promptgen.model` = \"\"", "non-empty"),
    ];
    for (line, key, expected) in cases {
        let manifest =
            fx.package(&one_step(&format!("model = \"m\"\n{line}").replacen("model = \"m\"\nmodel", "model", 1), ""));
        let err = load_err(&manifest, &Overrides::default(), NONE);
        assert!(matches!(err.kind(), ConfigErrorKind::InvalidValue { .. }), "{line}: {err:?}");
        assert_mentions(&err, &["pkg/Cargo.toml", key, expected]);
    }
    // A step's own max_model_calls too.
    let manifest = fx.package(&one_step("model = \"m\"", "max_model_calls = 0"));
    let err = load_err(&manifest, &Overrides::default(), NONE);
    assert_mentions(&err, &["`package.metadata.promptgen.steps[0].max_model_calls` = 0", "at least 1"]);
}

#[test]
fn empty_or_missing_steps() {
    let fx = Fixture::new();
    for text in
        ["[package.metadata.promptgen]\nmodel = \"m\"\n", "[package.metadata.promptgen]\nmodel = \"m\"\nsteps = []\n"]
    {
        let manifest = fx.package(text);
        let err = load_err(&manifest, &Overrides::default(), NONE);
        assert!(matches!(err.kind(), ConfigErrorKind::Missing { .. }), "{err:?}");
        assert_mentions(&err, &["pkg/Cargo.toml", "`package.metadata.promptgen.steps`", "at least one step"]);
    }
}

#[test]
fn missing_id_or_prompt() {
    let fx = Fixture::new();
    let manifest =
        fx.package("[package.metadata.promptgen]\nmodel = \"m\"\n[[package.metadata.promptgen.steps]]\nprompt = \"../prompts/01.md\"\n");
    let err = load_err(&manifest, &Overrides::default(), NONE);
    assert!(matches!(err.kind(), ConfigErrorKind::Missing { .. }), "{err:?}");
    assert_mentions(&err, &["pkg/Cargo.toml", "`package.metadata.promptgen.steps[0].id`", "id = \"01\""]);

    let manifest =
        fx.package("[package.metadata.promptgen]\nmodel = \"m\"\n[[package.metadata.promptgen.steps]]\nid = \"01\"\n");
    let err = load_err(&manifest, &Overrides::default(), NONE);
    assert!(matches!(err.kind(), ConfigErrorKind::Missing { .. }), "{err:?}");
    assert_mentions(
        &err,
        &["pkg/Cargo.toml", "`package.metadata.promptgen.steps[0].prompt`", "step `01`", "prompt = "],
    );
}

#[test]
fn duplicate_and_malformed_ids() {
    let fx = Fixture::new();
    let manifest = fx.package(
        "[package.metadata.promptgen]\nmodel = \"m\"\n\
         [[package.metadata.promptgen.steps]]\nid = \"01\"\nprompt = \"../prompts/01.md\"\n\
         [[package.metadata.promptgen.steps]]\nid = \"02\"\nprompt = \"../prompts/02.md\"\n\
         [[package.metadata.promptgen.steps]]\nid = \"01\"\nprompt = \"../prompts/10.md\"\n",
    );
    let err = load_err(&manifest, &Overrides::default(), NONE);
    assert!(matches!(err.kind(), ConfigErrorKind::DuplicateId { .. }), "{err:?}");
    assert_mentions(
        &err,
        &["pkg/Cargo.toml", "`package.metadata.promptgen.steps[2].id`", "`01`", "steps[0].id", "unique"],
    );

    for bad in ["step 1", "", "ü", "a/b"] {
        let manifest = fx.package(&format!(
            "[package.metadata.promptgen]\nmodel = \"m\"\n[[package.metadata.promptgen.steps]]\nid = {bad:?}\nprompt = \"../prompts/01.md\"\n"
        ));
        let err = load_err(&manifest, &Overrides::default(), NONE);
        assert!(matches!(err.kind(), ConfigErrorKind::InvalidValue { .. }), "{bad}: {err:?}");
        assert_mentions(
            &err,
            &["pkg/Cargo.toml", "`package.metadata.promptgen.steps[0].id`", "letters, digits, `_` and `-`"],
        );
    }
}

#[test]
fn missing_files_name_the_resolved_path() {
    let fx = Fixture::new();
    let cases = [
        ("prompt = \"../prompts/nope.md\"", "steps[0].prompt", "prompts/nope.md", "prompt of step `01`"),
        ("system_prompt = \"sys/none.md\"", "steps[0].system_prompt", "pkg/sys/none.md", "system prompt of step `01`"),
        (
            "script = \"../prompts/scripts/none.toml\"",
            "steps[0].script",
            "prompts/scripts/none.toml",
            "script of step `01`",
        ),
        ("inputs = [\"src/none.rs\"]", "steps[0].inputs[0]", "pkg/src/none.rs", "input of step `01`"),
    ];
    for (line, key, resolved, what) in cases {
        let text = if line.starts_with("prompt") {
            format!(
                "[package.metadata.promptgen]\nmodel = \"m\"\n[[package.metadata.promptgen.steps]]\nid = \"01\"\n{line}\n"
            )
        } else {
            one_step("model = \"m\"", line)
        };
        let manifest = fx.package(&text);
        let err = load_err(&manifest, &Overrides::default(), NONE);
        assert!(matches!(err.kind(), ConfigErrorKind::FileNotFound { .. }), "{line}: {err:?}");
        let resolved = fx.path(resolved);
        assert_mentions(
            &err,
            &[
                "pkg/Cargo.toml",
                &format!("package.metadata.promptgen.{key}"),
                &resolved.display().to_string(),
                what,
                "does not exist",
            ],
        );
    }

    // The package's system prompt, and the workspace's (relative to the workspace root).
    let manifest = fx.package(&one_step("model = \"m\"\nsystem_prompt = \"none.md\"", ""));
    let err = load_err(&manifest, &Overrides::default(), NONE);
    assert_mentions(
        &err,
        &["`package.metadata.promptgen.system_prompt`", &fx.path("pkg/none.md").display().to_string()],
    );

    let fx = Fixture::with_workspace_metadata("[workspace.metadata.promptgen]\nsystem_prompt = \"prompts/none.md\"\n");
    let manifest = fx.package(&one_step("model = \"m\"", ""));
    let err = load_err(&manifest, &Overrides::default(), NONE);
    assert!(matches!(err.kind(), ConfigErrorKind::FileNotFound { .. }), "{err:?}");
    assert_eq!(err.file(), fx.path("Cargo.toml"));
    assert_mentions(
        &err,
        &["`workspace.metadata.promptgen.system_prompt`", &fx.path("prompts/none.md").display().to_string()],
    );
}

#[test]
fn a_prompt_that_is_a_folder() {
    let fx = Fixture::new();
    let manifest = fx.package(
        "[package.metadata.promptgen]\nmodel = \"m\"\n[[package.metadata.promptgen.steps]]\nid = \"01\"\nprompt = \"../prompts\"\n",
    );
    let err = load_err(&manifest, &Overrides::default(), NONE);
    assert!(matches!(err.kind(), ConfigErrorKind::NotAFile { .. }), "{err:?}");
    assert_mentions(
        &err,
        &["pkg/Cargo.toml", "`package.metadata.promptgen.steps[0].prompt`", "is a folder", "must be a file"],
    );
}

#[test]
fn bad_output_and_input_paths() {
    let fx = Fixture::new();
    let cases = [
        ("outputs = [\"../escape.rs\"]", "outputs[0]", "`..`"),
        ("outputs = [\"/abs.rs\"]", "outputs[0]", "absolute"),
        ("outputs = [\"C:/abs.rs\"]", "outputs[0]", "absolute"),
        ("outputs = [\"src\\\\view.rs\"]", "outputs[0]", "forward slashes"),
        ("outputs = [\"\"]", "outputs[0]", "empty"),
        ("outputs = [\"./\"]", "outputs[0]", "output folder itself"),
        ("outputs = [\"a.rs\", \"./a.rs\"]", "outputs[1]", "twice"),
        ("inputs = [\"/etc/hosts\"]", "inputs[0]", "absolute"),
        ("inputs = [\"src\\\\domain.rs\"]", "inputs[0]", "forward slashes"),
        ("inputs = [\"..\"]", "inputs[0]", "package folder or above"),
        ("inputs = [\"src\", \"src/\"]", "inputs[1]", "list each input once"),
    ];
    for (line, key, reason) in cases {
        let manifest = fx.package(&one_step("model = \"m\"", line));
        let err = load_err(&manifest, &Overrides::default(), NONE);
        assert!(matches!(err.kind(), ConfigErrorKind::BadPath { .. }), "{line}: {err:?}");
        assert_mentions(&err, &["pkg/Cargo.toml", &format!("`package.metadata.promptgen.steps[0].{key}`"), reason]);
    }
}

#[test]
fn a_missing_model_names_the_key_and_the_steps() {
    let fx = Fixture::new();
    let manifest = fx.package(
        "[package.metadata.promptgen]\n\
         [[package.metadata.promptgen.steps]]\nid = \"01\"\nprompt = \"../prompts/01.md\"\nmodel = \"m\"\n\
         [[package.metadata.promptgen.steps]]\nid = \"02\"\nprompt = \"../prompts/02.md\"\n",
    );
    let err = load_err(&manifest, &Overrides::default(), NONE);
    assert!(matches!(err.kind(), ConfigErrorKind::MissingModel { .. }), "{err:?}");
    assert_mentions(&err, &["pkg/Cargo.toml", "`package.metadata.promptgen.model`", "`02`", "PROMPTGEN_MODEL"]);
    assert!(!err.to_string().contains("`01`"), "{err}");

    // Any layer supplies it.
    load(&manifest, &Overrides::default(), &[("PROMPTGEN_MODEL", "x")]);
    load(&manifest, &flags(None, Some("x"), None), NONE);
}

#[test]
fn the_scripted_backend_needs_a_script_per_step() {
    let fx = Fixture::new();
    let manifest = fx.package(&one_step("model = \"m\"\nbackend = \"scripted\"", ""));
    let err = load_err(&manifest, &Overrides::default(), NONE);
    assert!(matches!(err.kind(), ConfigErrorKind::MissingScript { .. }), "{err:?}");
    assert_mentions(
        &err,
        &["pkg/Cargo.toml", "`package.metadata.promptgen.steps[0].script`", "step `01`", "(from package metadata)"],
    );

    // Also when the environment chooses it.
    let manifest = fx.package(&one_step("model = \"m\"", ""));
    let err = load_err(&manifest, &Overrides::default(), &[("PROMPTGEN_BACKEND", "scripted")]);
    assert_mentions(&err, &["steps[0].script", "(from PROMPTGEN_BACKEND)"]);
}

#[test]
fn an_invalid_backend_variable_or_flag_is_named() {
    let fx = Fixture::new();
    let manifest = fx.package(&one_step("model = \"m\"", ""));
    let err = load_err(&manifest, &Overrides::default(), &[("PROMPTGEN_BACKEND", "llama")]);
    assert!(matches!(err.kind(), ConfigErrorKind::Env { .. }), "{err:?}");
    assert_mentions(
        &err,
        &["PROMPTGEN_BACKEND", "\"llama\"", "\"ollama\", \"openai\", \"scripted\"", "pkg/Cargo.toml"],
    );
    assert_eq!(err.key(), Some("PROMPTGEN_BACKEND"));

    let err = load_err(&manifest, &flags(Some("Ollama"), None, None), NONE);
    assert!(matches!(err.kind(), ConfigErrorKind::Flag { .. }), "{err:?}");
    assert_mentions(&err, &["--backend", "\"Ollama\"", "\"ollama\", \"openai\", \"scripted\""]);
}

#[test]
fn every_mistake_in_a_manifest_names_its_line_and_column() {
    let fx = Fixture::new();
    // `one_step` puts the chain's lines from line 6, the step table's header on the line after
    // them plus one, and the step's own lines after its `id` and `prompt`.
    let cases: &[(&str, &str, &str)] = &[
        ("model = \"m\"\nflavour = 1", "", "7:1"),
        ("model = \"m\"\nseed = \"x\"", "", "7:8"),
        ("model = \"m\"\ntemperature = 3.0", "", "7:15"),
        ("model = \"m\"\nbackend = \"llamacpp\"", "", "7:11"),
        ("model = \"m\"", "outputs = [\"a.rs\", \"../b.rs\"]", "11:20"),
        ("model = \"m\"", "inputs = [\"src/none.rs\"]", "11:11"),
        ("model = \"m\"", "system_prompt = \"none.md\"", "11:17"),
        ("model = \"m\"", "max_model_calls = 0", "11:19"),
        ("model = \"m\"", "check = \"cargo\"", "11:9"),
        ("model = \"m\"", "id = \"02\"", "11:1"),
        ("", "", "5:1"),
        ("model = \"m\"\nbackend = \"scripted\"", "", "9:1"),
    ];
    for (chain, step, at) in cases {
        let manifest = fx.package(&one_step(chain, step));
        let err = load_err(&manifest, &Overrides::default(), NONE);
        let location = err.location().unwrap_or_else(|| panic!("{chain} / {step}: no location in {err:?}"));
        assert_eq!(location.to_string(), *at, "{chain} / {step}: {err}");
        assert_mentions(&err, &[&format!("pkg/Cargo.toml:{at}`")]);
    }

    // A step table without `prompt` is pointed at by its header.
    let manifest = fx
        .package("[package.metadata.promptgen]\nmodel = \"m\"\n\n[[package.metadata.promptgen.steps]]\nid = \"01\"\n");
    let err = load_err(&manifest, &Overrides::default(), NONE);
    assert_eq!(err.location().map(|l| l.to_string()).as_deref(), Some("8:1"), "{err}");

    // The workspace's mistakes are pointed at in the workspace's manifest.
    let fx = Fixture::with_workspace_metadata("[workspace.metadata.promptgen]\nseed = -1\n");
    let manifest = fx.package(&one_step("model = \"m\"", ""));
    let err = load_err(&manifest, &Overrides::default(), NONE);
    assert_eq!(err.file(), fx.path("Cargo.toml"));
    assert_mentions(&err, &["Cargo.toml:5:8`", "`workspace.metadata.promptgen.seed` = -1"]);

    // What is not in a file has no location.
    let fx = Fixture::new();
    let manifest = fx.package(&one_step("model = \"m\"", ""));
    let err = load_err(&manifest, &Overrides::default(), &[("PROMPTGEN_BACKEND", "x")]);
    assert_eq!(err.location(), None);
}

#[test]
fn max_steps_is_the_old_name_of_max_model_calls() {
    let fx = Fixture::with_workspace_metadata("[workspace.metadata.promptgen]\nmax_steps = 5\n");
    let manifest = fx.package(&one_step("model = \"m\"", ""));
    assert_eq!(load(&manifest, &Overrides::default(), NONE).steps[0].max_model_calls, 5);
    let manifest = fx.package(&one_step("model = \"m\"\nmax_steps = 6", ""));
    assert_eq!(load(&manifest, &Overrides::default(), NONE).steps[0].max_model_calls, 6);
    let manifest = fx.package(&one_step("model = \"m\"\nmax_steps = 6", "max_steps = 7"));
    assert_eq!(load(&manifest, &Overrides::default(), NONE).steps[0].max_model_calls, 7);

    // The old name is checked like the new one, and named as written.
    let manifest = fx.package(&one_step("model = \"m\"", "max_steps = 0"));
    let err = load_err(&manifest, &Overrides::default(), NONE);
    assert!(matches!(err.kind(), ConfigErrorKind::InvalidValue { .. }), "{err:?}");
    assert_mentions(&err, &["`package.metadata.promptgen.steps[0].max_steps` = 0", "at least 1"]);

    // Both names in one table: an error naming both, at the second.
    for (chain, step, table, at) in [
        ("model = \"m\"\nmax_steps = 6\nmax_model_calls = 7", "", "package.metadata.promptgen", "8:1"),
        ("model = \"m\"", "max_model_calls = 7\nmax_steps = 6", "package.metadata.promptgen.steps[0]", "12:1"),
    ] {
        let manifest = fx.package(&one_step(chain, step));
        let err = load_err(&manifest, &Overrides::default(), NONE);
        assert!(matches!(err.kind(), ConfigErrorKind::SetTwice { .. }), "{err:?}");
        assert_mentions(&err, &[&format!("`{table}.max_model_calls`"), &format!("`{table}.max_steps`"), "old name"]);
        assert_eq!(err.location().map(|l| l.to_string()).as_deref(), Some(at), "{err}");
        assert_eq!(err.key(), Some(format!("{table}.max_model_calls").as_str()));
    }
}

// ---- which workspace a package belongs to ----

/// Writes `files` (path, text) under `root`, with a `src/lib.rs` beside each `Cargo.toml` that
/// declares a package and the prompt its chain names, so that cargo accepts them too.
fn layout(root: &Path, files: &[(&str, &str)]) {
    for (rel, text) in files {
        let path = root.join(rel);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, text).unwrap();
        if text.contains("[package]") {
            let dir = path.parent().unwrap();
            std::fs::create_dir_all(dir.join("src")).unwrap();
            std::fs::write(dir.join("src/lib.rs"), "").unwrap();
            std::fs::write(dir.join("01.md"), "Write it.").unwrap();
        }
    }
}

/// A package `name` with a one-step chain, `package_extra` in its `[package]` table and
/// `chain` in its chain's.
fn member(name: &str, package_extra: &str, chain: &str) -> String {
    format!(
        "[package]\nname = \"{name}\"\nversion = \"0.1.0\"\n{package_extra}\n\n[package.metadata.promptgen]\n{chain}\n\n\
         [[package.metadata.promptgen.steps]]\nid = \"01\"\nprompt = \"01.md\"\n"
    )
}

/// What `cargo metadata` says the workspace root of the package at `manifest` is.
fn cargo_workspace_root(manifest: &Path) -> PathBuf {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let out = std::process::Command::new(cargo)
        .args(["metadata", "--format-version", "1", "--no-deps", "--offline", "--manifest-path"])
        .arg(manifest)
        .output()
        .expect("run cargo metadata");
    assert!(out.status.success(), "cargo metadata: {}", String::from_utf8_lossy(&out.stderr));
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    PathBuf::from(json["workspace_root"].as_str().unwrap())
}

/// Loads the package at `manifest`, checks that its workspace root is cargo's, and that being
/// told cargo's root gives the same chain.
fn load_like_cargo(manifest: &Path) -> Chain {
    let chain = load(manifest, &Overrides::default(), NONE);
    let ours = chain.workspace_root.clone().unwrap_or_else(|| chain.package_dir.clone());
    let cargo = cargo_workspace_root(manifest);
    assert_eq!(std::fs::canonicalize(&ours).unwrap(), std::fs::canonicalize(&cargo).unwrap(), "{}", manifest.display());
    let told = Overrides { workspace_root: Some(cargo), ..Overrides::default() };
    assert_eq!(load(manifest, &told, NONE), chain, "told cargo's root: {}", manifest.display());
    chain
}

#[test]
fn a_package_excluded_from_the_nearest_workspace_belongs_to_the_next_one_up() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    layout(
        root,
        &[
            (
                "Cargo.toml",
                "[workspace]\nmembers = [\"inner/nested\"]\n\n[workspace.package]\nedition = \"2021\"\n\n\
                 [workspace.metadata.promptgen]\nmodel = \"outer\"\n",
            ),
            (
                "inner/Cargo.toml",
                "[workspace]\nexclude = [\"nested\"]\n\n[workspace.package]\nedition = \"2018\"\n\n\
                 [workspace.metadata.promptgen]\nmodel = \"inner\"\n",
            ),
            ("inner/nested/Cargo.toml", &member("nested", "edition.workspace = true", "")),
        ],
    );
    let chain = load_like_cargo(&root.join("inner/nested/Cargo.toml"));
    assert_eq!(chain.workspace_root, Some(root.to_path_buf()));
    assert_eq!((chain.steps[0].model.as_str(), chain.steps[0].model_origin), ("outer", Origin::Workspace));
    assert_eq!(chain.edition, "2021");
}

#[test]
fn an_excluded_package_without_another_workspace_inherits_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let workspace = "[workspace]\nmembers = []\nexclude = [\"nested\"]\n\n[workspace.package]\nedition = \"2018\"\n\n\
                     [workspace.metadata.promptgen]\nmodel = \"ws\"\n";
    layout(root, &[("Cargo.toml", workspace), ("nested/Cargo.toml", &member("nested", "edition = \"2021\"", ""))]);
    let manifest = root.join("nested/Cargo.toml");
    assert_eq!(cargo_workspace_root(&manifest), root.join("nested"));
    let err = load_err(&manifest, &Overrides::default(), NONE);
    assert!(matches!(err.kind(), ConfigErrorKind::MissingModel { .. }), "not the excluding workspace's model: {err:?}");

    layout(root, &[("nested/Cargo.toml", &member("nested", "edition = \"2021\"", "model = \"own\""))]);
    let chain = load_like_cargo(&manifest);
    assert_eq!((chain.workspace_root, chain.edition.as_str()), (None, "2021"));

    // A `members` glob does not win over `exclude`; the path itself does.
    layout(root, &[("Cargo.toml", &workspace.replace("members = []", "members = [\"nest*\"]"))]);
    assert_eq!(load_like_cargo(&manifest).workspace_root, None);
    layout(root, &[("Cargo.toml", &workspace.replace("members = []", "members = [\"nested\"]"))]);
    assert_eq!(load_like_cargo(&manifest).workspace_root, Some(root.to_path_buf()));
}

#[test]
fn package_workspace_names_the_root_over_a_nearer_workspace() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    layout(
        root,
        &[
            (
                "ws/Cargo.toml",
                "[workspace]\nmembers = [\"../pkgs/a\"]\n\n[workspace.metadata.promptgen]\nmodel = \"pointed\"\n",
            ),
            ("pkgs/a/Cargo.toml", &member("a", "edition = \"2021\"\nworkspace = \"../../ws\"", "")),
            ("Cargo.toml", "[workspace]\nmembers = []\n\n[workspace.metadata.promptgen]\nmodel = \"nearest\"\n"),
        ],
    );
    let chain = load_like_cargo(&root.join("pkgs/a/Cargo.toml"));
    assert_eq!(chain.workspace_root, Some(root.join("ws")));
    assert_eq!(chain.steps[0].model, "pointed");

    // A root that is not one is an error at `package.workspace`.
    layout(root, &[("pkgs/a/Cargo.toml", &member("a", "workspace = \"../..\"", "model = \"m\""))]);
    std::fs::write(root.join("Cargo.toml"), "[package]\nname = \"top\"\n").unwrap();
    let err = load_err(&root.join("pkgs/a/Cargo.toml"), &Overrides::default(), NONE);
    assert!(matches!(err.kind(), ConfigErrorKind::InvalidValue { .. }), "{err:?}");
    assert_mentions(&err, &["pkgs/a/Cargo.toml:4:13`", "`package.workspace` = \"../..\"", "no `[workspace]` table"]);
    layout(root, &[("pkgs/a/Cargo.toml", &member("a", "workspace = \"../nowhere\"", "model = \"m\""))]);
    let err = load_err(&root.join("pkgs/a/Cargo.toml"), &Overrides::default(), NONE);
    assert!(matches!(err.kind(), ConfigErrorKind::FileNotFound { .. }), "{err:?}");
    assert_mentions(&err, &["`package.workspace`", "workspace root's manifest", "does not exist"]);
}

#[test]
fn a_plain_member_and_a_package_without_workspace_agree_with_cargo() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    layout(
        root,
        &[
            ("ws/Cargo.toml", "[workspace]\nmembers = [\"crates/*\"]\n\n[workspace.package]\nedition = \"2024\"\n"),
            ("ws/crates/a/Cargo.toml", &member("a", "edition.workspace = true", "model = \"m\"")),
            ("lone/Cargo.toml", &member("lone", "", "model = \"m\"")),
        ],
    );
    let chain = load_like_cargo(&root.join("ws/crates/a/Cargo.toml"));
    assert_eq!((chain.workspace_root, chain.edition.as_str()), (Some(root.join("ws")), "2024"));
    let chain = load_like_cargo(&root.join("lone/Cargo.toml"));
    assert_eq!((chain.workspace_root, chain.edition.as_str()), (None, "2015"));
}

#[test]
fn a_path_that_cannot_be_looked_at_says_why_not_that_it_does_not_exist() {
    let fx = Fixture::new();
    // A path through a regular file: the OS says "not a directory" (ENOTDIR), which works
    // for root too, unlike a folder without permissions.
    let cases = [
        ("prompt = \"../prompts/01.md/x.md\"", "steps[0].prompt", "prompts/01.md/x.md", "prompt of step `01`"),
        ("system_prompt = \"src/lib.rs/x.md\"", "steps[0].system_prompt", "pkg/src/lib.rs/x.md", "system prompt"),
        ("inputs = [\"src/domain.rs/x\"]", "steps[0].inputs[0]", "pkg/src/domain.rs/x", "input of step `01`"),
    ];
    for (line, key, resolved, what) in cases {
        let text = if line.starts_with("prompt") {
            format!(
                "[package.metadata.promptgen]\nmodel = \"m\"\n[[package.metadata.promptgen.steps]]\nid = \"01\"\n{line}\n"
            )
        } else {
            one_step("model = \"m\"", line)
        };
        let manifest = fx.package(&text);
        let err = load_err(&manifest, &Overrides::default(), NONE);
        assert!(matches!(err.kind(), ConfigErrorKind::Unreadable { .. }), "{line}: {err:?}");
        let resolved = fx.path(resolved).display().to_string();
        assert_mentions(&err, &[&format!("package.metadata.promptgen.{key}`"), &resolved, what, "Not a directory"]);
        assert!(!err.to_string().contains("does not exist"), "{err}");
        assert!(err.location().is_some(), "{err}");
        let source = std::error::Error::source(&err).expect("the I/O error is the source");
        assert!(source.to_string().contains("Not a directory"), "{source}");
    }
}

#[cfg(unix)]
#[test]
fn links_in_an_input_folder_are_followed_inside_the_package_and_refused_outside_it() {
    use std::os::unix::fs::symlink;
    let fx = Fixture::new();
    symlink(fx.path("pkg/prompts"), fx.path("pkg/src/local")).unwrap();
    let manifest = fx.package(&one_step("model = \"m\"", "inputs = [\"src\"]"));
    let chain = load(&manifest, &Overrides::default(), NONE);
    // Regression: the fingerprint read the link to a folder as a file ("Is a directory").
    let fingerprint = cargo_promptgen::__private::fingerprint(&chain, &chain.steps[0], &[]).unwrap();
    let hashed: Vec<&str> = fingerprint.inputs.keys().map(String::as_str).collect();
    assert_eq!(hashed, ["src/domain.rs", "src/lib.rs", "src/local/local.md"]);

    // A link out of the package: refused when the chain is loaded, naming the link and its
    // target...
    symlink(fx.path("prompts/shared"), fx.path("pkg/src/outside")).unwrap();
    let err = load_err(&manifest, &Overrides::default(), NONE);
    assert!(matches!(err.kind(), ConfigErrorKind::InputLink { .. }), "{err:?}");
    assert_mentions(
        &err,
        &["Cargo.toml:11:11`", "`package.metadata.promptgen.steps[0].inputs[0]`", "src/outside`", "prompts/shared`"],
    );
    assert_mentions(&err, &["outside", "pkg`"]);
    // ... and by the fingerprint of a chain loaded before it appeared, as the step's error.
    let err = cargo_promptgen::__private::fingerprint(&chain, &chain.steps[0], &[]).unwrap_err();
    assert!(matches!(err, cargo_promptgen::Error::Sandbox { .. }), "{err:?}");
    assert!(cargo_promptgen::__private::report(&err).contains("src/outside`"), "{err:?}");
}

// ---- what `cargo promptgen eval` requires ----

#[test]
fn eval_thresholds_come_from_the_package_over_the_workspace() {
    let fx = Fixture::with_workspace_metadata("[workspace.metadata.promptgen.eval]\nmin_pass_rate = 0.5\n");
    let manifest = fx.package(&one_step("model = \"m\"", ""));
    let eval = load(&manifest, &Overrides::default(), NONE).eval;
    assert_eq!((eval.min_pass_rate, eval.min_pass_rate_of("01")), (Some(0.5), Some(0.5)));

    let chain = one_step("model = \"m\"", "");
    let manifest = fx.package(&format!(
        "{chain}\n[package.metadata.promptgen.eval]\nmin_pass_rate = 0.7\nsteps = {{ \"01\" = 0.9 }}\n"
    ));
    let eval = load(&manifest, &Overrides::default(), NONE).eval;
    assert_eq!(eval.min_pass_rate, Some(0.7), "the package's rate beats the workspace's");
    assert_eq!((eval.min_pass_rate_of("01"), eval.min_pass_rate_of("02")), (Some(0.9), Some(0.7)));

    let fx = Fixture::new();
    let eval = load(&fx.package(&chain), &Overrides::default(), NONE).eval;
    assert_eq!(eval.min_pass_rate_of("01"), None, "no table, no threshold");
}

#[test]
fn eval_mistakes_name_their_key_line_and_column() {
    let fx = Fixture::new();
    let chain = one_step("model = \"m\"", "");
    // The eval table's header is line 13, its key line 14 of the package manifest.
    let cases: &[(&str, &str, &str)] = &[
        ("min_pass_rate = 1.5", "`package.metadata.promptgen.eval.min_pass_rate` = 1.5 is not allowed", "14:17"),
        (
            "min_pass_rate = \"high\"",
            "`package.metadata.promptgen.eval.min_pass_rate` must be a number from 0 to 1",
            "14:17",
        ),
        (
            "min_pas_rate = 0.5",
            "unknown key `package.metadata.promptgen.eval.min_pas_rate`; did you mean `min_pass_rate`?",
            "14:1",
        ),
        ("steps = { \"01\" = -0.1 }", "`package.metadata.promptgen.eval.steps.01` = -0.1 is not allowed", "14:18"),
        (
            "steps = { \"1\" = 0.5 }",
            "unknown key `package.metadata.promptgen.eval.steps.1`: the chain has no step `1`; did you mean `01`?",
            "14:17",
        ),
    ];
    for (table, message, at) in cases {
        let manifest = fx.package(&format!("{chain}\n[package.metadata.promptgen.eval]\n{table}\n"));
        let err = load_err(&manifest, &Overrides::default(), NONE);
        assert_mentions(&err, &[message, &format!("Cargo.toml:{at}`")]);
    }

    // Per-step rates name one package's steps: not the workspace's to set.
    let fx = Fixture::with_workspace_metadata("[workspace.metadata.promptgen.eval]\nsteps = { \"01\" = 0.5 }\n");
    let err = load_err(&fx.package(&chain), &Overrides::default(), NONE);
    assert!(matches!(err.kind(), ConfigErrorKind::UnknownKey { .. }), "{err:?}");
    assert_eq!(err.file(), fx.path("Cargo.toml"));
    assert_mentions(
        &err,
        &["`workspace.metadata.promptgen.eval.steps`", "that package's `[package.metadata.promptgen.eval]`"],
    );
}
