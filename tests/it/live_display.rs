//! The live display in a real terminal: `gpuprov apply` at 1, 60 and 500 machines on the
//! fake cloud (`GPUPROV_FAKE_CLOUD=1`, a `test-doubles` build) inside a 120 × 45 tmux
//! pane. Each run is held while every machine waits for SSH (`GPUPROV_FAKE_HOLD_SSH`),
//! the screen is captured, then released and captured again at the end; then `destroy`
//! runs and its final screen is captured. The screens are kept as text snapshots, times,
//! ids and addresses filtered. Needs tmux (`.ci/run`
//! installs it).

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

const WIDTH: u32 = 120;
const HEIGHT: u32 = 45;

/// One tmux server on a private socket, killed with the test.
struct Tmux {
    socket: std::path::PathBuf,
}

impl Tmux {
    fn cmd(&self) -> Command {
        let mut c = Command::new("tmux");
        c.arg("-S").arg(&self.socket);
        c
    }

    fn start(dir: &Path, script: &Path) -> Tmux {
        let t = Tmux {
            socket: dir.join("tmux.sock"),
        };
        let ok = t
            .cmd()
            .args(["-f", "/dev/null", "new-session", "-d", "-s", "live"])
            .args(["-x", &WIDTH.to_string(), "-y", &HEIGHT.to_string()])
            .arg(format!("sh {}", script.display()))
            .status()
            .expect("tmux must be installed (apt-get install tmux; .ci/run does)");
        assert!(ok.success());
        t
    }

    /// The visible pane as text (no attributes), trailing blank lines dropped.
    fn capture(&self) -> String {
        let out = self
            .cmd()
            .args(["capture-pane", "-p", "-t", "live"])
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).to_string();
        let lines: Vec<&str> = text.lines().map(str::trim_end).collect();
        let end = lines
            .iter()
            .rposition(|l| !l.is_empty())
            .map_or(0, |i| i + 1);
        lines[..end].join("\n")
    }

    /// Captures until `done` holds for two captures in a row (a settled screen).
    fn wait_for(&self, what: &str, done: impl Fn(&str) -> bool) -> String {
        let deadline = Instant::now() + Duration::from_secs(300);
        let mut last = String::new();
        loop {
            let screen = self.capture();
            if done(&screen) && done(&last) {
                return screen;
            }
            assert!(
                Instant::now() < deadline,
                "timed out waiting for {what}; screen:\n{screen}"
            );
            last = screen;
            std::thread::sleep(Duration::from_millis(300));
        }
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        let _ = self.cmd().arg("kill-server").status();
    }
}

fn settings(dir: &Path) -> insta::Settings {
    let mut s = insta::Settings::clone_current();
    s.add_filter(&regex_escape(&dir.display().to_string()), "[TMP]");
    s.add_filter(
        r"\b[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}\b",
        "[UUID]",
    );
    // Time in state (right-aligned) and elapsed time.
    s.add_filter(r" +\d+(h\d\dm|m\d\ds|s)\b", " [t]");
    // The fake's instance ids follow the order of creates, which races.
    s.add_filter(r"lambda-i-\d+ +", "[id]  ");
    s.add_filter(r"(?m)lambda-i-\d+$", "[id]");
    s.add_filter(r"lambda-i-\d+", "[id]");
    s.add_filter(r"\b\d+\.\d+\.\d+\.\d+(:\d+)?", "[addr]");
    // The SSH error's text is cut at the pane's edge, where depends on the address.
    s.add_filter(r"waiting: SSH not up yet.*", "waiting: SSH not up yet […]");
    s
}

fn regex_escape(s: &str) -> String {
    s.chars()
        .flat_map(|c| {
            if "\\.+*?()|[]{}^$".contains(c) {
                vec!['\\', c]
            } else {
                vec![c]
            }
        })
        .collect()
}

/// Applies `n` machines in tmux; snapshots the held screen and the final one.
fn screens_at(n: usize) {
    let (dir, tmux) = start(n);
    let d = dir.path();
    let release = d.join("release");
    let held = held_screen(&tmux, n);
    settings(d).bind(|| insta::assert_snapshot!(format!("tmux_apply_{n}_held"), held));
    std::fs::write(&release, "").unwrap();
    let done = tmux.wait_for("the apply to end", |s| s.contains("EXIT="));
    assert!(done.contains("EXIT=0"), "{done}");
    assert!(
        done.contains(&format!("Apply complete! Resources: {n} added")),
        "{done}"
    );
    settings(d).bind(|| insta::assert_snapshot!(format!("tmux_apply_{n}_done"), done));
    // Destroy in a fresh process: its summary counts what is gone.
    std::fs::write(d.join("destroy"), "").unwrap();
    let gone = tmux.wait_for("the destroy to end", |s| s.contains("DESTROYED="));
    assert!(gone.contains("DESTROYED=0"), "{gone}");
    assert!(
        gone.contains(&format!(
            "Destroy complete! Resources: 0 added, 0 changed, {n} destroyed."
        )),
        "{gone}"
    );
    settings(d).bind(|| insta::assert_snapshot!(format!("tmux_destroy_{n}_done"), gone));
}

/// A project of `n` machines on the fake cloud and a tmux pane running its apply (held
/// at SSH until the file `release` exists), then its destroy (once `destroy` exists).
fn start(n: usize) -> (tempfile::TempDir, Tmux) {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    // The fake cloud hosts no k3s, so none is asked for (the plan would say it is skipped).
    let mut config =
        String::from("[defaults]\nclouds = [\"lambda\"]\ngpu = \"H100\"\nkubernetes = false\n");
    for i in 0..n {
        config.push_str(&format!("\n[vm.w{i:03}]\n"));
    }
    std::fs::write(d.join("gpuprov.toml"), config).unwrap();
    let release = d.join("release");
    let script = d.join("run.sh");
    std::fs::write(
        &script,
        format!(
            // The shell outlives a Ctrl-C sent to the pane (gpuprov gets its default).
            "trap true INT\ncd {dir}\nexport HOME={dir}/home GPUPROV_HOME={dir}/home GPUPROV_FAKE_CLOUD=1 \
             GPUPROV_FAKE_HOLD_SSH={release} TERM=xterm-256color\n\
             unset NO_COLOR GPUPROV_CONFIG GPUPROV_STATE GPUPROV_SSH_KEY_FILE GPUPROV_LOG\n\
             {bin} apply -auto-approve -parallelism={n} -lock-timeout=60s\n\
             echo \"EXIT=$?\"\n\
             while [ ! -e {destroy} ]; do sleep 0.1; done\nclear\n\
             {bin} destroy -auto-approve -parallelism={n}\n\
             echo \"DESTROYED=$?\"\nsleep 600\n",
            dir = d.display(),
            release = release.display(),
            destroy = d.join("destroy").display(),
            bin = env!("CARGO_BIN_EXE_gpuprov"),
        ),
    )
    .unwrap();
    let tmux = Tmux::start(d, &script);
    (dir, tmux)
}

/// Waits until every machine waits for SSH; the screen then.
fn held_screen(tmux: &Tmux, n: usize) -> String {
    let shown = n.min(HEIGHT as usize - 3);
    let held = tmux.wait_for("every machine waiting for SSH", |s| {
        let machines = if n == 1 {
            "(1 machine)".to_string()
        } else {
            format!("({n} machines)")
        };
        let header = format!("Apply: 0 of {n} ready");
        let waiting = s.lines().filter(|l| l.contains("waiting: SSH")).count();
        s.contains(&header)
            && s.contains(&machines)
            && waiting == shown
            && (n == shown || s.contains(&format!("more: {} waiting", n - shown)))
    });
    let lines: Vec<&str> = held.lines().collect();
    assert!(lines.len() <= HEIGHT as usize);
    assert!(lines.iter().all(|l| l.chars().count() <= WIDTH as usize));
    assert!(
        !held
            .lines()
            .any(|l| l.starts_with('!') || l.contains(": retry ")),
        "an expected wait is not an error:\n{held}"
    );
    held
}

#[test]
fn live_display_in_tmux_at_1_machine() {
    screens_at(1);
}

#[test]
fn live_display_in_tmux_at_60_machines() {
    screens_at(60);
}

#[test]
fn live_display_in_tmux_at_500_machines() {
    screens_at(500);
}

#[test]
fn live_display_in_tmux_shows_ctrl_c_and_the_interrupted_machines() {
    let (dir, tmux) = start(3);
    let d = dir.path();
    held_screen(&tmux, 3);
    let ok = tmux
        .cmd()
        .args(["send-keys", "-t", "live", "C-c"])
        .status()
        .unwrap();
    assert!(ok.success());
    let done = tmux.wait_for("the apply to stop", |s| s.contains("EXIT="));
    assert!(done.contains("EXIT=130"), "{done}");
    settings(d).bind(|| insta::assert_snapshot!("tmux_apply_interrupted", done));
}
