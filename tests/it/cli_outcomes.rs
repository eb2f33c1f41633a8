//! How a run ends, as the binary says it: the apply/destroy summary counts what failed
//! (a ready shared key is done, not failed), and each kind of error has its exit code
//! and names itself and its help on stderr (issue 34, item 6). Runs on the fake cloud
//! (`GPUPROV_FAKE_CLOUD=1`, a `test-doubles` build) or stops before any cloud call.

use std::path::PathBuf;

use assert_cmd::Command;

struct Project {
    dir: tempfile::TempDir,
}

/// One machine on the fake cloud under Lambda's name (which declares the project key as
/// a shared object).
const FAKE_TOML: &str =
    "[defaults]\nclouds = [\"lambda\"]\ngpu = \"H100\"\nkubernetes = false\n\n[vm.w000]\n";

impl Project {
    fn new(config: &str) -> Project {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("gpuprov.toml"), config).unwrap();
        Project { dir }
    }

    fn path(&self, p: &str) -> PathBuf {
        self.dir.path().join(p)
    }

    /// The binary in the project, on the fake cloud with the shared key declared, with
    /// `env` added.
    fn cmd(&self, args: &[&str], env: &[(&str, &str)]) -> Command {
        let mut c = Command::cargo_bin("gpuprov").unwrap();
        c.current_dir(self.dir.path())
            .env("HOME", self.path("home"))
            .env("GPUPROV_HOME", self.path("home"))
            .env("NO_COLOR", "1")
            .env("GPUPROV_FAKE_CLOUD", "1")
            .env("GPUPROV_FAKE_SHARED_KEY", "1")
            .env_remove("GPUPROV_CONFIG")
            .env_remove("GPUPROV_STATE")
            .env_remove("GPUPROV_SSH_KEY_FILE")
            .env_remove("GPUPROV_SSH_PRIVATE_KEY")
            .env_remove("GPUPROV_FAKE_HOLD_SSH")
            .env_remove("GITHUB_STEP_SUMMARY")
            .timeout(std::time::Duration::from_secs(120))
            .args(args);
        for (k, v) in env {
            c.env(k, v);
        }
        c
    }

    /// Runs and returns (exit code, stdout, stderr).
    fn run(&self, args: &[&str], env: &[(&str, &str)]) -> (i32, String, String) {
        let out = self.cmd(args, env).output().unwrap();
        let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
        (
            out.status.code().unwrap_or(-1),
            text(&out.stdout),
            text(&out.stderr),
        )
    }
}

/// The summary's header line (`Apply: … ready …`) of a run's stderr.
fn header<'a>(stderr: &'a str, verb: &str) -> &'a str {
    stderr
        .lines()
        .rfind(|l| l.starts_with(&format!("{verb}: ")))
        .unwrap_or_else(|| panic!("no {verb} summary in:\n{stderr}"))
}

/// A ready shared key is done, not failed: the summary of an apply that prepared one
/// said "Apply: 1 of 2 ready · 1 failed" beside "Apply complete!".
#[test]
fn a_ready_shared_key_is_counted_done_not_failed() {
    let p = Project::new(FAKE_TOML);
    let (code, _, err) = p.run(&["apply", "--auto-approve"], &[]);
    assert_eq!(code, 0, "{err}");
    assert!(err.contains("Apply complete!"), "{err}");
    let h = header(&err, "Apply");
    assert!(h.starts_with("Apply: 2 of 2 ready ·"), "{h}\n{err}");
    assert!(!h.contains("failed"), "{h}");
    assert!(
        err.lines()
            .any(|l| l.starts_with('✓') && l.contains("shared.lambda.ssh_key")),
        "{err}"
    );
    assert!(!err.lines().any(|l| l.starts_with('✗')), "{err}");

    // Its release is done too.
    let (code, _, err) = p.run(&["destroy", "--auto-approve"], &[]);
    assert_eq!(code, 0, "{err}");
    let h = header(&err, "Destroy");
    assert!(h.starts_with("Destroy: 2 of 2 destroyed ·"), "{h}\n{err}");
    assert!(!err.lines().any(|l| l.starts_with('✗')), "{err}");
}

// ---- One exit-code test per error kind (`gpuprov::cli::error::Kind`).

/// `Kind::Usage`: exit 1, clap's message naming the flag and its tip.
#[test]
fn a_usage_error_exits_1_naming_the_flag() {
    let p = Project::new(FAKE_TOML);
    let (code, out, err) = p.run(&["plan", "--nope"], &[]);
    assert_eq!(code, 1, "{err}");
    assert!(out.is_empty(), "{out}");
    assert!(err.contains("'--nope'"), "{err}");
    assert!(err.contains("--help"), "the tip: {err}");
}

/// `Kind::Config`: exit 1, the config diagnostic (its code, the key) with its help.
#[test]
fn a_config_error_exits_1_with_its_code_and_help() {
    let p = Project::new("[vm.a]\nclouds = [\"docker\"]\ngpus = 2\n");
    let (code, out, err) = p.run(&["plan", "--refresh=false"], &[]);
    assert_eq!(code, 1, "{err}");
    assert!(out.is_empty(), "{out}");
    assert!(err.contains("gpuprov::config"), "{err}");
    assert!(err.contains("gpus"), "names the key: {err}");
    assert!(err.contains("help:"), "{err}");
}

/// `Kind::User`: exit 1, what is wrong and what to do apart (here: the state is empty).
#[test]
fn a_user_error_exits_1_with_its_help() {
    let p = Project::new(FAKE_TOML);
    let (code, out, err) = p.run(&["state", "show", "vm.nope"], &[]);
    assert_eq!(code, 1, "{err}");
    assert!(out.is_empty(), "{out}");
    assert!(err.contains("no resource vm.nope"), "{err}");
    assert!(err.contains("help: the state has no machines"), "{err}");
}

/// `Kind::Interrupted`: Ctrl-C while `destroy` waits for the lock another run holds
/// exits 130 at once, saying so.
#[cfg(unix)]
#[test]
fn an_interrupt_while_waiting_for_the_lock_exits_130() {
    use std::io::{BufRead, BufReader};
    use std::process::Stdio;

    let p = Project::new(FAKE_TOML);
    // The holder: an apply held at SSH (the file never appears while it matters).
    let held = p.path("never");
    let mut holder = std::process::Command::new(assert_cmd::cargo::cargo_bin("gpuprov"));
    holder
        .current_dir(p.dir.path())
        .env("GPUPROV_HOME", p.path("home"))
        .env("NO_COLOR", "1")
        .env("GPUPROV_FAKE_CLOUD", "1")
        .env("GPUPROV_FAKE_HOLD_SSH", &held)
        .env_remove("GPUPROV_CONFIG")
        .env_remove("GPUPROV_STATE")
        .args(["apply", "--auto-approve"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    let mut holder = holder.spawn().unwrap();
    let lines = BufReader::new(holder.stderr.take().unwrap()).lines();
    let mut lines = lines.map_while(Result::ok);
    assert!(
        lines.by_ref().any(|l| l.contains("waiting: SSH")),
        "the apply holds the lock while it waits for SSH"
    );
    std::thread::spawn(move || lines.for_each(drop));

    let mut waiter = std::process::Command::new(assert_cmd::cargo::cargo_bin("gpuprov"));
    waiter
        .current_dir(p.dir.path())
        .env("GPUPROV_HOME", p.path("home"))
        .env("NO_COLOR", "1")
        .env("GPUPROV_FAKE_CLOUD", "1")
        .env_remove("GPUPROV_CONFIG")
        .env_remove("GPUPROV_STATE")
        .args(["destroy", "--auto-approve", "--lock-timeout", "60s"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    let mut waiter = waiter.spawn().unwrap();
    let mut err = BufReader::new(waiter.stderr.take().unwrap());
    let mut text = String::new();
    while !text.contains("Acquiring state lock") {
        let mut line = String::new();
        assert!(err.read_line(&mut line).unwrap() > 0, "{text}");
        text.push_str(&line);
    }
    // SAFETY: signalling a child this test started.
    assert_eq!(unsafe { libc::kill(waiter.id() as i32, libc::SIGINT) }, 0);
    let status = waiter.wait().unwrap();
    std::io::Read::read_to_string(&mut err, &mut text).unwrap();
    assert_eq!(status.code(), Some(130), "{text}");
    assert!(text.contains("gpuprov::interrupted"), "{text}");

    // The holder goes on: released, it finishes its apply.
    std::fs::write(&held, "").unwrap();
    let status = holder.wait().unwrap();
    assert!(status.success());
}

/// `Kind::Internal`: a bug (here a panic in a machine's SSH login, scripted by the fake
/// cloud) exits 255, naming it internal with the help to report it.
#[test]
fn an_internal_error_exits_255_asking_for_a_report() {
    let p = Project::new(FAKE_TOML);
    let (code, _, err) = p.run(
        &["apply", "--auto-approve"],
        &[("GPUPROV_FAKE_PANIC_SSH", "1")],
    );
    assert_eq!(code, 255, "{err}");
    assert!(
        err.contains("vm.w000: FAILED: internal error:"),
        "the machine it was about: {err}"
    );
    assert!(err.contains("gpuprov::internal"), "{err}");
    assert!(err.contains("internal error:"), "{err}");
    assert!(err.contains("help: this is a bug in gpuprov"), "{err}");
}
