//! `cargo promptgen`: run, check, inspect and accept a package's prompt chain.
//!
//! Exit codes: 0 success, 1 failure or stale steps, 2 usage error, 130 interrupted (Ctrl-C).

mod eval;
mod highlight;
mod history;
mod html;
mod interrupt;
mod live;
mod log;
mod review;

mod graph;
mod outcome;
mod workspace;

use std::io::Write;
use std::num::NonZeroU32;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;

use anyhow::{Context, bail};
use cargo_promptgen::__private::Layout;
use cargo_promptgen::__private::Lock;
use cargo_promptgen::__private::Lookup;
use cargo_promptgen::__private::ProcessLock;
use cargo_promptgen::__private::UnknownStep;
use cargo_promptgen::__private::eval::EvalError;
use cargo_promptgen::__private::remote::{self as sync, Remote, RemoteError, SyncError, Transfer};
use cargo_promptgen::__private::review as report;
use cargo_promptgen::__private::{self as internals, Chain, Overrides, StoreMode};
use cargo_promptgen::__private::{Destination, Schedule, discard_pending};
use cargo_promptgen::Error;
use clap::{ArgAction, Args, Parser, Subcommand, ValueEnum};
use live::{Live, Verbosity};

/// Prompt chains declared in Cargo metadata, recorded in promptgen.lock.
#[derive(Parser, Debug)]
#[command(
    name = "cargo promptgen",
    bin_name = "cargo promptgen",
    version,
    about,
    args_conflicts_with_subcommands = true
)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    /// Options of `run`, which is what `cargo promptgen` alone does.
    #[command(flatten)]
    run: RunArgs,
    #[command(flatten)]
    output: Output,
}

/// How much to print, and in colour or not: cargo's own options, and as in cargo, its
/// `CARGO_TERM_QUIET`, `CARGO_TERM_VERBOSE` and `CARGO_TERM_COLOR` when no flag says.
#[derive(Args, Debug, Clone, Copy)]
struct Output {
    /// Print nothing but errors.
    #[arg(short, long, global = true, conflicts_with = "verbose")]
    quiet: bool,
    /// Also print each tool call and check.
    #[arg(short, long, global = true, action = ArgAction::Count)]
    verbose: u8,
    /// Colour: auto (on a terminal, the default), always, never.
    #[arg(long, value_enum, value_name = "WHEN", global = true)]
    color: Option<ColorArg>,
}

impl Output {
    fn verbosity(&self) -> Verbosity {
        let set = |name: &str| std::env::var(name).is_ok_and(|value| value == "true");
        match (self.quiet, self.verbose) {
            (true, _) => Verbosity::Quiet,
            (false, 0) if set("CARGO_TERM_QUIET") => Verbosity::Quiet,
            (false, 0) if set("CARGO_TERM_VERBOSE") => Verbosity::Verbose,
            (false, 0) => Verbosity::Normal,
            (false, _) => Verbosity::Verbose,
        }
    }

    fn color(&self) -> ColorArg {
        self.color.unwrap_or_else(|| match std::env::var("CARGO_TERM_COLOR").as_deref() {
            Ok("always") => ColorArg::Always,
            Ok("never") => ColorArg::Never,
            _ => ColorArg::Auto,
        })
    }
}

/// `--color`.
#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
enum ColorArg {
    Auto,
    Always,
    Never,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Regenerate stale steps (or the ones named) and record them in the lock and store.
    Run(RunArgs),
    /// Exit 0 when every step is fresh in the lock, 1 otherwise; never calls a model.
    Check(Packages),
    /// A table of the steps: fresh or stale, what they run after, files, model, calls, tokens.
    Status(Packages),
    /// The chain as a Mermaid flowchart (or Graphviz with --format dot): each step with its
    /// state and outputs.
    Graph(graph::GraphArgs),
    /// How reliable each step is, per model: trials over seeds in throwaway copies, with the
    /// step's check and tests; a table, records under target/promptgen/eval/, and exit 1
    /// when a step falls below its min_pass_rate. Never touches the lock or the store.
    Eval(Box<eval::EvalArgs>),
    /// Record the results that builds left in the pending area, without calling a model.
    Accept(Selection),
    /// Unified diff from the recorded outputs to the pending ones.
    Diff {
        #[command(flatten)]
        selection: Selection,
        /// Only this step.
        #[arg(long, value_name = "ID")]
        step: Option<String>,
    },
    /// A step's conversation (or every step's): messages, tool calls, refusals, checks, tokens
    /// and timings; recorded, pending, failed or interrupted.
    Log(LogArgs),
    /// Show each pending result's diff and ask: accept, reject, skip or quit.
    Review(Selection),
    /// Upload to the cache's remote (`cache_url`) the files promptgen.lock names that it lacks.
    Push(Selection),
    /// Download into the local cache the files promptgen.lock names that it lacks.
    Pull(Selection),
    /// Move the recorded files between promptgen/ and the cache, and set `store` in Cargo.toml.
    Store {
        #[command(flatten)]
        selection: Selection,
        /// Where the files go: `cache` (the content-addressed cache) or `repo` (promptgen/).
        #[arg(long, value_enum, value_name = "STORE")]
        to: StoreArg,
    },
}

/// `log`.
#[derive(Args, Debug, Clone)]
struct LogArgs {
    #[command(flatten)]
    selection: Selection,
    /// The step (default: every step, in order).
    #[arg(value_name = "STEP")]
    step: Option<String>,
    /// Which transcript (default: the newest kept).
    #[arg(long, value_enum, value_name = "KIND")]
    show: Option<history::Kind>,
    /// Show long texts whole instead of their first lines.
    #[arg(long)]
    full: bool,
    /// Write one self-contained HTML page of the chain to FILE instead.
    #[arg(long, value_name = "FILE")]
    html: Option<PathBuf>,
    /// Show the trials of this `eval` run instead (STEP then names a step or one trial).
    #[arg(long, value_name = "RUN", conflicts_with = "show")]
    eval: Option<String>,
}

/// `store --to`.
#[derive(ValueEnum, Debug, Clone, Copy)]
enum StoreArg {
    /// The content-addressed cache (store = "cache").
    Cache,
    /// The package's promptgen/ folder (store = "repo").
    Repo,
}

#[derive(Args, Debug, Default, Clone)]
struct Selection {
    /// Path to the package's Cargo.toml.
    #[arg(long, value_name = "PATH", global = true)]
    manifest_path: Option<PathBuf>,
    /// The package to work on (default: the one in the current directory).
    #[arg(short = 'p', long, value_name = "SPEC", global = true)]
    package: Option<String>,
}

/// A package, or with `--workspace` every member with a chain.
#[derive(Args, Debug, Default, Clone)]
struct Packages {
    #[command(flatten)]
    selection: Selection,
    #[command(flatten)]
    members: workspace::Members,
}

#[derive(Args, Debug, Default, Clone)]
struct RunArgs {
    #[command(flatten)]
    selection: Selection,
    #[command(flatten)]
    members: workspace::Members,
    /// Run up to N ready steps at once (beats PROMPTGEN_JOBS and `jobs`; default 1).
    #[arg(short = 'j', long, value_name = "N")]
    jobs: Option<NonZeroU32>,
    /// Regenerate this step even if it is fresh (repeatable), and the stale steps it runs after; the steps after it are left stale.
    #[arg(long = "step", value_name = "ID", conflicts_with = "workspace")]
    steps: Vec<String>,
    /// Regenerate every step.
    #[arg(long)]
    force: bool,
    /// Run the steps that run from nothing, as `regenerate = "fresh"` does: every output written anew, not edited from the recorded files.
    #[arg(long)]
    fresh: bool,
    /// Call no model: fail if any step is stale.
    #[arg(long)]
    offline: bool,
    /// With store = "cache" and a cache_url: do not upload the results to the remote.
    #[arg(long)]
    no_push: bool,
    /// Backend for this run (beats PROMPTGEN_BACKEND and the metadata).
    #[arg(long, value_name = "NAME")]
    backend: Option<String>,
    /// Model for this run (beats PROMPTGEN_MODEL and the metadata).
    #[arg(long, value_name = "NAME")]
    model: Option<String>,
    /// Server URL for this run (beats PROMPTGEN_BASE_URL and the metadata).
    #[arg(long, value_name = "URL")]
    base_url: Option<String>,
}

fn main() -> ExitCode {
    // Cargo runs `cargo-promptgen promptgen <args>`; run by hand, the word is absent.
    let mut args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("promptgen") {
        args.remove(1);
    }
    let cli = match Cli::try_parse_from(args) {
        Ok(cli) => cli,
        Err(err) => {
            let _ = err.print();
            return ExitCode::from(if err.use_stderr() { 2 } else { 0 });
        }
    };
    match dispatch(cli) {
        Ok(code) => code,
        Err(err) => {
            eprintln!("error: {}", cargo_promptgen::__private::report(err.as_ref()));
            ExitCode::from(exit_code(&err))
        }
    }
}

/// A command line that asks for what cannot be (a package or step that is not there, flags
/// that contradict each other): exit code 2, before anything runs.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
struct UsageError(String);

/// The exit code of a failed command: 130 (128 + SIGINT, as a shell reports a process that
/// Ctrl-C ended) when it was interrupted, 2 for a usage error, else 1.
fn exit_code(err: &anyhow::Error) -> u8 {
    let usage = err.chain().any(|cause| {
        cause.is::<UsageError>()
            || cause.is::<UnknownStep>()
            || matches!(cause.downcast_ref::<EvalError>(), Some(EvalError::UnknownStep(_)))
    });
    match err.downcast_ref::<Error>() {
        Some(Error::Interrupted { .. }) => 130,
        _ if usage => 2,
        _ => 1,
    }
}

fn dispatch(cli: Cli) -> anyhow::Result<ExitCode> {
    let output = cli.output;
    match cli.command {
        None => run(cli.run, output),
        Some(Command::Run(args)) => run(args, output),
        Some(Command::Check(packages)) if packages.members.workspace => {
            workspace::each(&packages.selection, &packages.members, &["check".into()])
        }
        Some(Command::Check(packages)) => check(&packages.selection),
        Some(Command::Status(packages)) if packages.members.workspace => {
            workspace::each(&packages.selection, &packages.members, &["status".into()])
        }
        Some(Command::Status(packages)) => status(&packages.selection),
        Some(Command::Graph(args)) => graph::graph(&args),
        Some(Command::Eval(args)) => eval::eval(&args, output),
        Some(Command::Accept(selection)) => accept(&selection),
        Some(Command::Diff { selection, step }) => diff(&selection, step.as_deref()),
        Some(Command::Log(args)) => show_log(&args, output),
        Some(Command::Review(selection)) => {
            let Package { chain, layout } = open(&selection, &Overrides::default())?;
            let _guard = ProcessLock::acquire(&layout)?;
            review::review(&chain, &layout, &mut colored(std::io::stdout(), output.color()))
        }
        Some(Command::Push(selection)) => push(&selection),
        Some(Command::Pull(selection)) => pull(&selection),
        Some(Command::Store { selection, to }) => store(&selection, to),
    }
}

struct Package {
    chain: Chain,
    layout: Layout,
}

fn open(selection: &Selection, overrides: &Overrides) -> anyhow::Result<Package> {
    let metadata = cargo_metadata(selection.manifest_path.as_deref())?;
    let manifest = select_package(&metadata, selection)?;
    open_manifest(&metadata, &manifest, overrides)
}

/// The package of `manifest`, a member of the workspace `metadata` describes.
fn open_manifest(
    metadata: &cargo_metadata::Metadata,
    manifest: &Path,
    overrides: &Overrides,
) -> anyhow::Result<Package> {
    // cargo knows the workspace this package belongs to; internals::load need not guess.
    let overrides = Overrides { workspace_root: Some(metadata.workspace_root.clone().into()), ..overrides.clone() };
    let chain = internals::load_from_env(manifest, &overrides)?;
    let layout = Layout::new(&chain, metadata.target_directory.as_std_path());
    Ok(Package { chain, layout })
}

/// `cargo metadata` of the workspace, without dependencies and without the network.
fn cargo_metadata(manifest_path: Option<&Path>) -> anyhow::Result<cargo_metadata::Metadata> {
    let mut command = cargo_metadata::MetadataCommand::new();
    command.no_deps().other_options(vec!["--offline".to_string()]);
    if let Some(path) = manifest_path {
        command.manifest_path(path);
    }
    command.exec().context("`cargo metadata` could not describe the workspace")
}

/// The manifest of the package to work on: `-p NAME[@VERSION]`, else `--manifest-path`, else
/// the package whose folder holds the current directory, else the only package with a chain.
fn select_package(metadata: &cargo_metadata::Metadata, selection: &Selection) -> anyhow::Result<PathBuf> {
    let members: Vec<&cargo_metadata::Package> = metadata.workspace_packages();
    let manifest = |package: &cargo_metadata::Package| package.manifest_path.clone().into_std_path_buf();
    if let Some(spec) = &selection.package {
        let (name, version) = match spec.split_once('@') {
            Some((name, version)) => (name, Some(version)),
            None => (spec.as_str(), None),
        };
        let found =
            members.iter().find(|p| p.name.as_str() == name && version.is_none_or(|v| p.version.to_string() == v));
        return found.map(|p| manifest(p)).ok_or_else(|| {
            let names: Vec<String> = members.iter().map(|p| format!("{}@{}", p.name, p.version)).collect();
            UsageError(format!("no package `{spec}` in this workspace; its packages are: {}", names.join(", "))).into()
        });
    }
    if let Some(path) = &selection.manifest_path {
        let wanted = std::fs::canonicalize(path).unwrap_or_else(|_| path.clone());
        if let Some(package) = members.iter().find(|p| manifest(p) == wanted) {
            return Ok(manifest(package));
        }
    }
    let cwd = std::env::current_dir().context("cannot read the current directory")?;
    let nearest = members
        .iter()
        .filter(|p| p.manifest_path.parent().is_some_and(|dir| cwd.starts_with(dir)))
        .max_by_key(|p| p.manifest_path.as_str().len());
    if let Some(package) = nearest {
        return Ok(manifest(package));
    }
    let with_chain: Vec<&&cargo_metadata::Package> =
        members.iter().filter(|p| p.metadata.get("promptgen").is_some_and(|v| v.is_object())).collect();
    match with_chain.as_slice() {
        [package] => Ok(manifest(package)),
        [] => bail!("no package in this workspace declares [package.metadata.promptgen]"),
        many => {
            let names: Vec<&str> = many.iter().map(|p| p.name.as_str()).collect();
            Err(UsageError(format!(
                "several packages declare a prompt chain ({}); choose one with -p",
                names.join(", ")
            ))
            .into())
        }
    }
}

fn run(args: RunArgs, output: Output) -> anyhow::Result<ExitCode> {
    if args.members.workspace {
        return workspace::each(&args.selection, &args.members, &workspace::run_args(&args));
    }
    let quiet = output.verbosity() == Verbosity::Quiet;
    let overrides = Overrides {
        backend: args.backend.clone(),
        model: args.model.clone(),
        base_url: args.base_url.clone(),
        jobs: args.jobs,
        ..Overrides::default()
    };
    let Package { mut chain, layout } = open(&args.selection, &overrides)?;
    for id in &args.steps {
        chain.require_step(id)?;
    }
    if args.fresh {
        for step in &mut chain.steps {
            step.regenerate = cargo_promptgen::__private::Regenerate::Fresh;
        }
    }
    // `--step ID` runs those steps (and the stale steps they run after), never the steps after
    // them; `--force` runs every step.
    let only = (!args.force && !args.steps.is_empty()).then(|| args.steps.clone());
    let forced: Vec<String> = if args.force { chain.steps.iter().map(|s| s.id.clone()).collect() } else { args.steps };
    let _guard = ProcessLock::acquire(&layout)?;
    if args.offline {
        let report = report::check(&chain, &layout)?;
        if !report.stale.is_empty() || !forced.is_empty() {
            let steps = if forced.is_empty() { report.stale } else { Vec::new() };
            if steps.is_empty() {
                return Err(UsageError("--offline forbids model calls, and --step/--force ask for them".into()).into());
            }
            return Err(cargo_promptgen::Error::Stale {
                package: chain.package_name.clone(),
                steps,
                reason: "--offline forbids model calls".into(),
            }
            .into());
        }
        if !quiet {
            eprintln!("All {} steps of {} are fresh.", chain.steps.len(), chain.package_name);
        }
        return Ok(ExitCode::SUCCESS);
    }
    // With a remote: fetch what the lock names and this machine lacks, so it is not made
    // again, and check that the remote answers before any model is called.
    let remote = cache_remote(&chain, &layout)?;
    if let Some(remote) = &remote {
        if lacks_files(&layout)? {
            match sync::pull(&Lock::read(&layout.lock_path())?, &layout.cache()?, remote, &chain.package_name) {
                Ok(transfer) => eprintln!("Fetched {} files from {}.", transfer.moved, remote.describe()),
                Err(SyncError::Remote(e)) if matches!(*e, RemoteError::Incomplete { .. }) => {
                    eprintln!("warning: {e}\nTheir steps run again.");
                }
                Err(e) => {
                    return Err(anyhow::Error::new(e)
                        .context("could not fetch the recorded files from the remote; nothing was run"));
                }
            }
        }
        if !args.no_push {
            remote.probe().context("the remote does not answer; nothing was run (`--no-push` runs without it)")?;
        }
    }
    let started = Instant::now();
    let mut live = Live::new(output.verbosity());
    let cancel = interrupt::on_ctrl_c()?;
    let result = Schedule {
        chain: &chain,
        layout: &layout,
        forced: &forced,
        only: only.as_deref(),
        destination: Destination::Committed,
        jobs: chain.jobs,
        cancel: &cancel,
    }
    .bring_up_to_date(&mut |p| live.show(p));
    live.finish();
    let result = result?;
    for note in &result.recovered {
        eprintln!("note: {note}");
    }
    if !result.failed.is_empty() {
        eprintln!();
        print_status(&chain, &layout)?;
        return Ok(outcome::failed_run(&chain, result, started.elapsed()));
    }
    discard_pending(&layout)?;
    if !quiet {
        eprintln!();
        print_status(&chain, &layout)?;
        if !result.accepted.is_empty() {
            eprintln!("Recorded steps {} from the results a build left pending.", result.accepted.join(", "));
        }
        if !result.removed.is_empty() {
            eprintln!("Removed steps {} that Cargo.toml no longer declares.", result.removed.join(", "));
        }
        for id in &result.left {
            eprintln!("step {id} is now stale: run `cargo promptgen -p {}`", chain.package_name);
        }
        eprintln!(
            "{} of {} steps regenerated in {:.1}s; {}",
            result.regenerated.len(),
            chain.steps.len(),
            started.elapsed().as_secs_f64(),
            if result.left.is_empty() {
                "promptgen.lock is up to date."
            } else {
                "the steps after them were not asked for (`--step`)."
            }
        );
    }
    if let Some(remote) = remote.as_ref().filter(|_| !args.no_push) {
        let transfer = sync::push(&Lock::read(&layout.lock_path())?, &layout.cache()?, remote, &chain.package_name)
            .with_context(|| {
                format!(
                    "the run is recorded in promptgen.lock and the local cache, but pushing to {} failed; run `cargo \
                     promptgen push -p {}` when it answers",
                    remote.describe(),
                    chain.package_name
                )
            })?;
        if !quiet {
            print_transfer("Pushed", "to", &transfer, remote);
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// The remote of a package in cache mode with a `cache_url`.
fn cache_remote(chain: &Chain, layout: &Layout) -> anyhow::Result<Option<Remote>> {
    match (&chain.store.cache_url, layout.store.mode) {
        (Some(url), StoreMode::Cache) => Ok(Some(Remote::open(url, &|name| std::env::var(name).ok())?)),
        _ => Ok(None),
    }
}

/// Whether the local cache lacks (or holds damaged) a file the committed lock names.
fn lacks_files(layout: &Layout) -> anyhow::Result<bool> {
    let cache = layout.cache()?;
    for step in Lock::read(&layout.lock_path())?.steps {
        for file in &step.files {
            if !matches!(cache.get(&file.sha256)?, Lookup::Found(_)) {
                return Ok(true);
            }
        }
    }
    Ok(false)
}

fn print_transfer(verb: &str, direction: &str, transfer: &Transfer, remote: &Remote) {
    let transcripts = match transfer.transcripts {
        0 => String::new(),
        n => format!(" and {n} transcript{}", if n == 1 { "" } else { "s" }),
    };
    eprintln!(
        "{verb} {} of the {} files promptgen.lock names ({} bytes){transcripts} {direction} {}; the other {} were there already.",
        transfer.moved,
        transfer.objects,
        transfer.bytes,
        remote.describe(),
        transfer.objects - transfer.moved
    );
}

/// The remote of a package that must be in cache mode with a `cache_url`, for `push` and `pull`.
fn remote_for(chain: &Chain, layout: &Layout, verb: &str) -> anyhow::Result<Remote> {
    let package = &chain.package_name;
    if layout.store.mode != StoreMode::Cache {
        bail!(
            "{package} keeps its files in the repository (store = \"repo\"), so there is nothing to {verb}; `cargo \
             promptgen store --to cache -p {package}` moves them to the cache"
        );
    }
    match cache_remote(chain, layout)? {
        Some(remote) => Ok(remote),
        None => bail!(
            "{package} has no remote to {verb}: set `cache_url = \"s3://bucket/prefix\"` in [package.metadata.promptgen] \
             (or [workspace.metadata.promptgen]) of `{}`",
            chain.manifest_path.display()
        ),
    }
}

fn push(selection: &Selection) -> anyhow::Result<ExitCode> {
    let Package { chain, layout } = open(selection, &Overrides::default())?;
    let _guard = ProcessLock::acquire(&layout)?;
    let remote = remote_for(&chain, &layout, "push")?;
    let transfer = sync::push(&Lock::read(&layout.lock_path())?, &layout.cache()?, &remote, &chain.package_name)?;
    print_transfer("Pushed", "to", &transfer, &remote);
    Ok(ExitCode::SUCCESS)
}

fn pull(selection: &Selection) -> anyhow::Result<ExitCode> {
    let Package { chain, layout } = open(selection, &Overrides::default())?;
    let _guard = ProcessLock::acquire(&layout)?;
    let remote = remote_for(&chain, &layout, "pull")?;
    let transfer = sync::pull(&Lock::read(&layout.lock_path())?, &layout.cache()?, &remote, &chain.package_name)?;
    if transfer.moved == 0 {
        eprintln!(
            "The local cache `{}` already holds the {} files promptgen.lock names.",
            layout.cache()?.dir.display(),
            transfer.objects
        );
    } else {
        print_transfer("Pulled", "from", &transfer, &remote);
    }
    Ok(ExitCode::SUCCESS)
}

fn store(selection: &Selection, to: StoreArg) -> anyhow::Result<ExitCode> {
    let Package { chain, layout } = open(selection, &Overrides::default())?;
    let _guard = ProcessLock::acquire(&layout)?;
    let to = match to {
        StoreArg::Cache => StoreMode::Cache,
        StoreArg::Repo => StoreMode::Repo,
    };
    // Only a move out of the cache may need the remote (for files this machine lacks).
    let remote = match (&chain.store.cache_url, to) {
        (Some(url), StoreMode::Repo) => Some(Remote::open(url, &|name| std::env::var(name).ok())?),
        _ => None,
    };
    let switch = sync::switch(&chain, &layout, to, remote.as_ref())?;
    let cache = layout.cache()?.dir;
    let (from_place, to_place) = match to {
        StoreMode::Cache => ("promptgen/".to_string(), format!("the cache `{}`", cache.display())),
        StoreMode::Repo => (format!("the cache `{}`", cache.display()), "promptgen/".to_string()),
    };
    if switch.pulled > 0 {
        println!("Fetched {} files from the remote first.", switch.pulled);
    }
    println!(
        "Moved {} steps ({} files) from {from_place} to {to_place}; promptgen.lock is unchanged.",
        switch.steps, switch.files
    );
    let manifest = chain.manifest_path.display();
    if switch.manifest_changed {
        println!("`{manifest}` now says store = \"{to}\".");
    } else {
        println!("`{manifest}` (or its workspace) already said store = \"{to}\".");
    }
    match to {
        StoreMode::Cache => {
            println!("Commit Cargo.toml and the removal of promptgen/.");
            if chain.store.cache_url.is_some() {
                println!("Run `cargo promptgen push -p {}` to share the files.", chain.package_name);
            }
        }
        StoreMode::Repo => println!("Commit Cargo.toml and promptgen/."),
    }
    Ok(ExitCode::SUCCESS)
}

fn check(selection: &Selection) -> anyhow::Result<ExitCode> {
    let Package { chain, layout } = open(selection, &Overrides::default())?;
    let _guard = ProcessLock::acquire(&layout)?;
    let report = report::check(&chain, &layout)?;
    for path in &report.unowned {
        if layout.store.mode == StoreMode::Cache {
            println!(
                "warning: promptgen/{path} is not used: {} keeps its files in the cache (store = \"cache\"); delete it if it is a leftover",
                chain.package_name
            );
        } else {
            println!("warning: promptgen/{path} belongs to no step in promptgen.lock; delete it if it is a leftover");
        }
    }
    for id in &report.removed {
        println!(
            "promptgen.lock records step {id}, which Cargo.toml no longer declares; `cargo promptgen -p {}` removes it and promptgen/{id}/",
            chain.package_name
        );
    }
    for path in &report.leftovers {
        println!(
            "{path} was left by a run that was stopped (killed, or a crash): the record reads whole without it, and \
             `cargo promptgen -p {}` finishes what it holds or removes it; do not commit it",
            chain.package_name
        );
    }
    if report.stale.is_empty() {
        if !report.removed.is_empty() || !report.leftovers.is_empty() {
            return Ok(ExitCode::from(1));
        }
        println!("All {} steps of {} are fresh.", chain.steps.len(), chain.package_name);
        return Ok(ExitCode::SUCCESS);
    }
    println!("{} of {} steps of {} are stale:", report.stale.len(), chain.steps.len(), chain.package_name);
    for step in &report.stale {
        println!("  step {}: {}", step.id, step.reasons.join("; "));
    }
    if !report.pending.is_empty() {
        println!(
            "Steps {} have results from a build waiting: `cargo promptgen accept -p {}` records them.",
            report.pending.join(", "),
            chain.package_name
        );
    } else if report.not_in_cache.len() == report.stale.len() {
        println!("Run `cargo promptgen pull -p {}` to fetch their files; no model is needed.", chain.package_name);
    } else {
        println!("Run `cargo promptgen -p {}` to regenerate them.", chain.package_name);
    }
    Ok(ExitCode::from(1))
}

fn status(selection: &Selection) -> anyhow::Result<ExitCode> {
    let Package { chain, layout } = open(selection, &Overrides::default())?;
    let _guard = ProcessLock::acquire(&layout)?;
    print_status(&chain, &layout)?;
    Ok(ExitCode::SUCCESS)
}

fn print_status(chain: &Chain, layout: &Layout) -> anyhow::Result<()> {
    let rows = report::status(chain, layout)?;
    let header = [
        "step",
        "prompt",
        "after",
        "state",
        "files",
        "backend",
        "model",
        "seed",
        "calls",
        "tokens",
        "repairs",
        "check_rounds",
    ];
    let cells: Vec<[String; 12]> = rows
        .iter()
        .map(|r| {
            let opt = |v: Option<String>| v.unwrap_or_else(|| "-".into());
            [
                r.id.clone(),
                r.prompt.clone(),
                if r.after.is_empty() { "-".into() } else { r.after.join(",") },
                r.state.to_string(),
                r.files.to_string(),
                r.backend.clone(),
                r.model.clone(),
                opt(r.seed.map(|v| v.to_string())),
                opt(r.model_calls.map(|v| v.to_string())),
                opt(r.tokens.map(|v| v.to_string())),
                opt(r.repairs.map(|v| v.to_string())),
                opt(r.check_rounds.map(|v| v.to_string())),
            ]
        })
        .collect();
    let mut widths = header.map(str::len);
    for row in &cells {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let line = |row: &[String]| {
        row.iter().zip(widths).map(|(c, w)| format!("{c:<w$}")).collect::<Vec<_>>().join("  ").trim_end().to_string()
    };
    println!("{}", line(&header.map(String::from)));
    for row in &cells {
        println!("{}", line(row));
    }
    for row in rows.iter().filter(|r| r.retried) {
        println!(
            "step {} was recorded from a retry, with seed {} (seed_retries)",
            row.id,
            row.seed.unwrap_or_default()
        );
    }
    for row in rows.iter().filter(|r| !r.reasons.is_empty()) {
        println!("step {} is stale: {}", row.id, row.reasons.join("; "));
    }
    Ok(())
}

fn accept(selection: &Selection) -> anyhow::Result<ExitCode> {
    let Package { chain, layout } = open(selection, &Overrides::default())?;
    let _guard = ProcessLock::acquire(&layout)?;
    let report = report::accept(&chain, &layout)?;
    for note in &report.recovered {
        eprintln!("note: {note}");
    }
    if report.accepted.is_empty() && report.outdated.is_empty() {
        println!("Nothing to accept: no build left results for {}.", chain.package_name);
    }
    if !report.accepted.is_empty() {
        println!("Recorded steps {} in promptgen.lock.", report.accepted.join(", "));
        if layout.store.mode == StoreMode::Cache && chain.store.cache_url.is_some() {
            println!("Run `cargo promptgen push -p {}` to share their files.", chain.package_name);
        }
    }
    if !report.outdated.is_empty() {
        println!(
            "Discarded pending results of steps {}: their prompts or inputs changed since the build made them.",
            report.outdated.join(", ")
        );
    }
    let check = report::check(&chain, &layout)?;
    if check.stale.is_empty() {
        return Ok(ExitCode::SUCCESS);
    }
    let ids: Vec<&str> = check.stale.iter().map(|s| s.id.as_str()).collect();
    println!("Still stale: {}; run `cargo promptgen -p {}`.", ids.join(", "), chain.package_name);
    Ok(ExitCode::from(1))
}

/// `out`, with the styles written to it dropped when colour is off (`--color`, a pipe, NO_COLOR).
fn colored<W: anstream::stream::RawStream>(out: W, color: ColorArg) -> anstream::AutoStream<W> {
    let choice = match color {
        ColorArg::Auto => anstream::ColorChoice::Auto,
        ColorArg::Always => anstream::ColorChoice::Always,
        ColorArg::Never => anstream::ColorChoice::Never,
    };
    anstream::AutoStream::new(out, choice)
}

fn show_log(args: &LogArgs, output: Output) -> anyhow::Result<ExitCode> {
    let Package { chain, layout } = open(&args.selection, &Overrides::default())?;
    if let Some(id) = &args.step
        && args.eval.is_none()
    {
        chain.require_step(id)?;
    }
    let steps = {
        let _guard = ProcessLock::acquire(&layout)?;
        match &args.eval {
            Some(run) => history::eval_trials(&chain, &layout, run, args.step.as_deref())?,
            None => history::collect(&chain, &layout, args.step.as_deref(), args.show)?,
        }
    };
    if let Some(path) = &args.html {
        codegen_core::fs::write_atomic(path, html::page(&chain, &steps).as_bytes())?;
        if output.verbosity() != Verbosity::Quiet {
            eprintln!("Wrote {} ({} steps).", path.display(), steps.len());
        }
        return Ok(ExitCode::SUCCESS);
    }
    let mut out = colored(std::io::stdout().lock(), output.color());
    for (n, step) in steps.iter().enumerate() {
        if n > 0 {
            writeln!(out)?;
        }
        log::write_step(&mut out, step, log::Limits { full: args.full })?;
    }
    Ok(ExitCode::SUCCESS)
}

fn diff(selection: &Selection, step: Option<&str>) -> anyhow::Result<ExitCode> {
    let Package { chain, layout } = open(selection, &Overrides::default())?;
    let _guard = ProcessLock::acquire(&layout)?;
    if let Some(id) = step {
        chain.require_step(id)?;
    }
    let text = report::diff(&chain, &layout, step)?;
    if text.is_empty() {
        eprintln!("No pending results differ from the recorded ones.");
    }
    print!("{text}");
    Ok(ExitCode::SUCCESS)
}
