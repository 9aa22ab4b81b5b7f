"""Where each stage writes, relative to the work directory — one place, used by the Snakefile and tools.

    hf/<model>/                                  checkpoint (downloaded, local copy, or tiny)
    verified/<model>.json                        verification stamp (manifest hash)
    sources/<model>.json                         what the checkpoint is (source key): rewritten only when
                                                 the source changes; the rules reading the checkpoint
                                                 take it as input (the folder and stamp as ancient())
    dequantized/<model>/                         an NVFP4 checkpoint dequantized to BF16 (SGLang backend only;
                                                 repro.checkpoint.dequantize), with its own manifest
    verified/dequantized/<model>.json            its verification stamp
    sources/dequantized/<model>.json             what it is made from (source key + dequantize code + dtype)
    <suite>/plan.json                            the cells and shard files a run generates, written at its start
                                                 (repro.status: progress counts every planned cell)
    <suite>/problems/<bench>.jsonl               normalized problems (+ .meta.json): scoring, tables
    <suite>/problems/<bench>.for-generation.jsonl the same, as generation reads them: re-prepared only when
                                                 a rendered prompt changes (a gold fix re-scores, no more)
    <suite>/decoders/<model>/<bench>/seed<S>.yaml rendered decoder config
    <suite>/generations/<model>/<bench>/seed<S>/shard<K>of<N>.jsonl
    <suite>/generations/<model>/<bench>/seed<S>.jsonl   merged shards (+ .meta.json)
    <suite>/generations/<model>/seed<S>/shard<K>of<N>.json       grouped job (suite `group_benchmarks`): its
                                                 index, the only output Snakemake sees
    <suite>/generations/<model>/seed<S>/shard<K>of<N>/<bench>.jsonl  a grouped job's shard of one benchmark
                                                 (+ .meta.json), kept across reruns of the job
    <suite>/scores/<model>/<bench>/seed<S>.jsonl        per-sample verdicts (+ .summary.json)
    <suite>/speed/<model>/<bench>.jsonl          speed probe (suites generated batched): the first problems run
                                                 one request at a time (+ .meta.json), read by the speed table
    results/<suite>/main_table.{md,tex,csv}, provenance.json   (in the checkout, not the work dir)
"""

CHECKPOINT = "hf/{model}"
VERIFIED = "verified/{model}.json"
CHECKPOINT_SOURCE = "sources/{model}.json"
DEQUANTIZED = "dequantized/{model}"
DEQUANTIZED_VERIFIED = "verified/dequantized/{model}.json"
DEQUANTIZED_SOURCE = "sources/dequantized/{model}.json"
PLAN = "{suite}/plan.json"
PROBLEMS = "{suite}/problems/{bench}.jsonl"
GENERATION_PROBLEMS = "{suite}/problems/{bench}.for-generation.jsonl"
DECODER = "{suite}/decoders/{model}/{bench}/seed{seed}.yaml"
SHARD = "{suite}/generations/{model}/{bench}/seed{seed}/shard{shard}of{nshards}.jsonl"
GENERATIONS = "{suite}/generations/{model}/{bench}/seed{seed}.jsonl"
GROUP = "{suite}/generations/{model}/seed{seed}/shard{shard}of{nshards}.json"
GROUP_SHARD = "{suite}/generations/{model}/seed{seed}/shard{shard}of{nshards}/{bench}.jsonl"  # GROUP without .json
SCORES = "{suite}/scores/{model}/{bench}/seed{seed}.jsonl"
SUMMARY = "{suite}/scores/{model}/{bench}/seed{seed}.summary.json"
# verdicts a second, independent grader gives differently (repro/scoring/second_grader.py)
DISAGREEMENTS = "{suite}/scores/{model}/{bench}/seed{seed}.disagreements.json"
SPEED_PROBE = "{suite}/speed/{model}/{bench}.jsonl"
SPEED_SUBSET = 32  # problems (first in problem order) a speed probe runs; repro.tables.speed.SUBSET
