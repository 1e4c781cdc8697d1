//! `cargo promptgen review`, as `cargo insta review`: each pending result in chain order, its
//! diff against the recorded one, and a question: accept, reject, skip or quit. It needs a
//! terminal to ask; without one it says to use `diff` and `accept`.

use std::io::{BufRead, IsTerminal, Write};
use std::process::ExitCode;

use anstyle::{AnsiColor, Style};
use cargo_promptgen::__private::Chain;
use cargo_promptgen::__private::Layout;
use cargo_promptgen::__private::review as report;
use cargo_promptgen::__private::review::{self, Decided};

const TITLE: Style = Style::new().bold();
const ADDED: Style = AnsiColor::Green.on_default();
const REMOVED: Style = AnsiColor::Red.on_default();
const HUNK: Style = AnsiColor::Cyan.on_default();
const DIM: Style = AnsiColor::BrightBlack.on_default();

/// Refuses without a terminal to ask on; else reviews on it.
pub fn review(chain: &Chain, layout: &Layout, out: &mut dyn Write) -> anyhow::Result<ExitCode> {
    if !std::io::stdin().is_terminal() || !std::io::stdout().is_terminal() {
        let package = &chain.package_name;
        anyhow::bail!(
            "`cargo promptgen review` asks about each pending result and needs a terminal to ask on; without one, \
             `cargo promptgen diff -p {package}` shows the pending results and `cargo promptgen accept -p {package}` \
             records them all"
        );
    }
    let stdin = std::io::stdin();
    let mut answers = stdin.lock();
    run(chain, layout, &mut answers, out)
}

/// What was decided in one review.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Tally {
    pub accepted: Vec<String>,
    pub rejected: Vec<String>,
    pub skipped: Vec<String>,
    pub discarded: Vec<String>,
}

/// Reviews with the answers read from `answers` (a line each: `a`, `r`, `s` or `q`).
pub fn run(chain: &Chain, layout: &Layout, answers: &mut dyn BufRead, out: &mut dyn Write) -> anyhow::Result<ExitCode> {
    let mut tally = Tally::default();
    let total = review::pending_steps(chain, layout)?.len();
    if total == 0 {
        writeln!(out, "Nothing to review: no pending results for {}.", chain.package_name)?;
        return Ok(ExitCode::SUCCESS);
    }
    'steps: loop {
        let pending = review::pending_steps(chain, layout)?;
        let Some(id) = pending.into_iter().find(|id| !tally.skipped.contains(id)) else { break };
        writeln!(out, "{TITLE}step {id}{TITLE:#}: a pending result, made by a build")?;
        let diff = report::diff(chain, layout, Some(&id))?;
        if diff.is_empty() {
            writeln!(out, "{DIM}(its files are the recorded ones; only its record differs){DIM:#}")?;
        }
        for line in diff.lines() {
            let style = match line {
                l if l.starts_with("+++") || l.starts_with("---") => TITLE,
                l if l.starts_with('+') => ADDED,
                l if l.starts_with('-') => REMOVED,
                l if l.starts_with("@@") => HUNK,
                _ => Style::new(),
            };
            writeln!(out, "{style}{line}{style:#}")?;
        }
        loop {
            write!(out, "{TITLE}accept (a), reject (r), skip (s) or quit (q)?{TITLE:#} ")?;
            out.flush()?;
            let mut answer = String::new();
            if answers.read_line(&mut answer)? == 0 {
                writeln!(out)?;
                break 'steps;
            }
            match answer.trim() {
                "a" | "accept" => {
                    let decided = review::accept_step(chain, layout, &id)?;
                    writeln!(out, "{ADDED}accepted{ADDED:#}: step {id} is recorded in promptgen.lock")?;
                    tally.accepted.push(id);
                    note(out, &decided, &mut tally)?;
                }
                "r" | "reject" => {
                    let decided = review::reject_step(chain, layout, &id)?;
                    writeln!(out, "{REMOVED}rejected{REMOVED:#}: step {id}'s pending result is removed")?;
                    tally.rejected.push(id);
                    note(out, &decided, &mut tally)?;
                }
                "s" | "skip" => {
                    writeln!(out, "skipped: step {id}'s pending result stays")?;
                    tally.skipped.push(id);
                }
                "q" | "quit" => break 'steps,
                other => {
                    writeln!(out, "`{other}` is not an answer")?;
                    continue;
                }
            }
            break;
        }
    }
    let left = review::pending_steps(chain, layout)?;
    writeln!(
        out,
        "{} accepted, {} rejected, {} skipped{}; {} still pending.",
        tally.accepted.len(),
        tally.rejected.len(),
        tally.skipped.len(),
        if tally.discarded.is_empty() { String::new() } else { format!(", {} discarded", tally.discarded.len()) },
        left.len()
    )?;
    if !left.is_empty() {
        writeln!(out, "`cargo promptgen review -p {}` asks again.", chain.package_name)?;
    }
    Ok(ExitCode::SUCCESS)
}

fn note(out: &mut dyn Write, decided: &Decided, tally: &mut Tally) -> std::io::Result<()> {
    for id in &decided.discarded {
        writeln!(out, "  step {id}'s pending result was made after it, and is discarded too")?;
        tally.discarded.push(id.clone());
    }
    if decided.area_removed {
        writeln!(out, "  nothing else is pending: the pending area is removed")?;
    }
    Ok(())
}
