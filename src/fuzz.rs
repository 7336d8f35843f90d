//! Fuzz entry points: every parser of untrusted input, as functions that must never panic.
//!
//! `tests/fuzz/` (cargo fuzz) calls these from libFuzzer; `tests/it/fuzz_smoke.rs` runs them
//! over the seed corpora and seeded mutations in the normal test suite.

use crate::approval::{self, ApprovalSource, VerifyContext};
use crate::desired::{self, Snapshot, source::SourceFile};
use crate::plan::PlanId;

/// The desired-state loader: bytes of one file → diagnostics (never a panic).
pub fn desired_loader(data: &[u8]) {
    let snapshot = Snapshot {
        files: vec![SourceFile {
            path: "fuzz.yaml".into(),
            bytes: data.to_vec().into(),
        }],
        markers: vec![],
        commit: None,
        refused: Vec::new(),
    };
    let loaded = desired::parse_snapshot(snapshot);
    // Every diagnostic must point inside the file it names.
    for d in &loaded.diagnostics {
        if let Some(text) = loaded.sources.get(&d.origin.file) {
            assert!(
                d.origin.offset + d.origin.len <= text.len(),
                "span past end: {d:?}"
            );
        }
    }
}

/// The allowed_signers parser.
pub fn allowed_signers(data: &[u8]) {
    if let Ok(text) = std::str::from_utf8(data) {
        let (_signers, diags) = approval::allowed_signers::parse(text);
        let lines = text.lines().count().max(1);
        for d in diags {
            assert!(
                d.line >= 1 && d.line <= lines + 1,
                "diagnostic line {} of {lines}",
                d.line
            );
        }
    }
}

/// The armored SSH signature parser and verifier.
pub fn armored_signature(data: &[u8]) {
    if let Ok(text) = std::str::from_utf8(data) {
        let (signers, _) = approval::allowed_signers::parse("");
        let current = PlanId::from_digest([7; 32]);
        let ctx = VerifyContext {
            signers: &signers,
            current: &current,
            known: &[],
            consumed: &[],
            now: jiff::Timestamp::UNIX_EPOCH,
        };
        let outcome = approval::verify(text, ApprovalSource::Api, &ctx);
        assert!(
            outcome.approved().is_none(),
            "nobody is trusted, so nothing can be approved"
        );
    }
}

/// talosconfig parsing and the decoding of every context it names (endpoints, base64, PEM
/// certificates and keys). Errors must render without panicking.
pub fn talosconfig(data: &[u8]) {
    use crate::talos::config::TalosConfig;
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let path = std::path::Path::new("fuzz/talosconfig");
    match TalosConfig::parse(text, path) {
        Ok(config) => {
            let names = config.context_names();
            let _ = config.current_context();
            let mut tried = vec![None];
            tried.extend(names.iter().map(|n| Some(n.as_str())));
            for name in tried {
                match config.context(name) {
                    Ok(ctx) => {
                        for e in &ctx.endpoints {
                            assert!(!e.host().is_empty(), "an endpoint without a host: {e:?}");
                            let _ = e.uri();
                        }
                    }
                    Err(e) => {
                        let _ = crate::error_chain(&e);
                    }
                }
            }
        }
        Err(e) => {
            let _ = crate::error_chain(&e);
        }
    }
}

thread_local! {
    #[allow(clippy::expect_used, reason = "fuzz harness: building a current-thread runtime fails only when the OS refuses an epoll/eventfd, and the fuzzer cannot run without one")]
    static RUNTIME: tokio::runtime::Runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a current-thread runtime");
}

/// kubeconfig parsing, then what the kube adapter does with it: the kube-rs client
/// configuration of the current context and the client (TLS roots, client identity). File
/// references and exec/auth-provider plugins are dropped first: the fuzzer must not read
/// files or run commands.
pub fn kubeconfig(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let path = std::path::Path::new("fuzz/kubeconfig");
    let mut kc = match crate::k8s::kubeconfig::parse(text, path) {
        Ok(kc) => kc,
        Err(e) => {
            let _ = crate::error_chain(&e);
            return;
        }
    };
    for named in &mut kc.auth_infos {
        if let Some(a) = &mut named.auth_info {
            a.exec = None;
            a.auth_provider = None;
            a.token_file = None;
            a.client_certificate = None;
            a.client_key = None;
        }
    }
    for named in &mut kc.clusters {
        if let Some(c) = &mut named.cluster {
            c.certificate_authority = None;
        }
    }
    RUNTIME.with(|rt| {
        rt.block_on(async {
            let options = ::kube::config::KubeConfigOptions::default();
            match ::kube::Config::from_custom_kubeconfig(kc, &options).await {
                Ok(config) => {
                    let _ = crate::k8s::KubeClient::from_config(
                        config,
                        crate::k8s::ClientOptions::default(),
                    );
                }
                Err(e) => {
                    let _ = crate::error_chain(&e);
                }
            }
        })
    });
}

/// One HTTP request to the simulated kube-apiserver (request line, headers, body; see
/// [`crate::sim::kube::fuzzing::request`]). Any status is fine; a panic is not.
pub fn sim_http(data: &[u8]) {
    if let Some(status) = crate::sim::kube::fuzzing::request(data) {
        assert!((100..600).contains(&status), "status {status}");
    }
}
