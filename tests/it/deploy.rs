//! deploy/: the systemd unit is valid and hardened.

use std::path::PathBuf;

fn deploy() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("deploy")
}

#[test]
fn systemd_unit_is_hardened() {
    let unit = std::fs::read_to_string(deploy().join("medea.service")).unwrap();
    for line in [
        "Type=notify",
        "User=medea",
        "StateDirectory=medea",
        "ProtectSystem=strict",
        "NoNewPrivileges=yes",
        "PrivateTmp=yes",
        "CapabilityBoundingSet=",
        "UMask=0077",
        // the default soft limit of 1024 is too few (issue #32)
        "LimitNOFILE=65536",
    ] {
        assert!(unit.lines().any(|l| l == line), "missing `{line}`");
    }
}

#[test]
fn systemd_unit_verifies() {
    let Ok(analyze) = which("systemd-analyze") else {
        eprintln!(
            "systemd-analyze not installed: skipping `systemd-analyze verify` (install the systemd package)"
        );
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let unit = std::fs::read_to_string(deploy().join("medea.service"))
        .unwrap()
        .replace("/usr/local/bin/medea", env!("CARGO_BIN_EXE_medea"));
    let path = tmp.path().join("medea.service");
    std::fs::write(&path, unit).unwrap();
    let out = std::process::Command::new(analyze)
        .arg("verify")
        .arg(&path)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    // Only complaints about this unit count (the host's other units are not ours).
    let ours: Vec<&str> = err
        .lines()
        .filter(|l| l.contains("medea.service"))
        .collect();
    assert!(
        out.status.success() && ours.is_empty(),
        "systemd-analyze verify: {err}"
    );
}

#[test]
fn containerfile_runs_as_non_root_on_distroless() {
    let c = std::fs::read_to_string(deploy().join("Containerfile")).unwrap();
    assert!(c.contains("FROM gcr.io/distroless/cc-debian12:nonroot"));
    assert!(c.contains("USER nonroot:nonroot"));
    assert!(c.matches("FROM ").count() >= 2, "multi-stage");
}

fn which(name: &str) -> Result<PathBuf, ()> {
    std::env::var_os("PATH")
        .and_then(|p| {
            std::env::split_paths(&p)
                .map(|d| d.join(name))
                .find(|c| c.is_file())
        })
        .ok_or(())
}
