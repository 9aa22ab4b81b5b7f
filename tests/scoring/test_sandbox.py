"""Sandbox: hostile programs are judged failed, the run goes on, and the host is unchanged.

Hostile programs (docs/scoring_rules.md §10): infinite loop, fork bomb, 20 GB allocation (and a memory bomb
spread over several processes), deleting / writing
files outside the scratch dir, opening sockets, ``os._exit(0)`` / ``sys.exit(0)`` before the asserts,
killing the parent, printing "passed". The host checks: a sentinel file in a world-writable directory
is untouched, no new file appears outside the scratch dirs, a host TCP listener gets no connection, and
afterwards no sandbox process is alive (process table scanned for the sandbox uids and fork servers).
"""

import os
import shutil
import signal
import socket
import threading
import tempfile
import textwrap
import time
import uuid
from pathlib import Path

import pytest

from repro.scoring.code import proctable as zyg
from repro.scoring.code import sandbox as sbmod
from repro.scoring.code.sandbox import Limits, Sandbox

from scoring_util import REPO

ROOT = os.geteuid() == 0
TESTS_PASS = "\ndef check():\n    assert sum([1, 2]) == 3\ncheck()\n"


def live_sandbox_processes(uids, include_servers=True):
    """Live processes of the sandbox uids, or (``include_servers``) any sandbox fork server."""
    out = []
    for pid in zyg.pids():
        st = zyg.proc_stat(pid)
        if st is None or st[0] in (b"Z", b"X"):
            continue
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if zyg.uid_of(pid) in uids or (include_servers and b"_zygote.py" in cmd and st[1] == os.getpid()):
            out.append((pid, cmd[:80]))
    return out


@pytest.fixture(params=["repo_work_dir", "tmp"])
def host(request, tmp_path):
    # A directory the sandbox can see (under the git-ignored <repo>/work) and one under /tmp.
    if request.param == "tmp":
        d = tmp_path / "host"
    else:
        d = REPO / "work" / f"sandbox-host-{uuid.uuid4().hex}"
    d.mkdir(parents=True)
    os.chmod(d, 0o777)  # world-writable: only the read-only mount (or uid) protects it
    sentinel = d / "sentinel.txt"
    sentinel.write_text("keep me\n")
    os.chmod(sentinel, 0o666)
    outside = f"/tmp/orl_hostile_{uuid.uuid4().hex}"
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    listener.setblocking(False)
    yield {"dir": d, "sentinel": sentinel, "outside": outside, "port": listener.getsockname()[1],
           "listener": listener, "mtime": sentinel.stat().st_mtime_ns}
    listener.close()
    if os.path.exists(outside):
        os.unlink(outside)
    shutil.rmtree(d, ignore_errors=True)


def hostile_programs(h):
    s, d, out, port = str(h["sentinel"]), str(h["dir"]), h["outside"], h["port"]
    progs = {
        "infinite_loop": "while True:\n    pass\n",
        "sleep_forever": "import time\ntime.sleep(10**6)\n",
        "fork_bomb": "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n",
        "escaped_daemon": "import os, time\nif os.fork() == 0:\n    os.setsid()\n    time.sleep(10**6)\nraise SystemExit(1)\n",
        "alloc_20gb": "x = bytearray(20 * 1024 ** 3)\n",
        "delete_sentinel": f"import os\nos.remove({s!r})\n",
        "overwrite_sentinel": f"open({s!r}, 'w').write('pwned')\n",
        "rmtree_host_dir": f"import shutil\nshutil.rmtree({d!r})\n",
        "write_outside_tmp": f"open({out!r}, 'w').write('x')\n",
        "write_in_host_dir": f"open({d!r} + '/new_file', 'w').write('x')\n",
        "socket_internet": "import socket\nsocket.create_connection(('1.1.1.1', 80), timeout=3)\n",
        "socket_host_loopback": f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=3)\n",
        "os_exit_0_before_asserts": "import os\nos._exit(0)\n",
        "sys_exit_0_before_asserts": "import sys\nsys.exit(0)\n",
        "exit_builtin_before_asserts": "exit(0)\n",
        "kill_parent": "import os, signal\nos.kill(os.getppid(), signal.SIGKILL)\n",
        "kill_everything": "import os, signal\nos.kill(-1, signal.SIGKILL)\nos.kill(os.getpid(), signal.SIGKILL)\n",
        "print_passed_then_exit": "print('passed')\nprint('All tests passed', flush=True)\nimport os\nos._exit(0)\n",
        "print_passed_then_fail": "print('passed')\nassert False\n",
        "huge_output": "import sys\nwhile True:\n    sys.stdout.write('x' * 65536)\n",
        "fill_disk": "i = 0\nwhile True:\n    open(f'f{i}', 'wb').write(b'x' * (8 << 20))\n    i += 1\n",
        "close_result_pipes": "import os\nfor fd in range(3, 256):\n    try:\n        os.close(fd)\n    except OSError:\n        pass\n",
    }
    # every hostile snippet is followed by tests that would pass if reached
    return {k: v + TESTS_PASS for k, v in progs.items()}


@pytest.mark.parametrize("mode", ["auto", "userns"])
def test_hostile_programs_fail_and_host_is_unchanged(host, mode):
    """``auto``: root mode here (uid per slot). ``userns``: the non-root path (user/mount/net/PID
    namespaces, no uid change) forced while running as root -- the fork bomb is left out there because
    the kernel never applies RLIMIT_NPROC to real root, and killing the parent cannot even be attempted
    (the program is PID 1 of its own namespace and has no PID for the zygote), so it may pass."""
    progs = hostile_programs(host)
    if mode == "userns":
        progs.pop("fork_bomb")
    names = list(progs) + ["good_after_all"]
    programs = list(progs.values()) + ["x = 1" + TESTS_PASS]
    assert live_sandbox_processes(set()) == []
    with Sandbox(2, Limits(timeout_s=2.0), privileged=None if mode == "auto" else False) as sb:
        isolation = sb.enforced["isolation"]
        if isolation == "none" or (mode == "userns" and isolation != "userns"):
            pytest.skip(f"namespaces not available here, hostile programs would run unconfined: {sb.enforced}")
        uids = {u for u in sb._uids if u is not None}
        t0 = time.monotonic()
        results = dict(zip(names, sb.run_many(programs)))
        elapsed = time.monotonic() - t0
        enforced = sb.enforced
        during = live_sandbox_processes(uids, include_servers=False)
    after = live_sandbox_processes(uids)
    verdicts = {k: (r.status, r.reason) for k, r in results.items()}
    assert results.pop("good_after_all").status == "passed", verdicts
    # /tmp is the run's own writable tmpfs: writing there succeeds and never reaches the host (below)
    may_pass = {"good_after_all", "write_outside_tmp"} | ({"kill_parent"} if isolation == "userns" else set())
    not_failed = {k: v for k, v in verdicts.items()
                  if k not in may_pass and results[k].status not in ("failed", "timeout")}
    assert not not_failed, not_failed
    assert results["infinite_loop"].status == "timeout" and results["sleep_forever"].status == "timeout"
    assert "MemoryError" in results["alloc_20gb"].stderr_tail
    assert "before the test code finished" in results["os_exit_0_before_asserts"].reason
    assert "passed" in results["print_passed_then_exit"].stdout_tail  # it did print it; still failed
    # host unchanged
    assert host["sentinel"].read_text() == "keep me\n"
    assert host["sentinel"].stat().st_mtime_ns == host["mtime"]
    assert sorted(p.name for p in host["dir"].iterdir()) == ["sentinel.txt"]
    assert not os.path.exists(host["outside"])
    with pytest.raises(BlockingIOError):
        host["listener"].accept()
    # process table: nothing of the sandbox survives; the run went on in bounded time
    assert during == [] and after == []
    assert elapsed < 60
    if ROOT and mode == "auto":
        assert enforced["uid_separation"] and enforced["network_namespace"] and enforced["read_only_outside_scratch"]
    if isolation == "userns":
        assert enforced["pid_namespace"] and enforced["read_only_outside_scratch"] and not enforced["uid_separation"]


@pytest.mark.parametrize("privileged", [None, False], ids=["auto", "userns"])
def test_private_tmp_and_dev_shm_are_writable_size_limited_and_wiped(privileged):
    """Each run gets its own writable /tmp and /dev/shm (scoring cases t3-mbpp-04/05): a scratch file
    and multiprocessing's POSIX semaphores work; the files never reach the host and are gone for the
    next run on the same slot; writing past ``tmp_bytes`` fails with ENOSPC; /var/tmp stays read-only."""
    name = f"orl_private_{uuid.uuid4().hex}"
    write = (f"open('/tmp/{name}', 'w').write('x')\nopen('/dev/shm/{name}', 'w').write('x')\n"
             "import multiprocessing\nwith multiprocessing.Pool(2) as p:\n    assert p.map(abs, [-3]) == [3]\n"
             "from concurrent.futures import ProcessPoolExecutor\nwith ProcessPoolExecutor(2) as ex:\n"
             "    assert list(ex.map(abs, [-1])) == [1]\n"
             "from multiprocessing import shared_memory\nm = shared_memory.SharedMemory(create=True, size=64)\n"
             "m.close()\nm.unlink()\n"
             + TESTS_PASS)
    gone = (f"import os\nassert not os.path.exists('/tmp/{name}')\nassert not os.path.exists('/dev/shm/{name}')\n"
            + TESTS_PASS)
    fill = ("import errno\ntry:\n    for i in range(40):\n        open(f'/tmp/f{i}', 'wb').write(b'x' * (4 << 20))\n"
            "except OSError as e:\n    assert e.errno == errno.ENOSPC, e\nelse:\n    raise AssertionError('no limit')\n"
            + TESTS_PASS)
    var_tmp = "open('/var/tmp/x', 'w')\n" + TESTS_PASS
    with Sandbox(1, Limits(timeout_s=10, tmp_bytes=32 << 20), privileged=privileged) as sb:
        if sb.enforced["isolation"] == "none":
            pytest.skip(f"namespaces not available here: {sb.enforced}")
        assert sb.enforced["read_only_outside_scratch"]
        results = [sb.run(p) for p in (write, gone, fill, var_tmp)]
    assert [r.status for r in results[:3]] == ["passed"] * 3, [(r.status, r.reason, r.stderr_tail) for r in results]
    assert results[3].status == "failed" and "Read-only file system" in results[3].stderr_tail
    assert not os.path.exists(f"/tmp/{name}") and not os.path.exists(f"/dev/shm/{name}")


@pytest.mark.parametrize("privileged", [None, False], ids=["auto", "userns"])
def test_memory_bomb_across_processes_is_killed(privileged):
    """RLIMIT_AS is per process; children that each stay under it but together exceed the limit are
    caught by the fork server's resident-memory watch."""
    bomb = ("import os, time\nfor i in range(4):\n    if os.fork() == 0:\n        x = b'x' * (300 << 20)\n"
            "        time.sleep(30)\n        os._exit(0)\ntime.sleep(30)\n" + TESTS_PASS)
    with Sandbox(1, Limits(timeout_s=10, memory_bytes=512 << 20), privileged=privileged) as sb:
        t0 = time.monotonic()
        r = sb.run(bomb)
        assert r.status == "failed" and "memory limit exceeded" in r.reason, r
        assert time.monotonic() - t0 < 5
        assert sb.run("x = b'y' * (200 << 20)" + TESTS_PASS).status == "passed"  # under the limit: fine
        assert live_sandbox_processes({u for u in sb._uids if u is not None}, include_servers=False) == []


def test_workers_run_in_parallel_without_oversubscription():
    with Sandbox(64, Limits(timeout_s=10)) as sb:
        assert sb.workers == sbmod.default_workers()  # capped at the CPUs this process may use
    with Sandbox(2, Limits(timeout_s=10)) as sb:
        w = sb.workers
        t0 = time.monotonic()
        res = sb.run_many(["import time\ntime.sleep(1.0)\n"] * (2 * w))
        elapsed = time.monotonic() - t0
    assert [r.status for r in res] == ["passed"] * (2 * w)
    assert 1.9 <= elapsed < 3.9, elapsed  # w at a time: two rounds, not one, not 2w


@pytest.fixture
def flaky_server(tmp_path, monkeypatch):
    """A fork server that crashes on start-up the first ``n`` times, then works."""
    counter = tmp_path / "count"
    counter.write_text("0")
    script = tmp_path / "flaky_zygote.py"
    real = sbmod._ZYGOTE

    def make(n):
        script.write_text(textwrap.dedent(f"""
            import runpy, sys
            p = {str(counter)!r}
            k = int(open(p).read())
            open(p, "w").write(str(k + 1))
            if k < {n}:
                sys.exit(70)
            runpy.run_path({real!r}, run_name="__main__")
        """))
        monkeypatch.setattr(sbmod, "_ZYGOTE", str(script))
        return counter

    return make


def test_crashed_worker_is_retried_once(flaky_server):
    prog = "import time\ntime.sleep(0.5)" + TESTS_PASS
    with Sandbox(1, Limits(timeout_s=10)) as sb:
        # the fork server dies while the program runs: retried once on a fresh server
        server = sb._zygote(0).proc
        threading.Timer(0.2, os.kill, (server.pid, signal.SIGKILL)).start()
        r = sb.run(prog)
        assert r.status == "passed" and r.attempts == 2, r
        assert server.poll() is not None and sb._zygotes[0].proc.pid != server.pid
        # a server that cannot start at all: error after one retry, recorded with the reason
        sb._zygotes[0].kill()
        sb._zygotes[0] = None
        counter = flaky_server(5)
        r = sb.run(prog)
        assert r.status == "error" and r.attempts == 2 and "retried once" in r.reason, r
        assert counter.read_text() == "2"
        # and once servers work again, the next program runs normally
        flaky_server(0)
        r = sb.run(prog)
        assert r.status == "passed", r


def test_concurrent_sandboxes_get_disjoint_uids():
    """Two scoring jobs on one host must not share (and so sweep) each other's uids."""
    if not ROOT:
        pytest.skip("uid separation needs root")
    with Sandbox(2) as a, Sandbox(2) as b:
        assert set(a._uids).isdisjoint(b._uids)
        # a long program in a survives b's runs and sweeps
        t = threading.Thread(target=lambda: out.append(a.run("import time\ntime.sleep(1.5)" + TESTS_PASS)))
        out = []
        t.start()
        time.sleep(0.3)
        assert all(r.status == "passed" for r in b.run_many(["x = 1" + TESTS_PASS] * 6))
        t.join()
        assert out[0].status == "passed"
    with Sandbox(1) as c:  # uids are free again after close
        assert c._uids[0] <= min(a._uids + b._uids)


def test_bad_input():
    with Sandbox(1) as sb:
        with pytest.raises(TypeError, match="program must be a str"):
            sb.run(b"print(1)")
    with pytest.raises(ValueError, match="workers must be >= 1"):
        Sandbox(-1)


def test_exposures_rebind_interpreter_dirs_hidden_by_tmpfs_or_modes(tmp_path):
    """Paths under /tmp (a venv there) are bound back; under a 0700 dir the dir gets a tmpfs cover;
    visible paths are left alone, nested ones are covered by their ancestor's recursive bind."""
    hidden = tmp_path / "hidden"
    (hidden / "py" / "lib").mkdir(parents=True)
    os.chmod(hidden, 0o700)
    venv = "/tmp/ci-venv/lib/python3.11/site-packages"
    got = sbmod.exposures([venv, "/tmp/ci-venv", "/tmp"], masked=("/tmp",))
    assert got == [("/tmp/ci-venv", "")]  # nested path covered; /tmp itself never bound over its tmpfs
    got = sbmod.exposures([str(REPO), str(hidden / "py"), str(hidden / "py" / "lib")], masked=())
    assert len(got) == 1 and got[0][0] == str(hidden / "py"), got  # REPO is visible; lib nested
    cover = got[0][1]  # the first ancestor others cannot traverse (hidden, or pytest's 0700 base dir)
    assert str(hidden).startswith(cover + "/") or cover == str(hidden)
    assert not os.stat(cover).st_mode & 0o001
    if not str(REPO).startswith("/tmp/"):
        assert all(p != str(REPO) for p, _ in got)


def test_scorer_from_a_venv_under_tmp_imports_installed_packages(data):
    """A venv whose prefix and site-packages live under /tmp (as on many CI machines) -- hidden from
    the program by the sandbox's tmpfs over /tmp unless bound back. The real scorer (CLI, subprocess)
    runs from that venv on a correct HumanEval solution that imports numpy from the venv: it passes."""
    import json
    import subprocess
    import sys
    import sysconfig
    import venv as venvmod

    import numpy

    root = Path(tempfile.mkdtemp(prefix="orl-tmp-venv-", dir="/tmp"))
    try:
        venvmod.EnvBuilder(with_pip=False, symlinks=True).create(root / "venv")
        py = root / "venv" / "bin" / "python"
        site_dir = Path(subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                       capture_output=True, text=True, check=True).stdout.strip())
        assert str(site_dir).startswith("/tmp/")
        # numpy "installed" in the /tmp venv (hard links when on the same file system), the rest of
        # the scorer's dependencies and this checkout through a .pth file (read by the scorer only:
        # sandboxed programs run without .pth processing, so numpy must come from the /tmp venv)
        src_site = Path(numpy.__file__).parents[1]
        for name in ("numpy", "numpy.libs"):
            if (src_site / name).is_dir():
                shutil.copytree(src_site / name, site_dir / name, copy_function=_link_or_copy)
        (site_dir / "repro_test.pth").write_text(f"{REPO}\n{sysconfig.get_paths()['purelib']}\n")
        case = {"id": "tmp-venv-numpy", "benchmark": "humaneval", "task_id": "HumanEval/23",
                "model_output": "    import numpy\n    assert numpy.__file__.startswith('/tmp/'), numpy.__file__\n"
                                "    return int(numpy.asarray([len(string)])[0])\n",
                "expected_correct": True}
        cases = root / "cases.jsonl"
        cases.write_text(json.dumps(case) + "\n")
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
        proc = subprocess.run([str(py), "-m", "repro.scoring", "cases", str(cases), "--data-dir",
                               str(Path(data).resolve()), "--workers", "1"],  # it runs in another folder
                              capture_output=True, text=True, cwd=root, env=env, timeout=120)
        lines = [json.loads(ln) for ln in proc.stdout.splitlines() if ln.strip()]
        assert proc.returncode == 0 and lines and lines[0]["correct"], (proc.stdout, proc.stderr[-2000:])
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _link_or_copy(src, dst):
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)
    return dst


@pytest.mark.parametrize("privileged", [None, False], ids=["auto", "userns"])
def test_tens_of_megabytes_of_output_still_pass(privileged):
    """Output goes to pipes the fork server drains, keeping only a tail: 48 MB on stdout and stderr
    (more than RLIMIT_FSIZE and the scratch tmpfs) neither fails the program nor hangs it."""
    prog = ("import sys\nprint('debug ' * 4_000_000)\nsys.stderr.write('warn ' * 5_000_000)\n"
            "print('last line')\n" + TESTS_PASS)
    with Sandbox(1, Limits(timeout_s=20), privileged=privileged) as sb:
        r = sb.run(prog)
    assert r.status == "passed", r.reason
    assert r.stdout_tail.endswith("last line\n") and r.stderr_tail.endswith("warn ") and len(r.stderr_tail) <= 1000


def test_pth_files_add_their_directories_not_their_hooks(tmp_path):
    site_dir, lib = tmp_path / "site-packages", tmp_path / "src"
    site_dir.mkdir()
    lib.mkdir()
    (site_dir / "a.pth").write_text(f"# comment\n{lib}\n../src\nimport os; os.environ['X'] = '1'\nmissing_dir\n")
    assert sbmod.pth_dirs(str(site_dir)) == [str(lib)]
    assert sbmod.pth_dirs(str(tmp_path / "absent")) == []
