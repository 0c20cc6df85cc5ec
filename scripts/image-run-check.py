#!/usr/bin/env python3
"""Runs a command of an OCI image archive the way a container runtime would
with the chart's securityContext, for machines where podman/crun cannot run
containers (these: crun refuses hybrid cgroups and setrlimit):

- the image's layers unpacked, mounted read-only in a private mount namespace
  (plus /proc, /dev and the files Kubernetes mounts: /etc/hosts,
  /etc/resolv.conf, and a kubeconfig);
- chroot into it, groups cleared, gid/uid 65532 from the image config (which
  clears every capability), no_new_privs;
- the host's network (the emulator listens on 127.0.0.1).

usage: image-run-check.py ARCHIVE KUBECONFIG_OR_- -- ARGS...   (runs until killed)
"""

import ctypes
import json
import os
import sys
import tarfile
import tempfile

CLONE_NEWNS = 0x00020000
MS_RDONLY, MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 1, 32, 4096, 16384, 1 << 18
PR_SET_NO_NEW_PRIVS = 38
libc = ctypes.CDLL(None, use_errno=True)


def check(rc, what):
    if rc != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def mount(src, dst, fstype, flags):
    check(libc.mount(src.encode() if src else None, dst.encode(),
                     fstype.encode() if fstype else None, flags, None), f"mount {dst}")


def unpack(archive, into):
    with tarfile.open(archive) as oci:
        blob = lambda digest: oci.extractfile("blobs/" + digest.replace(":", "/"))
        index = json.load(oci.extractfile("index.json"))
        manifest = json.load(blob(index["manifests"][0]["digest"]))
        config = json.load(blob(manifest["config"]["digest"]))
        for layer in manifest["layers"]:
            with tarfile.open(fileobj=blob(layer["digest"])) as t:
                t.extractall(into, filter="tar")
    return config["config"]


def main():
    archive, kubeconfig = sys.argv[1], sys.argv[2]
    args = sys.argv[sys.argv.index("--") + 1:]
    root = tempfile.mkdtemp(prefix="image-root-")
    os.chmod(root, 0o755)  # "/" of the container: everyone may traverse it
    config = unpack(archive, root)
    uid, gid = (int(x) for x in config["User"].split(":"))
    # Mount points the runtime provides (the image itself has none of them).
    for d in ("proc", "dev", "etc/tuna"):
        os.makedirs(os.path.join(root, d), exist_ok=True)
    for f in ("etc/hosts", "etc/resolv.conf", "etc/tuna/kubeconfig"):
        open(os.path.join(root, f), "a").close()
    check(libc.unshare(CLONE_NEWNS), "unshare")
    mount(None, "/", None, MS_REC | MS_PRIVATE)
    mount(root, root, None, MS_BIND)
    mount(None, root, None, MS_REMOUNT | MS_BIND | MS_RDONLY)
    mount("proc", os.path.join(root, "proc"), "proc", 0)
    mount("/dev", os.path.join(root, "dev"), None, MS_BIND | MS_REC)
    for f in ("etc/hosts", "etc/resolv.conf"):
        mount("/" + f, os.path.join(root, f), None, MS_BIND)
    if kubeconfig != "-":
        mount(kubeconfig, os.path.join(root, "etc/tuna/kubeconfig"), None, MS_BIND)
    os.chroot(root)
    os.chdir("/")
    os.setgroups([])
    os.setgid(gid)
    os.setuid(uid)  # from root to 65532: permitted and effective capabilities are cleared
    check(libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")
    entrypoint = config.get("Entrypoint") or []
    env = {"PATH": "/usr/local/bin", "KUBECONFIG": "/etc/tuna/kubeconfig"}
    env.update(e.split("=", 1) for e in os.environ.get("IMAGE_ENV", "").split() if "=" in e)
    os.execve(entrypoint[0], entrypoint + args, env)


if __name__ == "__main__":
    main()
