//! Editing the manifest: setting `store` (`cargo promptgen store --to`).

use super::chain::PACKAGE_PREFIX;
use super::source::Doc;
use super::store::StoreMode;

/// `text`, a package manifest, with `store = "<mode>"` in its `[package.metadata.promptgen]`
/// table: the value replaced where the table sets it, else a line added under the table's
/// header, everything else byte for byte as it was. `Err` says the line to add by hand when the
/// table has no header of its own (written inline, or with dotted keys under `[package]`), or
/// when the result would not read back as that mode.
pub fn with_store(text: &str, mode: StoreMode) -> Result<String, String> {
    let line = format!("store = \"{mode}\"");
    let by_hand = || format!("add `{line}` to its `[{PACKAGE_PREFIX}]` table");
    let doc = Doc::parse(text).ok_or_else(by_hand)?;
    let key = format!("{PACKAGE_PREFIX}.store");
    let set = doc.entries().into_iter().find(|(path, _, _)| *path == key).map(|(_, _, value)| value.span());
    let edited = match set {
        Some(span) => format!("{}\"{mode}\"{}", &text[..span.start], &text[span.end..]),
        None => {
            // Just after the line `[package.metadata.promptgen]` (spaces and a comment allowed).
            let mut offset = 0;
            let mut after_header = None;
            for candidate in text.split_inclusive('\n') {
                let code = candidate.split('#').next().unwrap_or("");
                let compact: String = code.chars().filter(|c| !c.is_whitespace()).collect();
                offset += candidate.len();
                if compact == format!("[{PACKAGE_PREFIX}]") {
                    after_header = Some((offset, candidate.ends_with('\n')));
                    break;
                }
            }
            let (at, newline) = after_header.ok_or_else(by_hand)?;
            let newline = if newline { "" } else { "\n" };
            format!("{}{newline}{line}\n{}", &text[..at], &text[at..])
        }
    };
    let read: toml::Table = toml::from_str(&edited).map_err(|_| by_hand())?;
    let store = read
        .get("package")
        .and_then(|v| v.get("metadata"))
        .and_then(|v| v.get("promptgen"))
        .and_then(|v| v.get("store"))
        .and_then(|v| v.as_str());
    if store == Some(mode.as_str()) { Ok(edited) } else { Err(by_hand()) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_store_is_set_in_the_manifest_and_nothing_else_changes() {
        let manifest = "[package]\nname = \"x\"\n\n[package.metadata.promptgen] # the chain\nmodel = \"m\"\n";
        let cache = with_store(manifest, StoreMode::Cache).unwrap();
        assert_eq!(cache, manifest.replace("# the chain\n", "# the chain\nstore = \"cache\"\n"));
        let repo = with_store(&cache, StoreMode::Repo).unwrap();
        assert_eq!(repo, cache.replace("store = \"cache\"", "store = \"repo\""));
        let no_newline = "[package]\nname = \"x\"\n[package.metadata.promptgen]";
        assert_eq!(with_store(no_newline, StoreMode::Cache).unwrap(), format!("{no_newline}\nstore = \"cache\"\n"));
        let inline = "[package]\nname = \"x\"\nmetadata.promptgen = { model = \"m\" }\n";
        let err = with_store(inline, StoreMode::Cache).unwrap_err();
        assert_eq!(err, "add `store = \"cache\"` to its `[package.metadata.promptgen]` table");
    }
}
