//! The output cache of `store = "cache"`: the files the lock records, kept by the SHA-256 of
//! their bytes in a folder of the user's (and, through `cargo promptgen push` and `pull`, in an
//! S3 bucket), instead of in the package's `promptgen/` folder.
//!
//! ```text
//! <cache>/                        PROMPTGEN_CACHE_DIR, else the user's cache folder + promptgen
//! ├── sha256/ab/ab3f…90           one file's bytes, named by their SHA-256; never changed
//! └── transcripts/<key>.jsonl     the transcript of the run that recorded the step key <key>
//! ```
//!
//! An object is written under a temporary name and renamed into place, so a reader sees it
//! whole or not at all, and it is checked against its name on every read: a damaged object is
//! never used, it is only replaced by a sound copy (`cargo promptgen pull`). Transcripts are
//! not named by the lock, so they are kept by the step key that they belong to and are never
//! needed to build. Nothing removes objects: the cache only grows, and deleting it is always
//! safe (`pull` fetches again what a lock names).

use std::fmt;
use std::path::{Path, PathBuf};

use codegen_core::__private::fs;

use crate::error::Error;
use crate::record::lock::{LockedStep, sha256_hex};
use crate::record::store::Files;

/// The variable that names the cache folder; it beats the user's cache folder.
pub const CACHE_DIR_VAR: &str = "PROMPTGEN_CACHE_DIR";

/// The content-addressed cache folder.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cache {
    /// Its root.
    pub dir: PathBuf,
}

/// What the cache holds under a hash.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Lookup {
    /// The object, checked against its hash.
    Found(Vec<u8>),
    /// No object.
    Missing,
    /// An object whose bytes hash to `actual`, not to its name.
    Damaged {
        /// What its bytes hash to.
        actual: String,
    },
}

/// A file the lock names that the cache cannot give.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MissingFile {
    /// The step that recorded it.
    pub step: String,
    /// Its path in the generated tree.
    pub path: String,
    /// The SHA-256 the lock records.
    pub sha256: String,
    /// Whether an object is there but damaged (rather than absent).
    pub damaged: bool,
}

impl fmt::Display for MissingFile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = if self.damaged { "damaged" } else { "missing" };
        write!(f, "step {}: `{}` (sha256 {}): {state}", self.step, self.path, short(&self.sha256))
    }
}

/// The first 12 characters of a hash, for messages.
pub fn short(hash: &str) -> &str {
    hash.get(..12).unwrap_or(hash)
}

/// Whether `text` is a SHA-256 as the lock writes it: 64 lower-case hex digits. Only such
/// names become paths in the cache or keys in the bucket.
pub fn is_sha256(text: &str) -> bool {
    text.len() == 64 && text.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

impl Cache {
    /// The cache in `dir`.
    pub fn new(dir: impl Into<PathBuf>) -> Cache {
        Cache { dir: dir.into() }
    }

    /// Where the object `sha256` is kept; `None` for a name that is not a SHA-256.
    pub fn object_path(&self, sha256: &str) -> Option<PathBuf> {
        is_sha256(sha256).then(|| self.dir.join("sha256").join(&sha256[..2]).join(sha256))
    }

    /// Where the transcript of the step recorded with `key` is kept; `None` for a key that is
    /// not a SHA-256.
    pub fn transcript_path(&self, key: &str) -> Option<PathBuf> {
        is_sha256(key).then(|| self.dir.join("transcripts").join(format!("{key}.jsonl")))
    }

    /// The object `sha256`, checked against its name.
    pub fn get(&self, sha256: &str) -> Result<Lookup, Error> {
        let Some(path) = self.object_path(sha256) else { return Ok(Lookup::Missing) };
        let bytes = match fs::read(&path) {
            Ok(bytes) => bytes,
            Err(e) if e.source.kind() == std::io::ErrorKind::NotFound => return Ok(Lookup::Missing),
            Err(e) => return Err(e.into()),
        };
        let actual = sha256_hex(&bytes);
        Ok(if actual == sha256 { Lookup::Found(bytes) } else { Lookup::Damaged { actual } })
    }

    /// Stores `bytes` as the object `sha256`, unless a sound copy is there already (a damaged
    /// one is replaced). Bytes that do not hash to `sha256` are refused and nothing is
    /// written. Returns whether it wrote.
    pub fn put(&self, sha256: &str, bytes: &[u8]) -> Result<bool, Error> {
        let actual = sha256_hex(bytes);
        let path = match self.object_path(sha256) {
            Some(path) if actual == sha256 => path,
            _ => {
                return Err(Error::HashMismatch {
                    what: format!("the bytes offered to the cache `{}` as object {sha256}", self.dir.display()),
                    expected: sha256.to_string(),
                    actual,
                });
            }
        };
        if let Lookup::Found(_) = self.get(sha256)? {
            return Ok(false);
        }
        if let Some(parent) = path.parent() {
            fs::create_dir_all(parent)?;
        }
        fs::write_atomic(&path, bytes)?;
        Ok(true)
    }

    /// The files of `entry`, each checked against the hash the lock records, or every file of
    /// it that the cache lacks or holds damaged.
    pub fn load(&self, entry: &LockedStep) -> Result<Result<Files, Vec<MissingFile>>, Error> {
        let mut files = Files::new();
        let mut missing = Vec::new();
        for file in &entry.files {
            let damaged = match self.get(&file.sha256)? {
                Lookup::Found(bytes) => {
                    files.insert(file.path.clone(), bytes);
                    continue;
                }
                Lookup::Missing => false,
                Lookup::Damaged { .. } => true,
            };
            missing.push(MissingFile {
                step: entry.id.clone(),
                path: file.path.clone(),
                sha256: file.sha256.clone(),
                damaged,
            });
        }
        Ok(if missing.is_empty() { Ok(files) } else { Err(missing) })
    }

    /// The transcript of the step recorded with `key`, if the cache has it.
    pub fn transcript(&self, key: &str) -> Result<Option<String>, Error> {
        let Some(path) = self.transcript_path(key) else { return Ok(None) };
        match fs::read_to_string(&path) {
            Ok(text) => Ok(Some(text)),
            Err(e) if e.source.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e.into()),
        }
    }

    /// Keeps `text` as the transcript of the step recorded with `key`.
    pub fn put_transcript(&self, key: &str, text: &str) -> Result<(), Error> {
        let Some(path) = self.transcript_path(key) else { return Ok(()) };
        if let Some(parent) = path.parent() {
            fs::create_dir_all(parent)?;
        }
        fs::write_if_changed(&path, text.as_bytes())?;
        Ok(())
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

/// The variables [`default_dir`] reads.
pub const DIR_VARS: &[&str] = &[CACHE_DIR_VAR, "XDG_CACHE_HOME", "HOME", "LOCALAPPDATA"];

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
    use crate::record::lock::{Fingerprint, LockedFile};

    fn entry(files: &[(&str, &[u8])]) -> LockedStep {
        let fingerprint = Fingerprint {
            backend: "ollama".into(),
            model: "m".into(),
            protocol: "native".into(),
            seed: None,
            temperature: None,
            prompt: sha256_hex(b"p"),
            system_prompt: None,
            contract: sha256_hex(b"c"),
            check: None,
            script: None,
            outputs: Vec::new(),
            inputs: Default::default(),
            previous: None,
            after: Default::default(),
        };
        LockedStep {
            id: "01".into(),
            key: fingerprint.key(),
            model_calls: 1,
            prompt_tokens: 0,
            completion_tokens: 0,
            repairs: 0,
            check_rounds: 0,
            seed: None,
            fingerprint,
            files: files
                .iter()
                .map(|(path, bytes)| LockedFile { path: path.to_string(), sha256: sha256_hex(bytes) })
                .collect(),
        }
    }

    #[test]
    fn objects_are_kept_by_hash_checked_on_read_and_replaced_only_when_damaged() {
        let dir = tempfile::tempdir().unwrap();
        let cache = Cache::new(dir.path());
        let hash = sha256_hex(b"fn a() {}\n");
        assert_eq!(cache.get(&hash).unwrap(), Lookup::Missing);
        assert!(cache.put(&hash, b"fn a() {}\n").unwrap());
        assert!(!cache.put(&hash, b"fn a() {}\n").unwrap(), "a sound copy is left alone");
        let path = cache.object_path(&hash).unwrap();
        assert!(path.starts_with(dir.path().join("sha256").join(&hash[..2])));
        assert_eq!(cache.get(&hash).unwrap(), Lookup::Found(b"fn a() {}\n".to_vec()));

        std::fs::write(&path, b"fn b() {}\n").unwrap();
        assert_eq!(cache.get(&hash).unwrap(), Lookup::Damaged { actual: sha256_hex(b"fn b() {}\n") });
        assert!(cache.put(&hash, b"fn a() {}\n").unwrap(), "a damaged copy is replaced");
        assert_eq!(std::fs::read(&path).unwrap(), b"fn a() {}\n");

        // Bytes that do not match their name are refused, and nothing is written.
        let other = sha256_hex(b"other");
        let err = cache.put(&other, b"not other").unwrap_err().to_string();
        assert!(err.contains(&other) && err.contains(&sha256_hex(b"not other")), "{err}");
        assert!(!cache.object_path(&other).unwrap().exists());
        let names: Vec<_> =
            std::fs::read_dir(path.parent().unwrap()).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert_eq!(names.len(), 1, "no temporary files left: {names:?}");
    }

    #[test]
    fn only_sha256_names_become_paths() {
        let cache = Cache::new("/cache");
        assert_eq!(cache.object_path("../../etc/passwd"), None);
        assert_eq!(cache.object_path(&"A".repeat(64)), None);
        assert_eq!(cache.transcript_path("01"), None);
        assert_eq!(cache.get("../x").unwrap(), Lookup::Missing);
        assert!(cache.put("../x", b"x").is_err());
    }

    #[test]
    fn a_step_loads_whole_or_names_every_file_it_lacks() {
        let dir = tempfile::tempdir().unwrap();
        let cache = Cache::new(dir.path());
        let step = entry(&[("a.rs", b"a"), ("b/c.rs", b"c"), ("d.rs", b"d")]);
        cache.put(&sha256_hex(b"a"), b"a").unwrap();
        cache.put(&sha256_hex(b"d"), b"d").unwrap();
        std::fs::write(cache.object_path(&sha256_hex(b"d")).unwrap(), b"x").unwrap();
        let missing = cache.load(&step).unwrap().unwrap_err();
        let shown: Vec<String> = missing.iter().map(ToString::to_string).collect();
        assert_eq!(shown.len(), 2, "{shown:?}");
        assert!(shown[0].starts_with("step 01: `b/c.rs` (sha256 ") && shown[0].ends_with("missing"), "{shown:?}");
        assert!(shown[1].contains("`d.rs`") && shown[1].ends_with("damaged"), "{shown:?}");
        cache.put(&sha256_hex(b"c"), b"c").unwrap();
        cache.put(&sha256_hex(b"d"), b"d").unwrap();
        let files = cache.load(&step).unwrap().unwrap();
        assert_eq!(files.get("b/c.rs").map(Vec::as_slice), Some(&b"c"[..]));
        assert_eq!(cache.transcript(&step.key).unwrap(), None);
        cache.put_transcript(&step.key, "{}\n").unwrap();
        assert_eq!(cache.transcript(&step.key).unwrap().as_deref(), Some("{}\n"));
    }

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
