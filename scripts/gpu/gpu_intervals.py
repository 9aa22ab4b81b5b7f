"""Which GPU each generation job of a run held, and when: the check behind scripts/gpu/two_gpu_check.sh.

    python scripts/gpu/gpu_intervals.py --work WORK --suite SUITE [--samples APPS.csv --gpus GPUS.csv] \
        [--out SUMMARY.json] [--min-gpus 2]

Reads the grouped generation jobs' index files (``<WORK>/<SUITE>/generations/*/seed*/shard*of*.json``, written
by ``repro.backends.generation_job``: each job's claimed ``gpu``, ``pid`` and the interval it held the GPU,
``started_at`` after the claim to ``ended_at``), prints the intervals per GPU, and checks:

* no two jobs on one GPU at once (their intervals on that GPU do not overlap);
* at least one pair of jobs on different GPUs ran at once (``--min-gpus`` GPUs were used together);
* every job claimed a GPU.

``--samples``: lines ``<unix time>, <pid>, <gpu uuid>`` (``nvidia-smi --query-compute-apps=pid,gpu_uuid`` in a
loop, each line prefixed with its time) and ``--gpus``: lines ``<index>, <uuid>`` (``nvidia-smi
--query-gpu=index,uuid``). Samples whose pid is a job's are a second witness, from the driver: a job seen on
a GPU other than the one it claimed, or two jobs seen on one GPU in one sample, fail the check; the sample
in which most GPUs ran a job is reported. Samples that match no job pid (another pid namespace) are counted
and reported, not checked.

Exit status 0 when every check passes, 1 otherwise (each failure printed), 2 when no job index was found.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path


def load_jobs(work: Path, suite: str) -> list[dict]:
    """One dict per grouped job of the suite: model, shard, gpu, pid, start, end, benchmarks (sorted by start)."""
    jobs = []
    for idx in sorted((work / suite / "generations").glob("*/seed*/shard*of*.json")):
        d = json.loads(idx.read_text())
        j = d.get("job") or {}
        jobs.append({"index": str(idx), "model": d.get("model"), "shard": d.get("shard"), "gpu": j.get("gpu"),
                     "pid": j.get("pid"), "start": j.get("started_at"), "end": j.get("ended_at"),
                     "benchmarks": sorted(d.get("benchmarks") or {})})
    return sorted(jobs, key=lambda j: (j["start"] or 0))


def overlaps(a: dict, b: dict) -> bool:
    return a["start"] < b["end"] and b["start"] < a["end"]


def check(jobs: list[dict], min_gpus: int = 2) -> tuple[list[str], dict]:
    """(failures, facts) of the checks in the module docstring."""
    fails, facts = [], {}
    unclaimed = [j for j in jobs if j["gpu"] is None or j["start"] is None or j["end"] is None]
    if unclaimed:
        fails.append(f"{len(unclaimed)} job(s) claimed no GPU or recorded no interval: "
                     + ", ".join(j["index"] for j in unclaimed[:3]))
    timed = [j for j in jobs if j not in unclaimed]
    same = [(a, b) for i, a in enumerate(timed) for b in timed[i + 1:] if a["gpu"] == b["gpu"] and overlaps(a, b)]
    for a, b in same:
        fails.append(f"GPU {a['gpu']} oversubscribed: {a['model']} shard {a['shard']} and {b['model']} shard "
                     f"{b['shard']} held it at once")
    # the most GPUs busy at one moment: at each job's start, the GPUs of the jobs running then
    best = max(({k["gpu"] for k in timed if k["start"] <= j["start"] < k["end"]} for j in timed),
               key=len, default=set())
    facts["max_gpus_at_once"] = len(best)
    facts["gpus_used"] = sorted({str(j["gpu"]) for j in timed})
    pairs = [(a, b) for i, a in enumerate(timed) for b in timed[i + 1:] if a["gpu"] != b["gpu"] and overlaps(a, b)]
    facts["overlapping_pairs_on_different_gpus"] = len(pairs)
    if len(best) < min_gpus:
        fails.append(f"at most {len(best)} GPU(s) ran a job at one time; expected {min_gpus} jobs at once on "
                     f"different GPUs (is --resources gpu={min_gpus} given, and are there {min_gpus} GPUs?)")
    return fails, facts


def check_samples(jobs: list[dict], samples: Path, gpus: Path) -> tuple[list[str], dict]:
    """(failures, facts) from the driver's view (module docstring)."""
    uuid_to_index = {}
    for line in gpus.read_text().splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) >= 2:
            uuid_to_index[parts[1]] = parts[0]
    by_pid = {j["pid"]: j for j in jobs if j["pid"] is not None}
    seen = defaultdict(set)  # time -> {(gpu index, pid)}
    unmatched = 0
    for line in samples.read_text().splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) < 3 or not parts[1].isdigit():
            continue
        pid = int(parts[1])
        if pid not in by_pid:
            unmatched += 1
            continue
        seen[parts[0]].add((uuid_to_index.get(parts[2], parts[2]), parts[2], pid))
    fails = []
    for t, apps in sorted(seen.items()):
        per_gpu = defaultdict(set)
        for gpu, uuid, pid in apps:
            per_gpu[gpu].add(pid)
            claimed = str(by_pid[pid]["gpu"])
            if claimed not in (gpu, uuid):  # CUDA_VISIBLE_DEVICES names a GPU by index or by UUID
                fails.append(f"at {t}: job pid {pid} ran on GPU {gpu} but claimed GPU {claimed}")
        fails += [f"at {t}: GPU {g} ran jobs {sorted(p)} at once" for g, p in per_gpu.items() if len(p) > 1]
    most = max(seen.values(), key=lambda a: len({g for g, _, _ in a}), default=set())
    return fails, {"samples_matching_jobs": sum(len(a) for a in seen.values()), "samples_of_other_pids": unmatched,
                   "max_gpus_in_one_sample": len({g for g, _, _ in most})}


def report(jobs: list[dict]) -> str:
    """The intervals per GPU, seconds from the first job's start."""
    t0 = min((j["start"] for j in jobs if j["start"] is not None), default=0.0)
    lines = []
    for gpu in sorted({str(j["gpu"]) for j in jobs}):
        lines.append(f"GPU {gpu}:")
        for j in (j for j in jobs if str(j["gpu"]) == gpu):
            span = (f"{j['start'] - t0:7.2f} s .. {j['end'] - t0:7.2f} s" if j["start"] is not None and j["end"]
                    else "no interval recorded")
            lines.append(f"  {span}  {j['model']} shard {j['shard']} (pid {j['pid']}; {', '.join(j['benchmarks'])})")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work", required=True, type=Path)
    ap.add_argument("--suite", required=True)
    ap.add_argument("--samples", type=Path, help="nvidia-smi compute-app samples: time, pid, gpu uuid")
    ap.add_argument("--gpus", type=Path, help="nvidia-smi --query-gpu=index,uuid output")
    ap.add_argument("--min-gpus", type=int, default=2)
    ap.add_argument("--out", type=Path, help="write the summary here as JSON")
    a = ap.parse_args(argv)
    jobs = load_jobs(a.work, a.suite)
    if not jobs:
        print(f"error: no grouped generation job index under {a.work / a.suite / 'generations'} (did the suite run "
              "with group_benchmarks: true?)", file=sys.stderr)
        return 2
    print(report(jobs))
    fails, facts = check(jobs, a.min_gpus)
    if a.samples and a.gpus and a.samples.is_file() and a.gpus.is_file():
        f2, facts2 = check_samples(jobs, a.samples, a.gpus)
        fails += f2
        facts.update(facts2)
    facts.update(jobs=jobs, failures=fails, ok=not fails)
    print(f"{len(jobs)} jobs; GPUs used: {', '.join(facts['gpus_used'])}; most GPUs busy at once: "
          f"{facts['max_gpus_at_once']}; pairs of jobs overlapping on different GPUs: "
          f"{facts['overlapping_pairs_on_different_gpus']}"
          + (f"; driver samples matching a job: {facts['samples_matching_jobs']} (most GPUs in one sample: "
             f"{facts['max_gpus_in_one_sample']}; samples of other pids: {facts['samples_of_other_pids']})"
             if "samples_matching_jobs" in facts else ""))
    for f in fails:
        print(f"FAIL: {f}")
    print("OK: two jobs ran at once on different GPUs, never two on one GPU" if not fails else "CHECK FAILED")
    if a.out:
        a.out.write_text(json.dumps(facts, indent=1) + "\n")
    return 0 if not fails else 1


if __name__ == "__main__":
    sys.exit(main())
