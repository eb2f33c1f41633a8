//! Running things on a VM over SSH for the k3s machine: the [`NodeShell`] seam (a trait,
//! so the k3s machine's tests can script a node), and the commands it runs.

use std::io::{Cursor, Read};

use async_trait::async_trait;

use super::installer::{InstallerConfig, K3S_KUBECONFIG_PATH};
use crate::provider::boot::BootScriptError;
use crate::ssh::{exec, ExecIo, ProjectKey, SshError};
use crate::vm::VmRecord;

/// What one remote command left: its exit status (0..=255, 128 + signal when killed)
/// and its output, decoded as UTF-8 with invalid bytes replaced.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct RemoteOutput {
    pub status: i32,
    pub stdout: String,
    pub stderr: String,
}

/// Runs a command on a VM that is up, as its login user, over SSH with the VM's pinned
/// host key.
#[async_trait]
pub trait NodeShell: Send + Sync {
    /// Runs `command` through the login shell on `vm`, feeding it `stdin` (closed at
    /// once when `None`).
    ///
    /// Errors: as [`crate::ssh::exec`]: unreachable (maybe partly ran), key refused,
    /// host key changed (never retried), local problems.
    async fn run(
        &self,
        vm: &VmRecord,
        command: &str,
        stdin: Option<Vec<u8>>,
    ) -> Result<RemoteOutput, SshError>;
}

/// The real [`NodeShell`]: logs in with the project key over libssh2
/// ([`crate::ssh::exec`]) as `vm.user` at `vm.ssh`, refusing any host key other than
/// `vm.host_key` before authenticating. Each [`NodeShell::run`] is one SSH connection
/// running one command, on a blocking thread (libssh2 blocks), so many runs may overlap.
#[derive(Debug, Clone)]
pub struct SshNodeShell {
    key: ProjectKey,
}

impl SshNodeShell {
    /// A shell that logs in with `key` (the project key the VM trusts).
    pub fn new(key: ProjectKey) -> SshNodeShell {
        SshNodeShell { key }
    }

    /// The project key this shell logs in with.
    pub fn key(&self) -> &ProjectKey {
        &self.key
    }
}

#[async_trait]
impl NodeShell for SshNodeShell {
    /// Runs `command` on `vm` over SSH and collects its whole output (so keep it to
    /// commands with modest output; the installer's log is a few kilobytes).
    ///
    /// Errors: as [`crate::ssh::exec`] ([`SshError::Unreachable`],
    /// [`SshError::AuthRejected`], [`SshError::HostKeyMismatch`], [`SshError::Local`]),
    /// plus [`SshError::Local`] when the blocking task running it panicked or was
    /// cancelled. A non-zero exit status is not an error: it is in
    /// [`RemoteOutput::status`].
    async fn run(
        &self,
        vm: &VmRecord,
        command: &str,
        stdin: Option<Vec<u8>>,
    ) -> Result<RemoteOutput, SshError> {
        let (endpoint, user, pinned) = (vm.ssh.clone(), vm.user.clone(), vm.host_key.clone());
        let (key, command) = (self.key.clone(), command.to_string());
        tokio::task::spawn_blocking(move || {
            let (mut stdout, mut stderr) = (Vec::new(), Vec::new());
            let io = ExecIo {
                stdin: stdin.map(|b| Box::new(Cursor::new(b)) as Box<dyn Read + Send>),
                stdout: &mut stdout,
                stderr: &mut stderr,
            };
            let status = exec(&endpoint, &user, &key, &pinned, &command, io)?;
            Ok(RemoteOutput {
                status,
                stdout: String::from_utf8_lossy(&stdout).into_owned(),
                stderr: String::from_utf8_lossy(&stderr).into_owned(),
            })
        })
        .await
        .map_err(|e| SshError::Local(format!("ssh command task failed: {e}")))?
    }
}

/// `command` as root: as is for `root`, else through `sudo -n` (cloud images give the
/// login user passwordless sudo; `-n` fails rather than hang on a password prompt).
pub fn as_root(user: &str, command: &str) -> String {
    if user == "root" {
        command.to_string()
    } else {
        format!("sudo -n {command}")
    }
}

/// The command that runs the installer read from stdin, as root. The script is saved to
/// a private temporary file first and run with stdin closed, so no command inside it can
/// read (and swallow) the rest of the script, as it could under a plain `sh -s`.
pub fn install_command(user: &str) -> String {
    as_root(
        user,
        "sh -c 'umask 077; f=$(mktemp /tmp/gpuprov-install.XXXXXX) || exit 1; \
         if cat >\"$f\"; then sh \"$f\" </dev/null; rc=$?; else rc=1; fi; rm -f \"$f\"; exit $rc'",
    )
}

/// The installer's stdin for the SSH push: the same boot script the boot route runs,
/// in its plain shell form (environment first, then the script).
///
/// Errors: see [`BootScript::validate`](crate::provider::boot::BootScript::validate).
pub fn installer_stdin(cfg: &InstallerConfig) -> Result<Vec<u8>, BootScriptError> {
    Ok(cfg.boot_script()?.to_shell()?.into_bytes())
}

/// The command that prints the kubeconfig k3s wrote (root-only, mode 0600).
pub fn read_kubeconfig_command(user: &str) -> String {
    as_root(user, &format!("cat {K3S_KUBECONFIG_PATH}"))
}

#[cfg(test)]
mod install_command_tests {
    use super::install_command;
    use std::io::Write;
    use std::process::{Command, Stdio};

    fn run(script: &str) -> (i32, String) {
        let mut child = Command::new("sh")
            .arg("-c")
            .arg(install_command("root"))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        child
            .stdin
            .take()
            .unwrap()
            .write_all(script.as_bytes())
            .unwrap();
        let out = child.wait_with_output().unwrap();
        (
            out.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&out.stdout).into_owned(),
        )
    }

    #[test]
    fn a_command_reading_stdin_cannot_swallow_the_rest_of_the_script() {
        // Under `sh -s`, `cat` would print the script's remaining lines and they would
        // never run.
        assert_eq!(run("cat\necho after\n"), (0, "after\n".into()));
        assert_eq!(run("echo a\nexit 7\n").0, 7, "the exit status comes back");
        assert!(install_command("ubuntu").starts_with("sudo -n sh -c '"));
    }
}
