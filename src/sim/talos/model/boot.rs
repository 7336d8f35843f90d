//! Boot entries as upstream's bootloaders keep them (issue #48 item 2): which entries exist,
//! which one boots next, which ones an install removes or overwrites, and what a rollback can
//! still reach.
//!
//! **systemd-boot** (siderolabs/talos
//! `internal/app/machined/pkg/runtime/v1alpha1/bootloader/sdboot/sdboot.go`): the ESP holds UKIs
//! `EFI/Linux/Talos-<v>[~N].efi`; `LoaderEntryDefault` names the one that boots next. An
//! install in upgrade mode probes the entry it takes for *current*, removes **every other UKI**,
//! writes the new one (named by `generateNextUKIName` over the files found) and points
//! `LoaderEntryDefault` at it. Which entry the probe takes for current:
//! - before PR #14003 (`ProbeWithCallback` at v1.13.x/v1.14.x): `LoaderEntryDefault` when it
//!   names a file, else `LoaderEntrySelected` — so on a node whose default already names a
//!   staged entry, the *staged* entry is kept and the running one is deleted;
//! - after PR #14003 (`findBootedUKIFile`): the booted entry (`LoaderEntrySelected`), except
//!   after a kexec reboot (`LoaderEntryOneShot` = "kexec reboot", `LoaderEntryRebootReason` =
//!   "reboot"), where sd-boot did not run and the default is taken as booted — again the staged
//!   entry when one was staged before the install.
//!
//! **GRUB** (`…/bootloader/grub/boot_label.go`, `upgrade.go`, `revert.go`): two labels, `A` and
//! `B`; an upgrade flips the *configured default* (not the booted label) and writes the new
//! kernel into the label it flipped to. A second install on a staged node flips back onto the
//! running label and overwrites it. A revert flips the default and refuses a label that does
//! not exist.

use super::SimNode;
use crate::version::TalosVersion;

/// The first installer version whose sd-boot probe keeps the booted entry (talos PR #14003,
/// merged into main in August 2026, after the 1.14 branch was cut). Whether release-1.14 got it
/// could not be verified: the simulator assumes it did not, so older installers show the
/// default-first probe.
pub const SDBOOT_KEEPS_BOOTED_FROM: (u64, u64) = (1, 15);

/// A GRUB boot label.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub enum Label {
    #[default]
    A,
    B,
}

impl Label {
    /// `flipBootLabel`.
    pub fn flip(self) -> Label {
        match self {
            Label::A => Label::B,
            Label::B => Label::A,
        }
    }
    fn index(self) -> usize {
        match self {
            Label::A => 0,
            Label::B => 1,
        }
    }
}

/// GRUB's state on the BOOT partition: the default label and the version in each label, and
/// the label booted now (the truth, which the API does not show).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Grub {
    pub default: Label,
    pub booted: Label,
    pub slots: [Option<TalosVersion>; 2],
}

impl Grub {
    pub fn fresh(running: &TalosVersion) -> Grub {
        Grub {
            default: Label::A,
            booted: Label::A,
            slots: [Some(running.clone()), None],
        }
    }
    fn slot(&self, l: Label) -> Option<&TalosVersion> {
        self.slots[l.index()].as_ref()
    }
}

/// The version a UKI file name carries (`Talos-<v>.efi`, `Talos-<v>~<N>.efi`).
pub fn uki_version(name: &str) -> Option<TalosVersion> {
    let base = name.strip_prefix("Talos-")?.strip_suffix(".efi")?;
    let v = base.split_once('~').map_or(base, |(v, _)| v);
    TalosVersion::parse(v).ok()
}

/// `generateNextUKIName`: `Talos-<v>.efi`, or `Talos-<v>~<max+1>.efi` when files of that
/// version are on the ESP already.
pub fn next_uki_name(version: &TalosVersion, files: &[String]) -> String {
    let plain = format!("Talos-{version}");
    let mut max: Option<u32> = None;
    for f in files {
        let Some(base) = f.strip_suffix(".efi") else {
            continue;
        };
        let idx = if base == plain {
            Some(0)
        } else {
            base.strip_prefix(&plain)
                .and_then(|r| r.strip_prefix('~'))
                .and_then(|n| n.parse::<u32>().ok())
        };
        if let Some(i) = idx {
            max = Some(max.map_or(i, |m| m.max(i)));
        }
    }
    match max {
        Some(m) => format!("{plain}~{}.efi", m + 1),
        None => format!("{plain}.efi"),
    }
}

impl SimNode {
    /// The entry the next boot boots and its version: sd-boot's `LoaderEntryDefault` when it
    /// names a UKI on the ESP, else the entry booted now (sd-boot's fallback); GRUB's default
    /// label.
    pub fn next_entry(&self) -> Option<(String, TalosVersion)> {
        if self.bootloader.sd_boot() {
            let name = self
                .loader_default
                .as_ref()
                .filter(|d| self.ukis.contains(d))
                .unwrap_or(&self.loader_selected);
            uki_version(name).map(|v| (name.clone(), v))
        } else {
            let l = self.grub.default;
            self.grub.slot(l).map(|v| (format!("{l:?}"), v.clone()))
        }
    }

    /// The entry booted now.
    pub fn booted_entry(&self) -> String {
        if self.bootloader.sd_boot() {
            self.loader_selected.clone()
        } else {
            format!("{:?}", self.grub.booted)
        }
    }

    /// Every boot entry on the node, with its version (sd-boot: the UKIs; GRUB: the labels that
    /// hold a kernel).
    pub fn boot_entries(&self) -> Vec<(String, TalosVersion)> {
        if self.bootloader.sd_boot() {
            self.ukis
                .iter()
                .filter_map(|u| uki_version(u).map(|v| (u.clone(), v)))
                .collect()
        } else {
            [Label::A, Label::B]
                .into_iter()
                .filter_map(|l| self.grub.slot(l).map(|v| (format!("{l:?}"), v.clone())))
                .collect()
        }
    }

    /// `installed` follows the entries: the version of the next boot's entry when it is not
    /// the entry booted now (or holds another kernel: a GRUB label written over).
    pub(super) fn sync_installed(&mut self) {
        self.installed = self
            .next_entry()
            .filter(|(name, v)| *name != self.booted_entry() || *v != self.running)
            .map(|(_, v)| v);
    }

    /// The installer's bootloader part of an upgrade-mode install of `target`: entries removed
    /// or overwritten as upstream does (module doc), the new entry made the default. `Err`: the
    /// installer's failure (its exit code is non-zero), nothing changed.
    pub(super) fn install_boot_entry(&mut self, target: &TalosVersion) -> Result<(), String> {
        if self.bootloader.sd_boot() {
            let keep = self.sdboot_probe(target)?;
            let name = next_uki_name(target, &self.ukis);
            self.ukis.retain(|u| *u == keep);
            self.ukis.push(name.clone());
            self.loader_default = Some(name);
        } else {
            // `Config.flip` (only when the configured default exists), then `copyAssets` into
            // the label flipped to
            if self.grub.slot(self.grub.default).is_some() {
                self.grub.default = self.grub.default.flip();
            }
            self.grub.slots[self.grub.default.index()] = Some(target.clone());
        }
        self.sync_installed();
        Ok(())
    }

    /// The UKI the installer of `installer` takes for current (and keeps).
    fn sdboot_probe(&self, installer: &TalosVersion) -> Result<String, String> {
        let on_esp = |e: Option<&String>| e.filter(|e| self.ukis.contains(e)).cloned();
        let default = on_esp(self.loader_default.as_ref());
        let selected = on_esp(Some(&self.loader_selected));
        let kept = if installer.minor_line() >= SDBOOT_KEEPS_BOOTED_FROM && !self.kexec_boot {
            selected.or(default)
        } else {
            default.or(selected)
        };
        kept.ok_or_else(|| {
            "sd-boot: no valid boot entry found matching LoaderEntryDefault or LoaderEntrySelected"
                .to_string()
        })
    }

    /// The bootloader part of `MachineService.Rollback`: sd-boot points the default at the
    /// first UKI other than the one booting next (`revert`, "previous UKI not found" without
    /// one); GRUB flips the default label and refuses one that holds nothing.
    pub(super) fn revert_boot_entry(&mut self) -> Result<(), String> {
        if self.bootloader.sd_boot() {
            let next = self.next_entry().map(|(n, _)| n);
            let mut others: Vec<&String> = self
                .ukis
                .iter()
                .filter(|u| Some(*u) != next.as_ref())
                .collect();
            others.sort();
            let Some(other) = others.first() else {
                return Err("previous UKI not found".into());
            };
            self.loader_default = Some((*other).clone());
        } else {
            let flipped = self.grub.default.flip();
            if self.grub.slot(flipped).is_none() {
                return Err("cannot rollback to \"\", label does not exist".into());
            }
            self.grub.default = flipped;
        }
        self.sync_installed();
        Ok(())
    }

    /// The boot itself: the next entry becomes the booted one (`fallback`: the boot of a new
    /// entry failed and the bootloader fell back to the booted one, made the default again).
    /// `true` when the node changed entry.
    pub(super) fn boot_next_entry(&mut self, fallback: bool) -> bool {
        let Some((name, version)) = self.next_entry() else {
            return false;
        };
        // a GRUB label written over by a second install boots its new kernel under the same name
        let changed = name != self.booted_entry() || version != self.running;
        if changed && fallback {
            if self.bootloader.sd_boot() {
                if self.loader_default.is_some() {
                    self.loader_default = Some(self.loader_selected.clone());
                }
            } else {
                self.grub.default = self.grub.booted;
            }
        } else if changed {
            self.previous = Some((self.running.clone(), self.booted_entry()));
            self.running = version;
            if self.bootloader.sd_boot() {
                self.loader_selected = name;
            } else {
                self.grub.booted = self.grub.default;
            }
        }
        self.sync_installed();
        changed && !fallback
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uki_names_carry_their_version_and_reinstalls_count_up() {
        let v = TalosVersion::parse("v1.13.9").unwrap();
        assert_eq!(uki_version("Talos-v1.13.9~2.efi"), Some(v.clone()));
        assert_eq!(uki_version("BOOTX64.efi"), None);
        assert_eq!(next_uki_name(&v, &[]), "Talos-v1.13.9.efi");
        let files = ["Talos-v1.13.2.efi".into(), "Talos-v1.13.9.efi".into()];
        assert_eq!(next_uki_name(&v, &files), "Talos-v1.13.9~1.efi");
        let files = ["Talos-v1.13.9~3.efi".into(), "Talos-v1.13.9.efi".into()];
        assert_eq!(next_uki_name(&v, &files), "Talos-v1.13.9~4.efi");
    }
}
