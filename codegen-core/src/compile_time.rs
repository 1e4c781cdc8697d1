//! Files a Rust source would read when it is compiled, found lexically, so that model-written
//! code cannot reach around the sandbox through the compiler.
//!
//! The sandbox refuses `read_file(".env")`, but a model (or an input file that injects
//! instructions into it) could write `include_str!("/home/me/project/.env")` and let the
//! compile check quote the file back in an error. So every generated `.rs` file is scanned
//! before it is written: `include!`, `include_str!`, `include_bytes!` and `#[path = ...]` may
//! only name, with a plain string literal, a file inside the generated tree that is not
//! protected. An absolute path, a `..` that leaves the tree, a protected name (`.env`, `.git`,
//! keys) or a path built by a macro (`concat!`, `env!`) is refused, naming the construct.
//!
//! What this lexical rule cannot see: macros of dependencies that read files (a proc macro
//! can open anything when it runs), `build.rs` scripts, and code that reads files when it
//! runs rather than when it compiles (a test, say). The checks' confinement and the redaction
//! of their output cover those.

/// A construct that would read a file at compile time and is not allowed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CompileTimeRead {
    /// The construct as written, shortened (`include_str!("/etc/passwd")`).
    pub construct: String,
    /// Why it is refused.
    pub reason: String,
}

impl std::fmt::Display for CompileTimeRead {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "`{}` {}", self.construct, self.reason)
    }
}

/// The first construct in the Rust source `content`, to be written at `path` (relative to
/// the generated tree, forward slashes), that would read a file at compile time outside what
/// is allowed; `None` when there is none. `protected` says why a tree-relative path is
/// protected (the sandbox's rule), or `None`.
pub fn first_forbidden_read(
    path: &str,
    content: &str,
    protected: &dyn Fn(&str) -> Option<&'static str>,
) -> Option<CompileTimeRead> {
    let tokens = tokenize(content);
    let dir: Vec<&str> = path.rsplit_once('/').map(|(d, _)| d.split('/').collect()).unwrap_or_default();
    for (index, token) in tokens.iter().enumerate() {
        let argument = match token {
            Token::Ident(name) if ["include", "include_str", "include_bytes"].contains(&name.as_str()) => {
                if !matches!(tokens.get(index + 1), Some(Token::Punct('!'))) {
                    continue;
                }
                match (tokens.get(index + 2), tokens.get(index + 3), tokens.get(index + 4)) {
                    (
                        Some(Token::Punct('(' | '[' | '{')),
                        Some(Token::Str(literal)),
                        Some(Token::Punct(')' | ']' | '}')),
                    ) => Argument::Literal(literal.clone()),
                    _ => Argument::Built,
                }
            }
            // `path = "..."` inside an attribute: `#[path = "x.rs"]`, `#[cfg_attr(c, path = "x.rs")]`.
            Token::Ident(name) if name == "path" && in_attribute(&tokens, index) => {
                match (tokens.get(index + 1), tokens.get(index + 2)) {
                    (Some(Token::Punct('=')), Some(Token::Str(literal))) => Argument::Literal(literal.clone()),
                    _ => continue,
                }
            }
            _ => continue,
        };
        let construct = shown(&tokens, index);
        let reason = match argument {
            Argument::Built => Some(
                "builds the path of a file to read at compile time, which cannot be checked; generated code may only \
                 include files of the generated tree, named by a plain string literal"
                    .to_string(),
            ),
            Argument::Literal(literal) => reason_to_refuse(&dir, &literal, protected),
        };
        if let Some(reason) = reason {
            return Some(CompileTimeRead { construct, reason });
        }
    }
    None
}

enum Argument {
    Literal(String),
    Built,
}

/// Why reading `literal` from a file in `dir` at compile time is refused, or `None`.
fn reason_to_refuse(dir: &[&str], literal: &str, protected: &dyn Fn(&str) -> Option<&'static str>) -> Option<String> {
    let bytes = literal.as_bytes();
    if literal.starts_with('/')
        || literal.starts_with('\\')
        || (bytes.len() >= 2 && bytes[0].is_ascii_alphabetic() && bytes[1] == b':')
    {
        return Some(
            "reads a file by its absolute path; generated code may only include files of the generated tree".into(),
        );
    }
    let mut resolved: Vec<&str> = dir.to_vec();
    for part in literal.split(['/', '\\']) {
        match part {
            "" | "." => {}
            ".." => {
                if resolved.pop().is_none() {
                    return Some(
                        "reads a file outside the generated tree (its `..` leaves it); generated code may only include \
                         files of the generated tree"
                            .into(),
                    );
                }
            }
            part => resolved.push(part),
        }
    }
    let joined = resolved.join("/");
    protected(&joined).map(|why| format!("reads `{joined}`, which is protected ({why})"))
}

/// Whether the token at `index` sits inside `#[...]` or `#![...]`.
fn in_attribute(tokens: &[Token], index: usize) -> bool {
    let mut depth = 0usize;
    for i in (0..index).rev() {
        match &tokens[i] {
            Token::Punct(']' | ')' | '}') => depth += 1,
            Token::Punct('(' | '{') => depth = depth.saturating_sub(1),
            Token::Punct('[') => {
                if depth == 0 {
                    let before = i.checked_sub(1).map(|j| &tokens[j]);
                    let before2 = i.checked_sub(2).map(|j| &tokens[j]);
                    return matches!(before, Some(Token::Punct('#')))
                        || (matches!(before, Some(Token::Punct('!'))) && matches!(before2, Some(Token::Punct('#'))));
                }
                depth -= 1;
            }
            Token::Punct(';') if depth == 0 => return false,
            _ => {}
        }
    }
    false
}

/// The construct starting at `index`, as a short text for messages.
fn shown(tokens: &[Token], index: usize) -> String {
    let mut out = String::new();
    let mut depth = 0i32;
    for token in tokens.iter().skip(index).take(24) {
        match token {
            Token::Ident(name) => {
                if out.ends_with(|c: char| c.is_alphanumeric() || c == '_') {
                    out.push(' ');
                }
                out.push_str(name);
            }
            Token::Str(text) => out.push_str(&format!("{text:?}")),
            Token::Punct(c) => {
                match c {
                    '(' | '[' | '{' => depth += 1,
                    ')' | ']' | '}' => depth -= 1,
                    _ => {}
                }
                if *c == '=' {
                    out.push_str(" = ");
                } else if *c == ',' {
                    out.push_str(", ");
                } else {
                    out.push(*c);
                }
                if depth <= 0 && matches!(c, ')' | ']' | '}') {
                    break;
                }
            }
        }
    }
    out.chars().take(120).collect()
}

/// The tokens that matter here: identifiers, string literals (their value) and single
/// punctuation characters; comments, char literals, numbers and lifetimes are skipped.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Token {
    Ident(String),
    Str(String),
    Punct(char),
}

fn tokenize(source: &str) -> Vec<Token> {
    let chars: Vec<char> = source.chars().collect();
    let mut tokens = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        let next = chars.get(i + 1).copied();
        if c.is_whitespace() {
            i += 1;
        } else if c == '/' && next == Some('/') {
            while i < chars.len() && chars[i] != '\n' {
                i += 1;
            }
        } else if c == '/' && next == Some('*') {
            // Block comments nest in Rust.
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
        } else if let Some((value, end)) = string_literal(&chars, i) {
            tokens.push(Token::Str(value));
            i = end;
        } else if c == '\'' {
            i = skip_char_or_lifetime(&chars, i);
        } else if c.is_alphabetic() || c == '_' {
            let start = i;
            while i < chars.len() && (chars[i].is_alphanumeric() || chars[i] == '_') {
                i += 1;
            }
            tokens.push(Token::Ident(chars[start..i].iter().collect()));
        } else if c.is_ascii_digit() {
            // Digits, a suffix (`1u8`, `0xff`, `1e9`), and a `.` only before a digit: `0..x` is
            // a number, a range and `x`, and `x` may be `include!`.
            while i < chars.len()
                && (chars[i].is_alphanumeric()
                    || chars[i] == '_'
                    || (chars[i] == '.' && chars.get(i + 1).is_some_and(char::is_ascii_digit)))
            {
                i += 1;
            }
        } else {
            tokens.push(Token::Punct(c));
            i += 1;
        }
    }
    tokens
}

/// A string literal starting at `start` (`"..."`, `b"..."`, `c"..."`, `r"..."`, `r#"..."#`,
/// `br#"..."#`): its value, with every escape of a plain string resolved as rustc resolves it
/// (`\x2e`, `\u{2e}` and a line continuation included, so a path cannot hide a `..` in one),
/// and where it ends; `None` if none starts there.
fn string_literal(chars: &[char], start: usize) -> Option<(String, usize)> {
    let mut i = start;
    if matches!(chars.get(i), Some('b' | 'c')) {
        i += 1;
    }
    let raw = chars.get(i) == Some(&'r');
    if raw {
        i += 1;
        let mut hashes = 0;
        while chars.get(i) == Some(&'#') {
            hashes += 1;
            i += 1;
        }
        if chars.get(i) != Some(&'"') {
            return None;
        }
        i += 1;
        let body = i;
        loop {
            if i >= chars.len() {
                return Some((chars[body..].iter().collect(), chars.len()));
            }
            if chars[i] == '"' && (0..hashes).all(|h| chars.get(i + 1 + h) == Some(&'#')) {
                return Some((chars[body..i].iter().collect(), i + 1 + hashes));
            }
            i += 1;
        }
    }
    if chars.get(i) != Some(&'"') {
        return None;
    }
    // An identifier that merely starts with `b`, `c` or `r` is not a literal.
    if i > start && start > 0 && (chars[start - 1].is_alphanumeric() || chars[start - 1] == '_') {
        return None;
    }
    i += 1;
    let mut value = String::new();
    while i < chars.len() {
        match chars[i] {
            '"' => return Some((value, i + 1)),
            '\\' => i = escape(chars, i, &mut value),
            other => {
                value.push(other);
                i += 1;
            }
        }
    }
    Some((value, chars.len()))
}

/// Resolves the escape at `chars[at]` (a backslash) into `value`; returns where it ends. An
/// escape rustc would refuse resolves to U+FFFD, which no path component matches.
fn escape(chars: &[char], at: usize, value: &mut String) -> usize {
    let hex = |digits: &[char]| u32::from_str_radix(&digits.iter().collect::<String>(), 16).ok();
    match chars.get(at + 1) {
        Some('n') => value.push('\n'),
        Some('r') => value.push('\r'),
        Some('t') => value.push('\t'),
        Some('0') => value.push('\0'),
        Some('x') => {
            let end = (at + 4).min(chars.len());
            value.push(hex(&chars[at + 2..end]).and_then(char::from_u32).unwrap_or('\u{FFFD}'));
            return end;
        }
        Some('u') if chars.get(at + 2) == Some(&'{') => {
            let close = chars[at + 2..].iter().position(|&c| c == '}').map_or(chars.len(), |p| at + 2 + p);
            let digits: Vec<char> = chars[at + 3..close].iter().copied().filter(|&c| c != '_').collect();
            value.push(hex(&digits).and_then(char::from_u32).unwrap_or('\u{FFFD}'));
            return (close + 1).min(chars.len());
        }
        // A line continuation: the line break and the whitespace after it are not in the value.
        Some('\n' | '\r') => {
            let mut i = at + 1;
            while chars.get(i).is_some_and(|c| c.is_whitespace()) {
                i += 1;
            }
            return i;
        }
        Some(&other) => value.push(other),
        None => {}
    }
    at + 2
}

/// Past a char literal (`'a'`, `'\n'`, `'\u{1F600}'`) or a lifetime (`'a`) at `start`.
fn skip_char_or_lifetime(chars: &[char], start: usize) -> usize {
    let mut i = start + 1;
    if chars.get(i) == Some(&'\\') {
        i += 2;
        while i < chars.len() && chars[i] != '\'' && i - start < 12 {
            i += 1;
        }
        return (i + 1).min(chars.len());
    }
    if chars.get(i + 1) == Some(&'\'') {
        return i + 2;
    }
    // A lifetime or a label: an identifier follows.
    while i < chars.len() && (chars[i].is_alphanumeric() || chars[i] == '_') {
        i += 1;
    }
    i
}

#[cfg(test)]
mod tests {
    use super::*;

    fn protected(path: &str) -> Option<&'static str> {
        (path.split('/').any(|c| c.starts_with(".env")) || path.ends_with(".pem")).then_some("it holds secrets")
    }

    fn check(path: &str, content: &str) -> Option<String> {
        first_forbidden_read(path, content, &protected).map(|r| r.to_string())
    }

    #[test]
    fn reads_outside_the_tree_are_refused_naming_the_construct() {
        let refused = [
            ("include!(\"/home/me/project/.env\");", "include!(\"/home/me/project/.env\")", "absolute path"),
            ("const K: &str = include_str!(\"/etc/passwd\");", "include_str!(\"/etc/passwd\")", "absolute path"),
            (
                "static B: &[u8] = include_bytes!(\"../../Cargo.toml\");",
                "include_bytes!(\"../../Cargo.toml\")",
                "outside the generated tree",
            ),
            ("include!(\"sub/../../x.rs\");", "include!(\"sub/../../x.rs\")", "outside"),
            ("include_str!(\".env\")", "include_str!(\".env\")", "protected"),
            ("include_str!(r#\"C:\\secrets\"#)", "include_str!(\"C:\\\\secrets\")", "absolute path"),
            (
                "include!(concat!(env!(\"HOME\"), \"/.ssh/id_rsa\"));",
                "include!(concat!(env!(\"HOME\"), \"/.ssh/id_rsa\"))",
                "builds the path",
            ),
            ("#[path = \"/tmp/evil.rs\"]\nmod evil;", "path = \"/tmp/evil.rs\"", "absolute path"),
            ("#[cfg_attr(unix, path = \"../../../.env\")]\nmod evil;", "path = \"../../../.env\"", "outside"),
            ("include_str! [\"/etc/hosts\"]", "include_str![\"/etc/hosts\"]", "absolute path"),
            // A number does not swallow what follows a range.
            ("const N: () = { let _ = 0..include!(\"/etc/passwd\"); };", "include!(\"/etc/passwd\")", "absolute path"),
            ("let _ = 1.0..include_str!(\"/x\");", "include_str!(\"/x\")", "absolute path"),
            // Escapes are resolved as rustc resolves them.
            ("include_str!(\"\\x2e\\x2e/\\x2e\\x2e/Cargo.toml\")", "include_str!", "outside the generated tree"),
            ("include_str!(\"\\u{2e}\\u{2E}/Cargo.toml\")", "include_str!", "outside the generated tree"),
            ("include_str!(\"\\x2fetc/passwd\")", "include_str!", "absolute path"),
            ("include_str!(\"..\\\n    /..\\\n    /Cargo.toml\")", "include_str!", "outside the generated tree"),
            ("include_str!(\"\\u{2e}env\")", "include_str!", "protected"),
        ];
        for (content, construct, why) in refused {
            let text = check("a.rs", content).unwrap_or_else(|| panic!("not refused: {content}"));
            assert!(text.contains(construct) && text.contains(why), "{content}: {text}");
        }
        assert!(check("deep/a.rs", "include!(\"../../x.rs\");").unwrap().contains("outside"));
        assert!(check("deep/a.rs", "include_str!(\"keys/server.pem\");").unwrap().contains("protected"));
    }

    #[test]
    fn what_only_looks_like_a_read_is_left_alone() {
        let allowed = [
            "include!(\"helpers.rs\");",
            "include_str!(\"data/names.txt\")",
            "// include_str!(\"/etc/passwd\") in a comment\nfn a() {}",
            "/* nested /* include!(\"/x\") */ still a comment */ fn a() {}",
            "const S: &str = \"include_str!(\\\"/etc/passwd\\\")\";",
            "const R: &str = r#\"include!(\"/etc/passwd\")\"#;",
            "fn path() -> u8 { let path = \"/etc/passwd\"; 0 }",
            "fn f<'a>(x: &'a str) -> char { let path = '/'; 'x' }",
            "let include = 3; let include_str = include;",
            "let x = 1.5f64.max(0.0); let r = 0..10; let h = 0xff_u8;",
            "include_str!(\"data/\\x6eames.txt\")",
        ];
        for content in allowed {
            assert_eq!(check("a.rs", content), None, "{content}");
        }
        assert_eq!(check("deep/a.rs", "include!(\"../b.rs\");"), None);
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(500))]

        #[test]
        fn compile_time_scan_never_panics_on_any_model_text(
            content in proptest::prop_oneof![
                proptest::prelude::any::<String>(),
                "[a-z0-9\"'#!/*\\{}()\\[\\]._ \n-]{0,60}",
            ]
        ) {
            let _ = check("a.rs", &content);
        }

        /// No code before a read can hide it, as long as that code opens no string, character
        /// or comment (inside which the read would not be code).
        #[test]
        fn a_read_after_any_code_without_quotes_or_comments_is_seen(
            prefix in "[a-z0-9_.,;:+*=<>()\\[\\]{} \n&|^%-]{0,40}"
        ) {
            // Right after the prefix, unless that would make one identifier of the two.
            let joint = if prefix.ends_with(|c: char| c.is_alphanumeric() || c == '_') { " " } else { "" };
            let content = format!("{prefix}{joint}include_str!(\"/etc/passwd\")");
            proptest::prop_assert!(check("a.rs", &content).is_some(), "not refused: {}", content);
        }
    }
}
