//! What the simulated kube-apiserver remembers about deprecated API use, as the real one does:
//! the `apiserver_requested_deprecated_apis` gauge it exposes on `/metrics`, and the
//! group-version each field manager wrote an object with (`metadata.managedFields[].apiVersion`).
//!
//! Upstream behaviour (see design/sim.md, "Deprecated APIs"):
//! - the gauge is set to 1 for `{group,version,resource,subresource,removed_release}` on any
//!   request to a deprecated version and never reset while the apiserver process lives
//!   (k8s.io/apiserver `pkg/endpoints/metrics/metrics.go`, `deprecatedRequestGauge`,
//!   `MonitorRequest`); a restart or upgrade of the kube-apiserver starts it empty;
//! - each kube-apiserver process has its own gauge: it counts only the requests *it* served
//!   (the gauge is a process-local Prometheus registry). A request to a node's own
//!   `https://<address>:<port>` is served by that node's apiserver; a request to the
//!   control-plane endpoint (the kubeconfig's server, Talos' shared VIP) by the apiserver of
//!   the node holding it, here the first control-plane node whose apiserver is up;
//! - a managedFields entry carries "the version of this resource that this field set applies
//!   to", the one the writer used (k8s.io/apimachinery `pkg/apis/meta/v1/types.go`,
//!   `ManagedFieldsEntry.APIVersion`), and its own `time`.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use super::store::ObjKey;
use crate::api_lifecycle::Minor;

/// One series of `apiserver_requested_deprecated_apis`: group, version, resource,
/// subresource, removed_release.
pub(crate) type Series = (String, String, String, String, String);

/// Per object, per field manager: the group-version it last wrote with and when.
pub(crate) type WriterVersions = BTreeMap<String, (String, String)>;

/// The deprecated-API memory of the simulated apiserver.
#[derive(Debug, Default)]
pub(crate) struct Deprecation {
    /// Each kube-apiserver's gauge (by node name), since that apiserver last (re)started.
    requested: BTreeMap<String, BTreeSet<Series>>,
    /// The node-source fingerprint the cached facts below were derived from.
    fingerprint: Option<u64>,
    /// The kube-apiserver instances (node, image) last seen up; a change restarts the gauge.
    instances: Vec<(String, String, bool)>,
    /// When each kube-apiserver process started (Unix seconds), served as
    /// `process_start_time_seconds` on its `/metrics`.
    started: BTreeMap<String, i64>,
    /// The served minor, from the control plane's kube-apiserver version.
    minor: Option<Minor>,
    /// The group-version of the request being handled (set by the dispatcher), which a write
    /// records for its field manager.
    pub request_version: Option<String>,
    /// Who wrote each object with which group-version.
    pub writers: HashMap<ObjKey, WriterVersions>,
}

impl Deprecation {
    /// Whether the cached minor and instances need to be derived again for `fingerprint`
    /// (always when the node source cannot tell).
    pub fn stale(&self, fingerprint: Option<u64>) -> bool {
        self.minor.is_none() || fingerprint.is_none() || fingerprint != self.fingerprint
    }

    /// Take the current control plane: a kube-apiserver that changed image, or is down (it
    /// restarts), loses the gauge, as a restarted process does.
    /// `now` (Unix seconds) is when a process that (re)starts here started; the apiservers
    /// found up on the first observation have been running for [`BOOT_UPTIME`].
    pub fn observe(
        &mut self,
        fingerprint: Option<u64>,
        instances: Vec<(String, String, bool)>,
        version: &str,
        now: i64,
    ) {
        let first = self.minor.is_none();
        for (node, image, up) in &instances {
            let before = self.instances.iter().find(|(n, _, _)| n == node);
            let same_process = before.is_some_and(|(_, i, was_up)| i == image && *was_up);
            if !*up || !same_process {
                self.requested.remove(node);
            }
            if !*up {
                self.started.remove(node);
            } else if first {
                self.started.insert(node.clone(), now - BOOT_UPTIME);
            } else if !same_process {
                self.started.insert(node.clone(), now);
            }
        }
        self.requested
            .retain(|node, _| instances.iter().any(|(n, _, _)| n == node));
        self.started
            .retain(|node, _| instances.iter().any(|(n, _, _)| n == node));
        self.instances = instances;
        self.fingerprint = fingerprint;
        self.minor = Some(parse_minor(version));
    }

    /// The minor the simulated apiserver serves.
    pub fn minor(&self) -> Minor {
        self.minor.unwrap_or((1, 33))
    }

    /// The apiserver that serves requests to the control-plane endpoint: the first
    /// control-plane node whose kube-apiserver is up (the holder of the shared VIP), else the
    /// first one.
    pub fn endpoint_holder(&self) -> Option<&str> {
        self.instances
            .iter()
            .find(|(_, _, up)| *up)
            .or(self.instances.first())
            .map(|(n, _, _)| n.as_str())
    }

    /// Pretend the kube-apiserver of `node` started at `unix` seconds (a test knob: a
    /// process restarted by something the simulator does not model).
    pub fn set_started(&mut self, node: &str, unix: i64) {
        if self.started.contains_key(node) {
            self.started.insert(node.to_string(), unix);
        }
    }

    /// The apiserver that served a request: the node's own (`served_by`) or the endpoint's.
    pub fn serving<'a>(&'a self, served_by: Option<&'a str>) -> Option<&'a str> {
        served_by.or_else(|| self.endpoint_holder())
    }

    /// A request served by the kube-apiserver of `node` reached a deprecated version.
    pub fn record(&mut self, node: Option<&str>, series: Series) {
        let Some(node) = node.or_else(|| self.endpoint_holder()) else {
            return;
        };
        let node = node.to_string();
        self.requested.entry(node).or_default().insert(series);
    }

    /// Record that `manager` wrote the object at `key` now, with the request's group-version
    /// (`fallback` when the dispatcher set none).
    pub fn note_writer(&mut self, key: &ObjKey, manager: &str, fallback: &str, time: &str) {
        let version = self
            .request_version
            .clone()
            .unwrap_or_else(|| fallback.to_string());
        self.writers
            .entry(key.clone())
            .or_default()
            .insert(manager.to_string(), (version, time.to_string()));
    }

    /// The group-version and time `manager` last wrote `key` with, if recorded.
    pub fn writer(&self, key: &ObjKey, manager: &str) -> Option<&(String, String)> {
        self.writers.get(key)?.get(manager)
    }

    /// The `/metrics` exposition (Prometheus text format 0.0.4) of the kube-apiserver of
    /// `node` (the endpoint's when `None`): its gauge, labels sorted by name as client_golang
    /// writes them, plus `kubernetes_build_info`.
    pub fn metrics_text(&self, node: Option<&str>, version: &str) -> String {
        let (major, minor) = parse_minor(version);
        let mut out = String::new();
        let empty = BTreeSet::new();
        let requested = self
            .serving(node)
            .and_then(|n| self.requested.get(n))
            .unwrap_or(&empty);
        if !requested.is_empty() {
            out.push_str(
                "# HELP apiserver_requested_deprecated_apis [STABLE] Gauge of deprecated APIs that have been requested, broken out by API group, version, resource, subresource, and removed_release.\n\
                 # TYPE apiserver_requested_deprecated_apis gauge\n",
            );
            for (group, version, resource, subresource, removed) in requested {
                out.push_str(&format!(
                    "apiserver_requested_deprecated_apis{{group=\"{group}\",removed_release=\"{removed}\",resource=\"{resource}\",subresource=\"{subresource}\",version=\"{version}\"}} 1\n"
                ));
            }
        }
        if let Some(started) = self.serving(node).and_then(|n| self.started.get(n)) {
            // client_golang's process collector (`collectors.NewProcessCollector`, registered
            // by k8s.io/component-base `metrics/legacyregistry`)
            out.push_str(
                "# HELP process_start_time_seconds Start time of the process since unix epoch in seconds.\n\
                 # TYPE process_start_time_seconds gauge\n",
            );
            out.push_str(&format!("process_start_time_seconds {started}e+00\n"));
        }
        out.push_str(
            "# HELP kubernetes_build_info [ALPHA] A metric with a constant '1' value labeled by major, minor, git version, git commit, git tree state, build date, Go version, and compiler from which Kubernetes was built, and platform on which it is running.\n\
             # TYPE kubernetes_build_info gauge\n",
        );
        out.push_str(&format!(
            "kubernetes_build_info{{build_date=\"2025-01-01T00:00:00Z\",compiler=\"gc\",git_commit=\"0000000000000000000000000000000000000000\",git_tree_state=\"clean\",git_version=\"{version}\",go_version=\"go1.24.0\",major=\"{major}\",minor=\"{minor}\",platform=\"linux/amd64\"}} 1\n"
        ));
        out
    }
}

/// How long the kube-apiservers of a freshly started simulator have been running: the
/// scenario's cluster is an established one, so its gauge is a month's evidence.
pub(crate) const BOOT_UPTIME: i64 = 30 * 24 * 3600;

/// `(1, 31)` from `v1.31.2`; `(1, 33)` when unparsable.
pub(crate) fn parse_minor(version: &str) -> Minor {
    let mut parts = version.trim_start_matches('v').split('.');
    let major = parts.next().and_then(|p| p.parse().ok());
    let minor = parts.next().and_then(|p| {
        p.chars()
            .take_while(char::is_ascii_digit)
            .collect::<String>()
            .parse()
            .ok()
    });
    match (major, minor) {
        (Some(a), Some(b)) => (a, b),
        _ => (1, 33),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const T0: i64 = 1_790_000_000;

    #[test]
    fn the_gauge_survives_requests_and_resets_when_the_apiserver_restarts() {
        let mut d = Deprecation::default();
        let cp = vec![(
            "cp-1".to_string(),
            "kube-apiserver:v1.31.2".to_string(),
            true,
        )];
        d.observe(Some(1), cp.clone(), "v1.31.2", T0 + 100);
        assert_eq!(d.minor(), (1, 31));
        let s = (
            "flowcontrol.apiserver.k8s.io".to_string(),
            "v1beta3".to_string(),
            "flowschemas".to_string(),
            String::new(),
            "1.32".to_string(),
        );
        d.record(None, s.clone());
        d.observe(Some(2), cp.clone(), "v1.31.2", T0 + 200);
        let text = d.metrics_text(None, "v1.31.2");
        assert!(text.contains(
            "apiserver_requested_deprecated_apis{group=\"flowcontrol.apiserver.k8s.io\",removed_release=\"1.32\",resource=\"flowschemas\",subresource=\"\",version=\"v1beta3\"} 1\n"
        ));
        // the node reboots: its kube-apiserver restarts with an empty gauge
        let down = vec![(
            "cp-1".to_string(),
            "kube-apiserver:v1.31.2".to_string(),
            false,
        )];
        d.observe(Some(3), down, "v1.31.2", T0 + 300);
        assert!(
            !d.metrics_text(None, "v1.31.2")
                .contains("apiserver_requested_deprecated_apis")
        );
        d.record(None, s);
        // an upgrade changes the image: a new process
        let upgraded = vec![(
            "cp-1".to_string(),
            "kube-apiserver:v1.32.0".to_string(),
            true,
        )];
        d.observe(Some(4), upgraded, "v1.32.0", T0 + 400);
        assert!(
            !d.metrics_text(None, "v1.32.0")
                .contains("apiserver_requested_deprecated_apis")
        );
        assert_eq!(d.minor(), (1, 32));
        // the first apiserver seen had been up for BOOT_UPTIME; the upgraded one started at
        // its observation
        assert!(
            d.metrics_text(None, "v1.32.0")
                .contains(&format!("\nprocess_start_time_seconds {}e+00\n", T0 + 400)),
            "{}",
            d.metrics_text(None, "v1.32.0")
        );
    }

    #[test]
    fn an_apiserver_found_running_has_been_up_for_the_boot_uptime() {
        let mut d = Deprecation::default();
        let cp = vec![(
            "cp-1".to_string(),
            "kube-apiserver:v1.36.3".to_string(),
            true,
        )];
        d.observe(Some(1), cp.clone(), "v1.36.3", T0);
        let text = d.metrics_text(None, "v1.36.3");
        let started = crate::k8s::observe::process_start_time(&text);
        assert_eq!(started, Some(T0 - BOOT_UPTIME), "{text}");
        // the same process later: unchanged
        d.observe(Some(2), cp, "v1.36.3", T0 + 50);
        let text = d.metrics_text(None, "v1.36.3");
        assert_eq!(crate::k8s::observe::process_start_time(&text), started);
        d.set_started("cp-1", T0 + 7);
        let text = d.metrics_text(Some("cp-1"), "v1.36.3");
        assert_eq!(crate::k8s::observe::process_start_time(&text), Some(T0 + 7));
    }

    #[test]
    fn each_apiserver_counts_only_the_requests_it_served_and_restarts_alone() {
        let mut d = Deprecation::default();
        let image = "kube-apiserver:v1.31.2".to_string();
        let cps = |up2: bool| {
            vec![
                ("cp-1".to_string(), image.clone(), true),
                ("cp-2".to_string(), image.clone(), up2),
                ("cp-3".to_string(), image.clone(), true),
            ]
        };
        d.observe(Some(1), cps(true), "v1.31.2", T0 + 100);
        let s = |r: &str| {
            (
                "flowcontrol.apiserver.k8s.io".to_string(),
                "v1beta3".to_string(),
                r.to_string(),
                String::new(),
                "1.32".to_string(),
            )
        };
        let series = "apiserver_requested_deprecated_apis{";
        // through the endpoint: the holder's (cp-1) gauge only
        d.record(None, s("flowschemas"));
        d.record(Some("cp-2"), s("prioritylevelconfigurations"));
        assert!(
            d.metrics_text(None, "v1.31.2")
                .contains("resource=\"flowschemas\"")
        );
        assert!(
            d.metrics_text(Some("cp-1"), "v1.31.2")
                .contains("resource=\"flowschemas\"")
        );
        assert!(!d.metrics_text(Some("cp-3"), "v1.31.2").contains(series));
        let cp2 = d.metrics_text(Some("cp-2"), "v1.31.2");
        assert!(cp2.contains("resource=\"prioritylevelconfigurations\""));
        assert!(!cp2.contains("resource=\"flowschemas\""));
        // cp-2 reboots: its gauge restarts, cp-1's does not
        d.observe(Some(2), cps(false), "v1.31.2", T0 + 200);
        d.observe(Some(3), cps(true), "v1.31.2", T0 + 300);
        assert!(!d.metrics_text(Some("cp-2"), "v1.31.2").contains(series));
        assert!(
            d.metrics_text(Some("cp-1"), "v1.31.2")
                .contains("resource=\"flowschemas\"")
        );
        // the endpoint moves to the first apiserver that is up
        let cp1_down = vec![
            ("cp-1".to_string(), image.clone(), false),
            ("cp-2".to_string(), image.clone(), true),
        ];
        d.observe(Some(4), cp1_down, "v1.31.2", T0 + 400);
        assert_eq!(d.endpoint_holder(), Some("cp-2"));
    }

    #[test]
    fn minors_parse_from_versions() {
        assert_eq!(parse_minor("v1.29.0"), (1, 29));
        assert_eq!(parse_minor("v1.30.1-rc.0"), (1, 30));
        assert_eq!(parse_minor("garbage"), (1, 33));
    }
}
