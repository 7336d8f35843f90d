//! Strictly parsed release versions shared by every context.
//!
//! **Owns:** [`TalosVersion`] and [`KubeVersion`], the only way a version enters medea.
//! **May depend on:** the `version` row of design/architecture.md's code map: nothing (a leaf).
//!
//! Architecture Invariant: a version string is parsed once, at the edge (YAML, Talos `Version`
//! reply, Kubernetes `nodeInfo.kubeletVersion`); everything after that works on the typed value.
//! The accepted grammar is `v<major>.<minor>.<patch>` with an optional `-<pre>` suffix made of
//! `[0-9A-Za-z.]` (`v1.14.0-rc.1`). Leading zeros, missing parts and build metadata are refused.

use std::cmp::Ordering;
use std::fmt;
use std::str::FromStr;

/// Why a version string was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum VersionError {
    #[error("version `{input}` must start with `v` (for example `v1.13.9`)")]
    MissingV { input: String },
    #[error(
        "version `{input}` must have three numeric parts, `vMAJOR.MINOR.PATCH` (for example `v1.13.9`)"
    )]
    Shape { input: String },
    #[error("version `{input}`: `{part}` is not a number without leading zeros")]
    Number { input: String, part: String },
    #[error(
        "version `{input}`: pre-release suffix `{pre}` may only contain letters, digits and dots"
    )]
    PreRelease { input: String, pre: String },
}

/// A parsed `vX.Y.Z[-pre]` version. Pre-releases order before the release they precede.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct Semver {
    major: u64,
    minor: u64,
    patch: u64,
    pre: Option<String>,
}

impl Semver {
    pub fn parse(input: &str) -> Result<Semver, VersionError> {
        let rest = input
            .strip_prefix('v')
            .ok_or_else(|| VersionError::MissingV {
                input: input.to_string(),
            })?;
        let (core, pre) = match rest.split_once('-') {
            Some((core, pre)) => (core, Some(pre)),
            None => (rest, None),
        };
        let parts: Vec<&str> = core.split('.').collect();
        if parts.len() != 3 {
            return Err(VersionError::Shape {
                input: input.to_string(),
            });
        }
        let num = |part: &str| -> Result<u64, VersionError> {
            let ok = !part.is_empty()
                && part.bytes().all(|b| b.is_ascii_digit())
                && (part == "0" || !part.starts_with('0'));
            if !ok {
                return Err(VersionError::Number {
                    input: input.to_string(),
                    part: part.to_string(),
                });
            }
            part.parse().map_err(|_| VersionError::Number {
                input: input.to_string(),
                part: part.to_string(),
            })
        };
        let (major, minor, patch) = (num(parts[0])?, num(parts[1])?, num(parts[2])?);
        if let Some(pre) = pre {
            let ok = !pre.is_empty()
                && !pre.starts_with('.')
                && !pre.ends_with('.')
                && pre.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'.');
            if !ok {
                return Err(VersionError::PreRelease {
                    input: input.to_string(),
                    pre: pre.to_string(),
                });
            }
        }
        Ok(Semver {
            major,
            minor,
            patch,
            pre: pre.map(str::to_string),
        })
    }

    pub fn new(major: u64, minor: u64, patch: u64) -> Semver {
        Semver {
            major,
            minor,
            patch,
            pre: None,
        }
    }

    pub fn major(&self) -> u64 {
        self.major
    }
    pub fn minor(&self) -> u64 {
        self.minor
    }
    pub fn patch(&self) -> u64 {
        self.patch
    }
    pub fn pre(&self) -> Option<&str> {
        self.pre.as_deref()
    }
    /// `(major, minor)`: the unit of the upgrade-path and support-window rules.
    pub fn minor_line(&self) -> (u64, u64) {
        (self.major, self.minor)
    }
}

fn cmp_pre(a: &Option<String>, b: &Option<String>) -> Ordering {
    match (a, b) {
        (None, None) => Ordering::Equal,
        (None, Some(_)) => Ordering::Greater,
        (Some(_), None) => Ordering::Less,
        (Some(a), Some(b)) => {
            // SemVer §11: dot-separated identifiers, numeric ones compare numerically.
            let mut ai = a.split('.');
            let mut bi = b.split('.');
            loop {
                match (ai.next(), bi.next()) {
                    (None, None) => return Ordering::Equal,
                    (None, Some(_)) => return Ordering::Less,
                    (Some(_), None) => return Ordering::Greater,
                    (Some(x), Some(y)) => {
                        let o = match (x.parse::<u64>(), y.parse::<u64>()) {
                            (Ok(x), Ok(y)) => x.cmp(&y),
                            (Ok(_), Err(_)) => Ordering::Less,
                            (Err(_), Ok(_)) => Ordering::Greater,
                            (Err(_), Err(_)) => x.cmp(y),
                        };
                        if o != Ordering::Equal {
                            return o;
                        }
                    }
                }
            }
        }
    }
}

impl Ord for Semver {
    fn cmp(&self, other: &Self) -> Ordering {
        (self.major, self.minor, self.patch)
            .cmp(&(other.major, other.minor, other.patch))
            .then_with(|| cmp_pre(&self.pre, &other.pre))
    }
}
impl PartialOrd for Semver {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl fmt::Display for Semver {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "v{}.{}.{}", self.major, self.minor, self.patch)?;
        if let Some(pre) = &self.pre {
            write!(f, "-{pre}")?;
        }
        Ok(())
    }
}
impl fmt::Debug for Semver {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{self}")
    }
}

macro_rules! version_type {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub struct $name(Semver);

        impl $name {
            pub fn parse(input: &str) -> Result<Self, VersionError> {
                Semver::parse(input).map($name)
            }
            pub fn new(major: u64, minor: u64, patch: u64) -> Self {
                $name(Semver::new(major, minor, patch))
            }
            pub fn semver(&self) -> &Semver {
                &self.0
            }
            pub fn minor_line(&self) -> (u64, u64) {
                self.0.minor_line()
            }
            pub fn major(&self) -> u64 {
                self.0.major
            }
            pub fn minor(&self) -> u64 {
                self.0.minor
            }
            pub fn patch(&self) -> u64 {
                self.0.patch
            }
        }
        impl FromStr for $name {
            type Err = VersionError;
            fn from_str(s: &str) -> Result<Self, VersionError> {
                Self::parse(s)
            }
        }
        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                fmt::Display::fmt(&self.0, f)
            }
        }
        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "{}({})", stringify!($name), self.0)
            }
        }
        impl serde::Serialize for $name {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.collect_str(self)
            }
        }
        impl<'de> serde::Deserialize<'de> for $name {
            fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                let s = String::deserialize(d)?;
                $name::parse(&s).map_err(serde::de::Error::custom)
            }
        }
        impl schemars::JsonSchema for $name {
            fn schema_name() -> std::borrow::Cow<'static, str> {
                stringify!($name).into()
            }
            fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
                schemars::json_schema!({
                    "type": "string",
                    "pattern": "^v(0|[1-9][0-9]*)\\.(0|[1-9][0-9]*)\\.(0|[1-9][0-9]*)(-[0-9A-Za-z]+(\\.[0-9A-Za-z]+)*)?$",
                    "examples": ["v1.13.9"]
                })
            }
        }
    };
}

version_type!(
    /// A Talos Linux release, e.g. `v1.13.9`.
    TalosVersion
);
impl TalosVersion {
    /// Whether a node running this version is upgraded through `LifecycleService.Upgrade`
    /// (>= v1.13.0: the new boot entry only; the caller drains and reboots) rather than the
    /// legacy `MachineService.Upgrade`, which drains the node itself, server-side, and reboots.
    /// Pre-releases of 1.13.0 order below it and take the legacy RPC, which every 1.13 build
    /// still serves. The one home of the rule: the Talos adapter picks its RPC by it
    /// (`talos::UpgradeRpc::for_running`), the journal names its method by it
    /// (`rollout::ports::UpgradeMethod::for_version`), and the planner notes by it that a
    /// pool's `drain.skipPods` does not hold on the legacy path.
    pub fn upgrades_through_lifecycle(&self) -> bool {
        *self >= TalosVersion::new(1, 13, 0)
    }
}

version_type!(
    /// A Kubernetes release, e.g. `v1.34.1`.
    KubeVersion
);
impl KubeVersion {
    /// The first release of the next minor, `v1.(N+1).0` for `v1.N.x`.
    pub fn next_minor(&self) -> KubeVersion {
        KubeVersion::new(self.major(), self.minor() + 1, 0)
    }

    /// Whether a cluster on `from` may move to `self` in one step: Kubernetes moves one
    /// minor at a time (kube-apiserver's version skew policy; `talosctl upgrade-k8s` refuses
    /// more), so `self` is on `from`'s major and at most one minor past it. Whether `self` is
    /// older than `from` is not this rule's question. The one home of the rule: the planner's
    /// skew refusal (`plan::compute::kube`) and the executor's pre-check
    /// (`rollout::sequencer::kube_prechecks`) ask it.
    pub fn within_one_minor_of(&self, from: &KubeVersion) -> bool {
        self.major() == from.major() && self.minor() <= from.minor() + 1
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_strict_versions() {
        let v = TalosVersion::parse("v1.13.9").unwrap();
        assert_eq!((v.major(), v.minor(), v.patch()), (1, 13, 9));
        assert_eq!(v.to_string(), "v1.13.9");
        let rc = TalosVersion::parse("v1.14.0-rc.1").unwrap();
        assert_eq!(rc.to_string(), "v1.14.0-rc.1");
        assert!(rc < TalosVersion::parse("v1.14.0").unwrap());
        assert!(rc > TalosVersion::parse("v1.13.9").unwrap());
    }

    #[test]
    fn kubernetes_moves_one_minor_at_a_time() {
        let v = |s: &str| KubeVersion::parse(s).unwrap();
        assert_eq!(v("v1.34.7").next_minor(), v("v1.35.0"));
        assert!(v("v1.35.0").within_one_minor_of(&v("v1.34.7")));
        assert!(v("v1.35.9").within_one_minor_of(&v("v1.34.1")));
        assert!(v("v1.34.9").within_one_minor_of(&v("v1.34.1")));
        assert!(!v("v1.36.0").within_one_minor_of(&v("v1.34.1")));
        assert!(!v("v2.0.0").within_one_minor_of(&v("v1.34.1")));
        assert!(!v("v2.35.0").within_one_minor_of(&v("v1.34.1")));
        // Older is not this rule's question (the callers refuse a downgrade first).
        assert!(v("v1.30.0").within_one_minor_of(&v("v1.34.1")));
    }

    #[test]
    fn refuses_sloppy_versions_with_reasons() {
        for (input, want) in [
            ("1.13.9", "must start with `v`"),
            ("v1.13", "three numeric parts"),
            ("v1.13.9.1", "three numeric parts"),
            ("v1.013.9", "leading zeros"),
            ("v1.x.9", "`x` is not a number"),
            ("v1.13.9-", "pre-release suffix"),
            ("v1.13.9-rc_1", "pre-release suffix"),
            ("v1.13.9+build", "`9+build` is not a number"),
            ("", "must start with `v`"),
        ] {
            let err = TalosVersion::parse(input).unwrap_err().to_string();
            assert!(err.contains(want), "{input:?}: {err}");
        }
    }

    #[test]
    fn orders_numerically_and_by_prerelease() {
        let mut vs: Vec<KubeVersion> = [
            "v1.10.0",
            "v1.9.10",
            "v1.10.0-beta.2",
            "v1.10.0-beta.10",
            "v1.10.0-alpha.1",
        ]
        .iter()
        .map(|s| KubeVersion::parse(s).unwrap())
        .collect();
        vs.sort();
        let got: Vec<String> = vs.iter().map(|v| v.to_string()).collect();
        assert_eq!(
            got,
            [
                "v1.9.10",
                "v1.10.0-alpha.1",
                "v1.10.0-beta.2",
                "v1.10.0-beta.10",
                "v1.10.0"
            ]
        );
    }
}
