"""Benchmark: one streamed request through the HTTP server vs the same request through ``LLM.generate``.

    python -m repro.engine.bench serve                        # CUDA: LLaDA2.1-mini shapes, random bf16 weights
    python -m repro.engine.bench serve --checkpoint DIR --device cpu --tokens 128   # any checkpoint (e.g. tiny)
    python -m repro.engine.bench serve --concurrency 8,32     # concurrent streaming clients vs the batched engine

Without ``--checkpoint`` the model is LLaDA2.1-mini in its real shapes (``presets.PRESETS["llada2.1-mini"]``)
with deterministic random weights (``LLaDA2Model.random``, bf16, as :mod:`repro.engine.bench.rounds` builds it) behind
a temporary checkpoint folder that holds only the config, the tiny checkpoint's byte-level tokenizer and the
packaged ``paper_decoding.json`` (ids the tokenizer does not know decode to nothing; token counts are what is
compared). The server (:func:`repro.engine.serve.app.create_app` under uvicorn, 127.0.0.1, a thread of this
process) and the direct call share one loaded :class:`~repro.engine.llm.LLM`, so both run the same engine
path (``engine_path`` printed; CUDA graphs on a GPU).

Measured, after one warm-up of each path (graph capture), ``--repeats`` times alternately:

* direct: ``LLM.generate(prompt, max_new_tokens=N)`` timed around the call (tokenisation included);
* server: ``POST /generate`` (``stream`` true) over a socket, from sending the request to the last byte; the
  arrival time of every block line is kept (block-by-block streaming: the lines arrive spread over the
  decode, not at once).

Printed: both medians in tokens/s (generated tokens / seconds), the ratio server / direct (the target is
≥ 0.95), whether both produced the same tokens and forwards, the block lines' arrival spread; the last line is
one JSON document. Nothing is asserted.

``--concurrency 8,32`` measures, instead, per value ``c``: ``c`` concurrent streaming clients (distinct random
prompts of ``--prompt-tokens``, ``--tokens`` each; one thread each) against a server started with
``--max-batch c`` (every request in one batch), and the same ``c`` requests through the batched engine in
this process (``LLM.generate_batch(prompts, batch_size=c)``: the batched CUDA-graph path that ``bench batch``
measures, here with the requests' own decoder), alternately ``--repeats`` times after one warm-up of each.
Aggregate tokens/s = all generated tokens / seconds from the first request sent (call made) to the last byte
(call returned); printed per ``c``: both medians, their ratio server / batch (the issue's target is
≥ 0.8), and whether every client got the tokens and forwards the batched call gave that prompt.
"""

from __future__ import annotations

import argparse
import http.client
import json
import socket
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from unittest import mock


def build_llm(checkpoint: str | None, device: str, role: str, seed: int):
    """The LLM to serve: ``checkpoint`` loaded as usual, or full-size random weights (module docstring)."""
    from repro.engine.llm import LLM

    if checkpoint:
        return LLM(checkpoint, role=role, device=device)
    from repro.checkpoint.tiny import write_tiny
    from repro.engine.config import LLaDA2Config
    from repro.engine.model import LLaDA2Model
    from repro.engine.presets import PRESETS

    cfg = LLaDA2Config.from_dict(PRESETS["llada2.1-mini"])

    def random_model(path, device="cpu", dtype="bf16", with_adapter=True, **kw):
        return LLaDA2Model.random(cfg, device=device, dtype=dtype, seed=seed, with_adapter=False)

    with tempfile.TemporaryDirectory(prefix="serve_bench_") as tmp:  # read only while LLM() loads
        folder = Path(tmp)
        write_tiny(folder, seed=0)  # tokenizer files + paper_decoding.json; its weights are not used
        (folder / "config.json").write_text(json.dumps(PRESETS["llada2.1-mini"]))
        with mock.patch.object(LLaDA2Model, "from_pretrained", random_model):
            return LLM(folder, role=role, device=device)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(llm, model_name: str = "bench", log_level: str = "warning", graceful_s: float = 1.0, **app_kw):
    """uvicorn serving ``llm`` (``create_app(llm, model_name, **app_kw)``, :func:`~repro.engine.serve.app.make_server`
    with ``graceful_s``) on 127.0.0.1 in a daemon thread; returns (uvicorn server, port) once it listens. Stop it
    with ``server.should_exit = True``."""
    from repro.engine.serve.app import create_app, make_server

    port = _free_port()
    server = make_server(create_app(llm, model_name=model_name, **app_kw), "127.0.0.1", port, graceful_s=graceful_s,
                         log_level=log_level)
    threading.Thread(target=server.run, daemon=True, name="uvicorn").start()
    end = time.time() + 60
    while not server.started:
        if time.time() > end:
            raise RuntimeError("server did not start within 60 s")
        time.sleep(0.05)
    return server, port


def stream_request(port: int, body: dict) -> dict:
    """POST /generate streamed; returns seconds to the last byte, block arrival times and the final line."""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    t0 = time.perf_counter()
    c.request("POST", "/generate", body=json.dumps(body).encode())
    r = c.getresponse()
    if r.status != 200:
        raise RuntimeError(f"server answered {r.status}: {r.read()[:500]!r}")
    arrivals, text, last = [], [], None
    while True:
        line = r.readline()
        if not line:
            break
        obj = json.loads(line)
        if "error" in obj:
            raise RuntimeError(f"server reported: {obj['error']['message']}")
        text.append(obj.get("text", ""))
        if "block" in obj:
            arrivals.append(time.perf_counter() - t0)
        else:
            last = obj
    s = time.perf_counter() - t0
    c.close()
    return {"s": s, "arrivals": arrivals, "final": last, "text": "".join(text)}


def concurrent_requests(port: int, bodies: list[dict]) -> tuple[float, list[dict]]:
    """POST every body at once from its own thread (:func:`stream_request`); returns (seconds from the first
    send to the last byte, results in input order). Raises the first client's error."""
    out: list = [None] * len(bodies)

    def one(i):
        try:
            out[i] = stream_request(port, bodies[i])
        except Exception as e:  # noqa: BLE001 - re-raised below on the calling thread
            out[i] = e

    threads = [threading.Thread(target=one, args=(i,), daemon=True) for i in range(len(bodies))]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    s = time.perf_counter() - t0
    for r in out:
        if isinstance(r, Exception):
            raise r
    return s, out


def bench_concurrency(llm, c: int, prompt_tokens: int, tokens: int, repeats: int, seed: int, log) -> dict:
    """The ``--concurrency`` measurement at ``c`` clients (module docstring); returns its JSON row."""
    import torch

    g = torch.Generator().manual_seed(seed + c)
    letters = "abcdefghijklmnopqrstuvwxyz "
    prompts = ["".join(letters[i] for i in torch.randint(0, len(letters), (prompt_tokens,), generator=g).tolist())
               for _ in range(c)]
    positions = max(len(llm.tokenizer_.encode(p)) for p in prompts) + tokens
    server, port = start_server(llm, max_batch=c, max_queue=max(64, c), slot_positions=positions)
    bodies = [{"prompt": p, "max_new_tokens": tokens} for p in prompts]

    def batch():
        if str(llm.device).startswith("cuda"):
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        outs = llm.generate_batch(prompts, max_new_tokens=tokens, batch_size=c)
        return outs, time.perf_counter() - t0

    try:
        batch()  # warm-up: capture and compilation at this batch size
        concurrent_requests(port, bodies)
        runs = []
        for i in range(repeats):
            outs, sb = batch()
            ss, res = concurrent_requests(port, bodies)
            gb = sum(o.generated_tokens for o in outs)
            gs = sum(r["final"]["usage"]["generated_tokens"] for r in res)
            same = all(r["final"]["usage"]["generated_tokens"] == o.generated_tokens and r["text"] == o.text
                       and r["final"]["usage"]["forwards"] == o.forwards for r, o in zip(res, outs))
            runs.append({"batch_s": sb, "batch_tokens": gb, "batch_tps": gb / sb, "server_s": ss,
                         "server_tokens": gs, "server_tps": gs / ss, "same_tokens": same,
                         "first_block_s_median": statistics.median(r["arrivals"][0] for r in res if r["arrivals"])})
            log(f"[c={c} {i + 1}/{repeats}] batched engine {gb / sb:.1f} tok/s ({gb} tokens, {sb:.3f} s) | server "
                f"{c} streaming clients {gs / ss:.1f} tok/s ({gs} tokens, {ss:.3f} s) | same tokens: {same}")
    finally:
        server.should_exit = True
    b = statistics.median(r["batch_tps"] for r in runs)
    s = statistics.median(r["server_tps"] for r in runs)
    return {"concurrency": c, "batch_tokens_per_s": b, "server_tokens_per_s": s, "ratio": s / b,
            "target_ratio": 0.8, "same_tokens": all(r["same_tokens"] for r in runs), "runs": runs}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m repro.engine.bench serve",
                                 description="tokens/s of one streamed server request vs LLM.generate")
    ap.add_argument("--checkpoint", default=None, help="checkpoint directory (default: full-size random weights)")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--role", default="orl", choices=["orl", "base"])
    ap.add_argument("--prompt-tokens", type=int, default=512, help="prompt length (byte tokenizer: characters)")
    ap.add_argument("--tokens", type=int, default=512, help="max_new_tokens of the request")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--concurrency", default=None,
                    help="comma-separated client counts (e.g. 8,32): concurrent streaming clients against the "
                         "batched engine at that batch size, instead of the one-request comparison")
    ap.add_argument("--json", default=None, help="also write the JSON document to this file")
    a = ap.parse_args(argv)
    conc = None
    if a.concurrency is not None:
        try:
            conc = [int(x) for x in a.concurrency.split(",") if x.strip()]
        except ValueError:
            conc = []
        if not conc or min(conc) < 1:
            ap.error(f"--concurrency {a.concurrency!r}: give positive integers separated by commas, e.g. 8,32")
    import torch

    from repro.engine.bench.cli import emit_json, log

    if a.device.startswith("cuda") and not torch.cuda.is_available():
        print(json.dumps({"error": "CUDA not available; use --checkpoint DIR --device cpu for a CPU run"}))
        return 2

    t = time.perf_counter()
    llm = build_llm(a.checkpoint, a.device, a.role, a.seed)
    log(f"model ready in {time.perf_counter() - t:.1f} s: engine path {llm.engine_path}, {llm.precision}, "
        f"{llm.device}, decoder {llm.default_decoder().algorithm}")
    on_gpu = torch.cuda.is_available() and str(llm.device).startswith("cuda")
    gpu = {"gpu": torch.cuda.get_device_name(0)} if on_gpu else {}  # the JSON documents' last key
    if conc:
        rows = [bench_concurrency(llm, c, a.prompt_tokens, a.tokens, a.repeats, a.seed, log) for c in conc]
        doc = {"bench": "repro.engine.bench serve --concurrency", "device": str(llm.device),
               "engine_path": llm.engine_path, "model": a.checkpoint or "llada2.1-mini random bf16",
               "prompt_tokens": a.prompt_tokens, "max_new_tokens": a.tokens, "concurrency": rows, **gpu}
        for r in rows:
            print(f"{r['concurrency']} concurrent streaming clients: server {r['server_tokens_per_s']:.1f} tokens/s, "
                  f"batched engine at batch {r['concurrency']}: {r['batch_tokens_per_s']:.1f} tokens/s, ratio "
                  f"{r['ratio']:.3f} (target ≥ 0.8), same tokens: {r['same_tokens']}")
        return emit_json(doc, a.json)
    g = torch.Generator().manual_seed(a.seed)
    letters = "abcdefghijklmnopqrstuvwxyz "
    prompt = "".join(letters[i] for i in torch.randint(0, len(letters), (a.prompt_tokens,), generator=g).tolist())
    server, port = start_server(llm)
    body = {"prompt": prompt, "max_new_tokens": a.tokens}

    def direct():
        if str(llm.device).startswith("cuda"):
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        out = llm.generate(prompt, max_new_tokens=a.tokens)
        return out, time.perf_counter() - t0

    direct()  # warm-up: graph capture for this prompt length / capacity
    stream_request(port, body)
    runs_d, runs_s = [], []
    for i in range(a.repeats):
        out, s = direct()
        runs_d.append({"s": s, "tokens": out.generated_tokens, "tps": out.generated_tokens / s,
                       "engine_tps": out.request_tps})
        r = stream_request(port, body)
        u = r["final"]["usage"]
        gaps = [b - a_ for a_, b in zip(r["arrivals"], r["arrivals"][1:])]
        runs_s.append({"s": r["s"], "tokens": u["generated_tokens"], "tps": u["generated_tokens"] / r["s"],
                       "engine_tps": u["tokens_per_s"], "blocks": len(r["arrivals"]),
                       "first_block_s": r["arrivals"][0] if r["arrivals"] else None,
                       "median_block_gap_s": statistics.median(gaps) if gaps else None,
                       "same_tokens": u["generated_tokens"] == out.generated_tokens and u["forwards"] == out.forwards
                       and r["text"] == out.text})
        log(f"[{i + 1}/{a.repeats}] direct {runs_d[-1]['tps']:.1f} tok/s ({out.generated_tokens} tokens, "
            f"{s:.3f} s) | server {runs_s[-1]['tps']:.1f} tok/s ({u['generated_tokens']} tokens, {r['s']:.3f} s, "
            f"{len(r['arrivals'])} block lines, first at {runs_s[-1]['first_block_s']:.3f} s) | same tokens: "
            f"{runs_s[-1]['same_tokens']}")
    server.should_exit = True
    d = statistics.median(x["tps"] for x in runs_d)
    s = statistics.median(x["tps"] for x in runs_s)
    doc = {"bench": "repro.engine.bench serve", "device": str(llm.device), "engine_path": llm.engine_path,
           "model": a.checkpoint or "llada2.1-mini random bf16", "prompt_tokens": a.prompt_tokens,
           "max_new_tokens": a.tokens, "direct_tokens_per_s": d, "server_tokens_per_s": s, "ratio": s / d,
           "target_ratio": 0.95, "runs_direct": runs_d, "runs_server": runs_s, **gpu}
    print(f"LLM.generate: {d:.1f} tokens/s   server (streamed /generate): {s:.1f} tokens/s   "
          f"ratio server/direct: {s / d:.3f} (target ≥ 0.95)")
    return emit_json(doc, a.json)


if __name__ == "__main__":
    sys.exit(main())
