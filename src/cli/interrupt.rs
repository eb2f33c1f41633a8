//! Ctrl-C and SIGTERM before a command has anything to undo: while gpuprov waits for the
//! state lock, asks the clouds' catalogs or waits at the prompt, an interrupt ends it at
//! once with exit 130 (as the table in `gpuprov --help` says), instead of the signal's
//! default death. A command that handles interrupts itself (apply and destroy once
//! machines run: the first Ctrl-C compensates; `tunnel`: closes) calls [`take_over`]
//! first.

use std::sync::atomic::{AtomicBool, Ordering};

use super::error::{CommandError, Kind};

/// Whether a command has its own handler now.
static TAKEN_OVER: AtomicBool = AtomicBool::new(false);

/// Hands interrupts to the calling command: from now on the default handler ignores them.
pub(super) fn take_over() {
    TAKEN_OVER.store(true, Ordering::SeqCst);
}

/// Resolves on the next Ctrl-C or SIGTERM (what CI runners send on timeout).
pub(super) async fn next_interrupt() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        if let Ok(mut term) = signal(SignalKind::terminate()) {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
            }
            return;
        }
    }
    let _ = tokio::signal::ctrl_c().await;
}

/// Installs the default handler on the current runtime: an interrupt before
/// [`take_over`] prints why and exits 130. Nothing is written at that point (a lock held
/// on the local backend is released with the process; its stale record is taken over by
/// the next run), so exiting is what the signal would have done, with the documented code.
///
/// The signal handlers are registered here, before this returns, not when the spawned
/// task first runs: on a loaded machine the command could otherwise announce its lock
/// wait and be killed by the signal's default action before the task was polled.
pub(super) fn install_default() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        if let (Ok(mut int), Ok(mut term)) = (
            signal(SignalKind::interrupt()),
            signal(SignalKind::terminate()),
        ) {
            tokio::spawn(async move {
                loop {
                    tokio::select! {
                        _ = int.recv() => {}
                        _ = term.recv() => {}
                    }
                    exit_unless_taken_over();
                }
            });
            return;
        }
    }
    tokio::spawn(async {
        loop {
            next_interrupt().await;
            exit_unless_taken_over();
        }
    });
}

/// Exits 130 with the `interrupted` diagnostic, unless a command handles interrupts now.
fn exit_unless_taken_over() {
    if !TAKEN_OVER.load(Ordering::SeqCst) {
        let e = CommandError::new(
            Kind::Interrupted,
            miette::miette!(code = "gpuprov::interrupted", "interrupted"),
        );
        errln!();
        e.print();
        std::process::exit(e.exit().code().into());
    }
}
