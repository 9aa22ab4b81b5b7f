"""Helpers of the server tests: real ``python -m repro.engine serve`` processes on 127.0.0.1 (free ports) and
small stdlib HTTP helpers (the tests also use real clients: curl, openai, lm-eval)."""

from __future__ import annotations

import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from repro.config import REPO_ROOT


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerProc:
    """A running server: ``port``, ``proc`` (Popen), ``log`` (its stderr file); helpers for requests."""

    def __init__(self, model_dir: Path, log: Path, *extra: str):
        self.port = free_port()
        self.log = log
        env = dict(os.environ, OMP_NUM_THREADS="1")
        self._fh = open(log, "w")
        self.proc = subprocess.Popen([sys.executable, "-m", "repro.engine", "serve", "--model", str(model_dir),
                                      "--role", "orl", "--port", str(self.port), "--device", "cpu", *extra],
                                     cwd=REPO_ROOT, env=env, stdout=self._fh, stderr=subprocess.STDOUT)
        deadline = time.time() + 90
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}:\n{log.read_text()}")
            try:
                if self.request("GET", "/health")[0] == 200:
                    return
            except OSError:
                time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"server did not come up within 90 s:\n{log.read_text()}")

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def request(self, method: str, path: str, body=None, headers=None, timeout: float = 60):
        """(status, headers dict, parsed JSON or raw bytes). ``body``: dict (sent as JSON) or bytes."""
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        try:
            data = json.dumps(body).encode() if isinstance(body, dict) else body
            c.request(method, path, body=data, headers=headers or {})
            r = c.getresponse()
            raw = r.read()
            try:
                out = json.loads(raw)
            except ValueError:
                out = raw
            return r.status, {k.lower(): v for k, v in r.getheaders()}, out
        finally:
            c.close()

    def health(self) -> dict:
        return self.request("GET", "/health")[2]

    def rss_kib(self) -> int:
        """Resident memory of the server process (KiB, /proc)."""
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
        raise RuntimeError("no VmRSS")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self._fh.close()


def stream_lines(port: int, path: str, body: dict, headers=None, timeout: float = 120):
    """POST ``body`` and yield the response's lines (bytes, without newline) as they arrive; first yields the
    status code."""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        c.request("POST", path, body=json.dumps(body).encode(), headers=headers or {})
        r = c.getresponse()
        yield r.status
        while True:
            line = r.readline()
            if not line:
                return
            line = line.rstrip(b"\n")
            if line:
                yield line
    finally:
        c.close()


def probe_long_messages(llm, tokens: int = 128, tries: int = 30) -> list[dict]:
    """Chat messages the tiny model answers with at least ``tokens`` tokens before any EOS (found by trying
    ``Story i:`` prompts; the random model's EOS positions depend on the prompt and on the decoders)."""
    for i in range(tries):
        msgs = [{"role": "user", "content": f"Story {i}:"}]
        if llm.generate(msgs, max_new_tokens=tokens).finish_reason == "length":
            return msgs
    raise RuntimeError(f"no prompt among {tries} runs {tokens} tokens without EOS on this checkpoint")


def paced(delay: float):
    """A server ``block_hook`` that makes every committed block take ``delay`` more seconds (the real engine's
    output, slowed), so tests can act while a request is running or waiting without racing the tiny model."""
    def hook(job, ids):
        time.sleep(delay)
    return hook


def wait_for(pred, timeout: float = 60.0) -> bool:
    """Poll ``pred()`` every 0.05 s until true (True) or ``timeout`` seconds passed (False)."""
    end = time.time() + timeout
    while time.time() < end:
        if pred():
            return True
        time.sleep(0.05)
    return False


def open_post(port: int, body: dict, path: str = "/generate", headers=None) -> http.client.HTTPConnection:
    """A connection that has sent ``POST path`` with ``body`` (JSON); read its answer with ``getresponse()``."""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    c.request("POST", path, body=json.dumps(body).encode(), headers=headers or {})
    return c


def collect(port: int, body: dict, out: dict, key) -> None:
    """``out[key]`` = (status, parsed lines) of a streamed ``/generate`` (or ("error", repr) if it raised)."""
    try:
        it = stream_lines(port, "/generate", body)
        out[key] = (next(it), [json.loads(x) for x in it])
    except Exception as e:  # noqa: BLE001 - recorded, asserted by the caller
        out[key] = ("error", repr(e))
