//! Stage 2's installer rules: which installer each hop of a machine's path runs, and the
//! refusals that keep a rollout from pulling an image that does not exist or installing one
//! the machine cannot boot.
//!
//! - From Talos 1.14 `ghcr.io/siderolabs/installer` is not published (registry probes, talos
//!   `pkg/images/images.go` at HEAD: the default installer is the Image Factory's): a pool that
//!   names it for a hop to 1.14 or later is refused, and a pool that names no installer gets
//!   each machine's own Image Factory installer for those hops ([`factory_installer`]).
//! - A machine's factory installer is `<host>/<platform>-installer[-secureboot]/<schematic>`
//!   (talos `pkg/images/images.go`, `NewInstallerImageRepository`; image-factory
//!   `internal/frontend/http/registry.go`, `getRequestedImage`): the host from its
//!   `ImageFactorySchematic` (self-hosted and Omni factories), `-secureboot` when its
//!   `SecurityState` says SecureBoot (as Omni does, omni#253).
//! - A SecureBoot system cannot be upgraded with a non-SecureBoot installer and vice versa
//!   (talos#9245): a hop whose installer does not match is refused.
//! - An installer without the machine's schematic strips its system extensions; extensions
//!   without a known schematic are refused on every path, the factory's included.

use super::*;

/// Talos releases for which `ghcr.io/siderolabs/installer` is no longer published, so a pool
/// that names no installer gets each node's Image Factory installer: 1.14 and later (Talos
/// v1.14.0 release notes; registry probes: `v1.13.10` 200, `v1.14.0` 404).
pub(super) fn factory_only(v: &TalosVersion) -> bool {
    v.minor_line() >= (1, 14)
}

/// The schematic a machine runs: observed, else the one of the installer it was installed from.
pub(super) fn running_schematic(m: &Machine) -> Option<&str> {
    m.schematic
        .as_deref()
        .or_else(|| m.installer_image.as_deref().and_then(schematic_of))
}

/// A schematic that carries something (the empty one carries nothing).
pub(super) fn effective(s: Option<&str>) -> Option<&str> {
    s.filter(|s| *s != EMPTY_SCHEMATIC)
}

/// A machine's Image Factory installer repository: its factory's host (`factory.talos.dev`
/// when it named none), platform, SecureBoot and schematic (the one without customizations
/// when it runs none). The caller has checked that platform and SecureBoot are known.
pub(super) fn factory_repository(m: &Machine) -> String {
    let host = m.factory_host.as_deref().unwrap_or(DEFAULT_FACTORY);
    let platform = m.platform.as_deref().unwrap_or("metal");
    let secure = if m.secure_boot == Some(true) {
        "-secureboot"
    } else {
        ""
    };
    let schematic = running_schematic(m)
        .filter(|s| !s.is_empty())
        .unwrap_or(EMPTY_SCHEMATIC);
    format!("{host}/{platform}-installer{secure}/{schematic}")
}

/// A machine's Image Factory installer for `to` ([`factory_repository`] tagged).
pub(crate) fn factory_installer(m: &Machine, to: &TalosVersion) -> String {
    format!("{}:{to}", factory_repository(m))
}

/// What the installer checks of one pool collect, reported once per pool.
#[derive(Default)]
pub(super) struct InstallerFindings<'a> {
    /// Machines whose system extensions the installer would strip, with their schematic.
    /// `true` when every hop runs the machine's own factory installer.
    dropped: Vec<(&'a Machine, Option<String>, bool)>,
    /// Machines taken to Talos >= 1.14 with `ghcr.io/siderolabs/installer`.
    unpublished: Vec<&'a Machine>,
}

impl<'a> ClusterCtx<'a> {
    /// The installer rules for one member and its path: `false` (and a diagnostic, now or in
    /// [`Self::installer_findings`]) when the member cannot be planned.
    pub(super) fn installer_checks(
        &mut self,
        pool: &'a NodePool,
        m: &Member<'a>,
        path: &[TalosVersion],
        found: &mut InstallerFindings<'a>,
    ) -> bool {
        let machine = m.machine;
        if path.is_empty() {
            return true;
        }
        let named = pool.installer_named;
        let image = &pool.installer_image.value;
        let factory_hops = !named && path.iter().any(factory_only);
        // hops that run the pool's image: the named one, or the default below 1.14
        let pool_image_hops = named || path.iter().any(|v| !factory_only(v));
        let running = effective(running_schematic(machine));
        // reported with the other findings of the member, not instead of them
        let published = !(named && image.is_ghcr() && path.iter().any(factory_only));
        if !published {
            found.unpublished.push(machine);
        }
        // An installer without a schematic strips the node's system extensions: refused,
        // unless every hop resolves the node's own factory installer with its schematic.
        // Extensions without a known schematic have no installer that keeps them.
        if image.schematic().is_none()
            && ((running.is_none() && !machine.extensions.is_empty())
                || (pool_image_hops && running.is_some()))
        {
            found
                .dropped
                .push((machine, running.map(str::to_string), !pool_image_hops));
            return false;
        }
        if !published {
            return false;
        }
        if factory_hops && (machine.platform.is_none() || machine.secure_boot.is_none()) {
            let fact = if machine.platform.is_none() {
                "the platform"
            } else {
                "whether it booted with SecureBoot"
            };
            self.diags.push(
                Diagnostic::error(
                    codes::UNOBSERVED,
                    m.origin(pool),
                    format!(
                        "node pool `{}` names no installer and Talos {} has no default one, but {fact} of machine `{}` is unknown (its Talos API did not say at the last refresh)",
                        pool.name.value,
                        pool.talos_version.value,
                        machine.node
                    ),
                )
                .with_help("name the installer with `talos.installerImage: factory.talos.dev/<platform>-installer/<schematic>` (`-installer-secureboot` on a SecureBoot machine), or bring the node back and refresh the inventory"),
            );
            return false;
        }
        if let (true, Some(secure)) = (pool_image_hops, machine.secure_boot)
            && secure != image.secure_boot()
        {
            self.secure_boot_mismatch(pool, machine, secure);
            return false;
        }
        true
    }

    /// A SecureBoot machine and a non-SecureBoot installer, or the other way round.
    fn secure_boot_mismatch(&mut self, pool: &NodePool, machine: &Machine, secure: bool) {
        let image = &pool.installer_image.value;
        let named = if pool.installer_named {
            format!("installer image `{image}`")
        } else {
            format!("the default installer `{image}` (used for hops below Talos 1.14)")
        };
        let (message, label) = if secure {
            (
                format!(
                    "machine `{}` booted with SecureBoot, and {named} is not a SecureBoot installer: a SecureBoot system cannot be upgraded with a non-SecureBoot installer (talos#9245)",
                    machine.node
                ),
                "not a SecureBoot installer",
            )
        } else {
            (
                format!(
                    "machine `{}` did not boot with SecureBoot, and {named} is a SecureBoot installer: a non-SecureBoot system cannot be upgraded with a SecureBoot installer (talos#9245)",
                    machine.node
                ),
                "a SecureBoot installer",
            )
        };
        let own = if machine.platform.is_some() {
            format!(" (its own: `{}`)", factory_repository(machine))
        } else {
            String::new()
        };
        self.diags.push(
            Diagnostic::error(
                codes::SECURE_BOOT,
                pool.installer_image.origin.clone(),
                message,
            )
            .with_label(label)
            .with_help(format!(
                "put SecureBoot and non-SecureBoot machines in separate pools, each naming an installer of its kind{own}"
            )),
        );
    }

    /// The pool-wide diagnostics of [`Self::installer_checks`].
    pub(super) fn installer_findings(&mut self, pool: &NodePool, found: InstallerFindings<'a>) {
        if !found.unpublished.is_empty() {
            self.unpublished(pool, &found.unpublished);
        }
        for (machine, schematic, factory) in found.dropped {
            self.dropped(pool, machine, schematic, factory);
        }
    }

    /// `ghcr.io/siderolabs/installer` named for hops to Talos >= 1.14.
    fn unpublished(&mut self, pool: &NodePool, machines: &[&Machine]) {
        let mut own: Vec<(String, Vec<&str>)> = Vec::new();
        for m in machines {
            let repo = match (&m.platform, m.secure_boot) {
                (Some(_), Some(_)) => factory_repository(m),
                _ => format!(
                    "{}/<platform>-installer/<schematic> (platform or SecureBoot unknown)",
                    m.factory_host.as_deref().unwrap_or(DEFAULT_FACTORY)
                ),
            };
            match own.iter_mut().find(|(r, _)| *r == repo) {
                Some((_, nodes)) => nodes.push(&m.node),
                None => own.push((repo, vec![&m.node])),
            }
        }
        let list: Vec<String> = own
            .iter()
            .map(|(repo, nodes)| format!("`{repo}` for {}", nodes.join(", ")))
            .collect();
        let image = &pool.installer_image.value;
        self.diags.push(
            Diagnostic::error(
                codes::INSTALLER_UNPUBLISHED,
                pool.installer_image.origin.clone(),
                format!(
                    "installer image `{image}` is not published for Talos 1.14 and later, and node pool `{}` takes machines to Talos {} with it: every pull would fail",
                    pool.name.value, pool.talos_version.value
                ),
            )
            .with_label("no tags from v1.14.0")
            .with_help(format!(
                "from Talos 1.14 installers come from the Image Factory: remove `talos.installerImage` and each machine gets its own ({}), or name one of them",
                list.join("; ")
            )),
        );
    }

    /// An installer that would strip the system extensions of `machine`.
    fn dropped(
        &mut self,
        pool: &NodePool,
        machine: &Machine,
        schematic: Option<String>,
        factory: bool,
    ) {
        let node = &machine.node;
        let names: Vec<String> = machine
            .extensions
            .iter()
            .map(|(n, v)| format!("{n} {v}"))
            .collect();
        let plural = if names.len() == 1 { "" } else { "s" };
        let image = if factory && machine.platform.is_some() {
            format!(
                "its own Image Factory installer `{}`, without a schematic,",
                factory_repository(machine)
            )
        } else {
            format!("installer image `{}`", pool.installer_image.value)
        };
        let message = match (&schematic, names.is_empty()) {
            (Some(s), true) => format!(
                "{image} would drop Image Factory schematic {} that machine `{node}` runs",
                &s[..12.min(s.len())]
            ),
            (Some(s), false) => format!(
                "{image} would drop Image Factory schematic {} that machine `{node}` runs, and with it its system extension{plural} {}",
                &s[..12.min(s.len())],
                names.join(", ")
            ),
            (None, _) => format!(
                "{image} would drop the system extension{plural} that machine `{node}` runs: {}",
                names.join(", ")
            ),
        };
        let host = machine.factory_host.as_deref().unwrap_or(DEFAULT_FACTORY);
        let help = match (&schematic, machine.platform.as_deref()) {
            (Some(_), Some(_)) => format!(
                "keep the machine's system extensions with `installerImage: {}`",
                factory_repository(machine)
            ),
            (Some(s), None) => format!(
                "keep the machine's system extensions with `installerImage: {host}/installer/{s}`"
            ),
            (None, _) => "no schematic is known for them, so no installer medea can name keeps them: name one that carries them (an Image Factory schematic with these extensions: `installerImage: factory.talos.dev/<platform>-installer/<schematic>`)".to_string(),
        };
        self.diags.push(
            Diagnostic::error(
                codes::SCHEMATIC_DROPPED,
                pool.installer_image.origin.clone(),
                message,
            )
            .with_label("no schematic in this image")
            .with_help(help),
        );
    }
}
