//! Renders the reliability figures the tests wrote into RELIABILITY.md (issue 6).
//!
//! ```text
//! cargo nextest run --locked --no-fail-fast      # the tests write the figures
//! cargo run --example reliability-report         # renders RELIABILITY.md
//! ```
//!
//! Reads `<target>/reliability/*.json` (crash sweeps, fault runs, secret sweeps) and
//! `<target>/properties/*.json` (bad-input properties), where `<target>` is
//! `CARGO_TARGET_DIR` when set, else `./target`; replaces the part of RELIABILITY.md between
//! the `BEGIN GENERATED` and `END GENERATED` markers. A figure that is missing (its test
//! did not run) is shown as "not run", never as zero.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use serde_json::Value;

const BEGIN: &str = "<!-- BEGIN GENERATED: cargo run --example reliability-report -->";
const END: &str = "<!-- END GENERATED -->";

/// Figures written more than this long before the newest one are from an earlier run:
/// they are left out (shown as "not run") rather than passed off as this run's.
const SAME_RUN: std::time::Duration = std::time::Duration::from_secs(30 * 60);

/// The figures of `dir` with their modification times.
fn read_dir(dir: &Path) -> BTreeMap<String, (Value, std::time::SystemTime)> {
    let mut out = BTreeMap::new();
    let Ok(entries) = std::fs::read_dir(dir) else {
        return out;
    };
    for e in entries.flatten() {
        let p = e.path();
        if p.extension().is_some_and(|x| x == "json") {
            let mtime = e
                .metadata()
                .and_then(|m| m.modified())
                .unwrap_or(std::time::UNIX_EPOCH);
            if let Some(v) = std::fs::read_to_string(&p)
                .ok()
                .and_then(|t| serde_json::from_str(&t).ok())
            {
                let name = p.file_stem().unwrap_or_default().to_string_lossy().into();
                out.insert(name, (v, mtime));
            }
        }
    }
    out
}

/// Keeps the figures of the newest run; returns them and the names left out as stale.
fn same_run(
    rel: BTreeMap<String, (Value, std::time::SystemTime)>,
    props: BTreeMap<String, (Value, std::time::SystemTime)>,
) -> (
    BTreeMap<String, Value>,
    BTreeMap<String, Value>,
    Vec<String>,
) {
    let newest = rel
        .values()
        .chain(props.values())
        .map(|(_, t)| *t)
        .max()
        .unwrap_or(std::time::UNIX_EPOCH);
    let mut stale = Vec::new();
    let mut keep = |m: BTreeMap<String, (Value, std::time::SystemTime)>| {
        m.into_iter()
            .filter_map(|(name, (v, t))| {
                if newest.duration_since(t).unwrap_or_default() > SAME_RUN {
                    stale.push(name);
                    None
                } else {
                    Some((name, v))
                }
            })
            .collect::<BTreeMap<_, _>>()
    };
    let (rel, props) = (keep(rel), keep(props));
    (rel, props, stale)
}

fn num(v: &Value) -> u64 {
    v.as_u64().unwrap_or(0)
}

fn outcomes(v: &Value) -> String {
    v.as_object()
        .map(|m| {
            m.iter()
                .map(|(k, n)| format!("{k} {n}"))
                .collect::<Vec<_>>()
                .join(", ")
        })
        .unwrap_or_default()
}

fn render(rel: &BTreeMap<String, Value>, props: &BTreeMap<String, Value>) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "### Crash points\n");
    let _ = writeln!(s, "| cloud | machine | points covered / total |");
    let _ = writeln!(s, "|---|---|---|");
    let (mut leaks, mut dups, mut kept) = (0, 0, 0);
    let mut runs_table = String::new();
    for cloud in [
        "crash_sweep_fake",
        "crash_sweep_docker",
        "crash_sweep_docker_s3",
        "crash_sweep_docker_postgres",
    ] {
        let Some(v) = rel.get(cloud) else {
            let _ = writeln!(s, "| {cloud} | not run | not run |");
            let _ = writeln!(
                runs_table,
                "| {cloud} | not run | not run | not run | not run |"
            );
            continue;
        };
        leaks += num(&v["leaks"]);
        dups += num(&v["duplicates"]);
        kept += num(&v["pre_existing_destroyed"]);
        let name = match v["backend"].as_str() {
            Some(b) if b != "local" => {
                format!("{} (state on {b})", v["cloud"].as_str().unwrap_or(cloud))
            }
            _ => v["cloud"].as_str().unwrap_or(cloud).to_string(),
        };
        for (kind, k) in v["kinds"].as_object().into_iter().flatten() {
            let _ = writeln!(s, "| {name} | {kind} | {} / {} |", k["covered"], k["total"]);
        }
        // Figures from before the column existed did not check it.
        let kept_cell = match v.get("pre_existing_destroyed") {
            Some(n) => n.to_string(),
            None => "not checked".into(),
        };
        let _ = writeln!(
            runs_table,
            "| {name} | {} | {} | {} | {kept_cell} |",
            v["crash_runs"], v["leaks"], v["duplicates"]
        );
    }
    let _ = writeln!(s, "\n| cloud | crash runs (every occurrence of every point) | leaks found | duplicates found | pre-existing instances destroyed |");
    let _ = writeln!(s, "|---|---|---|---|---|");
    s.push_str(&runs_table);

    let _ = writeln!(
        s,
        "\n### Fault injection (FakeProvider, and Docker through the fault wrapper)\n"
    );
    let _ = writeln!(s, "| fault | runs | outcomes | leaks left | duplicates |");
    let _ = writeln!(s, "|---|---|---|---|---|");
    let mut fault_runs = 0;
    for (name, v) in rel.iter().filter(|(n, _)| n.starts_with("faults_")) {
        fault_runs += num(&v["runs"]);
        leaks += num(&v["leaks_left"]);
        dups += num(&v["duplicates"]);
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} | {} |",
            v["fault"].as_str().unwrap_or(name),
            v["runs"],
            outcomes(&v["outcomes"]),
            v["leaks_left"],
            v["duplicates"]
        );
    }
    if fault_runs == 0 {
        let _ = writeln!(s, "| not run | | | | |");
    }

    let _ = writeln!(
        s,
        "\n### Bad input (property tests, `tests/properties.rs`)\n"
    );
    let _ = writeln!(s, "| property | cases tried | passed | how answered |");
    let _ = writeln!(s, "|---|---|---|---|");
    let mut cases = 0;
    for (name, v) in props {
        cases += num(&v["cases"]);
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} |",
            v["property"].as_str().unwrap_or(name),
            v["cases"],
            v["passed"],
            outcomes(&v["outcomes"])
        );
    }
    if props.is_empty() {
        let _ = writeln!(s, "| not run | | | |");
    }

    let _ = writeln!(s, "\n### Secrets\n");
    let _ = writeln!(s, "| sweep | places searched | sentinel hits |");
    let _ = writeln!(s, "|---|---|---|");
    let mut secret_hits = None;
    for (name, v) in rel.iter().filter(|(n, _)| n.starts_with("secrets_")) {
        *secret_hits.get_or_insert(0) += num(&v["sentinel_hits"]);
        let places = v["searched"]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(Value::as_str)
                    .collect::<Vec<_>>()
                    .join(", ")
            })
            .unwrap_or_default();
        let _ = writeln!(s, "| {name} | {places} | {} |", v["sentinel_hits"]);
    }
    if secret_hits.is_none() {
        let _ = writeln!(s, "| not run | | |");
    }

    let _ = writeln!(
        s,
        "\n### State lost / stale / foreign (Docker, real binary)\n"
    );
    let _ = writeln!(
        s,
        "| situation | outcome | instances of the identity before → after | test |"
    );
    let _ = writeln!(s, "|---|---|---|---|");
    let mut lifecycle = false;
    for (_, v) in rel.iter().filter(|(n, _)| n.starts_with("lifecycle_")) {
        lifecycle = true;
        let _ = writeln!(
            s,
            "| {} | {} | {} → {} | `{}` |",
            v["situation"].as_str().unwrap_or_default(),
            v["outcome"].as_str().unwrap_or_default(),
            v["instances_before"],
            v["instances_after"],
            v["test"].as_str().unwrap_or_default()
        );
    }
    if !lifecycle {
        let _ = writeln!(s, "| not run | | | |");
    }
    let _ = writeln!(s, "\n### Summary\n");
    let _ = writeln!(s, "| figure | value |");
    let _ = writeln!(s, "|---|---|");
    let covered = |cloud: &str| {
        rel.get(cloud)
            .map(|v| {
                let (mut c, mut t) = (0, 0);
                for k in v["kinds"].as_object().into_iter().flatten().map(|(_, k)| k) {
                    c += num(&k["covered"]);
                    t += num(&k["total"]);
                }
                format!("{c} / {t}")
            })
            .unwrap_or_else(|| "not run".into())
    };
    let _ = writeln!(
        s,
        "| crash points covered (FakeProvider, every point) | {} |",
        covered("crash_sweep_fake")
    );
    let _ = writeln!(
        s,
        "| crash points covered (Docker subset, kill -9) | {} |",
        covered("crash_sweep_docker")
    );
    for backend in ["s3", "postgres"] {
        let _ = writeln!(
            s,
            "| crash points covered (Docker subset, kill -9, state on {backend}) | {} |",
            covered(&format!("crash_sweep_docker_{backend}"))
        );
    }
    let _ = writeln!(s, "| leaks found | {leaks} |");
    let _ = writeln!(s, "| duplicates found | {dups} |");
    let _ = writeln!(s, "| pre-existing instances destroyed | {kept} |");
    let _ = writeln!(s, "| fault-injection runs | {fault_runs} |");
    let cases = if props.is_empty() {
        "not run".to_string()
    } else {
        cases.to_string()
    };
    let _ = writeln!(
        s,
        "| bad inputs tried (property cases = fuzz executions) | {cases} |"
    );
    let _ = writeln!(
        s,
        "| secret hits | {} |",
        secret_hits.map_or("not run".into(), |h| h.to_string())
    );
    s
}

fn main() {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .filter(|d| !d.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("target"));
    let (rel, props, stale) = same_run(
        read_dir(&target.join("reliability")),
        read_dir(&target.join("properties")),
    );
    let mut body = render(&rel, &props);
    if !stale.is_empty() {
        body.push_str(&format!(
            "\nLeft out as stale (written more than 30 minutes before this run's newest figure, so their tests did not run this time): {}.\n",
            stale.join(", ")
        ));
    }
    // The checkout `cargo run` was started in: with a target directory shared between
    // clones, a compile-time CARGO_MANIFEST_DIR may name another clone.
    let doc = std::env::current_dir()
        .map(|d| d.join("RELIABILITY.md"))
        .ok()
        .filter(|d| d.exists())
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("RELIABILITY.md"));
    let text = std::fs::read_to_string(&doc).unwrap_or_default();
    let new = match (text.find(BEGIN), text.find(END)) {
        (Some(b), Some(e)) if b < e => {
            format!("{}{BEGIN}\n\n{body}\n{}", &text[..b], &text[e..])
        }
        _ => format!("{text}\n{BEGIN}\n\n{body}\n{END}\n"),
    };
    if let Err(e) = std::fs::write(&doc, new) {
        eprintln!("cannot write {}: {e}", doc.display());
        std::process::exit(1);
    }
    eprintln!(
        "{} updated from {} ({} figure files)",
        doc.display(),
        target.display(),
        rel.len() + props.len()
    );
}
