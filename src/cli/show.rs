//! `gpuprov show [-json|-markdown] PLANFILE`: a plan saved by `plan -out FILE`, as the
//! text plan, in Terraform's JSON plan shape (as `terraform show -json PLANFILE`), or as
//! Markdown for a pull-request comment. With `GITHUB_STEP_SUMMARY` set (GitHub Actions),
//! `plan` and `show` also append the Markdown plan to that file: the job's summary.

use super::apply::read_saved_plan;
use super::args::ShowArgs;
use super::error::{CmdResult, CommandError, Exit};
use super::view::json::JsonPlan;
use super::view::{markdown, text};

/// `color`: Terraform's plan colours (a terminal without `-no-color` / `NO_COLOR`).
pub(super) fn run(a: &ShowArgs, color: bool) -> CmdResult {
    let saved = read_saved_plan(&a.plan_file)?;
    if a.json.json {
        let json = JsonPlan::of(&saved);
        outln!(
            "{}",
            serde_json::to_string_pretty(&json).map_err(CommandError::internal)?
        );
    } else if a.markdown {
        out!("{}", markdown::render(&saved));
    } else {
        out!("{}", super::color::plan(&text::render(&saved), color));
    }
    write_step_summary(&saved)?;
    Ok(Exit::Success)
}

/// Appends the Markdown plan to `$GITHUB_STEP_SUMMARY` when it names a file (GitHub
/// Actions sets it in every step; "Adding a job summary", GitHub Actions docs). Errors: the
/// file cannot be written (named).
pub(super) fn write_step_summary(p: &crate::plan::Plan) -> Result<(), miette::Report> {
    use std::io::Write as _;
    let Some(path) = std::env::var_os("GITHUB_STEP_SUMMARY").filter(|v| !v.is_empty()) else {
        return Ok(());
    };
    let path = std::path::PathBuf::from(path);
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
        .and_then(|mut f| writeln!(f, "{}", markdown::render(p)))
        .map_err(|e| {
            miette::miette!(
                help = "unset GITHUB_STEP_SUMMARY, or point it at a writable file",
                "cannot append the plan to GITHUB_STEP_SUMMARY ({}): {e}",
                path.display()
            )
        })
}
