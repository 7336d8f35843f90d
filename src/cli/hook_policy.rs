//! The `medea serve` flags of the Job-hook policy (issue #49 item 6): the server, never the
//! repository, says what a Job hook's pod may ask for. Safe by default: no namespace, nothing
//! privileged, no host namespace or path, images pinned by digest
//! ([`crate::desired::hook_policy`]).

use clap::Args;

use crate::desired::hook_policy::HookPolicy;

/// What Job hooks may do on this server.
#[derive(Debug, Clone, Default, Args)]
pub struct HookPolicyArgs {
    /// Let Job hooks run in this namespace (repeatable, or comma-separated). None by default:
    /// a Job hook runs with medea's cluster credentials, so the server names where.
    #[arg(long = "hook-namespace", value_name = "NAMESPACE", value_delimiter = ',',
          env = "MEDEA_HOOK_NAMESPACES", value_parser = namespace)]
    pub namespaces: Vec<String>,
    /// Allow Job hooks with privileged containers, or capabilities beyond the Pod Security
    /// Standards' baseline set (refused by default).
    #[arg(long = "hook-allow-privileged")]
    pub allow_privileged: bool,
    /// Allow Job hooks whose pod joins the node's PID, network or IPC namespace (`hostPID`,
    /// `hostNetwork`, `hostIPC`; refused by default).
    #[arg(long = "hook-allow-host-namespaces")]
    pub allow_host_namespaces: bool,
    /// Allow Job hooks that mount a directory of the node (`hostPath` volumes; refused by
    /// default).
    #[arg(long = "hook-allow-host-path")]
    pub allow_host_path: bool,
    /// Allow Job hook images without a `@sha256:` digest. Refused by default: a tag can be
    /// moved after the plan was signed, a digest cannot.
    #[arg(long = "hook-allow-unpinned-images")]
    pub allow_unpinned_images: bool,
}

fn namespace(s: &str) -> Result<String, String> {
    let s = s.trim();
    if crate::desired::validate::is_dns_label(s) {
        Ok(s.to_string())
    } else {
        Err(format!(
            "`{s}` is not a namespace name: lowercase letters, digits and `-` (at most 63 characters)"
        ))
    }
}

impl HookPolicyArgs {
    /// The policy these flags set.
    pub fn policy(&self) -> HookPolicy {
        HookPolicy {
            namespaces: self.namespaces.iter().cloned().collect(),
            allow_privileged: self.allow_privileged,
            allow_host_namespaces: self.allow_host_namespaces,
            allow_host_path: self.allow_host_path,
            allow_unpinned_images: self.allow_unpinned_images,
        }
    }
}
