//! Layering rules, checked on the source text (after rust-analyzer's `tidy.rs`): the domain
//! modules are pure: no async runtime, filesystem, network, store backend, RPC stack,
//! Kubernetes client, file watcher or clock.

use std::path::{Path, PathBuf};

/// What pure code must not mention.
const FORBIDDEN: &[&str] = &[
    "tokio",
    "std::fs",
    "std::net",
    "fjall",
    "tonic",
    "::kube",
    "notify",
    "SystemTime::now",
    "Instant::now",
    "Timestamp::now",
    "Zoned::now",
];

/// Pure modules (directories or files) and their documented I/O edges.
const PURE: &[(&str, &[&str])] = &[
    // `source.rs` reads the directory or git revision (its module doc says so)
    ("src/desired", &["src/desired/source.rs"]),
    ("src/plan", &[]),
    // `sign.rs` is the signing adapter: key files, ssh-agent (see `src/approval/mod.rs`)
    ("src/approval", &["src/approval/sign.rs"]),
    ("src/rollout/sequencer", &[]),
    ("src/rollout/journal.rs", &[]),
];

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn rust_files(path: &Path, out: &mut Vec<PathBuf>) {
    if path.is_file() {
        if path.extension().is_some_and(|e| e == "rs") {
            out.push(path.to_path_buf());
        }
        return;
    }
    let Ok(entries) = std::fs::read_dir(path) else {
        return;
    };
    let mut entries: Vec<_> = entries.map(|e| e.unwrap().path()).collect();
    entries.sort();
    for e in entries {
        rust_files(&e, out);
    }
}

/// The code of a file that the rule applies to: up to its unit tests, without comments.
fn production_code(text: &str) -> Vec<(usize, &str)> {
    text.lines()
        .enumerate()
        .take_while(|(_, l)| l.trim() != "#[cfg(test)]")
        .map(|(i, l)| (i + 1, l.split("//").next().unwrap_or("")))
        .collect()
}

fn ident(c: Option<char>) -> bool {
    c.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// `word` occurs in `code` as a whole path segment (`::kube::Api`, not `::kubernetes`).
fn mentions(code: &str, word: &str) -> bool {
    code.match_indices(word).any(|(i, _)| {
        let before = code[..i].chars().next_back();
        let after = code[i + word.len()..].chars().next();
        let starts_ident = word
            .chars()
            .next()
            .is_some_and(|c| c.is_ascii_alphanumeric());
        let glued_before = starts_ident && ident(before);
        !glued_before && !ident(after)
    })
}

fn violations(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    for (line, code) in production_code(text) {
        for word in FORBIDDEN {
            if mentions(code, word) {
                out.push(format!("{line}: `{word}` in `{}`", code.trim()));
            }
        }
    }
    out
}

#[test]
fn domain_modules_are_pure() {
    let root = root();
    let mut problems = Vec::new();
    let mut checked = 0;
    for (module, exceptions) in PURE {
        let mut files = Vec::new();
        rust_files(&root.join(module), &mut files);
        for f in files {
            let rel = f
                .strip_prefix(&root)
                .unwrap()
                .to_string_lossy()
                .replace('\\', "/");
            if exceptions.contains(&rel.as_str()) {
                continue;
            }
            checked += 1;
            let text = std::fs::read_to_string(&f).unwrap();
            for v in violations(&text) {
                problems.push(format!("{rel}:{v}"));
            }
        }
    }
    assert!(
        checked >= 3,
        "the pure modules were found ({checked} files)"
    );
    assert!(
        problems.is_empty(),
        "pure domain code must not do I/O or read the clock; pass time and observations in:\n{}",
        problems.join("\n")
    );
}

#[test]
fn the_rule_catches_what_it_should() {
    let bad = "use tokio::time::sleep;\nfn f() { let _ = std::fs::read(\"x\"); let t = jiff::Timestamp::now(); }\n";
    let v = violations(bad);
    assert!(v.iter().any(|v| v.contains("`tokio`")), "{v:?}");
    assert!(v.iter().any(|v| v.contains("`std::fs`")), "{v:?}");
    assert!(v.iter().any(|v| v.contains("`Timestamp::now`")), "{v:?}");
    assert!(!violations("use ::kube::Api;\n").is_empty());
    // comments, unit tests and longer names do not count
    let fine = "// tokio is not used here\nfn f() {}\nconst C: &str = \"medea::plan::kubernetes-skew\";\nfn notify_all() {}\n#[cfg(test)]\nmod tests { use tokio; }\n";
    assert!(violations(fine).is_empty(), "{:?}", violations(fine));
}
