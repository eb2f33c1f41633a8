//! Errors of the state file store.

use std::io;
use std::path::{Path, PathBuf};

use miette::{Diagnostic, NamedSource, SourceSpan};
use thiserror::Error;

/// An error reading or writing the state file.
///
/// Every variant names the file involved; none of them carries a secret (the state file
/// never holds one).
#[derive(Debug, Error, Diagnostic)]
pub enum StateError {
    /// A filesystem call failed; `action` says what gpuprov was doing (for example
    /// "read state file") and `path` which file it touched.
    #[error("could not {action} `{}`", path.display())]
    #[diagnostic(code(gpuprov::state::io))]
    Io {
        /// What gpuprov was doing, as a short lowercase phrase.
        action: &'static str,
        /// The file or directory involved.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: io::Error,
    },

    /// The state file exists but is not a valid state (empty, truncated, not JSON, or a
    /// field of the wrong type). The file has not been modified.
    #[error(transparent)]
    #[diagnostic(transparent)]
    Corrupt(Box<CorruptState>),

    /// The state's `lineage` is not a UUID (the file was edited by hand). The file has not
    /// been modified.
    #[error("state file `{}` has an invalid lineage {lineage:?}: a lineage is a UUID", path.display())]
    #[diagnostic(
        code(gpuprov::state::invalid_lineage),
        help("restore the lineage this state had (the `gpuprov-lineage` label of its machines, or the `.backup` file); the file was not modified")
    )]
    InvalidLineage {
        /// The state file.
        path: PathBuf,
        /// The lineage found.
        lineage: String,
    },

    /// The state file was written by a newer gpuprov whose format this build cannot read.
    /// The file has not been modified.
    #[error(
        "state file `{}` has format version {found}, but this gpuprov supports up to {supported}: it was written by a newer gpuprov",
        path.display()
    )]
    #[diagnostic(
        code(gpuprov::state::newer_version),
        help("upgrade gpuprov to a release that supports state format version {found}; the file was not modified")
    )]
    NewerVersion {
        /// The state file.
        path: PathBuf,
        /// The version found in the file.
        found: u64,
        /// [`super::STATE_FORMAT_VERSION`] of this build.
        supported: u32,
    },

    /// The write-ahead journal beside the state file has a line that is not a valid
    /// change (not a crash-torn last line, which is ignored). Neither file was modified.
    #[error("state journal `{}` is corrupt at line {line}: {what}", path.display())]
    #[diagnostic(
        code(gpuprov::state::corrupt_journal),
        help("the journal holds the changes of a run that did not finish; neither file was modified. Keep a copy of both, then move the journal aside to fall back to the state file (changes after its last save would have to be recovered with `gpuprov apply`, which finds machines by their labels)")
    )]
    CorruptJournal {
        /// The journal file.
        path: PathBuf,
        /// 1-based line number.
        line: usize,
        /// What is wrong with it.
        what: String,
    },

    /// The journal beside the state file belongs to another state (lineage) or continues
    /// a newer serial than the file. Neither file was modified.
    #[error("state journal `{}` does not belong to the state beside it: {what}", path.display())]
    #[diagnostic(
        code(gpuprov::state::journal_mismatch),
        help("neither file was modified; restore the state file this journal continues, or move the journal aside if it belongs to another project")
    )]
    JournalMismatch {
        /// The journal file.
        path: PathBuf,
        /// What does not match.
        what: String,
    },

    /// The caller tried to save a state whose lineage differs from the one read at open,
    /// which would overwrite another project's state.
    #[error(
        "refusing to overwrite state file `{}`: its lineage is {on_disk}, but the state being saved has lineage {given}",
        path.display()
    )]
    #[diagnostic(
        code(gpuprov::state::lineage_mismatch),
        help("each state file belongs to one project; use `--state` to point at the right file")
    )]
    LineageMismatch {
        /// The state file.
        path: PathBuf,
        /// The lineage read at open.
        on_disk: String,
        /// The lineage of the state passed to save.
        given: String,
    },

    /// The state could not be serialized to JSON (not expected for these types).
    #[error("could not serialize the state for `{}`", path.display())]
    #[diagnostic(code(gpuprov::state::serialize))]
    Serialize {
        /// The state file.
        path: PathBuf,
        /// The serde error.
        #[source]
        source: serde_json::Error,
    },

    /// The final save failed, and the state was written to the `.errored` file instead.
    #[error(
        "could not save the final state to `{}`; it was written to `{}` instead",
        path.display(),
        errored.display()
    )]
    #[diagnostic(
        code(gpuprov::state::final_save_failed),
        help(
            "the state in `{}` is the newest record of your machines: do not delete it. Fix the problem above, then {}",
            errored.display(),
            restore_hint(errored, path)
        )
    )]
    FinalSaveFailed {
        /// The state file that could not be written.
        path: PathBuf,
        /// Where the state was written instead (`<path>.errored`).
        errored: PathBuf,
        /// Why saving to `path` failed.
        #[source]
        source: Box<StateError>,
    },

    /// Neither the final save nor the `.errored` fallback could be written. The state is
    /// carried in `state_json` so the caller can print it as a last resort.
    #[error(
        "could not save the final state to `{}` nor to `{}`",
        path.display(),
        errored.display()
    )]
    #[diagnostic(
        code(gpuprov::state::final_save_lost),
        help("the state JSON is printed below; save it to `{}` once the problem is fixed: the machines it records are still running and carry the labels gpuprov-vm-name and gpuprov-lineage", path.display())
    )]
    FinalSaveLost {
        /// The state file that could not be written.
        path: PathBuf,
        /// The fallback file that could not be written either.
        errored: PathBuf,
        /// Why saving to `path` failed.
        #[source]
        source: Box<StateError>,
        /// Why writing `errored` failed.
        errored_error: Box<StateError>,
        /// The state, pretty JSON, for the caller to print.
        state_json: String,
    },

    /// A remote backend (S3, PostgreSQL) refused or failed a call; nothing was changed
    /// by the failed call.
    #[error("could not {action} `{}`: {reason}", location.display())]
    #[diagnostic(code(gpuprov::state::store))]
    Store {
        /// What gpuprov was doing, as a short lowercase phrase.
        action: &'static str,
        /// The object or row (no secrets).
        location: PathBuf,
        /// The store's answer, scrubbed of secrets.
        reason: String,
    },

    /// The stored state moved on since this run read it: another writer saved it, so
    /// this run's lock was broken (`force-unlock`, a lost session). Nothing was written.
    #[error("this run can no longer write the state at `{}`: {what}", location.display())]
    #[diagnostic(
        code(gpuprov::state::conflict),
        help("this run lost its lock while it ran (force-unlock, or its database session ended), so it writes nothing more; its state went to the errored file instead. Compare it with `gpuprov state pull`, then re-run `gpuprov apply`: machines this run created carry the gpuprov labels and are found by refresh")
    )]
    Conflict {
        /// The state's location.
        location: PathBuf,
        /// What the store said (the expected and found versions).
        what: String,
    },

    /// The store accepted a conditional write it should have refused, so it cannot hold
    /// a lock or fence the state: it is not used.
    #[error("the store at `{}` does not enforce conditional writes: {what}", location.display())]
    #[diagnostic(
        code(gpuprov::state::unsafe_store),
        help("gpuprov's S3 lock is an object created with `If-None-Match: *` and the state is replaced with `If-Match` on its ETag; a store that ignores those headers would let two runs write at once. Use Amazon S3 or an S3-compatible store that supports conditional writes, or the postgres backend")
    )]
    UnsafeStore {
        /// The bucket and key prefix checked.
        location: PathBuf,
        /// Which check failed.
        what: String,
    },
}

/// How to put an errored state back: `mv` for a file, `gpuprov state push` for a remote
/// backend (whose location is not a path a shell can write to).
fn restore_hint(errored: &Path, location: &Path) -> String {
    let loc = location.display().to_string();
    if loc.starts_with("s3://") || loc.starts_with("postgres://") {
        format!(
            "run `gpuprov state push {}` (add --force if the stored state moved on; compare with `gpuprov state pull` first)",
            errored.display()
        )
    } else {
        format!("run `mv {} {}`", errored.display(), loc)
    }
}

impl StateError {
    pub(crate) fn io(action: &'static str, path: &Path, source: io::Error) -> Self {
        StateError::Io {
            action,
            path: path.to_path_buf(),
            source,
        }
    }
}

/// Details of a state file that cannot be parsed, with a span pointing at the offending
/// line and column (as reported by serde_json) for miette to render.
#[derive(Debug, Error, Diagnostic)]
#[error("state file `{}` cannot be parsed: {reason}", path.display())]
#[diagnostic(code(gpuprov::state::corrupt))]
pub struct CorruptState {
    /// The state file.
    pub path: PathBuf,
    /// serde_json's message, without its position suffix.
    pub reason: String,
    /// 1-based line of the error (0 when unknown).
    pub line: usize,
    /// 1-based column of the error (0 at the very start or when unknown).
    pub column: usize,
    /// The file's text (lossily decoded), named by its path.
    #[source_code]
    pub src: NamedSource<String>,
    /// Byte span of the error in `src`.
    #[label("{reason}")]
    pub span: SourceSpan,
    /// How to recover; it says the file was not modified.
    #[help]
    pub help: String,
}

/// The lineage written in a damaged state's text: the string after the first
/// `"lineage":`, when it is a UUID (anything else is not offered as a command argument).
fn lineage_in(text: &str) -> Option<String> {
    let rest = &text[text.find("\"lineage\"")? + "\"lineage\"".len()..];
    let rest = rest
        .trim_start()
        .strip_prefix(':')?
        .trim_start()
        .strip_prefix('"')?;
    let value = &rest[..rest.find('"')?];
    uuid::Uuid::parse_str(value).ok().map(|u| u.to_string())
}

impl CorruptState {
    /// Builds the diagnostic for `bytes` read from `path`, from serde_json's error.
    pub(crate) fn new(path: &Path, bytes: &[u8], err: &serde_json::Error) -> Self {
        let text = String::from_utf8_lossy(bytes).into_owned();
        let (line, column) = (err.line(), err.column());
        let full = err.to_string();
        // serde_json appends " at line L column C"; the span shows the position instead.
        let suffix = format!(" at line {line} column {column}");
        let reason = full.strip_suffix(&suffix).unwrap_or(&full).to_string();
        let reason = if bytes.iter().all(u8::is_ascii_whitespace) {
            format!("the file is empty ({reason})")
        } else {
            reason
        };
        let span = span_at(&text, line, column);
        let backup = super::backup_path(path);
        // The lineage is near the top of a file gpuprov wrote (keys are sorted), so even
        // a truncated file usually still names it.
        let recover = match lineage_in(&text) {
            Some(l) => format!("`gpuprov state recover --lineage {l}`"),
            None => "`gpuprov state recover --lineage LINEAGE`".to_string(),
        };
        let help = format!(
            "the state file was NOT modified. To recover, restore the previous state with \
             `cp {backup} {path}` if `{backup}` exists and is valid, or move the damaged \
             file away (`mv {path} {path}.corrupt`); the machines it recorded keep running \
             and carry the labels gpuprov-vm-name and gpuprov-lineage, from which \
             {recover} rebuilds the state",
            backup = backup.display(),
            path = path.display(),
        );
        CorruptState {
            path: path.to_path_buf(),
            reason,
            line,
            column,
            src: NamedSource::new(path.display().to_string(), text),
            span,
            help,
        }
    }
}

/// Converts serde_json's 1-based line and byte column into a byte span of `text`.
///
/// serde_json reports column 0 before the first byte of a line and points one past the end
/// at EOF, so the offset is clamped to the text and the span is empty at the end.
fn span_at(text: &str, line: usize, column: usize) -> SourceSpan {
    let line_start = if line <= 1 {
        0
    } else {
        text.match_indices('\n')
            .nth(line - 2)
            .map_or(text.len(), |(i, _)| i + 1)
    };
    let mut offset = (line_start + column.saturating_sub(1)).min(text.len());
    while !text.is_char_boundary(offset) {
        offset -= 1;
    }
    let len = text[offset..].chars().next().map_or(0, char::len_utf8);
    SourceSpan::new(offset.into(), len)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn span_points_at_line_and_column() {
        let text = "{\n  \"a\": x\n}\n";
        let span = span_at(text, 2, 8);
        assert_eq!(&text[span.offset()..span.offset() + span.len()], "x");
    }

    #[test]
    fn span_at_eof_is_empty_and_in_bounds() {
        let span = span_at("{", 1, 1);
        assert_eq!(span.offset(), 0);
        let span = span_at("", 1, 0);
        assert_eq!((span.offset(), span.len()), (0, 0));
        let span = span_at("{\n", 2, 0);
        assert_eq!((span.offset(), span.len()), (2, 0));
    }

    #[test]
    fn a_damaged_state_still_names_its_lineage_for_recovery() {
        let truncated = "{\n  \"gpuprov_version\": \"0.1.0\",\n  \"lineage\": \"0f0e0d0c-1111-4222-8333-444455556666\",\n  \"resources\": {\n    \"vm.a\": {\"mach";
        assert_eq!(
            lineage_in(truncated).as_deref(),
            Some("0f0e0d0c-1111-4222-8333-444455556666")
        );
        // Not a UUID, cut inside the value, or absent: no lineage is offered.
        assert_eq!(lineage_in("{\"lineage\": \"../../etc\"}"), None);
        assert_eq!(lineage_in("{\"lineage\": \"0f0e0d0c-11"), None);
        assert_eq!(lineage_in("{\"serial\": 3"), None);
    }
}
