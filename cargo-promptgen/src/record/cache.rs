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

use std::path::PathBuf;

use codegen_core::fs;

use crate::error::{Error, MissingFile};
use crate::files::Files;
use crate::hash::{is_sha256, sha256_hex};
use crate::record::lock::LockedStep;

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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hash::sha256_hex;
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
            constrain: None,
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
            transcript: None,
            fingerprint,
            files: files
                .iter()
                .map(|(path, bytes)| LockedFile { path: path.to_string(), sha256: sha256_hex(bytes) })
                .collect(),
            made_from: Vec::new(),
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
}
