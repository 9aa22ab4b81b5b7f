"""`python -m repro.backends.generation_job`: one generation job (a model × benchmark × seed × shard).

    python -m repro.backends.generation_job --backend engine --model tiny-orl --model-dir DIR --role orl \
        --verified STAMP.json --decoder DEC.yaml --problems problems/gsm8k.jsonl --seed 12345 \
        --shard 0 --num-shards 1 --device cpu --precision fp32 [--batch-size N] --out shard0of1.jsonl

Resumable and exactly-once: each finished problem is appended (flushed + fsynced) to
``OUT.partial.jsonl``; a rerun after a kill skips the problems already there (a truncated last line is
dropped and regenerated). When the shard is complete the records are de-duplicated by id, checked to
cover the shard exactly, ordered by problem index, and written to ``OUT`` atomically together with
``OUT.meta.json`` (provenance); then the partial file is removed. ``OUT`` therefore exists only when
complete, which is what Snakemake sees. The partial file is reused only by a job with the same inputs:
``OUT.partial.inputs.json`` records the sha256 of the decoder config and problems, the checkpoint's
manifest hash, backend, device, precision and the generation code version; any difference discards it.
The batch size is not among them: greedy records are identical at any batch size (repro.engine.batch), and
each record carries the ``batch_size`` it was made at; ``OUT.meta.json`` has the job's ``batch_size`` and
``generated_last_session`` (problems, tokens, seconds of the session that finished the shard: its
throughput; null when a rerun found nothing left).

Refuses to start when the checkpoint's verification stamp is missing or does not match the
checkpoint's manifest, and when ``--device cuda`` is asked on a machine without a usable GPU. Dies with the
Snakemake that started it (``repro.backends.lifeline``), so a killed Snakemake leaves no orphans. A local
GPU job pins itself to one free device (``repro.backends.gpu_slot``) unless ``CUDA_VISIBLE_DEVICES`` is
already set (as Slurm does).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import yaml

from repro.backends import get_backend
from repro.io import append_jsonl, atomic_write_text, read_jsonl_tolerant
from repro.provenance import code_revision, sha256_path, stage_code_version


class GenerationError(RuntimeError):
    """The job cannot run (unverified checkpoint, no GPU, bad decoder config); the message says why."""


def check_verified(model_dir: Path, stamp: Path) -> dict:
    """The verification stamp if it vouches for ``model_dir``'s current manifest; GenerationError if not."""
    from repro.checkpoint.verify import ManifestError, require_verified

    try:
        return require_verified(model_dir, stamp)
    except ManifestError as e:
        raise GenerationError(str(e)) from None


def check_device(device: str, model_dir: Path | None = None, precision: str = "fp32") -> None:
    """Fail clearly when a GPU job lands on a machine without one (Snakemake would run it anyway), or on a GPU
    without the memory or the bf16 support the model needs (repro.cluster.gpu_problem)."""
    if device.startswith("cuda"):
        import torch

        if not torch.cuda.is_available():
            raise GenerationError(
                "device 'cuda' requested but no CUDA GPU is visible (torch.cuda.is_available() is False, "
                f"CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES')!r}); run this suite on a GPU "
                "machine or use the smoke suite (CPU by design)")
        if model_dir is not None:
            from repro.cluster import check_gpu

            try:
                check_gpu(model_dir, precision)
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
    """De-duplicate the partial records, check coverage, write ``out`` + meta atomically."""
    recs = read_jsonl_tolerant(partial)
    by_id: dict[str, dict] = {}
    for r in recs:
        by_id.setdefault(r["id"], r)
    want = [p["id"] for p in todo]
    missing = [i for i in want if i not in by_id]
    if missing:
        raise GenerationError(f"{partial}: {len(missing)} problem(s) missing after generation: {missing[:5]}")
    ordered = [by_id[i] for i in want]
    atomic_write_text(out, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in ordered))
    atomic_write_text(Path(str(out) + ".meta.json"), json.dumps(meta, indent=1, sort_keys=True) + "\n")
    partial.unlink(missing_ok=True)
    return ordered


def _generate(a: argparse.Namespace, backend, remaining: list[dict], decoder: dict, partial: Path,
              out: Path) -> dict:
    """Generate ``remaining`` problems with ``backend``, appending each record to ``partial`` as it finishes
    (a batched backend's ``generate_each`` hands them over in finishing order); returns this session's
    ``{"problems", "generated_tokens", "wall_s"}`` (the job's throughput, in provenance)."""
    from tqdm import tqdm

    from repro.prompts import build_prompt

    prompts = [build_prompt(a.benchmark, p["source"]) for p in remaining]
    out.parent.mkdir(parents=True, exist_ok=True)
    bar = tqdm(total=len(remaining), desc=f"{a.model}/{a.benchmark}", unit="problem", file=sys.stderr,
               mininterval=1.0)
    toks = fwd = 0
    t0 = time.perf_counter()
    with open(partial, "a", encoding="utf-8") as f:
        def emit(i: int, rec: dict) -> None:
            nonlocal toks, fwd
            prob, prompt = remaining[i], prompts[i]
            rec = {"id": prob["id"], "benchmark": a.benchmark, "model": a.model, "seed": a.seed,
                   "backend": a.backend, "template_version": prompt.template_version, **rec}
            append_jsonl(f, rec)
            toks += rec["generated_tokens"]
            if rec.get("forwards"):
                fwd += rec["forwards"]["denoise"] + rec["forwards"]["commit"]
            bar.update(1)
            bar.set_postfix(tok_s=f"{toks / (time.perf_counter() - t0):.1f}",
                            TPF=f"{toks / fwd:.2f}" if fwd else "n/a")

        if hasattr(backend, "generate_each"):  # batched backends hand records over in finishing order
            backend.generate_each(prompts, decoder, emit)
        else:
            for i, rec in enumerate(backend.generate(prompts, decoder)):
                emit(i, rec)
    bar.close()
    return {"problems": len(remaining), "generated_tokens": toks, "wall_s": time.perf_counter() - t0}


def run(a: argparse.Namespace) -> int:
    model_dir, out = Path(a.model_dir), Path(a.out)
    stamp = check_verified(model_dir, Path(a.verified))
    gpu_lock = None  # held (not read) until the job ends: the flock on it is the GPU claim
    if a.device.startswith("cuda"):
        from repro.backends.gpu_slot import GpuSlotError, claim_gpu

        # host-wide, like the GPUs: every job on this machine must see the same locks
        lock_dir = os.environ.get("ORL_EVAL_GPU_LOCKS") or os.path.join(tempfile.gettempdir(), "repro-gpu-locks")
        try:
            index, gpu_lock = claim_gpu(lock_dir)
        except GpuSlotError as e:
            raise GenerationError(str(e)) from None
        if index is not None:
            print(f"pinned to GPU {index} (CUDA_VISIBLE_DEVICES={index})", file=sys.stderr)
    check_device(a.device, model_dir, a.precision)
    decoder = load_decoder(Path(a.decoder), a.seed)
    problems = [json.loads(line) for line in Path(a.problems).read_text().splitlines() if line.strip()]
    todo = shard_of(problems, a.shard, a.num_shards)
    partial = Path(str(out) + ".partial.jsonl")
    sessions_file = Path(str(out) + ".partial.backends.json")  # backend of every session that wrote records
    inputs_file = Path(str(out) + ".partial.inputs.json")
    code_version = stage_code_version("generate", a.backend)
    inputs = {"decoder_sha256": sha256_path(a.decoder), "problems_sha256": sha256_path(a.problems),
              "checkpoint_manifest_sha256": stamp.get("manifest_sha256"), "backend": a.backend,
              "device": a.device, "precision": a.precision, "code_version": code_version}
    if partial.exists() and (not inputs_file.exists() or json.loads(inputs_file.read_text()) != inputs):
        print(f"note: {partial} was written with other inputs (decoder, problems, checkpoint, backend or code); "
              "discarding it and starting this shard afresh", file=sys.stderr)
        partial.unlink()
        sessions_file.unlink(missing_ok=True)
    out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(inputs_file, json.dumps(inputs, indent=1, sort_keys=True) + "\n")
    kept = read_jsonl_tolerant(partial)
    done = {r["id"] for r in kept}
    if partial.exists():  # drop a record torn by a kill before appending after it
        atomic_write_text(partial, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in kept))
    remaining = [p for p in todo if p["id"] not in done]
    print(f"{a.model}/{a.benchmark}/seed{a.seed} shard {a.shard}/{a.num_shards}: {len(todo)} problems, "
          f"{len(todo) - len(remaining)} already done, {len(remaining)} to generate", file=sys.stderr)

    backend = None
    done_now = None
    sessions = json.loads(sessions_file.read_text()) if sessions_file.exists() else []
    if remaining:
        extra = {"adapter_map": a.adapter_map} if getattr(a, "adapter_map", None) else {}
        if a.backend == "engine":
            extra["batch_size"] = getattr(a, "batch_size", 1)
        backend = get_backend(a.backend, model_dir=str(model_dir), role=a.role, device=a.device,
                              precision=a.precision, **extra)
        sessions.append(backend.describe())
        atomic_write_text(sessions_file, json.dumps(sessions, indent=1) + "\n")
        try:
            done_now = _generate(a, backend, remaining, decoder, partial, out)
        finally:
            # describe again: a backend that starts its engine in generate() knows its arguments only now
            sessions[-1] = backend.describe()

            atomic_write_text(sessions_file, json.dumps(sessions, indent=1) + "\n")
            backend.close()
    meta = {
        "model": a.model, "benchmark": a.benchmark, "seed": a.seed, "shard": a.shard,
        "num_shards": a.num_shards, "backend": a.backend, "device": a.device, "precision": a.precision,
        "batch_size": getattr(a, "batch_size", 1),
        "generated_last_session": done_now,  # problems, tokens, seconds of the session that finished the shard
        "checkpoint_manifest_sha256": stamp.get("manifest_sha256"),
        "decoder_sha256": sha256_path(a.decoder), "decoder": decoder,
        "problems_sha256": sha256_path(a.problems), "code_revision": code_revision(),
        "code_version": code_version,  # sha256 of the generation code (repro.provenance.stage_code_version)
        # the backend that wrote the records: this session's, else (resumed with nothing left) the last
        # session's; every session's when a resumed job mixed several
        "backend_info": sessions[-1] if sessions else None,
        "backend_sessions": sessions,
    }
    recs = complete_shard(out, partial, todo, meta)
    sessions_file.unlink(missing_ok=True)
    inputs_file.unlink(missing_ok=True)
    print(f"wrote {len(recs)} records -> {out}", file=sys.stderr)
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m repro.backends.generation_job", description=__doc__.splitlines()[0])
    ap.add_argument("--backend", choices=["engine", "sglang"], default="engine")
    ap.add_argument("--model", required=True, help="model name from config.yaml")
    ap.add_argument("--model-dir", required=True)
    ap.add_argument("--role", choices=["orl", "base"], required=True)
    ap.add_argument("--verified", required=True, help="verification stamp written by repro.checkpoint verify")
    ap.add_argument("--decoder", required=True, help="rendered decoder YAML")
    ap.add_argument("--problems", required=True)
    ap.add_argument("--benchmark", required=True)
    ap.add_argument("--seed", type=int, required=True)
    ap.add_argument("--shard", type=int, default=0)
    ap.add_argument("--num-shards", type=int, default=1)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--precision", choices=["fp32", "bf16", "nvfp4-w4a16", "nvfp4"], default="fp32")
    ap.add_argument("--batch-size", type=int, default=1,
                    help="engine: requests decoded together (repro.engine.batch; greedy ids identical at any size)")
    ap.add_argument("--adapter-map", default=None,
                    help="adapter mapping file for the checkpoint's ORL adapter (docs/adapter_map.md)")
    ap.add_argument("--out", required=True)
    a = ap.parse_args(argv)
    from repro.backends.lifeline import die_with_parent

    die_with_parent()
    try:
        return run(a)
    except GenerationError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
