//! How errors and the texts they quote are shown to people.

/// An error and every cause in its chain, one per line after `separator` (e.g.
/// `"\ncaused by: "`). No error type of this project repeats its cause in its own message
/// (the Rust API guidelines: a cause is either shown or returned by `source`, never both), so
/// each cause appears exactly once.
pub fn error_with_causes(error: &dyn std::error::Error, separator: &str) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(separator);
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

/// At most `max` characters of `text`, on a char boundary, with an ellipsis when cut.
pub(crate) fn excerpt(text: &str, max: usize) -> String {
    match text.char_indices().nth(max) {
        Some((cut, _)) => format!("{}…", &text[..cut]),
        None => text.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_cause_is_shown_once_even_when_its_text_is_in_the_message() {
        #[derive(Debug, thiserror::Error)]
        #[error("outer mentions: inner trouble")]
        struct Outer(#[source] std::io::Error);
        let error = Outer(std::io::Error::other("inner trouble"));
        // The old rule skipped a cause whose text the message happened to contain.
        assert_eq!(
            error_with_causes(&error, "\ncaused by: "),
            "outer mentions: inner trouble\ncaused by: inner trouble"
        );
    }
}
