//! The chains most tests declare against the fake server, and the code its scripted models
//! write for them, each once: steps `01`, `02`, … that write `a.rs`, `b.rs`, …, each file's
//! function using the one before it.

use super::Package;

/// `[package.metadata.promptgen]` for the fake server: `fake-coder` over Ollama's protocol,
/// seed 1 and temperature 0, then `settings` (TOML lines, each ending in a newline); and a
/// step for each of `outputs`, in order: `01` writes the first from `prompts/01.md`, `02`
/// the second from `prompts/02.md`, and so on.
pub fn chain(settings: &str, outputs: &[&str]) -> String {
    unseeded_chain(&format!("seed = 1\ntemperature = 0.0\n{settings}"), outputs)
}

/// [`chain`] without its seed and temperature: `settings` come right after the model.
pub fn unseeded_chain(settings: &str, outputs: &[&str]) -> String {
    let mut metadata =
        format!("\n[package.metadata.promptgen]\nbackend = \"ollama\"\nmodel = \"fake-coder\"\n{settings}");
    for (n, output) in (1..).zip(outputs) {
        metadata.push_str(&format!(
            "\n[[package.metadata.promptgen.steps]]\nid = \"{n:02}\"\nprompt = \"prompts/{n:02}.md\"\noutputs = [\"{output}\"]\n"
        ));
    }
    metadata
}

/// `metadata` with `lines` (TOML, each ending in a newline) added at the end of the table of
/// step `id`.
pub fn with_step_keys(metadata: &str, id: &str, lines: &str) -> String {
    let step = metadata.find(&format!("\nid = \"{id}\"\n")).unwrap_or_else(|| panic!("no step {id} in:\n{metadata}"));
    let end = metadata[step..].find("\n\n[").map_or(metadata.len(), |next| step + next + 1);
    format!("{}{lines}{}", &metadata[..end], &metadata[end..])
}

impl Package {
    /// A package of `metadata`'s first `steps` steps as [`chain`] declares them (`a.rs`,
    /// `b.rs` using `a`, `c.rs` using `b`), with a prompt for each and a `main` that prints
    /// what the last one's function returns. Nothing is recorded yet.
    pub fn lettered(metadata: &str, steps: usize) -> Package {
        let letters = &["a", "b", "c"][..steps];
        let last = letters[steps - 1];
        let package = Package::new(metadata, &format!("println!(\"{{}}\", generated::{last}::{last}());"));
        for (n, letter) in (1..).zip(letters) {
            let prompt = match n {
                1 => format!("Write {letter}.rs with fn {letter}.\n"),
                _ => format!("Write {letter}.rs with fn {letter} using {}.\n", letters[n - 2]),
            };
            package.write(&format!("prompts/{n:02}.md"), &prompt);
        }
        package
    }
}

/// `a.rs`, as the model writes it. [`A1`] and [`A2`] are two versions whose outputs differ.
pub const A: &str = "pub fn a() -> &'static str { \"a\" }\n";
pub const A1: &str = "pub fn a() -> &'static str { \"a1\" }\n";
pub const A2: &str = "pub fn a() -> &'static str { \"a2\" }\n";
/// `a.rs` that does not compile: `a` no longer returns what it says.
pub const A_BROKEN: &str = "pub fn a() -> &'static str { 42 }\n";
/// `b.rs`, using `a`; [`B1`] and [`B2`] are two other versions.
pub const B: &str = "pub fn b() -> String { format!(\"{}b\", super::a::a()) }\n";
pub const B1: &str = "pub fn b() -> String { format!(\"{}b1\", super::a::a()) }\n";
pub const B2: &str = "pub fn b() -> String { format!(\"{}b2\", super::a::a()) }\n";
/// `c.rs`, using `b`.
pub const C: &str = "pub fn c() -> String { format!(\"{}c\", super::b::b()) }\n";
