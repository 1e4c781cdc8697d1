//! `cargo promptgen` as a user drives it from the command line: `--step`, `--force`, `status`,
//! what makes a step stale and what does not, which model and server win, metadata and usage
//! errors, `check` on stray and hand-edited stored files, a CI build, and `accept` with
//! nothing to do. Real binary, the fake LLM server on loopback; only one test runs `cargo build`.

use promptgen_tests::{FakeLlm, Reply, refused_url};

use crate::support;
use crate::support::{
    A1, A2, B, C, Package, assert_fresh, assert_stale, chain, edit, finish, run, stderr, stdout, text, with_step_keys,
    write,
};

fn one_run() -> Vec<Reply> {
    vec![write("a.rs", A1), finish(), write("b.rs", B), finish(), write("c.rs", C), finish()]
}

/// Three steps, a.rs (with `src/domain.rs` as an input), b.rs and c.rs, nothing recorded yet.
fn new_three_step_package() -> Package {
    let metadata = with_step_keys(&chain("", &["a.rs", "b.rs", "c.rs"]), "01", "inputs = [\"src/domain.rs\"]\n");
    let package = Package::lettered(&metadata, 3);
    package.write("src/domain.rs", "pub struct Domain;\n");
    package
}

/// A three-step package recorded once against `server` (which must hold [`one_run`]).
fn three_step_package(server: &FakeLlm) -> Package {
    let package = new_three_step_package();
    let before = server.requests().len();
    let out = run(package.promptgen(&[]).env("PROMPTGEN_BASE_URL", server.url()));
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert_eq!(server.requests().len(), before + 6, "{}", text(&out));
    package
}

#[test]
fn step_flag_regenerates_that_step_and_leaves_the_steps_after_it_stale_when_its_output_changes() {
    let server = FakeLlm::start(one_run());
    let package = three_step_package(&server);
    let url = server.url();
    let lock = package.read("promptgen.lock");

    // Same output: 01 runs although fresh; 02 and 03 stay fresh and call no model.
    server.push(write("a.rs", A1));
    server.push(finish());
    let out = run(package.promptgen(&["--step", "01"]).env("PROMPTGEN_BASE_URL", &url));
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert_eq!(server.requests().len(), 8, "{}", text(&out));
    let err = stderr(&out);
    assert!(err.contains("step 01: running, because regeneration was asked for"), "{err}");
    assert!(!err.contains("step 02: running") && !err.contains("step 03: running"), "{err}");
    assert!(err.contains("1 of 3 steps regenerated"), "{err}");
    assert_eq!(package.read("promptgen.lock"), lock, "an identical result records an identical lock");

    // Different output: 01 is recorded, and 02 and 03, which what 01 hands over changed, are
    // left stale for the next run, which the summary names: `--step` is the unit of iteration.
    server.push(write("a.rs", A2));
    server.push(finish());
    let out = run(package.promptgen(&["run", "--step", "01"]).env("PROMPTGEN_BASE_URL", &url));
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert_eq!(server.requests().len(), 10, "{}", text(&out));
    let err = stderr(&out);
    assert!(!err.contains("step 02: running") && !err.contains("step 03: running"), "{err}");
    for id in ["02", "03"] {
        assert!(err.contains(&format!("step {id} is now stale: run `cargo promptgen -p {}`", package.name)), "{err}");
    }
    assert!(err.contains("1 of 3 steps regenerated"), "{err}");
    assert_eq!(package.read("promptgen/01/a.rs"), A2);
    let out = run(&mut package.promptgen(&["check"]));
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(stdout(&out).contains("step 02: the previous step's output changed"), "{}", text(&out));
    // The next run without `--step` brings them up to date.
    server.push(write("b.rs", B));
    server.push(finish());
    server.push(write("c.rs", C));
    server.push(finish());
    let out = run(package.promptgen(&[]).env("PROMPTGEN_BASE_URL", &url));
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert_eq!(server.requests().len(), 14, "{}", text(&out));
    let err = stderr(&out);
    assert!(err.contains("step 02: running by edit from b.rs, because the previous step's output changed"), "{err}");
    assert!(err.contains("step 03: running by edit from c.rs, because the previous step's output changed"), "{err}");
    assert!(err.contains("2 of 3 steps regenerated"), "{err}");
    let out = run(&mut package.promptgen(&["check"]));
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));

    // --force regenerates every step, even with identical results.
    server.push(write("a.rs", A2));
    server.push(finish());
    server.push(write("b.rs", B));
    server.push(finish());
    server.push(write("c.rs", C));
    server.push(finish());
    let out = run(package.promptgen(&["--force"]).env("PROMPTGEN_BASE_URL", &url));
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert_eq!(server.requests().len(), 20, "{}", text(&out));
    let err = stderr(&out);
    for id in ["01", "02", "03"] {
        assert!(err.contains(&format!("step {id}: running, because regeneration was asked for")), "{err}");
    }
    assert!(err.contains("3 of 3 steps regenerated"), "{err}");

    // An unknown step is a usage error, refused before anything runs, naming the steps there are.
    let lock = package.read("promptgen.lock");
    let out = run(package.promptgen(&["--step", "99"]).env("PROMPTGEN_BASE_URL", &url));
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    let err = stderr(&out);
    assert!(err.contains("there is no step `99`") && err.contains("its steps are: 01, 02, 03"), "{err}");
    assert_eq!(server.requests().len(), 20);
    assert_eq!(package.read("promptgen.lock"), lock);
}

#[test]
fn status_shows_each_step_and_why_it_is_stale() {
    let server = FakeLlm::start(one_run());
    let package = three_step_package(&server);

    let out = run(&mut package.promptgen(&["status"]));
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let table = stdout(&out);
    let rows = table_rows(&table);
    assert_eq!(rows.len(), 3, "{table}");
    for (row, id) in rows.iter().zip(["01", "02", "03"]) {
        // Two model calls of 10 prompt + 5 completion tokens each.
        let want = [
            ("step", id.to_string()),
            ("prompt", format!("prompts/{id}.md")),
            ("state", "fresh".into()),
            ("files", "1".into()),
            ("model", "fake-coder".into()),
            ("calls", "2".into()),
            ("tokens", "30".into()),
        ];
        for (column, value) in want {
            assert_eq!(row.get(column), Some(&value), "column {column} of step {id}:\n{table}");
        }
    }

    package.write("src/domain.rs", "pub struct Domain { pub id: u32 }\n");
    let out = run(&mut package.promptgen(&["status"]));
    assert_eq!(out.status.code(), Some(0), "status reports, it does not fail: {}", text(&out));
    let table = stdout(&out);
    let rows = table_rows(&table);
    for (row, id) in rows.iter().zip(["01", "02", "03"]) {
        assert_eq!(row.get("step").map(String::as_str), Some(id), "{table}");
        assert_eq!(row.get("state").map(String::as_str), Some("stale"), "{table}");
    }
    assert!(table.contains("step 01 is stale: input `src/domain.rs` changed"), "{table}");
    assert!(
        table.contains("step 02 is stale:") && table.contains("it runs after step 01, which must run again"),
        "{table}"
    );
}

/// The rows of `status`'s table (the lines up to the first blank or `step .. is stale` line),
/// each as column name -> cell.
fn table_rows(table: &str) -> Vec<std::collections::BTreeMap<String, String>> {
    let mut lines = table.lines().take_while(|l| !l.trim().is_empty() && !l.contains(" is stale: "));
    let header: Vec<String> = lines.next().unwrap_or_default().split_whitespace().map(String::from).collect();
    assert_eq!(header.first().map(String::as_str), Some("step"), "{table}");
    lines
        .map(|line| {
            let cells: Vec<&str> = line.split_whitespace().collect();
            assert_eq!(cells.len(), header.len(), "a cell is empty or has spaces:\n{table}");
            header.iter().cloned().zip(cells.into_iter().map(String::from)).collect()
        })
        .collect()
}

/// One step, native protocol, with a system prompt and two inputs (a file and a folder).
fn one_step() -> String {
    let settings = "protocol = \"native\"\nsystem_prompt = \"prompts/system.md\"\n";
    with_step_keys(&chain(settings, &["a.rs"]), "01", "inputs = [\"src/domain.rs\", \"docs\"]\n")
}

/// A package of [`one_step`] with its prompts and inputs, nothing recorded yet.
fn new_one_step_package() -> Package {
    let package = Package::new(&one_step(), "");
    package.write("src/domain.rs", "pub struct Domain;\n");
    package.write("docs/guide.md", "Be brief.\n");
    package.write("prompts/system.md", "You write Rust.\n");
    package.write("prompts/01.md", "Write a.rs with fn a.\n");
    package
}

/// [`new_one_step_package`], recorded against `server`.
fn one_step_package(server: &FakeLlm) -> Package {
    let package = new_one_step_package();
    let out = run(package.promptgen(&[]).env("PROMPTGEN_BASE_URL", server.url()));
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    package
}

#[test]
fn every_declared_input_makes_the_step_stale_and_the_server_url_does_not() {
    let server = FakeLlm::start(vec![write("a.rs", A1), finish()]);
    let package = one_step_package(&server);
    assert_fresh(&package, &[]);

    let prompt = package.read("prompts/01.md");
    package.write("prompts/01.md", "Write a.rs with fn a, briefly.\n");
    assert_stale(&package, &[], &["prompt `prompts/01.md` changed"]);
    package.write("prompts/01.md", &prompt);
    assert_fresh(&package, &[]);

    package.write("prompts/system.md", "You write idiomatic Rust.\n");
    assert_stale(&package, &[], &["the system prompt changed"]);
    package.write("prompts/system.md", "You write Rust.\n");
    assert_fresh(&package, &[]);

    package.write("src/domain.rs", "pub struct Domain(u8);\n");
    assert_stale(&package, &[], &["input `src/domain.rs` changed"]);
    package.write("src/domain.rs", "pub struct Domain;\n");
    assert_fresh(&package, &[]);

    package.write("docs/more/extra.md", "Also this.\n");
    assert_stale(&package, &[], &["input `docs/more/extra.md` was added"]);
    std::fs::remove_dir_all(package.path("docs/more")).unwrap();
    assert_fresh(&package, &[]);

    edit(&package, "Cargo.toml", "seed = 1", "seed = 2");
    assert_stale(&package, &[], &["seed changed: 1 -> 2"]);
    edit(&package, "Cargo.toml", "seed = 2", "seed = 1");
    assert_fresh(&package, &[]);

    edit(&package, "Cargo.toml", "temperature = 0.0", "temperature = 0.5");
    assert_stale(&package, &[], &["temperature changed", "0.5"]);
    edit(&package, "Cargo.toml", "temperature = 0.5", "temperature = 0.0");
    assert_fresh(&package, &[]);

    assert_stale(&package, &[("PROMPTGEN_MODEL", "other-coder")], &["model changed", "other-coder", "PROMPTGEN_MODEL"]);
    assert_fresh(&package, &[("PROMPTGEN_MODEL", "fake-coder")]);

    edit(&package, "Cargo.toml", "protocol = \"native\"", "protocol = \"json\"");
    assert_stale(&package, &[], &["protocol changed: native -> json"]);
    edit(&package, "Cargo.toml", "protocol = \"json\"", "protocol = \"native\"");
    assert_fresh(&package, &[]);

    edit(&package, "Cargo.toml", "outputs = [\"a.rs\"]", "outputs = [\"a.rs\", \"extra.rs\"]");
    assert_stale(&package, &[], &["declared outputs changed"]);
    edit(&package, "Cargo.toml", "outputs = [\"a.rs\", \"extra.rs\"]", "outputs = [\"a.rs\"]");
    assert_fresh(&package, &[]);

    // Where the server is does not change what a step was asked.
    edit(&package, "Cargo.toml", "seed = 1", "seed = 1\nbase_url = \"http://192.0.2.1:9\"");
    assert_fresh(&package, &[]);
    assert_fresh(&package, &[("OLLAMA_HOST", "192.0.2.7:1234")]);
    assert_fresh(&package, &[("PROMPTGEN_BASE_URL", "http://192.0.2.8:1")]);
    assert_eq!(server.requests().len(), 2, "check never calls a model");
}

#[test]
fn the_model_flag_beats_the_variable_which_beats_the_metadata() {
    let server = FakeLlm::start(vec![write("a.rs", A1), finish()]);
    let package = one_step_package(&server);
    let url = server.url();
    let models = |from: usize| -> Vec<String> {
        server.requests()[from..].iter().map(|r| r.json()["model"].as_str().unwrap_or("?").to_string()).collect()
    };
    assert_eq!(models(0), ["fake-coder", "fake-coder"]);

    server.push(write("a.rs", A1));
    server.push(finish());
    let out = run(package.promptgen(&[]).env("PROMPTGEN_BASE_URL", &url).env("PROMPTGEN_MODEL", "env-coder"));
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert_eq!(models(2), ["env-coder", "env-coder"], "{}", text(&out));

    server.push(write("a.rs", A1));
    server.push(finish());
    let out = run(package
        .promptgen(&["--model", "flag-coder"])
        .env("PROMPTGEN_BASE_URL", &url)
        .env("PROMPTGEN_MODEL", "env-coder"));
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert_eq!(models(4), ["flag-coder", "flag-coder"], "{}", text(&out));
    let lock = package.read("promptgen.lock");
    assert!(lock.contains("model = \"flag-coder\""), "{lock}");
}

#[test]
fn the_base_url_flag_beats_promptgen_base_url_beats_ollama_host_beats_the_metadata() {
    let server = FakeLlm::start(vec![write("a.rs", A1), finish()]);
    let package = one_step_package(&server);
    let url = server.url();
    let refused = refused_url();
    edit(&package, "Cargo.toml", "seed = 1", &format!("seed = 1\nbase_url = \"{refused}\""));
    let host_port = url.trim_start_matches("http://").to_string();
    let mut served = 2;

    let mut forced = |flag: Option<&str>, env: &[(&str, &str)]| {
        server.push(write("a.rs", A1));
        server.push(finish());
        let mut args = vec!["--force"];
        if let Some(flag) = flag {
            args.extend(["--base-url", flag]);
        }
        let mut command = package.promptgen(&args);
        command.envs(env.iter().copied());
        let out = run(&mut command);
        assert_eq!(out.status.code(), Some(0), "{}", text(&out));
        served += 2;
        assert_eq!(server.requests().len(), served, "{}", text(&out));
    };
    forced(Some(&url), &[("PROMPTGEN_BASE_URL", &refused), ("OLLAMA_HOST", &refused)]);
    forced(None, &[("PROMPTGEN_BASE_URL", &url), ("OLLAMA_HOST", &refused)]);
    // OLLAMA_HOST in Ollama's own `host:port` form.
    forced(None, &[("OLLAMA_HOST", &host_port)]);
    edit(&package, "Cargo.toml", &format!("base_url = \"{refused}\""), &format!("base_url = \"{url}\""));
    forced(None, &[]);

    // The stronger source wins even when it is the one that does not work.
    let out = run(package.promptgen(&["--force"]).env("PROMPTGEN_BASE_URL", &refused));
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(stderr(&out).contains("step `01`"), "{}", text(&out));
    assert_eq!(server.requests().len(), 10, "{}", text(&out));
}

#[test]
fn metadata_errors_name_the_key_and_the_file() {
    let package = new_one_step_package();
    let manifest = package.read("Cargo.toml");
    let manifest_path = package.path("Cargo.toml");
    let manifest_path = manifest_path.to_string_lossy();

    let cases: [(String, &[&str]); 3] = [
        (
            manifest.replacen("seed = 1", "seed = 1\nmodle = \"x\"", 1),
            &["unknown key `package.metadata.promptgen.modle`", "did you mean `model`?"],
        ),
        (
            manifest.replacen("prompt = \"prompts/01.md\"", "prompt = \"prompts/missing.md\"", 1),
            &["`package.metadata.promptgen.steps[0].prompt`", "prompts/missing.md", "does not exist"],
        ),
        (
            format!("{manifest}\n[[package.metadata.promptgen.steps]]\nid = \"01\"\nprompt = \"prompts/01.md\"\n"),
            &[
                "`package.metadata.promptgen.steps[1].id`",
                "step id `01` is already used by `package.metadata.promptgen.steps[0].id`",
            ],
        ),
    ];
    for (text_of_manifest, phrases) in cases {
        package.write("Cargo.toml", &text_of_manifest);
        for args in [&[][..], &["check"][..], &["status"][..]] {
            let out = run(&mut package.promptgen(args));
            assert_eq!(out.status.code(), Some(1), "{args:?}: {}", text(&out));
            let err = stderr(&out);
            assert!(err.contains(manifest_path.as_ref()), "{args:?}: {err}");
            for phrase in phrases {
                assert!(err.contains(phrase), "{args:?}: expected `{phrase}` in {err}");
            }
        }
    }
    assert!(!package.path("promptgen.lock").exists());
}

#[test]
fn an_unknown_flag_is_a_usage_error() {
    let package = Package::new(&one_step(), "");
    for args in [&["--frobnicate"][..], &["check", "--frobnicate"][..], &["explode"][..]] {
        let out = run(&mut package.promptgen(args));
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", text(&out));
        let err = stderr(&out);
        assert!(err.contains(args.last().unwrap()), "{args:?}: {err}");
    }
    let out = run(&mut package.promptgen(&["--help"]));
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
}

#[test]
fn check_warns_about_stored_files_no_step_owns_and_still_passes() {
    let server = FakeLlm::start(one_run());
    let package = three_step_package(&server);
    package.write("promptgen/01/stray.rs", "fn stray() {}\n");
    std::fs::create_dir_all(package.path("promptgen/99")).unwrap();
    let out = run(&mut package.promptgen(&["check"]));
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let report = stdout(&out);
    assert!(report.contains("warning: promptgen/01/stray.rs belongs to no step"), "{report}");
    assert!(report.contains("warning: promptgen/99 belongs to no step"), "{report}");
    assert!(!report.contains("promptgen/01/a.rs") && !report.contains("transcript"), "{report}");
    assert!(report.contains("All 3 steps of"), "{report}");

    // With nothing pending, accept says so and succeeds.
    let out = run(&mut package.promptgen(&["accept"]));
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(
        stdout(&out).contains(&format!("Nothing to accept: no build left results for {}", package.name)),
        "{}",
        text(&out)
    );
}

#[test]
fn check_fails_on_a_hand_edited_stored_file_and_names_it() {
    let server = FakeLlm::start(one_run());
    let package = three_step_package(&server);
    package.write("promptgen/01/a.rs", "pub fn a() -> &'static str { \"edited\" }\n");
    let out = run(&mut package.promptgen(&["check"]));
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let report = stdout(&out);
    let line = report.lines().find(|l| l.contains("step 01:")).unwrap_or_else(|| panic!("{report}"));
    assert!(line.contains("promptgen/01/a.rs") && line.contains("edited by hand"), "{report}");
    assert!(report.contains("step 02:") && report.contains("step 03:"), "{report}");
    let out = run(&mut package.promptgen(&["status"]));
    assert!(stdout(&out).contains("step 01 is stale: stored file"), "{}", text(&out));
}

#[test]
fn a_ci_build_with_a_stale_step_fails_without_calling_a_model() {
    let server = FakeLlm::start(one_run());
    let package = new_three_step_package();
    let out = run(package.cargo(&["build", "--quiet"]).env("CI", "true").env("PROMPTGEN_BASE_URL", server.url()));
    assert!(!out.status.success(), "{}", text(&out));
    let err = stderr(&out);
    assert!(err.contains("3 steps of") && err.contains("must be regenerated"), "{err}");
    assert!(err.contains("CI is set, so the build may not call a model"), "{err}");
    assert!(err.contains("it was never generated"), "{err}");
    assert!(err.contains(&format!("cargo promptgen -p {}", package.name)), "{err}");
    assert!(server.requests().is_empty(), "a CI build calls no model");
    assert!(!package.path("promptgen.lock").exists() && !package.path("promptgen").exists());
}

#[test]
fn options_of_run_before_another_subcommand_are_a_usage_error() {
    let package = new_one_step_package();
    for args in [&["--force", "check"][..], &["--model", "other-coder", "status"][..], &["--step", "01", "accept"][..]]
    {
        let out = run(&mut package.promptgen(args));
        assert_eq!(out.status.code(), Some(2), "{args:?} must not run while ignoring {}: {}", args[0], text(&out));
        assert!(stderr(&out).contains(args[0]), "{args:?}: {}", text(&out));
    }
}

#[test]
fn a_step_removed_from_the_manifest_leaves_the_lock_and_is_reported() {
    let server = FakeLlm::start(one_run());
    let package = three_step_package(&server);
    let manifest = package.read("Cargo.toml");
    let third =
        "\n[[package.metadata.promptgen.steps]]\nid = \"03\"\nprompt = \"prompts/03.md\"\noutputs = [\"c.rs\"]\n";
    assert!(manifest.contains(third), "{manifest}");
    package.write("Cargo.toml", &manifest.replacen(third, "\n", 1));

    let out = run(&mut package.promptgen(&["check"]));
    assert_eq!(out.status.code(), Some(1), "the lock no longer matches the manifest: {}", text(&out));
    assert!(
        stdout(&out).contains("promptgen.lock records step 03, which Cargo.toml no longer declares"),
        "{}",
        text(&out)
    );

    let out = run(package.promptgen(&[]).env("PROMPTGEN_BASE_URL", server.url()));
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert_eq!(server.requests().len(), 6, "02 and 01 are still fresh");
    let lock = package.read("promptgen.lock");
    assert!(!lock.contains("id = \"03\""), "the lock records a step the chain no longer has:\n{lock}");
    assert!(!package.path("promptgen/03").exists(), "run removes the folder of a step it no longer has");
    assert!(!package.path("promptgen/03.transcript.jsonl").exists());
    let out = run(&mut package.promptgen(&["check"]));
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(!stdout(&out).contains("warning"), "{}", text(&out));
}

/// `-p` takes `NAME` or `NAME@VERSION`, as cargo's does, and the workspace a package belongs
/// to is the one `cargo metadata` reports: a package excluded from the workspace around it
/// does not inherit that workspace's `[workspace.metadata.promptgen]`.
#[test]
fn packages_are_chosen_and_their_workspace_found_as_cargo_does() {
    let dir = tempfile::tempdir().unwrap();
    let write = |rel: &str, text: &str| {
        let path = dir.path().join(rel);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
    };
    write(
        "Cargo.toml",
        "[workspace]\nmembers = [\"member\"]\nexclude = [\"excluded\"]\n\n[workspace.metadata.promptgen]\nmodel = \"from-the-workspace\"\n",
    );
    let package = |name: &str| {
        format!(
            "[package]\nname = \"{name}\"\nversion = \"0.3.0\"\nedition = \"2021\"\n\n[package.metadata.promptgen]\n\n\
             [[package.metadata.promptgen.steps]]\nid = \"01\"\nprompt = \"p.md\"\n"
        )
    };
    for name in ["member", "excluded"] {
        write(&format!("{name}/Cargo.toml"), &package(name));
        write(&format!("{name}/src/lib.rs"), "");
        write(&format!("{name}/p.md"), "Say hello.\n");
    }
    let promptgen = |args: &[&str], cwd: &str| {
        let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_cargo-promptgen"));
        command.arg("promptgen").args(args).current_dir(dir.path().join(cwd));
        for var in ["PROMPTGEN_MODEL", "PROMPTGEN_BACKEND", "CI"] {
            command.env_remove(var);
        }
        command.env("CARGO_TARGET_DIR", dir.path().join("target"));
        run(&mut command)
    };
    // The member inherits the workspace's model, chosen by name or by name@version.
    for spec in ["member", "member@0.3.0"] {
        let out = promptgen(&["status", "-p", spec], ".");
        assert_eq!(out.status.code(), Some(0), "{}", text(&out));
        assert!(stdout(&out).contains("from-the-workspace"), "{}", text(&out));
    }
    let out = promptgen(&["status", "-p", "member@9.9.9"], ".");
    assert_eq!(out.status.code(), Some(2), "a usage error: {}", text(&out));
    assert!(
        stderr(&out).contains("no package `member@9.9.9`") && stderr(&out).contains("member@0.3.0"),
        "{}",
        text(&out)
    );
    // The excluded package is its own workspace: no model is inherited, and the error says so.
    let out = promptgen(&["status"], "excluded");
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let err = stderr(&out);
    assert!(
        err.contains("`package.metadata.promptgen.model` is missing") && !err.contains("from-the-workspace"),
        "{err}"
    );
}

/// Without the `online` feature the build entry compiles no HTTP client and no model loop:
/// a stale step is an error that names the feature and `cargo promptgen`, and no model is
/// called; a fresh lock builds as before.
#[test]
fn a_build_script_without_the_online_feature_never_calls_a_model() {
    let server = FakeLlm::start(one_run());
    let package = new_three_step_package();
    support::edit(&package, "Cargo.toml", ", features = [\"online\"]", "");
    let out = run(package.cargo(&["build", "--quiet"]).env("PROMPTGEN_BASE_URL", server.url()));
    assert!(!out.status.success(), "{}", text(&out));
    let err = stderr(&out);
    assert!(
        err.contains("`online` feature is off") && err.contains(&format!("cargo promptgen -p {}", package.name)),
        "{err}"
    );
    assert!(server.requests().is_empty(), "{err}");
    // `cargo promptgen` records the chain; the build then needs no model.
    let out = run(package.promptgen(&[]).env("PROMPTGEN_BASE_URL", server.url()));
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let out = run(&mut package.cargo(&["run", "--quiet"]));
    assert_eq!(stdout(&out).trim(), "a1bc", "{}", text(&out));
}
