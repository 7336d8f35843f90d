//! The compatibility catalog: which Talos releases exist, and which Kubernetes versions each
//! Talos minor supports. Built in and versioned ([`CATALOG_VERSION`]); a cluster's
//! `upgradePolicy` can add releases and override support windows.
//!
//! Sources (checked 2026-12-04; siderolabs/talos snapshot of 2026-08-21 for the code, release
//! notes and announcements since for the newer patches):
//!
//! - **Support windows** come from `pkg/machinery/compatibility/talos1XX/talos1XX.go` in
//!   siderolabs/talos (`MinimumKubernetesVersion` / `MaximumKubernetesVersion`), which
//!   `talosctl upgrade-k8s` enforces through `KubernetesVersion.SupportedWith`:
//!   1.10: 1.28.0–1.33.99, 1.11: 1.29.0–1.34.99, 1.12: 1.30.0–1.35.99, 1.13: 1.31.0–1.36.99,
//!   1.14: 1.32.0–1.37.99, 1.15: 1.33.0–1.38.99 (`talos115`, on main: Talos 1.15 is in
//!   development; its host minimum is 1.13.0, `MinimumHostUpgradeVersion`).
//! - **Latest patches** come from the release announcements and release PRs of siderolabs/talos:
//!   v1.10.9 (release PR #12479, 2025-12-23), v1.11.6 (release PR #12428, 2025-12-16),
//!   v1.12.12 (2026-09-04; Kubernetes 1.35.8, etcd 3.6.14), v1.13.10 (2026-09-03),
//!   v1.14.6 (2026-11-11; 1.14.4 of 2026-10-16 moved to Kubernetes v1.37.1 and etcd v3.7.2).
//!   Kubernetes: 1.37 is GA (1.37.1 shipped by 2026-10-16), supported branches 1.37, 1.36, 1.35.
//!
//! medea's path rule is stricter than Talos' own (`MinimumHostUpgradeVersion` lets Talos 1.13
//! install over 1.11): one minor per hop, through the newest stable patch of each minor.

use std::collections::{BTreeMap, BTreeSet};

use crate::desired::model::{MinorLine, UpgradePolicy};
use crate::version::{KubeVersion, TalosVersion};

/// Version of the built-in tables; part of every plan id, so a medea with newer tables never
/// approves a plan computed with older ones.
pub const CATALOG_VERSION: &str = "2026-12-04.1";

/// Kubernetes minors a Talos minor supports (both ends inclusive).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Window {
    /// The oldest supported Kubernetes minor.
    pub min: MinorLine,
    /// The newest supported Kubernetes minor.
    pub max: MinorLine,
}

impl Window {
    /// Whether `k`'s minor is in the window.
    pub fn contains(&self, k: &KubeVersion) -> bool {
        let line = k.minor_line();
        self.min <= line && line <= self.max
    }
}

impl std::fmt::Display for Window {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Kubernetes {}.{} to {}.{}",
            self.min.0, self.min.1, self.max.0, self.max.1
        )
    }
}

/// (Talos minor, oldest and newest supported Kubernetes minor.)
const SUPPORT: &[(MinorLine, MinorLine, MinorLine)] = &[
    ((1, 10), (1, 28), (1, 33)),
    ((1, 11), (1, 29), (1, 34)),
    ((1, 12), (1, 30), (1, 35)),
    ((1, 13), (1, 31), (1, 36)),
    ((1, 14), (1, 32), (1, 37)),
    ((1, 15), (1, 33), (1, 38)),
];

/// The newest known release of each minor (pre-releases included; they are never stops), each
/// with where it is published: its release on GitHub, and the release PR where there is one.
/// A test refuses a version without a citation.
const RELEASES: &[(&str, &str)] = &[
    (
        "v1.10.9",
        "https://github.com/siderolabs/talos/releases/tag/v1.10.9 (release PR https://github.com/siderolabs/talos/pull/12479, 2025-12-23)",
    ),
    (
        "v1.11.6",
        "https://github.com/siderolabs/talos/releases/tag/v1.11.6 (release PR https://github.com/siderolabs/talos/pull/12428, 2025-12-16)",
    ),
    (
        "v1.12.12",
        "https://github.com/siderolabs/talos/releases/tag/v1.12.12 (2026-09-04)",
    ),
    (
        "v1.13.10",
        "https://github.com/siderolabs/talos/releases/tag/v1.13.10 (2026-09-03)",
    ),
    (
        "v1.14.6",
        "https://github.com/siderolabs/talos/releases/tag/v1.14.6 (2026-11-11)",
    ),
];

/// Where the catalog's release `v` is published ([`RELEASES`]), if it lists it.
pub fn release_source(v: &TalosVersion) -> Option<&'static str> {
    RELEASES
        .iter()
        .find(|(r, _)| TalosVersion::parse(r).is_ok_and(|r| &r == v))
        .map(|(_, source)| *source)
}

/// Why no upgrade path exists.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PathError {
    /// The target is older than the running version and downgrades are not allowed.
    Downgrade,
    /// The path crosses a major version; the catalog only orders minors of one major.
    Major,
    /// An intermediate minor has no known stable release to stop at.
    NoRelease {
        /// The minor without a release.
        minor: MinorLine,
    },
}

/// A catalog: the built-in tables plus a cluster's overrides.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Catalog {
    releases: BTreeMap<MinorLine, BTreeSet<TalosVersion>>,
    support: BTreeMap<MinorLine, Window>,
    overridden: bool,
}

impl Catalog {
    /// The catalog built into this medea ([`CATALOG_VERSION`]).
    #[allow(
        clippy::expect_used,
        reason = "the built-in release table is constant and a unit test parses every entry"
    )]
    pub fn builtin() -> Catalog {
        let mut releases: BTreeMap<MinorLine, BTreeSet<TalosVersion>> = BTreeMap::new();
        for (r, _) in RELEASES {
            let v = TalosVersion::parse(r).expect("built-in releases parse");
            releases.entry(v.minor_line()).or_default().insert(v);
        }
        let support = SUPPORT
            .iter()
            .map(|(t, min, max)| {
                (
                    *t,
                    Window {
                        min: *min,
                        max: *max,
                    },
                )
            })
            .collect();
        Catalog {
            releases,
            support,
            overridden: false,
        }
    }

    /// The built-in catalog with a cluster's `upgradePolicy` additions applied.
    pub fn for_policy(policy: &UpgradePolicy) -> Catalog {
        let mut c = Catalog::builtin();
        for r in &policy.talos_releases {
            c.releases
                .entry(r.minor_line())
                .or_default()
                .insert(r.clone());
            c.overridden = true;
        }
        for w in &policy.kubernetes_support {
            c.support.insert(
                w.talos,
                Window {
                    min: w.min_kubernetes,
                    max: w.max_kubernetes,
                },
            );
            c.overridden = true;
        }
        c
    }

    /// `2026-12-04.1`, or `2026-12-04.1+overrides` when the desired state changed the tables.
    pub fn version(&self) -> String {
        if self.overridden {
            format!("{CATALOG_VERSION}+overrides")
        } else {
            CATALOG_VERSION.to_string()
        }
    }

    /// The newest stable (non-pre-release) known release of a minor.
    pub fn latest_stable(&self, minor: MinorLine) -> Option<&TalosVersion> {
        self.releases
            .get(&minor)?
            .iter()
            .rev()
            .find(|v| v.semver().pre().is_none())
    }

    /// The Kubernetes minors Talos minor `talos` supports, if the catalog knows it.
    pub fn window(&self, talos: MinorLine) -> Option<Window> {
        self.support.get(&talos).copied()
    }

    /// Every Talos minor whose support window contains `kube`, oldest first.
    pub fn talos_minors_supporting(&self, kube: &KubeVersion) -> Vec<MinorLine> {
        self.support
            .iter()
            .filter(|(_, w)| w.contains(kube))
            .map(|(t, _)| *t)
            .collect()
    }

    /// The hops from `from` to `to`: one minor at a time, stopping at the newest stable patch
    /// of every minor strictly between them; the last hop is `to` itself (which may be a
    /// pre-release, when that is what the desired state asks for). Empty when `from == to`.
    pub fn talos_path(
        &self,
        from: &TalosVersion,
        to: &TalosVersion,
        allow_downgrade: bool,
    ) -> Result<Vec<TalosVersion>, PathError> {
        if from == to {
            return Ok(Vec::new());
        }
        if to < from && !allow_downgrade {
            return Err(PathError::Downgrade);
        }
        if from.major() != to.major() {
            return Err(PathError::Major);
        }
        let (a, b) = (from.minor(), to.minor());
        let between: Vec<u64> = if a < b {
            (a + 1..b).collect()
        } else {
            (b + 1..a).rev().collect()
        };
        let mut path = Vec::with_capacity(between.len() + 1);
        for m in between {
            let minor = (to.major(), m);
            match self.latest_stable(minor) {
                Some(v) => path.push(v.clone()),
                None => return Err(PathError::NoRelease { minor }),
            }
        }
        path.push(to.clone());
        Ok(path)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::desired::model::SupportOverride;

    fn t(s: &str) -> TalosVersion {
        TalosVersion::parse(s).unwrap()
    }
    fn k(s: &str) -> KubeVersion {
        KubeVersion::parse(s).unwrap()
    }

    #[test]
    fn two_minors_are_two_hops_through_the_latest_patch() {
        let c = Catalog::builtin();
        assert_eq!(
            c.talos_path(&t("v1.11.5"), &t("v1.13.9"), false).unwrap(),
            [t("v1.12.12"), t("v1.13.9")]
        );
        assert_eq!(
            c.talos_path(&t("v1.10.2"), &t("v1.13.9"), false).unwrap(),
            [t("v1.11.6"), t("v1.12.12"), t("v1.13.9")]
        );
        assert_eq!(
            c.talos_path(&t("v1.12.11"), &t("v1.14.6"), false).unwrap(),
            [t("v1.13.10"), t("v1.14.6")]
        );
        // Within a minor, or to the next one: a single hop, even from an old patch.
        assert_eq!(
            c.talos_path(&t("v1.12.3"), &t("v1.13.9"), false).unwrap(),
            [t("v1.13.9")]
        );
        assert_eq!(
            c.talos_path(&t("v1.13.2"), &t("v1.13.9"), false).unwrap(),
            [t("v1.13.9")]
        );
        assert!(
            c.talos_path(&t("v1.13.9"), &t("v1.13.9"), false)
                .unwrap()
                .is_empty()
        );
    }

    /// Issue #48 item 7: every version the catalog lists cites where it was published (its
    /// GitHub release, or the release PR), so a reviewer can check it.
    #[test]
    fn every_listed_release_cites_its_release_url_or_pr() {
        assert!(!RELEASES.is_empty());
        for (version, source) in RELEASES {
            let v = t(version);
            let release = format!("https://github.com/siderolabs/talos/releases/tag/{version}");
            assert!(
                source.contains(&release)
                    || source.contains("https://github.com/siderolabs/talos/pull/"),
                "{version} cites no release URL or PR: {source:?}"
            );
            assert_eq!(release_source(&v), Some(*source));
        }
        let c = Catalog::builtin();
        for minor in [(1, 10), (1, 11), (1, 12), (1, 13), (1, 14)] {
            let latest = c.latest_stable(minor).unwrap();
            assert!(release_source(latest).is_some(), "{latest}");
        }
        assert_eq!(release_source(&t("v1.14.5")), None);
    }

    #[test]
    fn todays_releases_are_the_stops() {
        let c = Catalog::builtin();
        assert_eq!(c.latest_stable((1, 12)), Some(&t("v1.12.12")));
        assert_eq!(c.latest_stable((1, 13)), Some(&t("v1.13.10")));
        assert_eq!(c.latest_stable((1, 14)), Some(&t("v1.14.6")));
        assert_eq!(c.latest_stable((1, 15)), None);
    }

    #[test]
    fn prereleases_are_never_stops_but_may_be_targets() {
        let c = Catalog::for_policy(&UpgradePolicy {
            allow_downgrade: false,
            talos_releases: vec![t("v1.15.0-beta.0")],
            kubernetes_support: Vec::new(),
            removed_apis: Vec::new(),
        });
        assert_eq!(c.latest_stable((1, 15)), None);
        assert_eq!(
            c.talos_path(&t("v1.14.6"), &t("v1.15.0-beta.0"), false)
                .unwrap(),
            [t("v1.15.0-beta.0")]
        );
        assert_eq!(
            c.talos_path(&t("v1.14.6"), &t("v1.16.0"), false),
            Err(PathError::NoRelease { minor: (1, 15) })
        );
        assert_eq!(
            c.talos_path(&t("v1.13.9"), &t("v1.15.0"), false).unwrap(),
            [t("v1.14.6"), t("v1.15.0")]
        );
    }

    #[test]
    fn downgrades_and_majors() {
        let c = Catalog::builtin();
        assert_eq!(
            c.talos_path(&t("v1.13.9"), &t("v1.12.4"), false),
            Err(PathError::Downgrade)
        );
        assert_eq!(
            c.talos_path(&t("v1.13.9"), &t("v1.11.2"), true).unwrap(),
            [t("v1.12.12"), t("v1.11.2")]
        );
        assert_eq!(
            c.talos_path(&t("v1.13.9"), &t("v2.0.0"), false),
            Err(PathError::Major)
        );
    }

    #[test]
    fn support_windows_match_the_talos_tables() {
        let c = Catalog::builtin();
        let cases = [
            ((1, 10), "v1.28.0", "v1.33.12", "v1.27.9", "v1.34.0"),
            ((1, 11), "v1.29.0", "v1.34.5", "v1.28.3", "v1.35.0"),
            ((1, 12), "v1.30.0", "v1.35.9", "v1.29.1", "v1.36.0"),
            ((1, 13), "v1.31.0", "v1.36.3", "v1.30.4", "v1.37.0"),
            ((1, 14), "v1.32.0", "v1.37.1", "v1.31.0", "v1.38.0"),
            ((1, 15), "v1.33.0", "v1.38.2", "v1.32.9", "v1.39.0"),
        ];
        for (minor, lo, hi, below, above) in cases {
            let w = c.window(minor).unwrap();
            assert!(w.contains(&k(lo)) && w.contains(&k(hi)), "{minor:?}");
            assert!(
                !w.contains(&k(below)) && !w.contains(&k(above)),
                "{minor:?}"
            );
        }
        assert_eq!(c.window((1, 16)), None);
        assert_eq!(c.window((1, 9)), None);
    }

    #[test]
    fn policy_adds_releases_and_overrides_windows() {
        let policy = UpgradePolicy {
            allow_downgrade: false,
            talos_releases: vec![t("v1.14.7"), t("v1.12.13")],
            kubernetes_support: vec![SupportOverride {
                talos: (1, 16),
                min_kubernetes: (1, 34),
                max_kubernetes: (1, 39),
            }],
            removed_apis: Vec::new(),
        };
        let c = Catalog::for_policy(&policy);
        assert_eq!(c.latest_stable((1, 12)), Some(&t("v1.12.13")));
        assert_eq!(c.latest_stable((1, 14)), Some(&t("v1.14.7")));
        assert_eq!(
            c.talos_path(&t("v1.13.9"), &t("v1.15.0"), false).unwrap(),
            [t("v1.14.7"), t("v1.15.0")]
        );
        assert!(c.window((1, 16)).unwrap().contains(&k("v1.39.2")));
        assert_eq!(c.version(), format!("{CATALOG_VERSION}+overrides"));
        assert_eq!(Catalog::builtin().version(), CATALOG_VERSION);
    }
}
