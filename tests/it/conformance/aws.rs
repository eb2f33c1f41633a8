//! The conformance driver of the AWS adapter (`src/provider/clouds/aws/`) against moto, through
//! the recording and address-rewriting proxy of `aws_moto` (its own `moto_server` per
//! scenario run, killed on drop, so runs never share instances). Faults are EC2's own
//! XML error bodies, injected by the proxy: `InsufficientInstanceCapacity` (HTTP 500)
//! and `VcpuLimitExceeded`.
//!
//! EC2 capacity is per (type, zone): a capacity refusal blocks that zone's offer only, so
//! the next offer is the same type in the region's next zone
//! ([`Driver::capacity_is_per_zone`]). `plan` is the adapter's static catalog, so a
//! region cannot be made to offer nothing (`ExactRegionMatch` is unsupported).
//!
//! Without moto the scenarios fail with the install hint, unless `GPUPROV_SKIP_AWS=1`:
//! then every scenario is declared unsupported on this driver.

use std::sync::{Arc, Mutex};

use gpuprov::config::{Cloud as CloudName, VmSpec};
use gpuprov::provider::clouds::aws::AwsProvider;
use gpuprov::provider::{CloudProvider, Location};
use gpuprov::vm::VmRecord;

use super::recover::CliCloud;
use super::{on_own_runtime, Cloud, Driver, Fault, Scenario, World};
use crate::aws_moto::{self as moto, Moto, Proxy};
use crate::support::drive;

pub struct AwsDriver;

struct AwsCloud {
    proxy: Proxy,
    moto_url: String,
    aws: Arc<AwsProvider>,
    /// Regions the scenario touches (for the sweeps).
    regions: [&'static str; 2],
    /// Killed on drop; declared last.
    _moto: Mutex<Moto>,
}

#[async_trait::async_trait]
impl Driver for AwsDriver {
    fn name(&self) -> &'static str {
        "aws"
    }

    fn unsupported(&self, s: Scenario) -> Option<&'static str> {
        if moto::skip() {
            return Some("GPUPROV_SKIP_AWS=1");
        }
        match s {
            Scenario::KeyFoundByValueNeverRegisteredTwice => Some(
                "no key registry in use: the project key goes into cloud-init user data \
                 (no ImportKeyPair)",
            ),
            Scenario::RetryAfterOnTheSameOffer => Some(
                "EC2 throttles with RequestLimitExceeded and no Retry-After header, and the \
                 proxy cannot add headers: there is no 429 with Retry-After to honour",
            ),
            Scenario::SecretsNeverInErrors => Some(
                "SigV4 never sends the secret access key, so no EC2 server can echo it; the \
                 adapter keeps EC2's messages whole (an injected echo does reach the error)",
            ),
            Scenario::ExactRegionMatch => Some(
                "plan is the adapter's static catalog (no network): every catalog region \
                 offers the type, so a region cannot be made to offer nothing",
            ),
            _ => None,
        }
    }

    fn regions(&self) -> [&'static str; 2] {
        // EC2 has no region named after another's prefix (`us-east-13`).
        ["us-east-1", "us-west-2"]
    }

    fn unplannable_gpu(&self) -> &'static str {
        // B200 is in the AWS catalog (p6-b200).
        "MI300X"
    }

    fn unknown_instance_id(&self) -> &'static str {
        "i-0123456789abcdef0"
    }

    fn capacity_is_per_zone(&self) -> bool {
        true
    }

    async fn start(&self, world: World) -> Box<dyn Cloud> {
        let [r0, _] = self.regions();
        let m = Moto::start();
        let moto_url = m.url();
        let proxy = Proxy::start(Some(m.port)).await;
        let settings = moto::settings(proxy.url());
        match world.create_fault {
            None => {}
            Some(Fault::Capacity) => proxy.fault(moto::Fault {
                region: Some(r0),
                message: "We currently do not have sufficient p4d.24xlarge capacity in the \
                          Availability Zone you requested.",
                ..moto::fault("RunInstances", 500, "InsufficientInstanceCapacity")
            }),
            Some(Fault::Quota) => proxy.fault(moto::Fault {
                region: Some(r0),
                message: "You have requested more vCPU capacity than your current vCPU \
                          limit of 0 allows for the instance bucket that the specified \
                          instance type belongs to.",
                ..moto::fault("RunInstances", 400, "VcpuLimitExceeded")
            }),
            Some(Fault::RateLimited { .. }) => unreachable!("declared unsupported"),
        }
        Box::new(AwsCloud {
            proxy,
            moto_url,
            aws: Arc::new(AwsProvider::new(settings)),
            regions: self.regions(),
            _moto: Mutex::new(m),
        })
    }
}

impl AwsCloud {
    /// What moto holds with the identity tag in the scenario's regions: live instance ids
    /// and security group ids.
    fn sweep(&self) -> (Vec<String>, Vec<String>) {
        let url = self.moto_url.clone();
        let regions = self.regions;
        on_own_runtime(move || async move {
            let mut ids = Vec::new();
            let mut groups = Vec::new();
            for r in regions {
                let (i, g) = moto::sweep_moto(&url, r).await;
                ids.extend(i);
                groups.extend(g);
            }
            (ids, groups)
        })
    }
}

impl Cloud for AwsCloud {
    fn provider(&self) -> Arc<dyn CloudProvider> {
        self.aws.clone()
    }

    fn vm(&self) -> VmSpec {
        // A100 × 8: p4d.24xlarge in four us-east-1 zones, then p4de.24xlarge, so both a
        // zone and a second type exist in the first region.
        let mut vm = drive::gpu_vm(CloudName::Aws, "A100", 8);
        vm.kubernetes = false;
        vm
    }

    fn creates(&self) -> Vec<String> {
        self.proxy
            .seen("RunInstances")
            .into_iter()
            .map(|s| s.region)
            .collect()
    }

    fn instances(&self) -> usize {
        self.sweep().0.len()
    }

    fn key_registrations(&self) -> usize {
        self.proxy.seen("ImportKeyPair").len()
    }

    fn lineage(&self) -> &str {
        moto::LINEAGE
    }

    /// Security groups with the identity tag, and key pairs, in the scenario's regions.
    fn side_resources(&self) -> usize {
        let (url, regions) = (self.moto_url.clone(), self.regions);
        let keys = on_own_runtime(move || async move {
            let mut n = 0;
            for r in regions {
                let out = moto::direct_client(&url, r)
                    .describe_key_pairs()
                    .send()
                    .await
                    .expect("DescribeKeyPairs straight at moto");
                n += out.key_pairs().len();
            }
            n
        });
        self.sweep().1.len() + keys
    }

    /// The proxy in front of moto as the EC2 endpoint, moto's static credentials, no
    /// instance metadata, and the waits of `aws_moto`'s own CLI test.
    fn cli(&self, _dir: &std::path::Path) -> Option<CliCloud> {
        let env = [
            ("AWS_ENDPOINT_URL", self.proxy.url()),
            ("AWS_ACCESS_KEY_ID", "testing".into()),
            ("AWS_SECRET_ACCESS_KEY", "testing".into()),
            ("AWS_REGION", "us-east-1".into()),
            ("AWS_EC2_METADATA_DISABLED", "true".into()),
            ("GPUPROV_AWS_SSH_TIMEOUT", "2s".into()),
            ("GPUPROV_AWS_BOOT_TIMEOUT", "30s".into()),
            ("GPUPROV_AWS_POLL_INTERVAL", "200ms".into()),
        ];
        Some(CliCloud {
            env: env.into_iter().map(|(k, v)| (k.to_string(), v)).collect(),
            config: String::new(),
        })
    }

    fn secret(&self) -> Option<&'static str> {
        Some("testing")
    }

    fn at(&self, region: &str) -> Location {
        Location {
            cloud: "aws".into(),
            region: region.into(),
            zone: None,
        }
    }

    /// The SSH endpoint is moto's address rewritten to loopback; the instance and its
    /// one per-VM security group carry the identity.
    fn check_launched(&self, vm: &VmRecord) {
        assert!(vm.ssh.host.starts_with("127.0.0."), "aws: {}", vm.ssh);
        assert_eq!(vm.ssh.port, 22, "aws");
        assert_eq!(vm.user, "ubuntu", "aws");
        let (ids, groups) = self.sweep();
        assert_eq!(ids, vec![vm.instance_id.clone()], "aws");
        assert_eq!(groups.len(), 1, "aws: one per-VM security group");
    }

    fn check_torn_down(&self) {
        assert_eq!(
            self.sweep(),
            (vec![], vec![]),
            "aws: nothing tagged is left"
        );
    }

    fn verify(&self) {
        self.proxy.assert_only_loopback_handed_out();
    }

    /// StopInstances straight at moto (not through the proxy, so the adapter's request log
    /// stays its own), in whichever of the scenario's regions holds `id`; returns once
    /// moto lists it `stopped`.
    fn stop(&self, id: &str) {
        let (url, regions, id) = (self.moto_url.clone(), self.regions, id.to_string());
        on_own_runtime(move || async move {
            use aws_sdk_ec2::types::InstanceStateName;
            for region in regions {
                let ec2 = moto::direct_client(&url, region);
                if ec2.stop_instances().instance_ids(&id).send().await.is_err() {
                    continue;
                }
                let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
                loop {
                    let state = ec2
                        .describe_instances()
                        .instance_ids(&id)
                        .send()
                        .await
                        .expect("DescribeInstances straight at moto")
                        .reservations()
                        .iter()
                        .flat_map(|r| r.instances())
                        .find_map(|i| i.state().and_then(|s| s.name()).cloned());
                    if state == Some(InstanceStateName::Stopped) {
                        return;
                    }
                    assert!(
                        std::time::Instant::now() < deadline,
                        "aws: {id} never stopped: {state:?}"
                    );
                    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                }
            }
            panic!("aws: no instance {id} to stop");
        })
    }

    /// What the old per-cloud copies asserted beyond the contract.
    fn check_after(&self, s: Scenario) {
        if s == Scenario::StartNotReplace {
            // One StartInstances naming the instance, answered (not a fault), and no
            // TerminateInstances: the same instance, never replaced.
            let start = self.proxy.seen("StartInstances");
            assert_eq!(start.len(), 1, "aws: {start:?}");
            let (ids, _) = self.sweep();
            assert_eq!(ids.len(), 1, "aws: {ids:?}");
            assert!(start[0].body.contains(&ids[0]), "aws: {start:?}");
            assert!(start[0].faulted.is_none(), "aws: {start:?}");
            assert!(
                self.proxy.seen("TerminateInstances").is_empty(),
                "aws: nothing terminated"
            );
        }
    }
}
