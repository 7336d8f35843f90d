//! Component-image edits of a node's machine configuration that change the image and nothing
//! else.
//!
//! The configuration is never decoded and re-encoded: serde-saphyr's YAML 1.1-lenient reading
//! would turn `permissions: 0644` into `644` and a string `off` into `false`, and Talos would
//! apply that live. Instead the image scalar is located by its source span (as
//! [`crate::desired::edit`] does for desired state) and replaced in the text; when the node has
//! no such field, one line (or a small block) is inserted into the mapping that should hold it.
//! [`check_only_image_changed`] then proves, before `ApplyConfiguration`, that the result differs
//! from the original only there.
//!
//! Where the image lives is what `talosctl upgrade-k8s` patches (siderolabs/talos
//! `pkg/cluster/kubernetes/talos_managed.go`, `patchNodeConfig` + the per-component
//! `upgradeStaticPodPatcher` / `upgradeKubeletPatcher`): the component's own document
//! (`KubeAPIServerConfig`, …, Talos 1.14) when the configuration has one, else the v1alpha1
//! field (`cluster.apiServer.image`, `machine.kubelet.image`, …).

use serde::Deserialize;
use serde_saphyr::{Location, Spanned};

use super::{MachineConfigError, expected_docs, image_location, parse_docs};
use crate::desired::edit;
use crate::desired::parse::{DocText, split_documents};
use crate::rollout::ports::Component;

/// A value whose position is kept (any YAML; `null` when written empty).
type At = Spanned<serde_json::Value>;

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct DocView {
    #[serde(default)]
    version: Option<serde_json::Value>,
    #[serde(default)]
    kind: Option<serde_json::Value>,
    #[serde(default)]
    image: Option<At>,
    #[serde(default, deserialize_with = "present")]
    machine: Option<Spanned<Option<Section>>>,
    #[serde(default, deserialize_with = "present")]
    cluster: Option<Spanned<Option<Section>>>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Section {
    #[serde(default, deserialize_with = "present")]
    kubelet: Option<Spanned<Option<Holder>>>,
    #[serde(default, deserialize_with = "present")]
    api_server: Option<Spanned<Option<Holder>>>,
    #[serde(default, deserialize_with = "present")]
    controller_manager: Option<Spanned<Option<Holder>>>,
    #[serde(default, deserialize_with = "present")]
    scheduler: Option<Spanned<Option<Holder>>>,
    #[serde(default, deserialize_with = "present")]
    proxy: Option<Spanned<Option<Holder>>>,
}

impl Section {
    fn get(&self, field: &str) -> Option<&Spanned<Option<Holder>>> {
        match field {
            "kubelet" => self.kubelet.as_ref(),
            "apiServer" => self.api_server.as_ref(),
            "controllerManager" => self.controller_manager.as_ref(),
            "scheduler" => self.scheduler.as_ref(),
            "proxy" => self.proxy.as_ref(),
            _ => None,
        }
    }
}

#[derive(Debug, Deserialize)]
struct Holder {
    #[serde(default)]
    image: Option<At>,
}

/// A key written with an empty (null) value is present, unlike a missing key: `Some(None)`.
fn present<'de, D, T>(d: D) -> Result<Option<Spanned<Option<T>>>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: Deserialize<'de>,
{
    Spanned::<Option<T>>::deserialize(d).map(Some)
}

fn options() -> serde_saphyr::Options {
    serde_saphyr::options! { with_snippet: false }
}

fn view(doc: &DocText<'_>) -> Result<Spanned<DocView>, MachineConfigError> {
    serde_saphyr::from_str_with_options(doc.text, options()).map_err(|e| {
        let loc = e.location();
        MachineConfigError::Yaml {
            line: loc.map(|l| l.line() + doc.line as u64),
            column: loc.map(|l| l.column()),
        }
    })
}

fn is_v1alpha1_view(d: &DocView) -> bool {
    d.version.as_ref().and_then(|v| v.as_str()) == Some("v1alpha1") && d.kind.is_none()
}

/// An image reference is written without quotes or escapes; anything else is refused so the
/// edit can never change the YAML structure around it.
fn check_image(image: &str) -> Result<(), MachineConfigError> {
    let ok = !image.is_empty()
        && image
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-' | '/' | ':' | '@'))
        && !image.starts_with(['-', ':', '@']);
    if ok {
        Ok(())
    } else {
        Err(MachineConfigError::BadImage {
            image: image.to_string(),
        })
    }
}

/// The machine configuration with `component`'s image set to `image`, where the node keeps it
/// (its own document if the configuration has one, else the v1alpha1 field, added if missing),
/// as `talosctl upgrade-k8s` patches it. Every other byte is kept: comments, quoting, octal
/// modes, `on`/`off` strings, anchors, other documents.
pub fn set_component_image_in(
    yaml: &[u8],
    component: Component,
    image: &str,
) -> Result<Vec<u8>, MachineConfigError> {
    check_image(image)?;
    let text = std::str::from_utf8(yaml).map_err(|_| MachineConfigError::Yaml {
        line: None,
        column: None,
    })?;
    let (kind, [section, field]) = image_location(component);
    let docs = split_documents("machine config", text);
    let mut views = Vec::with_capacity(docs.len());
    for d in &docs {
        views.push(view(d)?);
    }
    // the component's own document wins, as on the node
    if let Some(i) = views
        .iter()
        .position(|v| v.value.kind.as_ref().and_then(|k| k.as_str()) == Some(kind))
    {
        let doc = &docs[i];
        let out = match &views[i].value.image {
            Some(img) => replace_image(text, doc, img, kind)?,
            None => insert_keys(text, doc, &views[i].referenced, &["image"], kind)?,
        };
        return finish(out, image, text);
    }
    let i = views
        .iter()
        .position(|v| is_v1alpha1_view(&v.value))
        .ok_or(MachineConfigError::NoV1alpha1)?;
    let (doc, root) = (&docs[i], &views[i]);
    let sec = match section {
        "machine" => root.value.machine.as_ref(),
        _ => root.value.cluster.as_ref(),
    };
    let out = match sec {
        None => insert_keys(
            text,
            doc,
            &root.referenced,
            &[section, field, "image"],
            section,
        )?,
        Some(Spanned { value: None, .. }) => {
            return Err(MachineConfigError::NotAMapping {
                path: section.to_string(),
            });
        }
        Some(Spanned {
            value: Some(s),
            referenced,
            ..
        }) => {
            let path = format!("{section}.{field}");
            match s.get(field) {
                None => insert_keys(text, doc, referenced, &[field, "image"], &path)?,
                Some(Spanned { value: None, .. }) => {
                    return Err(MachineConfigError::NotAMapping { path });
                }
                Some(Spanned {
                    value: Some(h),
                    referenced,
                    ..
                }) => match &h.image {
                    Some(img) => replace_image(text, doc, img, &format!("{path}.image"))?,
                    None => insert_keys(text, doc, referenced, &["image"], &path)?,
                },
            }
        }
    };
    finish(out, image, text)
}

/// The edit, with the new image in the place the edit reserved (`\0` marks it).
struct Edit {
    start: usize,
    end: usize,
    with: String,
}

fn finish(e: Edit, image: &str, text: &str) -> Result<Vec<u8>, MachineConfigError> {
    let mut out = String::with_capacity(text.len() + e.with.len() + image.len());
    out.push_str(&text[..e.start]);
    out.push_str(&e.with.replace('\0', image));
    out.push_str(&text[e.end..]);
    Ok(out.into_bytes())
}

fn not_editable(path: &str, reason: &'static str) -> MachineConfigError {
    MachineConfigError::NotEditable {
        path: path.to_string(),
        reason,
    }
}

/// Replace the image scalar (plain or quoted, or an alias to one) by the new image.
fn replace_image(
    text: &str,
    doc: &DocText<'_>,
    img: &At,
    path: &str,
) -> Result<Edit, MachineConfigError> {
    let current = match &img.value {
        serde_json::Value::String(s) => s.clone(),
        serde_json::Value::Null => {
            return Err(not_editable(
                path,
                "it is empty (null); remove the key or give it the current image",
            ));
        }
        _ => return Err(not_editable(path, "it is not a string")),
    };
    let at = doc.origin(&img.referenced);
    let rest = text.get(at.offset..).unwrap_or("");
    if rest.starts_with('*') {
        // `image: *name`: replace this reference only; the anchored value stays for the others
        let len = rest
            .find(|c: char| c.is_whitespace() || matches!(c, ',' | '}' | ']'))
            .unwrap_or(rest.len());
        return Ok(Edit {
            start: at.offset,
            end: at.offset + len,
            with: "\0".to_string(),
        });
    }
    // `replace_scalar` checks the text at the span is the value it replaces
    let marked = edit::replace_scalar(text, &at, &current, "\0").map_err(|_| {
        not_editable(
            path,
            "it is not a plain or simply quoted scalar (block scalar, escapes or a tag)",
        )
    })?;
    let start = marked
        .find('\0')
        .ok_or_else(|| not_editable(path, "edit"))?;
    Ok(Edit {
        start,
        end: start + (text.len() + 1 - marked.len()),
        with: "\0".to_string(),
    })
}

/// Insert `keys[0]: keys[1]: …: <image>` as the first entry of the mapping at `map`.
fn insert_keys(
    text: &str,
    doc: &DocText<'_>,
    map: &Location,
    keys: &[&str],
    path: &str,
) -> Result<Edit, MachineConfigError> {
    let at = doc.origin(map);
    let rest = text.get(at.offset..).unwrap_or("");
    if let Some(inner) = rest.strip_prefix('{') {
        // flow mapping: `{a: 1}` → `{image: x, a: 1}`
        let mut value = "\0".to_string();
        for k in keys.iter().skip(1).rev() {
            value = format!("{{{k}: {value}}}");
        }
        let empty = inner.trim_start().starts_with('}');
        let sep = if empty { "" } else { ", " };
        return Ok(Edit {
            start: at.offset + 1,
            end: at.offset + 1,
            with: format!("{}: {value}{sep}", keys[0]),
        });
    }
    let line_start = text[..at.offset].rfind('\n').map_or(0, |p| p + 1);
    let indent = &text[line_start..at.offset];
    if !indent.chars().all(|c| c == ' ') {
        return Err(not_editable(
            path,
            "its mapping does not start on a line of its own",
        ));
    }
    let mut with = String::new();
    for (depth, k) in keys.iter().enumerate() {
        with.push_str(indent);
        with.push_str(&"  ".repeat(depth));
        with.push_str(k);
        with.push(':');
        if depth + 1 == keys.len() {
            with.push_str(" \0");
        }
        with.push('\n');
    }
    Ok(Edit {
        start: line_start,
        end: line_start,
        with,
    })
}

/// Refuse `new` unless it is `old` with `component`'s image set to `image` and nothing else
/// changed: the same documents with the same values (the image excepted), and the same text
/// outside the edited lines. Run on what is about to be sent with `ApplyConfiguration`.
pub fn check_only_image_changed(
    old: &[u8],
    new: &[u8],
    component: Component,
    image: &str,
) -> Result<(), MachineConfigError> {
    let want = expected_docs(parse_docs(old)?, component, image)?;
    let got = parse_docs(new)?;
    if want.len() != got.len() {
        return Err(MachineConfigError::UnexpectedChange {
            document: want.len().min(got.len()) + 1,
            path: "(document count)".to_string(),
        });
    }
    for (i, (w, g)) in want.iter().zip(&got).enumerate() {
        if let Some(path) = first_difference(w, g, String::new()) {
            return Err(MachineConfigError::UnexpectedChange {
                document: i + 1,
                path: if path.is_empty() { "/".into() } else { path },
            });
        }
    }
    // the values agree; the text must too, outside the lines that carry the image
    let (old, new) = (
        String::from_utf8_lossy(old).into_owned(),
        String::from_utf8_lossy(new).into_owned(),
    );
    let a: Vec<&str> = old.split_inclusive('\n').collect();
    let b: Vec<&str> = new.split_inclusive('\n').collect();
    let prefix = a.iter().zip(&b).take_while(|(x, y)| x == y).count();
    let suffix = a[prefix..]
        .iter()
        .rev()
        .zip(b[prefix..].iter().rev())
        .take_while(|(x, y)| x == y)
        .count();
    let removed = &a[prefix..a.len() - suffix];
    let added = &b[prefix..b.len() - suffix];
    let ok = match (removed, added) {
        ([], []) => true,
        // the image replaced in place, or a key inserted into a flow mapping
        ([r], [n]) => same_line_but_image(r, n, image),
        // `image: x` (or `field:`/`section:` lines above it) inserted into a block mapping
        ([], lines) if lines.len() <= 3 => {
            lines.iter().all(|l| is_key_line(l, image))
                && lines.last().is_some_and(|l| l.contains(image))
        }
        _ => false,
    };
    if ok {
        Ok(())
    } else {
        Err(MachineConfigError::TextChange { line: prefix + 1 })
    }
}

fn is_image_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-' | '/' | ':' | '@')
}

/// `new` is `old` with only (part of) an image token or an alias replaced by image characters,
/// or with `key: {key: image}, ` inserted after a flow mapping's `{`.
fn same_line_but_image(old: &str, new: &str, image: &str) -> bool {
    if !new.contains(image) {
        return false;
    }
    let p = old
        .bytes()
        .zip(new.bytes())
        .take_while(|(x, y)| x == y)
        .count();
    let max_s = old.len().min(new.len()) - p;
    let s = old
        .bytes()
        .rev()
        .zip(new.bytes().rev())
        .take(max_s)
        .take_while(|(x, y)| x == y)
        .count();
    let (Some(old_mid), Some(new_mid)) = (old.get(p..old.len() - s), new.get(p..new.len() - s))
    else {
        return false;
    };
    let replaced =
        old_mid.chars().all(|c| is_image_char(c) || c == '*') && new_mid.chars().all(is_image_char);
    let inserted = old_mid.is_empty()
        && new_mid.contains(image)
        && new_mid
            .chars()
            .all(|c| is_image_char(c) || matches!(c, ' ' | '{' | '}' | ','));
    replaced || inserted
}

/// `  key:` or `  image: <image>` (block insertion).
fn is_key_line(line: &str, image: &str) -> bool {
    let l = line.trim_end_matches(['\n', '\r']).trim_start_matches(' ');
    let key_only = |k: &str| !k.is_empty() && k.chars().all(|c| c.is_ascii_alphanumeric());
    match l.strip_suffix(':') {
        Some(k) => key_only(k),
        None => l == format!("image: {image}"),
    }
}

/// The JSON pointer of the first place `a` and `b` differ (keys only, never values: the
/// configuration holds secrets).
fn first_difference(a: &serde_json::Value, b: &serde_json::Value, at: String) -> Option<String> {
    use serde_json::Value;
    match (a, b) {
        (Value::Object(x), Value::Object(y)) => {
            for k in x.keys().chain(y.keys()) {
                let p = format!("{at}/{k}");
                match (x.get(k), y.get(k)) {
                    (Some(u), Some(v)) => {
                        if let Some(d) = first_difference(u, v, p) {
                            return Some(d);
                        }
                    }
                    _ => return Some(p),
                }
            }
            None
        }
        (Value::Array(x), Value::Array(y)) if x.len() == y.len() => x
            .iter()
            .zip(y)
            .enumerate()
            .find_map(|(i, (u, v))| first_difference(u, v, format!("{at}/{i}"))),
        _ if a == b => None,
        _ => Some(at),
    }
}

#[cfg(test)]
mod tests;

#[cfg(test)]
mod props;
