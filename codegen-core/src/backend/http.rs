//! One blocking HTTP client with the timeouts and retry rules every backend shares.
//!
//! Transport faults and the statuses that mean "try again later" are retried here; the
//! backends only ever see a final HTTP reply (success or not) or a final transport error,
//! and turn those into [`BackendError`](super::BackendError)s that say what to do.

use std::time::Duration;

use serde::Serialize;

/// Timeouts and retries of the HTTP backends.
#[derive(Debug, Clone, PartialEq)]
pub struct HttpConfig {
    /// Time allowed to open a connection. A few seconds: a server on this machine or the LAN
    /// answers at once, so a long wait only delays the "server not running" message.
    pub connect_timeout: Duration,
    /// Time allowed for one whole request. Minutes, not reqwest's 30 s: a local server loads
    /// the model's weights on its first request, and a long reply can take minutes on a CPU.
    pub request_timeout: Duration,
    /// When and how often to try again.
    pub retry: RetryPolicy,
}

impl Default for HttpConfig {
    fn default() -> HttpConfig {
        HttpConfig {
            connect_timeout: Duration::from_secs(5),
            request_timeout: Duration::from_secs(600),
            retry: RetryPolicy::default(),
        }
    }
}

/// Which failures are retried, how often, and how long to wait in between.
///
/// Retried: connection failures, a connection closed before the whole reply arrived, and the
/// statuses 408, 409, 429 and 5xx. Never retried: any other 4xx, a 429 that says
/// `insufficient_quota` (waiting does not add credit), and a request that ran past
/// [`HttpConfig::request_timeout`] (the server is working, only slowly: a second try would
/// just double the wait).
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
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RetryRecord {
    /// The attempt that failed (1-based).
    pub attempt: u32,
    /// What went wrong, e.g. "HTTP 503" or "connection refused".
    pub reason: String,
    /// How long we waited before the next attempt.
    #[serde(with = "duration_ms")]
    pub waited: Duration,
}

/// A complete HTTP reply, after any retries.
#[derive(Debug)]
pub(crate) struct HttpReply {
    pub status: u16,
    pub body: String,
    pub retries: Vec<RetryRecord>,
}

/// Why no complete HTTP reply could be had, after any retries.
#[derive(Debug)]
pub(crate) struct TransportError {
    pub kind: TransportKind,
    /// The underlying error, with its causes.
    pub detail: String,
    pub attempts: u32,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TransportKind {
    /// No connection could be opened (nothing listening, DNS, TLS handshake).
    Connect,
    /// The request ran past the request timeout.
    Timeout,
    /// The connection broke before the whole reply arrived.
    Interrupted,
}

pub(crate) struct HttpClient {
    client: reqwest::blocking::Client,
    config: HttpConfig,
}

impl HttpClient {
    pub fn new(config: HttpConfig) -> Result<HttpClient, String> {
        let builder = reqwest::blocking::Client::builder()
            .connect_timeout(config.connect_timeout)
            .timeout(config.request_timeout);
        #[cfg(feature = "tls")]
        let builder = builder.tls_backend_preconfigured(tls_config()?);
        let client = builder.build().map_err(|e| error_chain(&e))?;
        Ok(HttpClient { client, config })
    }

    pub fn config(&self) -> &HttpConfig {
        &self.config
    }

    /// POSTs `body`, JSON already encoded, retrying what [`RetryPolicy`] says to retry.
    pub fn post_json(&self, url: &str, bearer: Option<&str>, body: Vec<u8>) -> Result<HttpReply, TransportError> {
        // Shared by every attempt without a copy.
        let bytes = bytes::Bytes::from(body);
        let policy = &self.config.retry;
        let mut retries = Vec::new();
        let mut attempt = 0;
        loop {
            attempt += 1;
            let may_retry = attempt <= policy.max_retries;
            let mut request =
                self.client.post(url).header(reqwest::header::CONTENT_TYPE, "application/json").body(bytes.clone());
            if let Some(key) = bearer {
                request = request.bearer_auth(key);
            }
            let outcome = request.send().and_then(|response| {
                let status = response.status().as_u16();
                let retry_after = retry_after(response.headers());
                response.text().map(|body| (status, retry_after, body))
            });
            let (reason, server_wait) = match outcome {
                Ok((status, retry_after, body)) => {
                    if !is_retryable_status(status, &body) || !may_retry {
                        return Ok(HttpReply { status, body, retries });
                    }
                    (format!("HTTP {status}"), retry_after)
                }
                Err(err) => {
                    let kind = transport_kind(&err);
                    if kind == TransportKind::Timeout || !may_retry {
                        return Err(TransportError { kind, detail: error_chain(&err), attempts: attempt });
                    }
                    (error_chain(&err), None)
                }
            };
            let waited = match server_wait {
                Some(wait) => wait.min(policy.max_retry_after),
                None => jitter(policy.backoff(attempt - 1)),
            };
            retries.push(RetryRecord { attempt, reason, waited });
            std::thread::sleep(waited);
        }
    }
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

fn is_retryable_status(status: u16, body: &str) -> bool {
    match status {
        429 => !body.contains("insufficient_quota"),
        408 | 409 => true,
        s => s >= 500,
    }
}

/// Takes up to a quarter off `wait`, so that clients that failed together retry apart.
fn jitter(wait: Duration) -> Duration {
    wait.mul_f64(1.0 - 0.25 * fastrand::f64())
}

/// The server's requested wait: `retry-after-ms` (OpenAI's, in milliseconds) or
/// `Retry-After` in seconds. The HTTP-date form of `Retry-After` is not honoured; the
/// ordinary backoff applies instead.
fn retry_after(headers: &reqwest::header::HeaderMap) -> Option<Duration> {
    let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok()).map(str::trim);
    if let Some(ms) = header("retry-after-ms").and_then(|v| v.parse::<f64>().ok())
        && ms.is_finite()
        && ms >= 0.0
    {
        return Some(Duration::from_secs_f64(ms.min(1e9) / 1000.0));
    }
    let secs = header("retry-after").and_then(|v| v.parse::<f64>().ok())?;
    (secs.is_finite() && secs >= 0.0).then(|| Duration::from_secs_f64(secs.min(1e9)))
}

fn transport_kind(err: &reqwest::Error) -> TransportKind {
    if err.is_timeout() {
        TransportKind::Timeout
    } else if err.is_connect() {
        TransportKind::Connect
    } else {
        TransportKind::Interrupted
    }
}

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
}

#[cfg(test)]
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
        let mut dated = reqwest::header::HeaderMap::new();
        dated.insert("retry-after", "Wed, 21 Oct 2015 07:28:00 GMT".parse().unwrap());
        assert_eq!(retry_after(&dated), None);
        dated.insert("retry-after", "-5".parse().unwrap());
        assert_eq!(retry_after(&dated), None);
    }
}
