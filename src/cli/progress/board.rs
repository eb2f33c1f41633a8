//! The live display's model (issue 19): what each machine of a run is doing, folded from
//! the executor's [`Progress`] events, and the screen that fits a terminal. Pure: the
//! clock is the caller's (`now`, time since the run started), so screens are
//! snapshot-tested at any size.
//!
//! A screen is a header (`n of N ready`, elapsed time, the hourly cost of what is up),
//! one line per machine (mark, address, phase, time in phase, `cloud/region/type`, short
//! id, what it waits for) and, when the machines do not fit, the active ones with the
//! rest counted by state. Expected waits (`Progress::Poll`: SSH not up yet, still
//! booting) show as waiting; only retried failures show as errors.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use console::{measure_text_width, truncate_str};

use crate::engine::Outcome;
use crate::machine::{Facts, Progress};

/// Which command runs: it names the goal counted in the header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verb {
    Apply,
    Destroy,
}

impl Verb {
    fn name(self) -> &'static str {
        match self {
            Verb::Apply => "Apply",
            Verb::Destroy => "Destroy",
        }
    }
    fn goal(self) -> &'static str {
        match self {
            Verb::Apply => "ready",
            Verb::Destroy => "destroyed",
        }
    }
}

/// Where a machine is, coarsely: what its mark and its place on a full screen follow.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Status {
    /// Not started yet (parallelism, or waiting for its dependencies).
    Pending,
    /// Stepping through its states.
    Working,
    /// An expected wait: SSH not up yet, still booting, an API not answering yet.
    Waiting,
    /// A transient failure, retried within the budget.
    Retrying,
    /// Reached the run's goal (ready, updated, destroyed).
    Done,
    Failed,
    /// Stopped by Ctrl-C; the next run resumes it.
    Interrupted,
}

impl Status {
    fn mark(self) -> char {
        match self {
            Status::Pending => '·',
            Status::Working => '›',
            Status::Waiting => '…',
            Status::Retrying => '!',
            Status::Done => '✓',
            Status::Failed => '✗',
            Status::Interrupted => '‖',
        }
    }
    fn name(self) -> &'static str {
        match self {
            Status::Pending => "pending",
            Status::Working => "working",
            Status::Waiting => "waiting",
            Status::Retrying => "retrying",
            Status::Done => "done",
            Status::Failed => "failed",
            Status::Interrupted => "interrupted",
        }
    }
}

#[derive(Debug, Clone)]
struct Row {
    address: String,
    status: Status,
    /// A short state name: `booting`, `connecting`, `ready`.
    phase: String,
    /// What it waits for, the retried error, or why it failed.
    detail: String,
    /// When the current phase was entered (run clock).
    since: Duration,
    facts: Facts,
    resumed: bool,
}

/// The live display's state of one run.
#[derive(Debug, Clone)]
pub struct Board {
    verb: Verb,
    rows: Vec<Row>,
    index: HashMap<String, usize>,
    /// Ctrl-C level: 1 stopping gracefully, 2 exiting.
    interrupt: u8,
}

/// The phases of the machines' failed ends: the launch's `aborted`, `exhausted`,
/// `leaked` and `unowned`, the k3s machine's `failed`, the teardown's `leaked`, a shared
/// object's `failed: …` and `leaked: …` (labels without a phase read by their first word).
/// Only these count as failed: an end the board does not know is not a failure.
const FAILED_PHASES: &[&str] = &["aborted", "exhausted", "failed", "leaked", "unowned"];

/// Lines kept free below a live screen: the cursor's line (a full screen would scroll).
const SPARE_LINES: usize = 1;

impl Board {
    /// A board for `addresses` (the run's machines, in the order shown), each pending;
    /// `resumed` marks the ones the plan resumes.
    pub fn new(verb: Verb, addresses: impl IntoIterator<Item = (String, bool)>) -> Board {
        let mut b = Board {
            verb,
            rows: Vec::new(),
            index: HashMap::new(),
            interrupt: 0,
        };
        for (address, resumed) in addresses {
            b.row(&address).resumed |= resumed;
        }
        b
    }

    fn row(&mut self, address: &str) -> &mut Row {
        let i = match self.index.get(address) {
            Some(i) => *i,
            None => {
                self.rows.push(Row {
                    address: address.to_string(),
                    status: Status::Pending,
                    phase: "pending".into(),
                    detail: String::new(),
                    since: Duration::ZERO,
                    facts: Facts::default(),
                    resumed: false,
                });
                self.index.insert(address.to_string(), self.rows.len() - 1);
                self.rows.len() - 1
            }
        };
        &mut self.rows[i]
    }

    /// Folds one executor event in at `now`. Returns whether the machine's phase or
    /// status changed (a transition the plain log prints).
    pub fn event(&mut self, ev: &Progress, now: Duration) -> bool {
        match ev {
            Progress::Transition {
                key,
                label,
                terminal,
                facts,
                ..
            } => {
                let r = self.row(key);
                let phase = phase_of(facts, label);
                let status = match (*terminal, phase.as_str()) {
                    (false, _) => Status::Working,
                    (true, "interrupted") => Status::Interrupted,
                    (true, p) if FAILED_PHASES.contains(&p) => Status::Failed,
                    // Any other end reached its goal: a machine `ready` or `destroyed`, a
                    // shared key `ready …` or `using existing …`, one `released …`.
                    (true, _) => Status::Done,
                };
                let changed = phase != r.phase || status != r.status;
                if phase != r.phase {
                    r.since = now;
                }
                r.facts = merge(&r.facts, facts);
                r.phase = phase;
                r.status = status;
                r.detail = if status == Status::Failed {
                    label.clone()
                } else {
                    String::new()
                };
                changed
            }
            Progress::Resumed {
                key, label, facts, ..
            } => {
                let r = self.row(key);
                r.resumed = true;
                r.phase = phase_of(facts, label);
                r.facts = merge(&r.facts, facts);
                r.status = Status::Working;
                r.since = now;
                r.detail = String::new();
                true
            }
            Progress::Poll { key, note } => {
                let r = self.row(key);
                let changed = r.status != Status::Waiting;
                r.status = Status::Waiting;
                r.detail = note.clone();
                changed
            }
            Progress::Retry {
                key,
                attempt,
                max,
                error,
            } => {
                let r = self.row(key);
                r.status = Status::Retrying;
                r.detail = format!("retry {attempt}/{max}: {error}");
                true
            }
        }
    }

    /// Records Ctrl-C (`level` 1: stopping gracefully; 2: exiting).
    pub fn interrupt(&mut self, level: u8) {
        self.interrupt = self.interrupt.max(level);
    }

    /// Settles `address` with the run's outcome at `now` (what the events may not say:
    /// an interrupted machine, a skipped one, an in-place update).
    pub fn settle(&mut self, address: &str, outcome: &Outcome, now: Duration) {
        let r = self.row(address);
        let stopped = r.status == Status::Interrupted;
        let (status, phase, detail) = match outcome {
            // Ctrl-C ended it (its last state says so): interrupted, not failed.
            Outcome::Failed(why) if stopped => {
                (Status::Interrupted, "interrupted", why.to_string())
            }
            Outcome::Ready(_) => (Status::Done, "ready", String::new()),
            Outcome::Updated => (Status::Done, "updated", String::new()),
            Outcome::Unchanged => (Status::Done, "unchanged", String::new()),
            Outcome::Destroyed => (Status::Done, "destroyed", String::new()),
            Outcome::Failed(why) => (Status::Failed, "failed", why.to_string()),
            Outcome::Leaked(why) => (Status::Failed, "leaked", why.clone()),
            Outcome::Interrupted(at) => (Status::Interrupted, "interrupted", format!("while {at}")),
        };
        if phase != r.phase {
            r.since = now;
        }
        if let Outcome::Ready(vm) = outcome {
            r.facts = crate::vm::vm_facts("ready", vm);
        }
        if matches!(outcome, Outcome::Destroyed) {
            r.facts.billing = false;
        }
        r.status = status;
        r.phase = phase.into();
        r.detail = detail;
    }

    fn count(&self, status: Status) -> usize {
        self.rows.iter().filter(|r| r.status == status).count()
    }

    /// The header: `Apply: 3 of 60 ready · 1 failed · 2m05s · $41.20/h up (12 machines)`.
    pub fn header(&self, now: Duration) -> String {
        self.header_of(now, true)
    }

    /// The header; `live`: while the run goes on (Ctrl-C's news says what happens next).
    fn header_of(&self, now: Duration, live: bool) -> String {
        let total = self.rows.len();
        let mut h = format!(
            "{}: {} of {total} {}",
            self.verb.name(),
            self.count(Status::Done),
            self.verb.goal()
        );
        for s in [Status::Failed, Status::Interrupted] {
            let n = self.count(s);
            if n > 0 {
                h.push_str(&format!(" · {n} {}", s.name()));
            }
        }
        h.push_str(&format!(" · {}", duration(now)));
        let up: Vec<&Row> = self.rows.iter().filter(|r| r.facts.billing).collect();
        let priced: Vec<f64> = up.iter().filter_map(|r| r.facts.price_per_hour).collect();
        let cost = priced.iter().fold(0.0, |a, p| a + p);
        let machines = format!(
            "{} machine{}",
            up.len(),
            if up.len() == 1 { "" } else { "s" }
        );
        // A teardown knows no price: say what is known, never a made-up total.
        match (priced.len(), up.len()) {
            (0, 0) => h.push_str(" · $0.00/h up"),
            (0, _) => h.push_str(&format!(" · {machines} up")),
            (p, u) if p == u => h.push_str(&format!(" · ${cost:.2}/h up ({machines})")),
            _ => h.push_str(&format!(" · ${cost:.2}/h or more up ({machines})")),
        }
        match self.interrupt {
            0 => {}
            // The summary counts the interrupted machines; the verdict follows it.
            _ if !live => {}
            1 => h.push_str(
                " · interrupted: tearing down what is being created (Ctrl-C again to exit now)",
            ),
            _ => h.push_str(" · interrupted: exiting; the next run resumes"),
        }
        h
    }

    /// One machine's line, at most `width` columns.
    fn line(&self, r: &Row, now: Duration, widths: &Widths, width: usize) -> String {
        let mut where_ = r.facts.location.clone();
        if !r.facts.instance_type.is_empty() {
            where_.push('/');
            where_.push_str(&r.facts.instance_type);
        }
        let mut detail = String::new();
        if r.resumed {
            detail.push_str("resumed");
        }
        if !r.detail.is_empty() {
            if !detail.is_empty() {
                detail.push_str("; ");
            }
            if r.status == Status::Waiting {
                detail.push_str("waiting: ");
            }
            detail.push_str(&r.detail);
        }
        let text = format!(
            "{} {:aw$}  {:pw$}  {:>6}  {:ww$}  {:iw$}  {}",
            r.status.mark(),
            r.address,
            r.phase,
            duration(now.saturating_sub(r.since)),
            where_,
            short_id(&r.facts.instance_id),
            detail,
            aw = widths.address,
            pw = widths.phase,
            ww = widths.location,
            iw = widths.id,
        );
        fit(text.trim_end(), width)
    }

    fn widths(&self, rows: &[&Row]) -> Widths {
        let w = |f: &dyn Fn(&Row) -> usize| rows.iter().map(|r| f(r)).max().unwrap_or(0);
        Widths {
            address: w(&|r| measure_text_width(&r.address)).min(24),
            phase: w(&|r| r.phase.len()).max(7),
            location: w(&|r| {
                let t = r.facts.instance_type.len();
                r.facts.location.len() + if t > 0 { t + 1 } else { 0 }
            })
            .min(40),
            id: w(&|r| short_id(&r.facts.instance_id).len()),
        }
    }

    /// The screen for a `width` × `height` terminal: the header, then every machine when
    /// they fit, else the active ones first (then failed, interrupted, done, pending, as
    /// room allows) in address order, and one line counting the rest by state.
    pub fn render(&self, now: Duration, width: usize, height: usize) -> Vec<String> {
        let mut out = vec![fit(&self.header(now), width)];
        let room = height.saturating_sub(1 + SPARE_LINES);
        let shown: Vec<&Row> = if self.rows.len() <= room {
            self.rows.iter().collect()
        } else {
            let keep = room.saturating_sub(1);
            // Ties in address order, so a screen does not jump between redraws.
            let rank = |r: &Row| match r.status {
                Status::Working | Status::Waiting | Status::Retrying => 0,
                Status::Failed => 1,
                Status::Interrupted => 2,
                Status::Done => 3,
                Status::Pending => 4,
            };
            let mut order: Vec<usize> = (0..self.rows.len()).collect();
            order.sort_by_key(|&i| (rank(&self.rows[i]), i));
            let mut picked: Vec<usize> = order.into_iter().take(keep).collect();
            picked.sort_unstable();
            picked.iter().map(|&i| &self.rows[i]).collect()
        };
        let widths = self.widths(&shown);
        for r in &shown {
            out.push(self.line(r, now, &widths, width));
        }
        let hidden = self.rows.len() - shown.len();
        if hidden > 0 {
            let mut by: BTreeMap<Status, usize> = BTreeMap::new();
            let shown_set: std::collections::HashSet<&str> =
                shown.iter().map(|r| r.address.as_str()).collect();
            for r in self
                .rows
                .iter()
                .filter(|r| !shown_set.contains(r.address.as_str()))
            {
                *by.entry(r.status).or_default() += 1;
            }
            let parts: Vec<String> = by
                .iter()
                .rev()
                .map(|(s, n)| format!("{n} {}", s.name()))
                .collect();
            out.push(fit(
                &format!("  … and {hidden} more: {}", parts.join(", ")),
                width,
            ));
        }
        out
    }

    /// The plain log line of `address` (non-terminal output: CI logs), prefixed with the
    /// elapsed time: `[  2m05s] vm.web: booting lambda/us-east-1/gpu_1x_h100 3f9c2a1b`.
    pub fn log_line(&self, address: &str, now: Duration) -> Option<String> {
        let r = &self.rows[*self.index.get(address)?];
        let mut line = format!("[{:>7}] {}: {}", duration(now), r.address, r.phase);
        if !r.facts.location.is_empty() {
            line.push(' ');
            line.push_str(&r.facts.location);
            if !r.facts.instance_type.is_empty() {
                line.push('/');
                line.push_str(&r.facts.instance_type);
            }
        }
        if !r.facts.instance_id.is_empty() {
            line.push(' ');
            line.push_str(short_id(&r.facts.instance_id));
        }
        if r.resumed && r.status != Status::Done {
            line.push_str(" (resumed)");
        }
        if !r.detail.is_empty() {
            let tag = match r.status {
                Status::Waiting => ": waiting: ",
                _ => ": ",
            };
            line.push_str(tag);
            line.push_str(&r.detail);
        }
        Some(line)
    }

    /// The final summary: one line per machine, whatever the terminal.
    pub fn summary(&self, now: Duration) -> Vec<String> {
        let rows: Vec<&Row> = self.rows.iter().collect();
        let widths = self.widths(&rows);
        let mut out = vec![self.header_of(now, false)];
        out.extend(rows.iter().map(|r| self.line(r, now, &widths, usize::MAX)));
        out
    }
}

struct Widths {
    address: usize,
    phase: usize,
    location: usize,
    id: usize,
}

/// The short phase of a state: the machine's own, else the label's first words.
fn phase_of(facts: &Facts, label: &str) -> String {
    if !facts.phase.is_empty() {
        return facts.phase.to_string();
    }
    label
        .split([':', '('])
        .next()
        .unwrap_or(label)
        .trim()
        .to_string()
}

/// `new`, keeping what a later state no longer carries for the same location (a
/// teardown knows no instance type or price).
fn merge(old: &Facts, new: &Facts) -> Facts {
    let mut f = new.clone();
    // What was destroyed keeps the id it had.
    if f.instance_id.is_empty() && f.phase == "destroyed" {
        f.instance_id = old.instance_id.clone();
    }
    if f.location.is_empty() || f.location == old.location {
        if f.location.is_empty() && f.phase != "planning" && f.phase != "next offer" {
            f.location = old.location.clone();
        }
        if f.instance_type.is_empty() && f.location == old.location {
            f.instance_type = old.instance_type.clone();
        }
        if f.price_per_hour.is_none() && f.location == old.location {
            f.price_per_hour = old.price_per_hour;
        }
    }
    f
}

/// An instance id short enough for a column: ids up to 19 characters (EC2's) whole,
/// longer ones (Docker's 64 hex digits, UUIDs) by their first 12, as `docker ps` does.
pub fn short_id(id: &str) -> &str {
    if id.chars().count() <= 19 {
        return id;
    }
    match id.char_indices().nth(12) {
        Some((i, _)) => &id[..i],
        None => id,
    }
}

/// `7s`, `3m05s`, `1h02m`.
pub fn duration(d: Duration) -> String {
    let s = d.as_secs();
    match s {
        0..=59 => format!("{s}s"),
        60..=3599 => format!("{}m{:02}s", s / 60, s % 60),
        _ => format!("{}h{:02}m", s / 3600, (s % 3600) / 60),
    }
}

fn fit(s: &str, width: usize) -> String {
    if measure_text_width(s) <= width {
        s.to_string()
    } else {
        truncate_str(s, width, "…").into_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const W: usize = 120;
    const H: usize = 45;

    fn secs(s: f64) -> Duration {
        Duration::from_secs_f64(s)
    }

    fn facts(phase: &'static str, id: &str, billing: bool) -> Facts {
        Facts {
            phase,
            location: "lambda/us-east-1".into(),
            instance_type: "gpu_1x_h100".into(),
            instance_id: id.into(),
            price_per_hour: Some(2.49),
            billing,
        }
    }

    fn to(key: &str, phase: &'static str, id: &str, billing: bool, terminal: bool) -> Progress {
        Progress::Transition {
            key: key.into(),
            kind: "launch",
            label: format!("{phase} {id}"),
            terminal,
            facts: facts(phase, id, billing),
        }
    }

    fn poll(key: &str, note: &str) -> Progress {
        Progress::Poll {
            key: key.into(),
            note: note.into(),
        }
    }

    /// A Docker-style 64-hex-digit id.
    fn long_id(i: usize) -> String {
        format!("{i:04x}").repeat(16)
    }

    /// `n` machines at 5 minutes into an apply, in a mix of states chosen by index.
    fn run_of(n: usize) -> Board {
        let addresses: Vec<(String, bool)> = (0..n)
            .map(|i| (format!("vm.w{i:03}"), i % 50 == 7))
            .collect();
        let mut b = Board::new(Verb::Apply, addresses);
        for i in 0..n {
            let k = format!("vm.w{i:03}");
            let t = i as f64 * 0.5;
            let id = long_id(i);
            b.event(&to(&k, "preparing", "", false, false), secs(t));
            if i % 8 == 5 {
                continue; // still preparing
            }
            b.event(&to(&k, "creating", "", false, false), secs(t + 1.0));
            if i % 8 == 6 {
                b.event(
                    &Progress::Retry {
                        key: k.clone(),
                        attempt: 2,
                        max: 6,
                        error: "HTTP 503: service unavailable".into(),
                    },
                    secs(t + 2.0),
                );
                continue;
            }
            b.event(&to(&k, "booting", &id, true, false), secs(t + 3.0));
            if i % 8 == 4 {
                b.event(&poll(&k, "still booting (Pending)"), secs(t + 4.0));
                continue;
            }
            b.event(&to(&k, "connecting", &id, true, false), secs(t + 20.0));
            if i % 8 == 3 {
                b.event(
                    &poll(&k, "SSH not up yet (connection refused)"),
                    secs(t + 21.0),
                );
                continue;
            }
            if i % 8 == 2 {
                b.event(&to(&k, "aborted", "", false, true), secs(t + 40.0));
                continue;
            }
            b.event(&to(&k, "ready", &id, true, true), secs(t + 45.0));
        }
        b
    }

    fn screen(b: &Board, now: Duration) -> String {
        b.render(now, W, H).join("\n")
    }

    #[test]
    fn one_machine_waiting_for_ssh() {
        let mut b = Board::new(Verb::Apply, [("vm.trainer".to_string(), false)]);
        b.event(&to("vm.trainer", "planning", "", false, false), secs(0.1));
        b.event(&to("vm.trainer", "creating", "", false, false), secs(1.0));
        b.event(
            &to("vm.trainer", "booting", "i-0123456789abcdef0", true, false),
            secs(3.0),
        );
        b.event(
            &to(
                "vm.trainer",
                "connecting",
                "i-0123456789abcdef0",
                true,
                false,
            ),
            secs(50.0),
        );
        b.event(
            &poll(
                "vm.trainer",
                "SSH not up yet (ssh to 10.0.0.5:22 not reachable yet: connection refused)",
            ),
            secs(51.0),
        );
        let s = screen(&b, secs(62.0));
        assert!(s.contains("waiting: SSH not up yet"), "{s}");
        assert!(
            !s.contains("retry"),
            "an expected wait is not an error: {s}"
        );
        insta::assert_snapshot!("live_1_machine", s);
    }

    #[test]
    fn sixty_machines_on_a_45_row_terminal_keep_the_active_ones_and_count_the_rest() {
        let b = run_of(60);
        let lines = b.render(secs(300.0), W, H);
        assert!(
            lines.len() < H,
            "a full screen would scroll: {}",
            lines.len()
        );
        assert!(lines.iter().all(|l| measure_text_width(l) <= W));
        let s = lines.join("\n");
        // Every active machine is on screen.
        let active = [Status::Working, Status::Waiting, Status::Retrying];
        for r in b.rows.iter().filter(|r| active.contains(&r.status)) {
            assert!(s.contains(&r.address), "{} missing:\n{s}", r.address);
        }
        assert!(s.contains("more: "), "{s}");
        insta::assert_snapshot!("live_60_machines", s);
    }

    #[test]
    fn five_hundred_machines_fit_with_the_rest_summarised() {
        let b = run_of(500);
        let lines = b.render(secs(300.0), W, H);
        assert_eq!(lines.len(), H - SPARE_LINES);
        let s = lines.join("\n");
        let last = lines.last().unwrap();
        let shown = lines.len() - 2;
        assert!(
            last.contains(&format!("and {} more", 500 - shown)),
            "{last}"
        );
        insta::assert_snapshot!("live_500_machines", s);
    }

    #[test]
    fn header_counts_ready_failed_time_and_the_cost_of_what_is_up() {
        let b = run_of(8);
        let h = b.header(secs(125.0));
        // Of 8: index 0, 1, 7 ready; 2 aborted; 3 and 4 waiting with an instance (bill).
        assert_eq!(
            h,
            "Apply: 3 of 8 ready · 1 failed · 2m05s · $12.45/h up (5 machines)"
        );
    }

    #[test]
    fn ids_are_short_and_times_human() {
        assert_eq!(short_id(&long_id(3)), "000300030003");
        assert_eq!(short_id("i-0123456789abcdef0"), "i-0123456789abcdef0");
        assert_eq!(duration(secs(7.9)), "7s");
        assert_eq!(duration(secs(185.0)), "3m05s");
        assert_eq!(duration(secs(3720.0)), "1h02m");
    }

    #[test]
    fn plain_lines_one_per_transition_without_control_codes() {
        let mut b = Board::new(Verb::Apply, [("vm.a".to_string(), false)]);
        let mut log = Vec::new();
        let events = [
            (to("vm.a", "creating", "", false, false), 1.0),
            (to("vm.a", "booting", &long_id(1), true, false), 3.0),
            (poll("vm.a", "still booting (Pending)"), 3.5),
            (poll("vm.a", "still booting (Pending)"), 4.0),
            (to("vm.a", "connecting", &long_id(1), true, false), 9.0),
            (poll("vm.a", "SSH not up yet (connection refused)"), 9.5),
            (poll("vm.a", "SSH not up yet (connection refused)"), 10.0),
            (to("vm.a", "ready", &long_id(1), true, true), 14.0),
        ];
        for (ev, t) in &events {
            if b.event(ev, secs(*t)) {
                log.push(b.log_line("vm.a", secs(*t)).unwrap());
            }
        }
        let text = log.join("\n");
        assert!(!text.contains('\x1b'));
        insta::assert_snapshot!("plain_log", text);
    }

    #[test]
    fn summary_after_apply_marks_interrupted_and_resumed() {
        let mut b = run_of(8);
        b.interrupt(1);
        assert!(b.header(secs(60.0)).contains("interrupted: tearing down"));
        b.settle(
            "vm.w003",
            &Outcome::Interrupted("connecting ssh 10.0.0.3:22".into()),
            secs(61.0),
        );
        b.settle(
            "vm.w005",
            &Outcome::failed(crate::engine::FailureKind::Skipped, "skipped"),
            secs(61.0),
        );
        let s = b.summary(secs(61.0)).join("\n");
        assert!(s.contains("‖ vm.w003"), "{s}");
        assert!(s.contains("resumed"), "{s}");
        insta::assert_snapshot!("summary_apply_interrupted", s);
    }

    #[test]
    fn summary_after_destroy_counts_destroyed() {
        let addresses = (0..3).map(|i| (format!("vm.d{i}"), false));
        let mut b = Board::new(Verb::Destroy, addresses);
        for i in 0..3 {
            let k = format!("vm.d{i}");
            b.event(
                &Progress::Transition {
                    key: k.clone(),
                    kind: "teardown",
                    label: "deleting at lambda/us-east-1".into(),
                    terminal: false,
                    facts: Facts {
                        phase: "deleting",
                        location: "lambda/us-east-1".into(),
                        instance_id: long_id(i),
                        billing: true,
                        ..Facts::default()
                    },
                },
                secs(i as f64),
            );
        }
        b.settle("vm.d0", &Outcome::Destroyed, secs(9.0));
        b.settle("vm.d1", &Outcome::Destroyed, secs(9.0));
        b.settle(
            "vm.d2",
            &Outcome::Leaked("delete refused".into()),
            secs(9.0),
        );
        let s = b.summary(secs(10.0)).join("\n");
        assert!(s.starts_with("Destroy: 2 of 3 destroyed · 1 failed"), "{s}");
        insta::assert_snapshot!("summary_destroy", s);
    }

    #[test]
    fn a_resumed_machine_shows_as_resumed() {
        let mut b = Board::new(Verb::Apply, [("vm.a".to_string(), false)]);
        b.event(
            &Progress::Resumed {
                key: "vm.a".into(),
                kind: "launch",
                label: "booting".into(),
                facts: facts("booting", "i-1", true),
            },
            secs(0.0),
        );
        let s = screen(&b, secs(2.0));
        assert!(s.contains("booting") && s.contains("resumed"), "{s}");
    }
}
