//! Pure translation of Kubernetes objects into route specs (being written for issue 2).
