"""Load, cancellation, queue bound and API key against servers on 127.0.0.1, bounded in count and time: 2 × 32
short streaming clients on the CLI server; then servers in this process whose tiny-model engine is paced
(each committed block 0.25–0.5 s slower, :func:`serve_util.paced`) so that disconnects and a full queue
happen while a request is running or waiting, whatever the tiny model's speed."""

from __future__ import annotations

import http.client
import json
import logging
import threading
import time

from serve_util import collect as _collect, open_post, paced, stream_lines, wait_for as _wait_for

from repro.engine.bench.serve import start_server


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
            assert u["generated_tokens"] == sum(b["tokens"] for b in blocks) <= 24
            assert last["finish_reason"] in ("eos", "length") and u["tpf"] is not None
            ids.add(last["id"])
        assert len(ids) == 32  # none lost, none answered twice
    h = server.health()
    assert h["served"] - before["served"] == 64 and h["failed"] == before["failed"]
    assert h["waiting"] == 0 and not h["running"] and h["rejected"] == before["rejected"]
    # memory: the second round of 32 requests must not grow the server by more than 32 MiB
    assert rss[1] - rss[0] < 32 * 1024, rss


class InProcess:
    """A paced in-process server: ``port``, ``stats()`` (the worker's counters), ``log`` (captured records)."""

    def __init__(self, llm, delay: float = 0.25, **app_kw):
        self.server, self.port = start_server(llm, model_name="tiny", block_hook=paced(delay), **app_kw)

    def stats(self) -> dict:
        return self.server.config.app.state.server.worker.stats()

    def request(self, method, path, body=None, headers=None):
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
        try:
            c.request(method, path, body=None if body is None else json.dumps(body).encode(), headers=headers or {})
            r = c.getresponse()
            return r.status, {k.lower(): v for k, v in r.getheaders()}, json.loads(r.read())
        finally:
            c.close()


def _open(port: int, body: dict, headers=None) -> http.client.HTTPConnection:
    return open_post(port, body, headers=headers)


def test_clients_that_disconnect_cancel_their_requests(tiny_llm, long_messages, caplog):
    caplog.set_level(logging.INFO, logger="repro.serve")
    srv = InProcess(tiny_llm, delay=0.5, max_batch=1)  # one slot: B and C wait behind A
    try:
        long = {"messages": long_messages, "max_new_tokens": 4096}  # ≥ 128 tokens (≥ 2.5 s here) before any EOS
        # A: streaming, disconnects after its first block; B: waits behind A and disconnects before it starts;
        # C: non-streaming, disconnects while waiting for its answer.
        a = _open(srv.port, long)
        ra = a.getresponse()
        assert json.loads(ra.readline())["block"] == 1
        a_id = ra.getheader("x-request-id")
        b = _open(srv.port, long)
        assert _wait_for(lambda: srv.stats()["waiting"] == 1, 30)
        b.close()  # B's queue place is freed at once, not when B reaches the front
        assert _wait_for(lambda: (h := srv.stats())["waiting"] == 0 and h["cancelled"] == 1, 30), srv.stats()
        c = _open(srv.port, {**long, "stream": False})
        assert _wait_for(lambda: srv.stats()["waiting"] == 1, 30)
        c.close()
        a.close()
        assert _wait_for(lambda: srv.stats()["cancelled"] == 3 and srv.stats()["waiting"] == 0, 30), srv.stats()
        log = caplog.text
        done = next(x for x in log.splitlines() if f"{a_id} done:" in x)
        # uncancelled, A would have run ≥ 128 tokens: it stopped after the block during which its client left
        assert "finish cancelled" in done and int(done.split("done: ")[1].split()[0]) < 128
        assert log.count("dropped before it started: client disconnected") == 2
        # the engine is free again: the next request is answered
        st, _, out = srv.request("POST", "/generate", {"prompt": "hi", "max_new_tokens": 8, "stream": False})
        assert st == 200 and srv.stats()["served"] == 1 and srv.stats()["failed"] == 0
    finally:
        srv.server.should_exit = True


def test_non_streaming_client_that_disconnects_while_running_is_cancelled(tiny_llm, long_messages, caplog):
    # blocks come faster than the disconnect poll (as on a GPU: every few ms against 0.25 s); the poll used to
    # run only when no event came for that long, so a non-streaming request was never cancelled. Blocks are paced
    # (≥ 0.3 s each, poll 0.6 s) so that the request is still running when the cancel can land, however fast the
    # machine decodes: unpaced, the tiny model reached its EOS (410 tokens) in 1.8 s, inside sleep + poll.
    caplog.set_level(logging.INFO, logger="repro.serve")
    srv = InProcess(tiny_llm, delay=0.3, disconnect_poll_s=0.6)
    try:
        c = _open(srv.port, {"messages": long_messages, "max_new_tokens": 4096, "stream": False})
        assert _wait_for(lambda: srv.stats()["running"], 30)
        time.sleep(0.2)  # a block under way
        c.close()
        assert _wait_for(lambda: srv.stats()["cancelled"] == 1 and not srv.stats()["running"], 30), srv.stats()
        done = next(x for x in caplog.text.splitlines() if " done: " in x)
        # uncancelled it would run ≥ 128 tokens (4096 allowed); it stopped within a poll of the disconnect
        assert "finish cancelled" in done and int(done.split("done: ")[1].split()[0]) < 512, done
        assert srv.stats()["served"] == 0
    finally:
        srv.server.should_exit = True


def test_api_key_and_bounded_queue_answers_503(tiny_llm, long_messages):
    srv = InProcess(tiny_llm, api_key="s3cret", max_queue=1, max_batch=1)
    auth = {"Authorization": "Bearer s3cret"}
    try:
        assert srv.request("GET", "/health")[0] == 200
        assert srv.request("GET", "/v1/models")[0] == 401
        st, hdr, out = srv.request("GET", "/v1/models", headers={"Authorization": "Bearer wrong"})
        assert st == 401 and out["error"]["type"] == "authentication_error" and hdr["www-authenticate"] == "Bearer"
        assert srv.request("POST", "/generate", {"prompt": "x", "max_new_tokens": 4})[0] == 401
        assert srv.request("GET", "/v1/models", headers=auth)[0] == 200
        # one running + one waiting fill a queue of 1: the third request gets 503 at once
        long = {"messages": long_messages, "max_new_tokens": 4096}
        running = _open(srv.port, long, auth)
        assert json.loads(running.getresponse().readline())["block"] == 1
        waiting = _open(srv.port, long, auth)
        assert _wait_for(lambda: srv.stats()["waiting"] == 1, 30)
        st, hdr, out = srv.request("POST", "/generate", {"prompt": "x", "max_new_tokens": 4}, headers=auth)
        assert st == 503 and hdr["retry-after"] == "1" and "--max-queue 1" in out["error"]["message"]
        # a waiting client that leaves frees its queue place at once (the running request is still running)
        waiting.close()
        assert _wait_for(lambda: (h := srv.stats())["waiting"] == 0 and h["cancelled"] == 1, 30), srv.stats()
        assert srv.stats()["running"]
        again = _open(srv.port, long, auth)
        assert _wait_for(lambda: srv.stats()["waiting"] == 1, 30), srv.stats()  # admitted, not 503
        again.close()
        running.close()
        assert _wait_for(lambda: (h := srv.stats())["waiting"] == 0 and not h["running"], 30)
        h = srv.stats()
        assert h["rejected"] == 1 and h["cancelled"] == 3
        assert srv.request("POST", "/generate", {"prompt": "x", "max_new_tokens": 4, "stream": False},
                           headers=auth)[0] == 200
    finally:
        srv.server.should_exit = True


def test_concurrent_streaming_clients_get_the_tokens_each_gets_alone(tiny_llm):
    # 6 clients, 3 slots, budgets of 1-3 blocks: requests finish at different rounds and waiting ones join the
    # running batch (continuous batching); each answer equals the same request through LLM.generate alone
    srv = InProcess(tiny_llm, delay=0.0, max_batch=3)
    try:
        bodies = [{"prompt": f"Story {i}: once upon a time" + " and then" * i, "max_new_tokens": 32 * (1 + i % 3)}
                  for i in range(6)]
        out: dict = {}
        threads = [threading.Thread(target=_collect, args=(srv.port, b, out, i)) for i, b in enumerate(bodies)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(300)
        for i, b in enumerate(bodies):
            status, lines = out[i]
            assert status == 200, (i, lines)
            alone = tiny_llm.generate(b["prompt"], max_new_tokens=b["max_new_tokens"])
            blocks, last = lines[:-1], lines[-1]
            assert "".join(x["text"] for x in lines) == alone.text, i
            u = last["usage"]
            assert (u["generated_tokens"], u["forwards"]) == (alone.generated_tokens, alone.forwards), i
            assert len(blocks) == len(alone.block_forwards), i  # one line per committed block
        h = srv.stats()
        assert h["served"] == 6 and h["failed"] == 0 and h["running"] == 0 and h["waiting"] == 0
    finally:
        srv.server.should_exit = True


def test_a_disconnect_frees_its_batch_slot_for_a_waiting_request(tiny_llm, long_messages):
    # blocks paced at 0.5 s: the tiny model's EOS (410 tokens, 13 blocks) lies ≥ 6.5 s out, far behind the steps
    srv = InProcess(tiny_llm, delay=0.5, max_batch=2)
    try:
        long = {"messages": long_messages, "max_new_tokens": 4096}
        a, b = _open(srv.port, long), _open(srv.port, long)
        ra = a.getresponse()
        assert json.loads(ra.readline())["block"] == 1
        assert _wait_for(lambda: srv.stats()["running"] == 2, 30), srv.stats()
        c = _open(srv.port, long)
        assert _wait_for(lambda: srv.stats()["waiting"] == 1, 30), srv.stats()
        a.close()  # A's slot goes to C after A's current block
        assert _wait_for(lambda: (h := srv.stats())["waiting"] == 0 and h["running"] == 2 and h["cancelled"] == 1,
                         30), srv.stats()
        b.close()
        c.close()
        assert _wait_for(lambda: (h := srv.stats())["running"] == 0 and h["cancelled"] == 3, 30), srv.stats()
    finally:
        srv.server.should_exit = True
