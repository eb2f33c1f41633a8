//! The rules `architecture.rs` cannot check by scanning text, checked on the parsed
//! syntax (`syn`) and on the repository's files (rust-analyzer's `tidy`):
//!
//! 1. **An adapter names no other adapter.** Every path in an adapter's files (`use`
//!    trees and inline paths), with `self::`, `super::` and `crate::` resolved against
//!    the file's module, names no other cloud's module.
//! 2. **The kit and the contract name no cloud.** The same resolution over the contract
//!    (`provider/mod.rs`), the kit (`provider/kit/**`) and the modules beside them; only
//!    the registry and the test doubles may name every cloud.
//! 3. **Adapters loop only for pagination.** Every `loop`, `while` and call of a
//!    `timeout` in an adapter's shipped code is on [`LOOP_ALLOW`] with its reason (the
//!    design's invariant: no loops or sleeps beyond one call's pagination); `for` over
//!    data is iteration, not retrying, and is not counted.
//! 4. **Size budgets.** An adapter's `mod.rs` has at most [`ADAPTER_MOD_LINES`] lines,
//!    any other shipped file at most [`FILE_LINES`], unless [`SIZE_ALLOW`] names it with
//!    its reason and its own limit.
//! 5. **Docs name real paths.** Every repository path a `*.md` file names in backticks or
//!    a link (`src/…`, `tests/…`, `docs/…`, …) exists.
//!
//! Every allow-list entry must still be needed: a stale one fails, so the lists shrink
//! the day a file is fixed. Test code (`#[cfg(test)]` items, `tests.rs`) is exempt.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use syn::visit::Visit;

/// The clouds that have an adapter, as their module is spelled.
const CLOUDS: &[&str] = &[
    "aws",
    "digitalocean",
    "docker",
    "gcp",
    "hyperstack",
    "lambda",
    "massedcompute",
    "nebius",
    "primeintellect",
    "runpod",
    "verda",
];

/// Most lines an adapter's `mod.rs` may have (issue 34).
const ADAPTER_MOD_LINES: usize = 700;
/// Most lines any other shipped source file may have (issue 34).
const FILE_LINES: usize = 1000;

/// Files allowed past their size budget: (path under `src/`, its own limit, why).
const SIZE_ALLOW: &[(&str, usize, &str)] = &[
    (
        "provider/doubles/fake.rs",
        1090,
        "the scripted test double (compiled only for tests): scripts, recording and the listing in one place",
    ),
    (
        "plan.rs",
        1520,
        "the plan's diff, refresh and discovery folding; its views moved to cli/view, the rest is to be cut by concern",
    ),
    (
        "config.rs",
        1120,
        "the config types, merge and diagnostics, now with the per-cloud `[cloud.NAME]` key diagnostics; the diagnostics are to move to their own file",
    ),
    (
        "cluster/probe.rs",
        1340,
        "the node probe's parsers of real command outputs (nvidia-smi, systemctl, cloud-init) with their decision tables",
    ),
];

/// Loops and timeouts allowed in adapters: (path under `src/`, enclosing function, why).
const LOOP_ALLOW: &[(&str, &str, &str)] = &[
    (
        "provider/clouds/aws/errors.rs",
        "is_refused",
        "walks one error's `source()` chain (data, no call)",
    ),
    (
        "provider/clouds/aws/errors.rs",
        "innermost",
        "walks one error's `source()` chain (data, no call)",
    ),
    (
        "provider/clouds/aws/sdk.rs",
        "resolve_credentials",
        "the SDK's credential chain may read the instance metadata service: one resolution, bounded so `validate` never hangs",
    ),
    (
        "provider/clouds/aws/mod.rs",
        "instances",
        "`DescribeInstances` pagination (`NextToken`): one call's pages",
    ),
    (
        "provider/clouds/docker/build.rs",
        "build_sshd_image",
        "reads the one build call's progress stream to its end",
    ),
    (
        "provider/clouds/primeintellect/pods.rs",
        "ssh_endpoint",
        "parses the words of the `sshConnection` string (data, no call)",
    ),
];

/// Paths the docs name that are not in this repository on purpose (path, why).
const DOCS_ELSEWHERE: &[(&str, &str)] = &[
    (
        "examples/gpuprov.state.json",
        "the state file the README's first command leaves beside the example",
    ),
    (
        "proto/protovalidate/buf/validate/validate.proto",
        "the path in bufbuild/protovalidate that proto/README.md cites as the source",
    ),
];

/// Markdown files whose paths are not checked, with why.
const DOCS_UNCHECKED: &[(&str, &str)] = &[(
    "CHANGELOG.md",
    "a record of the past: its entries name files as they were when released",
)];

/// The module path of source file `path` (relative to `src/`, `/`-separated):
/// `provider/clouds/lambda/mod.rs` → `[provider, clouds, lambda]`.
fn module_of_file(path: &str) -> Vec<String> {
    let mut parts: Vec<String> = path.split('/').map(str::to_string).collect();
    let last = parts.pop().unwrap_or_default();
    let stem = last.trim_end_matches(".rs");
    if stem != "mod" && stem != "lib" && stem != "main" {
        parts.push(stem.to_string());
    }
    parts
}

/// The cloud whose adapter holds the module `module` (`[provider, clouds, lambda, api]`
/// → `lambda`).
fn cloud_of_module(module: &[String]) -> Option<&str> {
    let rest = match module {
        [p, c, rest @ ..] if p == "provider" && c == "clouds" => rest,
        _ => return None,
    };
    let first = rest.first()?;
    CLOUDS.iter().copied().find(|c| c == first)
}

/// Whether `path` (under `src/`) holds only tests.
fn is_test_file(path: &str) -> bool {
    path == "tests.rs" || path.ends_with("/tests.rs")
}

/// Whether `attrs` hold `#[cfg(test)]`.
fn is_cfg_test(attrs: &[syn::Attribute]) -> bool {
    attrs.iter().any(|a| {
        a.path().is_ident("cfg")
            && a.parse_args::<syn::Meta>()
                .is_ok_and(|m| m.path().is_ident("test"))
    })
}

/// What one file's syntax shows: the resolved module paths it names, and its loops and
/// timeouts by enclosing function.
#[derive(Default)]
struct Seen {
    /// Absolute module paths named (the segments after `crate`).
    paths: BTreeSet<Vec<String>>,
    /// (kind, enclosing function) of each `loop`, `while` and `timeout` call.
    loops: Vec<(&'static str, String)>,
}

struct Walker {
    /// The module the visitor is in (the file's, plus inline `mod`s).
    module: Vec<String>,
    /// The innermost named function.
    function: Vec<String>,
    seen: Seen,
}

impl Walker {
    /// `segments` as an absolute module path from the current module, `None` for paths
    /// that are not module-relative (a local name, an external crate, `std`).
    fn resolve(&self, segments: &[String]) -> Option<Vec<String>> {
        let mut base: Vec<String>;
        let mut rest = segments;
        match rest.first().map(String::as_str) {
            Some("crate") => {
                base = Vec::new();
                rest = &rest[1..];
            }
            Some("self") => {
                base = self.module.clone();
                rest = &rest[1..];
            }
            Some("super") => {
                base = self.module.clone();
                while rest.first().map(String::as_str) == Some("super") {
                    base.pop()?;
                    rest = &rest[1..];
                }
            }
            _ => return None,
        }
        base.extend(rest.iter().cloned());
        Some(base)
    }

    fn note(&mut self, segments: Vec<String>) {
        if let Some(p) = self.resolve(&segments) {
            self.seen.paths.insert(p);
        }
    }

    fn use_tree(&mut self, prefix: &mut Vec<String>, tree: &syn::UseTree) {
        match tree {
            syn::UseTree::Path(p) => {
                prefix.push(p.ident.to_string());
                self.use_tree(prefix, &p.tree);
                prefix.pop();
            }
            syn::UseTree::Name(n) => {
                let mut s = prefix.clone();
                if n.ident != "self" {
                    s.push(n.ident.to_string());
                }
                self.note(s);
            }
            syn::UseTree::Rename(r) => {
                let mut s = prefix.clone();
                s.push(r.ident.to_string());
                self.note(s);
            }
            syn::UseTree::Glob(_) => self.note(prefix.clone()),
            syn::UseTree::Group(g) => {
                for t in &g.items {
                    self.use_tree(prefix, t);
                }
            }
        }
    }

    fn in_function(&self) -> String {
        self.function.last().cloned().unwrap_or_else(|| "-".into())
    }
}

impl<'ast> Visit<'ast> for Walker {
    fn visit_item(&mut self, i: &'ast syn::Item) {
        let attrs: &[syn::Attribute] = match i {
            syn::Item::Mod(m) => &m.attrs,
            syn::Item::Fn(f) => &f.attrs,
            syn::Item::Impl(m) => &m.attrs,
            syn::Item::Use(u) => &u.attrs,
            syn::Item::Const(c) => &c.attrs,
            syn::Item::Static(s) => &s.attrs,
            syn::Item::Struct(s) => &s.attrs,
            syn::Item::Enum(e) => &e.attrs,
            _ => &[],
        };
        if is_cfg_test(attrs) {
            return;
        }
        syn::visit::visit_item(self, i);
    }

    fn visit_item_mod(&mut self, m: &'ast syn::ItemMod) {
        if m.content.is_none() {
            return;
        }
        self.module.push(m.ident.to_string());
        syn::visit::visit_item_mod(self, m);
        self.module.pop();
    }

    fn visit_item_fn(&mut self, f: &'ast syn::ItemFn) {
        self.function.push(f.sig.ident.to_string());
        syn::visit::visit_item_fn(self, f);
        self.function.pop();
    }

    fn visit_impl_item_fn(&mut self, f: &'ast syn::ImplItemFn) {
        if is_cfg_test(&f.attrs) {
            return;
        }
        self.function.push(f.sig.ident.to_string());
        syn::visit::visit_impl_item_fn(self, f);
        self.function.pop();
    }

    fn visit_item_use(&mut self, u: &'ast syn::ItemUse) {
        self.use_tree(&mut Vec::new(), &u.tree);
    }

    fn visit_path(&mut self, p: &'ast syn::Path) {
        let segments: Vec<String> = p.segments.iter().map(|s| s.ident.to_string()).collect();
        self.note(segments);
        syn::visit::visit_path(self, p);
    }

    fn visit_expr_loop(&mut self, e: &'ast syn::ExprLoop) {
        let f = self.in_function();
        self.seen.loops.push(("loop", f));
        syn::visit::visit_expr_loop(self, e);
    }

    fn visit_expr_while(&mut self, e: &'ast syn::ExprWhile) {
        let f = self.in_function();
        self.seen.loops.push(("while", f));
        syn::visit::visit_expr_while(self, e);
    }

    fn visit_expr_call(&mut self, e: &'ast syn::ExprCall) {
        if let syn::Expr::Path(p) = &*e.func {
            if p.path.segments.last().is_some_and(|s| s.ident == "timeout") {
                let f = self.in_function();
                self.seen.loops.push(("timeout", f));
            }
        }
        syn::visit::visit_expr_call(self, e);
    }

    fn visit_macro(&mut self, m: &'ast syn::Macro) {
        // Paths inside macro bodies (`format!`, `json!`) are mostly data; expressions
        // inside them are still parsed where they parse as a comma list.
        if let Ok(args) = m.parse_body_with(
            syn::punctuated::Punctuated::<syn::Expr, syn::Token![,]>::parse_terminated,
        ) {
            for a in &args {
                self.visit_expr(a);
            }
        }
    }
}

/// What file `path` (under `src/`) with `text` names and loops on. Errors: the file does
/// not parse.
fn walk(path: &str, text: &str) -> Result<Seen, String> {
    let file = syn::parse_file(text).map_err(|e| format!("{path}: does not parse: {e}"))?;
    let mut w = Walker {
        module: module_of_file(path),
        function: Vec::new(),
        seen: Seen::default(),
    };
    w.visit_file(&file);
    Ok(w.seen)
}

/// The cloud a resolved path names (`[provider, clouds, gcp, …]`).
fn cloud_named(path: &[String]) -> Option<&str> {
    cloud_of_module(path)
}

/// Whether `path` is a contract or kit file that must name no cloud (rule 2): under
/// `provider/`, not an adapter, not the registry (the one table of every cloud), not a
/// test double, not `shared.rs` (the table of each cloud's shared objects).
fn must_name_no_cloud(path: &str) -> bool {
    let Some(rest) = path.strip_prefix("provider/") else {
        return false;
    };
    let module = module_of_file(path);
    cloud_of_module(&module).is_none()
        && rest != "clouds/registry.rs"
        && rest != "clouds/mod.rs"
        && !rest.starts_with("doubles/")
}

/// Rules 1 to 3 over `files` (path under `src/`, text): the violations, and which
/// [`LOOP_ALLOW`]-shaped entries of `allowed` were used.
fn check_syntax(
    files: &[(String, String)],
    allowed: &[(&str, &str, &str)],
) -> (Vec<String>, Vec<bool>) {
    let mut problems = Vec::new();
    let mut used = vec![false; allowed.len()];
    for (path, text) in files {
        if is_test_file(path) || !path.starts_with("provider/") {
            continue;
        }
        let seen = match walk(path, text) {
            Ok(s) => s,
            Err(e) => {
                problems.push(e);
                continue;
            }
        };
        let module = module_of_file(path);
        let own = cloud_of_module(&module);
        for p in &seen.paths {
            let Some(named) = cloud_named(p) else {
                continue;
            };
            match own {
                Some(own) if own != named => problems.push(format!(
                    "{path}: the {own} adapter names the {named} adapter ({}); adapters share \
                     code only through the kit",
                    p.join("::")
                )),
                None if must_name_no_cloud(path) => problems.push(format!(
                    "{path}: the contract and the kit name no cloud, but this names {} \
                     (move it into the {named} adapter or the registry)",
                    p.join("::")
                )),
                _ => {}
            }
        }
        if own.is_none() {
            continue;
        }
        for (kind, function) in &seen.loops {
            match allowed
                .iter()
                .position(|(f, func, _)| f == path && func == function)
            {
                Some(i) => used[i] = true,
                None => problems.push(format!(
                    "{path}: a `{kind}` in `{function}`: adapters loop only over one call's \
                     pagination; retries, polls and waits belong to the executor \
                     (src/machine/). If this is pagination, add it to LOOP_ALLOW in \
                     src/tidy.rs with the reason"
                )),
            }
        }
    }
    (problems, used)
}

/// Rule 4 over `files`: the violations, and which entries of `allowed` were used.
fn check_sizes(
    files: &[(String, String)],
    allowed: &[(&str, usize, &str)],
) -> (Vec<String>, Vec<bool>) {
    let mut problems = Vec::new();
    let mut used = vec![false; allowed.len()];
    for (path, text) in files {
        if is_test_file(path) {
            continue;
        }
        let lines = text.lines().count();
        let is_adapter_mod =
            path.ends_with("/mod.rs") && cloud_of_module(&module_of_file(path)).is_some();
        let budget = if is_adapter_mod {
            ADAPTER_MOD_LINES
        } else {
            FILE_LINES
        };
        let allowance = allowed.iter().position(|(p, _, _)| p == path);
        match allowance {
            Some(i) if lines > budget => {
                used[i] = true;
                if lines > allowed[i].1 {
                    problems.push(format!(
                        "{path}: {lines} lines, over its allowance of {} in SIZE_ALLOW",
                        allowed[i].1
                    ));
                }
            }
            _ if lines > budget => problems.push(format!(
                "{path}: {lines} lines, over the budget of {budget}: split it (src/tidy.rs)"
            )),
            _ => {}
        }
    }
    (problems, used)
}

/// The repository paths a Markdown text names: in backticks or a link target, starting
/// with one of the repository's top-level folders, without placeholders or globs.
fn doc_paths(text: &str) -> Vec<String> {
    const ROOTS: &[&str] = &[
        "src/",
        "tests/",
        "docs/",
        "scripts/",
        "examples/",
        "schemas/",
        "benches/",
        "proto/",
        ".ci/",
    ];
    let mut out = Vec::new();
    let mut candidates: Vec<&str> = Vec::new();
    for (i, part) in text.split('`').enumerate() {
        if i % 2 == 1 {
            candidates.push(part);
        }
    }
    for piece in text.split("](").skip(1) {
        if let Some(end) = piece.find(')') {
            candidates.push(&piece[..end]);
        }
    }
    for c in candidates {
        let c = c.trim().trim_start_matches("./");
        let c = c.split(['#', ' ', ':']).next().unwrap_or("");
        let c = c.trim_end_matches([',', '.']);
        if !ROOTS.iter().any(|r| c.starts_with(r)) {
            continue;
        }
        if c.contains(['<', '>', '*', '{', '}', '$', '…']) {
            continue;
        }
        out.push(c.to_string());
    }
    out
}

/// Rule 5 over `docs` (path from the repository root, text), against `exists`.
fn check_docs(docs: &[(String, String)], exists: &dyn Fn(&str) -> bool) -> Vec<String> {
    let mut problems = Vec::new();
    for (doc, text) in docs {
        if DOCS_UNCHECKED.iter().any(|(d, _)| d == doc) {
            continue;
        }
        for p in doc_paths(text) {
            if !exists(&p) && !DOCS_ELSEWHERE.iter().any(|(g, _)| *g == p) {
                problems.push(format!("{doc}: names `{p}`, which does not exist"));
            }
        }
    }
    problems
}

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Every `.rs` file under `src/`, path relative to it.
fn sources() -> Vec<(String, String)> {
    files_under(&root().join("src"), &|p| {
        p.extension().is_some_and(|x| x == "rs")
    })
}

fn files_under(dir: &Path, keep: &dyn Fn(&Path) -> bool) -> Vec<(String, String)> {
    fn walk(
        root: &Path,
        dir: &Path,
        keep: &dyn Fn(&Path) -> bool,
        out: &mut Vec<(String, String)>,
    ) {
        let Ok(rd) = std::fs::read_dir(dir) else {
            return;
        };
        let mut entries: Vec<PathBuf> = rd.filter_map(|e| e.ok().map(|e| e.path())).collect();
        entries.sort();
        for p in entries {
            let name = p.file_name().unwrap_or_default().to_string_lossy();
            if p.is_dir() {
                if name != "target" && !name.starts_with('.') || name == ".ci" {
                    walk(root, &p, keep, out);
                }
            } else if keep(&p) {
                let rel = p
                    .strip_prefix(root)
                    .unwrap()
                    .to_string_lossy()
                    .replace('\\', "/");
                if let Ok(text) = std::fs::read_to_string(&p) {
                    out.push((rel, text));
                }
            }
        }
    }
    let mut out = Vec::new();
    walk(dir, dir, keep, &mut out);
    out
}

fn stale<T: std::fmt::Debug>(list: &[T], used: &[bool]) -> Vec<String> {
    list.iter()
        .zip(used)
        .filter(|(_, u)| !**u)
        .map(|(e, _)| format!("stale allow-list entry, nothing needs it any more: {e:?}"))
        .collect()
}

#[test]
fn adapters_name_no_other_adapter_and_loop_only_where_allowed() {
    let files = sources();
    assert!(files.len() > 20, "the sources were not found");
    let (mut problems, used) = check_syntax(&files, LOOP_ALLOW);
    problems.extend(stale(LOOP_ALLOW, &used));
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn files_keep_their_size_budgets() {
    let (mut problems, used) = check_sizes(&sources(), SIZE_ALLOW);
    problems.extend(stale(SIZE_ALLOW, &used));
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn every_path_named_in_the_docs_exists() {
    let docs = files_under(&root(), &|p| p.extension().is_some_and(|x| x == "md"));
    assert!(
        docs.iter().any(|(p, _)| p == "README.md"),
        "the docs were not found"
    );
    let problems = check_docs(&docs, &|p| root().join(p).exists());
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

mod checker {
    //! The rules on synthetic files: each mutation the rules exist for is caught.

    use super::*;

    fn files(v: &[(&str, &str)]) -> Vec<(String, String)> {
        v.iter()
            .map(|(p, t)| (p.to_string(), t.to_string()))
            .collect()
    }

    #[test]
    fn an_adapter_importing_another_through_super_is_reported() {
        for text in [
            "use super::runpod::Pod;\n",
            "use super::{kit, runpod};\n",
            "fn f() { let _ = super::runpod::CLOUD; }\n",
            "use crate::provider::clouds::runpod::Pod;\n",
        ] {
            let (p, _) = check_syntax(&files(&[("provider/clouds/lambda/mod.rs", text)]), &[]);
            assert_eq!(p.len(), 1, "{text}: {p:?}");
            assert!(p[0].contains("names the runpod adapter"), "{p:?}");
        }
        // A submodule's `super::super::` reaches the sibling adapter too.
        let (p, _) = check_syntax(
            &files(&[(
                "provider/clouds/lambda/api.rs",
                "use super::super::gcp::api::x;\n",
            )]),
            &[],
        );
        assert_eq!(p.len(), 1, "{p:?}");
        // Its own modules and the kit are fine.
        let (p, _) = check_syntax(
            &files(&[(
                "provider/clouds/lambda/mod.rs",
                "use crate::provider::kit::http;\nuse self::api::Instance;\nmod api;\n\
                 fn f() { super::lambda::x(); }\n",
            )]),
            &[],
        );
        assert!(p.is_empty(), "{p:?}");
    }

    #[test]
    fn the_kit_naming_a_cloud_is_reported() {
        let (p, _) = check_syntax(
            &files(&[(
                "provider/kit/http.rs",
                "use super::super::clouds::gcp::auth;\n",
            )]),
            &[],
        );
        assert_eq!(p.len(), 1, "{p:?}");
        let (p, _) = check_syntax(
            &files(&[(
                "provider/clouds/registry.rs",
                "use super::gcp::GcpProvider;\n",
            )]),
            &[],
        );
        assert!(p.is_empty(), "the registry names every cloud: {p:?}");
    }

    #[test]
    fn a_retry_loop_in_an_adapter_is_reported_unless_allowed() {
        let text =
            "async fn create(&self) { loop { if self.try_once().await.is_ok() { break; } } }\n\
                    fn g() { while x() {} }\nasync fn h() { tokio::time::timeout(d, f()).await; }\n\
                    fn pages(v: &[u8]) { for x in v { let _ = x; } }\n\
                    #[cfg(test)]\nmod tests { fn t() { loop {} } }\n";
        let f = files(&[("provider/clouds/verda/mod.rs", text)]);
        let (p, _) = check_syntax(&f, &[]);
        assert_eq!(p.len(), 3, "{p:?}");
        assert!(p[0].contains("`loop` in `create`"), "{p:?}");
        let allowed = [
            ("provider/clouds/verda/mod.rs", "create", "r"),
            ("provider/clouds/verda/mod.rs", "g", "r"),
            ("provider/clouds/verda/mod.rs", "h", "r"),
            ("provider/clouds/verda/mod.rs", "gone", "r"),
        ];
        let (p, used) = check_syntax(&f, &allowed);
        assert!(p.is_empty(), "{p:?}");
        assert_eq!(used, [true, true, true, false], "the last entry is stale");
        // Outside adapters, loops are the executor's business.
        let (p, _) = check_syntax(&files(&[("provider/kit/paginate.rs", text)]), &[]);
        assert!(p.is_empty(), "{p:?}");
    }

    #[test]
    fn a_file_over_its_budget_is_reported() {
        let long = "fn f() {}\n".repeat(1100);
        let (p, _) = check_sizes(&files(&[("engine.rs", &long)]), &[]);
        assert_eq!(p.len(), 1, "{p:?}");
        let adapter = "fn f() {}\n".repeat(800);
        let (p, _) = check_sizes(&files(&[("provider/clouds/gcp/mod.rs", &adapter)]), &[]);
        assert_eq!(p.len(), 1, "an adapter's mod.rs has 700: {p:?}");
        let (p, _) = check_sizes(&files(&[("provider/clouds/gcp/api.rs", &adapter)]), &[]);
        assert!(p.is_empty(), "{p:?}");
        let (p, used) = check_sizes(
            &files(&[("engine.rs", &long), ("small.rs", "fn f() {}\n")]),
            &[("engine.rs", 1200, "r"), ("small.rs", 1200, "r")],
        );
        assert!(p.is_empty(), "{p:?}");
        assert_eq!(
            used,
            [true, false],
            "a file back within budget makes its entry stale"
        );
        let (p, _) = check_sizes(&files(&[("tests.rs", &long)]), &[]);
        assert!(p.is_empty(), "test files have no budget");
    }

    #[test]
    fn a_doc_naming_a_missing_path_is_reported() {
        let doc = "See `src/engine.rs` and [the design](docs/design.md#x), \
                   `src/provider/<cloud>/mod.rs`, `tests/it/gone.rs:12`, `cargo run`.";
        assert_eq!(
            doc_paths(doc),
            ["src/engine.rs", "tests/it/gone.rs", "docs/design.md"]
        );
        let exists = |p: &str| p != "tests/it/gone.rs";
        let p = check_docs(&files(&[("README.md", doc)]), &exists);
        assert_eq!(p.len(), 1, "{p:?}");
        assert!(p[0].contains("tests/it/gone.rs"), "{p:?}");
        assert!(check_docs(&files(&[("CHANGELOG.md", doc)]), &exists).is_empty());
    }
}
