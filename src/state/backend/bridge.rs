//! Runs a remote backend's async client calls from the synchronous state API.
//!
//! Each remote backend owns one small Tokio runtime (one worker thread) that drives its
//! client and connections. A call spawns the future there and blocks the calling thread
//! until it ends; inside a multi-threaded runtime the block is announced with
//! `block_in_place`, so the caller's other tasks keep running. The caller may itself be
//! inside any runtime (the CLI's, a `#[tokio::test]`'s current-thread one) or none.

use std::future::Future;

use tokio::runtime::{Handle, Runtime, RuntimeFlavor};

/// A backend's own runtime; see the module docs.
#[derive(Debug)]
pub struct Bridge {
    runtime: Option<Runtime>,
}

impl Bridge {
    /// Starts the runtime (one worker thread named `name`).
    ///
    /// # Errors
    ///
    /// The OS error when the thread cannot be started.
    pub fn new(name: &str) -> std::io::Result<Bridge> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name(name)
            .enable_all()
            .build()?;
        Ok(Bridge {
            runtime: Some(runtime),
        })
    }

    /// Runs `fut` on the backend's runtime and returns its output; `None` only if the
    /// runtime is shutting down (the future panicked or the process is exiting).
    pub fn run<F>(&self, fut: F) -> Option<F::Output>
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        let runtime = self.runtime.as_ref()?;
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        runtime.spawn(async move {
            let _ = tx.send(fut.await);
        });
        blocking(|| rx.recv().ok())
    }

    /// The runtime's handle, to spawn a connection's driver task on it.
    pub fn handle(&self) -> Option<&Handle> {
        self.runtime.as_ref().map(Runtime::handle)
    }
}

impl Drop for Bridge {
    fn drop(&mut self) {
        // A runtime dropped inside another runtime's task must not block; its tasks are
        // idle connections by then.
        if let Some(rt) = self.runtime.take() {
            rt.shutdown_background();
        }
    }
}

/// Runs the blocking `f`, telling a multi-threaded Tokio runtime first (so it moves this
/// worker's other tasks elsewhere); on a current-thread runtime or outside one, just runs
/// it.
pub fn blocking<T>(f: impl FnOnce() -> T) -> T {
    match Handle::try_current().map(|h| h.runtime_flavor()) {
        Ok(RuntimeFlavor::MultiThread) => tokio::task::block_in_place(f),
        _ => f(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_outside_a_runtime() {
        let b = Bridge::new("t").unwrap();
        assert_eq!(b.run(async { 1 + 1 }), Some(2));
    }

    #[tokio::test]
    async fn runs_inside_a_current_thread_runtime_and_drops_there() {
        let b = Bridge::new("t").unwrap();
        let got = b.run(async {
            tokio::task::yield_now().await;
            "done"
        });
        assert_eq!(got, Some("done"));
        drop(b);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn runs_inside_a_multi_thread_runtime() {
        let b = Bridge::new("t").unwrap();
        assert_eq!(b.run(async { 3 }), Some(3));
    }
}
