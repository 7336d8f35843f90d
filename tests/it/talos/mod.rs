//! The real Talos client against the Talos simulator, over real mTLS sockets: every operation,
//! every fault, version selection, talosconfig errors, secret file modes and the CLI.
//!
//! This file holds the shared set-up (a simulator with a client, fast settings); each subject
//! is a module: [`read`] (read-only operations), [`upgrade`] (version selection and faults),
//! [`reboot_apply`] (reboot, ApplyConfiguration, health), [`routing`] (`node` metadata),
//! [`tls`] (TLS and talosconfig), [`wire`] (the wire contract) and [`cli`].

mod cli;
mod read;
mod reboot_apply;
mod routing;
mod tls;
mod upgrade;
mod wire;

use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use medea::sim::node::NodeSource as _;
use medea::sim::talos::{
    Effect, FaultPlan, Method, Power, RebootTiming, Scenario, SimTalos, TALOSCONFIG_FILE, Trigger,
};
use medea::talos::config::{KeyAlgorithm, TalosConfig, TalosConfigError};
use medea::talos::proto::machine::machine_service_client::MachineServiceClient;
use medea::talos::{
    AppliedMode, ApplyMode, ApplyOptions, ClientSettings, Health, HealthCheckSpec, ImageRef,
    MachineConfig, MachineStage, NodeTarget, RetryPolicy, TalosApi as _, TalosClient, TalosError,
    UpgradeOutcome, UpgradeRpc,
};
use medea::version::{KubeVersion, TalosVersion};
use sha2::Digest as _;
use tonic::Code;

fn tv(s: &str) -> TalosVersion {
    TalosVersion::parse(s).unwrap()
}

fn node(s: &str) -> NodeTarget {
    NodeTarget::parse(s).unwrap()
}

fn image(s: &str) -> ImageRef {
    ImageRef::parse(s).unwrap()
}

/// The installer of Talos `v` as it is published: `ghcr.io/siderolabs/installer` up to 1.13,
/// the Image Factory's (metal, no customization) from 1.14 (the simulator's registry has no
/// ghcr tag from v1.14.0, as the real one).
fn installer(v: &str) -> ImageRef {
    let version = medea::version::TalosVersion::parse(v).unwrap();
    if version.minor_line() < (1, 14) {
        image(&format!("ghcr.io/siderolabs/installer:{v}"))
    } else {
        image(&format!("{FACTORY_METAL}:{v}"))
    }
}

/// The public Image Factory's metal installer without customization.
const FACTORY_METAL: &str = "factory.talos.dev/metal-installer/376567988ad370138ad8b2698212367b8edcb69b5fd68c80be1f2ec7d603b4ba";

fn mode(p: &Path) -> u32 {
    std::fs::metadata(p).unwrap().permissions().mode() & 0o777
}

/// Short deadlines and millisecond backoff: faults resolve in milliseconds.
fn fast() -> ClientSettings {
    ClientSettings {
        connect_timeout: Duration::from_secs(5),
        request_timeout: Duration::from_secs(10),
        pull_timeout: Duration::from_secs(10),
        stream_idle_timeout: Duration::from_secs(10),
        retry: RetryPolicy {
            min_delay: Duration::from_millis(1),
            max_delay: Duration::from_millis(5),
            max_attempts: 4,
        },
    }
}

struct Env {
    sim: SimTalos,
    client: TalosClient,
    talosconfig: PathBuf,
    dir: tempfile::TempDir,
}

fn scenario(talos: &str) -> Scenario {
    let mut s = Scenario::uniform(3, 2, tv(talos), KubeVersion::parse("v1.34.1").unwrap());
    // Tests step reboots explicitly.
    s.timing.reboot = RebootTiming::Manual;
    // The client is tested here, not a 1.14 node's `PermissionDenied` window after its boot
    // (`rollout_sim::boot_entries` meets that one).
    s.timing.apid_permission_denied = Duration::ZERO;
    s
}

async fn env_with(scenario: Scenario, settings: ClientSettings) -> Env {
    let sim = SimTalos::start(scenario, "127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let talosconfig = sim.write_talosconfig(&dir.path().join("out")).unwrap();
    let (client, _) = TalosClient::from_talosconfig(&talosconfig, None, settings).unwrap();
    Env {
        sim,
        client,
        talosconfig,
        dir,
    }
}

async fn env(talos: &str) -> Env {
    env_with(scenario(talos), fast()).await
}
