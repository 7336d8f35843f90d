//! Failure responses as the real apiserver sends them: a `v1.Status` body with `reason`,
//! `message`, `details` and `code` (what `kubectl` prints as `Error from server (NotFound): …`
//! and what kube-rs turns into `kube::Error::Api`).

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Status, StatusCause, StatusDetails};
use serde_json::Value;

use super::resources::ResourceType;

/// The user the simulator's bearer token authenticates as.
pub(crate) const SIM_USER: &str = "admin";

/// A failed request: HTTP status plus the `Status` body.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct ApiError {
    pub code: u16,
    pub reason: &'static str,
    pub message: String,
    pub details: Option<Box<StatusDetails>>,
}

/// One `field.Invalid` error: the field path (`data[key]`), the offending string value and
/// the reason (k8s.io/apimachinery `pkg/util/validation/field/errors.go`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct FieldError {
    pub field: String,
    pub value: String,
    pub detail: String,
}

impl FieldError {
    /// `ErrorBody` of an `Invalid` error with a string value: `Invalid value: "<value>": <detail>`
    /// (the value Go-quoted, `%q`).
    pub fn body(&self) -> String {
        let quoted = serde_json::to_string(&self.value).unwrap_or_default();
        format!("Invalid value: {quoted}: {}", self.detail)
    }
}

impl ApiError {
    fn new(code: u16, reason: &'static str, message: impl Into<String>) -> ApiError {
        ApiError {
            code,
            reason,
            message: message.into(),
            details: None,
        }
    }

    fn with_details(mut self, rt: &ResourceType, name: &str) -> ApiError {
        self.details = Some(Box::new(StatusDetails {
            name: Some(name.to_string()),
            group: (!rt.group.is_empty()).then(|| rt.group.to_string()),
            kind: Some(rt.plural.to_string()),
            ..StatusDetails::default()
        }));
        self
    }

    pub fn not_found(rt: &ResourceType, name: &str) -> ApiError {
        ApiError::new(
            404,
            "NotFound",
            format!("{} \"{name}\" not found", rt.qualified()),
        )
        .with_details(rt, name)
    }

    pub fn already_exists(rt: &ResourceType, name: &str) -> ApiError {
        ApiError::new(
            409,
            "AlreadyExists",
            format!("{} \"{name}\" already exists", rt.qualified()),
        )
        .with_details(rt, name)
    }

    pub fn conflict(rt: &ResourceType, name: &str, why: &str) -> ApiError {
        ApiError::new(
            409,
            "Conflict",
            format!(
                "Operation cannot be fulfilled on {} \"{name}\": {why}",
                rt.qualified()
            ),
        )
        .with_details(rt, name)
    }

    /// A server-side apply conflict (`reason: Conflict`, one cause per field).
    pub fn apply_conflict(
        rt: &ResourceType,
        name: &str,
        conflicts: &[super::apply::Conflict],
        updaters: &std::collections::BTreeSet<String>,
    ) -> ApiError {
        // structured-merge-diff prints an `Update` manager with the API version it wrote
        // (k8s.io/apiserver `pkg/endpoints/handlers/fieldmanager/internal/conflict.go`
        // `printManager`): `conflict with "kubectl-create" using v1`.
        let who = |m: &str| {
            if updaters.contains(m) {
                format!("\"{m}\" using {}", rt.api_version())
            } else {
                format!("\"{m}\"")
            }
        };
        let list: Vec<String> = conflicts
            .iter()
            .map(|c| format!("conflict with {}: {}", who(&c.manager), c.field))
            .collect();
        let mut err = ApiError::new(
            409,
            "Conflict",
            format!(
                "Apply failed with {} conflict{}: {}",
                conflicts.len(),
                if conflicts.len() == 1 { "" } else { "s" },
                list.join(", ")
            ),
        )
        .with_details(rt, name);
        if let Some(d) = err.details.as_mut() {
            d.causes = Some(
                conflicts
                    .iter()
                    .map(|c| StatusCause {
                        reason: Some("FieldManagerConflict".into()),
                        message: Some(format!("conflict with {}", who(&c.manager))),
                        field: Some(c.field.clone()),
                    })
                    .collect(),
            );
        }
        err
    }

    pub fn bad_request(message: impl Into<String>) -> ApiError {
        ApiError::new(400, "BadRequest", message)
    }

    pub fn invalid(rt: &ResourceType, name: &str, message: impl Into<String>) -> ApiError {
        ApiError::new(422, "Invalid", message).with_details(rt, name)
    }

    /// A 422 from the apiserver's validation of one object: `errors.NewInvalid`
    /// (k8s.io/apimachinery `pkg/api/errors/errors.go`) over `field.Invalid` errors
    /// (`pkg/util/validation/field/errors.go`): the message is `<Kind> "<name>" is invalid: `
    /// and the one error, or the errors as `[a, b]` (`ToAggregate`, duplicates dropped);
    /// `details.kind` is the kind (not the resource) and each error is a cause
    /// `FieldValueInvalid` with its field path.
    pub fn invalid_fields(rt: &ResourceType, name: &str, errors: &[FieldError]) -> ApiError {
        let mut lines: Vec<String> = Vec::with_capacity(errors.len());
        for e in errors {
            let line = format!("{}: {}", e.field, e.body());
            if !lines.contains(&line) {
                lines.push(line);
            }
        }
        let aggregate = match lines.as_slice() {
            [one] => one.clone(),
            many => format!("[{}]", many.join(", ")),
        };
        let kind = if rt.group.is_empty() {
            rt.kind.to_string()
        } else {
            format!("{}.{}", rt.kind, rt.group)
        };
        let mut err = ApiError::new(
            422,
            "Invalid",
            format!("{kind} \"{name}\" is invalid: {aggregate}"),
        );
        err.details = Some(Box::new(StatusDetails {
            name: Some(name.to_string()),
            group: (!rt.group.is_empty()).then(|| rt.group.to_string()),
            kind: Some(rt.kind.to_string()),
            causes: Some(
                errors
                    .iter()
                    .map(|e| StatusCause {
                        reason: Some("FieldValueInvalid".into()),
                        message: Some(e.body()),
                        field: Some(e.field.clone()),
                    })
                    .collect(),
            ),
            ..StatusDetails::default()
        }));
        err
    }

    /// A 422 whose causes carry their own reason and message (`field.NotSupported`,
    /// `field.Required`, …): `(field, reason, message)` each; kubectl prints
    /// `The <Kind> "<name>" is invalid: <field>: <message>` from the causes.
    pub fn invalid_causes(
        rt: &ResourceType,
        name: &str,
        causes: &[(&str, &'static str, &str)],
    ) -> ApiError {
        let lines: Vec<String> = causes
            .iter()
            .map(|(field, _, message)| format!("{field}: {message}"))
            .collect();
        let aggregate = match lines.as_slice() {
            [one] => one.clone(),
            many => format!("[{}]", many.join(", ")),
        };
        let kind = if rt.group.is_empty() {
            rt.kind.to_string()
        } else {
            format!("{}.{}", rt.kind, rt.group)
        };
        let mut err = ApiError::new(
            422,
            "Invalid",
            format!("{kind} \"{name}\" is invalid: {aggregate}"),
        );
        err.details = Some(Box::new(StatusDetails {
            name: Some(name.to_string()),
            group: (!rt.group.is_empty()).then(|| rt.group.to_string()),
            kind: Some(rt.kind.to_string()),
            causes: Some(
                causes
                    .iter()
                    .map(|(field, reason, message)| StatusCause {
                        reason: Some((*reason).to_string()),
                        message: Some((*message).to_string()),
                        field: Some((*field).to_string()),
                    })
                    .collect(),
            ),
            ..StatusDetails::default()
        }));
        err
    }

    pub fn method_not_allowed(message: impl Into<String>) -> ApiError {
        ApiError::new(405, "MethodNotAllowed", message)
    }

    pub fn unsupported_media_type(content_type: &str) -> ApiError {
        ApiError::new(
            415,
            "UnsupportedMediaType",
            format!(
                "the body of the request was in an unknown format - accepted media types include: application/json, application/merge-patch+json, application/strategic-merge-patch+json, application/apply-patch+yaml (got `{content_type}`)"
            ),
        )
    }

    /// An RBAC refusal, worded like the apiserver's authorizer
    /// (`pods "x" is forbidden: User "admin" cannot create resource "pods/eviction" in API
    /// group "" in the namespace "default"`).
    pub fn forbidden(
        verb: &str,
        rt: &ResourceType,
        subresource: Option<&str>,
        ns: Option<&str>,
        name: Option<&str>,
    ) -> ApiError {
        let resource = match subresource {
            Some(sub) => format!("{}/{sub}", rt.plural),
            None => rt.plural.to_string(),
        };
        let subject = match name {
            Some(n) => format!("{} \"{n}\"", rt.qualified()),
            None => rt.qualified(),
        };
        let scope = match ns.filter(|n| !n.is_empty()) {
            Some(ns) => format!("in the namespace \"{ns}\""),
            None => "at the cluster scope".to_string(),
        };
        let mut err = ApiError::new(
            403,
            "Forbidden",
            format!(
                "{subject} is forbidden: User \"{}\" cannot {verb} resource \"{resource}\" in API group \"{}\" {scope}",
                SIM_USER, rt.group
            ),
        );
        err.details = Some(Box::new(StatusDetails {
            name: name.map(str::to_string),
            group: (!rt.group.is_empty()).then(|| rt.group.to_string()),
            kind: Some(rt.plural.to_string()),
            ..StatusDetails::default()
        }));
        err
    }

    /// A non-resource URL RBAC does not allow (`forbiddenMessage` in k8s.io/apiserver
    /// `pkg/endpoints/handlers/responsewriters/errors.go`: `forbidden: User "…" cannot get path "/metrics"`).
    pub fn forbidden_path(verb: &str, path: &str) -> ApiError {
        ApiError::new(
            403,
            "Forbidden",
            format!("forbidden: User \"{SIM_USER}\" cannot {verb} path \"{path}\""),
        )
    }

    pub fn unauthorized() -> ApiError {
        ApiError::new(401, "Unauthorized", "Unauthorized")
    }

    pub fn unavailable() -> ApiError {
        ApiError::new(
            503,
            "ServiceUnavailable",
            "the server is currently unable to handle the request",
        )
    }

    pub fn gone(message: impl Into<String>) -> ApiError {
        ApiError::new(410, "Expired", message)
    }

    pub fn internal(message: impl Into<String>) -> ApiError {
        ApiError::new(500, "InternalError", message)
    }

    pub fn page_not_found() -> ApiError {
        ApiError::new(
            404,
            "NotFound",
            "the server could not find the requested resource",
        )
    }

    /// The eviction refusal of a PodDisruptionBudget (apiserver `eviction.go`).
    pub fn disruption_budget(pdb: &str, desired: i32, current: i32) -> ApiError {
        let mut err = ApiError::new(
            429,
            "TooManyRequests",
            "Cannot evict pod as it would violate the pod's disruption budget.",
        );
        err.details = Some(Box::new(StatusDetails {
            causes: Some(vec![StatusCause {
                reason: Some("DisruptionBudget".into()),
                message: Some(format!(
                    "The disruption budget {pdb} needs {desired} healthy pods and has {current} currently"
                )),
                field: None,
            }]),
            ..StatusDetails::default()
        }));
        err
    }

    #[allow(
        clippy::expect_used,
        reason = "a k8s-openapi Status has string keys and no floats: serializing it to a JSON value cannot fail"
    )]
    pub fn to_status(&self) -> Value {
        let status = Status {
            code: Some(i32::from(self.code)),
            details: self.details.as_deref().cloned(),
            message: Some(self.message.clone()),
            reason: Some(self.reason.to_string()),
            status: Some("Failure".into()),
            ..Status::default()
        };
        serde_json::to_value(status).expect("Status serializes")
    }
}

/// The `Status` of a successful operation without an object (an accepted eviction).
#[allow(
    clippy::expect_used,
    reason = "a k8s-openapi Status has string keys and no floats: serializing it to a JSON value cannot fail"
)]
pub(crate) fn success(code: u16) -> Value {
    let status = Status {
        code: Some(i32::from(code)),
        status: Some("Success".into()),
        ..Status::default()
    };
    serde_json::to_value(status).expect("Status serializes")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pdb_refusal_has_the_apiserver_shape() {
        let v = ApiError::disruption_budget("web-pdb", 2, 2).to_status();
        assert_eq!(v["kind"], "Status");
        assert_eq!(v["apiVersion"], "v1");
        assert_eq!(v["code"], 429);
        assert_eq!(v["reason"], "TooManyRequests");
        assert_eq!(v["status"], "Failure");
        assert_eq!(v["details"]["causes"][0]["reason"], "DisruptionBudget");
        assert_eq!(
            v["details"]["causes"][0]["message"],
            "The disruption budget web-pdb needs 2 healthy pods and has 2 currently"
        );
    }
}
