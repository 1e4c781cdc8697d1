//! `plan` reads the stored files of the steps that look fresh ahead, on several threads: it
//! must come to exactly what assessing each step in order does.

use cargo_promptgen::config::{self, Chain, Overrides};
use cargo_promptgen::layout::Layout;
use cargo_promptgen::lock::{sha256_hex, Lock, LockedFile, LockedStep};
use cargo_promptgen::plan::{self, assess, Assessed, Previous, Records, StepState};

const STEPS: usize = 6;

/// A package of `STEPS` steps, each with two stored files, all recorded as fresh.
fn package() -> (tempfile::TempDir, Chain, Layout) {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let mut manifest = String::from(
        "[package]\nname = \"read-ahead\"\nversion = \"0.1.0\"\nedition = \"2021\"\n\n[workspace]\n\n\
         [package.metadata.promptgen]\nmodel = \"m\"\ncheck = \"none\"\n",
    );
    std::fs::create_dir_all(root.join("prompts")).unwrap();
    for n in 0..STEPS {
        manifest.push_str(&format!(
            "\n[[package.metadata.promptgen.steps]]\nid = \"{n:02}\"\nprompt = \"prompts/{n:02}.md\"\noutputs = [\"s{n}/a.rs\", \"s{n}/b.rs\"]\n"
        ));
        std::fs::write(root.join(format!("prompts/{n:02}.md")), format!("Step {n}.\n")).unwrap();
    }
    std::fs::write(root.join("Cargo.toml"), manifest).unwrap();
    let chain = config::load(&root.join("Cargo.toml"), &Overrides::default(), &|_| None).unwrap();
    let layout = Layout::new(&chain.package_dir, &chain.package_name, &root.join("target"));
    let store = layout.store();
    let mut lock = Lock::default();
    let mut previous = None;
    for (n, step) in chain.steps.iter().enumerate() {
        let fingerprint = plan::fingerprint(&chain, step, previous.clone()).unwrap();
        let mut files = Vec::new();
        for name in ["a", "b"] {
            let path = format!("s{n}/{name}.rs");
            let text = format!("pub fn {name}{n}() {{}}\n");
            let real = store.step_dir(&step.id).join(&path);
            std::fs::create_dir_all(real.parent().unwrap()).unwrap();
            std::fs::write(real, &text).unwrap();
            files.push(LockedFile { path, sha256: sha256_hex(text.as_bytes()) });
        }
        let entry = LockedStep {
            id: step.id.clone(),
            key: fingerprint.key(),
            model_calls: 1,
            prompt_tokens: 0,
            completion_tokens: 0,
            repairs: 0,
            check_rounds: 0,
            fingerprint,
            files,
        };
        previous = Some(entry.handoff_digest());
        lock.steps.push(entry);
    }
    lock.write(&layout.lock_path()).unwrap();
    (dir, chain, layout)
}

/// The plan as one `assess` after another, with nothing read ahead.
fn step_by_step(chain: &Chain, records: &Records) -> Vec<Assessed> {
    let mut assessed: Vec<Assessed> = Vec::new();
    for step in &chain.steps {
        let previous = match assessed.last() {
            None => Previous::First,
            Some(Assessed { entry: Some(entry), .. }) => Previous::Recorded(entry),
            Some(last) => Previous::Stale(&last.id),
        };
        assessed.push(assess(chain, step, previous, records, false).unwrap());
    }
    assessed
}

#[test]
fn reading_ahead_changes_nothing_whatever_state_the_store_is_in() {
    let (dir, chain, layout) = package();
    let plan_now = || plan::plan(&chain, &Records::read(&layout).unwrap()).unwrap();
    let expected = || step_by_step(&chain, &Records::read(&layout).unwrap());

    let fresh = plan_now();
    assert!(fresh.iter().all(|a| a.state == StepState::Fresh && a.files.len() == 2));
    assert_eq!(fresh, expected());

    // A stored file edited in the middle of the chain: that step is damaged, later ones stale.
    std::fs::write(dir.path().join("promptgen/03/s3/a.rs"), "pub fn edited() {}\n").unwrap();
    let damaged = plan_now();
    assert_eq!(damaged, expected());
    assert!(damaged[..3].iter().all(|a| a.state == StepState::Fresh));
    match &damaged[3].state {
        StepState::Stale(reasons) => assert!(reasons[0].contains("s3/a.rs"), "{reasons:?}"),
        other => panic!("{other:?}"),
    }
    assert!(damaged[4..].iter().all(|a| matches!(a.state, StepState::Stale(_))));

    // A prompt changed early: everything from there is stale, nothing is read for it.
    std::fs::write(dir.path().join("promptgen/03/s3/a.rs"), "pub fn a3() {}\n").unwrap();
    std::fs::write(dir.path().join("prompts/01.md"), "Step 1, changed.\n").unwrap();
    let changed = plan_now();
    assert_eq!(changed, expected());
    assert_eq!(changed[0].state, StepState::Fresh);
    assert!(changed[1..].iter().all(|a| matches!(a.state, StepState::Stale(_))));
}
