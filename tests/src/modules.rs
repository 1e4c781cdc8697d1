//! The import graph of a crate's modules, read from its sources, and the cycles in it.
//!
//! Every module is a node: a file (`lib.rs` is `crate`, `a.rs` and `a/mod.rs` are `crate::a`,
//! `a/b.rs` is `crate::a::b`). A module points at each module a path in it names: `use` trees
//! (re-exports too), and paths in code that start with `crate::`, `super::`, `self::` or one of
//! its own child modules. Declaring a module (`mod b;`) is not importing it. A path names the deepest module that
//! is a prefix of it, so `crate::config::Chain` names `crate::config` (whose `mod.rs` may only
//! re-export it). Test modules (`#[cfg(test)] mod tests { ... }`), comments and string
//! literals are not read.
//!
//! The rule this keeps is that no module imports a module that imports it back, directly or
//! through others: a child names its siblings (`super::chain::Chain`), never what its parent
//! re-exports, and nothing names what `lib.rs` re-exports.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// A crate's modules and who imports whom.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModuleGraph {
    /// Each module (`crate`, `crate::a`, ...) with its file, relative to the source folder.
    pub files: BTreeMap<String, PathBuf>,
    /// Each module's imports: the modules its paths name (a `mod` declaration alone is not one).
    pub edges: BTreeMap<String, BTreeSet<String>>,
}

impl ModuleGraph {
    /// The graph of the crate whose root file is `root` (`src/lib.rs`). Only modules reached
    /// from the root through `mod` declarations are read, so another crate's files in the
    /// same folder (`src/bin/`) stay out.
    pub fn read(root: &Path) -> std::io::Result<ModuleGraph> {
        let dir = root.parent().unwrap_or(Path::new(".")).to_path_buf();
        let mut files = BTreeMap::new();
        let mut sources = BTreeMap::new();
        let mut pending = vec![("crate".to_string(), root.to_path_buf())];
        while let Some((module, path)) = pending.pop() {
            let text = strip(&std::fs::read_to_string(&path)?);
            // Where `mod x;` of this file looks for `x`: beside a root or `mod.rs`, else in a
            // folder named after the file.
            let is_dir_owner = module == "crate" || path.file_name().is_some_and(|n| n == "mod.rs");
            let children_dir =
                if is_dir_owner { path.parent().unwrap().to_path_buf() } else { path.with_extension("") };
            for child in declared_modules(&text) {
                let file = children_dir.join(format!("{child}.rs"));
                let file = if file.is_file() { file } else { children_dir.join(&child).join("mod.rs") };
                pending.push((format!("{module}::{child}"), file));
            }
            files.insert(module.clone(), path.strip_prefix(&dir).unwrap_or(&path).to_path_buf());
            sources.insert(module, text);
        }
        let mut edges = BTreeMap::new();
        for (module, text) in &sources {
            let children: BTreeSet<String> = declared_modules(text).into_iter().collect();
            let mut to = BTreeSet::new();
            for (path, inline) in referenced_paths(text) {
                if let Some(target) = resolve(&path, inline, module, &children, &files)
                    && target != *module
                {
                    to.insert(target);
                }
            }
            edges.insert(module.clone(), to);
        }
        Ok(ModuleGraph { files, edges })
    }

    /// How many imports there are in all.
    pub fn import_count(&self) -> usize {
        self.edges.values().map(BTreeSet::len).sum()
    }

    /// Every cycle: each set of two or more modules that import each other, directly or
    /// through others (a strongly connected component), with one path around it.
    pub fn cycles(&self) -> Vec<Cycle> {
        let names: Vec<&String> = self.files.keys().collect();
        let index: BTreeMap<&String, usize> = names.iter().enumerate().map(|(i, n)| (*n, i)).collect();
        let next: Vec<Vec<usize>> = names
            .iter()
            .map(|n| self.edges.get(*n).into_iter().flatten().filter_map(|t| index.get(t).copied()).collect())
            .collect();
        strongly_connected(&next)
            .into_iter()
            .filter(|component| component.len() > 1)
            .map(|component| {
                let inside: BTreeSet<usize> = component.iter().copied().collect();
                Cycle {
                    members: inside.iter().map(|&i| names[i].clone()).collect(),
                    path: walk_around(&next, &inside).into_iter().map(|i| names[i].clone()).collect(),
                }
            })
            .collect()
    }
}

/// Modules that import each other, directly or through others.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cycle {
    /// All of them, in order.
    pub members: Vec<String>,
    /// One way around, from the first member back to it.
    pub path: Vec<String>,
}

impl std::fmt::Display for Cycle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} modules ({}), e.g. {}", self.members.len(), self.members.join(", "), self.path.join(" -> "))
    }
}

/// Tarjan's algorithm, iteratively: the strongly connected components of `next`.
fn strongly_connected(next: &[Vec<usize>]) -> Vec<Vec<usize>> {
    let n = next.len();
    let (mut order, mut low, mut on_stack) = (vec![usize::MAX; n], vec![0; n], vec![false; n]);
    let (mut stack, mut components, mut counter) = (Vec::new(), Vec::new(), 0);
    for start in 0..n {
        if order[start] != usize::MAX {
            continue;
        }
        let mut work = vec![(start, 0)];
        while let Some(&mut (node, ref mut edge)) = work.last_mut() {
            if *edge == 0 && order[node] == usize::MAX {
                order[node] = counter;
                low[node] = counter;
                counter += 1;
                stack.push(node);
                on_stack[node] = true;
            }
            if let Some(&to) = next[node].get(*edge) {
                *edge += 1;
                if order[to] == usize::MAX {
                    work.push((to, 0));
                } else if on_stack[to] {
                    low[node] = low[node].min(order[to]);
                }
                continue;
            }
            work.pop();
            if let Some(&(parent, _)) = work.last() {
                low[parent] = low[parent].min(low[node]);
            }
            if low[node] == order[node] {
                let mut component = Vec::new();
                while let Some(member) = stack.pop() {
                    on_stack[member] = false;
                    component.push(member);
                    if member == node {
                        break;
                    }
                }
                components.push(component);
            }
        }
    }
    components
}

/// A path from the lowest module of a component back to it, through the component.
fn walk_around(next: &[Vec<usize>], inside: &BTreeSet<usize>) -> Vec<usize> {
    let start = *inside.iter().next().expect("a component has a member");
    // Breadth-first from `start` to an edge back into it.
    let mut came_from: BTreeMap<usize, usize> = BTreeMap::new();
    let mut queue = std::collections::VecDeque::from([start]);
    while let Some(node) = queue.pop_front() {
        for &to in next[node].iter().filter(|to| inside.contains(to)) {
            if to == start {
                let mut path = vec![node];
                while let Some(&before) = came_from.get(path.last().unwrap()) {
                    path.push(before);
                }
                path.reverse();
                path.push(start);
                return path;
            }
            if !came_from.contains_key(&to) && to != start {
                came_from.insert(to, node);
                queue.push_back(to);
            }
        }
    }
    inside.iter().copied().collect()
}

/// The module `path` names, seen from `inline` modules deep inside `module` (whose child
/// modules are `children`): the deepest known module that is a prefix of the path made
/// absolute. `None` for a path into another crate, or into the inline modules.
fn resolve(
    path: &[String],
    inline: usize,
    module: &str,
    children: &BTreeSet<String>,
    files: &BTreeMap<String, PathBuf>,
) -> Option<String> {
    let mut absolute: Vec<String> = module.split("::").map(str::to_string).collect();
    let mut segments = path.iter().peekable();
    match segments.peek().map(|s| s.as_str()) {
        Some("crate") => {
            absolute = vec!["crate".into()];
            segments.next();
        }
        Some("self") if inline == 0 => {
            segments.next();
        }
        Some("super") => {
            // The first `super`s leave the inline modules, the others the file's module.
            let mut inline = inline;
            while segments.peek().is_some_and(|s| *s == "super") {
                segments.next();
                match inline.checked_sub(1) {
                    Some(left) => inline = left,
                    None => {
                        absolute.pop();
                    }
                }
            }
            if inline > 0 {
                return None;
            }
        }
        Some("self") if inline > 0 => return None,
        Some(first) if inline == 0 && children.contains(first) => {}
        _ => return None,
    }
    absolute.extend(segments.cloned());
    (1..=absolute.len()).rev().map(|len| absolute[..len].join("::")).find(|prefix| files.contains_key(prefix))
}

/// The names of `mod x;` declarations (not inline `mod x { ... }` blocks).
fn declared_modules(text: &str) -> Vec<String> {
    let mut names = Vec::new();
    for statement in text.split(';') {
        let words: Vec<&str> = statement.split_whitespace().collect();
        if let Some(at) = words.iter().rposition(|w| *w == "mod")
            && at + 2 == words.len()
            && words[at + 1].chars().all(|c| c.is_alphanumeric() || c == '_')
            && !statement.contains('{')
        {
            names.push(words[at + 1].to_string());
        }
    }
    names
}

/// Every path the code names, with how many inline modules (`mod x { ... }`) it is inside:
/// each leaf of each `use` tree, and each path in the code that has at least two segments.
fn referenced_paths(text: &str) -> Vec<(Vec<String>, usize)> {
    let mut paths = Vec::new();
    let tokens = tokenize(text);
    // The brace depths at which the inline modules around the current token opened.
    let mut inline: Vec<usize> = Vec::new();
    let mut braces = 0;
    let mut i = 0;
    while i < tokens.len() {
        match tokens[i].as_str() {
            "{" => braces += 1,
            "}" => {
                braces -= 1;
                if inline.last() == Some(&braces) {
                    inline.pop();
                }
            }
            "mod" if tokens.get(i + 2).is_some_and(|t| t == "{") => {
                inline.push(braces);
                braces += 1;
                i += 3;
                continue;
            }
            _ => {}
        }
        if tokens[i] == "use" {
            let end = tokens[i..].iter().position(|t| t == ";").map_or(tokens.len(), |p| i + p);
            let mut found = Vec::new();
            expand_use(&tokens[i + 1..end], &mut Vec::new(), &mut found);
            paths.extend(found.into_iter().map(|path| (path, inline.len())));
            i = end + 1;
            continue;
        }
        // A path: ident (:: ident)+
        if is_ident(&tokens[i]) && tokens.get(i + 1).is_some_and(|t| t == "::") {
            let mut path = vec![tokens[i].clone()];
            let mut j = i + 1;
            while tokens.get(j).is_some_and(|t| t == "::") && tokens.get(j + 1).is_some_and(|t| is_ident(t)) {
                path.push(tokens[j + 1].clone());
                j += 2;
            }
            paths.push((path, inline.len()));
            i = j;
            continue;
        }
        i += 1;
    }
    paths
}

/// The leaves of a `use` tree (`a::{b, c::{d, e}}`), each prefixed with `prefix`.
fn expand_use(tokens: &[String], prefix: &mut Vec<String>, out: &mut Vec<Vec<String>>) {
    let mut i = 0;
    let depth = prefix.len();
    while i < tokens.len() {
        match tokens[i].as_str() {
            "{" => {
                // Each item of the group, up to the matching brace.
                let mut level = 0;
                let mut start = i + 1;
                let mut j = i;
                while j < tokens.len() {
                    match tokens[j].as_str() {
                        "{" => level += 1,
                        "}" => {
                            level -= 1;
                            if level == 0 {
                                break;
                            }
                        }
                        "," if level == 1 => {
                            expand_use(&tokens[start..j], prefix, out);
                            start = j + 1;
                        }
                        _ => {}
                    }
                    j += 1;
                }
                expand_use(&tokens[start..j.min(tokens.len())], prefix, out);
                prefix.truncate(depth);
                return;
            }
            "::" | "pub" | "(" | ")" | "in" => {}
            "as" => break,
            word if is_ident(word) || word == "*" => prefix.push(word.to_string()),
            _ => {}
        }
        i += 1;
    }
    // `pub(crate) use`: `crate` inside the visibility is not a path.
    if prefix.len() > depth && !(prefix.len() == 1 && prefix[0] == "self") {
        out.push(prefix.clone());
    }
    prefix.truncate(depth);
}

fn is_ident(token: &str) -> bool {
    token.chars().next().is_some_and(|c| c.is_alphabetic() || c == '_')
        && token.chars().all(|c| c.is_alphanumeric() || c == '_')
}

/// Identifiers, `::` and single punctuation characters.
fn tokenize(text: &str) -> Vec<String> {
    let mut tokens = Vec::new();
    let chars: Vec<char> = text.chars().collect();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        if c.is_alphanumeric() || c == '_' {
            let start = i;
            while i < chars.len() && (chars[i].is_alphanumeric() || chars[i] == '_') {
                i += 1;
            }
            tokens.push(chars[start..i].iter().collect());
        } else if c == ':' && chars.get(i + 1) == Some(&':') {
            tokens.push("::".into());
            i += 2;
        } else {
            if !c.is_whitespace() {
                tokens.push(c.to_string());
            }
            i += 1;
        }
    }
    tokens
}

/// `text` without comments, string and character literals, and `#[cfg(test)]` modules.
fn strip(text: &str) -> String {
    let chars: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        let next = chars.get(i + 1).copied();
        if c == '/' && next == Some('/') {
            while i < chars.len() && chars[i] != '\n' {
                i += 1;
            }
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
        } else if c == 'r' && (next == Some('"') || next == Some('#')) && !prev_is_ident(&chars, i) {
            // A raw string: r"..." or r#"..."#.
            let mut j = i + 1;
            let mut hashes = 0;
            while chars.get(j) == Some(&'#') {
                hashes += 1;
                j += 1;
            }
            if chars.get(j) != Some(&'"') {
                out.push(c);
                i += 1;
                continue;
            }
            j += 1;
            loop {
                if j >= chars.len() {
                    break;
                }
                if chars[j] == '"' && (0..hashes).all(|h| chars.get(j + 1 + h) == Some(&'#')) {
                    j += 1 + hashes;
                    break;
                }
                j += 1;
            }
            out.push_str("\"\"");
            i = j;
        } else if c == '"' {
            i += 1;
            while i < chars.len() && chars[i] != '"' {
                i += if chars[i] == '\\' { 2 } else { 1 };
            }
            out.push_str("\"\"");
            i += 1;
        } else if c == '\'' && is_char_literal(&chars, i) {
            i += 1;
            while i < chars.len() && chars[i] != '\'' {
                i += if chars[i] == '\\' { 2 } else { 1 };
            }
            out.push_str("' '");
            i += 1;
        } else {
            out.push(c);
            i += 1;
        }
    }
    cut_test_modules(&out)
}

fn prev_is_ident(chars: &[char], i: usize) -> bool {
    i > 0 && (chars[i - 1].is_alphanumeric() || chars[i - 1] == '_')
}

/// Whether the `'` at `i` opens a character literal rather than a lifetime or a label.
fn is_char_literal(chars: &[char], i: usize) -> bool {
    matches!((chars.get(i + 1), chars.get(i + 2)), (Some('\\'), _) | (Some(_), Some('\'')))
}

/// `text` without the modules marked `#[cfg(test)]` (`mod x { ... }`).
fn cut_test_modules(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find("#[cfg(test)]") {
        out.push_str(&rest[..at]);
        let after = &rest[at + "#[cfg(test)]".len()..];
        let trimmed = after.trim_start();
        let is_module = trimmed.starts_with("mod ") || trimmed.starts_with("pub mod ");
        match (is_module, trimmed.find('{'), trimmed.find(';')) {
            (true, Some(open), semi) if semi.is_none_or(|s| s > open) => {
                let start = after.len() - trimmed.len() + open;
                let mut depth = 0;
                let mut end = after.len();
                for (offset, c) in after[start..].char_indices() {
                    match c {
                        '{' => depth += 1,
                        '}' => {
                            depth -= 1;
                            if depth == 0 {
                                end = start + offset + 1;
                                break;
                            }
                        }
                        _ => {}
                    }
                }
                rest = &after[end..];
            }
            _ => {
                rest = after;
            }
        }
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn crate_of(files: &[(&str, &str)]) -> (tempfile::TempDir, ModuleGraph) {
        let dir = tempfile::tempdir().unwrap();
        for (path, text) in files {
            let path = dir.path().join(path);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, text).unwrap();
        }
        let graph = ModuleGraph::read(&dir.path().join("lib.rs")).unwrap();
        (dir, graph)
    }

    #[test]
    fn a_child_that_names_what_its_parent_re_exports_closes_a_cycle() {
        let (_dir, graph) = crate_of(&[
            ("lib.rs", "mod config;\nmod record;\n"),
            ("config/mod.rs", "mod chain;\nmod load;\npub use chain::Chain;\npub use load::load;\n"),
            ("config/chain.rs", "pub struct Chain;\n"),
            ("config/load.rs", "use crate::config::Chain;\npub fn load() {}\n"),
            (
                "record.rs",
                "use crate::config::Chain; // crate::record::x in a comment\nfn f() { let s = \"crate::lib\"; }\n",
            ),
        ]);
        let cycles = graph.cycles();
        assert_eq!(cycles.len(), 1, "{cycles:?}");
        assert_eq!(cycles[0].members, ["crate::config", "crate::config::load"]);
        assert_eq!(cycles[0].path, ["crate::config", "crate::config::load", "crate::config"]);
        assert!(graph.edges["crate::record"].contains("crate::config"));
        assert_eq!(graph.edges["crate::record"].len(), 1, "comments and strings are not read: {:?}", graph.edges);
    }

    #[test]
    fn siblings_named_through_super_and_test_modules_are_no_cycle() {
        let (_dir, graph) = crate_of(&[
            ("lib.rs", "mod a;\nmod b;\n"),
            ("a.rs", "use crate::b::{self, B};\npub struct A;\n#[cfg(test)]\nmod tests {\n    use crate::b::B;\n}\n"),
            ("b.rs", "mod inner;\npub struct B;\n#[cfg(test)]\nmod tests { use crate::a::A; }\n"),
            ("b/inner.rs", "use super::super::a::A;\nfn f() { let _ = 'x'; }\n"),
        ]);
        assert_eq!(graph.cycles(), Vec::<Cycle>::new(), "{:?}", graph.edges);
        assert!(graph.edges["crate::b::inner"].contains("crate::a"));
        assert!(!graph.edges["crate::b"].contains("crate::a"), "the test module is not read");
    }

    #[test]
    fn super_in_an_inline_module_is_the_file_itself() {
        let (_dir, graph) = crate_of(&[
            ("lib.rs", "mod a;\nmod b;\n"),
            ("a.rs", "pub mod ms {\n    use super::*;\n    pub fn f() { super::super::b::g() }\n}\npub fn x() {}\n"),
            ("b.rs", "pub fn g() { crate::a::x() }\n"),
        ]);
        assert_eq!(graph.edges["crate::a"], BTreeSet::from(["crate::b".to_string()]));
        assert_eq!(graph.cycles().len(), 1, "a -> b -> a: {:?}", graph.edges);
    }

    #[test]
    fn a_loop_through_three_files_is_found_from_its_lowest_module() {
        let (_dir, graph) = crate_of(&[
            ("lib.rs", "mod x;\nmod y;\nmod z;\n"),
            ("x.rs", "fn f() { crate::y::g(); }\n"),
            ("y.rs", "pub fn g() { crate::z::h() }\n"),
            ("z.rs", "pub(crate) use crate::x as back;\npub fn h() {}\n"),
        ]);
        let cycles = graph.cycles();
        assert_eq!(cycles.len(), 1, "{cycles:?}");
        assert_eq!(cycles[0].path, ["crate::x", "crate::y", "crate::z", "crate::x"]);
        assert_eq!(
            cycles[0].to_string(),
            "3 modules (crate::x, crate::y, crate::z), e.g. crate::x -> crate::y -> crate::z -> crate::x"
        );
    }

    /// The library crates of this workspace, as `.ci/run` shows them.
    fn check_crate(name: &str) {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(name).join("src/lib.rs");
        let graph = ModuleGraph::read(&root).unwrap();
        let cycles = graph.cycles();
        println!("{name}: {} modules, {} imports, {} cycles", graph.files.len(), graph.import_count(), cycles.len());
        assert!(
            cycles.is_empty(),
            "modules of {name} import each other back:\n{}",
            cycles.iter().map(|c| format!("  {c}")).collect::<Vec<_>>().join("\n")
        );
        assert!(graph.files.len() > 10, "{name}: only {:?} were read", graph.files.keys());
    }

    #[test]
    fn module_graph_of_codegen_core_has_no_cycle() {
        check_crate("codegen-core");
    }

    #[test]
    fn module_graph_of_cargo_promptgen_has_no_cycle() {
        check_crate("cargo-promptgen");
    }
}
