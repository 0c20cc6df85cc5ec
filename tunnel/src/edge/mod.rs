//! The self-hosted edge's data plane: agent acceptor, session registry and
//! public listeners. The control plane (REST API, store) lives in `control`.

pub mod authority;
