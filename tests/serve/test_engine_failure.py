"""An engine failure (here: the tiny model's request raising after its first block, in the batched engine)
reaches the client as a 500 or a final error line — never a traceback — and the server keeps serving."""

from __future__ import annotations

import json

from serve_util import stream_lines

from repro.engine.llm import LLM
from repro.engine.bench.serve import start_server


def test_engine_error_is_reported_and_server_keeps_serving(serve_tiny_dir):
    llm = LLM(serve_tiny_dir, role="orl", device="cpu")

    def flaky(job, ids):  # after the request's first block reached its client
        if "boom" in job.prompt:
            raise RuntimeError("simulated device fault")

    server, port = start_server(llm, block_hook=flaky)
    try:
        lines = list(stream_lines(port, "/generate", {"prompt": "boom", "max_new_tokens": 64}))
        assert lines[0] == 200
        body = [json.loads(x) for x in lines[1:]]
        assert body[0]["block"] == 1 and "simulated device fault" in body[-1]["error"]["message"]
        assert "Traceback" not in json.dumps(body)
        status = list(stream_lines(port, "/generate", {"prompt": "boom", "max_new_tokens": 64, "stream": False}))
        assert status[0] == 500 and json.loads(status[1])["error"]["type"] == "server_error"
        ok = [json.loads(x) for x in
              list(stream_lines(port, "/generate", {"prompt": "fine", "max_new_tokens": 16}))[1:]]
        assert ok[-1]["finish_reason"] in ("eos", "length")
        stats = server.config.app.state.server.worker.stats()
        assert stats["failed"] == 2 and stats["served"] == 1
    finally:
        server.should_exit = True
