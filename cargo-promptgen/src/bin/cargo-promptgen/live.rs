//! How `cargo promptgen` shows a chain at work.
//!
//! On a terminal each running step has a live line, redrawn in place ten times a second:
//!
//! ```text
//! ⠹ step 02 · after 01 (regenerated) · call 3/8 · ~412 tokens · 9.8 tokens/s · 1:12 · calling write_file
//! ```
//!
//! the step it runs after and that step's state (regenerated in this run, recorded, or
//! pending), the call under way and the step's budget (`max_model_calls`), the tokens generated so far
//! (the server's counts of the finished calls, plus the pieces of the reply streaming in, about
//! one token each: hence `~`), the rate of the reply under way (or of the last one), the time
//! since the step started, and what it is doing. Several steps can run at once: each has its
//! line (indicatif's `MultiProgress`), and what happens to any of them (a step starts, a model
//! call returns, a step is done) is printed above the lines and stays in the scrollback.
//!
//! Without a terminal (CI, a pipe, a file) there are no live lines, only those printed ones, as
//! plain text. `--quiet` shows nothing but errors; `--verbose` adds each tool call and check.

use std::collections::BTreeMap;
use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use cargo_promptgen::__private::Progress;
use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressState, ProgressStyle};

/// How much to say, as cargo's `-q` and `-v` say it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Verbosity {
    /// Errors only.
    Quiet,
    /// What happens to each step.
    Normal,
    /// Also each tool call and check.
    Verbose,
}

/// What a running step's live line shows.
#[derive(Debug, Clone, PartialEq)]
pub struct StepLine {
    /// The step.
    pub id: String,
    /// The step it runs after, with that step's state (`01 (regenerated)`).
    pub after: Option<String>,
    /// Its budget of model calls.
    pub max_model_calls: u32,
    /// When it started (its current run, after a retry).
    pub started: Instant,
    /// The model call under way, or about to be made.
    pub call: u32,
    /// Completion tokens of the finished calls, as the server counted them.
    pub counted_tokens: u64,
    /// Pieces of the reply under way (0 before its first).
    pub pieces: u64,
    /// When the reply under way had its first piece and its latest, from its request.
    pub first_piece: Option<Duration>,
    /// When its latest piece arrived, from its request.
    pub last_piece: Duration,
    /// Tokens per second of the last finished call, when the server counted them.
    pub last_rate: Option<f64>,
    /// What it is doing.
    pub activity: Activity,
}

/// What a running step is doing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Activity {
    /// Its request is sent and no piece of the reply has come (a local server reads the whole
    /// prompt first).
    Waiting,
    /// The reply is streaming in: text, or a call of this tool.
    Writing(Option<String>),
    /// Its check runs.
    Checking(String),
}

impl StepLine {
    fn new(id: &str, max_model_calls: u32, now: Instant) -> StepLine {
        StepLine {
            id: id.to_string(),
            after: None,
            max_model_calls,
            started: now,
            call: 1,
            counted_tokens: 0,
            pieces: 0,
            first_piece: None,
            last_piece: Duration::ZERO,
            last_rate: None,
            activity: Activity::Waiting,
        }
    }

    /// Takes in what the step reported.
    fn update(&mut self, progress: &Progress) {
        match progress {
            Progress::Streaming { call, pieces, tool, call_elapsed, .. } => {
                if *call != self.call || self.first_piece.is_none() {
                    self.call = *call;
                    self.first_piece = Some(*call_elapsed);
                }
                self.pieces = *pieces;
                self.last_piece = *call_elapsed;
                self.activity = Activity::Writing(tool.clone());
            }
            Progress::ModelCall { number, completion_tokens, call_tokens, call_time, .. } => {
                self.counted_tokens = *completion_tokens;
                let generating = match (self.first_piece, call_time) {
                    // The time it spent generating: from its first piece, when it streamed.
                    (Some(first), Some(total)) => total.saturating_sub(first),
                    (None, Some(total)) => *total,
                    (_, None) => Duration::ZERO,
                };
                self.last_rate = match call_tokens {
                    Some(tokens) if generating > Duration::from_millis(50) => {
                        Some(*tokens as f64 / generating.as_secs_f64())
                    }
                    _ => self.last_rate,
                };
                self.call = number + 1;
                self.pieces = 0;
                self.first_piece = None;
                self.activity = Activity::Waiting;
            }
            Progress::Checking { check, .. } => self.activity = Activity::Checking(check.clone()),
            Progress::ToolRan { .. } => {
                if matches!(self.activity, Activity::Checking(_)) {
                    self.activity = Activity::Waiting;
                }
            }
            _ => {}
        }
    }

    /// The rate of the reply under way once it has two pieces, else of the last call.
    fn rate(&self) -> Option<f64> {
        match self.first_piece {
            Some(first) if self.pieces >= 2 && self.last_piece > first => {
                Some((self.pieces - 1) as f64 / (self.last_piece - first).as_secs_f64())
            }
            _ => self.last_rate,
        }
    }
}

/// The live line of a running step, as of `now`.
pub fn render(line: &StepLine, now: Instant) -> String {
    let tokens = if line.pieces > 0 {
        format!("~{} tokens", line.counted_tokens + line.pieces)
    } else {
        format!("{} tokens", line.counted_tokens)
    };
    let rate = match line.rate() {
        Some(rate) => format!("{rate:.1} tokens/s"),
        None => "- tokens/s".to_string(),
    };
    let doing = match &line.activity {
        Activity::Waiting => "waiting for the model".to_string(),
        Activity::Writing(None) => "writing".to_string(),
        Activity::Writing(Some(tool)) => format!("calling {tool}"),
        Activity::Checking(check) => format!("checking with `{check}`"),
    };
    let after = line.after.as_ref().map(|after| format!(" · after {after}")).unwrap_or_default();
    format!(
        "step {}{after} · call {}/{} · {tokens} · {rate} · {} · {doing}",
        line.id,
        line.call,
        line.max_model_calls,
        clock(now.saturating_duration_since(line.started))
    )
}

/// `m:ss`, or `h:mm:ss` past an hour.
fn clock(elapsed: Duration) -> String {
    let secs = elapsed.as_secs();
    match secs / 3600 {
        0 => format!("{}:{:02}", secs / 60, secs % 60),
        hours => format!("{hours}:{:02}:{:02}", secs / 60 % 60, secs % 60),
    }
}

/// The line printed for `progress` (above the live lines, or alone without a terminal), if
/// any at this verbosity.
pub fn plain_line(progress: &Progress, verbosity: Verbosity) -> Option<String> {
    if verbosity == Verbosity::Quiet {
        return None;
    }
    let verbose = verbosity == Verbosity::Verbose;
    Some(match progress {
        Progress::StepStarted { id, reasons, starts_from, .. } => {
            let how = match starts_from.as_slice() {
                [] => String::new(),
                files => format!(" by edit from {}", files.join(", ")),
            };
            format!("step {id}: running{how}, because {}", reasons.join("; "))
        }
        Progress::Retry { id, run, seed, reason } => {
            let reason = reason.lines().next().unwrap_or_default();
            format!("step {id}: run {run}, with seed {seed}, because the last run failed: {reason}")
        }
        Progress::ModelCall { id, number, tokens, elapsed, .. } => {
            format!("step {id}: model call {number}, {tokens} tokens so far, {:.1}s", elapsed.as_secs_f64())
        }
        Progress::StepFailed { id, error } => {
            format!("step {id}: failed: {}", error.lines().next().unwrap_or_default())
        }
        Progress::StepDone { id, entry, notes, elapsed } => {
            let mut line = format!(
                "step {id}: done in {:.1}s, {} files, {} model calls",
                elapsed.as_secs_f64(),
                entry.files.len(),
                entry.model_calls
            );
            for note in notes {
                line.push_str(&format!("\n  note: {note}"));
            }
            line
        }
        Progress::Streaming { id, call, pieces: 1, call_elapsed, .. } if verbose => {
            format!("step {id}: the reply to call {call} began after {:.1}s", call_elapsed.as_secs_f64())
        }
        Progress::ToolRan { id, tool, ok: true } if verbose => format!("step {id}: {tool} ran"),
        Progress::ToolRan { id, tool, ok: false } if verbose => {
            format!("step {id}: {tool} was refused; the model is told why")
        }
        Progress::Checking { id, check } if verbose => format!("step {id}: checking with `{check}`"),
        _ => return None,
    })
}

/// The display of one run of `cargo promptgen`.
pub struct Live {
    verbosity: Verbosity,
    /// The live lines, on a terminal.
    bars: Option<MultiProgress>,
    running: BTreeMap<String, Running>,
}

struct Running {
    line: Arc<Mutex<StepLine>>,
    bar: Option<ProgressBar>,
}

impl Live {
    /// Live lines when stderr is a terminal (and `TERM` is not `dumb`), plain lines otherwise.
    pub fn new(verbosity: Verbosity) -> Live {
        let terminal = std::io::IsTerminal::is_terminal(&std::io::stderr())
            && std::env::var("TERM").map_or(true, |term| term != "dumb");
        let bars = (terminal && verbosity > Verbosity::Quiet)
            .then(|| MultiProgress::with_draw_target(ProgressDrawTarget::stderr_with_hz(10)));
        Live { verbosity, bars, running: BTreeMap::new() }
    }

    /// Shows what the chain reported.
    pub fn show(&mut self, progress: Progress) {
        if let Some(text) = plain_line(&progress, self.verbosity) {
            self.print(&text);
        }
        match &progress {
            Progress::StepStarted { id, max_model_calls, after, .. } => {
                self.start(id, *max_model_calls, after.as_ref().map(|(after, state)| format!("{after} ({state})")))
            }
            Progress::Retry { id, .. } => {
                if let Some(running) = self.running.get(id) {
                    let mut line = running.line.lock().unwrap_or_else(|e| e.into_inner());
                    let after = line.after.take();
                    *line = StepLine::new(id, line.max_model_calls, Instant::now());
                    line.after = after;
                }
            }
            Progress::StepDone { id, .. } | Progress::StepStopped { id, .. } | Progress::StepFailed { id, .. } => {
                if let Some(Running { bar: Some(bar), .. }) = self.running.remove(id) {
                    bar.finish_and_clear();
                }
            }
            Progress::Streaming { id, .. }
            | Progress::ModelCall { id, .. }
            | Progress::ToolRan { id, .. }
            | Progress::Checking { id, .. } => {
                if let Some(running) = self.running.get(id) {
                    running.line.lock().unwrap_or_else(|e| e.into_inner()).update(&progress);
                }
            }
        }
    }

    fn start(&mut self, id: &str, max_model_calls: u32, after: Option<String>) {
        let mut first = StepLine::new(id, max_model_calls, Instant::now());
        first.after = after;
        let line = Arc::new(Mutex::new(first));
        let bar = self.bars.as_ref().map(|bars| {
            let shown = Arc::clone(&line);
            let style = ProgressStyle::with_template("{spinner:.cyan} {line}")
                .expect("the template is valid")
                .with_key("line", move |_: &ProgressState, out: &mut dyn std::fmt::Write| {
                    let line = shown.lock().unwrap_or_else(|e| e.into_inner());
                    let _ = out.write_str(&render(&line, Instant::now()));
                });
            let bar = bars.add(ProgressBar::new_spinner().with_style(style));
            bar.enable_steady_tick(Duration::from_millis(100));
            bar
        });
        self.running.insert(id.to_string(), Running { line, bar });
    }

    /// Prints `text` above the live lines, or as a plain line.
    pub fn print(&self, text: &str) {
        match &self.bars {
            Some(bars) => {
                let _ = bars.println(text);
            }
            None => {
                let _ = writeln!(std::io::stderr(), "{text}");
            }
        }
    }

    /// Removes the live lines, before the run's last words.
    pub fn finish(&mut self) {
        for (_, running) in std::mem::take(&mut self.running) {
            if let Some(bar) = running.bar {
                bar.finish_and_clear();
            }
        }
        if let Some(bars) = &self.bars {
            let _ = bars.clear();
        }
    }
}

impl Drop for Live {
    fn drop(&mut self) {
        self.finish();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn streaming(call: u32, pieces: u64, tool: Option<&str>, at_ms: u64) -> Progress {
        Progress::Streaming {
            id: "02".into(),
            call,
            max_model_calls: 8,
            pieces,
            chars: pieces * 4,
            tool: tool.map(String::from),
            call_elapsed: Duration::from_millis(at_ms),
        }
    }

    #[test]
    fn the_live_line_follows_a_step_through_its_calls() {
        let start = Instant::now();
        let mut line = StepLine::new("02", 8, start);
        assert_eq!(
            render(&line, start + Duration::from_secs(3)),
            "step 02 · call 1/8 · 0 tokens · - tokens/s · 0:03 · waiting for the model"
        );
        // The first piece after 10 s of reading the prompt, then 40 pieces in 4 s.
        line.update(&streaming(1, 1, None, 10_000));
        line.update(&streaming(1, 41, Some("write_file"), 14_000));
        assert_eq!(
            render(&line, start + Duration::from_secs(75)),
            "step 02 · call 1/8 · ~41 tokens · 10.0 tokens/s · 1:15 · calling write_file"
        );
        // The server counts 44 tokens over the 5 s it generated.
        line.update(&Progress::ModelCall {
            id: "02".into(),
            number: 1,
            max_model_calls: 8,
            tokens: 544,
            completion_tokens: 44,
            call_tokens: Some(44),
            call_time: Some(Duration::from_secs(15)),
            elapsed: Duration::from_secs(15),
        });
        assert_eq!(
            render(&line, start + Duration::from_secs(3700)),
            "step 02 · call 2/8 · 44 tokens · 8.8 tokens/s · 1:01:40 · waiting for the model"
        );
        line.update(&Progress::Checking { id: "02".into(), check: "rustc".into() });
        assert!(render(&line, start).ends_with("· checking with `rustc`"), "{}", render(&line, start));
        line.update(&streaming(2, 1, None, 500));
        assert!(render(&line, start).contains("call 2/8 · ~45 tokens · 8.8 tokens/s"), "{}", render(&line, start));
        // The step it runs after, and that step's state.
        line.after = Some("01 (regenerated)".into());
        assert!(
            render(&line, start).starts_with("step 02 · after 01 (regenerated) · call 2/8 · "),
            "{}",
            render(&line, start)
        );
    }

    #[test]
    fn plain_lines_say_what_happens_to_each_step_at_each_verbosity() {
        let started = Progress::StepStarted {
            id: "01".into(),
            reasons: vec!["prompt changed".into()],
            starts_from: Vec::new(),
            max_model_calls: 8,
            after: None,
        };
        assert_eq!(
            plain_line(&started, Verbosity::Normal).as_deref(),
            Some("step 01: running, because prompt changed")
        );
        let by_edit = Progress::StepStarted {
            id: "01".into(),
            reasons: vec!["prompt changed".into()],
            starts_from: vec!["a.rs".into(), "b.rs".into()],
            max_model_calls: 8,
            after: None,
        };
        assert_eq!(
            plain_line(&by_edit, Verbosity::Normal).as_deref(),
            Some("step 01: running by edit from a.rs, b.rs, because prompt changed")
        );
        assert_eq!(plain_line(&started, Verbosity::Quiet), None);
        let tool = Progress::ToolRan { id: "01".into(), tool: "finish".into(), ok: false };
        assert_eq!(plain_line(&tool, Verbosity::Normal), None);
        assert_eq!(
            plain_line(&tool, Verbosity::Verbose).as_deref(),
            Some("step 01: finish was refused; the model is told why")
        );
        assert_eq!(plain_line(&streaming(1, 3, None, 10), Verbosity::Verbose), None, "pieces are not printed");
        assert_eq!(
            plain_line(&streaming(2, 1, None, 12_340), Verbosity::Verbose).as_deref(),
            Some("step 02: the reply to call 2 began after 12.3s")
        );
        assert_eq!(plain_line(&streaming(2, 1, None, 10), Verbosity::Normal), None);
    }
}
