//! Request rates as declared facts: each adapter states its vendor's documented limits
//! ([`RateLimit`], in [`Capabilities::rate_limits`](super::Capabilities::rate_limits),
//! with the source of each number), and every HTTP request the kit's client sends (and
//! every simulated call of the fake cloud) first passes the adapter's [`Gate`]. The core
//! installs the gate's [`Admission`] (`machine/limits.rs`, where the waiting lives: only
//! the executor sleeps); until it does, the gate admits everything at once.
//!
//! Counting HTTP requests rather than contract calls is what makes the limit hold: one
//! `prepare` or `plan` may send several requests (pagination, lookups).
//!
//! A limit on one endpoint (Lambda's launch, DigitalOcean's SSH key listing) is declared
//! on that endpoint's [`EndpointClass`], and the adapter names the endpoint's exact
//! `method path` to its client
//! ([`RestClient::with_endpoint_class`](super::kit::RestClient::with_endpoint_class)).

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use async_trait::async_trait;

/// The endpoint class of one request, for limits that differ by endpoint. The classes
/// are disjoint: a request is in exactly one (a key listing is not also a
/// [`Read`](EndpointClass::Read)), and a limit of one class counts only its requests.
/// The kit's REST client puts a request in [`Launch`](EndpointClass::Launch) or
/// [`KeyListing`](EndpointClass::KeyListing) only when the adapter names that exact
/// `method path`; otherwise by method.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum EndpointClass {
    /// The request that launches an instance (Lambda's
    /// `POST /api/v1/instance-operations/launch`, DigitalOcean's `POST /v2/droplets`).
    Launch,
    /// Listing the account's SSH keys (DigitalOcean's `GET /v2/account/keys`, which its
    /// API description limits to 10 per 60 s apart from the other requests). A read, but
    /// counted apart from [`Read`](EndpointClass::Read).
    KeyListing,
    /// Any other read (`GET`/`HEAD`, gRPC `Get`/`List`).
    Read,
    /// Any other request (other creates, deletes, updates).
    Other,
}

impl EndpointClass {
    /// Every class, in order.
    pub const ALL: [EndpointClass; 4] = [
        EndpointClass::Launch,
        EndpointClass::KeyListing,
        EndpointClass::Read,
        EndpointClass::Other,
    ];
}

/// One documented limit: at most `requests` requests in any window of `per`, counted
/// over the requests of `class` (`None`: every request to the cloud). A request counts
/// against every limit whose class covers it (a Lambda launch against the general
/// limit and the launch limit; a DigitalOcean key listing against its 10 per 60 s and
/// the 250 a minute and 5,000 an hour over every request). The burst allowed is `requests` at once, as the vendors
/// document windows, not buckets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RateLimit {
    /// The requests the limit counts; `None`: all of them.
    pub class: Option<EndpointClass>,
    /// How many requests a window may hold.
    pub requests: u32,
    /// The window's length.
    pub per: Duration,
    /// Where the vendor documents it (file and section of the copy under
    /// `tests/fixtures/vendor-apis`, or a documentation page).
    pub source: &'static str,
}

impl RateLimit {
    /// `requests` per `per` over every request.
    pub fn all(requests: u32, per: Duration, source: &'static str) -> RateLimit {
        RateLimit {
            class: None,
            requests,
            per,
            source,
        }
    }

    /// `requests` per `per` over the requests of `class`.
    pub fn of(
        class: EndpointClass,
        requests: u32,
        per: Duration,
        source: &'static str,
    ) -> RateLimit {
        RateLimit {
            class: Some(class),
            ..RateLimit::all(requests, per, source)
        }
    }

    /// Whether a request of `class` counts against this limit.
    pub fn covers(&self, class: EndpointClass) -> bool {
        self.class.is_none_or(|c| c == class)
    }

    /// The declared rate, requests per second.
    pub fn per_second(&self) -> f64 {
        f64::from(self.requests) / self.per.as_secs_f64().max(f64::MIN_POSITIVE)
    }
}

/// What the core hands an adapter's requests: it returns once one more request of
/// `class` keeps every declared limit, and counts that request as sent. Dropping the
/// future before it returns counts nothing.
#[async_trait]
pub trait Admission: Send + Sync {
    async fn admit(&self, class: EndpointClass);
}

/// The slot through which an adapter's requests reach the core's [`Admission`]. An
/// adapter holds one (in its [`Adapter`](super::kit::Adapter)) and gives clones to its
/// clients; all clones share the installed admission.
#[derive(Clone, Default)]
pub struct Gate(Arc<OnceLock<Arc<dyn Admission>>>);

impl Gate {
    /// Installs `admission` unless one is installed already (an adapter registered twice
    /// keeps the first limiter, so its requests are counted in one place). Returns the
    /// admission in force.
    pub fn install(&self, admission: Arc<dyn Admission>) -> Arc<dyn Admission> {
        self.0.get_or_init(|| admission).clone()
    }

    /// Whether the core installed an admission.
    pub fn is_installed(&self) -> bool {
        self.0.get().is_some()
    }

    /// Waits for the admission of one request of `class` (at once when none is
    /// installed).
    pub async fn admit(&self, class: EndpointClass) {
        if let Some(a) = self.0.get() {
            a.admit(class).await;
        }
    }
}

impl std::fmt::Debug for Gate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("Gate")
            .field(&if self.is_installed() {
                "installed"
            } else {
                "open"
            })
            .finish()
    }
}

/// Gates compare equal: an adapter's self-description is the same whoever limits it.
impl PartialEq for Gate {
    fn eq(&self, _: &Gate) -> bool {
        true
    }
}

/// The requests in `times` (sorted, seconds on any clock) that broke `limit`: for each
/// request, whether more than `limit.requests` requests fell in the half-open window of
/// `limit.per` ending at it. For measuring at a server or a fake cloud, independently
/// of the limiter.
pub fn violations(times: &[f64], limit: &RateLimit) -> usize {
    let n = limit.requests as usize;
    let w = limit.per.as_secs_f64();
    let mut start = 0;
    let mut broke = 0;
    for (i, t) in times.iter().enumerate() {
        while times[start] <= t - w {
            start += 1;
        }
        if i + 1 - start > n {
            broke += 1;
        }
    }
    broke
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn violations_count_requests_over_a_sliding_window() {
        let l = RateLimit::all(2, Duration::from_secs(1), "test");
        assert_eq!(violations(&[0.0, 0.5, 1.0, 1.5], &l), 0);
        assert_eq!(violations(&[0.0, 0.5, 0.9, 1.5], &l), 1);
        assert_eq!(violations(&[0.0, 0.0, 0.0], &l), 1);
        assert_eq!(violations(&[], &l), 0);
        assert!(l.covers(EndpointClass::Launch));
        let launch = RateLimit::of(EndpointClass::Launch, 1, Duration::from_secs(12), "t");
        assert!(!launch.covers(EndpointClass::Read));
        // Classes are disjoint: a key listing counts against its own limit and the
        // limits over every request, not a limit of reads.
        let keys = RateLimit::of(EndpointClass::KeyListing, 10, Duration::from_secs(60), "t");
        let reads = RateLimit::of(EndpointClass::Read, 10, Duration::from_secs(60), "t");
        assert!(keys.covers(EndpointClass::KeyListing) && l.covers(EndpointClass::KeyListing));
        assert!(!keys.covers(EndpointClass::Read) && !reads.covers(EndpointClass::KeyListing));
        assert!((launch.per_second() - 1.0 / 12.0).abs() < 1e-12);
    }
}
