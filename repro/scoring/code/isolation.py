"""Kernel-level confinement of one sandboxed child: namespaces, read-only mounts, rlimits.

Called by the fork server's child (``_zygote._child``) before it drops privileges. Two modes:
``isolate`` (root): new mount + network namespaces; ``isolate_userns`` (not root, where unprivileged
user namespaces are allowed): new user + mount + network + PID namespaces, the program becoming PID 1
of its own PID namespace, then a nested user namespace that drops every capability. In both, the
mount namespace gets fresh tmpfs over /tmp and /dev/shm (writable by the program, mode 1777, each
``tmp_opts``-sized: scratch files and POSIX semaphores of ``multiprocessing`` work, nothing reaches the
host, and the tmpfs vanishes with the namespace when the run's processes are gone), an empty read-only
tmpfs over /var/tmp, the interpreter's directories
(prefixes, site-packages) bound back in place where those tmpfs would hide them (a venv under /tmp) or
where a parent directory is not traversable by other users (``expose``, from ``sandbox.exposures``),
a fresh size-limited tmpfs as the scratch dir, and every other mount remounted read-only. ``limits`` sets the rlimits; ``block_network``
is the Python-level fallback when no network namespace can be had. Linux only; ctypes over libc
(Python 3.11 has no ``os.unshare``); no third-party imports (the fork server runs with ``python -I -S``).
"""

import ctypes
import os
import resource
import signal

CLONE_NEWNS = 0x00020000
CLONE_NEWNET = 0x40000000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT = 1, 2, 4, 8, 32
MS_NOATIME, MS_NODIRATIME, MS_BIND, MS_REC, MS_PRIVATE, MS_RELATIME = 1024, 2048, 4096, 16384, 1 << 18, 1 << 21
PR_SET_PDEATHSIG, PR_SET_NO_NEW_PRIVS = 1, 38


def load_libc():
    return ctypes.CDLL(None, use_errno=True)


def _check(rc, what):
    if rc != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def _mount(libc, src, target, fstype, flags, data):
    _check(
        libc.mount(
            src.encode() if src else None,
            target.encode(),
            fstype.encode() if fstype else None,
            ctypes.c_ulong(flags),
            data.encode() if data else None,
        ),
        f"mount {target}",
    )


def mountpoints():
    """``(mount point, per-mount flags)`` from /proc/self/mountinfo (octal escapes decoded)."""
    names = {"nosuid": MS_NOSUID, "nodev": MS_NODEV, "noexec": MS_NOEXEC, "noatime": MS_NOATIME,
             "nodiratime": MS_NODIRATIME, "relatime": MS_RELATIME}
    out = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            fields = line.split()
            mp = fields[4].encode().decode("unicode_escape")
            flags = 0
            for opt in fields[5].split(","):
                flags |= names.get(opt, 0)
            out.append((mp, flags))
    return out


def isolate(libc, expose, scratch, scratch_opts, tmp_opts):
    """Root mode: network + mount namespaces; only ``scratch`` stays writable (module docstring)."""
    _check(libc.unshare(CLONE_NEWNS | CLONE_NEWNET), "unshare(NEWNS|NEWNET)")
    return _mounts(libc, expose, scratch, scratch_opts, tmp_opts)


def _write(path, text):
    with open(path, "w") as f:
        f.write(text)


def isolate_userns(libc, expose, scratch, scratch_opts, tmp_opts):
    """Non-root mode: user + mount + network + PID namespaces, same mounts as root mode.

    Returns in the *grandchild* (PID 1 of the new PID namespace, so the zygote and the scorer have no
    PID it can name); the intermediate child only waits for it and mirrors its exit status. Before
    returning, a second, nested user namespace drops every capability the first one granted, so the
    program cannot undo the read-only remounts.
    """
    uid, gid = os.getuid(), os.getgid()
    _check(libc.unshare(CLONE_NEWUSER | CLONE_NEWNS | CLONE_NEWNET | CLONE_NEWPID), "unshare(NEWUSER|NS|NET|PID)")
    _write("/proc/self/setgroups", "deny")
    _write("/proc/self/uid_map", f"0 {uid} 1")
    _write("/proc/self/gid_map", f"0 {gid} 1")
    ro_failed = _mounts(libc, expose, scratch, scratch_opts, tmp_opts)
    pid = os.fork()
    if pid:  # intermediate: relay the exit status of the namespace's init, nothing else
        code = 1
        try:
            libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)  # zygote gone -> we go, init follows
            if os.getppid() == 1:
                os.kill(pid, signal.SIGKILL)
            status = os.waitpid(pid, 0)[1]
            if os.WIFSIGNALED(status):
                sig = os.WTERMSIG(status)
                if sig != signal.SIGKILL:
                    signal.signal(sig, signal.SIG_DFL)
                os.kill(os.getpid(), sig)
            code = os.waitstatus_to_exitcode(status)
        finally:
            os._exit(code)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)  # intermediate gone -> namespace init goes
    libc.mount(b"proc", b"/proc", b"proc", ctypes.c_ulong(MS_NOSUID | MS_NODEV | MS_NOEXEC), None)
    _check(libc.unshare(CLONE_NEWUSER), "unshare(NEWUSER) to drop capabilities")
    return ro_failed


def _makedirs_0755(path):
    """Create ``path`` and missing parents with mode 0755 whatever the umask (a slot uid must traverse)."""
    missing = []
    p = path
    while not os.path.isdir(p):
        missing.append(p)
        p = os.path.dirname(p)
    for d in reversed(missing):
        os.mkdir(d)
        os.chmod(d, 0o755)


WRITABLE_TMP = ("/tmp", "/dev/shm")  # per-run private, size-limited, writable (scoring case t3-mbpp-04/05)


def _mounts(libc, expose, scratch, scratch_opts, tmp_opts):
    _mount(libc, "none", "/", None, MS_REC | MS_PRIVATE, None)
    # Keep handles on the interpreter's directories before any tmpfs hides them: ``expose`` is a list
    # of ``(path, cover)`` (``sandbox.exposures``): bind ``path`` back in place, after mounting a small
    # tmpfs over ``cover`` when it is not "" (an ancestor other users cannot traverse).
    handles = []
    for path, cover in expose:
        try:
            fd = os.open(path, os.O_PATH | os.O_DIRECTORY)
        except OSError:
            continue
        handles.append((path, cover, fd))
    for d in ("/tmp", "/var/tmp", "/dev/shm"):
        if os.path.isdir(d):
            opts = f"{tmp_opts},mode=1777" if d in WRITABLE_TMP else "size=1m,mode=0755"
            _mount(libc, "tmpfs", d, "tmpfs", MS_NOSUID | MS_NODEV, opts)
    covered = set()
    for path, cover, fd in handles:
        if cover and cover not in covered:
            _mount(libc, "tmpfs", cover, "tmpfs", MS_NOSUID | MS_NODEV, "size=1m,mode=0755")
            covered.add(cover)
        _makedirs_0755(path)
        _mount(libc, f"/proc/self/fd/{fd}", path, None, MS_BIND | MS_REC, None)
        os.close(fd)
    os.makedirs(scratch, exist_ok=True)  # inside the new /tmp tmpfs when the original path is hidden
    # The scratch dir itself is a fresh, size-limited tmpfs: nothing the program writes reaches the
    # host disk, and it cannot fill it.
    _mount(libc, "tmpfs", scratch, "tmpfs", MS_NOSUID | MS_NODEV, scratch_opts)
    os.chdir(scratch)
    # Everything except the scratch dir and the private /tmp, /dev/shm becomes read-only (this
    # namespace's copies only; the interpreter's directories bound back under /tmp included).
    ro_failed = []
    for mp, flags in mountpoints():
        if mp == scratch or mp in WRITABLE_TMP:
            continue
        if libc.mount(None, mp.encode(), None, ctypes.c_ulong(MS_REMOUNT | MS_BIND | MS_RDONLY | flags), None) != 0:
            ro_failed.append(mp)
    return ro_failed


def set_limits(limits):
    """rlimits from ``{"cpu_s", "memory_bytes", "nproc", "fsize_bytes", "nofile"}`` (None = leave)."""

    def cap(res, value):
        if value is None:
            return
        hard = resource.getrlimit(res)[1]
        value = int(value) if hard == resource.RLIM_INFINITY else min(int(value), hard)
        resource.setrlimit(res, (value, value))

    cpu = limits.get("cpu_s")
    if cpu is not None:  # soft limit sends SIGXCPU (reported as a timeout), hard limit one second later
        resource.setrlimit(resource.RLIMIT_CPU, (int(cpu), int(cpu) + 1))
    cap(resource.RLIMIT_AS, limits.get("memory_bytes"))
    cap(resource.RLIMIT_NPROC, limits.get("nproc"))
    cap(resource.RLIMIT_FSIZE, limits.get("fsize_bytes"))
    cap(resource.RLIMIT_NOFILE, limits.get("nofile"))
    cap(resource.RLIMIT_CORE, 0)


def block_network():
    """Best-effort guard for runs without a network namespace: no new sockets from Python."""
    import socket

    def refuse(*args, **kwargs):
        raise OSError("network access is disabled in the sandbox")

    socket.socket = refuse
    socket.create_connection = refuse
    socket.socketpair = refuse
