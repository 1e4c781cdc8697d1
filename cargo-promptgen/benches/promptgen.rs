//! What promptgen costs a build, a model call and a machine: the figures of BENCHMARKS.md.
//!
//! ```sh
//! cargo bench -p cargo-promptgen                      # every group, about a minute
//! cargo bench -p cargo-promptgen -- build check       # only the groups named (by part)
//! PROMPTGEN_BENCH_REPS=3 cargo bench -p cargo-promptgen   # fewer repetitions (a smoke run)
//! PROMPTGEN_BENCH_TMP=/dev/shm cargo bench -p cargo-promptgen -- build   # packages on tmpfs
//! PROMPTGEN_BENCH_STEPS=500 cargo bench -p cargo-promptgen -- build-warm  # one size, one half
//! PROMPTGEN_BENCH_KEEP=1 ...                            # keep the generated packages
//! ```
//!
//! Groups: `build-cold` and `build-warm` (the fresh-lock build entry into an empty `OUT_DIR`
//! against a plain copy of the store, and again against a plain hash of it, at 5, 50 and 500
//! steps), `loop` (one model call of our loop against a bare reqwest
//! round trip carrying the same bytes, to the fake server), `bytes` (prompt bytes the example
//! chain sends against the minimum), `check` (`cargo promptgen check` on 500 steps against
//! `cargo metadata` alone), `cache` (with `store = "cache"`: `cargo promptgen pull` of a 50-step
//! chain from a loopback S3 server into an empty cache, then the build from the cache, against
//! the same build from the repo store; it needs the server of `bash scripts/s3-cache.sh bench`,
//! and is skipped without it). The cold build of a user crate is `scripts/cold-build.sh`.
//!
//! The machines this runs on are shared and noisy, so every figure is a ratio of two things
//! measured in the same run, interleaved: each repetition runs both sides (alternating which
//! goes first), and the report gives the median of the per-repetition ratios with their
//! minimum and maximum. Absolute times are printed for orientation only.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use cargo_promptgen::Builder;
use cargo_promptgen::__private::config::{self, Chain, Overrides};
use cargo_promptgen::__private::layout::Layout;
use cargo_promptgen::__private::lock::{Lock, LockedFile, LockedStep, sha256_hex};
use cargo_promptgen::__private::plan::{self, Records};
use cargo_promptgen::__private::store::Files;
use codegen_core::backend::{Backend, BackendConfig, BackendError, BackendKind, ChatRequest, ChatResponse};
use codegen_core::chat::{Arguments, Message};
use codegen_core::sandbox::Sandbox;
use codegen_core::transcript::EndOutcome;
use promptgen_tests::{FakeLlm, Reply, Turn};
use serde_json::json;

// ------------------------------------------------------------------------------------------
// The harness: repetitions, medians, ratios.
// ------------------------------------------------------------------------------------------

/// Median, minimum and maximum of a sample.
#[derive(Debug, Clone, Copy)]
struct Spread {
    median: f64,
    min: f64,
    max: f64,
}

impl Spread {
    fn of(values: &[f64]) -> Spread {
        let mut sorted = values.to_vec();
        sorted.sort_by(f64::total_cmp);
        let n = sorted.len();
        let median = if n % 2 == 1 { sorted[n / 2] } else { (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0 };
        Spread { median, min: sorted[0], max: sorted[n - 1] }
    }

    fn time(&self) -> String {
        format!("{} [{} .. {}]", secs(self.median), secs(self.min), secs(self.max))
    }

    fn ratio(&self) -> String {
        format!("{:.2}x [{:.2} .. {:.2}]", self.median, self.min, self.max)
    }
}

fn secs(s: f64) -> String {
    if s >= 1.0 {
        format!("{s:.2} s")
    } else if s >= 1e-3 {
        format!("{:.2} ms", s * 1e3)
    } else {
        format!("{:.1} us", s * 1e6)
    }
}

/// Two things measured side by side: each closure returns the duration of its measured part
/// (it may prepare and clean up around it).
struct Paired {
    ours: Vec<f64>,
    base: Vec<f64>,
}

impl Paired {
    /// One unmeasured warm-up of each, then `reps` repetitions, alternating which runs first.
    fn run(reps: usize, mut ours: impl FnMut() -> Duration, mut base: impl FnMut() -> Duration) -> Paired {
        ours();
        base();
        let mut paired = Paired { ours: Vec::new(), base: Vec::new() };
        for rep in 0..reps {
            let (a, b) = if rep % 2 == 0 {
                let a = ours();
                (a, base())
            } else {
                let b = base();
                (ours(), b)
            };
            paired.ours.push(a.as_secs_f64());
            paired.base.push(b.as_secs_f64());
        }
        paired
    }

    fn ratios(&self) -> Spread {
        let ratios: Vec<f64> = self.ours.iter().zip(&self.base).map(|(a, b)| a / b).collect();
        Spread::of(&ratios)
    }

    fn ours(&self) -> Spread {
        Spread::of(&self.ours)
    }

    fn base(&self) -> Spread {
        Spread::of(&self.base)
    }
}

fn reps(default: usize) -> usize {
    std::env::var("PROMPTGEN_BENCH_REPS").ok().and_then(|v| v.parse().ok()).unwrap_or(default).max(1)
}

fn verdict(met: bool) -> &'static str {
    if met { "met" } else { "NOT MET" }
}

fn main() {
    // The bare reqwest client needs a crypto provider: codegen-core's `tls` builds reqwest
    // with rustls and none of its own.
    let _ = rustls::crypto::ring::default_provider().install_default();
    // `cargo bench` passes `--bench`; other words choose groups.
    let words: Vec<String> = std::env::args().skip(1).filter(|a| !a.starts_with('-')).collect();
    let wanted = |group: &str| words.is_empty() || words.iter().any(|w| group.contains(w.as_str()));
    println!("promptgen benchmarks: ratios are median [min .. max] of per-repetition ratios.\n");
    if wanted("build-cold") || wanted("build-warm") {
        build_entry(wanted("build-cold"), wanted("build-warm"));
    }
    if wanted("loop") {
        loop_overhead();
    }
    if wanted("bytes") {
        bytes_to_the_model();
    }
    if wanted("check") {
        check_speed();
    }
    if wanted("cache") {
        cache_pull_and_build();
    }
}

// ------------------------------------------------------------------------------------------
// A generated package: N steps x 20 files x 4 KB, all fresh.
// ------------------------------------------------------------------------------------------

const FILES_PER_STEP: usize = 20;
const FILE_BYTES: usize = 4096;

struct Package {
    _dir: Option<tempfile::TempDir>,
    root: PathBuf,
    chain: Chain,
    layout: Layout,
    steps: usize,
}

impl Package {
    fn store(&self) -> PathBuf {
        self.layout.store().root
    }
}

/// Deterministic text of exactly `FILE_BYTES` bytes, different for every file.
fn file_text(step: usize, file: usize) -> Vec<u8> {
    let mut state = (step as u64) * 1_000_003 + file as u64 + 1;
    let mut text = format!("// step {step}, file {file}: generated for the benchmarks.\n").into_bytes();
    while text.len() < FILE_BYTES {
        let mut line = String::from("// ");
        for _ in 0..60 {
            state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            line.push((b'a' + (state >> 59) as u8 % 26) as char);
        }
        line.push('\n');
        text.extend_from_slice(line.as_bytes());
    }
    text.truncate(FILE_BYTES - 1);
    text.push(b'\n');
    text
}

/// Writes a package whose lock is made with the library's own fingerprints, so its keys are
/// what a real `cargo promptgen` run records; checks that every step is fresh.
fn package(steps: usize) -> Package {
    // PROMPTGEN_BENCH_TMP=/dev/shm measures on tmpfs: the code's own cost, without the disk's.
    let base = std::env::var_os("PROMPTGEN_BENCH_TMP").map_or_else(std::env::temp_dir, PathBuf::from);
    let dir = tempfile::Builder::new().prefix("promptgen-bench-").tempdir_in(base).unwrap();
    let root = dir.path().join("pkg");
    let write = |rel: &str, bytes: &[u8]| {
        let path = root.join(rel);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, bytes).unwrap();
    };
    let mut manifest = format!(
        "[package]\nname = \"bench-{steps}\"\nversion = \"0.1.0\"\nedition = \"2021\"\npublish = false\n\n[workspace]\n\n\
         [package.metadata.promptgen]\nbackend = \"ollama\"\nmodel = \"qwen2.5-coder:7b\"\nseed = 123\ntemperature = 0.0\n\
         system_prompt = \"prompts/system.md\"\n"
    );
    write("prompts/system.md", b"You write Rust files for the benchmarks.\n");
    write("src/main.rs", b"fn main() {}\n");
    for step in 0..steps {
        let id = format!("{step:04}");
        let outputs: Vec<String> = (0..FILES_PER_STEP).map(|f| format!("\"s{id}/f{f:02}.rs\"")).collect();
        manifest.push_str(&format!(
            "\n[[package.metadata.promptgen.steps]]\nid = \"{id}\"\nprompt = \"prompts/{id}.md\"\noutputs = [{}]\n",
            outputs.join(", ")
        ));
        write(&format!("prompts/{id}.md"), format!("Write the {FILES_PER_STEP} files of step {id}.\n").as_bytes());
    }
    write("Cargo.toml", manifest.as_bytes());

    let chain = config::load(&root.join("Cargo.toml"), &Overrides::default(), &|_| None).unwrap();
    let layout = Layout::new(&chain, &root.join("target"));
    let store = layout.store();
    let mut lock = Lock::default();
    let mut previous = None;
    for (n, step) in chain.steps.iter().enumerate() {
        let fingerprint = plan::fingerprint(&chain, step, previous.clone()).unwrap();
        let mut files = Vec::new();
        for f in 0..FILES_PER_STEP {
            let path = format!("s{}/f{f:02}.rs", step.id);
            let bytes = file_text(n, f);
            let real = store.step_dir(&step.id).join(&path);
            std::fs::create_dir_all(real.parent().unwrap()).unwrap();
            std::fs::write(&real, &bytes).unwrap();
            files.push(LockedFile { path, sha256: sha256_hex(&bytes) });
        }
        std::fs::write(store.transcript_path(&step.id), "{\"event\":\"start\"}\n").unwrap();
        let entry = LockedStep {
            id: step.id.clone(),
            key: fingerprint.key(),
            model_calls: 2,
            prompt_tokens: 0,
            completion_tokens: 0,
            repairs: 0,
            check_rounds: 0,
            seed: None,
            fingerprint,
            files,
        };
        previous = Some(entry.handoff_digest());
        lock.steps.push(entry);
    }
    lock.write(&layout.lock_path()).unwrap();
    let report = cargo_promptgen::__private::report::check(&chain, &layout).unwrap();
    assert!(report.is_fresh() && report.unowned.is_empty(), "the generated package is not fresh: {report:?}");
    if std::env::var_os("PROMPTGEN_BENCH_KEEP").is_some() {
        // For looking at (or profiling) the package by hand: it outlives the run.
        println!("   (kept: {})", dir.keep().display());
        return package_at(root, chain, layout, steps);
    }
    Package { _dir: Some(dir), root, chain, layout, steps }
}

fn package_at(root: PathBuf, chain: Chain, layout: Layout, steps: usize) -> Package {
    Package { _dir: None, root, chain, layout, steps }
}

fn build_into(package: &Package, out: &Path) -> cargo_promptgen::BuildReport {
    Builder::new()
        .manifest_dir(&package.root)
        .out_dir(out)
        .target_dir(package.root.join("target"))
        .emit_cargo_directives(false)
        .offline(true)
        .run()
        .unwrap()
}

/// Every file under `dir`, recursively (plain `std::fs`).
fn files_under(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let entry = entry.unwrap();
        if entry.file_type().unwrap().is_dir() {
            files_under(&entry.path(), out);
        } else {
            out.push(entry.path());
        }
    }
}

/// `cp -r from to`, with std.
fn copy_tree(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_tree(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), target).unwrap();
        }
    }
}

/// SHA-256 of every file under `dir`.
fn hash_tree(dir: &Path) -> usize {
    let mut files = Vec::new();
    files_under(dir, &mut files);
    files.iter().map(|f| sha256_hex(&std::fs::read(f).unwrap()).len()).sum()
}

fn build_entry(do_cold: bool, do_warm: bool) {
    println!("== 1. Fresh-lock build entry ({FILES_PER_STEP} files x {} KB per step)", FILE_BYTES / 1024);
    println!("   cold: Builder::run into an empty OUT_DIR  vs  a plain recursive copy of the store (goal <= 3x)");
    println!(
        "   warm: Builder::run again, OUT_DIR unchanged  vs  a plain SHA-256 of every store file (goal <= 1.5x)\n"
    );
    println!(
        "   {:>5}  {:>32}  {:>32}  {:>24}  {:>32}  {:>32}  {:>24}",
        "steps", "cold build", "copy", "cold ratio", "warm build", "hash", "warm ratio"
    );
    let only: Option<Vec<usize>> = std::env::var("PROMPTGEN_BENCH_STEPS")
        .ok()
        .map(|v| v.split(',').filter_map(|n| n.trim().parse().ok()).collect());
    // steps -> (cold, warm) pairs
    let mut results: BTreeMap<usize, (Option<Paired>, Option<Paired>)> = BTreeMap::new();
    for (steps, default_reps) in [(5, 21), (50, 11), (500, 5)] {
        if only.as_ref().is_some_and(|only| !only.contains(&steps)) {
            continue;
        }
        let package = package(steps);
        assert_eq!(package.steps, steps);
        let scratch = package.root.parent().unwrap().to_path_buf();
        let n = std::cell::Cell::new(0);
        let fresh = || {
            n.set(n.get() + 1);
            scratch.join(format!("out-{}", n.get()))
        };
        // Each repetition writes a new folder, and all are removed at the end: creating
        // thousands of files right after removing thousands costs ext4 far more than either
        // side's own work, and would swamp the comparison.
        let cold = do_cold.then(|| {
            let paired = Paired::run(
                reps(default_reps),
                || {
                    let out = fresh();
                    let started = Instant::now();
                    let report = build_into(&package, &out);
                    let elapsed = started.elapsed();
                    assert_eq!(report.files_written, steps * FILES_PER_STEP);
                    elapsed
                },
                || {
                    let out = fresh();
                    let started = Instant::now();
                    copy_tree(&package.store(), &out);
                    started.elapsed()
                },
            );
            for entry in std::fs::read_dir(&scratch).unwrap() {
                let path = entry.unwrap().path();
                if path.file_name().is_some_and(|n| n.to_string_lossy().starts_with("out-")) {
                    std::fs::remove_dir_all(path).unwrap();
                }
            }
            paired
        });
        let warm = do_warm.then(|| {
            let out = scratch.join("warm-out");
            build_into(&package, &out);
            Paired::run(
                reps(default_reps * 2),
                || {
                    let started = Instant::now();
                    let report = build_into(&package, &out);
                    let elapsed = started.elapsed();
                    assert_eq!(report.files_written, 0, "a second build wrote files");
                    elapsed
                },
                || {
                    let started = Instant::now();
                    std::hint::black_box(hash_tree(&package.store()));
                    started.elapsed()
                },
            )
        });
        let show = |p: &Option<Paired>| match p {
            Some(p) => (p.ours().time(), p.base().time(), p.ratios().ratio()),
            None => ("-".into(), "-".into(), "-".into()),
        };
        let (cb, cc, cr) = show(&cold);
        let (wb, wh, wr) = show(&warm);
        println!("   {steps:>5}  {cb:>32}  {cc:>32}  {cr:>24}  {wb:>32}  {wh:>32}  {wr:>24}");
        results.insert(steps, (cold, warm));
    }
    println!();
    for (steps, (cold, warm)) in &results {
        let goal = |p: &Option<Paired>, limit: f64| p.as_ref().map_or("-", |p| verdict(p.ratios().median <= limit));
        println!("   {steps:>5} steps: cold <= 3x {}, warm <= 1.5x {}", goal(cold, 3.0), goal(warm, 1.5));
    }
    if results.len() == 3 {
        println!("\n   growth: per-step cost (median time / steps), and its ratio to the 5-step and 50-step figures");
        for (name, pick) in [("cold", 0), ("warm", 1)] {
            let per_step: Vec<(usize, f64)> = results
                .iter()
                .filter_map(|(steps, pair)| {
                    let p = if pick == 0 { &pair.0 } else { &pair.1 };
                    p.as_ref().map(|p| (*steps, p.ours().median / *steps as f64))
                })
                .collect();
            if per_step.len() < 3 {
                continue;
            }
            let cells: Vec<String> =
                per_step.iter().map(|(steps, cost)| format!("{steps} steps {}/step", secs(*cost))).collect();
            let growth = per_step[2].1 / per_step[1].1;
            println!(
                "   {name}: {}; 50/5 {:.2}x, 500/50 {:.2}x -> linear (500/50 <= 1.5x): {}",
                cells.join(", "),
                per_step[1].1 / per_step[0].1,
                growth,
                verdict(growth <= 1.5)
            );
        }
    }
    println!();
}

// ------------------------------------------------------------------------------------------
// 2. Loop overhead per model call.
// ------------------------------------------------------------------------------------------

const ROUNDS: usize = 20;

fn loop_overhead() {
    println!(
        "== 2. Loop overhead per model call ({ROUNDS} tool rounds + finish, ~100 KB history, fake server replying at once)"
    );
    println!(
        "   ours: codegen_core::Step::run  vs  bare reqwest::blocking round trips with the same request bytes (goal <= 1.5x);\n   streamed: the fake server streams each reply in pieces of 4 characters, and the bare client reads the same body\n"
    );
    let dir = tempfile::tempdir().unwrap();
    let docs = dir.path().join("docs");
    std::fs::create_dir_all(&docs).unwrap();
    for i in 0..ROUNDS {
        std::fs::write(docs.join(format!("{i:02}.md")), &file_text(i, 0)[..1024]).unwrap();
    }
    // A ~100 KB prompt: every request carries it, and the 20 reads add ~20 KB more.
    let mut prompt = String::from("Read every file under docs/, then finish. The background follows.\n\n");
    let mut n = 0;
    while prompt.len() < 100 * 1024 {
        prompt.push_str(&String::from_utf8(file_text(1000 + n, 1)).unwrap());
        n += 1;
    }
    let mut script: Vec<Reply> = (0..ROUNDS)
        .map(|i| Reply::turn(Turn::call("read_file", json!({ "path": format!("docs/{i:02}.md") }))))
        .collect();
    script.push(Reply::turn(Turn::call("finish", json!({ "summary": "Read them all." }))));
    let calls = script.len();

    for (kind, stream) in [
        (BackendKind::Ollama, true),
        (BackendKind::OpenAi, true),
        (BackendKind::Ollama, false),
        (BackendKind::OpenAi, false),
    ] {
        let recorded: std::cell::RefCell<Vec<(String, Vec<u8>)>> = Default::default();
        let history_bytes = std::cell::Cell::new(0);
        let paired = Paired::run(
            reps(15),
            || {
                let server = FakeLlm::start(script.clone());
                let mut config = BackendConfig::new(kind);
                config.base_url = Some(match kind {
                    BackendKind::OpenAi => format!("{}/v1", server.url()),
                    _ => server.url(),
                });
                config.api_key = Some("bench".into());
                config.stream = stream;
                let mut backend = config.open().unwrap();
                let out = dir.path().join("out");
                let mut sandbox = Sandbox::builder(&out).input("docs", &docs).build().unwrap();
                let mut step = codegen_core::Step::new("bench-model", prompt.clone());
                step.max_model_calls(calls as u32 + 1);
                let started = Instant::now();
                let output = step.run(backend.as_mut(), &mut sandbox).unwrap();
                let elapsed = started.elapsed();
                assert_eq!(output.end, EndOutcome::Finished);
                let requests = server.requests();
                assert_eq!(requests.len(), calls);
                history_bytes.set(requests.last().unwrap().body.len());
                *recorded.borrow_mut() = requests.into_iter().map(|r| (r.path, r.body.into_bytes())).collect();
                elapsed / calls as u32
            },
            || {
                let server = FakeLlm::start(script.clone());
                let client = reqwest::blocking::Client::builder()
                    .connect_timeout(Duration::from_secs(5))
                    .timeout(Duration::from_secs(600))
                    .build()
                    .unwrap();
                let bodies: Vec<(String, Vec<u8>)> = recorded
                    .borrow()
                    .iter()
                    .map(|(path, body)| (format!("{}{path}", server.url()), body.clone()))
                    .collect();
                let started = Instant::now();
                for (url, body) in bodies {
                    let mut request =
                        client.post(&url).header(reqwest::header::CONTENT_TYPE, "application/json").body(body);
                    if kind == BackendKind::OpenAi {
                        request = request.bearer_auth("bench");
                    }
                    let response = request.send().unwrap();
                    assert!(response.status().is_success());
                    std::hint::black_box(response.text().unwrap());
                }
                started.elapsed() / calls as u32
            },
        );
        println!(
            "   {:<7} {:<8} last request {:>4} KB: ours {} per call, bare {} per call -> {}  goal {}",
            kind.as_str(),
            if stream { "streamed" } else { "whole" },
            history_bytes.get() / 1024,
            paired.ours().time(),
            paired.base().time(),
            paired.ratios().ratio(),
            verdict(paired.ratios().median <= 1.5)
        );
    }
    println!();
}

// ------------------------------------------------------------------------------------------
// 3. Bytes to the model for the example chain.
// ------------------------------------------------------------------------------------------

/// What one model call carried.
#[derive(Debug, Default, Clone)]
struct CallBytes {
    /// Prompt bytes: every message's text, and every tool call's name and arguments as JSON.
    sent: usize,
    /// The same, with each file's content counted once (its latest occurrence).
    minimum: usize,
    /// The tool definitions sent with the call (as JSON).
    tools: usize,
}

/// Counts what each request carries, then lets the inner backend answer; with `as_text`,
/// turns the inner backend's native tool calls into `<tool_call>` JSON in the reply's text,
/// as qwen2.5-coder writes them under the `native` protocol.
struct Counting {
    inner: Box<dyn Backend>,
    as_text: bool,
    /// Every version of every file the conversation can carry: the tree before the step,
    /// and each `write_file` content of the replies.
    versions: Vec<(String, String)>,
    calls: Vec<CallBytes>,
}

impl Backend for Counting {
    fn kind(&self) -> BackendKind {
        self.inner.kind()
    }

    fn location(&self) -> String {
        self.inner.location()
    }

    fn chat(&mut self, request: &ChatRequest<'_>) -> Result<ChatResponse, BackendError> {
        let (sent, minimum) = prompt_bytes(request.messages, &self.versions);
        let tools = serde_json::to_string(request.tools).unwrap().len();
        self.calls.push(CallBytes { sent, minimum, tools });
        let mut response = self.inner.chat(request)?;
        for call in &response.message.tool_calls {
            if let (Arguments::Object(map), "write_file") = (&call.arguments, call.name.as_str())
                && let (Some(path), Some(content)) =
                    (map.get("path").and_then(|p| p.as_str()), map.get("content").and_then(|c| c.as_str()))
            {
                self.versions.push((path.to_string(), content.to_string()));
            }
        }
        if self.as_text && !response.message.tool_calls.is_empty() {
            let mut text = response.message.content.clone();
            for call in std::mem::take(&mut response.message.tool_calls) {
                let arguments = serde_json::from_str::<serde_json::Value>(&call.arguments.to_json_text()).unwrap();
                let json = json!({ "name": call.name, "arguments": arguments });
                text.push_str(&format!("\n<tool_call>\n{json}\n</tool_call>"));
            }
            response.message.content = text.trim_start().to_string();
        }
        Ok(response)
    }
}

/// The prompt bytes of a history and their minimum. `sent` counts every message's text and
/// every tool call's name and arguments (as JSON). A *file occurrence* is a place where a
/// known version of a file appears in one message, raw (a `read_file` result) or
/// JSON-escaped (a `write_file` call's `content`, natively or written as text); the minimum
/// keeps, for each path, only its last occurrence: every earlier copy, of the same content
/// or of a version since replaced, is waste.
fn prompt_bytes(messages: &[Message], versions: &[(String, String)]) -> (usize, usize) {
    let mut sent = 0;
    // path -> sizes of its occurrences, in order
    let mut occurrences: BTreeMap<&str, Vec<usize>> = BTreeMap::new();
    for message in messages {
        let mut text = message.content.clone();
        for call in &message.tool_calls {
            text.push_str(&call.name);
            text.push_str(&call.arguments.to_json_text());
        }
        sent += text.len();
        for (path, content) in versions.iter().filter(|(_, content)| content.len() >= 64) {
            let escaped = serde_json::to_string(content).unwrap();
            let escaped = &escaped[1..escaped.len() - 1];
            for form in [content.as_str(), escaped] {
                let found = text.matches(form).count();
                occurrences.entry(path).or_default().extend(std::iter::repeat_n(form.len(), found));
                if found > 0 {
                    break;
                }
            }
        }
    }
    let waste: usize =
        occurrences.values().map(|sizes| sizes.iter().sum::<usize>() - sizes.last().copied().unwrap_or(0)).sum();
    (sent, sent - waste)
}

fn bytes_to_the_model() {
    println!(
        "== 3. Bytes to the model: the example chain replayed from prompts/scripts through the real loop and check"
    );
    println!(
        "   sent = message texts + tool-call names and arguments; minimum = the same with each file's content once"
    );
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR")).join("../example-app/Cargo.toml");
    let chain = config::load(&manifest, &Overrides::default(), &|_| None).unwrap();
    let target = tempfile::tempdir().unwrap();
    let layout = Layout::new(&chain, target.path());
    let records = Records::read(&layout).unwrap();
    let assessed = plan::plan(&chain, &records).unwrap();
    for as_text in [false, true] {
        println!(
            "\n   {}",
            if as_text {
                "the same turns with every tool call written as <tool_call> JSON text (as qwen2.5-coder does under `native`)"
            } else {
                "native tool calls, as recorded"
            }
        );
        println!(
            "   {:<5} {:>5} {:>10} {:>10} {:>7} {:>12}   per call (sent/minimum)",
            "step", "calls", "sent", "minimum", "ratio", "tool defs"
        );
        let mut tree = Files::new();
        let (mut all_sent, mut all_minimum, mut all_tools) = (0, 0, 0);
        let records = plan::Records::read(&layout).unwrap();
        let all_recorded = cargo_promptgen::__private::generate::recorded_files(&chain, &records);
        for (index, (step, recorded)) in chain.steps.iter().zip(&assessed).enumerate() {
            let work = tempfile::tempdir().unwrap();
            let root = work.path().join("tree");
            cargo_promptgen::__private::out_dir::sync_dir(&root, &tree).unwrap();
            let mut builder = Sandbox::builder(&root);
            for input in &step.inputs {
                builder = builder.input(input.virtual_path.clone(), input.real_path.clone());
            }
            let mut sandbox = builder.build().unwrap();
            let versions = tree.iter().map(|(p, b)| (p.clone(), String::from_utf8(b.clone()).unwrap())).collect();
            let inner = chain.backend_config(step).open().unwrap();
            let mut backend = Counting { inner, as_text, versions, calls: Vec::new() };
            let mut core = codegen_core::Step::new(step.model.clone(), std::fs::read_to_string(&step.prompt).unwrap());
            core.max_model_calls(step.max_model_calls).protocol(step.protocol).check_rounds(step.check_rounds);
            if let Some(path) = &step.system_prompt {
                core.system_prompt(std::fs::read_to_string(path).unwrap());
            }
            if let Some(seed) = step.seed {
                core.seed(seed);
            }
            if let Some(t) = step.temperature {
                core.temperature(t);
            }
            for output in &step.outputs {
                core.expect_output(output.clone());
            }
            let (mounted, later) = cargo_promptgen::__private::generate::the_rest_of_the_chain(&chain, index, &all_recorded);
            let mut check = cargo_promptgen::__private::check::check_for(cargo_promptgen::__private::check::CheckSetup {
                chain: &chain,
                layout: &layout,
                step,
                scratch: work.path().join("check"),
                cancel: codegen_core::Cancel::new(),
                mounted,
                later,
            });
            let output = match check.as_mut() {
                Some(check) => core.run_checked(&mut backend, &mut sandbox, check.as_mut(), &mut |_| {}),
                None => core.run(&mut backend, &mut sandbox),
            }
            .unwrap();
            // The replay wrote what the lock records.
            for path in &output.written {
                let bytes = std::fs::read(root.join(path)).unwrap();
                assert_eq!(Some(&bytes), recorded.files.get(path), "step {} wrote another {path}", step.id);
            }
            tree.extend(recorded.files.clone());
            let sent: usize = backend.calls.iter().map(|c| c.sent).sum();
            let minimum: usize = backend.calls.iter().map(|c| c.minimum).sum();
            let tools: usize = backend.calls.iter().map(|c| c.tools).sum();
            let per_call: Vec<String> = backend.calls.iter().map(|c| format!("{}/{}", c.sent, c.minimum)).collect();
            println!(
                "   {:<5} {:>5} {:>10} {:>10} {:>6.3}x {:>12}   {}",
                step.id,
                backend.calls.len(),
                sent,
                minimum,
                sent as f64 / minimum as f64,
                tools,
                per_call.join(" ")
            );
            all_sent += sent;
            all_minimum += minimum;
            all_tools += tools;
        }
        println!(
            "   {:<5} {:>5} {:>10} {:>10} {:>6.3}x {:>12}",
            "all",
            "",
            all_sent,
            all_minimum,
            all_sent as f64 / all_minimum as f64,
            all_tools
        );
    }
    println!();
}

// ------------------------------------------------------------------------------------------
// 5. Check speed.
// ------------------------------------------------------------------------------------------

fn check_speed() {
    println!(
        "== 5. `cargo promptgen check` on 500 steps (the real binary)  vs  `cargo metadata --no-deps` alone (goal < 1 s)\n"
    );
    let package = package(500);
    let manifest = package.root.join("Cargo.toml");
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let timed = |command: &mut Command| {
        let started = Instant::now();
        let output = command.output().unwrap();
        let elapsed = started.elapsed();
        assert!(output.status.success(), "{command:?}: {}", String::from_utf8_lossy(&output.stderr));
        elapsed
    };
    let paired = Paired::run(
        reps(9),
        || {
            timed(
                Command::new(env!("CARGO_BIN_EXE_cargo-promptgen"))
                    .args(["promptgen", "check", "--manifest-path"])
                    .arg(&manifest)
                    .env("CARGO", &cargo),
            )
        },
        || {
            timed(
                Command::new(&cargo)
                    .args(["metadata", "--format-version", "1", "--no-deps", "--offline", "--manifest-path"])
                    .arg(&manifest),
            )
        },
    );
    let check = paired.ours();
    println!(
        "   check {}  cargo metadata {}  ratio {}  -> check without cargo metadata ~{}",
        check.time(),
        paired.base().time(),
        paired.ratios().ratio(),
        secs(check.median - paired.base().median)
    );
    println!("   goal < 1 s: {} (median {})", verdict(check.median < 1.0), secs(check.median));
    let records = Records::read(&package.layout).unwrap();
    assert_eq!(records.lock.steps.len(), package.chain.steps.len());
    println!();
}

// ------------------------------------------------------------------------------------------
// 6. The cache: pull from S3, then build, against the repo store's build.
// ------------------------------------------------------------------------------------------

fn cache_pull_and_build() {
    use cargo_promptgen::__private::cache::{Cache, CacheUrl};
    use cargo_promptgen::__private::remote::Remote;
    use cargo_promptgen::__private::sync;

    const STEPS: usize = 50;
    println!(
        "== 6. store = \"cache\", {STEPS} steps x {FILES_PER_STEP} files x {} KB: `pull` from a loopback S3 server into an \
         empty cache, then the build into an empty OUT_DIR  vs  the same build from the repo store\n",
        FILE_BYTES / 1024
    );
    let var = |name: &str| std::env::var(name).ok();
    let (Some(endpoint), Some(bucket), Some(key_id), Some(secret)) = (
        var("PROMPTGEN_S3_ENDPOINT"),
        var("PROMPTGEN_S3_BUCKET"),
        var("PROMPTGEN_S3_KEY_ID"),
        var("PROMPTGEN_S3_SECRET"),
    ) else {
        println!("   skipped: no S3 server (run `bash scripts/s3-cache.sh bench`)\n");
        return;
    };
    let repo = package(STEPS);
    // The cache-mode twin: the same manifest with `store = "cache"` and a cache_url, the same
    // lock, no promptgen/ folder.
    let twin_dir = tempfile::Builder::new().prefix("promptgen-bench-cache-").tempdir().unwrap();
    let twin = twin_dir.path().join("pkg");
    copy_tree(&repo.root.join("prompts"), &twin.join("prompts"));
    copy_tree(&repo.root.join("src"), &twin.join("src"));
    std::fs::copy(repo.layout.lock_path(), twin.join("promptgen.lock")).unwrap();
    let prefix = format!("bench-{}", std::process::id());
    let url = format!("s3://{bucket}/{prefix}");
    let manifest = std::fs::read_to_string(repo.root.join("Cargo.toml")).unwrap();
    let manifest = config::with_store(&manifest, config::StoreMode::Cache).unwrap();
    let manifest = manifest.replace("store = \"cache\"\n", &format!("store = \"cache\"\ncache_url = \"{url}\"\n"));
    std::fs::write(twin.join("Cargo.toml"), manifest).unwrap();
    let cache_dir = twin_dir.path().join("cache");
    // SAFETY: set once, before this group starts any thread; the build entry reads it.
    unsafe { std::env::set_var("PROMPTGEN_CACHE_DIR", &cache_dir) };

    // Upload the files once, through the library's own push.
    let env = |name: &str| match name {
        "AWS_ENDPOINT_URL" => Some(endpoint.clone()),
        "AWS_ACCESS_KEY_ID" => Some(key_id.clone()),
        "AWS_SECRET_ACCESS_KEY" => Some(secret.clone()),
        "AWS_REGION" => Some("us-east-1".to_string()),
        "AWS_CONFIG_FILE" | "AWS_SHARED_CREDENTIALS_FILE" => Some("/nonexistent/aws".to_string()),
        _ => None,
    };
    let remote = Remote::open(&CacheUrl::parse(&url).unwrap(), &env).unwrap();
    let lock = Lock::read(&repo.layout.lock_path()).unwrap();
    let cache = Cache::new(&cache_dir);
    for entry in &lock.steps {
        for (path, bytes) in repo.layout.store().load(entry).unwrap() {
            let sha = &entry.files.iter().find(|f| f.path == path).unwrap().sha256;
            cache.put(sha, &bytes).unwrap();
        }
    }
    let pushed = sync::push(&lock, &cache, &remote, "bench").unwrap();
    assert_eq!(pushed.objects, STEPS * FILES_PER_STEP);

    let outs = tempfile::tempdir().unwrap();
    let made = std::cell::Cell::new(0);
    let fresh_out = || {
        made.set(made.get() + 1);
        outs.path().join(format!("out-{}", made.get()))
    };
    let twin_package = package_at(twin.clone(), repo.chain.clone(), repo.layout.clone(), STEPS);
    let mut pulls = Vec::new();
    let mut builds = Vec::new();
    let paired = Paired::run(
        reps(7),
        || {
            std::fs::remove_dir_all(&cache_dir).unwrap();
            let started = Instant::now();
            let pulled = sync::pull(&lock, &cache, &remote, "bench").unwrap();
            let pulled_at = started.elapsed();
            assert_eq!(pulled.moved, STEPS * FILES_PER_STEP);
            let report = build_into(&twin_package, &fresh_out());
            let total = started.elapsed();
            assert_eq!(report.files_written, STEPS * FILES_PER_STEP);
            pulls.push(pulled_at.as_secs_f64());
            builds.push((total - pulled_at).as_secs_f64());
            total
        },
        || {
            let started = Instant::now();
            let report = build_into(&repo, &fresh_out());
            let elapsed = started.elapsed();
            assert_eq!(report.files_written, STEPS * FILES_PER_STEP);
            elapsed
        },
    );
    // The warm-up's pull and build are not part of the figures.
    let (pulls, builds) = (&pulls[1..], &builds[1..]);
    let base = &paired.base;
    let build_ratio: Vec<f64> = builds.iter().zip(base).map(|(b, r)| b / r).collect();
    println!("   pull + build from the cache {}", paired.ours().time());
    println!("     of which pull           {}", Spread::of(pulls).time());
    println!("     of which build          {}", Spread::of(builds).time());
    println!("   build from the repo store   {}", paired.base().time());
    println!("   ratio (pull + build) / repo build   {}", paired.ratios().ratio());
    println!("   ratio build from cache / repo build {}\n", Spread::of(&build_ratio).ratio());
}
