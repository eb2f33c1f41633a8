//! Test-only crash points (issue 6): named places right before and right after each
//! journal write and each side effect (provider call, installer push, kubeconfig write)
//! where a test can make the run die, to check that the next run recovers.
//!
//! Without the `crash-points` cargo feature [`point`] is an empty inline function, so
//! release builds carry nothing of it.
//!
//! With the feature:
//! - an in-process test calls [`arm`] with a point's name and occurrence; the run stops
//!   dead there (that future, and every later crash point in the process, pends forever)
//!   and the returned [`Hit`] is notified, so the test can drop the runtime: the process
//!   state is gone, the (fake) cloud and the files on disk survive;
//! - the binary, run with `GPUPROV_CRASH_AT=name[#n]`, prints
//!   `GPUPROV_CRASH_POINT_REACHED name#n` to stderr when the `n`-th hit of `name` is reached
//!   (default 1) and parks there, so the test can `kill -9` it;
//! - [`trace_start`] / [`trace_take`] (or `GPUPROV_CRASH_TRACE=1` for the binary, one
//!   `GPUPROV_CRASH_TRACE name` stderr line per hit) record every point passed, so a test can
//!   enumerate the points of a clean run.
//!
//! Names: `journal.before:<kind>:<state>` / `journal.after:<kind>:<state>` around each
//! transition (`<state>` is the state's serde tag; a compensating launch state adds the
//! embedded teardown state as `compensating/<teardown state>`), `journal.before:remove` /
//! `journal.after:remove` around dropping a destroyed resource, and
//! `provider.before:<op>` / `provider.after:<op>` around `prepare`, `create`, `delete`
//! and `cleanup`.

/// The stderr marker the binary prints when it parks at an armed crash point.
pub const REACHED_MARKER: &str = "GPUPROV_CRASH_POINT_REACHED";
/// The stderr prefix of each trace line of the binary (`GPUPROV_CRASH_TRACE=1`).
pub const TRACE_MARKER: &str = "GPUPROV_CRASH_TRACE";

/// Marks crash point `name` (for example `journal.after:launch:creating`). With the
/// `crash-points` feature, a test can arrange for the run to stop dead here; otherwise
/// this does nothing.
#[inline]
pub async fn point(name: &str) {
    #[cfg(feature = "crash-points")]
    imp::point(name).await;
    #[cfg(not(feature = "crash-points"))]
    let _ = name;
}

/// The crash point around a journal write of machine `kind` entering `state` (its JSON):
/// `<prefix>:<kind>:<serde tag>`. Does nothing without the `crash-points` feature.
#[inline]
pub async fn state_point(prefix: &str, kind: &str, state: &serde_json::Value) {
    #[cfg(feature = "crash-points")]
    {
        // The launch and teardown machines tag their states `state`, the k3s machine
        // `k3s`; nested machines (a k3s machine's launch, a compensation's teardown)
        // add their own tag after a `/`.
        let tag = |v: &serde_json::Value| {
            v.get("state")
                .or_else(|| v.get("k3s"))
                .and_then(|t| t.as_str())
                .unwrap_or("unknown")
                .to_string()
        };
        let mut name = format!("{prefix}:{kind}:{}", tag(state));
        let mut cur = state;
        while let Some(sub) = cur.get("launch").or_else(|| cur.get("teardown")) {
            name.push('/');
            name.push_str(&tag(sub));
            cur = sub;
        }
        imp::point(&name).await;
    }
    #[cfg(not(feature = "crash-points"))]
    let _ = (prefix, kind, state);
}

#[cfg(feature = "crash-points")]
pub use imp::{arm, crashed, disarm, trace_start, trace_take, Hit};

#[cfg(feature = "crash-points")]
mod imp {
    use std::collections::HashMap;
    use std::io::Write as _;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

    use tokio::sync::Notify;

    /// Set while anything is armed, tracing or crashed: the fast path skips the lock.
    static ACTIVE: AtomicBool = AtomicBool::new(false);
    static ENV: OnceLock<()> = OnceLock::new();

    #[derive(Default)]
    struct Registry {
        armed: Option<(String, u32)>,
        counts: HashMap<String, u32>,
        trace: Option<Vec<String>>,
        trace_stderr: bool,
        /// The binary prints a marker when it parks (env mode).
        from_env: bool,
        dead: bool,
        hit: Option<Arc<Notify>>,
        hit_name: Option<String>,
    }

    fn registry() -> MutexGuard<'static, Registry> {
        static R: OnceLock<Mutex<Registry>> = OnceLock::new();
        R.get_or_init(Default::default)
            .lock()
            .unwrap_or_else(|e| e.into_inner())
    }

    fn refresh_active(r: &Registry) {
        let on = r.armed.is_some() || r.trace.is_some() || r.trace_stderr || r.dead;
        ACTIVE.store(on, Ordering::SeqCst);
    }

    /// Reads `GPUPROV_CRASH_AT=name[#n]` and `GPUPROV_CRASH_TRACE=1` once.
    fn init_from_env() {
        ENV.get_or_init(|| {
            let mut r = registry();
            if let Ok(spec) = std::env::var("GPUPROV_CRASH_AT") {
                let spec = spec.trim();
                if !spec.is_empty() {
                    r.armed = Some(parse_spec(spec));
                    r.from_env = true;
                }
            }
            r.trace_stderr = std::env::var("GPUPROV_CRASH_TRACE").is_ok_and(|v| v == "1");
            refresh_active(&r);
        });
    }

    /// `name[#n]` → (name, n), n at least 1 (default 1; an unreadable count is 1).
    pub(super) fn parse_spec(spec: &str) -> (String, u32) {
        match spec.rsplit_once('#') {
            Some((n, k)) => (n.to_string(), k.parse::<u32>().unwrap_or(1).max(1)),
            None => (spec.to_string(), 1),
        }
    }

    /// Notified when the run stops at the armed point.
    pub struct Hit {
        notify: Arc<Notify>,
    }

    impl Hit {
        /// Resolves once the run has stopped at the armed point (at once if it already
        /// has).
        pub async fn wait(&self) {
            self.notify.notified().await
        }
    }

    /// Arms crash point `name` at its `nth` hit (1-based), counting from now; clears the
    /// counts and any earlier crash. The run that reaches it stops dead there.
    pub fn arm(name: &str, nth: u32) -> Hit {
        init_from_env();
        let mut r = registry();
        let notify = Arc::new(Notify::new());
        r.armed = Some((name.to_string(), nth.max(1)));
        r.counts.clear();
        r.dead = false;
        r.hit = Some(notify.clone());
        r.hit_name = None;
        refresh_active(&r);
        Hit { notify }
    }

    /// Disarms and forgets an earlier crash, so later runs in this process go through.
    pub fn disarm() {
        init_from_env();
        let mut r = registry();
        r.armed = None;
        r.counts.clear();
        r.dead = false;
        r.hit = None;
        refresh_active(&r);
    }

    /// The point the run stopped at since the last [`arm`], if it did.
    pub fn crashed() -> Option<String> {
        registry().hit_name.clone()
    }

    /// Starts recording every point passed (clears an earlier trace).
    pub fn trace_start() {
        init_from_env();
        let mut r = registry();
        r.trace = Some(Vec::new());
        refresh_active(&r);
    }

    /// Stops recording and returns the points passed since [`trace_start`], in order.
    pub fn trace_take() -> Vec<String> {
        let mut r = registry();
        let t = r.trace.take().unwrap_or_default();
        refresh_active(&r);
        t
    }

    pub(super) async fn point(name: &str) {
        init_from_env();
        if !ACTIVE.load(Ordering::SeqCst) {
            return;
        }
        let stop = {
            let mut r = registry();
            if r.dead {
                true
            } else {
                if let Some(t) = r.trace.as_mut() {
                    t.push(name.to_string());
                }
                if r.trace_stderr {
                    let _ = writeln!(std::io::stderr(), "{} {name}", super::TRACE_MARKER);
                }
                let nth = match &r.armed {
                    Some((armed, nth)) if armed == name => Some(*nth),
                    _ => None,
                };
                match nth {
                    Some(nth) => {
                        let c = r.counts.entry(name.to_string()).or_insert(0);
                        *c += 1;
                        if *c == nth {
                            r.dead = true;
                            r.armed = None;
                            r.hit_name = Some(format!("{name}#{nth}"));
                            if r.from_env {
                                let _ = writeln!(
                                    std::io::stderr(),
                                    "{} {name}#{nth}",
                                    super::REACHED_MARKER
                                );
                            }
                            if let Some(n) = &r.hit {
                                n.notify_one();
                            }
                            refresh_active(&r);
                            true
                        } else {
                            false
                        }
                    }
                    None => false,
                }
            }
        };
        if stop {
            std::future::pending::<()>().await;
        }
    }
}

#[cfg(all(test, feature = "crash-points"))]
mod tests {
    use super::imp::parse_spec;

    #[test]
    fn crash_at_spec_takes_an_optional_occurrence() {
        assert_eq!(
            parse_spec("provider.after:create"),
            ("provider.after:create".into(), 1)
        );
        assert_eq!(
            parse_spec("journal.after:launch:booting#3"),
            ("journal.after:launch:booting".into(), 3)
        );
        assert_eq!(parse_spec("x#0"), ("x".into(), 1));
        assert_eq!(parse_spec("x#junk"), ("x".into(), 1));
    }
}
