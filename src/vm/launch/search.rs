//! The failover cursor: the ordered offers of one planning, the one being tried, the
//! scopes blocked so far and what happened on each attempt. It travels in every attempt
//! state, so it survives a crash.

use serde::{Deserialize, Serialize};

use crate::provider::{BlockScope, ErrorKind, Offer};

use super::super::Preemption;

/// One attempt on one offer, kept for `status` and for the final error message.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Attempt {
    pub offer_id: String,
    pub outcome: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<ErrorKind>,
}

/// The failover cursor: ordered offers, the one being tried, what is blocked, and what
/// happened so far.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Search {
    pub offers: Vec<Offer>,
    pub cursor: usize,
    #[serde(default)]
    pub blocked: Vec<BlockScope>,
    #[serde(default)]
    pub history: Vec<Attempt>,
    /// Planning round (increases with each `--retry-until-up` re-plan); part of the
    /// idempotency token so a new round never reuses an old create.
    #[serde(default)]
    pub round: u32,
    /// Random per planning (8 hex digits), part of every create's idempotency token: a
    /// machine whose instance is gone (spot interruption, terminated in the console) is
    /// re-planned with a new nonce, so its replacement never re-sends a token the cloud
    /// already used (EC2 would answer with the dead instance). Journalled with the search,
    /// so it is stable across crashes of one attempt. Empty in journals written before it
    /// existed (their tokens stay as they were).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub nonce: String,
    /// The machine's recent spot preemptions (from its record, plus the one that ended
    /// it): planning ordered their (instance type, region) after every other offer, and
    /// the record of the machine this search brings up keeps them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub preempted: Vec<Preemption>,
}

/// A fresh [`Search::nonce`].
pub(super) fn new_nonce() -> String {
    format!("{:08x}", rand::random::<u32>())
}

impl Search {
    /// The offer under the cursor.
    pub fn current(&self) -> Option<&Offer> {
        self.offers.get(self.cursor)
    }

    pub(super) fn is_blocked(&self, o: &Offer) -> bool {
        self.blocked.iter().any(|b| b.covers(o))
    }

    /// The next offer after the cursor that no block covers.
    pub(super) fn next_unblocked(&self) -> Option<&Offer> {
        self.offers
            .iter()
            .skip(self.cursor + 1)
            .find(|o| !self.is_blocked(o))
    }

    /// The search moved to the next offer after the cursor that no block covers, `None`
    /// when none is left.
    pub(super) fn advanced(&self) -> Option<Search> {
        let i =
            (self.cursor + 1..self.offers.len()).find(|&i| !self.is_blocked(&self.offers[i]))?;
        Some(Search {
            cursor: i,
            ..self.clone()
        })
    }

    /// Records the outcome of the current offer and blocks `scope`.
    pub(super) fn record(
        mut self,
        outcome: String,
        kind: Option<ErrorKind>,
        scope: Option<BlockScope>,
    ) -> Search {
        if let Some(o) = self.current() {
            self.history.push(Attempt {
                offer_id: o.id.clone(),
                outcome,
                kind,
            });
        }
        if let Some(s) = scope {
            if !self.blocked.contains(&s) {
                self.blocked.push(s);
            }
        }
        self
    }

    /// Whether every attempt so far was refused by a cloud's account (`Credentials`:
    /// rejected credentials, billing): waiting for capacity cures none of them.
    pub(super) fn only_account_refusals(&self) -> bool {
        !self.history.is_empty()
            && self
                .history
                .iter()
                .all(|a| a.kind == Some(ErrorKind::Credentials))
    }

    pub(super) fn summary(&self) -> String {
        if self.history.is_empty() {
            return "no offer matched".into();
        }
        self.history
            .iter()
            .map(|a| format!("{}: {}", a.offer_id, a.outcome))
            .collect::<Vec<_>>()
            .join("; ")
    }
}
