//! The cache's shared remote: an S3-compatible bucket (AWS S3, MinIO, Cloudflare R2, Ceph...),
//! reached by `cargo promptgen push` and `pull` only (the `cli` feature; a build script never
//! talks to it).
//!
//! Requests are signed with AWS's own SigV4 signer (`aws-sigv4`, the one every AWS SDK for Rust
//! call goes through) in the `Authorization` header, with the payload's SHA-256 in
//! `x-amz-content-sha256`, so the server checks each upload's bytes too. They are sent with a
//! blocking reqwest client like the model backends' (rustls with *ring* under `tls`), and
//! retried on connection failures, 408, 429 and 5xx.
//!
//! Settings come from the standard AWS environment and files, strongest first:
//!
//! - credentials: `AWS_ACCESS_KEY_ID` + `AWS_SECRET_ACCESS_KEY` (+ `AWS_SESSION_TOKEN`); else the
//!   profile `AWS_PROFILE` (default `default`) of `~/.aws/credentials`
//!   (`AWS_SHARED_CREDENTIALS_FILE`), then of `~/.aws/config` (`AWS_CONFIG_FILE`); else none, and
//!   requests go unsigned (enough for a public bucket's `pull`). Profiles that get keys
//!   elsewhere (SSO, `credential_process`, `role_arn`) are refused with the command that
//!   exports their keys;
//! - region: `AWS_REGION`, `AWS_DEFAULT_REGION`, the profile's `region`, else `us-east-1`;
//! - endpoint: `AWS_ENDPOINT_URL_S3`, `AWS_ENDPOINT_URL`, the profile's `endpoint_url` (all
//!   ignored with `AWS_IGNORE_CONFIGURED_ENDPOINT_URLS=true`), else AWS's
//!   `https://s3.<region>.amazonaws.com`. A configured endpoint (MinIO, R2, Ceph, a test
//!   server) is addressed path-style (`<endpoint>/<bucket>/<key>`), AWS virtual-host style.
//!
//! Objects are `<prefix>/sha256/<hash>` and `<prefix>/transcripts/<key>.jsonl`.

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use aws_sigv4::http_request::{
    PayloadChecksumKind, PercentEncodingMode, SignableBody, SignableRequest, SigningSettings, UriPathNormalizationMode,
    sign,
};
use aws_sigv4::sign::v4;
use aws_smithy_runtime_api::client::identity::Identity;

use crate::config::CacheUrl;
use crate::hash::sha256_hex;

/// Tries of one request: the first and this many retries.
const RETRIES: u32 = 3;
/// Wait before the first retry; it doubles on each.
const FIRST_BACKOFF: Duration = Duration::from_millis(250);

/// Why the remote could not be used. Each says what to set or do.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RemoteError {
    /// An AWS configuration file exists and cannot be read.
    #[error("cannot read the AWS configuration file `{}`", path.display())]
    ConfigFile {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: codegen_core::FsError,
    },
    /// The credentials are incomplete or of a kind this tool cannot use.
    #[error("{0}")]
    Credentials(String),
    /// The endpoint is not a URL this tool can reach.
    #[error("the S3 endpoint `{value}` (from {origin}) cannot be used: {reason}")]
    Endpoint {
        /// The value.
        value: String,
        /// Where it came from.
        origin: String,
        /// Why not.
        reason: String,
    },
    /// The server refused the credentials (or their permissions).
    #[error(
        "{remote} refused the request ({what}: HTTP {status}{code}), with credentials from {credentials}. Set \
         AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (and AWS_SESSION_TOKEN for temporary keys), or AWS_PROFILE \
         naming a profile of ~/.aws/credentials, to a key that may read (pull) and write (push) the bucket"
    )]
    Denied {
        /// The remote, with its endpoint.
        remote: String,
        /// The request.
        what: String,
        /// The HTTP status.
        status: u16,
        /// `: Code: message` from the server, when it said one.
        code: String,
        /// Where the credentials came from.
        credentials: String,
    },
    /// The bucket does not exist.
    #[error("{remote}: the bucket `{bucket}` does not exist there. Create it, or fix `cache_url` (or the endpoint)")]
    NoBucket {
        /// The remote, with its endpoint.
        remote: String,
        /// The bucket.
        bucket: String,
    },
    /// No answer, after the retries.
    #[error(
        "{remote} did not answer {what} after {attempts} tries ({detail}). Check that the endpoint (AWS_ENDPOINT_URL, \
         or endpoint_url in ~/.aws/config) is right and its server runs; what was transferred before stays, and \
         nothing is half-written"
    )]
    Unreachable {
        /// The remote, with its endpoint.
        remote: String,
        /// The request.
        what: String,
        /// How many tries.
        attempts: u32,
        /// The last failure.
        detail: String,
    },
    /// Any other refusal.
    #[error("{remote}: {what} failed with HTTP {status}{code}{hint}")]
    Status {
        /// The remote, with its endpoint.
        remote: String,
        /// The request.
        what: String,
        /// The HTTP status.
        status: u16,
        /// `: Code: message` from the server, when it said one.
        code: String,
        /// What to do, when known.
        hint: String,
    },
    /// A downloaded object does not hash to its name: it was not used.
    #[error(
        "{remote}: the object `{key}` is damaged: its bytes hash to {actual}, not to the {expected} its name \
         promises. It was not used. Delete it from the bucket, then run `cargo promptgen push` on a machine whose \
         cache holds a sound copy"
    )]
    Damaged {
        /// The remote, with its endpoint.
        remote: String,
        /// The object key.
        key: String,
        /// The hash its name promises.
        expected: String,
        /// What its bytes hash to.
        actual: String,
    },
    /// Some files could not be fetched: the remote lacks them or holds them damaged.
    #[error(
        "{remote} could not give {} of the files promptgen.lock records ({fetched} others were fetched and kept):\n  {}\n\
         Run `cargo promptgen push -p {package}` on a machine whose cache holds them, or regenerate them with \
         `cargo promptgen -p {package}` (the lock will change: a model does not write the same bytes twice)",
        problems.len(),
        problems.join("\n  ")
    )]
    Incomplete {
        /// The remote, with its endpoint.
        remote: String,
        /// The package.
        package: String,
        /// Objects fetched before.
        fetched: usize,
        /// One line per file.
        problems: Vec<String>,
    },
    /// The request could not be signed or built (a bug, or a value no URL can carry).
    #[error("{remote}: cannot make the request {what}: {detail}")]
    Request {
        /// The remote, with its endpoint.
        remote: String,
        /// The request.
        what: String,
        /// Why.
        detail: String,
    },
}

/// An open connection to the remote: where it is, who we are, and the HTTP client.
pub struct Remote {
    url: CacheUrl,
    scheme: String,
    /// `host[:port]` of the endpoint.
    authority: String,
    path_style: bool,
    region: String,
    identity: Option<Identity>,
    /// Where the credentials came from, for messages.
    credentials_from: String,
    client: reqwest::blocking::Client,
}

impl fmt::Debug for Remote {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Remote").field("remote", &self.describe()).field("credentials", &self.credentials_from).finish()
    }
}

/// A reply to a request, after the retries.
struct Reply {
    status: u16,
    length: Option<u64>,
    body: Vec<u8>,
}

impl Remote {
    /// The remote of `url`, set up from the AWS environment and files (`env` reads variables).
    pub fn open(url: &CacheUrl, env: &dyn Fn(&str) -> Option<String>) -> Result<Remote, RemoteError> {
        let settings = Settings::read(env)?;
        let (scheme, authority, path_style) = match &settings.endpoint {
            Some((value, origin)) => {
                let parsed = reqwest::Url::parse(value).map_err(|e| RemoteError::Endpoint {
                    value: value.clone(),
                    origin: origin.clone(),
                    reason: format!("{e}; write it as a URL such as `http://127.0.0.1:9000`"),
                })?;
                let bad = |reason: &str| RemoteError::Endpoint {
                    value: value.clone(),
                    origin: origin.clone(),
                    reason: reason.to_string(),
                };
                if !matches!(parsed.scheme(), "http" | "https") {
                    return Err(bad("it is neither http:// nor https://"));
                }
                if !matches!(parsed.path(), "" | "/") || parsed.query().is_some() {
                    return Err(bad(
                        "it has a path or a query; give the server's root, such as `http://127.0.0.1:9000`",
                    ));
                }
                let host = parsed.host_str().ok_or_else(|| bad("it names no host"))?;
                let authority = match parsed.port() {
                    Some(port) => format!("{host}:{port}"),
                    None => host.to_string(),
                };
                (parsed.scheme().to_string(), authority, true)
            }
            None => ("https".to_string(), format!("s3.{}.amazonaws.com", settings.region), url.bucket.contains('.')),
        };
        if scheme == "https" && !cfg!(feature = "tls") {
            return Err(RemoteError::Endpoint {
                value: format!("https://{authority}"),
                origin: settings.endpoint.as_ref().map_or_else(|| "AWS's default".to_string(), |(_, o)| o.clone()),
                reason: "this cargo-promptgen was built without its `tls` feature, so it speaks plain HTTP only".into(),
            });
        }
        let builder = reqwest::blocking::Client::builder()
            .connect_timeout(Duration::from_secs(5))
            .timeout(Duration::from_secs(120))
            // S3 answers a wrong region with a redirect: report it rather than follow it with our
            // signature on another host.
            .redirect(reqwest::redirect::Policy::none());
        #[cfg(feature = "tls")]
        let builder = builder.tls_backend_preconfigured(tls_config().map_err(|detail| RemoteError::Request {
            remote: url.to_string(),
            what: "setting up TLS".into(),
            detail,
        })?);
        let client = builder.build().map_err(|e| RemoteError::Request {
            remote: url.to_string(),
            what: "setting up the HTTP client".into(),
            detail: codegen_core::error_with_causes(&e, ": "),
        })?;
        let (identity, credentials_from) = match settings.credentials {
            Some((credentials, from)) => (Some(credentials.into()), from),
            None => (None, "nowhere (no AWS_ACCESS_KEY_ID, no profile in ~/.aws: requests went unsigned)".to_string()),
        };
        Ok(Remote {
            url: url.clone(),
            scheme,
            authority,
            path_style,
            region: settings.region,
            identity,
            credentials_from,
            client,
        })
    }

    /// `s3://bucket/prefix at http://127.0.0.1:9000`, for messages.
    pub fn describe(&self) -> String {
        format!("{} at {}://{}", self.url, self.scheme, self.authority)
    }

    /// The cache URL.
    pub fn url(&self) -> &CacheUrl {
        &self.url
    }

    /// One listing request of at most one key under the prefix: whether the endpoint answers,
    /// the bucket exists and the credentials are accepted, before any transfer.
    pub fn probe(&self) -> Result<(), RemoteError> {
        let prefix = self.url.key("");
        let query = format!("list-type=2&max-keys=1&prefix={}", encode(&prefix, true));
        let what = format!("listing `{prefix}`");
        let reply = self.send("GET", &self.url_of("", &query), &[], &what)?;
        match reply.status {
            200..=299 => Ok(()),
            status => Err(self.failure(status, &reply.body, &what)),
        }
    }

    /// The size of the object `name` (`sha256/<hash>`), or `None` when the remote lacks it.
    pub fn head(&self, name: &str) -> Result<Option<u64>, RemoteError> {
        let key = self.url.key(name);
        let what = format!("HEAD `{key}`");
        let reply = self.send("HEAD", &self.url_of(&key, ""), &[], &what)?;
        match reply.status {
            200..=299 => Ok(Some(reply.length.unwrap_or(0))),
            404 => Ok(None),
            status => Err(self.failure(status, &reply.body, &what)),
        }
    }

    /// The bytes of the object `name`, or `None` when the remote lacks it.
    pub fn get(&self, name: &str) -> Result<Option<Vec<u8>>, RemoteError> {
        let key = self.url.key(name);
        let what = format!("GET `{key}`");
        let reply = self.send("GET", &self.url_of(&key, ""), &[], &what)?;
        match reply.status {
            200..=299 => Ok(Some(reply.body)),
            404 if s3_code(&reply.body).is_none_or(|(code, _)| code == "NoSuchKey") => Ok(None),
            status => Err(self.failure(status, &reply.body, &what)),
        }
    }

    /// The object `sha256/<hash>`, checked: bytes that do not hash to their name are refused.
    pub fn get_object(&self, sha256: &str) -> Result<Option<Vec<u8>>, RemoteError> {
        let name = format!("sha256/{sha256}");
        let Some(bytes) = self.get(&name)? else { return Ok(None) };
        let actual = sha256_hex(&bytes);
        if actual != sha256 {
            return Err(RemoteError::Damaged {
                remote: self.describe(),
                key: self.url.key(&name),
                expected: sha256.to_string(),
                actual,
            });
        }
        Ok(Some(bytes))
    }

    /// Uploads `bytes` as the object `name`. The signature carries their SHA-256, which the
    /// server checks against what it receives.
    pub fn put(&self, name: &str, bytes: &[u8]) -> Result<(), RemoteError> {
        let key = self.url.key(name);
        let what = format!("PUT `{key}`");
        let reply = self.send("PUT", &self.url_of(&key, ""), bytes, &what)?;
        match reply.status {
            200..=299 => Ok(()),
            status => Err(self.failure(status, &reply.body, &what)),
        }
    }

    /// The URL of `key` (empty: the bucket), with `query` (already encoded).
    fn url_of(&self, key: &str, query: &str) -> String {
        let path = encode(key, false);
        let mut url = if self.path_style {
            format!("{}://{}/{}", self.scheme, self.authority, self.url.bucket)
        } else {
            format!("{}://{}.{}", self.scheme, self.url.bucket, self.authority)
        };
        if !key.is_empty() || !self.path_style {
            url.push('/');
            url.push_str(&path);
        }
        if !query.is_empty() {
            url.push('?');
            url.push_str(query);
        }
        url
    }

    /// The error for a final non-success `status` with `body`.
    fn failure(&self, status: u16, body: &[u8], what: &str) -> RemoteError {
        let said = s3_code(body);
        let code = said.as_ref().map_or_else(String::new, |(code, message)| format!(": {code}: {message}"));
        let code_is = |name: &str| said.as_ref().is_some_and(|(code, _)| code == name);
        if code_is("NoSuchBucket") {
            return RemoteError::NoBucket { remote: self.describe(), bucket: self.url.bucket.clone() };
        }
        let region_hint =
            code_is("PermanentRedirect") || code_is("AuthorizationHeaderMalformed") || matches!(status, 301 | 307);
        if matches!(status, 401 | 403) && !region_hint {
            return RemoteError::Denied {
                remote: self.describe(),
                what: what.to_string(),
                status,
                code,
                credentials: self.credentials_from.clone(),
            };
        }
        let hint = if region_hint {
            format!(". The bucket is in another region than `{}`: set AWS_REGION to the bucket's region", self.region)
        } else {
            String::new()
        };
        RemoteError::Status { remote: self.describe(), what: what.to_string(), status, code, hint }
    }

    /// Sends one request, signed, retrying connection failures, 408, 429 and 5xx.
    fn send(&self, method: &str, url: &str, body: &[u8], what: &str) -> Result<Reply, RemoteError> {
        let mut attempt = 0;
        loop {
            attempt += 1;
            let headers = self.sign(method, url, body, what)?;
            let method_value = reqwest::Method::from_bytes(method.as_bytes()).unwrap_or(reqwest::Method::GET);
            let mut request = self.client.request(method_value, url);
            for (name, value) in &headers {
                request = request.header(name.as_str(), value.as_str());
            }
            if method == "PUT" {
                request = request.header(reqwest::header::CONTENT_LENGTH, body.len()).body(body.to_vec());
            }
            let outcome = request.send().and_then(|response| {
                let status = response.status().as_u16();
                let length = response
                    .headers()
                    .get(reqwest::header::CONTENT_LENGTH)
                    .and_then(|v| v.to_str().ok())
                    .and_then(|v| v.parse().ok());
                response.bytes().map(|bytes| Reply { status, length, body: bytes.to_vec() })
            });
            let failure = match outcome {
                Ok(reply) if !matches!(reply.status, 408 | 429 | 500..=599) => return Ok(reply),
                Ok(reply) if attempt > RETRIES => return Err(self.failure(reply.status, &reply.body, what)),
                Ok(reply) => format!("HTTP {}", reply.status),
                Err(e) => {
                    let detail = codegen_core::error_with_causes(&e, ": ");
                    if attempt > RETRIES {
                        return Err(RemoteError::Unreachable {
                            remote: self.describe(),
                            what: what.to_string(),
                            attempts: attempt,
                            detail,
                        });
                    }
                    detail
                }
            };
            let wait = FIRST_BACKOFF.saturating_mul(2u32.pow(attempt - 1));
            eprintln!(
                "promptgen: {what} on {} failed ({failure}); trying again in {} ms",
                self.describe(),
                wait.as_millis()
            );
            std::thread::sleep(wait);
        }
    }

    /// The headers that sign the request (none without credentials).
    fn sign(&self, method: &str, url: &str, body: &[u8], what: &str) -> Result<Vec<(String, String)>, RemoteError> {
        let Some(identity) = &self.identity else { return Ok(Vec::new()) };
        let failed = |detail: String| RemoteError::Request { remote: self.describe(), what: what.to_string(), detail };
        let mut settings = SigningSettings::default();
        // S3's own rules: paths are encoded once and not normalised; the payload's SHA-256
        // goes in `x-amz-content-sha256`.
        settings.percent_encoding_mode = PercentEncodingMode::Single;
        settings.uri_path_normalization_mode = UriPathNormalizationMode::Disabled;
        settings.payload_checksum_kind = PayloadChecksumKind::XAmzSha256;
        let params = v4::SigningParams::builder()
            .identity(identity)
            .region(&self.region)
            .name("s3")
            .time(SystemTime::now())
            .settings(settings)
            .build()
            .map_err(|e| failed(e.to_string()))?
            .into();
        let request = SignableRequest::new(method, url, std::iter::empty(), SignableBody::Bytes(body))
            .map_err(|e| failed(codegen_core::error_with_causes(&e, ": ")))?;
        let (instructions, _signature) =
            sign(request, &params).map_err(|e| failed(codegen_core::error_with_causes(&e, ": ")))?.into_parts();
        Ok(instructions.headers().map(|(name, value)| (name.to_string(), value.to_string())).collect())
    }
}

/// The `<Code>` and `<Message>` of an S3 error document.
fn s3_code(body: &[u8]) -> Option<(String, String)> {
    let text = std::str::from_utf8(body).ok()?;
    let element = |name: &str| {
        let start = text.find(&format!("<{name}>"))? + name.len() + 2;
        let end = text[start..].find(&format!("</{name}>"))? + start;
        Some(text[start..end].trim().to_string())
    };
    let code = element("Code")?;
    Some((code, element("Message").unwrap_or_default()))
}

/// `text` percent-encoded for a URL as SigV4 wants it: every byte but `A-Za-z0-9-_.~` (and `/`
/// unless `slash` is set) becomes `%XX`.
fn encode(text: &str, slash: bool) -> String {
    let mut out = String::with_capacity(text.len());
    for byte in text.bytes() {
        if byte.is_ascii_alphanumeric() || b"-_.~".contains(&byte) || (byte == b'/' && !slash) {
            out.push(byte as char);
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

/// The TLS settings of the client: rustls with the *ring* provider, as the backends have them.
#[cfg(feature = "tls")]
fn tls_config() -> Result<rustls::ClientConfig, String> {
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    let verifier = rustls_platform_verifier::Verifier::new(provider.clone()).map_err(|e| e.to_string())?;
    Ok(rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .dangerous()
        .with_custom_certificate_verifier(std::sync::Arc::new(verifier))
        .with_no_client_auth())
}

/// What the AWS environment and files say.
#[derive(Debug)]
struct Settings {
    credentials: Option<(aws_credential_types::Credentials, String)>,
    region: String,
    endpoint: Option<(String, String)>,
}

/// An INI file of the AWS CLI: sections of `key = value`.
type Ini = BTreeMap<String, BTreeMap<String, String>>;

impl Settings {
    fn read(env: &dyn Fn(&str) -> Option<String>) -> Result<Settings, RemoteError> {
        let var = |name: &str| env(name).map(|v| v.trim().to_string()).filter(|v| !v.is_empty());
        let home = var("HOME").or_else(|| var("USERPROFILE"));
        let aws_file = |variable: &str, name: &str| {
            var(variable).map(PathBuf::from).or_else(|| home.as_ref().map(|h| Path::new(h).join(".aws").join(name)))
        };
        let credentials_file = aws_file("AWS_SHARED_CREDENTIALS_FILE", "credentials");
        let config_file = aws_file("AWS_CONFIG_FILE", "config");
        let profile_var = var("AWS_PROFILE");
        let profile = profile_var.clone().unwrap_or_else(|| "default".to_string());
        let read = |path: &Option<PathBuf>| -> Result<Option<(PathBuf, Ini)>, RemoteError> {
            let Some(path) = path else { return Ok(None) };
            match codegen_core::fs::read_to_string(path) {
                Ok(text) => Ok(Some((path.clone(), parse_ini(&text)))),
                Err(e) if e.source.kind() == std::io::ErrorKind::NotFound => Ok(None),
                Err(source) => Err(RemoteError::ConfigFile { path: path.clone(), source }),
            }
        };
        let credentials_ini = read(&credentials_file)?;
        let config_ini = read(&config_file)?;
        let in_credentials =
            credentials_ini.as_ref().and_then(|(path, ini)| ini.get(&profile).map(|section| (path, section)));
        let config_section = if profile == "default" { "default".to_string() } else { format!("profile {profile}") };
        let in_config =
            config_ini.as_ref().and_then(|(path, ini)| ini.get(&config_section).map(|section| (path, section)));
        if profile_var.is_some() && in_credentials.is_none() && in_config.is_none() {
            return Err(RemoteError::Credentials(format!(
                "AWS_PROFILE={profile} names no profile: neither `{}` has a `[{profile}]` section nor `{}` a `[{config_section}]` \
                 one. Fix AWS_PROFILE, or unset it and set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY",
                show(&credentials_file),
                show(&config_file),
            )));
        }

        let credentials = match (var("AWS_ACCESS_KEY_ID"), var("AWS_SECRET_ACCESS_KEY")) {
            (Some(id), Some(secret)) => Some((
                aws_credential_types::Credentials::new(id, secret, var("AWS_SESSION_TOKEN"), None, "environment"),
                "the environment (AWS_ACCESS_KEY_ID)".to_string(),
            )),
            (Some(_), None) | (None, Some(_)) => {
                let (set, unset) = if var("AWS_ACCESS_KEY_ID").is_some() {
                    ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")
                } else {
                    ("AWS_SECRET_ACCESS_KEY", "AWS_ACCESS_KEY_ID")
                };
                return Err(RemoteError::Credentials(format!(
                    "{set} is set and {unset} is not: set both (and AWS_SESSION_TOKEN for temporary keys), or neither \
                     to use the profile of ~/.aws/credentials"
                )));
            }
            (None, None) => {
                profile_credentials(&profile, in_credentials)?.or(profile_credentials(&profile, in_config)?)
            }
        };

        let from_profile =
            |key: &str| in_config.and_then(|(path, section)| section.get(key).map(|v| (v.clone(), path)));
        let region = var("AWS_REGION")
            .or_else(|| var("AWS_DEFAULT_REGION"))
            .or_else(|| from_profile("region").map(|(v, _)| v))
            .unwrap_or_else(|| "us-east-1".to_string());
        let ignore_endpoints =
            var("AWS_IGNORE_CONFIGURED_ENDPOINT_URLS").is_some_and(|v| v.eq_ignore_ascii_case("true"));
        let endpoint = if ignore_endpoints {
            None
        } else if let Some(url) = var("AWS_ENDPOINT_URL_S3") {
            Some((url, "AWS_ENDPOINT_URL_S3".to_string()))
        } else if let Some(url) = var("AWS_ENDPOINT_URL") {
            Some((url, "AWS_ENDPOINT_URL".to_string()))
        } else {
            from_profile("endpoint_url")
                .map(|(url, path)| (url, format!("endpoint_url of profile `{profile}` in `{}`", path.display())))
        };
        Ok(Settings { credentials, region, endpoint })
    }
}

fn show(path: &Option<PathBuf>) -> String {
    path.as_ref().map_or_else(|| "~/.aws/...".to_string(), |p| p.display().to_string())
}

/// The static keys of a profile's section, if it has them.
fn profile_credentials(
    profile: &str,
    section: Option<(&PathBuf, &BTreeMap<String, String>)>,
) -> Result<Option<(aws_credential_types::Credentials, String)>, RemoteError> {
    let Some((path, section)) = section else { return Ok(None) };
    match (section.get("aws_access_key_id"), section.get("aws_secret_access_key")) {
        (Some(id), Some(secret)) => Ok(Some((
            aws_credential_types::Credentials::new(
                id.clone(),
                secret.clone(),
                section.get("aws_session_token").cloned(),
                None,
                "profile",
            ),
            format!("profile `{profile}` of `{}`", path.display()),
        ))),
        (None, None) => {
            let elsewhere =
                ["credential_process", "sso_session", "sso_start_url", "role_arn", "web_identity_token_file"];
            match elsewhere.iter().find(|key| section.contains_key(**key)) {
                Some(key) => Err(RemoteError::Credentials(format!(
                    "profile `{profile}` of `{}` gets its keys through `{key}`, which cargo promptgen does not do. \
                     Export them first, e.g. `eval \"$(aws configure export-credentials --profile {profile} --format env)\"`",
                    path.display()
                ))),
                None => Ok(None),
            }
        }
        _ => Err(RemoteError::Credentials(format!(
            "profile `{profile}` of `{}` has only one of aws_access_key_id and aws_secret_access_key: give it both",
            path.display()
        ))),
    }
}

/// Reads an AWS CLI file: `[section]` headers, `key = value` lines, `#` and `;` comments.
/// Indented lines (a nested block such as `s3 =`'s) are skipped.
fn parse_ini(text: &str) -> Ini {
    let mut ini = Ini::new();
    let mut section: Option<String> = None;
    for line in text.lines() {
        if line.starts_with([' ', '\t']) {
            continue;
        }
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') || line.starts_with(';') {
            continue;
        }
        if let Some(name) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            let name = name.split_whitespace().collect::<Vec<_>>().join(" ");
            ini.entry(name.clone()).or_default();
            section = Some(name);
        } else if let (Some(name), Some((key, value))) = (&section, line.split_once('=')) {
            ini.entry(name.clone()).or_default().insert(key.trim().to_ascii_lowercase(), value.trim().to_string());
        }
    }
    ini
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env_of(pairs: Vec<(&'static str, String)>) -> impl Fn(&str) -> Option<String> {
        move |name: &str| pairs.iter().find(|(k, _)| *k == name).map(|(_, v)| v.clone())
    }

    #[test]
    fn aws_files_are_read_as_the_cli_writes_them() {
        let ini = parse_ini(
            "# comment\n[default]\naws_access_key_id = AKID\naws_secret_access_key=SECRET\n\n[profile  dev ]\nregion = eu-west-1\ns3 =\n  addressing_style = path\nendpoint_url = http://127.0.0.1:9000\n; other\n",
        );
        assert_eq!(ini["default"]["aws_access_key_id"], "AKID");
        assert_eq!(ini["default"]["aws_secret_access_key"], "SECRET");
        assert_eq!(ini["profile dev"]["region"], "eu-west-1");
        assert_eq!(ini["profile dev"]["endpoint_url"], "http://127.0.0.1:9000");
        assert!(!ini["profile dev"].contains_key("addressing_style"));
    }

    #[test]
    fn settings_come_from_the_environment_then_the_profile() {
        let dir = tempfile::tempdir().unwrap();
        let credentials = dir.path().join("credentials");
        let config = dir.path().join("config");
        std::fs::write(
            &credentials,
            "[default]\naws_access_key_id = FILEID\naws_secret_access_key = FILESECRET\n[sso]\nsso_session = x\n",
        )
        .unwrap();
        std::fs::write(&config, "[default]\nregion = eu-central-1\nendpoint_url = http://10.0.0.1:9000\n[profile sso]\nsso_session = corp\n").unwrap();
        let files = || {
            vec![
                ("AWS_SHARED_CREDENTIALS_FILE", credentials.display().to_string()),
                ("AWS_CONFIG_FILE", config.display().to_string()),
            ]
        };
        let from_files = Settings::read(&env_of(files())).unwrap();
        let (creds, from) = from_files.credentials.unwrap();
        assert_eq!(creds.access_key_id(), "FILEID");
        assert!(from.contains("profile `default`"), "{from}");
        assert_eq!(from_files.region, "eu-central-1");
        assert_eq!(from_files.endpoint.as_ref().unwrap().0, "http://10.0.0.1:9000");

        let mut env = files();
        env.extend([
            ("AWS_ACCESS_KEY_ID", "ENVID".to_string()),
            ("AWS_SECRET_ACCESS_KEY", "ENVSECRET".to_string()),
            ("AWS_REGION", "ap-south-1".to_string()),
            ("AWS_ENDPOINT_URL", "http://127.0.0.1:1".to_string()),
            ("AWS_ENDPOINT_URL_S3", "http://127.0.0.1:2".to_string()),
        ]);
        let from_env = Settings::read(&env_of(env)).unwrap();
        assert_eq!(from_env.credentials.unwrap().0.access_key_id(), "ENVID");
        assert_eq!(from_env.region, "ap-south-1");
        assert_eq!(from_env.endpoint.unwrap(), ("http://127.0.0.1:2".to_string(), "AWS_ENDPOINT_URL_S3".to_string()));

        let mut env = files();
        env.push(("AWS_PROFILE", "sso".to_string()));
        let err = Settings::read(&env_of(env)).unwrap_err().to_string();
        assert!(err.contains("sso_session") && err.contains("export-credentials"), "{err}");
        let mut env = files();
        env.push(("AWS_PROFILE", "nobody".to_string()));
        let err = Settings::read(&env_of(env)).unwrap_err().to_string();
        assert!(err.contains("AWS_PROFILE=nobody names no profile"), "{err}");
        let err = Settings::read(&env_of(vec![("AWS_ACCESS_KEY_ID", "x".into())])).unwrap_err().to_string();
        assert!(err.contains("AWS_SECRET_ACCESS_KEY is not"), "{err}");

        let none = Settings::read(&env_of(vec![("HOME", dir.path().join("empty").display().to_string())])).unwrap();
        assert!(none.credentials.is_none() && none.endpoint.is_none());
        assert_eq!(none.region, "us-east-1");
    }

    #[test]
    fn urls_are_path_style_for_configured_endpoints_and_virtual_hosts_on_aws() {
        let url = CacheUrl::parse("s3://pg-cache/team a")
            .unwrap_or(CacheUrl { bucket: "pg-cache".into(), prefix: "team a".into() });
        let local = Remote::open(&url, &env_of(vec![("AWS_ENDPOINT_URL", "http://127.0.0.1:9000/".into())])).unwrap();
        assert_eq!(local.url_of(&url.key("sha256/ab"), ""), "http://127.0.0.1:9000/pg-cache/team%20a/sha256/ab");
        assert_eq!(local.url_of("", "list-type=2"), "http://127.0.0.1:9000/pg-cache?list-type=2");
        assert_eq!(local.describe(), "s3://pg-cache/team a at http://127.0.0.1:9000");
        if cfg!(feature = "tls") {
            let aws = Remote::open(&url, &env_of(vec![("AWS_REGION", "eu-west-1".into())])).unwrap();
            assert_eq!(aws.url_of("k", ""), "https://pg-cache.s3.eu-west-1.amazonaws.com/k");
            assert_eq!(aws.url_of("", "q=1"), "https://pg-cache.s3.eu-west-1.amazonaws.com/?q=1");
        }
        for bad in ["ftp://x", "http://127.0.0.1:9000/path", "not a url"] {
            let err = Remote::open(&url, &env_of(vec![("AWS_ENDPOINT_URL", bad.into())])).unwrap_err().to_string();
            assert!(err.contains(bad) && err.contains("AWS_ENDPOINT_URL"), "{err}");
        }
        assert_eq!(encode("a/b c+d", true), "a%2Fb%20c%2Bd");
        assert_eq!(
            s3_code(b"<Error><Code>NoSuchKey</Code><Message>gone</Message></Error>"),
            Some(("NoSuchKey".into(), "gone".into()))
        );
    }
}
