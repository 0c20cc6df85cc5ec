//! What a `NodePublishVolume` asks for, read from its `volume_context`: the
//! volume's attributes (`volumeAttributes` of the pod's inline volume) and
//! the pod's identity kubelet adds (`podInfoOnMount: true`). Pure: every rule
//! of the attributes is tested here without a socket.
//!
//! | attribute | meaning |
//! |---|---|
//! | `connector.name` | the Connector (deprecated form, still the documentation's) |
//! | `connector.namespace` | its namespace; default: the pod's |
//! | `connectors` | `ns/name` or `name`: the newer form (one connector per volume) |
//! | `configuration.names` | comma list of configurations to render (default: all of the class); `!file` leaves a file out |
//! | `token.expiration` | accepted for compatibility (a duration, `10m` to `24h`), not used: the token is kubelet's, its lifetime the CSIDriver's `tokenRequests[].expirationSeconds` |
//! | `csi.storage.k8s.io/pod.name`, `pod.namespace`, `pod.uid`, `serviceAccount.name` | the pod, from kubelet |
//! | `csi.storage.k8s.io/ephemeral` | `true` for inline volumes: the only kind served |
//! | `csi.storage.k8s.io/serviceAccount.tokens` | the pod's tokens kubelet requested (`tokenRequests`), in `secrets` (Kubernetes 1.35 with `serviceAccountTokenInSecrets`) or here |

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::Duration;

use k8s_openapi::api::authentication::v1::TokenRequestStatus;
use tuna_proxy::Credential;

use crate::Error;

/// The pod's name, from kubelet.
pub const POD_NAME: &str = "csi.storage.k8s.io/pod.name";
/// The pod's namespace, from kubelet.
pub const POD_NAMESPACE: &str = "csi.storage.k8s.io/pod.namespace";
/// The pod's UID, from kubelet.
pub const POD_UID: &str = "csi.storage.k8s.io/pod.uid";
/// The pod's ServiceAccount, from kubelet.
pub const POD_SERVICE_ACCOUNT: &str = "csi.storage.k8s.io/serviceAccount.name";
/// `"true"` for an inline ephemeral volume, from kubelet.
pub const EPHEMERAL: &str = "csi.storage.k8s.io/ephemeral";
/// The pod's ServiceAccount tokens kubelet requested for the CSIDriver's
/// `tokenRequests`: JSON `{"<audience>": {"token", "expirationTimestamp"}}`.
pub const SERVICE_ACCOUNT_TOKENS: &str = "csi.storage.k8s.io/serviceAccount.tokens";

/// Default of `token.expiration` (the chart's CSIDriver asks kubelet for
/// tokens of this lifetime too).
pub const DEFAULT_EXPIRATION: Duration = Duration::from_secs(30 * 60);
/// The API server refuses TokenRequests under ten minutes.
pub const MIN_EXPIRATION: Duration = Duration::from_secs(10 * 60);
/// The API server refuses TokenRequests over 2³² seconds; a day is plenty
/// for a token that is rotated anyway.
pub const MAX_EXPIRATION: Duration = Duration::from_secs(24 * 3600);

/// The pod a volume is published for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodIdentity {
    /// `metadata.name`.
    pub name: String,
    /// `metadata.namespace`.
    pub namespace: String,
    /// `metadata.uid`.
    pub uid: String,
    /// `spec.serviceAccountName`.
    pub service_account: String,
}

/// Which files of the volume are written.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct FileSelection {
    /// Configurations named without `!` (empty: all of the class).
    pub configurations: Vec<String>,
    /// Files named with `!`: left out.
    pub excluded: BTreeSet<String>,
}

/// A parsed publish request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VolumeRequest {
    /// The Connector's namespace.
    pub connector_namespace: String,
    /// The Connector's name.
    pub connector_name: String,
    /// What to write.
    pub files: FileSelection,
    /// `token.expiration`: checked and kept for compatibility; the token's
    /// lifetime is the CSIDriver's `tokenRequests[].expirationSeconds`.
    pub token_expiration: Duration,
    /// The pod.
    pub pod: PodIdentity,
}

fn invalid(message: impl Into<String>) -> Error {
    Error::CsiInvalidArgument(message.into())
}

/// A DNS-1123 subdomain (names of namespaces and Connectors).
fn is_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 253
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.')
        && !s.starts_with(['-', '.'])
        && !s.ends_with(['-', '.'])
}

fn required<'a>(context: &'a HashMap<String, String>, key: &str) -> crate::Result<&'a str> {
    match context.get(key).map(|v| v.trim()) {
        Some(v) if !v.is_empty() => Ok(v),
        _ => Err(invalid(format!(
            "volume_context has no {key}: set podInfoOnMount: true in the CSIDriver connectors-csi (the chart does)"
        ))),
    }
}

impl VolumeRequest {
    /// Reads `context` (a NodePublishVolume's `volume_context`).
    pub fn parse(context: &HashMap<String, String>) -> crate::Result<Self> {
        if context.get(EPHEMERAL).map(String::as_str) != Some("true") {
            return Err(invalid(format!(
                "connectors-csi serves inline ephemeral volumes only ({EPHEMERAL} is not \"true\"): use a csi: volume in the pod spec, not a PersistentVolume"
            )));
        }
        let pod = PodIdentity {
            name: required(context, POD_NAME)?.to_owned(),
            namespace: required(context, POD_NAMESPACE)?.to_owned(),
            uid: required(context, POD_UID)?.to_owned(),
            service_account: required(context, POD_SERVICE_ACCOUNT)?.to_owned(),
        };
        let (connector_namespace, connector_name) = connector_of(context, &pod.namespace)?;
        let files = match context.get("configuration.names") {
            Some(names) => parse_names(names)?,
            None => FileSelection::default(),
        };
        let token_expiration = match context.get("token.expiration").map(|v| v.trim()) {
            None | Some("") => DEFAULT_EXPIRATION,
            Some(v) => parse_expiration(v)?,
        };
        Ok(Self {
            connector_namespace,
            connector_name,
            files,
            token_expiration,
            pod,
        })
    }
}

/// `(namespace, name)` of the volume's connector.
fn connector_of(
    context: &HashMap<String, String>,
    pod_namespace: &str,
) -> crate::Result<(String, String)> {
    let new = context
        .get("connectors")
        .map(|v| v.trim())
        .filter(|v| !v.is_empty());
    let old = context
        .get("connector.name")
        .map(|v| v.trim())
        .filter(|v| !v.is_empty());
    let (namespace, name) = match (new, old) {
        (Some(_), Some(_)) => {
            return Err(invalid(
                "give either connectors or connector.name, not both",
            ));
        }
        (None, None) => {
            return Err(invalid(
                "volumeAttributes has no connector.name (or connectors: <namespace>/<name>): name the Connector to mount",
            ));
        }
        (Some(list), None) => {
            let entries: Vec<&str> = list.split(',').map(str::trim).collect();
            if entries.len() != 1 {
                return Err(invalid(format!(
                    "connectors {list:?} names {} connectors: a volume of the k8s class holds one kubeconfig, mount one volume per connector",
                    entries.len()
                )));
            }
            match entries[0].split_once('/') {
                Some((ns, name)) => (ns.to_owned(), name.to_owned()),
                None => (pod_namespace.to_owned(), entries[0].to_owned()),
            }
        }
        (None, Some(name)) => {
            let namespace = context
                .get("connector.namespace")
                .map(|v| v.trim())
                .filter(|v| !v.is_empty())
                .unwrap_or(pod_namespace);
            (namespace.to_owned(), name.to_owned())
        }
    };
    if !is_name(&namespace) || !is_name(&name) {
        return Err(invalid(format!(
            "{namespace:?}/{name:?} is not a connector's <namespace>/<name> (lower-case DNS names)"
        )));
    }
    Ok((namespace, name))
}

/// `configuration.names`: `kubeconfig`, `kubeconfig,!context.token`, ….
pub fn parse_names(value: &str) -> crate::Result<FileSelection> {
    let mut selection = FileSelection::default();
    for entry in value.split(',').map(str::trim).filter(|e| !e.is_empty()) {
        let (excluded, name) = match entry.strip_prefix('!') {
            Some(name) => (true, name.trim()),
            None => (false, entry),
        };
        if name.is_empty()
            || name == "."
            || name == ".."
            || name.starts_with("..")
            || name.contains(['/', '\\', '\0'])
        {
            return Err(invalid(format!(
                "configuration.names: {entry:?} is not a file name"
            )));
        }
        if excluded {
            selection.excluded.insert(name.to_owned());
        } else if !selection.configurations.iter().any(|c| c == name) {
            selection.configurations.push(name.to_owned());
        }
    }
    Ok(selection)
}

/// `token.expiration`: a duration like `30m`, between 10m and 24h.
pub fn parse_expiration(value: &str) -> crate::Result<Duration> {
    let duration = humantime::parse_duration(value).map_err(|e| {
        invalid(format!(
            "token.expiration {value:?} is not a duration like 30m or 1h: {e}"
        ))
    })?;
    if duration < MIN_EXPIRATION {
        return Err(invalid(format!(
            "token.expiration {value:?} is too short: the API server refuses tokens of less than 10m"
        )));
    }
    if duration > MAX_EXPIRATION {
        return Err(invalid(format!(
            "token.expiration {value:?} is too long: at most 24h (the token is rotated anyway)"
        )));
    }
    Ok(duration)
}

/// The pod's token for one audience, as kubelet passed it.
pub struct PodToken {
    /// The token (a proxy password).
    pub token: Credential,
    /// When it expires (Unix seconds).
    pub expires_at: u64,
}

/// kubelet's `serviceAccount.tokens` of a publish: from `secrets` first
/// (Kubernetes 1.35 puts them only there with
/// `serviceAccountTokenInSecrets: true`), else from `volume_context`.
/// Missing: the CSIDriver has no `tokenRequests`, or kubelet could not get
/// a token yet — `UNAVAILABLE`, kubelet retries.
pub fn service_account_tokens<'a>(
    secrets: &'a HashMap<String, String>,
    context: &'a HashMap<String, String>,
) -> crate::Result<&'a str> {
    secrets
        .get(SERVICE_ACCOUNT_TOKENS)
        .or_else(|| context.get(SERVICE_ACCOUNT_TOKENS))
        .map(String::as_str)
        .filter(|t| !t.trim().is_empty())
        .ok_or_else(|| {
            Error::CsiUnavailable(format!(
                "kubelet passed no ServiceAccount token ({SERVICE_ACCOUNT_TOKENS}): the CSIDriver connectors-csi must declare tokenRequests for the connector proxy's audience (the chart does); kubelet will retry"
            ))
        })
}

/// The token for `audience` in kubelet's `tokens` JSON. An expired or
/// missing one is `UNAVAILABLE` (kubelet brings a fresh one at the next
/// republish). Error messages never quote the JSON: it holds tokens.
pub fn pod_token(tokens: &str, audience: &str, now: u64) -> crate::Result<PodToken> {
    let map: BTreeMap<String, TokenRequestStatus> =
        serde_json::from_str(tokens).map_err(|e| {
            Error::CsiInvalidArgument(format!(
                "{SERVICE_ACCOUNT_TOKENS} is not kubelet's map of audience to {{token, expirationTimestamp}} (line {}, column {})",
                e.line(),
                e.column()
            ))
        })?;
    let Some(status) = map.get(audience).filter(|s| !s.token.is_empty()) else {
        let audiences: Vec<&str> = map.keys().map(String::as_str).collect();
        return Err(Error::CsiUnavailable(format!(
            "kubelet passed no token for the audience {audience:?} (only for {audiences:?}): add it to the CSIDriver connectors-csi's tokenRequests (the chart's connectors.tokenAudience); kubelet will retry"
        )));
    };
    let expires_at = u64::try_from(status.expiration_timestamp.0.as_second()).unwrap_or(0);
    if expires_at <= now {
        return Err(Error::CsiUnavailable(format!(
            "the token kubelet passed for the audience {audience:?} has expired; kubelet will retry with a fresh one"
        )));
    }
    Ok(PodToken {
        token: Credential::new(status.token.clone()),
        expires_at,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn context(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        let mut c: HashMap<String, String> = [
            (POD_NAME, "k8s-access-x7k2p"),
            (POD_NAMESPACE, "k8s-connector-demo"),
            (POD_UID, "0d4b5f2c-1111-4c1e-9a53-3b0e7e5a6f11"),
            (POD_SERVICE_ACCOUNT, "default"),
            (EPHEMERAL, "true"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
        for (k, v) in pairs {
            if v.is_empty() {
                c.remove(*k);
            } else {
                c.insert((*k).to_owned(), (*v).to_owned());
            }
        }
        c
    }

    /// The documentation's volume.
    #[test]
    fn the_documented_attributes() {
        let r = VolumeRequest::parse(&context(&[
            ("connector.name", "k8s-connector"),
            ("configuration.names", "kubeconfig"),
        ]))
        .unwrap();
        assert_eq!(r.connector_namespace, "k8s-connector-demo");
        assert_eq!(r.connector_name, "k8s-connector");
        assert_eq!(r.files.configurations, ["kubeconfig"]);
        assert!(r.files.excluded.is_empty());
        assert_eq!(r.token_expiration, DEFAULT_EXPIRATION);
        assert_eq!(r.pod.service_account, "default");
        assert_eq!(r.pod.name, "k8s-access-x7k2p");
    }

    #[test]
    fn connector_forms() {
        type Case<'a> = (&'a [(&'a str, &'a str)], Option<(&'a str, &'a str)>);
        let table: &[Case] = &[
            (
                &[("connector.name", "c")],
                Some(("k8s-connector-demo", "c")),
            ),
            (
                &[("connector.name", "c"), ("connector.namespace", "other")],
                Some(("other", "c")),
            ),
            (&[("connectors", "ns/c")], Some(("ns", "c"))),
            (&[("connectors", " c ")], Some(("k8s-connector-demo", "c"))),
            (&[("connectors", "a/c,b/d")], None),
            (&[("connectors", "ns/c"), ("connector.name", "c")], None),
            (&[], None),
            (&[("connector.name", "C")], None),
            (&[("connector.name", "a/b")], None),
            (&[("connectors", "ns/")], None),
            (&[("connectors", "/c")], None),
        ];
        for (pairs, want) in table {
            let got = VolumeRequest::parse(&context(pairs))
                .map(|r| (r.connector_namespace, r.connector_name));
            match want {
                Some((ns, name)) => {
                    assert_eq!(got.unwrap(), ((*ns).into(), (*name).into()), "{pairs:?}")
                }
                None => assert!(
                    matches!(got, Err(Error::CsiInvalidArgument(_))),
                    "{pairs:?}: {got:?}"
                ),
            }
        }
    }

    #[test]
    fn configuration_names() {
        let s = parse_names("kubeconfig, !context.token,kubeconfig,,!.env").unwrap();
        assert_eq!(s.configurations, ["kubeconfig"]);
        assert_eq!(
            s.excluded.iter().map(String::as_str).collect::<Vec<_>>(),
            [".env", "context.token"]
        );
        assert_eq!(parse_names("").unwrap(), FileSelection::default());
        for bad in ["../x", "a/b", "!", "..data", "!../../etc"] {
            assert!(parse_names(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn expirations() {
        assert_eq!(parse_expiration("10m").unwrap(), MIN_EXPIRATION);
        assert_eq!(parse_expiration("1h").unwrap(), Duration::from_secs(3600));
        for bad in ["9m59s", "5m", "0s", "thirty", "25h", "-1m"] {
            assert!(
                matches!(parse_expiration(bad), Err(Error::CsiInvalidArgument(_))),
                "{bad}"
            );
        }
        let r = VolumeRequest::parse(&context(&[
            ("connector.name", "c"),
            ("token.expiration", "45m"),
        ]))
        .unwrap();
        assert_eq!(r.token_expiration, Duration::from_secs(45 * 60));
    }

    #[test]
    fn kubelet_attributes_are_required() {
        for key in [
            POD_NAME,
            POD_NAMESPACE,
            POD_UID,
            POD_SERVICE_ACCOUNT,
            EPHEMERAL,
        ] {
            let err =
                VolumeRequest::parse(&context(&[("connector.name", "c"), (key, "")])).unwrap_err();
            assert!(matches!(err, Error::CsiInvalidArgument(_)), "{key}");
            assert!(err.to_string().contains(key), "{key}: {err}");
        }
        let err = VolumeRequest::parse(&context(&[("connector.name", "c"), (EPHEMERAL, "false")]))
            .unwrap_err();
        assert!(err.to_string().contains("inline ephemeral"), "{err}");
    }

    #[test]
    fn kubelet_tokens() {
        let now = 1_799_000_000;
        let json = r#"{"connectors.alauda.io":{"token":"t-proxy","expirationTimestamp":"2027-01-15T08:00:00Z"},"":{"token":"t-api","expirationTimestamp":"2027-01-15T08:00:00Z"}}"#;
        let map = |pairs: &[(&str, &str)]| -> HashMap<String, String> {
            pairs
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect()
        };
        // From volume_context, and from secrets first (Kubernetes 1.35).
        let context = map(&[(SERVICE_ACCOUNT_TOKENS, json)]);
        assert_eq!(
            service_account_tokens(&HashMap::new(), &context).unwrap(),
            json
        );
        let secrets = map(&[(SERVICE_ACCOUNT_TOKENS, "{}")]);
        assert_eq!(service_account_tokens(&secrets, &context).unwrap(), "{}");
        let err = service_account_tokens(&HashMap::new(), &HashMap::new()).unwrap_err();
        assert!(matches!(err, Error::CsiUnavailable(_)), "{err:?}");
        assert!(err.to_string().contains("tokenRequests"), "{err}");

        let token = pod_token(json, "connectors.alauda.io", now).unwrap();
        assert_eq!(token.token.expose(), "t-proxy");
        // 2027-01-15T08:00:00Z
        assert_eq!(token.expires_at, 1_800_000_000);
        type Case<'a> = (&'a str, &'a str, u64, &'a str);
        let refusals: &[Case] = &[
            (json, "other.example", now, "only for"),
            (json, "connectors.alauda.io", 1_800_000_000, "expired"),
            (
                r#"{"connectors.alauda.io":{"token":"","expirationTimestamp":"2027-01-15T08:00:00Z"}}"#,
                "connectors.alauda.io",
                now,
                "no token",
            ),
            (
                r#"{"connectors.alauda.io":"t-secret"}"#,
                "connectors.alauda.io",
                now,
                "not kubelet's map",
            ),
            ("t-secret", "connectors.alauda.io", now, "not kubelet's map"),
        ];
        for (tokens, audience, at, message) in refusals {
            let err = pod_token(tokens, audience, *at).err().expect("refused");
            assert!(err.to_string().contains(message), "{tokens}: {err}");
            for secret in ["t-proxy", "t-api", "t-secret"] {
                assert!(!err.to_string().contains(secret), "a token in {err}");
            }
        }
    }
}
