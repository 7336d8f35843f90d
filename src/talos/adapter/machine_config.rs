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
mod tests {
    use super::*;

    const API: &str = "registry.k8s.io/kube-apiserver:v1.34.0";

    fn set(yaml: &str, c: Component, image: &str) -> String {
        let out = set_component_image_in(yaml.as_bytes(), c, image)
            .unwrap_or_else(|e| panic!("{e}\n{yaml}"));
        check_only_image_changed(yaml.as_bytes(), &out, c, image)
            .unwrap_or_else(|e| panic!("{e}\n{yaml}\n---8<---\n{}", String::from_utf8_lossy(&out)));
        String::from_utf8(out).unwrap()
    }

    const TYPED: &str = "version: v1alpha1 # generated\nmachine:\n  type: controlplane\n  files:\n    - path: /var/etc/x\n      permissions: 0644\n      op: create\n      content: x\n  sysctls:\n    net.ipv4.ip_forward: on\n    vm.swap: off\n  kubelet:\n    image: ghcr.io/siderolabs/kubelet:v1.33.4 # pinned\n    extraArgs: {rotate-server-certificates: yes}\ncluster:\n  apiServer:\n    image: \"registry.k8s.io/kube-apiserver:v1.33.4\"\n";

    #[test]
    fn only_the_image_bytes_change() {
        let out = set(TYPED, Component::ApiServer, API);
        assert_eq!(
            out,
            TYPED.replace(
                "registry.k8s.io/kube-apiserver:v1.33.4",
                "registry.k8s.io/kube-apiserver:v1.34.0"
            )
        );
        let out = set(
            TYPED,
            Component::Kubelet,
            "ghcr.io/siderolabs/kubelet:v1.34.0",
        );
        assert_eq!(
            out,
            TYPED.replace("kubelet:v1.33.4 # pinned", "kubelet:v1.34.0 # pinned")
        );
        assert!(out.contains("permissions: 0644") && out.contains("vm.swap: off"));
    }

    #[test]
    fn missing_fields_are_inserted_into_their_mapping() {
        let out = set(
            TYPED,
            Component::Scheduler,
            "registry.k8s.io/kube-scheduler:v1.34.0",
        );
        assert_eq!(
            out,
            TYPED.replace(
                "cluster:\n",
                "cluster:\n  scheduler:\n    image: registry.k8s.io/kube-scheduler:v1.34.0\n"
            )
        );
        let no_cluster = "version: v1alpha1\nmachine:\n  type: worker\n";
        let out = set(
            no_cluster,
            Component::Proxy,
            "registry.k8s.io/kube-proxy:v1.34.0",
        );
        assert_eq!(
            out,
            "cluster:\n  proxy:\n    image: registry.k8s.io/kube-proxy:v1.34.0\nversion: v1alpha1\nmachine:\n  type: worker\n"
        );
        let flow = "version: v1alpha1\ncluster: {apiServer: {certSANs: [a]}, proxy: {}}\n";
        assert_eq!(
            set(flow, Component::ApiServer, API),
            format!(
                "version: v1alpha1\ncluster: {{apiServer: {{image: {API}, certSANs: [a]}}, proxy: {{}}}}\n"
            )
        );
        assert_eq!(
            set(flow, Component::Proxy, "p:v2"),
            "version: v1alpha1\ncluster: {apiServer: {certSANs: [a]}, proxy: {image: p:v2}}\n"
        );
    }

    #[test]
    fn the_components_own_document_is_edited_and_nothing_else() {
        let multi = format!(
            "{TYPED}---\n# api server\napiVersion: v1alpha1\nkind: KubeAPIServerConfig\nimage: 'registry.k8s.io/kube-apiserver:v1.33.4'\nextraArgs:\n  audit: off\n---\napiVersion: v1alpha1\nkind: KubeletConfig\n"
        );
        let out = set(&multi, Component::ApiServer, API);
        assert_eq!(
            out,
            multi.replace(
                "'registry.k8s.io/kube-apiserver:v1.33.4'",
                &format!("'{API}'")
            )
        );
        let out = set(&multi, Component::Kubelet, "k:v2");
        assert_eq!(
            out,
            multi.replace(
                "---\napiVersion: v1alpha1\nkind: KubeletConfig\n",
                "---\nimage: k:v2\napiVersion: v1alpha1\nkind: KubeletConfig\n"
            )
        );
    }

    #[test]
    fn an_alias_is_replaced_and_its_anchor_kept() {
        let t = "version: v1alpha1\nmachine:\n  kubelet:\n    image: &img ghcr.io/siderolabs/kubelet:v1.33.4\n    extraArgs: {note: *img}\ncluster:\n  proxy:\n    image: *img\n";
        let out = set(t, Component::Proxy, "registry.k8s.io/kube-proxy:v1.34.0");
        assert_eq!(
            out,
            t.replace(
                "    image: *img\n",
                "    image: registry.k8s.io/kube-proxy:v1.34.0\n"
            )
        );
        // editing the anchored scalar would change its aliases too: refused before applying
        let e = set_component_image_in(t.as_bytes(), Component::Kubelet, "k:v2")
            .and_then(|o| check_only_image_changed(t.as_bytes(), &o, Component::Kubelet, "k:v2"))
            .unwrap_err();
        assert!(
            matches!(&e, MachineConfigError::UnexpectedChange { path, .. } if path == "/cluster/proxy/image"),
            "{e:?}"
        );
    }

    #[test]
    fn any_other_change_is_refused_before_applying() {
        let good = set_component_image_in(TYPED.as_bytes(), Component::ApiServer, API).unwrap();
        let good = String::from_utf8(good).unwrap();
        // a re-encoding that keeps the values but not the text (what the old code sent)
        let e = check_only_image_changed(
            TYPED.as_bytes(),
            good.replace("vm.swap: off", "vm.swap: false").as_bytes(),
            Component::ApiServer,
            API,
        )
        .unwrap_err();
        assert!(
            matches!(e, MachineConfigError::TextChange { line: 11 }),
            "{e:?}"
        );
        let e = check_only_image_changed(
            TYPED.as_bytes(),
            good.replace("0644", "644").as_bytes(),
            Component::ApiServer,
            API,
        )
        .unwrap_err();
        assert!(
            matches!(&e, MachineConfigError::UnexpectedChange { document: 1, path } if path == "/machine/files/0/permissions"),
            "{e:?}"
        );
        assert!(e.to_string().contains("nothing was applied"));
        // a comment on the image line is part of the text
        let e = check_only_image_changed(
            TYPED.as_bytes(),
            good.replace("# pinned", "# moved").as_bytes(),
            Component::ApiServer,
            API,
        )
        .unwrap_err();
        assert!(matches!(e, MachineConfigError::TextChange { .. }), "{e:?}");
        // the image of another component is another change
        let e =
            check_only_image_changed(TYPED.as_bytes(), good.as_bytes(), Component::Kubelet, API)
                .unwrap_err();
        assert!(
            matches!(e, MachineConfigError::UnexpectedChange { .. }),
            "{e:?}"
        );
    }

    #[test]
    fn what_cannot_be_edited_in_place_is_refused() {
        // a folded scalar on one line is edited in place
        let folded = "version: v1alpha1\ncluster:\n  apiServer:\n    image: >-\n      registry.k8s.io/kube-apiserver:v1.33.4\n";
        assert_eq!(
            set(folded, Component::ApiServer, API),
            folded.replace("kube-apiserver:v1.33.4", "kube-apiserver:v1.34.0")
        );
        let escaped = "version: v1alpha1\ncluster:\n  apiServer:\n    image: \"registry.k8s.io/kube-apiserver:v1.33.\\x34\"\n";
        let e = set_component_image_in(escaped.as_bytes(), Component::ApiServer, API).unwrap_err();
        assert!(
            matches!(&e, MachineConfigError::NotEditable { path, .. } if path == "cluster.apiServer.image"),
            "{e:?}"
        );
        let e = set_component_image_in(TYPED.as_bytes(), Component::ApiServer, "x: y").unwrap_err();
        assert!(matches!(e, MachineConfigError::BadImage { .. }), "{e:?}");
        let null = "version: v1alpha1\ncluster:\n  apiServer:\n";
        let e = set_component_image_in(null.as_bytes(), Component::ApiServer, API).unwrap_err();
        assert!(matches!(e, MachineConfigError::NotAMapping { .. }), "{e:?}");
    }
}

#[cfg(test)]
mod props {
    //! Over configurations with octal modes, `on/off/yes/no` strings, anchors and aliases,
    //! comments, flow and block styles and several documents: the edit leaves every byte but
    //! the image's.

    use proptest::prelude::*;

    use super::*;

    const SLOT: &str = "\u{1}";
    const COMPONENTS: [(Component, &str, &str, &str); 5] = [
        (
            Component::Kubelet,
            "kubelet",
            "KubeletConfig",
            "ghcr.io/siderolabs/kubelet",
        ),
        (
            Component::ApiServer,
            "apiServer",
            "KubeAPIServerConfig",
            "registry.k8s.io/kube-apiserver",
        ),
        (
            Component::ControllerManager,
            "controllerManager",
            "KubeControllerManagerConfig",
            "registry.k8s.io/kube-controller-manager",
        ),
        (
            Component::Scheduler,
            "scheduler",
            "KubeSchedulerConfig",
            "registry.k8s.io/kube-scheduler",
        ),
        (
            Component::Proxy,
            "proxy",
            "KubeProxyConfig",
            "registry.k8s.io/kube-proxy",
        ),
    ];
    /// Lines a real configuration may hold that a YAML 1.1 reader would re-type.
    const FILLERS: [&str; 8] = [
        "  files:\n    - content: \"x\"\n      permissions: 0644\n      path: /var/etc/a\n      op: create\n",
        "  sysctls:\n    net.ipv4.ip_forward: on\n    vm.overcommit: off\n",
        "  nodeLabels: {feature: yes, other: no, mode: 0755}\n",
        "  # a comment: off\n",
        "  env: &env\n    A: 'on'\n    B: 010\n  envCopy: *env\n",
        "  banner: |\n    line: 1\n    off\n",
        "  disks: [{device: /dev/sdb, partitions: [{mountpoint: /var/a, size: 0x10}]}]\n",
        "  extraArgs:\n    feature-gates: Foo=true,Bar=false\n    verbose: Yes   # trailing comment\n",
    ];
    const DOCS: [&str; 3] = [
        "apiVersion: v1alpha1\nkind: SideroLinkConfig\napiUrl: https://siderolink.example/?jointoken=off\n",
        "# extension\napiVersion: v1alpha1\nkind: ExtensionServiceConfig\nname: nut\nconfigFiles:\n  - content: |-\n      MODE=netclient\n    mountPath: /usr/local/etc/nut/upsmon.conf\nenvironment: [NUT=on]\n",
        "apiVersion: v1alpha1\nkind: NetworkDefaultActionConfig\ningress: block\n",
    ];

    #[derive(Debug, Clone)]
    struct Case {
        target: usize,
        quoting: usize,
        comment: bool,
        flow: bool,
        own_doc: bool,
        cluster_first: bool,
        machine_fillers: Vec<usize>,
        cluster_fillers: Vec<usize>,
        docs: Vec<usize>,
        doc_before: bool,
    }

    fn case() -> impl Strategy<Value = Case> {
        (
            0..5usize,
            0..4usize,
            any::<bool>(),
            any::<bool>(),
            any::<bool>(),
            any::<bool>(),
            proptest::sample::subsequence((0..FILLERS.len()).collect::<Vec<_>>(), 0..4),
            proptest::sample::subsequence((0..FILLERS.len()).collect::<Vec<_>>(), 0..4),
            proptest::sample::subsequence((0..DOCS.len()).collect::<Vec<_>>(), 0..3),
            any::<bool>(),
        )
            .prop_map(
                |(target, quoting, comment, flow, own_doc, cluster_first, mf, cf, docs, db)| Case {
                    target,
                    quoting,
                    comment,
                    flow,
                    own_doc,
                    cluster_first,
                    machine_fillers: mf,
                    cluster_fillers: cf,
                    docs,
                    doc_before: db,
                },
            )
    }

    /// The configuration with the target image's text replaced by [`SLOT`].
    fn template(c: &Case) -> String {
        let holder = |i: usize, slot: bool| {
            let (_, field, _, repo) = COMPONENTS[i];
            let value = if slot {
                SLOT.to_string()
            } else {
                format!("{repo}:v1.33.4")
            };
            let comment = if slot && c.comment { " # pinned" } else { "" };
            if slot && c.flow {
                format!("  {field}: {{image: {value}, extraArgs: {{v: off}}}}{comment}\n")
            } else {
                format!(
                    "  {field}:\n    image: {value}{comment}\n    extraArgs:\n      enabled: on\n"
                )
            }
        };
        let in_v1 = !c.own_doc;
        let anchor = "  annotations:\n    current: &cur registry.k8s.io/pinned:v1.33.4\n";
        let mut machine = String::from("machine:\n  type: controlplane\n");
        let mut cluster = String::from("cluster:\n  clusterName: off\n");
        let first = if c.cluster_first {
            &mut cluster
        } else {
            &mut machine
        };
        first.push_str(anchor);
        for f in &c.machine_fillers {
            machine.push_str(FILLERS[*f]);
        }
        for f in &c.cluster_fillers {
            cluster.push_str(FILLERS[*f]);
        }
        machine.push_str(&holder(0, in_v1 && c.target == 0));
        for i in 1..5 {
            cluster.push_str(&holder(i, in_v1 && c.target == i));
        }
        let mut v1 = String::from("# node config\nversion: v1alpha1\ndebug: no\n");
        if c.cluster_first {
            v1.push_str(&cluster);
            v1.push_str(&machine);
        } else {
            v1.push_str(&machine);
            v1.push_str(&cluster);
        }
        let mut docs: Vec<String> = c.docs.iter().map(|d| DOCS[*d].to_string()).collect();
        if c.own_doc {
            let (_, _, kind, _) = COMPONENTS[c.target];
            let comment = if c.comment { " # pinned" } else { "" };
            docs.push(format!(
                "apiVersion: v1alpha1\nkind: {kind}\nimage: {SLOT}{comment}\nextraArgs:\n  profiling: off\n"
            ));
        }
        if c.doc_before {
            docs.push(v1);
            docs.rotate_right(1);
            docs.reverse();
        } else {
            docs.insert(0, v1);
        }
        docs.join("---\n")
    }

    fn slot_text(c: &Case, image: &str, original: bool) -> String {
        let quoting = if c.own_doc && c.quoting == 3 {
            0
        } else {
            c.quoting
        };
        match (quoting, original) {
            (1, _) => format!("'{image}'"),
            (2, _) => format!("\"{image}\""),
            (3, true) => "*cur".to_string(),
            _ => image.to_string(),
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

        #[test]
        fn the_result_equals_the_input_except_the_image(c in case()) {
            let (component, _, _, repo) = COMPONENTS[c.target];
            let t = template(&c);
            let old_image = format!("{repo}:v1.33.4");
            let new_image = format!("{repo}:v1.34.0");
            let original = t.replace(SLOT, &slot_text(&c, &old_image, true));
            let expected = t.replace(SLOT, &slot_text(&c, &new_image, false));
            let out = set_component_image_in(original.as_bytes(), component, &new_image)
                .map_err(|e| TestCaseError::fail(format!("{e}\n{original}")))?;
            prop_assert_eq!(String::from_utf8(out.clone()).unwrap(), expected);
            prop_assert!(
                check_only_image_changed(original.as_bytes(), &out, component, &new_image).is_ok()
            );
        }

        #[test]
        fn a_missing_image_is_added_and_nothing_else_changes(c in case()) {
            let (component, _, _, repo) = COMPONENTS[c.target];
            // the target's image line removed: the field must be inserted
            let t = template(&c);
            let original: String = if c.flow && !c.own_doc {
                t.replace(&format!("image: {SLOT}, "), "")
            } else {
                t.split_inclusive('\n').filter(|l| !l.contains(SLOT)).collect()
            };
            prop_assume!(!original.contains(SLOT));
            let new_image = format!("{repo}:v1.34.0");
            let out = set_component_image_in(original.as_bytes(), component, &new_image)
                .map_err(|e| TestCaseError::fail(format!("{e}\n{original}")))?;
            check_only_image_changed(original.as_bytes(), &out, component, &new_image)
                .map_err(|e| TestCaseError::fail(format!("{e}\n{}", String::from_utf8_lossy(&out))))?;
            let images = super::super::component_images_of(&out).unwrap();
            prop_assert_eq!(images.get(&component), Some(&new_image));
            // taking the added text out again gives the original back
            let out = String::from_utf8(out).unwrap();
            let back: String = if c.flow && !c.own_doc {
                out.replace(&format!("image: {new_image}, "), "")
            } else {
                out.split_inclusive('\n').filter(|l| !l.contains(&new_image)).collect()
            };
            prop_assert_eq!(back, original);
        }
    }
}
