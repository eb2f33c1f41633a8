//! `gpuprov state migrate`: copies a project's state from one backend to another.

use super::error::{CmdResult, Exit};
use std::sync::Arc;

use miette::{miette, Report};

use crate::state::backend::bridge::blocking;
use crate::state::{Backend, StateStore};

use super::args::{Cli, StateMigrateArgs};
use super::project::{lock_backend, Project};

/// Migrates the state from `--from` (default: the configured backend) to `--to`
/// (default: the configured backend), with both locks held.
///
/// The destination gets the source's bytes exactly (lineage and serial kept), is read
/// back and compared before success is reported, and the source is left untouched. A
/// source with an unfinished run's journal is refused (its changes would not travel);
/// a destination holding another lineage or a newer serial is refused unless `--force`.
pub(super) fn run(cli: &Cli, project: &Project, a: &StateMigrateArgs) -> CmdResult {
    if a.from.is_empty() && a.to.is_empty() {
        return Err(miette!(
            help = "for example, after adding an s3 [backend] to gpuprov.toml: `gpuprov state migrate --from type=local`",
            "state migrate needs --from or --to (the other side is the configured backend)"
        ).into());
    }
    let side = |pairs: &[String]| -> Result<(Option<String>, Arc<dyn Backend>), Report> {
        let settings = if pairs.is_empty() {
            project.backend_settings(None)?
        } else {
            project.backend_settings(Some(pairs))?
        };
        Ok((settings.endpoint.clone(), project.open_backend(&settings)?))
    };
    let (from_endpoint, from) = side(&a.from)?;
    let (to_endpoint, to) = side(&a.to)?;
    // The same bucket and key on two S3-compatible stores are two states.
    if from.location() == to.location() && from_endpoint == to_endpoint {
        return Err(miette!(
            "the source and the destination are the same state ({})",
            from.location().display()
        )
        .into());
    }
    let _from_lock = lock_backend(&*from, "state migrate (source)", cli.lock_timeout)?;
    let _to_lock = lock_backend(&*to, "state migrate (destination)", cli.lock_timeout)?;

    let (source, state) = blocking(|| StateStore::open_in(from.clone()))?;
    if source.replayed_journal() {
        return Err(miette!(
            help = "run `gpuprov apply` (or `gpuprov destroy`) on the source first, so the run finishes and its journal is folded into the state",
            "the source {} holds an unfinished run's journal, whose changes would not be migrated",
            from.location().display()
        ).into());
    }
    let Some(bytes) = source.original_bytes().map(<[u8]>::to_vec) else {
        return Err(miette!(
            "no state is stored at {}: nothing to migrate",
            from.location().display()
        )
        .into());
    };
    let (mut dest, existing) = blocking(|| StateStore::open_in(to.clone()))?;
    if let Some(current) = dest.original_bytes() {
        if current == bytes.as_slice() {
            errln!(
                "{} already holds this state (serial {}); nothing to do.",
                to.location().display(),
                state.serial
            );
            return Ok(Exit::Success);
        }
        let conflict = if existing.lineage != state.lineage {
            Some(format!(
                "it holds another state (lineage {})",
                existing.lineage
            ))
        } else if existing.serial > state.serial {
            Some(format!(
                "it holds a newer serial ({} > {})",
                existing.serial, state.serial
            ))
        } else {
            None
        };
        if let Some(what) = conflict {
            if !a.force {
                return Err(miette!(
                    help = "inspect both with `gpuprov state pull`; --force overwrites the destination",
                    "refusing to migrate to {}: {what}",
                    to.location().display()
                ).into());
            }
        }
    }
    if dest.replayed_journal() && !a.force {
        return Err(miette!(
            help = "finish that run on the destination first, or pass --force to discard it",
            "the destination {} holds an unfinished run's journal",
            to.location().display()
        )
        .into());
    }
    blocking(|| dest.write_exact(&bytes))?;
    // Verified by reading back through a fresh store, not trusted from the write.
    let (check, _) = blocking(|| StateStore::open_in(to.clone()))?;
    if check.original_bytes() != Some(bytes.as_slice()) {
        return Err(miette!(
            help = "the source is untouched; retry, or inspect the destination with `gpuprov state pull`",
            "the state read back from {} differs from the source",
            to.location().display()
        ).into());
    }
    errln!(
        "Migrated the state (lineage {}, serial {}, {} machine{}, {} bytes) from {} to {}, verified. The source is untouched.",
        state.lineage,
        state.serial,
        state.resources.len(),
        if state.resources.len() == 1 { "" } else { "s" },
        bytes.len(),
        from.location().display(),
        to.location().display()
    );
    if !a.to.is_empty() {
        errln!(
            "Point the [backend] table of gpuprov.toml at the destination before the next apply."
        );
    }
    Ok(Exit::Success)
}
