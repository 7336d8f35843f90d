//! Container image references, parsed once.
//!
//! **Owns:** [`ImageRef`], the only way an image reference enters medea: installer images in
//! desired-state YAML, `machine.install.image` and the component images read from a node's
//! machine configuration or its static pods, the images medea asks Talos to pull and install.
//! **May depend on:** the `image` row of design/architecture.md's code map (a tag may name a
//! release).
//!
//! Architecture Invariant: an image reference is parsed once, at the edge, by
//! [`ImageRef::parse`]; inner code asks the typed value for its repository, tag or digest and
//! never splits strings at `:`, `/` or `@` itself.
//!
//! The grammar is the one of the container registries, `distribution/reference`'s
//! `reference.go` (github.com/distribution/reference), without Docker's normalisation (the
//! reference is kept as written: `nginx` stays `nginx`, never `docker.io/library/nginx`):
//!
//! ```text
//! reference        := name [ ":" tag ] [ "@" digest ]
//! name             := [ domain "/" ] path            (at most 255 characters)
//! domain           := host [ ":" port ]              (the first component, when it contains
//!                                                     `.` or `:` or is `localhost`)
//! host             := domain-component { "." domain-component } | "[" IPv6 "]"
//! domain-component := [A-Za-z0-9] | [A-Za-z0-9][A-Za-z0-9-]*[A-Za-z0-9]
//! path             := path-component { "/" path-component }
//! path-component   := [a-z0-9]+ { separator [a-z0-9]+ }
//! separator        := "." | "_" | "__" | "-"+
//! tag              := [A-Za-z0-9_][A-Za-z0-9_.-]{0,127}
//! digest           := algorithm ":" hex              (algorithm [A-Za-z][A-Za-z0-9]* joined
//!                                                     by [+._-]; hex [0-9a-fA-F]{32,})
//! ```
//!
//! Display writes the reference back exactly as it was parsed.
//!
//! No crate: `oci-spec`'s `distribution::Reference` and `docker_reference`-style parsers
//! normalise (`docker.io/library/…`), which would change the images medea writes into machine
//! configurations; see design/dependencies.md.

use std::fmt;
use std::str::FromStr;

use crate::version::{KubeVersion, TalosVersion};

const NAME_MAX: usize = 255;
const TAG_MAX: usize = 128;

/// Why an image reference was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ImageRefError {
    #[error("image reference is empty")]
    Empty,
    #[error("image reference `{input}` contains whitespace or non-ASCII characters")]
    Characters { input: String },
    #[error(
        "image reference `{input}`: registry `{domain}` is not a host name or address with an optional `:port`"
    )]
    Domain { input: String, domain: String },
    #[error(
        "image reference `{input}`: repository `{path}` may only contain lowercase letters and digits separated by `/`, `.`, `_`, `__` or `-`"
    )]
    Path { input: String, path: String },
    #[error("image reference `{input}`: the repository name is longer than {NAME_MAX} characters")]
    NameTooLong { input: String },
    #[error(
        "image reference `{input}`: tag `{tag}` must be 1–{TAG_MAX} letters, digits, `_`, `.` or `-` (not starting with `.` or `-`)"
    )]
    Tag { input: String, tag: String },
    #[error(
        "image reference `{input}`: digest `{digest}` must be `algorithm:hex` (for example `sha256:` and 64 hex digits)"
    )]
    Digest { input: String, digest: String },
}

/// A parsed image reference: `[registry/]repository[:tag][@digest]`, kept as written.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ImageRef {
    domain: Option<String>,
    path: String,
    tag: Option<String>,
    digest: Option<String>,
}

fn is_alnum_lower(b: u8) -> bool {
    b.is_ascii_lowercase() || b.is_ascii_digit()
}

/// `[a-z0-9]+ { separator [a-z0-9]+ }` with separator `.`, `_`, `__` or `-`+.
fn is_path_component(s: &str) -> bool {
    let b = s.as_bytes();
    if b.is_empty() || !is_alnum_lower(b[0]) || !is_alnum_lower(b[b.len() - 1]) {
        return false;
    }
    let mut i = 0;
    while i < b.len() {
        if is_alnum_lower(b[i]) {
            i += 1;
            continue;
        }
        let start = i;
        while i < b.len() && !is_alnum_lower(b[i]) {
            i += 1;
        }
        let sep = &s[start..i];
        let ok = matches!(sep, "." | "_" | "__") || sep.bytes().all(|c| c == b'-');
        if !ok {
            return false;
        }
    }
    true
}

fn is_domain_component(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b[0].is_ascii_alphanumeric()
        && b[b.len() - 1].is_ascii_alphanumeric()
        && b.iter().all(|c| c.is_ascii_alphanumeric() || *c == b'-')
}

fn is_domain(s: &str) -> bool {
    let (host, port) = if let Some(rest) = s.strip_prefix('[') {
        let Some((v6, after)) = rest.split_once(']') else {
            return false;
        };
        if v6.parse::<std::net::Ipv6Addr>().is_err() {
            return false;
        }
        match after {
            "" => return true,
            p => match p.strip_prefix(':') {
                Some(port) => ("", Some(port)),
                None => return false,
            },
        }
    } else {
        match s.split_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (s, None),
        }
    };
    let host_ok = s.starts_with('[') || host.split('.').all(is_domain_component);
    let port_ok = port.is_none_or(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()));
    host_ok && port_ok
}

fn is_tag(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= TAG_MAX
        && (b[0].is_ascii_alphanumeric() || b[0] == b'_')
        && b.iter()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'_' | b'.' | b'-'))
}

fn is_digest(s: &str) -> bool {
    let Some((alg, hex)) = s.split_once(':') else {
        return false;
    };
    let alg_ok = alg.split(['+', '.', '_', '-']).all(|c| {
        c.bytes().next().is_some_and(|b| b.is_ascii_alphabetic())
            && c.bytes().all(|b| b.is_ascii_alphanumeric())
    });
    alg_ok && hex.len() >= 32 && hex.bytes().all(|b| b.is_ascii_hexdigit())
}

/// `name[:tag]` → (name, tag): the tag is after the last `:` that follows the last `/` (a
/// registry port comes before a `/`).
fn split_tag(reference: &str) -> (&str, Option<&str>) {
    let last_slash = reference.rfind('/').map_or(0, |i| i + 1);
    match reference[last_slash..].rfind(':') {
        Some(c) => (
            &reference[..last_slash + c],
            Some(&reference[last_slash + c + 1..]),
        ),
        None => (reference, None),
    }
}

/// The tag of a reference a node reported, read with the same rule as [`ImageRef::parse`] but
/// without checking the rest (a status line from a node may carry a reference medea would not
/// write, and only its tag matters there). Empty tags are `None`.
pub fn tag_of(reference: &str) -> Option<&str> {
    name_and_tag(reference).1.filter(|t| !t.is_empty())
}

/// `(name, tag)` of a reference a node reported, any `@digest` dropped: the split rule of
/// [`ImageRef::parse`] without checking the rest (see [`tag_of`]).
pub fn name_and_tag(reference: &str) -> (&str, Option<&str>) {
    let without_digest = reference.split('@').next().unwrap_or(reference);
    split_tag(without_digest)
}

/// The Kubernetes version a tag names and its flavour suffix (`v1.34.1-fat` → (`v1.34.1`,
/// `-fat`)); `-fat` and `-slim` are the kubelet image flavours.
pub fn kube_version_of_tag(tag: &str) -> Option<(KubeVersion, &str)> {
    for suffix in ["-fat", "-slim"] {
        if let Some(t) = tag.strip_suffix(suffix) {
            return KubeVersion::parse(t).ok().map(|v| (v, suffix));
        }
    }
    KubeVersion::parse(tag).ok().map(|v| (v, ""))
}

/// The Image Factory schematic with no customization (no extensions, no extra kernel
/// arguments): the id of an empty schematic document, the same for everyone.
pub const EMPTY_SCHEMATIC: &str =
    "376567988ad370138ad8b2698212367b8edcb69b5fd68c80be1f2ec7d603b4ba";

/// The schematic id of a reference a node reported (`machine.install.image`), with the rule of
/// [`ImageRef::schematic`] and, like [`tag_of`], without checking the rest.
pub fn schematic_of(reference: &str) -> Option<&str> {
    let without_digest = reference.split('@').next().unwrap_or(reference);
    schematic_segment(split_tag(without_digest).0)
}

/// The repository the Talos project published its installer under until Talos 1.13
/// (`pkg/images/images.go` at v1.13.9, `DefaultInstallerImageRepository`); from 1.14 installers
/// come from the Image Factory only.
pub const GHCR_INSTALLER: &str = "ghcr.io/siderolabs/installer";

/// The public Image Factory (`pkg/images/images.go`, `Factory`).
pub const DEFAULT_FACTORY: &str = "factory.talos.dev";

/// An Image Factory installer reference, split as the factory's registry front splits it
/// (siderolabs/image-factory `internal/frontend/http/registry.go`, `getRequestedImage`):
/// `<host>/<image>/<schematic>[:tag]`, where `<image>` is `installer`, `installer-secureboot`
/// (the metal platform), `<platform>-installer` or `<platform>-installer-secureboot`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FactoryInstaller<'a> {
    /// The registry host (and port).
    pub host: &'a str,
    /// The platform; `None` for the older `installer` form (metal).
    pub platform: Option<&'a str>,
    pub secure_boot: bool,
    pub schematic: &'a str,
    pub tag: Option<&'a str>,
}

/// [`FactoryInstaller`] of a reference a node reported or medea built, when it has that shape
/// (any `@digest` dropped; the rest unchecked, as [`tag_of`]).
pub fn factory_installer_of(reference: &str) -> Option<FactoryInstaller<'_>> {
    let (name, tag) = name_and_tag(reference);
    let mut parts = name.split('/');
    let (host, image, schematic) = (parts.next()?, parts.next()?, parts.next()?);
    if parts.next().is_some() || !(host.contains('.') || host.contains(':')) {
        return None;
    }
    let schematic = schematic_segment(schematic)?;
    let (platform, secure_boot) = match image {
        "installer" => (None, false),
        "installer-secureboot" => (None, true),
        _ => match image.strip_suffix("-installer-secureboot") {
            Some(p) if !p.is_empty() => (Some(p), true),
            _ => match image.strip_suffix("-installer") {
                Some(p) if !p.is_empty() => (Some(p), false),
                _ => return None,
            },
        },
    };
    Some(FactoryInstaller {
        host,
        platform,
        secure_boot,
        schematic,
        tag,
    })
}

/// Whether a reference (or repository) names a SecureBoot installer: an Image Factory
/// `…installer-secureboot/<schematic>` image, or any repository whose last but one path
/// segment ends in `installer-secureboot` (a mirror of one).
pub fn is_secure_boot_installer(reference: &str) -> bool {
    if let Some(f) = factory_installer_of(reference) {
        return f.secure_boot;
    }
    let (name, _) = name_and_tag(reference);
    name.split('/')
        .any(|segment| segment.ends_with("installer-secureboot"))
}

/// The last path segment of `name` when it is 64 lowercase hex characters.
fn schematic_segment(name: &str) -> Option<&str> {
    let last = name.rsplit('/').next()?;
    (last.len() == 64
        && last
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)))
    .then_some(last)
}

impl ImageRef {
    /// Parse the grammar of the module docs.
    pub fn parse(input: &str) -> Result<ImageRef, ImageRefError> {
        let owned = || input.to_string();
        if input.is_empty() {
            return Err(ImageRefError::Empty);
        }
        if !input.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(ImageRefError::Characters { input: owned() });
        }
        let (rest, digest) = match input.split_once('@') {
            Some((r, d)) => {
                if !is_digest(d) {
                    return Err(ImageRefError::Digest {
                        input: owned(),
                        digest: d.to_string(),
                    });
                }
                (r, Some(d.to_string()))
            }
            None => (input, None),
        };
        let (name, tag) = match split_tag(rest) {
            (n, Some(t)) => {
                if !is_tag(t) {
                    return Err(ImageRefError::Tag {
                        input: owned(),
                        tag: t.to_string(),
                    });
                }
                (n, Some(t.to_string()))
            }
            (n, None) => (n, None),
        };
        if name.len() > NAME_MAX {
            return Err(ImageRefError::NameTooLong { input: owned() });
        }
        let (domain, path) = match name.split_once('/') {
            Some((first, p))
                if first.contains(['.', ':']) || first == "localhost" || first.starts_with('[') =>
            {
                if !is_domain(first) {
                    return Err(ImageRefError::Domain {
                        input: owned(),
                        domain: first.to_string(),
                    });
                }
                (Some(first.to_string()), p)
            }
            _ => (None, name),
        };
        if path.is_empty() || !path.split('/').all(is_path_component) {
            return Err(ImageRefError::Path {
                input: owned(),
                path: path.to_string(),
            });
        }
        Ok(ImageRef {
            domain,
            path: path.to_string(),
            tag,
            digest,
        })
    }

    /// The registry host (and port), when the reference names one (`ghcr.io`,
    /// `registry.local:5000`).
    pub fn registry(&self) -> Option<&str> {
        self.domain.as_deref()
    }

    /// The repository with its registry, without tag or digest (`ghcr.io/siderolabs/installer`).
    pub fn repository(&self) -> String {
        match &self.domain {
            Some(d) => format!("{d}/{}", self.path),
            None => self.path.clone(),
        }
    }

    /// The repository path without its registry (`siderolabs/installer`).
    pub fn path(&self) -> &str {
        &self.path
    }

    pub fn tag(&self) -> Option<&str> {
        self.tag.as_deref()
    }

    pub fn digest(&self) -> Option<&str> {
        self.digest.as_deref()
    }

    /// The same repository with tag `tag` and no digest (a retag never keeps a pin to other
    /// content).
    pub fn with_tag(&self, tag: &str) -> Result<ImageRef, ImageRefError> {
        if !is_tag(tag) {
            return Err(ImageRefError::Tag {
                input: format!("{}:{tag}", self.repository()),
                tag: tag.to_string(),
            });
        }
        Ok(ImageRef {
            tag: Some(tag.to_string()),
            digest: None,
            ..self.clone()
        })
    }

    /// The same repository without tag or digest.
    pub fn without_tag(&self) -> ImageRef {
        ImageRef {
            tag: None,
            digest: None,
            ..self.clone()
        }
    }

    /// The Talos version the tag names, if it is one (`v1.13.9`).
    pub fn talos_version(&self) -> Option<TalosVersion> {
        self.tag().and_then(|t| TalosVersion::parse(t).ok())
    }

    /// The Kubernetes version the tag names and the flavour suffix after it (`v1.34.1-fat` →
    /// (`v1.34.1`, `-fat`)); `-fat` and `-slim` are the kubelet image flavours.
    pub fn kube_version(&self) -> Option<(KubeVersion, &str)> {
        kube_version_of_tag(self.tag()?)
    }

    /// The Image Factory schematic id, when the repository's last path segment is one (64
    /// lowercase hex characters: `factory.talos.dev/installer/<id>`).
    pub fn schematic(&self) -> Option<&str> {
        schematic_segment(&self.path)
    }
}

impl FromStr for ImageRef {
    type Err = ImageRefError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::parse(s)
    }
}

impl fmt::Display for ImageRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(d) = &self.domain {
            write!(f, "{d}/")?;
        }
        f.write_str(&self.path)?;
        if let Some(t) = &self.tag {
            write!(f, ":{t}")?;
        }
        if let Some(d) = &self.digest {
            write!(f, "@{d}")?;
        }
        Ok(())
    }
}

impl fmt::Debug for ImageRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ImageRef({self})")
    }
}

impl serde::Serialize for ImageRef {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const SHA: &str = "sha256:4bc45e7d8f1a2b3c4d5e6f708192a3b4c5d6e7f8091a2b3c4d5e6f708192a3b4";

    #[test]
    fn factory_installers_split_as_the_factory_splits_them() {
        let e = EMPTY_SCHEMATIC;
        let r = format!("factory.talos.dev/aws-installer-secureboot/{e}:v1.14.6");
        let f = factory_installer_of(&r).unwrap();
        assert_eq!(
            f,
            FactoryInstaller {
                host: "factory.talos.dev",
                platform: Some("aws"),
                secure_boot: true,
                schematic: e,
                tag: Some("v1.14.6"),
            }
        );
        let r = format!("omni.example.org:8443/installer/{e}");
        let f = factory_installer_of(&r).unwrap();
        assert_eq!(
            (f.host, f.platform, f.secure_boot, f.tag),
            ("omni.example.org:8443", None, false, None)
        );
        for not in [
            "ghcr.io/siderolabs/installer:v1.13.10".to_string(),
            format!("factory.talos.dev/metal-imager/{e}:v1.14.6"),
            format!("factory.talos.dev/a/metal-installer/{e}:v1.14.6"),
            "factory.talos.dev/installer/abc:v1.14.6".to_string(),
            format!("installer/{e}:v1.14.6"),
        ] {
            assert_eq!(factory_installer_of(&not), None, "{not}");
        }
        assert!(is_secure_boot_installer(&format!(
            "factory.talos.dev/installer-secureboot/{e}:v1.14.6"
        )));
        assert!(is_secure_boot_installer(
            "registry.local/mirror/metal-installer-secureboot/x"
        ));
        assert!(!is_secure_boot_installer(&format!(
            "factory.talos.dev/metal-installer/{e}"
        )));
        assert!(!is_secure_boot_installer(
            "ghcr.io/siderolabs/installer:v1.13.10"
        ));
    }

    #[test]
    fn parts_of_real_references() {
        let r = ImageRef::parse("ghcr.io/siderolabs/installer:v1.13.9").unwrap();
        assert_eq!(r.registry(), Some("ghcr.io"));
        assert_eq!(r.path(), "siderolabs/installer");
        assert_eq!(r.repository(), "ghcr.io/siderolabs/installer");
        assert_eq!(r.tag(), Some("v1.13.9"));
        assert_eq!(r.digest(), None);
        assert_eq!(r.talos_version(), TalosVersion::parse("v1.13.9").ok());

        let r = ImageRef::parse("registry.local:5000/talos/installer:v1.12.4").unwrap();
        assert_eq!(r.registry(), Some("registry.local:5000"));
        assert_eq!(r.tag(), Some("v1.12.4"));

        let r = ImageRef::parse("registry.local:5000/talos/installer").unwrap();
        assert_eq!(r.registry(), Some("registry.local:5000"));
        assert_eq!(r.tag(), None, "a registry port is not a tag");

        let r = ImageRef::parse(&format!("ghcr.io/siderolabs/kubelet:v1.34.1-fat@{SHA}")).unwrap();
        assert_eq!(r.tag(), Some("v1.34.1-fat"));
        assert_eq!(r.digest(), Some(SHA));
        assert_eq!(
            r.kube_version(),
            Some((KubeVersion::parse("v1.34.1").unwrap(), "-fat"))
        );
        let retagged = r.with_tag("v1.35.0-fat").unwrap();
        assert_eq!(
            retagged.to_string(),
            "ghcr.io/siderolabs/kubelet:v1.35.0-fat"
        );

        let r = ImageRef::parse("localhost/kube-apiserver:v1.33.1").unwrap();
        assert_eq!(r.registry(), Some("localhost"));
        let r = ImageRef::parse("nginx").unwrap();
        assert_eq!((r.registry(), r.path(), r.tag()), (None, "nginx", None));
        let r = ImageRef::parse("[::1]:5000/a/b:c").unwrap();
        assert_eq!(r.registry(), Some("[::1]:5000"));

        let s = "376567988ad370138ad8b2698212367b8edcb69b5fd68c80be1f2ec7d603b4ba";
        let f = ImageRef::parse(&format!("factory.talos.dev/metal-installer/{s}:v1.12.4")).unwrap();
        assert_eq!(f.schematic(), Some(s));
        assert_eq!(
            ImageRef::parse("ghcr.io/siderolabs/installer")
                .unwrap()
                .schematic(),
            None
        );
    }

    #[test]
    fn bad_references_say_which_part_is_wrong() {
        let cases: [(&str, fn(&ImageRefError) -> bool); 11] = [
            ("", |e| matches!(e, ImageRefError::Empty)),
            ("ghcr.io/x y", |e| {
                matches!(e, ImageRefError::Characters { .. })
            }),
            (
                "Ghcr.io/X",
                |e| matches!(e, ImageRefError::Path { path, .. } if path == "X"),
            ),
            ("ghcr.io/a..b", |e| matches!(e, ImageRefError::Path { .. })),
            ("ghcr.io/-a", |e| matches!(e, ImageRefError::Path { .. })),
            ("ghcr.io/", |e| matches!(e, ImageRefError::Path { .. })),
            ("-bad.io/a", |e| matches!(e, ImageRefError::Domain { .. })),
            ("reg.io:port/a", |e| {
                matches!(e, ImageRefError::Domain { .. })
            }),
            ("ghcr.io/a:", |e| matches!(e, ImageRefError::Tag { .. })),
            ("ghcr.io/a:.x", |e| matches!(e, ImageRefError::Tag { .. })),
            ("ghcr.io/a@sha256:abc", |e| {
                matches!(e, ImageRefError::Digest { .. })
            }),
        ];
        for (input, want) in cases {
            let e = ImageRef::parse(input).unwrap_err();
            assert!(want(&e), "{input:?}: {e:?}");
            if !input.is_empty() {
                assert!(e.to_string().contains(&format!("`{input}`")), "{e}");
            }
        }
        let long = format!("a/{}", "b".repeat(300));
        assert!(matches!(
            ImageRef::parse(&long),
            Err(ImageRefError::NameTooLong { .. })
        ));
        assert!(matches!(
            ImageRef::parse("a").unwrap().with_tag("-x"),
            Err(ImageRefError::Tag { .. })
        ));
    }

    fn reference() -> impl Strategy<Value = String> {
        let comp = "[a-z0-9]{1,5}([._-][a-z0-9]{1,5}){0,2}";
        (
            "[a-z]{1,8}\\.(io|dev|local)(:[0-9]{2,5})?",
            proptest::collection::vec(comp, 1..4),
            proptest::option::of("[A-Za-z0-9_][A-Za-z0-9_.-]{0,20}"),
            proptest::option::of("[0-9a-f]{64}"),
        )
            .prop_map(|(domain, path, tag, digest)| {
                let mut s = format!("{domain}/");
                s.push_str(&path.join("/"));
                if let Some(t) = tag {
                    s.push(':');
                    s.push_str(&t);
                }
                if let Some(d) = digest {
                    s.push_str("@sha256:");
                    s.push_str(&d);
                }
                s
            })
    }

    proptest! {
        #[test]
        fn display_gives_back_the_input(s in reference()) {
            let r = ImageRef::parse(&s).unwrap();
            prop_assert_eq!(r.to_string(), s);
        }

        #[test]
        fn parse_never_panics(s in "\\PC{0,40}") {
            let _ = ImageRef::parse(&s);
        }
    }
}
