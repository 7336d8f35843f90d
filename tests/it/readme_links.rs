//! Issue #52 item 4: every link of README.md resolves — a relative file it names exists, and an
//! anchor (`#section`, `design/x.md#section`) names a heading of that file, by GitHub's rule for
//! heading anchors (lower case; letters, digits, `-`, `_` and spaces kept, spaces made `-`; a
//! repeated anchor gets `-1`, `-2`…). External links (`http…`, `mailto:`) are not followed:
//! the tests run without a network.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The lines of a Markdown file outside fenced code blocks.
fn prose(text: &str) -> Vec<&str> {
    let mut fence = false;
    let mut out = Vec::new();
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fence = !fence;
            continue;
        }
        if !fence {
            out.push(line);
        }
    }
    out
}

/// GitHub's anchor of a heading's text.
fn slug(heading: &str) -> String {
    heading
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || matches!(c, '-' | '_' | ' '))
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

/// Every anchor the headings of `text` make.
fn anchors(text: &str) -> BTreeSet<String> {
    let mut seen: std::collections::BTreeMap<String, usize> = Default::default();
    let mut out = BTreeSet::new();
    for line in prose(text) {
        let Some(rest) = line.strip_prefix('#') else {
            continue;
        };
        let heading = rest.trim_start_matches('#');
        if !heading.starts_with(' ') {
            continue;
        }
        let s = slug(heading.trim());
        let n = seen.entry(s.clone()).or_insert(0);
        out.insert(if *n == 0 {
            s.clone()
        } else {
            format!("{s}-{n}")
        });
        *n += 1;
    }
    out
}

/// The targets of the inline links `[text](target)` of `text`'s prose.
fn links(text: &str) -> Vec<String> {
    let re = regex::Regex::new(r"\]\(([^)\s]+)\)").unwrap();
    prose(text)
        .iter()
        .flat_map(|l| {
            re.captures_iter(l)
                .map(|c| c[1].to_string())
                .collect::<Vec<_>>()
        })
        .collect()
}

/// What is wrong with `target`, linked from `from` (a file of the repository).
fn broken(from: &Path, target: &str) -> Option<String> {
    if target.starts_with("http://")
        || target.starts_with("https://")
        || target.starts_with("mailto:")
    {
        return None;
    }
    let (file, anchor) = match target.split_once('#') {
        Some((f, a)) => (f, Some(a)),
        None => (target, None),
    };
    let path = if file.is_empty() {
        from.to_path_buf()
    } else {
        from.parent().unwrap().join(file)
    };
    if !path.exists() {
        return Some(format!("`{target}`: {} does not exist", path.display()));
    }
    let anchor = anchor?;
    if path.is_dir() {
        return Some(format!("`{target}`: an anchor into a directory"));
    }
    let text = std::fs::read_to_string(&path).unwrap();
    (!anchors(&text).contains(anchor)).then(|| {
        format!(
            "`{target}`: {} has no heading with anchor `#{anchor}`",
            path.display()
        )
    })
}

#[test]
fn every_link_and_anchor_of_the_readme_resolves() {
    let readme = root().join("README.md");
    let text = std::fs::read_to_string(&readme).unwrap();
    let all = links(&text);
    assert!(
        all.iter().any(|l| l.starts_with('#')) && all.iter().any(|l| l.starts_with("design/")),
        "the README links its own sections (its table of contents) and design pages: {all:?}"
    );
    let bad: Vec<String> = all.iter().filter_map(|l| broken(&readme, l)).collect();
    assert!(
        bad.is_empty(),
        "README.md has broken links:\n  {}",
        bad.join("\n  ")
    );
}

#[test]
fn the_readme_table_of_contents_lists_every_section() {
    let text = std::fs::read_to_string(root().join("README.md")).unwrap();
    let listed: BTreeSet<String> = links(&text)
        .into_iter()
        .filter_map(|l| l.strip_prefix('#').map(str::to_string))
        .collect();
    let sections: Vec<String> = prose(&text)
        .into_iter()
        .filter_map(|l| l.strip_prefix("## ").or_else(|| l.strip_prefix("### ")))
        .filter(|h| *h != "Contents")
        .map(slug)
        .collect();
    let missing: Vec<&String> = sections.iter().filter(|s| !listed.contains(*s)).collect();
    assert!(
        missing.is_empty(),
        "sections missing from README's Contents: {missing:?}"
    );
}

/// The checker itself: a broken file, a broken anchor and a good anchor into another file.
#[test]
fn the_link_checker_finds_what_is_broken() {
    let readme = root().join("README.md");
    assert!(broken(&readme, "design/no-such-page.md").is_some());
    assert!(broken(&readme, "#no-such-section").is_some());
    assert!(
        broken(
            &readme,
            "design/observation.md#what-each-observation-reads-for-the-preflight-checks"
        )
        .is_none()
    );
    assert_eq!(
        slug("Add a cluster: `medea seed`"),
        "add-a-cluster-medea-seed"
    );
    assert!(broken(&readme, "https://example.com/anything").is_none());
}
