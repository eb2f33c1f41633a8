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
