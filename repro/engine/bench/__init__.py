"""The engine's benchmarks, apart from the engine (``repro/engine/`` holds the engine; this package measures it).

One command, ``python -m repro.engine.bench NAME [options]`` (:mod:`.__main__`; ``--help`` lists every NAME):

* ``round`` / ``generate`` / ``decode`` / ``all``: one denoising round against its memory floor, a fixed-schedule
  generation, the engine's decode loop (:mod:`.rounds`; the 4-bit round :mod:`.w4`, the round's variants
  :mod:`.variants`, per-kernel tables :mod:`.profiling`);
* ``batch``: batched generation, throughput and batch invariance (:mod:`.batch`);
* ``graph-round``: the batched CUDA-graph round per number of request slots (:mod:`.graph_round`);
* ``slot-attention``: the batched round's attention and norms alone (:mod:`.slot_attention`);
* ``route``: the MoE router / route-select / tile table alone (:mod:`.route`);
* ``attention``: one block's QK-norm/RoPE/KV + attention, three launches vs the fused one (:mod:`.attention`);
* ``w4``: one MoE layer's 4-bit expert GEMMs per tile set (:mod:`.w4`);
* ``serve``: one streamed HTTP request vs ``LLM.generate`` (:mod:`.serve`; runs on the CPU too).

Each module also runs alone (``python -m repro.engine.bench.graph_round``). Imports go downward only:
:mod:`.common` (timing, environment) and :mod:`.cli` (arguments, JSON output) import no other benchmark module;
:mod:`.profiling` and :mod:`.w4` import those; :mod:`.variants` imports :mod:`.w4` and :mod:`.profiling`;
:mod:`.rounds` imports :mod:`.variants`; :mod:`.batch` imports :mod:`.rounds`; :mod:`.__main__` imports them all.
The benchmarks report figures and never assert targets (docs/perf.md has the figures and the commands).
"""

#: NAME -> (module of this package, what it measures): the benchmarks with a parser of their own, after the modes
#: of :func:`repro.engine.bench.rounds.build_parser` (``round``, ``generate``, ``decode``, ``all``, ``batch``)
COMMANDS = {
    "graph-round": ("graph_round", "the batched CUDA-graph round, per number of request slots"),
    "slot-attention": ("slot_attention", "the batched round's attention and norms alone"),
    "route": ("route", "the MoE router / route-select / tile table alone"),
    "attention": ("attention", "one block's QK-norm/RoPE/KV + attention: three launches vs the fused one"),
    "w4": ("w4", "one MoE layer's 4-bit (NVFP4) expert GEMMs per tile set vs the BF16 kernels"),
    "serve": ("serve", "one streamed HTTP /generate request vs LLM.generate (CUDA, or --device cpu)"),
}
