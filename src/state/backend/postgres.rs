//! The PostgreSQL backend: the state, its backup, its journal and its lock info as rows.
//!
//! Tables (created on first use, in `schema`, default `gpuprov`):
//!
//! ```text
//! states  (name PK, generation, serial, lineage, body, backup, updated_at)
//! journal (name, run, seq, body; PK (name, run, seq))   one row per journal batch
//! locks   (name PK, id, info jsonb, holder_pid)          who holds the lock
//! ```
//!
//! The lock is a session advisory lock (`pg_try_advisory_lock`, PostgreSQL manual 9.27.10)
//! on a connection of its own: it dies with the holder's session, so a killed runner
//! never leaves the state locked (its `locks` row is reported as stale and replaced).
//! Every write of the holder goes through that session, and the state row is replaced
//! only by compare-and-set on its `generation`, so a writer whose session was lost can
//! write nothing at all.
//!
//! The connection string comes from `GPUPROV_PG_CONN_STR` (else Terraform's
//! `PG_CONN_STR`), never from `gpuprov.toml`; it is a [`Secret`], and its password is
//! scrubbed from every error. TLS is rustls (ring), used as the connection string's
//! `sslmode` says, with libpq's meaning of `require`: encrypted, certificate not verified
//! (see [`EncryptOnly`]).

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use sha2::{Digest, Sha256};
use tokio_postgres::{Client, Config, NoTls};

use crate::config::BackendKind;
use crate::provider::redact::{scrub, Secret};
use crate::state::error::StateError;
use crate::state::lock::{ForceUnlockOutcome, LockError, LockInfo};

use super::bridge::Bridge;
use super::{
    Backend, BackendError, JournalBytes, JournalSink, LockAttempt, LockHandle, Stored, Version,
};

/// The environment variables holding the connection string, in the order looked at.
pub const CONN_STR_VARS: [&str; 2] = ["GPUPROV_PG_CONN_STR", "PG_CONN_STR"];

/// The connection string from [`CONN_STR_VARS`], if one is set.
pub fn connection_string_from_env() -> Option<Secret> {
    CONN_STR_VARS
        .iter()
        .find_map(|k| std::env::var(k).ok().filter(|v| !v.is_empty()))
        .map(Secret::new)
}

/// Where the PostgreSQL backend keeps a state.
#[derive(Debug, Clone)]
pub struct PostgresSettings {
    /// The connection string (`host=… user=… password=… dbname=…` or a `postgres://`
    /// URL).
    pub conn: Secret,
    /// The schema holding the tables; an SQL identifier (`[a-z_][a-z0-9_]*`).
    pub schema: String,
    /// The state's name, its rows' key.
    pub name: String,
    /// The local file the state goes to when the final save fails.
    pub errored_path: PathBuf,
}

/// The PostgreSQL backend (see the module docs).
#[derive(Debug, Clone)]
pub struct PostgresBackend {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    settings: PostgresSettings,
    config: Config,
    /// The password, to scrub from errors.
    password: Option<String>,
    location: PathBuf,
    bridge: Bridge,
    /// For reads, and for writes while this process holds no lock.
    client: Arc<Client>,
    /// The lock's own session while this process holds the lock.
    session: Mutex<Option<Arc<Client>>>,
}

impl PostgresBackend {
    /// Connects, and creates the schema and tables if they are missing.
    ///
    /// # Errors
    ///
    /// [`BackendError::Config`] for an unparsable connection string or a bad schema
    /// name, [`BackendError::Unavailable`] when the server cannot be reached or the
    /// tables cannot be created (the password is never in the message).
    pub fn connect(settings: PostgresSettings) -> Result<PostgresBackend, BackendError> {
        let config: Config = settings.conn.expose().parse().map_err(|_| BackendError::Config {
            message: format!(
                "the connection string in {} does not parse",
                CONN_STR_VARS.join(" or ")
            ),
            help: Some("use `host=… port=… user=… password=… dbname=…` or `postgres://user:password@host:port/dbname` (the PostgreSQL manual, 34.1.1)".into()),
        })?;
        if !valid_identifier(&settings.schema) {
            return Err(BackendError::Config {
                message: format!(
                    "the postgres backend's `schema` {:?} is not a plain SQL identifier",
                    settings.schema
                ),
                help: Some(
                    "use lowercase letters, digits and `_`, starting with a letter or `_`".into(),
                ),
            });
        }
        let password = config
            .get_password()
            .map(|p| String::from_utf8_lossy(p).into_owned());
        let location = PathBuf::from(format!(
            "{} ({}.states, name {})",
            describe(&config),
            settings.schema,
            settings.name
        ));
        let unavailable = |reason: String| {
            BackendError::Unavailable {
            kind: "postgres",
            location: location.display().to_string(),
            reason: scrub(&reason, password.as_deref()),
            help: Some(format!(
                "check the server is up and the connection string in {} (host, port, user, dbname, sslmode)",
                CONN_STR_VARS.join(" or ")
            )),
        }
        };
        let bridge = Bridge::new("gpuprov-pg").map_err(|e| unavailable(e.to_string()))?;
        let (c, schema) = (config.clone(), settings.schema.clone());
        let client = bridge
            .run(async move {
                let client = open_connection(&c).await?;
                create_tables(&client, &schema).await?;
                Ok::<_, String>(client)
            })
            .ok_or_else(|| unavailable("the backend's runtime stopped".into()))?
            .map_err(unavailable)?;
        Ok(PostgresBackend {
            inner: Arc::new(Inner {
                settings,
                config,
                password,
                location,
                bridge,
                client: Arc::new(client),
                session: Mutex::new(None),
            }),
        })
    }
}

/// `postgres://user@host:port/dbname`, without the password.
fn describe(c: &Config) -> String {
    let host = c
        .get_hosts()
        .first()
        .map(|h| match h {
            tokio_postgres::config::Host::Tcp(h) => h.clone(),
            tokio_postgres::config::Host::Unix(p) => p.display().to_string(),
        })
        .unwrap_or_else(|| "localhost".into());
    let port = c.get_ports().first().copied().unwrap_or(5432);
    let user = c.get_user().map(|u| format!("{u}@")).unwrap_or_default();
    let db = c.get_dbname().unwrap_or("");
    format!("postgres://{user}{host}:{port}/{db}")
}

fn valid_identifier(s: &str) -> bool {
    let mut chars = s.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_lowercase() || c == '_')
        && chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
        && s.len() <= 63
}

/// libpq's `sslmode=require` (and `prefer`): the connection is encrypted, the server's
/// certificate is not checked against a CA (PostgreSQL manual 34.19.1, table 34.1: "I
/// want my data encrypted, and I accept the overhead. I trust that the network will make
/// sure I always connect to the server I want."). tokio-postgres has no `verify-ca` /
/// `verify-full`, so gpuprov offers no verified mode; the handshake's signatures are still
/// checked, so the session is bound to the certificate presented.
#[derive(Debug)]
struct EncryptOnly(Arc<rustls::crypto::CryptoProvider>);

impl rustls::client::danger::ServerCertVerifier for EncryptOnly {
    fn verify_server_cert(
        &self,
        _end_entity: &rustls::pki_types::CertificateDer<'_>,
        _intermediates: &[rustls::pki_types::CertificateDer<'_>],
        _server_name: &rustls::pki_types::ServerName<'_>,
        _ocsp_response: &[u8],
        _now: rustls::pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        Ok(rustls::client::danger::ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &rustls::pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &rustls::pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

/// Opens a connection (TLS as `sslmode` asks) and drives it on the current runtime.
async fn open_connection(config: &Config) -> Result<Client, String> {
    let mut config = config.clone();
    config.connect_timeout(Duration::from_secs(10));
    let client = if config.get_ssl_mode() == tokio_postgres::config::SslMode::Disable {
        let (client, conn) = config.connect(NoTls).await.map_err(|e| display_error(&e))?;
        tokio::spawn(async move {
            let _ = conn.await;
        });
        client
    } else {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let tls_config = rustls::ClientConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|e| e.to_string())?
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(EncryptOnly(provider)))
            .with_no_client_auth();
        let tls = tokio_postgres_rustls::MakeRustlsConnect::new(tls_config);
        let (client, conn) = config.connect(tls).await.map_err(|e| display_error(&e))?;
        tokio::spawn(async move {
            let _ = conn.await;
        });
        client
    };
    Ok(client)
}

async fn create_tables(client: &Client, schema: &str) -> Result<(), String> {
    // Existing tables need no CREATE privilege (a role that may only read and write them).
    let present: i64 = client
        .query_one(
            &format!(
                r#"SELECT count(to_regclass(t)) FROM unnest(ARRAY['"{schema}".states', '"{schema}".journal', '"{schema}".locks']) AS t"#
            ),
            &[],
        )
        .await
        .map_err(|e| display_error(&e))?
        .get(0);
    if present == 3 {
        return Ok(());
    }
    // Serialized across processes: concurrent `CREATE … IF NOT EXISTS` can still collide.
    let sql = format!(
        r#"BEGIN;
SELECT pg_advisory_xact_lock(7140385220191938301);
CREATE SCHEMA IF NOT EXISTS "{schema}";
CREATE TABLE IF NOT EXISTS "{schema}".states (
  name text PRIMARY KEY,
  generation bigint NOT NULL,
  serial bigint NOT NULL,
  lineage text NOT NULL,
  body bytea NOT NULL,
  backup bytea,
  updated_at timestamptz NOT NULL DEFAULT now()
);
CREATE TABLE IF NOT EXISTS "{schema}".journal (
  name text NOT NULL,
  run text NOT NULL,
  seq bigint NOT NULL,
  body bytea NOT NULL,
  PRIMARY KEY (name, run, seq)
);
CREATE TABLE IF NOT EXISTS "{schema}".locks (
  name text PRIMARY KEY,
  id text NOT NULL,
  info jsonb NOT NULL,
  holder_pid integer NOT NULL
);
COMMIT;"#
    );
    client
        .batch_execute(&sql)
        .await
        .map_err(|e| display_error(&e))
}

/// The advisory lock key of a state: the first 8 bytes of SHA-256("gpuprov/<schema>/<name>").
fn lock_key(schema: &str, name: &str) -> i64 {
    let digest = Sha256::digest(format!("gpuprov/{schema}/{name}").as_bytes());
    let mut b = [0u8; 8];
    b.copy_from_slice(&digest[..8]);
    i64::from_be_bytes(b)
}

impl Inner {
    fn schema(&self) -> &str {
        &self.settings.schema
    }

    fn clean(&self, e: impl std::fmt::Display) -> String {
        // tokio-postgres's messages carry the server's `DETAIL`, never the connection
        // string; the scrub is for a password that could still appear in one.
        scrub(&e.to_string(), self.password.as_deref())
    }

    fn run<F, T>(&self, fut: F) -> Result<T, String>
    where
        F: std::future::Future<Output = Result<T, tokio_postgres::Error>> + Send + 'static,
        T: Send + 'static,
    {
        match self.bridge.run(fut) {
            Some(Ok(v)) => Ok(v),
            Some(Err(e)) => Err(self.clean(display_error(&e))),
            None => Err("the PostgreSQL backend's runtime stopped".into()),
        }
    }

    /// The connection writes go through: the lock's session while held.
    fn writer(&self) -> (Arc<Client>, bool) {
        match &*self.session.lock().unwrap_or_else(|e| e.into_inner()) {
            Some(s) => (s.clone(), true),
            None => (self.client.clone(), false),
        }
    }

    fn store(&self, action: &'static str, reason: String) -> StateError {
        StateError::Store {
            action,
            location: self.location.clone(),
            reason,
        }
    }

    fn lock_store(&self, action: &'static str, reason: String) -> LockError {
        LockError::Store {
            action,
            location: self.location.clone(),
            reason,
        }
    }

    /// A write error: a closed lock session means this run lost its lock.
    fn write_error(&self, action: &'static str, via_session: bool, reason: String) -> StateError {
        if via_session && self.writer().0.is_closed() {
            StateError::Conflict {
                location: self.location.clone(),
                what: format!(
                    "the session holding this run's lock was lost ({reason}), so another run may hold the lock now"
                ),
            }
        } else {
            self.store(action, reason)
        }
    }

    fn read_lock(&self) -> Result<Option<(String, LockInfo)>, LockError> {
        let (client, schema, name) = (
            self.client.clone(),
            self.schema().to_string(),
            self.settings.name.clone(),
        );
        let row = self
            .run(async move {
                client
                    .query_opt(
                        &format!(r#"SELECT id, info::text FROM "{schema}".locks WHERE name = $1"#),
                        &[&name],
                    )
                    .await
            })
            .map_err(|r| self.lock_store("read", r))?;
        Ok(row.map(|r| {
            let id: String = r.get(0);
            let info: String = r.get(1);
            let info = serde_json::from_str(&info).unwrap_or_else(|_| LockInfo {
                id: id.clone(),
                ..LockInfo::default()
            });
            (id, info)
        }))
    }
}

/// The server's message with its detail, as `psql` shows them.
fn display_error(e: &tokio_postgres::Error) -> String {
    match e.as_db_error() {
        Some(db) => match db.detail() {
            Some(d) => format!("{}: {d}", db.message()),
            None => db.message().to_string(),
        },
        // "error connecting to server: Connection refused (os error 111)", with causes.
        None => crate::provider::cause::display_chain(e),
    }
}

impl Backend for PostgresBackend {
    fn kind(&self) -> BackendKind {
        BackendKind::Postgres
    }

    fn location(&self) -> PathBuf {
        self.inner.location.clone()
    }

    fn read_state(&self) -> Result<Option<Stored>, StateError> {
        let i = &self.inner;
        let (client, schema, name) = (
            i.client.clone(),
            i.schema().to_string(),
            i.settings.name.clone(),
        );
        let row = i
            .run(async move {
                client
                    .query_opt(
                        &format!(
                            r#"SELECT body, generation FROM "{schema}".states WHERE name = $1"#
                        ),
                        &[&name],
                    )
                    .await
            })
            .map_err(|r| i.store("read", r))?;
        Ok(row.map(|r| Stored {
            bytes: r.get::<_, Vec<u8>>(0),
            version: Version(r.get::<_, i64>(1).to_string()),
        }))
    }

    fn write_state(&self, bytes: &[u8], expected: Option<&Version>) -> Result<Version, StateError> {
        let i = &self.inner;
        // The serial and lineage columns are for people reading the table.
        let parsed: serde_json::Value = serde_json::from_slice(bytes).unwrap_or_default();
        let serial = parsed.get("serial").and_then(|s| s.as_i64()).unwrap_or(0);
        let lineage = parsed
            .get("lineage")
            .and_then(|s| s.as_str())
            .unwrap_or("")
            .to_string();
        let expected: Option<i64> = match expected {
            Some(v) => Some(
                v.0.parse()
                    .map_err(|_| i.store("write", format!("bad version {:?}", v.0)))?,
            ),
            None => None,
        };
        let (client, via_session) = i.writer();
        let (schema, name, body) = (
            i.schema().to_string(),
            i.settings.name.clone(),
            bytes.to_vec(),
        );
        let written = i
            .run(async move {
                match expected {
                    None => {
                        client
                            .query_opt(
                                &format!(
                                    r#"INSERT INTO "{schema}".states (name, generation, serial, lineage, body)
                                       VALUES ($1, 1, $2, $3, $4)
                                       ON CONFLICT (name) DO NOTHING RETURNING generation"#
                                ),
                                &[&name, &serial, &lineage, &body],
                            )
                            .await
                    }
                    Some(g) => {
                        client
                            .query_opt(
                                &format!(
                                    r#"UPDATE "{schema}".states
                                       SET generation = generation + 1, serial = $2, lineage = $3,
                                           body = $4, updated_at = now()
                                       WHERE name = $1 AND generation = $5 RETURNING generation"#
                                ),
                                &[&name, &serial, &lineage, &body, &g],
                            )
                            .await
                    }
                }
            })
            .map_err(|r| i.write_error("write", via_session, r))?;
        match written {
            Some(row) => Ok(Version(row.get::<_, i64>(0).to_string())),
            None => Err(StateError::Conflict {
                location: i.location.clone(),
                what: match expected {
                    Some(g) => {
                        format!("another run saved it since this run read it (generation {g})")
                    }
                    None => "a state was created there since this run found none".into(),
                },
            }),
        }
    }

    fn write_backup(&self, bytes: &[u8]) -> Result<(), StateError> {
        let i = &self.inner;
        let (client, via_session) = i.writer();
        let (schema, name, body) = (
            i.schema().to_string(),
            i.settings.name.clone(),
            bytes.to_vec(),
        );
        i.run(async move {
            client
                .execute(
                    &format!(r#"UPDATE "{schema}".states SET backup = $2 WHERE name = $1"#),
                    &[&name, &body],
                )
                .await
        })
        .map(|_| ())
        .map_err(|r| i.write_error("write the backup", via_session, r))
    }

    fn errored_path(&self) -> PathBuf {
        self.inner.settings.errored_path.clone()
    }

    fn read_journals(&self) -> Result<Vec<JournalBytes>, StateError> {
        let i = &self.inner;
        let (client, schema, name) = (
            i.client.clone(),
            i.schema().to_string(),
            i.settings.name.clone(),
        );
        let rows = i
            .run(async move {
                client
                    .query(
                        &format!(
                            r#"SELECT run, body FROM "{schema}".journal WHERE name = $1 ORDER BY run, seq"#
                        ),
                        &[&name],
                    )
                    .await
            })
            .map_err(|r| i.store("read the journal", r))?;
        let mut out: Vec<(String, JournalBytes)> = Vec::new();
        for row in rows {
            let run: String = row.get(0);
            let body: Vec<u8> = row.get(1);
            match out.last_mut() {
                Some((r, j)) if *r == run => j.bytes.extend_from_slice(&body),
                _ => out.push((
                    run.clone(),
                    JournalBytes {
                        location: PathBuf::from(format!(
                            "{} journal run {run}",
                            i.location.display()
                        )),
                        bytes: body,
                    },
                )),
            }
        }
        Ok(out.into_iter().map(|(_, j)| j).collect())
    }

    fn start_journal(&self, header: &[u8]) -> Result<Box<dyn JournalSink>, StateError> {
        let i = &self.inner;
        let run = format!(
            "{:013}-{}",
            chrono::Utc::now().timestamp_millis(),
            &uuid::Uuid::new_v4().simple().to_string()[..8]
        );
        let (client, via_session) = i.writer();
        let (schema, name, r, body) = (
            i.schema().to_string(),
            i.settings.name.clone(),
            run.clone(),
            header.to_vec(),
        );
        i.run(async move {
            client
                .execute(&format!(r#"DELETE FROM "{schema}".journal WHERE name = $1"#), &[&name])
                .await?;
            client
                .execute(
                    &format!(
                        r#"INSERT INTO "{schema}".journal (name, run, seq, body) VALUES ($1, $2, 0, $3)"#
                    ),
                    &[&name, &r, &body],
                )
                .await
        })
        .map_err(|reason| i.write_error("start the journal", via_session, reason))?;
        Ok(Box::new(PgJournal {
            inner: self.inner.clone(),
            run,
            next: std::sync::atomic::AtomicI64::new(1),
        }))
    }

    fn try_lock(&self, info: &LockInfo) -> Result<LockAttempt, LockError> {
        let i = &self.inner;
        let key = lock_key(i.schema(), &i.settings.name);
        let record =
            serde_json::to_string(info).map_err(|e| i.lock_store("serialize", e.to_string()))?;
        let (config, schema, name, id) = (
            i.config.clone(),
            i.schema().to_string(),
            i.settings.name.clone(),
            info.id.clone(),
        );
        let outcome = i
            .bridge
            .run(async move {
                let session = open_connection(&config).await?;
                let got: bool = session
                    .query_one("SELECT pg_try_advisory_lock($1)", &[&key])
                    .await
                    .map_err(|e| display_error(&e))?
                    .get(0);
                if !got {
                    return Ok(None);
                }
                let stale = session
                    .query_opt(
                        &format!(r#"SELECT info::text FROM "{schema}".locks WHERE name = $1"#),
                        &[&name],
                    )
                    .await
                    .map_err(|e| display_error(&e))?
                    .map(|r| r.get::<_, String>(0));
                session
                    .execute(
                        &format!(
                            r#"INSERT INTO "{schema}".locks (name, id, info, holder_pid)
                               VALUES ($1, $2, $3::text::jsonb, pg_backend_pid())
                               ON CONFLICT (name) DO UPDATE
                               SET id = EXCLUDED.id, info = EXCLUDED.info, holder_pid = EXCLUDED.holder_pid"#
                        ),
                        &[&name, &id, &record],
                    )
                    .await
                    .map_err(|e| display_error(&e))?;
                Ok::<_, String>(Some((session, stale)))
            })
            .ok_or_else(|| i.lock_store("take", "the backend's runtime stopped".into()))?
            .map_err(|r| i.lock_store("take", i.clean(r)))?;
        match outcome {
            Some((session, stale)) => {
                *i.session.lock().unwrap_or_else(|e| e.into_inner()) = Some(Arc::new(session));
                Ok(LockAttempt::Acquired {
                    handle: Box::new(PgLock {
                        inner: self.inner.clone(),
                        id: info.id.clone(),
                    }),
                    stale: stale.and_then(|s| serde_json::from_str(&s).ok()),
                })
            }
            None => Ok(LockAttempt::Held(i.read_lock()?.map(|(_, info)| info))),
        }
    }

    fn lock_poll_interval(&self) -> Duration {
        Duration::from_millis(500)
    }

    fn lock_info(&self) -> Result<Option<LockInfo>, LockError> {
        Ok(self.inner.read_lock()?.map(|(_, info)| info))
    }

    fn force_unlock(&self, id: &str) -> Result<ForceUnlockOutcome, LockError> {
        let i = &self.inner;
        let location = i.location.clone();
        let Some((actual, info)) = i.read_lock()? else {
            return Err(LockError::NotLocked {
                lock_path: location,
            });
        };
        if actual != id {
            return Err(LockError::IdMismatch {
                lock_path: location,
                given: id.to_string(),
                actual,
            });
        }
        // The holder is alive while its session holds the advisory lock: try to take it.
        let key = lock_key(i.schema(), &i.settings.name);
        let (config, schema, name, id) = (
            i.config.clone(),
            i.schema().to_string(),
            i.settings.name.clone(),
            id.to_string(),
        );
        let cleared = i
            .bridge
            .run(async move {
                let s = open_connection(&config).await?;
                let free: bool = s
                    .query_one("SELECT pg_try_advisory_lock($1)", &[&key])
                    .await
                    .map_err(|e| display_error(&e))?
                    .get(0);
                if !free {
                    return Ok(false);
                }
                s.execute(
                    &format!(r#"DELETE FROM "{schema}".locks WHERE name = $1 AND id = $2"#),
                    &[&name, &id],
                )
                .await
                .map_err(|e| display_error(&e))?;
                s.execute("SELECT pg_advisory_unlock($1)", &[&key])
                    .await
                    .map_err(|e| display_error(&e))?;
                Ok::<_, String>(true)
            })
            .ok_or_else(|| i.lock_store("clear", "the backend's runtime stopped".into()))?
            .map_err(|r| i.lock_store("clear", i.clean(r)))?;
        if cleared {
            Ok(ForceUnlockOutcome { cleared: info })
        } else {
            Err(LockError::StillHeld {
                lock_path: location,
                info: Box::new(info),
            })
        }
    }
}

/// A held PostgreSQL lock: the session in [`Inner::session`], by this lock's id.
#[derive(Debug)]
struct PgLock {
    inner: Arc<Inner>,
    id: String,
}

impl LockHandle for PgLock {
    fn release(self: Box<Self>) -> Result<(), LockError> {
        let i = &self.inner;
        let Some(session) = i.session.lock().unwrap_or_else(|e| e.into_inner()).take() else {
            return Ok(());
        };
        let key = lock_key(i.schema(), &i.settings.name);
        let (schema, name, id) = (
            i.schema().to_string(),
            i.settings.name.clone(),
            self.id.clone(),
        );
        // Dropping the session (closing it) releases the advisory lock whatever happens.
        i.run(async move {
            session
                .execute(
                    &format!(r#"DELETE FROM "{schema}".locks WHERE name = $1 AND id = $2"#),
                    &[&name, &id],
                )
                .await?;
            session
                .execute("SELECT pg_advisory_unlock($1)", &[&key])
                .await
        })
        .map(|_| ())
        .map_err(|r| i.lock_store("release", r))
    }
}

/// One run's journal: one row per batch.
struct PgJournal {
    inner: Arc<Inner>,
    run: String,
    next: std::sync::atomic::AtomicI64,
}

impl JournalSink for PgJournal {
    fn append(&self, batch: &[u8]) -> Result<(), String> {
        let i = &self.inner;
        let seq = self.next.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let (client, via_session) = i.writer();
        let (schema, name, run, body) = (
            i.schema().to_string(),
            i.settings.name.clone(),
            self.run.clone(),
            batch.to_vec(),
        );
        i.run(async move {
            client
                .execute(
                    &format!(
                        r#"INSERT INTO "{schema}".journal (name, run, seq, body) VALUES ($1, $2, $3, $4)"#
                    ),
                    &[&name, &run, &seq, &body],
                )
                .await
        })
        .map(|_| ())
        .map_err(|r| i.write_error("append to the journal", via_session, r).to_string())
    }

    fn remove(&self) -> Result<(), StateError> {
        let i = &self.inner;
        let (client, via_session) = i.writer();
        let (schema, name, run) = (
            i.schema().to_string(),
            i.settings.name.clone(),
            self.run.clone(),
        );
        i.run(async move {
            client
                .execute(
                    &format!(r#"DELETE FROM "{schema}".journal WHERE name = $1 AND run = $2"#),
                    &[&name, &run],
                )
                .await
        })
        .map(|_| ())
        .map_err(|r| i.write_error("delete the folded journal", via_session, r))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schema_names_are_plain_identifiers() {
        assert!(valid_identifier("gpuprov"));
        assert!(valid_identifier("_team_2"));
        assert!(!valid_identifier("Team"));
        assert!(!valid_identifier("a\"; DROP TABLE x; --"));
        assert!(!valid_identifier(""));
    }

    #[test]
    fn the_description_never_holds_the_password() {
        let c: Config = "host=127.0.0.1 port=5433 user=ci password=hunter2 dbname=state"
            .parse()
            .unwrap();
        let d = describe(&c);
        assert_eq!(d, "postgres://ci@127.0.0.1:5433/state");
        let u: Config = "postgres://ci:hunter2@db.internal:6543/s".parse().unwrap();
        assert!(!describe(&u).contains("hunter2"));
    }

    #[test]
    fn lock_keys_differ_per_state() {
        assert_ne!(lock_key("gpuprov", "a"), lock_key("gpuprov", "b"));
        assert_eq!(lock_key("gpuprov", "a"), lock_key("gpuprov", "a"));
    }
}
