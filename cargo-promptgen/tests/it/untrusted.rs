//! Input from outside, checked or survived: a lock that names files it may not (it arrives in
//! pull requests), a model that writes what its step does not declare, a server that ignores
//! the output cap, a transcript swapped in the cache, and command lines that ask for what is
//! not there.

use std::process::Stdio;

use promptgen_tests::{FakeLlm, Reply, Turn};
use serde_json::json;

use crate::support::{A1, B, Package, chain, finish, run, snapshot, stderr, stdout, text, write};

/// Two steps (`a.rs`, then `b.rs` after it), no check: these tests are about the record.
fn two_steps() -> Package {
    Package::lettered(&chain("check = \"none\"\n", &["a.rs", "b.rs"]), 2)
}

fn recorded(server: &FakeLlm) -> Package {
    let package = two_steps();
    let out = run(package.promptgen(&[]).env("PROMPTGEN_BASE_URL", server.url()));
    assert!(out.status.success(), "{}", text(&out));
    package
}

fn one_run() -> Vec<Reply> {
    vec![write("a.rs", A1), finish(), write("b.rs", B), finish()]
}

/// The lock's text with the first line equal to `from` replaced by `to`.
fn edit_lock(package: &Package, from: &str, to: &str) -> String {
    let lock = package.read("promptgen.lock");
    assert!(lock.contains(from), "`{from}` is not in:\n{lock}");
    let edited = lock.replacen(from, to, 1);
    package.write("promptgen.lock", &edited);
    edited
}

#[test]
fn a_lock_that_names_a_file_outside_its_step_is_refused_by_every_reader_naming_its_line() {
    let server = FakeLlm::start(one_run());
    let package = recorded(&server);
    let manifest = package.read("Cargo.toml");
    let hash = cargo_promptgen::__private::sha256_hex(manifest.as_bytes());
    // The attack: step 01 records `../../Cargo.toml` with that file's real hash, so that a
    // reader that follows the path finds what the lock promises.
    let lock = package.read("promptgen.lock");
    let a_hash = cargo_promptgen::__private::sha256_hex(A1.as_bytes());
    let edited = edit_lock(
        &package,
        &format!("[[step.file]]\npath = \"a.rs\"\nsha256 = \"{a_hash}\""),
        &format!("[[step.file]]\npath = \"../../Cargo.toml\"\nsha256 = \"{hash}\""),
    );
    let line = edited.lines().position(|l| l.contains("../../Cargo.toml")).unwrap() + 1;
    let before = snapshot(package.dir.path());
    for args in [&["check"][..], &["status"][..], &[][..], &["accept"][..], &["diff"][..], &["log"][..]] {
        let out = run(package.promptgen(args).env("PROMPTGEN_BASE_URL", server.url()));
        assert_eq!(out.status.code(), Some(1), "{args:?}: {}", text(&out));
        let err = stderr(&out);
        for phrase in [
            "promptgen.lock",
            "damaged",
            &format!("line {line}:"),
            "step `01` records the file \"../../Cargo.toml\"",
            "`..`",
            "nothing was read or written for it",
        ] {
            assert!(err.contains(phrase), "{args:?}: `{phrase}` not in:\n{err}");
        }
        assert!(!stdout(&out).contains("fresh"), "{args:?}: {}", text(&out));
    }
    assert_eq!(snapshot(package.dir.path()), before, "nothing was written");
    assert_eq!(server.requests().len(), 4, "no model was called");

    // The build entry refuses it too, and copies nothing anywhere.
    let out = run(package.cargo(&["build", "--quiet"]).env("PROMPTGEN_OFFLINE", "1"));
    assert!(!out.status.success(), "{}", text(&out));
    assert!(stderr(&out).contains("step `01` records the file \"../../Cargo.toml\""), "{}", text(&out));

    // A file the step does not declare, and an id that would name a folder outside the store.
    package.write("promptgen.lock", &lock);
    edit_lock(&package, "path = \"a.rs\"", "path = \"extra.rs\"");
    let out = run(&mut package.promptgen(&["check"]));
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let err = stderr(&out);
    assert!(err.contains("records the file \"extra.rs\", which is not one of its declared outputs (`a.rs`)"), "{err}");
    package.write("promptgen.lock", &lock);
    edit_lock(&package, "id = \"01\"", "id = \"../01\"");
    let out = run(&mut package.promptgen(&["check"]));
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let err = stderr(&out);
    assert!(err.contains("\"../01\", which is not a step id") && err.contains("line "), "{err}");
    package.write("promptgen.lock", &lock);
    let out = run(&mut package.promptgen(&["check"]));
    assert!(out.status.success(), "the lock as it was reads again: {}", text(&out));
}

#[test]
fn a_model_writes_only_the_outputs_its_step_declares_whatever_the_spelling() {
    let tricks = ["extra.rs", "sub/dir/evil.txt", "\u{2024}\u{2024}/x.rs", "\u{2025}/x.rs", "\u{ff0e}\u{ff0e}/x.rs"];
    let mut script: Vec<Reply> = tricks.iter().map(|path| write(path, "fn x() {}\n")).collect();
    script.extend([write("./a.rs", A1), finish(), write("b.rs", B), finish()]);
    let server = FakeLlm::start(script);
    let package = recorded(&server);
    let requests = server.requests();
    for (n, trick) in tricks.iter().enumerate() {
        let answer = crate::support::last_message(&requests[n + 1]);
        assert!(
            answer.contains(&format!("`{trick}` is not one of the files this step writes"))
                && answer.contains("`a.rs`"),
            "{trick}: {answer}"
        );
    }
    let lock = crate::support::lock_of(&package);
    let recorded: Vec<&str> = lock.steps[0].files.iter().map(|f| f.path.as_str()).collect();
    assert_eq!(recorded, ["a.rs"], "only the declared output is recorded");
    let stored: Vec<String> = snapshot(&package.path("promptgen/01")).into_keys().collect();
    assert_eq!(stored, ["a.rs"]);
}

#[test]
fn a_server_that_ignores_the_output_cap_is_cut_off_and_nothing_is_recorded() {
    // 20 MB of text against a cap of 64 tokens (a reply may have 1 MiB): streamed, then
    // whole (a server that answers a streamed request with one JSON body).
    let flood = "x".repeat(20 << 20);
    let metadata = chain("check = \"none\"\nmax_output_tokens = 64\n", &["a.rs"]);
    let server = FakeLlm::start(vec![
        // What the same run takes when the server behaves: the measure of what is normal.
        write("a.rs", A1),
        finish(),
        Reply::turn(Turn::text(&flood)).in_pieces(64 << 10),
        Reply::json(json!({"model": "fake-coder", "message": {"role": "assistant", "content": flood}, "done": true})),
    ]);
    let run_measured = |package: &Package| {
        let mut child = package
            .promptgen(&[])
            .env("PROMPTGEN_BASE_URL", server.url())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        wait_with_peak_memory(&mut child)
    };
    let ((code, _), normal_kib) = run_measured(&Package::lettered(&metadata, 1));
    assert_eq!(code, Some(0));
    let package = Package::lettered(&metadata, 1);
    let before = snapshot(package.dir.path());
    for delivery in ["streamed", "whole"] {
        let ((code, err), peak_kib) = run_measured(&package);
        let err = String::from_utf8_lossy(&err);
        assert_eq!(code, Some(1), "{delivery}: {err}");
        assert!(err.contains("sent more than 1048576 bytes for one reply and was cut off"), "{delivery}: {err}");
        assert!(err.contains("max_output_tokens = 64") && err.contains("ignores the output cap"), "{err}");
        // The reply is never held whole: the run takes at most 8 MiB more than a normal one,
        // far from the 20 MB it was sent.
        eprintln!("20 MB {delivery}: peak {peak_kib} KiB; a normal run: {normal_kib} KiB");
        assert!(peak_kib < normal_kib + 8 * 1024, "{delivery}: peak {peak_kib} KiB, normally {normal_kib} KiB");
        assert_eq!(snapshot(package.dir.path()), before, "{delivery}: nothing was recorded");
    }
}

/// Waits for `child`: its exit code, its stderr, and its peak resident memory in KiB, as the
/// kernel's high-water mark of the process's own memory (`VmHWM`), read while it runs. (The
/// rusage of a waited child would count this test process too: a child's peak starts from
/// its parent's memory at fork.)
fn wait_with_peak_memory(child: &mut std::process::Child) -> ((Option<i32>, Vec<u8>), u64) {
    let mut stderr = child.stderr.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut text = Vec::new();
        std::io::Read::read_to_end(&mut stderr, &mut text).unwrap();
        text
    });
    let status_file = format!("/proc/{}/status", child.id());
    let mut peak = 0;
    let status = loop {
        if let Ok(text) = std::fs::read_to_string(&status_file)
            && let Some(kib) =
                text.lines().find_map(|l| l.strip_prefix("VmHWM:")?.trim().strip_suffix("kB")?.trim().parse().ok())
        {
            peak = kib;
        }
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
    };
    ((status.code(), reader.join().unwrap()), peak)
}

#[test]
fn usage_errors_exit_2_before_any_model_call() {
    let server = FakeLlm::start(one_run());
    let package = recorded(&server);
    let lock = package.read("promptgen.lock");
    for (args, says) in [
        (&["--step", "99"][..], "there is no step `99`"),
        (&["-p", "nosuchpkg"][..], "no package `nosuchpkg` in this workspace"),
        (&["--jobs", "0"][..], "--jobs"),
        (&["log", "99"][..], "there is no step `99`"),
        (&["diff", "--step", "99"][..], "there is no step `99`"),
        (&["eval", "--step", "99"][..], "there is no step `99`"),
    ] {
        let out = run(package.promptgen(args).env("PROMPTGEN_BASE_URL", server.url()));
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", text(&out));
        assert!(stderr(&out).contains(says), "{args:?}: {}", text(&out));
    }
    assert_eq!(server.requests().len(), 4);
    assert_eq!(package.read("promptgen.lock"), lock);
}

#[test]
fn a_transcript_swapped_in_the_cache_is_never_shown_as_the_conversation_that_made_the_files() {
    let server = FakeLlm::start(one_run());
    let cache = tempfile::tempdir().unwrap();
    let package = Package::lettered(&chain("check = \"none\"\nstore = \"cache\"\n", &["a.rs", "b.rs"]), 2);
    let promptgen = |args: &[&str]| {
        let mut command = package.promptgen(args);
        command.env("PROMPTGEN_BASE_URL", server.url()).env("PROMPTGEN_CACHE_DIR", cache.path());
        run(&mut command)
    };
    assert!(promptgen(&[]).status.success());
    let lock = crate::support::lock_of(&package);
    let key = &lock.steps[0].key;
    let path = cache.path().join("transcripts").join(format!("{key}.jsonl"));
    let forged = "{\"event\":\"repair\",\"model_call\":1,\"problem\":\"a conversation nobody had\"}\n";
    std::fs::write(&path, forged).unwrap();
    let out = promptgen(&["log", "01"]);
    let shown = text(&out);
    assert!(!shown.contains("a conversation nobody had"), "{shown}");
    assert!(shown.contains("does not hash to the transcript promptgen.lock records"), "{shown}");
}
