"""`python -m repro.backends.generation_job`: one generation job — a model × seed × shard over one benchmark,
or (grouped) over several benchmarks with the model loaded once.

    python -m repro.backends.generation_job --backend engine --model tiny-orl --model-dir DIR --role orl \
        --verified STAMP.json --decoder DEC.yaml --problems problems/gsm8k.jsonl --benchmark gsm8k \
        --seed 12345 --shard 0 --num-shards 1 --device cpu --precision fp32 [--batch-size N] --out shard0of1.jsonl

    python -m repro.backends.generation_job ... --seed 12345 --shard 0 --num-shards 4 \
        --benchmark gsm8k mbpp --decoder DEC.yaml DEC2.yaml --problems problems/gsm8k.jsonl problems/mbpp.jsonl \
        --group-index G/shard0of4.json          # shards: G/shard0of4/gsm8k.jsonl, G/shard0of4/mbpp.jsonl

Resumable and exactly-once: each finished problem is appended (flushed + fsynced) to
``OUT.partial.jsonl``; a rerun after a kill skips the problems already there (a truncated last line is
dropped and regenerated). When a shard is complete the records are de-duplicated by id, checked to
cover the shard exactly, ordered by problem index, and written to ``OUT`` atomically together with
``OUT.meta.json`` (provenance); then the partial file is removed. The partial file is reused only by a
job with the same inputs: ``OUT.partial.inputs.json`` records the sha256 of the decoder config and
problems, the checkpoint's manifest hash, backend, device, precision, the adapter map's sha256 and the
generation code version; any difference discards it. The batch size is not among them: greedy records are
identical at any batch size (repro.engine.batch), and each record carries the ``batch_size`` it was made at.

One benchmark (``--out``): ``OUT`` is the Snakemake output, so it exists only when complete.

Grouped (several ``--benchmark`` with one ``--decoder`` and ``--problems`` each, in the same order, and
``--group-index INDEX``; benchmark B's shard is ``OUT`` = ``INDEX`` without ``.json`` / ``B.jsonl``): the backend is built
once, on the first benchmark with work left, and serves every benchmark of the job in turn (one model load,
graphs captured once per batch shape). Only ``INDEX`` is Snakemake's output; the per-benchmark ``OUT``
files are kept beside it, so that when Snakemake re-runs the job because ONE benchmark's inputs changed
(and deletes ``INDEX``), every other benchmark whose ``OUT.meta.json`` records the same inputs and whose
``OUT`` still has the recorded sha256 is taken as it is: its records are not generated again. A benchmark
whose inputs (or batch size) changed starts afresh (its old ``OUT`` is removed first). ``INDEX`` lists each benchmark's
``OUT`` (relative path), its sha256, record count and inputs; ``repro.backends.merge`` checks them.

Every ``OUT.meta.json`` has the job's ``batch_size``, ``generated_last_session`` (problems, tokens,
seconds of the session that finished the shard: its throughput; null when a rerun found nothing left) and
``job``: the fixed costs the shard's session shared — ``model_load_s`` (building the backend: reading the
checkpoint onto the device), ``graph_capture_s`` (CUDA-graph capture seconds spent while generating this
benchmark: the first benchmark of a job pays them; null on a path without graphs),
``benchmarks_sharing_load`` (how many benchmarks that one load generated), the job's ``id``, ``pid``, ``host`` and
``slurm_job_id`` (``$SLURM_JOB_ID``, null outside Slurm: how ``python -m repro.status`` tells a live job), its
claimed ``gpu`` and ``started_at`` (after the claim) / ``ended_at`` (Unix seconds). ``generation_sessions`` lists
every session that generated records of the shard, a killed one included (kept beside the partial file in
``OUT.partial.sessions.json`` until the shard completes): ``problems``, ``generated_tokens`` and ``wall_s`` it
generated (a killed session's as of its last snapshot, written at most every 2 s, so its last ≤ 2 s of records
are left out of both), ``graph_capture_s`` it spent, ``finished`` (whether it wrote the shard) and ``job``: the
job facts of its job (its ``model_load_s`` was paid even when it was killed). ``INDEX`` carries the same job facts, ``ended_at`` being the job's end.

``--limit N`` keeps the first N problems of each problems file (problem order) before sharding: the speed probe
(workflow/rules/generate.smk, rule ``speed_probe``) runs the first 32 problems one request at a time with
``--batch-size 1 --limit 32``; the limit joins the content key of the partial file and of the meta's ``inputs``
(only when given, so the key of a job without it is as before).

Refuses to start when the checkpoint's verification stamp is missing or does not match the
checkpoint's manifest, and when ``--device cuda`` is asked on a machine without a usable GPU; refuses to
write a shard when a checkpoint file's size or mtime changed while the job ran (the error names the files and
the fix). Every meta records ``checkpoint_stamp``, the stamp the records were generated under
(``verified_at``, ``stat_fingerprint``): a later failed check of the checkpoint removes those shards
(``repro.checkpoint.suspect``). Dies with the
Snakemake that started it (``repro.backends.lifeline``), so a killed Snakemake leaves no orphans. A local
GPU job pins itself to one free device (``repro.backends.gpu_slot``) unless ``CUDA_VISIBLE_DEVICES`` is
already names one device (as Slurm does), and logs ``gpu-job start|end ...`` lines with the device and the
time. ``ORL_EVAL_GPU_CLAIM=always`` makes a CPU job claim a device slot too (the CPU rehearsal of
``scripts/gpu/two_gpu_check.sh``).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import socket
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import yaml

from repro.backends import get_backend
from repro.checkpoint.suspect import stamp_identity
from repro.io import append_jsonl, atomic_write_text, disk_full, read_jsonl_tolerant
from repro.provenance import code_revision, file_key, sha256_path, stage_code_version


class GenerationError(RuntimeError):
    """The job cannot run (unverified checkpoint, no GPU, bad decoder config); the message says why."""


def checkpoint_quantization(model_dir: Path) -> str | None:
    """``"nvfp4"`` when ``model_dir`` is an NVFP4 export (``config.json`` ``quantization_config``) or the
    dequantized BF16 copy of one (its ``quant_provenance.json``, written by ``repro.checkpoint dequantize``),
    else None."""
    from repro.checkpoint.dequantize import declared_quantization

    if (Path(model_dir) / "quant_provenance.json").is_file():
        return "nvfp4"
    return declared_quantization({"source": {"type": "local", "path": str(model_dir)}})


def check_verified(model_dir: Path, stamp: Path) -> dict:
    """The verification stamp if it vouches for ``model_dir``'s current manifest; GenerationError if not."""
    from repro.checkpoint.verify import ManifestError, require_verified

    try:
        return require_verified(model_dir, stamp)
    except ManifestError as e:
        raise GenerationError(str(e)) from None


def check_device(device: str, model_dir: Path | None = None, precision: str = "fp32", batch_size: int = 1,
                 positions: int = 5_120) -> None:
    """Fail clearly when a GPU job lands on a machine without one (Snakemake would run it anyway), or on a GPU
    without the memory (weights + KV caches of ``batch_size`` slots of ``positions`` rows) or the bf16 support
    the model needs (repro.cluster.gpu_problem)."""
    if device.startswith("cuda"):
        import torch

        if not torch.cuda.is_available():
            raise GenerationError(
                "device 'cuda' requested but no CUDA GPU is visible (torch.cuda.is_available() is False, "
                f"CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES')!r}); run this suite on a GPU "
                "machine, or set the suite's `device: cpu` in the config (suites.<name>.device; the smoke suite's "
                "default)")
        if model_dir is not None:
            from repro.cluster import check_gpu

            try:
                check_gpu(model_dir, precision, batch_size, positions)
            except RuntimeError as e:
                raise GenerationError(str(e)) from None


def load_decoder(path: Path, seed: int) -> dict:
    """Read a rendered decoder YAML (a flat mapping of decoder keys); add the job's seed."""
    try:
        dec = yaml.safe_load(path.read_text())
    except yaml.YAMLError as e:
        raise GenerationError(f"{path}: not valid YAML ({str(e).splitlines()[0]})") from None
    if not isinstance(dec, dict):
        raise GenerationError(f"{path}: a decoder config must be a mapping of decoder keys")
    dec.setdefault("seed", seed)
    return dec


def shard_of(problems: list[dict], shard: int, num_shards: int) -> list[dict]:
    """Problems of one shard: every ``num_shards``-th problem starting at ``shard`` (balanced lengths)."""
    if not 0 <= shard < num_shards:
        raise GenerationError(f"--shard {shard} must be in [0, {num_shards})")
    return problems[shard::num_shards]


def complete_shard(out: Path, partial: Path, todo: list[dict], meta: dict) -> list[dict]:
    """De-duplicate the partial records, check coverage, write ``out`` + meta atomically (the meta gets
    ``records_sha256``, the sha256 of ``out``'s bytes)."""
    recs = read_jsonl_tolerant(partial)
    by_id: dict[str, dict] = {}
    for r in recs:
        by_id.setdefault(r["id"], r)
    want = [p["id"] for p in todo]
    missing = [i for i in want if i not in by_id]
    if missing:
        raise GenerationError(f"{partial}: {len(missing)} problem(s) missing after generation: {missing[:5]}")
    ordered = [by_id[i] for i in want]
    text = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in ordered)
    meta = dict(meta, records_sha256=hashlib.sha256(text.encode("utf-8")).hexdigest(), records=len(ordered))
    # meta first: an `out` without its meta is never taken as finished by a grouped rerun
    atomic_write_text(Path(str(out) + ".meta.json"), json.dumps(meta, indent=1, sort_keys=True) + "\n")
    atomic_write_text(out, text)
    partial.unlink(missing_ok=True)
    return ordered


@dataclass
class Task:
    """One benchmark of a job: where its decoder config and problems are, and where its shard goes."""

    benchmark: str
    decoder: str
    problems: str
    out: str


class Job:
    """What the benchmarks of one job share: the verified checkpoint, the claimed GPU, and the backend,
    built once on first use (:meth:`backend`) and closed by :meth:`close`. ``facts()`` gives the ``job``
    entry of the metas (module docstring)."""

    def __init__(self, a: argparse.Namespace):
        self.a, self.model_dir = a, Path(a.model_dir)
        self.id = uuid.uuid4().hex[:12]
        self.stamp = check_verified(self.model_dir, Path(a.verified))
        self.gpu_lock = None  # held (not read) until the job ends: the flock on it is the GPU claim
        self.gpu = None
        # ORL_EVAL_GPU_CLAIM=always: claim a device slot on a CPU job too (the CPU rehearsal of
        # scripts/gpu/two_gpu_check.sh, with a stand-in nvidia-smi)
        self.claims = a.device.startswith("cuda") or os.environ.get("ORL_EVAL_GPU_CLAIM") == "always"
        if getattr(a, "tensor_parallel_size", 1) > 1:  # N ranks use the N GPUs the job was given (cuda:0..N-1)
            self.claims = False
            if a.device.startswith("cuda"):
                from repro.engine.ranks import check_devices

                try:
                    check_devices(a.device, a.tensor_parallel_size)
                except ValueError as e:
                    raise GenerationError(str(e)) from None
        if self.claims:
            from repro.backends.gpu_slot import GpuSlotError, claim_gpu

            # host-wide, like the GPUs: every job on this machine must see the same locks
            lock_dir = os.environ.get("ORL_EVAL_GPU_LOCKS") or os.path.join(tempfile.gettempdir(), "repro-gpu-locks")
            try:
                self.gpu, self.gpu_lock = claim_gpu(lock_dir)
            except GpuSlotError as e:
                raise GenerationError(str(e)) from None
            if self.gpu is not None:
                print(f"pinned to GPU {self.gpu} (CUDA_VISIBLE_DEVICES={self.gpu})", file=sys.stderr)
        self.started_at = time.time()  # after the claim: [started_at, ended_at] lies inside the GPU's lock
        if self.claims:
            print(f"gpu-job start job={self.id} pid={os.getpid()} gpu={self.gpu} "
                  f"CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES')} t={self.started_at:.3f}",
                  file=sys.stderr)
        check_device(a.device, self.model_dir if getattr(a, "tensor_parallel_size", 1) == 1 else None, a.precision, getattr(a, "batch_size", 1), _slot_positions(a))
        self._backend = None
        self.model_load_s: float | None = None
        self.sharing = 0  # benchmarks the loaded backend generated

    def backend(self):
        """The job's backend, built on the first call (the model load, timed)."""
        if self._backend is None:
            a = self.a
            extra = {"adapter_map": a.adapter_map} if getattr(a, "adapter_map", None) else {}
            if a.backend == "engine":
                extra["batch_size"] = getattr(a, "batch_size", 1)
                if getattr(a, "tensor_parallel_size", 1) > 1:
                    extra["tensor_parallel_size"] = a.tensor_parallel_size
            t0 = time.perf_counter()
            self._backend = get_backend(a.backend, model_dir=str(self.model_dir), role=a.role, device=a.device,
                                        precision=a.precision, **extra)
            load = getattr(self._backend, "load_s", None)
            self.model_load_s = load if isinstance(load, (int, float)) else time.perf_counter() - t0
        return self._backend

    def capture_s(self) -> float | None:
        """CUDA-graph capture seconds the backend has spent since it was built: a cumulative counter that
        survives engine rebuilds (repro.engine.llm.LLM.graph_capture_s), so the difference of two reads is what
        was captured in between; None when it is not known (no graph path, a batched call still running, or a
        backend that does not say)."""
        v = getattr(self._backend, "graph_capture_s", None) if self._backend is not None else None
        return float(v) if isinstance(v, (int, float)) else None

    def facts(self, **kw) -> dict:
        return {"id": self.id, "pid": os.getpid(), "host": socket.gethostname(),
                "slurm_job_id": os.environ.get("SLURM_JOB_ID"), "model_load_s": self.model_load_s,
                "benchmarks_sharing_load": self.sharing,
                "gpu": self.gpu, "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
                "started_at": self.started_at, **kw}

    def recheck_checkpoint(self, out: Path) -> None:
        """Before ``out`` (a shard) is written: the checkpoint's files still have the sizes and mtimes of the
        stamp the job started on (repro.checkpoint.verify.require_verified), else GenerationError naming the
        files and the fix, and no shard is written: records generated while a file changed may have read other
        bytes. (A byte changed with its mtime put back passes here; the next run's start-up check sees it and
        removes the shards made under this stamp: repro.checkpoint.suspect.) A stamp rewritten meanwhile by
        another run's start-up check (it verified the folder again by content, e.g. after a hard link moved the
        inode change times) is accepted when it names the same manifest_sha256 and every file has the size and
        mtime the job started on; it becomes the job's stamp, so the shard records the later verification (the
        one a later failed check names)."""
        try:
            now = check_verified(self.model_dir, Path(self.a.verified))
            if now.get("stat_fingerprint") != self.stamp.get("stat_fingerprint"):
                def size_mtime(stamp: dict) -> dict | None:
                    table = stamp.get("stat")
                    return {k: list(v)[:2] for k, v in table.items()} if isinstance(table, dict) else None

                if now.get("manifest_sha256") != self.stamp.get("manifest_sha256") \
                        or size_mtime(now) is None or size_mtime(now) != size_mtime(self.stamp):
                    raise GenerationError(f"{self.a.verified} was rewritten while this job ran")
                self.stamp = now  # the same files, verified again by content
        except GenerationError as e:
            raise GenerationError(
                f"the checkpoint {self.model_dir} changed while this job generated {out.name}, so the shard is not "
                f"written ({e}). Fix: run the workflow again: its start-up check verifies the folder again by "
                "content; the same bytes (a touched file) give a fresh stamp and this shard resumes from its partial "
                "file; damaged bytes stop the run naming the files and the fix, and the shards and partial files "
                "generated since the last verification are removed") from None

    def close(self) -> None:
        if self._backend is not None:
            self._backend.close()
        if self.claims:
            print(f"gpu-job end job={self.id} pid={os.getpid()} gpu={self.gpu} t={time.time():.3f}", file=sys.stderr)


def _slot_positions(a: argparse.Namespace) -> int:
    """KV rows a batch slot needs for the job's longest generation: the largest ``max_new_tokens`` of its
    decoder configs + a prompt allowance (repro.cluster.slot_positions); the paper default 4,096 when a config
    does not say or cannot be read (its own error comes when the benchmark starts)."""
    from repro.cluster import slot_positions

    most = 0
    for d in _values(getattr(a, "decoder", None)):
        try:
            most = max(most, int((yaml.safe_load(Path(d).read_text()) or {}).get("max_new_tokens") or 4096))
        except (OSError, ValueError, AttributeError, yaml.YAMLError):
            most = max(most, 4096)
    return slot_positions(most or 4096)


def _generate(a: argparse.Namespace, bench: str, backend, remaining: list[dict], decoder: dict, partial: Path,
              out: Path, progress=None) -> dict:
    """Generate ``remaining`` problems of ``bench`` with ``backend``, appending each record to ``partial`` as
    it finishes (a batched backend's ``generate_each`` hands them over in finishing order); returns this
    session's ``{"problems", "generated_tokens", "wall_s"}`` (the job's throughput, in provenance).
    ``progress(snapshot)`` (optional) is called with the same dict so far after each record is appended."""
    from tqdm import tqdm

    from repro.console import bar_interval, bar_stream
    from repro.prompts import build_prompt

    prompts = [build_prompt(bench, p["source"]) for p in remaining]
    out.parent.mkdir(parents=True, exist_ok=True)
    stream = bar_stream(sys.stderr)  # one line per redraw in a job's log file, redrawn in place on a terminal
    bar = tqdm(total=len(remaining), desc=f"{a.model}/{bench}", unit="problem", file=stream,
               mininterval=bar_interval(stream), maxinterval=max(10.0, bar_interval(stream)),
               ascii=not stream.isatty())
    toks = fwd = done = 0
    t0 = time.perf_counter()
    with open(partial, "a", encoding="utf-8") as f:
        def emit(i: int, rec: dict) -> None:
            nonlocal toks, fwd, done
            prob, prompt = remaining[i], prompts[i]
            rec = {"id": prob["id"], "benchmark": bench, "model": a.model, "seed": a.seed,
                   "backend": a.backend, "template_version": prompt.template_version, **rec}
            append_jsonl(f, rec)
            done += 1
            toks += rec["generated_tokens"]
            if rec.get("forwards"):
                fwd += rec["forwards"]["denoise"] + rec["forwards"]["commit"]
            bar.set_postfix(tok_s=f"{toks / (time.perf_counter() - t0):.1f}",
                            TPF=f"{toks / fwd:.2f}" if fwd else "n/a", refresh=False)
            bar.update(1)  # one redraw per record, with the postfix above (a log gets one line, not two)
            if progress is not None:
                progress({"problems": done, "generated_tokens": toks, "wall_s": time.perf_counter() - t0})

        try:
            if hasattr(backend, "generate_each"):  # batched backends hand records over in finishing order
                backend.generate_each(prompts, decoder, emit)
            else:
                for i, rec in enumerate(backend.generate(prompts, decoder)):
                    emit(i, rec)
        finally:  # a failing job's log ends with how far it got (a log redraws every 30 s at most: "0/8" after 3)
            bar.close()
    return {"problems": len(remaining), "generated_tokens": toks, "wall_s": time.perf_counter() - t0}


class _Plan:
    """One task's state at the start of the job: its problems, the content key of its inputs, and whether
    its finished shard can be kept (grouped jobs) or what is left to generate."""

    def __init__(self, a: argparse.Namespace, task: Task, stamp: dict, grouped: bool):
        self.task, self.out = task, Path(task.out)
        self.partial = Path(task.out + ".partial.jsonl")
        self.sessions_file = Path(task.out + ".partial.backends.json")  # backend of every session that wrote
        self.gen_sessions_file = Path(task.out + ".partial.sessions.json")  # figures of every such session
        self.inputs_file = Path(task.out + ".partial.inputs.json")
        self.meta_file = Path(task.out + ".meta.json")
        self.code_version = stage_code_version("generate", a.backend)
        self.inputs = {"decoder_sha256": sha256_path(task.decoder), "problems_sha256": sha256_path(task.problems),
                       "checkpoint_manifest_sha256": stamp.get("manifest_sha256"), "backend": a.backend,
                       "device": a.device, "precision": a.precision, "code_version": self.code_version,
                       "adapter_map": file_key(a.adapter_map) if getattr(a, "adapter_map", None) else None,
                       # the role decides the adapter (orl) or none (base): records of another role are not these
                       "role": getattr(a, "role", None)}
        limit = getattr(a, "limit", None)
        if limit is not None:
            self.inputs["limit"] = limit
        self.batch_size = getattr(a, "batch_size", 1)
        self.tensor_parallel_size = getattr(a, "tensor_parallel_size", 1)
        problems = [json.loads(line) for line in Path(task.problems).read_text().splitlines() if line.strip()]
        if limit is not None:
            problems = problems[:limit]
        self.todo = shard_of(problems, a.shard, a.num_shards)
        why = self._why_not_kept() if grouped else "not a grouped job"
        self.kept = why is None
        if grouped and not self.kept and (self.out.exists() or self.meta_file.exists()):
            print(f"note: {self.out}: {why}; generating this benchmark afresh", file=sys.stderr)
            # its leftover partial files too (a kill between writing out and removing them): never resumed into
            # a shard that must start afresh
            for f in (self.out, self.meta_file, self.partial, self.inputs_file, self.sessions_file,
                      self.gen_sessions_file):
                f.unlink(missing_ok=True)
        self.remaining: list[dict] = []
        if not self.kept:
            self._open_partial()

    def _why_not_kept(self) -> str | None:
        """None when the finished shard can be kept (same content-keyed inputs, same batch size, records as
        written), else why not, in words for the job's log."""
        if not self.out.is_file():
            return "its records file is missing"
        try:
            meta = json.loads(self.meta_file.read_text())
        except (OSError, ValueError):
            return "its meta file is missing or unreadable"
        old = meta.get("inputs") or {}
        changed = sorted(k for k in set(old) | set(self.inputs) if old.get(k) != self.inputs.get(k))
        if changed:
            return "generated with other inputs (" + ", ".join(changed) + ")"
        # the batch size too: a job re-run for a new batch size generates at it (the partial file, by contrast,
        # is resumed at any batch size: the records are the same)
        if meta.get("batch_size", 1) != self.batch_size:
            return f"generated at batch size {meta.get('batch_size', 1)}, this job runs {self.batch_size}"
        if meta.get("tensor_parallel_size", 1) != self.tensor_parallel_size:
            return (f"generated over {meta.get('tensor_parallel_size', 1)} rank(s), this job runs "
                    f"{self.tensor_parallel_size}")
        if meta.get("records_sha256") != sha256_path(self.out):
            return "its records changed since they were written (sha256 differs from its meta)"
        return None

    def _open_partial(self) -> None:
        partial, inputs = self.partial, self.inputs
        if partial.exists() and (not self.inputs_file.exists() or json.loads(self.inputs_file.read_text()) != inputs):
            print(f"note: {partial} was written with other inputs (decoder, problems, checkpoint, backend or code); "
                  "discarding it and starting this shard afresh", file=sys.stderr)
            partial.unlink()
            self.sessions_file.unlink(missing_ok=True)
            self.gen_sessions_file.unlink(missing_ok=True)
        self.out.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(self.inputs_file, json.dumps(inputs, indent=1, sort_keys=True) + "\n")
        kept = read_jsonl_tolerant(partial)
        done = {r["id"] for r in kept}
        if partial.exists():  # drop a record torn by a kill before appending after it
            atomic_write_text(partial, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in kept))
        self.remaining = [p for p in self.todo if p["id"] not in done]


def run_task(a: argparse.Namespace, job: Job, plan: _Plan) -> dict:
    """Generate what is left of one task and write its shard + meta; returns the meta."""
    task = plan.task
    if plan.kept:
        print(f"{a.model}/{task.benchmark}/seed{a.seed} shard {a.shard}/{a.num_shards}: {len(plan.todo)} problems, "
              f"all done by an earlier run of this job with the same inputs: kept {plan.out}", file=sys.stderr)
        return json.loads(plan.meta_file.read_text())
    print(f"{a.model}/{task.benchmark}/seed{a.seed} shard {a.shard}/{a.num_shards}: {len(plan.todo)} problems, "
          f"{len(plan.todo) - len(plan.remaining)} already done, {len(plan.remaining)} to generate", file=sys.stderr)
    decoder = load_decoder(Path(task.decoder), a.seed)
    done_now = None
    capture = None
    sessions = json.loads(plan.sessions_file.read_text()) if plan.sessions_file.exists() else []
    gen_sessions = _read_list(plan.gen_sessions_file)
    if plan.remaining:
        backend = job.backend()
        sessions.append(backend.describe())
        atomic_write_text(plan.sessions_file, json.dumps(sessions, indent=1) + "\n")
        c0 = job.capture_s()
        mine = {"problems": 0, "generated_tokens": 0, "wall_s": 0.0, "graph_capture_s": None, "finished": False,
                "job": job.facts()}
        gen_sessions.append(mine)
        last = [0.0]

        def snapshot(now: dict, force: bool = False) -> None:
            # this session's figures so far, on disk at most every 2 s (a kill loses at most its last 2 s)
            c = job.capture_s()
            mine.update(now, graph_capture_s=c - c0 if c0 is not None and c is not None else None)
            if force or time.monotonic() - last[0] >= 2.0:
                last[0] = time.monotonic()
                atomic_write_text(plan.gen_sessions_file, json.dumps(gen_sessions, indent=1) + "\n")

        snapshot({}, force=True)
        try:
            done_now = _generate(a, task.benchmark, backend, plan.remaining, decoder, plan.partial, plan.out,
                                 progress=snapshot)
        finally:
            # describe again: a backend that starts its engine in generate() knows its arguments only now
            sessions[-1] = backend.describe()
            atomic_write_text(plan.sessions_file, json.dumps(sessions, indent=1) + "\n")
            snapshot({}, force=True)  # on an error too: this session's figures up to its last record
        c1 = job.capture_s()
        capture = c1 - c0 if c0 is not None and c1 is not None else None  # what this benchmark captured
        mine.update(done_now, graph_capture_s=capture, finished=True)
    job.recheck_checkpoint(plan.out)  # before the meta: it names the stamp the check accepted
    meta = {
        "model": a.model, "benchmark": task.benchmark, "seed": a.seed, "shard": a.shard,
        "num_shards": a.num_shards, "backend": a.backend, "device": a.device, "precision": a.precision,
        "batch_size": getattr(a, "batch_size", 1), "tensor_parallel_size": getattr(a, "tensor_parallel_size", 1),
        # what the checkpoint read is (not what config.yaml declares): the tables' precision labels use it
        "checkpoint_quantization": checkpoint_quantization(job.model_dir),
        "generated_last_session": done_now,  # problems, tokens, seconds of the session that finished the shard
        "checkpoint_manifest_sha256": job.stamp.get("manifest_sha256"),
        # the verification stamp the records were generated under: a later failed check of the checkpoint
        # removes the shards made under it (repro.checkpoint.suspect)
        "checkpoint_stamp": stamp_identity(job.stamp),
        "decoder_sha256": plan.inputs["decoder_sha256"], "decoder": decoder,
        "problems_sha256": plan.inputs["problems_sha256"], "code_revision": code_revision(),
        "code_version": plan.code_version,  # sha256 of the generation code (repro.provenance.stage_code_version)
        "inputs": plan.inputs,  # the content key a grouped rerun compares (module docstring)
        # the backend that wrote the records: this session's, else (resumed with nothing left) the last
        # session's; every session's when a resumed job mixed several
        "backend_info": sessions[-1] if sessions else None,
        "backend_sessions": sessions,
        # every session that generated records of this shard, killed ones included (module docstring)
        "generation_sessions": gen_sessions,
        # fixed costs of the session that finished the shard (none loaded when a rerun found nothing left)
        "job": job.facts(graph_capture_s=capture, ended_at=time.time()) if done_now else
        job.facts(graph_capture_s=None, model_load_s=None, benchmarks_sharing_load=0, ended_at=time.time()),
    }
    recs = complete_shard(plan.out, plan.partial, plan.todo, meta)
    plan.sessions_file.unlink(missing_ok=True)
    plan.gen_sessions_file.unlink(missing_ok=True)
    plan.inputs_file.unlink(missing_ok=True)
    print(f"wrote {len(recs)} records -> {plan.out}", file=sys.stderr)
    return json.loads(plan.meta_file.read_text())


def _read_list(path: Path) -> list:
    """A JSON list kept beside a partial file; [] when missing or unreadable (a kill during its first write)."""
    try:
        return v if isinstance(v := json.loads(path.read_text()), list) else []
    except (OSError, ValueError):
        return []


def _values(v) -> list[str]:
    return [v] if isinstance(v, str) else list(v or [])


def tasks_of(a: argparse.Namespace) -> list[Task]:
    """The job's tasks: one per ``--benchmark`` with its ``--decoder`` and ``--problems`` (module docstring).
    GenerationError names a missing option, unequal counts, or a benchmark given twice."""
    benches, decoders, problems = _values(a.benchmark), _values(a.decoder), _values(a.problems)
    index = getattr(a, "group_index", None)
    if not index:
        if not (len(benches) == len(decoders) == len(problems) == 1) or not getattr(a, "out", None):
            raise GenerationError("a one-benchmark job takes one --benchmark, --decoder, --problems and --out "
                                  "(several benchmarks: give --group-index INDEX instead of --out)")
        return [Task(benches[0], decoders[0], problems[0], a.out)]
    if not benches or not (len(benches) == len(decoders) == len(problems)):
        raise GenerationError(f"a grouped job takes one --decoder and one --problems per --benchmark, in the same "
                              f"order; got {len(benches)} benchmark(s), {len(decoders)} decoder(s), "
                              f"{len(problems)} problems file(s)")
    dup = sorted({b for b in benches if benches.count(b) > 1})
    if dup:
        raise GenerationError(f"--benchmark names {dup} more than once; give each benchmark once")
    base = Path(index).with_suffix("")  # P.GROUP_SHARD (repro/paths.py): <index without .json>/<bench>.jsonl
    return [Task(b, d, p, str(base / f"{b}.jsonl")) for b, d, p in zip(benches, decoders, problems)]


def run(a: argparse.Namespace) -> int:
    tasks = tasks_of(a)
    grouped = bool(getattr(a, "group_index", None))
    job = Job(a)
    try:
        plans = [_Plan(a, t, job.stamp, grouped) for t in tasks]
        job.sharing = sum(1 for p in plans if p.remaining)
        metas = [run_task(a, job, p) for p in plans]
    finally:
        job.close()
    if grouped:
        index = Path(a.group_index)
        entry = lambda p, m: {"file": os.path.relpath(p.out, index.parent), "sha256": m["records_sha256"],  # noqa: E731
                              "records": m["records"], "inputs": m["inputs"], "job": m.get("job")}
        atomic_write_text(index, json.dumps({
            "model": a.model, "seed": a.seed, "shard": a.shard, "num_shards": a.num_shards,
            "benchmarks": {p.task.benchmark: entry(p, m) for p, m in zip(plans, metas)},
            "job": job.facts(graph_capture_s=job.capture_s(), ended_at=time.time()),
        }, indent=1, sort_keys=True) + "\n")
        print(f"wrote {index}: {len(plans)} benchmark(s), " + (
            f"{job.sharing} generated with one model load" + (
                f" ({job.model_load_s:.2f} s)" if job.model_load_s is not None else "")
            if job.sharing else "all kept, no model loaded"), file=sys.stderr)
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m repro.backends.generation_job", description=__doc__.splitlines()[0])
    ap.add_argument("--backend", choices=["engine", "sglang"], default="engine")
    ap.add_argument("--model", required=True, help="model name from config.yaml")
    ap.add_argument("--model-dir", required=True)
    ap.add_argument("--role", choices=["orl", "base"], required=True)
    ap.add_argument("--verified", required=True, help="verification stamp written by repro.checkpoint verify")
    ap.add_argument("--benchmark", nargs="+", required=True, help="benchmark name(s); several: a grouped job")
    ap.add_argument("--decoder", nargs="+", required=True, help="rendered decoder YAML, one per benchmark")
    ap.add_argument("--problems", nargs="+", required=True, help="problems file, one per benchmark")
    ap.add_argument("--group-index", help="grouped job: the index file written when every benchmark is done")
    ap.add_argument("--seed", type=int, required=True)
    ap.add_argument("--shard", type=int, default=0)
    ap.add_argument("--num-shards", type=int, default=1)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--precision", choices=["fp32", "bf16", "nvfp4-w4a16", "nvfp4"], default="fp32")
    ap.add_argument("--batch-size", type=int, default=1,
                    help="engine: requests decoded together (repro.engine.batch; greedy ids identical at any size)")
    ap.add_argument("--adapter-map", default=None,
                    help="adapter mapping file for the checkpoint's ORL adapter (docs/adapter_map.md)")
    ap.add_argument("--tensor-parallel-size", type=int, default=1,
                    help="engine: ranks per request (repro.engine.ranks; GPUs cuda:0..N-1 of this job)")
    ap.add_argument("--limit", type=int, default=None,
                    help="only the first N problems of each problems file, before sharding (the speed probe)")
    ap.add_argument("--out", help="the shard file (one-benchmark job; a grouped job derives its shards' paths)")
    a = ap.parse_args(argv)
    if a.limit is not None and a.limit < 1:
        ap.error(f"--limit must be a positive number of problems, got {a.limit}")
    if a.tensor_parallel_size < 1 or (a.tensor_parallel_size > 1 and a.backend != "engine"):
        ap.error(f"--tensor-parallel-size {a.tensor_parallel_size}: give N >= 1; N > 1 needs --backend engine")
    from repro.backends.lifeline import die_with_parent
    from repro.console import plain_warnings

    plain_warnings()  # "warning: <message> (RuntimeWarning)" in the job's log, without a path and source line
    die_with_parent()
    try:
        return run(a)
    except GenerationError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except OSError as e:  # a full disk: one line naming the folder (no traceback); finished records are kept
        if (line := disk_full(e, Path(a.out or a.group_index).parent, "records finished so far are kept in the "
                              "partial file(s) there, and the job resumes from them")) is None:
            raise
        print(f"error: {line}", file=sys.stderr)
        return 3


if __name__ == "__main__":
    sys.exit(main())
