//! The cache's S3 remote against a REAL S3-protocol server: moto's, on loopback, with
//! authentication on. `scripts/s3-cache.sh` installs and starts it, creates a user, its key and
//! a bucket, and runs these tests with `--ignored`, the server in `PROMPTGEN_S3_*`. Without a
//! server they are ignored (and run by hand without one, they fail loudly rather than pass).
//!
//! Covered: a crate's whole life in cache mode (run and push, a fresh clone that pulls and
//! builds offline with no model call, `check`, `status`, `diff`); a push cut off in the middle
//! and resumed; a damaged object, in the bucket and in the local cache; wrong credentials; a
//! dead endpoint. The model is the fake LLM server, on loopback too.

use std::path::Path;
use std::process::Command;

use cargo_promptgen::__private::remote::Remote;
use cargo_promptgen::__private::{Cache, CacheUrl};
use cargo_promptgen::__private::{Lock, sha256_hex};
use promptgen_tests::{FakeLlm, refused_url};

use crate::support::cutting_proxy::CuttingProxy;
use crate::support::{Package, edit, finish, run, snapshot, stderr, stdout, text, unique_id, write};

const WHY: &str = "needs an S3 server: run scripts/s3-cache.sh";

/// The server the script started.
struct S3 {
    endpoint: String,
    bucket: String,
    key_id: String,
    secret: String,
}

fn s3() -> S3 {
    let var = |name: &str| std::env::var(name).unwrap_or_else(|_| panic!("{name} is not set: these tests {WHY}"));
    S3 {
        endpoint: var("PROMPTGEN_S3_ENDPOINT"),
        bucket: var("PROMPTGEN_S3_BUCKET"),
        key_id: var("PROMPTGEN_S3_KEY_ID"),
        secret: var("PROMPTGEN_S3_SECRET"),
    }
}

/// A key prefix no other test uses.
fn unique_prefix(name: &str) -> String {
    format!("{name}-{}", unique_id())
}

impl S3 {
    fn url(&self, prefix: &str) -> String {
        format!("s3://{}/{prefix}", self.bucket)
    }

    /// `command` pointed at this server with the right key, and at the cache folder `cache`.
    fn env<'c>(&self, command: &'c mut Command, cache: &Path) -> &'c mut Command {
        command
            .env("AWS_ENDPOINT_URL", &self.endpoint)
            .env("AWS_ACCESS_KEY_ID", &self.key_id)
            .env("AWS_SECRET_ACCESS_KEY", &self.secret)
            .env("AWS_REGION", "us-east-1")
            .env("PROMPTGEN_CACHE_DIR", cache)
    }

    /// The library's own client, for the tests' looks at the bucket (and its damage).
    fn remote(&self, prefix: &str) -> Remote {
        let url = CacheUrl::parse(&self.url(prefix)).unwrap();
        let env = |name: &str| match name {
            "AWS_ENDPOINT_URL" => Some(self.endpoint.clone()),
            "AWS_ACCESS_KEY_ID" => Some(self.key_id.clone()),
            "AWS_SECRET_ACCESS_KEY" => Some(self.secret.clone()),
            "AWS_REGION" => Some("us-east-1".into()),
            "AWS_CONFIG_FILE" | "AWS_SHARED_CREDENTIALS_FILE" => Some("/nonexistent/aws".into()),
            _ => None,
        };
        Remote::open(&url, &env).unwrap()
    }
}

/// The hashes of the files a package's lock records.
fn locked_hashes(package: &Package) -> Vec<String> {
    let lock = Lock::read(&package.path("promptgen.lock")).unwrap();
    let mut hashes: Vec<String> = lock.steps.iter().flat_map(|s| s.files.iter().map(|f| f.sha256.clone())).collect();
    hashes.sort();
    hashes.dedup();
    hashes
}

/// How many of `hashes` the bucket holds under `prefix`.
fn in_bucket(s3: &S3, prefix: &str, hashes: &[String]) -> usize {
    let remote = s3.remote(prefix);
    hashes.iter().filter(|h| remote.head(&format!("sha256/{h}")).unwrap().is_some()).count()
}

fn metadata(url: &str, steps: &[(&str, &[&str])]) -> String {
    let mut text = format!(
        "[package.metadata.promptgen]\nbackend = \"ollama\"\nmodel = \"fake-coder\"\nseed = 1\nstore = \"cache\"\ncache_url = \"{url}\"\n"
    );
    for (id, outputs) in steps {
        let outputs: Vec<String> = outputs.iter().map(|o| format!("\"{o}\"")).collect();
        text.push_str(&format!(
            "\n[[package.metadata.promptgen.steps]]\nid = \"{id}\"\nprompt = \"prompts/{id}.md\"\noutputs = [{}]\n",
            outputs.join(", ")
        ));
    }
    text
}

/// A cache-mode package of `steps` (each writing its outputs as `pub const` items), recorded
/// against `server` with `run_args` (the push is whatever they make it).
fn recorded(
    s3: &S3,
    prefix: &str,
    server: &FakeLlm,
    cache: &Path,
    steps: &[(&str, &[&str])],
    run_args: &[&str],
) -> Package {
    let package = Package::new(&metadata(&s3.url(prefix), steps), "");
    for (id, outputs) in steps {
        package.write(&format!("prompts/{id}.md"), &format!("Write {}.\n", outputs.join(", ")));
        for output in *outputs {
            server.push(write(output, &format!("pub const NAME: &str = \"{id}/{output}\";\n")));
        }
        server.push(finish());
    }
    let out = run(s3.env(package.promptgen(run_args).env("PROMPTGEN_BASE_URL", server.url()), cache));
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    package
}

/// Copies what a clone of `package`'s repository holds (no target folder, no cache) to a new folder.
fn fresh_clone(package: &Package) -> Package {
    let clone = Package::new("", "");
    for entry in ["Cargo.toml", "build.rs", "promptgen.lock"] {
        std::fs::copy(package.path(entry), clone.path(entry)).unwrap();
    }
    for dir in ["src", "prompts"] {
        for (rel, bytes) in snapshot(&package.path(dir)).into_iter().filter(|(rel, _)| !rel.ends_with('/')) {
            let to = clone.path(&format!("{dir}/{rel}"));
            std::fs::create_dir_all(to.parent().unwrap()).unwrap();
            std::fs::write(to, bytes).unwrap();
        }
    }
    assert!(!clone.path("promptgen").exists());
    Package { name: package.name.clone(), ..clone }
}

const AREA: &str = "pub fn area(w: u32, h: u32) -> u32 {\n    w * h\n}\n";
const DESCRIBE1: &str =
    "pub fn describe(w: u32, h: u32) -> String {\n    format!(\"{w}x{h} = {}\", super::shapes::area(w, h))\n}\n";
const DESCRIBE2: &str =
    "pub fn describe(w: u32, h: u32) -> String {\n    format!(\"{w} by {h} is {}\", super::shapes::area(w, h))\n}\n";

#[test]
#[ignore = "needs an S3 server: run scripts/s3-cache.sh"]
fn a_crate_in_cache_mode_runs_pushes_and_a_fresh_clone_pulls_and_builds_offline_without_a_model() {
    let s3 = s3();
    let prefix = unique_prefix("life");
    let server = FakeLlm::start(vec![write("shapes.rs", AREA), finish(), write("describe.rs", DESCRIBE1), finish()]);
    let cache = tempfile::Builder::new().prefix("pg-cache-").tempdir().unwrap();
    // A crate with a crates.io dependency, its own module and its own test, both using the
    // generated code.
    let package = Package::with_dependencies(
        &metadata(&s3.url(&prefix), &[("01", &["shapes.rs"]), ("02", &["describe.rs"])]),
        "",
        "fastrand = \"2\"",
    );
    package.write("prompts/01.md", "Write shapes.rs with fn area(w, h).\n");
    package.write("prompts/02.md", "Write describe.rs with fn describe(w, h) using area.\n");
    package.write(
        "src/main.rs",
        "mod generated {\n    include!(concat!(env!(\"OUT_DIR\"), \"/promptgen.rs\"));\n}\nmod dice;\n\nfn main() {\n    \
         let mut rng = fastrand::Rng::with_seed(7);\n    let (w, h) = dice::roll(&mut rng);\n    println!(\"{}\", generated::describe::describe(w, h));\n}\n",
    );
    package.write(
        "src/dice.rs",
        "/// A rectangle of random sides from 1 to 6.\npub fn roll(rng: &mut fastrand::Rng) -> (u32, u32) {\n    (rng.u32(1..=6), rng.u32(1..=6))\n}\n\n\
         #[cfg(test)]\nmod tests {\n    #[test]\n    fn the_generated_area_is_width_times_height() {\n        let mut rng = fastrand::Rng::with_seed(1);\n        \
         for _ in 0..20 {\n            let (w, h) = super::roll(&mut rng);\n            assert_eq!(crate::generated::shapes::area(w, h), w * h);\n        }\n        \
         assert_eq!(crate::generated::describe::describe(2, 3), \"2x3 = 6\");\n    }\n}\n",
    );

    // 1. The run records into the local cache and pushes.
    let out = run(s3.env(package.promptgen(&[]).env("PROMPTGEN_BASE_URL", server.url()), cache.path()));
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(
        stderr(&out).contains("Pushed 2 of the 2 files promptgen.lock names") && stderr(&out).contains("2 transcripts"),
        "{}",
        text(&out)
    );
    assert!(!package.path("promptgen").exists(), "nothing generated in the package");
    let hashes = locked_hashes(&package);
    assert_eq!(in_bucket(&s3, &prefix, &hashes), 2);
    assert_eq!(server.requests().len(), 4);
    let out = run(s3.env(package.cargo(&["test", "--offline", "--quiet"]).env("CI", "true"), cache.path()));
    assert!(out.status.success(), "{}", text(&out));

    // 2. The local cache is gone; a fresh clone (no target output, no cache) pulls and builds
    //    offline, CI set, with no model call; the crate's own test passes.
    std::fs::remove_dir_all(cache.path()).unwrap();
    let clone = fresh_clone(&package);
    let clone_cache = tempfile::Builder::new().prefix("pg-cache-").tempdir().unwrap();
    let out = run(s3.env(clone.cargo(&["build", "--offline", "--quiet"]).env("CI", "true"), clone_cache.path()));
    assert!(!out.status.success() && stderr(&out).contains("cargo promptgen pull -p"), "{}", text(&out));
    let out = run(s3.env(&mut clone.promptgen(&["pull"]), clone_cache.path()));
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(
        stderr(&out).contains("Pulled 2 of the 2 files") && stderr(&out).contains("2 transcripts"),
        "{}",
        text(&out)
    );
    let out = run(s3.env(&mut clone.promptgen(&["pull"]), clone_cache.path()));
    assert!(stderr(&out).contains("already holds the 2 files"), "{}", text(&out));
    let out = run(s3.env(clone.cargo(&["test", "--offline", "--quiet"]).env("CI", "true"), clone_cache.path()));
    assert!(out.status.success(), "{}", text(&out));
    let out = run(s3.env(clone.cargo(&["run", "--offline", "--quiet"]).env("CI", "true"), clone_cache.path()));
    assert!(stdout(&out).contains(" = "), "{}", text(&out));
    assert_eq!(server.requests().len(), 4, "the clone made no model call");

    // 3. check and status work from the cache.
    let out = run(s3.env(&mut clone.promptgen(&["check"]), clone_cache.path()));
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let out = run(s3.env(&mut clone.promptgen(&["status"]), clone_cache.path()));
    assert_eq!(stdout(&out).matches("fresh").count(), 2, "{}", text(&out));

    // 4. diff: an edited prompt, regenerated by an online build, against the cache's copy.
    edit(&clone, "prompts/02.md", "using area.", "using area, in words.");
    server.push(write("describe.rs", DESCRIBE2));
    server.push(finish());
    let out =
        run(s3.env(clone.cargo(&["build", "--offline"]).env("PROMPTGEN_BASE_URL", server.url()), clone_cache.path()));
    assert!(out.status.success(), "{}", text(&out));
    let out = run(s3.env(&mut clone.promptgen(&["diff"]), clone_cache.path()));
    let diff = stdout(&out);
    assert!(
        diff.contains("-    format!(\"{w}x{h} = {}\"") && diff.contains("+    format!(\"{w} by {h} is {}\""),
        "{}",
        text(&out)
    );
    // `cargo promptgen` records the pending result and pushes the one new file.
    let out = run(s3.env(clone.promptgen(&[]).env("PROMPTGEN_BASE_URL", server.url()), clone_cache.path()));
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(stderr(&out).contains("Pushed 1 of the 2 files"), "{}", text(&out));
    assert_eq!(server.requests().len(), 6);
}

#[test]
#[ignore = "needs an S3 server: run scripts/s3-cache.sh"]
fn a_push_cut_off_in_the_middle_leaves_whole_objects_and_the_next_push_uploads_only_the_rest() {
    let s3 = s3();
    let prefix = unique_prefix("partial");
    let server = FakeLlm::start(Vec::new());
    let cache = tempfile::Builder::new().prefix("pg-cache-").tempdir().unwrap();
    let steps: &[(&str, &[&str])] =
        &[("01", &["a.txt", "b.txt"]), ("02", &["c.txt", "d.txt"]), ("03", &["e.txt", "f.txt"])];
    let package = recorded(&s3, &prefix, &server, cache.path(), steps, &["--no-push"]);
    let hashes = locked_hashes(&package);
    assert_eq!(hashes.len(), 6);
    assert_eq!(in_bucket(&s3, &prefix, &hashes), 0, "--no-push uploads nothing");

    // The remote dies after two uploads: the push retries, then fails clearly.
    let proxy = CuttingProxy::start(&s3.endpoint, 2);
    let out = run(s3.env(&mut package.promptgen(&["push"]), cache.path()).env("AWS_ENDPOINT_URL", &proxy.url));
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let err = stderr(&out);
    assert!(
        err.contains("trying again in") && err.contains("did not answer") && err.contains("after 4 tries"),
        "{err}"
    );
    assert!(proxy.is_cut());
    assert_eq!(proxy.puts(), 2);
    assert_eq!(in_bucket(&s3, &prefix, &hashes), 2, "exactly the two uploads that went through");

    // Resumed: only the four others go up; a third push has nothing to do.
    let out = run(s3.env(&mut package.promptgen(&["push"]), cache.path()));
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(
        stderr(&out).contains("Pushed 4 of the 6 files") && stderr(&out).contains("the other 2 were there already"),
        "{}",
        text(&out)
    );
    assert_eq!(in_bucket(&s3, &prefix, &hashes), 6);
    let out = run(s3.env(&mut package.promptgen(&["push"]), cache.path()));
    assert!(stderr(&out).contains("Pushed 0 of the 6 files"), "{}", text(&out));

    // Every object is whole: a fresh cache pulls all six and checks each.
    let fresh = tempfile::Builder::new().prefix("pg-cache-").tempdir().unwrap();
    let out = run(s3.env(&mut package.promptgen(&["pull"]), fresh.path()));
    assert!(stderr(&out).contains("Pulled 6 of the 6 files"), "{}", text(&out));
}

#[test]
#[ignore = "needs an S3 server: run scripts/s3-cache.sh"]
fn a_damaged_object_in_the_bucket_is_refused_by_pull_and_replaced_by_push() {
    let s3 = s3();
    let prefix = unique_prefix("damaged-remote");
    let server = FakeLlm::start(Vec::new());
    let cache = tempfile::Builder::new().prefix("pg-cache-").tempdir().unwrap();
    let package = recorded(&s3, &prefix, &server, cache.path(), &[("01", &["a.txt", "b.txt"])], &[]);
    let hashes = locked_hashes(&package);
    assert_eq!(in_bucket(&s3, &prefix, &hashes), 2);
    let damaged = &hashes[0];
    s3.remote(&prefix).put(&format!("sha256/{damaged}"), b"not what was recorded").unwrap();

    // A fresh cache: pull keeps the sound object, refuses the damaged one, and says so.
    let fresh = tempfile::Builder::new().prefix("pg-cache-").tempdir().unwrap();
    let out = run(s3.env(&mut package.promptgen(&["pull"]), fresh.path()));
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let err = stderr(&out);
    assert!(
        err.contains(&format!("sha256/{damaged}` is damaged")) && err.contains(&sha256_hex(b"not what was recorded")),
        "{err}"
    );
    assert!(err.contains("It was not used") && err.contains("1 others were fetched and kept"), "{err}");
    let fresh_cache = Cache::new(fresh.path());
    assert!(!fresh_cache.object_path(damaged).unwrap().exists(), "the damaged bytes are not stored");
    assert!(fresh_cache.object_path(&hashes[1]).unwrap().exists());
    let out = run(s3.env(package.cargo(&["build", "--quiet"]).env("CI", "true"), fresh.path()));
    assert!(!out.status.success() && stderr(&out).contains("1 file that promptgen.lock records"), "{}", text(&out));

    // A push from the machine with a sound copy replaces it (its size differs); then pull works.
    let out = run(s3.env(&mut package.promptgen(&["push"]), cache.path()));
    assert!(stderr(&out).contains("Pushed 1 of the 2 files"), "{}", text(&out));
    let out = run(s3.env(&mut package.promptgen(&["pull"]), fresh.path()));
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let out = run(s3.env(package.cargo(&["build", "--quiet"]).env("CI", "true"), fresh.path()));
    assert!(out.status.success(), "{}", text(&out));
}

#[test]
#[ignore = "needs an S3 server: run scripts/s3-cache.sh"]
fn a_damaged_local_object_is_never_built_never_pushed_and_pull_repairs_it() {
    let s3 = s3();
    let prefix = unique_prefix("damaged-local");
    let server = FakeLlm::start(Vec::new());
    let cache = tempfile::Builder::new().prefix("pg-cache-").tempdir().unwrap();
    let package = recorded(&s3, &prefix, &server, cache.path(), &[("01", &["a.txt", "b.txt"])], &["--no-push"]);
    let hashes = locked_hashes(&package);
    let path = Cache::new(cache.path()).object_path(&hashes[0]).unwrap();
    let good = std::fs::read(&path).unwrap();
    // Same length, other bytes: only the hash can tell.
    let mut bad = good.clone();
    bad[0] ^= 0x20;
    std::fs::write(&path, &bad).unwrap();

    let out = run(s3.env(package.cargo(&["build", "--quiet"]).env("PROMPTGEN_BASE_URL", refused_url()), cache.path()));
    assert!(!out.status.success(), "{}", text(&out));
    assert!(stderr(&out).contains("there but damaged, and not used"), "{}", text(&out));
    let out = run(s3.env(&mut package.promptgen(&["push"]), cache.path()));
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(stderr(&out).contains(": damaged"), "{}", text(&out));
    assert_eq!(in_bucket(&s3, &prefix, &hashes), 0, "a push with a damaged file uploads nothing");

    // Once the bucket has a sound copy (from a machine that has one), pull repairs the cache.
    s3.remote(&prefix).put(&format!("sha256/{}", hashes[0]), &good).unwrap();
    let out = run(s3.env(&mut package.promptgen(&["pull"]), cache.path()));
    assert!(stderr(&out).contains("Pulled 1 of the 2 files"), "{}", text(&out));
    assert_eq!(std::fs::read(&path).unwrap(), good);
    let out = run(s3.env(package.cargo(&["build", "--quiet"]).env("CI", "true"), cache.path()));
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(server.requests().len(), 3, "no build called a model");
}

#[test]
#[ignore = "needs an S3 server: run scripts/s3-cache.sh"]
fn wrong_credentials_are_a_clear_error_that_says_what_to_set() {
    let s3 = s3();
    let prefix = unique_prefix("credentials");
    let server = FakeLlm::start(Vec::new());
    let cache = tempfile::Builder::new().prefix("pg-cache-").tempdir().unwrap();
    let package = recorded(&s3, &prefix, &server, cache.path(), &[("01", &["a.txt"])], &["--no-push"]);
    let hashes = locked_hashes(&package);
    // (No credentials at all: S3 answers an unsigned request 403 too, but moto 5.2.5 with
    // authentication on answers it 500, a KeyError of its own, so that case is not asserted here.)
    let cases = [
        ("SignatureDoesNotMatch", s3.key_id.as_str(), "wrong-secret"),
        ("InvalidAccessKeyId", "AKIAWRONGWRONGWRONG1", s3.secret.as_str()),
    ];
    for (expected, key_id, secret) in cases {
        let mut command = package.promptgen(&["push"]);
        s3.env(&mut command, cache.path()).env("AWS_ACCESS_KEY_ID", key_id).env("AWS_SECRET_ACCESS_KEY", secret);
        let out = run(&mut command);
        assert_eq!(out.status.code(), Some(1), "{}", text(&out));
        let err = stderr(&out);
        assert!(err.contains("refused the request") && err.contains("HTTP 403") && err.contains(expected), "{err}");
        assert!(err.contains("Set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY"), "{err}");
        assert!(!err.contains("trying again"), "a refusal is not retried: {err}");
    }
    assert_eq!(in_bucket(&s3, &prefix, &hashes), 0);

    // `cargo promptgen` with a stale step and wrong keys: refused before any model call.
    let lock = package.read("promptgen.lock");
    edit(&package, "prompts/01.md", "Write", "Now write");
    let out = run(s3
        .env(package.promptgen(&[]).env("PROMPTGEN_BASE_URL", server.url()), cache.path())
        .env("AWS_SECRET_ACCESS_KEY", "wrong"));
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(
        stderr(&out).contains("nothing was run") && stderr(&out).contains("SignatureDoesNotMatch"),
        "{}",
        text(&out)
    );
    assert_eq!(server.requests().len(), 2, "no model call");
    assert_eq!(package.read("promptgen.lock"), lock);
}

#[test]
#[ignore = "needs an S3 server: run scripts/s3-cache.sh"]
fn a_dead_endpoint_is_retried_then_a_clear_error_and_nothing_is_recorded_or_half_written() {
    let s3 = s3();
    let prefix = unique_prefix("dead");
    let server = FakeLlm::start(Vec::new());
    let cache = tempfile::Builder::new().prefix("pg-cache-").tempdir().unwrap();
    let package = recorded(&s3, &prefix, &server, cache.path(), &[("01", &["a.txt"])], &["--no-push"]);
    let dead = refused_url();
    let lock = package.read("promptgen.lock");

    let out = run(s3.env(&mut package.promptgen(&["push"]), cache.path()).env("AWS_ENDPOINT_URL", &dead));
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let err = stderr(&out);
    assert_eq!(err.matches("trying again in").count(), 3, "{err}");
    assert!(
        err.contains("did not answer") && err.contains("after 4 tries") && err.contains("AWS_ENDPOINT_URL"),
        "{err}"
    );
    assert!(err.contains("nothing is half-written"), "{err}");

    // A pull into an empty cache writes nothing at all, not even a temporary file.
    let fresh = tempfile::Builder::new().prefix("pg-cache-").tempdir().unwrap();
    let out = run(s3.env(&mut package.promptgen(&["pull"]), fresh.path()).env("AWS_ENDPOINT_URL", &dead));
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(stderr(&out).contains("did not answer"), "{}", text(&out));
    assert!(snapshot(fresh.path()).is_empty(), "{:?}", snapshot(fresh.path()));

    // A run that would push: refused before any model call, nothing recorded.
    edit(&package, "prompts/01.md", "Write", "Now write");
    let before = snapshot(cache.path());
    let out = run(s3
        .env(package.promptgen(&[]).env("PROMPTGEN_BASE_URL", server.url()), cache.path())
        .env("AWS_ENDPOINT_URL", &dead));
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(stderr(&out).contains("nothing was run") && stderr(&out).contains("--no-push"), "{}", text(&out));
    assert_eq!(server.requests().len(), 2, "no model call");
    assert_eq!(package.read("promptgen.lock"), lock);
    assert_eq!(snapshot(cache.path()), before);
}
