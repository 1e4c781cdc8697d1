//! Chains as graphs (`after`), as a user meets them: a diamond whose two middle steps run at
//! once under `--jobs 2` (proved from the order in which the fake server saw and answered
//! their requests, never from a clock); a step that cannot see the files of a step it does not
//! run after; an edit that regenerates only the edited step and its dependents; a failing step
//! that stops its dependents and not the steps independent of it; every mistake in `after`
//! named with its file, line and column; `graph`; `--workspace` over two packages; and the
//! committed example lock, recorded before `after` existed, still fresh and byte-identical.
//! Real binary, real `cargo` for one build, the fake LLM server on loopback.

use std::path::Path;

use promptgen_tests::{FakeLlm, Moment, RecordedRequest, Reply, Turn};
use serde_json::json;

use crate::support;
use crate::support::{
    A, B, Package, copy_tree, edit, finish, last_message, lock_of, run, stderr, stdout, text, unseeded_chain,
    with_step_keys, write,
};

/// 01 -> {02, 03} -> 04: four steps writing `outputs`, with `settings`, and step 04 holding
/// `last` too.
fn diamond_of(settings: &str, outputs: [&str; 4], last: &str) -> String {
    let metadata = unseeded_chain(settings, &outputs);
    let metadata = with_step_keys(&metadata, "02", "after = [\"01\"]\n");
    let metadata = with_step_keys(&metadata, "03", "after = [\"01\"]\n");
    with_step_keys(&metadata, "04", &format!("after = [\"02\", \"03\"]\n{last}"))
}

/// The diamond of a.rs, b.rs and c.rs (both using a) and d.rs (using both), unchecked. Each
/// prompt carries a marker (`[[02]]`) that routes the fake server's replies to its step.
fn diamond_chain() -> String {
    diamond_of("check = \"none\"\n", ["a.rs", "b.rs", "c.rs", "d.rs"], "")
}

const C: &str = "pub fn c() -> String { format!(\"{}c\", super::a::a()) }\n";
const D: &str = "pub fn d() -> String { format!(\"{}+{}\", super::b::b(), super::c::c()) }\n";

fn marker(id: &str) -> String {
    format!("[[{id}]]")
}

fn diamond(metadata: &str) -> Package {
    let package = Package::new(metadata, "println!(\"{}\", generated::d::d());");
    for (id, what) in [("01", "a.rs with fn a"), ("02", "b.rs with fn b"), ("03", "c.rs with fn c"), ("04", "d.rs")] {
        package.write(&format!("prompts/{id}.md"), &format!("Write {what}. {}\n", marker(id)));
    }
    package
}

/// Routes a step that writes `file` and finishes.
fn route(server: &FakeLlm, id: &str, file: &str, content: &str) {
    server.route(&marker(id), vec![write(file, content), finish()]);
}

fn promptgen(package: &Package, server: &FakeLlm, args: &[&str]) -> std::process::Output {
    run(package.promptgen(args).env("PROMPTGEN_BASE_URL", server.url()))
}

/// The indices of the requests of step `id`.
fn requests_of(requests: &[RecordedRequest], id: &str) -> Vec<usize> {
    let marker = marker(id);
    requests.iter().enumerate().filter(|(_, r)| r.body.contains(&marker)).map(|(i, _)| i).collect()
}

/// Where `moment` is in the server's timeline.
fn when(timeline: &[Moment], moment: Moment) -> usize {
    timeline.iter().position(|m| *m == moment).unwrap_or_else(|| panic!("{moment:?} is not in {timeline:?}"))
}

#[test]
fn a_diamond_runs_its_two_middle_steps_at_once_with_jobs_2_and_each_after_what_it_runs_after() {
    let server = FakeLlm::start(Vec::new());
    route(&server, "01", "a.rs", A);
    // Each middle step's first answer waits until the other step's first request is in: run
    // one after the other, the first would wait the whole cap, and the order below would fail.
    server.route(&marker("02"), vec![write("b.rs", B).once_seen(&marker("03")), finish()]);
    server.route(&marker("03"), vec![write("c.rs", C).once_seen(&marker("02")), finish()]);
    route(&server, "04", "d.rs", D);
    let package = diamond(&diamond_chain());

    let out = promptgen(&package, &server, &["--jobs", "2"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let requests = server.requests();
    let timeline = server.timeline();
    let [one, two, three, four] = ["01", "02", "03", "04"].map(|id| requests_of(&requests, id));
    assert_eq!([one.len(), two.len(), three.len(), four.len()], [2, 2, 2, 2], "{timeline:?}");
    // 02 and 03 overlapped: each one's first request arrived before the other's was answered.
    assert!(when(&timeline, Moment::Arrived(three[0])) < when(&timeline, Moment::Answered(two[0])), "{timeline:?}");
    assert!(when(&timeline, Moment::Arrived(two[0])) < when(&timeline, Moment::Answered(three[0])), "{timeline:?}");
    // Each step started only after the steps it runs after had their last answers.
    let last_answer = |ids: &[usize]| ids.iter().map(|&i| when(&timeline, Moment::Answered(i))).max().unwrap();
    let first_arrival = |ids: &[usize]| ids.iter().map(|&i| when(&timeline, Moment::Arrived(i))).min().unwrap();
    assert!(last_answer(&one) < first_arrival(&two) && last_answer(&one) < first_arrival(&three), "{timeline:?}");
    assert!(last_answer(&two) < first_arrival(&four) && last_answer(&three) < first_arrival(&four), "{timeline:?}");

    // Progress lines name their step; the summary counts every step.
    let err = stderr(&out);
    for id in ["01", "02", "03", "04"] {
        assert!(err.contains(&format!("step {id}: running")) && err.contains(&format!("step {id}: done")), "{err}");
    }
    assert!(err.contains("4 of 4 steps regenerated"), "{err}");

    // Each key holds what its step runs after: 02 runs after the step before it (the old form,
    // `previous`), 03 and 04 name theirs.
    let lock = lock_of(&package);
    let step = |id: &str| lock.step(id).unwrap().fingerprint.clone();
    assert!(step("01").previous.is_none() && step("01").after.is_empty());
    assert!(step("02").previous.is_some() && step("02").after.is_empty());
    assert!(step("03").previous.is_none() && step("03").after.keys().eq(["01"]));
    assert!(step("04").previous.is_none() && step("04").after.keys().eq(["02", "03"]));
    let text_of_lock = package.read("promptgen.lock");
    assert!(text_of_lock.contains("[step.fingerprint.after]"), "{text_of_lock}");

    // The crate gets every step's file: d uses b and c, both of which use a.
    let out = run(package.cargo(&["run", "--quiet"]).env("PROMPTGEN_OFFLINE", "1"));
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "ab+ac", "{}", text(&out));
    let out = run(&mut package.promptgen(&["check"]));
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
}

#[test]
fn a_step_sees_the_files_of_the_steps_it_runs_after_and_nothing_of_the_others() {
    let server = FakeLlm::start(Vec::new());
    route(&server, "01", "a.rs", A);
    route(&server, "02", "b.rs", B);
    let list = || Reply::turn(Turn::call("list_files", json!({})));
    let read_b = Reply::turn(Turn::call("read_file", json!({ "path": "b.rs" })));
    server.route(&marker("03"), vec![list(), read_b, write("c.rs", C), finish()]);
    server.route(&marker("04"), vec![list(), write("d.rs", D), finish()]);
    let package = diamond(&diamond_chain());

    // One at a time, in id order: 02 is recorded before 03 starts, and 03 still cannot see it.
    let out = promptgen(&package, &server, &["--jobs", "1"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let requests = server.requests();
    let three = requests_of(&requests, "03");
    let listed = last_message(&requests[three[1]]);
    assert!(listed.contains("a.rs") && !listed.contains("b.rs"), "03 lists only what 01 wrote:\n{listed}");
    let read = last_message(&requests[three[2]]);
    assert!(read.contains("b.rs") && read.contains("no such file"), "03 cannot read 02's file:\n{read}");
    let four = requests_of(&requests, "04");
    let listed = last_message(&requests[four[1]]);
    for file in ["a.rs", "b.rs", "c.rs"] {
        assert!(listed.contains(file), "04 sees every step it runs after, transitively:\n{listed}");
    }
}

#[test]
fn the_log_page_draws_the_edges_of_after_as_graph_does() {
    let server = FakeLlm::start(Vec::new());
    for (id, file, content) in [("01", "a.rs", A), ("02", "b.rs", B), ("03", "c.rs", C), ("04", "d.rs", D)] {
        route(&server, id, file, content);
    }
    let package = diamond(&diamond_chain());
    let out = promptgen(&package, &server, &[]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let page = package.path("chain.html");
    let out = run(&mut package.promptgen(&["log", "--html", page.to_str().unwrap()]));
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let html = std::fs::read_to_string(&page).unwrap();
    // Each step's box, and where it is: its column is one past those of the steps it runs
    // after.
    let x_of = |id: &str| -> usize {
        let at = html.find(&format!("<a href=\"#step-{id}\">")).unwrap_or_else(|| panic!("no box for {id}"));
        let rest = &html[at..];
        let x = rest.find("<rect x=\"").unwrap() + "<rect x=\"".len();
        rest[x..].split('"').next().unwrap().parse().unwrap()
    };
    let (x1, x2, x3, x4) = (x_of("01"), x_of("02"), x_of("03"), x_of("04"));
    assert!(x1 < x2 && x2 == x3 && x3 < x4, "columns: {x1} {x2} {x3} {x4}");
    // One arrow per dependency: 01 -> 02, 01 -> 03, 02 -> 04, 03 -> 04 (a line would have 3).
    let svg = &html[html.find("<svg").unwrap()..html.find("</svg>").unwrap()];
    assert_eq!(svg.matches("<line ").count(), 4, "{svg}");
}

#[test]
fn an_edit_regenerates_the_step_and_its_dependents_only_and_status_check_and_graph_say_why() {
    let server = FakeLlm::start(Vec::new());
    for (id, file, content) in [("01", "a.rs", A), ("02", "b.rs", B), ("03", "c.rs", C), ("04", "d.rs", D)] {
        route(&server, id, file, content);
    }
    let package = diamond(&diamond_chain());
    let out = promptgen(&package, &server, &["--jobs", "2"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));

    // `graph`: every step fresh, an arrow per dependency.
    let out = run(&mut package.promptgen(&["graph"]));
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let chart = stdout(&out);
    for line in [
        "flowchart TD",
        "    s_01[\"01 (fresh)<br/>a.rs\"]",
        "    s_01 --> s_02",
        "    s_01 --> s_03",
        "    s_02 --> s_04",
        "    s_03 --> s_04",
    ] {
        assert!(chart.lines().any(|l| l == line), "no line {line:?} in:\n{chart}");
    }

    // Edit 02: 02 and 04 are stale, 01 and 03 are not.
    edit(&package, "prompts/02.md", "fn b.", "fn b, in one line.");
    let out = run(&mut package.promptgen(&["check"]));
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let report = stdout(&out);
    assert!(report.contains("2 of 4 steps"), "{report}");
    assert!(report.contains("step 02: prompt `prompts/02.md` changed"), "{report}");
    assert!(report.contains("step 04: it runs after step 02, which must run again"), "{report}");
    assert!(!report.contains("step 01") && !report.contains("step 03"), "{report}");
    let out = run(&mut package.promptgen(&["status"]));
    let table = stdout(&out);
    let row = |id: &str| table.lines().find(|l| l.starts_with(&format!("{id} "))).unwrap_or_default().to_string();
    let cells = |id: &str| row(id).split_whitespace().map(String::from).collect::<Vec<_>>();
    assert_eq!(cells("01")[2..4], ["-", "fresh"], "{table}");
    assert_eq!(cells("03")[2..4], ["01", "fresh"], "{table}");
    assert_eq!(cells("02")[2..4], ["01", "stale"], "{table}");
    assert_eq!(cells("04")[2..4], ["02,03", "stale"], "{table}");
    let out = run(&mut package.promptgen(&["graph", "--format", "dot"]));
    let chart = stdout(&out);
    for line in [
        "    \"02\" [label=\"02 (stale)\\nb.rs\", fillcolor=\"#fde0dc\"];",
        "    \"03\" [label=\"03 (fresh)\\nc.rs\", fillcolor=\"#dcf5dc\"];",
        "    \"03\" -> \"04\";",
    ] {
        assert!(chart.lines().any(|l| l == line), "no line {line:?} in:\n{chart}");
    }

    // Only 02 and 04 run; the server has no reply for the others and would answer 500.
    let before = server.requests().len();
    route(&server, "02", "b.rs", B.replace("}b", "}B").as_str());
    route(&server, "04", "d.rs", D);
    let out = promptgen(&package, &server, &["--jobs", "2"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let err = stderr(&out);
    assert!(err.contains("2 of 4 steps regenerated"), "{err}");
    assert!(
        err.contains("step 04: running by edit from d.rs, because the output of step 02, which it runs after, changed"),
        "{err}"
    );
    let requests = server.requests();
    let ran: std::collections::BTreeSet<&str> = requests[before..]
        .iter()
        .filter_map(|r| ["01", "02", "03", "04"].into_iter().find(|id| r.body.contains(&marker(id))))
        .collect();
    assert_eq!(ran.into_iter().collect::<Vec<_>>(), ["02", "04"]);

    // Editing a leaf regenerates the leaf alone.
    edit(&package, "prompts/04.md", "Write d.rs.", "Write d.rs, joining b and c.");
    let before = server.requests().len();
    route(&server, "04", "d.rs", D);
    let out = promptgen(&package, &server, &[]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(stderr(&out).contains("1 of 4 steps regenerated"), "{}", text(&out));
    assert_eq!(requests_of(&server.requests()[before..], "04").len(), 2);
    assert_eq!(server.requests().len() - before, 2);
}

#[test]
fn a_failing_step_stops_the_steps_after_it_and_not_the_steps_independent_of_it() {
    let server = FakeLlm::start(Vec::new());
    route(&server, "01", "a.rs", A);
    server.route(&marker("02"), vec![Reply::error(400, "the model refused")]);
    route(&server, "03", "c.rs", C);
    let package = diamond(&diamond_chain());
    let out = promptgen(&package, &server, &["--jobs", "2"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let err = stderr(&out);
    for phrase in [
        "step 02: failed",
        "error: step `02` failed; nothing of it was recorded",
        "the model refused",
        "2 of 4 steps regenerated and recorded",
        "step 04 did not run: it runs after step 02, which failed.",
        "1 of 4 steps failed (02), 1 did not run",
    ] {
        assert!(err.contains(phrase), "expected `{phrase}` in:\n{err}");
    }
    assert!(requests_of(&server.requests(), "04").is_empty(), "04 never ran");
    let lock = lock_of(&package);
    let recorded: Vec<&str> = lock.steps.iter().map(|s| s.id.as_str()).collect();
    assert_eq!(recorded, ["01", "03"], "what ran and passed is recorded");
    assert_eq!(package.read("promptgen/03/c.rs"), C);
    let out = run(&mut package.promptgen(&["check"]));
    let report = stdout(&out);
    assert!(report.contains("step 02: it was never generated") && report.contains("step 04:"), "{report}");
    assert!(!report.contains("step 03"), "{report}");
}

/// A mistake, the manifest that makes it, where the error must point (a needle in the
/// manifest, which occurrence, and how many characters into it), and what it must say.
type Mistake = (&'static str, String, (&'static str, usize, usize), Vec<&'static str>);

/// `Cargo.toml:LINE:COLUMN` of the `nth` occurrence (from 0) of `needle` in the package's
/// manifest, `skip` characters into it.
fn place(package: &Package, needle: &str, nth: usize, skip: usize) -> String {
    let manifest = package.read("Cargo.toml");
    let offset = manifest.match_indices(needle).nth(nth).unwrap_or_else(|| panic!("no {needle:?} in:\n{manifest}")).0;
    let before = &manifest[..offset];
    let line = before.matches('\n').count() + 1;
    let column = before.rsplit('\n').next().unwrap_or_default().chars().count() + 1 + skip;
    format!("Cargo.toml:{line}:{column}")
}

#[test]
fn every_mistake_in_after_is_named_with_its_place_and_the_steps_involved() {
    let cycle = diamond_chain()
        .replacen("outputs = [\"a.rs\"]\n", "outputs = [\"a.rs\"]\nafter = [\"03\"]\n", 1)
        .replacen("outputs = [\"b.rs\"]\nafter = [\"01\"]\n", "outputs = [\"b.rs\"]\n", 1)
        .replacen("outputs = [\"c.rs\"]\nafter = [\"01\"]\n", "outputs = [\"c.rs\"]\nafter = [\"02\"]\n", 1);
    // (what, metadata, where: (needle, which occurrence, characters into it), phrases)
    let cases: Vec<Mistake> = vec![
        (
            "an unknown id",
            diamond_chain().replacen("after = [\"01\"]", "after = [\"09\"]", 1),
            ("\"09\"", 0, 0),
            vec![
                "`package.metadata.promptgen.steps[1].after[0]`",
                "step `02` runs after `09`, but there is no step `09`; the steps are: 01, 02, 03, 04.",
            ],
        ),
        (
            "a step after itself",
            diamond_chain().replacen("after = [\"01\"]", "after = [\"02\"]", 1),
            ("after = [\"02\"]", 0, 9),
            vec!["`package.metadata.promptgen.steps[1].after[0]`", "step `02` names itself in `after`"],
        ),
        (
            "a cycle through a step without `after`",
            cycle,
            ("after = [\"03\"]", 0, 9),
            vec![
                "`package.metadata.promptgen.steps[0].after[0]`",
                "steps wait for each other in a cycle",
                "01 runs after 03, 03 runs after 02, and 02 runs after 01 (the step before it: it declares no `after`)",
            ],
        ),
        (
            "two independent steps with one output",
            diamond_chain().replacen("outputs = [\"c.rs\"]", "outputs = [\"b.rs\"]", 1),
            ("\"b.rs\"", 1, 0),
            vec![
                "`package.metadata.promptgen.steps[2].outputs[0]`",
                "steps `02` and `03` both declare `b.rs`, and neither runs after the other",
                "`after = [\"02\"]` in step `03`",
            ],
        ),
        (
            "jobs = 0",
            diamond_chain().replacen("check = \"none\"", "check = \"none\"\njobs = 0", 1),
            ("jobs = 0", 0, 7),
            vec!["`package.metadata.promptgen.jobs` = 0 is not allowed: expected a positive integer"],
        ),
    ];
    for (what, metadata, (needle, nth, skip), phrases) in cases {
        let package = diamond(&metadata);
        let out = run(&mut package.promptgen(&["check"]));
        assert_eq!(out.status.code(), Some(1), "{what}: {}", text(&out));
        let err = stderr(&out);
        assert!(err.starts_with("error: ") && !err.contains("panicked"), "{what}: {err}");
        let at = place(&package, needle, nth, skip);
        assert!(err.contains(&format!("{at}`")), "{what}: expected {at} in:\n{err}");
        for phrase in phrases {
            assert!(err.contains(phrase), "{what}: expected `{phrase}` in:\n{err}");
        }
    }
    // The variable is checked as the key is.
    let package = diamond(&diamond_chain());
    let out = run(package.promptgen(&["check"]).env("PROMPTGEN_JOBS", "many"));
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(stderr(&out).contains("PROMPTGEN_JOBS=\"many\" is not allowed"), "{}", text(&out));
}

/// A workspace whose root package declares no chain, with two members that do.
fn workspace() -> (Package, [String; 2]) {
    let root = Package::new("", "");
    edit(&root, "Cargo.toml", "[workspace]\n", "[workspace]\nmembers = [\"a\", \"b\"]\n");
    let names = ["a", "b"].map(|m| format!("{}-{m}", root.name));
    for (member, name) in ["a", "b"].iter().zip(&names) {
        root.write(
            &format!("{member}/Cargo.toml"),
            &format!(
                "[package]\nname = \"{name}\"\nversion = \"0.1.0\"\nedition = \"2021\"\npublish = false\n{}",
                unseeded_chain("check = \"none\"\n", &[&format!("{member}.rs")])
            ),
        );
        root.write(&format!("{member}/src/lib.rs"), "");
        root.write(&format!("{member}/prompts/01.md"), &format!("Write {member}.rs. [[{member}]]\n"));
    }
    (root, names)
}

/// Every line of `output` that is not empty starts with one of `names` and `: `, but for the
/// summary, which names them.
fn every_line_names_its_package(output: &str, names: &[String]) {
    for line in output.lines() {
        let named = names.iter().any(|name| line.starts_with(&format!("{name}:")));
        let summary = line.starts_with("promptgen ") && line.contains("--workspace");
        assert!(named || summary, "a line without its package: {line:?} in:\n{output}");
    }
}

#[test]
fn workspace_runs_and_checks_every_member_with_a_chain_and_names_the_package_in_every_line() {
    let (root, names) = workspace();
    let server = FakeLlm::start(Vec::new());
    server.route("[[a]]", vec![write("a.rs", "pub fn a() {}\n"), finish()]);
    server.route("[[b]]", vec![write("b.rs", "pub fn b() {}\n"), finish()]);

    let out = promptgen(&root, &server, &["run", "--workspace", "--jobs", "2"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    every_line_names_its_package(&stderr(&out), &names);
    every_line_names_its_package(&stdout(&out), &names);
    for name in &names {
        assert!(stderr(&out).contains(&format!("{name}: step 01: done")), "{}", text(&out));
    }
    assert!(stderr(&out).contains("2 package(s), all passed"), "{}", text(&out));
    assert_eq!(server.requests().len(), 4);
    assert!(root.path("a/promptgen.lock").exists() && root.path("b/promptgen.lock").exists());

    let out = run(&mut root.promptgen(&["check", "--workspace"]));
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    every_line_names_its_package(&stdout(&out), &names);
    for name in &names {
        assert!(stdout(&out).contains(&format!("{name}: All 1 steps of {name} are fresh.")), "{}", text(&out));
    }

    // One stale member: one exit code for all, and each line says whose it is.
    edit(&root, "b/prompts/01.md", "Write b.rs.", "Write b.rs, with a doc comment.");
    let out = run(&mut root.promptgen(&["check", "--workspace"]));
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let report = stdout(&out);
    every_line_names_its_package(&report, &names);
    let [a, b] = &names;
    assert!(report.contains(&format!("{a}: All 1 steps of {a} are fresh.")), "{report}");
    assert!(report.contains(&format!("{b}: 1 of 1 steps of {b} are stale:")), "{report}");
    assert!(report.contains(&format!("{b}:   step 01: prompt `prompts/01.md` changed")), "{report}");
    assert!(stderr(&out).contains(&format!("1 of 2 package(s) failed: {b}")), "{}", text(&out));
    let out = run(&mut root.promptgen(&["check", "--workspace", "--exclude", b]));
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));

    let out = run(&mut root.promptgen(&["status", "--workspace"]));
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    every_line_names_its_package(&stdout(&out), &names);
    assert!(stdout(&out).contains(&format!("{b}: step ")), "{}", text(&out));

    let out = run(&mut root.promptgen(&["graph", "--workspace"]));
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let chart = stdout(&out);
    assert_eq!(chart.matches("    subgraph ").count(), 2, "{chart}");
    assert!(chart.contains(&format!("[\"{a} 01 (fresh)<br/>a.rs\"]")), "{chart}");
    assert!(chart.contains(&format!("[\"{b} 01 (stale)<br/>b.rs\"]")), "{chart}");

    // `--workspace` is not `-p`, and `--step` names a step of one package.
    let out = run(&mut root.promptgen(&["check", "--workspace", "-p", a]));
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    let out = run(&mut root.promptgen(&["run", "--workspace", "--step", "01"]));
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
}

/// A lock recorded before `after` existed keeps its meaning byte for byte. The fixture
/// `tests/fixtures/example-app-before-after/` is the example's record (lock and store) as a
/// chain without `after` records it, for the example's manifest without its `after` keys and
/// step 04's prompt as first written (before the change the example re-ran by edit): with
/// those keys taken out again, that lock is fresh, a run leaves it byte for byte, and running
/// every step again from its script records the same bytes. (If the example's prompts,
/// scripts or settings change, the fixture goes stale with them: record it again from a
/// manifest without `after`, from an empty lock, and check that only what the change explains
/// moved.) Everything is copied; the committed files are not touched.
#[test]
fn a_lock_recorded_before_after_existed_stays_fresh_and_byte_identical() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let dir = tempfile::Builder::new().prefix("pg-e2e-example-").tempdir().unwrap();
    copy_tree(&root.join("prompts"), &dir.path().join("prompts"));
    let prompt_04 = dir.path().join("prompts/step_04_app.md");
    let now = std::fs::read_to_string(&prompt_04).unwrap();
    std::fs::write(&prompt_04, now.replace(support::PROMPT_04_CHANGED, support::PROMPT_04_FIRST)).unwrap();
    let app = dir.path().join("example-app");
    for part in ["src", "tests"] {
        copy_tree(&root.join("example-app").join(part), &app.join(part));
    }
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/example-app-before-after");
    copy_tree(&fixture.join("promptgen"), &app.join("promptgen"));
    std::fs::copy(root.join("example-app/build.rs"), app.join("build.rs")).unwrap();
    let committed = std::fs::read_to_string(fixture.join("promptgen.lock")).unwrap();
    assert!(!committed.contains("after"), "the fixture predates `after`:\n{committed}");
    std::fs::write(app.join("promptgen.lock"), &committed).unwrap();
    let manifest = std::fs::read_to_string(root.join("example-app/Cargo.toml")).unwrap();
    let promptgen_dir = Path::new(env!("CARGO_MANIFEST_DIR")).display().to_string();
    let mut line = String::new();
    for text in manifest.lines().filter(|l| !l.starts_with("after = ")) {
        line.push_str(text);
        line.push('\n');
    }
    assert!(manifest.contains("after = ") && !line.contains("after = "), "{manifest}");
    let line = line
        .replace("edition.workspace = true", "edition = \"2024\"")
        .replace("rust-version.workspace = true\n", "")
        .replace("license.workspace = true\n", "")
        .replace("path = \"../cargo-promptgen\"", &format!("path = {promptgen_dir:?}"));
    std::fs::write(app.join("Cargo.toml"), format!("{line}\n[workspace]\n")).unwrap();
    std::fs::copy(root.join("Cargo.lock"), app.join("Cargo.lock")).unwrap();
    let promptgen = |args: &[&str]| {
        let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_cargo-promptgen"));
        command.arg("promptgen").args(args).current_dir(&app).env("CARGO_TARGET_DIR", support::shared_target());
        for var in
            ["CI", "PROMPTGEN_OFFLINE", "PROMPTGEN_BACKEND", "PROMPTGEN_MODEL", "PROMPTGEN_BASE_URL", "PROMPTGEN_JOBS"]
        {
            command.env_remove(var);
        }
        run(command.env("CARGO_NET_OFFLINE", "true"))
    };

    let out = promptgen(&["check"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let out = promptgen(&["run", "--jobs", "4"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(stderr(&out).contains("0 of 4 steps regenerated"), "{}", text(&out));
    assert_eq!(std::fs::read_to_string(app.join("promptgen.lock")).unwrap(), committed, "a fresh run rewrites nothing");
    let out = promptgen(&["run", "--force", "--jobs", "4"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(stderr(&out).contains("4 of 4 steps regenerated"), "{}", text(&out));
    let again = std::fs::read_to_string(app.join("promptgen.lock")).unwrap();
    assert_eq!(again, committed, "the same steps record the same lock, byte for byte");
}

/// A crate as users have them: serde and serde_json from crates.io, a hand-written
/// `domain.rs` the generated code uses, and tests in `main.rs` that use the generated code.
/// 01 turns a user into JSON; 02 (a description) and 03 (a greeting) build on it, not on each
/// other; 04 joins them and must pass the crate's tests.
fn crate_chain() -> String {
    diamond_of("", ["user_json.rs", "describe.rs", "greeting.rs", "report.rs"], "check = \"cargo test\"\n")
}

const CRATE_MAIN: &str = r##"mod domain;

#[allow(dead_code)]
mod generated {
    include!(concat!(env!("OUT_DIR"), "/promptgen.rs"));
}

fn main() {
    let user = domain::User { name: "Ada".into(), age: 36 };
    println!("{}", generated::report::report(&user));
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ada() -> domain::User {
        domain::User { name: "Ada".into(), age: 36 }
    }

    #[test]
    fn the_report_describes_and_greets() {
        let json = r#"{"name":"Ada","age":36}"#;
        assert_eq!(generated::report::report(&ada()), format!("Ada, 36: {json}\nHello, Ada! {json}"));
    }
}
"##;

const USER_JSON: &str = "use crate::domain::User;\n\npub fn to_json(user: &User) -> String {\n    serde_json::to_string(user).expect(\"a User always serialises\")\n}\n";
const DESCRIBE: &str = "use crate::domain::User;\n\npub fn describe(user: &User) -> String {\n    format!(\"{}, {}: {}\", user.name, user.age, super::user_json::to_json(user))\n}\n";
const GREETING: &str = "use crate::domain::User;\n\npub fn greet(user: &User) -> String {\n    format!(\"Hello, {}! {}\", user.name, super::user_json::to_json(user))\n}\n";
const REPORT: &str = "use crate::domain::User;\n\npub fn report(user: &User) -> String {\n    format!(\"{}\\n{}\", super::describe::describe(user), super::greeting::greet(user))\n}\n";

/// The crate of [`crate_chain`], resolving its dependencies offline from the workspace's lock.
fn real_crate() -> Package {
    let package = Package::realistic(&crate_chain(), CRATE_MAIN);
    for (id, what) in [
        ("01", "user_json.rs: to_json for crate::domain::User"),
        ("02", "describe.rs: describe a User, with its JSON"),
        ("03", "greeting.rs: greet a User, with its JSON"),
        ("04", "report.rs: the description, then the greeting"),
    ] {
        package.write(&format!("prompts/{id}.md"), &format!("Write {what}. {}\n", marker(id)));
    }
    package
}

#[test]
fn a_real_crate_checks_two_independent_steps_at_once_and_an_edit_to_one_leaves_the_other_recorded() {
    let server = FakeLlm::start(Vec::new());
    route(&server, "01", "user_json.rs", USER_JSON);
    server.route(&marker("02"), vec![write("describe.rs", DESCRIBE).once_seen(&marker("03")), finish()]);
    server.route(&marker("03"), vec![write("greeting.rs", GREETING).once_seen(&marker("02")), finish()]);
    route(&server, "04", "report.rs", REPORT);
    let package = real_crate();
    let promptgen = |args: &[&str]| {
        run(package.promptgen(args).env("PROMPTGEN_BASE_URL", server.url()).env("CARGO_NET_OFFLINE", "true"))
    };

    // From nothing, two at a time: 02 and 03 overlap, and their crate checks (which share one
    // target folder) both pass; what the crate's `main.rs` needs of 04 is put off, then
    // checked on the whole crate.
    let out = promptgen(&["--jobs", "2"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let requests = server.requests();
    let timeline = server.timeline();
    let [two, three] = ["02", "03"].map(|id| requests_of(&requests, id));
    assert!(when(&timeline, Moment::Arrived(three[0])) < when(&timeline, Moment::Answered(two[0])), "{timeline:?}");
    assert!(when(&timeline, Moment::Arrived(two[0])) < when(&timeline, Moment::Answered(three[0])), "{timeline:?}");
    assert_eq!(requests.len(), 8, "every step passed its check first time: {}", text(&out));
    let err = stderr(&out);
    assert!(err.contains("4 of 4 steps regenerated"), "{err}");
    assert!(err.contains("was put off"), "{err}");
    let tests = run(package.cargo(&["test", "--quiet"]).env("PROMPTGEN_OFFLINE", "1").env("CARGO_NET_OFFLINE", "true"));
    assert!(tests.status.success() && stdout(&tests).contains("1 passed"), "{}", text(&tests));
    let before = lock_of(&package);

    // The greeting's code changes (not what it says): 03 and 04 run again, and 01 and 02 keep
    // their records byte for byte; the crate's tests still pass.
    edit(&package, "prompts/03.md", "greet a User", "greet a User, documented");
    let documented = format!("/// Greets a user by name, with the user as JSON.\n{GREETING}");
    route(&server, "03", "greeting.rs", &documented);
    route(&server, "04", "report.rs", REPORT);
    let out = run(&mut package.promptgen(&["check"]));
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let report = stdout(&out);
    assert!(
        report.contains("2 of 4 steps") && report.contains("step 04: it runs after step 03, which must run again"),
        "{report}"
    );
    let asked = server.requests().len();
    let out = promptgen(&["--jobs", "2"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let requests = server.requests();
    let ran: Vec<&str> = requests[asked..]
        .iter()
        .filter_map(|r| ["01", "02", "03", "04"].into_iter().find(|id| r.body.contains(&marker(id))))
        .collect();
    assert_eq!(ran, ["03", "03", "04", "04"], "{}", text(&out));
    assert!(
        stderr(&out).contains(
            "step 04: running by edit from report.rs, because the output of step 03, which it runs after, changed"
        ),
        "{}",
        text(&out)
    );
    let after = lock_of(&package);
    for id in ["01", "02"] {
        assert_eq!(after.step(id), before.step(id), "step {id} is untouched");
    }
    for id in ["03", "04"] {
        assert_ne!(after.step(id).map(|s| &s.key), before.step(id).map(|s| &s.key), "step {id} ran again");
    }
    assert_eq!(package.read("promptgen/03/greeting.rs"), documented);
    let tests = run(package.cargo(&["test", "--quiet"]).env("PROMPTGEN_OFFLINE", "1").env("CARGO_NET_OFFLINE", "true"));
    assert!(tests.status.success() && stdout(&tests).contains("1 passed"), "{}", text(&tests));
}
