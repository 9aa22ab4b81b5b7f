"""The HTTP application (FastAPI on uvicorn): the model card's ``/generate`` plus an OpenAI-compatible API over one
loaded :class:`~repro.engine.llm.LLM`.

Endpoints (request bodies: :mod:`repro.engine.serve.schemas`; every error: ``{"error": {"message", "type",
"param", "code"}}``):

* ``POST /generate`` — ``stream`` true (default, what ``curl -N`` shows): ``application/x-ndjson``, one line
  ``{"block": k, "text": new_text, "tokens": n}`` per committed block, then one line ``{"id", "text": rest,
  "finish_reason", "blocks", "usage"}``; the ``text`` fields concatenate to the completion. ``stream`` false:
  one object ``{"id", "text", "finish_reason", "blocks", "usage"}``. ``usage``: ``prompt_tokens``,
  ``generated_tokens``, ``forwards`` ``{prefill, denoise, commit}``, ``tpf`` (generated tokens / (denoise +
  commit), docs/interfaces.md), ``wall_s`` (engine decode seconds), ``tokens_per_s``, ``queue_s``.
  ``finish_reason``: ``"eos"`` | ``"length"`` | ``"stop"`` (a stop string).
* ``POST /v1/chat/completions``, ``POST /v1/completions`` — OpenAI shapes; ``stream: true`` as server-sent
  events (``data: {chunk}`` … ``data: [DONE]``), one content chunk per committed block; ``usage`` =
  ``{prompt_tokens, completion_tokens, total_tokens}`` plus the extra fields ``tpf``, ``forwards``, ``wall_s``,
  ``tokens_per_s``, ``queue_s`` (also on the streamed finish chunk; ``stream_options.include_usage`` adds
  OpenAI's usage-only last chunk). ``finish_reason``: ``"stop"`` (EOS or stop string) | ``"length"``.
* ``GET /v1/models``, ``GET /health`` (queue counters; never needs the API key).

Behaviour: with ``api_key`` every endpoint but ``/health`` needs ``Authorization: Bearer <key>`` (401).
Requests go through :class:`~repro.engine.serve.worker.EngineWorker` (concurrent requests decode together in
the continuous-batching engine, up to ``max_batch``; bounded queue of those waiting for a slot: 503 with
``Retry-After`` when full, never while a slot is free; a request past ``slot_positions`` — the positions, i.e.
the KV cache, one request may hold, on every engine — is a 400 naming ``--slot-positions``, the limit is
``max_model_len`` in ``/v1/models`` and ``max_request_positions`` in ``/health``); a client that disconnects
cancels its request (streaming: Starlette cancels the
response; non-streaming: polled). Bodies over ``max_body_bytes`` → 413; invalid JSON, wrong types, unknown
fields, a lone UTF-16 surrogate escape in a string, an empty message list, ``max_new_tokens`` ≤ 0 or past the
context → 400 naming the field; a request for another model → 404. Nothing raises through to the client: an unexpected error is a 500 whose message
points at the server log (where its traceback is); an engine failure after a stream began ends it with one
``{"error": ...}`` line (``/generate``) or event (SSE, then ``data: [DONE]``). Shutdown: :func:`make_server`.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import logging
import time
import uuid

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from repro.engine.decoders import DecoderConfig, DecoderConfigError
from repro.engine.llm import context_problem
from repro.engine.serve.schemas import (ChatRequest, CompletionRequest, GenerateRequest, RequestError, chat_messages,
                                        error_body, validation_error)
from repro.engine.serve.worker import EngineWorker, Job, QueueFull
from repro.engine.tokenizer import TokenizerError

log = logging.getLogger("repro.serve")

#: OpenAI finish reasons of the engine's (``cancelled`` never reaches a client: it has gone).
OPENAI_FINISH = {"eos": "stop", "stop": "stop", "length": "length", "cancelled": "stop"}


def _reject_constant(name: str):
    raise ValueError(f"{name} is not a JSON number")


def _lone_surrogate(obj, path: str = ""):
    """The dotted path (``messages.0.content``, as the 400s of :mod:`~repro.engine.serve.schemas` name fields) of
    the first string in ``obj`` (parsed JSON) holding a lone UTF-16 surrogate (``"\\ud800"`` escapes decode to
    one; no UTF-8 text can hold it), or None. Keys are checked too (their path is the parent's)."""
    stack = [(obj, path)]
    while stack:
        x, at = stack.pop()
        if isinstance(x, str):
            try:
                x.encode("utf-8")
            except UnicodeEncodeError:
                return at or "(body)"
        elif isinstance(x, dict):
            stack.extend((v, f"{at}.{k}" if at else str(k)) for k, v in x.items())
            stack.extend((k, at) for k in x)
        elif isinstance(x, list):
            stack.extend((v, f"{at}.{i}" if at else str(i)) for i, v in enumerate(x))
    return None


class Server:
    """State shared by the routes: the LLM, its worker, the served model name and the limits."""

    def __init__(self, llm, model_name: str, api_key: str | None, max_queue: int, max_body_bytes: int,
                 progress_s: float, disconnect_poll_s: float = 0.25, max_batch: int = 8,
                 slot_positions: int | None = None, block_hook=None):
        self.llm, self.model_name, self.api_key = llm, model_name, api_key
        self.disconnect_poll_s = disconnect_poll_s
        self.max_body_bytes = max_body_bytes
        self.worker = EngineWorker(llm, max_queue=max_queue, progress_s=progress_s, max_batch=max_batch,
                                   slot_positions=slot_positions, block_hook=block_hook)
        self.context = int(llm.config.max_position_embeddings)
        self.created = int(time.time())

    # -------------------------------------------------------------- request plumbing
    def check_auth(self, request: Request) -> None:
        """401 unless the Bearer token equals the API key (when one is set)."""
        if not self.api_key:
            return
        got = request.headers.get("authorization", "")
        scheme, _, token = got.partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(), self.api_key.encode()):
            raise RequestError(401, "missing or wrong API key: send the header 'Authorization: Bearer <key>' "
                                    "with the key the server was started with (--api-key)", None,
                               "authentication_error")

    async def read_json(self, request: Request) -> dict:
        """The body as a JSON object (whatever the Content-Type: ``curl -d`` sends a form type); 413/400."""
        limit = self.max_body_bytes
        cl = request.headers.get("content-length", "")
        if cl.isdigit() and int(cl) > limit:
            raise RequestError(413, f"request body of {int(cl)} bytes exceeds the server limit of {limit} bytes "
                                    "(--max-body-bytes)")
        buf = bytearray()
        async for chunk in request.stream():
            buf += chunk
            if len(buf) > limit:
                raise RequestError(413, f"request body exceeds the server limit of {limit} bytes (--max-body-bytes)")
        if not buf.strip():
            raise RequestError(400, "empty request body; send a JSON object")
        try:
            body = json.loads(bytes(buf), parse_constant=_reject_constant)
        except (ValueError, UnicodeDecodeError) as e:
            raise RequestError(400, f"request body is not valid JSON: {e}") from None
        except RecursionError:  # arrays/objects nested thousands deep: Python's decoder gives up
            raise RequestError(400, "request body nests arrays or objects too deeply to parse; send a flat request "
                                    "(a string prompt, or a list of chat messages)") from None
        if not isinstance(body, dict):
            raise RequestError(400, f"request body must be a JSON object, got a JSON {type(body).__name__}")
        if (at := _lone_surrogate(body)) is not None:
            raise RequestError(400, f"field {at!r} holds a lone UTF-16 surrogate escape (such as \\ud800 without its "
                                    "pair), which is no Unicode text; send valid UTF-8 or a complete surrogate pair",
                               at if at != "(body)" else None)
        return body

    def check_model(self, model: str | None) -> None:
        """404 when an OpenAI request names a model this server does not serve."""
        if model is not None and model != self.model_name:
            raise RequestError(404, f"model {model!r} is not served here; this server serves {self.model_name!r} "
                                    "(GET /v1/models)", "model", "not_found_error")

    async def make_job(self, endpoint: str, prompt, budget: int | None, budget_field: str, req,
                       prompt_field: str) -> Job:
        """Render/tokenise the prompt (in a worker thread: a long prompt must not stall the event loop, which
        streams the other requests' blocks), check it and the budget against the context, build the decoder."""
        loop = asyncio.get_running_loop()
        return await asyncio.to_thread(self._make_job, endpoint, prompt, budget, budget_field, req, prompt_field,
                                       loop)

    def _make_job(self, endpoint: str, prompt, budget: int | None, budget_field: str, req, prompt_field: str,
                  loop: asyncio.AbstractEventLoop) -> Job:
        llm = self.llm
        try:
            text = prompt if isinstance(prompt, str) else llm.apply_chat_template(prompt)
        except TokenizerError as e:
            raise RequestError(400, f"field {prompt_field!r}: {e}", prompt_field) from None
        ids = llm.tokenizer_.encode(text)
        n_prompt = len(ids)
        if n_prompt < 1:
            raise RequestError(400, f"field {prompt_field!r} encodes to no tokens", prompt_field)
        problem = context_problem(n_prompt, None, self.context)
        if problem:
            raise RequestError(400, f"field {prompt_field!r}: {problem}", prompt_field)
        room = self.context - n_prompt
        base = llm.default_decoder().to_dict()
        if budget is None:
            budget = min(base.get("max_new_tokens") or room, room)
        elif problem := context_problem(n_prompt, budget, self.context, f"field {budget_field!r}"):
            raise RequestError(400, problem, budget_field)
        over = {k: getattr(req, k) for k in ("threshold", "edit_threshold", "temperature")
                if getattr(req, k) is not None}
        try:
            decoder = DecoderConfig.from_dict({**base, **over, "max_new_tokens": budget})
        except DecoderConfigError as e:
            param = next((k for k in over if k in str(e)), None)
            raise RequestError(400, f"decoder settings refused: {e}", param) from None
        B = decoder.block_size
        if -(-(n_prompt + budget) // B) * B > self.worker.slot_positions:
            raise RequestError(400, f"prompt ({n_prompt} tokens) plus {budget_field!r} ({budget}) needs more than the "
                                    f"{self.worker.slot_positions} positions one request may hold on this server "
                                    "(its KV cache; max_request_positions in /health and /v1/models); ask for fewer "
                                    "tokens or a shorter prompt, or start the server with a larger --slot-positions",
                               budget_field)
        stop = req.stop_list()
        prefix = {"generate": "gen", "chat": "chatcmpl", "completions": "cmpl"}[endpoint]
        return Job(id=f"{prefix}-{uuid.uuid4().hex[:16]}", prompt=text, prompt_tokens=n_prompt, decoder=decoder,
                   max_new_tokens=budget, loop=loop, stop=stop, seed=req.seed,
                   endpoint=endpoint, ids=ids)

    def abort_remaining(self, graceful_s: float) -> None:
        """Shutdown past the grace period: every open request gets a final error event and is cancelled."""
        self.worker.abort(f"the server is shutting down and this request did not finish within the {graceful_s:g} s "
                          "grace period (--graceful-s); it was cancelled")

    def submit(self, job: Job) -> None:
        """Queue ``job`` or answer 503."""
        try:
            self.worker.submit(job)
        except QueueFull as e:
            log.warning("%s rejected: queue full (%s)", job.id, e)
            raise RequestError(503, f"server busy: {e}; retry later", None, "overloaded_error") from None


def _parse(model, body: dict):
    try:
        return model.model_validate(body, strict=True)
    except ValidationError as e:
        raise validation_error(e, model) from None


async def _events(job: Job):
    """Async iterator over the job's events; cancels the job if the consumer stops early (client gone)."""
    try:
        while True:
            ev = await job.events.get()
            yield ev
            if ev[0] in ("done", "error"):
                return
    finally:
        job.cancel()  # no effect once the job is done


async def _wait(job: Job, request: Request, poll_s: float = 0.25) -> tuple:
    """Non-streaming: the job's final event, polling for a client disconnect every ``poll_s`` seconds whether or
    not block events keep arriving (they come every few ms on a GPU: a poll only on a quiet queue never ran
    while the request decoded); a disconnect cancels the job (waiting: dropped; running: stopped after its
    current block). The job is cancelled however this ends (also when the handler itself is cancelled, e.g. at
    shutdown)."""
    loop = asyncio.get_running_loop()
    next_poll = loop.time() + poll_s
    try:
        while True:
            try:
                ev = await asyncio.wait_for(job.events.get(), timeout=max(0.0, next_poll - loop.time()))
            except asyncio.TimeoutError:
                ev = None
            if ev is not None and ev[0] in ("done", "error"):
                return ev
            if loop.time() >= next_poll:
                next_poll = loop.time() + poll_s
                if await request.is_disconnected():
                    job.cancel()
                    log.info("%s: client disconnected; cancelled", job.id)
                    return ("error", "client disconnected")
    finally:
        job.cancel()  # no effect once the job is done


class _JobStream(StreamingResponse):
    """A streamed answer that cancels its job however the response ends (also when Starlette cancels it on a
    client disconnect before the body iterator ever ran)."""

    def __init__(self, job: Job, content, media_type: str):
        headers = {"X-Request-Id": job.id, "Cache-Control": "no-cache"}
        super().__init__(content, media_type=media_type, headers=headers)
        self.job = job

    async def __call__(self, scope, receive, send):
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.job.cancel()  # no effect once the job is done


def _engine_error(msg: str) -> JSONResponse:
    return JSONResponse(error_body(f"{msg} (details in the server log)", None, "server_error"), status_code=500)


def _ndjson(obj) -> bytes:
    return (json.dumps(obj, ensure_ascii=False) + "\n").encode()


def _sse(obj) -> bytes:
    return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n".encode()


def _openai_usage(res: dict) -> dict:
    u = res["usage"]
    return {"prompt_tokens": u["prompt_tokens"], "completion_tokens": u["generated_tokens"],
            "total_tokens": u["prompt_tokens"] + u["generated_tokens"], "tpf": u["tpf"], "forwards": u["forwards"],
            "wall_s": u["wall_s"], "tokens_per_s": u["tokens_per_s"], "queue_s": u["queue_s"]}


def create_app(llm, model_name: str, api_key: str | None = None, max_queue: int = 64,
               max_body_bytes: int = 1 << 20, progress_s: float = 10.0,
               disconnect_poll_s: float = 0.25, max_batch: int = 8, slot_positions: int | None = None,
               block_hook=None) -> FastAPI:
    """The FastAPI application serving ``llm`` as ``model_name`` (module docstring). ``max_queue``: requests
    allowed to wait; ``max_body_bytes``: largest request body; ``progress_s``: seconds between progress log
    lines of a long request; ``disconnect_poll_s``: seconds between checks whether the client of a
    non-streaming request is still there; ``max_batch``, ``slot_positions``, ``block_hook``: as
    :class:`~repro.engine.serve.worker.EngineWorker`. The worker's scheduler is retired with the application's
    lifespan (what remains is answered and cancelled)."""
    srv = Server(llm, model_name, api_key, max_queue, max_body_bytes, progress_s, disconnect_poll_s, max_batch,
                 slot_positions, block_hook)

    @contextlib.asynccontextmanager
    async def lifespan(app):
        yield
        await asyncio.to_thread(srv.worker.close)  # never block the event loop (it still flushes final events)

    app = FastAPI(title="repro engine server", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    app.state.server = srv

    @app.exception_handler(RequestError)
    async def _request_error(request: Request, e: RequestError):
        headers = {"Retry-After": "1"} if e.status == 503 else ({"WWW-Authenticate": "Bearer"} if e.status == 401
                                                                  else None)
        if e.status >= 500 or e.status in (401, 413):
            log.info("%s %s -> %d: %s", request.method, request.url.path, e.status, e.message)
        return JSONResponse(error_body(e.message, e.param, e.kind), status_code=e.status, headers=headers)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, e: StarletteHTTPException):
        msg = {404: f"no endpoint {request.url.path}; endpoints: POST /generate, POST /v1/chat/completions, "
                    "POST /v1/completions, GET /v1/models, GET /health",
               405: f"method {request.method} not allowed on {request.url.path}"}.get(e.status_code, str(e.detail))
        return JSONResponse(error_body(msg), status_code=e.status_code, headers=getattr(e, "headers", None))

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, e: Exception):
        log.exception("unexpected error on %s %s", request.method, request.url.path)
        return JSONResponse(error_body("internal server error; the traceback is in the server log", None,
                                       "server_error"), status_code=500)

    # -------------------------------------------------------------- routes
    @app.get("/health")
    async def health():
        return {"status": "ok", "model": srv.model_name, "role": llm.role, "device": str(llm.device),
                "engine_path": llm.engine_path, **srv.worker.stats()}

    @app.get("/v1/models")
    async def models(request: Request):
        srv.check_auth(request)
        return {"object": "list", "data": [{"id": srv.model_name, "object": "model", "created": srv.created,
                                            "owned_by": "repro", "root": str(llm.path),
                                            "max_model_len": srv.worker.slot_positions, "context": srv.context}]}

    @app.post("/generate")
    async def generate(request: Request):
        srv.check_auth(request)
        req = _parse(GenerateRequest, await srv.read_json(request))
        field = "messages" if req.messages is not None else "prompt"
        job = await srv.make_job("generate", req.prompt_or_messages(), req.max_new_tokens, "max_new_tokens", req, field)
        srv.submit(job)
        if not req.stream:
            ev = await _wait(job, request, srv.disconnect_poll_s)
            if ev[0] == "error":
                return _engine_error(ev[1])
            res = ev[1]
            return JSONResponse({k: res[k] for k in ("id", "text", "finish_reason", "blocks", "usage")},
                                headers={"X-Request-Id": job.id})

        async def lines():
            k = 0
            async for ev in _events(job):
                if ev[0] == "block":
                    k += 1
                    yield _ndjson({"block": k, "text": ev[1], "tokens": ev[2]})
                elif ev[0] == "done":
                    res = ev[1]
                    yield _ndjson({"id": res["id"], "text": res["tail"], "finish_reason": res["finish_reason"],
                                   "blocks": res["blocks"], "usage": res["usage"]})
                else:
                    yield _ndjson(error_body(f"{ev[1]} (details in the server log)", None, "server_error"))

        return _JobStream(job, lines(), "application/x-ndjson")

    async def openai_route(request: Request, endpoint: str):
        srv.check_auth(request)
        body = await srv.read_json(request)
        if endpoint == "chat":
            req = _parse(ChatRequest, body)
            srv.check_model(req.model)
            req.check_neutral()
            job = await srv.make_job("chat", chat_messages(req), req.budget(),
                               "max_completion_tokens" if req.max_completion_tokens is not None else "max_tokens",
                               req, "messages")
        else:
            req = _parse(CompletionRequest, body)
            srv.check_model(req.model)
            req.check_neutral()
            job = await srv.make_job("completions", req.prompt_text(), req.max_tokens, "max_tokens", req, "prompt")
        srv.submit(job)
        created = int(time.time())
        obj = "chat.completion" if endpoint == "chat" else "text_completion"
        head = {"id": job.id, "created": created, "model": srv.model_name}
        if not req.stream:
            ev = await _wait(job, request, srv.disconnect_poll_s)
            if ev[0] == "error":
                return _engine_error(ev[1])
            res = ev[1]
            fin = OPENAI_FINISH[res["finish_reason"]]
            choice = ({"index": 0, "message": {"role": "assistant", "content": res["text"]}, "logprobs": None,
                       "finish_reason": fin} if endpoint == "chat" else
                      {"index": 0, "text": res["text"], "logprobs": None, "finish_reason": fin})
            return JSONResponse({**head, "object": obj, "choices": [choice], "usage": _openai_usage(res)},
                                headers={"X-Request-Id": job.id})
        include_usage = bool(req.stream_options and req.stream_options.include_usage)

        def chunk(text: str | None, finish: str | None, first: bool = False) -> dict:
            if endpoint == "chat":
                delta = {} if text is None else ({"role": "assistant", "content": text} if first else {"content": text})
                c = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
                return {**head, "object": "chat.completion.chunk", "choices": [c]}
            c = {"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish}
            return {**head, "object": "text_completion", "choices": [c]}

        async def events():
            if endpoint == "chat":
                yield _sse(chunk("", None, first=True))
            async for ev in _events(job):
                if ev[0] == "block":
                    if ev[1]:
                        yield _sse(chunk(ev[1], None))
                elif ev[0] == "done":
                    res = ev[1]
                    if res["tail"]:
                        yield _sse(chunk(res["tail"], None))
                    usage = _openai_usage(res)
                    yield _sse({**chunk(None, OPENAI_FINISH[res["finish_reason"]]), "usage": usage})
                    if include_usage:
                        yield _sse({**head, "object": chunk(None, None)["object"], "choices": [], "usage": usage})
                else:
                    yield _sse(error_body(f"{ev[1]} (details in the server log)", None, "server_error"))
            yield b"data: [DONE]\n\n"

        return _JobStream(job, events(), "text/event-stream")

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        return await openai_route(request, "chat")

    @app.post("/v1/completions")
    async def completions(request: Request):
        return await openai_route(request, "completions")

    return app


#: Seconds past the grace period uvicorn gives the final error events to reach their clients.
FLUSH_S = 5.0


def make_server(app: FastAPI, host: str = "127.0.0.1", port: int = 18080, graceful_s: float = 10.0,
                log_level: str = "info"):
    """The uvicorn server of ``app`` (from :func:`create_app`) with its shutdown (SIGINT/SIGTERM, or
    ``should_exit``): no new connection is taken, open requests get ``graceful_s`` seconds to finish; past that
    each remaining client gets a final error event (``{"error": ...}`` line on ``/generate``, an error event then
    ``data: [DONE]`` on the OpenAI streams, a 500 when not streaming) and its request is cancelled in the engine;
    then the application stops. Run it with ``.run()``."""
    import uvicorn

    class EngineServer(uvicorn.Server):
        async def shutdown(self, sockets=None):
            timer = asyncio.get_running_loop().call_later(graceful_s, app.state.server.abort_remaining, graceful_s)
            try:
                await super().shutdown(sockets)
            finally:
                timer.cancel()

    return EngineServer(uvicorn.Config(app, host=host, port=port, log_level=log_level,
                                       timeout_graceful_shutdown=graceful_s + FLUSH_S))
