"""The engine's streaming hook (``on_block`` of ``generate_ids`` / ``LLM.generate``): one call per committed
block whose ids concatenate to the decoded positions, and a True return stops decoding after that block."""

from __future__ import annotations


def test_on_block_sees_every_block_and_can_stop(tiny_llm, long_messages):
    llm, msgs = tiny_llm, long_messages  # ≥ 128 tokens before any EOS
    ref = llm.generate(msgs, max_new_tokens=100)
    seen: list[list[int]] = []
    out = llm.generate(msgs, max_new_tokens=100, on_block=lambda ids: seen.append(ids) and False)
    assert sum(seen, []) == ref.raw_token_ids == out.raw_token_ids
    assert len(seen) == len(ref.block_forwards) and out.finish_reason == ref.finish_reason == "length"
    assert len(seen[-1]) < 32  # the budget ends mid-block: the hook gets only the ids within max_new_tokens
    stopped: list[list[int]] = []
    cut = llm.generate(msgs, max_new_tokens=100, on_block=lambda ids: stopped.append(ids) or len(stopped) == 2)
    assert cut.finish_reason == "stop" and len(stopped) == 2
    assert cut.token_ids == sum(seen[:2], []) and cut.forwards["denoise"] < ref.forwards["denoise"]
