"""MATH-500 answer normalisation before Math-Verify, and the checks Math-Verify's parse must pass.

Contract (pure string/sympy helpers, no I/O; ``math.equivalent`` calls them inside the worker process):
- ``plain_to_latex(s) -> str``: plain-text maths a model writes inside a box, rewritten to the LaTeX
  Math-Verify reads: ``pi`` -> ``\\pi``, ``sqrt`` / ``sin`` / ``log`` ... -> ``\\sqrt`` / ``\\sin`` / ...,
  ``infinity`` -> ``\\infty``, ``\\mathrm{e}`` -> ``e``, ``\\operatorname{sin}`` -> ``\\sin``, a number in a wrapper
  (``\\mathbf{88.55}``, ``\\textbf{6}``: Math-Verify reads it as text) -> the number, ``+ -`` -> ``-``,
  ``14.0`` -> ``14`` (a decimal with only zeros after the point is that integer), ``1i`` -> ``1 i``. Value-preserving only.
- ``mc_letter(s) -> str | None``: the option letter of a multiple-choice answer (``(C)``,
  ``\\text{C: Plane}``, ``C. Plane``), None when the text does not start with a lone letter.
- ``unit_of(s) -> str | None``: the canonical unit named by a trailing unit word (``5.4 \\text{ cents}``
  -> ``cent``), None when none or an unknown word.
- ``accounts_for(src, parsed) -> bool``: whether a Math-Verify parse (``[expr, matched string]``) read
  the whole of ``src``: no LaTeX command it cannot read, no cut-off match, and every letter outside
  LaTeX command names (and outside a trailing unit) appears in the parsed expression.

Sources: scoring cases t3-math500-01 (Math-Verify PR #82: ``\\mathrm{e}`` unreadable, only the ``1`` of
``1 - \\frac{1}{\\mathrm{e}}`` survives the parse), t3-math500-04 (scitix/sieval PR #68: unescaped ``pi``
is read ``p*i``), t3-math500-05 (Math-Verify #69: ``14.0 + -1.0i`` vs ``14 - i``), t3-math500-09/10
(NVIDIA-NeMo/Gym PR #1844: a leading option letter is the answer, bare option text is not),
t3-math500-15 (a contradicting unit word is wrong, a missing one is not); docs/scoring_rules.md §3.
"""

from __future__ import annotations

import re

from . import fixes

__all__ = ["plain_to_latex", "mc_letter", "unit_of", "contradicts", "accounts_for", "strip_unit"]

_FUNCS = ("arcsin", "arccos", "arctan", "sinh", "cosh", "tanh", "sin", "cos", "tan", "cot", "sec", "csc",
          "log", "ln", "exp", "sqrt")
_PLAIN_FUNC = re.compile(r"(?<![\\A-Za-z])(" + "|".join(_FUNCS) + r")(?![A-Za-z])")
_PLAIN_PI = re.compile(r"(?<![\\A-Za-z])pi(?![A-Za-z])")
_PLAIN_INF = re.compile(r"(?<![\\A-Za-z])(?:infinity|infty|inf)(?![A-Za-z])")
_WRAPPED_FUNC = re.compile(r"\\(?:operatorname|mathrm|text|textrm)\s*\{\s*(" + "|".join(_FUNCS) + r")\s*\}")
_WRAPPED_CONST = re.compile(r"\\(?:mathrm|text|textrm|mathit|rm)\s*\{\s*([ei])\s*\}")
_WRAPPED_NUMBER = re.compile(r"\\(?:textbf|mathbf|boldsymbol|bm|text|textrm|mathrm|mbox|mathit)\s*\{\s*(-?\d[\d.,]*)\s*\}")
_PLUS_MINUS = re.compile(r"\+\s*-")
_ZERO_DECIMAL = re.compile(r"(?<![\d.])(\d+)\.0+(?![\d.])")
_DIGIT_I = re.compile(r"(?<=\d)[ij](?![A-Za-z])")  # "1i": Math-Verify 0.9.0 misreads it; "1.0j": Python's i
_BOLD = re.compile(r"^\s*\*\*(.*)\*\*\s*$", re.DOTALL)  # markdown bold around the whole answer
_TEXT_SPANS = re.compile(r"\\(?:text|mbox|textrm|textbf|textit)\s*\{[^{}]*\}")


def _outside_text(s: str, fn) -> str:
    """Apply ``fn`` to the parts of ``s`` outside ``\\text{...}`` groups (words there are prose)."""
    out, i = [], 0
    for m in _TEXT_SPANS.finditer(s):
        out.append(fn(s[i:m.start()]))
        out.append(m.group(0))
        i = m.end()
    out.append(fn(s[i:]))
    return "".join(out)


def _plain(part: str) -> str:
    part = _PLAIN_PI.sub(r"\\pi ", part)
    part = _PLAIN_INF.sub(r"\\infty ", part)
    return _PLAIN_FUNC.sub(r"\\\1", part)


def plain_to_latex(s: str) -> str:
    """See module docstring; ``\\pm`` / ``\\mp`` are left alone (``+ -`` with a space only)."""
    s = _BOLD.sub(r"\1", s)
    s = _WRAPPED_FUNC.sub(r"\\\1 ", s)
    s = _WRAPPED_CONST.sub(r"\1", s)
    s = _WRAPPED_NUMBER.sub(r"\1", s)
    s = _outside_text(s, _plain)
    s = _PLUS_MINUS.sub("-", s)
    s = _ZERO_DECIMAL.sub(r"\1", s)
    return _DIGIT_I.sub(" i", s)


# --- multiple choice ----------------------------------------------------------------------------------
_MC = re.compile(r"^\s*(?:(?:[Oo]ption|[Cc]hoice|[Aa]nswer)\s*:?\s*)?(?:\\(?:text|textbf|mathrm|mathbf)\s*\{\s*)?(?:\\?\(\s*)?([A-Ea-e])\s*(?:\\?\))?\s*(?:[:.)]\s*[^{}]*)?\}?\s*$")
_MC_GOLD = re.compile(r"^\s*(?:\\text(?:bf)?\s*\{\s*)?\(\s*([A-E])\s*\)\s*\}?\s*$|^\s*(?:\\text(?:bf)?\s*\{\s*)?([A-E])\s*\}?\s*$")


def mc_letter(s: str, gold: bool = False) -> str | None:
    """Option letter (upper case) of a multiple-choice answer; ``gold=True`` accepts only a bare letter
    or ``(C)`` (a gold is never followed by option text). Bare option text (``\\text{Plane}``) -> None:
    the letter is what MATH asks for (case t3-math500-10)."""
    m = (_MC_GOLD if gold else _MC).match(s)
    if not m:
        return None
    letter = next(g for g in m.groups() if g)
    return letter.upper()


# --- units --------------------------------------------------------------------------------------------
_UNITS = {
    "cent": ("cent", "cents", "c", "\u00a2"), "dollar": ("dollar", "dollars", "usd"),
    "euro": ("euro", "euros"), "pound": ("pound", "pounds", "lb", "lbs"),
    "mm": ("mm", "millimeter", "millimeters", "millimetre", "millimetres"),
    "cm": ("cm", "centimeter", "centimeters", "centimetre", "centimetres"),
    "m": ("m", "meter", "meters", "metre", "metres"), "km": ("km", "kilometer", "kilometers"),
    "inch": ("in", "inch", "inches"), "foot": ("ft", "foot", "feet"), "yard": ("yd", "yard", "yards"),
    "mile": ("mi", "mile", "miles"), "second": ("s", "sec", "second", "seconds"),
    "minute": ("min", "minute", "minutes"), "hour": ("h", "hr", "hour", "hours"), "day": ("day", "days"),
    "week": ("week", "weeks"), "mph": ("mph", "miles per hour", "mi/h"), "year": ("year", "years"), "gram": ("g", "gram", "grams"),
    "kg": ("kg", "kilogram", "kilograms"), "ounce": ("oz", "ounce", "ounces"),
    "degree": ("degree", "degrees", "\\circ", "^\\circ"), "radian": ("rad", "radian", "radians"),
    "liter": ("l", "liter", "liters", "litre", "litres"), "ml": ("ml", "milliliter", "milliliters"),
}
_UNIT_OF = {w: canon for canon, words in _UNITS.items() for w in words}
_TRAILING_UNIT = re.compile(r"(?<=[\d}\s])\s*\\(?:text|mbox|textrm|mathrm)\s*\{\s*([^{}]*?)\s*\}\s*(?:\^\s*\{?\d\}?)?\s*$")
_CONSTANT_LETTERS = ("e", "i")  # \mathrm{e}, \text{i}: Euler's number, the imaginary unit
_TRAILING_WORD = re.compile(r"(?<=\d)\s+([A-Za-z]+)\s*$")


def unit_of(s: str) -> str | None:
    """Canonical unit of a trailing unit word (``\\text{ cents}``, ``\\mbox{cm}``, ``5 dollars``) or of a leading
    dollar sign (``\\$5.40``), else None. ``square``/``cubic`` prefixes are kept apart (``square cm`` is not
    ``cm``). A word outside the unit table is returned as ``"word:<singular>"`` (``4000 \\text{ bananas}``), so
    two different words contradict; a table unit and an unknown word never do (``contradicts``)."""
    m = _TRAILING_UNIT.search(s) or _TRAILING_WORD.search(s)
    if not m:
        return "dollar" if re.match(r"^\s*-?\s*\\?\$\s*\d", s) else None
    words = m.group(1).lower().replace(".", "").split()
    if not words or len(words) > 3:
        return None
    prefix = ""
    if words[0] in ("square", "sq", "cubic") and len(words) > 1:
        prefix, words = words[0].replace("sq", "square") + " ", words[1:]
    name = " ".join(words)
    canon = _UNIT_OF.get(name)
    if canon is not None:
        return prefix + canon
    if name in ("unit", "units") or not re.fullmatch(r"[a-z]{2,}", name):
        return None
    return "word:" + prefix + (name[:-1] if name.endswith("s") and len(name) > 3 else name)


def contradicts(gold_unit: str | None, pred_unit: str | None) -> bool:
    """Both sides name a unit and they differ; a table unit against an unknown word does not count."""
    if not gold_unit or not pred_unit or gold_unit == pred_unit:
        return False
    return gold_unit.startswith("word:") == pred_unit.startswith("word:")


def strip_unit(s: str) -> str:
    """``s`` without a trailing ``\\text{...}`` unit, or without a trailing plain unit word after a number
    (``5.4 cents``: Math-Verify would read ``5.4*c*e*n*t*s``). ``\\mathrm{e}`` / ``\\mathrm{i}`` after a number
    are the constants e and i, never a unit: ``3\\mathrm{e}`` is not 3 (turn-4 kind, docs/scoring_rules.md §3)."""
    m = _TRAILING_UNIT.search(s)
    if m and not (m.group(1).strip() in _CONSTANT_LETTERS and fixes.on("math_roman_constant")):
        s = s[:m.start()]
    m = _TRAILING_WORD.search(s)
    if m and unit_of(s) is not None:
        s = s[:m.start()]
    return s


# --- whole-answer accounting --------------------------------------------------------------------------
_CMD = re.compile(r"\\([A-Za-z]+)")
_DEGREE = re.compile(r"\^\s*\{?\s*\\circ\s*\}?")
# LaTeX commands latex2sympy (Math-Verify 0.9.0) reads, or that carry no value (spacing, wrappers whose
# content is checked by the letter rule). Any other command (``\\operatorname{cis}``, ``\\foo``) may be
# dropped by the parse with only a number around it surviving.
KNOWN_COMMANDS = frozenset("""
frac dfrac tfrac cfrac sqrt pi infty circ cdot times div pm mp le leq ge geq ne neq lt gt left right
text textbf textit textrm textnormal mbox mathbf mathrm mathit mathsf bold boldsymbol displaystyle
sin cos tan cot sec csc arcsin arccos arctan sinh cosh tanh log ln exp lg binom dbinom tbinom choose
cup cap emptyset varnothing in notin subset subseteq setminus mathbb alpha beta gamma delta epsilon
varepsilon zeta eta theta vartheta iota kappa lambda mu nu xi rho sigma tau upsilon phi varphi chi psi
omega Gamma Delta Theta Lambda Xi Pi Sigma Phi Psi Omega ldots dots cdots dotsb dotsc dotsm quad qquad
begin end pmatrix bmatrix matrix array cases overline angle mid gcd lcm max min lfloor rfloor lceil
rceil vert lvert rvert approx equiv to rightarrow prime hline circ degree
""".split())


def accounts_for(src: str, parsed: list) -> bool:
    """True when Math-Verify's ``parsed = [expr, matched]`` read the whole of ``src`` (the prepared text):
    the matched string is not a cut-off prefix, ``src`` has no LaTeX command outside ``KNOWN_COMMANDS``,
    and every letter outside command names (a trailing unit aside) appears in the parsed expression. A
    parse that dropped part of the answer (``1 - \\frac{1}{\\mathrm{E}}`` read as ``1``,
    ``2\\operatorname{cis}(3)`` read as ``2``) must not decide "equal" alone (Math-Verify PR #82)."""
    if len(parsed) < 2 or not isinstance(parsed[1], str):
        return False
    core = _DEGREE.sub("", strip_unit(src.strip().strip("$")))
    core = re.sub(r"\\(?:begin|end)\s*\{[A-Za-z*]*\}", " ", core)  # environment names are not letters
    if any(name not in KNOWN_COMMANDS for name in _CMD.findall(core)):
        return False
    squeeze = lambda t: re.sub(r"\s", "", t)
    matched = squeeze(parsed[1])
    if len(matched) < len(squeeze(core)) and squeeze(core).startswith(matched):
        return False
    letters = set(_CMD.sub(" ", core).lower()) & set("abcdefghijklmnopqrstuvwxyz")
    return letters <= set(str(parsed[0]).lower())
