//! The HTTP probes of a connector's address: liveness (the server answers
//! over verified TLS) and auth (the token is accepted), with the class's
//! paths.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use rustls::pki_types::CertificateDer;
use tuna_proxy::Credential;

/// What a probe found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProbeResult {
    /// The server answered with `status`; `message` is its `Status.message`
    /// (or the start of its body).
    Answered {
        /// The HTTP status.
        status: u16,
        /// The `Status.message`, or the start of the body.
        message: String,
    },
    /// No answer: `reason` is `Timeout`, `TLSVerificationFailed` or
    /// `Unreachable`.
    Failed {
        /// `Timeout`, `TLSVerificationFailed` or `Unreachable`.
        reason: &'static str,
        /// What failed, for the condition's message.
        message: String,
    },
}

/// The system's CA certificates (read once).
fn system_roots() -> Arc<rustls::RootCertStore> {
    static ROOTS: OnceLock<Arc<rustls::RootCertStore>> = OnceLock::new();
    ROOTS
        .get_or_init(|| {
            let mut roots = rustls::RootCertStore::empty();
            let found = rustls_native_certs::load_native_certs();
            for cert in found.certs {
                let _ = roots.add(cert);
            }
            Arc::new(roots)
        })
        .clone()
}

/// A client that trusts `ca` (else the system roots), ignores proxy
/// environment variables, follows no redirect and gives up after `timeout`.
pub fn client(
    ca: Option<&[CertificateDer<'static>]>,
    timeout: Duration,
) -> crate::Result<reqwest::Client> {
    let roots = match ca {
        Some(certs) => {
            let mut roots = rustls::RootCertStore::empty();
            for cert in certs {
                roots
                    .add(cert.clone())
                    .map_err(|e| crate::Error::ProbeTls(e.to_string()))?;
            }
            Arc::new(roots)
        }
        None => system_roots(),
    };
    let mut config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map_err(|e| crate::Error::ProbeTls(e.to_string()))?
    .with_root_certificates(roots)
    .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    reqwest::Client::builder()
        .tls_backend_preconfigured(config)
        .no_proxy()
        .redirect(reqwest::redirect::Policy::none())
        .timeout(timeout)
        .build()
        .map_err(|e| crate::Error::ProbeTls(error_chain(&e)))
}

/// `GET url` with `Authorization: Bearer <token>` (when given).
pub async fn get(client: &reqwest::Client, url: &str, token: Option<&Credential>) -> ProbeResult {
    let mut request = client.get(url).header("accept", "application/json");
    if let Some(token) = token {
        request = request.bearer_auth(token.expose());
    }
    match request.send().await {
        Ok(resp) => {
            let status = resp.status().as_u16();
            let body = resp.text().await.unwrap_or_default();
            ProbeResult::Answered {
                status,
                message: server_message(&body),
            }
        }
        Err(e) => {
            let message = error_chain(&e);
            let reason = if e.is_timeout() {
                "Timeout"
            } else if message.contains("certificate") || message.contains("Certificate") {
                "TLSVerificationFailed"
            } else {
                "Unreachable"
            };
            ProbeResult::Failed { reason, message }
        }
    }
}

/// An error and its causes, `: `-joined (reqwest's top-level message hides
/// the cause).
fn error_chain(error: &dyn std::error::Error) -> String {
    let mut out = error.to_string();
    let mut source = error.source();
    while let Some(e) = source {
        let text = e.to_string();
        if !out.contains(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        source = e.source();
    }
    out
}

/// The `message` of a Kubernetes `Status` body, else the body's first line
/// (at most 200 characters).
fn server_message(body: &str) -> String {
    if let Ok(v) = serde_json::from_str::<serde_json::Value>(body)
        && let Some(m) = v.get("message").and_then(|m| m.as_str())
    {
        return m.to_owned();
    }
    let line = body.lines().next().unwrap_or("").trim();
    line.chars().take(200).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_come_from_status_bodies() {
        assert_eq!(
            server_message(r#"{"kind":"Status","message":"Unauthorized","code":401}"#),
            "Unauthorized"
        );
        assert_eq!(server_message("plain text\nmore"), "plain text");
        assert_eq!(server_message(&"x".repeat(500)).len(), 200);
    }
}
