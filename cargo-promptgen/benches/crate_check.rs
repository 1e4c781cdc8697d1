//! What a crate-context check costs next to the `cargo check` a user runs anyway (BENCHMARKS.md,
//! figure 8).
//!
//! ```sh
//! cargo bench -p cargo-promptgen --bench crate_check   # a few minutes: it compiles serde twice
//! ```
//!
//! A realistic throwaway crate: serde and serde_json from the registry, a hand-written
//! `src/domain.rs`, a `main.rs` and tests that use the generated module, and a build script
//! that calls cargo-promptgen. Its step's check (`cargo check`, the default) runs through the
//! library's own `check_for`, exactly as a step's `finish` runs it, against the command a user
//! types in the same crate with the same generated files: `cargo check --all-targets`.
//!
//! - **First check on a machine**: the check's target folder empty, against a plain
//!   `cargo check` into an empty target folder. Both compile the dependencies once.
//! - **Re-check after a repair**: the candidate's one generated file changed, against a plain
//!   `cargo check` after touching one file of the crate. Goal: at most 1.3x.
//!
//! Each repetition runs both sides, alternating which goes first; a figure is the median of
//! the per-repetition ratios with their minimum and maximum. `PROMPTGEN_BENCH_REPS=n` sets the
//! repetitions of the re-check (default 9); the first check runs 3 times.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use cargo_promptgen::__private::Layout;
use cargo_promptgen::__private::{self as config, Overrides};
use cargo_promptgen::__private::{CheckSetup, Later, check_for};
use codegen_core::check::CheckOutcome;

const DOMAIN: &str = "#[derive(serde::Serialize)]\npub struct User {\n    pub name: String,\n    pub age: u32,\n}\n";

const MAIN: &str = r##"mod domain;

#[allow(dead_code)]
mod generated {
    include!(concat!(env!("OUT_DIR"), "/promptgen.rs"));
}

fn main() {
    let user = domain::User { name: "Ada".into(), age: 36 };
    println!("{}", generated::user_json::to_json(&user));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_has_every_field() {
        let user = domain::User { name: "Ada".into(), age: 36 };
        assert_eq!(generated::user_json::to_json(&user), r#"{"name":"Ada","age":36}"#);
    }
}
"##;

/// The generated file; `{n}` makes each repair a different file.
fn generated(n: usize) -> String {
    format!(
        "use crate::domain::User;\n\npub fn to_json(user: &User) -> String {{\n    serde_json::to_string(user).expect(\"a User always serialises\")\n}}\n\npub fn describe(user: &User) -> String {{\n    format!(\"{{}} ({{}}) #{n}\", user.name, user.age)\n}}\n"
    )
}

struct Crate {
    _dir: tempfile::TempDir,
    root: PathBuf,
}

fn realistic_crate() -> Crate {
    let dir = tempfile::Builder::new().prefix("promptgen-bench-check-").tempdir().unwrap();
    let root = dir.path().join("app");
    let write = |rel: &str, text: &str| {
        let path = root.join(rel);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
    };
    let promptgen = Path::new(env!("CARGO_MANIFEST_DIR"));
    write(
        "Cargo.toml",
        &format!(
            "[package]\nname = \"bench-crate-check\"\nversion = \"0.1.0\"\nedition = \"2021\"\npublish = false\n\n\
             [dependencies]\nserde = {{ version = \"1\", features = [\"derive\"] }}\nserde_json = \"1\"\n\n\
             [build-dependencies]\ncargo-promptgen = {{ path = \"{}\", default-features = false }}\n\n[workspace]\n\n\
             [package.metadata.promptgen]\nbackend = \"ollama\"\nmodel = \"m\"\n\n\
             [[package.metadata.promptgen.steps]]\nid = \"01\"\nprompt = \"prompts/01.md\"\noutputs = [\"user_json.rs\"]\n",
            promptgen.display()
        ),
    );
    write("build.rs", "fn main() -> Result<(), cargo_promptgen::Error> {\n    cargo_promptgen::build()\n}\n");
    write("src/domain.rs", DOMAIN);
    write("src/main.rs", MAIN);
    write("prompts/01.md", "Write user_json.rs.\n");
    write("Cargo.lock", &std::fs::read_to_string(promptgen.join("../Cargo.lock")).unwrap());
    Crate { _dir: dir, root }
}

fn median_min_max(mut values: Vec<f64>) -> (f64, f64, f64) {
    values.sort_by(f64::total_cmp);
    (values[values.len() / 2], values[0], values[values.len() - 1])
}

fn secs(d: Duration) -> f64 {
    d.as_secs_f64()
}

/// A user's `cargo check --all-targets` of the crate, its build entry given `tree` as the
/// generated files (what it would copy from the store).
fn plain_cargo_check(krate: &Crate, target: &Path, tree: &Path) -> Duration {
    let started = Instant::now();
    let out = Command::new(env!("CARGO"))
        .args(["check", "--all-targets", "--quiet"])
        .current_dir(&krate.root)
        .env("CARGO_TARGET_DIR", target)
        .env("PROMPTGEN_TREE", tree)
        .env("PROMPTGEN_TREE_PACKAGE", &krate.root)
        .output()
        .unwrap();
    let took = started.elapsed();
    assert!(out.status.success(), "plain cargo check failed:\n{}", String::from_utf8_lossy(&out.stderr));
    took
}

fn main() {
    // The crate resolves its dependencies from the workspace's lock and the registry cache.
    // SAFETY: set before any thread starts.
    unsafe { std::env::set_var("CARGO_NET_OFFLINE", "true") };
    let reps: usize = std::env::var("PROMPTGEN_BENCH_REPS").ok().and_then(|r| r.parse().ok()).unwrap_or(9);
    let krate = realistic_crate();
    let chain = config::load_from_env(&krate.root.join("Cargo.toml"), &Overrides::default()).unwrap();
    let step = chain.step("01").unwrap().clone();
    let layout = Layout::new(&chain, &krate.root.join("target"));
    let candidate = krate.root.join("candidate");
    std::fs::create_dir_all(&candidate).unwrap();
    let user_target = krate.root.join("user-target");

    let mut check = check_for(CheckSetup {
        chain: &chain,
        layout: &layout,
        step: &step,
        scratch: krate.root.join("scratch"),
        tree_dir: layout.check_tree_dir("01"),
        mounted: Default::default(),
        later: Later::default(),
        cancel: codegen_core::Cancel::new(),
    })
    .expect("`cargo check` is the default check of a step with .rs outputs");
    let mut run_check = |n: usize| {
        std::fs::write(candidate.join("user_json.rs"), generated(n)).unwrap();
        let started = Instant::now();
        let outcome = check.run(&candidate).expect("the check runs");
        let took = started.elapsed();
        assert!(matches!(outcome, CheckOutcome::Passed), "{outcome:?}");
        took
    };

    println!("crate-context check vs plain `cargo check --all-targets`, same crate, same files\n");
    let mut edit = 0;
    let (mut ratios, mut ours, mut plain) = (Vec::new(), Vec::new(), Vec::new());
    for rep in 0..3 {
        let _ = std::fs::remove_dir_all(layout.check_target_dir());
        let _ = std::fs::remove_dir_all(&user_target);
        edit += 1;
        let (a, b) = if rep % 2 == 0 {
            let a = run_check(edit);
            (a, plain_cargo_check(&krate, &user_target, &layout.check_tree_dir("01")))
        } else {
            let b = plain_cargo_check(&krate, &user_target, &layout.check_tree_dir("01"));
            (run_check(edit), b)
        };
        ratios.push(secs(a) / secs(b));
        ours.push(secs(a));
        plain.push(secs(b));
    }
    let (r, rmin, rmax) = median_min_max(ratios);
    println!(
        "first check (empty target folders): check {:.1} s, plain cold cargo check {:.1} s, ratio {r:.2}x [{rmin:.2} .. {rmax:.2}]",
        median_min_max(ours).0,
        median_min_max(plain).0
    );

    let (mut ratios, mut ours, mut plain) = (Vec::new(), Vec::new(), Vec::new());
    for rep in 0..reps {
        edit += 1;
        // The user's side: touch one file of the crate, as an edit would.
        let touch = || {
            let main = krate.root.join("src/main.rs");
            std::fs::write(&main, format!("{MAIN}// edit {edit}\n")).unwrap();
        };
        let (a, b) = if rep % 2 == 0 {
            let a = run_check(edit);
            touch();
            (a, plain_cargo_check(&krate, &user_target, &layout.check_tree_dir("01")))
        } else {
            touch();
            let b = plain_cargo_check(&krate, &user_target, &layout.check_tree_dir("01"));
            (run_check(edit), b)
        };
        ratios.push(secs(a) / secs(b));
        ours.push(secs(a));
        plain.push(secs(b));
    }
    let (r, rmin, rmax) = median_min_max(ratios);
    println!(
        "re-check after a repair ({reps} reps): check {:.2} s, plain cargo check after touching one file {:.2} s, ratio {r:.2}x [{rmin:.2} .. {rmax:.2}] (goal <= 1.3x: {})",
        median_min_max(ours).0,
        median_min_max(plain).0,
        if r <= 1.3 { "met" } else { "NOT MET" }
    );
}
