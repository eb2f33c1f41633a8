//! The executor (design 4.2): runs a [`Machine`] step by step, journalling each
//! transition before the next step's side effect (write-ahead), retrying transient
//! failures within a budget with exponential backoff, polling, mapping the first
//! cancellation to a compensating state and exiting on the second, and resuming from the
//! journal.
//!
//! Architecture invariant: this is the only place that sleeps, retries or polls. Machines
//! decide *what* happens (including deadlines, measured with [`StepCx::in_state`]); the
//! executor decides *when*.

pub mod coalesce;
pub mod journal;
pub mod limits;
pub mod providers;

use std::fmt::Debug;
use std::sync::Arc;
use std::time::Duration;

// tokio's clock, the one the executor sleeps on: time in state and sleeps agree (also
// under a paused test clock).
use tokio::time::Instant;

use async_trait::async_trait;
use serde::de::DeserializeOwned;
use serde::Serialize;
use tokio::sync::{mpsc, watch};
use tracing::Instrument;

pub use journal::{Journal, JournalError, MemoryJournal, PrevRecord};
pub use providers::Providers;

/// What one step asks the executor to do next.
#[derive(Debug, Clone, PartialEq)]
pub enum Step<S> {
    /// Transition; persisted before the next step runs.
    Next(S),
    /// Not done yet: same state after `after`, no retry budget consumed.
    Poll { after: Duration, note: String },
    /// Transient failure: same state after a backoff, budget consumed. `after` carries a
    /// server-requested delay (HTTP `Retry-After`), used when longer than the backoff.
    Retry {
        error: String,
        after: Option<Duration>,
    },
}

impl<S> Step<S> {
    /// A transient failure with no server-requested delay.
    pub fn retry(error: impl Into<String>) -> Self {
        Step::Retry {
            error: error.into(),
            after: None,
        }
    }
    /// A poll after `after` with a progress note.
    pub fn poll(after: Duration, note: impl Into<String>) -> Self {
        Step::Poll {
            after,
            note: note.into(),
        }
    }
}

/// The retry budget of one state: consecutive `Retry`s before
/// [`Machine::on_retries_exhausted`], and the exponential backoff between them.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RetryPolicy {
    pub max_attempts: u32,
    pub initial_backoff: Duration,
    pub max_backoff: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            max_attempts: 6,
            initial_backoff: Duration::from_secs(1),
            max_backoff: Duration::from_secs(30),
        }
    }
}

impl RetryPolicy {
    /// The delay before retry number `attempt` (1-based): `initial * 2^(attempt-1)`,
    /// capped at `max_backoff`, with up to 20% random jitter so parallel machines spread.
    pub fn backoff(&self, attempt: u32) -> Duration {
        let exp = self
            .initial_backoff
            .saturating_mul(1u32 << attempt.saturating_sub(1).min(16));
        let base = exp.min(self.max_backoff);
        let jitter = rand::random::<f64>() * 0.2;
        base.mul_f64(1.0 + jitter).min(self.max_backoff.max(base))
    }
}

/// The first poll of a state comes after at most this long ([`poll_delay`]).
pub const FIRST_POLL: Duration = Duration::from_millis(250);

/// How much longer each further poll of one state waits than the one before.
const POLL_GROWTH: f64 = 1.5;

/// The wait before poll number `polls` (0-based, counted within one state) of a step that
/// asked to be polled after `after` (the adapter's poll interval, or a longer wait): fast
/// at first (250 ms, then ×1.5 each time) and never longer than `after`, so a machine the
/// cloud reports ready after 2 s is seen within about a second of it, and a long wait
/// still settles at the cloud's own interval. The calls this adds are cheap: observes are
/// shared per location ([`shared`]), and the governor ([`limits`]) still spaces them.
pub fn poll_delay(polls: u32, after: Duration) -> Duration {
    FIRST_POLL
        .mul_f64(POLL_GROWTH.powi(polls.min(40) as i32))
        .min(after)
}

/// What a step may know about its context.
#[derive(Debug, Clone, Copy)]
pub struct StepCx {
    /// Time since this state was entered in this process (a resume gets a fresh window).
    pub in_state: Duration,
    /// Consecutive retries so far in this state.
    pub attempt: u32,
    /// Whether the user asked to cancel (the machine is compensating or finishing).
    pub cancelling: bool,
}

/// A journalled state machine (design 4.2).
#[async_trait]
pub trait Machine: Send + Sync {
    type State: Serialize + DeserializeOwned + Clone + Debug + Send + Sync;
    /// The journal's `kind` for this machine's records, for example `launch`.
    const KIND: &'static str;
    fn is_terminal(&self, s: &Self::State) -> bool;
    /// A short human line for the journal and progress, for example `booting i-123`.
    fn label(&self, s: &Self::State) -> String;
    /// The offer state `s` works on, for the structured log's fields (cloud, region,
    /// offer); `None` by default and between offers.
    fn offer<'a>(&self, _s: &'a Self::State) -> Option<&'a crate::provider::Offer> {
        None
    }
    async fn step(&self, s: &Self::State, cx: &StepCx) -> Step<Self::State>;
    fn retry_policy(&self, _s: &Self::State) -> RetryPolicy {
        RetryPolicy::default()
    }
    /// The failure state to enter when the retry budget of `s` is spent.
    fn on_retries_exhausted(&self, s: &Self::State, last_error: String) -> Self::State;
    /// The compensating state to enter on the first cancellation, `None` to keep going.
    fn on_cancel(&self, _s: &Self::State) -> Option<Self::State> {
        None
    }
    /// What the live display shows of `s` beside its label; nothing by default.
    fn facts(&self, _s: &Self::State) -> Facts {
        Facts::default()
    }
}

/// What the live display shows of a state beside its label: a short phase and, once
/// known, where the machine runs and what it costs.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Facts {
    /// A short state name, for example `booting`; empty: the display shows the label.
    pub phase: &'static str,
    /// `cloud/region[/zone]` of the chosen offer or the instance; empty before a choice.
    pub location: String,
    /// The cloud's instance type, for example `gpu_1x_h100`; empty before a choice.
    pub instance_type: String,
    /// The instance's id once the cloud answered (a Docker id is 64 characters).
    pub instance_id: String,
    /// The offer's price in USD per hour (`Offer::price_per_hour`).
    pub price_per_hour: Option<f64>,
    /// Whether an instance exists in this state (it bills).
    pub billing: bool,
}

impl Facts {
    /// A machine whose instances `ids` at `location` could not be removed: still billing.
    pub fn leaked(location: &impl std::fmt::Display, ids: &[String]) -> Facts {
        Facts {
            phase: "leaked",
            location: location.to_string(),
            instance_id: ids.join(","),
            billing: true,
            ..Facts::default()
        }
    }
}

/// Cancellation levels: 0 none, 1 soft (compensate), 2 hard (exit, journal resumable).
#[derive(Clone)]
pub struct CancelToken {
    tx: Arc<watch::Sender<u8>>,
}

impl Default for CancelToken {
    fn default() -> Self {
        let (tx, _) = watch::channel(0);
        CancelToken { tx: Arc::new(tx) }
    }
}

impl CancelToken {
    pub fn new() -> Self {
        Self::default()
    }
    /// Raises the level by one (first Ctrl-C or SIGTERM: soft; second: hard) and returns it.
    pub fn escalate(&self) -> u8 {
        let mut level = 0;
        self.tx.send_modify(|l| {
            *l = (*l + 1).min(2);
            level = *l;
        });
        level
    }
    pub fn level(&self) -> u8 {
        *self.tx.borrow()
    }
    /// Resolves when the level reaches at least `at_least`.
    pub async fn reached(&self, at_least: u8) {
        let mut rx = self.tx.subscribe();
        let _ = rx.wait_for(|l| *l >= at_least).await;
    }
}

/// A progress event for the CLI.
#[derive(Debug, Clone, PartialEq)]
pub enum Progress {
    /// A journalled transition into the state described by `label` and `facts`.
    Transition {
        key: String,
        kind: &'static str,
        label: String,
        terminal: bool,
        facts: Facts,
    },
    /// A run picked up a machine the journal left unfinished (an interrupted run).
    Resumed {
        key: String,
        kind: &'static str,
        label: String,
        facts: Facts,
    },
    /// An expected wait (`Step::Poll`): not an error, no retry budget spent.
    Poll { key: String, note: String },
    /// A transient failure being retried (`Step::Retry`).
    Retry {
        key: String,
        attempt: u32,
        max: u32,
        error: String,
    },
}

/// Why a run stopped without reaching a terminal state.
#[derive(Debug, thiserror::Error, miette::Diagnostic)]
pub enum ExecError {
    /// A second cancellation: the journal holds the last durable state; the next run
    /// resumes from it.
    #[error("interrupted in state '{label}'; the next run resumes from the journal")]
    #[diagnostic(code(gpuprov::interrupted))]
    Interrupted { key: String, label: String },
    #[error("cannot journal {key}")]
    #[diagnostic(code(gpuprov::journal))]
    Journal {
        key: String,
        #[source]
        source: JournalError,
    },
    #[error("journal record of {key} is not a valid {kind} state: {msg}")]
    #[diagnostic(
        code(gpuprov::journal::invalid),
        help("the state file was edited by hand or written by an incompatible version; restore the .backup or run `gpuprov state show` to inspect it")
    )]
    BadRecord {
        key: String,
        kind: String,
        msg: String,
    },
}

/// Runs machines against a journal (design 4.2).
#[derive(Clone)]
pub struct Executor {
    journal: Arc<dyn Journal>,
    cancel: CancelToken,
    progress: Option<mpsc::UnboundedSender<Progress>>,
    /// Polls wait the step's whole `after` ([`Executor::with_fixed_polls`]).
    fixed_polls: bool,
}

impl Executor {
    pub fn new(journal: Arc<dyn Journal>, cancel: CancelToken) -> Self {
        Executor {
            journal,
            cancel,
            progress: None,
            fixed_polls: false,
        }
    }

    /// Polls wait each step's whole `after` instead of starting fast ([`poll_delay`]):
    /// the schedule before issue 20, kept for comparisons.
    pub fn with_fixed_polls(mut self) -> Self {
        self.fixed_polls = true;
        self
    }

    /// Sends progress events to `tx`.
    pub fn with_progress(mut self, tx: mpsc::UnboundedSender<Progress>) -> Self {
        self.progress = Some(tx);
        self
    }

    pub fn cancel_token(&self) -> &CancelToken {
        &self.cancel
    }

    fn emit(&self, p: Progress) {
        if let Some(tx) = &self.progress {
            let _ = tx.send(p);
        }
    }

    /// Runs machine `m` under journal key `key` to a terminal state.
    ///
    /// Resume: when the journal holds a non-terminal record of this machine's kind,
    /// execution continues from it. Otherwise `initial` is called with the previous record
    /// (terminal, or of another kind, or `None`) and its result is journalled first.
    ///
    /// Errors: [`ExecError::Interrupted`] on a second cancellation,
    /// [`ExecError::Journal`] when a transition cannot be made durable (the run stops
    /// before any further side effect), [`ExecError::BadRecord`] for a record that does not
    /// parse as this machine's state.
    pub async fn run<M: Machine>(
        &self,
        m: &M,
        key: &str,
        initial: impl FnOnce(Option<PrevRecord>) -> M::State + Send,
    ) -> Result<M::State, ExecError> {
        // `GPUPROV_LOG=gpuprov=info`: one span per machine, one per step inside it.
        let span = tracing::info_span!("machine", address = %key, kind = %M::KIND);
        self.run_machine(m, key, initial).instrument(span).await
    }

    async fn run_machine<M: Machine>(
        &self,
        m: &M,
        key: &str,
        initial: impl FnOnce(Option<PrevRecord>) -> M::State + Send,
    ) -> Result<M::State, ExecError> {
        let prev = self
            .journal
            .load(key)
            .await
            .map_err(|source| ExecError::Journal {
                key: key.to_string(),
                source,
            })?;
        let resumed = match &prev {
            Some(p) if p.kind == M::KIND => {
                let s: M::State =
                    serde_json::from_value(p.state.clone()).map_err(|e| ExecError::BadRecord {
                        key: key.into(),
                        kind: M::KIND.into(),
                        msg: e.to_string(),
                    })?;
                (!m.is_terminal(&s)).then_some(s)
            }
            _ => None,
        };
        let mut state = match resumed {
            Some(s) => {
                self.emit(Progress::Resumed {
                    key: key.into(),
                    kind: M::KIND,
                    label: m.label(&s),
                    facts: m.facts(&s),
                });
                s
            }
            None => {
                let s = initial(prev);
                self.persist(m, key, &s).await?;
                s
            }
        };
        let mut entered = Instant::now();
        let mut attempt: u32 = 0;
        let mut polls: u32 = 0;
        let mut cancel_mapped = false;
        loop {
            if m.is_terminal(&state) {
                return Ok(state);
            }
            let level = self.cancel.level();
            if level >= 2 {
                return Err(ExecError::Interrupted {
                    key: key.into(),
                    label: m.label(&state),
                });
            }
            if level == 1 && !cancel_mapped {
                cancel_mapped = true;
                if let Some(next) = m.on_cancel(&state) {
                    self.persist(m, key, &next).await?;
                    state = next;
                    entered = Instant::now();
                    attempt = 0;
                    polls = 0;
                    continue;
                }
            }
            let cx = StepCx {
                in_state: entered.elapsed(),
                attempt,
                cancelling: cancel_mapped,
            };
            // A hard cancel drops the in-flight step: steps are idempotent and the journal
            // holds the last durable state, so the next run resumes safely.
            let step_span = tracing::info_span!(
                "step",
                state = %m.label(&state),
                attempt,
                cloud = tracing::field::Empty,
                region = tracing::field::Empty,
                offer = tracing::field::Empty,
            );
            if let Some(o) = m.offer(&state).filter(|_| !step_span.is_disabled()) {
                use tracing::field::display;
                step_span.record("cloud", display(&o.location.cloud));
                step_span.record("region", display(&o.location.region));
                step_span.record("offer", display(&o.id));
            }
            let step = tokio::select! {
                s = m.step(&state, &cx).instrument(step_span.clone()) => s,
                _ = self.cancel.reached(2) => {
                    return Err(ExecError::Interrupted { key: key.into(), label: m.label(&state) });
                }
            };
            match step {
                Step::Next(next) => {
                    tracing::info!(parent: &step_span, to = %m.label(&next), "transition");
                    self.persist(m, key, &next).await?;
                    state = next;
                    entered = Instant::now();
                    attempt = 0;
                    polls = 0;
                }
                Step::Poll { after, note } => {
                    tracing::debug!(parent: &step_span, after_ms = after.as_millis() as u64, note = %note, "poll");
                    self.emit(Progress::Poll {
                        key: key.into(),
                        note,
                    });
                    let wait = match self.fixed_polls {
                        true => after,
                        false => poll_delay(polls, after),
                    };
                    self.sleep(wait, cancel_mapped).await;
                    polls += 1;
                }
                Step::Retry { error, after } => {
                    attempt += 1;
                    let policy = m.retry_policy(&state);
                    tracing::info!(parent: &step_span, attempt, max = policy.max_attempts, error = %error, "retry");
                    if attempt >= policy.max_attempts {
                        let next = m.on_retries_exhausted(&state, error);
                        self.persist(m, key, &next).await?;
                        state = next;
                        entered = Instant::now();
                        attempt = 0;
                        polls = 0;
                        continue;
                    }
                    self.emit(Progress::Retry {
                        key: key.into(),
                        attempt,
                        max: policy.max_attempts,
                        error,
                    });
                    let backoff = policy.backoff(attempt).max(after.unwrap_or_default());
                    self.sleep(backoff, cancel_mapped).await;
                }
            }
        }
    }

    /// Sleeps, waking early on the next cancellation level so it is acted on promptly.
    async fn sleep(&self, d: Duration, cancel_mapped: bool) {
        let wake_at = if cancel_mapped { 2 } else { 1 };
        tokio::select! {
            _ = tokio::time::sleep(d) => {}
            _ = self.cancel.reached(wake_at) => {}
        }
    }

    async fn persist<M: Machine>(&self, m: &M, key: &str, s: &M::State) -> Result<(), ExecError> {
        let value = serde_json::to_value(s).map_err(|e| ExecError::Journal {
            key: key.into(),
            source: JournalError::Encode(e.to_string()),
        })?;
        let label = m.label(s);
        crate::crash::state_point("journal.before", M::KIND, &value).await;
        self.journal
            .record(key, M::KIND, &value, &label)
            .await
            .map_err(|source| ExecError::Journal {
                key: key.into(),
                source,
            })?;
        crate::crash::state_point("journal.after", M::KIND, &value).await;
        self.emit(Progress::Transition {
            key: key.into(),
            kind: M::KIND,
            label,
            terminal: m.is_terminal(s),
            facts: m.facts(s),
        });
        Ok(())
    }
}
