//! Live progress of apply and destroy: on a terminal, a screen redrawn in place from the
//! display model ([`board::Board`]) that fits the terminal; otherwise (CI logs) plain
//! lines with the elapsed time, one per transition, no control codes. Both end with a
//! per-machine summary.

pub mod board;

use std::io::IsTerminal;
use std::time::Duration;

use tokio::sync::mpsc::UnboundedReceiver;
use tokio::time::Instant;

pub use board::{Board, Verb};

use crate::engine::Outcome;
use crate::machine::{CancelToken, Progress};

/// How often a live screen is redrawn (elapsed times tick; events are coalesced).
const REDRAW: Duration = Duration::from_millis(250);

/// What a run's display needs to know up front.
pub struct Options {
    pub verb: Verb,
    /// The run's machines in the order shown, and whether the plan resumes each.
    pub machines: Vec<(String, bool)>,
    /// Redraw a screen in place (a terminal) rather than print lines.
    pub live: bool,
    /// Colour the marks.
    pub color: bool,
    /// Ctrl-C, shown in the header.
    pub cancel: CancelToken,
}

/// What a command tells its run's display: the verb, the machines in the order shown
/// (and whether the plan resumes each), colour.
pub struct Display {
    pub verb: Verb,
    pub machines: Vec<(String, bool)>,
    pub color: bool,
}

/// Whether a live screen is on stderr now: the Ctrl-C handler then leaves the news to
/// its header instead of printing under it (a line printed there would tear the frame).
static LIVE: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Whether a live screen is being drawn.
pub fn is_live() -> bool {
    LIVE.load(std::sync::atomic::Ordering::SeqCst)
}

/// Whether stderr can take a live screen: a terminal that is not `TERM=dumb`.
pub fn live_terminal() -> bool {
    std::io::stderr().is_terminal() && std::env::var("TERM").map_or(true, |t| t != "dumb")
}

/// Renders executor progress events until the channel closes.
pub struct Renderer {
    task: tokio::task::JoinHandle<Board>,
    started: Instant,
    color: bool,
}

impl Renderer {
    pub fn spawn(mut rx: UnboundedReceiver<Progress>, opts: Options) -> Renderer {
        let started = Instant::now();
        let color = opts.color;
        let task = tokio::spawn(async move {
            let mut board = Board::new(opts.verb, opts.machines);
            LIVE.store(opts.live, std::sync::atomic::Ordering::SeqCst);
            let mut screen = Screen::default();
            let mut tick = tokio::time::interval(REDRAW);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
            loop {
                tokio::select! {
                    ev = rx.recv() => {
                        let Some(ev) = ev else { break };
                        let now = started.elapsed();
                        let changed = board.event(&ev, now);
                        if !opts.live && changed {
                            if let Some(line) = board.log_line(key_of(&ev), now) {
                                errln!("{line}");
                            }
                        }
                    }
                    _ = tick.tick(), if opts.live => {
                        board.interrupt(opts.cancel.level());
                        screen.draw(&board, started.elapsed(), opts.color);
                    }
                }
            }
            if opts.live {
                screen.clear();
                LIVE.store(false, std::sync::atomic::Ordering::SeqCst);
            }
            board
        });
        Renderer {
            task,
            started,
            color,
        }
    }

    /// Waits until every event sent so far is rendered (the senders must be dropped)
    /// and clears the live screen.
    pub async fn finish(self) -> Finished {
        Finished {
            board: self.task.await.ok(),
            started: self.started,
            color: self.color,
        }
    }
}

/// A run's display once its events are in: prints the per-machine summary.
pub struct Finished {
    board: Option<Board>,
    started: Instant,
    color: bool,
}

impl Finished {
    /// Settles each machine with its outcome and prints one line per machine.
    /// `interrupted`: Ctrl-C was pressed during the run.
    pub fn print_summary(
        self,
        outcomes: &std::collections::BTreeMap<String, Outcome>,
        interrupted: bool,
    ) {
        let Some(mut board) = self.board else {
            return;
        };
        if interrupted {
            board.interrupt(1);
        }
        let now = self.started.elapsed();
        for (address, o) in outcomes {
            board.settle(address, o, now);
        }
        let mut lines = board.summary(now).into_iter();
        if let Some(header) = lines.next() {
            errln!(
                "
{header}"
            );
        }
        for line in lines {
            errln!("{}", paint(&line, self.color));
        }
    }
}

fn key_of(ev: &Progress) -> &str {
    match ev {
        Progress::Transition { key, .. }
        | Progress::Resumed { key, .. }
        | Progress::Poll { key, .. }
        | Progress::Retry { key, .. } => key,
    }
}

/// The live screen on stderr: how many lines the last frame drew.
#[derive(Default)]
struct Screen {
    drawn: usize,
}

impl Screen {
    /// Redraws `board` over the last frame, fitted to the terminal's current size.
    fn draw(&mut self, board: &Board, now: Duration, color: bool) {
        let (rows, cols) = console::Term::stderr().size_checked().unwrap_or((24, 80));
        let lines = board.render(now, cols as usize, rows as usize);
        let mut buf = self.rewind();
        for l in &lines {
            buf.push_str(&paint(l, color));
            buf.push_str("\x1b[K\n");
        }
        buf.push_str("\x1b[J");
        err!("{buf}");
        self.drawn = lines.len();
    }

    /// Cursor back to the frame's first line.
    fn rewind(&self) -> String {
        match self.drawn {
            0 => "\r".into(),
            n => format!("\r\x1b[{n}A"),
        }
    }

    /// Removes the last frame (the summary replaces it).
    fn clear(&mut self) {
        if self.drawn > 0 {
            err!("{}\x1b[J", self.rewind());
            self.drawn = 0;
        }
    }
}

/// A machine line with its mark coloured (green done, red failed, yellow retrying or
/// interrupted, cyan waiting).
fn paint(line: &str, color: bool) -> String {
    let Some(mark) = line.chars().next() else {
        return String::new();
    };
    let styled = console::style(mark.to_string()).force_styling(true);
    let styled = match mark {
        '✓' => styled.green(),
        '✗' => styled.red(),
        '!' | '‖' => styled.yellow(),
        '…' => styled.cyan(),
        _ => return line.to_string(),
    };
    if !color {
        return line.to_string();
    }
    format!("{styled}{}", &line[mark.len_utf8()..])
}
