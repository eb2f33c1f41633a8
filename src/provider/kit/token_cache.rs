//! A short-lived access token and its renewal, shared by the adapters that exchange a
//! long-lived credential for tokens (GCP's service accounts and user logins, Nebius'
//! service accounts): the token is kept until its renewal time, concurrent callers wait
//! for one request instead of sending their own, every token (and assertion) issued is
//! remembered so it can be scrubbed from errors, and a token the API refused after it had
//! worked is dropped so the next call fetches a new one.

use std::future::Future;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::super::redact::Secret;
use super::failure::Failure;

struct Cached {
    token: Secret,
    renew_at: Instant,
    /// Whether an API call succeeded with it.
    worked: bool,
}

/// The cache (module docs). Its `Debug` shows no token.
#[derive(Default)]
pub struct TokenCache {
    current: Mutex<Option<Cached>>,
    issued: Mutex<Vec<Secret>>,
    /// Held across a fetch, so concurrent calls make one.
    gate: tokio::sync::Mutex<()>,
}

impl std::fmt::Debug for TokenCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TokenCache").finish_non_exhaustive()
    }
}

impl TokenCache {
    fn fresh(&self) -> Option<Secret> {
        let c = self.current.lock().unwrap_or_else(|p| p.into_inner());
        c.as_ref()
            .filter(|c| Instant::now() < c.renew_at)
            .map(|c| c.token.clone())
    }

    /// The cached token until its renewal time, else a new one from `fetch`, which
    /// answers the token and how long it may be used before it is renewed. Errors:
    /// `fetch`'s.
    pub async fn get<F, Fut>(&self, fetch: F) -> Result<Secret, Failure>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<(Secret, Duration), Failure>>,
    {
        if let Some(t) = self.fresh() {
            return Ok(t);
        }
        let _one = self.gate.lock().await;
        if let Some(t) = self.fresh() {
            return Ok(t);
        }
        let (token, renew_in) = fetch().await?;
        self.remember(&token);
        *self.current.lock().unwrap_or_else(|p| p.into_inner()) = Some(Cached {
            token: token.clone(),
            renew_at: Instant::now() + renew_in,
            worked: false,
        });
        Ok(token)
    }

    /// Remembers `s` (a token, or the assertion that asked for one) for [`issued`](Self::issued).
    pub fn remember(&self, s: &Secret) {
        self.issued
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(s.clone());
    }

    /// A call with `token` succeeded.
    pub fn worked(&self, token: &Secret) {
        if let Some(c) = self
            .current
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_mut()
            .filter(|c| &c.token == token)
        {
            c.worked = true;
        }
    }

    /// The API refused `token`: drops it, and answers whether a new one may succeed (it
    /// had worked, so it expired or was revoked early).
    pub fn rejected(&self, token: &Secret) -> bool {
        let mut c = self.current.lock().unwrap_or_else(|p| p.into_inner());
        match c.as_ref() {
            Some(cached) if &cached.token == token => {
                let worked = cached.worked;
                *c = None;
                worked
            }
            _ => false,
        }
    }

    /// Every token and assertion issued so far.
    pub fn issued(&self) -> Vec<Secret> {
        self.issued
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_token_is_kept_until_renewal_and_a_refused_one_that_worked_is_dropped() {
        let cache = TokenCache::default();
        let t1 = cache
            .get(|| async { Ok((Secret::new("t1"), Duration::from_secs(60))) })
            .await
            .unwrap();
        let again = cache
            .get(|| async { Ok((Secret::new("t2"), Duration::from_secs(60))) })
            .await
            .unwrap();
        assert_eq!(again, t1, "cached");
        assert!(!cache.rejected(&Secret::new("other")), "not ours");
        cache.worked(&t1);
        assert!(cache.rejected(&t1), "it had worked: renew");
        let t3 = cache
            .get(|| async { Ok((Secret::new("t3"), Duration::ZERO)) })
            .await
            .unwrap();
        assert_eq!(t3.expose(), "t3");
        assert!(
            !cache.rejected(&t3),
            "never worked: the credential is wrong"
        );
        let t4 = cache
            .get(|| async { Ok((Secret::new("t4"), Duration::ZERO)) })
            .await
            .unwrap();
        assert_eq!(t4.expose(), "t4", "a token due for renewal is renewed");
        let e = cache
            .get(|| async { Err(Failure::no_credential("refused")) })
            .await
            .unwrap_err();
        assert_eq!(e.message, "refused");
        let issued: Vec<String> = cache
            .issued()
            .iter()
            .map(|s| s.expose().to_string())
            .collect();
        assert_eq!(issued, ["t1", "t3", "t4"]);
    }
}
