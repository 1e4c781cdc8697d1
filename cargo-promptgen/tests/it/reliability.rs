//! What survives when things go wrong: a server that keeps failing, a run killed in the
//! middle of a step, two runs at once, a build and the subcommand at once, a damaged lock.
//! Each test snapshots the package's files and compares them byte for byte.

use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use promptgen_tests::{FakeLlm, Reply};

use crate::support::{
    A1, A2, B, C, Package, chain, changes, finish, lock_of, run, snapshot, stderr, stdout, text, write,
};

fn one_run(a: &str) -> Vec<Reply> {
    vec![write("a.rs", a), finish(), write("b.rs", B), finish(), write("c.rs", C), finish()]
}

fn package() -> Package {
    Package::lettered(&chain("", &["a.rs", "b.rs", "c.rs"]), 3)
}

/// A package whose three steps are recorded against `server` (which must hold one run).
fn recorded_package(server: &FakeLlm) -> Package {
    let package = package();
    let out = run(package.promptgen(&[]).env("PROMPTGEN_BASE_URL", server.url()));
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    package
}

/// Names in `promptgen/` that are not dot-files: what a user sees and may commit.
fn visible_store_entries(package: &Package) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(package.path("promptgen"))
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| !n.starts_with('.'))
        .collect();
    names.sort();
    names
}

const STORE_ENTRIES: [&str; 6] =
    ["01", "01.transcript.jsonl", "02", "02.transcript.jsonl", "03", "03.transcript.jsonl"];

fn wait_for_requests(server: &FakeLlm, count: usize, child: &mut Child) {
    let deadline = Instant::now() + Duration::from_secs(120);
    while server.requests().len() < count {
        if let Some(status) = child.try_wait().unwrap() {
            panic!("the run ended ({status}) before request {count} arrived; it saw {}", server.requests().len());
        }
        assert!(Instant::now() < deadline, "request {count} never arrived");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_failing_step_records_nothing_of_itself_and_keeps_what_ran_before_it() {
    let server = FakeLlm::start(one_run(A1));
    let package = recorded_package(&server);
    let url = server.url();
    // Every step is stale now.
    package.write("prompts/01.md", "Write a.rs with fn a, saying a2.\n");
    let before = snapshot(package.dir.path());
    let lock_before = lock_of(&package);

    // The first step fails (three attempts: the first and two retries): nothing changes at all.
    for _ in 0..3 {
        server.push(Reply::error(500, "the model fell over"));
    }
    let out = run(package.promptgen(&[]).env("PROMPTGEN_BASE_URL", &url));
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let err = stderr(&out);
    assert!(err.contains("step `01` failed") && err.contains("unchanged"), "{err}");
    assert_eq!(server.requests().len(), 9, "{}", text(&out));
    assert_eq!(changes(&before, &snapshot(package.dir.path())), Vec::<String>::new(), "{}", text(&out));

    // The first step succeeds, the second fails: 01 is recorded, 02 and 03 are as they were.
    server.push(write("a.rs", A2));
    server.push(finish());
    for _ in 0..3 {
        server.push(Reply::error(500, "the model fell over"));
    }
    let out = run(package.promptgen(&[]).env("PROMPTGEN_BASE_URL", &url));
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let err = stderr(&out);
    assert!(err.contains("step 01: done") && err.contains("step `02` failed"), "{err}");
    assert!(!err.contains("step 03: running"), "{err}");
    assert_eq!(server.requests().len(), 14, "{}", text(&out));
    let after = snapshot(package.dir.path());
    assert_eq!(
        changes(&before, &after),
        ["changed promptgen.lock", "changed promptgen/01.transcript.jsonl", "changed promptgen/01/a.rs"],
    );
    assert_eq!(package.read("promptgen/01/a.rs"), A2);
    let lock_after = lock_of(&package);
    assert_ne!(lock_after.step("01"), lock_before.step("01"));
    assert_eq!(lock_after.step("02"), lock_before.step("02"));
    assert_eq!(lock_after.step("03"), lock_before.step("03"));
    assert_eq!(visible_store_entries(&package), STORE_ENTRIES);

    let out = run(&mut package.promptgen(&["check"]));
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let report = stdout(&out);
    assert!(report.contains("2 of 3 steps"), "{report}");
    assert!(report.contains("step 02: the previous step's output changed"), "{report}");
    assert!(!report.contains("step 01"), "{report}");
}

#[test]
fn a_run_killed_in_the_middle_of_a_step_leaves_that_step_as_it_was() {
    let server = FakeLlm::start(one_run(A1));
    let package = recorded_package(&server);
    package.write("prompts/01.md", "Write a.rs with fn a, saying a2.\n");
    let lock_before = lock_of(&package);
    let before = snapshot(package.dir.path());

    server.push(write("a.rs", A2));
    server.push(finish());
    server.push(Reply::stall(Duration::from_secs(60)));
    let mut child = package
        .promptgen(&[])
        .env("PROMPTGEN_BASE_URL", server.url())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    // Requests 7 and 8 are step 01's; 9 is step 02's first, which never gets an answer.
    wait_for_requests(&server, 9, &mut child);
    child.kill().unwrap();
    child.wait().unwrap();

    let after = snapshot(package.dir.path());
    let changed = changes(&before, &after);
    for line in &changed {
        let path = line.split_once(' ').unwrap().1;
        let allowed = ["promptgen.lock", "promptgen/01.transcript.jsonl", "promptgen/01/a.rs"];
        let leftover = path.strip_prefix("promptgen/").is_some_and(|p| p.starts_with('.'));
        assert!(allowed.contains(&path) || leftover, "the killed run touched {path}: {changed:?}");
    }
    let lock_after = lock_of(&package);
    assert_eq!(lock_after.step("02"), lock_before.step("02"));
    assert_eq!(lock_after.step("03"), lock_before.step("03"));
    assert_eq!(visible_store_entries(&package), STORE_ENTRIES);

    let out = run(&mut package.promptgen(&["check"]));
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let report = stdout(&out);
    assert!(report.contains("step 02: the previous step's output changed"), "{report}");
    assert!(!report.contains("damaged") && !report.contains("stored file"), "{report}");
    assert!(stderr(&out).is_empty(), "{}", text(&out));

    // The next run picks up where the killed one stopped.
    server.push(write("b.rs", B));
    server.push(finish());
    server.push(write("c.rs", C));
    server.push(finish());
    let out = run(package.promptgen(&[]).env("PROMPTGEN_BASE_URL", server.url()));
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(stderr(&out).contains("2 of 3 steps regenerated"), "{}", text(&out));
    assert_eq!(server.requests().len(), 13);
    let out = run(&mut package.promptgen(&["check"]));
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert_eq!(visible_store_entries(&package), STORE_ENTRIES);
}

#[test]
fn two_runs_at_once_take_turns_and_call_the_model_once() {
    // The first request stalls and is retried, so the second process surely starts while the
    // first holds the package.
    let mut script = vec![Reply::stall(Duration::from_secs(2))];
    script.extend(one_run(A1));
    let server = FakeLlm::start(script);
    let package = package();
    let spawn = || {
        package
            .promptgen(&[])
            .env("PROMPTGEN_BASE_URL", server.url())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    };
    let mut first = spawn();
    wait_for_requests(&server, 1, &mut first);
    let second = spawn();
    let first = first.wait_with_output().unwrap();
    let second = second.wait_with_output().unwrap();
    assert_eq!(first.status.code(), Some(0), "{}", text(&first));
    assert_eq!(second.status.code(), Some(0), "{}", text(&second));
    assert_eq!(server.requests().len(), 7, "{}\n{}", text(&first), text(&second));
    assert!(
        stderr(&second).contains("waiting for another process working on"),
        "the second waited:\n{}",
        text(&second)
    );
    assert!(!stderr(&first).contains("waiting for another process"), "{}", text(&first));
    let mut summaries: Vec<bool> =
        [&first, &second].iter().map(|o| stderr(o).contains("3 of 3 steps regenerated")).collect();
    summaries.sort();
    assert_eq!(summaries, [false, true], "one run did the work:\n{}\n{}", text(&first), text(&second));
    assert_eq!(lock_of(&package).steps.len(), 3);
    assert_eq!(visible_store_entries(&package), STORE_ENTRIES);
    let out = run(&mut package.promptgen(&["check"]));
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
}

/// A build and `cargo promptgen` at once: whichever starts first holds the package while it
/// calls the model, the other waits, and the lock ends up recording every step.
fn build_and_subcommand_at_once(build_first: bool) {
    // The first request stalls for a moment and is retried, so the second process surely
    // arrives while the first is in the middle of a step.
    let mut script = vec![Reply::stall(Duration::from_secs(2))];
    script.extend(one_run(A1));
    let server = FakeLlm::start(script);
    let package = package();
    let url = server.url();
    let mut build = package.cargo(&["build", "--quiet"]);
    build.env("PROMPTGEN_BASE_URL", &url).stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut subcommand = package.promptgen(&[]);
    subcommand.env("PROMPTGEN_BASE_URL", &url).stdout(Stdio::piped()).stderr(Stdio::piped());
    let (mut first, mut second) = if build_first { (build, subcommand) } else { (subcommand, build) };
    let mut first = first.spawn().unwrap();
    wait_for_requests(&server, 1, &mut first);
    let second = second.spawn().unwrap();
    let first = first.wait_with_output().unwrap();
    let second = second.wait_with_output().unwrap();
    assert_eq!(first.status.code(), Some(0), "{}", text(&first));
    assert_eq!(second.status.code(), Some(0), "{}", text(&second));
    assert_eq!(server.requests().len(), 7, "{}\n{}", text(&first), text(&second));
    let out = run(&mut package.promptgen(&["check"]));
    assert_eq!(out.status.code(), Some(0), "{}\n{}\n{}", text(&first), text(&second), text(&out));
    assert_eq!(lock_of(&package).steps.len(), 3);
    let out = run(package.cargo(&["run", "--quiet"]).env("PROMPTGEN_OFFLINE", "1"));
    assert_eq!(stdout(&out).trim(), "a1bc", "{}", text(&out));
}

#[test]
fn a_subcommand_then_a_build_at_once() {
    build_and_subcommand_at_once(false);
}

#[test]
fn a_build_then_a_subcommand_at_once() {
    build_and_subcommand_at_once(true);
}

#[test]
fn running_the_subcommand_after_an_online_build_records_the_steps() {
    let server = FakeLlm::start(one_run(A1));
    let package = package();
    let url = server.url();
    let out = run(package.cargo(&["build", "--quiet"]).env("PROMPTGEN_BASE_URL", &url));
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(server.requests().len(), 6, "{}", text(&out));

    // The user runs `cargo promptgen` rather than `accept`: it must leave a lock that passes.
    let out = run(package.promptgen(&[]).env("PROMPTGEN_BASE_URL", &url));
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let check = run(&mut package.promptgen(&["check"]));
    assert_eq!(
        check.status.code(),
        Some(0),
        "`cargo promptgen` said:\n{}\n`check` says:\n{}",
        text(&out),
        text(&check)
    );
    assert_eq!(package.read("promptgen/01/a.rs"), A1);
}

#[test]
fn a_damaged_lock_is_reported_and_never_overwritten() {
    let server = FakeLlm::start(one_run(A1));
    let package = recorded_package(&server);
    let garbage = "this is not [[ a lock\n\u{0}\u{1}";
    package.write("promptgen.lock", garbage);
    for args in [&["check"][..], &["status"][..], &[][..], &["--force"][..], &["accept"][..]] {
        let out = run(package.promptgen(args).env("PROMPTGEN_BASE_URL", server.url()));
        assert_eq!(out.status.code(), Some(1), "{args:?}: {}", text(&out));
        let err = stderr(&out);
        assert!(err.contains("promptgen.lock") && err.contains("damaged"), "{args:?}: {err}");
        assert!(err.contains("git checkout -- promptgen.lock"), "{args:?}: {err}");
        assert_eq!(package.read("promptgen.lock"), garbage, "{args:?}");
    }
    assert_eq!(server.requests().len(), 6, "nothing runs on a damaged lock");

    // A lock from a future cargo-promptgen is damaged for this one, with its version named.
    package.write("promptgen.lock", "version = 9\n");
    let out = run(&mut package.promptgen(&["check"]));
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(stderr(&out).contains("version 9") && stderr(&out).contains("damaged"), "{}", text(&out));
}
