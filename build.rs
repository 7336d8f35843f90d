//! Generates gRPC code for medea's own API and the Talos machine API from `proto/`.
//! protoc comes from `PROTOC` when set, else from protoc-bin-vendored: no system protoc needed.

use std::path::PathBuf;

fn main() {
    build_info();
    let protoc = match std::env::var_os("PROTOC") {
        Some(p) => PathBuf::from(p),
        None => protoc_bin_vendored::protoc_bin_path().expect("vendored protoc for this platform"),
    };
    let wkt = protoc_bin_vendored::include_path().expect("vendored protobuf include path");
    let protos: Vec<PathBuf> = vec![PathBuf::from("proto/medea/v1/medea.proto")];
    let includes: Vec<PathBuf> = vec![PathBuf::from("proto"), wkt];
    for p in &protos {
        println!("cargo:rerun-if-changed={}", p.display());
    }
    println!("cargo:rerun-if-changed=proto");
    let mut cfg = prost_build::Config::new();
    cfg.protoc_executable(protoc);
    // medea's own messages double as the CLI's `-o json|yaml` output.
    cfg.type_attribute(
        ".medea.v1",
        "#[derive(serde::Serialize)] #[serde(rename_all = \"camelCase\")]",
    );
    tonic_prost_build::configure()
        .build_server(true)
        .build_client(true)
        .compile_with_config(cfg, &protos, &includes)
        .expect("compile protos");
}

/// `medea --version` reports the git sha and build profile it was built from.
fn build_info() {
    let sha = std::process::Command::new("git")
        .args(["rev-parse", "--short=12", "HEAD"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_else(|| "unknown".to_string());
    println!("cargo:rustc-env=MEDEA_GIT_SHA={sha}");
    println!(
        "cargo:rustc-env=MEDEA_PROFILE={}",
        std::env::var("PROFILE").unwrap_or_else(|_| "unknown".into())
    );
    if std::path::Path::new(".git/HEAD").exists() {
        println!("cargo:rerun-if-changed=.git/HEAD");
    }
}
