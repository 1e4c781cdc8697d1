//! The example regenerates from nothing: a copy of `example-app` and `prompts/` without its
//! lock and store, `cargo promptgen` with the settings the example declares (the scripted
//! backend replays `prompts/scripts/`; every step is checked in the crate, step 03 with
//! `cargo test`), exit 0; then step 04 again, by edit, after the change its prompt had
//! since it was first recorded; and since the scripted turns are the same, the lock, the
//! stored files and the transcripts come out byte for byte as committed: the committed
//! record is what this chain produces.

use std::path::PathBuf;

use crate::support;
use crate::support::{copy_tree, run, snapshot, text};

#[test]
fn example_app_regenerates_from_an_empty_lock_with_its_own_settings_and_reproduces_its_record() {
    let repo = PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/.."));
    let dir = tempfile::Builder::new().prefix("pg-example-").tempdir().unwrap();
    copy_tree(&repo.join("example-app"), &dir.path().join("example-app"));
    copy_tree(&repo.join("prompts"), &dir.path().join("prompts"));
    let _ = std::fs::remove_dir_all(dir.path().join("example-app/target"));
    // The workspace the example inherits its edition and licence from, and the way to
    // cargo-promptgen from the copy.
    let workspace = std::fs::read_to_string(repo.join("Cargo.toml")).unwrap();
    let package = workspace.split("[workspace.dependencies]").next().unwrap();
    std::fs::write(
        dir.path().join("Cargo.toml"),
        package.replace(
            "members = [\"codegen-core\", \"cargo-promptgen\", \"example-app\", \"tests\"]",
            "members = [\"example-app\"]",
        ),
    )
    .unwrap();
    let manifest = dir.path().join("example-app/Cargo.toml");
    let text_of = std::fs::read_to_string(&manifest).unwrap();
    assert!(text_of.contains("path = \"../cargo-promptgen\""), "{text_of}");
    std::fs::write(
        &manifest,
        text_of.replace(
            "path = \"../cargo-promptgen\"",
            &format!("path = \"{}\"", repo.join("cargo-promptgen").display()),
        ),
    )
    .unwrap();
    std::fs::copy(repo.join("Cargo.lock"), dir.path().join("Cargo.lock")).unwrap();

    let recorded = snapshot(&repo.join("example-app/promptgen"));
    let recorded_lock = std::fs::read_to_string(repo.join("example-app/promptgen.lock")).unwrap();
    std::fs::remove_file(dir.path().join("example-app/promptgen.lock")).unwrap();
    std::fs::remove_dir_all(dir.path().join("example-app/promptgen")).unwrap();

    let promptgen = |args: &[&str]| {
        let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_cargo-promptgen"));
        command.arg("promptgen").args(args).arg("--manifest-path").arg(&manifest).current_dir(dir.path());
        for var in ["CI", "PROMPTGEN_OFFLINE", "PROMPTGEN_BACKEND", "PROMPTGEN_MODEL", "PROMPTGEN_BASE_URL"] {
            command.env_remove(var);
        }
        command.env("CARGO_TARGET_DIR", support::shared_target()).env("CARGO_NET_OFFLINE", "true");
        run(&mut command)
    };
    // The record's history, replayed: every step from nothing with step 04's prompt as it was
    // first written, then step 04 again, by edit, after its prompt asked for one thing more
    // (see prompts/scripts/step_04_app.toml).
    let prompt_04 = dir.path().join("prompts/step_04_app.md");
    let now = std::fs::read_to_string(&prompt_04).unwrap();
    assert!(now.contains(support::PROMPT_04_CHANGED), "{now}");
    std::fs::write(&prompt_04, now.replace(support::PROMPT_04_CHANGED, support::PROMPT_04_FIRST)).unwrap();
    let out = promptgen(&[]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("4 of 4 steps regenerated"), "{err}");
    // Step 03's tests could not run before step 04 wrote app.rs: put off, then run in full.
    assert!(err.contains("part of the check `cargo test` was put off"), "{err}");
    assert!(!std::fs::read_to_string(dir.path().join("example-app/promptgen.lock")).unwrap().contains("made_from"));

    std::fs::write(&prompt_04, &now).unwrap();
    let out = promptgen(&[]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("1 of 4 steps regenerated"), "{err}");

    assert_eq!(std::fs::read_to_string(dir.path().join("example-app/promptgen.lock")).unwrap(), recorded_lock);
    assert_eq!(snapshot(&dir.path().join("example-app/promptgen")), recorded, "the store and the transcripts");
    let out = promptgen(&["check"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
}
