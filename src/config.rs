//! User configuration: `gpuprov.toml`, its validation and its diagnostics.
//!
//! The config is user-written, so unknown keys are rejected (they are typos), and every
//! problem is a [`ConfigError`] diagnostic pointing at the span in the file. The JSON
//! Schema in `schemas/gpuprov.schema.json` is generated from these types
//! ([`json_schema`]) and a test keeps it in sync.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use miette::{Diagnostic, NamedSource, SourceSpan};
use petgraph::algo::tarjan_scc;
use petgraph::graphmap::DiGraphMap;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_spanned::Spanned;

use crate::provider::ResourceRequest;

pub use crate::provider::clouds::registry::{Cloud, CloudTables, CommonSettings};

/// The whole `gpuprov.toml`.
#[derive(Debug, Clone, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(
    title = "gpuprov.toml",
    description = "gpuprov configuration: one [vm.NAME] table per machine"
)]
pub struct ConfigFile {
    /// Settings every `[vm.NAME]` inherits unless it sets its own (`depends_on` excepted).
    #[serde(default)]
    pub defaults: VmSettings,
    /// Per-cloud settings: `[cloud.NAME]`, each cloud's own table (endpoint override,
    /// `keep_shared`, and the keys only that cloud takes).
    #[serde(default)]
    pub cloud: CloudTables,
    /// The machines, by name (lowercase letters, digits and `-`, at most 40 characters).
    #[serde(default)]
    pub vm: BTreeMap<String, VmTable>,
    /// Where the state, its write-ahead journal and its lock live; the local file when
    /// absent.
    #[serde(default)]
    pub backend: Option<BackendSettings>,
    /// Renames recorded in the config, Terraform-style: `[[moved]]` with `from = "vm.a"`
    /// and `to = "vm.b"`. `plan` and `apply` move the state's record before planning, so
    /// the machine is kept instead of destroyed and created again.
    #[serde(default)]
    pub moved: Vec<MovedBlock>,
}

/// One `[[moved]]` block: the machine recorded at `from` is now `to`.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct MovedBlock {
    /// The old address, for example `vm.a` (no longer a machine of the config).
    #[schemars(with = "String")]
    pub from: Spanned<String>,
    /// The new address, for example `vm.b` (a machine of the config).
    #[schemars(with = "String")]
    pub to: Spanned<String>,
}

/// A validated `[[moved]]` block, with where it is written (byte ranges into
/// [`Config::source`]) for diagnostics raised when it meets the state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Moved {
    /// The old address, `vm.NAME`.
    pub from: String,
    /// The new address, `vm.NAME`, a machine of the config.
    pub to: String,
    /// Where `from`'s value is written.
    pub from_span: std::ops::Range<usize>,
    /// Where `to`'s value is written.
    pub to_span: std::ops::Range<usize>,
}

/// The kind of state backend (`[backend] type`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum BackendKind {
    /// A JSON file beside the config (or `path`), locked with an advisory file lock.
    #[default]
    Local,
    /// An object in an S3 bucket (or an S3-compatible store) that enforces conditional
    /// writes (`If-None-Match`, `If-Match`).
    S3,
    /// Rows in a PostgreSQL database; the connection string comes from the environment
    /// (`GPUPROV_PG_CONN_STR`, else `PG_CONN_STR`), never from this file.
    Postgres,
}

impl BackendKind {
    /// The name used in `[backend] type`.
    pub fn as_str(self) -> &'static str {
        match self {
            BackendKind::Local => "local",
            BackendKind::S3 => "s3",
            BackendKind::Postgres => "postgres",
        }
    }
}

/// `[backend]`: where the state lives. One flat table; which keys apply depends on
/// `type` (checked when the backend is opened, naming the key):
///
/// - `local`: `path` (default `gpuprov.state.json` beside the config).
/// - `s3`: `bucket` and `key` (required; the state object's key: the lock is
///   `<key>.lock`, the journal `<key>.journal/`),
///   `region` (else the SDK's region chain), `endpoint` (an S3-compatible store),
///   `force_path_style` (path-style URLs, as MinIO and moto need).
/// - `postgres`: `name` (required; the state's row), `schema` (default `gpuprov`).
///
/// CI overrides any key with `--backend-config KEY=VALUE` or `GPUPROV_BACKEND_CONFIG`.
/// No key holds a secret: credentials come from the SDK's chain or the environment.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct BackendSettings {
    /// `local` (default), `s3` or `postgres`.
    #[serde(rename = "type", default)]
    pub kind: BackendKind,
    /// `local`: the state file.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<PathBuf>,
    /// `s3`: the bucket.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bucket: Option<String>,
    /// `s3`: the state object's key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    /// `s3`: the bucket's region.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub region: Option<String>,
    /// `s3`: the endpoint of an S3-compatible store (`http://127.0.0.1:9000`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub endpoint: Option<String>,
    /// `s3`: address the bucket in the path rather than the host name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub force_path_style: Option<bool>,
    /// `postgres`: the schema holding gpuprov's tables.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub schema: Option<String>,
    /// `postgres`: the state's name (one row per state).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
}

impl BackendSettings {
    /// Returns these settings with one layer of `KEY=VALUE` overrides applied (`type=s3`,
    /// `bucket=…`, `force_path_style=true`); a layer whose `type` differs from these
    /// settings' replaces them rather than merging.
    ///
    /// # Errors
    ///
    /// A message naming the pair: not `KEY=VALUE`, an unknown key, or a value of the
    /// wrong type.
    pub fn with_overrides(&self, pairs: &[String]) -> Result<BackendSettings, String> {
        let mut table = match toml::Table::try_from(self) {
            Ok(t) => t,
            Err(e) => return Err(format!("cannot apply backend overrides: {e}")),
        };
        // Another type starts from scratch: the keys of the table's type do not apply to
        // it (`--backend-config type=local` on an s3 config).
        let new_kind = pairs
            .iter()
            .filter_map(|p| p.split_once('='))
            .find(|(k, _)| k.trim() == "type")
            .map(|(_, v)| v.trim());
        if new_kind.is_some_and(|k| k != self.kind.as_str()) {
            table.clear();
        }
        for pair in pairs {
            let Some((key, value)) = pair.split_once('=') else {
                return Err(format!("backend override {pair:?} is not KEY=VALUE"));
            };
            let key = key.trim();
            let value = value.trim();
            let value = match key {
                "force_path_style" => match value {
                    "true" => toml::Value::Boolean(true),
                    "false" => toml::Value::Boolean(false),
                    _ => {
                        return Err(format!(
                            "backend override {pair:?}: force_path_style is true or false"
                        ))
                    }
                },
                _ => toml::Value::String(value.to_string()),
            };
            table.insert(key.to_string(), value);
        }
        toml::Value::Table(table)
            .try_into()
            .map_err(|e: toml::de::Error| format!("invalid backend override: {}", e.message()))
    }
}

/// Fields shared by `[defaults]` and `[vm.NAME]`; every one is optional.
#[derive(Debug, Clone, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct VmSettings {
    /// Clouds to try, in preference order.
    #[schemars(with = "Option<Vec<Cloud>>")]
    pub clouds: Option<Spanned<Vec<Cloud>>>,
    /// Regions to try, in preference order (cloud-specific names; `local` for docker).
    pub regions: Option<Vec<String>>,
    /// Zones to restrict to, where the cloud has zones.
    pub zones: Option<Vec<String>>,
    /// GPU model, for example `H100`, `A100-80GB`, `L40S`. Omit for no GPU.
    pub gpu: Option<String>,
    /// GPUs per machine (default 1 when `gpu` is set, else 0).
    pub gpu_count: Option<u32>,
    /// Use spot / preemptible capacity.
    pub spot: Option<bool>,
    /// Upper bound on the offer price, USD per hour.
    pub max_price_per_hour: Option<f64>,
    /// Image override (cloud-specific id or name); default: the adapter's GPU-ready image.
    pub image: Option<String>,
    /// Root disk size, GiB.
    pub disk_gb: Option<u32>,
    /// Extra inbound TCP ports besides 22.
    pub ports: Option<Vec<u16>>,
    /// Make the machine a single-node k3s cluster (default true; skipped with a note on
    /// clouds that cannot host it).
    pub kubernetes: Option<bool>,
    /// Keep searching every 30 s when every offer is out of capacity, instead of failing.
    pub retry_until_up: Option<bool>,
    /// Names of machines that must be up before this one is created (not in `[defaults]`).
    #[serde(default)]
    #[schemars(with = "Vec<String>")]
    pub depends_on: Vec<Spanned<String>>,
}

/// `[vm.NAME]`: one machine. The same keys as `[defaults]` (no flattening: serde's
/// flatten would lose the spans diagnostics point at).
pub type VmTable = VmSettings;

/// One machine's effective settings: its table merged over `[defaults]`.
///
/// This is also the "desired" snapshot recorded in the state when applied, so its
/// serialized field names are part of the state format.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct VmSpec {
    pub name: String,
    pub clouds: Vec<Cloud>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub regions: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub zones: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu: Option<String>,
    #[serde(default)]
    pub gpu_count: u32,
    #[serde(default)]
    pub spot: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_price_per_hour: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disk_gb: Option<u32>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ports: Vec<u16>,
    /// Whether k3s is wanted (after defaults; the cloud may still skip it).
    #[serde(default)]
    pub kubernetes: bool,
    #[serde(default)]
    pub retry_until_up: bool,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub depends_on: Vec<String>,
    /// Whether `kubernetes = true` was written explicitly (a cloud that cannot host k3s
    /// then rejects the machine up front instead of skipping with a note).
    #[serde(skip)]
    pub kubernetes_explicit: bool,
}

impl VmSpec {
    /// The offer-search input for this machine.
    pub fn request(&self) -> ResourceRequest {
        ResourceRequest {
            vm_name: self.name.clone(),
            regions: self.regions.clone(),
            zones: self.zones.clone(),
            gpu: self.gpu.clone(),
            gpu_count: self.gpu_count,
            spot: self.spot,
            max_price_per_hour: self.max_price_per_hour,
            gpu_count_at_least: false,
        }
    }

    /// The attributes whose change forces the machine to be replaced (destroy, then
    /// create), as `(name, rendered value)` pairs in display order.
    pub fn replace_attributes(&self) -> Vec<(&'static str, String)> {
        let list = |v: &[String]| format!("{v:?}");
        vec![
            (
                "clouds",
                format!(
                    "{:?}",
                    self.clouds.iter().map(|c| c.as_str()).collect::<Vec<_>>()
                ),
            ),
            ("regions", list(&self.regions)),
            ("zones", list(&self.zones)),
            ("gpu", opt(&self.gpu)),
            ("gpu_count", self.gpu_count.to_string()),
            ("spot", self.spot.to_string()),
            ("image", opt(&self.image)),
            (
                "disk_gb",
                self.disk_gb
                    .map(|d| d.to_string())
                    .unwrap_or_else(|| "(default)".into()),
            ),
            ("ports", format!("{:?}", self.ports)),
        ]
    }

    /// Whether `other` has the same value for every attribute of
    /// [`VmSpec::replace_attributes`] and [`VmSpec::in_place_attributes`] (the name and
    /// whether `kubernetes` was written explicitly are not attributes). Costs no
    /// formatting, unlike comparing the rendered attributes.
    pub fn same_attributes(&self, other: &VmSpec) -> bool {
        // Destructured in full so that a new field cannot be forgotten here.
        let VmSpec {
            name: _,
            clouds,
            regions,
            zones,
            gpu,
            gpu_count,
            spot,
            max_price_per_hour,
            image,
            disk_gb,
            ports,
            kubernetes,
            retry_until_up,
            depends_on,
            kubernetes_explicit: _,
        } = self;
        *clouds == other.clouds
            && *regions == other.regions
            && *zones == other.zones
            && *gpu == other.gpu
            && *gpu_count == other.gpu_count
            && *spot == other.spot
            && *max_price_per_hour == other.max_price_per_hour
            && *image == other.image
            && *disk_gb == other.disk_gb
            && *ports == other.ports
            && *kubernetes == other.kubernetes
            && *retry_until_up == other.retry_until_up
            && *depends_on == other.depends_on
    }

    /// The attributes that can change without touching the machine.
    pub fn in_place_attributes(&self) -> Vec<(&'static str, String)> {
        vec![
            (
                "max_price_per_hour",
                self.max_price_per_hour
                    .map(|p| format!("{p}"))
                    .unwrap_or_else(|| "(none)".into()),
            ),
            ("kubernetes", self.kubernetes.to_string()),
            ("retry_until_up", self.retry_until_up.to_string()),
            ("depends_on", format!("{:?}", self.depends_on)),
        ]
    }
}

fn opt(v: &Option<String>) -> String {
    match v {
        Some(s) => format!("{s:?}"),
        None => "(default)".into(),
    }
}

/// A loaded, validated config.
#[derive(Debug, Clone)]
pub struct Config {
    /// The file it was read from.
    pub path: PathBuf,
    /// Machines in name order.
    pub vms: BTreeMap<String, VmSpec>,
    /// The `[cloud.NAME]` tables (the core reads them through [`CloudTables::common`]).
    pub clouds: CloudTables,
    /// The `[backend]` table, if any.
    pub backend: Option<BackendSettings>,
    /// The `[[moved]]` blocks, in file order.
    pub moved: Vec<Moved>,
    /// The file's text, kept for diagnostics raised after loading.
    pub source: String,
}

/// A problem in `gpuprov.toml`, with the span it concerns.
#[derive(Debug, thiserror::Error, Diagnostic)]
#[error("{message}")]
#[diagnostic(code(gpuprov::config))]
pub struct ConfigError {
    pub message: String,
    #[source_code]
    pub src: NamedSource<String>,
    #[label("{label}")]
    pub span: Option<SourceSpan>,
    pub label: String,
    #[help]
    pub help: Option<String>,
}

/// Why a config could not be read at all.
#[derive(Debug, thiserror::Error, Diagnostic)]
pub enum LoadError {
    #[error("cannot read config file {path}")]
    #[diagnostic(
        code(gpuprov::config::read),
        help("check the path: -c PATH (or GPUPROV_CONFIG) names the config; without either it is gpuprov.toml in the current directory")
    )]
    Read {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    #[diagnostic(transparent)]
    Invalid(Box<ConfigError>),
}

impl Config {
    /// Reads and validates the config at `path`.
    ///
    /// Errors: [`LoadError::Read`] when the file cannot be read; [`LoadError::Invalid`] for
    /// TOML syntax, unknown keys, wrong types, unknown clouds, bad values, and
    /// `depends_on` references that dangle or form a cycle.
    pub fn load(path: &Path) -> Result<Config, LoadError> {
        let text = std::fs::read_to_string(path).map_err(|source| LoadError::Read {
            path: path.display().to_string(),
            source,
        })?;
        Config::parse(path, text).map_err(LoadError::Invalid)
    }

    /// Parses and validates config text; `path` names it in diagnostics.
    pub fn parse(path: &Path, text: String) -> Result<Config, Box<ConfigError>> {
        let reporter = Reporter {
            name: path.display().to_string(),
            text: &text,
        };
        let err = |message, span, label: &str, help| reporter.err(message, span, label, help);
        let file: ConfigFile = match toml::from_str(&text) {
            Ok(f) => f,
            Err(e) => {
                let msg = e.message().to_string();
                if let Some(cloud_err) = cloud_key_error(&text, &msg, e.span(), &reporter) {
                    return Err(cloud_err);
                }
                let help = if msg.contains("unknown field") {
                    Some(
                        "see schemas/gpuprov.schema.json for every key; keys are snake_case"
                            .to_string(),
                    )
                } else if msg.contains("unknown variant") {
                    Some(format!("known clouds: {}", Cloud::known_names()))
                } else {
                    None
                };
                return Err(err(
                    format!("invalid config: {msg}"),
                    e.span(),
                    "here",
                    help,
                ));
            }
        };
        if let Some(d) = file.defaults.depends_on.first() {
            return Err(err(
                "depends_on cannot be set in [defaults]".into(),
                Some(d.span()),
                "here",
                Some("set depends_on in the [vm.NAME] tables that need it".into()),
            ));
        }
        if file.vm.is_empty() {
            return Err(err(
                "the config defines no machine".into(),
                None,
                "",
                Some("add a [vm.NAME] table; see examples/docker.toml".into()),
            ));
        }
        let mut vms = BTreeMap::new();
        for (name, table) in &file.vm {
            // Located only when reporting: searching the text per machine is O(N²).
            let key_span = || find_vm_header(&text, name);
            if !valid_vm_name(name) {
                return Err(err(
                    format!("invalid machine name {name:?}"),
                    key_span(),
                    "this name",
                    Some("use 1 to 40 lowercase letters, digits and '-', starting with a letter (it becomes part of cloud resource names and DNS labels)".into()),
                ));
            }
            let spec = merge(name, &file.defaults, table, &reporter)?;
            vms.insert(name.clone(), spec);
        }
        // depends_on: dangling references, then cycles.
        for (name, table) in &file.vm {
            for dep in &table.depends_on {
                if !file.vm.contains_key(dep.get_ref()) {
                    return Err(err(
                        format!(
                            "vm.{name} depends on {:?}, which is not defined",
                            dep.get_ref()
                        ),
                        Some(dep.span()),
                        "unknown machine",
                        Some(format!(
                            "defined machines: {}",
                            file.vm.keys().cloned().collect::<Vec<_>>().join(", ")
                        )),
                    ));
                }
                if dep.get_ref() == name {
                    return Err(err(
                        format!("vm.{name} depends on itself"),
                        Some(dep.span()),
                        "self-reference",
                        None,
                    ));
                }
            }
        }
        if let Some(cycle) = find_cycle(&vms) {
            // Point at the first edge of the cycle.
            let (from, to) = (&cycle[0], &cycle[1 % cycle.len()]);
            let span = file.vm[from]
                .depends_on
                .iter()
                .find(|d| d.get_ref() == to)
                .map(|d| d.span());
            return Err(err(
                format!(
                    "depends_on forms a cycle: {}",
                    cycle
                        .iter()
                        .chain(std::iter::once(&cycle[0]))
                        .map(|s| s.as_str())
                        .collect::<Vec<_>>()
                        .join(" -> ")
                ),
                span,
                "this edge closes the cycle",
                Some("remove one of these depends_on entries".into()),
            ));
        }
        if let Some(span) = interpolation_span(&text) {
            return Err(err(
                "a string holds `${...}`, which gpuprov.toml does not interpolate".into(),
                Some(span),
                "taken literally",
                Some("TOML has no variables or expressions: write the value itself (Terraform's `${var.x}` has no equivalent here)".into()),
            ));
        }
        let moved = check_moved(&file.moved, &vms, &reporter)?;
        Ok(Config {
            path: path.to_path_buf(),
            vms,
            clouds: file.cloud,
            backend: file.backend,
            moved,
            source: text,
        })
    }

    /// Every cloud some machine may use, in first-use order.
    pub fn clouds_in_use(&self) -> Vec<Cloud> {
        let mut out = Vec::new();
        for vm in self.vms.values() {
            for c in &vm.clouds {
                if !out.contains(c) {
                    out.push(*c);
                }
            }
        }
        out
    }

    /// A diagnostic pointing at `span` (a byte range into the config text), raised after
    /// loading: a `[[moved]]` block that conflicts with the state, say.
    pub fn error_at(
        &self,
        span: std::ops::Range<usize>,
        label: &str,
        message: String,
        help: Option<String>,
    ) -> ConfigError {
        ConfigError {
            message,
            src: NamedSource::new(self.path.display().to_string(), self.source.clone()),
            span: Some(SourceSpan::from(span)),
            label: label.into(),
            help,
        }
    }

    /// A diagnostic about machine `vm`'s `key` raised after loading (for example `zones`
    /// on clouds without zones), pointing at the value it gets (its table's, else
    /// `[defaults]`'s), else at its table header.
    pub fn key_error(
        &self,
        vm: &str,
        key: &str,
        message: String,
        help: Option<String>,
    ) -> ConfigError {
        let span = key_span(&self.source, vm, key).or_else(|| find_vm_header(&self.source, vm));
        ConfigError {
            message,
            src: NamedSource::new(self.path.display().to_string(), self.source.clone()),
            span: span.map(|r| SourceSpan::from(r.start..r.end)),
            label: "here".into(),
            help,
        }
    }

    /// A diagnostic about machine `vm` raised after loading (for example a cloud that
    /// rejects what it asks for), pointing at its table header.
    pub fn vm_error(&self, vm: &str, message: String, help: Option<String>) -> ConfigError {
        ConfigError {
            message,
            src: NamedSource::new(self.path.display().to_string(), self.source.clone()),
            span: find_vm_header(&self.source, vm).map(|r| SourceSpan::from(r.start..r.end)),
            label: "this machine".into(),
            help,
        }
    }
}

/// Builds diagnostics into one config file's text.
struct Reporter<'a> {
    name: String,
    text: &'a str,
}

impl Reporter<'_> {
    fn err(
        &self,
        message: String,
        span: Option<std::ops::Range<usize>>,
        label: &str,
        help: Option<String>,
    ) -> Box<ConfigError> {
        // Without a span miette shows no snippet, so nothing would say which file is
        // wrong: the message names it instead.
        let message = match span {
            Some(_) => message,
            None => format!("{}: {message}", self.name),
        };
        Box::new(ConfigError {
            message,
            src: NamedSource::new(self.name.clone(), self.text.to_string()),
            span: span.map(|r| SourceSpan::from(r.start..r.end.max(r.start))),
            label: label.to_string(),
            help,
        })
    }
}

fn merge(
    name: &str,
    d: &VmSettings,
    t: &VmTable,
    r: &Reporter<'_>,
) -> Result<VmSpec, Box<ConfigError>> {
    let s = t;
    let err = |message, span, label: &str, help| r.err(message, span, label, help);
    // Located only when reporting: searching the text per machine is O(N²).
    let header = || find_vm_header(r.text, name);
    let clouds = s.clouds.as_ref().or(d.clouds.as_ref());
    let clouds = match clouds {
        Some(c) if c.get_ref().is_empty() => {
            return Err(err(
                format!("vm.{name}: clouds is empty"),
                Some(c.span()),
                "empty list",
                Some("list at least one cloud, for example clouds = [\"docker\"]".into()),
            ))
        }
        Some(c) => {
            let mut seen = Vec::new();
            for cl in c.get_ref() {
                if seen.contains(cl) {
                    return Err(err(
                        format!("vm.{name}: cloud {cl} is listed twice"),
                        Some(c.span()),
                        "duplicate",
                        None,
                    ));
                }
                seen.push(*cl);
            }
            seen
        }
        None => {
            return Err(err(
                format!("vm.{name} names no cloud"),
                header(),
                "no clouds here or in [defaults]",
                Some(
                    "set clouds = [\"docker\"] (or another cloud) in [vm.NAME] or [defaults]"
                        .into(),
                ),
            ))
        }
    };
    let gpu = s.gpu.clone().or_else(|| d.gpu.clone());
    let gpu_count = s
        .gpu_count
        .or(d.gpu_count)
        .unwrap_or(if gpu.is_some() { 1 } else { 0 });
    if gpu_count > 0 && gpu.is_none() {
        return Err(err(
            format!("vm.{name}: gpu_count = {gpu_count} but no gpu model is set"),
            key_span(r.text, name, "gpu_count").or_else(header),
            "here",
            Some("set gpu = \"H100\" (or another model)".into()),
        ));
    }
    if gpu.is_some() && gpu_count == 0 {
        return Err(err(
            format!("vm.{name}: gpu is set but gpu_count = 0"),
            key_span(r.text, name, "gpu_count").or_else(header),
            "here",
            None,
        ));
    }
    let max_price = s.max_price_per_hour.or(d.max_price_per_hour);
    if let Some(p) = max_price {
        if !(p.is_finite() && p > 0.0) {
            return Err(err(format!("vm.{name}: max_price_per_hour must be a positive number of USD per hour, got {p}"), key_span(r.text, name, "max_price_per_hour").or_else(header), "here", None));
        }
    }
    let disk_gb = s.disk_gb.or(d.disk_gb);
    if disk_gb == Some(0) {
        return Err(err(
            format!("vm.{name}: disk_gb must be at least 1 GiB"),
            key_span(r.text, name, "disk_gb").or_else(header),
            "here",
            None,
        ));
    }
    let ports = s
        .ports
        .clone()
        .or_else(|| d.ports.clone())
        .unwrap_or_default();
    if let Some(p) = ports.iter().find(|p| **p == 0 || **p == 22) {
        return Err(err(
            format!("vm.{name}: port {p} cannot be listed in ports"),
            key_span(r.text, name, "ports").or_else(header),
            "here",
            Some("ports lists extra inbound TCP ports (1-65535); 22 is always open".into()),
        ));
    }
    if let Some(p) = ports
        .iter()
        .enumerate()
        .find(|(i, p)| ports[..*i].contains(p))
        .map(|(_, p)| p)
    {
        return Err(err(
            format!("vm.{name}: port {p} is listed twice in ports"),
            key_span(r.text, name, "ports").or_else(header),
            "here",
            Some("list each port once".into()),
        ));
    }
    if let Some((_, dup)) = t.depends_on.iter().enumerate().find(|(i, d)| {
        t.depends_on[..*i]
            .iter()
            .any(|e| e.get_ref() == d.get_ref())
    }) {
        return Err(err(
            format!("vm.{name}: depends_on lists {:?} twice", dup.get_ref()),
            Some(dup.span()),
            "again here",
            Some("list each machine once".into()),
        ));
    }
    Ok(VmSpec {
        name: name.to_string(),
        clouds,
        regions: s
            .regions
            .clone()
            .or_else(|| d.regions.clone())
            .unwrap_or_default(),
        zones: s
            .zones
            .clone()
            .or_else(|| d.zones.clone())
            .unwrap_or_default(),
        gpu,
        gpu_count,
        spot: s.spot.or(d.spot).unwrap_or(false),
        max_price_per_hour: max_price,
        image: s.image.clone().or_else(|| d.image.clone()),
        disk_gb,
        ports,
        kubernetes: s.kubernetes.or(d.kubernetes).unwrap_or(true),
        kubernetes_explicit: s.kubernetes.or(d.kubernetes) == Some(true),
        retry_until_up: s.retry_until_up.or(d.retry_until_up).unwrap_or(false),
        depends_on: t.depends_on.iter().map(|d| d.get_ref().clone()).collect(),
    })
}

/// Checks the `[[moved]]` blocks: both addresses are `vm.NAME` with valid names and
/// differ, `to` is a machine of the config and `from` is not, and no address is moved
/// from twice.
fn check_moved(
    blocks: &[MovedBlock],
    vms: &BTreeMap<String, VmSpec>,
    r: &Reporter<'_>,
) -> Result<Vec<Moved>, Box<ConfigError>> {
    let err = |message, span, label: &str, help| r.err(message, span, label, help);
    let mut out: Vec<Moved> = Vec::new();
    for b in blocks {
        for end in [&b.from, &b.to] {
            let ok = end.get_ref().strip_prefix("vm.").is_some_and(valid_vm_name);
            if !ok {
                return Err(err(
                    format!("moved: {:?} is not a machine address", end.get_ref()),
                    Some(end.span()),
                    "expected vm.NAME",
                    Some("addresses are vm.NAME, as in `gpuprov state list`".into()),
                ));
            }
        }
        let (from, to) = (b.from.get_ref(), b.to.get_ref());
        if from == to {
            return Err(err(
                format!("moved: from and to are both {from}"),
                Some(b.to.span()),
                "same address",
                None,
            ));
        }
        let defined = || {
            Some(format!(
                "machines in the config: {}",
                vms.keys()
                    .map(|n| format!("vm.{n}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            ))
        };
        if !vms.contains_key(&to["vm.".len()..]) {
            return Err(err(
                format!("moved: {to} is not a machine of the config"),
                Some(b.to.span()),
                "no [vm] table of this name",
                defined(),
            ));
        }
        if vms.contains_key(&from["vm.".len()..]) {
            return Err(err(
                format!("moved: {from} is still a machine of the config"),
                Some(b.from.span()),
                "still defined",
                Some(format!(
                    "remove [{from}] (it was renamed to {to}), or drop this moved block"
                )),
            ));
        }
        if out.iter().any(|m| m.from == *from) {
            return Err(err(
                format!("moved: {from} is moved more than once"),
                Some(b.from.span()),
                "moved again here",
                Some("keep one moved block per old address".into()),
            ));
        }
        out.push(Moved {
            from: from.clone(),
            to: to.clone(),
            from_span: b.from.span(),
            to_span: b.to.span(),
        });
    }
    Ok(out)
}

/// Whether `name` is a valid machine name: `[a-z][a-z0-9-]{0,39}`, not ending in `-`.
pub fn valid_vm_name(name: &str) -> bool {
    let b = name.as_bytes();
    !b.is_empty()
        && b.len() <= 40
        && b[0].is_ascii_lowercase()
        && !name.ends_with('-')
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
}

/// Finds the value of `key` as machine `name` gets it: in its `[vm.NAME]` table, else in
/// `[defaults]` (where an inherited value comes from). Spans of values checked after
/// merging, which serde cannot give.
fn key_span(text: &str, name: &str, key: &str) -> Option<std::ops::Range<usize>> {
    let in_table = |header: &str| -> Option<std::ops::Range<usize>> {
        let start = text.find(header)? + header.len();
        let end = text[start..]
            .find("\n[")
            .map(|i| start + i)
            .unwrap_or(text.len());
        let mut offset = start;
        for line in text[start..end].split_inclusive('\n') {
            let trimmed = line.trim_start();
            if let Some(rest) = trimmed.strip_prefix(key) {
                if let Some(value) = rest.trim_start().strip_prefix('=') {
                    let value = value.trim();
                    let value = value.split(" #").next().unwrap_or(value).trim_end();
                    let at = offset + line.find(value).unwrap_or(0);
                    return Some(at..at + value.len());
                }
            }
            offset += line.len();
        }
        None
    };
    in_table(&format!("[vm.{name}]")).or_else(|| in_table("[defaults]"))
}

/// The span of the first string value (or key) holding `${`: Terraform-style
/// interpolation, which TOML takes literally, so such a value would reach a cloud as
/// written. Comments are not values, so they may hold it. Read through toml's own
/// spanned parser; `None` when the text does not parse (serde reported that already).
fn interpolation_span(text: &str) -> Option<std::ops::Range<usize>> {
    use toml::de::{DeTable, DeValue};
    fn in_value(v: &toml::Spanned<DeValue<'_>>) -> Option<std::ops::Range<usize>> {
        match v.get_ref() {
            DeValue::String(s) if s.contains("${") => Some(v.span()),
            DeValue::Array(items) => items.iter().find_map(in_value),
            DeValue::Table(t) => in_table(t),
            _ => None,
        }
    }
    fn in_table(t: &DeTable<'_>) -> Option<std::ops::Range<usize>> {
        t.iter().find_map(|(k, v)| {
            if k.get_ref().contains("${") {
                Some(k.span())
            } else {
                in_value(v)
            }
        })
    }
    if !text.contains("${") {
        return None;
    }
    let table = DeTable::parse(text).ok()?;
    in_table(table.get_ref())
}

/// The diagnostic of an unknown key under `[cloud]` (serde's "unknown field" at `span`):
/// an unknown cloud (`[cloud.nimbus]`), with the known clouds, or a key the cloud does not
/// take (`[cloud.lambda] project`), naming the cloud, its keys and the clouds that take
/// the key. `None` for any other error.
fn cloud_key_error(
    text: &str,
    msg: &str,
    span: Option<std::ops::Range<usize>>,
    r: &Reporter<'_>,
) -> Option<Box<ConfigError>> {
    if !msg.contains("unknown field") {
        return None;
    }
    let path = key_path_at(text, span.clone()?)?;
    match path.as_slice() {
        [top, name] if top == "cloud" => Some(r.err(
            format!("invalid config: unknown cloud `{name}` in [cloud.{name}]"),
            span,
            "unknown cloud",
            Some(format!("known clouds: {}", Cloud::known_names())),
        )),
        [top, name, key] if top == "cloud" => {
            let cloud = Cloud::from_name(name)?;
            let takers: Vec<String> = Cloud::ALL
                .iter()
                .filter(|c| c.settings_keys().contains(&key.as_str()))
                .map(|c| format!("[cloud.{c}]"))
                .collect();
            let own = format!(
                "[cloud.{cloud}] takes {}",
                cloud
                    .settings_keys()
                    .iter()
                    .map(|k| format!("`{k}`"))
                    .collect::<Vec<_>>()
                    .join(", ")
            );
            let help = if takers.is_empty() {
                format!("{own}; see schemas/gpuprov.schema.json for every key")
            } else {
                format!("{own}; `{key}` is a key of {} only", takers.join(", "))
            };
            Some(r.err(
                format!("invalid config: [cloud.{cloud}] has no key `{key}`"),
                span,
                &format!("not a key of {cloud}"),
                Some(help),
            ))
        }
        _ => None,
    }
}

/// The dotted path of the key written at `span` (`["cloud", "lambda", "project"]`),
/// however the tables are written (headers, dotted keys, inline tables). Read through
/// toml's own spanned parser; `None` when the text does not parse or no key is there.
fn key_path_at(text: &str, span: std::ops::Range<usize>) -> Option<Vec<String>> {
    use toml::de::{DeTable, DeValue};
    fn in_table(t: &DeTable<'_>, span: &std::ops::Range<usize>, path: &mut Vec<String>) -> bool {
        for (k, v) in t.iter() {
            path.push(k.get_ref().to_string());
            if k.span() == *span {
                return true;
            }
            if let DeValue::Table(inner) = v.get_ref() {
                if in_table(inner, span, path) {
                    return true;
                }
            }
            path.pop();
        }
        false
    }
    let table = DeTable::parse(text).ok()?;
    let mut path = Vec::new();
    in_table(table.get_ref(), &span, &mut path).then_some(path)
}

/// Finds the `[vm.NAME]` header (or a dotted `vm.NAME` key) in the text, for spans that
/// serde cannot give (map keys).
fn find_vm_header(text: &str, name: &str) -> Option<std::ops::Range<usize>> {
    for pat in [
        format!("[vm.{name}]"),
        format!("[vm.\"{name}\"]"),
        format!("vm.{name}"),
    ] {
        if let Some(i) = text.find(&pat) {
            return Some(i..i + pat.len());
        }
    }
    None
}

/// The JSON Schema of `gpuprov.toml`, as committed in `schemas/gpuprov.schema.json`.
pub fn json_schema() -> String {
    let schema = schemars::schema_for!(ConfigFile);
    let mut s = serde_json::to_string_pretty(&schema).expect("schema serializes");
    s.push('\n');
    s
}

impl VmSpec {
    /// A machine named `name` on `clouds` with every other setting at its default
    /// (as if its table set nothing else): for tests and programmatic use.
    pub fn new(name: &str, clouds: Vec<Cloud>) -> VmSpec {
        VmSpec {
            name: name.into(),
            clouds,
            regions: vec![],
            zones: vec![],
            gpu: None,
            gpu_count: 0,
            spot: false,
            max_price_per_hour: None,
            image: None,
            disk_gb: None,
            ports: vec![],
            kubernetes: true,
            retry_until_up: false,
            depends_on: vec![],
            kubernetes_explicit: false,
        }
    }
}

/// Finds a `depends_on` cycle, returned as the machine names along it (`a` depends on
/// `b` ... depends on `a`), starting from the alphabetically first; `None` when acyclic.
fn find_cycle(vms: &BTreeMap<String, VmSpec>) -> Option<Vec<String>> {
    // Only machines with dependencies can be on a cycle: a fleet without any builds no
    // graph.
    let mut g: DiGraphMap<&str, ()> = DiGraphMap::new();
    for (name, vm) in vms.iter().filter(|(_, vm)| !vm.depends_on.is_empty()) {
        for d in &vm.depends_on {
            g.add_edge(name.as_str(), d.as_str(), ());
        }
    }
    let scc = tarjan_scc(&g)
        .into_iter()
        .filter(|c| c.len() > 1)
        .min_by_key(|c| c.iter().min().copied())?;
    let start = *scc.iter().min()?;
    // Walk inside the component, always to the smallest successor in it, until a repeat.
    let mut path = vec![start];
    loop {
        let cur = *path.last()?;
        let mut next: Vec<&str> = g.neighbors(cur).filter(|n| scc.contains(n)).collect();
        next.sort();
        let n = *next.first()?;
        if let Some(i) = path.iter().position(|p| *p == n) {
            return Some(path[i..].iter().map(|s| s.to_string()).collect());
        }
        path.push(n);
    }
}
