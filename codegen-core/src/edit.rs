//! Exact-match edits: replace an `old` string that occurs once in a file by `new`.
//!
//! This is what `edit_file` runs (the sandbox decides *which* file; this module only the
//! text). The rule is the one Claude Code's `Edit` and SWE-agent's `str_replace` follow,
//! because it makes a model's intent checkable: `old` must match exactly one place. Zero or
//! several matches are refused with what the model needs to try again: the line of every
//! match, or the lines nearest to what it sent. A match that differs only in trailing
//! whitespace or line endings (models drop trailing spaces and write `\n` for `\r\n`) is
//! accepted and said to be loose.
//!
//! The edits of one call apply in order, each to the text the one before it left, and all or
//! none: the first that fails leaves the file as it was.

use std::fmt;

/// One replacement.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Edit {
    /// The text to find: it must occur exactly once.
    pub old: String,
    /// What replaces it.
    pub new: String,
}

/// The edits applied, and the text they made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Applied {
    /// The whole new text.
    pub text: String,
    /// For each edit, in order: the line its match started on (1-based, in the text as that
    /// edit found it), and whether it matched only loosely (trailing whitespace or line
    /// endings differ).
    pub matches: Vec<Match>,
}

/// Where one edit matched.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Match {
    /// The first line of the match, 1-based.
    pub line: usize,
    /// It matched only once trailing whitespace and line endings were set aside.
    pub loose: bool,
}

/// Why the edits were not applied (none of them was). `Display` is the model-facing sentence.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EditProblem {
    /// No edits were sent.
    NoEdits,
    /// An edit's `old` is empty (or only whitespace).
    EmptyOld {
        /// Which edit, from 0.
        index: usize,
    },
    /// An edit's `old` matches nowhere, even loosely.
    NotFound {
        /// Which edit, from 0.
        index: usize,
        /// The first non-blank line of its `old`, trimmed.
        first_line: String,
        /// The lines most like it, best first: number (from 1) and text.
        nearest: Vec<(usize, String)>,
    },
    /// An edit's `old` matches several places.
    Ambiguous {
        /// Which edit, from 0.
        index: usize,
        /// The line each match starts on, from 1.
        lines: Vec<usize>,
        /// They are loose matches (no exact one was found).
        loose: bool,
    },
}

/// Lines of a match list shown to the model, at most.
const MAX_LINES_SHOWN: usize = 20;
/// Nearest lines shown when nothing matches.
const NEAREST_SHOWN: usize = 3;
/// Characters of a line compared or shown.
const LINE_CHARS: usize = 160;

impl EditProblem {
    fn which(index: usize, count: usize) -> String {
        if count == 1 { "`old`".to_string() } else { format!("the `old` of edit {} of {count}", index + 1) }
    }

    /// The sentence for the model, for a call of `count` edits.
    pub fn describe(&self, count: usize) -> String {
        let none = if count > 1 { " No edit of this call was applied." } else { " The file was not changed." };
        match self {
            EditProblem::NoEdits => {
                "no edit was given: send `old` (text copied exactly from the file) and `new` (what replaces it)."
                    .to_string()
            }
            EditProblem::EmptyOld { index } => format!(
                "{} is empty; copy the lines to change from the file into `old` (to write a whole file, use write_file).{none}",
                Self::which(*index, count)
            ),
            EditProblem::NotFound { index, first_line, nearest } => {
                let mut text = format!("{} matches nothing in the file", Self::which(*index, count));
                if nearest.is_empty() {
                    text.push_str(&format!(", and no line resembles its first line `{}`", shorten(first_line)));
                } else {
                    let shown: Vec<String> =
                        nearest.iter().map(|(line, text)| format!("line {line}: `{}`", shorten(text))).collect();
                    text.push_str(&format!(
                        "; the lines nearest to its first line `{}` are {}",
                        shorten(first_line),
                        shown.join(", ")
                    ));
                }
                text.push_str(". Copy `old` exactly from the file (read_file shows it as it is now).");
                text.push_str(none);
                text
            }
            EditProblem::Ambiguous { index, lines, loose } => {
                let mut shown: Vec<String> = lines.iter().take(MAX_LINES_SHOWN).map(usize::to_string).collect();
                if lines.len() > MAX_LINES_SHOWN {
                    shown.push(format!("and {} more", lines.len() - MAX_LINES_SHOWN));
                }
                format!(
                    "{} matches {} places{} (lines {}); include more of the lines around the one to change so that it \
                     matches only one.{none}",
                    Self::which(*index, count),
                    lines.len(),
                    if *loose { " once trailing whitespace is set aside" } else { "" },
                    shown.join(", ")
                )
            }
        }
    }
}

impl fmt::Display for EditProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.describe(1))
    }
}

/// Applies `edits` to `text` in order, all or none.
pub fn apply(text: &str, edits: &[Edit]) -> Result<Applied, EditProblem> {
    if edits.is_empty() {
        return Err(EditProblem::NoEdits);
    }
    let mut current = text.to_string();
    let mut matches = Vec::with_capacity(edits.len());
    for (index, edit) in edits.iter().enumerate() {
        let (range, found) = locate(&current, &edit.old, index)?;
        current.replace_range(range, &edit.new);
        matches.push(found);
    }
    Ok(Applied { text: current, matches })
}

/// The one byte range of `text` that `old` matches, exactly or else loosely.
fn locate(text: &str, old: &str, index: usize) -> Result<(std::ops::Range<usize>, Match), EditProblem> {
    if old.is_empty() {
        return Err(EditProblem::EmptyOld { index });
    }
    let exact = occurrences(text, old);
    match exact.as_slice() {
        [start] => return Ok((*start..start + old.len(), Match { line: line_of(text, *start), loose: false })),
        [] => {}
        several => {
            return Err(EditProblem::Ambiguous {
                index,
                lines: several.iter().map(|&start| line_of(text, start)).collect(),
                loose: false,
            });
        }
    }
    let (norm_text, map) = normalized(text);
    let (norm_old, _) = normalized(old);
    if norm_old.trim().is_empty() {
        return Err(EditProblem::EmptyOld { index });
    }
    let loose = occurrences(&norm_text, &norm_old);
    match loose.as_slice() {
        [start] => {
            let begin = map[*start];
            // The end is where the next kept byte is: trailing whitespace the match ended before
            // is replaced with it.
            let end = map[start + norm_old.len()];
            Ok((begin..end, Match { line: line_of(text, begin), loose: true }))
        }
        [] => {
            let first_line = old.lines().map(str::trim).find(|l| !l.is_empty()).unwrap_or_default().to_string();
            Err(EditProblem::NotFound { index, nearest: nearest_lines(text, &first_line), first_line })
        }
        several => Err(EditProblem::Ambiguous {
            index,
            lines: several.iter().map(|&start| line_of(text, map[start])).collect(),
            loose: true,
        }),
    }
}

/// Every start of `needle` in `haystack`, overlapping ones included.
fn occurrences(haystack: &str, needle: &str) -> Vec<usize> {
    let mut found = Vec::new();
    let mut from = 0;
    while let Some(at) = haystack[from..].find(needle) {
        let start = from + at;
        found.push(start);
        // On to the next character: a match may overlap the one before it.
        from = start + haystack[start..].chars().next().map_or(1, char::len_utf8);
        if from > haystack.len() {
            break;
        }
    }
    found
}

/// `text` with `\r\n` made `\n` and each line's trailing spaces and tabs removed, and for each
/// byte of it the byte of `text` it came from (with one more entry: the end of `text`).
fn normalized(text: &str) -> (String, Vec<usize>) {
    let mut out = String::with_capacity(text.len());
    let mut map = Vec::with_capacity(text.len() + 1);
    let mut offset = 0;
    for segment in text.split_inclusive('\n') {
        let (body, newline) = match segment.strip_suffix('\n') {
            Some(body) => (body.strip_suffix('\r').unwrap_or(body), Some(segment.len() - 1)),
            None => (segment, None),
        };
        let kept = body.trim_end_matches([' ', '\t']);
        out.push_str(kept);
        map.extend((0..kept.len()).map(|i| offset + i));
        if let Some(at) = newline {
            out.push('\n');
            map.push(offset + at);
        }
        offset += segment.len();
    }
    map.push(text.len());
    (out, map)
}

/// The 1-based line of byte `at`.
fn line_of(text: &str, at: usize) -> usize {
    text.as_bytes()[..at.min(text.len())].iter().filter(|&&b| b == b'\n').count() + 1
}

/// The lines of `text` most like `wanted` (trimmed), best first, with their numbers; none
/// when nothing is at least half alike.
fn nearest_lines(text: &str, wanted: &str) -> Vec<(usize, String)> {
    if wanted.is_empty() {
        return Vec::new();
    }
    let wanted: Vec<char> = wanted.chars().take(LINE_CHARS).collect();
    let mut scored: Vec<(f64, usize, String)> = text
        .lines()
        .enumerate()
        .filter_map(|(i, line)| {
            let trimmed = line.trim();
            if trimmed.is_empty() {
                return None;
            }
            let chars: Vec<char> = trimmed.chars().take(LINE_CHARS).collect();
            let distance = levenshtein(&wanted, &chars) as f64;
            let similarity = 1.0 - distance / wanted.len().max(chars.len()) as f64;
            (similarity >= 0.5).then(|| (similarity, i + 1, trimmed.to_string()))
        })
        .collect();
    // Best first; the earlier line among equals.
    scored.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
    scored.into_iter().take(NEAREST_SHOWN).map(|(_, line, text)| (line, text)).collect()
}

fn levenshtein(a: &[char], b: &[char]) -> usize {
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.iter().enumerate() {
        let mut diagonal = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let above = row[j + 1];
            row[j + 1] = if ca == cb { diagonal } else { 1 + diagonal.min(above).min(row[j]) };
            diagonal = above;
        }
    }
    row[b.len()]
}

fn shorten(line: &str) -> String {
    let mut out: String = line.chars().take(80).collect::<String>().replace('`', "'");
    if line.chars().count() > 80 {
        out.push('…');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn edit(old: &str, new: &str) -> Edit {
        Edit { old: old.into(), new: new.into() }
    }

    const FILE: &str = "fn a() {\n    1\n}\n\nfn b() {\n    1\n}\n";

    #[test]
    fn a_unique_match_is_replaced_and_the_rest_kept_byte_for_byte() {
        let applied = apply(FILE, &[edit("fn a() {\n    1", "fn a() {\n    2")]).unwrap();
        assert_eq!(applied.text, "fn a() {\n    2\n}\n\nfn b() {\n    1\n}\n");
        assert_eq!(applied.matches, [Match { line: 1, loose: false }]);
    }

    #[test]
    fn several_matches_are_refused_with_every_line() {
        let problem = apply(FILE, &[edit("    1\n", "    2\n")]).unwrap_err();
        assert_eq!(problem, EditProblem::Ambiguous { index: 0, lines: vec![2, 6], loose: false });
        assert!(problem.to_string().contains("matches 2 places (lines 2, 6)"), "{problem}");
        // Overlapping occurrences count.
        assert_eq!(occurrences("aaa", "aa"), [0, 1]);
    }

    #[test]
    fn no_match_names_the_nearest_lines() {
        let problem = apply(FILE, &[edit("fn c() {\n", "")]).unwrap_err();
        let EditProblem::NotFound { nearest, .. } = &problem else { panic!("{problem:?}") };
        assert_eq!(nearest[0].0, 1);
        assert_eq!(nearest[1], (5, "fn b() {".to_string()));
        let text = problem.to_string();
        assert!(text.contains("line 1: `fn a() {`") && text.contains("Copy `old` exactly"), "{text}");
        let far = apply(FILE, &[edit("completely different", "")]).unwrap_err();
        assert!(far.to_string().contains("no line resembles"), "{far}");
    }

    #[test]
    fn trailing_whitespace_and_line_endings_match_loosely() {
        let crlf = "fn a() {  \r\n    1\r\n}\r\n";
        let applied = apply(crlf, &[edit("fn a() {\n    1\n", "fn a() {\n    2\n")]).unwrap();
        assert_eq!(applied.text, "fn a() {\n    2\n}\r\n");
        assert_eq!(applied.matches, [Match { line: 1, loose: true }]);
        // The model's old has trailing spaces the file lacks.
        let applied = apply(FILE, &[edit("fn b() {   \n    1", "fn b() {\n    3")]).unwrap();
        assert!(applied.text.ends_with("fn b() {\n    3\n}\n") && applied.matches[0].loose);
        // Spaces inside a line are not whitespace to set aside.
        assert!(apply(FILE, &[edit("fn  a()", "x")]).is_err());
    }

    #[test]
    fn edits_apply_in_order_and_all_or_none() {
        let applied =
            apply(FILE, &[edit("fn a()", "fn first()"), edit("fn first() {\n    1", "fn first() {\n    9")]).unwrap();
        assert!(applied.text.starts_with("fn first() {\n    9\n}"), "{}", applied.text);
        let problem = apply(FILE, &[edit("fn a()", "fn first()"), edit("missing", "x")]).unwrap_err();
        assert!(matches!(problem, EditProblem::NotFound { index: 1, .. }));
        assert!(problem.describe(2).contains("No edit of this call was applied"), "{}", problem.describe(2));
        assert_eq!(apply(FILE, &[]).unwrap_err(), EditProblem::NoEdits);
        assert_eq!(apply(FILE, &[edit("", "x")]).unwrap_err(), EditProblem::EmptyOld { index: 0 });
        assert_eq!(apply(FILE, &[edit("  \n", "x")]).unwrap_err(), EditProblem::EmptyOld { index: 0 });
    }

    #[test]
    fn any_text_is_safe() {
        for text in ["", "\n", "\r", "é\r\n  ", "a\r\r\n"] {
            for old in ["é", "\r", "a\n", " ", "\n"] {
                let _ = apply(text, &[edit(old, "x")]);
            }
        }
    }
}
