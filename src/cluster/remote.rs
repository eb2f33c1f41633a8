//! Running things on a VM over SSH for the k3s machine: the [`NodeShell`] seam (a trait,
//! so the k3s machine's tests can script a node), and the commands it runs.

use async_trait::async_trait;

use super::boot::BootScriptError;
use super::installer::{InstallerConfig, K3S_KUBECONFIG_PATH};
use crate::ssh::SshError;
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

/// `command` as root: as is for `root`, else through `sudo -n` (cloud images give the
/// login user passwordless sudo; `-n` fails rather than hang on a password prompt).
pub fn as_root(user: &str, command: &str) -> String {
    if user == "root" {
        command.to_string()
    } else {
        format!("sudo -n {command}")
    }
}

/// The command that runs the installer read from stdin, as root.
pub fn install_command(user: &str) -> String {
    as_root(user, "sh -s")
}

/// The installer's stdin for the SSH push: the same boot script the boot route runs,
/// in its plain shell form (environment first, then the script).
///
/// Errors: see [`BootScript::validate`](super::boot::BootScript::validate).
pub fn installer_stdin(cfg: &InstallerConfig) -> Result<Vec<u8>, BootScriptError> {
    Ok(cfg.boot_script()?.to_shell()?.into_bytes())
}

/// The command that prints the kubeconfig k3s wrote (root-only, mode 0600).
pub fn read_kubeconfig_command(user: &str) -> String {
    as_root(user, &format!("cat {K3S_KUBECONFIG_PATH}"))
}
