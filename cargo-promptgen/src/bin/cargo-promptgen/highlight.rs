//! Rust source as HTML with its tokens marked (`<span class="k">fn</span>`), for the page of
//! `log --html`. A small hand-written lexer: comments (nested), strings (raw, byte, escaped),
//! characters and lifetimes, numbers, keywords, macros, attributes and capitalised names. It
//! only colours: whatever it does not know is copied as text, and every character the model
//! wrote is escaped.

/// Escapes text for HTML content and attribute values.
pub fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

const KEYWORDS: &[&str] = &[
    "as", "async", "await", "break", "const", "continue", "crate", "dyn", "else", "enum", "extern", "false", "fn",
    "for", "if", "impl", "in", "let", "loop", "match", "mod", "move", "mut", "pub", "ref", "return", "self", "Self",
    "static", "struct", "super", "trait", "true", "type", "unsafe", "use", "where", "while", "yield",
];

/// `source` as HTML, Rust tokens marked with the classes `c` (comment), `s` (string or
/// character), `n` (number), `k` (keyword), `m` (macro), `a` (attribute), `t` (type), `l`
/// (lifetime).
pub fn rust(source: &str) -> String {
    let chars: Vec<char> = source.chars().collect();
    let mut out = String::with_capacity(source.len() * 2);
    let mut i = 0;
    let text = |from: usize, to: usize| -> String { chars[from..to.min(chars.len())].iter().collect() };
    let span = |out: &mut String, class: &str, body: &str| {
        out.push_str(&format!("<span class=\"{class}\">{}</span>", escape(body)));
    };
    while i < chars.len() {
        let c = chars[i];
        let next = chars.get(i + 1).copied();
        let start = i;
        if c == '/' && next == Some('/') {
            while i < chars.len() && chars[i] != '\n' {
                i += 1;
            }
            span(&mut out, "c", &text(start, i));
        } else if c == '/' && next == Some('*') {
            let mut depth = 0;
            while i < chars.len() {
                if chars[i] == '/' && chars.get(i + 1) == Some(&'*') {
                    depth += 1;
                    i += 2;
                } else if chars[i] == '*' && chars.get(i + 1) == Some(&'/') {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    i += 1;
                }
            }
            span(&mut out, "c", &text(start, i));
        } else if let Some(end) = raw_string_end(&chars, i) {
            i = end;
            span(&mut out, "s", &text(start, i));
        } else if c == '"' || (c == 'b' && next == Some('"')) {
            i += if c == 'b' { 2 } else { 1 };
            while i < chars.len() && chars[i] != '"' {
                i += if chars[i] == '\\' { 2 } else { 1 };
            }
            i = (i + 1).min(chars.len());
            span(&mut out, "s", &text(start, i));
        } else if c == '\'' {
            // A character ('a', '\n', '\u{1F600}') or a lifetime ('a, 'static).
            match char_literal_end(&chars, i) {
                Some(end) => {
                    i = end;
                    span(&mut out, "s", &text(start, i));
                }
                None => {
                    i += 1;
                    while i < chars.len() && (chars[i].is_alphanumeric() || chars[i] == '_') {
                        i += 1;
                    }
                    span(&mut out, "l", &text(start, i));
                }
            }
        } else if c == '#' && (next == Some('[') || (next == Some('!') && chars.get(i + 2) == Some(&'['))) {
            let mut depth = 0;
            while i < chars.len() {
                match chars[i] {
                    '[' => depth += 1,
                    ']' => {
                        depth -= 1;
                        if depth == 0 {
                            i += 1;
                            break;
                        }
                    }
                    '\n' if depth == 0 => break,
                    _ => {}
                }
                i += 1;
            }
            span(&mut out, "a", &text(start, i));
        } else if c.is_ascii_digit() {
            while i < chars.len() && (chars[i].is_ascii_alphanumeric() || chars[i] == '_' || chars[i] == '.') {
                // `1..2` is two numbers and a range.
                if chars[i] == '.'
                    && (chars.get(i + 1) == Some(&'.') || !chars.get(i + 1).is_some_and(char::is_ascii_digit))
                {
                    break;
                }
                i += 1;
            }
            span(&mut out, "n", &text(start, i));
        } else if c.is_alphabetic() || c == '_' {
            while i < chars.len() && (chars[i].is_alphanumeric() || chars[i] == '_') {
                i += 1;
            }
            let word = text(start, i);
            if chars.get(i) == Some(&'!') && chars.get(i + 1) != Some(&'=') {
                i += 1;
                span(&mut out, "m", &text(start, i));
            } else if KEYWORDS.contains(&word.as_str()) {
                span(&mut out, "k", &word);
            } else if word.starts_with(|c: char| c.is_uppercase()) {
                span(&mut out, "t", &word);
            } else {
                out.push_str(&escape(&word));
            }
        } else {
            out.push_str(&escape(&c.to_string()));
            i += 1;
        }
    }
    out
}

/// Where a raw string (`r"…"`, `r#"…"#`, `br#"…"#`) starting at `i` ends, if one does.
fn raw_string_end(chars: &[char], i: usize) -> Option<usize> {
    let mut j = i;
    if chars.get(j) == Some(&'b') {
        j += 1;
    }
    if chars.get(j) != Some(&'r') {
        return None;
    }
    // Not the end of an identifier such as `bar"`: the caller only asks at a token's start,
    // and `r` must be followed by `#`s and a quote.
    j += 1;
    let mut hashes = 0;
    while chars.get(j) == Some(&'#') {
        hashes += 1;
        j += 1;
    }
    if chars.get(j) != Some(&'"') {
        return None;
    }
    j += 1;
    while j < chars.len() {
        if chars[j] == '"' && (1..=hashes).all(|k| chars.get(j + k) == Some(&'#')) {
            return Some(j + 1 + hashes);
        }
        j += 1;
    }
    Some(chars.len())
}

/// Where a character literal starting at `i` ends, or `None` for a lifetime.
fn char_literal_end(chars: &[char], i: usize) -> Option<usize> {
    match chars.get(i + 1)? {
        '\\' => {
            let mut j = i + 2;
            while j < chars.len() && chars[j] != '\'' && chars[j] != '\n' {
                j += 1;
            }
            (chars.get(j) == Some(&'\'')).then_some(j + 1)
        }
        _ => (chars.get(i + 2) == Some(&'\'')).then_some(i + 3),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_marked_and_everything_is_escaped() {
        let html = rust("pub fn a<'a>(x: &'a str) -> Vec<u8> { println!(\"<b>\"); 'c'; 0x1F } // </pre>");
        assert_eq!(
            html,
            "<span class=\"k\">pub</span> <span class=\"k\">fn</span> a&lt;<span class=\"l\">&#39;a</span>&gt;(x: \
             &amp;<span class=\"l\">&#39;a</span> str) -&gt; <span class=\"t\">Vec</span>&lt;u8&gt; { \
             <span class=\"m\">println!</span>(<span class=\"s\">&quot;&lt;b&gt;&quot;</span>); \
             <span class=\"s\">&#39;c&#39;</span>; <span class=\"n\">0x1F</span> } \
             <span class=\"c\">// &lt;/pre&gt;</span>"
        );
    }

    #[test]
    fn raw_strings_attributes_nested_comments_and_ranges() {
        assert_eq!(rust("r#\"a\"b\"#"), "<span class=\"s\">r#&quot;a&quot;b&quot;#</span>");
        assert_eq!(rust("#[derive(Debug)]"), "<span class=\"a\">#[derive(Debug)]</span>");
        assert_eq!(rust("/* a /* b */ c */x"), "<span class=\"c\">/* a /* b */ c */</span>x");
        assert_eq!(rust("0..10"), "<span class=\"n\">0</span>..<span class=\"n\">10</span>");
        assert_eq!(rust("bar\"x\""), "bar<span class=\"s\">&quot;x&quot;</span>");
        // Whatever it is given, it ends, and gives back every character.
        for text in ["\"unterminated", "'", "r#\"", "/* open", "#[", "b'", "x!="] {
            let html = rust(text);
            let back = html
                .replace("&lt;", "<")
                .replace("&gt;", ">")
                .replace("&quot;", "\"")
                .replace("&#39;", "'")
                .replace("&amp;", "&");
            let stripped: String = {
                let mut s = String::new();
                let mut in_tag = false;
                for c in back.chars() {
                    match c {
                        '<' if !in_tag => in_tag = true,
                        '>' if in_tag => in_tag = false,
                        c if !in_tag => s.push(c),
                        _ => {}
                    }
                }
                s
            };
            assert_eq!(stripped, text, "{html}");
        }
    }
}
