//! Conventions as checks (issue #50 item 5), in the style of rust-analyzer's tidy tests: each
//! house rule that reviews used to catch is a function over the source text, run on the tree
//! and, in a second test, on a synthetic violation it must report.
//!
//! 1. **Function length**: a function of `rollout::sequencer` or `plan::compute` is at most
//!    [`MAX_FN_LINES`] lines (the `fn` line to the closing brace); [`LONG_FNS`] lists the
//!    exceptions, each with its reason.
//! 2. **File length**: a production file under `src/` (not a test module: `tests.rs`,
//!    `*_tests.rs`) is at most [`MAX_FILE_LINES`] lines. [`BIG_FILES`] is a ratchet: each
//!    listed file with its line count when it was listed; the test fails when a listed file
//!    grows past its count, when one falls under the limit (delete its entry), and when a file
//!    not listed crosses the limit (split it by subject).
//! 3. **missing_docs**: the modules design/architecture.md names on its `**Documented
//!    modules:**` line are exactly those `src/lib.rs` puts under `#[warn(missing_docs)]` or
//!    `#[deny(missing_docs)]` (or whose root file says `#![warn(missing_docs)]`).
//! 4. **One observation policy**: the variants of [`POLICY_ENUM`] (what an observation is:
//!    missing, transient, failed, got) are matched only in `src/rollout/sequencer/policy.rs`;
//!    [`POLICY_MATCHES_ELSEWHERE`] lists today's other sites, exactly, so it only shrinks.
//! 5. **Test honesty**: no test skips when `CI` is set (a skip goes through
//!    `fixtures::tool_or_skip` / `fixtures::skip`, which fail under CI), and every poll in
//!    `tests/` (a `loop`/`while` that sleeps) has a deadline ([`UNBOUNDED_LOOPS`] lists the
//!    loops that are not polls, with why).
//!
//! How to satisfy each check: CONTRIBUTING.md, "Checks on the conventions".

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use proc_macro2::{TokenStream, TokenTree};
use syn::spanned::Spanned;
use syn::visit::{self, Visit};

use crate::architecture::test_only;

/// The longest function of the checked modules, in lines.
const MAX_FN_LINES: usize = 120;
/// The directories whose functions [`MAX_FN_LINES`] holds.
const FN_LEN_SCOPES: &[&str] = &["src/rollout/sequencer", "src/plan/compute"];
/// Functions allowed past [`MAX_FN_LINES`]: (file, function, why).
const LONG_FNS: &[(&str, &str, &str)] = &[
    (
        "src/rollout/sequencer/silence.rs",
        "silence_outcome",
        "one decision table over the silence's states (create, extend, expire, error policy); to split by state",
    ),
    (
        "src/rollout/sequencer/stage.rs",
        "stage_ahead",
        "staging the next wave's installs in one pass over its nodes; to split per node decision",
    ),
    (
        "src/plan/compute/kube.rs",
        "kubernetes",
        "the Kubernetes section's steps, notes and skew checks in one place; set50 reshapes this stage",
    ),
    (
        "src/plan/compute/talos.rs",
        "pool_steps",
        "a pool's waves, steps and notes; to split into wave building and step building",
    ),
];

/// The longest production file, in lines.
const MAX_FILE_LINES: usize = 800;
/// The ratchet: production files over [`MAX_FILE_LINES`] when the check came (issue #50), with
/// their line count then. Never raise a count: split the file by subject instead.
const BIG_FILES: &[(&str, usize)] = &[
    ("src/desired/validate.rs", 1547),
    ("src/rollout/fake.rs", 1451),
    ("src/desired/health.rs", 1464),
    ("src/rollout/sequencer/talos_node.rs", 1277),
    ("src/desired/incremental.rs", 1239),
    ("src/server/ui/pages.rs", 1226),
    ("src/sim/kube/cluster/incremental.rs", 1176),
    ("src/sim/talos/model/mod.rs", 1149),
    ("src/server/api/mod.rs", 1199),
    ("src/backup/s3.rs", 1128),
    ("src/rollout/executor/mod.rs", 1138),
    ("src/ops/approvals.rs", 1052),
    ("src/server/rollouts.rs", 1142),
    ("src/k8s/client.rs", 1042),
    ("src/bench/rollout.rs", 1022),
    ("src/sim/talos/scenario.rs", 1014),
    ("src/rollout/ports.rs", 1068),
    ("src/sim/kube/mod.rs", 972),
    ("src/desired/source.rs", 965),
    ("src/k8s/bootstrap.rs", 961),
    ("src/plan/compute/mod.rs", 1015),
    ("src/plan/render.rs", 955),
    ("src/rehearsal/twin.rs", 949),
    ("src/cli/rollout.rs", 960),
    ("src/desired/format.rs", 966),
    ("src/ops/refresh.rs", 904),
    ("src/plan/applied.rs", 1133),
    ("src/talos/adapter/mod.rs", 855),
    ("src/server/mod.rs", 878),
    ("src/rollout/sequencer/model.rs", 847),
    ("src/sim/kube/resources.rs", 845),
    ("src/approval/verify.rs", 835),
    ("src/plan/estimate.rs", 832),
    ("src/k8s/mod.rs", 831),
    ("src/ops/replan.rs", 807),
    ("src/k8s/drain.rs", 805),
];

/// The enum whose variants are the observation policy's to match.
const POLICY_ENUM: &str = "Seen";
/// Where it is defined, and the one file that may match it.
const POLICY_ENUM_FILE: &str = "src/rollout/sequencer/observe.rs";
const POLICY_FILE: &str = "src/rollout/sequencer/policy.rs";
/// Files that still match [`POLICY_ENUM`]'s variants, with how many patterns: exact (the test
/// fails when a count changes either way, so the list only shrinks).
const POLICY_MATCHES_ELSEWHERE: &[(&str, usize, &str)] = &[
    (
        "src/rollout/sequencer/leadership.rs",
        10,
        "the leader-move decisions read etcd membership per variant; to move into policy helpers",
    ),
    (
        "src/rollout/sequencer/stage.rs",
        19,
        "staging reads the node's install state per variant (boot id, next boot); to move into policy helpers",
    ),
    (
        "src/rollout/sequencer/talos_node.rs",
        9,
        "the version and down-node checks; to move into policy helpers",
    ),
];

/// Loops in `tests/` that sleep and are not polls: (file, a text the loop's line contains, why).
const UNBOUNDED_LOOPS: &[(&str, &str, &str)] = &[
    (
        "tests/it/kube_sim.rs",
        "while !stop.load(",
        "a sampler, stopped by the test once the rollout it samples has ended (which has its deadline)",
    ),
    (
        "tests/it/rollout_sim/snapshot_age.rs",
        "while !flag.load(",
        "a directory watcher, stopped by the test once the rollout it watches has ended",
    ),
];

// ---------------------------------------------------------------------------------------
// Reading the tree.

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    let mut entries: Vec<PathBuf> = entries.filter_map(|e| e.ok().map(|e| e.path())).collect();
    entries.sort();
    for p in entries {
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|e| e == "rs") {
            out.push(p);
        }
    }
}

/// Every `.rs` file under `root/dir`, as (path relative to `root`, text).
fn sources(root: &Path, dir: &str) -> Vec<(String, String)> {
    let mut files = Vec::new();
    rust_files(&root.join(dir), &mut files);
    files
        .into_iter()
        .map(|f| {
            let rel = f
                .strip_prefix(root)
                .unwrap_or(&f)
                .to_string_lossy()
                .replace('\\', "/");
            let text = std::fs::read_to_string(&f).unwrap();
            (rel, text)
        })
        .collect()
}

/// A test module's file: `tests.rs`, `*_tests.rs`, or under a `tests/` directory of `src/`.
fn is_test_file(rel: &str) -> bool {
    let name = rel.rsplit('/').next().unwrap_or(rel);
    name == "tests.rs" || name.ends_with("_tests.rs") || rel.contains("/tests/")
}

// ---------------------------------------------------------------------------------------
// 1. Function length.

/// A function and its length: (name, first line, lines).
struct Fns {
    out: Vec<(String, usize, usize)>,
}

impl Fns {
    fn record(&mut self, name: &syn::Ident, from: proc_macro2::Span, to: proc_macro2::Span) {
        let (a, b) = (from.start().line, to.end().line);
        self.out
            .push((name.to_string(), a, b.saturating_sub(a) + 1));
    }
}

impl<'ast> Visit<'ast> for Fns {
    fn visit_item_mod(&mut self, m: &'ast syn::ItemMod) {
        if !test_only(&m.attrs) {
            visit::visit_item_mod(self, m);
        }
    }
    fn visit_item_fn(&mut self, f: &'ast syn::ItemFn) {
        if test_only(&f.attrs) {
            return;
        }
        self.record(
            &f.sig.ident,
            f.sig.fn_token.span,
            f.block.brace_token.span.close(),
        );
        visit::visit_item_fn(self, f);
    }
    fn visit_impl_item_fn(&mut self, f: &'ast syn::ImplItemFn) {
        if test_only(&f.attrs) {
            return;
        }
        self.record(
            &f.sig.ident,
            f.sig.fn_token.span,
            f.block.brace_token.span.close(),
        );
        visit::visit_impl_item_fn(self, f);
    }
    fn visit_trait_item_fn(&mut self, f: &'ast syn::TraitItemFn) {
        if let Some(b) = &f.default {
            self.record(
                &f.sig.ident,
                f.sig.fn_token.span,
                b.brace_token.span.close(),
            );
        }
        visit::visit_trait_item_fn(self, f);
    }
}

/// Functions over [`MAX_FN_LINES`] in one file's text: "file:line: `name` is N lines".
fn long_fns(rel: &str, text: &str) -> Vec<(String, String)> {
    let Ok(file) = syn::parse_file(text) else {
        return vec![(String::new(), format!("{rel}: does not parse"))];
    };
    let mut fns = Fns { out: Vec::new() };
    fns.visit_file(&file);
    fns.out
        .into_iter()
        .filter(|(_, _, n)| *n > MAX_FN_LINES)
        .map(|(name, line, n)| {
            (
                name.clone(),
                format!("{rel}:{line}: `{name}` is {n} lines (at most {MAX_FN_LINES})"),
            )
        })
        .collect()
}

fn check_fn_length(root: &Path, allowed: &[(&str, &str, &str)]) -> Vec<String> {
    let mut out = Vec::new();
    let mut used = BTreeSet::new();
    for scope in FN_LEN_SCOPES {
        for (rel, text) in sources(root, scope) {
            if is_test_file(&rel) {
                continue;
            }
            for (name, msg) in long_fns(&rel, &text) {
                match allowed.iter().find(|(f, n, _)| *f == rel && *n == name) {
                    Some(_) => {
                        used.insert((rel.clone(), name));
                    }
                    None => out.push(format!("{msg}: split it (or list it in LONG_FNS with why)")),
                }
            }
        }
    }
    for (f, n, _) in allowed {
        if !used.contains(&(f.to_string(), n.to_string())) {
            out.push(format!(
                "{f}: `{n}` is listed in LONG_FNS but is no longer over {MAX_FN_LINES} lines: delete its entry"
            ));
        }
    }
    out
}

// ---------------------------------------------------------------------------------------
// 2. File length.

/// The ratchet over `files` ((path, lines) of production files).
fn check_file_length(files: &[(String, usize)], listed: &[(&str, usize)]) -> Vec<String> {
    let mut out = Vec::new();
    let counts: BTreeMap<&str, usize> = files.iter().map(|(f, n)| (f.as_str(), *n)).collect();
    for (f, n) in files {
        if *n > MAX_FILE_LINES && !listed.iter().any(|(l, _)| l == f) {
            out.push(format!(
                "{f}: {n} lines (at most {MAX_FILE_LINES} for a production file): split it by subject into submodules"
            ));
        }
    }
    for (f, max) in listed {
        match counts.get(f) {
            None => out.push(format!(
                "{f}: listed in BIG_FILES but gone: delete its entry"
            )),
            Some(&n) if n <= MAX_FILE_LINES => out.push(format!(
                "{f}: {n} lines, under {MAX_FILE_LINES} now: delete its entry from BIG_FILES"
            )),
            Some(&n) if n > *max => out.push(format!(
                "{f}: {n} lines, grown past its recorded {max} (BIG_FILES is a ratchet: split the file instead of raising the count)"
            )),
            Some(_) => {}
        }
    }
    out
}

fn production_files(root: &Path) -> Vec<(String, usize)> {
    sources(root, "src")
        .into_iter()
        .filter(|(rel, _)| !is_test_file(rel))
        .map(|(rel, text)| {
            let n = text.lines().count();
            (rel, n)
        })
        .collect()
}

// ---------------------------------------------------------------------------------------
// 3. missing_docs.

/// The backticked names on the `**Documented modules:**` line of `doc`.
fn documented_in_doc(doc: &str) -> Option<BTreeSet<String>> {
    let line = doc
        .lines()
        .find(|l| l.trim_start().starts_with("**Documented modules:**"))?;
    let rest = line.split_once(":**")?.1;
    Some(
        rest.split('`')
            .skip(1)
            .step_by(2)
            .map(str::to_string)
            .collect(),
    )
}

fn is_missing_docs_lint(attr: &syn::Attribute) -> bool {
    (attr.path().is_ident("warn") || attr.path().is_ident("deny") || attr.path().is_ident("forbid"))
        && attr
            .parse_args_with(
                syn::punctuated::Punctuated::<syn::Path, syn::Token![,]>::parse_terminated,
            )
            .is_ok_and(|p| p.iter().any(|p| p.is_ident("missing_docs")))
}

/// The top-level modules `lib` (the text of `src/lib.rs`) lints with `missing_docs`, and those
/// whose root file (`module_root(name)`) carries the inner attribute.
fn documented_in_code(lib: &str, module_root: impl Fn(&str) -> Option<String>) -> BTreeSet<String> {
    let Ok(file) = syn::parse_file(lib) else {
        return BTreeSet::new();
    };
    let mut out = BTreeSet::new();
    for item in &file.items {
        let syn::Item::Mod(m) = item else { continue };
        let name = m.ident.to_string();
        let outer = m.attrs.iter().any(is_missing_docs_lint);
        let inner = module_root(&name)
            .and_then(|t| syn::parse_file(&t).ok())
            .is_some_and(|f| f.attrs.iter().any(is_missing_docs_lint));
        if outer || inner {
            out.insert(name);
        }
    }
    out
}

fn check_missing_docs(doc: &str, documented: &BTreeSet<String>) -> Vec<String> {
    let Some(want) = documented_in_doc(doc) else {
        return vec![
            "design/architecture.md has no `**Documented modules:**` line naming the modules `missing_docs` covers".into(),
        ];
    };
    let mut out = Vec::new();
    for m in want.difference(documented) {
        out.push(format!(
            "`{m}`: design/architecture.md says `missing_docs` covers it, but src/lib.rs has no `#[warn(missing_docs)]` on `pub mod {m};`"
        ));
    }
    for m in documented.difference(&want) {
        out.push(format!(
            "`{m}`: src/lib.rs lints it with `missing_docs`, but design/architecture.md's `**Documented modules:**` line does not name it"
        ));
    }
    out
}

// ---------------------------------------------------------------------------------------
// 4. The observation policy.

/// Patterns naming `enum_name::Variant` (in `match`, `if let`, `let … else`, and in
/// `matches!`), outside test-only items.
struct PolicyMatches<'a> {
    enum_name: &'a str,
    lines: Vec<usize>,
}

impl PolicyMatches<'_> {
    fn path(&mut self, p: &syn::Path) {
        let segs: Vec<String> = p.segments.iter().map(|s| s.ident.to_string()).collect();
        if segs.len() >= 2 && segs[segs.len() - 2] == self.enum_name {
            self.lines.push(p.span().start().line);
        }
    }
    /// `inside`: within the arguments of a `matches!` (where a path is a pattern).
    fn tokens(&mut self, ts: TokenStream, inside: bool) {
        let tt: Vec<TokenTree> = ts.into_iter().collect();
        let has_matches = inside
            || tt
                .iter()
                .any(|t| matches!(t, TokenTree::Ident(i) if i == "matches"));
        for (i, t) in tt.iter().enumerate() {
            match t {
                TokenTree::Group(g) => self.tokens(g.stream(), has_matches),
                TokenTree::Ident(id) if has_matches && id == self.enum_name => {
                    let colons = tt.get(i + 1).is_some_and(|t| t.to_string() == ":")
                        && tt.get(i + 2).is_some_and(|t| t.to_string() == ":");
                    if colons {
                        self.lines.push(id.span().start().line);
                    }
                }
                _ => {}
            }
        }
    }
}

impl<'ast> Visit<'ast> for PolicyMatches<'_> {
    fn visit_item_mod(&mut self, m: &'ast syn::ItemMod) {
        if !test_only(&m.attrs) {
            visit::visit_item_mod(self, m);
        }
    }
    fn visit_item_fn(&mut self, f: &'ast syn::ItemFn) {
        if !test_only(&f.attrs) {
            visit::visit_item_fn(self, f);
        }
    }
    fn visit_pat(&mut self, p: &'ast syn::Pat) {
        match p {
            syn::Pat::Path(x) => self.path(&x.path),
            syn::Pat::TupleStruct(x) => self.path(&x.path),
            syn::Pat::Struct(x) => self.path(&x.path),
            _ => {}
        }
        visit::visit_pat(self, p);
    }
    fn visit_macro(&mut self, m: &'ast syn::Macro) {
        let mut ts = TokenStream::new();
        ts.extend(std::iter::once(TokenTree::Ident(
            m.path
                .segments
                .last()
                .map(|s| s.ident.clone())
                .unwrap_or_else(|| proc_macro2::Ident::new("m", proc_macro2::Span::call_site())),
        )));
        ts.extend(m.tokens.clone());
        self.tokens(ts, false);
    }
}

/// How many patterns of `enum_name`'s variants each file of `files` has (files with none are
/// left out).
fn policy_matches(files: &[(String, String)], enum_name: &str) -> BTreeMap<String, usize> {
    let mut out = BTreeMap::new();
    for (rel, text) in files {
        let Ok(file) = syn::parse_file(text) else {
            continue;
        };
        let mut v = PolicyMatches {
            enum_name,
            lines: Vec::new(),
        };
        v.visit_file(&file);
        if !v.lines.is_empty() {
            out.insert(rel.clone(), v.lines.len());
        }
    }
    out
}

fn check_policy(
    found: &BTreeMap<String, usize>,
    policy_file: &str,
    listed: &[(&str, usize, &str)],
) -> Vec<String> {
    let mut out = Vec::new();
    for (f, n) in found {
        if f == policy_file {
            continue;
        }
        match listed.iter().find(|(l, _, _)| l == f) {
            None => out.push(format!(
                "{f}: matches `{POLICY_ENUM}`'s variants {n} time(s): what a decision does with a missing, transient or failed observation is {policy_file}'s (add a helper there)"
            )),
            Some((_, want, _)) if want != n => out.push(format!(
                "{f}: matches `{POLICY_ENUM}`'s variants {n} time(s), POLICY_MATCHES_ELSEWHERE says {want}: lower the count (it may only shrink)"
            )),
            Some(_) => {}
        }
    }
    for (f, _, _) in listed {
        if !found.contains_key(*f) {
            out.push(format!(
                "{f}: listed in POLICY_MATCHES_ELSEWHERE but matches no `{POLICY_ENUM}` variant now: delete its entry"
            ));
        }
    }
    out
}

// ---------------------------------------------------------------------------------------
// 5. Test honesty.

/// Test files that skip without failing under `CI`: a `skip` message printed in a function
/// that never reads `CI`, or a tool looked up by hand (`which(`, `find_tool(`) with an early
/// `return` in its `else`. `fixtures.rs` holds the helpers that do it right.
fn check_skips(files: &[(String, String)]) -> Vec<String> {
    let mut out = Vec::new();
    for (rel, text) in files {
        if rel.ends_with("tests/it/fixtures.rs") {
            continue;
        }
        let Ok(file) = syn::parse_file(text) else {
            continue;
        };
        let mut v = Skips {
            rel,
            lines: text.lines().collect(),
            out: &mut out,
        };
        v.visit_file(&file);
    }
    out
}

struct Skips<'a> {
    rel: &'a str,
    lines: Vec<&'a str>,
    out: &'a mut Vec<String>,
}

impl Skips<'_> {
    /// The source lines `span` covers.
    fn text(&self, span: proc_macro2::Span) -> String {
        let (a, b) = (span.start().line, span.end().line);
        self.lines
            .get(a.saturating_sub(1)..b.min(self.lines.len()))
            .map(|l| l.join("\n"))
            .unwrap_or_default()
    }

    fn body(&mut self, name: &syn::Ident, block: &syn::Block) {
        let text = self.text(block.span());
        let reads_ci = text.contains("\"CI\"");
        let mut prints = SkipPrints(false);
        prints.visit_block(block);
        let prints_skip = prints.0;
        if prints_skip && !reads_ci {
            self.out.push(format!(
                "{}:{}: `{name}` prints a skip without failing under CI: use `crate::fixtures::skip` or `tool_or_skip`",
                self.rel,
                name.span().start().line
            ));
        }
        for stmt in &block.stmts {
            let syn::Stmt::Local(l) = stmt else { continue };
            let (Some(init), true) = (
                &l.init,
                l.init.as_ref().is_some_and(|i| i.diverge.is_some()),
            ) else {
                continue;
            };
            let looked_up = {
                let e = self.text(init.expr.span());
                e.contains("which(") || e.contains("find_tool(")
            };
            let diverge = init
                .diverge
                .as_ref()
                .map(|(_, e)| self.text(e.span()))
                .unwrap_or_default();
            if looked_up && diverge.contains("return") && !reads_ci {
                self.out.push(format!(
                    "{}:{}: `{name}` returns early when a tool is missing, also under CI: use `crate::fixtures::tool_or_skip`",
                    self.rel,
                    l.let_token.span.start().line
                ));
            }
        }
    }
}

/// Whether a block prints (`eprintln!`/`println!`) a message that says "skip".
struct SkipPrints(bool);

impl<'ast> Visit<'ast> for SkipPrints {
    fn visit_macro(&mut self, m: &'ast syn::Macro) {
        let printing = m
            .path
            .segments
            .last()
            .is_some_and(|s| s.ident == "eprintln" || s.ident == "println");
        if printing && m.tokens.to_string().to_lowercase().contains("skip") {
            self.0 = true;
        }
    }
}

impl<'ast> Visit<'ast> for Skips<'_> {
    fn visit_item_fn(&mut self, f: &'ast syn::ItemFn) {
        self.body(&f.sig.ident, &f.block);
        visit::visit_item_fn(self, f);
    }
    fn visit_impl_item_fn(&mut self, f: &'ast syn::ImplItemFn) {
        self.body(&f.sig.ident, &f.block);
        visit::visit_impl_item_fn(self, f);
    }
}

/// Words that show a loop is bounded: a deadline, a timeout, a progress watch, a count.
const DEADLINE_WORDS: &[&str] = &[
    "deadline",
    "timeout",
    "elapsed",
    "PATIENCE",
    "watch.check",
    "within",
    "for _ in",
    "attempt",
];

/// Loops (`loop {`, `while … {`) in test files that sleep but name no deadline in the loop or
/// the six lines before it: (file, line, the loop's line).
fn unbounded_polls(files: &[(String, String)]) -> Vec<(String, usize, String)> {
    let mut out = Vec::new();
    for (rel, text) in files {
        let lines: Vec<&str> = text.lines().collect();
        for (i, l) in lines.iter().enumerate() {
            let t = l.trim_start();
            let opens =
                (t.starts_with("loop {") || t.contains(" loop {") || t.starts_with("while "))
                    && t.ends_with('{');
            if !opens {
                continue;
            }
            let indent = l.len() - t.len();
            let mut body = Vec::new();
            for m in &lines[i + 1..] {
                let mt = m.trim_start();
                if m.len() - mt.len() == indent && mt.starts_with('}') {
                    break;
                }
                body.push(*m);
            }
            let body = body.join("\n");
            if !body.contains("sleep(") {
                continue;
            }
            let before = lines[i.saturating_sub(6)..i].join("\n");
            let bounded = DEADLINE_WORDS
                .iter()
                .any(|w| body.contains(w) || before.contains(w) || t.contains(w));
            if !bounded {
                out.push((rel.clone(), i + 1, t.to_string()));
            }
        }
    }
    out
}

fn check_polls(files: &[(String, String)], allowed: &[(&str, &str, &str)]) -> Vec<String> {
    let found = unbounded_polls(files);
    let mut out = Vec::new();
    for (f, line, text) in &found {
        if !allowed
            .iter()
            .any(|(af, at, _)| af == f && text.contains(at))
        {
            out.push(format!(
                "{f}:{line}: `{text}` sleeps and polls without a deadline: bound it (`tokio::time::timeout`, an `Instant` deadline, or `crate::fixtures::Deadline`) so it fails instead of hanging"
            ));
        }
    }
    for (af, at, _) in allowed {
        if !found.iter().any(|(f, _, t)| f == af && t.contains(at)) {
            out.push(format!(
                "{af}: `{at}` is listed in UNBOUNDED_LOOPS but no such loop sleeps without a deadline now: delete its entry"
            ));
        }
    }
    out
}

// ---------------------------------------------------------------------------------------
// The tests: the tree passes each check.

fn fail_on(what: &str, found: Vec<String>) {
    assert!(
        found.is_empty(),
        "{what} (see CONTRIBUTING.md, \"Checks on the conventions\"):\n  {}",
        found.join("\n  ")
    );
}

#[test]
fn tidy_functions_of_the_sequencer_and_the_planner_are_short() {
    fail_on("function length", check_fn_length(&root(), LONG_FNS));
}

#[test]
fn tidy_production_files_are_short_or_listed_with_their_size() {
    fail_on(
        "file length",
        check_file_length(&production_files(&root()), BIG_FILES),
    );
}

#[test]
fn tidy_missing_docs_covers_what_the_architecture_doc_says() {
    let root = root();
    let doc = std::fs::read_to_string(root.join("design/architecture.md")).unwrap();
    let lib = std::fs::read_to_string(root.join("src/lib.rs")).unwrap();
    let documented = documented_in_code(&lib, |m| {
        std::fs::read_to_string(root.join(format!("src/{m}/mod.rs")))
            .or_else(|_| std::fs::read_to_string(root.join(format!("src/{m}.rs"))))
            .ok()
    });
    fail_on("missing_docs", check_missing_docs(&doc, &documented));
}

#[test]
fn tidy_the_observation_policy_is_matched_in_one_file() {
    let root = root();
    let def = std::fs::read_to_string(root.join(POLICY_ENUM_FILE)).unwrap();
    assert!(
        def.contains(&format!("enum {POLICY_ENUM}<"))
            || def.contains(&format!("enum {POLICY_ENUM} ")),
        "{POLICY_ENUM_FILE} no longer defines `{POLICY_ENUM}`: point the check at the policy's enum"
    );
    let found = policy_matches(&sources(&root, "src"), POLICY_ENUM);
    fail_on(
        "observation policy",
        check_policy(&found, POLICY_FILE, POLICY_MATCHES_ELSEWHERE),
    );
}

#[test]
fn tidy_no_test_skips_under_ci() {
    fail_on("test skips", check_skips(&sources(&root(), "tests")));
}

#[test]
fn tidy_every_poll_in_the_tests_has_a_deadline() {
    fail_on(
        "polls without a deadline",
        check_polls(&sources(&root(), "tests"), UNBOUNDED_LOOPS),
    );
}

// ---------------------------------------------------------------------------------------
// The checks on synthetic violations: each reports what it must.

#[test]
fn tidy_checker_reports_a_long_function_and_skips_test_code() {
    let body = "    let x = 1;\n".repeat(MAX_FN_LINES);
    let src = format!(
        "fn long() {{\n{body}}}\nfn short() {{ }}\n#[cfg(test)]\nmod tests {{ fn long_test() {{\n{body}}} }}\n"
    );
    let found = long_fns("src/plan/compute/x.rs", &src);
    assert_eq!(found.len(), 1, "{found:?}");
    assert_eq!(found[0].0, "long");
    assert!(
        found[0]
            .1
            .contains(&format!("is {} lines", MAX_FN_LINES + 2)),
        "{found:?}"
    );
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("src/plan/compute");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("x.rs"), &src).unwrap();
    let found = check_fn_length(tmp.path(), &[]);
    assert!(found.len() == 1 && found[0].contains("`long`"), "{found:?}");
    assert!(check_fn_length(tmp.path(), &[("src/plan/compute/x.rs", "long", "why")]).is_empty());
    let stale = check_fn_length(tmp.path(), &[("src/plan/compute/x.rs", "short", "why")]);
    assert!(
        stale
            .iter()
            .any(|m| m.contains("`short`") && m.contains("delete its entry")),
        "{stale:?}"
    );
}

#[test]
fn tidy_checker_ratchets_file_length() {
    let files = vec![
        ("src/a.rs".to_string(), MAX_FILE_LINES + 1),
        ("src/b.rs".to_string(), 900),
        ("src/c.rs".to_string(), 700),
    ];
    let found = check_file_length(&files, &[("src/b.rs", 900)]);
    assert!(
        found.len() == 1 && found[0].starts_with("src/a.rs"),
        "{found:?}"
    );
    let grown = check_file_length(&files, &[("src/a.rs", 801), ("src/b.rs", 899)]);
    assert!(
        grown.len() == 1 && grown[0].contains("src/b.rs") && grown[0].contains("grown past"),
        "{grown:?}"
    );
    let shrunk = check_file_length(
        &files,
        &[("src/a.rs", 801), ("src/b.rs", 900), ("src/c.rs", 900)],
    );
    assert!(
        shrunk.len() == 1
            && shrunk[0].contains("src/c.rs")
            && shrunk[0].contains("delete its entry"),
        "{shrunk:?}"
    );
    assert!(is_test_file("src/plan/tests.rs") && is_test_file("src/plan/compute/memo_tests.rs"));
    assert!(!is_test_file("src/plan/render.rs"));
}

#[test]
fn tidy_checker_reports_missing_docs_drift() {
    let doc = "x\n**Documented modules:** `plan`, `approval`.\n";
    let lib = "#[warn(missing_docs)]\npub mod plan;\npub mod approval;\npub mod ops;\n";
    let documented = documented_in_code(lib, |m| {
        (m == "ops").then(|| "#![deny(missing_docs)]\n//! x\n".to_string())
    });
    assert_eq!(
        documented,
        BTreeSet::from(["plan".to_string(), "ops".to_string()])
    );
    let found = check_missing_docs(doc, &documented);
    assert_eq!(found.len(), 2, "{found:?}");
    assert!(
        found.iter().any(|m| m.starts_with("`approval`")),
        "{found:?}"
    );
    assert!(found.iter().any(|m| m.starts_with("`ops`")), "{found:?}");
    assert!(!check_missing_docs("no such line", &documented).is_empty());
}

#[test]
fn tidy_checker_reports_the_policy_matched_elsewhere() {
    let src = r#"
fn decide(s: Seen<'_, u8>) -> u8 {
    if matches!(s, Seen::Missing) { return 0; }
    match s {
        Seen::Got(t) => *t,
        Seen::Transient(_) | Seen::Failed(_) => 1,
        Seen::Missing => 2,
    }
}
fn build() -> Seen<'static, u8> { Seen::Missing }
fn nested(s: Seen<'_, u8>) { assert!(matches!(s, Seen::Got(_))); }
#[cfg(test)]
mod tests { fn t(s: Seen<'_, u8>) { let Seen::Got(_) = s else { return }; } }
"#;
    let files = vec![
        (
            "src/rollout/sequencer/stage.rs".to_string(),
            src.to_string(),
        ),
        (POLICY_FILE.to_string(), src.to_string()),
    ];
    let found = policy_matches(&files, "Seen");
    assert_eq!(
        found.get("src/rollout/sequencer/stage.rs"),
        Some(&6),
        "{found:?}"
    );
    let v = check_policy(&found, POLICY_FILE, &[]);
    assert!(
        v.len() == 1 && v[0].starts_with("src/rollout/sequencer/stage.rs"),
        "{v:?}"
    );
    assert!(
        check_policy(
            &found,
            POLICY_FILE,
            &[("src/rollout/sequencer/stage.rs", 6, "r")]
        )
        .is_empty()
    );
    let grew = check_policy(
        &found,
        POLICY_FILE,
        &[("src/rollout/sequencer/stage.rs", 5, "r")],
    );
    assert!(grew.len() == 1 && grew[0].contains("says 5"), "{grew:?}");
}

#[test]
fn tidy_checker_reports_a_silent_skip() {
    let bad = r#"
#[test]
fn needs_a_tool() {
    let Ok(t) = which("systemd-analyze") else {
        eprintln!("not installed: skipping");
        return;
    };
    run(t);
}
"#;
    let good = r#"
#[test]
fn needs_a_tool() {
    let Some(t) = crate::fixtures::tool_or_skip("systemd-analyze") else { return };
    run(t);
}
fn python() -> Option<&'static str> {
    assert!(std::env::var_os("CI").is_none(), "CI is set");
    eprintln!("skipped: no python");
    None
}
"#;
    let found = check_skips(&[("tests/it/x.rs".to_string(), bad.to_string())]);
    assert_eq!(found.len(), 2, "{found:?}");
    assert!(
        found.iter().any(|m| m.contains("returns early")),
        "{found:?}"
    );
    assert!(check_skips(&[("tests/it/x.rs".to_string(), good.to_string())]).is_empty());
}

#[test]
fn tidy_checker_reports_a_poll_without_a_deadline() {
    let bad = "async fn t() {\n    while sim.installing() {\n        tokio::time::sleep(MS).await;\n    }\n}\n";
    let good = "async fn t() {\n    let deadline = Instant::now() + PATIENCE;\n    while sim.installing() {\n        assert!(Instant::now() < deadline);\n        tokio::time::sleep(MS).await;\n    }\n}\n";
    let files = vec![("tests/it/x.rs".to_string(), bad.to_string())];
    let found = check_polls(&files, &[]);
    assert!(
        found.len() == 1 && found[0].starts_with("tests/it/x.rs:2:"),
        "{found:?}"
    );
    assert!(check_polls(&[("tests/it/x.rs".to_string(), good.to_string())], &[]).is_empty());
    assert!(
        check_polls(
            &files,
            &[("tests/it/x.rs", "while sim.installing()", "why")]
        )
        .is_empty()
    );
}
