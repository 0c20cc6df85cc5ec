//! The files of a published volume, written the way kubelet's
//! `AtomicWriter` writes Secret and projected volumes, so that a reader in
//! the pod never sees half a rotation:
//!
//! ```text
//! <target_path>/
//!   ..2026_12_01_13_05_00.123456789/   this generation's files
//!   ..data -> ..2026_…                 swapped with one rename(2)
//!   kubeconfig -> ..data/kubeconfig    what the pod opens
//!   ..state.json                       the plugin's own bookkeeping (no secret)
//! ```
//!
//! The target directory itself is never replaced: the pod's containers
//! bind-mount it at start, so a rotation must happen inside it.
//!
//! Modes: files `0440` and directories `0750`/`0550` owned by root with the
//! group `volume_mount_group` (the pod's `fsGroup`) when kubelet passes one;
//! else `0444` and `0755`/`0555`, because a pod that runs as a non-root user
//! without `fsGroup` (the documentation's `bitnami/kubectl` Job) must still
//! read them. Either way the volume lives under the pod's directory in
//! `/var/lib/kubelet/pods/<uid>/` (mode `0750`, root), which only root on
//! the node and the pod's own containers can enter. `readonly` takes the
//! write bits off the target directory; the files never have any.

use std::fs;
use std::io::{self, Write as _};
use std::os::unix::fs::{PermissionsExt as _, symlink};
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

/// One file of a volume. Its contents may be a token: never in `Debug`.
pub struct VolumeFile {
    /// File name (no `/`).
    pub name: String,
    /// Contents.
    pub contents: Vec<u8>,
}

impl std::fmt::Debug for VolumeFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VolumeFile")
            .field("name", &self.name)
            .field("len", &self.contents.len())
            .finish()
    }
}

/// Who may read a volume and whether it is read-only.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ownership {
    /// The pod's `fsGroup` (`volume_mount_group`).
    pub group: Option<u32>,
    /// `readonly` of the publish call.
    pub readonly: bool,
}

impl Ownership {
    fn file_mode(&self) -> u32 {
        if self.group.is_some() { 0o440 } else { 0o444 }
    }

    fn data_dir_mode(&self) -> u32 {
        if self.group.is_some() { 0o550 } else { 0o555 }
    }

    fn target_mode(&self) -> u32 {
        match (self.group.is_some(), self.readonly) {
            (true, true) => 0o550,
            (true, false) => 0o770,
            (false, true) => 0o555,
            (false, false) => 0o755,
        }
    }
}

/// The plugin's record of a published volume (`..state.json`): what was
/// asked and when the token runs out. Holds no secret.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VolumeState {
    /// The volume's id.
    pub volume_id: String,
    /// A digest of the request (attributes, readonly, group): a changed
    /// request is published anew.
    pub request: String,
    /// When the token was minted (Unix seconds).
    pub issued_at: u64,
    /// When it expires (Unix seconds).
    pub expires_at: u64,
}

const DATA: &str = "..data";
const STATE: &str = "..state.json";

/// Seconds since the Unix epoch.
pub fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or_default()
}

/// The state of the volume at `target`, if it was published by this plugin.
pub fn read_state(target: &Path) -> Option<VolumeState> {
    let text = fs::read(target.join(STATE)).ok()?;
    let state: VolumeState = serde_json::from_slice(&text).ok()?;
    // The files must still be there (someone may have emptied the directory).
    fs::metadata(target.join(DATA)).ok()?;
    Some(state)
}

fn chown_group(path: &Path, group: Option<u32>) -> io::Result<()> {
    match group {
        Some(gid) => std::os::unix::fs::lchown(path, None, Some(gid)),
        None => Ok(()),
    }
}

fn set_mode(path: &Path, mode: u32) -> io::Result<()> {
    fs::set_permissions(path, fs::Permissions::from_mode(mode))
}

/// Writes `contents` to `path` through a temporary file and one rename.
fn replace_file(path: &Path, contents: &[u8], mode: u32) -> io::Result<()> {
    let tmp = path.with_extension("tmp");
    {
        let mut file = fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .open(&tmp)?;
        file.write_all(contents)?;
        file.sync_all()?;
    }
    set_mode(&tmp, mode)?;
    fs::rename(&tmp, path)
}

/// Points `link` at `to`, atomically (a new link renamed over the old one).
fn replace_symlink(link: &Path, to: &Path) -> io::Result<()> {
    let tmp = link.with_file_name(format!(
        "..tmp_{}",
        link.file_name().and_then(|n| n.to_str()).unwrap_or("link")
    ));
    let _ = fs::remove_file(&tmp);
    symlink(to, &tmp)?;
    fs::rename(&tmp, link)
}

fn generation_name() -> String {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    format!("..{}.{:09}", now.as_secs(), now.subsec_nanos())
}

/// Writes `files` into `target` (created if missing, as the CSI spec asks of
/// the plugin), replacing the previous generation atomically, and records
/// `state`. Files of the previous generation that are not in `files` go.
pub fn write_volume(
    target: &Path,
    files: &[VolumeFile],
    ownership: Ownership,
    state: &VolumeState,
) -> io::Result<()> {
    fs::create_dir_all(target)?;
    let generation = generation_name();
    let data_dir = target.join(&generation);
    fs::create_dir(&data_dir)?;
    set_mode(&data_dir, 0o700)?;
    for file in files {
        let path = data_dir.join(&file.name);
        replace_file(&path, &file.contents, ownership.file_mode())?;
        chown_group(&path, ownership.group)?;
    }
    set_mode(&data_dir, ownership.data_dir_mode())?;
    chown_group(&data_dir, ownership.group)?;
    let previous = fs::read_link(target.join(DATA)).ok();
    replace_symlink(&target.join(DATA), Path::new(&generation))?;
    // The names the pod opens.
    for file in files {
        let link = target.join(&file.name);
        if fs::read_link(&link).ok().as_deref() != Some(&Path::new(DATA).join(&file.name)) {
            replace_symlink(&link, &Path::new(DATA).join(&file.name))?;
        }
    }
    // Names of an older generation that this one has not.
    for entry in fs::read_dir(target)? {
        let entry = entry?;
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        if name.starts_with("..") || files.iter().any(|f| f.name == name) {
            continue;
        }
        if let Ok(to) = fs::read_link(entry.path())
            && to.starts_with(DATA)
        {
            fs::remove_file(entry.path())?;
        }
    }
    if let Some(previous) = previous
        && previous != Path::new(&generation)
    {
        remove_generation(&target.join(previous))?;
    }
    let state = serde_json::to_vec(state).expect("the state serializes");
    replace_file(&target.join(STATE), &state, 0o600)?;
    set_mode(target, ownership.target_mode())?;
    chown_group(target, ownership.group)
}

fn remove_generation(dir: &Path) -> io::Result<()> {
    // Write bits first: the directory was made read-only.
    let _ = set_mode(dir, 0o700);
    match fs::remove_dir_all(dir) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

/// Removes `target` and everything in it. A missing target is no error
/// (NodeUnpublishVolume is idempotent).
pub fn remove_volume(target: &Path) -> io::Result<()> {
    if fs::symlink_metadata(target).is_err() {
        return Ok(());
    }
    let _ = set_mode(target, 0o700);
    for entry in fs::read_dir(target)? {
        let path: PathBuf = entry?.path();
        if path.is_dir() && !path.is_symlink() {
            let _ = set_mode(&path, 0o700);
        }
    }
    match fs::remove_dir_all(target) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(name: &str, contents: &str) -> VolumeFile {
        VolumeFile {
            name: name.into(),
            contents: contents.as_bytes().to_vec(),
        }
    }

    fn state(n: u64) -> VolumeState {
        VolumeState {
            volume_id: "v".into(),
            request: "r".into(),
            issued_at: n,
            expires_at: n + 600,
        }
    }

    #[test]
    fn generations_replace_each_other() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("mount");
        let own = Ownership {
            group: None,
            readonly: true,
        };
        write_volume(&target, &[file("a", "1"), file("b", "1")], own, &state(1)).unwrap();
        assert_eq!(fs::read_to_string(target.join("a")).unwrap(), "1");
        assert_eq!(read_state(&target).unwrap(), state(1));
        let mode = fs::metadata(target.join("a")).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o444);
        let mode = fs::metadata(&target).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o555);
        write_volume(&target, &[file("a", "2")], own, &state(2)).unwrap();
        assert_eq!(fs::read_to_string(target.join("a")).unwrap(), "2");
        assert!(
            !target.join("b").exists(),
            "a file the new generation lacks goes"
        );
        let generations: Vec<_> = fs::read_dir(&target)
            .unwrap()
            .filter_map(|e| e.ok())
            .filter(|e| e.path().is_dir() && !e.path().is_symlink())
            .collect();
        assert_eq!(generations.len(), 1, "the old generation is removed");
        remove_volume(&target).unwrap();
        assert!(!target.exists());
        remove_volume(&target).unwrap();
        assert!(read_state(&target).is_none());
        assert!(!format!("{:?}", file("t", "secret")).contains("secret"));
    }

    #[test]
    fn a_group_gets_0440() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("mount");
        // The process's own group: chown to it needs no privilege.
        let gid = fs::metadata(dir.path()).unwrap();
        let gid = std::os::unix::fs::MetadataExt::gid(&gid);
        let own = Ownership {
            group: Some(gid),
            readonly: false,
        };
        write_volume(&target, &[file("a", "1")], own, &state(1)).unwrap();
        let meta = fs::metadata(target.join("a")).unwrap();
        assert_eq!(meta.permissions().mode() & 0o777, 0o440);
        assert_eq!(std::os::unix::fs::MetadataExt::gid(&meta), gid);
        let mode = fs::metadata(&target).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o770);
        remove_volume(&target).unwrap();
    }
}
