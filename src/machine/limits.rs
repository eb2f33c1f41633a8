//! The core's per-cloud API limits (brief: "Capabilities ... API rate and concurrency
//! limits"): at most `max_concurrency` calls in flight to one cloud from this process,
//! `create` calls at least `min_create_interval` apart, and every HTTP request within the
//! vendor's documented rates (`rate_limits`, see [`crate::provider::rate`]) by a
//! [`RateLimiter`] installed in the adapter's gate, so the limits hold per request, not
//! per contract call: one `prepare` or `plan` may send several requests, and coalesced
//! listings ([`super::coalesce`], above [`Governed`]) and shared-object calls reach the
//! cloud through the same gate. Every adapter registered in [`Providers`](super::Providers)
//! is wrapped in a [`Governed`], so adapters never wait and no call path can bypass the
//! limits. Being on every call path, it also carries the test-only crash points around
//! each side effect (`provider.before:<op>` / `provider.after:<op>` for prepare, create,
//! delete and cleanup; see [`crate::crash`]).
//!
//! A 429 with `Retry-After` is still a `Transient` error retried after the delay the
//! server asked for (the executor's backoff); the limiter only keeps gpuprov from
//! causing it.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::{Mutex, Semaphore};
use tokio::time::Instant;

use crate::provider::{
    Admission, Capabilities, CloudProvider, EndpointClass, InstanceSpec, Location, Observed, Offer,
    ProviderError, RateLimit, ResourceRequest, Result,
};

/// The least time the limiter adds to every declared window. The vendor counts requests
/// when they arrive, not when gpuprov sends them: a request that had to open its
/// connection first (DNS, TCP and TLS handshakes, 100–300 ms to a distant API) arrives
/// that much later than one sent a window after it on a pooled connection, which would
/// put both in one window at the vendor.
pub const MIN_MARGIN: Duration = Duration::from_millis(250);

/// The window the limiter keeps for a declared window `per`: `per` plus 1 % of it, at
/// least [`MIN_MARGIN`] more (a declared 1 request/s is kept as one per 1.25 s; 250 a
/// minute as 250 per 60.6 s).
pub fn kept_window(per: Duration) -> Duration {
    per + (per / 100).max(MIN_MARGIN)
}

/// The core's limiter of one cloud's declared request rates ([`RateLimit`]). For each
/// limit it keeps the admission times of the last `requests` requests it counted and
/// admits a request once the oldest of them is one [`kept_window`] old: a sliding window,
/// which never lets more than `requests` through in any window of `per` and allows the
/// declared burst (`requests` at once). A token bucket of that size refilling at
/// `requests / per` would let up to twice the limit through in one window.
///
/// Waiters queue per endpoint class in arrival order (tokio's fair mutex), so a class
/// whose own limit is exhausted (launches, DigitalOcean's key listings) never holds
/// back another class (reads), and a request of one class waits only for the limits
/// that cover it. On a limit that also covers launches, a queued launch keeps the slot
/// it is due to take; no other class gets that priority (a key listing gives way to a
/// queued launch like any read).
pub struct RateLimiter {
    limits: Vec<RateLimit>,
    /// Per limit, the admission times still in its window (oldest first, at most
    /// `requests`), and the launches queued at the head of their class.
    sent: std::sync::Mutex<Sent>,
    /// One waiter per class at a time, first come first served (indexed as
    /// [`EndpointClass::ALL`]).
    turns: [Mutex<()>; EndpointClass::ALL.len()],
}

struct Sent {
    logs: Vec<VecDeque<Instant>>,
    /// Launch waiters at the head of their queue (0 or 1; a counter so that a dropped
    /// waiter's guard can leave it right).
    launches_waiting: usize,
}

/// Counts a launch at the head of its queue while it lives.
struct LaunchWaiting<'a>(&'a RateLimiter);

impl Drop for LaunchWaiting<'_> {
    fn drop(&mut self) {
        self.0.lock().launches_waiting -= 1;
    }
}

/// How long a request that gave way to a queued launch waits after the launch's turn.
const AFTER_LAUNCH: Duration = Duration::from_millis(1);

impl RateLimiter {
    /// A limiter of `limits` (a limit of 0 requests is taken as 1: it would block forever).
    pub fn new(limits: Vec<RateLimit>) -> RateLimiter {
        let logs = limits.iter().map(|_| VecDeque::new()).collect();
        RateLimiter {
            limits,
            sent: std::sync::Mutex::new(Sent {
                logs,
                launches_waiting: 0,
            }),
            turns: std::array::from_fn(|_| Mutex::new(())),
        }
    }

    /// The declared limits it enforces.
    pub fn limits(&self) -> &[RateLimit] {
        &self.limits
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Sent> {
        self.sent.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The earliest instant, `now` or later, at which every limit covering `class`
    /// allows one more request.
    fn ready_at(&self, logs: &[VecDeque<Instant>], class: EndpointClass, now: Instant) -> Instant {
        let mut ready = now;
        for (limit, log) in self.limits.iter().zip(logs) {
            let n = limit.requests.max(1) as usize;
            if limit.covers(class) && log.len() >= n {
                ready = ready.max(log[log.len() - n] + kept_window(limit.per));
            }
        }
        ready
    }

    /// The earliest instant, now or later, at which a launch would be admitted, counting
    /// nothing: `Governed::create` waits for it before taking a concurrency permit, so a
    /// launch queued behind a 12 s launch window does not hold a permit the cloud's polls,
    /// prepares and deletes need meanwhile.
    pub fn launch_ready_at(&self) -> Instant {
        let sent = self.lock();
        self.ready_at(&sent.logs, EndpointClass::Launch, Instant::now())
    }

    /// Counts the request now if every limit covering `class` allows it and it takes no
    /// slot a queued launch is due to take; else the earliest instant to try again.
    /// Launches go first on the limits they share with other requests (Lambda's general
    /// 1 request/s): a launch comes once per 12 s there, and a poll that took its slot
    /// would delay it by a whole window, while the poll loses at most that.
    fn try_admit(&self, class: EndpointClass) -> Option<Instant> {
        let mut sent = self.lock();
        let now = Instant::now();
        let ready = self.ready_at(&sent.logs, class, now);
        if ready > now {
            return Some(ready);
        }
        if class != EndpointClass::Launch && sent.launches_waiting > 0 {
            let due = self.ready_at(&sent.logs, EndpointClass::Launch, now);
            let takes_its_slot = self.limits.iter().zip(&sent.logs).any(|(limit, log)| {
                let kept = kept_window(limit.per);
                let held = log.iter().filter(|e| **e + kept > due).count();
                limit.covers(class)
                    && limit.covers(EndpointClass::Launch)
                    && now + kept > due
                    && held + 1 >= limit.requests.max(1) as usize
            });
            if takes_its_slot {
                return Some(due.max(now) + AFTER_LAUNCH);
            }
        }
        for (limit, log) in self.limits.iter().zip(sent.logs.iter_mut()) {
            if limit.covers(class) {
                log.push_back(now);
                while log.len() > limit.requests.max(1) as usize {
                    log.pop_front();
                }
            }
        }
        None
    }
}

#[async_trait]
impl Admission for RateLimiter {
    async fn admit(&self, class: EndpointClass) {
        if !self.limits.iter().any(|l| l.covers(class)) {
            return;
        }
        let i = EndpointClass::ALL
            .iter()
            .position(|c| *c == class)
            .unwrap_or(0);
        let _turn = self.turns[i].lock().await;
        let _head = (class == EndpointClass::Launch).then(|| {
            self.lock().launches_waiting += 1;
            LaunchWaiting(self)
        });
        while let Some(at) = self.try_admit(class) {
            tokio::time::sleep_until(at).await;
        }
    }
}

/// An adapter behind its declared limits.
pub struct Governed {
    inner: Arc<dyn CloudProvider>,
    caps: Capabilities,
    in_flight: Semaphore,
    /// Earliest time the next `create` may start.
    next_create: Mutex<Option<Instant>>,
    /// The limiter installed in the adapter's gate (if the adapter was governed before,
    /// the gate keeps the first one and this one counts nothing: its launch wait is then
    /// none).
    limiter: Arc<RateLimiter>,
}

impl Governed {
    /// `inner` behind its declared capabilities; installs the limiter of its
    /// `rate_limits` in the adapter's gate (an adapter governed before keeps its first
    /// limiter, so its requests are counted in one place).
    pub fn new(inner: Arc<dyn CloudProvider>) -> Self {
        let caps = inner.capabilities();
        let limiter = Arc::new(RateLimiter::new(caps.rate_limits.clone()));
        inner.adapter().gate().install(limiter.clone());
        Governed {
            in_flight: Semaphore::new(caps.max_concurrency.max(1)),
            caps,
            inner,
            next_create: Mutex::new(None),
            limiter,
        }
    }

    async fn permit(&self) -> Result<tokio::sync::SemaphorePermit<'_>> {
        self.in_flight
            .acquire()
            .await
            .map_err(|_| ProviderError::transient("internal: API limiter closed"))
    }
}

#[async_trait]
impl CloudProvider for Governed {
    fn adapter(&self) -> &crate::provider::kit::Adapter {
        self.inner.adapter()
    }
    fn name(&self) -> &'static str {
        self.inner.name()
    }
    fn capabilities(&self) -> Capabilities {
        self.caps.clone()
    }
    fn endpoint_override(&self) -> Option<String> {
        self.inner.endpoint_override()
    }
    async fn credentials(&self) -> crate::provider::kit::CredentialReport {
        self.inner.credentials().await
    }
    fn check_request(&self, req: &ResourceRequest) -> Result<()> {
        self.inner.check_request(req)
    }
    async fn plan(&self, req: &ResourceRequest) -> Result<Vec<Offer>> {
        let _p = self.permit().await?;
        self.inner.plan(req).await
    }
    async fn prepare(&self, offer: &Offer, spec: &InstanceSpec) -> Result<serde_json::Value> {
        crate::crash::point("provider.before:prepare").await;
        let r = {
            let _p = self.permit().await?;
            self.inner.prepare(offer, spec).await
        };
        crate::crash::point("provider.after:prepare").await;
        r
    }
    async fn create(
        &self,
        offer: &Offer,
        prep: &serde_json::Value,
        spec: &InstanceSpec,
    ) -> Result<String> {
        let permit = {
            // Held across both waits, so creates queue up and reach the cloud one
            // interval apart: the permit is taken before the next slot is set, else
            // creates spaced here could bunch up behind a full semaphore.
            let mut next = self.next_create.lock().await;
            if let Some(at) = *next {
                tokio::time::sleep_until(at).await;
            }
            // Wait out a declared launch window before taking a permit, so the wait does
            // not hold one (the gate still counts the launch when it is sent).
            loop {
                let at = self.limiter.launch_ready_at();
                if at <= Instant::now() {
                    break;
                }
                tokio::time::sleep_until(at).await;
            }
            let p = self.permit().await?;
            *next = Some(Instant::now() + self.caps.min_create_interval);
            p
        };
        crate::crash::point("provider.before:create").await;
        let r = self.inner.create(offer, prep, spec).await;
        drop(permit);
        crate::crash::point("provider.after:create").await;
        r
    }
    async fn instances(
        &self,
        at: &Location,
        only_vm: Option<&str>,
    ) -> Result<Vec<crate::provider::Seen>> {
        let _p = self.permit().await?;
        self.inner.instances(at, only_vm).await
    }
    async fn observe(&self, at: &Location, vm_name: &str) -> Result<Vec<Observed>> {
        let _p = self.permit().await?;
        self.inner.observe(at, vm_name).await
    }
    async fn observe_location(
        &self,
        at: &Location,
    ) -> Result<Option<crate::provider::Observations>> {
        let _p = self.permit().await?;
        self.inner.observe_location(at).await
    }
    async fn import(
        &self,
        at: &Location,
        vm_name: &str,
        instance_id: &str,
    ) -> Result<crate::provider::Imported> {
        let _p = self.permit().await?;
        self.inner.import(at, vm_name, instance_id).await
    }
    async fn list(&self, at: &Location) -> Result<Vec<crate::provider::Listed>> {
        let _p = self.permit().await?;
        self.inner.list(at).await
    }
    async fn delete(&self, at: &Location, vm_name: &str, instance_ids: &[String]) -> Result<()> {
        crate::crash::point("provider.before:delete").await;
        let r = {
            let _p = self.permit().await?;
            self.inner.delete(at, vm_name, instance_ids).await
        };
        crate::crash::point("provider.after:delete").await;
        r
    }
    fn shared_objects(&self, offer: &Offer) -> Vec<crate::provider::SharedObject> {
        self.inner.shared_objects(offer)
    }
    async fn observe_shared(
        &self,
        obj: &crate::provider::SharedObject,
        public_key: &str,
    ) -> Result<Option<crate::provider::SharedFound>> {
        let _p = self.permit().await?;
        self.inner.observe_shared(obj, public_key).await
    }
    async fn create_shared(
        &self,
        obj: &crate::provider::SharedObject,
        public_key: &str,
    ) -> Result<crate::provider::SharedFound> {
        crate::crash::point("provider.before:create_shared").await;
        let r = {
            let _p = self.permit().await?;
            self.inner.create_shared(obj, public_key).await
        };
        crate::crash::point("provider.after:create_shared").await;
        r
    }
    async fn delete_shared(
        &self,
        obj: &crate::provider::SharedObject,
        found: &crate::provider::SharedFound,
    ) -> Result<()> {
        crate::crash::point("provider.before:delete_shared").await;
        let r = {
            let _p = self.permit().await?;
            self.inner.delete_shared(obj, found).await
        };
        crate::crash::point("provider.after:delete_shared").await;
        r
    }
    async fn start(&self, at: &Location, vm_name: &str, instance_id: &str) -> Result<()> {
        crate::crash::point("provider.before:start").await;
        let r = {
            let _p = self.permit().await?;
            self.inner.start(at, vm_name, instance_id).await
        };
        crate::crash::point("provider.after:start").await;
        r
    }
    async fn diagnose(
        &self,
        at: &Location,
        vm_name: &str,
        instance_id: &str,
    ) -> Result<Vec<crate::provider::Finding>> {
        let _p = self.permit().await?;
        self.inner.diagnose(at, vm_name, instance_id).await
    }
    async fn cleanup(&self, at: &Location, vm_name: &str) -> Result<()> {
        crate::crash::point("provider.before:cleanup").await;
        let r = {
            let _p = self.permit().await?;
            self.inner.cleanup(at, vm_name).await
        };
        crate::crash::point("provider.after:cleanup").await;
        r
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::provider::doubles::fake::FakeProvider;
    use crate::provider::rate::violations;
    use EndpointClass::*;

    fn secs(d: Duration) -> f64 {
        d.as_secs_f64()
    }

    /// `n` concurrent admissions of `class`; the seconds since `t0` at which each was
    /// admitted, sorted.
    async fn admit_all(
        l: &Arc<RateLimiter>,
        class: EndpointClass,
        n: usize,
        t0: Instant,
    ) -> Vec<f64> {
        let tasks: Vec<_> = (0..n)
            .map(|_| {
                let l = l.clone();
                tokio::spawn(async move {
                    l.admit(class).await;
                    secs(t0.elapsed())
                })
            })
            .collect();
        let mut out = Vec::new();
        for t in tasks {
            out.push(t.await.unwrap());
        }
        out.sort_by(f64::total_cmp);
        out
    }

    #[tokio::test(start_paused = true)]
    async fn never_more_than_the_declared_rate_in_any_window_and_the_burst_at_once() {
        let limit = RateLimit::all(5, Duration::from_secs(1), "test");
        let l = Arc::new(RateLimiter::new(vec![limit.clone()]));
        let t0 = Instant::now();
        let times = admit_all(&l, Read, 23, t0).await;
        assert_eq!(violations(&times, &limit), 0, "{times:?}");
        // The declared burst goes at once; each further five one kept window later.
        assert!(times[..5].iter().all(|t| *t == 0.0), "{times:?}");
        let kept = secs(kept_window(limit.per));
        assert!((times[5] - kept).abs() < 1e-9, "{times:?}");
        assert!((times[22] - 4.0 * kept).abs() < 1e-9, "{times:?}");
        // Not slower than the declared rate needs (the margin aside).
        assert!(
            times[22] <= 4.0 * secs(Duration::from_secs(1) + MIN_MARGIN) + 1e-9,
            "{times:?}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn every_limit_covering_a_request_holds_at_once() {
        // DigitalOcean's shape, scaled: a burst window and a longer budget.
        let minute = RateLimit::all(5, Duration::from_secs(1), "test");
        let hour = RateLimit::all(12, Duration::from_secs(10), "test");
        let l = Arc::new(RateLimiter::new(vec![minute.clone(), hour.clone()]));
        let times = admit_all(&l, Other, 30, Instant::now()).await;
        assert_eq!(violations(&times, &minute), 0, "{times:?}");
        assert_eq!(violations(&times, &hour), 0, "{times:?}");
        // The 13th waits for the long window, not the short one.
        assert!(times[12] >= 10.0, "{times:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn classes_are_independent_and_a_launch_also_counts_as_a_request() {
        let launch = RateLimit::of(Launch, 1, Duration::from_secs(12), "test");
        let reads = RateLimit::of(Read, 4, Duration::from_secs(1), "test");
        let l = Arc::new(RateLimiter::new(vec![launch.clone(), reads.clone()]));
        let t0 = Instant::now();
        let (launches, read_times, other) = tokio::join!(
            admit_all(&l, Launch, 3, t0),
            admit_all(&l, Read, 12, t0),
            admit_all(&l, Other, 50, t0),
        );
        assert_eq!(violations(&launches, &launch), 0, "{launches:?}");
        assert!(launches[2] >= 24.0, "{launches:?}");
        // Reads wait only for their own limit, never for the queued launches.
        assert_eq!(violations(&read_times, &reads), 0, "{read_times:?}");
        assert!(
            read_times[11] <= 2.0 * kept_window(Duration::from_secs(1)).as_secs_f64(),
            "{read_times:?}"
        );
        // A class no limit covers is never held.
        assert!(other.iter().all(|t| *t == 0.0), "{other:?}");

        // A limit over every request counts launches too (Lambda: 1/s and a launch 1/12 s).
        let all = RateLimit::all(2, Duration::from_secs(1), "test");
        let l = Arc::new(RateLimiter::new(vec![all.clone(), launch.clone()]));
        let t0 = Instant::now();
        l.admit(Launch).await;
        let reads = admit_all(&l, Read, 3, t0).await;
        assert_eq!(reads[0], 0.0);
        assert!(reads[1] >= 1.0, "the launch used one of the two: {reads:?}");
    }

    /// DigitalOcean's shape: 250 a minute and 5,000 an hour over every request, key
    /// listings 10 per 60 s. The 11th listing waits out the key window; reads sent
    /// meanwhile go at once, and launches are not held by the listings.
    #[tokio::test(start_paused = true)]
    async fn key_listings_wait_for_their_own_window_and_hold_back_no_read() {
        let minute = RateLimit::all(250, Duration::from_secs(60), "test");
        let hour = RateLimit::all(5000, Duration::from_secs(3600), "test");
        let keys = RateLimit::of(KeyListing, 10, Duration::from_secs(60), "test");
        let launch = RateLimit::of(Launch, 1, Duration::from_secs(12), "test");
        let l = Arc::new(RateLimiter::new(vec![
            minute.clone(),
            hour,
            keys.clone(),
            launch,
        ]));
        let t0 = Instant::now();
        let (listings, reads) = tokio::join!(
            admit_all(&l, KeyListing, 11, t0),
            admit_all(&l, Read, 40, t0),
        );
        assert_eq!(violations(&listings, &keys), 0, "{listings:?}");
        assert!(listings[..10].iter().all(|t| *t == 0.0), "{listings:?}");
        let kept = secs(kept_window(keys.per));
        assert!((listings[10] - kept).abs() < 1e-9, "{listings:?}");
        assert!(reads.iter().all(|t| *t == 0.0), "{reads:?}");
        // A key listing is no launch: the launch window is untouched by the listings.
        assert!(l.launch_ready_at() <= Instant::now());
        let t1 = Instant::now();
        l.admit(Launch).await;
        assert_eq!(secs(t1.elapsed()), 0.0);

        // Each listing also counts against the limit over every request.
        let l = Arc::new(RateLimiter::new(vec![
            RateLimit::all(12, Duration::from_secs(60), "test"),
            keys.clone(),
        ]));
        let t0 = Instant::now();
        admit_all(&l, KeyListing, 10, t0).await;
        let reads = admit_all(&l, Read, 3, t0).await;
        assert_eq!(reads[..2], [0.0, 0.0], "{reads:?}");
        assert!((reads[2] - kept).abs() < 1e-9, "{reads:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn a_caller_that_gives_up_waiting_counts_nothing() {
        let limit = RateLimit::all(1, Duration::from_secs(1), "test");
        let l = RateLimiter::new(vec![limit]);
        l.admit(Read).await;
        let gave_up = tokio::time::timeout(Duration::from_millis(100), l.admit(Read)).await;
        assert!(gave_up.is_err());
        let t0 = Instant::now();
        l.admit(Read).await;
        // Admitted one kept window after the first, not two.
        assert!(
            secs(t0.elapsed()) <= secs(kept_window(Duration::from_secs(1))),
            "{:?}",
            t0.elapsed()
        );
    }

    /// Lambda's shape: one permit, launches 1 per 12 s. A second launch waits out the
    /// window without holding the permit, so an observe sent meanwhile is answered at
    /// once, not after the launch (found in review: the wait used to hold the permit).
    #[tokio::test(start_paused = true)]
    async fn a_launch_waiting_for_its_window_holds_no_permit() {
        let f = FakeProvider::new("aws").with_offer("east", "us-east-1", "p5.48xlarge", 98.0);
        let mut caps = f.capabilities_for_test();
        caps.max_concurrency = 1;
        caps.rate_limits = vec![RateLimit::of(Launch, 1, Duration::from_secs(12), "test")];
        let fake = Arc::new(f.with_capabilities(caps));
        let governed = Arc::new(Governed::new(fake.clone()));
        let req = ResourceRequest {
            vm_name: "a".into(),
            regions: vec![],
            zones: vec![],
            gpu: None,
            gpu_count: 0,
            spot: false,
            max_price_per_hour: None,
            gpu_count_at_least: false,
        };
        let offer = governed.plan(&req).await.unwrap().remove(0);
        let spec = |vm: &str| InstanceSpec {
            vm_name: vm.into(),
            lineage: "0f0e0d0c-1111-4222-8333-444455556666".into(),
            client_token: format!("{vm}-1"),
            image: None,
            disk_gb: None,
            ports: vec![],
            ssh_public_key: "ssh-ed25519 AAAAtest".into(),
            boot_script: None,
            shared: Default::default(),
        };
        let t0 = Instant::now();
        governed
            .create(&offer, &serde_json::Value::Null, &spec("a"))
            .await
            .unwrap();
        let second = {
            let (g, o, sp) = (governed.clone(), offer.clone(), spec("b"));
            tokio::spawn(async move {
                g.create(&o, &serde_json::Value::Null, &sp).await.unwrap();
                t0.elapsed()
            })
        };
        tokio::time::sleep(Duration::from_secs(1)).await;
        let at = Location {
            cloud: "aws".into(),
            region: "us-east-1".into(),
            zone: None,
        };
        governed.observe(&at, "a").await.unwrap();
        let observed = t0.elapsed();
        let launched = second.await.unwrap();
        assert!(
            observed < Duration::from_secs(2),
            "observe waited for the launch window: {observed:?}"
        );
        assert!(launched >= Duration::from_secs(12), "{launched:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn governed_installs_the_declared_limits_on_every_call_path() {
        // Coalesced listings above the limits, plans, observes and shared-object calls:
        // the fake cloud measures its own requests against its declared limits.
        let limited = || {
            let f = FakeProvider::new("aws")
                .with_offer("east", "us-east-1", "p5.48xlarge", 98.0)
                .with_shared_key(None);
            let mut caps = f.capabilities_for_test();
            caps.rate_limits = vec![RateLimit::all(3, Duration::from_secs(1), "test")];
            Arc::new(f.with_capabilities(caps))
        };
        let fake = limited();
        let governed: Arc<dyn CloudProvider> = Arc::new(Governed::new(fake.clone()));
        // The same calls straight to the adapter (nothing installed in its gate) break
        // the limit, so the count at the fake cloud can fail.
        let raw = limited();
        for _ in 0..4 {
            raw.observe(
                &Location {
                    cloud: "aws".into(),
                    region: "us-east-1".into(),
                    zone: None,
                },
                "a",
            )
            .await
            .unwrap();
        }
        assert!(raw.rate_violations() > 0);
        let shared = crate::machine::coalesce::SharedReads::new(governed.clone());
        let at = Location {
            cloud: "aws".into(),
            region: "us-east-1".into(),
            zone: None,
        };
        let req = ResourceRequest {
            vm_name: "a".into(),
            regions: vec![],
            zones: vec![],
            gpu: None,
            gpu_count: 0,
            spot: false,
            max_price_per_hour: None,
            gpu_count_at_least: false,
        };
        let t0 = Instant::now();
        let offer = governed.plan(&req).await.unwrap().remove(0);
        let obj = governed.shared_objects(&offer).remove(0);
        let calls = (0..21).map(|i| {
            let (governed, at, req, obj) = (governed.clone(), at.clone(), req.clone(), obj.clone());
            async move {
                match i % 3 {
                    0 => governed.observe(&at, "a").await.map(|_| ()),
                    1 => governed.plan(&req).await.map(|_| ()),
                    _ => governed
                        .observe_shared(&obj, "ssh-ed25519 AAAA")
                        .await
                        .map(|_| ()),
                }
            }
        });
        for r in futures_util::future::join_all(calls).await {
            r.unwrap();
        }
        let listed = futures_util::future::join_all((0..10).map(|i| {
            let shared = &shared;
            let at = at.clone();
            async move { shared.observe(&at, &format!("m{i}")).await }
        }))
        .await;
        assert!(listed.iter().all(|r| r.is_ok()));
        let requests = fake.request_times().len();
        assert!(requests >= 23, "{requests}");
        assert_eq!(fake.rate_violations(), 0);
        assert!(secs(t0.elapsed()) >= 6.0, "{:?}", t0.elapsed());
    }

    #[tokio::test(start_paused = true)]
    async fn a_queued_launch_keeps_its_slot_on_a_limit_it_shares_with_polls() {
        // Lambda's shape: every request 1 per second, launches 1 per 12 s, polls all along.
        let all = RateLimit::all(1, Duration::from_secs(1), "test");
        let launch = RateLimit::of(Launch, 1, Duration::from_secs(12), "test");
        let l = Arc::new(RateLimiter::new(vec![all.clone(), launch.clone()]));
        let t0 = Instant::now();
        let polls = {
            let l = l.clone();
            tokio::spawn(async move {
                let mut at = Vec::new();
                while t0.elapsed() < Duration::from_secs(40) {
                    l.admit(Read).await;
                    at.push(secs(t0.elapsed()));
                }
                at
            })
        };
        let launches = admit_all(&l, Launch, 4, t0).await;
        let polls = polls.await.unwrap();
        let kept = secs(kept_window(launch.per));
        // The first launch waits at most for the poll admitted with it; then none is
        // delayed beyond its own window.
        assert!(
            launches[0] <= secs(kept_window(all.per)) + 0.01,
            "{launches:?}"
        );
        for (k, t) in launches.iter().enumerate() {
            let due = launches[0] + k as f64 * kept;
            assert!((t - due).abs() < 1e-9, "launch {k} delayed: {launches:?}");
        }
        let mut every: Vec<f64> = polls.iter().chain(&launches).copied().collect();
        every.sort_by(f64::total_cmp);
        assert_eq!(violations(&every, &all), 0, "{every:?}");
        // The polls lose only the slots next to each launch.
        assert!(polls.len() >= 25, "{}", polls.len());
    }
}
