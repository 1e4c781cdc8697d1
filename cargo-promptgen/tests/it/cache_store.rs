//! `store = "cache"` without a remote: a chain recorded into the local cache, builds from it,
//! `store --to` both ways with the lock byte for byte unchanged, a lost or damaged cache (a
//! build fails with the fix and never calls a model, CI or not), and a build's pending results
//! reviewed with `diff` against the cache and recorded with `accept`. Real binaries, real
//! `cargo build`, the fake LLM server on loopback. (Against an S3 server: `s3_cache.rs`.)

use promptgen_tests::FakeLlm;

use crate::support::{A, B1, B2, Package, chain, edit, finish, run, snapshot, stderr, stdout, text, write};

/// A two-step package recorded in the repo store against `server`, and its own cache folder.
fn recorded(server: &FakeLlm) -> (Package, tempfile::TempDir) {
    for reply in [write("a.rs", A), finish(), write("b.rs", B1), finish()] {
        server.push(reply);
    }
    let package = Package::lettered(&chain("", &["a.rs", "b.rs"]), 2);
    let cache = tempfile::Builder::new().prefix("pg-cache-").tempdir().unwrap();
    let out = run(package.promptgen(&[]).env("PROMPTGEN_BASE_URL", server.url()));
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    (package, cache)
}

#[test]
fn switching_stores_moves_the_files_and_keeps_the_lock_byte_for_byte() {
    let server = FakeLlm::start(Vec::new());
    let (package, cache) = recorded(&server);
    let cache_dir = cache.path().to_str().unwrap();
    let lock = std::fs::read(package.path("promptgen.lock")).unwrap();
    let repo_store = snapshot(&package.path("promptgen"));
    assert!(repo_store.contains_key("01/a.rs") && repo_store.contains_key("02.transcript.jsonl"), "{repo_store:?}");

    // To the cache: the files leave promptgen/, the manifest says so, the lock stays.
    let out = run(package.promptgen(&["store", "--to", "cache"]).env("PROMPTGEN_CACHE_DIR", cache_dir));
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(stdout(&out).contains("Moved 2 steps (2 files)") && stdout(&out).contains("promptgen.lock is unchanged"));
    assert_eq!(std::fs::read(package.path("promptgen.lock")).unwrap(), lock, "the lock is byte-identical");
    assert!(!package.path("promptgen").exists(), "promptgen/ is gone");
    let manifest = package.read("Cargo.toml");
    assert!(manifest.contains("[package.metadata.promptgen]\nstore = \"cache\"\nbackend = \"ollama\""), "{manifest}");
    let objects: Vec<String> =
        snapshot(cache.path()).into_keys().filter(|p| p.starts_with("sha256/") && !p.ends_with('/')).collect();
    assert_eq!(objects.len(), 2, "{objects:?}");
    assert_eq!(snapshot(&cache.path().join("transcripts")).len(), 2, "the transcripts go to the cache by step key");

    // It builds from the cache, offline, and `check` and `status` agree.
    let out = run(package.cargo(&["run", "--quiet"]).env("PROMPTGEN_CACHE_DIR", cache_dir).env("CI", "true"));
    assert_eq!(stdout(&out).trim(), "ab1", "{}", text(&out));
    let out = run(package.promptgen(&["check"]).env("PROMPTGEN_CACHE_DIR", cache_dir));
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    // Running it again changes nothing.
    let out = run(package.promptgen(&["store", "--to", "cache"]).env("PROMPTGEN_CACHE_DIR", cache_dir));
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(stdout(&out).contains("already said store = \"cache\""), "{}", text(&out));

    // And back: promptgen/ holds exactly what it held, transcripts included.
    let out = run(package.promptgen(&["store", "--to", "repo"]).env("PROMPTGEN_CACHE_DIR", cache_dir));
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert_eq!(std::fs::read(package.path("promptgen.lock")).unwrap(), lock, "the lock is byte-identical");
    assert_eq!(snapshot(&package.path("promptgen")), repo_store);
    assert!(package.read("Cargo.toml").contains("store = \"repo\""));
    let out = run(package.cargo(&["run", "--quiet"]).env("CI", "true"));
    assert_eq!(stdout(&out).trim(), "ab1", "{}", text(&out));
    assert_eq!(server.requests().len(), 4, "no switch and no build called a model");
}

#[test]
fn a_lost_or_damaged_cache_fails_the_build_with_the_fix_and_never_calls_a_model() {
    let server = FakeLlm::start(Vec::new());
    let (package, cache) = recorded(&server);
    let cache_dir = cache.path().to_str().unwrap();
    let out = run(package.promptgen(&["store", "--to", "cache"]).env("PROMPTGEN_CACHE_DIR", cache_dir));
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let lock = package.read("promptgen.lock");

    // A damaged object: an online build refuses it, names it, and says what fixes it.
    let object = snapshot(cache.path()).into_keys().find(|p| p.starts_with("sha256/") && p.len() > 20).unwrap();
    std::fs::write(cache.path().join(&object), "pub fn a() -> &'static str { \"evil\" }\n").unwrap();
    let out =
        run(package.cargo(&["build"]).env("PROMPTGEN_CACHE_DIR", cache_dir).env("PROMPTGEN_BASE_URL", server.url()));
    assert!(!out.status.success(), "{}", text(&out));
    let err = stderr(&out);
    assert!(err.contains("(1 there but damaged, and not used)") && err.contains("damaged"), "{err}");
    assert!(
        err.contains("No `cache_url` is set") && err.contains(&format!("cargo promptgen -p {}", package.name)),
        "{err}"
    );

    // A lost cache: the build fails with the list, online or CI, and calls no model.
    std::fs::remove_dir_all(cache.path()).unwrap();
    for ci in [false, true] {
        let mut command = package.cargo(&["build"]);
        command.env("PROMPTGEN_CACHE_DIR", cache_dir).env("PROMPTGEN_BASE_URL", server.url());
        if ci {
            command.env("CI", "true");
        }
        let out = run(&mut command);
        assert!(!out.status.success(), "{}", text(&out));
        let err = stderr(&out);
        assert!(
            err.contains("2 files that promptgen.lock records for") && err.contains("are not in the local cache"),
            "{err}"
        );
        assert!(err.contains("step 01: `a.rs` (sha256 ") && err.contains("step 02: `b.rs`"), "{err}");
    }
    let out = run(package.promptgen(&["check"]).env("PROMPTGEN_CACHE_DIR", cache_dir));
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(
        stdout(&out).contains("not in the local cache") && stdout(&out).contains("cargo promptgen pull"),
        "{}",
        text(&out)
    );
    let out = run(package.promptgen(&["status"]).env("PROMPTGEN_CACHE_DIR", cache_dir));
    assert!(stdout(&out).contains("unpulled"), "{}", text(&out));
    assert_eq!(server.requests().len(), 4, "no build called a model");
    assert_eq!(package.read("promptgen.lock"), lock);

    // Without a remote, `cargo promptgen` regenerates them: the documented price of a lost cache.
    for reply in [write("a.rs", A), finish(), write("b.rs", B1), finish()] {
        server.push(reply);
    }
    let out = run(package.promptgen(&[]).env("PROMPTGEN_CACHE_DIR", cache_dir).env("PROMPTGEN_BASE_URL", server.url()));
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(
        stderr(&out).contains("step 01: running, because 1 of its 1 files is not in the local cache"),
        "{}",
        text(&out)
    );
    let out = run(package.cargo(&["run", "--quiet"]).env("PROMPTGEN_CACHE_DIR", cache_dir).env("CI", "1"));
    assert_eq!(stdout(&out).trim(), "ab1", "{}", text(&out));
}

#[test]
fn pending_results_in_cache_mode_are_diffed_against_the_cache_and_accepted_into_it() {
    let server = FakeLlm::start(Vec::new());
    let (package, cache) = recorded(&server);
    let cache_dir = cache.path().to_str().unwrap();
    let out = run(package.promptgen(&["store", "--to", "cache"]).env("PROMPTGEN_CACHE_DIR", cache_dir));
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let cache_before = snapshot(cache.path());

    // An online build regenerates the edited step into the pending area, not the cache.
    edit(&package, "prompts/02.md", "using a.", "using a, saying b2.");
    server.push(write("b.rs", B2));
    server.push(finish());
    let out =
        run(package.cargo(&["build"]).env("PROMPTGEN_CACHE_DIR", cache_dir).env("PROMPTGEN_BASE_URL", server.url()));
    assert!(stderr(&out).contains("cargo promptgen accept"), "{}", text(&out));
    let out = run(package
        .cargo(&["run", "--quiet"])
        .env("PROMPTGEN_CACHE_DIR", cache_dir)
        .env("PROMPTGEN_BASE_URL", server.url()));
    assert_eq!(stdout(&out).trim(), "ab2", "{}", text(&out));
    assert_eq!(snapshot(cache.path()), cache_before, "a build never writes the cache");

    // `diff` shows the code diff from the cache's copy to the pending one.
    let out = run(package.promptgen(&["diff"]).env("PROMPTGEN_CACHE_DIR", cache_dir));
    let diff = stdout(&out);
    assert!(
        diff.contains(&format!("-{}", B1.trim_end())) && diff.contains(&format!("+{}", B2.trim_end())),
        "{}",
        text(&out)
    );

    // `accept` records it into the lock and the cache; then CI builds it.
    let out = run(package.promptgen(&["accept"]).env("PROMPTGEN_CACHE_DIR", cache_dir));
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(!package.path("promptgen").exists(), "nothing lands in promptgen/ in cache mode");
    let out = run(package.promptgen(&["check"]).env("PROMPTGEN_CACHE_DIR", cache_dir));
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let out = run(package.cargo(&["run", "--quiet"]).env("PROMPTGEN_CACHE_DIR", cache_dir).env("CI", "true"));
    assert_eq!(stdout(&out).trim(), "ab2", "{}", text(&out));
    assert_eq!(server.requests().len(), 6);
}

#[test]
fn push_and_pull_say_what_is_missing_from_the_setup() {
    let server = FakeLlm::start(Vec::new());
    let (package, cache) = recorded(&server);
    let cache_dir = cache.path().to_str().unwrap();
    let out = run(package.promptgen(&["push"]).env("PROMPTGEN_CACHE_DIR", cache_dir));
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(stderr(&out).contains("store = \"repo\"") && stderr(&out).contains("store --to cache"), "{}", text(&out));
    let out = run(package.promptgen(&["store", "--to", "cache"]).env("PROMPTGEN_CACHE_DIR", cache_dir));
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let out = run(package.promptgen(&["pull"]).env("PROMPTGEN_CACHE_DIR", cache_dir));
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(
        stderr(&out).contains("has no remote to pull") && stderr(&out).contains("cache_url = \"s3://"),
        "{}",
        text(&out)
    );

    // A cache_url that is not one is an error naming the key, line and column.
    edit(&package, "Cargo.toml", "store = \"cache\"", "store = \"cache\"\ncache_url = \"https://bucket\"");
    let out = run(package.promptgen(&["check"]).env("PROMPTGEN_CACHE_DIR", cache_dir));
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let err = stderr(&out);
    assert!(
        err.contains("Cargo.toml:") && err.contains("package.metadata.promptgen.cache_url") && err.contains("s3://"),
        "{err}"
    );

    // Cache mode needs a cache folder: with no HOME and no PROMPTGEN_CACHE_DIR, a clear error.
    edit(&package, "Cargo.toml", "cache_url = \"https://bucket\"", "");
    let out = run(package.promptgen(&["check"]).env_remove("HOME").env_remove("XDG_CACHE_HOME"));
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(
        stderr(&out).contains("needs a cache folder") && stderr(&out).contains("PROMPTGEN_CACHE_DIR"),
        "{}",
        text(&out)
    );
}
