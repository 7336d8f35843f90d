//! The architecture, checked on the parsed source (with `syn`, not by grepping text).
//!
//! Three rules, each over every non-test item of every file under `src/` (items behind
//! `#[cfg(test)]` or `#[test]`, and files declared by `#[cfg(test)] mod x;`, are skipped item by
//! item; code after them, or after a string such as `"http://…"`, is still checked):
//!
//! 1. **The module table.** `design/architecture.md`'s code map (the markdown table itself,
//!    parsed here so doc and test cannot drift) says which top-level module may use which. A
//!    reference to `crate::x…` (in a `use`, a path in code, or a path inside a macro call)
//!    from module `m` needs `x` in `m`'s "may depend on" column.
//! 2. **Pure modules** ([`PURE`]) mention no I/O, runtime, store (beyond a record's encoding,
//!    [`PURE_STORE_PATHS`]), RPC or HTTP stack and no clock ([`FORBIDDEN`], [`CLOCKS`]).
//! 3. **The map is the territory.** Every top-level module of `src/lib.rs` has a row, every row
//!    names a module that exists and has code (an item other than `mod`/`use`), and every
//!    [`PURE`] path exists.
//!
//! Code that breaks a rule today, while a branch of issue #21 moves it, is listed in
//! [`KNOWN_VIOLATIONS`]; the test fails on any other violation *and* on a listed one that no
//! longer occurs, so the list can only shrink. How to read a failure: CONTRIBUTING.md.
//!
//! The checker proves itself on a fixture tree (`tests/it/fixtures/architecture/`).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::path::{Path, PathBuf};

use proc_macro2::{TokenStream, TokenTree};
use syn::spanned::Spanned;
use syn::visit::{self, Visit};

/// Paths pure code must not mention (a reference matches when it starts with one of these).
const FORBIDDEN: &[&str] = &[
    "tokio",
    "std::fs",
    "std::net",
    // Pure code formats with `std::fmt`; `std::io` (its traits included) is I/O.
    "std::io",
    "std::process",
    "std::env",
    "std::thread",
    "std::os",
    "fjall",
    "tonic",
    "kube",
    "kube_client",
    "notify",
    "notify_debouncer_full",
    "reqwest",
    "hyper",
    "hyper_util",
];

/// Clocks: a path with one of these followed by `now` (`SystemTime::now`, `jiff::Timestamp::now`).
const CLOCKS: &[&str] = &["SystemTime", "Instant", "Timestamp", "Zoned"];

/// The pure modules (a file or a directory) and the files in them that are their documented
/// edge. Keep in step with the "Architecture invariants" of design/architecture.md.
const PURE: &[(&str, &[&str])] = &[
    // `source.rs` reads the directory or git revision (its module doc says so).
    ("src/desired", &["src/desired/source.rs"]),
    ("src/plan", &[]),
    // `sign.rs` is the signing adapter: key files, ssh-agent (see `src/approval/mod.rs`);
    // `allowed_signers/read.rs` the one reader of the allowed_signers file (issue #34).
    (
        "src/approval",
        &[
            "src/approval/sign.rs",
            "src/approval/allowed_signers/read.rs",
        ],
    ),
    // The rollout state machine and the journal's records, deltas and replay.
    ("src/rollout/sequencer", &[]),
    ("src/rollout/journal.rs", &[]),
];

/// A violation the tree still has while issue #21's branches move code: the file, the start
/// of the offending path (as written in [`Violation::import`]), and who removes it.
struct Known {
    file: &'static str,
    import: &'static str,
    removed_by: &'static str,
}

const fn known(file: &'static str, import: &'static str, removed_by: &'static str) -> Known {
    Known {
        file,
        import,
        removed_by,
    }
}

/// Tolerated today; each entry must still occur (the test says when one is gone: delete it).
const KNOWN_VIOLATIONS: &[Known] = &[];

// ---------------------------------------------------------------------------------------
// The checker.

/// One broken rule at one place.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct Violation {
    /// Relative to the crate root, `/`-separated.
    file: String,
    line: usize,
    /// The path as the code names it, resolved (`crate::cli::report::render_plain`), or the
    /// module/path a structural rule is about.
    import: String,
    rule: String,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}:{}: `{}`: {}",
            self.file, self.line, self.import, self.rule
        )
    }
}

/// One path a file mentions, resolved against the module it is written in.
#[derive(Debug, Clone)]
struct Reference {
    line: usize,
    /// `crate` first for paths into this crate, else the external crate's name first.
    segments: Vec<String>,
}

impl Reference {
    fn shown(&self) -> String {
        self.segments.join("::")
    }
}

/// A row of the code map: the module and the modules it may depend on.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Row {
    line: usize,
    may_use: BTreeSet<String>,
}

impl Row {
    /// `path` (after `crate::`) is allowed: its module is listed, or a listed path
    /// (`store::Record`) is a prefix of it, segment by segment.
    fn allows(&self, path: &[String]) -> bool {
        self.may_use.iter().any(|m| {
            let want: Vec<&str> = m.split("::").collect();
            want.len() <= path.len() && want.iter().zip(path).all(|(w, p)| *w == p)
        })
    }
}

/// The code-map table under `## Code map` in `doc`: the backticked names of the first column
/// (one row may name several modules), and of the third ("—" for none).
fn parse_table(doc: &str, doc_name: &str) -> Result<BTreeMap<String, Row>, String> {
    let mut rows = BTreeMap::new();
    let mut in_section = false;
    let mut seen_table = false;
    for (i, line) in doc.lines().enumerate() {
        let t = line.trim();
        if t.starts_with("## ") {
            if in_section && seen_table {
                break;
            }
            in_section = t == "## Code map";
            continue;
        }
        if !in_section || !t.starts_with('|') {
            if in_section && seen_table && !t.is_empty() && !t.starts_with('|') {
                break;
            }
            continue;
        }
        seen_table = true;
        let cells: Vec<&str> = t.trim_matches('|').split('|').map(str::trim).collect();
        if cells.len() != 3 {
            return Err(format!(
                "{doc_name}:{}: a code-map row needs 3 cells (module | owns | may depend on): {t}",
                i + 1
            ));
        }
        if cells[0] == "module" || cells[0].chars().all(|c| c == '-' || c == ':') {
            continue;
        }
        let names = backticked(cells[0]);
        if names.is_empty() {
            return Err(format!(
                "{doc_name}:{}: the first cell names no `module`: {t}",
                i + 1
            ));
        }
        let may_use: BTreeSet<String> = backticked(cells[2]).into_iter().collect();
        for n in names {
            if rows
                .insert(
                    n.clone(),
                    Row {
                        line: i + 1,
                        may_use: may_use.clone(),
                    },
                )
                .is_some()
            {
                return Err(format!("{doc_name}:{}: module `{n}` has two rows", i + 1));
            }
        }
    }
    if rows.is_empty() {
        return Err(format!("{doc_name} has no `## Code map` table"));
    }
    Ok(rows)
}

fn backticked(cell: &str) -> Vec<String> {
    cell.split('`')
        .skip(1)
        .step_by(2)
        .map(str::to_string)
        .collect()
}

/// True when the `cfg` predicate can only hold in a test build.
pub(crate) fn requires_test(meta: &syn::Meta) -> bool {
    match meta {
        syn::Meta::Path(p) => p.is_ident("test"),
        syn::Meta::List(l) => {
            let inner = l
                .parse_args_with(
                    syn::punctuated::Punctuated::<syn::Meta, syn::Token![,]>::parse_terminated,
                )
                .map(|p| p.into_iter().collect::<Vec<_>>())
                .unwrap_or_default();
            if l.path.is_ident("all") {
                inner.iter().any(requires_test)
            } else if l.path.is_ident("any") {
                !inner.is_empty() && inner.iter().all(requires_test)
            } else {
                false
            }
        }
        syn::Meta::NameValue(_) => false,
    }
}

/// `#[test]`, `#[cfg(test)]`, `#[cfg(all(test, …))]`.
pub(crate) fn test_only(attrs: &[syn::Attribute]) -> bool {
    attrs.iter().any(|a| {
        a.path().is_ident("test")
            || (a.path().is_ident("cfg")
                && a.parse_args::<syn::Meta>().is_ok_and(|m| requires_test(&m)))
    })
}

fn item_attrs(item: &syn::Item) -> &[syn::Attribute] {
    use syn::Item::*;
    match item {
        Const(i) => &i.attrs,
        Enum(i) => &i.attrs,
        ExternCrate(i) => &i.attrs,
        Fn(i) => &i.attrs,
        ForeignMod(i) => &i.attrs,
        Impl(i) => &i.attrs,
        Macro(i) => &i.attrs,
        Mod(i) => &i.attrs,
        Static(i) => &i.attrs,
        Struct(i) => &i.attrs,
        Trait(i) => &i.attrs,
        TraitAlias(i) => &i.attrs,
        Type(i) => &i.attrs,
        Union(i) => &i.attrs,
        Use(i) => &i.attrs,
        _ => &[],
    }
}

/// What one file says: the paths it mentions, the `mod x;` files it declares for tests only,
/// and whether it has code (an item other than `mod` and `use`).
#[derive(Default)]
struct FileFacts {
    /// Modules this file declares at its top level (`mod kube;`): a path starting with one
    /// of them is local, not the extern crate of the same name.
    local_mods: BTreeSet<String>,
    refs: Vec<Reference>,
    test_mods: Vec<String>,
    has_code: bool,
    /// The file's `//!` header, line by line (number, text after `//!`).
    header: Vec<(usize, String)>,
}

struct Collector {
    /// The module the visitor is in (`["plan", "stored"]`; empty at the crate root).
    module: Vec<String>,
    facts: FileFacts,
}

impl Collector {
    /// Resolve `segments` (as written, `leading` for `::x`) against the current module.
    fn record(&mut self, line: usize, leading: bool, segments: Vec<String>) {
        let Some(first) = segments.first() else {
            return;
        };
        let resolved = if leading {
            segments
        } else {
            match first.as_str() {
                "crate" => segments,
                m if self.facts.local_mods.contains(m) => {
                    let mut v = vec!["crate".to_string()];
                    v.extend(self.module.iter().cloned());
                    v.extend(segments);
                    v
                }
                "self" => {
                    let mut v = vec!["crate".to_string()];
                    v.extend(self.module.iter().cloned());
                    v.extend(segments.into_iter().skip(1));
                    v
                }
                "super" => {
                    let supers = segments.iter().take_while(|s| *s == "super").count();
                    let keep = self.module.len().saturating_sub(supers);
                    let mut v = vec!["crate".to_string()];
                    v.extend(self.module[..keep].iter().cloned());
                    v.extend(segments.into_iter().skip(supers));
                    v
                }
                _ => segments,
            }
        };
        self.facts.refs.push(Reference {
            line,
            segments: resolved,
        });
    }

    fn use_tree(&mut self, prefix: &mut Vec<String>, leading: bool, tree: &syn::UseTree) {
        match tree {
            syn::UseTree::Path(p) => {
                prefix.push(p.ident.to_string());
                self.use_tree(prefix, leading, &p.tree);
                prefix.pop();
            }
            syn::UseTree::Name(n) => {
                let mut v = prefix.clone();
                if n.ident != "self" {
                    v.push(n.ident.to_string());
                }
                self.record(n.ident.span().start().line, leading, v);
            }
            syn::UseTree::Rename(r) => {
                let mut v = prefix.clone();
                if r.ident != "self" {
                    v.push(r.ident.to_string());
                }
                self.record(r.ident.span().start().line, leading, v);
            }
            syn::UseTree::Glob(g) => {
                let v = prefix.clone();
                self.record(g.star_token.span().start().line, leading, v);
            }
            syn::UseTree::Group(g) => {
                for t in &g.items {
                    self.use_tree(prefix, leading, t);
                }
            }
        }
    }

    /// Paths inside a macro call's tokens (`format!("{}", std::env::args().count())`): runs
    /// of `ident :: ident …`. String literals are tokens of their own, never scanned.
    fn tokens(&mut self, tokens: TokenStream) {
        let trees: Vec<TokenTree> = tokens.into_iter().collect();
        let mut i = 0;
        while i < trees.len() {
            match &trees[i] {
                TokenTree::Group(g) => {
                    self.tokens(g.stream());
                    i += 1;
                }
                TokenTree::Ident(first) => {
                    let leading = i >= 2 && is_colon(&trees[i - 1]) && is_colon(&trees[i - 2]);
                    let mut segs = vec![first.to_string()];
                    let line = first.span().start().line;
                    let mut j = i + 1;
                    while j + 2 < trees.len() && is_colon(&trees[j]) && is_colon(&trees[j + 1]) {
                        if let TokenTree::Ident(next) = &trees[j + 2] {
                            segs.push(next.to_string());
                            j += 3;
                        } else {
                            break;
                        }
                    }
                    if segs.len() > 1 || leading {
                        self.record(line, leading, segs);
                    }
                    i = j;
                }
                _ => i += 1,
            }
        }
    }
}

fn is_colon(t: &TokenTree) -> bool {
    matches!(t, TokenTree::Punct(p) if p.as_char() == ':')
}

impl<'ast> Visit<'ast> for Collector {
    fn visit_item(&mut self, item: &'ast syn::Item) {
        if test_only(item_attrs(item)) {
            if let syn::Item::Mod(m) = item
                && m.content.is_none()
            {
                self.facts.test_mods.push(m.ident.to_string());
            }
            return;
        }
        if !matches!(
            item,
            syn::Item::Mod(_) | syn::Item::Use(_) | syn::Item::ExternCrate(_)
        ) && !matches!(item, syn::Item::Verbatim(_))
        {
            self.facts.has_code = true;
        }
        visit::visit_item(self, item);
    }

    fn visit_item_mod(&mut self, m: &'ast syn::ItemMod) {
        if let Some((_, items)) = &m.content {
            self.module.push(m.ident.to_string());
            for i in items {
                self.visit_item(i);
            }
            self.module.pop();
        }
    }

    fn visit_impl_item(&mut self, i: &'ast syn::ImplItem) {
        let attrs: &[syn::Attribute] = match i {
            syn::ImplItem::Const(x) => &x.attrs,
            syn::ImplItem::Fn(x) => &x.attrs,
            syn::ImplItem::Type(x) => &x.attrs,
            syn::ImplItem::Macro(x) => &x.attrs,
            _ => &[],
        };
        if !test_only(attrs) {
            visit::visit_impl_item(self, i);
        }
    }

    fn visit_trait_item(&mut self, i: &'ast syn::TraitItem) {
        let attrs: &[syn::Attribute] = match i {
            syn::TraitItem::Const(x) => &x.attrs,
            syn::TraitItem::Fn(x) => &x.attrs,
            syn::TraitItem::Type(x) => &x.attrs,
            syn::TraitItem::Macro(x) => &x.attrs,
            _ => &[],
        };
        if !test_only(attrs) {
            visit::visit_trait_item(self, i);
        }
    }

    fn visit_item_use(&mut self, u: &'ast syn::ItemUse) {
        self.use_tree(&mut Vec::new(), u.leading_colon.is_some(), &u.tree);
    }

    fn visit_path(&mut self, p: &'ast syn::Path) {
        let segs: Vec<String> = p.segments.iter().map(|s| s.ident.to_string()).collect();
        // A lone `kube` in code is a local name; a crate is named as `kube::…` or `::kube`.
        if segs.len() > 1 || p.leading_colon.is_some() {
            self.record(p.span().start().line, p.leading_colon.is_some(), segs);
        }
        visit::visit_path(self, p);
    }

    fn visit_macro(&mut self, m: &'ast syn::Macro) {
        self.visit_path(&m.path);
        self.tokens(m.tokens.clone());
    }

    // Doc comments are attributes whose text is prose, not code.
    fn visit_attribute(&mut self, _: &'ast syn::Attribute) {}
}

/// The module path of a file under `src/` (`src/plan/mod.rs` → `plan`), or `None` for a file
/// that is not part of the library (`src/main.rs`, the binary).
fn module_of(rel: &str) -> Option<Vec<String>> {
    let inner = rel.strip_prefix("src/")?.strip_suffix(".rs")?;
    if inner == "main" {
        return None;
    }
    let mut segs: Vec<String> = inner.split('/').map(str::to_string).collect();
    if matches!(segs.last().map(String::as_str), Some("mod" | "lib")) {
        segs.pop();
    }
    Some(segs)
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

/// Everything a check reads: a crate root with `src/`, its code-map doc, and its pure paths.
struct Tree<'a> {
    root: &'a Path,
    doc: &'a str,
    /// How messages name `doc`.
    doc_name: &'a str,
    pure: &'a [(&'a str, &'a [&'a str])],
}

/// Every violation of the three rules in `tree`, sorted.
fn check(tree: &Tree<'_>) -> Vec<Violation> {
    let mut out = Vec::new();
    let table = match parse_table(tree.doc, tree.doc_name) {
        Ok(t) => t,
        Err(e) => {
            out.push(Violation {
                file: tree.doc_name.into(),
                line: 0,
                import: "## Code map".into(),
                rule: e,
            });
            return out;
        }
    };

    // Parse every file; files declared `#[cfg(test)] mod x;` are test code.
    let mut files = Vec::new();
    rust_files(&tree.root.join("src"), &mut files);
    let rel = |p: &Path| {
        p.strip_prefix(tree.root)
            .unwrap_or(p)
            .to_string_lossy()
            .replace('\\', "/")
    };
    let mut parsed: BTreeMap<String, (Vec<String>, FileFacts)> = BTreeMap::new();
    for f in &files {
        let r = rel(f);
        let Some(module) = module_of(&r) else {
            continue;
        };
        let text = match std::fs::read_to_string(f) {
            Ok(t) => t,
            Err(e) => {
                out.push(Violation {
                    file: r,
                    line: 0,
                    import: String::new(),
                    rule: format!("cannot be read: {e}"),
                });
                continue;
            }
        };
        let ast = match syn::parse_file(&text) {
            Ok(a) => a,
            Err(e) => {
                out.push(Violation {
                    file: r,
                    line: e.span().start().line,
                    import: String::new(),
                    rule: format!("does not parse: {e}"),
                });
                continue;
            }
        };
        let mut c = Collector {
            module: module.clone(),
            facts: FileFacts::default(),
        };
        c.facts.local_mods = ast
            .items
            .iter()
            .filter_map(|i| match i {
                syn::Item::Mod(m) => Some(m.ident.to_string()),
                _ => None,
            })
            .collect();
        c.visit_file(&ast);
        c.facts.header = text
            .lines()
            .enumerate()
            .take_while(|(_, l)| l.starts_with("//!"))
            .map(|(i, l)| (i + 1, l.trim_start_matches("//!").trim().to_string()))
            .collect();
        parsed.insert(r, (module, c.facts));
    }
    let mut test_files = BTreeSet::new();
    for (r, (_, facts)) in &parsed {
        let dir = if r.ends_with("/mod.rs") || r == "src/lib.rs" {
            r.rsplit_once('/').map_or("", |(d, _)| d).to_string()
        } else {
            r.trim_end_matches(".rs").to_string()
        };
        for m in &facts.test_mods {
            test_files.insert(format!("{dir}/{m}.rs"));
            test_files.insert(format!("{dir}/{m}/mod.rs"));
        }
    }
    let prod: Vec<(&String, &Vec<String>, &FileFacts)> = parsed
        .iter()
        .filter(|(r, _)| {
            !test_files.contains(*r)
                && !test_files
                    .iter()
                    .any(|t| t.ends_with("/mod.rs") && r.starts_with(t.trim_end_matches("mod.rs")))
        })
        .map(|(r, (m, f))| (r, m, f))
        .collect();

    // 3. The map is the territory.
    let declared: BTreeSet<String> = prod
        .iter()
        .filter(|(_, m, _)| m.len() == 1)
        .map(|(_, m, _)| m[0].clone())
        .collect();
    for m in &declared {
        if !table.contains_key(m) {
            out.push(Violation {
                file: format!("src/{m}"),
                line: 0,
                import: m.clone(),
                rule: format!("a top-level module with no row in {}'s code map: add one (what it owns, what it may depend on)", tree.doc_name),
            });
        }
    }
    for (m, row) in &table {
        if !declared.contains(m) {
            out.push(Violation {
                file: tree.doc_name.into(),
                line: row.line,
                import: m.clone(),
                rule: format!(
                    "the code map lists `{m}`, but neither src/{m}.rs nor src/{m}/mod.rs exists"
                ),
            });
        } else if !prod
            .iter()
            .any(|(_, fm, f)| fm.first() == Some(m) && f.has_code)
        {
            out.push(Violation {
                file: format!("src/{m}"),
                line: 0,
                import: m.clone(),
                rule: format!("module `{m}` has no code (only `mod`/`use` items or none): fill it or drop its row"),
            });
        }
        for dep in &row.may_use {
            let top = dep.split("::").next().unwrap_or(dep);
            if !table.contains_key(top) {
                out.push(Violation {
                    file: tree.doc_name.into(),
                    line: row.line,
                    import: dep.clone(),
                    rule: format!("`{m}` may depend on `{dep}`, which has no row of its own"),
                });
            }
        }
    }
    for (path, edges) in tree.pure {
        for p in std::iter::once(path).chain(edges.iter()) {
            if !tree.root.join(p).exists() {
                out.push(Violation {
                    file: (*p).to_string(),
                    line: 0,
                    import: (*p).to_string(),
                    rule: "a pure path (or its documented edge) that does not exist: update PURE in tests/it/architecture.rs and design/architecture.md".into(),
                });
            }
        }
    }

    // 1. The module table.
    for (r, module, facts) in &prod {
        let Some(from) = module.first() else {
            continue; // the crate root declares the modules
        };
        let Some(row) = table.get(from) else {
            continue; // reported above
        };
        for reference in &facts.refs {
            let s = &reference.segments;
            if s.len() < 2 || s[0] != "crate" || &s[1] == from || !declared.contains(&s[1]) {
                continue;
            }
            if !row.allows(&s[1..]) {
                out.push(Violation {
                    file: (*r).clone(),
                    line: reference.line,
                    import: reference.shown(),
                    rule: format!(
                        "module `{from}` may not depend on `{}` ({}:{} allows {})",
                        s[1],
                        tree.doc_name,
                        row.line,
                        if row.may_use.is_empty() {
                            "nothing".to_string()
                        } else {
                            row.may_use
                                .iter()
                                .map(|m| format!("`{m}`"))
                                .collect::<Vec<_>>()
                                .join(", ")
                        }
                    ),
                });
            }
        }
    }

    // 2. Pure modules.
    for (r, _, facts) in &prod {
        let Some((scope, _)) = tree.pure.iter().find(|(p, edges)| {
            (r.as_str() == *p || r.starts_with(&format!("{p}/"))) && !edges.contains(&r.as_str())
        }) else {
            continue;
        };
        for reference in &facts.refs {
            if let Some(why) = impure(&reference.segments) {
                out.push(Violation {
                    file: (*r).clone(),
                    line: reference.line,
                    import: reference.shown(),
                    rule: format!(
                        "{scope} is pure: {why}; pass the value in, or move the I/O to `ops` or an adapter"
                    ),
                });
            }
        }
    }
    // 4. Module headers keep no second copy of the map.
    for (r, module, facts) in &prod {
        let Some(from) = module.first() else {
            continue;
        };
        let Some(row) = table.get(from) else {
            continue;
        };
        let Some((line, says)) = may_depend_on(&facts.header) else {
            continue;
        };
        // the other top-level modules the paragraph names, as paths after `crate::`
        let named: Vec<Vec<String>> = backticked(&says)
            .iter()
            .map(|b| {
                b.trim_start_matches("crate::")
                    .split("::")
                    .map(str::to_string)
                    .collect::<Vec<_>>()
            })
            .filter(|segs| &segs[0] != from && table.contains_key(&segs[0]))
            .collect();
        if module.len() == 1 {
            if !says.contains(tree.doc_name) || !named.is_empty() {
                out.push(Violation {
                    file: (*r).clone(),
                    line,
                    import: "May depend on".into(),
                    rule: format!(
                        "a top-level module's header points at the `{from}` row of {}'s code map instead of listing modules (a second copy drifts){}",
                        tree.doc_name,
                        if named.is_empty() {
                            String::new()
                        } else {
                            format!(
                                "; it names {}",
                                named
                                    .iter()
                                    .map(|s| format!("`{}`", s.join("::")))
                                    .collect::<Vec<_>>()
                                    .join(", ")
                            )
                        }
                    ),
                });
            }
        } else {
            for segs in named {
                if !row.allows(&segs) {
                    out.push(Violation {
                        file: (*r).clone(),
                        line,
                        import: segs.join("::"),
                        rule: format!(
                            "the header says `{}` may depend on `{}`, but {}:{} does not allow it for `{from}`",
                            module.join("::"),
                            segs.join("::"),
                            tree.doc_name,
                            row.line
                        ),
                    });
                }
            }
        }
    }
    out.sort();
    out.dedup();
    out
}

/// The header's `**May depend on:**` paragraph: its line and its text up to the next bold
/// label (`**Used by:**`), blank line or `Architecture Invariant`.
fn may_depend_on(header: &[(usize, String)]) -> Option<(usize, String)> {
    const MARK: &str = "**May depend on:**";
    let start = header.iter().position(|(_, l)| l.contains(MARK))?;
    let (line, first) = &header[start];
    let mut says = first[first.find(MARK)? + MARK.len()..].to_string();
    for (_, l) in &header[start + 1..] {
        if l.is_empty() || l.starts_with("**") || l.starts_with("Architecture Invariant") {
            break;
        }
        says.push(' ');
        says.push_str(l);
    }
    if let Some(end) = says.find("**") {
        says.truncate(end);
    }
    Some((*line, says))
}

/// What pure code may name of `crate::store`: a record type declares its encoding (the
/// `Record` trait, its `Table`, `record::encode`) where it is defined, and a pure function may
/// build a transaction as a value, without touching a store.
const PURE_STORE_PATHS: &[&str] = &[
    "crate::store::Record",
    "crate::store::Table",
    "crate::store::record",
    // A transaction as a value; committing it needs a `Store`.
    "crate::store::Txn",
    "crate::store::Check",
    "crate::store::Op",
    // The error a record's decoding returns (`store::record::decode`).
    "crate::store::StoreError",
];

/// Why a path is not allowed in pure code, if it is not.
fn impure(segments: &[String]) -> Option<String> {
    let joined = segments.join("::");
    if (joined == "crate::store" || joined.starts_with("crate::store::"))
        && !PURE_STORE_PATHS
            .iter()
            .any(|p| joined == *p || joined.starts_with(&format!("{p}::")))
    {
        return Some("no store (only a record's encoding and a transaction as a value)".into());
    }
    for f in FORBIDDEN {
        if joined == *f || joined.starts_with(&format!("{f}::")) {
            return Some(format!("no `{f}`"));
        }
    }
    for w in segments.windows(2) {
        if w[1] == "now" && CLOCKS.contains(&w[0].as_str()) {
            return Some(format!("no clock (`{}::now`)", w[0]));
        }
    }
    None
}

/// The violations `known` does not cover, and the `known` entries that match nothing.
fn triage(found: &[Violation], known: &[Known]) -> (Vec<String>, Vec<String>) {
    let matches = |k: &Known, v: &Violation| {
        v.file == k.file
            && (v.import == k.import || v.import.starts_with(&format!("{}::", k.import)))
    };
    let new = found
        .iter()
        .filter(|v| !known.iter().any(|k| matches(k, v)))
        .map(ToString::to_string)
        .collect();
    let gone = known
        .iter()
        .filter(|k| !found.iter().any(|v| matches(k, v)))
        .map(|k| {
            format!(
                "{}: `{}` (was to be removed by `{}`)",
                k.file, k.import, k.removed_by
            )
        })
        .collect();
    (new, gone)
}

// ---------------------------------------------------------------------------------------
// The tests.

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

#[test]
fn the_code_follows_design_architecture_md() {
    let root = root();
    let doc = std::fs::read_to_string(root.join("design/architecture.md")).unwrap();
    let found = check(&Tree {
        root: &root,
        doc: &doc,
        doc_name: "design/architecture.md",
        pure: PURE,
    });
    let (new, gone) = triage(&found, KNOWN_VIOLATIONS);
    assert!(
        new.is_empty(),
        "architecture violations (see design/architecture.md and CONTRIBUTING.md, \"When the architecture test fails\"):\n  {}",
        new.join("\n  ")
    );
    assert!(
        gone.is_empty(),
        "these KNOWN_VIOLATIONS no longer occur: delete them from tests/it/architecture.rs so the list stays exact:\n  {}",
        gone.join("\n  ")
    );
}

/// The checker on `tests/it/fixtures/architecture/`: exactly the violations planted there.
#[test]
fn the_checker_finds_every_planted_violation_and_nothing_else() {
    let root = root().join("tests/it/fixtures/architecture");
    let doc = std::fs::read_to_string(root.join("architecture.md")).unwrap();
    let found: Vec<Violation> = check(&Tree {
        root: &root,
        doc: &doc,
        doc_name: "architecture.md",
        pure: &[
            ("src/domain", &["src/domain/io.rs"]),
            ("src/missing.rs", &[]),
        ],
    });
    // (where, the path or module, a phrase of the rule)
    let expected: &[(&str, &str, &str)] = &[
        (
            "architecture.md:11",
            "ghost",
            "neither src/ghost.rs nor src/ghost/mod.rs exists",
        ),
        // after a `#[cfg(test)] mod` and after a `"http://…"` literal: still checked
        // a submodule's header names a module its top-level row does not allow (`base` it does)
        (
            "src/domain/header.rs:1",
            "edge::e",
            "the header says `domain::header` may depend on `edge::e`, but architecture.md:8",
        ),
        ("src/domain/io.rs:0", "src/domain/io.rs", "does not exist"),
        ("src/domain/mod.rs:15", "std::fs::read", "no `std::fs`"),
        (
            "src/domain/mod.rs:19",
            "std::net::TcpStream::connect",
            "no `std::net`",
        ),
        // comments, strings and `notify_all` are not `tokio` or `notify`
        ("src/domain/mod.rs:31", "tokio::time::sleep", "no `tokio`"),
        ("src/domain/mod.rs:32", "jiff::Timestamp::now", "no clock"),
        ("src/domain/mod.rs:35", "kube::Api", "no `kube`"),
        (
            "src/domain/rules.rs:2",
            "crate::edge::e",
            "module `domain` may not depend on `edge` (architecture.md:8 allows `base`, `store`)",
        ),
        ("src/domain/rules.rs:3", "std::io::Write", "no `std::io`"),
        ("src/domain/rules.rs:7", "Instant::now", "no clock"),
        // inside a macro call's tokens
        ("src/domain/rules.rs:12", "std::env::args", "no `std::env`"),
        // `cfg(not(test))` is production code
        (
            "src/domain/rules.rs:22",
            "std::thread::yield_now",
            "no `std::thread`",
        ),
        // `super::super::edge` resolves to `crate::edge`
        (
            "src/domain/rules.rs:26",
            "crate::edge::e",
            "may not depend on `edge`",
        ),
        ("src/domain/rules.rs:35", "fjall::Config::new", "no `fjall`"),
        // the table allows `store`, purity only a record's encoding
        ("src/domain/rules.rs:40", "crate::store::Store", "no store"),
        // `store::Record` is allowed, the rest of `store` is not
        (
            "src/edge.rs:4",
            "crate::store::Store",
            "module `edge` may not depend on `store`",
        ),
        ("src/empty:0", "empty", "has no code"),
        ("src/missing.rs:0", "src/missing.rs", "does not exist"),
        // a top-level header that copies the map (`base.rs` points at it: no finding)
        (
            "src/store.rs:1",
            "May depend on",
            "points at the `store` row of architecture.md's code map instead of listing modules (a second copy drifts); it names `base`",
        ),
        ("src/unlisted:0", "unlisted", "no row"),
    ];
    let got: Vec<(String, &str)> = found
        .iter()
        .map(|v| (format!("{}:{}", v.file, v.line), v.import.as_str()))
        .collect();
    let want: Vec<(String, &str)> = expected
        .iter()
        .map(|(at, import, _)| (at.to_string(), *import))
        .collect();
    assert_eq!(
        got,
        want,
        "the checker's findings on the fixture:\n{}",
        found
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join("\n")
    );
    for (v, (_, _, phrase)) in found.iter().zip(expected) {
        assert!(v.rule.contains(phrase), "{v}\n  should say: {phrase}");
    }
}

/// A forbidden path added to a copy of a real pure file is reported, at its line.
#[test]
fn a_new_import_in_a_pure_module_is_reported() {
    let root = root();
    let doc = std::fs::read_to_string(root.join("design/architecture.md")).unwrap();
    let tmp = tempfile::tempdir().unwrap();
    crate::fixtures::copy_dir(&root.join("src"), &tmp.path().join("src"));
    let target = tmp.path().join("src/plan/render.rs");
    let mut text = std::fs::read_to_string(&target).unwrap();
    assert!(text.ends_with('\n'));
    // after a blank line and the `fn` line
    let line = text.lines().count() + 3;
    text.push_str("\npub fn sneaky() -> bool {\n    tokio::task::id() == tokio::task::id()\n}\n");
    std::fs::write(&target, text).unwrap();
    let tree = Tree {
        root: tmp.path(),
        doc: &doc,
        doc_name: "design/architecture.md",
        pure: PURE,
    };
    let found = check(&tree);
    let at: Vec<&Violation> = found
        .iter()
        .filter(|v| v.file == "src/plan/render.rs")
        .collect();
    assert!(
        at.iter().any(|v| v.line == line
            && v.import == "tokio::task::id"
            && v.rule.contains("no `tokio`")),
        "{found:#?}"
    );
}

/// A known violation covers its file and path prefix only, and one that no longer occurs is
/// reported (so `KNOWN_VIOLATIONS` stays exact).
#[test]
fn known_violations_cover_exactly_what_they_name() {
    let v = |file: &str, import: &str| Violation {
        file: file.into(),
        line: 1,
        import: import.into(),
        rule: "r".into(),
    };
    let found = [
        v("src/a.rs", "crate::b::c"),
        v("src/a.rs", "crate::bb"),
        v("src/x.rs", "crate::b::c"),
    ];
    let known = [
        known("src/a.rs", "crate::b", "test"),
        known("src/gone.rs", "crate::b", "test"),
    ];
    let (new, gone) = triage(&found, &known);
    assert_eq!(
        new,
        ["src/a.rs:1: `crate::bb`: r", "src/x.rs:1: `crate::b::c`: r"]
    );
    assert_eq!(
        gone,
        ["src/gone.rs: `crate::b` (was to be removed by `test`)"]
    );
}
