"""HTTP server of the engine: the model card's ``/generate`` (streamed block by block) and an OpenAI-compatible API.

    python -m repro.engine serve --model DIR|HUB_ID --role orl --port 18080 \
        [--precision fp32|bf16] [--host 127.0.0.1] [--api-key KEY] [--max-queue 64] [--max-batch 8]
    curl -N localhost:18080/generate -d '{"messages": [{"role": "user", "content": "Hi!"}], "max_new_tokens": 512}'

Modules: :mod:`~repro.engine.serve.app` (routes, shapes, errors), :mod:`~repro.engine.serve.schemas` (request
bodies), :mod:`~repro.engine.serve.worker` (the engine thread over the continuous-batching engine, bounded
queue, streaming text, cancellation),
:mod:`~repro.engine.bench.serve` (server vs ``LLM.generate`` tokens/s on a GPU). README section "Serving".

Contract of :func:`serve_main`: loads the checkpoint (a directory, or a hub id fetched with
``huggingface_hub`` — cache or hub), runs one warm-up generation (CUDA-graph capture happens then, not in the
first request), logs one line saying what is served where, then serves until SIGINT/SIGTERM (uvicorn;
in-flight requests get ``--graceful-s`` seconds, then each remaining client gets a final error event and its
request is cancelled in the engine: :func:`~repro.engine.serve.app.make_server`). ``--tensor-parallel-size N``
serves from N ranks in step (:mod:`repro.engine.ranks`). Bad arguments or an unloadable checkpoint: one
``error:`` line and exit status 2, before anything listens.
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path

log = logging.getLogger("repro.serve")


def add_serve_args(p) -> None:
    """The ``serve`` subcommand's options (model/role/precision/device come from the engine CLI's own flags)."""
    p.add_argument("--host", default="127.0.0.1", help="interface to listen on (default 127.0.0.1: this machine "
                                                      "only; 0.0.0.0 for every interface)")
    p.add_argument("--port", type=int, default=18080, help="TCP port (default: %(default)s)")
    p.add_argument("--api-key", default=os.environ.get("REPRO_SERVE_API_KEY"),
                   help="require 'Authorization: Bearer KEY' (default: $REPRO_SERVE_API_KEY; unset = open)")
    p.add_argument("--served-model-name", default=None,
                   help="model id of /v1/models and the OpenAI 'model' field (default: the directory's name, "
                        "or the hub id)")
    p.add_argument("--revision", default="main", help="hub revision when --model is a hub id (default: %(default)s)")
    p.add_argument("--max-queue", type=int, default=64,
                   help="requests allowed to wait beyond the free slots; more get 503 (default: %(default)s)")
    p.add_argument("--max-batch", type=int, default=8,
                   help="requests decoded together by the continuous-batching engine (default: %(default)s)")
    p.add_argument("--slot-positions", type=int, default=None,
                   help="positions (prompt + completion: the KV cache) one request may hold, on every engine; "
                        "longer requests get 400 (default: min(8192, the model's context); said in /health)")
    p.add_argument("--max-body-bytes", type=int, default=1 << 20, help="largest request body in bytes; 413 beyond (default: %(default)s)")
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"],
                   help="server log level (default: %(default)s)")
    p.add_argument("--graceful-s", type=float, default=10.0,
                   help="seconds in-flight requests get on shutdown; then each gets a final error event and is "
                        "cancelled (default: %(default)s)")


def _looks_local(model: str) -> bool:
    """Whether ``--model`` is meant as a local path rather than a hub id ``owner/name``: it starts with ``.``
    or ``~``, is absolute, has a backslash or more or fewer than one ``/``, or its first part is a folder
    here (``work/tiny-orl`` when ``work/`` exists)."""
    return (model.startswith((".", "~")) or os.path.isabs(model) or "\\" in model or model.count("/") != 1
            or Path(model.split("/", 1)[0]).expanduser().is_dir())


def resolve_model(model: str, revision: str = "main") -> Path:
    """A checkpoint directory for ``model``: the directory itself, or the hub snapshot of the id ``owner/name``.

    Raises ValueError naming what is wrong: a local path (see :func:`_looks_local`) that is no folder says
    "no such local checkpoint folder"; a hub id the hub (or its cache) cannot provide gives the hub's reason,
    and says no local folder of that name exists either."""
    p = Path(model).expanduser()
    if p.is_dir():
        return p
    if p.exists():
        raise ValueError(f"--model {model!r}: is a file, not a checkpoint folder (the folder holding config.json, "
                         "the tokenizer files and the safetensors weights)")
    if _looks_local(model):
        raise ValueError(f"--model {model!r}: no such local checkpoint folder: {p.absolute()}; write one "
                         "(python -m repro.checkpoint.tiny --out DIR) or give a hub id of the form owner/name")
    from repro.checkpoint.download import DownloadError, hub_snapshot

    try:
        return hub_snapshot(model, revision)[0]
    except DownloadError as e:
        raise ValueError(f"--model {model!r}: no local folder of that name, and as a hub id: {e}") from None


def _check_listen(host: str, port: int) -> None:
    """ValueError when ``host:port`` cannot be listened on (port taken, unknown host)."""
    import socket

    try:
        with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind((host, port))
    except OSError as e:
        raise ValueError(f"cannot listen on {host}:{port} ({e.strerror or e}); choose another --port or --host") \
            from None


def serve_main(a, precision: str) -> int:
    """Run the server for parsed CLI arguments ``a`` (see :func:`add_serve_args`); returns the exit status."""
    try:
        import uvicorn  # noqa: F401

        from repro.engine.serve.app import create_app, make_server
    except ImportError as e:
        raise ValueError(f"the server needs FastAPI and uvicorn ({e}); install the 'serve' extra: "
                         f".venv/bin/python -m pip install -e '.[serve]' (scripts/setup.sh does)") from None
    from repro.engine.llm import LLM

    logging.basicConfig(level=a.log_level.upper(), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for name, v in (("--port", a.port), ("--max-queue", a.max_queue), ("--max-body-bytes", a.max_body_bytes),
                    ("--max-batch", a.max_batch), ("--slot-positions", a.slot_positions or 1)):
        if v < (0 if name == "--port" else 1) or (name == "--port" and v > 65535):
            raise ValueError(f"{name} {v} is out of range")
    _check_listen(a.host, a.port)  # before loading a model that may take minutes
    path = resolve_model(a.model, a.revision)
    llm = LLM(path, role=a.role, precision=precision, device=a.device,
              tensor_parallel_size=getattr(a, "tensor_parallel_size", 1))
    name = a.served_model_name or (Path(a.model.rstrip("/")).name if Path(a.model).is_dir() else a.model)
    out = llm.generate("warm-up", max_new_tokens=llm.default_decoder().block_size)
    log.info("loaded %s (role %s, %s, %s, engine path %s); warm-up %.2f s", path, llm.role, llm.precision,
             llm.device, llm.engine_path, out.wall_s)
    context = int(llm.config.max_position_embeddings)
    if a.slot_positions is not None and a.slot_positions > context:
        raise ValueError(f"--slot-positions {a.slot_positions} exceeds the model's context of {context} positions")
    app = create_app(llm, model_name=name, api_key=a.api_key, max_queue=a.max_queue,
                     max_body_bytes=a.max_body_bytes, max_batch=a.max_batch,
                     slot_positions=a.slot_positions or min(8192, context))
    log.info("serving %r on http://%s:%d — POST /generate, POST /v1/chat/completions, POST /v1/completions, "
             "GET /v1/models, GET /health%s", name, a.host, a.port, " (API key required)" if a.api_key else "")
    try:
        make_server(app, a.host, a.port, graceful_s=a.graceful_s, log_level=a.log_level).run()
    finally:
        llm.close()  # the engine loop, and the ranks of a tensor-parallel server
    return 0
