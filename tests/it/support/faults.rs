//! Scripted error answers of the fake vendor servers (`tests/it/vendor/`): per (method,
//! path), the errors a server answers with before its normal behaviour, and the hostile
//! mode in which every error it serves echoes a credential of the request, so a test can
//! show the adapter scrubs it.
#![allow(dead_code)]

use std::collections::{BTreeMap, VecDeque};

use serde_json::Value;

use super::spec::{Canned, Seen};

/// The scripted errors of one fake server.
#[derive(Default)]
pub struct Faults {
    queue: BTreeMap<(String, String), VecDeque<Canned>>,
    /// Every error served echoes the request's credential (see [`Faults::take`]).
    pub echo: bool,
}

impl Faults {
    /// Answers the next `method path` (exact path) with `c`, once; queued after earlier ones.
    pub fn push(&mut self, method: &str, path: &str, c: Canned) {
        self.queue
            .entry((method.into(), path.into()))
            .or_default()
            .push_back(c);
    }

    /// The error to answer `req` with, if one is scripted. In echo mode, `secret(req)` (the
    /// credential as the request carried it) is appended, in brackets, to the string at
    /// JSON pointer `message` of the error body.
    pub fn take(
        &mut self,
        req: &Seen,
        message: &str,
        secret: impl Fn(&Seen) -> String,
    ) -> Option<Canned> {
        let mut c = self
            .queue
            .get_mut(&(req.method.clone(), req.path.clone()))?
            .pop_front()?;
        if self.echo {
            let echoed = secret(req);
            if let Some(Value::String(m)) = c.body.as_mut().and_then(|b| b.pointer_mut(message)) {
                *m = format!("{m} [{echoed}]");
            }
        }
        Some(c)
    }
}

/// The request's `Authorization` header, as sent (empty when there is none).
pub fn authorization(req: &Seen) -> String {
    req.headers
        .iter()
        .find(|(k, _)| k.eq_ignore_ascii_case("authorization"))
        .map(|(_, v)| v.clone())
        .unwrap_or_default()
}

/// The value of query parameter `k` of `req`.
pub fn query<'a>(req: &'a Seen, k: &str) -> Option<&'a str> {
    req.query
        .iter()
        .find(|(n, _)| n == k)
        .map(|(_, v)| v.as_str())
}
