//! The whole life of a three-step chain, as a user lives it: `cargo promptgen` against a
//! server, `check`, an edited prompt, an offline build that refuses, an online build that
//! regenerates, `accept`, and `check` again. Real binaries, real `cargo build`, the fake LLM
//! server on loopback.

use promptgen_tests::FakeLlm;

use crate::support::{A, B1, B2, C, Package, chain, finish, run, text, write};

#[test]
fn a_three_step_chain_from_first_run_to_accepted_regeneration() {
    let server =
        FakeLlm::start(vec![write("a.rs", A), finish(), write("b.rs", B1), finish(), write("c.rs", C), finish()]);
    let package = Package::lettered(&chain("", &["a.rs", "b.rs", "c.rs"]), 3);
    let url = server.url();

    // 1. The first run records every step.
    let out = run(package.promptgen(&[]).env("PROMPTGEN_BASE_URL", &url));
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(server.requests().len(), 6);
    let lock = package.read("promptgen.lock");
    assert!(lock.starts_with("# @generated"), "{lock}");
    assert_eq!(lock.matches("[[step]]").count(), 3, "{lock}");
    assert_eq!(package.read("promptgen/02/b.rs"), B1);
    let transcript = package.read("promptgen/02.transcript.jsonl");
    assert!(transcript.contains("\"write_file\"") && !transcript.contains("duration_ms"), "{transcript}");

    // 2. Fresh: check passes, with no server at all.
    let out = run(&mut package.promptgen(&["check"]));
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));

    // 3. Editing the second prompt makes 02 and 03 stale, and not 01.
    package.write("prompts/02.md", "Write b.rs with fn b using a, and say b2.\n");
    let out = run(&mut package.promptgen(&["check"]));
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let report = String::from_utf8_lossy(&out.stdout);
    assert!(report.contains("step 02: prompt `prompts/02.md` changed"), "{report}");
    assert!(report.contains("step 03:") && report.contains("runs after step 02"), "{report}");
    assert!(!report.contains("step 01"), "{report}");

    // 4. An offline build refuses, names the stale steps and the one command that fixes it.
    let out = run(package.cargo(&["build", "--quiet"]).env("PROMPTGEN_OFFLINE", "1"));
    assert!(!out.status.success(), "{}", text(&out));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("step 02") && stderr.contains("step 03") && stderr.contains("PROMPTGEN_OFFLINE"),
        "{stderr}"
    );
    assert!(stderr.contains(&format!("cargo promptgen -p {}", package.name)), "{stderr}");
    assert_eq!(server.requests().len(), 6, "an offline build calls no model");

    // 5. An online build regenerates 02 and 03 into the pending area and says so.
    server.push(write("b.rs", B2));
    server.push(finish());
    server.push(write("c.rs", C));
    server.push(finish());
    let out = run(package.cargo(&["build"]).env("PROMPTGEN_BASE_URL", &url));
    assert!(out.status.success(), "{}", text(&out));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("cargo promptgen accept"), "{stderr}");
    assert_eq!(server.requests().len(), 10);
    assert_eq!(package.read("promptgen/02/b.rs"), B1, "the build never writes the package");
    let out = run(package.cargo(&["run", "--quiet"]).env("PROMPTGEN_BASE_URL", &url));
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "ab2c", "{}", text(&out));
    assert_eq!(server.requests().len(), 10, "pending results are reused, not regenerated");
    // CI builds only from the committed lock: the pending results of this machine do not count.
    let out = run(package.cargo(&["build", "--quiet"]).env("CI", "true"));
    assert!(!out.status.success(), "{}", text(&out));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("step 02") && stderr.contains("not results a build left pending"), "{stderr}");
    assert_eq!(server.requests().len(), 10, "a CI build calls no model");

    // 6. `diff` shows what changed; `accept` records it without calling a model.
    let out = run(&mut package.promptgen(&["diff"]));
    let diff = String::from_utf8_lossy(&out.stdout);
    assert!(diff.contains(&format!("-{}", B1.trim_end())) && diff.contains(&format!("+{}", B2.trim_end())), "{diff}");
    let out = run(&mut package.promptgen(&["accept"]));
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert_eq!(package.read("promptgen/02/b.rs"), B2);
    let out = run(&mut package.promptgen(&["check"]));
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert_eq!(server.requests().len(), 10);

    // 7. And the committed lock now builds offline.
    let out = run(package.cargo(&["run", "--quiet"]).env("PROMPTGEN_OFFLINE", "1"));
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "ab2c", "{}", text(&out));
}
