//! The k3s layer (design 4.5, issue 5): every VM a ready single-node k3s cluster.
//!
//! The pure parts (none of them does I/O):
//!
//! - [`installer`] — the installer shell script shipped in the binary and the
//!   environment that configures it;
//! - [`probe`] — the one-round-trip boot probe command, its parser (including
//!   `nvidia-smi` output), and the decision table that maps it to installed / wait /
//!   push over SSH;
//! - [`kubeconfig`] — reading the kubeconfig k3s writes, rewriting it for the user's
//!   access path and merging it into the user's kubeconfig;
//! - [`san`] — the API certificate's TLS SAN list and the check that a certificate
//!   covers the host the user connects to.
//!
//! And the parts that talk to a VM:
//!
//! - [`remote`] — the [`remote::NodeShell`] seam and its real implementation over SSH,
//!   [`remote::SshNodeShell`], plus the commands the k3s machine runs through it;
//! - [`tunnel`] — an SSH local port forward with the system OpenSSH client, pinned to the
//!   VM's host key ([`tunnel::Tunnel`]).
//!
//! And the machine itself:
//!
//! - [`k3s`] — [`k3s::K3sMachine`]: the launch machine as a child, then the boot-install
//!   check, SSH push, API wait, kubeconfig and validation (design 4.5);
//! - [`api`] — the Kubernetes API calls validation makes, over the access path the user
//!   will use.

pub mod api;
pub mod installer;
pub mod k3s;
pub mod kubeconfig;
pub mod probe;
pub mod remote;
pub mod san;
pub mod tunnel;
