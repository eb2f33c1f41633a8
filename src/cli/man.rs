//! `gpuprov man [--dir DIR]`: the man page (clap_mangen) from the same clap definitions
//! the parser uses, exit codes included, plus an ENVIRONMENT section from
//! [`ENVIRONMENT`](super::error::ENVIRONMENT).

use clap_mangen::roff::{roman, Roff};
use miette::{miette, IntoDiagnostic};

use super::args::{command, ManArgs};
use super::error::{CmdResult, Exit, ENVIRONMENT};

pub(super) fn run(a: &ManArgs) -> CmdResult {
    let cmd = command();
    if let Some(dir) = &a.dir {
        std::fs::create_dir_all(dir)
            .map_err(|e| miette!("cannot create {}: {e}", dir.display()))?;
        clap_mangen::generate_to(cmd.clone(), dir)
            .map_err(|e| miette!("cannot write the man pages into {}: {e}", dir.display()))?;
        // The top page again, with the ENVIRONMENT section generate_to cannot add.
        let top = dir.join("gpuprov.1");
        std::fs::write(&top, page(cmd)?)
            .map_err(|e| miette!("cannot write {}: {e}", top.display()))?;
        errln!("Wrote the man pages into {}.", dir.display());
        return Ok(Exit::Success);
    }
    out!("{}", String::from_utf8_lossy(&page(cmd)?));
    Ok(Exit::Success)
}

/// The top man page: clap_mangen's sections in its order, with ENVIRONMENT after the
/// exit codes (man-pages(7) order).
fn page(cmd: clap::Command) -> Result<Vec<u8>, miette::Report> {
    let man = clap_mangen::Man::new(cmd);
    let mut out = Vec::new();
    man.render_title(&mut out).into_diagnostic()?;
    man.render_name_section(&mut out).into_diagnostic()?;
    man.render_synopsis_section(&mut out).into_diagnostic()?;
    man.render_description_section(&mut out).into_diagnostic()?;
    man.render_options_section(&mut out).into_diagnostic()?;
    man.render_subcommands_section(&mut out).into_diagnostic()?;
    man.render_extra_section(&mut out).into_diagnostic()?;
    let mut env = Roff::default();
    env.control("SH", ["ENVIRONMENT"]);
    for (name, meaning) in ENVIRONMENT {
        env.control("TP", []);
        env.text([roman(*name)]);
        env.text([roman(*meaning)]);
    }
    env.to_writer(&mut out).into_diagnostic()?;
    man.render_version_section(&mut out).into_diagnostic()?;
    Ok(out)
}
