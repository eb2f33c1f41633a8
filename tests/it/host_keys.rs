//! Host-key checking is never switched off (issue 6, "Host keys"): no source file, script
//! or generated config carries an option that disables or weakens it. The behaviour
//! itself (a changed key refused with a clear message) is tested in `tests/it/ssh_local.rs`
//! (libssh2 and OpenSSH through the generated config), `tests/k3s_docker.rs` (the tunnel
//! and the k3s node shell) and `tests/k3s_machine.rs` (the k3s machine stops).

use std::path::Path;

/// Spellings that disable or weaken OpenSSH host-key checking, lower-cased and with
/// spaces and `=` removed.
const FORBIDDEN: &[&str] = &[
    "stricthostkeycheckingno",
    "stricthostkeycheckingaccept-new",
    "stricthostkeycheckingoff",
    "userknownhostsfile/dev/null",
];

fn scan(dir: &Path, hits: &mut Vec<String>, files: &mut usize) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            scan(&p, hits, files);
            continue;
        }
        let Ok(text) = std::fs::read_to_string(&p) else {
            continue;
        };
        *files += 1;
        for (i, line) in text.lines().enumerate() {
            // A test asserting the option is absent is a guard, not a use.
            if line.contains("assert!(!") {
                continue;
            }
            let flat: String = line
                .to_lowercase()
                .chars()
                .filter(|c| !c.is_whitespace() && *c != '=')
                .collect();
            for f in FORBIDDEN {
                if flat.contains(f) {
                    hits.push(format!("{}:{}: {line}", p.display(), i + 1));
                }
            }
        }
    }
}

#[test]
fn nothing_disables_host_key_checking() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let (mut hits, mut files) = (Vec::new(), 0);
    for d in ["src", "scripts", "examples", ".ci"] {
        if root.join(d).exists() {
            scan(&root.join(d), &mut hits, &mut files);
        }
    }
    assert!(files > 50, "the scan read the sources ({files} files)");
    assert!(
        hits.is_empty(),
        "host-key checking weakened:\n{}",
        hits.join("\n")
    );
    // The scan itself finds what it looks for.
    let probe = "-o StrictHostKeyChecking=no";
    let flat: String = probe
        .to_lowercase()
        .chars()
        .filter(|c| !c.is_whitespace() && *c != '=')
        .collect();
    assert!(FORBIDDEN.iter().any(|f| flat.contains(f)));
}
