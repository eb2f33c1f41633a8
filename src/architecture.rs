//! The architecture invariants of ARCHITECTURE.md as a test, in the style of
//! rust-analyzer's `tidy`: the sources under `src/` are read as text and checked by pure
//! functions over `(path, text)` pairs, so the checker has its own tests.
//!
//! The rules:
//!
//! 1. **Layering.** The modules form one stack ([`STACK`], bottom first); a module refers
//!    (`use crate::x`, `use crate::{x, y}`, inline `crate::x::…`) only to modules below
//!    it, so there are no back-arrows and no circles. Tolerated exceptions are named in
//!    [`ALLOWED_BACK_ARROWS`], each with its reason.
//! 2. **Adapters import nothing of the core above the contract.** `provider/**` refers to
//!    none of [`ABOVE_THE_CONTRACT`].
//! 3. **Only the CLI prints or exits**: no `println!`, `eprintln!`, `print!`, `eprint!`,
//!    `dbg!` or `std::process::exit` outside `cli/` and `main.rs`.
//! 4. **Only the executor waits**: no sleep (`tokio::time::sleep`, `std::thread::sleep`,
//!    `sleep_until`) outside `machine/`, except the files of [`SLEEP_EXCEPTIONS`]; none at
//!    all in `provider/**`.
//!
//! Comments, doc comments and string literals are blanked before checking, so prose and
//! messages may name anything. `#[cfg(test)]` items are exempt from every rule: tests may
//! build fixtures from any layer and print; the rules are about what ships.

use std::collections::BTreeSet;
use std::path::Path;

/// The layers, bottom to top: a module may refer only to the modules before it.
const STACK: &[&str] = &[
    "atomic_file",
    "crash",
    "provider",
    "ssh",
    "config",
    "graph",
    "machine",
    "vm",
    "cluster",
    "record",
    "state",
    "plan",
    "engine",
    "cli",
];

/// What adapters must not refer to (rule 2): the core above the provider contract.
const ABOVE_THE_CONTRACT: &[&str] = &[
    "machine", "vm", "cluster", "record", "state", "plan", "engine", "cli", "config", "graph",
];

/// Files checked by no rule: the crate root, the binary (it is the CLI's entry point) and
/// this test-only module.
const UNCHECKED: &[&str] = &["lib.rs", "architecture.rs", "tidy.rs"];

/// Files that hold only a module's unit tests (`#[cfg(test)] mod tests;` in `tests.rs`),
/// exempt like inline `#[cfg(test)]` items.
fn is_test_file(path: &str) -> bool {
    path == "tests.rs" || path.ends_with("/tests.rs")
}

/// One tolerated exception to a rule, with the reason it is tolerated.
#[derive(Debug, Clone, Copy)]
enum Tolerated {
    /// References to `crate::<to>` from the files whose path (under `src/`) starts with
    /// `files`.
    Import {
        files: &'static str,
        to: &'static str,
        reason: &'static str,
    },
    /// Sleeps in file `file`.
    Sleep {
        file: &'static str,
        reason: &'static str,
    },
}

impl Tolerated {
    fn reason(&self) -> &'static str {
        match self {
            Tolerated::Import { reason, .. } | Tolerated::Sleep { reason, .. } => reason,
        }
    }
}

/// Back-arrows the stack tolerates for good: only the test doubles' (never shipped).
const ALLOWED_BACK_ARROWS: &[Tolerated] = &[Tolerated::Import {
    files: "provider/doubles/fake.rs",
    to: "ssh",
    reason: "the test double `FakeConnector` implements `ssh::Connector` beside the `FakeProvider` it scripts with; compiled only with the `test-doubles` feature, never shipped",
}];

/// The deliberate waits outside the executor (rule 4). None may be in an adapter; the
/// one under `provider/` is the feature-gated test double's.
const SLEEP_EXCEPTIONS: &[Tolerated] = &[
    Tolerated::Sleep {
        file: "state/lock.rs",
        reason: "waiting up to `--lock-timeout` for another gpuprov's lock: fs4 has no blocking lock with a timeout",
    },
    Tolerated::Sleep {
        file: "state/file.rs",
        reason: "`StateStore::open` re-reads after a short pause when a writer folded its journal between its two reads",
    },
    Tolerated::Sleep {
        file: "ssh/client.rs",
        reason: "the non-blocking libssh2 read loop of a remote command backs off while the command is silent",
    },
    Tolerated::Sleep {
        file: "provider/doubles/fake.rs",
        reason: "the test double `FakeProvider`'s simulated API latency; compiled only with the `test-doubles` feature, never shipped",
    },
    Tolerated::Sleep {
        file: "cluster/tunnel.rs",
        reason: "`Tunnel` polls the ssh child until its local port accepts or it exits (one call, bounded by its deadline)",
    },
];

/// The real tree: every rule holds, with exactly the tolerated exceptions.
#[test]
fn the_tree_keeps_its_architecture() {
    let files = read_sources(&Path::new(env!("CARGO_MANIFEST_DIR")).join("src"));
    assert!(
        files.iter().any(|(p, _)| p == "engine.rs") && files.len() > 20,
        "the sources were not found"
    );
    let tolerated: Vec<Tolerated> = ALLOWED_BACK_ARROWS
        .iter()
        .chain(SLEEP_EXCEPTIONS)
        .copied()
        .collect();
    let report = check(&files, &tolerated);
    let mut problems = report.violations;
    for (t, used) in tolerated.iter().zip(report.used) {
        if !used {
            problems.push(format!(
                "stale exception, nothing needs it any more; remove it from its list: {t:?}"
            ));
        }
    }
    assert!(
        problems.is_empty(),
        "architecture rules broken (see src/architecture.rs):\n{}",
        problems.join("\n")
    );
}

/// The core's wrappers around an adapter: each must define every method of the contract,
/// because a default it inherits silently drops what the adapter does (a wrapper that
/// forgot the shared-object methods made every cloud look as if it had none).
const WRAPPERS: &[(&str, &str)] = &[
    ("machine/limits.rs", "Governed"),
    ("machine/coalesce.rs", "SharedReads"),
    ("provider/doubles/faulty.rs", "Faulty"),
];

/// Rule 5: every method of `trait CloudProvider` in `provider/mod.rs` is defined by each
/// of [`WRAPPERS`].
#[test]
fn the_wrappers_forward_every_contract_method() {
    let files = read_sources(&Path::new(env!("CARGO_MANIFEST_DIR")).join("src"));
    let text = |path: &str| {
        files
            .iter()
            .find(|(p, _)| p == path)
            .map(|(_, t)| without_tests(&blank_comments_and_strings(t)))
            .unwrap_or_else(|| panic!("{path} not found"))
    };
    let contract = text("provider/mod.rs");
    // The contract's one read and the reads derived from it are among the methods read
    // from the trait (a wrapper without `instances` would answer the default's refusal).
    let wanted = missing_forwards(&contract, &|_| String::new());
    for m in ["instances", "observe", "observe_location", "list"] {
        assert!(
            wanted.contains(&format!("Governed::{m}")),
            "the contract's methods as read lack `{m}`: {wanted:?}"
        );
    }
    let missing = missing_forwards(&contract, &|w| {
        text(WRAPPERS.iter().find(|(_, name)| *name == w).unwrap().0)
    });
    assert!(
        missing.is_empty(),
        "wrappers inherit defaults instead of forwarding: {missing:?}"
    );
}

/// The methods of `trait CloudProvider` (in `contract`) that a wrapper's `impl` does not
/// define, as `Wrapper::method`.
fn missing_forwards(contract: &str, wrapper_text: &dyn Fn(&str) -> String) -> Vec<String> {
    let block = |text: &str, header: &str| -> String {
        let Some(start) = text.find(header) else {
            return String::new();
        };
        // The block ends at the first line that is exactly `}` after the header.
        let body = &text[start..];
        body.find("\n}\n")
            .map_or(body, |end| &body[..end])
            .to_string()
    };
    let methods = |block: &str| -> Vec<String> {
        block
            .split("fn ")
            .skip(1)
            .filter_map(|rest| {
                let name: String = rest.chars().take_while(|c| is_ident(*c)).collect();
                (!name.is_empty()).then_some(name)
            })
            .collect()
    };
    let wanted = methods(&block(contract, "pub trait CloudProvider"));
    let mut missing = Vec::new();
    for (_, name) in WRAPPERS {
        let defined = methods(&block(
            &wrapper_text(name),
            &format!("impl CloudProvider for {name}"),
        ));
        for m in &wanted {
            if !defined.contains(m) {
                missing.push(format!("{name}::{m}"));
            }
        }
    }
    missing
}

#[test]
fn the_exception_lists_keep_their_own_rules() {
    assert!(
        ALLOWED_BACK_ARROWS.len() <= 3,
        "at most three tolerated back-arrows"
    );
    for t in ALLOWED_BACK_ARROWS {
        assert!(matches!(t, Tolerated::Import { .. }), "{t:?}");
    }
    for t in SLEEP_EXCEPTIONS {
        let Tolerated::Sleep { file, .. } = t else {
            panic!("not a sleep: {t:?}");
        };
        assert!(
            !file.starts_with("provider/") || *file == "provider/doubles/fake.rs",
            "adapters never sleep (only the feature-gated test double may): {t:?}"
        );
        assert!(
            !file.starts_with("machine/"),
            "the executor needs no exception"
        );
    }
    for t in ALLOWED_BACK_ARROWS.iter().chain(SLEEP_EXCEPTIONS) {
        assert!(!t.reason().is_empty(), "every exception says why: {t:?}");
    }
    let mut stack = STACK.to_vec();
    stack.sort_unstable();
    stack.dedup();
    assert_eq!(stack.len(), STACK.len(), "a module is in the stack twice");
}

/// What [`check`] found: the broken rules, one line each, and which of the tolerated
/// exceptions were needed (by index).
struct Report {
    violations: Vec<String>,
    used: Vec<bool>,
}

/// Checks `files` (paths relative to `src/`, `/`-separated, with their text) against the
/// rules, skipping what `tolerated` allows.
fn check(files: &[(String, String)], tolerated: &[Tolerated]) -> Report {
    let mut used = vec![false; tolerated.len()];
    let mut violations = Vec::new();
    let modules: BTreeSet<&str> = files
        .iter()
        .filter(|(p, _)| !UNCHECKED.contains(&p.as_str()) && !is_test_file(p))
        .filter_map(|(p, _)| module_of(p))
        .collect();
    let rank = |m: &str| STACK.iter().position(|s| *s == m);
    for m in &modules {
        if rank(m).is_none() {
            violations.push(format!(
                "module {m} is not in the stack: place it in STACK in src/architecture.rs"
            ));
        }
    }
    let mut edges: BTreeSet<(String, String)> = BTreeSet::new();
    for (path, text) in files {
        if UNCHECKED.contains(&path.as_str()) || is_test_file(path) {
            continue;
        }
        let code = without_tests(&blank_comments_and_strings(text));
        let from = module_of(path);
        if let Some(from) = from {
            for (line, to) in references(&code) {
                if to == from || !modules.contains(to.as_str()) {
                    continue;
                }
                let excused = tolerated.iter().position(|t| {
                    matches!(t, Tolerated::Import { files, to: t_to, .. }
                        if path.starts_with(files) && *t_to == to)
                });
                if let Some(i) = excused {
                    used[i] = true;
                    continue;
                }
                let at = format!("{path}:{line}");
                if path.starts_with("provider/") && ABOVE_THE_CONTRACT.contains(&to.as_str()) {
                    violations.push(format!(
                        "{at}: the adapter refers to crate::{to}; adapters import nothing above the provider contract"
                    ));
                }
                if let (Some(a), Some(b)) = (rank(from), rank(&to)) {
                    if b > a {
                        violations.push(format!(
                            "{at}: back-arrow {from} -> {to}: {to} sits above {from} in the stack"
                        ));
                    }
                }
                edges.insert((from.to_string(), to));
            }
        }
        if !(path.starts_with("cli/") || path == "main.rs") {
            for (line, what) in prints(&code) {
                violations.push(format!(
                    "{path}:{line}: {what} outside cli/: only the CLI prints or exits"
                ));
            }
        }
        if !path.starts_with("machine/") {
            for (line, what) in sleeps(&code) {
                let excused = tolerated.iter().position(
                    |t| matches!(t, Tolerated::Sleep { file, .. } if path.as_str() == *file),
                );
                match excused {
                    Some(i) => used[i] = true,
                    None => violations.push(format!(
                        "{path}:{line}: {what} outside machine/: only the executor waits"
                    )),
                }
            }
        }
    }
    for circle in circles(&edges) {
        violations.push(format!("circle: {}", circle.join(" -> ")));
    }
    violations.sort();
    violations.dedup();
    Report { violations, used }
}

/// The top-level module a file belongs to: `engine.rs` → `engine`, `cli/kube.rs` →
/// `cli`; `None` for the crate roots.
fn module_of(path: &str) -> Option<&str> {
    if path == "lib.rs" || path == "main.rs" {
        return None;
    }
    let first = path.split('/').next()?;
    Some(first.strip_suffix(".rs").unwrap_or(first))
}

/// The circles among the module edges (each a strongly connected component of more than
/// one module), each as its modules in order from the smallest and back to it.
fn circles(edges: &BTreeSet<(String, String)>) -> Vec<Vec<String>> {
    let mut g: petgraph::graphmap::DiGraphMap<&str, ()> = petgraph::graphmap::DiGraphMap::new();
    for (a, b) in edges {
        g.add_edge(a.as_str(), b.as_str(), ());
    }
    let mut out: Vec<Vec<String>> = petgraph::algo::tarjan_scc(&g)
        .into_iter()
        .filter(|c| c.len() > 1)
        .map(|mut c| {
            c.sort_unstable();
            let mut names: Vec<String> = c.iter().map(|s| s.to_string()).collect();
            names.push(names[0].clone());
            names
        })
        .collect();
    out.sort();
    out
}

fn is_ident(c: char) -> bool {
    c.is_alphanumeric() || c == '_'
}

/// The text with comments (line, block, doc) and the contents of string, byte-string,
/// raw-string and character literals replaced by spaces. Newlines are kept, so line
/// numbers stay; delimiters are kept, so the code's shape stays.
fn blank_comments_and_strings(text: &str) -> String {
    let c: Vec<char> = text.chars().collect();
    let blank = |ch: char| if ch == '\n' { '\n' } else { ' ' };
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    while i < c.len() {
        let ch = c[i];
        let next = c.get(i + 1).copied();
        if ch == '/' && next == Some('/') {
            while i < c.len() && c[i] != '\n' {
                out.push(' ');
                i += 1;
            }
        } else if ch == '/' && next == Some('*') {
            let mut depth = 0;
            while i < c.len() {
                if c[i] == '/' && c.get(i + 1) == Some(&'*') {
                    depth += 1;
                    out.push_str("  ");
                    i += 2;
                } else if c[i] == '*' && c.get(i + 1) == Some(&'/') {
                    depth -= 1;
                    out.push_str("  ");
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    out.push(blank(c[i]));
                    i += 1;
                }
            }
        } else if ch == '"' {
            i = quoted(&c, i, &mut out);
        } else if ch == '\'' {
            i = char_or_lifetime(&c, i, &mut out);
        } else if is_ident(ch) {
            let start = i;
            while i < c.len() && is_ident(c[i]) {
                i += 1;
            }
            let word: String = c[start..i].iter().collect();
            out.push_str(&word);
            let at = c.get(i).copied();
            match (word.as_str(), at) {
                ("r" | "br" | "cr", Some('"' | '#')) => i = raw(&c, i, &mut out),
                ("b" | "c", Some('"')) => i = quoted(&c, i, &mut out),
                ("b", Some('\'')) => i = char_or_lifetime(&c, i, &mut out),
                _ => {}
            }
        } else {
            out.push(ch);
            i += 1;
        }
    }
    out
}

/// Blanks a `"…"` literal starting at `c[i]`; returns the index after it.
fn quoted(c: &[char], mut i: usize, out: &mut String) -> usize {
    out.push('"');
    i += 1;
    while i < c.len() {
        match c[i] {
            '\\' => {
                out.push(' ');
                if let Some(&e) = c.get(i + 1) {
                    out.push(if e == '\n' { '\n' } else { ' ' });
                }
                i += 2;
            }
            '"' => {
                out.push('"');
                return i + 1;
            }
            ch => {
                out.push(if ch == '\n' { '\n' } else { ' ' });
                i += 1;
            }
        }
    }
    i
}

/// Blanks a raw string `#*"…"#*` starting at `c[i]` (after its `r`); returns the index
/// after it. Not a raw string (`r#ident`): copies the `#` and goes on.
fn raw(c: &[char], mut i: usize, out: &mut String) -> usize {
    let mut hashes = 0;
    while c.get(i + hashes) == Some(&'#') {
        hashes += 1;
    }
    if c.get(i + hashes) != Some(&'"') {
        out.push('#');
        return i + 1;
    }
    for _ in 0..hashes {
        out.push('#');
    }
    out.push('"');
    i += hashes + 1;
    while i < c.len() {
        if c[i] == '"' && (0..hashes).all(|k| c.get(i + 1 + k) == Some(&'#')) {
            out.push('"');
            for _ in 0..hashes {
                out.push('#');
            }
            return i + 1 + hashes;
        }
        out.push(if c[i] == '\n' { '\n' } else { ' ' });
        i += 1;
    }
    i
}

/// Blanks a character literal starting at `c[i]`, or copies a lifetime's or label's `'`;
/// returns the index after what it consumed.
fn char_or_lifetime(c: &[char], i: usize, out: &mut String) -> usize {
    let end = if c.get(i + 1) == Some(&'\\') {
        // '\n', '\'', '\u{1F600}': the closing quote is the first one after the escaped
        // character.
        (i + 3..c.len()).find(|&j| c[j] == '\'')
    } else if c.get(i + 2) == Some(&'\'') {
        Some(i + 2)
    } else {
        None
    };
    match end {
        Some(end) => {
            out.push('\'');
            for _ in i + 1..end {
                out.push(' ');
            }
            out.push('\'');
            end + 1
        }
        None => {
            out.push('\'');
            i + 1
        }
    }
}

/// The code with every `#[cfg(test)]` (or `#[cfg(all(test, …))]`) item blanked, from its
/// attribute to its closing `}` or `;`. Expects comments and strings already blanked.
fn without_tests(code: &str) -> String {
    let mut c: Vec<char> = code.chars().collect();
    let mut i = 0;
    while i < c.len() {
        if c[i] != '#'
            || !starts_with(&c, i, "#[cfg(test)]") && !starts_with(&c, i, "#[cfg(all(test,")
        {
            i += 1;
            continue;
        }
        let start = i;
        // The item: up to the first `;` or `{` outside brackets, then through its `}`.
        let mut depth = 0i32;
        let mut j = i;
        let mut end = c.len();
        while j < c.len() {
            match c[j] {
                '(' | '[' => depth += 1,
                ')' | ']' => depth -= 1,
                ';' if depth == 0 => {
                    end = j + 1;
                    break;
                }
                '{' if depth == 0 => {
                    let mut braces = 0;
                    let mut k = j;
                    while k < c.len() {
                        match c[k] {
                            '{' => braces += 1,
                            '}' => {
                                braces -= 1;
                                if braces == 0 {
                                    break;
                                }
                            }
                            _ => {}
                        }
                        k += 1;
                    }
                    end = (k + 1).min(c.len());
                    break;
                }
                _ => {}
            }
            j += 1;
        }
        for ch in &mut c[start..end] {
            if *ch != '\n' {
                *ch = ' ';
            }
        }
        i = end;
    }
    c.into_iter().collect()
}

fn starts_with(c: &[char], i: usize, s: &str) -> bool {
    s.chars()
        .enumerate()
        .all(|(k, ch)| c.get(i + k) == Some(&ch))
}

/// Every occurrence of identifier `word` in `code`: (char index, line).
fn words<'a>(code: &'a [char], word: &'a str) -> impl Iterator<Item = (usize, usize)> + 'a {
    let w: Vec<char> = word.chars().collect();
    let mut line = 1;
    let mut last = 0;
    (0..code.len()).filter_map(move |i| {
        let hit = code[i..].starts_with(&w)
            && (i == 0 || !is_ident(code[i - 1]))
            && code.get(i + w.len()).is_none_or(|&ch| !is_ident(ch));
        if !hit {
            return None;
        }
        line += code[last..i].iter().filter(|&&ch| ch == '\n').count();
        last = i;
        Some((i + w.len(), line))
    })
}

/// Skips whitespace from `i`.
fn skip_ws(c: &[char], mut i: usize) -> usize {
    while i < c.len() && c[i].is_whitespace() {
        i += 1;
    }
    i
}

/// Reads an identifier at `i`.
fn ident_at(c: &[char], i: usize) -> String {
    c[i..].iter().take_while(|&&ch| is_ident(ch)).collect()
}

/// The top-level modules `code` refers to through `crate::`: `(line, module)` for every
/// `crate::x…`, and for every entry of a `crate::{x, y::z}` group.
fn references(code: &str) -> Vec<(usize, String)> {
    let c: Vec<char> = code.chars().collect();
    let mut out = Vec::new();
    for (after, line) in words(&c, "crate") {
        let i = skip_ws(&c, after);
        if !starts_with(&c, i, "::") {
            continue; // pub(crate), crate-level attributes
        }
        let i = skip_ws(&c, i + 2);
        if c.get(i) == Some(&'{') {
            // A group: the first segment of every top-level entry.
            let mut depth = 0;
            let mut entry_start = true;
            let mut j = i + 1;
            while j < c.len() {
                match c[j] {
                    '{' => depth += 1,
                    '}' if depth == 0 => break,
                    '}' => depth -= 1,
                    ',' if depth == 0 => entry_start = true,
                    ch if entry_start && is_ident(ch) => {
                        let name = ident_at(&c, j);
                        j += name.len();
                        if name != "self" {
                            out.push((line, name));
                        }
                        entry_start = false;
                        continue;
                    }
                    _ => {}
                }
                j += 1;
            }
        } else {
            let name = ident_at(&c, i);
            if !name.is_empty() {
                out.push((line, name));
            }
        }
    }
    out
}

/// The prints and exits in `code`: `(line, what)`.
fn prints(code: &str) -> Vec<(usize, String)> {
    let c: Vec<char> = code.chars().collect();
    let mut out = Vec::new();
    for mac in ["println", "eprintln", "print", "eprint", "dbg"] {
        for (after, line) in words(&c, mac) {
            if c.get(skip_ws(&c, after)) == Some(&'!') {
                out.push((line, format!("{mac}!")));
            }
        }
    }
    for (after, line) in words(&c, "process") {
        let i = skip_ws(&c, after);
        if starts_with(&c, i, "::") && ident_at(&c, skip_ws(&c, i + 2)) == "exit" {
            out.push((line, "process::exit".to_string()));
        }
    }
    out.sort();
    out
}

/// The sleeps in `code`: `(line, what)`, for any mention of the identifiers `sleep` and
/// `sleep_until` (calls, imports, paths).
fn sleeps(code: &str) -> Vec<(usize, String)> {
    let c: Vec<char> = code.chars().collect();
    let mut out: Vec<(usize, String)> = ["sleep", "sleep_until"]
        .iter()
        .flat_map(|w| words(&c, w).map(move |(_, line)| (line, w.to_string())))
        .collect();
    out.sort();
    out
}

/// Every `.rs` file under `dir`, with its path relative to `dir` (`/`-separated), sorted.
fn read_sources(dir: &Path) -> Vec<(String, String)> {
    fn walk(root: &Path, dir: &Path, out: &mut Vec<(String, String)>) {
        let mut entries: Vec<_> = std::fs::read_dir(dir)
            .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
            .map(|e| e.unwrap().path())
            .collect();
        entries.sort();
        for p in entries {
            if p.is_dir() {
                walk(root, &p, out);
            } else if p.extension().is_some_and(|x| x == "rs") {
                let rel = p.strip_prefix(root).unwrap();
                let rel: Vec<String> = rel
                    .components()
                    .map(|c| c.as_os_str().to_string_lossy().into_owned())
                    .collect();
                let text =
                    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
                out.push((rel.join("/"), text));
            }
        }
    }
    let mut out = Vec::new();
    walk(dir, dir, &mut out);
    out
}

mod checker {
    //! The checker's own tests, on synthetic trees.

    use super::*;

    fn tree(files: &[(&str, &str)]) -> Vec<(String, String)> {
        // The real modules exist in every synthetic tree, so references resolve.
        let mut out: Vec<(String, String)> = STACK
            .iter()
            .map(|m| (format!("{m}.rs"), String::new()))
            .collect();
        for (p, t) in files {
            out.retain(|(q, _)| q != p);
            out.push((p.to_string(), t.to_string()));
        }
        out
    }

    fn violations(files: &[(&str, &str)]) -> Vec<String> {
        check(&tree(files), &[]).violations
    }

    #[test]
    fn an_adapter_reaching_above_the_contract_is_reported() {
        let v = violations(&[("provider/clouds/aws/mod.rs", "use crate::plan::redact_url;\n")]);
        assert!(
            v.iter()
                .any(|l| l.starts_with("provider/clouds/aws/mod.rs:1: the adapter refers to crate::plan")),
            "{v:?}"
        );
        assert!(
            v.iter().any(|l| l.contains("back-arrow provider -> plan")),
            "{v:?}"
        );

        let v = violations(&[(
            "provider/clouds/aws/mod.rs",
            "fn f() {\n    let u = crate::cluster::userdata::render(None, &[]);\n}\n",
        )]);
        assert!(
            v.iter()
                .any(|l| l
                    .starts_with("provider/clouds/aws/mod.rs:2: the adapter refers to crate::cluster")),
            "{v:?}"
        );
    }

    #[test]
    fn groups_and_inline_paths_count_and_down_arrows_pass() {
        let v = violations(&[(
            "vm/launch.rs",
            "use crate::{machine::Step, provider::Offer, engine::Engine};\nuse crate::ssh;\n",
        )]);
        assert_eq!(
            v,
            ["vm/launch.rs:1: back-arrow vm -> engine: engine sits above vm in the stack"]
        );
        assert!(violations(&[(
            "cli/mod.rs",
            "use crate::{engine, plan::Plan};\npub(crate) fn f() { crate::state::x(); }\n"
        )])
        .is_empty());
    }

    #[test]
    fn a_circle_is_reported() {
        let v = violations(&[
            ("vm/mod.rs", "use crate::engine::Engine;\n"),
            ("engine.rs", "use crate::vm::LaunchMachine;\n"),
        ]);
        assert!(
            v.contains(&"circle: engine -> vm -> engine".to_string()),
            "{v:?}"
        );
        // Tolerating the back-arrow removes the circle with it.
        let tolerated = [Tolerated::Import {
            files: "vm/",
            to: "engine",
            reason: "test",
        }];
        let files = tree(&[
            ("vm/mod.rs", "use crate::engine::Engine;\n"),
            ("engine.rs", "use crate::vm::LaunchMachine;\n"),
        ]);
        let r = check(&files, &tolerated);
        assert!(r.violations.is_empty(), "{:?}", r.violations);
        assert_eq!(r.used, [true]);
    }

    #[test]
    fn a_module_outside_the_stack_is_reported() {
        let v = violations(&[("wizard.rs", "")]);
        assert_eq!(
            v,
            ["module wizard is not in the stack: place it in STACK in src/architecture.rs"]
        );
    }

    #[test]
    fn a_print_outside_the_cli_is_reported() {
        let v = violations(&[("engine.rs", "fn f() {\n    println!(\"hi\");\n}\n")]);
        assert_eq!(
            v,
            ["engine.rs:2: println! outside cli/: only the CLI prints or exits"]
        );
        let v = violations(&[(
            "state/mod.rs",
            "fn f() { eprint!(\"x\"); std::process::exit(1) }",
        )]);
        assert_eq!(v.len(), 2, "{v:?}");
        assert!(violations(&[(
            "cli/mod.rs",
            "fn f() { println!(\"x\"); std::process::exit(1) }"
        )])
        .is_empty());
        assert!(violations(&[("main.rs", "fn main() { eprintln!(\"x\") }")]).is_empty());
    }

    #[test]
    fn a_sleep_outside_the_executor_is_reported() {
        let v = violations(&[(
            "provider/clouds/lambda/mod.rs",
            "use tokio::time::sleep;\nasync fn f() { tokio::time::sleep(d).await; std::thread::sleep(d); }\n",
        )]);
        assert_eq!(
            v,
            [
                "provider/clouds/lambda/mod.rs:1: sleep outside machine/: only the executor waits",
                "provider/clouds/lambda/mod.rs:2: sleep outside machine/: only the executor waits",
            ]
        );
        assert!(violations(&[(
            "machine/limits.rs",
            "async fn f() { tokio::time::sleep_until(t).await }"
        )])
        .is_empty());
        let tolerated = [Tolerated::Sleep {
            file: "state/lock.rs",
            reason: "test",
        }];
        let r = check(
            &tree(&[("state/lock.rs", "fn f() { std::thread::sleep(d) }")]),
            &tolerated,
        );
        assert!(
            r.violations.is_empty() && r.used == [true],
            "{:?}",
            r.violations
        );
    }

    #[test]
    fn comments_strings_and_tests_are_not_code() {
        let text = r##"//! Uses crate::engine::Engine and println!("x") in prose.
/// See [`crate::plan::redact_url`]; never std::thread::sleep here.
/* block crate::cli /* nested crate::engine */ still comment */
fn f() -> &'static str {
    let _c = '"';
    let _s = "crate::engine::x println!(\"y\") sleep(1)";
    let _r = r#"crate::plan "quoted" dbg!(x)"#;
    let _b = b"crate::cli";
    "done"
}

#[cfg(test)]
mod tests {
    use crate::engine::Engine;
    fn g() { println!("test output is fine"); std::thread::sleep(d); }
}
"##;
        assert_eq!(violations(&[("vm/launch.rs", text)]), Vec::<String>::new());
        // And what follows the blanked parts is still seen.
        let after = format!("{text}fn h() {{ crate::engine::run() }}\n");
        assert_eq!(
            violations(&[("vm/launch.rs", &after)]),
            ["vm/launch.rs:17: back-arrow vm -> engine: engine sits above vm in the stack"]
        );
    }

    #[test]
    fn a_wrapper_missing_a_contract_method_is_reported() {
        let contract =
            "pub trait CloudProvider: Send {\n    fn a(&self);\n    async fn b(&self) {}\n}\n";
        let full =
            "impl CloudProvider for Governed {\n    fn a(&self) {}\n    async fn b(&self) {}\n}\n";
        // `b` outside the impl block does not count.
        let partial = "impl CloudProvider for Governed {\n    fn a(&self) {}\n}\nfn b() {}\n";
        let governed = |text: &'static str| {
            super::missing_forwards(contract, &|_| text.to_string())
                .into_iter()
                .filter(|m| m.starts_with("Governed::"))
                .collect::<Vec<_>>()
        };
        assert_eq!(governed(full), Vec::<String>::new());
        assert_eq!(governed(partial), ["Governed::b"]);
    }

    #[test]
    fn blanking_keeps_lines_and_shape() {
        let text = "a /* x\ny */ b \"s\\\"t\n\" 'c' '\\'' 'a: x\n";
        let out = blank_comments_and_strings(text);
        assert_eq!(out.lines().count(), text.lines().count());
        assert_eq!(out, "a     \n     b \"    \n\" ' ' '  ' 'a: x\n");
    }
}
