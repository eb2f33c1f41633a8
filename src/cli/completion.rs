//! `gpuprov completion SHELL`: shell completions generated (clap_complete) from the same
//! clap definitions the parser uses.

use super::args::{command, CompletionArgs};
use super::error::{CmdResult, Exit};

pub(super) fn run(a: &CompletionArgs) -> CmdResult {
    let mut cmd = command();
    let mut script = Vec::new();
    clap_complete::generate(a.shell, &mut cmd, "gpuprov", &mut script);
    out!("{}", String::from_utf8_lossy(&script));
    Ok(Exit::Success)
}
