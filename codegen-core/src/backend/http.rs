//! One HTTP client with the timeouts and retry rules every backend shares.
//!
//! Transport faults and the statuses that mean "try again later" are retried here; the
//! backends only ever see a final HTTP reply (success or not) or a final transport error,
//! and turn those into [`BackendError`](super::BackendError)s that say what to do.
//!
//! The client is reqwest's async one, driven on the caller's thread by a current-thread tokio
//! runtime that each client owns (tokio and its timers are in every build through reqwest
//! already). reqwest's blocking client has a single timeout per request, applied to the wait
//! for the headers and again to each read of the body: it cannot give a streamed reply a
//! long wait for its first byte and a short one between its pieces.

#[cfg(feature = "http")]
use std::future::Future;
use std::time::Duration;
#[cfg(feature = "http")]
use std::time::Instant;

use serde::{Deserialize, Serialize};

use crate::cancel::Cancel;

/// Timeouts and retries of the HTTP backends.
///
/// A streamed reply (the default) has no limit on its length in time: it may take as long as
/// the server keeps sending, and the request's output cap bounds how long that can be. What
/// is limited is silence: before the reply's first byte ([`first_byte_timeout`]) and between
/// two of its pieces ([`idle_timeout`]), so that a stalled server is noticed within a minute
/// while a slow one works on. A reply asked for whole (a server that cannot stream) has one
/// limit for all of it, [`request_timeout`].
///
/// Ollama holds back a tool call until the model has written all of it, and sends nothing
/// meanwhile: a streamed request that offers tools to Ollama may be silent as long as a whole
/// one, so both of its silences are allowed the longer of their own limit and
/// [`request_timeout`].
///
/// [`first_byte_timeout`]: HttpConfig::first_byte_timeout
/// [`idle_timeout`]: HttpConfig::idle_timeout
/// [`request_timeout`]: HttpConfig::request_timeout
#[derive(Debug, Clone, PartialEq)]
pub struct HttpConfig {
    /// Time allowed to open a connection. A few seconds: a server on this machine or the LAN
    /// answers at once, so a long wait only delays the "server not running" message.
    pub connect_timeout: Duration,
    /// Time allowed for one whole reply asked for without streaming. Minutes, not reqwest's
    /// 30 s: a local server loads the model's weights on its first request, and a long reply
    /// can take minutes on a CPU.
    pub request_timeout: Duration,
    /// Time allowed between sending a streamed request and the first byte of its reply. Five
    /// minutes: before its first token a local server loads the model's weights (on its first
    /// request) and reads the whole prompt, which on a CPU goes at tens of tokens a second.
    pub first_byte_timeout: Duration,
    /// The longest silence allowed between two pieces of a streamed reply once it has begun.
    /// A minute: even on a CPU a model sends a token every second or so, so a minute of
    /// silence is a server that has stalled or died.
    pub idle_timeout: Duration,
    /// When and how often to try again.
    pub retry: RetryPolicy,
}

impl Default for HttpConfig {
    fn default() -> HttpConfig {
        HttpConfig {
            connect_timeout: Duration::from_secs(5),
            request_timeout: Duration::from_secs(600),
            first_byte_timeout: Duration::from_secs(300),
            idle_timeout: Duration::from_secs(60),
            retry: RetryPolicy::default(),
        }
    }
}

/// Which failures are retried, how often, and how long to wait in between.
///
/// Retried: connection failures, a connection closed before the whole reply arrived, and the
/// statuses 408, 409, 429 and 5xx. Never retried: any other 4xx, a 429 that says
/// `insufficient_quota` (waiting does not add credit), and a request that ran past one of its
/// time limits (the server is working, only slowly, or has stalled: a second try would just
/// double the wait).
#[derive(Debug, Clone, PartialEq)]
pub struct RetryPolicy {
    /// Retries after the first attempt.
    pub max_retries: u32,
    /// Wait before the first retry; it doubles on each retry, with up to 25% jitter off.
    pub initial_backoff: Duration,
    /// Ceiling of the doubling backoff.
    pub max_backoff: Duration,
    /// Ceiling of a server's `Retry-After` / `retry-after-ms`: a longer request is cut to this.
    pub max_retry_after: Duration,
}

impl Default for RetryPolicy {
    fn default() -> RetryPolicy {
        RetryPolicy {
            max_retries: 2,
            initial_backoff: Duration::from_millis(500),
            max_backoff: Duration::from_secs(8),
            max_retry_after: Duration::from_secs(120),
        }
    }
}

impl RetryPolicy {
    /// A policy that never retries.
    pub fn none() -> RetryPolicy {
        RetryPolicy { max_retries: 0, ..RetryPolicy::default() }
    }

    /// The doubling backoff before retry number `retry` (0-based), before jitter.
    fn backoff(&self, retry: u32) -> Duration {
        let factor = 2u32.saturating_pow(retry.min(16));
        self.initial_backoff.saturating_mul(factor).min(self.max_backoff)
    }
}

/// One retry that happened: why, and how long we waited before it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct RetryRecord {
    /// The attempt that failed (1-based).
    pub attempt: u32,
    /// What went wrong, e.g. "HTTP 503" or "connection refused".
    pub reason: String,
    /// How long we waited before the next attempt.
    #[serde(with = "duration_ms")]
    pub waited: Duration,
}

#[cfg(feature = "http")]
/// A complete HTTP reply, after any retries.
#[derive(Debug)]
pub(crate) struct HttpReply {
    pub status: u16,
    pub body: String,
    pub retries: Vec<RetryRecord>,
}

#[cfg(feature = "http")]
/// Why no complete HTTP reply could be had, after any retries.
#[derive(Debug)]
pub(crate) struct TransportError {
    pub kind: TransportKind,
    /// The underlying error, with its causes.
    pub detail: String,
    pub attempts: u32,
}

#[cfg(feature = "http")]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TransportKind {
    /// No connection could be opened (nothing listening, DNS, TLS handshake).
    Connect,
    /// The request ran past the request timeout.
    Timeout,
    /// A streamed request's reply did not begin within this limit.
    Silent(Limit),
    /// The connection broke before the whole reply arrived.
    Interrupted,
    /// The [`Cancel`] flag was set: the request was abandoned.
    Cancelled,
    /// The reply had more bytes than this: it was cut off.
    TooLarge(u64),
}

#[cfg(feature = "http")]
/// The first answer to a streamed request, after any retries.
pub(crate) enum Opened<'c> {
    /// A reply read whole: an error status, or a server that answered with one JSON body.
    Whole { status: u16, body: String },
    /// A 2xx reply whose body streams.
    Stream(Box<ByteStream<'c>>),
}

#[cfg(feature = "http")]
/// A limit on a streamed reply's silence, and the [`HttpConfig`] field it comes from (for the
/// message that says which to raise).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Limit {
    pub after: Duration,
    pub name: &'static str,
}

#[cfg(feature = "http")]
impl Limit {
    /// The longer of the two limits.
    pub fn max_with(self, other: Limit) -> Limit {
        if other.after > self.after { other } else { self }
    }
}

#[cfg(feature = "http")]
/// The body of a streamed reply, read piece by piece within the silence limits.
pub(crate) struct ByteStream<'c> {
    runtime: &'c tokio::runtime::Runtime,
    cancel: &'c Cancel,
    response: reqwest::Response,
    /// When the first byte must have arrived by, and the limit that says so.
    first_byte_by: Option<Instant>,
    first_byte: Limit,
    /// The longest silence allowed once the body has begun.
    pub idle: Limit,
    /// Whether any byte of the body has arrived.
    pub begun: bool,
    /// Bytes of the body so far, and the most it may have.
    received: u64,
    max_bytes: u64,
}

#[cfg(feature = "http")]
/// Why the next piece of a streamed body could not be had.
pub(crate) enum ChunkError {
    /// Nothing arrived within this limit.
    Silent(Limit),
    /// The connection broke.
    Broken(String),
    /// The [`Cancel`] flag was set.
    Cancelled,
    /// The body has more bytes than this.
    TooLarge(u64),
}

#[cfg(feature = "http")]
impl ByteStream<'_> {
    /// The next piece of the body; `None` when it has ended.
    pub fn next(&mut self) -> Result<Option<bytes::Bytes>, ChunkError> {
        let limit = match self.first_byte_by {
            Some(by) if !self.begun => by.saturating_duration_since(Instant::now()),
            None if !self.begun => self.first_byte.after,
            _ => self.idle.after,
        };
        let response = &mut self.response;
        let cancel = self.cancel;
        match self.runtime.block_on(async { cancel.guard(tokio::time::timeout(limit, response.chunk())).await }) {
            Some(Ok(Ok(Some(chunk)))) => {
                self.begun |= !chunk.is_empty();
                self.received += chunk.len() as u64;
                if self.received > self.max_bytes {
                    return Err(ChunkError::TooLarge(self.max_bytes));
                }
                Ok(Some(chunk))
            }
            Some(Ok(Ok(None))) => Ok(None),
            Some(Ok(Err(err))) => Err(ChunkError::Broken(error_chain(&err))),
            Some(Err(_)) if self.begun => Err(ChunkError::Silent(self.idle)),
            Some(Err(_)) => Err(ChunkError::Silent(self.first_byte)),
            None => Err(ChunkError::Cancelled),
        }
    }
}

#[cfg(feature = "http")]
pub(crate) struct HttpClient {
    client: reqwest::Client,
    runtime: tokio::runtime::Runtime,
    config: HttpConfig,
    /// Abandons the request in flight, and any wait before a retry, when set.
    cancel: Cancel,
}

#[cfg(feature = "http")]
/// Why [`HttpClient::run`] gave up on a future.
enum Stop {
    /// Its time limit ran out.
    Elapsed,
    /// The [`Cancel`] flag was set.
    Cancelled,
}

#[cfg(feature = "http")]
/// What one attempt came to.
enum Attempt<T> {
    /// The server answered; `retry` holds the reason and the server's requested wait when
    /// the policy would try again.
    Answered { value: T, retry: Option<(String, Option<Duration>)> },
    /// No answer could be had.
    Failed { kind: TransportKind, detail: String },
}

#[cfg(feature = "http")]
impl HttpClient {
    pub fn new(config: HttpConfig, cancel: Cancel) -> Result<HttpClient, String> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| format!("could not start the HTTP client's runtime: {e}"))?;
        let builder = reqwest::Client::builder().connect_timeout(config.connect_timeout);
        #[cfg(feature = "tls")]
        let builder = builder.tls_backend_preconfigured(tls_config()?);
        let client = {
            let _inside = runtime.enter();
            builder.build().map_err(|e| error_chain(&e))?
        };
        Ok(HttpClient { client, runtime, config, cancel })
    }

    pub fn config(&self) -> &HttpConfig {
        &self.config
    }

    /// Runs `future` to completion on this client's runtime, or gives up after `limit` or
    /// when the [`Cancel`] flag is set.
    fn run<T>(&self, limit: Duration, future: impl Future<Output = T>) -> Result<T, Stop> {
        // The timer is made inside the runtime: tokio's timers need one to exist.
        match self.runtime.block_on(async { self.cancel.guard(tokio::time::timeout(limit, future)).await }) {
            Some(Ok(value)) => Ok(value),
            Some(Err(_)) => Err(Stop::Elapsed),
            None => Err(Stop::Cancelled),
        }
    }

    /// Waits `wait` (before a retry), or less when the [`Cancel`] flag is set: whether it was.
    fn pause(&self, wait: Duration) -> bool {
        self.runtime.block_on(async { self.cancel.guard(tokio::time::sleep(wait)).await }).is_none()
    }

    /// POSTs JSON `body` once, without retries, within the request timeout: the status and
    /// the body (at most `max_bytes`), or why there was none. For questions about a prompt,
    /// never a model call.
    pub fn post_once(
        &self,
        url: &str,
        bearer: Option<&str>,
        body: Vec<u8>,
        max_bytes: u64,
    ) -> Result<(u16, String), String> {
        let request = self.client.post(url).header(reqwest::header::CONTENT_TYPE, "application/json").body(body);
        self.once(request, bearer, self.config.request_timeout, max_bytes)
    }

    /// GETs `url` once, without retries, within `limit`: the status and the body (at most
    /// 1 MiB), or why there was none. For asking a server what it is; never a model call.
    pub fn probe(&self, url: &str, bearer: Option<&str>, limit: Duration) -> Result<(u16, String), String> {
        self.once(self.client.get(url), bearer, limit, 1 << 20)
    }

    /// Sends `request` once, without retries, within `limit`, and reads at most `max_bytes` of
    /// its answer.
    fn once(
        &self,
        mut request: reqwest::RequestBuilder,
        bearer: Option<&str>,
        limit: Duration,
        max_bytes: u64,
    ) -> Result<(u16, String), String> {
        if let Some(key) = bearer {
            request = request.bearer_auth(key);
        }
        match self.run(limit, async {
            let response = request.send().await.map_err(BodyError::Transport)?;
            let status = response.status().as_u16();
            read_body(response, max_bytes).await.map(|body| (status, body))
        }) {
            Ok(Ok(answer)) => Ok(answer),
            Ok(Err(BodyError::TooLarge)) => Err(format!("its answer was over {max_bytes} bytes")),
            Ok(Err(BodyError::Transport(err))) => Err(error_chain(&err)),
            Err(Stop::Elapsed) => Err(format!("no answer within {} s", limit.as_secs())),
            Err(Stop::Cancelled) => Err("cancelled".to_string()),
        }
    }

    /// POSTs `body`, JSON already encoded, and reads the whole reply (at most `max_bytes` of
    /// it) within [`HttpConfig::request_timeout`], retrying what [`RetryPolicy`] says to retry.
    pub fn post_json(
        &self,
        url: &str,
        bearer: Option<&str>,
        body: Vec<u8>,
        max_bytes: u64,
    ) -> Result<HttpReply, TransportError> {
        let limit = self.config.request_timeout;
        let (reply, retries) = self.with_retries(url, bearer, body, |request| {
            let outcome = self.run(limit, async {
                let response = request.send().await.map_err(BodyError::Transport)?;
                let status = response.status().as_u16();
                let retry_after = retry_after(response.headers());
                read_body(response, max_bytes).await.map(|body| (status, retry_after, body))
            });
            match outcome {
                Ok(Ok((status, retry_after, body))) => {
                    let retry = is_retryable_status(status, &body).then(|| (format!("HTTP {status}"), retry_after));
                    Attempt::Answered { value: (status, body), retry }
                }
                Ok(Err(BodyError::TooLarge)) => Attempt::Failed {
                    kind: TransportKind::TooLarge(max_bytes),
                    detail: format!("more than {max_bytes} bytes"),
                },
                Ok(Err(BodyError::Transport(err))) => {
                    Attempt::Failed { kind: transport_kind(&err), detail: error_chain(&err) }
                }
                Err(Stop::Elapsed) => Attempt::Failed {
                    kind: TransportKind::Timeout,
                    detail: format!("no whole reply within {} s", limit.as_secs_f64()),
                },
                Err(Stop::Cancelled) => cancelled(),
            }
        })?;
        let (status, body) = reply;
        Ok(HttpReply { status, body, retries })
    }

    /// POSTs `body` asking for a streamed reply: waits at most `first_byte` for the reply to
    /// begin, and hands back its body to be read piece by piece; retries what [`RetryPolicy`]
    /// says to retry before the body begins. An error status, or a server that answered with
    /// one JSON body, is read whole. Either way the body may have at most `max_bytes`.
    pub fn post_stream(
        &self,
        url: &str,
        bearer: Option<&str>,
        body: Vec<u8>,
        first_byte: Limit,
        idle: Limit,
        max_bytes: u64,
    ) -> Result<(Opened<'_>, Vec<RetryRecord>), TransportError> {
        let whole_limit = self.config.request_timeout;
        self.with_retries(url, bearer, body, |request| {
            let started = Instant::now();
            let response = match self.run(first_byte.after, request.send()) {
                Ok(Ok(response)) => response,
                Ok(Err(err)) => return Attempt::Failed { kind: transport_kind(&err), detail: error_chain(&err) },
                Err(Stop::Elapsed) => {
                    let detail = format!("no reply within {} s", first_byte.after.as_secs_f64());
                    return Attempt::Failed { kind: TransportKind::Silent(first_byte), detail };
                }
                Err(Stop::Cancelled) => return cancelled(),
            };
            let status = response.status().as_u16();
            let json = response
                .headers()
                .get(reqwest::header::CONTENT_TYPE)
                .and_then(|v| v.to_str().ok())
                .is_some_and(|v| v.trim_start().to_ascii_lowercase().starts_with("application/json"));
            if (200..300).contains(&status) && !json {
                let stream = ByteStream {
                    runtime: &self.runtime,
                    cancel: &self.cancel,
                    response,
                    // No deadline at all for a limit too long to add to the clock.
                    first_byte_by: started.checked_add(first_byte.after),
                    first_byte,
                    idle,
                    begun: false,
                    received: 0,
                    max_bytes,
                };
                return Attempt::Answered { value: Opened::Stream(Box::new(stream)), retry: None };
            }
            let retry_after = retry_after(response.headers());
            match self.run(whole_limit, read_body(response, max_bytes)) {
                Ok(Ok(body)) => {
                    let retry = is_retryable_status(status, &body).then(|| (format!("HTTP {status}"), retry_after));
                    Attempt::Answered { value: Opened::Whole { status, body }, retry }
                }
                Ok(Err(BodyError::TooLarge)) => Attempt::Failed {
                    kind: TransportKind::TooLarge(max_bytes),
                    detail: format!("more than {max_bytes} bytes"),
                },
                Ok(Err(BodyError::Transport(err))) => {
                    Attempt::Failed { kind: transport_kind(&err), detail: error_chain(&err) }
                }
                Err(Stop::Elapsed) => Attempt::Failed {
                    kind: TransportKind::Timeout,
                    detail: format!("no whole reply within {} s", whole_limit.as_secs_f64()),
                },
                Err(Stop::Cancelled) => cancelled(),
            }
        })
    }

    /// Makes attempts until one gives an answer the policy keeps, the policy's retries run
    /// out, or one fails in a way that is never retried (a timeout).
    fn with_retries<T>(
        &self,
        url: &str,
        bearer: Option<&str>,
        body: Vec<u8>,
        mut attempt: impl FnMut(reqwest::RequestBuilder) -> Attempt<T>,
    ) -> Result<(T, Vec<RetryRecord>), TransportError> {
        // Shared by every attempt without a copy.
        let bytes = bytes::Bytes::from(body);
        let policy = &self.config.retry;
        let mut retries = Vec::new();
        let mut number = 0;
        loop {
            number += 1;
            if self.cancel.is_cancelled() {
                return Err(TransportError {
                    kind: TransportKind::Cancelled,
                    detail: "cancelled".into(),
                    attempts: number - 1,
                });
            }
            let may_retry = number <= policy.max_retries;
            let mut request =
                self.client.post(url).header(reqwest::header::CONTENT_TYPE, "application/json").body(bytes.clone());
            if let Some(key) = bearer {
                request = request.bearer_auth(key);
            }
            let (reason, server_wait) = match attempt(request) {
                Attempt::Answered { value, retry: None } => return Ok((value, retries)),
                Attempt::Answered { value, retry: Some(_) } if !may_retry => return Ok((value, retries)),
                Attempt::Answered { retry: Some(retry), .. } => retry,
                Attempt::Failed { kind, detail } => {
                    let final_kind = matches!(
                        kind,
                        TransportKind::Timeout
                            | TransportKind::Silent(_)
                            | TransportKind::Cancelled
                            | TransportKind::TooLarge(_)
                    );
                    if final_kind || !may_retry {
                        return Err(TransportError { kind, detail, attempts: number });
                    }
                    (detail, None)
                }
            };
            let waited = match server_wait {
                Some(wait) => wait.min(policy.max_retry_after),
                None => jitter(policy.backoff(number - 1)),
            };
            retries.push(RetryRecord { attempt: number, reason, waited });
            if self.pause(waited) {
                return Err(TransportError {
                    kind: TransportKind::Cancelled,
                    detail: "cancelled".into(),
                    attempts: number,
                });
            }
        }
    }
}

#[cfg(feature = "http")]
/// Why a whole body could not be read.
enum BodyError {
    Transport(reqwest::Error),
    /// It has more bytes than allowed.
    TooLarge,
}

#[cfg(feature = "http")]
/// A whole body as text (invalid UTF-8 replaced, as `Response::text` does), read piece by
/// piece so that no more than `max_bytes` of it is ever held.
async fn read_body(mut response: reqwest::Response, max_bytes: u64) -> Result<String, BodyError> {
    if response.content_length().is_some_and(|length| length > max_bytes) {
        return Err(BodyError::TooLarge);
    }
    let mut body = Vec::new();
    while let Some(chunk) = response.chunk().await.map_err(BodyError::Transport)? {
        if (body.len() + chunk.len()) as u64 > max_bytes {
            return Err(BodyError::TooLarge);
        }
        body.extend_from_slice(&chunk);
    }
    Ok(String::from_utf8(body).unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned()))
}

/// The TLS settings of every client: rustls with the *ring* provider, given to this client
/// alone (nothing is installed process-wide), and the platform's certificate verifier.
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

#[cfg(feature = "http")]
/// The attempt the [`Cancel`] flag stopped.
fn cancelled<T>() -> Attempt<T> {
    Attempt::Failed { kind: TransportKind::Cancelled, detail: "the request was abandoned: cancelled".into() }
}

#[cfg(feature = "http")]
fn is_retryable_status(status: u16, body: &str) -> bool {
    match status {
        429 => !body.contains("insufficient_quota"),
        408 | 409 => true,
        s => s >= 500,
    }
}

#[cfg(feature = "http")]
/// Takes up to a quarter off `wait`, so that clients that failed together retry apart.
fn jitter(wait: Duration) -> Duration {
    wait.mul_f64(1.0 - 0.25 * fastrand::f64())
}

#[cfg(feature = "http")]
/// The server's requested wait: `retry-after-ms` (OpenAI's, in milliseconds), or
/// `Retry-After` in seconds or as an HTTP date (a date already past means now).
fn retry_after(headers: &reqwest::header::HeaderMap) -> Option<Duration> {
    let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok()).map(str::trim);
    if let Some(ms) = header("retry-after-ms").and_then(|v| v.parse::<f64>().ok())
        && ms.is_finite()
        && ms >= 0.0
    {
        return Some(Duration::from_secs_f64(ms.min(1e9) / 1000.0));
    }
    let value = header("retry-after")?;
    if let Ok(secs) = value.parse::<f64>() {
        return (secs.is_finite() && secs >= 0.0).then(|| Duration::from_secs_f64(secs.min(1e9)));
    }
    let date = httpdate::parse_http_date(value).ok()?;
    Some(date.duration_since(std::time::SystemTime::now()).unwrap_or(Duration::ZERO))
}

#[cfg(feature = "http")]
fn transport_kind(err: &reqwest::Error) -> TransportKind {
    if err.is_timeout() {
        TransportKind::Timeout
    } else if err.is_connect() {
        TransportKind::Connect
    } else {
        TransportKind::Interrupted
    }
}

#[cfg(feature = "http")]
/// The error and its causes on one line: reqwest's own Display leaves out the cause that
/// matters ("connection refused").
pub(crate) fn error_chain(err: &dyn std::error::Error) -> String {
    crate::report::error_with_causes(err, ": ")
}

pub(crate) mod duration_ms {
    use std::time::Duration;

    pub fn serialize<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u64(d.as_millis().try_into().unwrap_or(u64::MAX))
    }

    pub fn deserialize<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        Ok(Duration::from_millis(serde::Deserialize::deserialize(d)?))
    }
}

#[cfg(all(test, feature = "http"))]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_up_to_the_ceiling() {
        let policy = RetryPolicy::default();
        assert_eq!(policy.backoff(0), Duration::from_millis(500));
        assert_eq!(policy.backoff(1), Duration::from_secs(1));
        assert_eq!(policy.backoff(4), Duration::from_secs(8));
        assert_eq!(policy.backoff(40), Duration::from_secs(8));
    }

    #[test]
    fn jitter_only_shortens_and_by_at_most_a_quarter() {
        for _ in 0..1000 {
            let wait = jitter(Duration::from_secs(8));
            assert!(wait <= Duration::from_secs(8) && wait >= Duration::from_secs(6), "{wait:?}");
        }
    }

    #[test]
    fn retryable_statuses_follow_the_reference_client() {
        for status in [408, 409, 429, 500, 502, 503, 504] {
            assert!(is_retryable_status(status, "{}"), "{status}");
        }
        for status in [400, 401, 403, 404, 422] {
            assert!(!is_retryable_status(status, "{}"), "{status}");
        }
        let quota = r#"{"error":{"message":"You exceeded your current quota","type":"insufficient_quota","code":"insufficient_quota"}}"#;
        assert!(!is_retryable_status(429, quota));
    }

    #[test]
    fn retry_after_headers_are_read_in_both_forms() {
        let mut headers = reqwest::header::HeaderMap::new();
        assert_eq!(retry_after(&headers), None);
        headers.insert("retry-after", "3".parse().unwrap());
        assert_eq!(retry_after(&headers), Some(Duration::from_secs(3)));
        headers.insert("retry-after-ms", "150".parse().unwrap());
        assert_eq!(retry_after(&headers), Some(Duration::from_millis(150)));
        // The HTTP-date form: a date in the past means now, a later one the time until it.
        let mut dated = reqwest::header::HeaderMap::new();
        dated.insert("retry-after", "Wed, 21 Oct 2015 07:28:00 GMT".parse().unwrap());
        assert_eq!(retry_after(&dated), Some(Duration::ZERO));
        let later = httpdate::fmt_http_date(std::time::SystemTime::now() + Duration::from_secs(30));
        dated.insert("retry-after", later.parse().unwrap());
        let wait = retry_after(&dated).unwrap();
        assert!(wait > Duration::from_secs(25) && wait <= Duration::from_secs(30), "{wait:?}");
        dated.insert("retry-after", "-5".parse().unwrap());
        assert_eq!(retry_after(&dated), None);
        dated.insert("retry-after", "soon".parse().unwrap());
        assert_eq!(retry_after(&dated), None);
    }
}
