"""The protocol loop of the scoring worker processes (``repro.scoring.graders.worker`` runs it; started by
:class:`repro.scoring.verify_worker.VerifyPool`, never by hand).

Protocol: after ``prepare()`` it writes ``{"ready": true}``; then for each stdin line one stdout line, the
``answer`` to it, or ``{"status": "error", "equal": false, "detail": "<exception>", ...}`` when answering raised
(the worker keeps serving). Library output goes to stderr so it cannot corrupt the protocol stream. The hard
timeout is the pool's: it kills this process.
"""

from __future__ import annotations

import json
import sys


def serve_loop(answer, prepare=lambda: None) -> None:
    """The protocol loop shared by the worker processes: quiet logging and warnings, ``prepare()`` (imports paid
    before "ready"), ``{"ready": true}``, then ``answer(request) -> dict`` per stdin line, one JSON line out; an
    exception becomes ``{"status": "error", "equal": false, "detail"}`` and the loop goes on."""
    import logging
    import warnings

    warnings.filterwarnings("ignore")
    logging.disable(logging.CRITICAL)
    prepare()
    out = sys.stdout
    sys.stdout = sys.stderr  # stray library prints must not corrupt the protocol stream
    out.write('{"ready": true}\n')
    out.flush()
    for line in sys.stdin:
        req = json.loads(line)
        try:
            ans = answer(req)
        except Exception as exc:  # report, keep serving
            ans = {"status": "error", "equal": False, "detail": f"{type(exc).__name__}: {exc}"[:500],
                   "gold_parsed": None, "pred_parsed": None}
        out.write(json.dumps(ans) + "\n")
        out.flush()
