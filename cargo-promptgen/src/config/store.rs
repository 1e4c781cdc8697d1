//! Where the outputs the lock records are kept: `store`, the cache folder the environment
//! names, and the cache's remote (`cache_url`). None of it changes a step's key: switching
//! stores leaves the lock as it is.

use std::fmt;
use std::path::{Path, PathBuf};

use serde::Deserialize;

/// The variable that names the cache folder; it beats the user's cache folder.
pub const CACHE_DIR_VAR: &str = "PROMPTGEN_CACHE_DIR";

/// A package's store, as resolved: where the files live, and the cache's folder and remote
/// (in either mode: a switch to the cache needs the folder, `pull` the remote).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StoreSettings {
    /// `store`, default [`StoreMode::Repo`].
    pub mode: StoreMode,
    /// The cache folder the environment names ([`default_dir`]); always set when `mode` is
    /// [`StoreMode::Cache`].
    pub cache_dir: Option<PathBuf>,
    /// The cache's shared remote (`cache_url`).
    pub cache_url: Option<CacheUrl>,
}

/// Where the outputs the lock records are kept: `store = "repo" | "cache"`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum StoreMode {
    /// In the package's `promptgen/` folder, committed beside the lock.
    #[default]
    Repo,
    /// In the content-addressed cache (`crate::record::cache`); only the lock is committed.
    Cache,
}

impl StoreMode {
    /// The mode as the manifest spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            StoreMode::Repo => "repo",
            StoreMode::Cache => "cache",
        }
    }
}

impl fmt::Display for StoreMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The cache folder the environment names: `PROMPTGEN_CACHE_DIR`, else the user's cache
/// folder (`$XDG_CACHE_HOME` or `~/.cache` on Linux and the BSDs, `~/Library/Caches` on macOS,
/// `%LOCALAPPDATA%` on Windows) joined with `promptgen`. `Ok(None)` when the environment names
/// none; `Err` with the variable and its value when `PROMPTGEN_CACHE_DIR` is not absolute.
pub fn default_dir(env: &dyn Fn(&str) -> Option<String>) -> Result<Option<PathBuf>, (&'static str, String)> {
    let var = |name: &str| env(name).filter(|v| !v.trim().is_empty());
    if let Some(dir) = var(CACHE_DIR_VAR) {
        return if Path::new(&dir).is_absolute() { Ok(Some(PathBuf::from(dir))) } else { Err((CACHE_DIR_VAR, dir)) };
    }
    let absolute = |name: &str| var(name).map(PathBuf::from).filter(|p| p.is_absolute());
    let user_cache = if cfg!(windows) {
        absolute("LOCALAPPDATA")
    } else if cfg!(target_os = "macos") {
        absolute("HOME").map(|home| home.join("Library/Caches"))
    } else {
        absolute("XDG_CACHE_HOME").or_else(|| absolute("HOME").map(|home| home.join(".cache")))
    };
    Ok(user_cache.map(|dir| dir.join("promptgen")))
}

/// `cache_url`: an S3 bucket and a key prefix (`s3://bucket/some/prefix`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CacheUrl {
    /// The bucket.
    pub bucket: String,
    /// The key prefix without slashes at either end; empty for the bucket's root.
    pub prefix: String,
}

impl CacheUrl {
    /// Reads `s3://bucket[/prefix]`. The bucket follows S3's rules (3 to 63 lower-case letters,
    /// digits, dots and hyphens, starting and ending with a letter or digit); the prefix is made
    /// of path segments of letters, digits and `-_.~!*'()+=,@`, none of them `.` or `..`.
    pub fn parse(text: &str) -> Result<CacheUrl, String> {
        let rest = text.strip_prefix("s3://").ok_or_else(|| "it does not start with `s3://`".to_string())?;
        let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
        let edge_ok = |c: Option<char>| c.is_some_and(|c| c.is_ascii_lowercase() || c.is_ascii_digit());
        if !(3..=63).contains(&bucket.len())
            || !bucket.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '.' || c == '-')
            || !edge_ok(bucket.chars().next())
            || !edge_ok(bucket.chars().last())
        {
            return Err(format!(
                "the bucket name `{bucket}` is not one S3 allows (3 to 63 lower-case letters, digits, dots and hyphens)"
            ));
        }
        let prefix = prefix.trim_matches('/');
        for segment in prefix.split('/').filter(|_| !prefix.is_empty()) {
            let allowed = |c: char| c.is_ascii_alphanumeric() || "-_.~!*'()+=,@".contains(c);
            if segment.is_empty() || segment == "." || segment == ".." || !segment.chars().all(allowed) {
                return Err(format!(
                    "the key prefix `{prefix}` has a segment `{segment}` that is empty, `.`, `..` or holds other \
                     characters than letters, digits and -_.~!*'()+=,@"
                ));
            }
        }
        Ok(CacheUrl { bucket: bucket.to_string(), prefix: prefix.to_string() })
    }

    /// The object key of `name` (`sha256/<hash>`, `transcripts/<key>.jsonl`) under the prefix.
    pub fn key(&self, name: &str) -> String {
        if self.prefix.is_empty() { name.to_string() } else { format!("{}/{name}", self.prefix) }
    }
}

impl fmt::Display for CacheUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.prefix.is_empty() {
            write!(f, "s3://{}", self.bucket)
        } else {
            write!(f, "s3://{}/{}", self.bucket, self.prefix)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cache_folder_comes_from_the_environment() {
        let env = |pairs: &'static [(&'static str, &'static str)]| {
            move |name: &str| pairs.iter().find(|(k, _)| *k == name).map(|(_, v)| v.to_string())
        };
        let dir = default_dir(&env(&[("PROMPTGEN_CACHE_DIR", "/c"), ("HOME", "/h")])).unwrap();
        assert_eq!(dir, Some(PathBuf::from("/c")));
        assert_eq!(default_dir(&env(&[("PROMPTGEN_CACHE_DIR", "rel")])), Err((CACHE_DIR_VAR, "rel".to_string())));
        assert_eq!(default_dir(&env(&[])).unwrap(), None);
        if cfg!(all(unix, not(target_os = "macos"))) {
            let dir = default_dir(&env(&[("XDG_CACHE_HOME", "/x"), ("HOME", "/h")])).unwrap();
            assert_eq!(dir, Some(PathBuf::from("/x/promptgen")));
            let dir = default_dir(&env(&[("XDG_CACHE_HOME", "relative"), ("HOME", "/h")])).unwrap();
            assert_eq!(dir, Some(PathBuf::from("/h/.cache/promptgen")), "a relative XDG_CACHE_HOME is ignored");
        }
    }

    #[test]
    fn cache_urls_name_a_bucket_and_a_prefix() {
        let url = CacheUrl::parse("s3://pg-cache/team/app/").unwrap();
        assert_eq!((url.bucket.as_str(), url.prefix.as_str()), ("pg-cache", "team/app"));
        assert_eq!(url.key("sha256/ab"), "team/app/sha256/ab");
        assert_eq!(url.to_string(), "s3://pg-cache/team/app");
        let root = CacheUrl::parse("s3://pg-cache").unwrap();
        assert_eq!((root.key("sha256/ab"), root.to_string()), ("sha256/ab".to_string(), "s3://pg-cache".to_string()));
        for bad in [
            "http://b/p",
            "s3://",
            "s3://Bucket",
            "s3://ab",
            "s3://b_c/x",
            "s3://bucket/a/../b",
            "s3://bucket/a//b",
            "s3://bucket/a b",
        ] {
            assert!(CacheUrl::parse(bad).is_err(), "{bad}");
        }
    }
}
