//! OpenSSH's own tools as test oracles and helpers: keys made by `ssh-keygen` with the
//! fingerprints it prints, and a throwaway `ssh-agent` holding some of them.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A key pair made by `ssh-keygen -q -N '' -C NAME ARGS -f dir/NAME` (mode 0600), and the
/// fingerprint `ssh-keygen -lf` prints for it.
pub fn keygen(dir: &Path, name: &str, args: &[&str]) -> (PathBuf, String) {
    let path = dir.join(name);
    let out = Command::new("ssh-keygen")
        .args(["-q", "-N", "", "-C", name])
        .args(args)
        .arg("-f")
        .arg(&path)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let fp = keygen_fingerprint(&path);
    (path, fp)
}

/// A P-521 key whose private scalar has a leading zero byte (OpenSSH stores it in 65
/// bytes; about every other P-521 key), which the ssh-key crate refuses to decode: made
/// by [`keygen`] until one is.
pub fn keygen_p521_short_scalar(dir: &Path, name: &str) -> (PathBuf, String) {
    for _ in 0..64 {
        let (path, fp) = keygen(dir, name, &["-t", "ecdsa", "-b", "521"]);
        let text = std::fs::read_to_string(&path).unwrap();
        if ssh_key::PrivateKey::from_openssh(&text).is_err() {
            return (path, fp);
        }
        std::fs::remove_file(&path).unwrap();
        std::fs::remove_file(path.with_extension("pub")).unwrap();
    }
    panic!("64 P-521 keys without a short scalar: ssh-key may decode them now");
}

/// The `SHA256:` fingerprint `ssh-keygen -lf path` prints (private or public key file).
pub fn keygen_fingerprint(path: &Path) -> String {
    let out = Command::new("ssh-keygen")
        .arg("-lf")
        .arg(path)
        .output()
        .unwrap();
    let listed = String::from_utf8(out.stdout).unwrap();
    let fp = listed
        .split_whitespace()
        .nth(1)
        .unwrap_or_default()
        .to_string();
    assert!(
        fp.starts_with("SHA256:"),
        "ssh-keygen -lf printed {listed:?}"
    );
    fp
}

/// A running `ssh-agent -D` on `dir/agent.sock`; killed and reaped on drop.
pub struct Agent {
    child: Child,
    pub socket: PathBuf,
}

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Agent {
    /// Starts an empty agent and waits (at most 10 s) for its socket.
    pub fn start(dir: &Path) -> Agent {
        let socket = dir.join("agent.sock");
        let child = Command::new("ssh-agent")
            .arg("-D")
            .arg("-a")
            .arg(&socket)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start ssh-agent");
        let agent = Agent { child, socket };
        let deadline = Instant::now() + Duration::from_secs(10);
        while !agent.socket.exists() {
            assert!(Instant::now() < deadline, "ssh-agent made no socket");
            std::thread::sleep(Duration::from_millis(20));
        }
        agent
    }

    /// Adds the private key file `key` (`ssh-add`).
    pub fn add(&self, key: &Path) {
        let add = Command::new("ssh-add")
            .arg(key)
            .env("SSH_AUTH_SOCK", &self.socket)
            .output()
            .unwrap();
        assert!(
            add.status.success(),
            "{}",
            String::from_utf8_lossy(&add.stderr)
        );
    }
}
