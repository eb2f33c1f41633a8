//! The boot probe (design 4.5, `CheckingBootInstall`): one SSH round trip that reads the
//! installer's status marker, `cloud-init status`, the k3s unit state and the GPUs
//! (`nvidia-smi`), its parser, and the pure decision table that maps the result to
//! installed, wait, or push the installer over SSH.
//!
//! Parsing never panics and never guesses: a section that is missing, a command that is
//! not installed, or output that does not parse becomes an explicit variant
//! (`NotInstalled`, `Unknown`, ...), and [`BootProbe::decide`] treats every unknown
//! conservatively (wait within the deadline, else push; the installer is idempotent, so a
//! needless push costs one run that changes nothing).

use std::fmt;
use std::time::Duration;

use super::installer::STATUS_PATH;

/// How long a boot-time install may run before gpuprov stops waiting and pushes the
/// installer over SSH (design 4.5: "poll, ≤ 15 min").
pub const BOOT_INSTALL_DEADLINE: Duration = Duration::from_secs(15 * 60);

/// The `nvidia-smi --query-gpu` fields the probe asks for, in order. A CSV without a
/// header is read in this order.
pub const QUERY_FIELDS: &str = "index,name,memory.total,driver_version";

const SECTION: &str = "@@gpuprov-probe section ";
const RC: &str = "@@gpuprov-probe rc ";
const MISSING: &str = "@@gpuprov-probe missing";
const BEGIN: &str = "@@gpuprov-probe v1";
const END: &str = "@@gpuprov-probe end";

/// The probe command: POSIX sh, read-only, runs as the login user (the marker is
/// world-readable; `systemctl is-active`, `cloud-init status` and `nvidia-smi` need no
/// root). Each section prints its command's output, then its exit status, or a
/// `missing` line when the file or command does not exist. `nvidia-smi` is bounded by
/// `timeout 20` where `timeout` exists, since a wedged driver can hang it.
pub fn command() -> String {
    format!(
        r#"S={status}
T=
if command -v timeout >/dev/null 2>&1; then T='timeout 20'; fi
echo '{BEGIN}'
echo '{SECTION}marker'
if [ -e "$S" ]; then cat "$S" 2>&1; printf '\n{RC}%s\n' "$?"; else echo '{MISSING}'; fi
echo '{SECTION}cloud-init'
if command -v cloud-init >/dev/null 2>&1; then cloud-init status 2>&1; echo "{RC}$?"; else echo '{MISSING}'; fi
echo '{SECTION}k3s'
if command -v systemctl >/dev/null 2>&1; then systemctl is-active k3s 2>&1; echo "{RC}$?"; else echo '{MISSING}'; fi
echo '{SECTION}nvidia-smi'
if command -v nvidia-smi >/dev/null 2>&1; then $T nvidia-smi --query-gpu={QUERY_FIELDS} --format=csv 2>&1; echo "{RC}$?"; else echo '{MISSING}'; fi
echo '{END}'
"#,
        status = STATUS_PATH
    )
}

/// The installer's status marker ([`STATUS_PATH`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Marker {
    /// No marker file: the installer has not started (or the file was removed).
    Absent,
    Running {
        step: Option<String>,
    },
    Done,
    Failed {
        step: Option<String>,
        reason: Option<String>,
    },
    /// The file exists but has no known `state=` line, or could not be read.
    Unreadable,
    /// The probe output had no marker section at all.
    Unknown,
}

/// `cloud-init status` (cloud-init docs, "cloud-init status"): `status: not started |
/// running | done | error | disabled` (newer releases may say `degraded done`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CloudInit {
    /// The command does not exist on the image.
    NotInstalled,
    NotStarted,
    Running,
    Done,
    Error,
    Disabled,
    Unknown,
}

/// `systemctl is-active k3s` (systemctl(1): `active`, `activating`, `deactivating`,
/// `inactive`, `failed`, ...; an unknown unit prints `inactive`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum K3sUnit {
    Active,
    Activating,
    Inactive,
    Failed,
    /// No `systemctl` on the host.
    NoSystemd,
    Unknown,
}

/// One GPU as `nvidia-smi` reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Gpu {
    /// nvidia-smi's index (`index`, or `minor_number` in XML).
    pub index: Option<u32>,
    /// Product name, e.g. `NVIDIA H200`.
    pub name: String,
    /// Total framebuffer memory in MiB (`memory.total`), when the output has it.
    pub memory_mib: Option<u64>,
}

/// The GPUs of a host and the driver version, from any of `nvidia-smi`'s output forms.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct GpuInventory {
    pub gpus: Vec<Gpu>,
    /// e.g. `580.159.04`, when the output has it.
    pub driver_version: Option<String>,
}

/// What the probe learned about the GPUs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GpuState {
    /// `nvidia-smi` is not installed (no driver, or a CPU image).
    NoNvidiaSmi,
    /// `nvidia-smi` ran and failed (no driver loaded, timeout); its first line.
    Error(String),
    /// `nvidia-smi` answered; the list may be empty.
    Visible(GpuInventory),
    /// No section, or output that does not parse.
    Unknown,
}

impl GpuState {
    /// How many GPUs are visible (0 unless `Visible`).
    pub fn visible_count(&self) -> usize {
        match self {
            GpuState::Visible(inv) => inv.gpus.len(),
            _ => 0,
        }
    }
}

/// Everything one probe round trip learned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BootProbe {
    pub marker: Marker,
    pub cloud_init: CloudInit,
    pub k3s: K3sUnit,
    pub gpu: GpuState,
}

/// How the installer was meant to reach this VM at boot.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BootRoute {
    /// In cloud-init user-data (`userdata::render`).
    CloudInit,
    /// As the cloud's startup script (`BootScript::to_shell`).
    StartupScript,
    /// The cloud runs no boot script: the installer must be pushed.
    NoBootScript,
    /// The VM existed before this run (re-entered after `Failed`, or adopted): its boot
    /// script, if any, may be from another run, so the installer is pushed to converge.
    Reused,
}

/// The inputs of [`BootProbe::decide`] besides the probe.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DecideCtx {
    pub route: BootRoute,
    /// GPUs the VM was bought with.
    pub expected_gpus: u32,
    /// Time spent waiting for the boot install so far.
    pub elapsed: Duration,
    /// Normally [`BOOT_INSTALL_DEADLINE`].
    pub deadline: Duration,
}

/// Why the installer is pushed over SSH.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PushReason {
    NoBootScript,
    ReusedVm,
    /// The route is cloud-init but the image has no `cloud-init`.
    NoCloudInit,
    /// cloud-init finished (or is disabled) and the installer never wrote its marker.
    BootInstallNotStarted,
    /// The marker says running but cloud-init has finished: the run was killed.
    BootInstallInterrupted,
    BootInstallFailed {
        step: Option<String>,
        reason: Option<String>,
    },
    MarkerUnreadable,
    /// The boot install did not finish within the deadline.
    TimedOut,
    /// Installed, but fewer GPUs are visible than the VM has.
    GpuMissing {
        expected: u32,
        visible: usize,
    },
    /// Installed, but the k3s unit is not running.
    K3sNotActive(K3sUnit),
}

impl fmt::Display for PushReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PushReason::NoBootScript => f.write_str("the cloud runs no boot script"),
            PushReason::ReusedVm => f.write_str("the VM is reused from an earlier run"),
            PushReason::NoCloudInit => f.write_str("the image has no cloud-init"),
            PushReason::BootInstallNotStarted => {
                f.write_str("cloud-init finished without running the installer")
            }
            PushReason::BootInstallInterrupted => {
                f.write_str("the boot install stopped before it finished")
            }
            PushReason::BootInstallFailed { step, reason } => {
                f.write_str("the boot install failed")?;
                if let Some(s) = step {
                    write!(f, " at step {s}")?;
                }
                if let Some(r) = reason {
                    write!(f, ": {r}")?;
                }
                Ok(())
            }
            PushReason::MarkerUnreadable => f.write_str("the install status file is unreadable"),
            PushReason::TimedOut => f.write_str("the boot install ran past its deadline"),
            PushReason::GpuMissing { expected, visible } => write!(
                f,
                "{visible} of {expected} GPUs visible to nvidia-smi after the boot install"
            ),
            PushReason::K3sNotActive(u) => {
                write!(f, "k3s is not running after the boot install ({u:?})")
            }
        }
    }
}

/// What `CheckingBootInstall` does next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Installed at boot: go to `AwaitingApi`.
    Installed,
    /// The boot install may still finish: probe again later.
    Wait,
    /// Push the installer over SSH (`Installing`).
    PushOverSsh(PushReason),
}

/// One section of the probe output: its lines and how it ended.
struct Section<'a> {
    lines: Vec<&'a str>,
    /// `None` when the file or command was missing, or the section was cut off.
    rc: Option<i32>,
    missing: bool,
}

fn sections(out: &str) -> Vec<(&str, Section<'_>)> {
    let mut v: Vec<(&str, Section<'_>)> = Vec::new();
    for line in out.lines() {
        let line = line.trim_end_matches('\r');
        if let Some(name) = line.strip_prefix(SECTION) {
            v.push((
                name.trim(),
                Section {
                    lines: Vec::new(),
                    rc: None,
                    missing: false,
                },
            ));
        } else if line == BEGIN || line == END {
            continue;
        } else if let Some((_, s)) = v.last_mut() {
            if let Some(rc) = line.strip_prefix(RC) {
                s.rc = rc.trim().parse().ok();
            } else if line == MISSING {
                s.missing = true;
            } else if s.rc.is_none() {
                s.lines.push(line);
            }
        }
    }
    v
}

impl BootProbe {
    /// Parses the output of [`command`]. Never fails: whatever is missing or unreadable
    /// is `Unknown` (or the section's own "missing" variant).
    pub fn parse(out: &str) -> BootProbe {
        let secs = sections(out);
        let find = |n: &str| secs.iter().find(|(name, _)| *name == n).map(|(_, s)| s);
        BootProbe {
            marker: find("marker").map_or(Marker::Unknown, parse_marker),
            cloud_init: find("cloud-init").map_or(CloudInit::Unknown, parse_cloud_init),
            k3s: find("k3s").map_or(K3sUnit::Unknown, parse_k3s),
            gpu: find("nvidia-smi").map_or(GpuState::Unknown, parse_gpu_section),
        }
    }

    /// The decision table of design 4.5, in this order:
    ///
    /// 1. no boot script on this cloud, or a reused VM → push;
    /// 2. marker `failed` → push; marker unreadable → push;
    /// 3. marker `done`: fewer GPUs visible than the VM has → push; k3s `active` →
    ///    installed; k3s `activating` → wait; k3s in any other state → push;
    /// 4. marker `running`: on cloud-init, cloud-init `done`/`error` means the run was
    ///    killed → push; else wait;
    /// 5. no marker: on cloud-init, no cloud-init → push, cloud-init `done`/`error`/
    ///    `disabled` → push (it will never run), else wait; on a startup script, wait;
    /// 6. a missing marker section (probe cut off) → wait.
    ///
    /// Every "wait" becomes a push once `ctx.elapsed >= ctx.deadline`.
    pub fn decide(&self, ctx: &DecideCtx) -> Decision {
        use Decision::{Installed, PushOverSsh, Wait};
        let wait = || {
            if ctx.elapsed >= ctx.deadline {
                PushOverSsh(PushReason::TimedOut)
            } else {
                Wait
            }
        };
        let cloud_init_route = match ctx.route {
            BootRoute::NoBootScript => return PushOverSsh(PushReason::NoBootScript),
            BootRoute::Reused => return PushOverSsh(PushReason::ReusedVm),
            BootRoute::CloudInit => true,
            BootRoute::StartupScript => false,
        };
        let cloud_init_finished = matches!(self.cloud_init, CloudInit::Done | CloudInit::Error);
        match &self.marker {
            Marker::Failed { step, reason } => PushOverSsh(PushReason::BootInstallFailed {
                step: step.clone(),
                reason: reason.clone(),
            }),
            Marker::Unreadable => PushOverSsh(PushReason::MarkerUnreadable),
            Marker::Done => {
                let visible = self.gpu.visible_count();
                if visible < ctx.expected_gpus as usize {
                    return PushOverSsh(PushReason::GpuMissing {
                        expected: ctx.expected_gpus,
                        visible,
                    });
                }
                match self.k3s {
                    K3sUnit::Active => Installed,
                    K3sUnit::Activating => wait(),
                    other => PushOverSsh(PushReason::K3sNotActive(other)),
                }
            }
            Marker::Running { .. } => {
                if cloud_init_route && cloud_init_finished {
                    PushOverSsh(PushReason::BootInstallInterrupted)
                } else {
                    wait()
                }
            }
            Marker::Absent if cloud_init_route => match self.cloud_init {
                CloudInit::NotInstalled => PushOverSsh(PushReason::NoCloudInit),
                CloudInit::Done | CloudInit::Error | CloudInit::Disabled => {
                    PushOverSsh(PushReason::BootInstallNotStarted)
                }
                CloudInit::NotStarted | CloudInit::Running | CloudInit::Unknown => wait(),
            },
            Marker::Absent | Marker::Unknown => wait(),
        }
    }
}

fn parse_marker(s: &Section<'_>) -> Marker {
    if s.missing {
        return Marker::Absent;
    }
    if s.rc.is_some_and(|rc| rc != 0) {
        return Marker::Unreadable;
    }
    let get = |key: &str| {
        s.lines.iter().rev().find_map(|l| {
            l.split_once('=')
                .filter(|(k, _)| k.trim() == key)
                .map(|(_, v)| v.trim().to_string())
                .filter(|v| !v.is_empty())
        })
    };
    match get("state").as_deref() {
        Some("running") => Marker::Running { step: get("step") },
        Some("done") => Marker::Done,
        Some("failed") => Marker::Failed {
            step: get("step"),
            reason: get("reason"),
        },
        _ => Marker::Unreadable,
    }
}

fn parse_cloud_init(s: &Section<'_>) -> CloudInit {
    if s.missing {
        return CloudInit::NotInstalled;
    }
    let status = s.lines.iter().find_map(|l| {
        l.trim()
            .strip_prefix("status:")
            .map(|v| v.trim().to_ascii_lowercase())
    });
    match status.as_deref() {
        Some("not started" | "not run") => CloudInit::NotStarted,
        Some("running") => CloudInit::Running,
        Some("done" | "degraded done") => CloudInit::Done,
        Some("error" | "degraded error") => CloudInit::Error,
        Some("disabled") => CloudInit::Disabled,
        _ => CloudInit::Unknown,
    }
}

fn parse_k3s(s: &Section<'_>) -> K3sUnit {
    if s.missing {
        return K3sUnit::NoSystemd;
    }
    match s.lines.iter().map(|l| l.trim()).find(|l| !l.is_empty()) {
        Some("active" | "reloading") => K3sUnit::Active,
        Some("activating") => K3sUnit::Activating,
        Some("inactive" | "deactivating") => K3sUnit::Inactive,
        Some("failed") => K3sUnit::Failed,
        _ => K3sUnit::Unknown,
    }
}

fn parse_gpu_section(s: &Section<'_>) -> GpuState {
    if s.missing {
        return GpuState::NoNvidiaSmi;
    }
    let text = s.lines.join("\n");
    match s.rc {
        Some(0) => GpuInventory::from_query_csv(&text).map_or(GpuState::Unknown, GpuState::Visible),
        Some(rc) => {
            let first = s
                .lines
                .iter()
                .map(|l| l.trim())
                .find(|l| !l.is_empty())
                .unwrap_or("");
            let first: String = first.chars().take(200).collect();
            GpuState::Error(format!("exit status {rc}: {first}"))
        }
        None => GpuState::Unknown,
    }
}

/// A memory amount as nvidia-smi prints it (`143771 MiB`, `143771MiB`, `143771`) in MiB.
fn mib(s: &str) -> Option<u64> {
    let s = s.trim();
    let digits_end = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let n: u64 = s[..digits_end].parse().ok()?;
    match s[digits_end..].trim() {
        "" | "MiB" => Some(n),
        "GiB" => n.checked_mul(1024),
        _ => None,
    }
}

fn known(s: &str) -> Option<String> {
    let s = s.trim();
    (!s.is_empty() && !s.starts_with('[') && s != "N/A").then(|| s.to_string())
}

/// The text between `<tag>` and `</tag>`, first occurrence.
fn xml_tag<'a>(text: &'a str, tag: &str) -> Option<&'a str> {
    let open = format!("<{tag}>");
    let start = text.find(&open)? + open.len();
    let end = text[start..].find(&format!("</{tag}>"))? + start;
    Some(text[start..end].trim())
}

impl GpuInventory {
    /// The number of GPUs.
    pub fn count(&self) -> usize {
        self.gpus.len()
    }

    /// The model when every GPU has the same name (the usual cloud VM).
    pub fn model(&self) -> Option<&str> {
        let first = self.gpus.first()?.name.as_str();
        self.gpus.iter().all(|g| g.name == first).then_some(first)
    }

    /// Reads any `nvidia-smi` output form: `--query-gpu` CSV, `-q -x` XML, `-L`, or the
    /// default table. `None` when it is none of them.
    pub fn parse(text: &str) -> Option<GpuInventory> {
        let t = text.trim_start();
        if t.starts_with("<?xml") || t.starts_with("<nvidia_smi_log") {
            GpuInventory::from_xml(text)
        } else if text.contains("NVIDIA-SMI") && text.contains("Driver Version:") {
            GpuInventory::from_table(text)
        } else if t.starts_with("GPU ") {
            GpuInventory::from_list(text)
        } else {
            GpuInventory::from_query_csv(text)
        }
    }

    /// Reads `nvidia-smi --query-gpu=... --format=csv[,noheader][,nounits]`. With a
    /// header, columns are found by name (`index`, `name`, `memory.total [MiB]`,
    /// `driver_version`); without one they are taken in [`QUERY_FIELDS`] order (a prefix
    /// of it is fine). Empty output is zero GPUs. `None` on any malformed row.
    pub fn from_query_csv(text: &str) -> Option<GpuInventory> {
        let mut lines = text
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .peekable();
        let split = |l: &str| {
            l.split(',')
                .map(str::trim)
                .map(str::to_string)
                .collect::<Vec<_>>()
        };
        let mut cols: Vec<String> = QUERY_FIELDS.split(',').map(str::to_string).collect();
        if let Some(first) = lines.peek() {
            if first.split(',').any(|c| c.trim().starts_with("name")) {
                cols = split(first)
                    .into_iter()
                    .map(|c| c.split(" [").next().unwrap_or("").to_string())
                    .collect();
                lines.next();
            }
        }
        let col = |n: &str| cols.iter().position(|c| c == n);
        let (i_index, i_name, i_mem, i_drv) = (
            col("index"),
            col("name")?,
            col("memory.total"),
            col("driver_version"),
        );
        let mut inv = GpuInventory::default();
        for line in lines {
            let f = split(line);
            let name = known(f.get(i_name)?)?;
            let index = match i_index {
                Some(i) => Some(f.get(i)?.parse().ok()?),
                None => None,
            };
            let memory_mib = i_mem.and_then(|i| f.get(i)).and_then(|m| mib(m));
            if let Some(d) = i_drv.and_then(|i| f.get(i)).and_then(|d| known(d)) {
                inv.driver_version.get_or_insert(d);
            }
            inv.gpus.push(Gpu {
                index,
                name,
                memory_mib,
            });
        }
        Some(inv)
    }

    /// Reads `nvidia-smi -L` (`GPU 0: NVIDIA H200 (UUID: GPU-...)`); MIG device lines are
    /// not GPUs and are skipped. No memory or driver version in this form.
    pub fn from_list(text: &str) -> Option<GpuInventory> {
        let mut inv = GpuInventory::default();
        for line in text.lines().map(str::trim) {
            let Some(rest) = line.strip_prefix("GPU ") else {
                continue;
            };
            let (idx, name) = rest.split_once(':')?;
            let name = name.split(" (UUID:").next().unwrap_or(name);
            inv.gpus.push(Gpu {
                index: Some(idx.trim().parse().ok()?),
                name: known(name)?,
                memory_mib: None,
            });
        }
        (!inv.gpus.is_empty()).then_some(inv)
    }

    /// Reads the default `nvidia-smi` table: the driver from the banner, one GPU per
    /// `| <index>  <name>  On/Off |` row and its total memory from the `used / total` cell
    /// of the row after it. Stops at the `Processes:` table.
    pub fn from_table(text: &str) -> Option<GpuInventory> {
        let mut inv = GpuInventory {
            driver_version: text
                .split("Driver Version:")
                .nth(1)
                .and_then(|r| r.split_whitespace().next())
                .and_then(known),
            ..Default::default()
        };
        for line in text.lines() {
            if line.contains("Processes:") {
                break;
            }
            let cells: Vec<&str> = line.split('|').map(str::trim).collect();
            let Some(first) = cells.get(1) else { continue };
            let mut words = first.split_whitespace();
            if let Some(index) = words.next().and_then(|w| w.parse::<u32>().ok()) {
                let mut name: Vec<&str> = words.collect();
                if matches!(name.last(), Some(&"On") | Some(&"Off")) {
                    name.pop();
                }
                inv.gpus.push(Gpu {
                    index: Some(index),
                    name: known(&name.join(" "))?,
                    memory_mib: None,
                });
            } else if let Some(mem) = cells.get(2).and_then(|c| c.split_once(" / ")) {
                if let Some(g) = inv.gpus.last_mut().filter(|g| g.memory_mib.is_none()) {
                    g.memory_mib = mib(mem.1);
                }
            }
        }
        (!inv.gpus.is_empty()).then_some(inv)
    }

    /// Reads `nvidia-smi -q -x`: `driver_version`, and per `<gpu>` its `product_name`,
    /// `minor_number` and `fb_memory_usage/total`.
    pub fn from_xml(text: &str) -> Option<GpuInventory> {
        let mut inv = GpuInventory {
            driver_version: xml_tag(text, "driver_version").and_then(known),
            ..Default::default()
        };
        for block in text.split("<gpu id=").skip(1) {
            inv.gpus.push(Gpu {
                index: xml_tag(block, "minor_number").and_then(|m| m.parse().ok()),
                name: known(xml_tag(block, "product_name")?)?,
                memory_mib: xml_tag(block, "fb_memory_usage")
                    .and_then(|m| xml_tag(m, "total"))
                    .and_then(mib),
            });
        }
        (!inv.gpus.is_empty()).then_some(inv)
    }
}

/// The driver version from `/proc/driver/nvidia/version` (`NVRM version: NVIDIA UNIX
/// ... Kernel Module ...  580.159.04  ...`): the first dotted number on the NVRM line.
pub fn driver_version_from_proc(text: &str) -> Option<String> {
    let line = text.lines().find(|l| l.starts_with("NVRM version:"))?;
    line.split_whitespace()
        .find(|w| {
            w.contains('.')
                && w.starts_with(|c: char| c.is_ascii_digit())
                && w.chars().all(|c| c.is_ascii_digit() || c == '.')
        })
        .map(str::to_string)
}

/// The number of GPU device nodes (`/dev/nvidia<N>`) in `ls -l /dev/nvidia*` output.
pub fn gpu_device_nodes(text: &str) -> usize {
    text.lines()
        .filter_map(|l| l.split_whitespace().last())
        .filter(|p| {
            p.strip_prefix("/dev/nvidia")
                .is_some_and(|n| !n.is_empty() && n.chars().all(|c| c.is_ascii_digit()))
        })
        .count()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    const FIXTURES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/gpu-probe");

    fn read(dir: &Path, f: &str) -> Option<String> {
        std::fs::read_to_string(dir.join(f)).ok()
    }

    /// Every fixture directory (copied from the project's `shared/fixtures/gpu-probe/`, with
    /// the checksums in `tests/fixtures/gpu-probe/PROVENANCE.md`, plus an `expected.json`
    /// per GPU) parses to its expected model, count, memory and driver, in every output
    /// form the directory holds.
    #[test]
    fn every_gpu_fixture_parses() {
        let mut dirs = 0;
        for entry in std::fs::read_dir(FIXTURES).unwrap() {
            let dir = entry.unwrap().path();
            if !dir.is_dir() {
                continue;
            }
            dirs += 1;
            let want: serde_json::Value =
                serde_json::from_str(&read(&dir, "expected.json").unwrap()).unwrap();
            let model = want["model"].as_str().unwrap();
            let count = want["count"].as_u64().unwrap() as usize;
            let mem = want["memory_mib"].as_u64().unwrap();
            let driver = want["driver_version"].as_str().unwrap();
            let ctx = |f: &str| format!("{}/{f}", dir.display());
            // (file, has memory, has driver)
            for (file, has_mem, has_driver) in [
                ("query-gpu.csv", true, true),
                ("query-gpu-noheader.csv", true, false),
                ("nvidia-smi.txt", true, true),
                ("nvidia-smi-q.xml", true, true),
                ("nvidia-smi-L.txt", false, false),
            ] {
                let Some(text) = read(&dir, file) else {
                    continue;
                };
                let inv = GpuInventory::parse(&text).unwrap_or_else(|| panic!("{}", ctx(file)));
                assert_eq!(inv.count(), count, "{}", ctx(file));
                assert_eq!(inv.model(), Some(model), "{}", ctx(file));
                for (i, g) in inv.gpus.iter().enumerate() {
                    assert_eq!(g.index, Some(i as u32), "{}", ctx(file));
                    let m = has_mem.then_some(mem);
                    assert_eq!(g.memory_mib, m, "{}", ctx(file));
                }
                let d = has_driver.then(|| driver.to_string());
                assert_eq!(inv.driver_version, d, "{}", ctx(file));
            }
            if let Some(text) = read(&dir, "proc-driver-nvidia-version.txt") {
                assert_eq!(driver_version_from_proc(&text).as_deref(), Some(driver));
            }
            if let Some(text) = read(&dir, "dev-nvidia.txt") {
                assert_eq!(gpu_device_nodes(&text), count);
            }
        }
        assert!(dirs >= 1, "no fixture directories under {FIXTURES}");
    }

    /// Wraps `nvidia_smi` as the probe's nvidia-smi section.
    fn probe_out(marker: &str, cloud_init: &str, k3s: &str, nvidia_smi: &str) -> String {
        format!(
            "{BEGIN}\n{SECTION}marker\n{marker}\n{SECTION}cloud-init\n{cloud_init}\n\
             {SECTION}k3s\n{k3s}\n{SECTION}nvidia-smi\n{nvidia_smi}\n{END}\n"
        )
    }

    #[test]
    fn parses_a_finished_gpu_host() {
        let csv = read(&Path::new(FIXTURES).join("nvidia-h200"), "query-gpu.csv").unwrap();
        let out = probe_out(
            &format!("state=done\nstep=finish\nupdated=1764540000\n\n{RC}0"),
            &format!("status: done\n{RC}0"),
            &format!("active\n{RC}0"),
            &format!("{csv}{RC}0"),
        );
        let p = BootProbe::parse(&out);
        assert_eq!(p.marker, Marker::Done);
        assert_eq!(p.cloud_init, CloudInit::Done);
        assert_eq!(p.k3s, K3sUnit::Active);
        let GpuState::Visible(inv) = &p.gpu else {
            panic!("{:?}", p.gpu)
        };
        assert_eq!(inv.count(), 1);
        assert_eq!(inv.model(), Some("NVIDIA H200"));
        assert_eq!(inv.gpus[0].memory_mib, Some(143771));
        assert_eq!(inv.driver_version.as_deref(), Some("580.159.04"));
    }

    #[test]
    fn parses_a_fresh_cpu_host() {
        let out = probe_out(
            MISSING,
            &format!("status: running\n{RC}0"),
            &format!("inactive\n{RC}3"),
            MISSING,
        );
        let p = BootProbe::parse(&out);
        assert_eq!(p.marker, Marker::Absent);
        assert_eq!(p.cloud_init, CloudInit::Running);
        assert_eq!(p.k3s, K3sUnit::Inactive);
        assert_eq!(p.gpu, GpuState::NoNvidiaSmi);
    }

    #[test]
    fn parses_marker_states_and_failures() {
        let m =
            |body: &str| BootProbe::parse(&probe_out(&format!("{body}\n{RC}0"), "", "", "")).marker;
        assert_eq!(
            m("state=running\nstep=toolkit"),
            Marker::Running {
                step: Some("toolkit".into())
            }
        );
        assert_eq!(
            m("state=failed\nstep=driver\nreason=no NVIDIA GPU visible"),
            Marker::Failed {
                step: Some("driver".into()),
                reason: Some("no NVIDIA GPU visible".into())
            }
        );
        assert_eq!(m("state=exploded"), Marker::Unreadable);
        assert_eq!(m(""), Marker::Unreadable);
        assert_eq!(m("\u{0}\u{1}garbage=="), Marker::Unreadable);
        let unreadable = probe_out(&format!("cat: permission denied\n\n{RC}1"), "", "", "");
        assert_eq!(BootProbe::parse(&unreadable).marker, Marker::Unreadable);
    }

    #[test]
    fn parses_cloud_init_and_k3s_variants() {
        let ci =
            |s: &str| BootProbe::parse(&probe_out("", &format!("{s}\n{RC}0"), "", "")).cloud_init;
        assert_eq!(ci("status: not started"), CloudInit::NotStarted);
        assert_eq!(ci("status: done"), CloudInit::Done);
        assert_eq!(ci("status: degraded done"), CloudInit::Done);
        assert_eq!(ci("status: error"), CloudInit::Error);
        assert_eq!(ci("status: disabled"), CloudInit::Disabled);
        assert_eq!(ci("\nstatus: running\n"), CloudInit::Running);
        assert_eq!(ci("Traceback (most recent call last):"), CloudInit::Unknown);
        assert_eq!(
            BootProbe::parse(&probe_out("", MISSING, "", "")).cloud_init,
            CloudInit::NotInstalled
        );
        let k = |s: &str| BootProbe::parse(&probe_out("", "", &format!("{s}\n{RC}0"), "")).k3s;
        assert_eq!(k("active"), K3sUnit::Active);
        assert_eq!(k("activating"), K3sUnit::Activating);
        assert_eq!(k("failed"), K3sUnit::Failed);
        assert_eq!(k("inactive"), K3sUnit::Inactive);
        assert_eq!(
            k("System has not been booted with systemd"),
            K3sUnit::Unknown
        );
        assert_eq!(
            BootProbe::parse(&probe_out("", "", MISSING, "")).k3s,
            K3sUnit::NoSystemd
        );
    }

    #[test]
    fn parses_nvidia_smi_failures() {
        let g = |s: &str| BootProbe::parse(&probe_out("", "", "", s)).gpu;
        assert_eq!(
            g(&format!(
                "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.\n{RC}9"
            )),
            GpuState::Error(
                "exit status 9: NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver."
                    .into()
            )
        );
        assert_eq!(
            g(&format!("{RC}124")),
            GpuState::Error("exit status 124: ".into())
        );
        assert_eq!(g(&format!("complete nonsense\n{RC}0")), GpuState::Unknown);
        assert_eq!(
            g("index, name\n0, NVIDIA H200"),
            GpuState::Unknown,
            "cut off before rc"
        );
        assert_eq!(
            g(&format!(
                "index, name, memory.total [MiB], driver_version\n{RC}0"
            )),
            GpuState::Visible(GpuInventory::default())
        );
    }

    #[test]
    fn eight_gpus_in_every_form() {
        let mut csv = String::from("index, name, memory.total [MiB], driver_version\n");
        for i in 0..8 {
            csv.push_str(&format!(
                "{i}, NVIDIA H100 80GB HBM3, 81559 MiB, 550.54.15\n"
            ));
        }
        let inv = GpuInventory::parse(&csv).unwrap();
        assert_eq!(inv.count(), 8);
        assert_eq!(inv.model(), Some("NVIDIA H100 80GB HBM3"));
        assert!(inv.gpus.iter().all(|g| g.memory_mib == Some(81559)));
        let mixed = GpuInventory::parse("0, A, 1\n1, B, 2\n").unwrap();
        assert_eq!(mixed.model(), None);
        assert_eq!(mixed.gpus[1].memory_mib, Some(2));
    }

    #[test]
    fn garbage_never_panics() {
        let long = "x".repeat(10_000);
        let inputs = [
            "",
            "\n\n\n",
            "@@gpuprov-probe",
            "@@gpuprov-probe section ",
            "@@gpuprov-probe section marker",
            "@@gpuprov-probe rc 0\n@@gpuprov-probe missing",
            "@@gpuprov-probe section nvidia-smi\n@@gpuprov-probe rc notanumber",
            "@@gpuprov-probe section nvidia-smi\n| 0 |\n@@gpuprov-probe rc 0",
            "<?xml <gpu id=<product_name>",
            "<nvidia_smi_log><gpu id=\"x\"><product_name>N/A</product_name></gpu>",
            "NVIDIA-SMI Driver Version:",
            "GPU x: y",
            "GPU 0:",
            "| 0 |\n| a | 1 / 2 |",
            "99999999999999999999999, name, 1",
            "0, NVIDIA H200, 99999999999999999999999 GiB",
            "\u{feff}\u{0}\r\n\t",
            long.as_str(),
        ];
        for s in inputs {
            let _ = BootProbe::parse(s);
            let _ = GpuInventory::parse(s);
            let _ = GpuInventory::from_table(s);
            let _ = GpuInventory::from_xml(s);
            let _ = GpuInventory::from_list(s);
            let _ = driver_version_from_proc(s);
            let _ = gpu_device_nodes(s);
        }
        let p = BootProbe::parse("ssh: connect to host: Connection refused");
        assert_eq!(
            p,
            BootProbe {
                marker: Marker::Unknown,
                cloud_init: CloudInit::Unknown,
                k3s: K3sUnit::Unknown,
                gpu: GpuState::Unknown
            }
        );
    }

    #[test]
    fn command_runs_under_sh_and_parses() {
        // Runs the real probe command on this machine (read-only, local): whatever it
        // finds, the output must parse into sections without losing any.
        let out = std::process::Command::new("sh")
            .arg("-c")
            .arg(command())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            text.starts_with(BEGIN) && text.trim_end().ends_with(END),
            "{text}"
        );
        let names: Vec<&str> = sections(&text).into_iter().map(|(n, _)| n).collect();
        assert_eq!(names, ["marker", "cloud-init", "k3s", "nvidia-smi"]);
        let p = BootProbe::parse(&text);
        assert_ne!(p.marker, Marker::Unknown);
        assert_ne!(p.cloud_init, CloudInit::Unknown);
    }

    // ---- the decision table --------------------------------------------------------

    const D: Duration = BOOT_INSTALL_DEADLINE;

    fn all_markers() -> Vec<Marker> {
        vec![
            Marker::Absent,
            Marker::Running { step: None },
            Marker::Running {
                step: Some("toolkit".into()),
            },
            Marker::Done,
            Marker::Failed {
                step: None,
                reason: None,
            },
            Marker::Failed {
                step: Some("driver".into()),
                reason: Some("no GPU".into()),
            },
            Marker::Unreadable,
            Marker::Unknown,
        ]
    }
    const CLOUD_INITS: [CloudInit; 7] = [
        CloudInit::NotInstalled,
        CloudInit::NotStarted,
        CloudInit::Running,
        CloudInit::Done,
        CloudInit::Error,
        CloudInit::Disabled,
        CloudInit::Unknown,
    ];
    const UNITS: [K3sUnit; 6] = [
        K3sUnit::Active,
        K3sUnit::Activating,
        K3sUnit::Inactive,
        K3sUnit::Failed,
        K3sUnit::NoSystemd,
        K3sUnit::Unknown,
    ];
    const ROUTES: [BootRoute; 4] = [
        BootRoute::CloudInit,
        BootRoute::StartupScript,
        BootRoute::NoBootScript,
        BootRoute::Reused,
    ];

    fn gpus(n: usize) -> GpuState {
        GpuState::Visible(GpuInventory {
            gpus: (0..n)
                .map(|i| Gpu {
                    index: Some(i as u32),
                    name: "NVIDIA H200".into(),
                    memory_mib: Some(143771),
                })
                .collect(),
            driver_version: Some("580.159.04".into()),
        })
    }

    fn all_gpu_states() -> Vec<GpuState> {
        vec![
            GpuState::NoNvidiaSmi,
            GpuState::Error("exit status 9: no driver".into()),
            GpuState::Unknown,
            gpus(0),
            gpus(1),
            gpus(8),
        ]
    }

    fn elapsed_values() -> [Duration; 5] {
        [
            Duration::ZERO,
            D / 2,
            D - Duration::from_secs(1),
            D,
            D + Duration::from_secs(3600),
        ]
    }

    fn ctx(route: BootRoute, expected_gpus: u32, elapsed: Duration) -> DecideCtx {
        DecideCtx {
            route,
            expected_gpus,
            elapsed,
            deadline: D,
        }
    }

    /// Every combination of inputs (8 markers × 7 cloud-init × 6 units × 6 GPU states
    /// × 4 routes × 3 GPU counts × 5 times), checked against the table's invariants.
    #[test]
    fn decide_exhaustive_invariants() {
        let mut n = 0;
        for marker in all_markers() {
            for cloud_init in CLOUD_INITS {
                for k3s in UNITS {
                    for gpu in all_gpu_states() {
                        let p = BootProbe {
                            marker: marker.clone(),
                            cloud_init,
                            k3s,
                            gpu: gpu.clone(),
                        };
                        for route in ROUTES {
                            for expected in [0u32, 1, 8] {
                                let mut previous: Option<Decision> = None;
                                for elapsed in elapsed_values() {
                                    n += 1;
                                    let c = ctx(route, expected, elapsed);
                                    let d = p.decide(&c);
                                    check_invariants(&p, &c, &d);
                                    // Time only moves a Wait to a push, never back.
                                    if let Some(prev) = &previous {
                                        if *prev != Decision::Wait {
                                            assert_eq!(&d, prev, "{p:?} {c:?}");
                                        }
                                    }
                                    previous = Some(d);
                                }
                            }
                        }
                    }
                }
            }
        }
        assert_eq!(n, 8 * 7 * 6 * 6 * 4 * 3 * 5);
    }

    fn check_invariants(p: &BootProbe, c: &DecideCtx, d: &Decision) {
        let delivered = matches!(c.route, BootRoute::CloudInit | BootRoute::StartupScript);
        let gpus_ok = p.gpu.visible_count() >= c.expected_gpus as usize;
        let complete = p.marker == Marker::Done && p.k3s == K3sUnit::Active && gpus_ok;
        let why = format!("{p:?} {c:?} -> {d:?}");
        // Installed exactly when the boot route delivered and finished with k3s running
        // and every GPU visible, whatever the clock or cloud-init say.
        assert_eq!(*d == Decision::Installed, delivered && complete, "{why}");
        // Never wait past the deadline, nor on a route that will not deliver.
        if *d == Decision::Wait {
            assert!(c.elapsed < c.deadline && delivered, "{why}");
            assert!(
                matches!(
                    p.marker,
                    Marker::Absent | Marker::Running { .. } | Marker::Unknown
                ) || (p.marker == Marker::Done && p.k3s == K3sUnit::Activating),
                "{why}"
            );
        }
        match c.route {
            BootRoute::NoBootScript => {
                assert_eq!(*d, Decision::PushOverSsh(PushReason::NoBootScript), "{why}")
            }
            BootRoute::Reused => {
                assert_eq!(*d, Decision::PushOverSsh(PushReason::ReusedVm), "{why}")
            }
            _ => {}
        }
        if delivered && matches!(p.marker, Marker::Failed { .. }) {
            assert!(
                matches!(
                    d,
                    Decision::PushOverSsh(PushReason::BootInstallFailed { .. })
                ),
                "{why}"
            );
        }
        if delivered && p.marker == Marker::Done && !gpus_ok {
            assert!(
                matches!(d, Decision::PushOverSsh(PushReason::GpuMissing { .. })),
                "{why}"
            );
        }
        if let Decision::PushOverSsh(r) = d {
            assert!(!r.to_string().is_empty());
        }
    }

    fn probe(marker: Marker, cloud_init: CloudInit, k3s: K3sUnit, gpu: GpuState) -> BootProbe {
        BootProbe {
            marker,
            cloud_init,
            k3s,
            gpu,
        }
    }

    #[test]
    fn decide_named_cases() {
        use Decision::*;
        let early = Duration::from_secs(60);
        let late = D;
        let push = |r| PushOverSsh(r);
        let cases: Vec<(&str, BootProbe, DecideCtx, Decision)> = vec![
            (
                "installed at boot on a GPU VM",
                probe(Marker::Done, CloudInit::Done, K3sUnit::Active, gpus(1)),
                ctx(BootRoute::CloudInit, 1, early),
                Installed,
            ),
            (
                "installed at boot on a CPU VM without nvidia-smi",
                probe(
                    Marker::Done,
                    CloudInit::Done,
                    K3sUnit::Active,
                    GpuState::NoNvidiaSmi,
                ),
                ctx(BootRoute::StartupScript, 0, late),
                Installed,
            ),
            (
                "boot install still running",
                probe(
                    Marker::Running {
                        step: Some("toolkit".into()),
                    },
                    CloudInit::Running,
                    K3sUnit::Inactive,
                    gpus(1),
                ),
                ctx(BootRoute::CloudInit, 1, early),
                Wait,
            ),
            (
                "boot install running past the deadline",
                probe(
                    Marker::Running { step: None },
                    CloudInit::Running,
                    K3sUnit::Inactive,
                    gpus(1),
                ),
                ctx(BootRoute::CloudInit, 1, late),
                push(PushReason::TimedOut),
            ),
            (
                "boot install failed",
                probe(
                    Marker::Failed {
                        step: Some("driver".into()),
                        reason: Some("no GPU".into()),
                    },
                    CloudInit::Error,
                    K3sUnit::Inactive,
                    GpuState::Error("x".into()),
                ),
                ctx(BootRoute::CloudInit, 1, early),
                push(PushReason::BootInstallFailed {
                    step: Some("driver".into()),
                    reason: Some("no GPU".into()),
                }),
            ),
            (
                "no marker and cloud-init done: the script never ran",
                probe(Marker::Absent, CloudInit::Done, K3sUnit::Inactive, gpus(1)),
                ctx(BootRoute::CloudInit, 1, early),
                push(PushReason::BootInstallNotStarted),
            ),
            (
                "no marker while cloud-init runs",
                probe(
                    Marker::Absent,
                    CloudInit::Running,
                    K3sUnit::Inactive,
                    GpuState::Unknown,
                ),
                ctx(BootRoute::CloudInit, 1, early),
                Wait,
            ),
            (
                "no marker, image without cloud-init",
                probe(
                    Marker::Absent,
                    CloudInit::NotInstalled,
                    K3sUnit::Inactive,
                    gpus(1),
                ),
                ctx(BootRoute::CloudInit, 1, early),
                push(PushReason::NoCloudInit),
            ),
            (
                "startup-script cloud without cloud-init waits for the marker",
                probe(
                    Marker::Absent,
                    CloudInit::NotInstalled,
                    K3sUnit::Inactive,
                    gpus(1),
                ),
                ctx(BootRoute::StartupScript, 1, early),
                Wait,
            ),
            (
                "running marker but cloud-init finished: killed",
                probe(
                    Marker::Running { step: None },
                    CloudInit::Done,
                    K3sUnit::Inactive,
                    gpus(1),
                ),
                ctx(BootRoute::CloudInit, 1, early),
                push(PushReason::BootInstallInterrupted),
            ),
            (
                "done but the GPU is not visible",
                probe(
                    Marker::Done,
                    CloudInit::Done,
                    K3sUnit::Active,
                    GpuState::Error("no driver".into()),
                ),
                ctx(BootRoute::CloudInit, 1, early),
                push(PushReason::GpuMissing {
                    expected: 1,
                    visible: 0,
                }),
            ),
            (
                "done but only 1 of 8 GPUs visible",
                probe(Marker::Done, CloudInit::Done, K3sUnit::Active, gpus(1)),
                ctx(BootRoute::CloudInit, 8, early),
                push(PushReason::GpuMissing {
                    expected: 8,
                    visible: 1,
                }),
            ),
            (
                "done but k3s has stopped",
                probe(Marker::Done, CloudInit::Done, K3sUnit::Failed, gpus(1)),
                ctx(BootRoute::CloudInit, 1, early),
                push(PushReason::K3sNotActive(K3sUnit::Failed)),
            ),
            (
                "done and k3s restarting",
                probe(Marker::Done, CloudInit::Done, K3sUnit::Activating, gpus(1)),
                ctx(BootRoute::CloudInit, 1, early),
                Wait,
            ),
            (
                "cloud without a boot script",
                probe(
                    Marker::Absent,
                    CloudInit::NotInstalled,
                    K3sUnit::NoSystemd,
                    GpuState::NoNvidiaSmi,
                ),
                ctx(BootRoute::NoBootScript, 0, early),
                push(PushReason::NoBootScript),
            ),
            (
                "reused VM, even when it looks installed",
                probe(Marker::Done, CloudInit::Done, K3sUnit::Active, gpus(1)),
                ctx(BootRoute::Reused, 1, early),
                push(PushReason::ReusedVm),
            ),
            (
                "unreadable marker",
                probe(
                    Marker::Unreadable,
                    CloudInit::Done,
                    K3sUnit::Active,
                    gpus(1),
                ),
                ctx(BootRoute::CloudInit, 1, early),
                push(PushReason::MarkerUnreadable),
            ),
            (
                "probe output cut off",
                probe(
                    Marker::Unknown,
                    CloudInit::Unknown,
                    K3sUnit::Unknown,
                    GpuState::Unknown,
                ),
                ctx(BootRoute::CloudInit, 1, early),
                Wait,
            ),
        ];
        for (name, p, c, want) in cases {
            assert_eq!(p.decide(&c), want, "{name}");
        }
    }

    #[test]
    fn push_reasons_read_well() {
        assert_eq!(
            PushReason::BootInstallFailed {
                step: Some("driver".into()),
                reason: Some("no GPU".into())
            }
            .to_string(),
            "the boot install failed at step driver: no GPU"
        );
        assert_eq!(
            PushReason::GpuMissing {
                expected: 8,
                visible: 1
            }
            .to_string(),
            "1 of 8 GPUs visible to nvidia-smi after the boot install"
        );
    }
}
