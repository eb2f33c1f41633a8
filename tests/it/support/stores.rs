//! Real state stores on loopback for the backend tests: moto's S3 (one server per
//! store, a fresh bucket) and a throwaway PostgreSQL cluster (`initdb` + `pg_ctl` in a
//! temp dir, as the `postgres` user when the tests run as root, with a password so the
//! secret sweep has one to look for). Each is stopped on drop.

use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use gpuprov::config::{BackendKind, BackendSettings};
use gpuprov::state::backend::bridge::Bridge;
use gpuprov::state::Backend;

use crate::aws_moto::Moto;

/// The fake AWS secret the S3 tests use; the sweep checks it is stored nowhere.
pub const AWS_SECRET: &str = "s3-secret-d41d8cd98f00b204e9800998ecf8427e";

/// A store the CLI and the library can both be pointed at.
pub trait Store {
    /// The `[backend]` settings of this store.
    fn settings(&self) -> BackendSettings;
    /// The environment a gpuprov process needs to reach it (credentials, connection
    /// string).
    fn env(&self) -> Vec<(String, String)>;
    /// The secret values that must never be stored or printed.
    fn secrets(&self) -> Vec<String>;
    /// Everything the store holds, as text, for the secret sweep.
    fn dump(&self) -> String;

    /// Opens a backend on this store from the test process (the env applied first).
    fn open(&self) -> Arc<dyn Backend> {
        for (k, v) in self.env() {
            // Each test is its own process (nextest), so this touches no other test.
            std::env::set_var(k, v);
        }
        gpuprov::state::open_backend(
            &self.settings(),
            Path::new("unused.state.json"),
            &std::env::temp_dir(),
        )
        .unwrap()
    }
}

/// moto's S3 with one bucket, and a signed client to look inside it.
pub struct S3Store {
    pub moto: Moto,
    pub bucket: String,
    /// Overrides the endpoint (a proxy in front of moto).
    pub endpoint: Option<String>,
    client: aws_sdk_s3::Client,
    bridge: Bridge,
}

impl S3Store {
    pub fn start() -> S3Store {
        let moto = Moto::start();
        let bucket = format!(
            "gpuprov-state-{}",
            &uuid::Uuid::new_v4().simple().to_string()[..8]
        );
        let conf = aws_sdk_s3::config::Builder::new()
            .behavior_version(aws_sdk_s3::config::BehaviorVersion::latest())
            .region(aws_sdk_s3::config::Region::new("us-east-1"))
            .endpoint_url(moto.url())
            .force_path_style(true)
            .credentials_provider(aws_sdk_s3::config::Credentials::new(
                "AKIAGPUPROVTEST",
                AWS_SECRET,
                None,
                None,
                "test",
            ))
            .http_client(
                aws_smithy_http_client::Builder::new()
                    .tls_provider(aws_smithy_http_client::tls::Provider::Rustls(
                        aws_smithy_http_client::tls::rustls_provider::CryptoMode::Ring,
                    ))
                    .build_https(),
            )
            .build();
        let client = aws_sdk_s3::Client::from_conf(conf);
        let bridge = Bridge::new("test-s3").unwrap();
        let (c, b) = (client.clone(), bucket.clone());
        bridge
            .run(async move { c.create_bucket().bucket(b).send().await })
            .unwrap()
            .expect("create the bucket");
        S3Store {
            moto,
            bucket,
            endpoint: None,
            client,
            bridge,
        }
    }

    /// The keys in the bucket.
    pub fn keys(&self) -> Vec<String> {
        let (c, b) = (self.client.clone(), self.bucket.clone());
        self.bridge
            .run(async move { c.list_objects_v2().bucket(b).send().await })
            .unwrap()
            .expect("list the bucket")
            .contents()
            .iter()
            .filter_map(|o| o.key().map(String::from))
            .collect()
    }

    /// Writes one object (as a stray writer would).
    pub fn put(&self, key: &str, bytes: &[u8]) {
        let (c, b, k, body) = (
            self.client.clone(),
            self.bucket.clone(),
            key.to_string(),
            bytes.to_vec(),
        );
        self.bridge
            .run(async move {
                c.put_object()
                    .bucket(b)
                    .key(k)
                    .body(aws_sdk_s3::primitives::ByteStream::from(body))
                    .send()
                    .await
            })
            .unwrap()
            .expect("put");
    }

    /// One object's bytes; `None` when there is no such object.
    pub fn get(&self, key: &str) -> Option<Vec<u8>> {
        let (c, b, k) = (self.client.clone(), self.bucket.clone(), key.to_string());
        self.bridge
            .run(async move {
                match c.get_object().bucket(b).key(k).send().await {
                    Ok(o) => Some(o.body.collect().await.unwrap().into_bytes().to_vec()),
                    Err(e) if e.as_service_error().is_some_and(|s| s.is_no_such_key()) => None,
                    Err(e) => panic!("get: {e:?}"),
                }
            })
            .unwrap()
    }
}

impl Store for S3Store {
    fn settings(&self) -> BackendSettings {
        BackendSettings {
            kind: BackendKind::S3,
            bucket: Some(self.bucket.clone()),
            key: Some("team/gpuprov.state.json".into()),
            region: Some("us-east-1".into()),
            endpoint: Some(self.endpoint.clone().unwrap_or_else(|| self.moto.url())),
            force_path_style: Some(true),
            ..Default::default()
        }
    }

    fn env(&self) -> Vec<(String, String)> {
        vec![
            ("AWS_ACCESS_KEY_ID".into(), "AKIAGPUPROVTEST".into()),
            ("AWS_SECRET_ACCESS_KEY".into(), AWS_SECRET.into()),
            ("AWS_REGION".into(), "us-east-1".into()),
            ("AWS_EC2_METADATA_DISABLED".into(), "true".into()),
        ]
    }

    fn secrets(&self) -> Vec<String> {
        vec![AWS_SECRET.into()]
    }

    fn dump(&self) -> String {
        self.keys()
            .iter()
            .map(|k| {
                format!(
                    "== {k}\n{}\n",
                    String::from_utf8_lossy(&self.get(k).unwrap_or_default())
                )
            })
            .collect()
    }
}

/// A throwaway PostgreSQL cluster.
pub struct PgStore {
    dir: PathBuf,
    pub port: u16,
    password: String,
    pub schema: String,
    _tmp: tempfile::TempDir,
}

fn pg_bin(name: &str) -> PathBuf {
    for v in ["17", "16", "15", "14", "13"] {
        let p = PathBuf::from(format!("/usr/lib/postgresql/{v}/bin/{name}"));
        if p.exists() {
            return p;
        }
    }
    PathBuf::from(name)
}

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// `cmd` as the `postgres` user when we are root (initdb refuses root).
fn as_pg(bin: &Path) -> Command {
    if is_root() {
        let mut c = Command::new("runuser");
        c.args(["-u", "postgres", "--"]).arg(bin);
        c
    } else {
        Command::new(bin)
    }
}

impl PgStore {
    pub fn start() -> PgStore {
        let tmp = tempfile::Builder::new()
            .prefix("gpuprov-pg-")
            .tempdir()
            .unwrap();
        let dir = tmp.path().join("data");
        let password = format!("pg-secret-{}", uuid::Uuid::new_v4().simple());
        let pwfile = tmp.path().join("pw");
        std::fs::write(&pwfile, &password).unwrap();
        if is_root() {
            let out = Command::new("chown")
                .args(["-R", "postgres:postgres"])
                .arg(tmp.path())
                .output()
                .unwrap();
            assert!(out.status.success(), "chown: {out:?}");
        }
        let out = as_pg(&pg_bin("initdb"))
            .arg("-D")
            .arg(&dir)
            .args(["-U", "gpuprov", "--auth=scram-sha-256", "--no-sync"])
            .arg(format!("--pwfile={}", pwfile.display()))
            .stdin(Stdio::null())
            .output()
            .unwrap_or_else(|e| panic!("PostgreSQL's initdb is needed for the postgres backend tests ({e}); install Debian's `postgresql` package"));
        assert!(
            out.status.success(),
            "initdb failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let log = tmp.path().join("log");
        let out = as_pg(&pg_bin("pg_ctl"))
            .arg("-D")
            .arg(&dir)
            .arg("-l")
            .arg(&log)
            .arg("-o")
            .arg(format!(
                "-p {port} -c listen_addresses=127.0.0.1 -k {} -c fsync=off",
                tmp.path().display()
            ))
            .args(["-w", "-t", "60", "start"])
            .stdin(Stdio::null())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "pg_ctl start failed: {}{}",
            String::from_utf8_lossy(&out.stderr),
            std::fs::read_to_string(&log).unwrap_or_default()
        );
        let deadline = Instant::now() + Duration::from_secs(30);
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(
                Instant::now() < deadline,
                "PostgreSQL did not listen on {port}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        PgStore {
            dir,
            port,
            password,
            schema: format!(
                "gpuprov_{}",
                &uuid::Uuid::new_v4().simple().to_string()[..8]
            ),
            _tmp: tmp,
        }
    }

    pub fn conn_str(&self) -> String {
        format!(
            "host=127.0.0.1 port={} user=gpuprov password={} dbname=postgres sslmode=disable",
            self.port, self.password
        )
    }

    /// Runs `sql` with psql; its output (`-At`).
    pub fn psql(&self, sql: &str) -> String {
        let out = Command::new(pg_bin("psql"))
            .args(["-At", "-h", "127.0.0.1", "-U", "gpuprov", "-d", "postgres"])
            .arg("-p")
            .arg(self.port.to_string())
            .arg("-c")
            .arg(sql)
            .env("PGPASSWORD", &self.password)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "psql {sql}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }
}

impl Store for PgStore {
    fn settings(&self) -> BackendSettings {
        BackendSettings {
            kind: BackendKind::Postgres,
            schema: Some(self.schema.clone()),
            name: Some("team".into()),
            ..Default::default()
        }
    }

    fn env(&self) -> Vec<(String, String)> {
        vec![("GPUPROV_PG_CONN_STR".into(), self.conn_str())]
    }

    fn secrets(&self) -> Vec<String> {
        vec![self.password.clone()]
    }

    fn dump(&self) -> String {
        let s = &self.schema;
        [
            format!("SELECT name, generation, serial, lineage, convert_from(body, 'UTF8'), coalesce(convert_from(backup, 'UTF8'), '') FROM {s}.states"),
            format!("SELECT name, run, seq, convert_from(body, 'UTF8') FROM {s}.journal"),
            format!("SELECT name, id, info::text, holder_pid FROM {s}.locks"),
        ]
        .iter()
        .map(|q| self.psql(q))
        .collect::<Vec<_>>()
        .join("\n")
    }
}

impl Drop for PgStore {
    fn drop(&mut self) {
        let _ = as_pg(&pg_bin("pg_ctl"))
            .arg("-D")
            .arg(&self.dir)
            .args(["-m", "immediate", "stop"])
            .stdin(Stdio::null())
            .output();
    }
}

/// `settings` with the state under its own `name`: the S3 key `<name>/gpuprov.state.json`,
/// the PostgreSQL state name `name`, the local file `<name>.state.json`.
pub fn named(mut settings: BackendSettings, name: &str) -> BackendSettings {
    match settings.kind {
        BackendKind::S3 => settings.key = Some(format!("{name}/gpuprov.state.json")),
        BackendKind::Postgres => settings.name = Some(name.to_string()),
        BackendKind::Local => settings.path = Some(PathBuf::from(format!("{name}.state.json"))),
    }
    settings
}

/// `GPUPROV_BACKEND_CONFIG` (comma-separated `KEY=VALUE`) for `settings`.
pub fn backend_config(settings: &BackendSettings) -> String {
    let t = toml::Table::try_from(settings).unwrap();
    t.iter()
        .map(|(k, v)| match v {
            toml::Value::String(s) => format!("{k}={s}"),
            other => format!("{k}={other}"),
        })
        .collect::<Vec<_>>()
        .join(",")
}
