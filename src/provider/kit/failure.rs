//! One failed call, as any cloud API reports it, and one classifier driven by each
//! vendor's table of rules (data, not code) into the contract's [`ErrorKind`]s.
//!
//! The classifier applies, in order:
//!
//! 1. no credential configured → `Credentials` (with the places looked at as help);
//! 2. no response: the endpoint refused the connection → `Unreachable`, anything else
//!    (timeout, reset) → `Transient`;
//! 3. HTTP 429, and gRPC `RESOURCE_EXHAUSTED` without a vendor code, → `Transient` with
//!    the server's `Retry-After` (never failover); the kit's own [`codes`]: a stale token →
//!    `Transient`, credentials the token endpoint refused → `Credentials`, an endpoint that
//!    is no usable URL → `InvalidRequest` (checked first: nothing was sent). (A
//!    `RESOURCE_EXHAUSTED` with the vendor's detail, such as Nebius' `quota_failure` or
//!    `not_enough_resources`, is for the vendor's table: it may be quota or capacity.)
//! 4. the vendor's [`Rule`]s, first match wins (a rule may also set a region-wide block
//!    and a help line);
//! 5. the defaults every adapter shares: 5xx / gRPC `UNAVAILABLE`, `DEADLINE_EXCEEDED`,
//!    `INTERNAL`, `RESOURCE_EXHAUSTED` → `Transient`, 401 / 403
//!    / gRPC `UNAUTHENTICATED`, `PERMISSION_DENIED` → `Credentials`, anything else →
//!    `Failed`. An unknown error is never taken for capacity.
//!
//! The message never carries a secret (every credential the adapter holds is scrubbed
//! from it), and the hint is carried as a separate `help`, not glued into the message.

use super::super::redact::scrub;
use super::super::{BlockScope, ErrorKind, ProviderError};

/// gRPC status codes the defaults use (google.rpc.Code).
pub mod grpc {
    pub const INVALID_ARGUMENT: i32 = 3;
    pub const ALREADY_EXISTS: i32 = 6;
    pub const FAILED_PRECONDITION: i32 = 9;
    pub const ABORTED: i32 = 10;
    pub const RESOURCE_EXHAUSTED: i32 = 8;
    pub const UNAVAILABLE: i32 = 14;
    pub const DEADLINE_EXCEEDED: i32 = 4;
    pub const UNAUTHENTICATED: i32 = 16;
    pub const PERMISSION_DENIED: i32 = 7;
    pub const NOT_FOUND: i32 = 5;
    pub const INTERNAL: i32 = 13;
}

/// The codes the kit itself gives a [`Failure`] (never shown: they start `gpuprov/`),
/// which the classifier maps before any vendor rule.
pub mod codes {
    /// The API answered 401 to an OAuth access token that had worked before: it expired
    /// or was revoked early and is dropped, so another try fetches a new one → `Transient`.
    pub const STALE_TOKEN: &str = "gpuprov/stale-token";
    /// The token endpoint refused the client credentials → `Credentials`.
    pub const TOKEN_REFUSED: &str = "gpuprov/token-refused";
    /// The configured endpoint is no URL the client can use (nothing was sent) →
    /// `InvalidRequest`: retrying cannot help.
    pub const BAD_ENDPOINT: &str = "gpuprov/bad-endpoint";
}

/// How far a call got.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    /// No credential was configured, so nothing was sent.
    NoCredential,
    /// No response. `refused`: the endpoint refused the connection (or its name did not
    /// resolve), so nothing was sent.
    Transport { refused: bool },
    /// An HTTP response with this status.
    Http(u16),
    /// A gRPC status code (google.rpc.Code).
    Grpc(i32),
}

/// A failed API call as the cloud reported it, before classification.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    pub status: Status,
    /// The vendor's own error code (Lambda `error.code`, DigitalOcean `id`, EC2 `Code`),
    /// when the body carried one. `Some("")` marks the vendor's own error body when it has
    /// no code (Hyperstack's envelope): [`Rule::code`]`("*")` matches it, so phrase rules
    /// can be kept to the vendor's words (never a proxy's page), and it is not shown.
    pub code: Option<String>,
    /// The vendor's message, a one-line cause for a body that is not the vendor's envelope
    /// (`provider::cause::http_cause`), or a transport description.
    pub message: String,
    /// Server-requested delay before the next call, seconds (`Retry-After`, or derived
    /// from `RateLimit-*` headers).
    pub retry_after_secs: Option<u64>,
}

impl Failure {
    pub fn http(status: u16, code: Option<String>, message: impl Into<String>) -> Failure {
        Failure {
            status: Status::Http(status),
            code,
            message: message.into(),
            retry_after_secs: None,
        }
    }

    pub fn transport(refused: bool, message: impl Into<String>) -> Failure {
        Failure {
            status: Status::Transport { refused },
            code: None,
            message: message.into(),
            retry_after_secs: None,
        }
    }

    pub fn grpc(code: i32, message: impl Into<String>) -> Failure {
        Failure {
            status: Status::Grpc(code),
            code: None,
            message: message.into(),
            retry_after_secs: None,
        }
    }

    /// No credential configured; `message` says which and where it was looked for.
    pub fn no_credential(message: impl Into<String>) -> Failure {
        Failure {
            status: Status::NoCredential,
            code: None,
            message: message.into(),
            retry_after_secs: None,
        }
    }

    pub fn with_retry_after(mut self, secs: Option<u64>) -> Failure {
        self.retry_after_secs = secs;
        self
    }

    /// The HTTP status, when a response arrived over HTTP.
    pub fn http_status(&self) -> Option<u16> {
        match self.status {
            Status::Http(s) => Some(s),
            _ => None,
        }
    }

    /// Whether the API said the object does not exist (HTTP 404): a delete's success,
    /// an observe's "gone". Clouds with their own not-found code check it beside this.
    pub fn is_not_found(&self) -> bool {
        self.http_status() == Some(404)
    }

    /// Whether the vendor's code is `code`.
    pub fn has_code(&self, code: &str) -> bool {
        self.code.as_deref() == Some(code)
    }

    /// Whether the message contains any of `phrases`, ignoring case.
    pub fn message_has(&self, phrases: &[&str]) -> bool {
        let m = self.message.to_lowercase();
        phrases.iter().any(|p| m.contains(&p.to_lowercase()))
    }
}

/// What part of a [`Failure`] a [`Rule`] looks at. Every condition set must hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rule {
    /// The HTTP status range `lo..=hi`, when set.
    pub status: Option<(u16, u16)>,
    /// The gRPC code, when set.
    pub grpc: Option<i32>,
    /// The vendor code: exact, or a prefix when it ends in `*` (`"*"`: any code, the
    /// empty one included).
    pub code: Option<&'static str>,
    /// Message phrases (any of them, ignoring case), when non-empty.
    pub phrases: &'static [&'static str],
    /// The call (an adapter's name for it, e.g. `"create"`), when set.
    pub call: Option<&'static str>,
    pub kind: ErrorKind,
    /// Block the whole region the call was about (the classifier needs it given).
    pub region_wide: bool,
    /// Block every offer of the cloud (a quota that counts across all regions, such as
    /// GCP's `GPUS_ALL_REGIONS`); wins over `region_wide`.
    pub cloud_wide: bool,
    /// A hint for the user, shown apart from the message.
    pub help: Option<&'static str>,
}

impl Rule {
    /// A rule that always matches (narrow it with the builder methods).
    pub const fn new(kind: ErrorKind) -> Rule {
        Rule {
            status: None,
            grpc: None,
            code: None,
            phrases: &[],
            call: None,
            kind,
            region_wide: false,
            cloud_wide: false,
            help: None,
        }
    }
    /// Vendor code `code` (exact, or a prefix `"provider/*"`) → `kind`.
    pub const fn code(code: &'static str, kind: ErrorKind) -> Rule {
        let mut r = Rule::new(kind);
        r.code = Some(code);
        r
    }
    /// HTTP status `status` → `kind`.
    pub const fn status(status: u16, kind: ErrorKind) -> Rule {
        let mut r = Rule::new(kind);
        r.status = Some((status, status));
        r
    }
    /// gRPC code `code` → `kind`.
    pub const fn grpc(code: i32, kind: ErrorKind) -> Rule {
        let mut r = Rule::new(kind);
        r.grpc = Some(code);
        r
    }
    /// Also requires HTTP status `status`.
    pub const fn with_status(mut self, status: u16) -> Rule {
        self.status = Some((status, status));
        self
    }
    /// Also requires a message containing one of `phrases`.
    pub const fn phrases(mut self, phrases: &'static [&'static str]) -> Rule {
        self.phrases = phrases;
        self
    }
    /// Also requires the call to be `call`.
    pub const fn on(mut self, call: &'static str) -> Rule {
        self.call = Some(call);
        self
    }
    /// Blocks the whole region of the call.
    pub const fn region_wide(mut self) -> Rule {
        self.region_wide = true;
        self
    }
    /// Blocks every offer of the cloud.
    pub const fn cloud_wide(mut self) -> Rule {
        self.cloud_wide = true;
        self
    }
    pub const fn help(mut self, help: &'static str) -> Rule {
        self.help = Some(help);
        self
    }

    fn matches(&self, f: &Failure, call: &str) -> bool {
        let status_ok = match (self.status, f.status) {
            (None, _) => true,
            (Some((lo, hi)), Status::Http(s)) => (lo..=hi).contains(&s),
            (Some(_), _) => false,
        };
        let grpc_ok = match (self.grpc, f.status) {
            (None, _) => true,
            (Some(c), Status::Grpc(g)) => c == g,
            (Some(_), _) => false,
        };
        let code_ok = match (self.code, f.code.as_deref()) {
            (None, _) => true,
            (Some(want), Some(have)) => match want.strip_suffix('*') {
                Some(prefix) => have.starts_with(prefix),
                None => have == want,
            },
            (Some(_), None) => false,
        };
        let phrases_ok = self.phrases.is_empty() || f.message_has(self.phrases);
        let call_ok = self.call.is_none_or(|c| c == call);
        status_ok && grpc_ok && code_ok && phrases_ok && call_ok
    }
}

/// One vendor's classifier: its name (which starts every message), its rules, and the
/// hint shown with any `Credentials` error.
#[derive(Debug, Clone, Copy)]
pub struct Classifier {
    pub cloud: &'static str,
    pub rules: &'static [Rule],
    /// Shown as help with every `Credentials` error (which credential, where it is read).
    pub credentials_help: &'static str,
}

/// What a classified call was about: the call's name (matched by [`Rule::on`]), a short
/// description that starts the message (`"launch gpu_8x_h100 in us-east-1"`), and the
/// region, for region-wide rules.
#[derive(Debug, Clone, Copy)]
pub struct Call<'a> {
    pub name: &'static str,
    pub what: &'a str,
    pub region: Option<&'a str>,
}

impl<'a> Call<'a> {
    /// A call named `"other"` (the default for reads).
    pub fn other(what: &'a str) -> Call<'a> {
        Call {
            name: "other",
            what,
            region: None,
        }
    }
    pub fn named(name: &'static str, what: &'a str) -> Call<'a> {
        Call {
            name,
            what,
            region: None,
        }
    }
    pub fn in_region(mut self, region: &'a str) -> Call<'a> {
        self.region = Some(region);
        self
    }
}

impl Classifier {
    /// The contract's error for `f`, its message `"<cloud> <what>: <cause>"` with every
    /// one of `secrets` scrubbed, its help separate.
    pub fn classify<'s>(
        &self,
        f: &Failure,
        call: Call<'_>,
        secrets: impl IntoIterator<Item = &'s str>,
    ) -> ProviderError {
        let mut help = None;
        let mut region_wide = false;
        let mut cloud_wide = false;
        let kind = match f.status {
            Status::NoCredential => ErrorKind::Credentials,
            _ if f.has_code(codes::BAD_ENDPOINT) => ErrorKind::InvalidRequest,
            Status::Transport { refused: true } => ErrorKind::Unreachable,
            Status::Transport { refused: false } => ErrorKind::Transient,
            Status::Http(429) => ErrorKind::Transient,
            Status::Grpc(grpc::RESOURCE_EXHAUSTED) if f.code.is_none() => ErrorKind::Transient,
            _ if f.has_code(codes::STALE_TOKEN) => ErrorKind::Transient,
            _ if f.has_code(codes::TOKEN_REFUSED) => ErrorKind::Credentials,
            _ => match self.rules.iter().find(|r| r.matches(f, call.name)) {
                Some(r) => {
                    help = r.help.map(str::to_string);
                    region_wide = r.region_wide;
                    cloud_wide = r.cloud_wide;
                    r.kind
                }
                None => match f.status {
                    Status::Http(s) if s >= 500 => ErrorKind::Transient,
                    Status::Grpc(
                        grpc::UNAVAILABLE
                        | grpc::DEADLINE_EXCEEDED
                        | grpc::INTERNAL
                        | grpc::RESOURCE_EXHAUSTED,
                    ) => ErrorKind::Transient,
                    Status::Http(401 | 403)
                    | Status::Grpc(grpc::UNAUTHENTICATED | grpc::PERMISSION_DENIED) => {
                        ErrorKind::Credentials
                    }
                    _ => ErrorKind::Failed,
                },
            },
        };
        if kind == ErrorKind::Credentials && help.is_none() {
            help = Some(self.credentials_help.to_string());
        }
        // An empty code (a decoder's mark for the vendor's own body without a code, see
        // `Failure::code`) is not shown, nor are the kit's own `codes`.
        let code = f
            .code
            .as_deref()
            .filter(|c| !c.is_empty() && !c.starts_with("gpuprov/"));
        let cause = match (f.status, code) {
            (Status::Http(s), Some(c)) => format!("{c} (HTTP {s}): {}", f.message),
            (Status::Grpc(g), Some(c)) => format!("{c} (gRPC {g}): {}", f.message),
            (Status::Grpc(g), None) => format!("gRPC {g}: {}", f.message),
            (Status::Http(s), None) if f.message.is_empty() => format!("HTTP {s}"),
            // Otherwise the message is already the short cause, starting with the status.
            _ => f.message.clone(),
        };
        let secrets: Vec<&str> = secrets.into_iter().collect();
        let mut err = ProviderError::new(
            kind,
            scrub(
                &format!("{} {}: {cause}", self.cloud, call.what),
                secrets.iter().copied(),
            ),
        );
        err.help = help.map(|h| scrub(&h, secrets.iter().copied()));
        if kind == ErrorKind::Transient {
            err.retry_after_secs = f.retry_after_secs;
        }
        if cloud_wide {
            err = err.with_block(BlockScope::Cloud {
                cloud: self.cloud.to_string(),
            });
        } else if let (true, Some(region)) = (region_wide, call.region) {
            err = err.with_block(BlockScope::Region {
                cloud: self.cloud.to_string(),
                region: region.to_string(),
            });
        }
        err
    }
}

/// An error body's text as one short message part: trimmed, at most 300 characters
/// (a proxy's HTML page or a stack trace must not flood the output).
pub fn clip(text: &str) -> String {
    text.trim().chars().take(300).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const RULES: &[Rule] = &[
        Rule::code("launch/insufficient-capacity", ErrorKind::Capacity),
        Rule::code("provider/*", ErrorKind::Transient),
        Rule::status(400, ErrorKind::Capacity).on("create"),
        Rule::status(422, ErrorKind::Quota).phrases(&["droplet limit"]),
        Rule::status(422, ErrorKind::Capacity)
            .phrases(&["region is not available"])
            .region_wide(),
        Rule::status(402, ErrorKind::Credentials).help("add funds"),
        Rule::code("InsufficientInstanceCapacity", ErrorKind::Capacity),
        Rule::grpc(9, ErrorKind::Capacity).phrases(&["not enough resources"]),
        Rule::code("QUOTA_EXCEEDED", ErrorKind::Quota)
            .phrases(&["all regions"])
            .cloud_wide(),
    ];
    const C: Classifier = Classifier {
        cloud: "acme",
        rules: RULES,
        credentials_help: "set ACME_KEY",
    };

    fn kind(f: Failure, call: &'static str) -> ErrorKind {
        C.classify(&f, Call::named(call, "x"), []).kind
    }

    #[test]
    fn defaults_never_guess_capacity() {
        use ErrorKind::*;
        assert_eq!(kind(Failure::transport(true, "refused"), "c"), Unreachable);
        assert_eq!(kind(Failure::transport(false, "reset"), "c"), Transient);
        assert_eq!(kind(Failure::http(429, None, ""), "create"), Transient);
        assert_eq!(kind(Failure::http(503, None, ""), "c"), Transient);
        assert_eq!(kind(Failure::http(401, None, ""), "c"), Credentials);
        assert_eq!(kind(Failure::http(403, None, ""), "c"), Credentials);
        assert_eq!(kind(Failure::http(409, None, "odd"), "c"), Failed);
        assert_eq!(kind(Failure::http(400, None, "odd"), "other"), Failed);
        assert_eq!(kind(Failure::grpc(14, "down"), "c"), Transient);
        assert_eq!(kind(Failure::grpc(16, "who"), "c"), Credentials);
        assert_eq!(kind(Failure::grpc(3, "bad"), "c"), Failed);
        assert_eq!(kind(Failure::grpc(8, "slow down"), "c"), Transient);
        let mut coded = Failure::grpc(8, "odd");
        coded.code = Some("something_new".into());
        assert_eq!(kind(coded, "c"), Transient, "no rule: the default");
        assert_eq!(kind(Failure::no_credential("no key"), "c"), Credentials);
    }

    #[test]
    fn the_table_decides_before_the_status_defaults() {
        use ErrorKind::*;
        let code = |c: &str, s: u16| Failure::http(s, Some(c.into()), "m");
        assert_eq!(
            kind(code("launch/insufficient-capacity", 400), "c"),
            Capacity
        );
        assert_eq!(kind(code("provider/outage", 400), "c"), Transient);
        assert_eq!(
            kind(code("provider", 400), "c"),
            Failed,
            "prefix needs the /"
        );
        // EC2's capacity error arrives as HTTP 500: the table wins over "5xx → Transient".
        assert_eq!(
            kind(code("InsufficientInstanceCapacity", 500), "c"),
            Capacity
        );
        assert_eq!(kind(Failure::http(400, None, "m"), "create"), Capacity);
        assert_eq!(
            kind(Failure::http(422, None, "Droplet limit reached"), "c"),
            Quota
        );
        assert_eq!(
            kind(Failure::grpc(9, "Not enough resources"), "c"),
            Capacity
        );
        assert_eq!(kind(Failure::grpc(9, "precondition"), "c"), Failed);
    }

    #[test]
    fn the_kits_own_codes_decide_before_the_table_and_are_not_shown() {
        let stale = Failure::http(401, Some(codes::STALE_TOKEN.into()), "HTTP 401: expired");
        let e = C.classify(&stale, Call::named("create", "launch"), []);
        assert_eq!(e.kind, ErrorKind::Transient);
        assert_eq!(e.msg, "acme launch: HTTP 401: expired");
        let refused = Failure::http(400, Some(codes::TOKEN_REFUSED.into()), "bad client");
        let e = C.classify(&refused, Call::named("create", "launch"), []);
        assert_eq!(
            e.kind,
            ErrorKind::Credentials,
            "the create rule for 400 is not asked"
        );
        assert_eq!(e.help.as_deref(), Some("set ACME_KEY"));
        assert_eq!(e.msg, "acme launch: bad client");
    }

    #[test]
    fn an_empty_code_marks_the_vendors_body_and_is_not_shown() {
        const VENDOR: &[Rule] = &[Rule::code("*", ErrorKind::Capacity).phrases(&["out of stock"])];
        let v = Classifier {
            cloud: "acme",
            rules: VENDOR,
            credentials_help: "",
        };
        let e = v.classify(
            &Failure::http(400, Some(String::new()), "HTTP 400: Out of stock"),
            Call::other("create"),
            [],
        );
        assert_eq!(e.kind, ErrorKind::Capacity);
        assert_eq!(e.msg, "acme create: HTTP 400: Out of stock");
        // The same words in a body that is not the vendor's (no code): not capacity.
        let f = Failure::http(400, None, "HTTP 400 (text/html): Out of stock");
        assert_eq!(v.classify(&f, Call::other("x"), []).kind, ErrorKind::Failed);
    }

    #[test]
    fn messages_help_scopes_and_retry_after() {
        let f = Failure::http(429, None, "slow down [Bearer sk_1]").with_retry_after(Some(7));
        let e = C.classify(&f, Call::other("list instances"), ["sk_1"]);
        assert_eq!(e.msg, "acme list instances: slow down [Bearer REDACTED]");
        assert_eq!(e.retry_after_secs, Some(7));
        assert_eq!(e.help, None);

        let f = Failure::http(401, Some("invalid-key".into()), "bad key").with_retry_after(Some(3));
        let e = C.classify(&f, Call::other("list"), []);
        assert_eq!(e.msg, "acme list: invalid-key (HTTP 401): bad key");
        assert_eq!(e.help.as_deref(), Some("set ACME_KEY"));
        assert_eq!(
            e.retry_after_secs, None,
            "only transient errors carry a delay"
        );

        let e = C.classify(&Failure::http(402, None, ""), Call::other("create"), []);
        assert_eq!(
            (e.msg.as_str(), e.help.as_deref()),
            ("acme create: HTTP 402", Some("add funds"))
        );

        let f = Failure::http(403, Some("QUOTA_EXCEEDED".into()), "GPUs in all regions");
        let e = C.classify(&f, Call::other("create").in_region("nyc2"), []);
        assert_eq!(e.kind, ErrorKind::Quota);
        assert_eq!(
            e.block.as_deref(),
            Some(&BlockScope::Cloud {
                cloud: "acme".into()
            }),
            "a cloud-wide rule wins over the call's region"
        );

        let f = Failure::http(422, None, "This region is not available");
        let e = C.classify(&f, Call::other("create").in_region("nyc2"), []);
        assert_eq!(
            e.block.as_deref(),
            Some(&BlockScope::Region {
                cloud: "acme".into(),
                region: "nyc2".into()
            })
        );
    }
}
