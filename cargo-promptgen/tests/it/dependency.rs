//! Only the user's own packages call a model. A dependency that uses promptgen and comes from
//! git (here a local `file://` repository), a registry or a vendored directory builds from its
//! committed lock, and when that lock is stale the build fails naming the dependency, without
//! a request to any model server.

use std::path::Path;
use std::process::Command;

use promptgen_tests::FakeLlm;

use crate::support;
use crate::support::{Package, finish, run, shared_target, stderr, text, unseeded_chain, write};

fn git(dir: &Path, args: &[&str]) {
    let out = Command::new("git")
        .args(["-c", "user.email=test@example.com", "-c", "user.name=test", "-c", "init.defaultBranch=main"])
        .args(args)
        .current_dir(dir)
        .output()
        .expect("git runs");
    assert!(out.status.success(), "git {args:?}: {}", String::from_utf8_lossy(&out.stderr));
}

#[test]
fn a_git_dependency_whose_lock_is_stale_fails_the_build_naming_it_and_calls_no_model() {
    let server = FakeLlm::start(vec![write("greet.rs", "pub fn greet() -> &'static str { \"hi\" }\n"), finish()]);

    // The dependency: a library whose prompt chain was never recorded (no lock).
    let dependency = Package::new(&unseeded_chain("", &["greet.rs"]), "");
    std::fs::remove_file(dependency.path("src/main.rs")).unwrap();
    dependency.write("src/lib.rs", "include!(concat!(env!(\"OUT_DIR\"), \"/promptgen.rs\"));\n");
    dependency.write("prompts/01.md", "Write greet.rs with `pub fn greet() -> &'static str`.\n");
    let manifest = dependency.read("Cargo.toml").replace("[workspace]\n", "");
    dependency.write("Cargo.toml", &manifest);
    git(dependency.dir.path(), &["init", "-q"]);
    git(dependency.dir.path(), &["add", "-A"]);
    git(dependency.dir.path(), &["commit", "-q", "-m", "a greeting library"]);

    // The app, which depends on it through git, resolved from the workspace's lock file.
    let url = format!("file://{}", dependency.dir.path().display());
    let app = Package::with_dependencies("", "", &format!("{} = {{ git = \"{url}\" }}\n", dependency.name));
    let manifest = app.read("Cargo.toml");
    let manifest = manifest.split("[build-dependencies]").next().unwrap().to_string() + "[workspace]\n";
    app.write("Cargo.toml", &manifest);
    std::fs::remove_file(app.path("build.rs")).unwrap();
    app.write(
        "src/main.rs",
        &format!("fn main() {{\n    println!(\"{{}}\", {}::greet());\n}}\n", dependency.name.replace('-', "_")),
    );
    app.write("Cargo.lock", &support::workspace_lock());

    // A cargo home of its own for the git checkout (under the target folder, and the same
    // each run so that what it compiled stays fresh), sharing the registry so that nothing is
    // downloaded; a dead proxy makes any attempt to reach the internet fail instead.
    let cargo_home = shared_target().join("cargo-home-for-git-dependencies");
    if !cargo_home.join("registry").exists() {
        let user_home = std::env::var_os("CARGO_HOME")
            .map(std::path::PathBuf::from)
            .unwrap_or_else(|| Path::new(&std::env::var_os("HOME").unwrap()).join(".cargo"));
        std::fs::create_dir_all(&cargo_home).unwrap();
        std::os::unix::fs::symlink(user_home.join("registry"), cargo_home.join("registry")).unwrap();
    }

    // And a target folder of its own: cargo fingerprints a registry crate by the path its
    // sources were read from, so a build through this cargo home in the shared target folder
    // would make every other test's build compile the registry crates again, and back.
    let out = run(app
        .cargo(&["build"])
        .env("CARGO_HOME", &cargo_home)
        .env("CARGO_TARGET_DIR", shared_target().join("with-a-cargo-home-of-its-own"))
        .env("CARGO_HTTP_PROXY", "http://127.0.0.1:9")
        .env("CARGO_NET_RETRY", "0")
        .env("OLLAMA_HOST", server.url())
        .env("PROMPTGEN_BASE_URL", server.url()));
    assert!(!out.status.success(), "{}", text(&out));
    let err = stderr(&out);
    for phrase in [
        format!("{} is a dependency from a git repository", dependency.name),
        "step 01: ".to_string(),
        "A dependency's build never calls a model".to_string(),
        format!("cargo promptgen -p {}", dependency.name),
    ] {
        assert!(err.contains(&phrase), "expected `{phrase}` in:\n{err}");
    }
    assert!(server.requests().is_empty(), "the dependency's build called the model server");
}
