//! The sandbox, through its public API: what a model-supplied path may reach, and how each
//! refusal explains itself.

use std::fs;
use std::path::{Path, PathBuf};

use codegen_core::sandbox::{Limits, Refusal, Sandbox, SandboxError, input_files};

/// A project with inputs in `pkg/` and an empty output root `out/`.
struct Fixture {
    _dir: tempfile::TempDir,
    pkg: PathBuf,
    out: PathBuf,
}

fn fixture() -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let pkg = dir.path().join("pkg");
    let out = dir.path().join("out");
    write(&pkg.join("src/domain.rs"), "pub struct Order;\n");
    write(&pkg.join("src/model/user.rs"), "pub struct User;\n");
    write(&pkg.join("README.md"), "# pkg\n");
    Fixture { _dir: dir, pkg, out }
}

fn write(path: &Path, content: &str) {
    fs::create_dir_all(path.parent().unwrap()).unwrap();
    fs::write(path, content).unwrap();
}

fn refused<T: std::fmt::Debug>(result: Result<T, Refusal>) -> Refusal {
    result.expect_err("expected a refusal")
}

fn assert_mentions(refusal: &Refusal, facts: &[&str]) {
    for fact in facts {
        assert!(refusal.reason.contains(fact), "reason should mention {fact:?}: {refusal}");
    }
}

/// The names in `dir`, sorted.
fn names(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> =
        fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
    names.sort();
    names
}

#[test]
fn build_creates_the_output_root_and_canonicalises_it() {
    let f = fixture();
    let sandbox = Sandbox::builder(f.out.join("deep/er")).build().unwrap();
    assert!(f.out.join("deep/er").is_dir());
    assert_eq!(sandbox.output_root(), fs::canonicalize(f.out.join("deep/er")).unwrap());
    assert!(sandbox.written().is_empty());
    assert_eq!(
        Limits::default(),
        Limits { max_read_bytes: 256 * 1024, max_write_bytes: 512 * 1024, max_files_per_step: 64 }
    );
}

#[test]
fn build_rejects_bad_missing_duplicate_and_protected_inputs() {
    let f = fixture();
    let err = Sandbox::builder(&f.out).input("src/x.rs", f.pkg.join("nope.rs")).build().unwrap_err();
    assert!(matches!(err, SandboxError::MissingInput { .. }), "{err:?}");
    assert!(err.to_string().contains("does not exist"), "{err}");

    for bad in ["../src", "/abs", "C:\\x", "", "a\\b", "."] {
        let err = Sandbox::builder(&f.out).input(bad, f.pkg.join("src")).build().unwrap_err();
        assert!(matches!(err, SandboxError::BadInputPath { .. }), "{bad:?}: {err:?}");
    }
    let err = Sandbox::builder(&f.out).input(".env", f.pkg.join("README.md")).build().unwrap_err();
    assert!(err.to_string().contains("protected"), "{err}");

    let err = Sandbox::builder(&f.out)
        .input("src", f.pkg.join("src"))
        .input("./src/", f.pkg.join("src"))
        .build()
        .unwrap_err();
    assert!(matches!(err, SandboxError::DuplicateInput { ref virtual_path } if virtual_path == "src"), "{err:?}");

    let err = Sandbox::builder(&f.out)
        .input("a.rs", f.pkg.join("README.md"))
        .input("a.rs/b.rs", f.pkg.join("README.md"))
        .build()
        .unwrap_err();
    assert!(err.to_string().contains("is a file"), "{err}");

    write(&f.pkg.join("file"), "x");
    let err = Sandbox::builder(f.pkg.join("file")).build().unwrap_err();
    assert!(matches!(err, SandboxError::Fs(_)), "{err:?}");
}

#[test]
fn refusal_displays_path_then_reason() {
    let refusal = Refusal { path: "a.rs".into(), reason: "no such file".into() };
    assert_eq!(refusal.to_string(), "`a.rs`: no such file");
}

#[test]
fn reads_an_input_mounted_as_a_file() {
    let f = fixture();
    let sandbox = Sandbox::builder(&f.out).input("src/domain.rs", f.pkg.join("src/domain.rs")).build().unwrap();
    assert_eq!(sandbox.read_file("src/domain.rs").unwrap(), "pub struct Order;\n");
    assert_eq!(sandbox.read_file("./src//domain.rs").unwrap(), "pub struct Order;\n");
    // Only the mounted file, not its siblings.
    let r = refused(sandbox.read_file("src/model/user.rs"));
    assert_mentions(&r, &["no such file", "list_files"]);
    let r = refused(sandbox.read_file("src/domain.rs/x"));
    assert_mentions(&r, &["no such file", "not a folder"]);
    assert_eq!(sandbox.list_files(None).unwrap(), ["src/domain.rs"]);
    assert_eq!(sandbox.list_files(Some("src")).unwrap(), ["src/domain.rs"]);
}

#[test]
fn reads_an_input_mounted_as_a_folder() {
    let f = fixture();
    let sandbox = Sandbox::builder(&f.out).input("src", f.pkg.join("src")).build().unwrap();
    assert_eq!(sandbox.read_file("src/model/user.rs").unwrap(), "pub struct User;\n");
    assert_eq!(sandbox.list_files(None).unwrap(), ["src/domain.rs", "src/model/user.rs"]);
    assert_eq!(sandbox.list_files(Some("src/model")).unwrap(), ["src/model/user.rs"]);
    let r = refused(sandbox.read_file("README.md"));
    assert_mentions(&r, &["no such file"]);
}

#[test]
fn inputs_win_over_the_output_root_and_the_most_specific_mount_wins() {
    let f = fixture();
    write(&f.out.join("src/domain.rs"), "stale copy");
    write(&f.out.join("gen.rs"), "generated");
    write(&f.pkg.join("other.rs"), "other");
    let sandbox = Sandbox::builder(&f.out)
        .input("src", f.pkg.join("src"))
        .input("src/domain.rs", f.pkg.join("other.rs"))
        .build()
        .unwrap();
    assert_eq!(sandbox.read_file("src/domain.rs").unwrap(), "other");
    assert_eq!(sandbox.read_file("gen.rs").unwrap(), "generated");
    assert_eq!(sandbox.list_files(None).unwrap(), ["gen.rs", "src/domain.rs", "src/model/user.rs"]);
}

#[test]
fn writes_to_inputs_are_refused_and_suggest_another_path() {
    let f = fixture();
    let mut sandbox = Sandbox::builder(&f.out)
        .input("src/domain.rs", f.pkg.join("src/domain.rs"))
        .input("model", f.pkg.join("src/model"))
        .build()
        .unwrap();
    let r = refused(sandbox.write_file("src/domain.rs", "hacked"));
    assert_eq!(r.path, "src/domain.rs");
    assert_mentions(&r, &["read-only input", "elsewhere, e.g. `domain.rs`"]);
    let r = refused(sandbox.write_file("model/user.rs", "hacked"));
    assert_mentions(&r, &["`model`, a read-only input", "e.g. `user.rs`"]);
    let r = refused(sandbox.write_file("model", "hacked"));
    assert_mentions(&r, &["read-only input", "e.g. `generated/model`"]);
    let r = refused(sandbox.write_file("src", "hacked"));
    assert_mentions(&r, &["folder holding read-only inputs"]);
    assert_eq!(fs::read_to_string(f.pkg.join("src/domain.rs")).unwrap(), "pub struct Order;\n");
    assert_eq!(fs::read_to_string(f.pkg.join("src/model/user.rs")).unwrap(), "pub struct User;\n");
    assert!(names(&f.out).is_empty());
    // Beside a file mount is the output root, and writable.
    sandbox.write_file("src/view.rs", "view").unwrap();
    assert_eq!(sandbox.read_file("src/view.rs").unwrap(), "view");
}

#[test]
fn an_input_inside_the_output_root_stays_read_only_under_its_real_path() {
    let f = fixture();
    let out = f.pkg.clone();
    let mut sandbox = Sandbox::builder(&out).input("domain.rs", f.pkg.join("src/domain.rs")).build().unwrap();
    let r = refused(sandbox.write_file("src/domain.rs", "hacked"));
    assert_mentions(&r, &["same file as the read-only input `domain.rs`"]);
    assert_eq!(fs::read_to_string(f.pkg.join("src/domain.rs")).unwrap(), "pub struct Order;\n");
    // An output root inside an input folder is fine.
    let mut sandbox = Sandbox::builder(f.pkg.join("src/generated")).input("src", f.pkg.join("src")).build().unwrap();
    sandbox.write_file("view.rs", "v").unwrap();
    assert_eq!(fs::read_to_string(f.pkg.join("src/generated/view.rs")).unwrap(), "v");
}

#[test]
fn writes_normalise_create_folders_report_changes_and_leave_no_temporary_files() {
    let f = fixture();
    let mut sandbox = Sandbox::builder(&f.out).build().unwrap();
    let outcome = sandbox.write_file("./gen//deep/a.rs/", "fn a() {}").unwrap();
    assert_eq!((outcome.path.as_str(), outcome.bytes, outcome.changed), ("gen/deep/a.rs", 9, true));
    assert_eq!(fs::read_to_string(f.out.join("gen/deep/a.rs")).unwrap(), "fn a() {}");
    let again = sandbox.write_file("gen/deep/a.rs", "fn a() {}").unwrap();
    assert!(!again.changed);
    assert!(sandbox.write_file("gen/deep/a.rs", "fn b() {}").unwrap().changed);
    sandbox.write_file("b.rs", "b").unwrap();
    assert_eq!(sandbox.written(), ["gen/deep/a.rs", "b.rs"]);
    assert_eq!(names(&f.out), ["b.rs", "gen"]);
    assert_eq!(names(&f.out.join("gen/deep")), ["a.rs"]);
    assert!(sandbox.output_exists("gen/deep/a.rs"));
    assert!(sandbox.output_exists("./gen/deep/a.rs"));
    assert!(!sandbox.output_exists("gen/deep"));
    assert!(!sandbox.output_exists("missing.rs"));
    assert!(!sandbox.output_exists("../out/b.rs"));
}

#[test]
fn writes_to_folders_and_through_files_are_refused() {
    let f = fixture();
    let mut sandbox = Sandbox::builder(&f.out).build().unwrap();
    sandbox.write_file("gen/a.rs", "a").unwrap();
    let r = refused(sandbox.write_file("gen", "x"));
    assert_mentions(&r, &["is a folder", "`gen/new_file.rs`"]);
    let r = refused(sandbox.write_file("gen/a.rs/b.rs", "x"));
    assert_mentions(&r, &["`gen/a.rs` is a file, not a folder"]);
    let r = refused(sandbox.write_file(".", "x"));
    assert_mentions(&r, &["root folder"]);
}

#[test]
fn writes_may_not_nest_folders_without_end() {
    let f = fixture();
    let mut sandbox = Sandbox::builder(&f.out).build().unwrap();
    let deep = format!("{}x.rs", "a/".repeat(40));
    assert_mentions(&refused(sandbox.write_file(&deep, "x")), &["40 folders deep", "at most 32 folders deep"]);
    let long = format!("{}.rs", "n".repeat(2000));
    assert_mentions(&refused(sandbox.write_file(&long, "x")), &["2003 bytes long", "1024 bytes"]);
    assert!(names(&f.out).is_empty());
    sandbox.write_file(&format!("{}x.rs", "a/".repeat(32)), "x").unwrap();
}

#[test]
fn malformed_paths_are_refused_by_every_operation() {
    let f = fixture();
    let mut sandbox = Sandbox::builder(&f.out).build().unwrap();
    let cases: [(&str, &str); 13] = [
        ("", "empty"),
        (" \t", "empty"),
        ("a\0.rs", "NUL"),
        ("/etc/passwd", "absolute"),
        ("\\etc\\passwd", "absolute"),
        ("C:\\x.rs", "Windows drive"),
        ("C:x.rs", "Windows drive"),
        ("\\\\server\\share\\x.rs", "Windows network"),
        ("\\\\?\\C:\\x.rs", "Windows network"),
        ("src\\x.rs", "forward slashes"),
        ("../x.rs", "`..`"),
        ("gen/../../x.rs", "`..`"),
        ("x.rs\n", "control character"),
    ];
    for (path, fact) in cases {
        assert_mentions(&refused(sandbox.read_file(path)), &[fact]);
        assert_mentions(&refused(sandbox.write_file(path, "x")), &[fact]);
        if !path.trim().is_empty() {
            assert_mentions(&refused(sandbox.list_files(Some(path))), &[fact]);
        }
    }
    assert!(names(f.out.parent().unwrap()).iter().all(|n| n == "out" || n == "pkg"));
    assert!(names(&f.out).is_empty());
    // A refused path is shown escaped.
    assert_eq!(refused(sandbox.read_file("x.rs\n")).path, "x.rs\\n");
}

#[test]
fn protected_paths_cannot_be_read_listed_or_written() {
    let f = fixture();
    let protected = [
        ".env",
        ".env.production",
        "conf/.ENV",
        ".git/config",
        "target/debug/build.rs",
        "keys/server.pem",
        "ssh/id_rsa",
        ".cargo/credentials",
        ".cargo/credentials.toml",
    ];
    for path in protected {
        write(&f.out.join(path), "SECRET");
        write(&f.pkg.join("src").join(path), "SECRET");
    }
    write(&f.out.join(".cargo/config.toml"), "ok");
    let mut sandbox = Sandbox::builder(&f.out).input("src", f.pkg.join("src")).build().unwrap();
    for path in protected {
        for virtual_path in [path.to_owned(), format!("src/{path}")] {
            let r = refused(sandbox.read_file(&virtual_path));
            assert_mentions(&r, &["protected", "cannot be read"]);
            let r = refused(sandbox.write_file(&virtual_path, "overwritten"));
            assert_mentions(&r, &["protected", "cannot be written"]);
        }
    }
    assert_mentions(&refused(sandbox.read_file(".GIT/config")), &["version control"]);
    assert_mentions(&refused(sandbox.read_file("keys/SERVER.PEM")), &["`.pem`"]);
    assert_mentions(&refused(sandbox.list_files(Some(".git"))), &["protected", "cannot be listed"]);
    assert_mentions(&refused(sandbox.list_files(Some("src/target"))), &["build output"]);
    let listed = sandbox.list_files(None).unwrap();
    assert_eq!(listed, [".cargo/config.toml", "src/domain.rs", "src/model/user.rs"]);
    for path in protected {
        assert_eq!(fs::read_to_string(f.out.join(path)).unwrap(), "SECRET");
    }
}

#[test]
fn non_utf8_files_folders_and_missing_files_are_refused_helpfully() {
    let f = fixture();
    fs::write(f.pkg.join("src/logo.png"), [0x89, b'P', b'N', b'G', 0xff, 0xfe]).unwrap();
    let sandbox = Sandbox::builder(&f.out).input("src", f.pkg.join("src")).build().unwrap();
    assert_mentions(&refused(sandbox.read_file("src/logo.png")), &["not a UTF-8 text file"]);
    let r = refused(sandbox.read_file("src/model"));
    assert_mentions(&r, &["is a folder", "list_files"]);
    assert_mentions(&refused(sandbox.read_file("src")), &["is a folder"]);
    assert_mentions(&refused(sandbox.read_file(".")), &["list_files"]);
    let r = refused(sandbox.read_file("src/user.rs"));
    assert_mentions(&r, &["no such file", "did you mean `src/model/user.rs`"]);
    let r = refused(sandbox.read_file("src/USER.RS"));
    assert_mentions(&r, &["did you mean `src/model/user.rs`"]);
    let r = refused(sandbox.read_file("nothing/like/this.rs"));
    assert_mentions(&r, &["no such file", "list_files"]);
}

#[test]
fn list_files_is_sorted_filters_by_folder_and_names_top_folders_when_missing() {
    let f = fixture();
    let mut sandbox = Sandbox::builder(&f.out).input("src", f.pkg.join("src")).build().unwrap();
    assert_eq!(sandbox.list_files(None).unwrap(), ["src/domain.rs", "src/model/user.rs"]);
    sandbox.write_file("z.rs", "z").unwrap();
    sandbox.write_file("gen/b.rs", "b").unwrap();
    sandbox.write_file("gen/a.rs", "a").unwrap();
    let all = ["gen/a.rs", "gen/b.rs", "src/domain.rs", "src/model/user.rs", "z.rs"];
    assert_eq!(sandbox.list_files(None).unwrap(), all);
    assert_eq!(sandbox.list_files(Some(".")).unwrap(), all);
    assert_eq!(sandbox.list_files(Some("")).unwrap(), all);
    assert_eq!(sandbox.list_files(Some("./gen/")).unwrap(), ["gen/a.rs", "gen/b.rs"]);
    fs::create_dir(f.out.join("empty")).unwrap();
    assert!(sandbox.list_files(Some("empty")).unwrap().is_empty());
    let r = refused(sandbox.list_files(Some("nope")));
    assert_mentions(&r, &["no such folder", "`empty`, `gen`, `src`", "without `dir`"]);
    let r = refused(sandbox.list_files(Some("z.rs")));
    assert_mentions(&r, &["is a file, not a folder", "read_file"]);
    let r = refused(sandbox.list_files(Some("src/domain.rs")));
    assert_mentions(&r, &["is a file, not a folder"]);
}

#[test]
fn list_files_under_a_virtual_folder_of_file_mounts() {
    let f = fixture();
    let sandbox = Sandbox::builder(&f.out)
        .input("inputs/domain.rs", f.pkg.join("src/domain.rs"))
        .input("inputs/readme.md", f.pkg.join("README.md"))
        .build()
        .unwrap();
    assert_eq!(sandbox.list_files(Some("inputs")).unwrap(), ["inputs/domain.rs", "inputs/readme.md"]);
    assert_mentions(&refused(sandbox.list_files(Some("other"))), &["`inputs`"]);
}

#[test]
fn read_cap_states_the_size_and_the_limit() {
    let f = fixture();
    write(&f.out.join("big.txt"), &"x".repeat(101));
    write(&f.out.join("ok.txt"), &"x".repeat(100));
    let limits = Limits { max_read_bytes: 100, ..Limits::default() };
    let sandbox = Sandbox::builder(&f.out).limits(limits).build().unwrap();
    assert_mentions(&refused(sandbox.read_file("big.txt")), &["101 bytes", "read limit of 100 bytes"]);
    assert_eq!(sandbox.read_file("ok.txt").unwrap().len(), 100);
}

#[test]
fn write_cap_states_the_size_and_the_limit() {
    let f = fixture();
    let limits = Limits { max_write_bytes: 10, ..Limits::default() };
    let mut sandbox = Sandbox::builder(&f.out).limits(limits).build().unwrap();
    let r = refused(sandbox.write_file("a.rs", "01234567890"));
    assert_mentions(&r, &["11 bytes", "write limit of 10 bytes", "smaller files"]);
    assert!(!f.out.join("a.rs").exists());
    sandbox.write_file("a.rs", "0123456789").unwrap();
}

#[test]
fn distinct_files_per_step_are_capped_but_rewrites_are_not() {
    let f = fixture();
    let limits = Limits { max_files_per_step: 2, ..Limits::default() };
    let mut sandbox = Sandbox::builder(&f.out).limits(limits).build().unwrap();
    sandbox.write_file("a.rs", "a").unwrap();
    sandbox.write_file("b.rs", "b").unwrap();
    let r = refused(sandbox.write_file("c.rs", "c"));
    assert_mentions(&r, &["already written 2 distinct files", "limit of 2", "`a.rs`, `b.rs`"]);
    assert!(!f.out.join("c.rs").exists());
    sandbox.write_file("./a.rs", "a2").unwrap();
    assert_eq!(sandbox.written(), ["a.rs", "b.rs"]);
}

#[cfg(unix)]
mod symlinks {
    use super::*;
    use std::os::unix::fs::symlink;

    /// `out/` with links to `outside/`, which holds `secret` and `target.rs`.
    fn linked() -> (Fixture, tempfile::TempDir) {
        let f = fixture();
        let outside = tempfile::tempdir().unwrap();
        write(&outside.path().join("secret"), "TOP SECRET");
        write(&outside.path().join("target.rs"), "original");
        fs::create_dir_all(&f.out).unwrap();
        symlink(outside.path(), f.out.join("link")).unwrap();
        symlink(outside.path().join("target.rs"), f.out.join("evil.rs")).unwrap();
        (f, outside)
    }

    #[test]
    fn reading_through_a_link_that_leaves_the_root_is_refused() {
        let (f, _outside) = linked();
        let sandbox = Sandbox::builder(&f.out).build().unwrap();
        let r = refused(sandbox.read_file("link/secret"));
        assert_mentions(&r, &["`link` is a symbolic link", "outside the output folder"]);
        assert_mentions(&refused(sandbox.read_file("evil.rs")), &["outside the output folder"]);
        assert_mentions(&refused(sandbox.list_files(Some("link"))), &["outside the output folder"]);
    }

    #[test]
    fn writing_through_a_folder_link_that_leaves_the_root_is_refused() {
        let (f, outside) = linked();
        let mut sandbox = Sandbox::builder(&f.out).build().unwrap();
        let r = refused(sandbox.write_file("link/x.rs", "pwned"));
        assert_mentions(&r, &["`link` is a symbolic link", "outside the output folder"]);
        let r = refused(sandbox.write_file("link/new/deeper/x.rs", "pwned"));
        assert_mentions(&r, &["outside the output folder"]);
        assert_eq!(names(outside.path()), ["secret", "target.rs"]);
        assert!(sandbox.written().is_empty());
    }

    #[test]
    fn writing_to_a_file_link_that_leaves_the_root_is_refused_and_the_target_untouched() {
        let (f, outside) = linked();
        let mut sandbox = Sandbox::builder(&f.out).build().unwrap();
        let r = refused(sandbox.write_file("evil.rs", "pwned"));
        assert_mentions(&r, &["`evil.rs` is a symbolic link", "outside the output folder"]);
        assert_eq!(fs::read_to_string(outside.path().join("target.rs")).unwrap(), "original");
        assert!(fs::symlink_metadata(f.out.join("evil.rs")).unwrap().file_type().is_symlink());
        assert!(!sandbox.output_exists("evil.rs"));
        assert!(!sandbox.output_exists("link/secret"));
    }

    #[test]
    fn listing_leaves_out_links_that_leave_the_root() {
        let (f, _outside) = linked();
        write(&f.out.join("real/a.rs"), "a");
        symlink(f.out.join("real/a.rs"), f.out.join("alias.rs")).unwrap();
        symlink(f.out.join("nowhere.rs"), f.out.join("dangling.rs")).unwrap();
        let sandbox = Sandbox::builder(&f.out).build().unwrap();
        assert_eq!(sandbox.list_files(None).unwrap(), ["alias.rs", "real/a.rs"]);
        assert_mentions(&refused(sandbox.read_file("dangling.rs")), &["does not exist"]);
    }

    #[test]
    fn links_that_stay_inside_the_root_work_for_reads_and_writes() {
        let (f, _outside) = linked();
        write(&f.out.join("real/a.rs"), "a");
        symlink(f.out.join("real"), f.out.join("alias")).unwrap();
        symlink(f.out.join("real/a.rs"), f.out.join("a_link.rs")).unwrap();
        let mut sandbox = Sandbox::builder(&f.out).build().unwrap();
        assert_eq!(sandbox.read_file("alias/a.rs").unwrap(), "a");
        assert_eq!(sandbox.read_file("a_link.rs").unwrap(), "a");
        sandbox.write_file("alias/new/b.rs", "b").unwrap();
        assert_eq!(fs::read_to_string(f.out.join("real/new/b.rs")).unwrap(), "b");
        sandbox.write_file("a_link.rs", "a2").unwrap();
        assert_eq!(fs::read_to_string(f.out.join("real/a.rs")).unwrap(), "a2");
        assert!(fs::symlink_metadata(f.out.join("a_link.rs")).unwrap().file_type().is_symlink());
    }

    #[test]
    fn links_to_protected_files_inside_the_root_are_protected() {
        let (f, _outside) = linked();
        write(&f.out.join(".env"), "SECRET=1");
        write(&f.out.join(".git/config"), "[core]");
        symlink(f.out.join(".env"), f.out.join("notes.txt")).unwrap();
        symlink(f.out.join(".git"), f.out.join("vcs")).unwrap();
        let mut sandbox = Sandbox::builder(&f.out).build().unwrap();
        assert_mentions(&refused(sandbox.read_file("notes.txt")), &["protected", "secrets"]);
        assert_mentions(&refused(sandbox.read_file("vcs/config")), &["protected", "version control"]);
        assert_mentions(&refused(sandbox.write_file("notes.txt", "x")), &["protected"]);
        assert_mentions(&refused(sandbox.write_file("vcs/hooks/pre-commit", "x")), &["protected"]);
        assert_mentions(&refused(sandbox.list_files(Some("vcs"))), &["protected"]);
        assert!(sandbox.list_files(None).unwrap().is_empty());
        assert_eq!(fs::read_to_string(f.out.join(".env")).unwrap(), "SECRET=1");
        assert!(!f.out.join(".git/hooks").exists());
    }

    #[test]
    fn a_link_inside_an_input_folder_cannot_leave_that_folder() {
        let f = fixture();
        write(&f.pkg.join("private.txt"), "private");
        symlink(f.pkg.join("private.txt"), f.pkg.join("src/peek.txt")).unwrap();
        symlink(&f.pkg, f.pkg.join("src/up")).unwrap();
        let sandbox = Sandbox::builder(&f.out).input("src", f.pkg.join("src")).build().unwrap();
        let r = refused(sandbox.read_file("src/peek.txt"));
        assert_mentions(&r, &["outside the read-only input `src`"]);
        assert_mentions(&refused(sandbox.read_file("src/up/private.txt")), &["outside the read-only input `src`"]);
        assert_eq!(sandbox.list_files(None).unwrap(), ["src/domain.rs", "src/model/user.rs"]);
    }

    #[test]
    fn with_links_within_the_package_an_input_folder_follows_links_that_stay_inside_it() {
        let f = fixture();
        write(&f.pkg.join("private.txt"), "private");
        write(&f.pkg.join("shared/types.rs"), "pub struct T;");
        write(&f.pkg.join("shared/.env"), "SECRET=1");
        symlink(f.pkg.join("private.txt"), f.pkg.join("src/peek.txt")).unwrap();
        symlink(f.pkg.join("shared"), f.pkg.join("src/shared")).unwrap();
        let sandbox = Sandbox::builder(&f.out).input("src", f.pkg.join("src")).links_within(&f.pkg).build().unwrap();
        assert_eq!(sandbox.read_file("src/peek.txt").unwrap(), "private");
        assert_eq!(sandbox.read_file("src/shared/types.rs").unwrap(), "pub struct T;");
        assert_mentions(&refused(sandbox.read_file("src/shared/.env")), &["protected"]);
        let listed = ["src/domain.rs", "src/model/user.rs", "src/peek.txt", "src/shared/types.rs"];
        assert_eq!(sandbox.list_files(None).unwrap(), listed);
        assert_eq!(sandbox.list_files(Some("src/shared")).unwrap(), ["src/shared/types.rs"]);

        // What a model can read is what `input_files` walks, real paths resolved.
        let files = input_files(&f.pkg.join("src"), Some(&f.pkg)).unwrap();
        let paths: Vec<&str> = files.iter().map(|(path, _)| path.as_str()).collect();
        assert_eq!(paths, ["domain.rs", "model/user.rs", "peek.txt", "shared/types.rs"]);
        assert_eq!(files[3].1, fs::canonicalize(f.pkg.join("shared/types.rs")).unwrap());
    }

    #[test]
    fn with_links_within_the_package_a_link_that_leaves_it_is_the_users_error() {
        let f = fixture();
        let outside = tempfile::tempdir().unwrap();
        let src = fs::canonicalize(f.pkg.join("src")).unwrap();
        let build = || Sandbox::builder(&f.out).input("src", f.pkg.join("src")).links_within(&f.pkg).build();
        let link_error = |err: SandboxError| match err {
            SandboxError::InputLink { link, target, reason } => (link, target, reason),
            other => panic!("expected InputLink, got {other:?}"),
        };

        symlink(outside.path(), f.pkg.join("src/out")).unwrap();
        let (link, target, reason) = link_error(build().unwrap_err());
        assert_eq!((link, target), (src.join("out"), fs::canonicalize(outside.path()).unwrap()));
        assert!(
            reason.contains("outside") && reason.contains(&fs::canonicalize(&f.pkg).unwrap().display().to_string())
        );
        assert_eq!(input_files(&f.pkg.join("src"), Some(&f.pkg)).map_err(link_error).unwrap_err().0, src.join("out"));
        fs::remove_file(f.pkg.join("src/out")).unwrap();

        // A link to a folder that holds it would make an endless tree.
        symlink(&f.pkg, f.pkg.join("src/up")).unwrap();
        let (link, _, reason) = link_error(build().unwrap_err());
        assert_eq!(link, src.join("up"));
        assert!(reason.contains("never end"), "{reason}");
        fs::remove_file(f.pkg.join("src/up")).unwrap();

        // A link the model could never open is not judged.
        symlink(outside.path(), f.pkg.join("src/target")).unwrap();
        build().unwrap();
        fs::remove_file(f.pkg.join("src/target")).unwrap();

        symlink(f.pkg.join("nowhere"), f.pkg.join("src/gone")).unwrap();
        let (link, target, reason) = link_error(build().unwrap_err());
        assert_eq!((link, target), (src.join("gone"), f.pkg.join("nowhere")));
        assert!(reason.contains("does not exist"), "{reason}");
    }
}
