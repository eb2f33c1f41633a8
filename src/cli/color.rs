//! Terraform's plan colours on a terminal: the change symbols `+` green, `-` red, `~`
//! yellow (`-/+` red and green), the `# ADDRESS will be …` headers and the `Plan:` line
//! bold. None with `-no-color`, `NO_COLOR` or when stdout is not a terminal.

use std::io::IsTerminal;

use console::style;

/// Whether stdout takes colour: a terminal, no `-no-color`, no `NO_COLOR`.
pub fn stdout_color(no_color: bool) -> bool {
    !no_color && std::env::var_os("NO_COLOR").is_none() && std::io::stdout().is_terminal()
}

/// `text` (a rendered plan) with Terraform's colours, or unchanged when `color` is off.
pub fn plan(text: &str, color: bool) -> String {
    if !color {
        return text.to_string();
    }
    let mut out = String::with_capacity(text.len() + 64);
    for line in text.split_inclusive('\n') {
        out.push_str(&paint_line(line));
    }
    out
}

fn paint_line(line: &str) -> String {
    let body = line.trim_start();
    let indent = &line[..line.len() - body.len()];
    let s = |t: &str| style(t.to_string()).force_styling(true);
    for (symbol, painted) in [
        ("-/+ ", format!("{}/{} ", s("-").red(), s("+").green())),
        ("+/- ", format!("{}/{} ", s("+").green(), s("-").red())),
        ("+ ", format!("{} ", s("+").green())),
        ("- ", format!("{} ", s("-").red())),
        ("~ ", format!("{} ", s("~").yellow())),
    ] {
        if let Some(rest) = body.strip_prefix(symbol) {
            return format!("{indent}{painted}{rest}");
        }
    }
    let header = body.starts_with("# ")
        && !indent.is_empty()
        && indent.len() <= 2
        && body.starts_with("# vm.");
    if header || body.starts_with("Plan:") {
        let (text, nl) = match body.strip_suffix('\n') {
            Some(t) => (t, "\n"),
            None => (body, ""),
        };
        return format!("{indent}{}{nl}", s(text).bold());
    }
    line.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    const PLAN: &str = "gpuprov will perform the following actions:\n\n  # vm.dev must be replaced\n-/+ vm \"dev\" {\n      ~ image = (default) -> \"debian:12\" # forces replacement\n      + ports = [22]\n      - gpu = \"H100\"\n    }\n\nPlan: 1 to add, 0 to change, 1 to destroy.\n";

    #[test]
    fn symbols_take_terraforms_colours_and_nothing_else_changes() {
        let painted = plan(PLAN, true);
        assert!(painted.contains("\x1b[31m-\x1b[0m/\x1b[32m+\x1b[0m vm \"dev\" {"));
        assert!(painted.contains("      \x1b[33m~\x1b[0m image = (default)"));
        assert!(painted.contains("      \x1b[32m+\x1b[0m ports = [22]"));
        assert!(painted.contains("      \x1b[31m-\x1b[0m gpu = \"H100\""));
        assert!(painted.contains("  \x1b[1m# vm.dev must be replaced\x1b[0m\n"));
        assert!(painted.contains("\x1b[1mPlan: 1 to add, 0 to change, 1 to destroy.\x1b[0m\n"));
        // Stripping the codes gives the plain plan back.
        assert_eq!(console::strip_ansi_codes(&painted), PLAN);
    }

    #[test]
    fn no_colour_leaves_the_text_alone() {
        assert_eq!(plan(PLAN, false), PLAN);
    }
}
