"""The pre-exec helper: isolates itself, then becomes the engine.

The provider runs ``python -I sandbox.py SPEC.json`` in a new session. Using only
the standard library (so it never imports the provider), the helper:

1. joins the attempt's cgroups (memory, CPU, pids), so the engine and every
   process it starts are counted and limited from the first instruction;
2. enters a new network namespace (``unshare(CLONE_NEWNET)``) and a private mount
   namespace, checks that only a loopback interface is visible, and brings that
   namespace-private loopback up;
3. bind-mounts every input read-only onto itself (inside that mount namespace);
4. applies the rlimits (open files, address space when no memory cgroup);
5. restricts CPU affinity when no CPU cgroup is available;
6. changes to the private working directory and ``execve``\\ s the engine with
   exactly the environment the job declares.

If any isolation step fails, it writes one line starting ``ficc-sandbox:`` to
stderr and exits with status 125 without running the engine. ``--probe`` checks
steps 2 and 3 and prints a JSON report instead.
"""

import ctypes
import ctypes.util
import fcntl
import json
import os
import resource
import socket
import struct
import sys

CLONE_NEWNS = 0x00020000
CLONE_NEWNET = 0x40000000
MS_RDONLY = 1
MS_REMOUNT = 32
MS_BIND = 4096
MS_REC = 16384
MS_PRIVATE = 1 << 18
ISOLATION_FAILED = 125
SIOCGIFFLAGS = 0x8913
SIOCSIFFLAGS = 0x8914
IFF_UP = 0x1

_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)


def _fail(message):
    sys.stderr.write(f"ficc-sandbox: {message}\n")
    sys.stderr.flush()
    os._exit(ISOLATION_FAILED)


def _check(result, what):
    if result != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"{what}: {os.strerror(errno)}")


def _mount(source, target, flags):
    _check(
        _libc.mount(
            None if source is None else source.encode(), target.encode(), None, flags, None
        ),
        f"mount {target}",
    )


def isolate_network_and_mounts():
    """Enter new network and mount namespaces; raise OSError when that is impossible."""
    _check(_libc.unshare(CLONE_NEWNET | CLONE_NEWNS), "unshare(CLONE_NEWNET|CLONE_NEWNS)")
    _mount(None, "/", MS_REC | MS_PRIVATE)
    names = sorted(name for _index, name in socket.if_nameindex())
    if names != ["lo"]:
        raise OSError(0, f"network interfaces still visible after unshare: {names}")
    # The namespace's own loopback (not the host's) is up, for engines that talk to
    # themselves over 127.0.0.1 or listen there (the TCP transport).
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as control:
        request = struct.pack("16sH", b"lo", 0)
        flags = struct.unpack("16sH", fcntl.ioctl(control, SIOCGIFFLAGS, request)[:18])[1]
        fcntl.ioctl(control, SIOCSIFFLAGS, struct.pack("16sH", b"lo", flags | IFF_UP))


def mount_read_only(path):
    """Bind-mount ``path`` onto itself read-only (inside the private mount namespace)."""
    _mount(path, path, MS_BIND | MS_REC)
    _mount(None, path, MS_BIND | MS_REMOUNT | MS_RDONLY)


def probe():
    """Report whether isolation works here (run in a throw-away child)."""
    try:
        isolate_network_and_mounts()
        mount_read_only(os.path.dirname(os.path.abspath(__file__)))
    except OSError as exc:
        print(json.dumps({"network": False, "reason": str(exc)}))
        return
    print(json.dumps({"network": True, "reason": None}))


def main():
    if sys.argv[1:] == ["--probe"]:
        probe()
        return
    with open(sys.argv[1]) as file:
        spec = json.load(file)
    for procs in spec["cgroup_procs"]:
        try:
            with open(procs, "w") as file:
                file.write(str(os.getpid()))
        except OSError as exc:
            _fail(f"cannot join cgroup {procs}: {exc}")
    try:
        isolate_network_and_mounts()
    except OSError as exc:
        _fail(f"network isolation failed: {exc}")
    for path in spec["read_only"]:
        try:
            mount_read_only(path)
        except OSError as exc:
            _fail(f"cannot make input {path} read-only: {exc}")
    try:
        for name, value in spec["rlimits"].items():
            resource.setrlimit(getattr(resource, name), (value, value))
        if spec["affinity"]:
            os.sched_setaffinity(0, spec["affinity"])
    except (OSError, ValueError) as exc:
        _fail(f"cannot apply limits: {exc}")
    os.chdir(spec["cwd"])
    os.umask(0o077)
    try:
        os.execve(spec["argv"][0], spec["argv"], spec["env"])
    except OSError as exc:
        sys.stderr.write(f"ficc-sandbox: cannot execute {spec['argv'][0]}: {exc}\n")
        os._exit(127)


if __name__ == "__main__":
    main()
