//! The files of a published volume, written the way kubelet's
//! `AtomicWriter` writes Secret and projected volumes, so that a reader in
//! the pod never sees half a rotation:
//!
//! ```text
//! <target_path>/
//!   ..1764594300_9f2c41d07a6b3e15/     this generation's files
//!   ..data -> ..1764594300_…           swapped with one rename(2)
//!   kubeconfig -> ..data/kubeconfig    what the pod opens
//!   ..state.json                       the plugin's own bookkeeping (no secret)
//! ```
//!
//! The target directory itself is never replaced: the pod's containers
//! bind-mount it at start, so a rotation must happen inside it.
//!
//! **The pod can write here.** Unless the volume is `readOnly` a container
//! running as root, or as any user of the pod's `fsGroup`, can rename,
//! delete and plant entries in the target directory (and root in the
//! container can also write into the generation directories), while the
//! plugin runs as root on the node. So nothing here resolves a path inside
//! the target: the target is opened once with `O_DIRECTORY|O_NOFOLLOW`
//! (a symlink there is refused), and every create, rename, unlink, chmod and
//! chown is relative to that directory fd (or a generation's fd opened the
//! same way) or on the fd of a file the plugin just created with
//! `O_CREAT|O_EXCL|O_NOFOLLOW` under a random name. Link texts the pod may
//! have changed are compared, never followed or joined to a path; old
//! generations are found by the shape of their names and removed beneath
//! the target fd, descending only into real directories. A pod can thus
//! spoil its own volume (and get an error or stale files), but it cannot
//! make the plugin read, write, chmod or delete anything outside it.
//!
//! Modes: files `0440` and directories `0750`/`0550` owned by root with the
//! group `volume_mount_group` (the pod's `fsGroup`) when kubelet passes one;
//! else `0444` and `0755`/`0555`, because a pod that runs as a non-root user
//! without `fsGroup` (the documentation's `bitnami/kubectl` Job) must still
//! read them. Either way the volume lives under the pod's directory in
//! `/var/lib/kubelet/pods/<uid>/` (mode `0750`, root), which only root on
//! the node and the pod's own containers can enter. `readonly` takes the
//! write bits off the target directory; the files never have any.

use std::ffi::{CStr, OsStr};
use std::fs::{self, File};
use std::io::{self, Read as _, Write as _};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt as _;
use std::path::{Component, Path};
use std::time::{SystemTime, UNIX_EPOCH};

use rustix::fs::{AtFlags, FileType, Gid, Mode, OFlags};
use rustix::io::Errno;
use serde::{Deserialize, Serialize};

/// One file of a volume. Its contents may be a token: never in `Debug`.
pub struct VolumeFile {
    /// File name (no `/`, not starting with `..`).
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
    /// A digest of the request (attributes, readonly, group, the token): a
    /// changed request, or a new token from kubelet, is published anew.
    pub request: String,
    /// When the files were written (Unix seconds).
    pub issued_at: u64,
    /// When their token expires (Unix seconds).
    pub expires_at: u64,
}

const DATA: &str = "..data";
const STATE: &str = "..state.json";
/// The largest `..state.json` read back (the pod may plant anything there).
const MAX_STATE_BYTES: u64 = 64 * 1024;
/// The deepest directory tree removed: a pod can nest directories in its
/// volume, and each level holds one fd.
const MAX_DEPTH: usize = 128;

/// Seconds since the Unix epoch.
pub fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or_default()
}

/// Flags that open a directory entry only if it is a real directory.
fn dir_flags() -> OFlags {
    OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC
}

/// `(parent, last component)` of an absolute target path without `.` or
/// `..` components.
fn split(target: &Path) -> io::Result<(&Path, &OsStr)> {
    let normal = target.is_absolute()
        && target
            .components()
            .all(|c| matches!(c, Component::RootDir | Component::Normal(_)));
    match (normal, target.parent(), target.file_name()) {
        (true, Some(parent), Some(name)) => Ok((parent, name)),
        _ => Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "not an absolute path without . or .. components",
        )),
    }
}

/// Opens the target directory (made first if `create`), refusing a
/// symlink or anything else that is not a directory at its last component.
/// Its parent is kubelet's (`…/volumes/kubernetes.io~csi/<name>/`), which
/// the pod cannot write. `None`: there is no target.
fn open_target(target: &Path, create: bool) -> io::Result<Option<OwnedFd>> {
    let (parent, name) = split(target)?;
    if create {
        fs::create_dir_all(parent)?;
    }
    let parent = match rustix::fs::open(
        parent,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    ) {
        Err(Errno::NOENT) if !create => return Ok(None),
        other => other?,
    };
    if create {
        match rustix::fs::mkdirat(&parent, name, Mode::from_raw_mode(0o700)) {
            Ok(()) | Err(Errno::EXIST) => {}
            Err(e) => return Err(e.into()),
        }
    }
    match rustix::fs::openat(&parent, name, dir_flags(), Mode::empty()) {
        Ok(fd) => Ok(Some(fd)),
        Err(Errno::NOENT) if !create => Ok(None),
        Err(Errno::LOOP | Errno::NOTDIR) => Err(io::Error::other(
            "the target is a symbolic link or not a directory: the plugin writes only into a directory it made itself",
        )),
        Err(e) => Err(e.into()),
    }
}

fn random_hex() -> String {
    format!("{:016x}", rand::random::<u64>())
}

/// A fresh temporary name: random, so the pod cannot plant it beforehand
/// (and it is created with `O_EXCL` anyway).
fn temp_name() -> String {
    format!("..tmp_{}", random_hex())
}

fn generation_name() -> String {
    format!("..{}_{}", unix_now(), random_hex())
}

/// Whether `name` is a generation directory's name: `..<seconds>_<16 hex>`,
/// or `..<seconds>.<9 digits>` as earlier versions named them.
fn is_generation(name: &[u8]) -> bool {
    let Some(rest) = name.strip_prefix(b"..") else {
        return false;
    };
    let digits = rest.iter().take_while(|b| b.is_ascii_digit()).count();
    if digits == 0 || digits > 20 {
        return false;
    }
    match &rest[digits..] {
        [b'_', hex @ ..] => {
            hex.len() == 16
                && hex
                    .iter()
                    .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(b))
        }
        [b'.', nanos @ ..] => nanos.len() == 9 && nanos.iter().all(u8::is_ascii_digit),
        _ => false,
    }
}

/// A file name the plugin writes: plain, not one of its reserved `..` names.
fn check_name(name: &str) -> io::Result<()> {
    if name.is_empty() || name.starts_with("..") || name.contains(['/', '\0']) || name == "." {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{name:?} is not a plain file name"),
        ));
    }
    Ok(())
}

/// Sets group and mode on an open file or directory (never on a path).
fn set_owner(fd: impl AsFd, mode: u32, group: Option<u32>) -> io::Result<()> {
    if let Some(gid) = group {
        rustix::fs::fchown(&fd, None, Some(Gid::from_raw_unchecked(gid)))?;
    }
    rustix::fs::fchmod(&fd, Mode::from_raw_mode(mode))?;
    Ok(())
}

/// Creates `name` in `dir` — nothing may be there, not even a dangling
/// link (`O_EXCL|O_NOFOLLOW`) — with `contents`, `mode` and `group`.
fn create_file(
    dir: impl AsFd,
    name: &str,
    contents: &[u8],
    mode: u32,
    group: Option<u32>,
) -> io::Result<()> {
    let fd = rustix::fs::openat(
        dir,
        name,
        OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::from_raw_mode(0o600),
    )?;
    let mut file = File::from(fd);
    file.write_all(contents)?;
    set_owner(&file, mode, group)?;
    file.sync_all()
}

/// Runs `create` on a fresh temporary name in `dir`, then renames it over
/// `name` (rename replaces whatever entry is there, a link included,
/// without following it). The temporary entry goes if anything fails.
fn replace_entry(
    dir: impl AsFd,
    name: &str,
    create: impl FnOnce(&str) -> io::Result<()>,
) -> io::Result<()> {
    let tmp = temp_name();
    let result = create(&tmp).and_then(|()| Ok(rustix::fs::renameat(&dir, &tmp, &dir, name)?));
    if result.is_err() {
        let _ = rustix::fs::unlinkat(&dir, &tmp, AtFlags::empty());
    }
    result
}

/// The text of the link `name` in `dir`, if it is one.
fn link_text(dir: impl AsFd, name: impl rustix::path::Arg) -> Option<Vec<u8>> {
    rustix::fs::readlinkat(dir, name, Vec::new())
        .ok()
        .map(|text| text.into_bytes())
}

/// Removes the entry `name` of `dir` and, if it is a real directory,
/// everything in it — never following a link: a link is removed itself, a
/// directory is entered through an fd opened with `O_NOFOLLOW`. A missing
/// entry is no error.
fn remove_beneath(dir: impl AsFd, name: &CStr, depth: usize) -> io::Result<()> {
    match rustix::fs::unlinkat(&dir, name, AtFlags::empty()) {
        Ok(()) | Err(Errno::NOENT) => return Ok(()),
        // Linux answers EISDIR for a directory (POSIX allows EPERM).
        Err(Errno::ISDIR | Errno::PERM) => {}
        Err(e) => return Err(e.into()),
    }
    if depth >= MAX_DEPTH {
        return Err(io::Error::other(format!(
            "more than {MAX_DEPTH} nested directories"
        )));
    }
    let sub = match rustix::fs::openat(&dir, name, dir_flags(), Mode::empty()) {
        Ok(sub) => sub,
        // Replaced by a link or a file meanwhile: remove that entry itself.
        Err(Errno::LOOP | Errno::NOTDIR) => {
            return match rustix::fs::unlinkat(&dir, name, AtFlags::empty()) {
                Ok(()) | Err(Errno::NOENT) => Ok(()),
                Err(e) => Err(e.into()),
            };
        }
        Err(Errno::NOENT) => return Ok(()),
        Err(e) => return Err(e.into()),
    };
    // Write bits: generations are read-only. This is a real directory of
    // the volume (directories have no hard links, and the pod cannot mount).
    rustix::fs::fchmod(&sub, Mode::from_raw_mode(0o700))?;
    for entry in entries(&sub)? {
        remove_beneath(&sub, &entry, depth + 1)?;
    }
    match rustix::fs::unlinkat(&dir, name, AtFlags::REMOVEDIR) {
        Ok(()) | Err(Errno::NOENT) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// The names in the directory `dir` (without `.` and `..`).
fn entries(dir: impl AsFd) -> io::Result<Vec<std::ffi::CString>> {
    let mut names = Vec::new();
    for entry in rustix::fs::Dir::read_from(&dir)? {
        let entry = entry?;
        let name = entry.file_name();
        if name.to_bytes() != b"." && name.to_bytes() != b".." {
            names.push(name.to_owned());
        }
    }
    Ok(names)
}

/// The state of the volume at `target`, if it was published by this plugin.
pub fn read_state(target: &Path) -> Option<VolumeState> {
    let dir = open_target(target, false).ok()??;
    let fd = rustix::fs::openat(
        &dir,
        STATE,
        // NONBLOCK and NOCTTY: a FIFO or a terminal planted there neither
        // blocks the plugin nor becomes its controlling terminal.
        OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::NOCTTY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .ok()?;
    // Only a regular file: a FIFO or device planted there is not read.
    let stat = rustix::fs::fstat(&fd).ok()?;
    if FileType::from_raw_mode(stat.st_mode) != FileType::RegularFile {
        return None;
    }
    let mut text = Vec::new();
    File::from(fd)
        .take(MAX_STATE_BYTES)
        .read_to_end(&mut text)
        .ok()?;
    let state: VolumeState = serde_json::from_slice(&text).ok()?;
    // The files must still be there: `..data` names a generation directory.
    let generation = link_text(&dir, DATA)?;
    if !is_generation(&generation) {
        return None;
    }
    let stat = rustix::fs::statat(&dir, generation.as_slice(), AtFlags::SYMLINK_NOFOLLOW).ok()?;
    (FileType::from_raw_mode(stat.st_mode) == FileType::Directory).then_some(state)
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
    for file in files {
        check_name(&file.name)?;
    }
    let dir = open_target(target, true)?.ok_or_else(|| io::Error::from(io::ErrorKind::NotFound))?;
    // A republish finds the target as the last one left it (0550 when
    // read-only): the plugin owns it but, as the chart runs it (root with
    // CAP_CHOWN alone, no CAP_DAC_OVERRIDE), may not write into it until
    // it gives itself the owner's bits back. The pod's bits are unchanged
    // meanwhile; the end of this function sets the final mode.
    rustix::fs::fchmod(&dir, Mode::from_raw_mode(ownership.target_mode() | 0o700))?;
    // This generation, in a directory no one else has seen yet.
    let generation = generation_name();
    rustix::fs::mkdirat(&dir, generation.as_str(), Mode::from_raw_mode(0o700))?;
    let data = rustix::fs::openat(&dir, generation.as_str(), dir_flags(), Mode::empty())?;
    for file in files {
        create_file(
            &data,
            &file.name,
            &file.contents,
            ownership.file_mode(),
            ownership.group,
        )?;
    }
    set_owner(&data, ownership.data_dir_mode(), ownership.group)?;
    rustix::fs::fsync(&data)?;
    replace_entry(&dir, DATA, |tmp| {
        Ok(rustix::fs::symlinkat(generation.as_str(), &dir, tmp)?)
    })?;
    // The names the pod opens.
    for file in files {
        let to = format!("{DATA}/{}", file.name);
        if link_text(&dir, &file.name).as_deref() != Some(to.as_bytes()) {
            replace_entry(&dir, &file.name, |tmp| {
                Ok(rustix::fs::symlinkat(to.as_str(), &dir, tmp)?)
            })?;
        }
    }
    // Names of an older generation that this one has not, and the older
    // generations themselves (found by name: `..data` may have been changed
    // by the pod, so its text is never used to find anything).
    for name in entries(&dir)? {
        let bytes = name.to_bytes();
        if bytes == generation.as_bytes() {
            continue;
        }
        if is_generation(bytes) {
            remove_beneath(&dir, &name, 0)?;
        } else if !bytes.starts_with(b"..")
            && !files.iter().any(|f| f.name.as_bytes() == bytes)
            && link_text(&dir, name.as_c_str())
                .is_some_and(|to| to.starts_with(format!("{DATA}/").as_bytes()))
        {
            match rustix::fs::unlinkat(&dir, &name, AtFlags::empty()) {
                Ok(()) | Err(Errno::NOENT) => {}
                Err(e) => return Err(e.into()),
            }
        }
    }
    let state = serde_json::to_vec(state).expect("the state serializes");
    replace_entry(&dir, STATE, |tmp| {
        create_file(&dir, tmp, &state, 0o600, None)
    })?;
    set_owner(&dir, ownership.target_mode(), ownership.group)?;
    rustix::fs::fsync(&dir)?;
    Ok(())
}

/// Removes `target` and everything in it, beneath its parent's fd and
/// without following links. A missing target is no error
/// (NodeUnpublishVolume is idempotent).
pub fn remove_volume(target: &Path) -> io::Result<()> {
    let (parent, name) = split(target)?;
    let parent = match rustix::fs::open(
        parent,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    ) {
        Err(Errno::NOENT) => return Ok(()),
        other => other?,
    };
    let name = std::ffi::CString::new(name.as_bytes())
        .map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    remove_beneath(&parent, &name, 0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;
    use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _, symlink};
    use std::path::PathBuf;

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

    fn mode(path: &Path) -> u32 {
        fs::metadata(path).unwrap().permissions().mode() & 0o777
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
        assert_eq!(mode(&target.join("a")), 0o444);
        assert_eq!(mode(&target), 0o555);
        write_volume(&target, &[file("a", "2")], own, &state(2)).unwrap();
        assert_eq!(fs::read_to_string(target.join("a")).unwrap(), "2");
        assert_eq!(read_state(&target).unwrap(), state(2));
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

    /// The chart runs the plugin as root with CAP_CHOWN alone: no
    /// CAP_DAC_OVERRIDE, so the owner's mode bits bind it. The kubelet's
    /// republish with a renewed token then writes into the read-only
    /// target the first publish left (found on the real node: the renewed
    /// token failed with `Permission denied` every time).
    #[test]
    fn a_republish_needs_no_capability_beyond_chown() {
        use rustix::thread::{CapabilitySet, capabilities, set_capabilities};
        let dir = tempfile::tempdir().unwrap();
        let gid = fs::metadata(dir.path()).unwrap().gid();
        for (n, own) in [
            Ownership {
                group: None,
                readonly: true,
            },
            Ownership {
                group: Some(gid),
                readonly: true,
            },
            Ownership {
                group: Some(gid),
                readonly: false,
            },
        ]
        .into_iter()
        .enumerate()
        {
            let target = dir.path().join(format!("mount{n}"));
            write_volume(&target, &[file("a", "1")], own, &state(1)).unwrap();
            let before = mode(&target);
            let republished = std::thread::spawn(move || {
                // Capabilities are per thread: this one keeps CHOWN only.
                let mut caps = capabilities(None).unwrap();
                caps.effective &= CapabilitySet::CHOWN;
                set_capabilities(None, caps).unwrap();
                write_volume(&target, &[file("a", "2")], own, &state(2))?;
                let text = fs::read_to_string(target.join("a"))?;
                remove_volume(&target)?;
                Ok::<_, io::Error>((text, target))
            })
            .join()
            .unwrap();
            let (text, target) = republished.unwrap_or_else(|e| panic!("{own:?}: {e}"));
            assert_eq!(text, "2", "{own:?}");
            assert!(!target.exists(), "{own:?}: unpublished");
            assert!(matches!(before, 0o550 | 0o555 | 0o770), "{before:o}");
        }
    }

    #[test]
    fn a_group_gets_0440() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("mount");
        // The process's own group: chown to it needs no privilege.
        let gid = fs::metadata(dir.path()).unwrap().gid();
        let own = Ownership {
            group: Some(gid),
            readonly: false,
        };
        write_volume(&target, &[file("a", "1")], own, &state(1)).unwrap();
        let meta = fs::metadata(target.join("a")).unwrap();
        assert_eq!(meta.permissions().mode() & 0o777, 0o440);
        assert_eq!(meta.gid(), gid);
        assert_eq!(mode(&target), 0o770);
        remove_volume(&target).unwrap();
    }

    /// A node's kubelet directory: another pod's Secret volume and emptyDir
    /// (what a planted link aims at), and this pod's CSI volume.
    struct NodeDirs {
        _root: tempfile::TempDir,
        other_pod: PathBuf,
        secret: PathBuf,
        empty_dir: PathBuf,
        target: PathBuf,
    }

    fn node_dirs() -> NodeDirs {
        let root = tempfile::tempdir().unwrap();
        // uid 1000 must reach its own volume, as in a pod.
        fs::set_permissions(root.path(), fs::Permissions::from_mode(0o755)).unwrap();
        let other_pod = root.path().join("pods/other-uid");
        let secret_dir = other_pod.join("volumes/kubernetes.io~secret/token");
        fs::create_dir_all(&secret_dir).unwrap();
        let secret = secret_dir.join("token");
        fs::write(&secret, "another pod's token").unwrap();
        fs::set_permissions(&secret, fs::Permissions::from_mode(0o640)).unwrap();
        let empty_dir = other_pod.join("volumes/kubernetes.io~empty-dir/cache");
        fs::create_dir_all(empty_dir.join("sub")).unwrap();
        fs::write(empty_dir.join("data"), "cache").unwrap();
        fs::write(empty_dir.join("sub/more"), "more").unwrap();
        fs::set_permissions(&empty_dir, fs::Permissions::from_mode(0o751)).unwrap();
        let target = root
            .path()
            .join("pods/my-uid/volumes/kubernetes.io~csi/kubeconfig/mount");
        fs::create_dir_all(target.parent().unwrap()).unwrap();
        NodeDirs {
            _root: root,
            other_pod,
            secret,
            empty_dir,
            target,
        }
    }

    /// Every entry under `dir`, not following links: type, mode, owner and
    /// contents (or link text).
    fn snapshot(dir: &Path) -> BTreeMap<PathBuf, String> {
        let mut out = BTreeMap::new();
        let mut todo = vec![dir.to_owned()];
        while let Some(path) = todo.pop() {
            let meta = fs::symlink_metadata(&path).unwrap();
            let what = if meta.is_symlink() {
                format!("-> {}", fs::read_link(&path).unwrap().display())
            } else if meta.is_dir() {
                for e in fs::read_dir(&path).unwrap() {
                    todo.push(e.unwrap().path());
                }
                "dir".to_owned()
            } else {
                fs::read_to_string(&path).unwrap()
            };
            let line = format!(
                "{:o} {}:{} {what}",
                meta.mode() & 0o7777,
                meta.uid(),
                meta.gid()
            );
            out.insert(path, line);
        }
        out
    }

    /// Who plants the links: root in the container, or a user of the pod's
    /// `fsGroup` (uid 1000, group 2000), for whom the plugin makes the target
    /// `0770` group 2000.
    #[derive(Debug, Clone, Copy, PartialEq)]
    enum Planter {
        Root,
        FsGroupUser,
    }

    const FS_GROUP: u32 = 2000;

    impl Planter {
        fn ownership(self) -> Ownership {
            Ownership {
                group: (self == Planter::FsGroupUser).then_some(FS_GROUP),
                readonly: false,
            }
        }

        /// Runs `script` with `sh` in `dir` as this planter.
        fn plant(self, dir: &Path, script: &str) {
            let mut command = match self {
                Planter::Root => std::process::Command::new("sh"),
                Planter::FsGroupUser => {
                    let mut c = std::process::Command::new("setpriv");
                    c.args([
                        "--reuid=1000",
                        "--regid=1000",
                        &format!("--groups={FS_GROUP}"),
                        "sh",
                    ]);
                    c
                }
            };
            let out = command
                .args(["-ec", script])
                .current_dir(dir)
                .output()
                .expect("sh");
            assert!(
                out.status.success(),
                "{self:?} could not plant ({script}): {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }

    fn is_root() -> bool {
        // /proc/self belongs to the effective user.
        fs::metadata("/proc/self").is_ok_and(|m| m.uid() == 0)
    }

    /// Links a pod plants in its own volume between two publishes leave
    /// every file outside the volume as it was (contents, mode, owner,
    /// existence); the publish and the unpublish still do their job inside.
    #[test]
    fn planted_links_reach_nothing_outside_the_volume() {
        if !is_root() {
            // chown to the fsGroup and setpriv need root (CI runs as root).
            eprintln!("skipped: needs root");
            return;
        }
        type Case = (&'static str, bool, fn(&NodeDirs) -> String);
        let cases: &[Case] = &[
            ("..state.tmp -> another pod's secret", false, |n| {
                format!("ln -s {} ..state.tmp", n.secret.display())
            }),
            ("..state.json -> another pod's secret", false, |n| {
                format!("ln -sfn {} ..state.json", n.secret.display())
            }),
            ("..data -> another pod's emptyDir (absolute)", false, |n| {
                format!("ln -sfn {} ..data", n.empty_dir.display())
            }),
            (
                "..data -> ../../../../../other-uid/… (relative)",
                false,
                |_| {
                    "ln -sfn ../../../../../other-uid/volumes/kubernetes.io~empty-dir/cache ..data"
                        .into()
                },
            ),
            ("a generation replaced by a link", false, |n| {
                format!(
                    "g=$(readlink ..data); mv \"$g\" ..moved; ln -s {} \"$g\"",
                    n.empty_dir.display()
                )
            }),
            ("visible names replaced by links", false, |n| {
                format!(
                    "ln -sfn {} kubeconfig; ln -sfn {} context.token",
                    n.secret.display(),
                    n.empty_dir.display()
                )
            }),
            ("a link inside a generation (root only)", true, |n| {
                format!(
                    "g=$(readlink ..data); ln -s {} \"$g/escape\"",
                    n.empty_dir.display()
                )
            }),
            ("temporary link names planted ahead", false, |n| {
                format!(
                    "ln -s {s} ..tmp_kubeconfig; ln -s {s} ..data_tmp; ln -s {s} ..state.json.tmp",
                    s = n.secret.display()
                )
            }),
        ];
        let mut failures = Vec::new();
        for planter in [Planter::Root, Planter::FsGroupUser] {
            for (case, root_only, script) in cases {
                if *root_only && planter != Planter::Root {
                    continue;
                }
                let n = node_dirs();
                let own = planter.ownership();
                let v1 = [file("kubeconfig", "1"), file("context.token", "t1")];
                write_volume(&n.target, &v1, own, &state(1)).unwrap();
                let before = snapshot(&n.other_pod);
                planter.plant(&n.target, &script(&n));
                let mut problems = Vec::new();
                match write_volume(&n.target, &[file("kubeconfig", "2")], own, &state(2)) {
                    Ok(()) => {
                        if fs::read_to_string(n.target.join("kubeconfig"))
                            .ok()
                            .as_deref()
                            != Some("2")
                        {
                            problems.push("the republish did not write kubeconfig".to_owned());
                        }
                    }
                    Err(e) => problems.push(format!("the republish failed: {e}")),
                }
                if snapshot(&n.other_pod) != before {
                    problems.push(format!(
                        "the republish changed another pod's files: {:#?}",
                        diff(&before, &snapshot(&n.other_pod))
                    ));
                }
                if let Err(e) = remove_volume(&n.target) {
                    problems.push(format!("the unpublish failed: {e}"));
                }
                if fs::symlink_metadata(&n.target).is_ok() {
                    problems.push("the unpublish left the target".into());
                }
                if snapshot(&n.other_pod) != before {
                    problems.push(format!(
                        "the unpublish changed another pod's files: {:#?}",
                        diff(&before, &snapshot(&n.other_pod))
                    ));
                }
                if !problems.is_empty() {
                    failures.push(format!("{planter:?}, {case}: {}", problems.join("; ")));
                }
            }
        }
        assert!(failures.is_empty(), "{failures:#?}");
    }

    fn diff(a: &BTreeMap<PathBuf, String>, b: &BTreeMap<PathBuf, String>) -> Vec<String> {
        let mut out = Vec::new();
        for (path, was) in a {
            match b.get(path) {
                None => out.push(format!("{} deleted", path.display())),
                Some(now) if now != was => {
                    out.push(format!("{}: {was:?} -> {now:?}", path.display()))
                }
                _ => {}
            }
        }
        for path in b.keys().filter(|p| !a.contains_key(*p)) {
            out.push(format!("{} created", path.display()));
        }
        out
    }

    /// A target that is a symlink (to another pod's directory) is refused:
    /// nothing is written through it, and unpublish removes only the link.
    #[test]
    fn a_target_that_is_a_link_is_refused() {
        let n = node_dirs();
        symlink(&n.empty_dir, &n.target).unwrap();
        let before = snapshot(&n.other_pod);
        let own = Ownership {
            group: None,
            readonly: true,
        };
        let err = write_volume(&n.target, &[file("kubeconfig", "1")], own, &state(1))
            .expect_err("a symlinked target is refused");
        assert!(err.to_string().contains("symbolic link"), "{err}");
        assert_eq!(snapshot(&n.other_pod), before, "nothing written through it");
        assert!(read_state(&n.target).is_none());
        remove_volume(&n.target).unwrap();
        assert!(fs::symlink_metadata(&n.target).is_err(), "the link is gone");
        assert_eq!(snapshot(&n.other_pod), before, "and only the link");
    }

    /// A FIFO planted as `..state.json` is not read (it would block).
    #[test]
    fn a_fifo_state_is_not_read() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("mount");
        let own = Ownership {
            group: None,
            readonly: false,
        };
        write_volume(&target, &[file("a", "1")], own, &state(1)).unwrap();
        fs::remove_file(target.join(STATE)).unwrap();
        let target_dir = open_target(&target, false).unwrap().unwrap();
        rustix::fs::mkfifoat(&target_dir, STATE, Mode::from_raw_mode(0o600)).unwrap();
        assert!(read_state(&target).is_none());
        write_volume(&target, &[file("a", "2")], own, &state(2)).unwrap();
        assert_eq!(
            read_state(&target).unwrap(),
            state(2),
            "replaced by the file"
        );
        remove_volume(&target).unwrap();
    }

    #[test]
    fn generation_names() {
        for good in [
            generation_name(),
            "..1764594300_0123456789abcdef".into(),
            "..1764594300.123456789".into(),
        ] {
            assert!(is_generation(good.as_bytes()), "{good}");
        }
        for bad in [
            "..data",
            "..",
            "...",
            "../x",
            "..1_0123456789ABCDEF",
            "..1_0123456789abcde",
            "..1.12345678",
            "..1764594300_0123456789abcdef/..",
            "/..1_0123456789abcdef",
            "..a_0123456789abcdef",
            "..state.json",
        ] {
            assert!(!is_generation(bad.as_bytes()), "{bad}");
        }
        assert_ne!(temp_name(), temp_name());
    }
}
