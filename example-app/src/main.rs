//! The greeting app. Its code will be generated from `prompts/` once cargo-promptgen exists;
//! until then it says so instead of pretending.

fn main() {
    eprintln!("example-app: not generated yet (it needs cargo-promptgen, see the open issues)");
    std::process::exit(2);
}
