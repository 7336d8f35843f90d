//! A fuzzing entry into the simulated kube-apiserver's request handling, without sockets.
//!
//! [`request`] builds a fresh simulated cluster (four nodes, the default scenario's objects),
//! turns raw bytes into one HTTP request and runs it through the same handler the server uses
//! (routing, query strings, label and field selectors, bodies, patches, server-side apply,
//! evictions, watches). Used by `medea::fuzz::sim_http`; the simulator must never panic on
//! any request.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Body;
use axum::extract::State;
use axum::http::{Method, Request};
use tokio::sync::Notify;

use super::cluster::{KubeSide, Timing};
use super::pki::BearerToken;
use super::{Shared, scenario, seed_objects};
use crate::sim::node::{NodeFacts, NodeSource};

/// The token every fuzzed request carries unless the input says otherwise.
pub const TOKEN: &str = "fuzz-token";

struct FixedNodes(Vec<NodeFacts>);

impl NodeSource for FixedNodes {
    fn nodes(&self) -> Vec<NodeFacts> {
        self.0.clone()
    }
}

fn node(name: &str, cp: bool) -> NodeFacts {
    NodeFacts {
        name: name.into(),
        address: format!("10.0.0.{}", name.len()),
        control_plane: cp,
        up: true,
        talos_version: "v1.13.9".into(),
        kubelet_version: "v1.34.1".into(),
        static_pod_images: if cp {
            [(
                "kube-apiserver".to_string(),
                "registry.k8s.io/kube-apiserver:v1.34.1".to_string(),
            )]
            .into()
        } else {
            BTreeMap::new()
        },
        crash_looping: Default::default(),
        extensions: Default::default(),
        static_pod_config_versions: Default::default(),
        static_pod_config_file_versions: Default::default(),
    }
}

#[allow(
    clippy::expect_used,
    reason = "fuzz harness: the built-in default scenario always seeds (a unit test seeds it)"
)]
fn shared() -> Arc<Shared> {
    let nodes = Arc::new(FixedNodes(vec![
        node("cp-1", true),
        node("w-1", false),
        node("w-2", false),
        node("w-3", false),
    ]));
    let mut cluster = KubeSide::new(
        nodes,
        Timing {
            start: Duration::ZERO,
            termination: Duration::ZERO,
            crd_establish: Duration::ZERO,
        },
        42,
    );
    seed_objects(&mut cluster, &scenario::default_scenario()).expect("the default scenario seeds");
    Arc::new(Shared {
        cluster: Mutex::new(cluster),
        token: BearerToken::fixed(TOKEN),
        server_address: "127.0.0.1:6443".into(),
        wake: Notify::new(),
        refresh: Duration::from_millis(200),
    })
}

/// One raw request: `METHOD TARGET\n` then `Header: value` lines, a blank line, and the body
/// (the shape of HTTP/1.1 on the wire). Inputs that do not form a request are ignored, as a
/// real HTTP server would refuse them before routing. Returns the response status.
#[allow(
    clippy::expect_used,
    reason = "fuzz harness: a current-thread runtime without I/O drivers cannot fail to build"
)]
pub fn request(data: &[u8]) -> Option<u16> {
    let (head, body) = match data.windows(2).position(|w| w == b"\n\n") {
        Some(i) => (&data[..i], &data[i + 2..]),
        None => (data, &[][..]),
    };
    let head = std::str::from_utf8(head).ok()?;
    let mut lines = head.lines();
    let (method, target) = lines.next()?.split_once(' ')?;
    let method = Method::from_bytes(method.as_bytes()).ok()?;
    let mut builder = Request::builder().method(method).uri(target);
    let mut authorized = true;
    for line in lines {
        let (name, value) = line.split_once(':')?;
        if name.eq_ignore_ascii_case("x-fuzz-anonymous") {
            authorized = false;
            continue;
        }
        builder = builder.header(name.trim(), value.trim());
    }
    if authorized {
        builder = builder.header("authorization", format!("Bearer {TOKEN}"));
    }
    let req = builder.body(Body::from(body.to_vec())).ok()?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .expect("a current-thread runtime");
    let status = rt.block_on(async {
        let resp = super::api::handle(State(shared()), req).await;
        let status = resp.status().as_u16();
        // Drain bounded bodies; a watch streams until its timeout, so read only what is ready.
        let mut body = resp.into_body();
        let _ = tokio::time::timeout(Duration::from_millis(1), async {
            use http_body_util::BodyExt;
            while let Some(frame) = body.frame().await {
                if frame.is_err() {
                    break;
                }
            }
        })
        .await;
        status
    });
    Some(status)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_reach_the_handler() {
        assert_eq!(request(b"GET /api/v1/nodes\n"), Some(200));
        assert_eq!(request(b"GET /api/v1/nodes/w-1\n"), Some(200));
        assert_eq!(request(b"GET /api/v1/nodes/nope\n"), Some(404));
        assert_eq!(
            request(b"GET /api/v1/nodes\nx-fuzz-anonymous: 1\n"),
            Some(401)
        );
        assert_eq!(
            request(b"PATCH /api/v1/nodes/w-1\ncontent-type: application/merge-patch+json\n\n{\"spec\":{\"unschedulable\":true}}"),
            Some(200)
        );
        assert_eq!(request(b"not a request"), None);
    }
}
