"""Ahead-of-time build of every kernel the engine launches, for the cards users own, on a machine without a GPU.

Contract
--------
* :func:`record` (target) runs the engine's own launch sites (:func:`repro.engine.aot_launches.scenarios`: the
  single-request and batched graph forwards and the eager seams, at LLaDA2.1-mini's shapes, on CPU tensors) inside
  :func:`recording`: Triton's active driver answers for the target's card (target, device, stream; no GPU behind
  it), the host code's device questions (``kernels._triton.compiled`` / ``capability``) and the tile lookup
  (``kernels.configs.current_card``: the cards of :data:`CARDS`) answer for that card. Every ``kernel[grid](...)``
  then goes through Triton's own binder (argument types, 16-byte specialisation, constexprs, launch options for
  that target) up to the compile, where ``knobs.runtime.jit_cache_hook`` keeps Triton's specialization data (the
  JSON ``JITFunction.preload`` reads) and skips compile and launch. No kernel runs, so the weights are allocated
  and never filled, and buffers of 1 MiB or more are not zeroed. Returns the distinct :class:`Launch` es.
* :func:`classes` keeps one launch per :func:`build_class` (launches that differ only in :data:`SIZE_CONSTEXPRS`
  and in their arguments' alignment build the same code).
* :func:`build` compiles one launch for its target as ``JITFunction.preload`` would on that card
  (``triton.compile(ASTSource(fn, signature, constexprs, attrs), target, options)``, ptxas included) and fails it
  when its shared memory exceeds the card's per-block limit (:data:`SMEM_LIMIT`: it would compile and not launch).
  :class:`Builds` runs builds in forked children, ``jobs`` at a time (a compiler that aborts the process fails only
  its launch); :func:`run_matrix` records and builds targets in a pipeline. Results: :class:`Built`.
* ``python -m repro.engine.aot [--targets sm_80,...] [--jobs N] [--exact] [--only TEXT] [--json PATH]``: one line
  per failure, one per target; exit status 1 when any launch does not build. It runs itself again on the tested
  Triton (``repro/stack.py``) when this environment has another one and ``scripts/setup.sh`` installed the tested
  one beside it (:func:`tested_triton_dir`; ``--any-triton``: no).

Needs a Triton with its NVIDIA backend (ptxas bundled). RuntimeError under ``TRITON_INTERPRET=1`` (the interpreter
replaces the compiler) or without triton.
"""
from __future__ import annotations

import argparse
import contextlib
import importlib
import io
import json
import os
import pickle
import sys
import tempfile
import time
from dataclasses import dataclass

#: target name -> compute capability (the "a" suffix of sm_90a is Triton's own choice for capability 9.0)
TARGETS = {"sm_80": (8, 0), "sm_89": (8, 9), "sm_90a": (9, 0), "sm_100": (10, 0), "sm_120": (12, 0)}

#: the cards whose tile lookup each target's launches follow: (name, SMs, bandwidth GB/s, memory GB); the tile
#: files' own entries serve a card of their architecture (the tuned H100 and H200 on sm_90a)
CARDS = {
    "sm_80": [("NVIDIA A100-SXM4-80GB", 108, 2039, 85.1)],
    "sm_89": [("NVIDIA L40S", 142, 864, 47.7)],
    "sm_90a": [("NVIDIA H100 80GB HBM3", 132, 3352.3, 85.0), ("NVIDIA H200", 132, 4800, 150.1)],
    "sm_100": [("NVIDIA B200", 148, 8000, 191.5)],
    "sm_120": [("NVIDIA GeForce RTX 5090", 170, 1792, 33.7)],
}

#: the largest shared memory one block may use (bytes, opt-in), by compute capability major/minor: CUDA C++
#: Programming Guide, "Technical Specifications per Compute Capability"
SMEM_LIMIT = {(8, 0): 166912, (8, 9): 101376, (9, 0): 232448, (10, 0): 232448, (12, 0): 101376}


@dataclass(frozen=True)
class Launch:
    """One distinct launch: the kernel's full name (``module.qualname``) and Triton's specialization data."""

    kernel: str
    spec: str  # JSON: name, signature, constant keys/values, attrs, options, key (JITFunction.preload's input)
    scenarios: tuple = ()

    @property
    def short(self) -> str:
        """``kernel[w=warps s=stages](scalar constexprs)``: the launch in one line."""
        d = json.loads(self.spec)
        o = d["options"]
        names = list(d["signature"])
        cs = ", ".join(f"{names[k[0]]}={v}" for k, v in zip(d["constant_keys"], d["constant_vals"]) if len(k) == 1)
        return f"{self.kernel.rsplit('.', 1)[-1]}[w={o['num_warps']} s={o['num_stages']}]({cs})"


@dataclass
class Built:
    """The result of :func:`build`: ``ok``; ``error`` (first line) when not; ``shared`` bytes; ``seconds``."""

    target: str
    launch: Launch
    ok: bool
    error: str = ""
    shared: int = 0
    seconds: float = 0.0


# ---------------------------------------------------------------------------------------------------------------
# recording
# ---------------------------------------------------------------------------------------------------------------


def _require_compiler():
    from repro.engine.kernels._triton import HAS_TRITON, INTERPRET

    if not HAS_TRITON:
        raise RuntimeError("aot: triton is not installed")
    if INTERPRET:
        raise RuntimeError("aot: TRITON_INTERPRET=1 is set; the ahead-of-time build needs Triton's compiler")


def _recording_driver(cc: tuple[int, int]):
    """A Triton driver for card ``cc`` with no device behind it: the binder asks it for the target, device and
    stream only (``JITFunction.run`` before the compile, which the hook stops)."""
    from triton.backends.compiler import GPUTarget
    from triton.backends.driver import DriverBase

    class _RecordingDriver(DriverBase):
        @classmethod
        def is_active(cls):
            return False

        def map_python_to_cpp_type(self, ty):  # pragma: no cover - not used by the binder
            raise NotImplementedError

        def get_current_target(self):
            return GPUTarget("cuda", cc[0] * 10 + cc[1], 32)

        def get_active_torch_device(self):
            import torch

            return torch.device("cpu")

        def get_benchmarker(self):  # pragma: no cover
            raise NotImplementedError

        def get_current_device(self):
            return cc[0] * 10 + cc[1]  # one binder cache per target

        def get_current_stream(self, device=None):
            return 0

    return _RecordingDriver()


@contextlib.contextmanager
def recording(cc: tuple[int, int], card=None):
    """Within: launches are recorded for capability ``cc`` (not compiled, not run) into the yielded dict
    ``{key: Launch}``; the host code sees a card of capability ``cc`` (``_triton.compiled`` / ``capability``) and the
    tile lookup sees ``card`` (a ``configs.Card``; None: built-in defaults)."""
    import torch
    from triton import knobs
    from triton.runtime import driver

    from repro.engine.kernels import _triton, configs

    _require_compiler()
    found: dict = {}

    def hook(*, key, fn, compile, **_):
        jf = fn.jit_function
        name = f"{jf.fn.__module__}.{jf.fn.__qualname__}"
        found.setdefault((name, str(key)), Launch(name, compile["specialization_data"]))
        return True  # skip the compile (and so the launch)

    old = (knobs.runtime.jit_cache_hook, _triton._RECORDING[0], configs.current_card, driver._active, torch.zeros,
           torch.zeros_like)
    driver.set_active(_recording_driver(cc))
    knobs.runtime.jit_cache_hook = hook
    _triton._RECORDING[0] = tuple(cc)
    configs.current_card = lambda device=None: card
    torch.zeros, torch.zeros_like = _lazy(torch.empty), _lazy(torch.empty_like)
    try:
        with contextlib.redirect_stderr(_Null()):
            yield found  # (the lookup's once-per-card "no tiles tuned" line is for users, not for this build)
    finally:
        (knobs.runtime.jit_cache_hook, _triton._RECORDING[0], configs.current_card, driver._active, torch.zeros,
         torch.zeros_like) = old


def _lazy(empty, big: int = 1 << 20):
    """A ``torch.zeros`` (``empty``: ``torch.empty``) / ``zeros_like`` (``torch.empty_like``) that zeroes tensors
    under ``big`` bytes only: the large buffers (KV caches, logits, workspaces) are read by kernels alone, which do
    not run while recording; writing their zeros was most of its time."""

    def make(*args, **kwargs):
        t = empty(*args, **kwargs)
        return t.zero_() if t.numel() * t.element_size() < big else t

    return make


class _Null:
    """A text stream that drops what is written."""

    def write(self, s):
        return len(s)

    def flush(self):
        pass


def record(target: str, only: str | None = None, between=None) -> list[Launch]:
    """The distinct launches of every scenario (``only``: names containing it) on the cards of ``target``
    (module doc), in first-seen order, each with the scenarios that launch it. ``between()`` is called after each
    scenario (outside the recording)."""
    import torch

    from repro.engine import aot_launches as L
    from repro.engine.kernels import configs

    cc = TARGETS[target]
    cfg = L.config()
    shape = L.model_shape()
    Ws = {p: L.weights(shape, torch.bfloat16, prec, g) for p, (prec, g) in L.PRECISIONS.items()}
    seen: dict = {}
    for name, sms, bw, mem in CARDS[target]:
        card = configs.Card(name, cc, sms, bw, mem)
        for sc, run in L.scenarios():
            if only and only not in sc:
                continue
            with recording(cc, card) as found:
                run(cfg, Ws)
            for key, launch in found.items():
                prev = seen.get(key)
                tag = f"{sc} [{name}]"
                seen[key] = Launch(launch.kernel, launch.spec, (prev.scenarios if prev else ()) + (tag,))
            if between is not None:
                between()
    return list(seen.values())


# ---------------------------------------------------------------------------------------------------------------
# building
# ---------------------------------------------------------------------------------------------------------------


def _jit_function(name: str):
    module, _, qual = name.rpartition(".")
    return getattr(importlib.import_module(module), qual)


def _why(e: BaseException) -> str:
    """One line: the innermost cause's type and last message line (a CompilationError's text is the kernel source
    around the failing call; ptxas errors: the first 'error' line)."""
    while e.__cause__ is not None:
        e = e.__cause__
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
    errs = [ln for ln in lines if "error" in ln and "ptxas" in ln]
    line = errs[0] if errs else (lines[-1] if lines else "")
    return f"{type(e).__name__}: {line[:300]}"


def build(target: str, launch: Launch) -> Built:
    """Compile ``launch`` for ``target`` as ``JITFunction.preload`` does on such a card (the specialization data
    deserialised the same way), ptxas included, and check its shared memory against :data:`SMEM_LIMIT`."""
    import triton
    import triton.language as tl
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    cc = TARGETS[target]
    t0 = time.perf_counter()
    d = json.loads(launch.spec)
    if d["options"].get("arch") != f"sm{cc[0] * 10 + cc[1]}":
        raise ValueError(f"aot.build: launch recorded for {d['options'].get('arch')}, not {target}: record it for "
                         f"{target} (the options are the target's)")
    constexprs = {tuple(k): (tl.dtype(v) if tl.dtype.is_dtype(v) else
                             tl.constexpr(v["constexpr"]) if isinstance(v, dict) and "constexpr" in v else v)
                  for k, v in zip(d["constant_keys"], d["constant_vals"])}
    attrs = dict(zip(map(tuple, d["attrs_keys"]), d["attrs_vals"]))
    signature = {k: tuple(v) if isinstance(v, list) else v for k, v in d["signature"].items()}
    options = {k: tuple(v) if isinstance(v, list) else v for k, v in d["options"].items()}
    try:
        src = ASTSource(_jit_function(launch.kernel), signature, constexprs, attrs)
        k = triton.compile(src, target=GPUTarget("cuda", cc[0] * 10 + cc[1], 32), options=options)
        shared = int(k.metadata.shared)
    except Exception as e:  # noqa: BLE001 - any compiler or ptxas failure is this launch's result
        return Built(target, launch, False, _why(e), 0, time.perf_counter() - t0)
    limit = SMEM_LIMIT[cc]
    if shared > limit:
        return Built(target, launch, False, f"shared memory {shared} B > {limit} B per block on {target}", shared,
                     time.perf_counter() - t0)
    return Built(target, launch, True, "", shared, time.perf_counter() - t0)


#: constexprs that are only sizes in index arithmetic (row counts, cache rows, counts-row index, the shared
#: expert's index): launches that differ only in these and in the 16-byte specialisation of their arguments build
#: the same code, so :func:`classes` keeps one of them (``--exact`` builds every one)
SIZE_CONSTEXPRS = ("MAXC", "MAXLEN", "NACT_IDX", "E_SH", "MAXT")


def build_class(launch: Launch) -> tuple:
    """The launch without its argument specialisation (attrs) and :data:`SIZE_CONSTEXPRS`."""
    d = json.loads(launch.spec)
    names = list(d["signature"])
    consts = tuple((tuple(k), json.dumps(v)) for k, v in zip(d["constant_keys"], d["constant_vals"])
                   if not (len(k) == 1 and names[k[0]] in SIZE_CONSTEXPRS))
    return launch.kernel, json.dumps(d["signature"]), consts, json.dumps(d["options"], sort_keys=True)


def classes(launches: list[Launch]) -> list[Launch]:
    """One launch per :func:`build_class` (the first seen), with the scenarios of all of them."""
    out: dict = {}
    for la in launches:
        k = build_class(la)
        prev = out.get(k)
        out[k] = la if prev is None else Launch(prev.kernel, prev.spec, prev.scenarios + la.scenarios)
    return list(out.values())


def _start(target: str, launch: Launch):
    """Fork a child that builds ``launch`` for ``target`` and writes the pickled :class:`Built` to a file; a
    compiler that aborts the process (LLVM's "Cannot select" does) loses only the child. Returns (pid, files)."""
    out, err = tempfile.TemporaryFile(), tempfile.TemporaryFile()
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:  # child: nothing but the compile (no torch op, no thread pool)
        code = 1
        try:
            os.dup2(err.fileno(), 2)  # the compiler's own messages (a failed ptxas prints the whole PTX)
            with contextlib.redirect_stderr(io.StringIO()):
                b = build(target, launch)
            out.write(pickle.dumps(b))
            out.flush()
            code = 0
        finally:
            os._exit(code)
    return pid, (out, err)


def _finish(target: str, launch: Launch, files, status: int, seconds: float) -> Built:
    out, err = files
    out.seek(0)
    data = out.read()
    if status == 0 and data:
        return pickle.loads(data)
    err.seek(0)
    lines = [ln for ln in err.read().decode(errors="replace").splitlines() if ln.strip()]
    why = lines[-1].strip() if lines else f"exit status {status}"
    return Built(target, launch, False, f"compiler crashed: {why}", 0, seconds)


class Builds:
    """:func:`build` of ``(target, launch)`` pairs, each in a forked child (a crash is that launch's failure), at
    most ``jobs`` at a time: :meth:`add` queues, :meth:`pump` reaps finished children and starts queued ones without
    waiting (the recording of the next target runs meanwhile), :meth:`finish` waits for all. ``log(Built)`` is
    called as each one finishes; ``done`` holds the results in the order they finished."""

    def __init__(self, jobs: int = 2, log=None):
        self.jobs, self.log = max(1, jobs), log
        self.queue: list = []
        self.running: dict = {}
        self.done: list[Built] = []

    def add(self, items) -> None:
        self.queue.extend(items)

    def pump(self, slots: int | None = None, wait: bool = False) -> None:
        """Reap (``wait``: at least one, when any runs), then start queued builds up to ``slots`` running."""
        while self.running:
            pid, status = os.waitpid(-1, 0 if wait else os.WNOHANG)
            if pid == 0:
                break
            wait = False
            if pid in self.running:
                job, files, t0 = self.running.pop(pid)
                b = _finish(*job, files, os.waitstatus_to_exitcode(status), time.perf_counter() - t0)
                for f in files:
                    f.close()
                self.done.append(b)
                if self.log is not None:
                    self.log(b)
        while self.queue and len(self.running) < (self.jobs if slots is None else slots):
            job = self.queue.pop(0)
            pid, files = _start(*job)
            self.running[pid] = (job, files, time.perf_counter())

    def finish(self) -> list[Built]:
        self.pump()
        while self.running:
            self.pump(wait=True)
        return self.done


def run_matrix(targets, jobs: int = 2, exact: bool = False, only: str | None = None, log=print) -> dict:
    """Record and build every target's launches (one per :func:`build_class` unless ``exact``), ``jobs`` at a
    time: a target's builds start when it is recorded, one at a time while the next target is recorded. Returns
    ``{target: [Built]}`` (in the order of the recorded launches)."""

    def report(b):
        if not b.ok:
            log(f"FAIL {b.target} {b.launch.short[:200]}: {b.error[:300]} (scenarios: "
                f"{', '.join(sorted(set(s.split(' [')[0] for s in b.launch.scenarios)))[:200]})")

    builds = Builds(jobs, report)
    order: dict = {}
    for t in targets:
        launches = record(t, only, between=lambda: builds.pump(jobs - 1))
        launches = launches if exact else classes(launches)
        order[t] = {la: i for i, la in enumerate(launches)}
        builds.add((t, la) for la in launches)
        builds.pump(jobs - 1)
    out: dict = {t: [] for t in targets}
    for b in builds.finish():
        out[b.target].append(b)
    for t in targets:
        out[t].sort(key=lambda b: order[t][b.launch])
    return out


def tested_triton_dir() -> str | None:
    """The folder that holds the tested Triton (``repro/stack.py``) beside this environment's own, where
    ``scripts/setup.sh`` installs it on a CPU machine (``<venv>/share/repro/triton-X.Y.Z``), or None."""
    from repro.stack import TESTED

    d = os.path.join(sys.prefix, "share", "repro", f"triton-{TESTED['triton']}")
    return d if os.path.isdir(os.path.join(d, "triton")) else None


def _reexec_with_tested_triton(argv) -> None:
    """Run this command again on the tested Triton when the environment's own is another release (a CPU machine's
    interpreter Triton) and the tested one is installed beside it; else return."""
    from importlib.metadata import version

    from repro.stack import TESTED, release

    if os.environ.get("REPRO_AOT_TRITON") or release(version("triton")) == TESTED["triton"]:
        return
    d = tested_triton_dir()
    if d is None:
        return
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([d] + [p for p in [os.environ.get("PYTHONPATH")] if p])
    env["REPRO_AOT_TRITON"] = d
    os.execve(sys.executable, [sys.executable, "-m", "repro.engine.aot", *argv], env)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--targets", default=",".join(TARGETS), help="comma-separated, of " + ", ".join(TARGETS))
    ap.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1))
    ap.add_argument("--exact", action="store_true", help="build every distinct launch, not one per build class")
    ap.add_argument("--only", help="only the scenarios whose name contains this")
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--any-triton", action="store_true",
                    help="build with this environment's Triton even when it is not the tested release")
    a = ap.parse_args(argv)
    if not a.any_triton:
        _reexec_with_tested_triton(argv)
    import triton

    targets = a.targets.split(",")
    t0 = time.perf_counter()
    res = run_matrix(targets, a.jobs, a.exact, a.only)
    bad = 0
    for t in targets:
        n_ok = sum(b.ok for b in res[t])
        bad += len(res[t]) - n_ok
        kernels = len({b.launch.kernel for b in res[t]})
        print(f"{t}: {n_ok}/{len(res[t])} launches of {kernels} kernels built (triton {triton.__version__})")
    seconds = time.perf_counter() - t0
    print(f"{seconds:.0f} s")
    if a.json:
        rows = [dict(target=b.target, kernel=b.launch.kernel, launch=b.launch.short, ok=b.ok, error=b.error,
                     shared=b.shared, seconds=round(b.seconds, 2), scenarios=list(b.launch.scenarios),
                     constexprs=_constexprs(b.launch))
                for t in targets for b in res[t]]
        with open(a.json, "w") as f:
            json.dump({"triton": triton.__version__, "seconds": round(seconds, 1), "launches": rows}, f, indent=1)
    return 1 if bad else 0


def _constexprs(launch: Launch) -> dict:
    """``{name: value}`` of a launch's scalar constexprs (JSON-ready)."""
    d = json.loads(launch.spec)
    names = list(d["signature"])
    return {names[k[0]]: v for k, v in zip(d["constant_keys"], d["constant_vals"])
            if len(k) == 1 and isinstance(v, (int, float, str, bool))}


if __name__ == "__main__":
    sys.exit(main())
