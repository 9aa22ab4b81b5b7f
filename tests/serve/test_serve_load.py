"""Load, cancellation, queue bound and API key against servers on 127.0.0.1 (bounded: 2 × 32 short streaming
clients, a handful of long requests that the tests cut short)."""

from __future__ import annotations

import http.client
import json
import threading
import time

import pytest

from serve_util import ServerProc, stream_lines

LONG = [{"role": "user", "content": "Tell me a long story."}]  # runs past 1024 tokens on the tiny checkpoint


def _stream_client(port: int, i: int, out: dict) -> None:
    try:
        it = stream_lines(port, "/generate", {"messages": [{"role": "user", "content": f"client {i}"}],
                                              "max_new_tokens": 24})
        status = next(it)
        out[i] = (status, [json.loads(x) for x in it])
    except Exception as e:  # noqa: BLE001 - recorded, asserted below
        out[i] = ("error", repr(e))


def _round(server, n: int = 32) -> dict:
    out: dict = {}
    threads = [threading.Thread(target=_stream_client, args=(server.port, i, out)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(180)
    return out


def _wait_for(pred, timeout: float = 60.0) -> bool:
    end = time.time() + timeout
    while time.time() < end:
        if pred():
            return True
        time.sleep(0.1)
    return False


def test_32_concurrent_streaming_clients_all_complete_memory_stable(server):
    before = server.health()
    rss = []
    for _ in range(2):
        out = _round(server)
        rss.append(server.rss_kib())
        assert len(out) == 32
        ids = set()
        for i, (status, lines) in out.items():
            assert status == 200, (i, lines)
            blocks, last = lines[:-1], lines[-1]
            assert blocks and all("block" in b for b in blocks), (i, lines)
            u = last["usage"]
            assert u["generated_tokens"] == sum(b["tokens"] for b in blocks) and 1 <= u["generated_tokens"] <= 24
            assert last["finish_reason"] in ("eos", "length") and u["tpf"] is not None
            ids.add(last["id"])
        assert len(ids) == 32  # none lost, none answered twice
    h = server.health()
    assert h["served"] - before["served"] == 64 and h["failed"] == before["failed"]
    assert h["waiting"] == 0 and not h["running"] and h["rejected"] == before["rejected"]
    # memory: the second round of 32 requests must not grow the server by more than 32 MiB
    assert rss[1] - rss[0] < 32 * 1024, rss


def _open_stream(port: int, body: dict):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    c.request("POST", "/generate", body=json.dumps(body).encode())
    return c


def test_clients_that_disconnect_cancel_their_requests(server):
    before = server.health()
    # A: streaming, disconnects after its first block; B: waits behind A and disconnects before it starts;
    # C: non-streaming, disconnects while waiting for its answer.
    a = _open_stream(server.port, {"messages": LONG, "max_new_tokens": 4096})
    ra = a.getresponse()
    first = json.loads(ra.readline())
    assert first["block"] == 1
    a_id = ra.getheader("x-request-id")
    b = _open_stream(server.port, {"messages": LONG, "max_new_tokens": 4096})
    assert _wait_for(lambda: server.health()["waiting"] >= 1, 30)
    b.close()
    c = _open_stream(server.port, {"messages": LONG, "max_new_tokens": 4096, "stream": False})
    time.sleep(0.5)
    c.close()
    a.close()
    assert _wait_for(lambda: server.health()["cancelled"] - before["cancelled"] == 3, 60), server.health()
    log = server.log.read_text()
    line = next(x for x in log.splitlines() if f"{a_id} done:" in x)
    assert "finish cancelled" in line and int(line.split("done: ")[1].split()[0]) < 4096
    assert "dropped before it started: client disconnected" in log
    # the engine is free again: a new request is answered at once
    st, _, out = server.request("POST", "/generate", {"prompt": "hi", "max_new_tokens": 8, "stream": False},
                                timeout=60)
    assert st == 200 and out["usage"]["generated_tokens"] >= 1
    assert server.health()["waiting"] == 0


@pytest.fixture(scope="module")
def strict_server(serve_tiny_dir, tmp_path_factory):
    s = ServerProc(serve_tiny_dir, tmp_path_factory.mktemp("serve_strict") / "server.log", "--api-key", "s3cret",
                   "--max-queue", "1")
    yield s
    s.stop()


def test_api_key_and_bounded_queue_answers_503(strict_server):
    s = strict_server
    auth = {"Authorization": "Bearer s3cret"}
    assert s.request("GET", "/health")[0] == 200
    assert s.request("GET", "/v1/models")[0] == 401
    st, hdr, out = s.request("GET", "/v1/models", headers={"Authorization": "Bearer wrong"})
    assert st == 401 and out["error"]["type"] == "authentication_error" and hdr["www-authenticate"] == "Bearer"
    assert s.request("POST", "/generate", {"prompt": "x", "max_new_tokens": 4})[0] == 401
    assert s.request("GET", "/v1/models", headers=auth)[0] == 200
    # one running + one waiting fill a queue of 1: the third request gets 503 at once
    running = http.client.HTTPConnection("127.0.0.1", s.port, timeout=120)
    running.request("POST", "/generate", body=json.dumps({"messages": LONG, "max_new_tokens": 4096}), headers=auth)
    r = running.getresponse()
    assert json.loads(r.readline())["block"] == 1
    waiting = http.client.HTTPConnection("127.0.0.1", s.port, timeout=120)
    waiting.request("POST", "/generate", body=json.dumps({"messages": LONG, "max_new_tokens": 4096}), headers=auth)
    assert _wait_for(lambda: s.health()["waiting"] == 1, 30)
    st, hdr, out = s.request("POST", "/generate", {"prompt": "x", "max_new_tokens": 4}, headers=auth)
    assert st == 503 and hdr["retry-after"] == "1" and "--max-queue 1" in out["error"]["message"]
    waiting.close()
    running.close()
    assert _wait_for(lambda: (h := s.health())["waiting"] == 0 and not h["running"], 60)
    h = s.health()
    assert h["rejected"] == 1 and h["cancelled"] == 2
    assert s.request("POST", "/generate", {"prompt": "x", "max_new_tokens": 4, "stream": False}, headers=auth)[0] == 200
