//! Generates the gRPC code (tonic + prost) for every proto set medea speaks.
//!
//! A fresh clone builds with `cargo build` alone: protoc comes from `protoc-bin-vendored` unless
//! `PROTOC` is set, and the well-known types (`google/protobuf/*.proto`) come from the same crate.
//!
//! To add protos, append to `PROTO_SETS` (a new set for a new API, with its own include file, so
//! each API lands in its own Rust module), or add files to an existing set.

use std::path::PathBuf;

/// One group of protos compiled together into one generated include file.
struct ProtoSet {
    /// Name of the generated file in `OUT_DIR` that declares the nested package modules;
    /// the Rust side does `include!(concat!(env!("OUT_DIR"), "/<include_file>"))`.
    include_file: &'static str,
    /// Include roots (relative to the crate root), in protoc `-I` order.
    includes: &'static [&'static str],
    /// Files to compile, relative to the crate root.
    protos: &'static [&'static str],
    /// Extra attributes on generated types: (proto path prefix, attribute).
    type_attributes: &'static [(&'static str, &'static str)],
    /// Proto types implemented by hand instead of generated: (proto path, Rust path).
    extern_paths: &'static [(&'static str, &'static str)],
    /// Generate servers too (the simulator serves these APIs), or only clients.
    servers: bool,
    /// Compile only when this cargo feature is on (`None`: always).
    feature: Option<&'static str>,
}

const PROTO_SETS: &[ProtoSet] = &[
    // The Talos machine API subset medea uses (upstream files, unmodified) and the COSI
    // `cosi.resource.State` read API. See proto/talos/README.md.
    ProtoSet {
        include_file: "talos_api.rs",
        includes: &["proto/talos/api", "proto/talos/vendor", "proto/talos/cosi"],
        protos: &[
            "proto/talos/api/common/common.proto",
            "proto/talos/api/machine/machine.proto",
            "proto/talos/api/machine/lifecycle.proto",
            "proto/talos/api/machine/image.proto",
            "proto/talos/api/cluster/cluster.proto",
            "proto/talos/api/resource/config/config.proto",
            "proto/talos/api/resource/definitions/enums/enums.proto",
            "proto/talos/api/resource/definitions/proto/proto.proto",
            "proto/talos/api/resource/definitions/k8s/k8s.proto",
            "proto/talos/api/resource/definitions/runtime/runtime.proto",
            "proto/talos/api/resource/definitions/v1alpha1/v1alpha1.proto",
            "proto/talos/cosi/v1alpha1/resource.proto",
            "proto/talos/cosi/v1alpha1/state.proto",
        ],
        type_attributes: &[],
        extern_paths: &[],
        servers: true,
        feature: None,
    },
    // medea's own API (`medea serve`). Its messages double as the CLI's `-o json|yaml` output.
    ProtoSet {
        include_file: "medea_api.rs",
        includes: &["proto"],
        protos: &["proto/medea/v1/medea.proto"],
        type_attributes: &[(
            ".medea.v1",
            "#[derive(serde::Serialize)] #[serde(rename_all = \"camelCase\")]",
        )],
        // The server sends `get machines` rows it encoded once (src/api/machines.rs).
        extern_paths: &[(
            ".medea.v1.ListMachinesResponse",
            "crate::api::machines::ListMachinesResponse",
        )],
        servers: true,
        feature: None,
    },
    // The etcd v3 API (KV, Watch, Lease, Auth clients) for the etcd store backend: upstream etcd
    // files, unmodified. See proto/etcd/README.md.
    ProtoSet {
        include_file: "etcd_api.rs",
        includes: &["proto/etcd"],
        protos: &["proto/etcd/etcd/api/etcdserverpb/rpc.proto"],
        type_attributes: &[],
        extern_paths: &[],
        servers: false,
        feature: Some("etcd"),
    },
];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    build_info();
    let protoc = match std::env::var_os("PROTOC") {
        Some(p) => PathBuf::from(p),
        None => protoc_bin_vendored::protoc_bin_path()?,
    };
    let wkt = protoc_bin_vendored::include_path()?;
    println!("cargo:rerun-if-env-changed=PROTOC");

    for set in PROTO_SETS {
        if let Some(feature) = set.feature {
            let var = format!("CARGO_FEATURE_{}", feature.to_uppercase().replace('-', "_"));
            if std::env::var_os(var).is_none() {
                continue;
            }
        }
        let mut cfg = prost_build::Config::new();
        cfg.protoc_executable(&protoc);
        for (path, attr) in set.type_attributes {
            cfg.type_attribute(path, attr);
        }
        for (proto, rust) in set.extern_paths {
            cfg.extern_path(*proto, *rust);
        }
        let protos: Vec<PathBuf> = set.protos.iter().map(PathBuf::from).collect();
        let mut includes: Vec<PathBuf> = set.includes.iter().map(PathBuf::from).collect();
        includes.push(wkt.clone());
        for root in set.includes {
            println!("cargo:rerun-if-changed={root}");
        }
        tonic_prost_build::configure()
            .build_client(true)
            .build_server(set.servers)
            // Servers (the simulator) implement only the RPCs they serve; the rest answer
            // `Unimplemented`, as an older Talos would.
            .generate_default_stubs(true)
            .include_file(set.include_file)
            .compile_with_config(cfg, &protos, &includes)?;
    }
    Ok(())
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
    // Re-run when HEAD moves: HEAD itself changes on a checkout, the branch ref it names on a
    // commit (a loose ref, or packed-refs after `git pack-refs`). `--git-path` finds them in a
    // worktree too.
    let git = |args: &[&str]| {
        std::process::Command::new("git")
            .args(args)
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
    };
    let mut watched = vec!["HEAD".to_string(), "packed-refs".to_string()];
    if let Some(branch) = git(&["symbolic-ref", "-q", "HEAD"]) {
        watched.push(branch);
    }
    for name in watched {
        if let Some(path) = git(&["rev-parse", "--git-path", &name])
            && std::path::Path::new(&path).exists()
        {
            println!("cargo:rerun-if-changed={path}");
        }
    }
}
