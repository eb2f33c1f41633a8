//! Test-only crash points (issue 6): named places right before and right after each
//! journal write and each side effect (provider call, installer push, kubeconfig write)
//! where a test can make the run die, to check that the next run recovers.
//!
//! Without the `crash-points` cargo feature [`point`] is an empty inline function, so
//! release builds carry nothing of it.

/// Marks crash point `name` (for example `journal.after:launch:creating`). With the
/// `crash-points` feature, a test can arrange for the run to stop dead here; otherwise
/// this does nothing.
#[inline]
pub async fn point(name: &str) {
    let _ = name;
}
