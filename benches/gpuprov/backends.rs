//! Figure 2b: journalling cost per state backend. The apply of figure 2 (N VMs on the
//! FakeProvider through the real engine and journal) with its state, journal and lock on
//! each backend, served on loopback: the local file, moto's S3 (`moto[server]`), and a
//! throwaway PostgreSQL cluster (Debian's `postgresql`: `initdb`, `pg_ctl`). A backend
//! whose server cannot be started here is reported as not run, never as zero.

use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use gpuprov::config::{BackendKind, BackendSettings};
use gpuprov::state::Backend;
use serde_json::{json, Value};

use super::{apply_fleet_on, fake_cloud, Opts};

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .unwrap()
}

fn wait_listening(port: u16) -> bool {
    let deadline = Instant::now() + Duration::from_secs(30);
    while Instant::now() < deadline {
        if TcpStream::connect(("127.0.0.1", port)).is_ok() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    false
}

/// A server process, stopped on drop.
struct Server {
    child: Option<Child>,
    stop: Option<Command>,
    _dir: Option<tempfile::TempDir>,
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(mut c) = self.stop.take() {
            let _ = c.output();
        }
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn moto() -> Option<(Server, BackendSettings)> {
    let port = free_port();
    let child = Command::new("python3")
        .args([
            "-m",
            "moto.server",
            "-H",
            "127.0.0.1",
            "-p",
            &port.to_string(),
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .ok()?;
    let server = Server {
        child: Some(child),
        stop: None,
        _dir: None,
    };
    if !wait_listening(port) {
        return None;
    }
    std::env::set_var("AWS_ACCESS_KEY_ID", "bench");
    std::env::set_var("AWS_SECRET_ACCESS_KEY", "bench");
    std::env::set_var("AWS_EC2_METADATA_DISABLED", "true");
    // moto creates the bucket on an unsigned PUT.
    let mut s = TcpStream::connect(("127.0.0.1", port)).ok()?;
    use std::io::{Read, Write};
    write!(
        s,
        "PUT /bench HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut answer = String::new();
    let _ = s.read_to_string(&mut answer);
    answer.starts_with("HTTP/1.1 200").then_some(())?;
    Some((
        server,
        BackendSettings {
            kind: BackendKind::S3,
            bucket: Some("bench".into()),
            key: Some("bench/gpuprov.state.json".into()),
            region: Some("us-east-1".into()),
            endpoint: Some(format!("http://127.0.0.1:{port}")),
            force_path_style: Some(true),
            ..Default::default()
        },
    ))
}

fn pg_bin(name: &str) -> Option<PathBuf> {
    ["17", "16", "15", "14", "13"]
        .iter()
        .map(|v| PathBuf::from(format!("/usr/lib/postgresql/{v}/bin/{name}")))
        .find(|p| p.exists())
}

fn as_postgres(bin: PathBuf) -> Command {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        let mut c = Command::new("runuser");
        c.args(["-u", "postgres", "--"]).arg(bin);
        c
    } else {
        Command::new(bin)
    }
}

fn postgres() -> Option<(Server, BackendSettings)> {
    let dir = tempfile::Builder::new()
        .prefix("gpuprov-bench-pg-")
        .tempdir()
        .ok()?;
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        Command::new("chown")
            .args(["-R", "postgres:postgres"])
            .arg(dir.path())
            .output()
            .ok()?;
    }
    let data = dir.path().join("data");
    let ok = as_postgres(pg_bin("initdb")?)
        .arg("-D")
        .arg(&data)
        .args(["-U", "bench", "--auth=trust", "--no-sync"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .ok()?
        .success();
    if !ok {
        return None;
    }
    let port = free_port();
    let ok = as_postgres(pg_bin("pg_ctl")?)
        .arg("-D")
        .arg(&data)
        .arg("-l")
        .arg(dir.path().join("log"))
        .arg("-o")
        // Durable commits, as in production: the figure includes the WAL fsync.
        .arg(format!(
            "-p {port} -c listen_addresses=127.0.0.1 -k {}",
            dir.path().display()
        ))
        .args(["-w", "start"])
        .stdout(Stdio::null())
        .status()
        .ok()?
        .success();
    let mut stop = as_postgres(pg_bin("pg_ctl")?);
    stop.arg("-D").arg(&data).args(["-m", "immediate", "stop"]);
    let server = Server {
        child: None,
        stop: Some(stop),
        _dir: Some(dir),
    };
    if !ok || !wait_listening(port) {
        return None;
    }
    std::env::set_var(
        "GPUPROV_PG_CONN_STR",
        format!("host=127.0.0.1 port={port} user=bench dbname=postgres sslmode=disable"),
    );
    Some((
        server,
        BackendSettings {
            kind: BackendKind::Postgres,
            ..Default::default()
        },
    ))
}

/// Rows `{backend, vms, transitions, batches, bytes_per_apply, journal_ms_per_transition,
/// apply_wall_ms}` for 100 and 1,000 VMs (10 and 100 with `--quick`).
pub fn bench(rt: &tokio::runtime::Runtime, o: &Opts) -> Vec<Value> {
    let sizes: &[usize] = if o.quick { &[10, 100] } else { &[100, 1000] };
    let dir = tempfile::tempdir().unwrap();
    let mut rows = Vec::new();
    for kind in ["local", "s3", "postgres"] {
        let server = match kind {
            "local" => Some((
                Server {
                    child: None,
                    stop: None,
                    _dir: None,
                },
                BackendSettings::default(),
            )),
            "s3" => moto(),
            _ => postgres(),
        };
        let Some((_server, settings)) = server else {
            rows.push(json!({"backend": kind, "not_run": "its server could not be started here"}));
            continue;
        };
        for &n in sizes {
            let mut s = settings.clone();
            match s.kind {
                BackendKind::S3 => s.key = Some(format!("bench-{n}/gpuprov.state.json")),
                BackendKind::Postgres => s.name = Some(format!("bench-{n}")),
                BackendKind::Local => s.path = Some(dir.path().join(format!("{n}.json"))),
            }
            let backend: Arc<dyn Backend> =
                gpuprov::state::open_backend(&s, &dir.path().join("x.json"), dir.path()).unwrap();
            let cloud = fake_cloud(Duration::ZERO, Duration::from_millis(1), 1, None);
            let run = rt.block_on(apply_fleet_on(backend, cloud, n, n.min(1000)));
            assert_eq!(run.ready, n, "every VM comes up on {kind}");
            let transitions = run.journal.appends.max(1);
            rows.push(json!({
                "backend": kind,
                "vms": n,
                "transitions": run.journal.appends,
                "batches": run.journal.syncs,
                "journal_bytes": run.journal.bytes,
                "state_bytes": run.state_bytes,
                "bytes_per_apply": run.journal.bytes + run.state_bytes,
                "journal_ms_per_transition": run.journal.busy.as_secs_f64() * 1000.0 / transitions as f64,
                "apply_wall_ms": run.wall.as_secs_f64() * 1000.0,
            }));
        }
    }
    rows
}

pub fn print(rows: &Value) {
    println!("\n2b. journal cost per state backend (servers on loopback; same apply as figure 2)");
    println!(
        "   {:>8}  {:>6}  {:>11}  {:>8}  {:>15}  {:>13}  {:>10}",
        "backend", "VMs", "transitions", "batches", "bytes per apply", "ms/transition", "apply ms"
    );
    for row in rows.as_array().into_iter().flatten() {
        if let Some(why) = row.get("not_run") {
            println!(
                "   {:>8}  not run: {why}",
                row["backend"].as_str().unwrap_or("?")
            );
            continue;
        }
        println!(
            "   {:>8}  {:>6}  {:>11}  {:>8}  {:>15}  {:>13.3}  {:>10.0}",
            row["backend"].as_str().unwrap_or("?"),
            row["vms"].as_u64().unwrap_or(0),
            row["transitions"].as_u64().unwrap_or(0),
            row["batches"].as_u64().unwrap_or(0),
            row["bytes_per_apply"].as_u64().unwrap_or(0),
            row["journal_ms_per_transition"].as_f64().unwrap_or(0.0),
            row["apply_wall_ms"].as_f64().unwrap_or(0.0),
        );
    }
}
