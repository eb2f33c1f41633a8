//! Replacing a file atomically: write a temporary file in the same directory (so the
//! rename does not cross file systems), fsync it, rename it over the target, fsync the
//! directory (so the rename itself survives a power loss). Readers see the old content or
//! the new, never a mix, and a crash leaves no torn file.
//!
//! The one implementation for the state file (`state/`), the project key's public half and
//! the generated ssh config (`ssh/`) and the kubeconfigs gpuprov writes (`cluster/`).
//! Layering: the bottom of the crate; it imports nothing of it.

use std::fs::{self, OpenOptions};
use std::io::{self, Write as _};
use std::path::{Path, PathBuf};

/// How [`write`] creates the file and how strictly it makes the rename durable.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Options {
    mode: Option<u32>,
    dir_sync_best_effort: bool,
}

impl Options {
    /// A replaced file keeps the target's permissions (a user may have restricted them),
    /// a new one gets the default (0o666 less the umask); a failed directory fsync is an
    /// error.
    pub const fn new() -> Options {
        Options {
            mode: None,
            dir_sync_best_effort: false,
        }
    }

    /// The file gets `mode` (less the umask) when the temporary file is created, so there
    /// is no window with wider permissions; the target's own are not kept. Unix only;
    /// elsewhere the mode is ignored.
    pub const fn mode(self, mode: u32) -> Options {
        Options {
            mode: Some(mode),
            ..self
        }
    }

    /// A failed directory fsync is ignored: some file systems do not support it, and the
    /// data itself is already durable (for derived files that are rewritten anyway).
    pub const fn dir_sync_best_effort(self) -> Options {
        Options {
            dir_sync_best_effort: true,
            ..self
        }
    }
}

/// A step of [`write`] that failed, with the file or directory it concerned.
#[derive(Debug, thiserror::Error)]
#[error("cannot {step} {}: {source}", path.display())]
pub struct Error {
    /// What was being done, as a short lowercase phrase (`write temporary file`).
    pub step: &'static str,
    /// The temporary file, the target or the directory.
    pub path: PathBuf,
    #[source]
    pub source: io::Error,
}

/// Replaces `target` with `bytes` atomically (see the module docs). On error the target is
/// unchanged and the temporary file removed (best effort).
///
/// # Errors
///
/// [`Error`] naming the step (`create temporary file`, `set permissions of temporary
/// file`, `write temporary file`, `fsync temporary file`, `replace`, `fsync directory`)
/// and its path.
pub fn write(target: &Path, bytes: &[u8], options: Options) -> Result<(), Error> {
    let dir = parent_dir(target);
    let name = target
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "file".to_string());
    let tmp = dir.join(format!(".{name}.{}.tmp", uuid::Uuid::new_v4().simple()));
    let result = write_tmp_and_rename(&tmp, target, bytes, options);
    if result.is_err() {
        // Best effort: the temporary file is garbage now, and the original error is what
        // matters to the user.
        let _ = fs::remove_file(&tmp);
        return result;
    }
    match sync_dir(dir) {
        Err(_) if options.dir_sync_best_effort => Ok(()),
        other => other,
    }
}

fn write_tmp_and_rename(
    tmp: &Path,
    target: &Path,
    bytes: &[u8],
    options: Options,
) -> Result<(), Error> {
    fn err<'a>(step: &'static str, path: &'a Path) -> impl FnOnce(io::Error) -> Error + 'a {
        move |source| Error {
            step,
            path: path.to_path_buf(),
            source,
        }
    }
    let mut open = OpenOptions::new();
    open.write(true).create_new(true);
    set_mode(&mut open, options.mode);
    let mut file = open.open(tmp).map_err(err("create temporary file", tmp))?;
    if options.mode.is_none() {
        if let Ok(meta) = fs::metadata(target) {
            if meta.is_file() {
                file.set_permissions(meta.permissions())
                    .map_err(err("set permissions of temporary file", tmp))?;
            }
        }
    }
    file.write_all(bytes)
        .map_err(err("write temporary file", tmp))?;
    file.sync_all().map_err(err("fsync temporary file", tmp))?;
    drop(file);
    fs::rename(tmp, target).map_err(err("replace", target))
}

#[cfg(unix)]
fn set_mode(open: &mut OpenOptions, mode: Option<u32>) {
    if let Some(mode) = mode {
        std::os::unix::fs::OpenOptionsExt::mode(open, mode);
    }
}

#[cfg(not(unix))]
fn set_mode(_open: &mut OpenOptions, _mode: Option<u32>) {}

/// The directory holding `path`: its parent, or `.` for a bare file name.
pub fn parent_dir(path: &Path) -> &Path {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    }
}

/// Fsyncs directory `dir`, so a create, rename, link or delete in it is durable.
///
/// # Errors
///
/// [`Error`] with step `fsync directory`.
#[cfg(unix)]
pub fn sync_dir(dir: &Path) -> Result<(), Error> {
    fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|source| Error {
            step: "fsync directory",
            path: dir.to_path_buf(),
            source,
        })
}

/// Does nothing: Windows cannot open a directory as a file to flush it; NTFS journals the
/// rename.
#[cfg(not(unix))]
pub fn sync_dir(_dir: &Path) -> Result<(), Error> {
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[cfg(unix)]
    use std::os::unix::fs::PermissionsExt;

    fn entries(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> = fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }

    #[test]
    fn replaces_the_content_and_leaves_no_temporary_file() {
        let tmp = tempfile::tempdir().unwrap();
        let p = tmp.path().join("f");
        write(&p, b"one", Options::new()).unwrap();
        write(&p, b"two", Options::new()).unwrap();
        assert_eq!(fs::read_to_string(&p).unwrap(), "two");
        assert_eq!(entries(tmp.path()), ["f"]);
    }

    /// Moved from `ssh::keys` with its assertions, when its `write_atomic` became this.
    #[cfg(unix)]
    #[test]
    fn write_atomic_replaces_content_with_given_mode() {
        let tmp = tempfile::tempdir().unwrap();
        let p = tmp.path().join("f");
        let options = Options::new().mode(0o600).dir_sync_best_effort();
        write(&p, b"one", options).unwrap();
        write(&p, b"two", options).unwrap();
        assert_eq!(fs::read_to_string(&p).unwrap(), "two");
        assert_eq!(
            fs::metadata(&p).unwrap().permissions().mode() & 0o777,
            0o600
        );
        assert_eq!(fs::read_dir(tmp.path()).unwrap().count(), 1);
    }

    #[cfg(unix)]
    #[test]
    fn a_mode_applies_from_creation_and_replaces_the_targets() {
        let tmp = tempfile::tempdir().unwrap();
        let p = tmp.path().join("f");
        fs::write(&p, "old").unwrap();
        fs::set_permissions(&p, fs::Permissions::from_mode(0o644)).unwrap();
        write(&p, b"one", Options::new().mode(0o600)).unwrap();
        write(&p, b"two", Options::new().mode(0o600)).unwrap();
        assert_eq!(fs::read_to_string(&p).unwrap(), "two");
        assert_eq!(
            fs::metadata(&p).unwrap().permissions().mode() & 0o777,
            0o600
        );
        assert_eq!(entries(tmp.path()), ["f"]);
    }

    #[cfg(unix)]
    #[test]
    fn without_a_mode_the_targets_permissions_are_kept() {
        let tmp = tempfile::tempdir().unwrap();
        let p = tmp.path().join("state.json");
        fs::write(&p, "old").unwrap();
        fs::set_permissions(&p, fs::Permissions::from_mode(0o640)).unwrap();
        write(&p, b"new", Options::new()).unwrap();
        assert_eq!(
            fs::metadata(&p).unwrap().permissions().mode() & 0o777,
            0o640
        );
    }

    #[test]
    fn a_failed_step_is_named_with_its_path_and_the_target_is_untouched() {
        let tmp = tempfile::tempdir().unwrap();
        // The target is a directory: the rename fails after the temporary file is written.
        let target = tmp.path().join("d");
        fs::create_dir(&target).unwrap();
        fs::write(target.join("inside"), "x").unwrap();
        let e = write(&target, b"new", Options::new()).unwrap_err();
        assert_eq!(e.step, "replace");
        assert_eq!(e.path, target);
        assert!(e
            .to_string()
            .starts_with(&format!("cannot replace {}: ", target.display())));
        assert_eq!(entries(tmp.path()), ["d"], "temporary file removed");
        assert_eq!(entries(&target), ["inside"]);

        // No such directory: the temporary file cannot be created.
        let missing = tmp.path().join("nope").join("f");
        let e = write(&missing, b"x", Options::new().mode(0o600)).unwrap_err();
        assert_eq!(e.step, "create temporary file");
        assert!(e.path.starts_with(tmp.path().join("nope")), "{e}");
    }

    #[test]
    fn a_bare_file_name_lives_in_the_current_directory() {
        assert_eq!(parent_dir(Path::new("f")), Path::new("."));
        assert_eq!(parent_dir(Path::new("a/f")), Path::new("a"));
        sync_dir(Path::new(".")).unwrap();
        #[cfg(unix)]
        assert_eq!(
            sync_dir(Path::new("/definitely/not/here"))
                .unwrap_err()
                .step,
            "fsync directory"
        );
    }
}
