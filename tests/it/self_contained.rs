//! A clone runs its own tests (issue 34): nothing in the repository reads or links a path
//! outside it, and every file copied in from the project's shared folder (the vendors' API
//! descriptions, the Nebius protos, the GPU probe's captured outputs) is still the file its
//! `PROVENANCE.md` names, byte for byte.
//!
//! The rules, checked over the repository's files (`git ls-files`, plus files not yet
//! added that git does not ignore; a plain walk without `target/` and `.git/` when there is
//! no git):
//!
//! 1. No `.rs`, `.md`, `.toml`, `.sh`, `.py` file (nor a script with a `#!` line) names the
//!    shared folder beside the repository by a relative path (`..` then `/shared/`): that
//!    folder is not there in a clone.
//! 2. In Rust sources, the path of an `include_str!`/`include_bytes!`/`include!` and every
//!    literal that follows `CARGO_MANIFEST_DIR` in the same statement stays inside the
//!    repository once its `..` are resolved, and a file that names `CARGO_MANIFEST_DIR`
//!    does not walk up from it (`Path::ancestors`).
//! 3. In Markdown, a relative link target stays inside the repository.
//! 4. Every row of every `PROVENANCE.md` under `tests/fixtures/` names a file whose size
//!    and SHA-256 are the row's, and every file of the copied folders has its row.
//!
//! The checks are pure functions over `(path, text)` pairs, with their own test below.

use sha2::{Digest, Sha256};
use std::path::{Path, PathBuf};
use std::process::Command;

/// The repository's root.
fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The shared folder's relative name, built so that this file does not name it itself.
fn outside_name() -> String {
    format!("{}/shared/", "..")
}

/// The repository's files, relative to the root with `/` separators.
fn repository_files() -> Vec<String> {
    let root = root();
    let git = Command::new("git")
        .arg("-C")
        .arg(&root)
        .args([
            "ls-files",
            "-z",
            "--cached",
            "--others",
            "--exclude-standard",
        ])
        .output();
    let mut files: Vec<String> = match git {
        Ok(out) if out.status.success() => String::from_utf8(out.stdout)
            .expect("git ls-files prints UTF-8 paths")
            .split('\0')
            .filter(|p| !p.is_empty())
            .map(str::to_string)
            .collect(),
        _ => {
            let mut out = Vec::new();
            walk(&root, &root, &mut out);
            out
        }
    };
    // A file deleted in the work tree but still in the index is not there to read.
    files.retain(|f| root.join(f).is_file());
    files.sort();
    files
}

fn walk(root: &Path, dir: &Path, out: &mut Vec<String>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        let rel = path
            .strip_prefix(root)
            .unwrap()
            .to_string_lossy()
            .replace('\\', "/");
        if path.is_dir() {
            if rel != "target" && rel != ".git" {
                walk(root, &path, out);
            }
        } else {
            out.push(rel);
        }
    }
}

/// Whether rules 1–3 read this file: by extension, or a script by its `#!` line.
fn is_checked(path: &str, text: &str) -> bool {
    let ext = Path::new(path).extension().and_then(|e| e.to_str());
    matches!(ext, Some("rs" | "md" | "toml" | "sh" | "py")) || text.starts_with("#!")
}

/// `path` (relative, `/`-separated) resolved against `base` (a directory relative to the
/// root); `None` when its `..` climb above the root.
fn resolve(base: &str, path: &str) -> Option<String> {
    let mut parts: Vec<&str> = base.split('/').filter(|p| !p.is_empty()).collect();
    for part in path.split('/') {
        match part {
            "" | "." => {}
            ".." => {
                parts.pop()?;
            }
            p => parts.push(p),
        }
    }
    Some(parts.join("/"))
}

/// The directory of a repository file (`""` for the root).
fn dir_of(path: &str) -> &str {
    path.rsplit_once('/').map_or("", |(d, _)| d)
}

/// The string literals in `text` (plain `"…"` only, escapes kept as written).
fn literals(text: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(start) = rest.find('"') {
        let after = &rest[start + 1..];
        let mut end = None;
        let mut escaped = false;
        for (i, c) in after.char_indices() {
            match c {
                '\\' if !escaped => escaped = true,
                '"' if !escaped => {
                    end = Some(i);
                    break;
                }
                _ => escaped = false,
            }
        }
        let Some(end) = end else { break };
        out.push(&after[..end]);
        rest = &after[end + 1..];
    }
    out
}

/// Rules 1–3 for one file: what in it reaches outside the repository, one line each.
fn outside_reads(path: &str, text: &str) -> Vec<String> {
    let mut found = Vec::new();
    let outside = outside_name();
    for (n, line) in text.lines().enumerate() {
        if line.contains(&outside) {
            found.push(format!("{path}:{}: names {outside}", n + 1));
        }
    }
    if path.ends_with(".rs") {
        for mac in ["include_str!(", "include_bytes!(", "include!("] {
            for (at, _) in text.match_indices(mac) {
                let args = &text[at + mac.len()..];
                // Only a literal path is a path here (`concat!(env!("OUT_DIR"), …)` is not).
                if !args.trim_start().starts_with('"') {
                    continue;
                }
                let lit = literals(args)[0];
                if resolve(dir_of(path), lit).is_none() {
                    let line = text[..at].lines().count();
                    found.push(format!(
                        "{path}:{line}: {mac}\"{lit}\") is outside the repository"
                    ));
                }
            }
        }
        for (at, name) in text.match_indices("CARGO_MANIFEST_DIR") {
            // From after the name's closing quote to the end of the statement or block.
            let tail = &text[at + name.len()..];
            let tail = tail.strip_prefix('"').unwrap_or(tail);
            let statement = &tail[..tail.find([';', '{', '}']).unwrap_or(tail.len())];
            for lit in literals(statement) {
                if resolve("", lit).is_none() {
                    let line = text[..at].lines().count();
                    found.push(format!(
                        "{path}:{line}: \"{lit}\" from the manifest dir is outside the repository"
                    ));
                }
            }
        }
        // Searching the manifest dir's ancestors (how the vendor descriptions were found
        // beside the repository) looks outside it by construction.
        if text.contains("CARGO_MANIFEST_DIR") {
            let climb = format!(".{}()", "ancestors"); // so that this file does not name it
            for (at, _) in text.match_indices(&climb) {
                let line = text[..at].lines().count();
                found.push(format!(
                    "{path}:{line}: searches the manifest dir's ancestors"
                ));
            }
        }
    }
    if path.ends_with(".md") {
        for (at, _) in text.match_indices("](") {
            let target = &text[at + 2..];
            let target = &target[..target.find(')').unwrap_or(target.len())];
            let target = target.split('#').next().unwrap_or("").trim();
            let external =
                target.is_empty() || target.contains("://") || target.starts_with("mailto:");
            if !external && resolve(dir_of(path), target).is_none() {
                let line = text[..at].lines().count();
                found.push(format!(
                    "{path}:{line}: links {target}, outside the repository"
                ));
            }
        }
    }
    found
}

/// One row of a `PROVENANCE.md` table: the file in this repository, where it was copied
/// from, its size and its SHA-256.
#[derive(Debug, PartialEq)]
struct Row {
    file: String,
    from: String,
    bytes: u64,
    sha256: String,
}

/// The rows of a `PROVENANCE.md`: table lines `| `file` | `from` | bytes | `sha256` |`.
fn rows(text: &str) -> Vec<Row> {
    text.lines()
        .filter_map(|line| {
            let cells: Vec<&str> = line
                .trim()
                .strip_prefix('|')?
                .strip_suffix('|')?
                .split('|')
                .map(|c| c.trim().trim_matches('`'))
                .collect();
            let [file, from, bytes, sha256] = cells[..] else {
                return None;
            };
            let is_hex = sha256.len() == 64 && sha256.bytes().all(|b| b.is_ascii_hexdigit());
            is_hex.then(|| Row {
                file: file.to_string(),
                from: from.to_string(),
                bytes: bytes.replace(',', "").parse().expect("a byte count"),
                sha256: sha256.to_ascii_lowercase(),
            })
        })
        .collect()
}

/// The rows of every `PROVENANCE.md` under `tests/fixtures/`, with the file they are in.
fn all_rows() -> Vec<(String, Row)> {
    repository_files()
        .into_iter()
        .filter(|f| f.starts_with("tests/fixtures/") && f.ends_with("/PROVENANCE.md"))
        .flat_map(|p| {
            let text = std::fs::read_to_string(root().join(&p)).unwrap();
            rows(&text).into_iter().map(move |r| (p.clone(), r))
        })
        .collect()
}

/// Where a row's file differs from the row (`None` when it is the file the row names).
fn mismatch(row: &Row) -> Option<String> {
    let bytes = match std::fs::read(root().join(&row.file)) {
        Ok(b) => b,
        Err(e) => return Some(format!("{}: {e}", row.file)),
    };
    let sha256 = format!("{:x}", Sha256::digest(&bytes));
    (bytes.len() as u64 != row.bytes || sha256 != row.sha256).then(|| {
        format!(
            "{} is {} bytes, SHA-256 {sha256}; its row says {} bytes, {} (copied from {})",
            row.file,
            bytes.len(),
            row.bytes,
            row.sha256,
            row.from
        )
    })
}

/// Rules 1–3 over the whole repository.
#[test]
fn no_file_reaches_outside_the_repository() {
    let mut found = Vec::new();
    let mut checked = 0;
    for f in repository_files() {
        let Ok(text) = std::fs::read_to_string(root().join(&f)) else {
            continue; // not text: no path in it is read
        };
        if is_checked(&f, &text) {
            checked += 1;
            found.extend(outside_reads(&f, &text));
        }
    }
    assert!(
        found.is_empty(),
        "paths outside the repository:\n  {}",
        found.join("\n  ")
    );
    assert!(checked > 200, "only {checked} files checked");
}

/// Rule 4: every copied file is still the one its provenance names, and every file of the
/// copied folders has a row (a description added without its provenance fails here).
#[test]
fn every_copied_fixture_matches_its_checksum() {
    let rows = all_rows();
    let bad: Vec<String> = rows.iter().filter_map(|(_, r)| mismatch(r)).collect();
    assert!(bad.is_empty(), "copies that moved:\n  {}", bad.join("\n  "));
    let listed: std::collections::BTreeSet<&str> =
        rows.iter().map(|(_, r)| r.file.as_str()).collect();
    let unlisted: Vec<String> = repository_files()
        .into_iter()
        .filter(|f| {
            (f.starts_with("tests/fixtures/vendor-apis/") && !f.ends_with("/PROVENANCE.md"))
                || (f.starts_with("tests/fixtures/gpu-probe/")
                    && !f.ends_with("/PROVENANCE.md")
                    && !f.ends_with("/expected.json"))
        })
        .filter(|f| !listed.contains(f.as_str()))
        .collect();
    assert!(
        unlisted.is_empty(),
        "copied files without a PROVENANCE.md row: {unlisted:?}"
    );
    // The descriptions the spec-checked tests load, the protos and the probe outputs.
    assert!(rows.len() >= 10 + 29 + 9, "{} rows", rows.len());
    for (provenance, r) in &rows {
        assert!(
            r.from.starts_with("shared/"),
            "{provenance}: {} copied from {}",
            r.file,
            r.from
        );
    }
}

/// The Nebius protos `build.rs` compiles are the vendor's files: each has its row, copied
/// from the shared folder's `vendor-apis/nebius/`, and matches it.
#[test]
fn the_protos_are_the_vendors() {
    let rows = all_rows();
    let mut compared = 0;
    for f in repository_files() {
        if !f.starts_with("proto/") || f == "proto/README.md" {
            continue;
        }
        let (_, row) = rows.iter().find(|(_, r)| r.file == f).unwrap_or_else(|| {
            panic!("{f} has no row in tests/fixtures/vendor-apis/PROVENANCE.md")
        });
        assert!(
            row.from.starts_with("shared/vendor-apis/nebius/"),
            "{f} from {}",
            row.from
        );
        assert_eq!(mismatch(row), None);
        compared += 1;
    }
    assert!(compared >= 25, "only {compared} files compared");
}

/// The checks find what they are for, and pass what is inside.
#[test]
fn the_checks_catch_what_reaches_outside() {
    let outside = outside_name();
    let shared_join =
        format!("let d = Path::new(env!(\"CARGO_MANIFEST_DIR\")).join(\"{outside}vendor-apis\");");
    assert_eq!(
        outside_reads("tests/it/x.rs", &shared_join).len(),
        2,
        "{shared_join}"
    );
    let up = "let d = Path::new(env!(\"CARGO_MANIFEST_DIR\")).join(\"../elsewhere/x.json\");";
    assert_eq!(outside_reads("tests/it/x.rs", up).len(), 1);
    let search = format!(
        "let m = Path::new(env!(\"CARGO_MANIFEST_DIR\"));\n\
         m.{}().skip(1).map(|a| a.join(\"shared/vendor-apis\"));",
        "ancestors"
    );
    assert_eq!(outside_reads("tests/it/support/spec.rs", &search).len(), 1);
    let inside =
        "const F: &str = concat!(env!(\"CARGO_MANIFEST_DIR\"), \"/tests/fixtures/gpu-probe\");";
    assert!(outside_reads("src/x.rs", inside).is_empty());
    assert!(outside_reads(
        "tests/it/support/k3s.rs",
        "include_str!(\"../../fixtures/a.csv\")"
    )
    .is_empty());
    assert_eq!(
        outside_reads("tests/it/k3s.rs", "include_str!(\"../../../../a.csv\")").len(),
        1
    );
    assert!(outside_reads(
        "src/x.rs",
        "include!(concat!(env!(\"OUT_DIR\"), \"/p.rs\"));"
    )
    .is_empty());
    assert_eq!(
        outside_reads("docs/design/x.md", "see [it](../../../up.md)").len(),
        1
    );
    assert!(outside_reads(
        "docs/design/x.md",
        "see [it](../../README.md#top) or [w](https://x.y/../z)"
    )
    .is_empty());
    assert_eq!(
        outside_reads("README.md", &format!("`{outside}design/x.md`")).len(),
        1
    );
    assert!(outside_reads("README.md", "copied from `shared/vendor-apis/x`").is_empty());
    assert!(is_checked(".ci/run", "#!/usr/bin/env bash\n"));
    assert!(!is_checked(
        "tests/fixtures/vendor-apis/lambda/openapi-1.8.3.json",
        "{}"
    ));

    let table = "| file | from | bytes | SHA-256 |\n|---|---|---|---|\n\
                 | `a/b.json` | `shared/x/b.json` | 1,234 | `ABCDEF0123456789abcdef0123456789abcdef0123456789abcdef0123456789` |\n\
                 | not | a | row | here |\n";
    assert_eq!(
        rows(table),
        vec![Row {
            file: "a/b.json".into(),
            from: "shared/x/b.json".into(),
            bytes: 1234,
            sha256: "abcdef0123456789abcdef0123456789abcdef0123456789abcdef0123456789".into(),
        }]
    );
    let moved = Row {
        file: "tests/fixtures/gpu-probe/nvidia-h200/query-gpu.csv".into(),
        from: "shared/fixtures/gpu-probe/nvidia-h200/query-gpu.csv".into(),
        bytes: 183,
        sha256: "0".repeat(64),
    };
    assert!(mismatch(&moved).is_some());
}
