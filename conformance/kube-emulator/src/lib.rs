//! kube-emulator (placeholder until issue 5 lands).
