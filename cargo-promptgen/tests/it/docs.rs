//! The README and the guide in `docs/` stay whole: every relative link points to a file that
//! exists (and to a heading that exists, when it names one), and the README stays a first
//! screen (at most 12 KB).

use std::path::{Path, PathBuf};

const README_MAX_BYTES: usize = 12 * 1024;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
}

/// README.md and every `docs/*.md`.
fn pages() -> Vec<PathBuf> {
    let mut pages = vec![root().join("README.md")];
    let docs = std::fs::read_dir(root().join("docs")).expect("the docs/ folder");
    let mut guide: Vec<PathBuf> =
        docs.map(|e| e.unwrap().path()).filter(|p| p.extension().is_some_and(|x| x == "md")).collect();
    guide.sort();
    assert!(!guide.is_empty(), "docs/ holds no .md page");
    pages.extend(guide);
    pages
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()))
}

/// The page's lines outside fenced code blocks, with inline code spans blanked.
fn prose(text: &str) -> Vec<String> {
    let mut fenced = false;
    let mut lines = Vec::new();
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if fenced {
            continue;
        }
        let mut out = String::new();
        for (n, part) in line.split('`').enumerate() {
            out.push_str(if n % 2 == 0 { part } else { "code" });
        }
        lines.push(out);
    }
    lines
}

/// The targets of the page's `[text](target)` and `![alt](target)` links.
fn links(text: &str) -> Vec<String> {
    let mut targets = Vec::new();
    for line in prose(text) {
        let mut rest = line.as_str();
        while let Some(at) = rest.find("](") {
            let after = &rest[at + 2..];
            let Some(end) = after.find(')') else { break };
            targets.push(after[..end].trim().to_string());
            rest = &after[end..];
        }
    }
    targets
}

/// GitHub's anchor of a heading: lower case, punctuation dropped, spaces as hyphens.
fn anchor(heading: &str) -> String {
    let text = heading.trim_start_matches('#').trim().to_lowercase();
    text.chars()
        .filter(|c| c.is_alphanumeric() || *c == ' ' || *c == '-' || *c == '_')
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

/// The anchors of a Markdown page's headings (`-1`, `-2`, ... for repeated ones, as GitHub does).
fn anchors(text: &str) -> Vec<String> {
    let (mut bases, mut anchors) = (Vec::new(), Vec::new());
    let mut fenced = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
        } else if !fenced && line.starts_with('#') {
            let base = anchor(line);
            let repeats = bases.iter().filter(|b| **b == base).count();
            anchors.push(if repeats == 0 { base.clone() } else { format!("{base}-{repeats}") });
            bases.push(base);
        }
    }
    anchors
}

/// Every broken relative link of `page`, as `page: target (why)`.
fn broken_links(page: &Path) -> Vec<String> {
    let text = read(page);
    let dir = page.parent().unwrap();
    let name = page.strip_prefix(root()).unwrap_or(page).display().to_string();
    let mut broken = Vec::new();
    for target in links(&text) {
        if target.contains("://") || target.starts_with("mailto:") {
            continue;
        }
        let (file, fragment) = match target.split_once('#') {
            Some((file, fragment)) => (file, Some(fragment)),
            None => (target.as_str(), None),
        };
        let file = if file.is_empty() { page.to_path_buf() } else { dir.join(file) };
        if !file.exists() {
            broken.push(format!("{name}: {target} (no such file)"));
            continue;
        }
        if let Some(fragment) = fragment {
            let is_markdown = file.extension().is_some_and(|x| x == "md");
            if !is_markdown || !anchors(&read(&file)).iter().any(|a| a == fragment) {
                broken.push(format!("{name}: {target} (no heading with that anchor)"));
            }
        }
    }
    broken
}

#[test]
fn every_relative_link_points_to_a_file_and_heading_that_exist() {
    let broken: Vec<String> = pages().iter().flat_map(|page| broken_links(page)).collect();
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}

#[test]
fn the_readme_links_every_docs_page() {
    let readme = read(&root().join("README.md"));
    let linked = links(&readme);
    for page in pages().iter().skip(1) {
        let name = format!("docs/{}", page.file_name().unwrap().to_string_lossy());
        assert!(linked.iter().any(|l| l.split('#').next() == Some(name.as_str())), "README.md does not link {name}");
    }
    for page in ["ARCHITECTURE.md", "BENCHMARKS.md"] {
        assert!(linked.iter().any(|l| l == page), "README.md does not link {page}");
    }
}

#[test]
fn the_readme_stays_a_first_screen() {
    let bytes = read(&root().join("README.md")).len();
    assert!(
        bytes <= README_MAX_BYTES,
        "README.md is {bytes} bytes; keep it at most {README_MAX_BYTES} and move the rest to docs/"
    );
}

#[test]
fn the_checker_sees_what_it_must() {
    let page = "See [a](docs/a.md#b-c) and ![p](x.png), not `[c](d)`.\n```\n[e](f)\n```\n";
    assert_eq!(links(page), ["docs/a.md#b-c", "x.png"]);
    assert_eq!(anchor("## Commit prompts, not code: `store = \"cache\"`"), "commit-prompts-not-code-store--cache");
    assert_eq!(anchors("# A\n## A\n```\n# not a heading\n```\n## B: `c`\n"), ["a", "a-1", "b-c"]);
}
