//! Issue 14, item 4, on the real Docker cloud through the real binary: the project's SSH
//! key on a second machine. Runner A applies; runner B (its own directory and
//! `GPUPROV_HOME`, the state file copied over as a shared backend would hand it out)
//! logs in only with the key A's state records — from `GPUPROV_SSH_PRIVATE_KEY`,
//! `--ssh-key`/`GPUPROV_SSH_KEY_FILE` or the SSH agent — and without it gets an error
//! naming the fingerprint and those ways, never a second key. The key's text is found
//! nowhere: not in B's state, its files, or any output.

use std::path::{Path, PathBuf};
use std::process::Output;

use crate::docker_e2e::{containers, ensure_base_image, leftovers, skip, Project};
use crate::support::openssh::{keygen_fingerprint, Agent};

/// Every command of a runner, and everything it printed.
struct Runner<'a> {
    name: &'static str,
    project: &'a Project,
    printed: std::cell::RefCell<String>,
}

impl<'a> Runner<'a> {
    fn new(name: &'static str, project: &'a Project) -> Self {
        Runner {
            name,
            project,
            printed: Default::default(),
        }
    }

    /// Runs gpuprov with no key from the surroundings (none of the three ways set)
    /// except `env`.
    fn run(&self, args: &[&str], env: &[(&str, &str)]) -> Output {
        let mut c = self.project.cmd(args);
        for k in [
            "GPUPROV_SSH_PRIVATE_KEY",
            "GPUPROV_SSH_KEY_FILE",
            "SSH_AUTH_SOCK",
        ] {
            c.env_remove(k);
        }
        c.env("GPUPROV_LOG", "debug");
        for (k, v) in env {
            c.env(k, v);
        }
        let out = c.output().unwrap();
        let (stdout, stderr) = (
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
        );
        let shown_env: Vec<&str> = env.iter().map(|(k, _)| *k).collect();
        eprintln!(
            "[{}] $ gpuprov {} (env {shown_env:?})\n-> {:?}\n{stdout}{stderr}",
            self.name,
            args.join(" "),
            out.status.code(),
        );
        let mut p = self.printed.borrow_mut();
        p.push_str(&stdout);
        p.push_str(&stderr);
        out
    }

    fn home(&self) -> PathBuf {
        self.project.dir.path().join("home")
    }
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// stderr with the diagnostic's wrapping undone (margins dropped, lines joined; a line
/// broken after a hyphen or slash is joined without a space), so phrases can be searched.
fn flat(o: &Output) -> String {
    let mut out = String::new();
    for line in stderr(o).lines() {
        let mut l = line.trim();
        for margin in ["| ", "│ ", "x ", "× "] {
            if let Some(rest) = l.strip_prefix(margin) {
                l = rest.trim_start();
            }
        }
        if !out.is_empty() && !out.ends_with(['-', '/']) {
            out.push(' ');
        }
        out.push_str(l);
    }
    out
}

/// Every file under `dir`, with its bytes as text.
fn files_under(dir: &Path) -> Vec<(PathBuf, String)> {
    let mut out = Vec::new();
    let Ok(entries) = std::fs::read_dir(dir) else {
        return out;
    };
    for e in entries {
        let path = e.unwrap().path();
        if path.is_dir() {
            out.extend(files_under(&path));
        } else {
            let text = String::from_utf8_lossy(&std::fs::read(&path).unwrap()).into_owned();
            out.push((path, text));
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread")]
async fn a_second_runner_uses_the_recorded_key_from_the_environment_and_never_makes_another() {
    if skip() {
        return;
    }
    ensure_base_image();
    let (pa, pb) = (Project::new(), Project::new());
    let (a, b) = (Runner::new("A", &pa), Runner::new("B", &pb));

    // Runner A: the first apply generates the project key and records its fingerprint.
    assert!(a.run(&["apply", "--auto-approve"], &[]).status.success());
    let lineage = pa.lineage();
    let key_path = a.home().join("projects").join(&lineage).join("id_ed25519");
    let key_text = std::fs::read_to_string(&key_path).unwrap();
    let fingerprint = keygen_fingerprint(&key_path);
    let state = pa.state();
    assert_eq!(
        state["ssh"]["key_fingerprint"],
        fingerprint.as_str(),
        "{state}"
    );
    let public = std::fs::read_to_string(key_path.with_extension("pub")).unwrap();
    let public: Vec<&str> = public.split_whitespace().take(2).collect();
    assert_eq!(state["ssh"]["public_key"], public.join(" ").as_str());
    // The pinned host key is in the machine's journalled record, so it travels too.
    let pinned = &state["resources"]["vm.dev"]["machine"]["state"]["vm"]["host_key"];
    assert!(
        pinned["fingerprint"]
            .as_str()
            .unwrap()
            .starts_with("SHA256:"),
        "{state}"
    );

    // Runner B gets the state (as a shared backend would) and nothing else.
    std::fs::copy(pa.state_path(), pb.state_path()).unwrap();
    let b_project_dir = b.home().join("projects").join(&lineage);

    // Without the key: a clear error naming the fingerprint and the three ways.
    for args in [&["ssh", "dev", "--", "true"][..], &["ssh", "dev"]] {
        let out = b.run(args, &[]);
        assert_eq!(out.status.code(), Some(1), "{args:?}");
        let err = flat(&out);
        assert!(err.contains(&fingerprint), "{err}");
        for way in [
            "GPUPROV_SSH_PRIVATE_KEY",
            "GPUPROV_SSH_KEY_FILE",
            "--ssh-key",
            "SSH agent",
        ] {
            assert!(err.contains(way), "names {way}: {err}");
        }
        assert!(err.contains("never makes a second key"), "{err}");
    }
    // An apply with nothing to do needs no key; one that would create a machine refuses
    // before creating anything.
    assert!(b.run(&["apply", "--auto-approve"], &[]).status.success());
    let config = std::fs::read_to_string(pb.dir.path().join("gpuprov.toml")).unwrap();
    std::fs::write(
        pb.dir.path().join("gpuprov.toml"),
        format!("{config}\n[vm.second]\nregions = [\"local\"]\n"),
    )
    .unwrap();
    let out = b.run(&["apply", "--auto-approve"], &[]);
    assert_eq!(out.status.code(), Some(1));
    assert!(flat(&out).contains(&fingerprint), "{}", stderr(&out));
    assert_eq!(containers(&lineage).await.len(), 1, "nothing was created");
    let private_keys_in_b = || {
        files_under(&b.home())
            .into_iter()
            .filter(|(_, t)| t.contains("PRIVATE KEY"))
            .map(|(p, _)| p)
            .collect::<Vec<_>>()
    };
    assert!(private_keys_in_b().is_empty(), "{:?}", private_keys_in_b());
    assert!(!b_project_dir.join("id_ed25519").exists(), "no second key");

    // With the key's text in the environment: ssh works, and so does an apply that
    // creates a machine (which then trusts the same key).
    let env_key = [("GPUPROV_SSH_PRIVATE_KEY", key_text.as_str())];
    let out = b.run(&["ssh", "dev", "--", "echo", "hello-from-b"], &env_key);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(stdout(&out), "hello-from-b\n");
    assert!(b
        .run(&["ssh", "dev", "--", "true"], &env_key)
        .status
        .success());
    let out = b.run(&["apply", "--auto-approve"], &env_key);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(containers(&lineage).await.len(), 2);
    assert_eq!(
        pb.state()["ssh"],
        pa.state()["ssh"],
        "the recorded key is unchanged"
    );
    assert!(b
        .run(&["ssh", "second", "--", "true"], &env_key)
        .status
        .success());
    // A's own key file logs in to the machine B made: one key for the project.
    assert!(a.run(&["ssh", "dev", "--", "true"], &[]).status.success());
    std::fs::copy(pb.state_path(), pa.state_path()).unwrap();
    assert!(a
        .run(&["ssh", "second", "--", "true"], &[])
        .status
        .success());

    // The generated ssh config names the supplied key's public half, and the
    // known_hosts pins the host keys the state carries.
    let ssh_config = std::fs::read_to_string(b_project_dir.join("ssh_config")).unwrap();
    assert!(ssh_config.contains("supplied_key.pub"), "{ssh_config}");
    let known_hosts = std::fs::read_to_string(b_project_dir.join("known_hosts")).unwrap();
    assert!(
        known_hosts.contains(pinned["key_base64"].as_str().unwrap()),
        "{known_hosts}"
    );
    // An interactive `gpuprov ssh` (OpenSSH) gets a temporary copy, removed afterwards.
    let tmpdir = pb.dir.path().join("tmp");
    std::fs::create_dir(&tmpdir).unwrap();
    let tmp = tmpdir.to_str().unwrap();
    let out = b.run(
        &["ssh", "dev"],
        &[
            ("GPUPROV_SSH_PRIVATE_KEY", key_text.as_str()),
            ("TMPDIR", tmp),
        ],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(
        std::fs::read_dir(&tmpdir).unwrap().count(),
        0,
        "copy removed"
    );

    // Another key in the environment: refused, naming both fingerprints.
    let other_dir = tempfile::tempdir().unwrap();
    let other = gpuprov::ssh::ensure_project_key(other_dir.path(), "other").unwrap();
    let other_path = other.private_key_path().unwrap().to_path_buf();
    let other_text = std::fs::read_to_string(&other_path).unwrap();
    let out = b.run(
        &["ssh", "dev", "--", "true"],
        &[("GPUPROV_SSH_PRIVATE_KEY", other_text.as_str())],
    );
    assert_eq!(out.status.code(), Some(1));
    let err = flat(&out);
    assert!(err.contains(&fingerprint), "{err}");
    assert!(
        err.contains(&format!(
            "GPUPROV_SSH_PRIVATE_KEY holds another key: {}",
            keygen_fingerprint(&other_path)
        )),
        "{err}"
    );

    // A key file: by flag or by environment.
    let file = other_dir.path().join("ci key");
    std::fs::write(&file, &key_text).unwrap();
    std::fs::set_permissions(&file, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    let file_arg = file.to_str().unwrap();
    let out = b.run(&["--ssh-key", file_arg, "ssh", "dev", "--", "true"], &[]);
    assert!(out.status.success(), "{}", stderr(&out));
    let out = b.run(
        &["ssh", "dev", "--", "true"],
        &[("GPUPROV_SSH_KEY_FILE", file_arg)],
    );
    assert!(out.status.success(), "{}", stderr(&out));

    // The SSH agent holding the recorded key.
    let agent = Agent::start(other_dir.path());
    agent.add(&file);
    let sock = agent.socket.to_str().unwrap();
    let out = b.run(&["ssh", "dev", "--", "true"], &[("SSH_AUTH_SOCK", sock)]);
    assert!(out.status.success(), "{}", stderr(&out));
    drop(agent);

    // Destroy never logs in, so it runs without the key.
    let out = b.run(&["destroy", "--auto-approve"], &[]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(leftovers(&lineage).await, (0, 0, 0));

    // The key's text is nowhere on runner B: not in its state, its files or its output.
    let key_lines: Vec<&str> = key_text
        .lines()
        .filter(|l| !l.starts_with("-----") && l.len() >= 16)
        .collect();
    assert!(!key_lines.is_empty());
    let mut haystacks = files_under(pb.dir.path());
    haystacks.push((
        PathBuf::from("runner B's output"),
        b.printed.borrow().clone(),
    ));
    for (name, text) in &haystacks {
        for l in &key_lines {
            assert!(
                !text.contains(l),
                "private key text found in {}",
                name.display()
            );
        }
    }
    assert!(private_keys_in_b().is_empty(), "{:?}", private_keys_in_b());
    assert!(!b_project_dir.join("id_ed25519").exists(), "no second key");
}
