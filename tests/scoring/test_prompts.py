"""repro.prompts: one versioned template per benchmark, rendered for every real record."""

import json

import pytest

from repro import benchmarks
from repro.prompts import Prompt, build_prompt, template_version


@pytest.mark.parametrize("benchmark", benchmarks.names())
def test_every_real_record_renders(benchmark, data):
    lines = (data / benchmarks.get(benchmark).file).read_text().splitlines()
    for line in lines:
        p = build_prompt(benchmark, json.loads(line))
        assert isinstance(p, Prompt)
        assert len(p.messages) == 1 and p.messages[0]["role"] == "user"
        assert p.messages[0]["content"].strip()
        assert "<|endoftext|>" in p.stop
        assert p.template_version == template_version(benchmark)
    assert template_version(benchmark).startswith(f"{benchmark}/v1+")


def test_prompt_contents(problems):
    gsm = build_prompt("gsm8k", problems("gsm8k")[0]["source"]).messages[0]["content"]
    assert gsm.startswith("Janet\u2019s ducks") and gsm.endswith("within \\boxed{}.")
    he = problems("humaneval")[0]["source"]
    assert build_prompt("humaneval", he).messages[0]["content"] == "Complete the following python code:\n" + he["prompt"]
    mb = problems("mbpp")[0]["source"]
    text = build_prompt("mbpp", mb).messages[0]["content"]
    assert all(t in text for t in mb["test_list"]), "all three asserts are shown"
    assert "```python" in text
    assert "[DONE]" in build_prompt("mbpp", mb).stop
    assert "\nQuestion:" in build_prompt("gsm8k", problems("gsm8k")[0]["source"]).stop


def test_bad_input_is_named():
    with pytest.raises(ValueError, match="unknown benchmark 'gsm9k'"):
        build_prompt("gsm9k", {})
    with pytest.raises(ValueError, match=r"lacks field\(s\) \['question'\]"):
        build_prompt("gsm8k", {"answer": "#### 1"})
