//! Bad-input properties (issue 6): no input makes gpuprov panic, overwrite or half-write
//! anything.
//!
//! Each property runs a bounded number of proptest cases (see `cases` in each test), keeps
//! its shrunk failures in `proptest-regressions/properties/<name>.txt` (replayed first on
//! every run), prints `properties: <name> <N> cases` to stderr and writes the figures to
//! `<target>/properties/<name>.json` for the RELIABILITY.md generator.
//!
//! Run: `cargo nextest run --locked -E 'test(properties::)'`.
//! `GPUPROV_PROPTEST_SCALE=N` multiplies every case count (for a longer local soak).
//!
//! Nothing here dials a non-loopback address: the REST adapters talk to a wiremock server
//! on 127.0.0.1, and the CLI property points the docker cloud at a socket that does not
//! exist (and only ever runs `apply` on plans it predicts are refused or change nothing).

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::{TimeZone, Utc};
use gpuprov::config::{Config, VmSpec};
use gpuprov::plan::{Plan, PLAN_FORMAT_VERSION};
use gpuprov::provider::clouds::digitalocean::{
    DigitalOceanProvider, DigitalOceanSettings, RateHeaders, Token,
};
use gpuprov::provider::clouds::gcp::auth::{GoogleCredential, Kind as GoogleKind};
use gpuprov::provider::clouds::gcp::{self, GcpProvider, GcpSettings};
use gpuprov::provider::clouds::hyperstack::{HyperstackProvider, HyperstackSettings};
use gpuprov::provider::clouds::lambda::{LambdaProvider, LambdaSettings};
use gpuprov::provider::clouds::runpod::{RunpodProvider, RunpodSettings};
use gpuprov::provider::clouds::{digitalocean, hyperstack, lambda, runpod};
use gpuprov::provider::{CloudProvider, ErrorKind, Location, ProviderError, ResourceRequest};
use gpuprov::state::{
    journal_path, JournalOp, MachineRecord, ResourceRecord, StateFile, StateStore,
    STATE_FORMAT_VERSION,
};
use proptest::prelude::*;
use proptest::sample::Index;
use proptest::test_runner::{Config as PtConfig, FileFailurePersistence, TestRunner};
use serde_json::{json, Value};
use tempfile::TempDir;

// ---------------------------------------------------------------------------------------
// Harness: bounded runner, per-property regression file, case counts and summary file.
// ---------------------------------------------------------------------------------------

/// Extra figures a property reports beside its case count (for example how many inputs
/// were accepted and how many refused).
#[derive(Default)]
struct Tally(std::sync::Mutex<BTreeMap<&'static str, u64>>);

impl Tally {
    fn add(&self, what: &'static str) {
        *self
            .0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(what)
            .or_default() += 1;
    }
    fn snapshot(&self) -> BTreeMap<&'static str, u64> {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

fn scale() -> u32 {
    std::env::var("GPUPROV_PROPTEST_SCALE")
        .ok()
        .and_then(|s| s.parse::<u32>().ok())
        .filter(|n| *n > 0)
        .unwrap_or(1)
}

/// The cargo target directory (`CARGO_TARGET_TMPDIR` is `<target>/tmp`).
fn target_dir() -> PathBuf {
    let tmp = Path::new(env!("CARGO_TARGET_TMPDIR"));
    tmp.parent()
        .map(Path::to_path_buf)
        .unwrap_or_else(|| tmp.to_path_buf())
}

/// Writes `<target>/properties/<name>.json` and prints the one-line summary.
fn report(name: &str, cases: u64, seconds: f64, passed: bool, tally: &Tally) {
    let extra = tally.snapshot();
    let mut line = format!("properties: {name} {cases} cases ({seconds:.1}s)");
    for (k, v) in &extra {
        line.push_str(&format!(", {k} {v}"));
    }
    eprintln!("{line}");
    let summary = json!({
        "property": name,
        "cases": cases,
        "passed": passed,
        "seconds": (seconds * 10.0).round() / 10.0,
        "outcomes": extra,
    });
    let dir = target_dir().join("properties");
    if fs::create_dir_all(&dir).is_ok() {
        let _ = fs::write(
            dir.join(format!("{name}.json")),
            serde_json::to_string_pretty(&summary).unwrap_or_default() + "\n",
        );
    }
}

/// Runs `test` on `cases` inputs of `strategy` (times [`scale`]), with the regression
/// file `proptest-regressions/properties/<name>.txt`; panics with the shrunk input on
/// failure. `test` gets the input and a [`Tally`] for extra figures.
fn check<S, F>(name: &'static str, cases: u32, strategy: S, test: F)
where
    S: Strategy,
    S::Value: std::fmt::Debug,
    F: Fn(S::Value, &Tally) -> Result<(), TestCaseError>,
{
    let path: &'static str = Box::leak(
        format!(
            "{}/proptest-regressions/properties/{name}.txt",
            env!("CARGO_MANIFEST_DIR")
        )
        .into_boxed_str(),
    );
    let config = PtConfig {
        cases: cases * scale(),
        max_shrink_iters: 512,
        failure_persistence: Some(Box::new(FileFailurePersistence::Direct(path))),
        source_file: Some(file!()),
        ..PtConfig::default()
    };
    let count = AtomicU64::new(0);
    let tally = Tally::default();
    let started = Instant::now();
    let mut runner = TestRunner::new(config);
    let result = runner.run(&strategy, |v| {
        count.fetch_add(1, Ordering::Relaxed);
        test(v, &tally)
    });
    report(
        name,
        count.load(Ordering::Relaxed),
        started.elapsed().as_secs_f64(),
        result.is_ok(),
        &tally,
    );
    if let Err(e) = result {
        panic!("property {name} failed: {e}");
    }
}

/// The names in `dir` (sorted).
fn listing(dir: &Path) -> BTreeSet<String> {
    fs::read_dir(dir)
        .map(|rd| {
            rd.filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default()
}

/// A miette diagnostic rendered as the CLI renders it (`{:?}` of a `Report`).
fn render(d: impl miette::Diagnostic + Send + Sync + 'static) -> String {
    format!("{:?}", miette::Report::new(d))
}

// ---------------------------------------------------------------------------------------
// Generic input strategies.
// ---------------------------------------------------------------------------------------

/// Key names the loaders and adapters know, so random JSON hits real code paths.
const KEYS: &[&str] = &[
    "version",
    "serial",
    "lineage",
    "gpuprov_version",
    "resources",
    "machine",
    "kind",
    "state",
    "label",
    "updated_at",
    "desired",
    "events",
    "at",
    "name",
    "clouds",
    "regions",
    "data",
    "error",
    "code",
    "message",
    "suggestion",
    "id",
    "status",
    "instances",
    "ip",
    "region",
    "instance_type",
    "pods",
    "droplets",
    "sizes",
    "links",
    "pages",
    "next",
    "flavors",
    "stocks",
    "title",
    "detail",
    "errors",
    "error_reason",
    "networks",
    "v4",
    "ports",
    "publicIp",
    "portMappings",
    "desiredStatus",
    "env",
    "tags",
    "labels",
    "gpu_info",
    "available",
    "slug",
    "price_hourly",
    "gpuTypes",
    "lowestPrice",
    "stockStatus",
    "dataCenterId",
    "floating_ip",
    "floating_ip_status",
    "vm_name",
    "price_cents_per_hour",
    "instance_types_with_capacity_available",
    "specs",
    "gpus",
    "gpu_description",
    "description",
    "format_version",
    "changes",
    "address",
    "vm",
    "action",
    "config_sha256",
    "refreshed",
    "hourly_cost_after",
    "hourly_cost_incomplete",
    "offers",
    "price_per_hour",
    "depends_on",
    "x",
    "",
];

fn json_key() -> impl Strategy<Value = String> {
    prop_oneof![
        4 => proptest::sample::select(KEYS).prop_map(str::to_string),
        1 => ".{0,12}",
    ]
}

fn json_leaf() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        any::<f64>()
            .prop_filter("finite", |f| f.is_finite())
            .prop_map(Value::from),
        proptest::sample::select(
            &[
                "ACTIVE",
                "active",
                "running",
                "RUNNING",
                "booting",
                "terminated",
                "EXITED",
                "new",
                "off",
                "archive",
                "ERROR",
                "HIBERNATED",
                "weird-status",
                "",
                "null",
                "0f0e0d0c-1111-4222-8333-444455556666",
                "2024-01-01T00:00:00Z",
                "vm.dev",
                "launch",
                "teardown",
                "create",
                "no_op",
                "destroy",
                "docker",
                "local",
                "127.0.0.1",
                "../..",
            ][..]
        )
        .prop_map(Value::from),
        ".{0,16}".prop_map(Value::from),
    ]
}

/// Arbitrary JSON, objects keyed mostly by names the code knows.
fn json_value() -> impl Strategy<Value = Value> {
    json_leaf().prop_recursive(4, 48, 6, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            proptest::collection::btree_map(json_key(), inner, 0..6)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

/// One edit of a JSON document.
#[derive(Debug, Clone)]
enum JsonEdit {
    /// Replace the value at a random path by another (often of another type).
    Set(Vec<Index>, Value),
    /// Remove the key (or array element) at a random path.
    Remove(Vec<Index>),
    /// Insert a key into the object at a random path.
    Insert(Vec<Index>, String, Value),
}

fn json_edit() -> impl Strategy<Value = JsonEdit> {
    let path = proptest::collection::vec(any::<Index>(), 0..5);
    prop_oneof![
        3 => (path.clone(), json_value()).prop_map(|(p, v)| JsonEdit::Set(p, v)),
        2 => path.clone().prop_map(JsonEdit::Remove),
        2 => (path, json_key(), json_value()).prop_map(|(p, k, v)| JsonEdit::Insert(p, k, v)),
    ]
}

/// Follows `path` (indices modulo the children) as far as it goes; returns the node.
fn walk<'a>(mut v: &'a mut Value, path: &[Index]) -> &'a mut Value {
    for i in path {
        let next_is_container = match &*v {
            Value::Object(m) => !m.is_empty(),
            Value::Array(a) => !a.is_empty(),
            _ => false,
        };
        if !next_is_container {
            break;
        }
        v = match v {
            Value::Object(m) => {
                let k = m.keys().nth(i.index(m.len())).cloned().unwrap_or_default();
                m.get_mut(&k).expect("key exists")
            }
            Value::Array(a) => {
                let n = a.len();
                &mut a[i.index(n)]
            }
            _ => unreachable!(),
        };
    }
    v
}

fn apply_json_edit(doc: &mut Value, edit: &JsonEdit) {
    match edit {
        JsonEdit::Set(path, new) => *walk(doc, path) = new.clone(),
        JsonEdit::Remove(path) => {
            if let Some((last, parent)) = path.split_last() {
                match walk(doc, parent) {
                    Value::Object(m) if !m.is_empty() => {
                        let k = m
                            .keys()
                            .nth(last.index(m.len()))
                            .cloned()
                            .unwrap_or_default();
                        m.remove(&k);
                    }
                    Value::Array(a) if !a.is_empty() => {
                        let n = a.len();
                        a.remove(last.index(n));
                    }
                    _ => {}
                }
            }
        }
        JsonEdit::Insert(path, k, new) => {
            if let Value::Object(m) = walk(doc, path) {
                m.insert(k.clone(), new.clone());
            }
        }
    }
}

/// One edit of a file's bytes.
#[derive(Debug, Clone)]
enum ByteEdit {
    Truncate(Index),
    Flip(Index, u8),
    Insert(Index, Vec<u8>),
    Delete(Index, usize),
}

fn byte_edit() -> impl Strategy<Value = ByteEdit> {
    prop_oneof![
        (any::<Index>()).prop_map(ByteEdit::Truncate),
        (any::<Index>(), 1..=255u8).prop_map(|(i, x)| ByteEdit::Flip(i, x)),
        (any::<Index>(), proptest::collection::vec(any::<u8>(), 1..8))
            .prop_map(|(i, b)| ByteEdit::Insert(i, b)),
        (any::<Index>(), 1..16usize).prop_map(|(i, n)| ByteEdit::Delete(i, n)),
    ]
}

fn apply_byte_edit(bytes: &mut Vec<u8>, edit: &ByteEdit) {
    let len = bytes.len();
    match edit {
        ByteEdit::Truncate(i) => bytes.truncate(i.index(len + 1)),
        ByteEdit::Flip(i, x) if len > 0 => bytes[i.index(len)] ^= x,
        ByteEdit::Insert(i, b) => {
            let at = i.index(len + 1);
            bytes.splice(at..at, b.iter().copied());
        }
        ByteEdit::Delete(i, n) if len > 0 => {
            let at = i.index(len);
            bytes.drain(at..(at + n).min(len));
        }
        _ => {}
    }
}

/// A JSON document mutated by structured edits, then serialized (compact or pretty), then
/// optionally damaged byte-wise.
fn mutated_json(base: Value) -> impl Strategy<Value = Vec<u8>> {
    (
        proptest::collection::vec(json_edit(), 0..4),
        any::<bool>(),
        proptest::collection::vec(byte_edit(), 0..3),
    )
        .prop_map(move |(edits, pretty, bytes)| {
            let mut doc = base.clone();
            for e in &edits {
                apply_json_edit(&mut doc, e);
            }
            let mut out = if pretty {
                serde_json::to_vec_pretty(&doc).unwrap_or_default()
            } else {
                serde_json::to_vec(&doc).unwrap_or_default()
            };
            for b in &bytes {
                apply_byte_edit(&mut out, b);
            }
            out
        })
}

// ---------------------------------------------------------------------------------------
// 1. Config loader.
// ---------------------------------------------------------------------------------------

const EXAMPLES: &[(&str, &str)] = &[
    ("docker.toml", include_str!("../../examples/docker.toml")),
    ("aws.toml", include_str!("../../examples/aws.toml")),
    (
        "multi-cloud.toml",
        include_str!("../../examples/multi-cloud.toml"),
    ),
];

const CONFIG_PATH: &str = "/project/gpuprov.toml";

/// Checks what `Config::parse` promises for any text: no panic; an error renders through
/// miette naming the file; a config that parses keeps its invariants.
fn check_config_text(text: String, tally: &Tally) -> Result<(), TestCaseError> {
    match Config::parse(Path::new(CONFIG_PATH), text) {
        Err(e) => {
            tally.add("refused");
            let shown = render(*e);
            prop_assert!(
                shown.contains(CONFIG_PATH),
                "the diagnostic does not name the file:\n{shown}"
            );
        }
        Ok(c) => {
            tally.add("accepted");
            config_invariants(&c)?;
        }
    }
    Ok(())
}

fn config_invariants(c: &Config) -> Result<(), TestCaseError> {
    prop_assert!(!c.vms.is_empty(), "a config defines at least one machine");
    for (name, vm) in &c.vms {
        prop_assert_eq!(name, &vm.name);
        prop_assert!(gpuprov::config::valid_vm_name(name), "bad name {:?}", name);
        prop_assert!(!vm.clouds.is_empty(), "vm.{} has no cloud", name);
        let distinct: BTreeSet<_> = vm.clouds.iter().collect();
        prop_assert_eq!(
            distinct.len(),
            vm.clouds.len(),
            "vm.{} repeats a cloud",
            name
        );
        for d in &vm.depends_on {
            prop_assert!(
                c.vms.contains_key(d),
                "vm.{} depends on undefined {:?}",
                name,
                d
            );
            prop_assert!(d != name, "vm.{} depends on itself", name);
        }
        prop_assert!(
            !vm.ports.iter().any(|p| *p == 0 || *p == 22),
            "vm.{} lists port 0 or 22",
            name
        );
        prop_assert_eq!(
            vm.gpu.is_some(),
            vm.gpu_count > 0,
            "vm.{} gpu/gpu_count",
            name
        );
        prop_assert_ne!(vm.disk_gb, Some(0));
        if let Some(p) = vm.max_price_per_hour {
            prop_assert!(p.is_finite() && p > 0.0, "vm.{} price {}", name, p);
        }
    }
    prop_assert!(!has_cycle(&c.vms), "depends_on has a cycle");
    Ok(())
}

/// Independent cycle check (depth-first, three colours).
fn has_cycle(vms: &BTreeMap<String, VmSpec>) -> bool {
    fn visit<'a>(
        n: &'a str,
        vms: &'a BTreeMap<String, VmSpec>,
        colour: &mut BTreeMap<&'a str, u8>,
    ) -> bool {
        match colour.get(n) {
            Some(1) => return true,
            Some(2) => return false,
            _ => {}
        }
        colour.insert(n, 1);
        if let Some(vm) = vms.get(n) {
            for d in &vm.depends_on {
                if visit(d, vms, colour) {
                    return true;
                }
            }
        }
        colour.insert(n, 2);
        false
    }
    let mut colour = BTreeMap::new();
    vms.keys().any(|n| visit(n, vms, &mut colour))
}

/// Fragments a user (or a bad merge) might leave in a TOML file.
const TOML_TOKENS: &[&str] = &[
    "[",
    "]",
    "[[",
    "]]",
    "vm.",
    "vm",
    "defaults",
    "cloud",
    "cloud.docker",
    ".",
    "=",
    "\"",
    "'",
    "\"\"\"",
    "'''",
    "\n",
    " ",
    "#",
    ",",
    "{",
    "}",
    "clouds",
    "regions",
    "zones",
    "gpu",
    "gpu_count",
    "spot",
    "max_price_per_hour",
    "image",
    "disk_gb",
    "ports",
    "kubernetes",
    "retry_until_up",
    "depends_on",
    "endpoint",
    "base_image",
    "docker",
    "aws",
    "lambda",
    "runpod",
    "\"docker\"",
    "[\"docker\"]",
    "dev",
    "a",
    "b",
    "true",
    "false",
    "0",
    "22",
    "-1",
    "1.5",
    "nan",
    "inf",
    "-inf",
    "1e999",
    "4294967296",
    "65536",
    "1979-05-27",
    "07:32:00",
    "0x1F",
    "\\u0000",
    "é",
    "\u{202e}",
    "\u{0}",
];

fn toml_soup() -> impl Strategy<Value = String> {
    proptest::collection::vec(proptest::sample::select(TOML_TOKENS), 0..60).prop_map(|t| t.concat())
}

/// A valid config with 1..6 machines; each may depend on earlier ones (a DAG).
fn valid_config() -> impl Strategy<Value = String> {
    (1..6usize)
        .prop_flat_map(|n| {
            (
                Just(n),
                proptest::collection::vec(proptest::collection::vec(any::<Index>(), 0..3), n),
                proptest::collection::vec(any::<bool>(), n),
            )
        })
        .prop_map(|(n, deps, gpu)| {
            let mut s = String::from("[defaults]\nclouds = [\"docker\"]\nkubernetes = false\n");
            for i in 0..n {
                s.push_str(&format!("\n[vm.m{i}]\nregions = [\"local\"]\n"));
                if gpu[i] {
                    s.push_str("ports = [8000, 8888]\ndisk_gb = 20\n");
                }
                let ds: BTreeSet<usize> = if i == 0 {
                    BTreeSet::new()
                } else {
                    deps[i].iter().map(|x| x.index(i)).collect()
                };
                if !ds.is_empty() {
                    let list: Vec<String> = ds.iter().map(|d| format!("\"m{d}\"")).collect();
                    s.push_str(&format!("depends_on = [{}]\n", list.join(", ")));
                }
            }
            s
        })
}

/// One mistake a user makes in `gpuprov.toml`.
#[derive(Debug, Clone)]
enum ConfigEdit {
    DeleteLine(Index),
    DuplicateLine(Index),
    /// Replace the value of the `key = value` line by another literal.
    ChangeValue(Index, &'static str),
    InsertUnknownKey(Index, String),
    InsertLine(Index, String),
    TruncateAt(Index),
    /// Rename a machine to an arbitrary (quoted) string, everywhere it appears.
    RenameVm(Index, String),
    /// Add a depends_on to some table naming some machine (may dangle or close a cycle).
    AddDependsOn(Index, Index, String),
}

const VALUES: &[&str] = &[
    "1",
    "0",
    "-1",
    "22",
    "70000",
    "4294967296",
    "1.5",
    "-0.0",
    "nan",
    "inf",
    "true",
    "\"x\"",
    "\"\"",
    "[]",
    "[\"docker\", \"docker\"]",
    "[\"nope\"]",
    "[1, 2]",
    "[0]",
    "[22]",
    "{ a = 1 }",
    "1979-05-27T07:32:00Z",
    "\"H100\"",
    "[\"local\"]",
    "[\"m0\"]",
    "'''multi\nline'''",
];

fn config_edit() -> impl Strategy<Value = ConfigEdit> {
    prop_oneof![
        any::<Index>().prop_map(ConfigEdit::DeleteLine),
        any::<Index>().prop_map(ConfigEdit::DuplicateLine),
        (any::<Index>(), proptest::sample::select(VALUES))
            .prop_map(|(i, v)| ConfigEdit::ChangeValue(i, v)),
        (any::<Index>(), "[a-z_]{1,12}").prop_map(|(i, k)| ConfigEdit::InsertUnknownKey(i, k)),
        (any::<Index>(), toml_soup()).prop_map(|(i, l)| ConfigEdit::InsertLine(i, l)),
        any::<Index>().prop_map(ConfigEdit::TruncateAt),
        (any::<Index>(), ".{0,45}").prop_map(|(i, n)| ConfigEdit::RenameVm(i, n)),
        (any::<Index>(), any::<Index>(), "[a-z0-9]{0,3}")
            .prop_map(|(i, j, s)| ConfigEdit::AddDependsOn(i, j, s)),
    ]
}

fn vm_names(text: &str) -> Vec<String> {
    text.lines()
        .filter_map(|l| l.trim().strip_prefix("[vm.")?.strip_suffix(']'))
        .map(str::to_string)
        .collect()
}

fn apply_config_edit(text: &mut String, edit: &ConfigEdit) {
    let mut lines: Vec<String> = text.split('\n').map(str::to_string).collect();
    let n = lines.len();
    match edit {
        ConfigEdit::DeleteLine(i) => {
            lines.remove(i.index(n));
        }
        ConfigEdit::DuplicateLine(i) => {
            let at = i.index(n);
            let l = lines[at].clone();
            lines.insert(at, l);
        }
        ConfigEdit::ChangeValue(i, v) => {
            let with_value: Vec<usize> = (0..n).filter(|k| lines[*k].contains('=')).collect();
            if !with_value.is_empty() {
                let at = with_value[i.index(with_value.len())];
                let key = lines[at].split('=').next().unwrap_or_default().to_string();
                lines[at] = format!("{key}= {v}");
            }
        }
        ConfigEdit::InsertUnknownKey(i, k) => lines.insert(i.index(n + 1), format!("{k} = 1")),
        ConfigEdit::InsertLine(i, l) => lines.insert(i.index(n + 1), l.clone()),
        ConfigEdit::TruncateAt(i) => {
            let mut cut = i.index(text.len() + 1);
            while !text.is_char_boundary(cut) {
                cut -= 1;
            }
            text.truncate(cut);
            return;
        }
        ConfigEdit::RenameVm(i, new) => {
            let names = vm_names(text);
            if !names.is_empty() {
                let old = &names[i.index(names.len())];
                let quoted = serde_json::to_string(new).unwrap_or_default();
                *text = text
                    .replace(&format!("[vm.{old}]"), &format!("[vm.{quoted}]"))
                    .replace(&format!("\"{old}\""), &quoted);
            }
            return;
        }
        ConfigEdit::AddDependsOn(i, j, extra) => {
            let names = vm_names(text);
            if !names.is_empty() {
                let from = &names[i.index(names.len())];
                let to = format!("{}{extra}", names[j.index(names.len())]);
                let header = format!("[vm.{from}]");
                if let Some(at) = lines.iter().position(|l| l.trim() == header) {
                    // A second depends_on in the same table is itself a mistake (duplicate key).
                    lines.insert(at + 1, format!("depends_on = [\"{to}\"]"));
                }
            }
        }
    }
    *text = lines.join("\n");
}

fn mutated_config() -> impl Strategy<Value = String> {
    let base = prop_oneof![
        proptest::sample::select(EXAMPLES).prop_map(|(_, t)| t.to_string()),
        valid_config(),
    ];
    (base, proptest::collection::vec(config_edit(), 1..5)).prop_map(|(mut text, edits)| {
        for e in &edits {
            apply_config_edit(&mut text, e);
        }
        text
    })
}

#[test]
fn config_loader_arbitrary_text() {
    let text = prop_oneof![any::<String>(), ".{0,400}", toml_soup()];
    check("config_loader_arbitrary_text", 512, text, check_config_text);
}

#[test]
fn config_loader_mutated_configs() {
    check(
        "config_loader_mutated_configs",
        1024,
        mutated_config(),
        check_config_text,
    );
}

/// Machines with arbitrary depends_on edges (self-loops and cycles included): the loader
/// accepts exactly the acyclic ones.
#[test]
fn config_loader_depends_on_graphs() {
    let graph = (1..7usize).prop_flat_map(|n| {
        (
            Just(n),
            proptest::collection::vec(proptest::collection::vec(any::<Index>(), 0..3), n),
        )
    });
    check(
        "config_loader_depends_on_graphs",
        512,
        graph,
        |(n, edges), tally| {
            let mut text = String::from("[defaults]\nclouds = [\"docker\"]\n");
            let mut adj: BTreeMap<usize, BTreeSet<usize>> = BTreeMap::new();
            for (i, out) in edges.iter().enumerate() {
                let ds: BTreeSet<usize> = out.iter().map(|x| x.index(n)).collect();
                text.push_str(&format!("\n[vm.m{i}]\n"));
                if !ds.is_empty() {
                    let list: Vec<String> = ds.iter().map(|d| format!("\"m{d}\"")).collect();
                    text.push_str(&format!("depends_on = [{}]\n", list.join(", ")));
                }
                adj.insert(i, ds);
            }
            let cyclic = {
                let mut specs = BTreeMap::new();
                for (i, ds) in &adj {
                    let mut s = VmSpec::new(&format!("m{i}"), vec![]);
                    s.depends_on = ds.iter().map(|d| format!("m{d}")).collect();
                    specs.insert(format!("m{i}"), s);
                }
                has_cycle(&specs)
            };
            let result = Config::parse(Path::new(CONFIG_PATH), text.clone());
            prop_assert_eq!(
                result.is_ok(),
                !cyclic,
                "cyclic = {}, parse = {:?}\n{}",
                cyclic,
                result.as_ref().err().map(|e| e.message.clone()),
                text
            );
            match result {
                Ok(c) => {
                    tally.add("acyclic accepted");
                    config_invariants(&c)?;
                }
                Err(e) => {
                    tally.add("cycle refused");
                    prop_assert!(
                        e.message.contains("cycle") || e.message.contains("itself"),
                        "{}",
                        e.message
                    );
                    let shown = render(*e);
                    prop_assert!(shown.contains(CONFIG_PATH), "{}", shown);
                }
            }
            Ok(())
        },
    );
}

/// Arbitrary bytes in the file (invalid UTF-8 included) through `Config::load`.
#[test]
fn config_loader_arbitrary_bytes_from_disk() {
    let dir = TempDir::new().unwrap();
    let path = dir.path().join("gpuprov.toml");
    let bytes = prop_oneof![
        proptest::collection::vec(any::<u8>(), 0..512),
        mutated_config()
            .prop_map(String::into_bytes)
            .prop_flat_map(|b| {
                (Just(b), proptest::collection::vec(byte_edit(), 0..3)).prop_map(|(mut b, es)| {
                    for e in &es {
                        apply_byte_edit(&mut b, e);
                    }
                    b
                })
            }),
    ];
    check(
        "config_loader_arbitrary_bytes",
        256,
        bytes,
        |bytes, tally| {
            fs::write(&path, &bytes).unwrap();
            match Config::load(&path) {
                Err(e) => {
                    tally.add("refused");
                    let shown = render(e);
                    prop_assert!(
                        shown.contains(&path.display().to_string()),
                        "the diagnostic does not name the file:\n{}",
                        shown
                    );
                }
                Ok(c) => {
                    tally.add("accepted");
                    config_invariants(&c)?;
                }
            }
            prop_assert_eq!(
                fs::read(&path).unwrap(),
                bytes,
                "the loader wrote the config"
            );
            Ok(())
        },
    );
}

// ---------------------------------------------------------------------------------------
// 2. State loader.
// ---------------------------------------------------------------------------------------

const LINEAGE: &str = "0f0e0d0c-1111-4222-8333-444455556666";

fn machine(label: &str, secs: i64) -> MachineRecord {
    MachineRecord {
        kind: "launch".into(),
        state: json!({"state": label, "search": {"offers": [], "cursor": 0, "round": 1}}).into(),
        label: label.into(),
        updated_at: Utc.timestamp_opt(1_700_000_000 + secs, 0).unwrap(),
    }
}

/// A valid state with `n` resources, as `StateStore::save` writes it.
fn valid_state(n: usize) -> StateFile {
    let mut s = StateFile::new();
    s.lineage = LINEAGE.into();
    s.serial = 7;
    for i in 0..n {
        let name = format!("m{i}");
        let mut rec = ResourceRecord::new(machine("running", i as i64));
        rec.desired = Some(gpuprov::state::JsonText::encode(&VmSpec::new(&name, vec![])).unwrap());
        rec.push_event_at(Utc.timestamp_opt(1_700_000_000, 0).unwrap(), "planning");
        rec.push_event_at(Utc.timestamp_opt(1_700_000_100, 0).unwrap(), "running");
        rec.extra
            .insert("future_field".into(), json!({"kept": true}));
        s.resources.insert(format!("vm.{name}"), rec);
    }
    s.extra.insert("written_by_newer".into(), json!([1, 2, 3]));
    s
}

fn state_bytes(state: &StateFile) -> Vec<u8> {
    let mut b = serde_json::to_vec_pretty(state).unwrap();
    b.push(b'\n');
    b
}

/// Checks `StateStore::open` on `bytes` in a fresh directory: no panic; on error nothing
/// on disk changed and the diagnostic names the file; on success a save round-trips.
fn check_state_bytes(bytes: &[u8], tally: &Tally) -> Result<(), TestCaseError> {
    let dir = TempDir::new().unwrap();
    let path = dir.path().join("gpuprov.state.json");
    fs::write(&path, bytes).unwrap();
    let before = listing(dir.path());
    match StateStore::open(&path) {
        Err(e) => {
            tally.add("refused");
            prop_assert_eq!(
                fs::read(&path).unwrap(),
                bytes,
                "a refused state file changed"
            );
            prop_assert_eq!(listing(dir.path()), before, "a refused open created files");
            let shown = render(e);
            prop_assert!(
                shown.contains("gpuprov.state.json"),
                "the diagnostic does not name the file:\n{}",
                shown
            );
        }
        Ok((mut store, mut state)) => {
            tally.add("accepted");
            prop_assert_eq!(fs::read(&path).unwrap(), bytes, "open wrote the state file");
            prop_assert_eq!(listing(dir.path()), before, "open created files");
            prop_assert!(uuid::Uuid::parse_str(&state.lineage).is_ok());
            prop_assert!(state.version <= STATE_FORMAT_VERSION);
            let serial = state.serial;
            store.save(&mut state).map_err(|e| {
                TestCaseError::fail(format!("save of an accepted state failed: {e}"))
            })?;
            prop_assert_eq!(state.serial, serial.saturating_add(1));
            prop_assert_eq!(fs::read(store.backup_path()).unwrap(), bytes, ".backup");
            let (_, again) = StateStore::open(&path).map_err(|e| {
                TestCaseError::fail(format!("a saved state does not open again: {e}"))
            })?;
            prop_assert_eq!(again, state, "save does not round-trip");
        }
    }
    Ok(())
}

#[test]
fn state_loader_arbitrary_bytes() {
    let bytes = prop_oneof![
        proptest::collection::vec(any::<u8>(), 0..512),
        json_value().prop_map(|v| serde_json::to_vec(&v).unwrap()),
    ];
    check("state_loader_arbitrary_bytes", 256, bytes, |b, t| {
        check_state_bytes(&b, t)
    });
}

#[test]
fn state_loader_mutated_states() {
    let targeted = prop_oneof![
        (0..3usize, any::<u64>()).prop_map(|(n, v)| {
            let mut d = serde_json::to_value(valid_state(n)).unwrap();
            d["version"] = json!(v);
            d
        }),
        (0..3usize, ".{0,40}").prop_map(|(n, l)| {
            let mut d = serde_json::to_value(valid_state(n)).unwrap();
            d["lineage"] = json!(l);
            d
        }),
        (
            0..3usize,
            prop_oneof![
                Just(json!(u64::MAX)),
                Just(json!(-1)),
                Just(json!(1e300)),
                Just(json!(18446744073709551616.0f64)),
                Just(json!("7")),
                any::<i64>().prop_map(|i| json!(i)),
            ]
        )
            .prop_map(|(n, s)| {
                let mut d = serde_json::to_value(valid_state(n)).unwrap();
                d["serial"] = s;
                d
            }),
    ];
    let base = prop_oneof![
        (0..3usize).prop_map(|n| serde_json::to_value(valid_state(n)).unwrap()),
        targeted,
    ];
    let bytes = base.prop_flat_map(mutated_json);
    check("state_loader_mutated_states", 512, bytes, |b, t| {
        check_state_bytes(&b, t)
    });
    // Raw JSON text edits serde_json::Value cannot express: huge literals, duplicates.
    let raw = String::from_utf8(state_bytes(&valid_state(1))).unwrap();
    for (what, text) in [
        (
            "huge serial",
            raw.replace("\"serial\": 7", "\"serial\": 1e99999"),
        ),
        (
            "big version",
            raw.replace("\"version\": 1", "\"version\": 99999999999999999999999"),
        ),
        (
            "dup lineage",
            raw.replace("\"serial\": 7", "\"serial\": 7, \"lineage\": \"x\""),
        ),
        (
            "dup resources",
            raw.replace("\"serial\": 7", "\"serial\": 7, \"resources\": {}"),
        ),
        ("nan", raw.replace("\"serial\": 7", "\"serial\": NaN")),
        ("bom", format!("\u{feff}{raw}")),
        ("nul", raw.replace("running", "run\u{0}ning")),
    ] {
        let tally = Tally::default();
        check_state_bytes(text.as_bytes(), &tally)
            .unwrap_or_else(|e| panic!("raw edit {what}: {e}"));
    }
}

/// Every prefix of a valid state file (the torn write an atomic rename prevents, and a
/// copy cut short by hand): refused untouched, or (the whole file) accepted.
#[test]
fn state_loader_every_truncation() {
    let started = Instant::now();
    let bytes = state_bytes(&valid_state(2));
    let tally = Tally::default();
    for cut in 0..=bytes.len() {
        check_state_bytes(&bytes[..cut], &tally)
            .unwrap_or_else(|e| panic!("state cut at byte {cut}: {e}"));
    }
    let accepted = tally.snapshot().get("accepted").copied().unwrap_or(0);
    // The whole file, and the file without its trailing newline.
    assert_eq!(accepted, 2, "only complete documents are accepted");
    report(
        "state_loader_every_truncation",
        bytes.len() as u64 + 1,
        started.elapsed().as_secs_f64(),
        true,
        &tally,
    );
}

// ---------------------------------------------------------------------------------------
// 3. Journal replay.
// ---------------------------------------------------------------------------------------

fn journal_op() -> impl Strategy<Value = JournalOp> {
    let key =
        proptest::sample::select(&["vm.a", "vm.b", "vm.c", "vm.m0"][..]).prop_map(String::from);
    let label = "[a-z ]{1,12}";
    prop_oneof![
        4 => (key.clone(), label, 0..10_000i64, proptest::option::of(json_value())).prop_map(
            |(key, label, secs, desired)| JournalOp::Transition {
                key,
                machine: machine(&label, secs),
                desired: desired.map(Into::into),
            }
        ),
        1 => (key.clone(), json_value(), 0..10_000i64).prop_map(|(key, desired, secs)| {
            JournalOp::Desired {
                key,
                desired: desired.into(),
                at: Utc.timestamp_opt(1_700_000_000 + secs, 0).unwrap(),
            }
        }),
        1 => key.prop_map(|key| JournalOp::Remove { key }),
    ]
}

fn header(lineage: &str, base_serial: u64) -> Vec<u8> {
    let mut h = serde_json::to_vec(&json!({
        "gpuprov_journal": 1, "lineage": lineage, "base_serial": base_serial
    }))
    .unwrap();
    h.push(b'\n');
    h
}

fn op_line(op: &JournalOp) -> Vec<u8> {
    let mut l = serde_json::to_vec(op).unwrap();
    l.push(b'\n');
    l
}

/// A state file plus its journal in a fresh directory; returns (dir, state path).
fn state_with_journal(state: &StateFile, journal: &[u8]) -> (TempDir, PathBuf) {
    let dir = TempDir::new().unwrap();
    let path = dir.path().join("gpuprov.state.json");
    fs::write(&path, state_bytes(state)).unwrap();
    fs::write(journal_path(&path), journal).unwrap();
    (dir, path)
}

#[test]
fn journal_replay_torn_tails() {
    let input = (
        0..3usize,
        proptest::collection::vec(journal_op(), 0..8),
        any::<Index>(),
    );
    check(
        "journal_replay_torn_tails",
        256,
        input,
        |(n, ops, cut), tally| {
            let base = valid_state(n);
            let mut journal = header(LINEAGE, base.serial);
            let mut ends = vec![journal.len()];
            for op in &ops {
                journal.extend(op_line(op));
                ends.push(journal.len());
            }
            let cut = cut.index(journal.len() + 1);
            let torn = &journal[..cut];
            let (dir, path) = state_with_journal(&base, torn);
            let before = listing(dir.path());
            let state_before = fs::read(&path).unwrap();

            // By hand: the complete lines within the cut, after a complete header.
            let mut expected = base.clone();
            let complete = ends.iter().filter(|e| **e <= cut).count();
            if complete > 1 {
                for op in &ops[..complete - 1] {
                    op.apply(&mut expected);
                }
            }
            let (store, got) = StateStore::open(&path)
                .map_err(|e| TestCaseError::fail(format!("a torn journal was refused: {e}")))?;
            prop_assert_eq!(got, expected, "cut at {} of {}", cut, journal.len());
            prop_assert_eq!(store.replayed_journal(), complete >= 1 && ends[0] <= cut);
            tally.add(if cut == journal.len() {
                "whole journal"
            } else {
                "torn"
            });
            prop_assert_eq!(fs::read(&path).unwrap(), state_before);
            prop_assert_eq!(fs::read(journal_path(&path)).unwrap(), torn);
            prop_assert_eq!(listing(dir.path()), before);
            Ok(())
        },
    );
}

/// A line that is not a change, anywhere but a torn tail, refuses both files untouched.
#[test]
fn journal_replay_garbage_lines() {
    let garbage = prop_oneof![
        proptest::collection::vec(any::<u8>(), 0..64)
            .prop_map(|b| b.into_iter().filter(|c| *c != b'\n').collect::<Vec<u8>>()),
        json_value().prop_map(|v| serde_json::to_vec(&v).unwrap()),
        journal_op().prop_flat_map(|op| {
            let v = serde_json::to_value(&op).unwrap();
            mutated_json(v).prop_map(|b| b.into_iter().filter(|c| *c != b'\n').collect())
        }),
    ];
    let input = (
        0..3usize,
        proptest::collection::vec(journal_op(), 0..5),
        any::<Index>(),
        garbage,
        any::<bool>(),
    );
    check(
        "journal_replay_garbage_lines",
        256,
        input,
        |(n, ops, at, garbage, in_header), tally| {
            let base = valid_state(n);
            // Garbage that happens to be a valid line is not garbage.
            if in_header {
                if serde_json::from_slice::<Value>(&garbage)
                    .ok()
                    .and_then(|v| v.get("gpuprov_journal").cloned())
                    .is_some()
                {
                    return Ok(());
                }
            } else if serde_json::from_slice::<JournalOp>(&garbage).is_ok() {
                return Ok(());
            }
            let mut lines: Vec<Vec<u8>> = ops.iter().map(op_line).collect();
            let mut g = garbage.clone();
            g.push(b'\n');
            let mut journal = Vec::new();
            if in_header {
                journal.extend(g);
                for l in &lines {
                    journal.extend(l);
                }
            } else {
                lines.insert(at.index(lines.len() + 1), g);
                journal.extend(header(LINEAGE, base.serial));
                for l in &lines {
                    journal.extend(l);
                }
            }
            let (dir, path) = state_with_journal(&base, &journal);
            let before = listing(dir.path());
            let state_before = fs::read(&path).unwrap();
            match StateStore::open(&path) {
                Ok(_) => {
                    return Err(TestCaseError::fail(format!(
                        "a journal with a garbage line was accepted: {:?}",
                        String::from_utf8_lossy(&journal)
                    )))
                }
                Err(e) => {
                    tally.add("refused");
                    let shown = render(e);
                    prop_assert!(shown.contains("gpuprov.state.json.journal"), "{}", shown);
                }
            }
            prop_assert_eq!(fs::read(&path).unwrap(), state_before);
            prop_assert_eq!(fs::read(journal_path(&path)).unwrap(), journal);
            prop_assert_eq!(listing(dir.path()), before);
            Ok(())
        },
    );
}

// ---------------------------------------------------------------------------------------
// 4. Saved plan files given to `gpuprov apply FILE`.
// ---------------------------------------------------------------------------------------

struct PlanProject {
    dir: TempDir,
    config: PathBuf,
    config_text: String,
    state: PathBuf,
    state_bytes: Vec<u8>,
    state_file: StateFile,
    plan: Value,
    docker: String,
}

impl PlanProject {
    fn new() -> PlanProject {
        let dir = TempDir::new().unwrap();
        // A socket that does not exist: nothing can start a container.
        let docker = format!("unix://{}/no-docker.sock", dir.path().display());
        let config = dir.path().join("gpuprov.toml");
        let config_text = format!(
            "[defaults]\nclouds = [\"docker\"]\nkubernetes = false\n\n[cloud.docker]\nendpoint = \"{docker}\"\n\n[vm.dev]\nregions = [\"local\"]\n\n[vm.web]\ndepends_on = [\"dev\"]\nports = [8080]\n"
        );
        fs::write(&config, &config_text).unwrap();
        let state = dir.path().join("gpuprov.state.json");
        let (mut store, mut s) = StateStore::open(&state).unwrap();
        store.save(&mut s).unwrap();
        let mut p = PlanProject {
            state_bytes: fs::read(&state).unwrap(),
            state_file: s,
            plan: Value::Null,
            dir,
            config,
            config_text,
            state,
            docker,
        };
        let out = p.dir.path().join("base.plan.json");
        let o = p.cmd().args(["plan", "-out"]).arg(&out).output().unwrap();
        assert!(
            o.status.success(),
            "plan -out: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        p.plan = serde_json::from_slice(&fs::read(&out).unwrap()).unwrap();
        assert_eq!(
            fs::read(&p.state).unwrap(),
            p.state_bytes,
            "plan wrote the state"
        );
        // The setup reaches the gates: a stale copy of the plan is refused as stale, and
        // the plan with nothing to do is applied (doing nothing).
        let mut stale = p.plan.clone();
        stale["serial"] = json!(p.state_file.serial + 1);
        let o = p.apply_json(&stale, "stale");
        assert_eq!(o.status.code(), Some(1));
        assert!(
            String::from_utf8_lossy(&o.stderr).contains("is stale"),
            "{o:?}"
        );
        let mut noop = p.plan.clone();
        for c in noop["changes"].as_array_mut().unwrap() {
            c["action"] = json!("no_op");
        }
        let o = p.apply_json(&noop, "noop");
        assert_eq!(o.status.code(), Some(0), "{o:?}");
        assert_eq!(
            fs::read(&p.state).unwrap(),
            p.state_bytes,
            "a no-op apply wrote the state"
        );
        p
    }

    fn apply_json(&self, plan: &Value, name: &str) -> std::process::Output {
        let file = self.dir.path().join(format!("{name}.plan.json"));
        fs::write(&file, serde_json::to_vec(plan).unwrap()).unwrap();
        let o = self
            .cmd()
            .args(["apply", "--auto-approve"])
            .arg(&file)
            .output()
            .unwrap();
        let _ = fs::remove_file(&file);
        o
    }

    fn cmd(&self) -> assert_cmd::Command {
        let mut c = assert_cmd::Command::cargo_bin("gpuprov").unwrap();
        c.current_dir(self.dir.path())
            .env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .env("HOME", self.dir.path().join("home"))
            .env("GPUPROV_HOME", self.dir.path().join("gpuprov-home"))
            .env("GPUPROV_DOCKER_ENDPOINT", &self.docker)
            .env("DOCKER_HOST", &self.docker)
            .env("NO_COLOR", "1")
            .arg("-c")
            .arg(&self.config)
            .arg("--state")
            .arg(&self.state)
            .timeout(Duration::from_secs(60));
        c
    }

    /// What apply would do with `bytes`, judged from the outside: `None` when it must
    /// refuse the file, `Some(has_changes)` when the file passes every gate.
    fn accepts(&self, bytes: &[u8]) -> Option<bool> {
        let text = std::str::from_utf8(bytes).ok()?;
        let plan: Plan = serde_json::from_str(text).ok()?;
        let ok = plan.format_version <= PLAN_FORMAT_VERSION
            && uuid::Uuid::parse_str(&plan.lineage).is_ok()
            && plan.lineage == self.state_file.lineage
            && plan.serial == self.state_file.serial
            && plan.config_sha256 == gpuprov::plan::sha256_hex(self.config_text.as_bytes());
        ok.then(|| plan.has_changes())
    }
}

#[test]
fn saved_plan_files_never_panic_or_write() {
    let p = PlanProject::new();
    let targeted = {
        let plan = p.plan.clone();
        prop_oneof![
            Just(plan.clone()),
            (any::<u64>()).prop_map({
                let plan = plan.clone();
                move |v| {
                    let mut d = plan.clone();
                    d["format_version"] = json!(v);
                    d
                }
            }),
            ".{0,40}".prop_map({
                let plan = plan.clone();
                move |l| {
                    let mut d = plan.clone();
                    d["lineage"] = json!(l);
                    d
                }
            }),
            proptest::sample::select(
                &["create", "replace", "destroy", "resume", "bogus", "no_op"][..]
            )
            .prop_map({
                let plan = plan.clone();
                move |a| {
                    let mut d = plan.clone();
                    d["changes"][0]["action"] = json!(a);
                    d
                }
            }),
        ]
    };
    let bytes = prop_oneof![
        1 => proptest::collection::vec(any::<u8>(), 0..256),
        1 => json_value().prop_map(|v| serde_json::to_vec(&v).unwrap()),
        4 => targeted.prop_flat_map(mutated_json),
    ];
    let listing_before = listing(p.dir.path());
    let n = AtomicU64::new(0);
    check("saved_plan_files", 48, bytes, |bytes, tally| {
        let verdict = p.accepts(&bytes);
        if verdict == Some(true) {
            // It would reach the engine (and try to start a container): not run.
            tally.add("passes every gate, not run");
            return Ok(());
        }
        let file = p.dir.path().join(format!(
            "case-{}.plan.json",
            n.fetch_add(1, Ordering::Relaxed)
        ));
        fs::write(&file, &bytes).unwrap();
        let out = p
            .cmd()
            .args(["apply", "--auto-approve"])
            .arg(&file)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        let code = out.status.code();
        prop_assert_ne!(code, Some(101), "gpuprov panicked:\n{}", stderr);
        match verdict {
            None => {
                tally.add("refused");
                prop_assert_eq!(
                    code,
                    Some(1),
                    "a bad plan file was not refused:\n{}",
                    stderr
                );
                prop_assert!(
                    stderr.contains(&file.display().to_string()) || stderr.contains("plan"),
                    "the diagnostic does not say which plan:\n{}",
                    stderr
                );
            }
            Some(_) => {
                tally.add("no changes, exit 0");
                prop_assert_eq!(code, Some(0), "{}", stderr);
            }
        }
        prop_assert_eq!(
            &fs::read(&p.state).unwrap(),
            &p.state_bytes,
            "state changed"
        );
        prop_assert!(!journal_path(&p.state).exists(), "a journal was started");
        let mut now = listing(p.dir.path());
        now.retain(|f| !f.starts_with("case-"));
        let mut want = listing_before.clone();
        want.retain(|f| !f.starts_with("case-"));
        // The lock file may be left beside the state by design; nothing else appears.
        now.retain(|f| !f.ends_with(".lock"));
        want.retain(|f| !f.ends_with(".lock"));
        prop_assert_eq!(now, want, "files appeared or vanished");
        let _ = fs::remove_file(&file);
        Ok(())
    });
}

/// A state as gpuprov writes it mid-life: one machine booting on the docker cloud, one
/// leaked, one aborted, one tearing down; `desired` snapshots included.
fn lived_state(lineage: &str) -> Value {
    use gpuprov::vm::{LaunchState, Search, Target, TeardownState};
    let docker = Location {
        cloud: "docker".into(),
        region: "local".into(),
        zone: None,
    };
    let rec = |kind: &str, state: Value, label: &str, desired: Option<&str>| {
        json!({
            "machine": {"kind": kind, "state": state, "label": label,
                        "updated_at": "2024-05-01T10:00:00Z"},
            "desired": desired.map(|n| serde_json::to_value(VmSpec::new(n, vec![gpuprov::config::Cloud::Docker])).unwrap()),
            "events": [{"at": "2024-05-01T09:59:00Z", "label": "planning"}],
        })
    };
    let booting = LaunchState::Booting {
        search: Search {
            round: 1,
            ..Search::default()
        },
        instance_id: "c0ffee".into(),
        adopted: false,
        kept: None,
    };
    let leaked = LaunchState::Leaked {
        location: docker.clone(),
        instance_ids: vec!["dead".into()],
        reason: "delete kept failing".into(),
    };
    let aborted = LaunchState::Aborted {
        reason: "no offer".into(),
        owned: None,
    };
    let tearing = TeardownState::AwaitingGone {
        target: Target::new(docker, "old", vec!["beef".into()]),
    };
    json!({
        "version": 1, "serial": 5, "lineage": lineage, "gpuprov_version": "0.1.0",
        "resources": {
            "vm.dev": rec("launch", serde_json::to_value(booting).unwrap(), "booting", Some("dev")),
            "vm.web": rec("launch", serde_json::to_value(aborted).unwrap(), "aborted", Some("web")),
            "vm.gone": rec("launch", serde_json::to_value(leaked).unwrap(), "leaked", Some("gone")),
            "vm.old": rec("teardown", serde_json::to_value(tearing).unwrap(), "awaiting gone", None),
        }
    })
}

/// Hand-edited, inconsistent state files given to the read-only commands (`status`,
/// `list`, `state show`, `plan`) and to `destroy`: never a panic, never a write; a file
/// the loader refuses is refused by every command, naming it; `destroy` refuses a state
/// with a record it cannot read (it may be the only trace of a billed machine) and is
/// not run on states it would act on.
#[test]
fn hand_edited_states_through_the_cli() {
    let p = PlanProject::new();
    let base = lived_state(&p.state_file.lineage);
    // The unedited state is readable by every read-only command.
    fs::write(&p.state, serde_json::to_vec_pretty(&base).unwrap()).unwrap();
    for args in [
        &["status"][..],
        &["list"],
        &["state", "show", "vm.dev"],
        &["plan"],
    ] {
        let o = p.cmd().args(args).output().unwrap();
        assert!(
            o.status.code() == Some(0) || (args == ["plan"] && o.status.code() == Some(2)),
            "{args:?} on a valid state: {o:?}"
        );
    }
    // Edits anywhere, or inside one record's machine state (where hand edits and
    // incompatible releases do their damage while the file stays valid JSON).
    let edits = (
        proptest::collection::vec(json_edit(), 0..3),
        proptest::collection::vec((any::<Index>(), json_edit()), 0..3),
    )
        .prop_map({
            let base = base.clone();
            move |(anywhere, in_machine)| {
                let mut d = base.clone();
                for e in &anywhere {
                    apply_json_edit(&mut d, e);
                }
                for (i, e) in &in_machine {
                    let keys: Vec<String> = d["resources"]
                        .as_object()
                        .map(|m| m.keys().cloned().collect())
                        .unwrap_or_default();
                    if keys.is_empty() {
                        break;
                    }
                    let k = &keys[i.index(keys.len())];
                    if let Some(state) = d["resources"][k]
                        .get_mut("machine")
                        .and_then(|m| m.get_mut("state"))
                    {
                        apply_json_edit(state, e);
                    }
                }
                serde_json::to_vec_pretty(&d).unwrap()
            }
        });
    let listing_before = {
        let mut l = listing(p.dir.path());
        l.retain(|f| !f.ends_with(".lock"));
        l
    };
    check("hand_edited_states_cli", 32, edits, |bytes, tally| {
        fs::write(&p.state, &bytes).unwrap();
        let (loads, unreadable_record) = match StateStore::open(&p.state) {
            Err(_) => (false, false),
            Ok((_, st)) => (
                true,
                st.resources.values().any(|r| {
                    gpuprov::engine::owned_of(&gpuprov::machine::PrevRecord {
                        kind: r.machine.kind.clone(),
                        state: r.machine.state.to_value(),
                    })
                    .is_err()
                }),
            ),
        };
        let mut runs: Vec<Vec<&str>> = vec![
            vec!["status"],
            vec!["list"],
            vec!["state", "show", "vm.dev"],
            vec!["plan", "--refresh=false"],
        ];
        if !loads || unreadable_record {
            runs.push(vec!["destroy", "--auto-approve"]);
        }
        for args in &runs {
            let o = p.cmd().args(args).output().unwrap();
            let stderr = String::from_utf8_lossy(&o.stderr);
            prop_assert_ne!(
                o.status.code(),
                Some(101),
                "{:?} panicked:\n{}",
                args,
                stderr
            );
            prop_assert!(o.status.code().is_some(), "{:?} was killed: {:?}", args, o);
            if !loads {
                prop_assert_eq!(
                    o.status.code(),
                    Some(1),
                    "{:?} accepted a refused state",
                    args
                );
                prop_assert!(
                    stderr.contains("gpuprov.state.json"),
                    "{:?}:\n{}",
                    args,
                    stderr
                );
            }
            if args[0] == "destroy" {
                prop_assert_eq!(o.status.code(), Some(1), "destroy:\n{}", stderr);
            }
            prop_assert_eq!(
                &fs::read(&p.state).unwrap(),
                &bytes,
                "{:?} wrote the state",
                args
            );
            let mut now = listing(p.dir.path());
            now.retain(|f| !f.ends_with(".lock"));
            prop_assert_eq!(&now, &listing_before, "{:?} left files", args);
        }
        tally.add(match (loads, unreadable_record) {
            (false, _) => "state refused",
            (true, true) => "record unreadable, destroy refused",
            (true, false) => "state readable",
        });
        Ok(())
    });
    fs::write(&p.state, &p.state_bytes).unwrap();
}

// ---------------------------------------------------------------------------------------
// 5. Response parsers of the REST adapters.
// ---------------------------------------------------------------------------------------

const STATUSES: &[u16] = &[
    200, 201, 202, 204, 400, 401, 402, 403, 404, 405, 408, 409, 410, 418, 422, 429, 500, 501, 502,
    503, 504, 520,
];

fn html_page() -> impl Strategy<Value = String> {
    (
        proptest::sample::select(&["502 Bad Gateway", "Service Unavailable", "Not Found", "Forbidden", "Error"][..]),
        ".{0,40}",
    )
        .prop_map(|(t, body)| {
            format!("<!DOCTYPE html>\n<html><head><title>{t}</title></head><body><h1>{t}</h1><p>{body}</p><hr><center>cloudflare</center></body></html>\n")
        })
}

/// A response body: arbitrary JSON (often shaped like the vendors'), an HTML error page,
/// nothing, or text.
fn body() -> impl Strategy<Value = String> {
    prop_oneof![
        4 => json_value().prop_map(|v| v.to_string()),
        3 => (status_string(), 0..4u8)
            .prop_flat_map(|(s, n)| mutated_json(listing_fixture(&s, n)))
            .prop_map(|b| String::from_utf8_lossy(&b).into_owned()),
        2 => html_page(),
        1 => Just(String::new()),
        1 => ".{0,80}",
        1 => json_value().prop_map(|v| {
            // A body cut short (a dropped connection behind a proxy).
            let s = v.to_string();
            let mut cut = s.len() / 2;
            while !s.is_char_boundary(cut) {
                cut -= 1;
            }
            s[..cut].to_string()
        }),
    ]
}

/// A header value: numbers, dates, junk (visible ASCII only, as HTTP allows).
fn header_value() -> impl Strategy<Value = Option<String>> {
    proptest::option::of(prop_oneof![
        any::<u64>().prop_map(|n| n.to_string()),
        Just("-1".to_string()),
        Just("Wed, 21 Oct 2015 07:28:00 GMT".to_string()),
        Just("\"minute\";r=0;t=18446744073709551615".to_string()),
        "[ -~]{0,24}",
    ])
}

#[derive(Debug, Clone)]
struct Response {
    status: u16,
    body: String,
    retry_after: Option<String>,
    rate: Option<String>,
}

fn response() -> impl Strategy<Value = Response> {
    (
        proptest::sample::select(STATUSES),
        body(),
        header_value(),
        header_value(),
    )
        .prop_map(|(status, body, retry_after, rate)| Response {
            status,
            body: if status == 204 { String::new() } else { body },
            retry_after,
            rate,
        })
}

/// Whether `body` names capacity in a way `cloud` documents; only then may an error be
/// classified `Capacity` (issue 4: an unknown error is never taken for capacity).
fn names_capacity(cloud: &str, status: u16, body: &str) -> bool {
    let lower = body.to_lowercase();
    let any = |ps: &[&str]| ps.iter().any(|p| lower.contains(p));
    match cloud {
        "lambda" => body.contains(lambda::INSUFFICIENT_CAPACITY),
        "digitalocean" => {
            status == 422
                && (any(digitalocean::SIZE_UNAVAILABLE_PHRASES)
                    || any(digitalocean::REGION_UNAVAILABLE_PHRASES))
        }
        "hyperstack" => any(hyperstack::CAPACITY_PHRASES),
        // GCP: its stockout codes, in Google's error body.
        "gcp" => any(&[
            "zone_resource_pool_exhausted",
            "zoneresourcepoolexhausted",
            "unsupported_operation",
            "resourcenotready",
        ]),
        // RunPod: only a 400 on a pod create (never a plan or observe call).
        _ => false,
    }
}

/// The classifiers themselves, on many more inputs than the HTTP round trip can afford.
#[test]
fn error_classifiers_never_take_unknown_errors_for_capacity() {
    check(
        "error_classifiers",
        2048,
        (response(), any::<bool>(), any::<u64>()),
        |(r, create, now), tally| {
            let ra = r.retry_after.as_deref();
            let mut kinds: Vec<(&str, ProviderError)> = vec![
                (
                    "lambda",
                    lambda::classify(
                        &lambda::ApiError::from_response(r.status, None, &r.body, ra),
                        "x",
                        Some("k"),
                    ),
                ),
                (
                    "hyperstack",
                    hyperstack::classify(
                        &hyperstack::ApiError::from_response(r.status, &r.body, ra),
                        "x",
                        Some("k"),
                    ),
                ),
            ];
            let rate = RateHeaders {
                retry_after: ra.and_then(|v| v.parse().ok()),
                remaining: r.rate.as_deref().and_then(|v| v.parse().ok()),
                reset_epoch: r.rate.as_deref().and_then(|v| v.parse().ok()),
            };
            let (d, _) = digitalocean::classify(
                &digitalocean::ApiError::from_response(r.status, None, &r.body, rate, now),
                "x",
                Some("k"),
            );
            kinds.push(("digitalocean", d));
            let call = if create {
                runpod::Call::CreatePod
            } else {
                runpod::Call::Other
            };
            let rp = runpod::classify(
                &runpod::ApiError::from_response(r.status, &r.body, ra, r.rate.as_deref()),
                call,
                "x",
                Some("k"),
            );
            let rp_capacity_ok = create && r.status == 400;
            kinds.push(("runpod", rp));
            let headers = gpuprov::provider::kit::http::RateHeaders {
                retry_after: r.retry_after.clone(),
                ..Default::default()
            };
            let f = gpuprov::provider::kit::http::failure_of(
                gcp::errors::decode,
                r.status,
                Some("application/json"),
                &r.body,
                &headers,
                now,
            );
            let call = if create { gcp::errors::CREATE } else { "other" };
            let g = gcp::errors::CLASSIFIER.classify(
                &f,
                gpuprov::provider::kit::Call::named(call, "x").in_region("us-central1"),
                ["k"],
            );
            kinds.push(("gcp", g));
            for (cloud, e) in &kinds {
                if e.kind == ErrorKind::Capacity {
                    tally.add("capacity (documented)");
                    let allowed = if *cloud == "runpod" {
                        rp_capacity_ok
                    } else {
                        names_capacity(cloud, r.status, &r.body)
                    };
                    prop_assert!(
                        allowed,
                        "{} took an unknown error for capacity: {:?}",
                        cloud,
                        r
                    );
                }
                prop_assert!(!e.msg.is_empty());
                // GCP's documented codes decide before the status (a stockout may come as
                // a 503 `zoneResourcePoolExhausted`).
                let documented =
                    *cloud == "gcp" && e.kind != ErrorKind::Transient && r.status != 429;
                if (r.status >= 500 || r.status == 429) && !documented {
                    prop_assert_eq!(e.kind, ErrorKind::Transient, "{}: {:?}", cloud, r);
                }
            }
            tally.add("classified");
            Ok(())
        },
    );
}

/// A wiremock server answering every request with the case's response, and a metadata
/// server that hands GCP a token (so GCP's API calls reach the case's response).
struct Fake {
    rt: tokio::runtime::Runtime,
    server: wiremock::MockServer,
    tokens: wiremock::MockServer,
}

impl Fake {
    fn new() -> Fake {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let server = rt.block_on(wiremock::MockServer::start());
        let tokens = rt.block_on(async {
            let t = wiremock::MockServer::start().await;
            wiremock::Mock::given(wiremock::matchers::path(
                "/computeMetadata/v1/instance/service-accounts/default/token",
            ))
            .respond_with(wiremock::ResponseTemplate::new(200).set_body_json(
                json!({"access_token": "k-sentinel-token", "expires_in": 3600, "token_type": "Bearer"}),
            ))
            .mount(&t)
            .await;
            t
        });
        Fake { rt, server, tokens }
    }

    /// The adapters of this fake (see [`adapters`]).
    fn adapters(&self) -> Vec<(&'static str, Arc<dyn CloudProvider>, &'static str)> {
        let host = self.tokens.uri().trim_start_matches("http://").to_string();
        adapters(&self.server.uri(), &host)
    }

    fn serve(&self, r: &Response) {
        let mut t = wiremock::ResponseTemplate::new(r.status)
            .set_body_raw(r.body.clone().into_bytes(), "application/json");
        if let Some(v) = &r.retry_after {
            t = t.insert_header("retry-after", v.as_str());
        }
        if let Some(v) = &r.rate {
            t = t
                .insert_header("ratelimit", v.as_str())
                .insert_header("ratelimit-reset", v.as_str())
                .insert_header("ratelimit-remaining", v.as_str());
        }
        self.rt.block_on(async {
            self.server.reset().await;
            wiremock::Mock::given(wiremock::matchers::any())
                .respond_with(t)
                .mount(&self.server)
                .await;
        });
    }
}

fn request() -> ResourceRequest {
    ResourceRequest {
        vm_name: "dev".into(),
        regions: vec![],
        zones: vec![],
        gpu: Some("H100".into()),
        gpu_count: 1,
        spot: false,
        max_price_per_hour: None,
        gpu_count_at_least: false,
    }
}

fn adapters(
    uri: &str,
    token_host: &str,
) -> Vec<(&'static str, Arc<dyn CloudProvider>, &'static str)> {
    let google = GoogleCredential {
        kind: GoogleKind::Metadata(token_host.to_string()),
        source: gpuprov::provider::kit::Source::Other("the test metadata server".into()),
    };
    vec![
        (
            "gcp",
            Arc::new(GcpProvider::new(GcpSettings::with_credential(
                LINEAGE.parse().unwrap(),
                Some(uri.to_string()),
                Some("p".into()),
                Some(google),
            ))),
            "us-central1",
        ),
        (
            "lambda",
            Arc::new(LambdaProvider::new(LambdaSettings {
                endpoint: Some(uri.to_string()),
                api_key: Some(lambda::ApiKey::new("k-sentinel")),
                lineage: LINEAGE.parse().unwrap(),
            })),
            "us-east-1",
        ),
        (
            "runpod",
            Arc::new(RunpodProvider::new(RunpodSettings {
                endpoint: Some(uri.to_string()),
                api_key: Some(runpod::ApiKey::new("k-sentinel")),
                key_source: "test".into(),
                lineage: LINEAGE.parse().unwrap(),
            })),
            "US-KS-2",
        ),
        (
            "digitalocean",
            Arc::new(DigitalOceanProvider::new(DigitalOceanSettings {
                endpoint: Some(uri.to_string()),
                token: Some(Token::new("k-sentinel")),
                token_source: "test".into(),
                lineage: LINEAGE.parse().unwrap(),
            })),
            "tor1",
        ),
        (
            "hyperstack",
            Arc::new(HyperstackProvider::new(HyperstackSettings {
                endpoint: Some(format!("{uri}/v1")),
                api_key: Some(hyperstack::ApiKey::new("k-sentinel")),
                lineage: LINEAGE.parse().unwrap(),
            })),
            "CANADA-1",
        ),
    ]
}

/// Every REST adapter's `plan` and `observe` against arbitrary answers.
#[test]
fn rest_adapters_plan_and_observe_survive_any_response() {
    let fake = Fake::new();
    let uri = fake.server.uri();
    assert!(uri.starts_with("http://127.0.0.1:"), "loopback only: {uri}");
    let adapters = fake.adapters();
    check("rest_adapter_responses", 192, response(), |r, tally| {
        fake.serve(&r);
        for (cloud, p, region) in &adapters {
            let at = Location {
                cloud: cloud.to_string(),
                region: region.to_string(),
                zone: None,
            };
            let planned = fake.rt.block_on(p.plan(&request()));
            let observed = fake.rt.block_on(p.observe(&at, "dev"));
            let results: [(&str, Option<&ProviderError>); 2] = [
                ("plan", planned.as_ref().err()),
                ("observe", observed.as_ref().err()),
            ];
            for (call, err) in results {
                match err {
                    None => tally.add("ok"),
                    Some(e) => {
                        tally.add("err");
                        prop_assert!(
                            e.kind != ErrorKind::Capacity
                                || names_capacity(cloud, r.status, &r.body),
                            "{} {} took an unknown answer for capacity: {:?} -> {:?}",
                            cloud,
                            call,
                            r,
                            e
                        );
                        prop_assert!(!e.msg.contains("k-sentinel"), "{}", e.msg);
                        prop_assert!(!e.msg.contains("k-sentinel-token"), "{}", e.msg);
                    }
                }
            }
            if let Ok(offers) = &planned {
                for o in offers {
                    prop_assert!(o.price_per_hour.is_finite(), "{} offer {:?}", cloud, o);
                }
            }
        }
        Ok(())
    });
}

/// A status string: each vendor's documented ones, case variants, and anything.
fn status_string() -> impl Strategy<Value = String> {
    prop_oneof![
        proptest::sample::select(
            &[
                "booting",
                "active",
                "unhealthy",
                "terminating",
                "preempted",
                "terminated",
                "PROVISIONING",
                "STARTING",
                "RUNNING",
                "EXITED",
                "ERROR",
                "TERMINATED",
                "new",
                "off",
                "archive",
                "ACTIVE",
                "CREATING",
                "BUILD",
                "SHUTOFF",
                "DELETING",
                "DELETED",
                " deleted ",
                "Terminated",
                "",
                "null",
            ][..]
        )
        .prop_map(str::to_string),
        ".{0,16}",
    ]
}

/// One listing answer that every REST adapter reads as "one instance of `dev` in this
/// lineage" (each reads its own key: Lambda `data`, RunPod `pods`, DigitalOcean
/// `droplets`, Hyperstack `instances`, GCP's aggregated `items`), with status `status`. `variant` drops the parts
/// an adapter may do without (addresses, tags, environment).
fn listing_fixture(status: &str, variant: u8) -> Value {
    let name = format!("gpuprov-dev-{}", &LINEAGE[..8]);
    let full = variant % 2 == 0;
    let mut lambda = json!({
        "id": "0000000000000000000000000000000a", "name": name, "status": status,
        "region": {"name": "us-east-1"},
    });
    let mut pod = json!({
        "id": "pod-1", "name": name, "status": status,
        "env": {"GPUPROV_VM_NAME": "dev", "GPUPROV_LINEAGE": LINEAGE},
        "dataCenterId": if variant == 1 { Value::Null } else { json!("US-KS-2") },
    });
    let mut droplet = json!({
        "id": 42, "status": status, "region": {"slug": "tor1"},
        "tags": [format!("gpuprov-vm-name:dev"), format!("gpuprov-lineage:{LINEAGE}")],
    });
    let mut vm = json!({
        "id": 7, "name": name, "status": status,
        "labels": [format!("gpuprov-vm-name=dev"), format!("gpuprov-lineage={LINEAGE}")],
    });
    let mut gce = json!({
        "name": format!("{name}-0a1b"), "status": status,
        "labels": {"gpuprov-vm-name": "dev", "gpuprov-lineage": LINEAGE},
    });
    if full {
        lambda["ip"] = json!("127.0.0.9");
        lambda["tags"] = json!([
            {"key": "gpuprov-vm-name", "value": "dev"},
            {"key": "gpuprov-lineage", "value": LINEAGE},
        ]);
        pod["ssh"] = json!({"direct": {"host": "127.0.0.10", "port": 2222, "username": "root"}});
        droplet["networks"] = json!({"v4": [{"ip_address": "127.0.0.11", "type": "public"}]});
        vm["environment"] =
            json!({"name": format!("gpuprov-{}-canada-1", &LINEAGE[..8]), "region": "CANADA-1"});
        vm["floating_ip"] = json!("127.0.0.12");
        vm["floating_ip_status"] = json!("ATTACHED");
        gce["networkInterfaces"] = json!([{"accessConfigs": [{"natIP": "127.0.0.13"}]}]);
    }
    json!({
        "data": [lambda], "pods": [pod], "droplets": [droplet], "instances": [vm],
        "items": {"zones/us-central1-a": {"instances": [gce]}},
        "count": 1, "links": {}, "meta": {"total": 1},
    })
}

/// The status each cloud documents as "gone" (the instance no longer exists).
fn is_gone(cloud: &str, status: &str) -> bool {
    match cloud {
        "lambda" => status == "terminated",
        "runpod" => status == "TERMINATED",
        "hyperstack" => status.trim().eq_ignore_ascii_case("DELETED"),
        _ => false,
    }
}

/// An instance of ours listed with any status string is observed (an unknown status is
/// `Failed` naming it), unless the status is the cloud's documented "gone": an odd answer
/// never makes a billed machine disappear from gpuprov's view.
#[test]
fn rest_adapters_never_take_an_unknown_status_for_gone() {
    let fake = Fake::new();
    let adapters = fake.adapters();
    check(
        "rest_adapter_unknown_status",
        128,
        (status_string(), 0..2u8),
        |(status, variant), tally| {
            fake.serve(&Response {
                status: 200,
                body: listing_fixture(&status, variant).to_string(),
                retry_after: None,
                rate: None,
            });
            for (cloud, p, region) in &adapters {
                let at = Location {
                    cloud: cloud.to_string(),
                    region: region.to_string(),
                    zone: None,
                };
                let seen = fake
                    .rt
                    .block_on(p.observe(&at, "dev"))
                    .map_err(|e| TestCaseError::fail(format!("{cloud} observe: {e:?}")))?;
                if is_gone(cloud, &status) {
                    tally.add("gone");
                    prop_assert!(seen.is_empty(), "{} {:?}: {:?}", cloud, status, seen);
                } else {
                    tally.add("observed");
                    prop_assert_eq!(
                        seen.len(),
                        1,
                        "{} lost an instance with status {:?}",
                        cloud,
                        status
                    );
                }
            }
            Ok(())
        },
    );
}
