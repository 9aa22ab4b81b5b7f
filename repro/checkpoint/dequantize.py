"""Write the dequantized BF16 checkpoint of an NVFP4 (ModelOpt export) checkpoint: what the SGLang backend loads.

``python -m repro.checkpoint dequantize --src DIR --out DIR [--source-key JSON] [--verified STAMP]``. Every NVFP4 group (``X.weight`` packed uint8 +
``X.weight_scale`` E4M3 + ``X.weight_scale_2`` [+ ``X.input_scale``]) becomes one ``X.weight`` in BF16 with
the values of :func:`repro.checkpoint.nvfp4.dequantize` (fp32, then one round-to-nearest-even to BF16: the
values the engine's dequantize-at-load path holds); every other tensor is copied unchanged, in the same shard
files. ``config.json`` loses ``quantization_config``, ``hf_quant_config.json`` is not copied, the other files
(tokenizer, generation config, ``paper_decoding.json``) are. ``quant_provenance.json`` records the source (its
identity ``source_key`` -- the workflow's checkpoint source key: hub id + revision, local folder + manifest,
tiny seed + code -- its ``quantization_config`` and manifest hash), the method, the dequantize code version
(``repro.provenance.stage_code_version("dequantize")``) and the dtype; the directory gets its own
``checkpoint_manifest.json`` (every file hashed). No absolute path goes in: the same source and code give the
same manifest hash on any machine.

Why (docs/workflow.md, "NVFP4 checkpoints"): SGLang runs this model on Hopper as a BF16 model (FP4 kernels
need Blackwell), so the workflow (rule ``dequantize_checkpoint``) gives it this copy; the engine backend reads
the NVFP4 export directly. :func:`declared_quantization` and :func:`serves_dequantized` say, from a model's
config, when that copy is made.

The output is written into ``OUT.partial`` and renamed at the end, so an interrupted run never leaves a
directory that looks complete. Raises ValueError (the CLI exits 2) for a source that is not an NVFP4 export.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

#: files written or replaced here (everything else in the source directory is copied)
_REWRITTEN = {"config.json", "hf_quant_config.json", "model.safetensors.index.json", "checkpoint_manifest.json",
              "quant_provenance.json"}


def declared_quantization(model_cfg: dict) -> str | None:
    """``"nvfp4"`` when a config.yaml model declares an NVFP4 checkpoint (``quantization: nvfp4``, or a tiny
    source with ``nvfp4: true``) or is a local checkpoint whose ``config.json`` says so (``quantization_config``
    with ``quant_algo`` NVFP4, the ModelOpt export), else None (an unquantized checkpoint). A hub checkpoint is
    known only by its declaration (it is not downloaded yet when the workflow starts)."""
    src = model_cfg.get("source") or {}
    if model_cfg.get("quantization") == "nvfp4" or src.get("nvfp4"):
        return "nvfp4"
    if src.get("type") == "local" and src.get("path"):
        try:
            qc = json.loads((Path(src["path"]) / "config.json").read_text()).get("quantization_config") or {}
        except (OSError, ValueError, AttributeError):
            return None
        if str(qc.get("quant_algo", "")).upper() == "NVFP4":
            return "nvfp4"
    return None


def serves_dequantized(model_cfg: dict, backend: str) -> bool:
    """True when generation reads the dequantized BF16 copy instead of the checkpoint: the SGLang backend on a
    model whose checkpoint is NVFP4 (:func:`declared_quantization`). The engine backend reads NVFP4 itself."""
    return backend == "sglang" and declared_quantization(model_cfg) == "nvfp4"


def dequantize_checkpoint(src: str | Path, out: str | Path, dtype=None, source_key: dict | None = None) -> dict:
    """Write the dequantized checkpoint of ``src`` into ``out`` (replaced if it exists); returns its manifest.

    ``dtype``: a torch floating dtype, default ``torch.bfloat16`` (what SGLang loads).
    ``source_key``: what ``src`` is (the workflow's checkpoint source key), recorded in
    ``quant_provenance.json``; default ``{"folder": <src's name>}``.
    Raises ValueError naming the problem for a checkpoint that is not a complete NVFP4 ModelOpt export."""
    import torch
    from safetensors import safe_open
    from safetensors.torch import save_file

    from repro.checkpoint import nvfp4
    from repro.checkpoint.manifest import MANIFEST_NAME, write_json, write_manifest
    from repro.engine.config import LLaDA2Config
    from repro.engine.weights import checkpoint_files, expected_checkpoint_shapes
    from repro.provenance import stage_code_version

    dtype = torch.bfloat16 if dtype is None else dtype
    src, out = Path(src), Path(out)
    cfg = json.loads((src / "config.json").read_text())
    if "quantization_config" not in cfg:
        raise ValueError(f"{src}/config.json has no quantization_config: not an NVFP4 checkpoint, nothing to "
                         f"dequantize")
    nvfp4.check_export(src, cfg["quantization_config"])
    files = checkpoint_files(src)
    expected = expected_checkpoint_shapes(LLaDA2Config.from_dict(cfg))
    groups, _ = nvfp4.group_quantized_names(list(files), expected)
    part_of = {p: w for w, g in groups.items() for p in g.values() if p}
    tmp = out.with_name(out.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    weight_map = {}
    for shard in sorted(set(files.values())):
        tensors = {}
        with safe_open(str(shard), "pt") as h:
            for name in h.keys():
                if name not in part_of:
                    tensors[name] = h.get_tensor(name)
                elif name == part_of[name]:  # the group's X.weight: dequantize it
                    g = groups[name]
                    parts = [h.get_tensor(g[k]) if files[g[k]] == shard else _get(files[g[k]], g[k])
                             for k in ("weight", "weight_scale", "weight_scale_2")]
                    nvfp4.check_group(*parts, *expected[name])
                    tensors[name] = nvfp4.dequantize(*parts, dtype=torch.float32).to(dtype).contiguous()
        save_file(tensors, str(tmp / shard.name), metadata={"format": "pt"})
        weight_map.update({n: shard.name for n in tensors})
    if (src / "model.safetensors.index.json").is_file():
        total = sum((tmp / f).stat().st_size for f in set(weight_map.values()))
        write_json(tmp / "model.safetensors.index.json", {"metadata": {"total_size": total},
                                                         "weight_map": dict(sorted(weight_map.items()))})
    for f in sorted(src.iterdir()):
        if f.is_file() and f.name not in _REWRITTEN and not f.name.endswith(".safetensors"):
            shutil.copy2(f, tmp / f.name)
    write_json(tmp / "config.json", {k: v for k, v in cfg.items() if k != "quantization_config"})
    src_manifest = src / MANIFEST_NAME
    write_json(tmp / "quant_provenance.json", {
        "dequantized_from": {"source_key": source_key or {"folder": src.name},
                             "quantization_config": cfg["quantization_config"],
                             "manifest_sha256": json.loads(src_manifest.read_text()).get("manifest_sha256")
                             if src_manifest.is_file() else None},
        "method": "repro.checkpoint.nvfp4.dequantize: e2m1 * (e4m3 block scale * global scale) in fp32, then "
                  f"one round to nearest even to {str(dtype).removeprefix('torch.')}",
        "code_version": stage_code_version("dequantize"),
        "dtype": str(dtype).removeprefix("torch."), "groups_dequantized": len(groups)})
    manifest = write_manifest(tmp)
    if out.exists():
        shutil.rmtree(out)
    tmp.rename(out)
    return manifest


def _get(path: Path, name: str):
    """One tensor from a shard other than the one being written (a group split across shards)."""
    from safetensors import safe_open

    with safe_open(str(path), "pt") as h:
        return h.get_tensor(name)
