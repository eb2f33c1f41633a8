//! `gpuprov show [-json] PLANFILE`: a plan saved by `plan -out FILE`, as the text plan or
//! in Terraform's JSON plan shape (as `terraform show -json PLANFILE`).

use miette::IntoDiagnostic;

use super::args::ShowArgs;
use super::error::{CmdResult, Exit};
use super::json::JsonPlan;
use super::read_saved_plan;
use crate::plan;

pub(super) fn run(a: &ShowArgs) -> CmdResult {
    let saved = read_saved_plan(&a.plan_file)?;
    if a.json.json {
        let json = JsonPlan::of(&saved);
        outln!("{}", serde_json::to_string_pretty(&json).into_diagnostic()?);
    } else {
        out!("{}", plan::render(&saved));
    }
    Ok(Exit::Success)
}
