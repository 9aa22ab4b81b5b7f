"""The server on the tiny checkpoint, driven by real clients: the model card's curl line, the ``openai`` client,
and hostile input. Every answer is checked against ``LLM.generate`` run in this process on the same checkpoint."""

from __future__ import annotations

import json
import shutil
import subprocess

import pytest

from serve_util import stream_lines


openai = pytest.importorskip("openai")

HI = [{"role": "user", "content": "Hi!"}]


@pytest.fixture
def llm(tiny_llm):
    return tiny_llm


@pytest.fixture
def long_prompt(tiny_llm, long_messages):
    """A chat-formatted prompt string (used as is) the tiny model answers with ≥ 128 tokens before EOS."""
    return tiny_llm.apply_chat_template(long_messages)


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=120)


def _check_usage(u: dict, blocks_tokens: int | None = None):
    f = u["forwards"]
    assert set(f) == {"prefill", "denoise", "commit"}
    assert u["tpf"] == pytest.approx(u["generated_tokens"] / (f["denoise"] + f["commit"]))
    assert u["wall_s"] > 0 and u["tokens_per_s"] == pytest.approx(u["generated_tokens"] / u["wall_s"], rel=1e-3)
    if blocks_tokens is not None:
        assert blocks_tokens == u["generated_tokens"]


@pytest.mark.skipif(shutil.which("curl") is None, reason="curl not installed")
def test_card_curl_line_streams_blocks_then_usage(server, llm):
    """The card's second line, verbatim but for the port: one JSON line per committed block, then usage; the
    same text and counts as LLM.generate (``stream: false`` is compared in the next test)."""
    body = '{"messages": [{"role": "user", "content": "Hi!"}], "max_new_tokens": 512}'
    r = subprocess.run(["curl", "-sN", f"localhost:{server.port}/generate", "-d", body], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    lines = [json.loads(x) for x in r.stdout.splitlines()]
    blocks, last = lines[:-1], lines[-1]
    ref = llm.generate(HI, max_new_tokens=512)
    assert [b["block"] for b in blocks] == list(range(1, len(ref.block_forwards) + 1))  # one line per block
    assert last["blocks"] == len(blocks) and last["id"].startswith("gen-")
    _check_usage(last["usage"], sum(b["tokens"] for b in blocks))
    text = "".join(b["text"] for b in blocks) + last["text"]
    assert text == ref.text
    assert last["usage"]["generated_tokens"] == ref.generated_tokens and last["usage"]["forwards"] == ref.forwards
    assert last["finish_reason"] == ref.finish_reason
    assert f"{last['id']} done: {ref.generated_tokens} tokens" in server.log.read_text()  # per-request log line


def test_generate_prompt_and_decoder_overrides(server, llm, long_prompt):
    """``prompt`` is used as is; threshold / edit_threshold reach the decoder (same result as LLM.generate with
    those settings, and different forwards from the defaults)."""
    prompt = long_prompt
    base = server.request("POST", "/generate", {"prompt": prompt, "max_new_tokens": 64, "stream": False})[2]
    streamed = [json.loads(x) for x in list(stream_lines(server.port, "/generate",
                                                         {"prompt": prompt, "max_new_tokens": 64}))[1:]]
    assert "".join(x["text"] for x in streamed) == base["text"] and streamed[-1]["usage"]["forwards"] == \
        base["usage"]["forwards"]
    st, _, over = server.request("POST", "/generate", {"prompt": prompt, "max_new_tokens": 64, "stream": False,
                                                       "threshold": 0.99, "edit_threshold": 0.9})
    assert st == 200
    dec = {**llm.default_decoder().to_dict(), "threshold": 0.99, "edit_threshold": 0.9}
    ref = llm.generate(prompt, decoder=dec, max_new_tokens=64)
    assert over["text"] == ref.text and over["usage"]["forwards"] == ref.forwards
    assert base["usage"]["forwards"] != over["usage"]["forwards"]
    assert base["text"] == llm.generate(prompt, max_new_tokens=64).text


def test_openai_chat_plain_and_streamed(client, llm, long_messages):
    msgs = long_messages  # ≥ 128 tokens before any EOS: several blocks to stream
    name = client.models.list().data[0].id
    r = client.chat.completions.create(model=name, messages=msgs, max_tokens=96)
    ref = llm.generate(msgs, max_new_tokens=96)
    assert r.object == "chat.completion" and r.choices[0].message.role == "assistant"
    assert r.choices[0].message.content == ref.text
    assert r.choices[0].finish_reason == ("stop" if ref.finish_reason == "eos" else "length")
    u = r.usage
    assert (u.prompt_tokens, u.completion_tokens) == (ref.prompt_tokens, ref.generated_tokens)
    assert u.total_tokens == u.prompt_tokens + u.completion_tokens
    assert u.model_extra["forwards"] == ref.forwards and u.model_extra["tpf"] == pytest.approx(ref.tpf)

    chunks = list(client.chat.completions.create(model=name, messages=msgs, max_tokens=96, stream=True,
                                                 stream_options={"include_usage": True}))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == ref.text
    assert len([c for c in chunks if c.choices and c.choices[0].delta.content]) >= 2  # streamed per block
    fin = [c for c in chunks if c.choices and c.choices[0].finish_reason]
    assert len(fin) == 1 and fin[0].choices[0].finish_reason == r.choices[0].finish_reason
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == ref.generated_tokens


def test_openai_completions_and_stop_strings(client, llm, long_prompt):
    name = client.models.list().data[0].id
    prompt = long_prompt
    r = client.completions.create(model=name, prompt=prompt, max_tokens=80)
    ref = llm.generate(prompt, max_new_tokens=80)
    assert r.choices[0].text == ref.text and r.usage.completion_tokens == ref.generated_tokens
    # a stop string taken from the middle of the completion cuts it there (streamed and not)
    clean = [i for i in range(10, len(ref.text) - 3) if "\ufffd" not in ref.text[i:i + 3]]
    stop = ref.text[clean[0]:clean[0] + 3]
    want = ref.text[:ref.text.find(stop)]
    s = client.completions.create(model=name, prompt=prompt, max_tokens=80, stop=[stop, "never-seen"])
    assert s.choices[0].text == want and s.choices[0].finish_reason == "stop"
    parts = list(client.completions.create(model=name, prompt=prompt, max_tokens=80, stop=stop, stream=True))
    assert "".join(p.choices[0].text for p in parts if p.choices) == want
    assert parts[-1].choices[0].finish_reason == "stop"


BAD = [  # (body, status, field named in the error)
    (b"{not json", 400, None),
    (b"", 400, None),
    (b"[1, 2]", 400, None),
    (b'{"prompt": ' + b"[" * 50000 + b"]" * 50000 + b"}", 400, None),  # nested past Python's recursion limit: was 500
    (b'{"messages": [{"role": "user", "content": "x"}], "max_new_tokens": NaN}', 400, None),
    ({"messages": HI, "max_new_tokens": 0}, 400, "max_new_tokens"),
    ({"messages": HI, "max_new_tokens": -3}, 400, "max_new_tokens"),
    ({"messages": HI, "max_new_tokens": "64"}, 400, "max_new_tokens"),
    ({"messages": HI, "max_new_tokens": 10 ** 9}, 400, "max_new_tokens"),
    ({"messages": HI, "max_new_tokens": 8, "temprature": 0.5}, 400, "temprature"),
    ({"messages": [], "max_new_tokens": 8}, 400, "messages"),
    ({"messages": [{"role": "user"}], "max_new_tokens": 8}, 400, "messages.0.content"),
    ({"messages": [{"role": "robot", "content": "x"}]}, 400, "messages.0.role"),
    ({"messages": "hello"}, 400, "messages"),
    ({"max_new_tokens": 8}, 400, "messages"),
    ({"prompt": "", "max_new_tokens": 8}, 400, "prompt"),
    ({"prompt": "x", "max_new_tokens": 8, "threshold": 1.5}, 400, "threshold"),
    ({"prompt": "x", "max_new_tokens": 8, "edit_threshold": "high"}, 400, "edit_threshold"),
    ({"prompt": "x", "max_new_tokens": 8, "stream": "yes"}, 400, "stream"),
    ({"prompt": "x", "max_new_tokens": 8, "temperature": 3}, 400, "temperature"),  # capped at 2, as OpenAI's
    (b'{"prompt": "x", "max_new_tokens": 8, "temperature": 1e400}', 400, "temperature"),  # parses to infinity
    ({"prompt": "x", "max_new_tokens": 8, "seed": 10 ** 30}, 400, "seed"),
    ({"prompt": "x", "max_new_tokens": 8, "stop": ["ok", ""]}, 400, "stop"),
    ({"prompt": "x", "max_new_tokens": 8, "stop": ["y" * 257]}, 400, "stop"),
    # a lone surrogate escape parses in Python but is no text: was a 500 with two tracebacks in the log
    (b'{"prompt": "a\\ud800b", "max_new_tokens": 8}', 400, "prompt"),
    (b'{"messages": [{"role": "user", "content": "a\\udfffb"}], "max_new_tokens": 8}', 400, "messages.0.content"),
]


@pytest.mark.parametrize("body,status,field", BAD, ids=[str(i) for i in range(len(BAD))])
def test_generate_bad_input_is_4xx_naming_the_field(server, body, status, field):
    st, _, out = server.request("POST", "/generate", body)
    assert st == status, out
    err = out["error"]
    assert "Traceback" not in err["message"] and err["message"]
    if field is not None:
        assert err["param"] == field and field in err["message"]


def test_openai_bad_input_and_unsupported_options(server):
    name = server.health()["model"]
    cases = [("/v1/chat/completions", {"model": name, "messages": HI, "n": 2}, 400, "n"),
             ("/v1/chat/completions", {"model": name, "messages": HI, "top_p": 0.5}, 400, "top_p"),
             ("/v1/chat/completions", {"model": name, "messages": HI, "logprobs": True}, 400, "logprobs"),
             ("/v1/chat/completions", {"model": name, "messages": []}, 400, "messages"),
             ("/v1/chat/completions", {"model": name, "messages": HI, "max_tokens": 0}, 400, "max_tokens"),
             ("/v1/chat/completions", {"model": "gpt-4", "messages": HI}, 404, "model"),
             ("/v1/completions", {"model": name, "prompt": ["a", "b"]}, 400, "prompt"),
             ("/v1/completions", {"model": name, "prompt": "a", "echo": True}, 400, "echo"),
             ("/v1/completions", {"model": name}, 400, "prompt")]
    for path, body, status, field in cases:
        st, _, out = server.request("POST", path, body)
        assert st == status and out["error"]["param"] == field, (path, body, out)
    assert server.request("GET", "/nope")[0] == 404
    assert server.request("GET", "/generate")[0] == 405
    big = b'{"prompt": "' + b"a" * (2 << 20) + b'"}'
    st, _, out = server.request("POST", "/generate", big)
    assert st == 413 and "--max-body-bytes" in out["error"]["message"]
    # still serving, and nothing above reached the engine or failed in it
    h = server.health()
    assert h["status"] == "ok" and h["failed"] == 0
    assert server.request("POST", "/generate", {"prompt": "ok", "max_new_tokens": 4, "stream": False})[0] == 200
    assert "Traceback" not in server.log.read_text()


def test_sampling_temperature_and_seed_reach_the_engine(server, llm, long_prompt):
    body = {"prompt": long_prompt, "max_new_tokens": 40, "stream": False, "temperature": 0.8, "seed": 7}
    a = server.request("POST", "/generate", body)[2]
    ref = llm.generate(long_prompt, decoder={**llm.default_decoder().to_dict(), "temperature": 0.8},
                       max_new_tokens=40, seed=7)
    assert a["text"] == ref.text and a["usage"]["forwards"] == ref.forwards
    b = server.request("POST", "/generate", {**body, "seed": 8})[2]
    assert (a["text"], a["usage"]["forwards"]) != (b["text"], b["usage"]["forwards"])


def test_completions_max_tokens_null_is_the_default_16(server, long_prompt):
    """``"max_tokens": null`` on /v1/completions behaves as leaving it out (OpenAI's 16), not "until EOS"."""
    name = server.health()["model"]
    body = {"model": name, "prompt": long_prompt}
    st, _, null = server.request("POST", "/v1/completions", {**body, "max_tokens": None})
    absent = server.request("POST", "/v1/completions", body)[2]
    assert st == 200 and null["usage"]["completion_tokens"] == absent["usage"]["completion_tokens"] == 16
    assert null["choices"][0]["text"] == absent["choices"][0]["text"]
