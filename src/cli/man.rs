//! `gpuprov man [--dir DIR]`: the man page (clap_mangen) from the same clap definitions
//! the parser uses, exit codes included.

use miette::{miette, IntoDiagnostic};

use super::args::{command, ManArgs};
use super::error::{CmdResult, Exit};

pub(super) fn run(a: &ManArgs) -> CmdResult {
    let cmd = command();
    if let Some(dir) = &a.dir {
        std::fs::create_dir_all(dir)
            .map_err(|e| miette!("cannot create {}: {e}", dir.display()))?;
        clap_mangen::generate_to(cmd, dir)
            .map_err(|e| miette!("cannot write the man pages into {}: {e}", dir.display()))?;
        errln!("Wrote the man pages into {}.", dir.display());
        return Ok(Exit::Success);
    }
    let mut page = Vec::new();
    clap_mangen::Man::new(cmd)
        .render(&mut page)
        .into_diagnostic()?;
    out!("{}", String::from_utf8_lossy(&page));
    Ok(Exit::Success)
}
