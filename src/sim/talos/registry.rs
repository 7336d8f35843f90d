//! The simulated image registry: which installer images exist, what a pull of a missing one
//! answers, and whether the entry an installer wrote boots on a SecureBoot machine (issue #48
//! item 6). Everything the simulator models here is cited in design/sim.md, "Installers that
//! exist".
//!
//! - `ghcr.io/siderolabs/installer` has tags of Talos releases up to the 1.13 line only: from
//!   1.14 the project publishes installers through the Image Factory (registry probes of
//!   September 2026: `v1.13.10` 200, `v1.14.0`/`v1.14.1` 404; talos `pkg/images/images.go` at
//!   v1.13.9 vs HEAD).
//! - An Image Factory (`factory.talos.dev`, and each scenario node's `imageFactory`) serves
//!   `installer`, `installer-secureboot`, `<platform>-installer` and
//!   `<platform>-installer-secureboot` of a schematic it knows (the empty one, and the schematics
//!   of the scenario's nodes built by it), tagged with a Talos version: siderolabs/image-factory
//!   `internal/frontend/http/registry.go` (`getRequestedImage` refuses other image names,
//!   `schematicFactory.Get` an unknown schematic, and a `v…` tag builds the installer).
//! - Any other registry (a private mirror) is served unchecked.

use std::collections::{BTreeMap, BTreeSet};

use tonic::Status;

use super::scenario::{NodeSpec, Scenario};
use crate::image::{
    DEFAULT_FACTORY, EMPTY_SCHEMATIC, GHCR_INSTALLER, factory_installer_of, name_and_tag,
};
use crate::version::TalosVersion;

/// What the simulated registries hold.
#[derive(Debug, Clone, Default)]
pub(crate) struct Registry {
    /// Factory host → the schematics it knows.
    factories: BTreeMap<String, BTreeSet<String>>,
}

impl Registry {
    /// The registries of a scenario: `factory.talos.dev` and every node's factory, each
    /// knowing the empty schematic and the schematics of its nodes.
    pub fn of(scenario: &Scenario) -> Registry {
        let mut factories: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        factories
            .entry(DEFAULT_FACTORY.to_string())
            .or_default()
            .insert(EMPTY_SCHEMATIC.to_string());
        for n in &scenario.nodes {
            let known = factories.entry(n.factory_host().to_string()).or_default();
            known.insert(EMPTY_SCHEMATIC.to_string());
            known.extend(n.schematic.clone());
        }
        Registry { factories }
    }

    /// `Ok` when `image` can be pulled, else why the registry answered 404 (containerd's
    /// resolver error, as machined relays it).
    pub fn lookup(&self, image: &str) -> Result<(), String> {
        let (name, tag) = name_and_tag(image);
        let not_found = || format!("failed to resolve reference {image:?}: {image}: not found");
        if name == GHCR_INSTALLER {
            return match tag.and_then(|t| TalosVersion::parse(t).ok()) {
                Some(v) if v.minor_line() <= (1, 13) => Ok(()),
                _ => Err(not_found()),
            };
        }
        let host = name.split('/').next().unwrap_or("");
        let Some(known) = self.factories.get(host) else {
            return Ok(());
        };
        let Some(f) = factory_installer_of(image) else {
            return Err(not_found());
        };
        let version = f.tag.and_then(|t| TalosVersion::parse(t).ok());
        if known.contains(f.schematic) && version.is_some() {
            Ok(())
        } else {
            Err(not_found())
        }
    }
}

/// `ImageService.Pull` (and the deprecated `MachineService.ImagePull`) of an image the registry
/// does not have: siderolabs/talos `internal/app/images/images.go`, `Pull`: containerd's
/// not-found becomes `NotFound "error pulling image: …"`.
pub(crate) fn pull_not_found(why: &str) -> Status {
    Status::not_found(format!("error pulling image: {why}"))
}

/// The legacy `MachineService.Upgrade`, which pulls and validates the installer before it
/// answers (`v1alpha1_server.go`, `Upgrade`: "error validating installer image %q: %w", a plain
/// Go error, so gRPC `Unknown`).
pub(crate) fn legacy_upgrade_not_found(image: &str, why: &str) -> Status {
    Status::unknown(format!(
        "error validating installer image {image:?}: {}",
        pull_not_found(why).message()
    ))
}

/// `LifecycleService.Upgrade` with an installer that is not in the system containerd namespace:
/// `internal/app/lifecycle/container.go` fails with "installer image %q not found in containerd
/// store", which `lifecycle.go` returns as `Internal "upgrade failed: …"`.
pub(crate) fn lifecycle_not_found(image: &str) -> Status {
    Status::internal(format!(
        "upgrade failed: installer image {image:?} not found in containerd store: image \"{image}\": not found"
    ))
}

/// Whether the entry `image` wrote is refused by the node's firmware at the next boot: a
/// SecureBoot machine loads only signed boot assets, and a non-SecureBoot installer writes
/// unsigned ones (talos#9245: "You can't upgrade non-SecureBoot system to use SecureBoot and
/// vice versa"; talos#8097: the firmware answers "Error loading \EFI\Linux\Talos-….efi: Access
/// denied" and systemd-boot halts). The machine never comes back on its own.
pub(crate) fn firmware_refuses(node: &NodeSpec, image: &str) -> bool {
    node.secure_boot && !crate::image::is_secure_boot_installer(image)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scenario() -> Scenario {
        let text = format!(
            "nodes:\n  - {{ name: cp-1, address: 127.5.0.2, role: controlplane, talos: v1.13.10, kubernetes: v1.35.8 }}\n  - {{ name: w-1, address: 127.5.0.5, role: worker, talos: v1.13.10, kubernetes: v1.35.8, imageFactory: factory.example.org, schematic: {S}, secureBoot: true }}\n"
        );
        Scenario::parse(&text, std::path::Path::new("s.yaml")).unwrap()
    }
    const S: &str = "ce4c980550dd2ab1b17bbf2b08801c7eb59418eafe8f279833297925d67c7515";

    #[test]
    fn ghcr_publishes_installers_up_to_talos_1_13() {
        let r = Registry::of(&scenario());
        assert!(r.lookup("ghcr.io/siderolabs/installer:v1.13.10").is_ok());
        assert!(r.lookup("ghcr.io/siderolabs/installer:v1.12.11").is_ok());
        let e = r
            .lookup("ghcr.io/siderolabs/installer:v1.14.6")
            .unwrap_err();
        assert_eq!(
            e,
            "failed to resolve reference \"ghcr.io/siderolabs/installer:v1.14.6\": ghcr.io/siderolabs/installer:v1.14.6: not found"
        );
        assert!(r.lookup("ghcr.io/siderolabs/installer:latest").is_err());
        // other registries are not modelled
        assert!(r.lookup("registry.local:5000/installer:v1.14.6").is_ok());
        assert!(r.lookup("registry.k8s.io/kube-apiserver:v1.35.8").is_ok());
    }

    #[test]
    fn factories_serve_the_installers_of_the_schematics_they_know() {
        let r = Registry::of(&scenario());
        for ok in [
            format!("factory.talos.dev/metal-installer/{EMPTY_SCHEMATIC}:v1.14.6"),
            format!("factory.talos.dev/installer/{EMPTY_SCHEMATIC}:v1.14.6"),
            format!("factory.talos.dev/aws-installer-secureboot/{EMPTY_SCHEMATIC}:v1.14.6"),
            format!("factory.example.org/metal-installer-secureboot/{S}:v1.14.6"),
            format!("factory.example.org/installer-secureboot/{S}:v1.13.10"),
        ] {
            assert!(r.lookup(&ok).is_ok(), "{ok}");
        }
        for missing in [
            // a schematic the public factory was never given
            format!("factory.talos.dev/metal-installer/{S}:v1.14.6"),
            // not an installer the factory builds
            format!("factory.talos.dev/metal-imager/{EMPTY_SCHEMATIC}:v1.14.6"),
            "factory.talos.dev/installer/abc:v1.14.6".to_string(),
            format!("factory.example.org/metal-installer/{S}:latest"),
        ] {
            assert!(r.lookup(&missing).is_err(), "{missing}");
        }
    }

    #[test]
    fn a_secure_boot_machine_refuses_what_a_plain_installer_wrote() {
        let s = scenario();
        let (cp, w) = (&s.nodes[0], &s.nodes[1]);
        assert!(firmware_refuses(
            w,
            &format!("factory.example.org/metal-installer/{S}:v1.14.6")
        ));
        assert!(!firmware_refuses(
            w,
            &format!("factory.example.org/metal-installer-secureboot/{S}:v1.14.6")
        ));
        assert!(!firmware_refuses(
            cp,
            "ghcr.io/siderolabs/installer:v1.13.10"
        ));
    }
}
