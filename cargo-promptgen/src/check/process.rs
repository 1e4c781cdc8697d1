//! The processes a check starts: `cargo` with an environment fit for a nested build, and a
//! run to its end, its time limit or an interruption, killed whole.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use codegen_core::Cancel;
use codegen_core::check::remove_secrets;

use crate::mount::{TREE_PACKAGE_VAR, TREE_VAR};

/// The `cargo` that runs us (`CARGO`, which Cargo sets for subcommands and build scripts),
/// else `cargo` on `PATH`.
pub(crate) fn cargo_program() -> PathBuf {
    std::env::var_os("CARGO").map(PathBuf::from).unwrap_or_else(|| PathBuf::from("cargo"))
}

/// `cargo`, with an environment fit for a nested build: no secrets (a check's output goes
/// back to the model), and none of the variables Cargo sets for the build script that may
/// be running us (they describe that build, and would confuse this one).
pub(crate) fn cargo_command(cargo: &Path) -> Command {
    let mut command = Command::new(cargo);
    remove_secrets(&mut command);
    for (name, _) in std::env::vars_os() {
        let Some(name) = name.to_str() else { continue };
        let build_script_var =
            ["OUT_DIR", "TARGET", "HOST", "NUM_JOBS", "OPT_LEVEL", "DEBUG", "PROFILE", "MAKEFLAGS", "MFLAGS"]
                .contains(&name)
                || [
                    "CARGO_MANIFEST_",
                    "CARGO_PKG_",
                    "CARGO_CFG_",
                    "CARGO_FEATURE_",
                    "CARGO_CRATE_",
                    "CARGO_BIN_",
                    "CARGO_PRIMARY_PACKAGE",
                ]
                .iter()
                .any(|prefix| name.starts_with(prefix))
                || [
                    "CARGO_ENCODED_RUSTFLAGS",
                    "CARGO_MAKEFLAGS",
                    "CARGO_TARGET_DIR",
                    "CARGO_TARGET_TMPDIR",
                    "CARGO_RUSTC_CURRENT_DIR",
                    TREE_VAR,
                    TREE_PACKAGE_VAR,
                ]
                .contains(&name);
        if build_script_var {
            command.env_remove(name);
        }
    }
    command
}

/// What a command did.
pub(crate) struct Ran {
    pub(crate) success: bool,
    pub(crate) timed_out: bool,
    pub(crate) interrupted: bool,
    pub(crate) stdout: String,
    pub(crate) stderr: String,
}

/// Runs `command` to its end, or kills it after `timeout` or once `cancel` is set. On Unix it
/// runs in a process group of its own, and the whole group is killed: killing `cargo` alone
/// would leave the `rustc` or test binary it started running.
pub(crate) fn run_with_timeout(command: &mut Command, timeout: Duration, cancel: &Cancel) -> std::io::Result<Ran> {
    #[cfg(unix)]
    std::os::unix::process::CommandExt::process_group(command, 0);
    let mut child = command.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn()?;
    let collect = |pipe: Option<Box<dyn Read + Send>>| {
        std::thread::spawn(move || {
            let mut text = Vec::new();
            if let Some(mut pipe) = pipe {
                let _ = pipe.read_to_end(&mut text);
            }
            String::from_utf8_lossy(&text).into_owned()
        })
    };
    let stdout = collect(child.stdout.take().map(|p| Box::new(p) as Box<dyn Read + Send>));
    let stderr = collect(child.stderr.take().map(|p| Box::new(p) as Box<dyn Read + Send>));
    let deadline = Instant::now() + timeout;
    let (status, timed_out, interrupted) = loop {
        if let Some(status) = child.try_wait()? {
            break (Some(status), false, false);
        }
        let (timed_out, interrupted) = (Instant::now() >= deadline, cancel.is_cancelled());
        if timed_out || interrupted {
            kill_group(&mut child);
            let _ = child.wait();
            break (None, timed_out, interrupted);
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    Ok(Ran {
        success: status.is_some_and(|s| s.success()),
        timed_out,
        interrupted,
        stdout: stdout.join().unwrap_or_default(),
        stderr: stderr.join().unwrap_or_default(),
    })
}

/// Kills `child` and, on Unix, every process of its group (see [`run_with_timeout`]).
fn kill_group(child: &mut std::process::Child) {
    #[cfg(unix)]
    if let Ok(group) = libc::pid_t::try_from(child.id()) {
        // SAFETY: kill(2) with a negative pid signals that process group; it touches no memory.
        unsafe {
            libc::kill(-group, libc::SIGKILL);
        }
    }
    let _ = child.kill();
}

/// The last `lines` lines of `text`.
pub(crate) fn tail(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}
