//! Loading Kubernetes manifests from files (being written for issue 2).
