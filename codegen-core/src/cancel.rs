//! Stopping a step from another thread: a Ctrl-C handler, a user interface's button.
//!
//! A [`Cancel`] is a shared flag. Once it is set, the HTTP backends abandon the request in
//! flight (a streamed reply between two of its pieces, a reply asked for whole while it is
//! awaited, a wait before a retry) at once, not at the next timeout, and the loop ends the
//! step with [`Error::Interrupted`](crate::Error::Interrupted) before its next model call.
//! Nothing of the abandoned reply is recorded.

// Without the `http` feature only the flag is used: the waits it wakes are the HTTP client's.
#![cfg_attr(not(feature = "http"), allow(dead_code))]

use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::pin::pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Poll, Waker};

/// A handle that stops whatever watches it; clones share one flag.
///
/// ```
/// use codegen_core::Cancel;
///
/// let cancel = Cancel::new();
/// let handler = cancel.clone(); // e.g. moved into a Ctrl-C handler
/// assert!(!cancel.is_cancelled());
/// handler.cancel();
/// assert!(cancel.is_cancelled());
/// ```
#[derive(Clone, Default)]
pub struct Cancel {
    inner: Arc<Inner>,
}

#[derive(Default)]
struct Inner {
    cancelled: AtomicBool,
    /// The tasks waiting on this flag, by registration: woken when it is set, so that a wait
    /// ends at once instead of at its next timer.
    wakers: Mutex<HashMap<u64, Waker>>,
    next: AtomicU64,
}

impl Cancel {
    /// A flag that is not set.
    pub fn new() -> Cancel {
        Cancel::default()
    }

    /// Sets the flag and wakes every wait on it. Setting it again does nothing.
    pub fn cancel(&self) {
        self.inner.cancelled.store(true, Ordering::SeqCst);
        let wakers: Vec<Waker> = self.lock().drain().map(|(_, waker)| waker).collect();
        for waker in wakers {
            waker.wake();
        }
    }

    /// Whether the flag is set.
    pub fn is_cancelled(&self) -> bool {
        self.inner.cancelled.load(Ordering::SeqCst)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Waker>> {
        // A panic while holding it leaves the map usable: it holds only wakers.
        self.inner.wakers.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Runs `future` until it completes (`Some`) or the flag is set (`None`, and `future` is
    /// dropped: a request in flight is abandoned).
    pub(crate) async fn guard<F: Future>(&self, future: F) -> Option<F::Output> {
        let id = self.inner.next.fetch_add(1, Ordering::Relaxed);
        let _registration = Registration { cancel: self, id };
        let mut future = pin!(future);
        std::future::poll_fn(|cx| {
            if self.is_cancelled() {
                return Poll::Ready(None);
            }
            self.lock().insert(id, cx.waker().clone());
            // Set between the first look and the registration: `cancel` may have drained the
            // map before this waker was in it.
            if self.is_cancelled() {
                return Poll::Ready(None);
            }
            future.as_mut().poll(cx).map(Some)
        })
        .await
    }
}

/// Removes a finished wait's waker, so that the map holds only live waits.
struct Registration<'a> {
    cancel: &'a Cancel,
    id: u64,
}

impl Drop for Registration<'_> {
    fn drop(&mut self) {
        self.cancel.lock().remove(&self.id);
    }
}

impl fmt::Debug for Cancel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Cancel").field("cancelled", &self.is_cancelled()).finish()
    }
}

/// Two handles are equal when they share one flag.
impl PartialEq for Cancel {
    fn eq(&self, other: &Cancel) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap()
    }

    #[test]
    fn a_wait_ends_when_another_thread_cancels() {
        let cancel = Cancel::new();
        let other = cancel.clone();
        let (started_tx, started_rx) = std::sync::mpsc::channel();
        let canceller = std::thread::spawn(move || {
            started_rx.recv().unwrap();
            other.cancel();
        });
        let outcome = runtime().block_on(cancel.guard(async {
            started_tx.send(()).unwrap();
            // Far longer than any test runs: only the flag can end it.
            tokio::time::sleep(Duration::from_secs(3600)).await;
            "slept"
        }));
        canceller.join().unwrap();
        assert_eq!(outcome, None);
        assert!(cancel.lock().is_empty(), "the finished wait left its waker behind");
    }

    #[test]
    fn a_finished_future_gives_its_output_and_a_cancelled_flag_stops_at_once() {
        let cancel = Cancel::new();
        let rt = runtime();
        assert_eq!(rt.block_on(cancel.guard(async { 7 })), Some(7));
        assert!(cancel.lock().is_empty());
        cancel.cancel();
        assert_eq!(rt.block_on(cancel.guard(async { 7 })), None);
        assert_eq!(cancel, cancel.clone());
        assert_ne!(cancel, Cancel::new());
    }
}
