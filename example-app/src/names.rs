//! Names as people type them. This rule is written by hand; the generated presenter must use
//! it (step 03's prompt says so, and the crate's tests check it).

/// `raw` as a name to greet: surrounding whitespace trimmed and every inner run of whitespace
/// folded into one space; `None` when nothing is left.
pub fn tidy_name(raw: &str) -> Option<String> {
    let words: Vec<&str> = raw.split_whitespace().collect();
    (!words.is_empty()).then(|| words.join(" "))
}

#[cfg(test)]
mod tests {
    use super::tidy_name;

    #[test]
    fn whitespace_is_trimmed_and_folded() {
        assert_eq!(tidy_name("  Ada \t Lovelace \n").as_deref(), Some("Ada Lovelace"));
        assert_eq!(tidy_name(" \t\n"), None);
    }
}
