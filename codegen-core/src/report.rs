//! How errors are shown to people.

/// An error and those of its causes that its message does not already quote, joined by
/// `separator`. Many messages here quote their cause; walking the chain blindly would print
/// it twice (and a compiler's diagnostics with it).
pub fn error_with_causes(error: &dyn std::error::Error, separator: &str) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        if !text.contains(&cause_text) {
            text.push_str(separator);
            text.push_str(&cause_text);
        }
        source = cause.source();
    }
    text
}
