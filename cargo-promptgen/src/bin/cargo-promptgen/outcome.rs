//! What `cargo promptgen` (`run`) says when steps failed: which steps ran and were recorded,
//! which failed and why, and which did not run because a step they run after failed.

use std::process::ExitCode;
use std::time::Duration;

use cargo_promptgen::__private::Chain;
use cargo_promptgen::__private::ChainResult;
use cargo_promptgen::__private::report;

/// Prints the summary of a run in which steps failed; the exit code is 1.
pub fn failed_run(chain: &Chain, result: ChainResult, elapsed: Duration) -> ExitCode {
    let total = chain.steps.len();
    let package = &chain.package_name;
    if result.regenerated.is_empty() {
        eprintln!("No step was regenerated ({:.1}s).", elapsed.as_secs_f64());
    } else {
        eprintln!(
            "{} of {total} steps regenerated and recorded in {:.1}s: {}.",
            result.regenerated.len(),
            elapsed.as_secs_f64(),
            result.regenerated.join(", ")
        );
    }
    for failed in &result.failed {
        eprintln!("error: {}", report(&failed.error));
    }
    for skipped in &result.skipped {
        let steps = match skipped.failed.as_slice() {
            [one] => format!("step {one}"),
            many => format!("steps {}", many.join(", ")),
        };
        eprintln!("step {} did not run: it runs after {steps}, which failed.", skipped.id);
    }
    let failed: Vec<&str> = result.failed.iter().map(|f| f.id.as_str()).collect();
    let skipped = match result.skipped.len() {
        0 => String::new(),
        n => format!(", {n} did not run"),
    };
    eprintln!(
        "{} of {total} steps failed ({}){skipped}; what ran and passed is recorded. `cargo promptgen -p {package}` runs \
         the rest again.",
        failed.len(),
        failed.join(", ")
    );
    ExitCode::from(1)
}
