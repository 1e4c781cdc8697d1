//! `--workspace` (`run`, `check`, `status`): the command for every member of the workspace that
//! declares `[package.metadata.promptgen]`, one package after another, each in a process of its
//! own (this program again, with `--manifest-path`), every line it prints prefixed with its
//! package's name, and one exit code for all: 0 when every package's is 0, else 1.
//!
//! A process per package keeps each package's run exactly what it is alone (its own process
//! lock, its own `cargo metadata`, its own output), and a failing package does not stop the
//! others.

use std::io::{BufRead, BufReader, Read, Write};
use std::path::PathBuf;
use std::process::{Command, ExitCode, Stdio};

use anyhow::{Context, bail};
use clap::Args;

use crate::{RunArgs, Selection};

/// `--workspace` and `--exclude`.
#[derive(Args, Debug, Default, Clone)]
pub struct Members {
    /// Every member of the workspace with [package.metadata.promptgen], one after another;
    /// each line names its package.
    #[arg(long, conflicts_with = "package")]
    pub workspace: bool,
    /// With --workspace: leave out this package (repeatable).
    #[arg(long, value_name = "SPEC", requires = "workspace")]
    pub exclude: Vec<String>,
}

/// The members of the workspace `metadata` describes that declare a chain and `members` does
/// not exclude: (name, manifest), by name.
pub fn chain_members(metadata: &cargo_metadata::Metadata, members: &Members) -> anyhow::Result<Vec<(String, PathBuf)>> {
    let packages = metadata.workspace_packages();
    let is = |package: &cargo_metadata::Package, spec: &str| match spec.split_once('@') {
        Some((name, version)) => package.name.as_str() == name && package.version.to_string() == version,
        None => package.name.as_str() == spec,
    };
    for spec in &members.exclude {
        if !packages.iter().any(|p| is(p, spec)) {
            eprintln!("warning: --exclude {spec}: no package `{spec}` in this workspace");
        }
    }
    let with_chain = |p: &&&cargo_metadata::Package| p.metadata.get("promptgen").is_some_and(|v| v.is_object());
    let mut chosen: Vec<(String, PathBuf)> = packages
        .iter()
        .filter(with_chain)
        .filter(|p| !members.exclude.iter().any(|spec| is(p, spec)))
        .map(|p| (p.name.to_string(), p.manifest_path.clone().into_std_path_buf()))
        .collect();
    chosen.sort();
    if chosen.is_empty() {
        if packages.iter().any(|p| with_chain(&p)) {
            bail!("--exclude leaves out every package of this workspace that declares [package.metadata.promptgen]");
        }
        bail!("no package in this workspace declares [package.metadata.promptgen]");
    }
    Ok(chosen)
}

/// Runs `cargo promptgen <verb_args> --manifest-path <member>` for each member with a chain,
/// prefixing each line it prints with the member's name.
pub fn each(selection: &Selection, members: &Members, verb_args: &[String]) -> anyhow::Result<ExitCode> {
    let metadata = crate::cargo_metadata(selection.manifest_path.as_deref())?;
    let packages = chain_members(&metadata, members)?;
    let program = std::env::current_exe().context("cannot find this program, to run it for each package")?;
    let verb = verb_args.first().map_or("run", String::as_str);
    let mut failed = Vec::new();
    for (name, manifest) in &packages {
        let mut command = Command::new(&program);
        command.arg("promptgen").args(verb_args).arg("--manifest-path").arg(manifest);
        let status =
            prefixed(command, name).with_context(|| format!("{name}: could not run `cargo promptgen {verb}`"))?;
        if !status.success() {
            failed.push(name.as_str());
        }
    }
    let names: Vec<&str> = packages.iter().map(|(name, _)| name.as_str()).collect();
    if failed.is_empty() {
        eprintln!("promptgen {verb} --workspace: {} package(s), all passed: {}", names.len(), names.join(", "));
        Ok(ExitCode::SUCCESS)
    } else {
        eprintln!(
            "promptgen {verb} --workspace: {} of {} package(s) failed: {}",
            failed.len(),
            names.len(),
            failed.join(", ")
        );
        Ok(ExitCode::from(1))
    }
}

/// `run`'s options, to run it again for one package (without `--workspace`, `--exclude`,
/// `-p` and `--manifest-path`; `--step` cannot be given with `--workspace`).
pub fn run_args(args: &RunArgs) -> Vec<String> {
    let mut words = vec!["run".to_string()];
    if let Some(jobs) = args.jobs {
        words.extend(["--jobs".into(), jobs.to_string()]);
    }
    for (flag, on) in
        [("--force", args.force), ("--fresh", args.fresh), ("--offline", args.offline), ("--no-push", args.no_push)]
    {
        if on {
            words.push(flag.into());
        }
    }
    for (flag, value) in [("--backend", &args.backend), ("--model", &args.model), ("--base-url", &args.base_url)] {
        if let Some(value) = value {
            words.extend([flag.to_string(), value.clone()]);
        }
    }
    words
}

/// Runs `command` to its end, its standard output and error each copied to ours line by line,
/// as they come, each line prefixed with `name`.
fn prefixed(mut command: Command, name: &str) -> std::io::Result<std::process::ExitStatus> {
    let mut child = command.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn()?;
    let stdout = child.stdout.take();
    let stderr = child.stderr.take();
    std::thread::scope(|scope| {
        scope.spawn(|| copy_lines(stdout, name, &mut std::io::stdout()));
        copy_lines(stderr, name, &mut std::io::stderr());
    });
    child.wait()
}

fn copy_lines(from: Option<impl Read>, name: &str, to: &mut dyn Write) {
    let Some(from) = from else { return };
    for line in BufReader::new(from).split(b'\n') {
        let Ok(mut line) = line else { return };
        if line.last() == Some(&b'\r') {
            line.pop();
        }
        let mut text = Vec::with_capacity(name.len() + line.len() + 3);
        text.extend_from_slice(name.as_bytes());
        text.push(b':');
        if !line.is_empty() {
            text.push(b' ');
            text.extend_from_slice(&line);
        }
        text.push(b'\n');
        // A closed terminal is no reason to stop the package's run: it ends by itself.
        let _ = to.write_all(&text).and_then(|()| to.flush());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_line_is_prefixed_with_the_package() {
        let mut out = Vec::new();
        copy_lines(Some(&b"step 01: done\n\nlast line without newline"[..]), "pkg-a", &mut out);
        assert_eq!(String::from_utf8(out).unwrap(), "pkg-a: step 01: done\npkg-a:\npkg-a: last line without newline\n");
    }
}
