//! The file provider: loads `-f` files and directories, computes the desired
//! state, and on [`FileProvider::poll`] reloads when the files changed and says
//! what changed.
//!
//! # Why polling, not inotify
//!
//! Files are watched by polling a fingerprint (a hash of every manifest's bytes,
//! with the same walk rules as [`crate::manifest`]) rather than with the `notify`
//! crate. Polling sees every way a file changes — editors that write a temporary
//! file and rename it, `kubectl`-style symlink swaps in mounted ConfigMaps, files
//! created in a directory that did not exist yet, network file systems — with no
//! platform-specific code, and costs one read of a few small files per interval.
//! Hashing the bytes (not just mtimes) means a touch without change reloads
//! nothing.
//!
//! # Debounce
//!
//! A change is applied only once the fingerprint has been the same for two polls
//! in a row, so a file caught half-written is not applied (and reported as
//! broken) on the way to its final content.

use std::collections::BTreeMap;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::path::{Path, PathBuf};

use super::desired::{DesiredOptions, DesiredState, desired_state};
use super::diff::{Change, diff};
use crate::manifest;

/// Content fingerprint of a set of manifest paths.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Fingerprint(BTreeMap<PathBuf, Option<u64>>);

/// Fingerprints `paths` with the walk rules of [`manifest::load_paths`]: a
/// directory is walked recursively, skipping dot entries and reading only
/// `.yaml`, `.yml` and `.json` files; a named file is read whatever its name. A
/// path that cannot be read is recorded as such, so its appearance is a change.
pub fn fingerprint(paths: &[PathBuf]) -> Fingerprint {
    let mut fp = Fingerprint::default();
    for path in paths {
        walk(path, true, &mut fp.0);
    }
    fp
}

fn walk(path: &Path, explicit: bool, out: &mut BTreeMap<PathBuf, Option<u64>>) {
    match std::fs::metadata(path) {
        Ok(m) if m.is_dir() => {
            let Ok(entries) = std::fs::read_dir(path) else {
                out.insert(path.to_owned(), None);
                return;
            };
            let mut entries: Vec<PathBuf> =
                entries.filter_map(|e| e.ok().map(|e| e.path())).collect();
            entries.sort();
            for entry in entries {
                let hidden = entry
                    .file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| n.starts_with('.'));
                if !hidden {
                    walk(&entry, false, out);
                }
            }
        }
        Ok(_) => {
            let ext = path.extension().and_then(|e| e.to_str()).unwrap_or("");
            if explicit || matches!(ext, "yaml" | "yml" | "json") {
                let hash = std::fs::read(path).ok().map(|bytes| {
                    let mut h = DefaultHasher::new();
                    bytes.hash(&mut h);
                    h.finish()
                });
                out.insert(path.to_owned(), hash);
            }
        }
        Err(_) => {
            out.insert(path.to_owned(), None);
        }
    }
}

/// Loads manifests into a [`DesiredState`] and tracks changes.
#[derive(Debug)]
pub struct FileProvider {
    paths: Vec<PathBuf>,
    options: DesiredOptions,
    applied: Fingerprint,
    pending: Option<Fingerprint>,
    state: DesiredState,
}

impl FileProvider {
    /// Loads `paths` now. Broken files do not fail this: they are in
    /// `state().skipped`.
    pub fn new(paths: Vec<PathBuf>, options: DesiredOptions) -> Self {
        let applied = fingerprint(&paths);
        let state = desired_state(&manifest::load_paths(&paths), &options);
        Self {
            paths,
            options,
            applied,
            pending: None,
            state,
        }
    }

    /// The current desired state.
    pub fn state(&self) -> &DesiredState {
        &self.state
    }

    /// The watched paths.
    pub fn paths(&self) -> &[PathBuf] {
        &self.paths
    }

    /// Checks the files. Returns the changes when the files changed and have
    /// settled (see the module docs), `None` otherwise. An edit that changes
    /// nothing served (a comment) returns `Some` with no changes, so callers can
    /// still reprint the report (skipped items may have changed).
    pub fn poll(&mut self) -> Option<Vec<Change>> {
        let now = fingerprint(&self.paths);
        if now == self.applied {
            self.pending = None;
            return None;
        }
        if self.pending.as_ref() != Some(&now) {
            self.pending = Some(now);
            return None;
        }
        Some(self.reload_with(now))
    }

    /// Reloads now, without the debounce.
    pub fn reload(&mut self) -> Vec<Change> {
        let now = fingerprint(&self.paths);
        self.reload_with(now)
    }

    fn reload_with(&mut self, fingerprint: Fingerprint) -> Vec<Change> {
        let next = desired_state(&manifest::load_paths(&self.paths), &self.options);
        let changes = diff(&self.state, &next);
        self.state = next;
        self.applied = fingerprint;
        self.pending = None;
        changes
    }
}
