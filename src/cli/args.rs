//! Command-line arguments (clap). Help lines are imperative, without a trailing period.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};

/// Provision GPU machines on many clouds from a committed gpuprov.toml
///
/// Every long flag also takes Terraform's single-dash spelling (-auto-approve,
/// -lock=false, -out=FILE, -chdir=DIR).
#[derive(Debug, Parser)]
#[command(name = "gpuprov", version, about, propagate_version = true)]
pub struct Cli {
    /// Switch to DIR before doing anything else (Terraform's -chdir): the config, the
    /// state and every relative path are then read from there
    #[arg(long, value_name = "DIR", global = true)]
    pub chdir: Option<PathBuf>,
    /// Config file
    #[arg(
        short = 'c',
        long = "config",
        global = true,
        default_value = "gpuprov.toml",
        env = "GPUPROV_CONFIG"
    )]
    pub config: PathBuf,
    /// State file (default: gpuprov.state.json beside the config)
    #[arg(long, global = true, env = "GPUPROV_STATE")]
    pub state: Option<PathBuf>,
    /// Override a key of the [backend] table, for example type=s3 or bucket=team-state
    /// (repeatable; applied after GPUPROV_BACKEND_CONFIG's comma-separated pairs)
    #[arg(
        long = "backend-config",
        global = true,
        value_name = "KEY=VALUE",
        value_delimiter = ','
    )]
    pub backend_config: Vec<String>,
    /// How long to wait for the state lock, for example 30s or 2m
    #[arg(long = "lock-timeout", global = true, default_value = "0s", value_parser = parse_duration)]
    pub lock_timeout: Duration,
    /// The project's SSH private key file, on a machine other than the one that made it
    /// (or a .pub file whose key the SSH agent holds); the key's text can come from
    /// GPUPROV_SSH_PRIVATE_KEY instead
    #[arg(
        long = "ssh-key",
        value_name = "PATH",
        global = true,
        env = "GPUPROV_SSH_KEY_FILE"
    )]
    pub ssh_key: Option<PathBuf>,
    /// Ask for confirmation when needed (default true); --input=false fails instead, as
    /// without a terminal (Terraform's -input=false)
    #[arg(long, global = true, default_value_t = true, action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    pub input: bool,
    /// Disable colours and live progress (also when NO_COLOR is set or output is not a terminal)
    #[arg(long = "no-color", global = true)]
    pub no_color: bool,
    #[command(subcommand)]
    pub command: Command,
}

/// Parses a human duration (`30s`, `2m`, `1h 30m`, or bare seconds).
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    if let Ok(secs) = s.trim().parse::<u64>() {
        return Ok(Duration::from_secs(secs));
    }
    humantime::parse_duration(s).map_err(|e| format!("{e} (expected for example 30s, 2m, 1h)"))
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Show what apply would change
    Plan(PlanArgs),
    /// Create, update or replace machines to match the config
    Apply(ApplyArgs),
    /// Destroy every machine in the state
    Destroy(DestroyArgs),
    /// Show each machine's recorded and observed state
    Status(StatusArgs),
    /// List the machines in the state, one line each
    List(ListArgs),
    /// Show a plan saved by `gpuprov plan -out FILE`, as text or JSON
    Show(ShowArgs),
    /// Open a shell on a machine, or run a command there
    Ssh(SshArgs),
    /// Print the resource graph as Graphviz DOT
    Graph,
    /// Check the config and report which clouds are usable
    Validate(ValidateArgs),
    /// Inspect, pull, push or migrate the state
    #[command(subcommand)]
    State(StateCommand),
    /// Clear a stale state lock left by a process that is gone
    ForceUnlock(ForceUnlockArgs),
    /// Adopt an instance created outside gpuprov as machine ADDRESS (vm.NAME of the config),
    /// giving it the machine's identity where the cloud allows
    Import(ImportArgs),
    /// List machines carrying gpuprov's labels that no state here knows, by lineage, with
    /// age and price; --destroy LINEAGE tears them down. Read-only by default
    Sweep(SweepArgs),
    /// Search the clouds' catalogs for offers: instance types, regions and prices
    Offers(OffersArgs),
    /// Print a machine's kubeconfig, or merge it into yours
    Kubeconfig(KubeconfigArgs),
    /// Forward 127.0.0.1:6443 to a machine's Kubernetes API over SSH until Ctrl-C
    Tunnel(TunnelArgs),
    /// Check each machine's cloud status, SSH login and k3s API; exit 1 when one fails
    Health(HealthArgs),
    /// Print shell completions (for example `gpuprov completion bash > /etc/bash_completion.d/gpuprov`)
    Completion(CompletionArgs),
    /// Print the man page (roff), or write one page per command into a directory
    Man(ManArgs),
}

#[derive(Debug, Args)]
pub struct CompletionArgs {
    /// The shell to complete in
    #[arg(value_enum)]
    pub shell: clap_complete::Shell,
}

#[derive(Debug, Args)]
pub struct ManArgs {
    /// Write gpuprov.1 and a page per command (gpuprov-plan.1, …) into DIR instead of
    /// printing gpuprov.1
    #[arg(long, value_name = "DIR")]
    pub dir: Option<PathBuf>,
}

/// `--k8s` / `--no-k8s`: override `kubernetes` for every machine of the config.
#[derive(Debug, Args, Default)]
pub struct K8sArgs {
    /// Make every machine a k3s cluster, overriding `kubernetes` in the config (rejected
    /// when a machine's clouds cannot host k3s)
    #[arg(long = "k8s", conflicts_with = "no_k8s")]
    pub k8s: bool,
    /// Skip k3s on every machine, overriding `kubernetes` in the config
    #[arg(long = "no-k8s")]
    pub no_k8s: bool,
}

#[derive(Debug, Args)]
pub struct KubeconfigArgs {
    /// Machine name as in [vm.NAME]
    pub name: String,
    /// Print the path of gpuprov's copy instead of its contents
    #[arg(long, conflicts_with = "merge")]
    pub path: bool,
    /// Merge the machine's cluster, user and context (named gpuprov-NAME) into your
    /// kubeconfig: --kubeconfig FILE, else the first file of $KUBECONFIG, else ~/.kube/config
    #[arg(long)]
    pub merge: bool,
    /// With --merge: also make it the current context
    #[arg(long = "use-context", requires = "merge")]
    pub use_context: bool,
    /// With --merge: the kubeconfig file to merge into
    #[arg(long = "kubeconfig", value_name = "FILE", requires = "merge")]
    pub kubeconfig: Option<PathBuf>,
}

#[derive(Debug, Args)]
pub struct TunnelArgs {
    /// Machine name as in [vm.NAME]
    pub name: String,
    /// Local port to listen on (127.0.0.1 only); 0 picks a free one; default: the port in
    /// its kubeconfig (6443)
    #[arg(long)]
    pub port: Option<u16>,
}

#[derive(Debug, Args)]
pub struct OffersArgs {
    /// Show the offers one machine of the config would try, in apply's order
    #[arg(long, value_name = "NAME", conflicts_with_all = ["gpu", "gpu_count", "min_gpu_count", "clouds", "regions", "spot", "max_price"])]
    pub vm: Option<String>,
    /// GPU model, for example H100 (case-insensitive); omit for any
    #[arg(long)]
    pub gpu: Option<String>,
    /// Exactly N GPUs per machine (default: any count)
    #[arg(long = "gpu-count", value_name = "N", value_parser = clap::value_parser!(u32).range(1..=64))]
    pub gpu_count: Option<u32>,
    /// At least N GPUs per machine
    #[arg(long = "min-gpu-count", value_name = "N", value_parser = clap::value_parser!(u32).range(1..=64), conflicts_with = "gpu_count")]
    pub min_gpu_count: Option<u32>,
    /// Clouds to ask (repeatable; default: every cloud in this build except docker)
    #[arg(long = "cloud", value_name = "CLOUD")]
    pub clouds: Vec<String>,
    /// Regions to consider (repeatable; default: each cloud's own)
    #[arg(long = "region", value_name = "REGION")]
    pub regions: Vec<String>,
    /// Spot (interruptible) offers instead of on-demand
    #[arg(long)]
    pub spot: bool,
    /// Drop offers above this price, in USD per hour
    #[arg(
        long = "max-price",
        value_name = "USD_PER_HOUR",
        allow_negative_numbers = true
    )]
    pub max_price: Option<f64>,
    /// Show at most N offers (cheapest first)
    #[arg(long, value_name = "N")]
    pub limit: Option<usize>,
    /// Print the offers as JSON on stdout
    #[arg(long)]
    pub json: bool,
}

/// `--json`: machine-readable output on stdout (schema in `schemas/`).
#[derive(Debug, Args, Default)]
pub struct JsonArg {
    /// Print JSON on stdout instead of text (its JSON Schema is in schemas/)
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct StatusArgs {
    #[command(flatten)]
    pub refresh: RefreshArg,
    #[command(flatten)]
    pub json: JsonArg,
}

/// `gpuprov health [NAME]`.
#[derive(Debug, Args)]
#[command(after_help = "Checks, each ok, warn, fail or skipped:
  cloud  the cloud's own view of the recorded instance: running is ok; starting is a
         warning; stopped, deleted outside gpuprov or an API error is a failure; the
         cloud's own findings (Docker: healthcheck, OOM kill, exit code) are shown
  ssh    a login with the project key and the host key pinned in the state, running
         `true` (5 s to connect); a changed host key is a failure
  k8s    the k3s API (/readyz and the node) through the kubeconfig's access path;
         skipped for a machine without k3s
A machine that is not up (aborted, exhausted, leaked, unowned) fails with its recorded
state. Machines are checked concurrently, each check once, within a deadline.

Exit codes: 0 when no check failed (warnings allowed), 1 when one did or the state
cannot be read.")]
pub struct HealthArgs {
    /// Check only this machine (as in [vm.NAME]); default: every machine of the state
    pub name: Option<String>,
    #[command(flatten)]
    pub json: JsonArg,
}

#[derive(Debug, Args)]
pub struct ListArgs {
    #[command(flatten)]
    pub json: JsonArg,
}

#[derive(Debug, Args)]
pub struct ValidateArgs {
    #[command(flatten)]
    pub json: JsonArg,
}

#[derive(Debug, Args)]
pub struct ShowArgs {
    /// A plan saved by `gpuprov plan -out FILE`
    pub plan_file: PathBuf,
    #[command(flatten)]
    pub json: JsonArg,
    /// Print the plan as Markdown (for a pull-request comment)
    #[arg(long, conflicts_with = "json")]
    pub markdown: bool,
}

#[derive(Debug, Args)]
pub struct RefreshArg {
    /// Ask the clouds for each machine's current state (default true)
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    pub refresh: bool,
}

/// `-target` and `-replace` of `plan` and `apply`.
#[derive(Debug, Args, Default)]
pub struct TargetArgs {
    /// Plan only this machine, for example vm.gpu (repeatable), plus the machines it
    /// depends_on, or for a destroy the machines that depend on it; for exceptional
    /// situations, not for routine use
    #[arg(long = "target", value_name = "ADDRESS")]
    pub targets: Vec<String>,
    /// Replace this machine even when nothing changed, for example vm.gpu (repeatable)
    #[arg(long = "replace", value_name = "ADDRESS")]
    pub replace: Vec<String>,
}

impl TargetArgs {
    /// Whether `-target` or `-replace` was given.
    pub fn any(&self) -> bool {
        !self.targets.is_empty() || !self.replace.is_empty()
    }
}

#[derive(Debug, Args)]
pub struct PlanArgs {
    #[command(flatten)]
    pub refresh: RefreshArg,
    #[command(flatten)]
    pub targeting: TargetArgs,
    /// Exit 0 when there are no changes, 2 when there are, 1 on error
    #[arg(long = "detailed-exitcode")]
    pub detailed_exitcode: bool,
    /// Print the plan as JSON on stdout, in Terraform's JSON plan shape with gpuprov's
    /// extras under "gpuprov" (schemas/gpuprov-plan.schema.json)
    #[arg(long, conflicts_with = "markdown")]
    pub json: bool,
    /// Print the plan as Markdown on stdout (for a pull-request comment): a summary, a
    /// table of machines with prices, the hourly cost change and folded attribute diffs
    #[arg(long)]
    pub markdown: bool,
    /// Save the plan to FILE for `gpuprov apply FILE`
    #[arg(long = "out", value_name = "FILE")]
    pub out: Option<PathBuf>,
    /// Plan (and apply) even when a machine to create has no offer on any of its clouds
    /// (no credentials, an API error, nothing matching, everything above the max price);
    /// without it that is an error listing each cloud's reason
    #[arg(long = "allow-no-offers")]
    pub allow_no_offers: bool,
    /// Take the state lock (default true)
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    pub lock: bool,
    #[command(flatten)]
    pub k8s: K8sArgs,
}

#[derive(Debug, Args)]
pub struct ApplyArgs {
    /// A plan saved by `gpuprov plan -out FILE`; refused when the state moved on since
    pub plan_file: Option<PathBuf>,
    /// Apply without asking for confirmation (required without a terminal)
    #[arg(long = "auto-approve")]
    pub auto_approve: bool,
    /// Machines provisioned at once
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u32).range(1..=10_000))]
    pub parallelism: u32,
    /// Plan (and apply) even when a machine to create has no offer on any of its clouds
    /// (no credentials, an API error, nothing matching, everything above the max price);
    /// without it that is an error listing each cloud's reason
    #[arg(long = "allow-no-offers")]
    pub allow_no_offers: bool,
    /// Keep re-planning every 30 s while no offer has capacity, for every machine (as if
    /// each set retry_until_up = true); stop with Ctrl-C
    #[arg(long = "retry-until-up")]
    pub retry_until_up: bool,
    #[command(flatten)]
    pub refresh: RefreshArg,
    #[command(flatten)]
    pub targeting: TargetArgs,
    #[command(flatten)]
    pub k8s: K8sArgs,
}

#[derive(Debug, Args)]
pub struct DestroyArgs {
    /// Destroy without asking for confirmation (required without a terminal)
    #[arg(long = "auto-approve")]
    pub auto_approve: bool,
    /// Machines torn down at once
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u32).range(1..=10_000))]
    pub parallelism: u32,
    /// Destroy only this machine, for example vm.gpu (repeatable), and the machines that
    /// depend on it; for exceptional situations, not for routine use
    #[arg(long = "target", value_name = "ADDRESS")]
    pub targets: Vec<String>,
}

#[derive(Debug, Args)]
pub struct SshArgs {
    /// Machine name as in [vm.NAME]
    #[arg(required_unless_present = "print_config")]
    pub name: Option<String>,
    /// Print this project's ssh config (its Host aliases: gpuprov-PROJECT-NAME, and
    /// gpuprov-NAME while no other project uses it) and the Include line for ~/.ssh/config
    #[arg(long = "print-config", conflicts_with_all = ["name", "command"])]
    pub print_config: bool,
    /// Command to run instead of a shell (after --)
    #[arg(last = true)]
    pub command: Vec<String>,
}

#[derive(Debug, Subcommand)]
pub enum StateCommand {
    /// List the addresses in the state
    List,
    /// Show one resource's recorded state as JSON
    Show {
        /// Address, for example vm.dev
        address: String,
    },
    /// Print the whole state as stored in the backend (JSON)
    Pull,
    /// Replace the backend's state with a state file
    Push(StatePushArgs),
    /// Copy the state from one backend to another, verified, leaving the source as is
    Migrate(StateMigrateArgs),
    /// Forget machines without destroying them: they keep running, and billing
    Rm(StateRmArgs),
    /// Rename a machine in the state, keeping its instance
    Mv(StateMvArgs),
    /// Rebuild a lost state from the machines the clouds report under its lineage
    /// (`gpuprov plan` and `gpuprov sweep` show the lineage), logging in to each and
    /// pinning its host key on first use
    Recover(StateRecoverArgs),
}

#[derive(Debug, Args)]
pub struct StateRecoverArgs {
    /// The lost state's lineage (a UUID), as `gpuprov plan` or `gpuprov sweep` shows it
    #[arg(long)]
    pub lineage: String,
    /// Recover without asking for confirmation (required without a terminal)
    #[arg(long = "auto-approve")]
    pub auto_approve: bool,
    /// Machines taken over at once
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u32).range(1..=10_000))]
    pub parallelism: u32,
}

#[derive(Debug, Args)]
pub struct ImportArgs {
    /// The machine to import into, `vm.NAME` (its `[vm.NAME]` table must be in the config)
    pub address: String,
    /// Where the instance is and its id: `CLOUD/REGION/INSTANCE_ID`, for example
    /// `docker/local/3f2a1b7c9d0e` or `lambda/us-east-1/0920582c7ff041399e34823a0be62549`
    pub id: String,
}

#[derive(Debug, Args)]
pub struct SweepArgs {
    /// Tear down every listed object of this lineage (after confirmation)
    #[arg(long, value_name = "LINEAGE")]
    pub destroy: Option<String>,
    /// Destroy without asking for confirmation (required without a terminal)
    #[arg(long = "auto-approve", requires = "destroy")]
    pub auto_approve: bool,
    /// Print the listing as JSON
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct StateRmArgs {
    /// Addresses to forget, for example vm.gpu
    #[arg(required = true, value_name = "ADDRESS")]
    pub addresses: Vec<String>,
    /// Show what would be forgotten, changing nothing
    #[arg(long = "dry-run")]
    pub dry_run: bool,
    /// Take the state lock (default true)
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    pub lock: bool,
}

#[derive(Debug, Args)]
pub struct StateMvArgs {
    /// The address in the state, for example vm.old
    #[arg(value_name = "SOURCE")]
    pub source: String,
    /// Its new address, for example vm.new (not in the state yet)
    #[arg(value_name = "DESTINATION")]
    pub destination: String,
    /// Show what would be moved, changing nothing
    #[arg(long = "dry-run")]
    pub dry_run: bool,
    /// Take the state lock (default true)
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    pub lock: bool,
}

#[derive(Debug, Args)]
pub struct StatePushArgs {
    /// The state file to push (`-` reads standard input)
    pub file: PathBuf,
    /// Push even when its lineage differs or its serial is not newer
    #[arg(long)]
    pub force: bool,
}

#[derive(Debug, Args)]
pub struct StateMigrateArgs {
    /// The source backend as KEY=VALUE pairs (type=local, path=…); default: the
    /// configured backend
    #[arg(long = "from", value_name = "KEY=VALUE", value_delimiter = ',')]
    pub from: Vec<String>,
    /// The destination backend as KEY=VALUE pairs (type=s3, bucket=…); default: the
    /// configured backend
    #[arg(long = "to", value_name = "KEY=VALUE", value_delimiter = ',')]
    pub to: Vec<String>,
    /// Overwrite a destination state of another lineage or a newer serial
    #[arg(long)]
    pub force: bool,
}

#[derive(Debug, Args)]
pub struct ForceUnlockArgs {
    /// The lock ID printed by the command that failed to take the lock
    pub lock_id: String,
}

/// The whole command line as clap sees it: [`Cli`]'s definitions with the exit-code
/// table as the help's epilogue. The parser, the argv normalisation, completions and the
/// man page all start from here.
pub fn command() -> clap::Command {
    use clap::CommandFactory;
    Cli::command().after_help(super::error::exit_codes_help())
}
