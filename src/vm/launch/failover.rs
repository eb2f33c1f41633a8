//! The launch machine's failover table: one pure decision from where a fault happened
//! ([`Stage`]), what it was ([`Fault`]) and what the attempt holds at the cloud
//! ([`Holds`]: whether a create may have been sent, and whose the instance is) to what
//! the machine does next ([`Reaction`]). No I/O: the steps observe and call the cloud,
//! [`decide`] says what follows, and `compensate.rs` builds that state.
//!
//! The whole table is printed by a snapshot test
//! (`snapshots/gpuprov__vm__launch__failover__tests__failover_table.snap`), so a failover
//! change is a one-row diff, reviewed like code.

use std::fmt;

use crate::provider::ErrorKind;

/// Where in the launch a fault happened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    /// Looking at what the previous run left (`Reconciling`): the recorded machine, or an
    /// instance left unowned.
    Reconcile,
    /// Asking one cloud for offers (`Planning`), and between offers (`NextOffer`,
    /// `Exhausted`).
    Plan,
    /// Preparing an offer: shared objects and side resources (`Preparing`).
    Prepare,
    /// The listing by identity `Creating` reads before it sends a create.
    Find,
    /// The create call (`Creating`).
    Create,
    /// A create the cloud accepted and then refused (its operation failed), as the
    /// listing shows it (`InstanceStatus::Refused`).
    Refused,
    /// Starting the recorded machine that is stopped (`Starting`, and `Reconciling` while
    /// it waits for a stopping one or finds the cloud cannot start it).
    Start,
    /// Waiting for the instance to run with an SSH endpoint (`Booting`).
    Boot,
    /// Logging in over SSH (`Connecting`).
    Connect,
    /// Tearing down what a failed attempt may own (`Compensating`).
    Compensate,
}

/// What the attempt holds at the cloud when the fault happens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Holds {
    /// No instance, and no create of this attempt can be at the cloud (side resources
    /// of a prepare may exist).
    Nothing,
    /// A create of this attempt may be at the cloud, its instance not known yet: it was
    /// sent and its answer may be lost (a crash, a bare `Transient`).
    CreateSent,
    /// An instance this run created.
    Created,
    /// An instance carrying the machine's identity that gpuprov did not create (found by
    /// identity, or left `Unowned` by an earlier run).
    Adopted,
    /// The recorded machine that was up (restarted, reconnected), or the previous run's
    /// record: never deleted or replaced because of a fault.
    Kept,
}

/// What went wrong.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// A provider error, as the adapter classified it. The launch's own timeouts and
    /// failed or stopped instances are `Failed`.
    Provider(ErrorKind),
    /// The instance is not listed any more after the cloud's listing lag.
    Vanished,
    /// The VM's SSH host key differs from the pinned one.
    HostKeyChanged,
    /// SSH cannot run on this machine (`SshError::Local`).
    LocalSsh,
    /// This run has no adapter for the cloud.
    NoAdapter,
    /// The step's retry budget is spent.
    GaveUp,
    /// Ctrl-C.
    Cancelled,
}

impl Fault {
    /// The kind recorded in the search's history (and whose scope is blocked): the
    /// provider error's, `Failed` for a vanished instance and a spent budget, `None` for
    /// faults that are not the offer's (SSH on this machine, a host key, no adapter,
    /// Ctrl-C): those record and block nothing.
    pub fn kind(self) -> Option<ErrorKind> {
        match self {
            Fault::Provider(k) => Some(k),
            Fault::Vanished | Fault::GaveUp => Some(ErrorKind::Failed),
            Fault::HostKeyChanged | Fault::LocalSsh | Fault::NoAdapter | Fault::Cancelled => None,
        }
    }
}

/// What the launch does about a fault.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reaction {
    /// Run the same step again with backoff, within its retry budget (then
    /// [`Fault::GaveUp`]).
    Retry,
    /// Record the attempt, block its scope and go to the next offer; nothing to tear down.
    /// At [`Stage::Plan`]: leave the cloud's offers out (named if no offer is left).
    Skip,
    /// Record the attempt, block its scope, tear down what the attempt may own, then go
    /// to the next offer.
    CompensateThenNext,
    /// Tear down what the attempt may own, then stop the machine (`Aborted`).
    CompensateThenAbort,
    /// Stop the machine (`Aborted`), deleting nothing: what the state records stays
    /// recorded. At [`Stage::Plan`]: leave the cloud out, and stop if no cloud offered
    /// anything and none failed otherwise.
    Abort,
    /// Stop with the recorded machine kept, with its disk; it is never replaced.
    Keep,
    /// Leave the instance gpuprov did not create untouched (`Unowned`): only `destroy`
    /// deletes it.
    LeaveUnowned,
    /// Plan afresh (a new nonce, so a new create token): the instance is gone, not by
    /// this run's hand.
    Replan,
    /// Stop, naming what may still exist as `Leaked`: the next apply or destroy tears it
    /// down.
    Leak,
    /// Nothing changes: the step goes on (a compensation runs to its end).
    Continue,
}

/// Decides what follows `fault` at `stage` while the attempt `holds` what it holds. The
/// rules, the first that matches:
///
/// 1. **Ctrl-C**: a compensation runs to its end; at `Reconcile` and `Plan` the machine
///    stops (`Abort`) with what the state records; a kept machine is kept, an adopted
///    instance left unowned; any other attempt is compensated, then aborted.
/// 2. **Reconcile**: no adapter → `Leak` (the record stays for a run that has one); a
///    kind retried in place (`Transient`, `Unreachable`, `InUse`) → `Retry`; anything
///    else → `Abort` with the record as it was: nothing is replaced because of an error.
/// 3. **Plan** (one cloud): `Transient` → `Retry`; a kind that [`ends_the_machine`],
///    `Credentials`, no adapter, a spent budget → `Abort` (the cloud is left out, and the
///    machine stops only if no cloud offered anything and no other cloud failed
///    otherwise); any other kind → `Skip` the cloud.
/// 4. **Prepare and Create**: `Transient` → `Retry`; `Unavailable` (by contract nothing
///    was created) and `Unreachable` (the connection was refused: nothing was sent) →
///    `Skip`; no adapter → `Abort`; at `Prepare`, `Credentials` (this cloud's account
///    refused: credentials, billing) made nothing and a cleanup would be refused too:
///    `Skip`, which blocks the cloud.
/// 5. **Find**: `Unreachable` while no create may have been sent → `Skip`; a kind
///    retried in place → `Retry`.
/// 6. **Start**: a kind retried in place → `Retry`; anything else → `Keep`: never a
///    second instance of a machine that exists.
/// 7. **Compensate**: a spent budget → `Leak`.
/// 8. **Boot**: a kind retried in place → `Retry`; no adapter → `Leak`; vanished while
///    kept or adopted → `Replan` (gone, not by this run's hand).
/// 9. **Connect**: a changed host key → `Abort` with the machine recorded; SSH failing on
///    this machine → `Abort` a kept one (recorded, running), leave an adopted one
///    unowned, compensate then abort one this run created.
/// 10. **Boot, Connect, Refused**: a kept machine → `Keep`; an adopted instance →
///     `LeaveUnowned`.
/// 11. Otherwise: a kind that [`ends_the_machine`] → `CompensateThenAbort`; anything
///     else → `CompensateThenNext` (a `Credentials` refusal, such as an HTTP 402 on
///     create, blocks its cloud and the search goes on to the next cloud).
/// 12. A `Skip` while a create may have been sent becomes `CompensateThenNext`: only a
///     compensation finds an unlisted create.
///
/// `Skip` and `CompensateThenNext` block the error's scope: its own `block` when the
/// adapter set one, else `BlockScope::default_for` its kind (the offer; the instance
/// type in the region for a zoned `Failed`; the region for `Quota`; the cloud for
/// `Unreachable` and `Credentials`). A search left with no offer whose every attempt was
/// refused by an account (`Credentials`) ends `Aborted`, not `Exhausted`: waiting cures
/// no account (`LaunchMachine::next_offer`). Faults with no [`Fault::kind`] record and block nothing.
///
/// The inputs are meant to be reachable ([`Stage::holds`], [`Stage::faults`]); debug
/// builds check it, so the printed table is the one the steps use.
pub fn decide(stage: Stage, fault: Fault, holds: Holds) -> Reaction {
    use Reaction::*;
    debug_assert!(
        stage.holds().contains(&holds) && stage.faults().contains(&fault),
        "failover input outside the table: {stage:?} {fault:?} {holds:?}"
    );
    let kind = match fault {
        Fault::Provider(k) => Some(k),
        _ => None,
    };
    let retried = kind.is_some_and(ErrorKind::retried_in_place);
    let transient = kind == Some(ErrorKind::Transient);
    let nothing_made = matches!(kind, Some(ErrorKind::Unavailable | ErrorKind::Unreachable));
    let fatal = kind.is_some_and(ends_the_machine);
    let reaction = match stage {
        // 1.
        _ if fault == Fault::Cancelled => match (stage, holds) {
            (Stage::Compensate, _) => Continue,
            (Stage::Reconcile | Stage::Plan, _) => Abort,
            (_, Holds::Kept) => Keep,
            (_, Holds::Adopted) => LeaveUnowned,
            _ => CompensateThenAbort,
        },
        // 2.
        Stage::Reconcile if fault == Fault::NoAdapter => Leak,
        Stage::Reconcile if retried => Retry,
        Stage::Reconcile => Abort,
        // 3.
        Stage::Plan if transient => Retry,
        Stage::Plan
            if fatal
                || kind == Some(ErrorKind::Credentials)
                || matches!(fault, Fault::NoAdapter | Fault::GaveUp) =>
        {
            Abort
        }
        Stage::Plan => Skip,
        // 4.
        Stage::Prepare | Stage::Create if transient => Retry,
        Stage::Prepare | Stage::Create if nothing_made => Skip,
        Stage::Prepare | Stage::Create if fault == Fault::NoAdapter => Abort,
        Stage::Prepare if kind == Some(ErrorKind::Credentials) => Skip,
        // 5.
        Stage::Find if kind == Some(ErrorKind::Unreachable) && holds == Holds::Nothing => Skip,
        Stage::Find if retried => Retry,
        // 6.
        Stage::Start if retried => Retry,
        Stage::Start => Keep,
        // 7.
        Stage::Compensate => Leak,
        // 8.
        Stage::Boot if retried => Retry,
        Stage::Boot if fault == Fault::NoAdapter => Leak,
        Stage::Boot
            if fault == Fault::Vanished && matches!(holds, Holds::Kept | Holds::Adopted) =>
        {
            Replan
        }
        // 9.
        Stage::Connect if fault == Fault::HostKeyChanged => Abort,
        Stage::Connect if fault == Fault::LocalSsh => match holds {
            Holds::Kept => Abort,
            Holds::Adopted => LeaveUnowned,
            _ => CompensateThenAbort,
        },
        // 10.
        Stage::Boot | Stage::Connect | Stage::Refused if holds == Holds::Kept => Keep,
        Stage::Boot | Stage::Connect | Stage::Refused if holds == Holds::Adopted => LeaveUnowned,
        // 11.
        _ if fatal => CompensateThenAbort,
        _ => CompensateThenNext,
    };
    // 12.
    if reaction == Skip && holds == Holds::CreateSent {
        CompensateThenNext
    } else {
        reaction
    }
}

/// Whether a refusal of this kind ends the machine rather than its offer or its cloud: the
/// ask itself cannot be met, so no other offer can succeed (rules 3 and 11 of
/// [`decide`]). A refusal by one cloud's account (`Credentials`: rejected credentials, an
/// HTTP 402 for billing) is not one: it blocks that cloud, and other clouds may still
/// take the machine.
pub fn ends_the_machine(kind: ErrorKind) -> bool {
    kind == ErrorKind::InvalidRequest
}

/// Every provider error kind, in the contract's order.
pub const KINDS: [ErrorKind; 10] = [
    ErrorKind::Transient,
    ErrorKind::Capacity,
    ErrorKind::Quota,
    ErrorKind::Unavailable,
    ErrorKind::Failed,
    ErrorKind::InvalidRequest,
    ErrorKind::Credentials,
    ErrorKind::Unreachable,
    ErrorKind::InUse,
    ErrorKind::Exists,
];

impl Stage {
    /// Every stage, in the order a launch meets them.
    pub const ALL: [Stage; 10] = [
        Stage::Reconcile,
        Stage::Plan,
        Stage::Prepare,
        Stage::Find,
        Stage::Create,
        Stage::Refused,
        Stage::Start,
        Stage::Boot,
        Stage::Connect,
        Stage::Compensate,
    ];

    /// What an attempt can hold at this stage.
    pub fn holds(self) -> &'static [Holds] {
        use Holds::*;
        match self {
            Stage::Reconcile => &[Nothing, Adopted, Kept],
            Stage::Plan | Stage::Prepare => &[Nothing],
            Stage::Find | Stage::Create => &[Nothing, CreateSent],
            Stage::Refused => &[CreateSent, Created, Adopted, Kept],
            Stage::Start => &[Kept],
            Stage::Boot | Stage::Connect => &[Created, Adopted, Kept],
            Stage::Compensate => &[Created],
        }
    }

    /// The faults that can happen at this stage: the provider's kinds where the stage
    /// calls the cloud, and the launch's own.
    pub fn faults(self) -> Vec<Fault> {
        let kinds = KINDS.iter().map(|k| Fault::Provider(*k));
        let own: &[Fault] = match self {
            Stage::Find | Stage::Refused => &[],
            Stage::Reconcile | Stage::Plan | Stage::Prepare | Stage::Create | Stage::Start => {
                &[Fault::NoAdapter, Fault::GaveUp, Fault::Cancelled]
            }
            Stage::Boot => &[
                Fault::Vanished,
                Fault::NoAdapter,
                Fault::GaveUp,
                Fault::Cancelled,
            ],
            Stage::Connect => {
                return vec![
                    Fault::Provider(ErrorKind::Failed),
                    Fault::HostKeyChanged,
                    Fault::LocalSsh,
                    Fault::GaveUp,
                    Fault::Cancelled,
                ]
            }
            Stage::Compensate => return vec![Fault::GaveUp, Fault::Cancelled],
        };
        kinds.chain(own.iter().copied()).collect()
    }
}

impl fmt::Display for Stage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Stage::Reconcile => "reconcile",
            Stage::Plan => "plan",
            Stage::Prepare => "prepare",
            Stage::Find => "find",
            Stage::Create => "create",
            Stage::Refused => "refused",
            Stage::Start => "start",
            Stage::Boot => "boot",
            Stage::Connect => "connect",
            Stage::Compensate => "compensate",
        })
    }
}

impl fmt::Display for Holds {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Holds::Nothing => "nothing",
            Holds::CreateSent => "create sent",
            Holds::Created => "created",
            Holds::Adopted => "adopted",
            Holds::Kept => "kept",
        })
    }
}

impl fmt::Display for Fault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Fault::Provider(k) => write!(f, "{k:?}"),
            Fault::Vanished => f.write_str("vanished"),
            Fault::HostKeyChanged => f.write_str("host key changed"),
            Fault::LocalSsh => f.write_str("local ssh"),
            Fault::NoAdapter => f.write_str("no adapter"),
            Fault::GaveUp => f.write_str("gave up"),
            Fault::Cancelled => f.write_str("cancelled"),
        }
    }
}

impl fmt::Display for Reaction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Reaction::Retry => "retry",
            Reaction::Skip => "skip",
            Reaction::CompensateThenNext => "compensate, next",
            Reaction::CompensateThenAbort => "compensate, abort",
            Reaction::Abort => "abort",
            Reaction::Keep => "keep",
            Reaction::LeaveUnowned => "leave unowned",
            Reaction::Replan => "replan",
            Reaction::Leak => "leak",
            Reaction::Continue => "continue",
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::provider::{BlockScope, Location, Offer};
    use Reaction::*;

    const HOLDS: [Holds; 5] = [
        Holds::Nothing,
        Holds::CreateSent,
        Holds::Created,
        Holds::Adopted,
        Holds::Kept,
    ];

    /// Fails to compile when the contract gains a kind, so [`KINDS`] stays complete.
    #[test]
    fn kinds_lists_every_error_kind() {
        for k in KINDS {
            match k {
                ErrorKind::Transient
                | ErrorKind::Capacity
                | ErrorKind::Quota
                | ErrorKind::Unavailable
                | ErrorKind::Failed
                | ErrorKind::InvalidRequest
                | ErrorKind::Credentials
                | ErrorKind::Unreachable
                | ErrorKind::InUse
                | ErrorKind::Exists => {}
            }
        }
        let distinct: std::collections::HashSet<ErrorKind> = KINDS.into_iter().collect();
        assert_eq!(distinct.len(), KINDS.len());
    }

    fn offer(zone: Option<&str>) -> Offer {
        Offer {
            id: "c/r/t".into(),
            location: Location {
                cloud: "c".into(),
                region: "r".into(),
                zone: zone.map(str::to_string),
            },
            instance_type: "t".into(),
            gpu: None,
            gpu_count: 0,
            spot: false,
            price_per_hour: 1.0,
            detail: serde_json::Value::Null,
            facts: Default::default(),
        }
    }

    /// The scope a skip or a compensation blocks for this fault when the error names
    /// none ([`BlockScope::default_for`]), on an offer without and with a zone; `-` when
    /// the row blocks nothing (at `Plan` a skip leaves the cloud out, there is no search
    /// yet).
    fn blocks(stage: Stage, fault: Fault) -> String {
        let blocking = stage != Stage::Plan
            && stage
                .holds()
                .iter()
                .any(|h| matches!(decide(stage, fault, *h), Skip | CompensateThenNext));
        if !blocking {
            return "-".into();
        }
        let name = |s: Option<BlockScope>| match s {
            None => "-",
            Some(BlockScope::Offer { .. }) => "offer",
            Some(BlockScope::InstanceTypeInRegion { .. }) => "type in region",
            Some(BlockScope::Region { .. }) => "region",
            Some(BlockScope::Cloud { .. }) => "cloud",
        };
        let Some(kind) = fault.kind() else {
            return "-".into();
        };
        let plain = name(BlockScope::default_for(kind, &offer(None)));
        let zoned = name(BlockScope::default_for(kind, &offer(Some("z"))));
        if plain == zoned {
            plain.into()
        } else {
            format!("{plain} (zoned: {zoned})")
        }
    }

    /// The whole table: one row per stage and fault, one column per holding (`·` where the
    /// stage cannot hold it), and the scope a skip or a compensation blocks.
    fn table() -> String {
        let mut rows = vec![{
            let mut head = vec!["stage".to_string(), "fault".into()];
            head.extend(HOLDS.iter().map(Holds::to_string));
            head.push("blocks".into());
            head
        }];
        for stage in Stage::ALL {
            for fault in stage.faults() {
                let mut row = vec![stage.to_string(), fault.to_string()];
                row.extend(HOLDS.iter().map(|h| {
                    if stage.holds().contains(h) {
                        decide(stage, fault, *h).to_string()
                    } else {
                        "·".into()
                    }
                }));
                row.push(blocks(stage, fault));
                rows.push(row);
            }
        }
        let widths: Vec<usize> = (0..rows[0].len())
            .map(|i| rows.iter().map(|r| r[i].chars().count()).max().unwrap_or(0))
            .collect();
        let mut out = String::new();
        for (n, row) in rows.iter().enumerate() {
            let cells: Vec<String> = row
                .iter()
                .zip(&widths)
                .map(|(c, w)| format!("{c:<w$}", w = *w))
                .collect();
            out.push_str(cells.join(" | ").trim_end());
            out.push('\n');
            if n == 0 {
                let rule: Vec<String> = widths.iter().map(|w| "-".repeat(*w)).collect();
                out.push_str(&rule.join("-|-"));
                out.push('\n');
            }
        }
        out
    }

    /// The failover table as the steps use it: a change to [`decide`] is a row here.
    #[test]
    fn failover_table() {
        insta::assert_snapshot!("failover_table", table());
    }

    fn every_input() -> Vec<(Stage, Fault, Holds)> {
        Stage::ALL
            .iter()
            .flat_map(|s| {
                s.faults()
                    .into_iter()
                    .flat_map(move |f| s.holds().iter().map(move |h| (*s, f, *h)))
            })
            .collect()
    }

    /// The rules every row keeps, whatever the table says otherwise.
    #[test]
    fn every_row_keeps_the_invariants() {
        for (stage, fault, holds) in every_input() {
            let r = decide(stage, fault, holds);
            let why = format!("{stage} × {fault} × {holds} → {r}");
            // What this run did not create is never torn down nor given up for another
            // offer.
            if matches!(holds, Holds::Kept | Holds::Adopted) {
                assert!(
                    !matches!(r, Skip | CompensateThenNext | CompensateThenAbort),
                    "{why}"
                );
            }
            // Only what this run made may be left behind for the next offer without a
            // compensation, and only when no create may be at the cloud.
            if r == Skip {
                assert_eq!(holds, Holds::Nothing, "{why}");
            }
            // Only a call is retried, never a spent budget or a Ctrl-C.
            if r == Retry {
                assert!(matches!(fault, Fault::Provider(_)), "{why}");
            }
            if r == Keep {
                assert_eq!(holds, Holds::Kept, "{why}");
            }
            if r == LeaveUnowned {
                assert_eq!(holds, Holds::Adopted, "{why}");
            }
            if r == Replan {
                assert_eq!(fault, Fault::Vanished, "{why}");
            }
            assert_eq!(
                r == Continue,
                stage == Stage::Compensate && fault == Fault::Cancelled
            );
            // An ask no offer can meet never moves on to the next offer.
            if fault == Fault::Provider(ErrorKind::InvalidRequest) {
                assert!(!matches!(r, Skip | CompensateThenNext | Retry), "{why}");
            }
            // A Ctrl-C never starts another offer.
            if fault == Fault::Cancelled {
                assert!(!matches!(r, Skip | CompensateThenNext | Retry), "{why}");
            }
        }
    }

    /// The cases the launch's scenario tests are about, one line each.
    #[test]
    fn decide_named_cases() {
        use ErrorKind::*;
        use Fault::*;
        use Holds::*;
        use Stage::*;
        let p = Provider;
        #[rustfmt::skip]
        let cases: &[(&str, Stage, Fault, Holds, Reaction)] = &[
            ("a 503 on prepare retries", Prepare, p(Transient), Nothing, Retry),
            ("an account refusal in prepare leaves its cloud out", Prepare, p(Credentials), Nothing, Skip),
            ("a 402 on create cleans up, then the next cloud", Create, p(Credentials), Nothing, CompensateThenNext),
            ("an invalid ask cleans up, then aborts", Prepare, p(InvalidRequest), Nothing, CompensateThenAbort),
            ("not offered here: next offer, nothing to clean", Prepare, p(Unavailable), Nothing, Skip),
            ("a refused connection skips (the cloud is blocked)", Prepare, p(Unreachable), Nothing, Skip),
            ("quota in prepare cleans up the side resources", Prepare, p(Quota), Nothing, CompensateThenNext),
            ("an unreachable listing before a create skips", Find, p(Unreachable), Nothing, Skip),
            ("an unreachable listing after a create retries", Find, p(Unreachable), CreateSent, Retry),
            ("a failed listing after a create sweeps it", Find, p(Failed), CreateSent, CompensateThenNext),
            ("out of capacity on create: next offer", Create, p(Capacity), Nothing, CompensateThenNext),
            ("a rate-limited create retries", Create, p(Transient), Nothing, Retry),
            ("a create whose answer may be lost retries", Create, p(Transient), CreateSent, Retry),
            ("a late refusal for capacity: next offer", Refused, p(Capacity), CreateSent, CompensateThenNext),
            ("a late transient refusal is over: next offer", Refused, p(Transient), CreateSent, CompensateThenNext),
            ("a restart refused for quota keeps the machine", Start, p(Quota), Kept, Keep),
            ("a cloud that cannot start keeps the machine", Start, p(Unavailable), Kept, Keep),
            ("an instance failing while booting: next offer", Boot, p(Failed), Created, CompensateThenNext),
            ("an instance vanishing while booting is replaced", Boot, Vanished, Created, CompensateThenNext),
            ("a kept machine gone is planned afresh", Boot, Vanished, Kept, Replan),
            ("a found instance that stops is left untouched", Boot, p(Failed), Adopted, LeaveUnowned),
            ("a restarted machine that fails to boot is kept", Boot, p(Failed), Kept, Keep),
            ("a refused key on a found instance leaves it", Connect, p(Failed), Adopted, LeaveUnowned),
            ("ssh never up on a new instance: next offer", Connect, p(Failed), Created, CompensateThenNext),
            ("ssh never up on a machine that was up keeps it", Connect, p(Failed), Kept, Keep),
            ("a changed host key aborts, machine recorded", Connect, HostKeyChanged, Kept, Abort),
            ("no ssh here: clean up, then abort", Connect, LocalSsh, Created, CompensateThenAbort),
            ("a teardown that gives up leaks", Compensate, GaveUp, Created, Leak),
            ("Ctrl-C during a teardown lets it finish", Compensate, Cancelled, Created, Continue),
            ("Ctrl-C during create cleans up, then aborts", Create, Cancelled, CreateSent, CompensateThenAbort),
            ("Ctrl-C while restarting keeps the machine", Start, Cancelled, Kept, Keep),
            ("a catalog that answers 503 retries", Plan, p(Transient), Nothing, Retry),
            ("a catalog refusing the credentials: abort if alone", Plan, p(Credentials), Nothing, Abort),
            ("a catalog out of capacity: the cloud is left out", Plan, p(Capacity), Nothing, Skip),
            ("the record's cloud unreachable: retry", Reconcile, p(Unreachable), Kept, Retry),
            ("the record's cloud has no adapter: leaked", Reconcile, NoAdapter, Kept, Leak),
        ];
        for (name, stage, fault, holds, want) in cases {
            assert_eq!(decide(*stage, *fault, *holds), *want, "{name}");
        }
    }
}
