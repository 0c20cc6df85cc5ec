//! The crate's one error enum, and the API-level error that becomes a `Status` object.

use serde_json::{Value, json};

/// Errors of the emulator's library API (starting, loading manifests, writing kubeconfigs).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Binding or serving the listening socket failed.
    #[error("cannot listen on {addr}: {source}")]
    Listen {
        /// The address asked for (`127.0.0.1:0`, …).
        addr: String,
        /// Why the bind or accept failed.
        #[source]
        source: std::io::Error,
    },
    /// A file (manifest, kubeconfig, audit log) could not be read or written.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// Why reading or writing it failed.
        #[source]
        source: std::io::Error,
    },
    /// A manifest is not valid YAML/JSON.
    #[error("{path}: not a valid YAML manifest: {message}")]
    Manifest {
        /// The manifest file.
        path: String,
        /// The parser's message.
        message: String,
    },
    /// The API rejected an object while pre-loading manifests.
    #[error("{what}: {status}")]
    Rejected {
        /// The object, as `Kind name`.
        what: String,
        /// The API's answer (its `Status` message).
        status: String,
    },
    /// Generating the TLS certificates failed.
    #[error("generating TLS certificates: {0}")]
    Tls(String),
    /// Building a kube-rs client failed.
    #[error("building a kube client: {0}")]
    Client(String),
}

/// `Result` with the crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// An API error: turned into a Kubernetes `Status` object with the matching HTTP code.
#[derive(Debug, Clone)]
pub struct ApiError {
    /// The HTTP status code, also the `Status.code`.
    pub code: u16,
    /// `Status.reason` (`NotFound`, `AlreadyExists`, …), which clients match on.
    pub reason: &'static str,
    /// `Status.message`, for people.
    pub message: String,
    /// `Status.details` (name, group, kind, causes), when the apiserver sends them.
    pub details: Option<Value>,
    /// `Warning` headers of the refused request (admission policies bound
    /// with `Warn`), sent with the `Status`.
    pub warnings: Vec<String>,
}

impl ApiError {
    /// An error with no details and no warnings.
    pub fn new(code: u16, reason: &'static str, message: impl Into<String>) -> Self {
        ApiError {
            code,
            reason,
            message: message.into(),
            details: None,
            warnings: Vec::new(),
        }
    }
    /// The same error with `Status.details`.
    pub fn with_details(mut self, details: Value) -> Self {
        self.details = Some(details);
        self
    }
    /// 400 `BadRequest`: the request itself is malformed.
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(400, "BadRequest", message)
    }
    /// 404 `NotFound` for the object `name` of `resource_group` (`pods`, `tunnels.tuna.am`).
    pub fn not_found(resource_group: &str, name: &str) -> Self {
        Self::new(404, "NotFound", format!("{resource_group} \"{name}\" not found"))
            .with_details(json!({"name": name, "kind": kind_of(resource_group), "group": group_of(resource_group)}))
    }
    /// 409 `AlreadyExists`: a create of a name that is taken.
    pub fn already_exists(resource_group: &str, name: &str) -> Self {
        Self::new(409, "AlreadyExists", format!("{resource_group} \"{name}\" already exists"))
            .with_details(json!({"name": name, "kind": kind_of(resource_group), "group": group_of(resource_group)}))
    }
    /// 409 `Conflict`: a stale `resourceVersion` or a UID precondition that does not hold.
    pub fn conflict(resource_group: &str, name: &str, why: &str) -> Self {
        Self::new(
            409,
            "Conflict",
            format!("Operation cannot be fulfilled on {resource_group} \"{name}\": {why}"),
        )
        .with_details(json!({"name": name, "kind": kind_of(resource_group), "group": group_of(resource_group)}))
    }
    /// 422 with one cause per field error, as the apiserver reports validation failures.
    pub fn invalid(kind_group: &str, name: &str, causes: Vec<FieldError>) -> Self {
        let msgs: Vec<String> = causes.iter().map(|c| c.to_string()).collect();
        let message = if msgs.len() == 1 {
            format!("{kind_group} \"{name}\" is invalid: {}", msgs[0])
        } else {
            format!("{kind_group} \"{name}\" is invalid: [{}]", msgs.join(", "))
        };
        let (kind, group) = match kind_group.split_once('.') {
            Some((k, g)) => (k, g),
            None => (kind_group, ""),
        };
        Self::new(422, "Invalid", message).with_details(json!({
            "name": name, "group": group, "kind": kind,
            "causes": causes.iter().map(|c| json!({"reason": c.reason, "message": c.detail_message(), "field": c.field})).collect::<Vec<_>>(),
        }))
    }
    /// 403 `Forbidden`: RBAC or an admission policy refused the request.
    pub fn forbidden(message: impl Into<String>) -> Self {
        Self::new(403, "Forbidden", message)
    }
    /// 405 `MethodNotAllowed`: the verb does not apply to the resource.
    pub fn method_not_allowed(message: impl Into<String>) -> Self {
        Self::new(405, "MethodNotAllowed", message)
    }
    /// 410 `Expired`: a watch or list from a `resourceVersion` older than the history kept.
    pub fn gone(message: impl Into<String>) -> Self {
        Self::new(410, "Expired", message)
    }
    /// 415 `UnsupportedMediaType`: a body or patch type the resource does not take.
    pub fn unsupported_media(message: impl Into<String>) -> Self {
        Self::new(415, "UnsupportedMediaType", message)
    }

    /// The `Status` object the apiserver returns for this error.
    pub fn to_status(&self) -> Value {
        let mut s = json!({
            "kind": "Status", "apiVersion": "v1", "metadata": {},
            "status": "Failure", "message": self.message, "reason": self.reason, "code": self.code,
        });
        if let Some(d) = &self.details {
            s["details"] = d.clone();
        }
        s
    }
}

fn kind_of(resource_group: &str) -> &str {
    resource_group
        .split_once('.')
        .map(|(r, _)| r)
        .unwrap_or(resource_group)
}
fn group_of(resource_group: &str) -> &str {
    resource_group.split_once('.').map(|(_, g)| g).unwrap_or("")
}

/// One field-level validation failure (a `StatusCause`).
#[derive(Debug, Clone)]
pub struct FieldError {
    pub field: String,
    pub reason: &'static str,
    pub message: String,
}

impl FieldError {
    pub fn invalid(field: impl Into<String>, value: &Value, message: impl Into<String>) -> Self {
        let field = field.into();
        let v = match value {
            Value::String(s) => format!("\"{s}\""),
            other => other.to_string(),
        };
        FieldError {
            field,
            reason: "FieldValueInvalid",
            message: format!("Invalid value: {v}: {}", message.into()),
        }
    }
    pub fn required(field: impl Into<String>) -> Self {
        FieldError {
            field: field.into(),
            reason: "FieldValueRequired",
            message: "Required value".into(),
        }
    }
    pub fn unsupported(field: impl Into<String>, value: &Value, allowed: &[Value]) -> Self {
        let list: Vec<String> = allowed.iter().map(|v| v.to_string()).collect();
        FieldError {
            field: field.into(),
            reason: "FieldValueNotSupported",
            message: format!(
                "Unsupported value: {value}: supported values: {}",
                list.join(", ")
            ),
        }
    }
    pub fn forbidden(field: impl Into<String>, message: impl Into<String>) -> Self {
        FieldError {
            field: field.into(),
            reason: "FieldValueForbidden",
            message: format!("Forbidden: {}", message.into()),
        }
    }
    fn detail_message(&self) -> &str {
        &self.message
    }
}

impl std::fmt::Display for FieldError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.field, self.message)
    }
}
