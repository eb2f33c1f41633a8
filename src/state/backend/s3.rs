//! The S3 backend: the state, its backup, its journal and its lock as objects in one
//! bucket of Amazon S3 or an S3-compatible store.
//!
//! Layout, for `key = "team/gpuprov.state.json"`:
//!
//! ```text
//! team/gpuprov.state.json                         the state (replaced with If-Match)
//! team/gpuprov.state.json.backup                  the state as the last run first read it
//! team/gpuprov.state.json.lock                    lock info (created with If-None-Match: *)
//! team/gpuprov.state.json.journal/<run>/<seq>     one object per journal batch
//! ```
//!
//! Conditional writes are the whole design (AWS: "Add preconditions to S3 operations
//! with conditional requests", PutObject `If-None-Match` and `If-Match`, DeleteObject
//! `If-Match`): a lock is an object only one writer can create; the state is replaced
//! only while its ETag is the one this run read, so a writer whose lock was broken can
//! never overwrite a newer state (Terraform's S3 backend does not fence its state write);
//! journal batches are created, never overwritten. Before its first write, a backend
//! checks once that the store really refuses a conditional write it must refuse (some
//! S3-compatible stores accept the headers and ignore them) and is refused otherwise
//! ([`StateError::UnsafeStore`]).
//!
//! An S3 lock does not die with its holder: a killed CI job leaves it, and the next run
//! reports it with the holder's info until `gpuprov force-unlock ID` clears it.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use aws_config::Region;
use aws_sdk_s3::config::http::HttpResponse;
use aws_sdk_s3::error::{ProvideErrorMetadata, SdkError};
use aws_sdk_s3::primitives::ByteStream;
use aws_sdk_s3::types::{Delete, ObjectIdentifier};
use aws_sdk_s3::Client;
use futures_util::StreamExt;

use crate::config::BackendKind;
use crate::provider::cause::display_chain;
use crate::state::error::StateError;
use crate::state::lock::{parse_info, ForceUnlockOutcome, LockError, LockInfo};

use super::bridge::Bridge;
use super::{
    Backend, BackendError, JournalBytes, JournalSink, LockAttempt, LockHandle, Stored, Version,
};

/// How many journal objects are fetched at once when a journal is replayed.
const FETCH_CONCURRENCY: usize = 16;
/// DeleteObjects takes at most 1,000 keys per request (S3 API reference).
const DELETE_BATCH: usize = 1000;

/// Where the S3 backend keeps a state (see [`crate::config::BackendSettings`]).
#[derive(Debug, Clone)]
pub struct S3Settings {
    /// The bucket (it must exist).
    pub bucket: String,
    /// The state object's key.
    pub key: String,
    /// The bucket's region; else the SDK's region chain (`AWS_REGION`, the profile),
    /// else `us-east-1`.
    pub region: Option<String>,
    /// The endpoint of an S3-compatible store; else AWS's.
    pub endpoint: Option<String>,
    /// Path-style addressing (`endpoint/bucket/key`), as MinIO and moto need.
    pub force_path_style: bool,
    /// The local file the state goes to when the final save fails.
    pub errored_path: PathBuf,
}

/// The S3 backend (see the module docs).
#[derive(Debug, Clone)]
pub struct S3Backend {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    settings: S3Settings,
    client: Client,
    bridge: Bridge,
    /// The conditional-write self-test, run once before the first write.
    checked: OnceLock<Result<(), (bool, String)>>,
    /// The ETag of the lock object this process holds; journal batches are written only
    /// while the lock object still has it (a force-unlocked run stops journalling).
    held: Mutex<Option<String>>,
}

impl S3Backend {
    /// Builds the client (credentials from the SDK's default chain; nothing is sent yet).
    ///
    /// # Errors
    ///
    /// [`BackendError::Unavailable`] when the backend's runtime cannot start.
    pub fn new(settings: S3Settings) -> Result<S3Backend, BackendError> {
        let unavailable = |reason: String| BackendError::Unavailable {
            kind: "s3",
            location: format!("s3://{}/{}", settings.bucket, settings.key),
            reason,
            help: None,
        };
        let bridge = Bridge::new("gpuprov-s3").map_err(|e| unavailable(e.to_string()))?;
        let region = settings.region.clone();
        let sdk = bridge
            .run(async move {
                let mut loader = crate::provider::clouds::aws::sdk_loader();
                if let Some(r) = region {
                    loader = loader.region(Region::new(r));
                }
                loader.load().await
            })
            .ok_or_else(|| unavailable("the backend's runtime stopped".into()))?;
        let mut conf =
            aws_sdk_s3::config::Builder::from(&sdk).force_path_style(settings.force_path_style);
        if sdk.region().is_none() {
            conf = conf.region(Region::new("us-east-1"));
        }
        if let Some(endpoint) = &settings.endpoint {
            conf = conf.endpoint_url(endpoint);
        }
        Ok(S3Backend {
            inner: Arc::new(Inner {
                client: Client::from_conf(conf.build()),
                settings,
                bridge,
                checked: OnceLock::new(),
                held: Mutex::new(None),
            }),
        })
    }
}

impl Inner {
    fn location_of(&self, key: &str) -> PathBuf {
        PathBuf::from(format!("s3://{}/{key}", self.settings.bucket))
    }

    fn state_location(&self) -> PathBuf {
        self.location_of(&self.settings.key)
    }

    fn lock_key(&self) -> String {
        format!("{}.lock", self.settings.key)
    }

    fn journal_prefix(&self) -> String {
        format!("{}.journal/", self.settings.key)
    }

    fn run<F>(&self, fut: F) -> Result<F::Output, String>
    where
        F: std::future::Future + Send + 'static,
        F::Output: Send + 'static,
    {
        self.bridge
            .run(fut)
            .ok_or_else(|| "the S3 backend's runtime stopped".to_string())
    }

    /// GETs `key`: its bytes and ETag, `None` when there is no such object.
    fn get(&self, key: &str) -> Result<Fetched, String> {
        let (client, bucket, key) = (
            self.client.clone(),
            self.settings.bucket.clone(),
            key.to_string(),
        );
        self.run(async move { get(&client, &bucket, &key).await })
    }

    /// PUTs `bytes` at `key` under `condition`; the new ETag.
    fn put(
        &self,
        key: &str,
        bytes: Vec<u8>,
        condition: Condition,
    ) -> Result<Result<String, PutError>, String> {
        let (client, bucket, key) = (
            self.client.clone(),
            self.settings.bucket.clone(),
            key.to_string(),
        );
        self.run(async move { put(&client, &bucket, &key, bytes, condition).await })
    }

    /// Runs the conditional-write self-test once per process (see the module docs).
    fn check_conditional_writes(&self) -> Result<(), StateError> {
        let result = self.checked.get_or_init(|| self.self_test());
        match result {
            Ok(()) => Ok(()),
            Err((true, what)) => Err(StateError::UnsafeStore {
                location: self.state_location(),
                what: what.clone(),
            }),
            Err((false, reason)) => Err(StateError::Store {
                action: "check conditional writes on",
                location: self.state_location(),
                reason: reason.clone(),
            }),
        }
    }

    /// `Err((true, what))`: the store ignored a condition; `Err((false, why))`: it could
    /// not be asked.
    fn self_test(&self) -> Result<(), (bool, String)> {
        let probe = format!(
            "{}.conditional-write-check/{}",
            self.settings.key,
            uuid::Uuid::new_v4()
        );
        let asked = |r: Result<Result<String, PutError>, String>| r.map_err(|e| (false, e));
        let first = asked(self.put(&probe, b"1".to_vec(), Condition::Create))?;
        if let Err(e) = first {
            return Err((false, e.reason));
        }
        let second = asked(self.put(&probe, b"2".to_vec(), Condition::Create))?;
        let stale = asked(self.put(
            &probe,
            b"3".to_vec(),
            Condition::Replace("\"00000000000000000000000000000000\"".into()),
        ))?;
        let _ = self.delete(&probe, None);
        match (second, stale) {
            (Ok(_), _) => Err((
                true,
                "it let a second PutObject with `If-None-Match: *` replace an existing object"
                    .into(),
            )),
            (_, Ok(_)) => Err((
                true,
                "it let a PutObject with `If-Match` on a stale ETag replace an object".into(),
            )),
            (Err(a), Err(b)) if a.precondition && b.precondition => Ok(()),
            (Err(a), Err(b)) => Err((false, if a.precondition { b.reason } else { a.reason })),
        }
    }

    /// DELETEs `key` (if `etag` is given, only while the object has it).
    fn delete(&self, key: &str, etag: Option<String>) -> Result<Result<(), PutError>, String> {
        let (client, bucket, key) = (
            self.client.clone(),
            self.settings.bucket.clone(),
            key.to_string(),
        );
        self.run(async move {
            let mut req = client.delete_object().bucket(bucket).key(key);
            if let Some(etag) = etag {
                req = req.if_match(etag);
            }
            req.send().await.map(|_| ()).map_err(|e| PutError::of(&e))
        })
    }

    /// The keys under `prefix`, in key order (every page of ListObjectsV2).
    fn list(&self, prefix: &str) -> Result<Vec<String>, StateError> {
        let (client, bucket, p) = (
            self.client.clone(),
            self.settings.bucket.clone(),
            prefix.to_string(),
        );
        let listed = self
            .run(async move {
                let mut keys = Vec::new();
                let mut pages = client
                    .list_objects_v2()
                    .bucket(bucket)
                    .prefix(p)
                    .into_paginator()
                    .send();
                while let Some(page) = pages.next().await {
                    let page = page.map_err(|e| describe(&e))?;
                    keys.extend(
                        page.contents()
                            .iter()
                            .filter_map(|o| o.key().map(String::from)),
                    );
                }
                Ok::<_, String>(keys)
            })
            .and_then(|r| r);
        let mut keys = listed.map_err(|reason| StateError::Store {
            action: "list",
            location: self.location_of(prefix),
            reason,
        })?;
        keys.sort();
        Ok(keys)
    }

    /// Deletes `keys` (DeleteObjects, 1,000 per request).
    fn delete_all(&self, keys: Vec<String>, what: &str) -> Result<(), StateError> {
        if keys.is_empty() {
            return Ok(());
        }
        let (client, bucket) = (self.client.clone(), self.settings.bucket.clone());
        let done = self
            .run(async move {
                for chunk in keys.chunks(DELETE_BATCH) {
                    let ids: Vec<ObjectIdentifier> = chunk
                        .iter()
                        .filter_map(|k| ObjectIdentifier::builder().key(k).build().ok())
                        .collect();
                    let delete = Delete::builder()
                        .set_objects(Some(ids))
                        .quiet(true)
                        .build()
                        .map_err(|e| e.to_string())?;
                    let out = client
                        .delete_objects()
                        .bucket(&bucket)
                        .delete(delete)
                        .send()
                        .await
                        .map_err(|e| describe(&e))?;
                    if let Some(err) = out.errors().first() {
                        return Err(format!(
                            "{} of {} objects not deleted, the first {}: {}",
                            out.errors().len(),
                            chunk.len(),
                            err.key().unwrap_or("?"),
                            err.message().unwrap_or("?")
                        ));
                    }
                }
                Ok(())
            })
            .and_then(|r| r);
        done.map_err(|reason| StateError::Store {
            action: "delete",
            location: self.location_of(what),
            reason,
        })
    }
}

/// A PutObject's condition.
#[derive(Debug, Clone)]
enum Condition {
    /// Only if no object has the key (`If-None-Match: *`).
    Create,
    /// Only while the object has this ETag (`If-Match`).
    Replace(String),
    /// Unconditionally (the backup, written only by the lock holder).
    None,
}

/// An object's bytes and ETag.
type Object = (Vec<u8>, String);

/// A GET's answer: the object, `None` when there is no such key, or why it failed.
type Fetched = Result<Option<Object>, GetError>;

/// Why a GET failed.
#[derive(Debug)]
struct GetError {
    reason: String,
}

/// Why a conditional PUT or DELETE failed; `precondition` when the condition did not
/// hold (412 Precondition Failed, 409 ConditionalRequestConflict, or 404 for an
/// `If-Match` on an object that is gone).
#[derive(Debug)]
struct PutError {
    precondition: bool,
    /// The HTTP status, when the store answered.
    status: Option<u16>,
    reason: String,
}

impl PutError {
    fn of<E>(e: &SdkError<E, HttpResponse>) -> PutError
    where
        E: std::error::Error + ProvideErrorMetadata + 'static,
    {
        let status = e.raw_response().map(|r| r.status().as_u16());
        let code = e.as_service_error().and_then(|s| s.code()).unwrap_or("");
        PutError {
            precondition: matches!(status, Some(412 | 409))
                || matches!(
                    code,
                    "PreconditionFailed" | "ConditionalRequestConflict" | "NoSuchKey"
                ),
            status,
            reason: describe(e),
        }
    }
}

/// A store error as a person reads it: the service's code and message (`NoSuchBucket:
/// The specified bucket does not exist`), or for no answer the transport's cause chain.
fn describe<E>(e: &SdkError<E, HttpResponse>) -> String
where
    E: std::error::Error + ProvideErrorMetadata + 'static,
{
    let status = e.raw_response().map(|r| r.status().as_u16());
    match e.as_service_error() {
        Some(s) if s.code().is_some() || s.message().is_some() => format!(
            "{}: {} (HTTP {})",
            s.code().unwrap_or("error"),
            s.message().unwrap_or("no message"),
            status.map(|c| c.to_string()).unwrap_or_else(|| "?".into())
        ),
        Some(_) => format!(
            "HTTP {}",
            status.map(|c| c.to_string()).unwrap_or_else(|| "?".into())
        ),
        None => {
            // "dispatch failure: io error: … Connection refused": the whole chain, which
            // names what failed (no credentials, no connection, a timeout).
            display_chain(e)
        }
    }
}

async fn get(client: &Client, bucket: &str, key: &str) -> Fetched {
    match client.get_object().bucket(bucket).key(key).send().await {
        Ok(out) => {
            let etag = out.e_tag().unwrap_or_default().to_string();
            let bytes = out.body.collect().await.map_err(|e| GetError {
                reason: format!("reading the body: {e}"),
            })?;
            Ok(Some((bytes.into_bytes().to_vec(), etag)))
        }
        Err(e) if e.as_service_error().is_some_and(|s| s.is_no_such_key()) => Ok(None),
        Err(e) => Err(GetError {
            reason: describe(&e),
        }),
    }
}

async fn put(
    client: &Client,
    bucket: &str,
    key: &str,
    bytes: Vec<u8>,
    condition: Condition,
) -> Result<String, PutError> {
    let mut req = client
        .put_object()
        .bucket(bucket)
        .key(key)
        .content_type("application/json")
        .body(ByteStream::from(bytes));
    req = match condition {
        Condition::Create => req.if_none_match("*"),
        Condition::Replace(etag) => req.if_match(etag),
        Condition::None => req,
    };
    match req.send().await {
        Ok(out) => Ok(out.e_tag().unwrap_or_default().to_string()),
        Err(e) => Err(PutError::of(&e)),
    }
}

impl Backend for S3Backend {
    fn kind(&self) -> BackendKind {
        BackendKind::S3
    }

    fn location(&self) -> PathBuf {
        self.inner.state_location()
    }

    fn read_state(&self) -> Result<Option<Stored>, StateError> {
        let i = &self.inner;
        let got = i.get(&i.settings.key).map_err(|reason| StateError::Store {
            action: "read",
            location: i.state_location(),
            reason,
        })?;
        match got {
            Ok(found) => Ok(found.map(|(bytes, etag)| Stored {
                bytes,
                version: Version(etag),
            })),
            Err(e) => Err(StateError::Store {
                action: "read",
                location: i.state_location(),
                reason: e.reason,
            }),
        }
    }

    fn write_state(&self, bytes: &[u8], expected: Option<&Version>) -> Result<Version, StateError> {
        let i = &self.inner;
        i.check_conditional_writes()?;
        let condition = match expected {
            Some(v) => Condition::Replace(v.0.clone()),
            None => Condition::Create,
        };
        let put = i
            .put(&i.settings.key, bytes.to_vec(), condition)
            .map_err(|reason| StateError::Store {
                action: "write",
                location: i.state_location(),
                reason,
            })?;
        match put {
            Ok(etag) => Ok(Version(etag)),
            Err(e) if e.precondition => Err(StateError::Conflict {
                location: i.state_location(),
                what: match expected {
                    Some(v) => {
                        format!("another run saved it since this run read it (ETag {})", v.0)
                    }
                    None => "a state was created there since this run found none".into(),
                },
            }),
            Err(e) => Err(StateError::Store {
                action: "write",
                location: i.state_location(),
                reason: e.reason,
            }),
        }
    }

    fn write_backup(&self, bytes: &[u8]) -> Result<(), StateError> {
        let i = &self.inner;
        let key = format!("{}.backup", i.settings.key);
        let put = i.put(&key, bytes.to_vec(), Condition::None);
        match put {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(e)) => Err(StateError::Store {
                action: "write the backup",
                location: i.location_of(&key),
                reason: e.reason,
            }),
            Err(reason) => Err(StateError::Store {
                action: "write the backup",
                location: i.location_of(&key),
                reason,
            }),
        }
    }

    fn errored_path(&self) -> PathBuf {
        self.inner.settings.errored_path.clone()
    }

    fn read_journals(&self) -> Result<Vec<JournalBytes>, StateError> {
        let i = &self.inner;
        let prefix = i.journal_prefix();
        let keys = i.list(&prefix)?;
        // `<prefix><run>/<seq>`; runs sort by their start time, batches by sequence.
        let mut runs: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for key in keys {
            if let Some((run, _seq)) = key[prefix.len()..].split_once('/') {
                runs.entry(run.to_string()).or_default().push(key);
            }
        }
        let mut out = Vec::new();
        for (run, keys) in runs {
            // A run without its header object was discarded by a later run (its lock was
            // broken and it kept writing): nothing of it can be applied.
            if !keys.first().is_some_and(|k| k.ends_with("/0000000000")) {
                tracing::warn!(run, "ignoring a discarded run's journal batches");
                continue;
            }
            let (client, bucket) = (i.client.clone(), i.settings.bucket.clone());
            let fetched = i
                .run(async move {
                    futures_util::stream::iter(keys)
                        .map(|k| {
                            let (client, bucket) = (client.clone(), bucket.clone());
                            async move { get(&client, &bucket, &k).await }
                        })
                        .buffered(FETCH_CONCURRENCY)
                        .collect::<Vec<_>>()
                        .await
                })
                .map_err(|reason| StateError::Store {
                    action: "read the journal",
                    location: i.location_of(&format!("{prefix}{run}/")),
                    reason,
                })?;
            let mut bytes = Vec::new();
            for part in fetched {
                match part {
                    Ok(Some((b, _))) => bytes.extend_from_slice(&b),
                    // Deleted while listed: a writer folded this run meanwhile.
                    Ok(None) => {}
                    Err(e) => {
                        return Err(StateError::Store {
                            action: "read the journal",
                            location: i.location_of(&format!("{prefix}{run}/")),
                            reason: e.reason,
                        })
                    }
                }
            }
            out.push(JournalBytes {
                location: i.location_of(&format!("{prefix}{run}/")),
                bytes,
            });
        }
        Ok(out)
    }

    fn start_journal(&self, header: &[u8]) -> Result<Box<dyn JournalSink>, StateError> {
        let i = &self.inner;
        i.check_conditional_writes()?;
        let prefix = i.journal_prefix();
        i.delete_all(i.list(&prefix)?, &prefix)?;
        // Start time first, so runs list in the order they started.
        let run = format!(
            "{:013}-{}",
            chrono::Utc::now().timestamp_millis(),
            &uuid::Uuid::new_v4().simple().to_string()[..8]
        );
        let journal = S3Journal {
            inner: self.inner.clone(),
            prefix: format!("{prefix}{run}/"),
            next: AtomicU64::new(0),
        };
        journal.append(header).map_err(|reason| StateError::Store {
            action: "start the journal",
            location: i.location_of(&journal.prefix),
            reason,
        })?;
        Ok(Box::new(journal))
    }

    fn try_lock(&self, info: &LockInfo) -> Result<LockAttempt, LockError> {
        let i = &self.inner;
        i.check_conditional_writes().map_err(|e| LockError::Store {
            action: "take",
            location: i.location_of(&i.lock_key()),
            reason: e.to_string(),
        })?;
        let record = serde_json::to_vec_pretty(info).map_err(|e| LockError::Store {
            action: "serialize",
            location: i.location_of(&i.lock_key()),
            reason: e.to_string(),
        })?;
        let put = i
            .put(&i.lock_key(), record, Condition::Create)
            .map_err(|reason| LockError::Store {
                action: "take",
                location: i.location_of(&i.lock_key()),
                reason,
            })?;
        match put {
            Ok(etag) => {
                *i.held.lock().unwrap_or_else(|e| e.into_inner()) = Some(etag.clone());
                Ok(LockAttempt::Acquired {
                    handle: Box::new(S3Lock {
                        inner: self.inner.clone(),
                        etag,
                    }),
                    stale: None,
                })
            }
            Err(e) if e.precondition => Ok(LockAttempt::Held(self.lock_info()?)),
            Err(e) => Err(LockError::Store {
                action: "take",
                location: i.location_of(&i.lock_key()),
                reason: e.reason,
            }),
        }
    }

    fn lock_poll_interval(&self) -> Duration {
        Duration::from_secs(1)
    }

    fn lock_info(&self) -> Result<Option<LockInfo>, LockError> {
        Ok(self.read_lock()?.map(|(info, _)| info))
    }

    fn force_unlock(&self, id: &str) -> Result<ForceUnlockOutcome, LockError> {
        let i = &self.inner;
        let lock_path = i.location_of(&i.lock_key());
        let Some((info, etag)) = self.read_lock()? else {
            return Err(LockError::NotLocked { lock_path });
        };
        if info.id != id {
            return Err(LockError::IdMismatch {
                lock_path,
                given: id.to_string(),
                actual: info.id,
            });
        }
        // Only the lock that was inspected: if it changed since, nothing is deleted.
        match i.delete(&i.lock_key(), Some(etag)) {
            Ok(Ok(())) => Ok(ForceUnlockOutcome { cleared: info }),
            Ok(Err(e)) if e.precondition => Err(LockError::IdMismatch {
                lock_path,
                given: id.to_string(),
                actual: "(another lock, taken meanwhile)".into(),
            }),
            Ok(Err(e)) => Err(LockError::Store {
                action: "clear",
                location: lock_path,
                reason: e.reason,
            }),
            Err(reason) => Err(LockError::Store {
                action: "clear",
                location: lock_path,
                reason,
            }),
        }
    }
}

impl S3Backend {
    /// The lock object's info and ETag, `None` when there is none. An object that does
    /// not parse is reported with empty info (its id unknown), so it is still shown.
    fn read_lock(&self) -> Result<Option<(LockInfo, String)>, LockError> {
        let i = &self.inner;
        let got = i.get(&i.lock_key()).map_err(|reason| LockError::Store {
            action: "read",
            location: i.location_of(&i.lock_key()),
            reason,
        })?;
        match got {
            Ok(Some((bytes, etag))) => Ok(Some((parse_info(&bytes).unwrap_or_default(), etag))),
            Ok(None) => Ok(None),
            Err(e) => Err(LockError::Store {
                action: "read",
                location: i.location_of(&i.lock_key()),
                reason: e.reason,
            }),
        }
    }
}

/// A held S3 lock: the lock object this run created, by its ETag.
#[derive(Debug)]
struct S3Lock {
    inner: Arc<Inner>,
    etag: String,
}

impl LockHandle for S3Lock {
    fn release(self: Box<Self>) -> Result<(), LockError> {
        let i = &self.inner;
        i.held.lock().unwrap_or_else(|e| e.into_inner()).take();
        // `If-Match`: a lock force-unlocked and taken by another run is not ours to
        // delete; then there is nothing of ours left to release.
        match i.delete(&i.lock_key(), Some(self.etag.clone())) {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) if e.precondition => Ok(()),
            Ok(Err(e)) => Err(LockError::Store {
                action: "release",
                location: i.location_of(&i.lock_key()),
                reason: e.reason,
            }),
            Err(reason) => Err(LockError::Store {
                action: "release",
                location: i.location_of(&i.lock_key()),
                reason,
            }),
        }
    }
}

/// One run's journal: each batch an object `<prefix><seq>`, created, never replaced.
struct S3Journal {
    inner: Arc<Inner>,
    prefix: String,
    next: AtomicU64,
}

impl S3Journal {
    /// Fences the journal: while this process holds the lock, a batch is written only if
    /// the lock object still has the ETag it was created with (a HEAD with `If-Match`).
    /// A run whose lock was force-unlocked stops here, so its machines stop with it
    /// instead of journalling into a state another run now owns.
    fn still_locked(&self) -> Result<(), String> {
        let i = &self.inner;
        let Some(etag) = i.held.lock().unwrap_or_else(|e| e.into_inner()).clone() else {
            return Ok(());
        };
        let (client, bucket, key) = (i.client.clone(), i.settings.bucket.clone(), i.lock_key());
        let checked = i.run(async move {
            client
                .head_object()
                .bucket(bucket)
                .key(key)
                .if_match(etag)
                .send()
                .await
                .map(|_| ())
                .map_err(|e| PutError::of(&e))
        })?;
        match checked {
            Ok(()) => Ok(()),
            Err(e) if e.precondition || e.status == Some(404) => Err(format!(
                "this run's lock at s3://{}/{} was broken (force-unlock) or taken by another run: nothing more is journalled, and the state is not saved by this run",
                i.settings.bucket,
                i.lock_key()
            )),
            Err(e) => Err(e.reason),
        }
    }
}

impl JournalSink for S3Journal {
    fn append(&self, batch: &[u8]) -> Result<(), String> {
        self.still_locked()?;
        // Batches are appended one at a time (the writer's group commit), so the
        // sequence is dense.
        let seq = self.next.fetch_add(1, Ordering::SeqCst);
        let key = format!("{}{seq:010}", self.prefix);
        match self.inner.put(&key, batch.to_vec(), Condition::Create)? {
            Ok(_) => Ok(()),
            Err(e) => Err(format!(
                "s3://{}/{key}: {}",
                self.inner.settings.bucket, e.reason
            )),
        }
    }

    fn remove(&self) -> Result<(), StateError> {
        let n = self.next.load(Ordering::SeqCst);
        let keys = (0..n)
            .map(|seq| format!("{}{seq:010}", self.prefix))
            .collect();
        self.inner.delete_all(keys, &self.prefix)
    }
}
