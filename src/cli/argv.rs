//! The one argv normalisation step before clap: Terraform's single-dash spelling of long
//! flags (`-auto-approve`, `-lock=false`, `-out FILE`, `-chdir=DIR`) becomes clap's
//! double dash. The long flags come from the clap definitions themselves (the built
//! [`clap::Command`], globals included), so a new flag gets its single-dash spelling
//! without a list to keep in step.
//!
//! A single-dash word that is not a long flag of the command it is given to is refused
//! with a hint, instead of being read as a cluster of short options (clap would read
//! `-chdirx` as `-c hdirx`). Single letters (`-c PATH`, `-c=PATH`, `-h`) and negative
//! numbers are clap's as before; everything after `--` is passed on untouched.

use std::ffi::OsString;

use clap::{Arg, Command};

use super::error::CommandError;

/// Rewrites `args` (the program name first) for `cmd`, which must be built
/// ([`Command::build`], so every subcommand carries the global flags).
///
/// # Errors
///
/// A usage [`CommandError`] for a single-dash word that is no long flag where it stands,
/// with the nearest long flag as a hint.
pub fn normalize(cmd: &Command, args: Vec<OsString>) -> Result<Vec<OsString>, CommandError> {
    let mut out = Vec::with_capacity(args.len());
    let mut scope = cmd;
    // The subcommand path so far, for the hint's `gpuprov SUB --help`.
    let mut path: Vec<&str> = Vec::new();
    let mut words = args.into_iter();
    if let Some(program) = words.next() {
        out.push(program);
    }
    while let Some(word) = words.next() {
        let Some(s) = word.to_str().map(str::to_owned) else {
            out.push(word);
            continue;
        };
        if s == "--" {
            out.push(word);
            out.extend(words);
            break;
        }
        // Go's flag package (Terraform's) takes `-json=true` / `-json=false` for a switch.
        let dashes = s.chars().take(2).take_while(|c| *c == '-').count();
        if let Some((name, value)) = s[dashes..].split_once('=').filter(|_| dashes > 0) {
            if find_long(scope, name).is_some_and(is_switch) {
                match value {
                    "true" | "1" => out.push(format!("--{name}").into()),
                    "false" | "0" => {}
                    _ => {
                        return Err(CommandError::usage(
                            format!("invalid value {value:?} for -{name}"),
                            Some(format!(
                                "-{name} is a switch: write -{name}, -{name}=true or -{name}=false"
                            )),
                        ))
                    }
                }
                continue;
            }
        }
        let takes_value = if let Some(body) = s.strip_prefix("--") {
            out.push(word);
            !body.contains('=') && find_long(scope, body).is_some_and(needs_value)
        } else if let Some(body) = s.strip_prefix('-').filter(|b| !b.is_empty()) {
            let name = body.split_once('=').map_or(body, |(n, _)| n);
            let is_word =
                name.chars().count() > 1 && name.starts_with(|c: char| c.is_ascii_alphabetic());
            if !is_word {
                // `-c`, `-c=PATH`, `-h`, `-3`: clap's own short options and values.
                let short = name.chars().next();
                out.push(word);
                !body.contains('=')
                    && name.chars().count() == 1
                    && short
                        .and_then(|c| find_short(scope, c))
                        .is_some_and(needs_value)
            } else if let Some(arg) = find_long(scope, name) {
                out.push(format!("-{s}").into());
                !body.contains('=') && needs_value(arg)
            } else {
                return Err(unknown(cmd, scope, &path, name));
            }
        } else {
            // A subcommand or a positional value.
            if let Some(sub) = scope.find_subcommand(&s) {
                scope = sub;
                path.push(sub.get_name());
            }
            out.push(word);
            false
        };
        if takes_value {
            // The value is the option's whatever it looks like (`--max-price -3`).
            out.extend(words.next());
        }
    }
    Ok(out)
}

/// Whether `arg` is an on/off switch that takes no value (`--json`, `--auto-approve`).
fn is_switch(arg: &Arg) -> bool {
    matches!(arg.get_action(), clap::ArgAction::SetTrue)
}

/// Whether `arg` needs a value after it (`--out FILE`); `--lock` / `--refresh` take one
/// only when attached (`--lock=false`).
fn needs_value(arg: &Arg) -> bool {
    arg.get_num_args().is_some_and(|n| n.min_values() > 0)
}

/// The argument of `scope` whose long name (or alias) is `name`.
fn find_long<'a>(scope: &'a Command, name: &str) -> Option<&'a Arg> {
    scope.get_arguments().find(|a| {
        a.get_long() == Some(name)
            || a.get_all_aliases()
                .is_some_and(|aliases| aliases.contains(&name))
    })
}

fn find_short(scope: &Command, c: char) -> Option<&Arg> {
    scope.get_arguments().find(|a| a.get_short() == Some(c))
}

/// The long flags a single-dash word may spell at `scope`.
pub fn long_flags(scope: &Command) -> impl Iterator<Item = &str> {
    scope.get_arguments().filter_map(Arg::get_long)
}

/// The usage error for `-NAME` at `scope`: the nearest long flag there as the hint, else
/// the commands of `root` that have such a flag, else how one-letter options take values.
fn unknown(root: &Command, scope: &Command, path: &[&str], name: &str) -> CommandError {
    let nearest = long_flags(scope)
        .map(|l| (strsim::jaro(name, l), l))
        .filter(|(score, _)| *score > 0.8)
        .max_by(|a, b| a.0.total_cmp(&b.0))
        .map(|(_, l)| l);
    let command = std::iter::once("gpuprov")
        .chain(path.iter().copied())
        .collect::<Vec<_>>()
        .join(" ");
    let first = name.chars().next().unwrap_or('-');
    let elsewhere = commands_with(root, name);
    let help = match nearest {
        Some(l) => format!("did you mean -{l} (--{l})? See `{command} --help`"),
        None if !elsewhere.is_empty() => format!(
            "-{name} is a flag of {}, not of `{command}`",
            elsewhere
                .iter()
                .map(|c| format!("`{c}`"))
                .collect::<Vec<_>>()
                .join(", ")
        ),
        None if find_short(scope, first).is_some() => format!(
            "-{first} takes its value as the next word (-{first} VALUE) or after = (-{first}=VALUE); a single-dash word is a long flag, as in Terraform. See `{command} --help`"
        ),
        None => format!(
            "see `{command} --help` for its flags (a single-dash word is a long flag, as in Terraform)"
        ),
    };
    CommandError::usage(format!("unknown flag -{name} for `{command}`"), Some(help))
}

/// The (sub)commands under `root` that have the long flag `name`, as `gpuprov SUB`.
fn commands_with(root: &Command, name: &str) -> Vec<String> {
    let mut found = Vec::new();
    let mut stack: Vec<(String, &Command)> = vec![("gpuprov".to_string(), root)];
    while let Some((path, c)) = stack.pop() {
        if c.get_arguments()
            .any(|a| a.get_long() == Some(name) && !a.is_global_set())
        {
            found.push(path.clone());
        }
        for sub in c.get_subcommands().filter(|s| s.get_name() != "help") {
            stack.push((format!("{path} {}", sub.get_name()), sub));
        }
    }
    found.sort();
    found
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::parser::ValueSource;

    fn cmd() -> Command {
        let mut c = super::super::args::command();
        c.build();
        c
    }

    fn norm(args: &[&str]) -> Result<Vec<String>, String> {
        let c = cmd();
        let args = std::iter::once("gpuprov")
            .chain(args.iter().copied())
            .map(OsString::from)
            .collect();
        normalize(&c, args)
            .map(|v| {
                v.into_iter()
                    .skip(1)
                    .map(|s| s.into_string().unwrap())
                    .collect()
            })
            .map_err(|e| format!("{e:?}"))
    }

    #[test]
    fn terraform_spellings_become_double_dash() {
        assert_eq!(
            norm(&[
                "-chdir=/tmp",
                "plan",
                "-out",
                "f",
                "-lock=false",
                "-refresh=false",
                "-detailed-exitcode",
                "-json",
                "-no-color",
                "-lock-timeout=5s",
                "-c",
                "x.toml",
            ])
            .unwrap(),
            [
                "--chdir=/tmp",
                "plan",
                "--out",
                "f",
                "--lock=false",
                "--refresh=false",
                "--detailed-exitcode",
                "--json",
                "--no-color",
                "--lock-timeout=5s",
                "-c",
                "x.toml",
            ]
        );
        assert_eq!(
            norm(&["apply", "-auto-approve", "-parallelism=3", "tfplan"]).unwrap(),
            ["apply", "--auto-approve", "--parallelism=3", "tfplan"]
        );
    }

    #[test]
    fn a_switch_takes_go_style_true_and_false() {
        assert_eq!(
            norm(&[
                "plan",
                "-json=true",
                "-detailed-exitcode=false",
                "--no-color=1"
            ])
            .unwrap(),
            ["plan", "--json", "--no-color"]
        );
        assert_eq!(
            norm(&["plan", "-lock=false"]).unwrap(),
            ["plan", "--lock=false"],
            "a flag with a value keeps it"
        );
        let e = norm(&["plan", "-json=yes"]).unwrap_err();
        assert!(e.contains("invalid value \"yes\" for -json"), "{e}");
    }

    #[test]
    fn values_and_the_words_after_double_dash_are_left_alone() {
        assert_eq!(
            norm(&["offers", "--max-price", "-3", "-gpu", "-x"]).unwrap(),
            ["offers", "--max-price", "-3", "--gpu", "-x"],
            "an option's value is taken whole, whatever it looks like"
        );
        assert_eq!(
            norm(&["ssh", "dev", "--", "-lah", "-auto-approve"]).unwrap(),
            ["ssh", "dev", "--", "-lah", "-auto-approve"]
        );
        assert_eq!(norm(&["-c=a.toml", "plan"]).unwrap(), ["-c=a.toml", "plan"]);
        assert_eq!(
            norm(&["state", "push", "-"]).unwrap(),
            ["state", "push", "-"]
        );
    }

    #[test]
    fn an_unknown_single_dash_word_is_refused_with_a_hint() {
        let e = norm(&["plan", "-detailed-exitcodes"]).unwrap_err();
        assert!(
            e.contains("unknown flag -detailed-exitcodes for `gpuprov plan`"),
            "{e}"
        );
        assert!(e.contains("did you mean -detailed-exitcode"), "{e}");
        // Issue 19: `-chdirx` was read as `-c hdirx`.
        let e = norm(&["-chdirx=/tmp", "plan"]).unwrap_err();
        assert!(e.contains("did you mean -chdir"), "{e}");
        let e = norm(&["-cfoo.toml", "plan"]).unwrap_err();
        assert!(e.contains("-c takes its value as the next word"), "{e}");
        // A flag of another subcommand is not one here, and the hint says whose it is.
        let e = norm(&["plan", "-auto-approve"]).unwrap_err();
        assert!(
            e.contains("unknown flag -auto-approve for `gpuprov plan`"),
            "{e}"
        );
        assert!(
            e.contains("-auto-approve is a flag of `gpuprov apply`, `gpuprov destroy`"),
            "{e}"
        );
        let e = norm(&["plan", "-frobnicate"]).unwrap_err();
        assert!(e.contains("see `gpuprov plan --help` for its flags"), "{e}");
    }

    /// Every long flag of every (sub)command, spelt with one dash, parses as that flag.
    #[test]
    fn every_long_flag_has_a_working_single_dash_spelling() {
        let root = cmd();
        let mut checked = 0;
        let mut stack: Vec<(Vec<String>, &Command)> = vec![(vec![], &root)];
        while let Some((path, scope)) = stack.pop() {
            for sub in scope.get_subcommands().filter(|s| s.get_name() != "help") {
                let mut p = path.clone();
                p.push(sub.get_name().to_string());
                stack.push((p, sub));
            }
            if scope.has_subcommands() {
                continue; // its flags are globals, tried in every leaf
            }
            // Required positionals get a placeholder, so only the flag is on trial.
            let positionals: Vec<String> = scope
                .get_positionals()
                .filter(|a| a.is_required_set())
                .map(|a| {
                    a.get_possible_values()
                        .first()
                        .map_or_else(|| "x".to_string(), |v| v.get_name().to_string())
                })
                .collect();
            for arg in scope.get_arguments() {
                let Some(long) = arg.get_long() else { continue };
                if long == "help" || long == "version" {
                    continue; // they print and exit instead of parsing
                }
                let value = arg
                    .get_default_values()
                    .first()
                    .and_then(|v| v.to_str())
                    .map(str::to_string)
                    .or_else(|| {
                        arg.get_possible_values()
                            .first()
                            .map(|p| p.get_name().to_string())
                    })
                    .unwrap_or_else(|| "1".into());
                let flag = if needs_value(arg) {
                    vec![format!("-{long}"), value]
                } else if arg.get_action().takes_values() {
                    vec![format!("-{long}={value}")]
                } else {
                    vec![format!("-{long}")]
                };
                let words: Vec<String> = path
                    .iter()
                    .cloned()
                    .chain(flag.iter().cloned())
                    .chain(positionals.iter().cloned())
                    .collect();
                let words: Vec<&str> = words.iter().map(String::as_str).collect();
                let normalised = norm(&words).unwrap_or_else(|e| panic!("{words:?}: {e}"));
                let matches = cmd()
                    .try_get_matches_from(std::iter::once("gpuprov".to_string()).chain(normalised));
                match matches {
                    Ok(m) => {
                        let mut m = &m;
                        for p in &path {
                            m = m.subcommand_matches(p).unwrap();
                        }
                        assert_eq!(
                            m.value_source(arg.get_id().as_str()),
                            Some(ValueSource::CommandLine),
                            "{words:?}"
                        );
                    }
                    // `--use-context` requires `--merge`: recognised, just not alone.
                    Err(e) => assert!(
                        matches!(e.kind(), clap::error::ErrorKind::MissingRequiredArgument),
                        "{words:?}: {e}"
                    ),
                }
                checked += 1;
            }
        }
        assert!(checked > 40, "only {checked} flags checked");
    }
}
