//! The connector proxy's CA: generated once, kept in a Secret of the
//! operator's namespace (`kubernetes.io/tls`, `tls.crt` + `tls.key`), loaded
//! by every start and every replica. Its certificate is what kubeconfigs
//! carry in `certificate-authority-data` (published in each Connector's
//! `status.proxy.httpAddress.CACerts`).
//!
//! The certificate alone is published in a ConfigMap of the same name (key
//! `ca.crt`, as `kube-root-ca.crt` is), which is all the CSI node plugin
//! reads: the nodes never hold a right to the CA's key.
//!
//! Rotating it: delete the Secret and restart the role; kubeconfigs minted
//! before then stop working (their tokens are short-lived anyway).

use std::collections::BTreeMap;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::Client;
use kube::api::{Api, ObjectMeta, Patch, PatchParams, PostParams};
use tuna_proxy::{CaPem, Credential, InterceptCa};

use crate::Error;

/// The CA of Secret `namespace/name`, created (with a new CA) if absent.
pub async fn load_or_create(client: &Client, namespace: &str, name: &str) -> crate::Result<CaPem> {
    let id = format!("{namespace}/{name}");
    let api: Api<Secret> = Api::namespaced(client.clone(), namespace);
    let kube = |source| Error::ProxyCaSecret {
        secret: id.clone(),
        source,
    };
    for _ in 0..2 {
        if let Some(secret) = api.get_opt(name).await.map_err(kube)? {
            let pem = from_secret(&secret).ok_or_else(|| Error::ProxyCaIncomplete(id.clone()))?;
            InterceptCa::from_pem(&pem).map_err(|source| Error::ProxyCaInvalid {
                secret: id.clone(),
                source,
            })?;
            return Ok(pem);
        }
        let pem = InterceptCa::generate("tuna-operator connectors proxy CA").map_err(|source| {
            Error::ProxyCaInvalid {
                secret: id.clone(),
                source,
            }
        })?;
        let secret = Secret {
            metadata: ObjectMeta {
                name: Some(name.to_owned()),
                namespace: Some(namespace.to_owned()),
                labels: Some(BTreeMap::from([(
                    "app.kubernetes.io/managed-by".to_owned(),
                    "tuna-operator".to_owned(),
                )])),
                ..Default::default()
            },
            type_: Some("kubernetes.io/tls".into()),
            data: Some(BTreeMap::from([
                (
                    "tls.crt".to_owned(),
                    ByteString(pem.cert_pem.clone().into_bytes()),
                ),
                (
                    "tls.key".to_owned(),
                    ByteString(pem.key_pem.expose().as_bytes().to_vec()),
                ),
            ])),
            ..Default::default()
        };
        match api.create(&PostParams::default(), &secret).await {
            Ok(_) => {
                tracing::info!(secret = %id, "created the connector proxy's CA");
                return Ok(pem);
            }
            // Another replica made it first: use that one.
            Err(kube::Error::Api(s)) if s.code == 409 => continue,
            Err(e) => return Err(kube(e)),
        }
    }
    Err(Error::ProxyCaIncomplete(id))
}

/// The key of the CA certificate in the published ConfigMap.
pub const CA_CERT_KEY: &str = "ca.crt";

/// Publishes the CA's certificate (no key) in ConfigMap `namespace/name`
/// (server-side apply), for the CSI node plugin.
pub async fn publish_certificate(
    client: &Client,
    namespace: &str,
    name: &str,
    cert_pem: &str,
) -> crate::Result<()> {
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), namespace);
    let config_map = ConfigMap {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            namespace: Some(namespace.to_owned()),
            labels: Some(BTreeMap::from([(
                "app.kubernetes.io/managed-by".to_owned(),
                "tuna-operator".to_owned(),
            )])),
            ..Default::default()
        },
        data: Some(BTreeMap::from([(
            CA_CERT_KEY.to_owned(),
            cert_pem.to_owned(),
        )])),
        ..Default::default()
    };
    api.patch(
        name,
        &PatchParams::apply(crate::connectors::reconciler::FIELD_MANAGER).force(),
        &Patch::Apply(&config_map),
    )
    .await
    .map_err(|source| Error::ProxyCaConfigMap {
        config_map: format!("{namespace}/{name}"),
        source,
    })?;
    Ok(())
}

/// The certificate (PEM) of the proxy's CA, from ConfigMap `namespace/name`
/// (what [`publish_certificate`] wrote), as the CSI plugin puts it in
/// workload kubeconfigs: it must parse as a certificate. `Ok(None)`: the
/// ConfigMap does not exist yet (the connectors role writes it at its start).
pub async fn certificate(
    client: &Client,
    namespace: &str,
    name: &str,
) -> crate::Result<Option<String>> {
    let id = format!("{namespace}/{name}");
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), namespace);
    let Some(config_map) = api
        .get_opt(name)
        .await
        .map_err(|source| Error::ProxyCaConfigMap {
            config_map: id.clone(),
            source,
        })?
    else {
        return Ok(None);
    };
    let pem = config_map
        .data
        .as_ref()
        .and_then(|d| d.get(CA_CERT_KEY))
        .filter(|pem| {
            use rustls::pki_types::{CertificateDer, pem::PemObject};
            CertificateDer::pem_slice_iter(pem.as_bytes())
                .next()
                .is_some_and(|c| c.is_ok())
        })
        .cloned()
        .ok_or(Error::ProxyCaCertificateMissing(id))?;
    Ok(Some(pem))
}

fn from_secret(secret: &Secret) -> Option<CaPem> {
    let data = secret.data.as_ref()?;
    let text = |k: &str| {
        data.get(k)
            .and_then(|b| String::from_utf8(b.0.clone()).ok())
            .filter(|s| !s.is_empty())
    };
    Some(CaPem {
        cert_pem: text("tls.crt")?,
        key_pem: Credential::new(text("tls.key")?),
    })
}
