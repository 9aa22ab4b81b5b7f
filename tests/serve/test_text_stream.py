"""TextStream: the per-block text the server streams — EOS cut, stop strings across block edges, UTF-8
characters split between blocks — always concatenating to the final text, on the tiny checkpoint's real
byte-level tokenizer."""

from __future__ import annotations

import pytest

from repro.engine.serve.worker import TextStream
from repro.engine.tokenizer import ChatTokenizer


@pytest.fixture(scope="module")
def tok(serve_tiny_dir):
    return ChatTokenizer(serve_tiny_dir)


def _blocks(ids, size):
    return [ids[i:i + size] for i in range(0, len(ids), size)]


def _run(tok, text_or_ids, size, stop=None):
    ids = tok.encode(text_or_ids) if isinstance(text_or_ids, str) else text_or_ids
    s = TextStream(tok.decode, tok.eos_id, stop)
    pieces = []
    for b in _blocks(ids, size):
        pieces.append(s.push(b))
        if s.stopped or s.eos:
            break
    pieces.append(s.finish())
    return s, pieces


@pytest.mark.parametrize("size", [1, 2, 3, 5, 32])
def test_multibyte_characters_split_across_blocks(tok, size):
    text = "naïve café — 数学 ✓ emoji 🙂 end"
    s, pieces = _run(tok, text, size)
    assert "".join(pieces) == text == s.text
    assert all("\ufffd" not in p for p in pieces)  # an incomplete character is held back, never sent broken


def test_eos_cuts_and_stop_string_across_block_edge(tok):
    ids = tok.encode("The answer is 42.") + [tok.eos_id] + tok.encode("garbage")
    s, pieces = _run(tok, ids, 4)
    assert "".join(pieces) == "The answer is 42." and s.eos and not s.stopped
    s, pieces = _run(tok, "Answer: 7\nQuestion: next one", 3, stop=["Question:", "</s>"])
    assert "".join(pieces) == "Answer: 7\n" and s.stopped
    assert not any("Q" in p for p in pieces)  # the stop string's start was held back, not streamed
    s, pieces = _run(tok, "no stop here, only Quest", 4, stop=["Question:"])
    assert "".join(pieces) == "no stop here, only Quest" and not s.stopped  # held-back prefix flushed at end


def test_invalid_bytes_are_flushed_at_the_end(tok):
    ids = tok.encode("ok ") + [0xE2, 0x82]  # a truncated 3-byte character at the very end
    s, pieces = _run(tok, ids, 2)
    assert "".join(pieces) == tok.decode(ids) and pieces[-1].endswith("\ufffd")


def test_stop_strings_match_settled_text_only(tok):
    """A character split across blocks decodes to U+FFFD until its last byte arrives: a stop string must not
    match that provisional character."""
    s = TextStream(tok.decode, tok.eos_id, ["\ufffd"])
    first = s.push(tok.encode("ab") + [0xE2, 0x82])
    second = s.push([0xAC] + tok.encode("cd"))
    assert (first, second + s.finish()) == ("ab", "€cd") and not s.stopped
