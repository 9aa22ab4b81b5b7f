"""Hardened test code: returned objects cannot fake comparisons; honest solutions still pass.

In-process checks of ``strict_compare`` (the sandbox gives every program the same ``GLOBALS``), then the
real scorer on MBPP/HumanEval problems with faking solutions.
"""

import collections
import fractions

import numpy as np
import pytest

from repro.scoring import score_records
from repro.scoring.code.strict_compare import GLOBALS, harden

from scoring_util import WORKERS

FAKES = '''
class AlwaysEqInt(int):
    def __eq__(self, other): return True
    def __ne__(self, other): return False
    __hash__ = int.__hash__
class AlwaysEq:
    def __eq__(self, other): return True
    def __ne__(self, other): return False
    def __lt__(self, other): return True
    def __gt__(self, other): return True
    def __bool__(self): return True
    def __contains__(self, item): return True
class EqStr(str):
    def __eq__(self, other): return True
'''


def run(test_src: str, **values) -> None:
    """Execute hardened ``test_src`` as the sandbox would (fakes defined first, like candidate code)."""
    g = dict(GLOBALS)
    exec(compile(FAKES, "<candidate>", "exec"), g)
    g.update(values)
    exec(compile(harden(test_src), "<tests>", "exec"), g)


@pytest.mark.parametrize("test_src", [
    "assert AlwaysEqInt(0) == 40",
    "assert 40 == AlwaysEqInt(0)",
    "assert not (AlwaysEqInt(0) != 40)",
    "assert AlwaysEq() == [1, 2, 3]",
    "assert [1, 2, 3] == AlwaysEq()",
    "assert [AlwaysEqInt(5), 2] == [1, 2]",
    "assert {'a': AlwaysEqInt(1)} == {'a': 2}",
    "assert (EqStr('x'),) == ('abc',)",
    "assert AlwaysEq() in [1, 2]",
    "assert 3 in AlwaysEq()",
    "assert AlwaysEq() < 1e-6",
    "assert 0 < AlwaysEq() < 10",
    "assert AlwaysEq()",
    "assert not AlwaysEq()",
    "def check(candidate):\n    assert candidate(3) == 9\ncheck(lambda x: AlwaysEqInt(0))",
])
def test_faked_comparisons_fail(test_src):
    with pytest.raises((AssertionError, TypeError)):
        run(test_src)


@pytest.mark.parametrize("test_src", [
    "assert AlwaysEqInt(40) == 40 and AlwaysEqInt(1) != 2",  # a subclass is read as its base value
    "assert EqStr('abc') == 'abc'",
    "assert P(1, 2) == (1, 2)",
    "assert collections.OrderedDict(b=2, a=1) == {'a': 1, 'b': 2}",
    "assert collections.Counter('aab') == {'a': 2, 'b': 1}",
    "assert {3, 1, 2} == {1, 2, 3} and frozenset([1]) == {1}",
    "assert [[1, 2.0], (3,)] == [[1, 2], (3,)]",
    "assert np.float64(0.5) == 0.5 and np.int64(7) == 7 and np.bool_(True) == True",
    "assert fractions.Fraction(1, 2) == 0.5",
    "assert 1 < 2 <= 2 < 3 and not (3 < 2 < 1)",
    "assert 'b' in 'abc' and 2 in [1, 2] and 5 not in (1, 2) and None is None",
    "assert abs(2.0000001 - 2) < 1e-6",
    "assert range(3) == range(3) and list(range(3)) == [0, 1, 2]",
    "class Node:\n    def __init__(self, v): self.v = v\n    def __eq__(self, o): return self.v == o.v\nassert Node(1) == Node(1)",
    "x = []\nx.append(x)\nassert x != [1]",  # self-referential list: no recursion error
])
def test_honest_comparisons_pass(test_src):
    run(test_src, P=collections.namedtuple("P", "a b"), collections=collections, np=np, fractions=fractions)


def test_chain_is_lazy_and_unparseable_source_is_kept():
    calls = []
    run("assert not (f(1) > f(2) > f(3))", f=lambda v: calls.append(v) or v)
    assert calls == [1, 2]  # f(3) never evaluated: 1 > 2 is already false
    assert harden("def broken(:\n") == "def broken(:\n"


def test_scorer_rejects_faked_equality_and_keeps_honest_solutions(problems):
    mbpp = {p["source"]["task_id"]: p for p in problems("mbpp")}
    he = {p["id"]: p for p in problems("humaneval")}
    fence = "`" * 3
    cases = [  # (problem, completion, expected correct)
        (mbpp[17], "class N(int):\n    def __eq__(self, o):\n        return True\n\ndef square_perimeter(a):\n    return N(0)", False),
        (mbpp[17], "class N:\n    def __eq__(self, o):\n        return True\n\ndef square_perimeter(a):\n    return N()", False),
        (mbpp[17], "class N(int):\n    pass\n\ndef square_perimeter(a):\n    return N(4 * a)", True),
        (he["HumanEval/34"], f"{fence}python\nclass L(list):\n    def __eq__(self, o):\n        return True\n"
                             f"def unique(l: list):\n    return L()\n{fence}", False),
        (he["HumanEval/34"], f"{fence}python\nimport numpy as np\ndef unique(l: list):\n    return [int(v) for v in np.unique(l)]\n{fence}", True),
    ]
    for b in ("mbpp", "humaneval"):
        sel = [(dict(p, id=f"{p['id']}#{i}"), c, exp) for i, (p, c, exp) in enumerate(cases) if p["benchmark"] == b]
        scores = score_records(b, [p for p, _, _ in sel], {p["id"]: c for p, c, _ in sel}, WORKERS)
        assert [s["correct"] for s in scores] == [exp for _, _, exp in sel], [s["reason"] for s in scores]
