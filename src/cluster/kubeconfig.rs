//! The kubeconfig k3s writes on the host (`/etc/rancher/k3s/k3s.yaml`), rewritten for the
//! user's machine, and merged into the user's own kubeconfig on request (design 4.5,
//! `FetchingKubeconfig`).
//!
//! k3s writes one cluster, one user and one context, all named `default`, with the server
//! `https://127.0.0.1:6443` (k3s docs, "Cluster Access"). gpuprov renames all three
//! `gpuprov-<vm>` so several VMs can live in one kubeconfig, and points the server at the
//! access path the user will use: the public host (`Direct`) or the local end of
//! `gpuprov tunnel` (`SshTunnel`).
//!
//! A kubeconfig holds a client key. Nothing here prints one: `Debug` of a user entry
//! shows its name only, and parse errors carry a line and column, never the text.

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};
use serde_yaml::Value;
use thiserror::Error;

use super::san::San;

/// The Kubernetes API port k3s serves (k3s docs, "Inbound Rules": 6443/tcp).
pub const API_PORT: u16 = 6443;

/// How the user reaches the VM's Kubernetes API.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ApiAccess {
    /// The cloud opened 6443: connect to the VM's public host.
    Direct { host: String },
    /// `gpuprov tunnel <vm>` forwards `127.0.0.1:<local_port>` to the VM's 6443.
    SshTunnel { local_port: u16 },
}

impl ApiAccess {
    /// The host the client connects to, which the API certificate must cover.
    pub fn host(&self) -> &str {
        match self {
            ApiAccess::Direct { host } => host,
            ApiAccess::SshTunnel { .. } => "127.0.0.1",
        }
    }

    /// The `server` URL: `https://<host>:6443` or `https://127.0.0.1:<local_port>`
    /// (IPv6 hosts in brackets).
    ///
    /// Errors: a host that is not an IP or DNS name.
    pub fn server_url(&self) -> Result<String, KubeconfigError> {
        let (host, port) = match self {
            ApiAccess::Direct { host } => (host.as_str(), API_PORT),
            ApiAccess::SshTunnel { local_port } => ("127.0.0.1", *local_port),
        };
        let san = San::parse(host).map_err(|_| KubeconfigError::BadHost(host.to_string()))?;
        Ok(match san {
            San::Ip(std::net::IpAddr::V6(ip)) => format!("https://[{ip}]:{port}"),
            other => format!("https://{other}:{port}"),
        })
    }
}

/// The name gpuprov gives a VM's cluster, user and context.
pub fn entry_name(vm: &str) -> String {
    format!("gpuprov-{vm}")
}

#[derive(Debug, Error, PartialEq, Eq)]
pub enum KubeconfigError {
    /// Carries the position only: the text may hold a private key.
    /// `reason` is the parser's message with every quoted value removed (a value may be
    /// a key); field names stay.
    #[error(
        "the kubeconfig is not valid YAML of the expected shape (at line {line}, column {column}: {reason})"
    )]
    Parse {
        line: usize,
        column: usize,
        reason: String,
    },
    #[error("the kubeconfig from k3s has {clusters} clusters, {users} users and {contexts} contexts; expected one of each")]
    NotSingle {
        clusters: usize,
        users: usize,
        contexts: usize,
    },
    #[error("`{0}` is not a host name or IP address for the API server")]
    BadHost(String),
    #[error("could not write the kubeconfig as YAML")]
    Serialize,
}

/// A kubeconfig (`apiVersion: v1`, `kind: Config`). Fields gpuprov does not use are kept
/// as they were, so a merge into the user's file loses nothing.
#[derive(Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct Kubeconfig {
    #[serde(rename = "apiVersion", default = "v1")]
    pub api_version: String,
    #[serde(default = "config_kind")]
    pub kind: String,
    #[serde(default, deserialize_with = "null_as_empty")]
    pub clusters: Vec<NamedCluster>,
    #[serde(default, deserialize_with = "null_as_empty")]
    pub contexts: Vec<NamedContext>,
    #[serde(default, deserialize_with = "null_as_empty")]
    pub users: Vec<NamedUser>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub current_context: Option<String>,
    #[serde(flatten)]
    pub other: BTreeMap<String, Value>,
}

/// The parser's message without its position (reported apart) and with every
/// double-quoted or single-quoted value cut out, so no scalar of the file, which may be a
/// key, reaches an error message.
fn safe_reason(msg: &str) -> String {
    let msg = msg.split(" at line ").next().unwrap_or(msg);
    let mut out = String::new();
    let mut quote: Option<char> = None;
    for c in msg.chars() {
        match quote {
            Some(q) if c == q => quote = None,
            Some(_) => {}
            None if c == '"' || c == '\'' => {
                quote = Some(c);
                out.push_str("<value>");
            }
            None => out.push(c),
        }
    }
    out.trim().to_string()
}

/// kubectl writes an empty list as `null` (`clusters: null`); read it as empty.
fn null_as_empty<'de, D, T>(d: D) -> Result<Vec<T>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: Deserialize<'de>,
{
    Ok(Option::<Vec<T>>::deserialize(d)?.unwrap_or_default())
}

fn v1() -> String {
    "v1".into()
}

fn config_kind() -> String {
    "Config".into()
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NamedCluster {
    pub name: String,
    pub cluster: Cluster,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Cluster {
    /// Empty when absent (kubectl accepts a cluster without one).
    #[serde(default)]
    pub server: String,
    /// `certificate-authority-data` and anything else, kept verbatim.
    #[serde(flatten)]
    pub other: BTreeMap<String, Value>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NamedContext {
    pub name: String,
    pub context: Context,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Context {
    #[serde(default)]
    pub cluster: String,
    #[serde(default)]
    pub user: String,
    #[serde(flatten)]
    pub other: BTreeMap<String, Value>,
}

/// A user entry; its credentials (client certificate and key, tokens) are opaque.
#[derive(Clone, PartialEq, Serialize, Deserialize)]
pub struct NamedUser {
    pub name: String,
    #[serde(default)]
    pub user: Value,
}

impl fmt::Debug for NamedUser {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NamedUser")
            .field("name", &self.name)
            .field("user", &"<redacted>")
            .finish()
    }
}

impl fmt::Debug for Kubeconfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Kubeconfig")
            .field("clusters", &self.clusters)
            .field("contexts", &self.contexts)
            .field("users", &self.users)
            .field("current_context", &self.current_context)
            .finish_non_exhaustive()
    }
}

impl Kubeconfig {
    /// An empty kubeconfig, as a user without `~/.kube/config` has.
    pub fn empty() -> Kubeconfig {
        Kubeconfig {
            api_version: v1(),
            kind: config_kind(),
            clusters: Vec::new(),
            contexts: Vec::new(),
            users: Vec::new(),
            current_context: None,
            other: BTreeMap::new(),
        }
    }

    /// Parses a kubeconfig. An empty document is an empty kubeconfig.
    ///
    /// Errors: invalid YAML or a wrong shape, with its position only.
    pub fn parse(text: &str) -> Result<Kubeconfig, KubeconfigError> {
        if text.trim().is_empty() {
            return Ok(Kubeconfig::empty());
        }
        serde_yaml::from_str(text).map_err(|e| {
            let (line, column) = e.location().map_or((0, 0), |l| (l.line(), l.column()));
            KubeconfigError::Parse {
                line,
                column,
                reason: safe_reason(&e.to_string()),
            }
        })
    }

    /// The YAML text.
    pub fn to_yaml(&self) -> Result<String, KubeconfigError> {
        serde_yaml::to_string(self).map_err(|_| KubeconfigError::Serialize)
    }

    /// The kubeconfig for VM `vm` from the `k3s.yaml` text: its single cluster, user and
    /// context renamed [`entry_name`], the server set by `access`, current context set to
    /// it (this file is the VM's own).
    ///
    /// Errors: unparsable text, not exactly one cluster, user and context, a bad host.
    pub fn from_k3s(
        k3s_yaml: &str,
        vm: &str,
        access: &ApiAccess,
    ) -> Result<Kubeconfig, KubeconfigError> {
        let k = Kubeconfig::parse(k3s_yaml)?;
        let ([cluster], [user], [context]) = (&k.clusters[..], &k.users[..], &k.contexts[..])
        else {
            return Err(KubeconfigError::NotSingle {
                clusters: k.clusters.len(),
                users: k.users.len(),
                contexts: k.contexts.len(),
            });
        };
        let name = entry_name(vm);
        let mut cluster = cluster.clone();
        cluster.name = name.clone();
        cluster.cluster.server = access.server_url()?;
        let mut user = user.clone();
        user.name = name.clone();
        let mut context = context.clone();
        context.name = name.clone();
        context.context.cluster = name.clone();
        context.context.user = name.clone();
        Ok(Kubeconfig {
            clusters: vec![cluster],
            users: vec![user],
            contexts: vec![context],
            current_context: Some(name),
            ..k
        })
    }

    /// Merges `new` into `self` (the user's kubeconfig): entries with a name in `new`
    /// replace the same-named ones in place, others are appended; everything else is
    /// kept. The current context changes only when `use_context` is true (then it becomes
    /// `new`'s current context).
    pub fn merge(&mut self, new: &Kubeconfig, use_context: bool) {
        fn upsert<T: Clone>(into: &mut Vec<T>, from: &[T], name: impl Fn(&T) -> &str) {
            for item in from {
                match into.iter_mut().find(|e| name(e) == name(item)) {
                    Some(slot) => *slot = item.clone(),
                    None => into.push(item.clone()),
                }
            }
        }
        upsert(&mut self.clusters, &new.clusters, |c| &c.name);
        upsert(&mut self.users, &new.users, |u| &u.name);
        upsert(&mut self.contexts, &new.contexts, |c| &c.name);
        if use_context {
            if let Some(c) = &new.current_context {
                self.current_context = Some(c.clone());
            }
        }
    }

    /// Removes VM `vm`'s cluster, user and context (by [`entry_name`]); clears the
    /// current context if it was that one. Returns whether anything was removed.
    pub fn remove_vm(&mut self, vm: &str) -> bool {
        let name = entry_name(vm);
        let before = self.clusters.len() + self.users.len() + self.contexts.len();
        self.clusters.retain(|c| c.name != name);
        self.users.retain(|u| u.name != name);
        self.contexts.retain(|c| c.name != name);
        if self.current_context.as_deref() == Some(name.as_str()) {
            self.current_context = None;
        }
        before != self.clusters.len() + self.users.len() + self.contexts.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A kubeconfig in the exact shape k3s v1.31 writes to /etc/rancher/k3s/k3s.yaml.
    /// The base64 data is dummy text ("dummy CA", "dummy client cert", "dummy client
    /// key" in PEM armour), not key material.
    const K3S_YAML: &str = include_str!(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/kubeconfig/k3s.yaml"
    ));
    const CA: &str =
        "LS0tLS1CRUdJTiBDRVJUSUZJQ0FURS0tLS0tCmR1bW15IENBCi0tLS0tRU5EIENFUlRJRklDQVRFLS0tLS0K";
    const KEY: &str = "LS0tLS1CRUdJTiBFQyBQUklWQVRFIEtFWS0tLS0tCmR1bW15IGNsaWVudCBrZXkKLS0tLS1FTkQgRUMgUFJJVkFURSBLRVktLS0tLQo=";

    fn direct() -> ApiAccess {
        ApiAccess::Direct {
            host: "203.0.113.7".into(),
        }
    }

    #[test]
    fn k3s_yaml_is_rewritten_for_direct_access() {
        let k = Kubeconfig::from_k3s(K3S_YAML, "train1", &direct()).unwrap();
        assert_eq!(k.clusters.len(), 1);
        assert_eq!(k.clusters[0].name, "gpuprov-train1");
        assert_eq!(k.clusters[0].cluster.server, "https://203.0.113.7:6443");
        assert_eq!(
            k.clusters[0].cluster.other["certificate-authority-data"].as_str(),
            Some(CA)
        );
        assert_eq!(k.users[0].name, "gpuprov-train1");
        assert_eq!(k.users[0].user["client-key-data"].as_str(), Some(KEY));
        assert_eq!(k.contexts[0].name, "gpuprov-train1");
        assert_eq!(k.contexts[0].context.cluster, "gpuprov-train1");
        assert_eq!(k.contexts[0].context.user, "gpuprov-train1");
        assert_eq!(k.current_context.as_deref(), Some("gpuprov-train1"));
        // Round-trips through YAML, with k3s's `preferences: {}` kept.
        let text = k.to_yaml().unwrap();
        assert_eq!(Kubeconfig::parse(&text).unwrap(), k);
        let v: Value = serde_yaml::from_str(&text).unwrap();
        assert_eq!(v["apiVersion"].as_str(), Some("v1"));
        assert_eq!(v["kind"].as_str(), Some("Config"));
        assert_eq!(v["current-context"].as_str(), Some("gpuprov-train1"));
        assert!(v["preferences"].is_mapping());
        assert!(!text.contains("default"), "{text}");
    }

    #[test]
    fn server_urls() {
        let tunnel = ApiAccess::SshTunnel { local_port: 6443 };
        let k = Kubeconfig::from_k3s(K3S_YAML, "t", &tunnel).unwrap();
        assert_eq!(k.clusters[0].cluster.server, "https://127.0.0.1:6443");
        assert_eq!(tunnel.host(), "127.0.0.1");
        let url = |h: &str| ApiAccess::Direct { host: h.into() }.server_url();
        assert_eq!(url("2001:db8::1").unwrap(), "https://[2001:db8::1]:6443");
        assert_eq!(url("[2001:db8::1]").unwrap(), "https://[2001:db8::1]:6443");
        assert_eq!(
            url("GPU.example.com").unwrap(),
            "https://gpu.example.com:6443"
        );
        assert_eq!(
            ApiAccess::SshTunnel { local_port: 16443 }
                .server_url()
                .unwrap(),
            "https://127.0.0.1:16443"
        );
        assert_eq!(url("a b"), Err(KubeconfigError::BadHost("a b".into())));
        assert_eq!(
            url("evil/path@x"),
            Err(KubeconfigError::BadHost("evil/path@x".into()))
        );
    }

    const USER_CONFIG: &str = r#"apiVersion: v1
kind: Config
clusters:
- cluster:
    server: https://prod.example:6443
    certificate-authority-data: UFJPRA==
  name: prod
- cluster:
    server: https://old.example:6443
  name: gpuprov-train1
contexts:
- context:
    cluster: prod
    user: prod-admin
    namespace: web
  name: prod
- context:
    cluster: gpuprov-train1
    user: gpuprov-train1
  name: gpuprov-train1
users:
- name: prod-admin
  user:
    exec:
      apiVersion: client.authentication.k8s.io/v1
      command: aws
      args: ["eks", "get-token"]
- name: gpuprov-train1
  user:
    token: old-token
current-context: prod
preferences: {}
extensions:
- name: my-extension
  extension:
    anything: 1
"#;

    #[test]
    fn merge_replaces_same_names_and_keeps_the_rest() {
        let mut user = Kubeconfig::parse(USER_CONFIG).unwrap();
        let new = Kubeconfig::from_k3s(K3S_YAML, "train1", &direct()).unwrap();
        user.merge(&new, false);
        let names = |v: Vec<&str>| v.join(",");
        assert_eq!(
            names(user.clusters.iter().map(|c| c.name.as_str()).collect()),
            "prod,gpuprov-train1"
        );
        assert_eq!(user.clusters[1].cluster.server, "https://203.0.113.7:6443");
        assert_eq!(
            names(user.users.iter().map(|c| c.name.as_str()).collect()),
            "prod-admin,gpuprov-train1"
        );
        assert_eq!(user.users[1].user["client-key-data"].as_str(), Some(KEY));
        assert!(user.users[1].user.get("token").is_none());
        assert_eq!(
            user.contexts[0].context.other["namespace"].as_str(),
            Some("web")
        );
        assert_eq!(
            user.current_context.as_deref(),
            Some("prod"),
            "unchanged unless asked"
        );
        assert!(user.other.contains_key("extensions"));
        // A second VM is appended; asking for it switches the context.
        let other = Kubeconfig::from_k3s(
            K3S_YAML,
            "infer2",
            &ApiAccess::SshTunnel { local_port: 6443 },
        )
        .unwrap();
        user.merge(&other, true);
        assert_eq!(user.clusters.len(), 3);
        assert_eq!(user.current_context.as_deref(), Some("gpuprov-infer2"));
        // Merging the same thing again changes nothing.
        let snapshot = user.clone();
        user.merge(&other, true);
        assert_eq!(user, snapshot);
        let reparsed = Kubeconfig::parse(&user.to_yaml().unwrap()).unwrap();
        assert_eq!(reparsed, user);
    }

    #[test]
    fn merge_into_an_empty_or_missing_config() {
        let new = Kubeconfig::from_k3s(K3S_YAML, "train1", &direct()).unwrap();
        for start in ["", "\n", "apiVersion: v1\nkind: Config\n"] {
            let mut k = Kubeconfig::parse(start).unwrap();
            k.merge(&new, false);
            assert_eq!(k.clusters.len(), 1);
            assert_eq!(k.current_context, None);
        }
    }

    #[test]
    fn remove_vm_entries() {
        let mut user = Kubeconfig::parse(USER_CONFIG).unwrap();
        user.current_context = Some("gpuprov-train1".into());
        assert!(user.remove_vm("train1"));
        assert_eq!(user.clusters.len(), 1);
        assert_eq!(user.users.len(), 1);
        assert_eq!(user.contexts.len(), 1);
        assert_eq!(user.current_context, None);
        assert!(!user.remove_vm("train1"));
    }

    #[test]
    fn kubectl_written_files_with_null_lists_and_partial_entries_parse() {
        // What `kubectl config set-credentials u --token=t --kubeconfig F` writes to a new
        // file, and entries kubectl accepts without a server or user.
        let k = Kubeconfig::parse(
            "apiVersion: v1\nclusters: null\ncontexts:\n- context:\n    cluster: c\n  name: n\ncurrent-context: \"\"\nkind: Config\npreferences: {}\nusers:\n- name: u\n  user:\n    token: t\n",
        )
        .unwrap();
        assert!(k.clusters.is_empty());
        assert_eq!(k.contexts[0].context.user, "");
        assert_eq!(k.users.len(), 1);
        let k =
            Kubeconfig::parse("clusters:\n- name: c\n  cluster: {}\nusers: null\ncontexts: null\n")
                .unwrap();
        assert_eq!(k.clusters[0].cluster.server, "");
        // The reason names the field, never a value.
        let e = Kubeconfig::parse("clusters: [{name: x, cluster: 7}]\n").unwrap_err();
        assert!(e.to_string().contains("invalid type"), "{e}");
    }

    #[test]
    fn errors_never_echo_the_text() {
        let secret = "client-key-data: SECRETSECRET";
        for bad in [
            format!("{secret}\n: : :\n  - ["),
            format!("users: \"{secret}\""),
            format!("clusters:\n- name: x\n  cluster: [1]\n{secret}\n"),
            format!("clusters:\n- name: {secret}\n  cluster: 7\n"),
            format!("users: [\"{secret}\"]\n"),
        ] {
            let e = Kubeconfig::parse(&bad).unwrap_err();
            assert!(matches!(e, KubeconfigError::Parse { .. }), "{e:?}");
            assert!(!e.to_string().contains("SECRET"), "{e}");
        }
        let k = Kubeconfig::from_k3s(K3S_YAML, "t", &direct()).unwrap();
        let dbg = format!("{k:?}");
        assert!(!dbg.contains(KEY) && dbg.contains("<redacted>"), "{dbg}");
    }

    #[test]
    fn k3s_yaml_must_have_one_of_each() {
        let two = USER_CONFIG;
        assert_eq!(
            Kubeconfig::from_k3s(two, "t", &direct()),
            Err(KubeconfigError::NotSingle {
                clusters: 2,
                users: 2,
                contexts: 2
            })
        );
        assert!(matches!(
            Kubeconfig::from_k3s("", "t", &direct()),
            Err(KubeconfigError::NotSingle { .. })
        ));
        assert_eq!(
            Kubeconfig::from_k3s(K3S_YAML, "t", &ApiAccess::Direct { host: "".into() }),
            Err(KubeconfigError::BadHost("".into()))
        );
    }
}
