//! Ctrl-C while `cargo promptgen` runs a chain: the first stops the running step at once (the
//! request in flight is abandoned, nothing of the step is recorded, and the run exits with
//! 130 after saying so); a second one exits at once, for a run stuck where nothing watches the
//! flag. Every write of the lock and the store is atomic, so exiting at any moment leaves them
//! whole.

use anyhow::Context;
use codegen_core::Cancel;

/// Installs the handler; the flag it sets.
pub fn on_ctrl_c() -> anyhow::Result<Cancel> {
    on_ctrl_c_for("step")
}

/// Installs the handler for a run of `what` (`step`, `trials`); the flag it sets.
pub fn on_ctrl_c_for(what: &'static str) -> anyhow::Result<Cancel> {
    let cancel = Cancel::new();
    let flag = cancel.clone();
    ctrlc::set_handler(move || {
        if flag.is_cancelled() {
            eprintln!("\ninterrupted again: exiting at once");
            std::process::exit(130);
        }
        eprintln!("\ninterrupted: stopping the running {what} (Ctrl-C again exits at once)");
        flag.cancel();
    })
    .context("could not install the Ctrl-C handler")?;
    Ok(cancel)
}
