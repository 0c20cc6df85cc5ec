//! The connector family: workloads run `kubectl` against another cluster
//! without ever holding its credentials.
//!
//! ```text
//! workload (kubeconfig: server = the target, proxy-url = the proxy's Service:80,
//!           proxy password = its own short-lived ServiceAccount token)
//!    │ CONNECT target:port, Proxy-Authorization: Basic <ns>/<name>:<token>
//!    ▼
//! connector proxy (a CONNECT listener of the proxy core)
//!    │ TokenReview + SubjectAccessReview (authorizer), TLS intercepted with
//!    │ the proxy CA, Authorization replaced by the Connector's Secret's token
//!    ▼
//! target API server (TLS verified with the Connector's CA)
//! ```
//!
//! - [`kubeconfig`]: the `kubeconfig` configuration of the `k8s` class, one
//!   renderer for the CLI and the CSI driver;
//! - [`authorizer`]: who may use which connector (the proxy core's
//!   `ConnectAuthorizer`, implemented with Kubernetes reviews);
//! - [`targets`]: what the proxy may reach, published by the reconciler
//!   (`crate::connectors::reconciler`);
//! - [`probe`]: the HTTPS probes of a connector's address;
//! - [`proxy_ca`]: the proxy's CA, kept in a Secret;
//! - [`role`]: `tuna-operator connectors`;
//! - [`cli`]: `tuna-operator connector kubeconfig`.

pub mod authorizer;
pub mod cli;
pub mod kubeconfig;
pub mod probe;
pub mod proxy_ca;
pub mod reconciler;
pub mod role;
pub mod targets;
