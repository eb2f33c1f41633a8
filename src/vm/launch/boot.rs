//! The steps that bring an instance up: `Booting` (running with an SSH endpoint) and
//! `Connecting` (SSH login, the host key pinned), ending `Ready`.

use crate::machine::{Step, StepCx};
use crate::provider::{ErrorKind, InstanceStatus, Observed, ProviderError, SshEndpoint};
use crate::ssh::{HostKey, SshError};

use super::super::{Owned, VmRecord};
use super::compensate::{Failure, Keeping, Lag, Site};
use super::failover::{Fault, Holds, Stage};
use super::{LaunchMachine, LaunchState, Search};

impl LaunchMachine {
    /// `Booting`: waits for the instance to run with an SSH endpoint. Only what this run
    /// created is compensated when it fails; a kept machine is kept, an adopted instance
    /// left unowned ([`super::failover::decide`]).
    pub(super) async fn boot(
        &self,
        search: &Search,
        instance_id: &str,
        adopted: bool,
        kept: Option<&VmRecord>,
        cx: &StepCx,
    ) -> Step<LaunchState> {
        let Some(offer) = search.current() else {
            return Step::Next(LaunchState::Aborted {
                reason: "booting without an offer".into(),
                owned: None,
            });
        };
        let holds = match (kept, adopted) {
            (Some(_), _) => Holds::Kept,
            (None, true) => Holds::Adopted,
            (None, false) => Holds::Created,
        };
        let site = |stage, label| Site {
            record: Some(Owned::at(
                offer.location.clone(),
                vec![instance_id.to_string()],
            )),
            keep: kept.map_or(Keeping::Nothing, |vm| Keeping::Kept(Box::new(vm.clone()))),
            ..Site::attempt(
                stage,
                holds,
                label,
                search,
                vec![instance_id.to_string()],
                Lag::Named,
            )
        };
        // A kept machine's reason names the call that failed.
        let fail = |stage, e: ProviderError, label: &'static str| {
            let why = match kept {
                Some(_) => format!("{label}: {}", e.text()),
                None => e.text(),
            };
            self.fail(site(stage, label), Failure::of(e).why(why))
        };
        let Some(p) = self.provider(&offer.location.cloud) else {
            let f = Failure::new(Fault::NoAdapter, "no adapter");
            return self.fail(site(Stage::Boot, "boot"), f);
        };
        let caps = p.capabilities();
        let seen = match p.observe(&offer.location, &self.vm.name).await {
            Ok(v) => v,
            Err(e) => return fail(Stage::Boot, e, "observe"),
        };
        let failed = |msg: String| {
            fail(
                Stage::Boot,
                ProviderError::new(ErrorKind::Failed, msg),
                "boot",
            )
        };
        let grace = self
            .vanish_grace
            .unwrap_or(caps.create_list_lag)
            .max(caps.poll_interval);
        match seen.iter().find(|o| o.instance_id == instance_id) {
            Some(Observed {
                status: InstanceStatus::Refused(e),
                ..
            }) => fail(Stage::Refused, (**e).clone(), "create"),
            Some(o) => match (&o.status, &o.ssh) {
                (InstanceStatus::Running, Some(ep)) => Step::Next(LaunchState::Connecting {
                    search: search.clone(),
                    instance_id: instance_id.to_string(),
                    endpoint: ep.clone(),
                    pinned: kept.map(|vm| vm.host_key.clone()),
                    adopted,
                }),
                (InstanceStatus::Failed(r), _) => failed(format!("instance failed: {r}")),
                (InstanceStatus::Preempted { signal, .. }, _) => {
                    failed(format!("instance preempted while booting: {signal}"))
                }
                (InstanceStatus::Stopped | InstanceStatus::Stopping, _) if adopted => {
                    failed(format!("it is {:?}", o.status))
                }
                // A start was accepted; clouds report the instance stopped until it takes
                // effect (DigitalOcean: `off` until power_on completes).
                (InstanceStatus::Stopped | InstanceStatus::Stopping, _)
                    if kept.is_some() && cx.in_state <= caps.boot_timeout =>
                {
                    Step::poll(
                        caps.poll_interval,
                        format!("{instance_id} is {:?}; its start is in progress", o.status),
                    )
                }
                (
                    InstanceStatus::Stopped
                    | InstanceStatus::Stopping
                    | InstanceStatus::Terminating,
                    _,
                ) => failed(format!("instance stopped while booting ({:?})", o.status)),
                _ if cx.in_state > caps.boot_timeout => failed(format!(
                    "not running with an SSH endpoint after {}s",
                    caps.boot_timeout.as_secs()
                )),
                (status, _) => {
                    Step::poll(caps.poll_interval, format!("still booting ({status:?})"))
                }
            },
            // Clouds list a new instance with a lag: only a lasting absence counts. Gone
            // not by our hand is planned afresh (a new nonce, a new token).
            None if cx.in_state > grace => {
                let why = format!("instance {instance_id} vanished while booting");
                self.fail(
                    site(Stage::Boot, "boot"),
                    Failure::new(Fault::Vanished, why),
                )
            }
            None => Step::poll(caps.poll_interval, "still booting (not listed yet)"),
        }
    }

    /// `Connecting`: logs in over SSH and pins the host key. A machine that was up, or
    /// one gpuprov did not create, is never deleted because SSH fails; one this run
    /// created is compensated ([`super::failover::decide`]).
    pub(super) async fn connect(
        &self,
        search: &Search,
        instance_id: &str,
        endpoint: &SshEndpoint,
        pinned: Option<&HostKey>,
        adopted: bool,
        cx: &StepCx,
    ) -> Step<LaunchState> {
        let Some(offer) = search.current() else {
            return Step::Next(LaunchState::Aborted {
                reason: "connecting without an offer".into(),
                owned: None,
            });
        };
        let caps = self
            .provider(&offer.location.cloud)
            .map(|p| p.capabilities())
            .unwrap_or_default();
        let user = endpoint.user.clone().unwrap_or_else(|| "root".into());
        let holds = match (pinned, adopted) {
            (Some(_), _) => Holds::Kept,
            (None, true) => Holds::Adopted,
            (None, false) => Holds::Created,
        };
        // The machine that was up stays recorded, with its pinned key.
        let site = Site {
            record: pinned.map(|k| Owned {
                vm: self
                    .record_for(search, instance_id, endpoint, k.clone())
                    .map(Box::new),
                ..Owned::at(offer.location.clone(), vec![instance_id.to_string()])
            }),
            keep: if pinned.is_some() {
                Keeping::Running
            } else {
                Keeping::Nothing
            },
            ..Site::attempt(
                Stage::Connect,
                holds,
                "connect",
                search,
                vec![instance_id.to_string()],
                Lag::None,
            )
        };
        let give_up = |msg: String| {
            let e = ProviderError::new(ErrorKind::Failed, msg);
            self.fail(site.clone(), Failure::of(e))
        };
        match self.connector.login(endpoint, &user, pinned).await {
            Ok(key) => match self.record_for(search, instance_id, endpoint, key) {
                Some(vm) => Step::Next(LaunchState::Ready { vm: Box::new(vm) }),
                None => Step::Next(LaunchState::Aborted {
                    reason: "no offer".into(),
                    owned: None,
                }),
            },
            Err(e @ SshError::HostKeyMismatch { .. }) => {
                self.fail(site, Failure::new(Fault::HostKeyChanged, e.to_string()))
            }
            Err(e @ SshError::Local(_)) => {
                self.fail(site, Failure::new(Fault::LocalSsh, e.to_string()))
            }
            // A refused key is permanent for that key: at once on a machine this run did
            // not just create, after a short grace on one it did (cloud-init may still be
            // writing `authorized_keys`).
            Err(e @ SshError::AuthRejected { .. })
                if pinned.is_some()
                    || adopted
                    || cx.in_state > self.auth_refused_grace.min(caps.ssh_timeout) =>
            {
                give_up(format!("key refused: {e}"))
            }
            Err(e) if cx.in_state > caps.ssh_timeout => give_up(format!(
                "ssh not reachable after {}s: {e}",
                caps.ssh_timeout.as_secs()
            )),
            // The expected wait while sshd starts: a note, not an error.
            Err(e) => Step::poll(caps.poll_interval, format!("SSH not up yet ({e})")),
        }
    }

    /// The record of the machine that is up on the current offer.
    pub(super) fn record_for(
        &self,
        search: &Search,
        instance_id: &str,
        endpoint: &SshEndpoint,
        host_key: HostKey,
    ) -> Option<VmRecord> {
        let offer = search.current()?.clone();
        Some(VmRecord {
            instance_id: instance_id.to_string(),
            location: offer.location.clone(),
            offer,
            ssh: endpoint.clone(),
            user: endpoint.user.clone().unwrap_or_else(|| "root".into()),
            host_key,
            ready_at: chrono::Utc::now(),
            preemptions: search.preempted.clone(),
        })
    }
}
