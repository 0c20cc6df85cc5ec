//! Pure translation of Kubernetes objects into desired state (routes,
//! tunnels, reservations). No I/O: the Kubernetes controllers and the
//! standalone file provider feed the same functions, and tests call them
//! with plain objects.

pub mod domain;
pub mod ingress;
pub mod service;
pub mod tcpendpoint;
pub mod tunnel;
