# Content-keyed intermediate files: their content, not their mtime, decides whether the jobs reading them re-run.
#
# Snakemake re-runs a job when an input is newer than its outputs, and only consults its own records (params,
# input checksums) for paths it has seen before. A work directory copied without its mtimes (`cp -r`, rsync
# without -t) gets new, arbitrarily ordered mtimes at new paths: every decoder YAML or problem file that lands
# later than a shard made from it would regenerate that shard (hours of GPU on the paper suite), although not a
# byte changed. The same holds for a `touch`.
#
# So these files -- the checkpoint source keys (sources/), the decoder YAMLs, both problem copies -- carry a
# fixed mtime, 1970-01-01 (PINNED_MTIME_NS), once their content is known to be what the jobs reading them used:
# never newer than any output, they re-run nothing by date. What re-runs those jobs is a change of content:
#   * a job that writes one of them re-runs (its params: decoder settings, rendered prompts, data sha256,
#     code version, checkpoint source...): Snakemake re-runs every job reading the file in the same run;
#   * a file edited by hand, or otherwise changed in place: its new mtime is left as it is (newer than the
#     outputs made from it), so those jobs re-run by date, as before.
# At start-up (before the DAG is built) and after a successful run every such file is hashed (they are small)
# and checked against what the jobs reading it recorded -- a shard's or speed probe's `decoder_sha256` /
# `problems_sha256` (.meta.json), the source key the config gives now; a file no output reads yet is confirmed.
# A confirmed file gets the pinned mtime; a pinned file that is no longer confirmed (its content changed with
# its mtime kept: `cp -p`, `rsync -a`, `tar x` of another one) gets the current time back, so the jobs made from
# the old content re-run by date. Only the consumers' own records decide: no registry of past pins, which a
# failed run or a reverted edit could leave out of step with the shards. A dry run changes no mtime: it says how
# many files a real run would pin or un-pin.
import hashlib
import types
from glob import glob

PINNED_MTIME_NS = 0


def _file_sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _recorded(metas, field, sha):
    """Whether every consumer record agrees that ``field`` was ``sha``: ``metas`` are the paths of the consumer
    outputs (each with its ``.meta.json``); an output without a readable meta confirms nothing."""
    for out in metas:
        try:
            meta = json.loads(Path(f"{out}.meta.json").read_text())
        except (OSError, ValueError):
            return False
        if meta.get(field) != sha:
            return False
    return True


def _generation_outputs(suite, bench, model="*", seed="*"):
    """Outputs of the jobs that read a decoder / generation problems file of ``bench``: per-benchmark shards,
    grouped jobs' per-benchmark shards, speed probes (``model``/``seed`` narrow them; a speed probe has no seed
    in its path and records the one it ran)."""
    shards = (glob(W(f"{suite}/generations/{model}/{bench}/seed{seed}/shard*of*.jsonl"))
              + glob(W(f"{suite}/generations/{model}/seed{seed}/shard*of*/{bench}.jsonl")))
    return ([p for p in shards if ".partial." not in os.path.basename(p)]  # a killed job's resume file: no meta
            + [p for p in glob(W(f"{suite}/speed/{model}/{bench}.jsonl")) if seed == "*" or _meta_seed(p) == seed])


def _meta_seed(out):
    try:
        return str(json.loads(Path(f"{out}.meta.json").read_text()).get("seed"))
    except (OSError, ValueError):
        return None


def _content_keyed_files():
    """``(path, confirm)`` for every content-keyed file in the work directory; ``confirm(sha256)`` says whether
    the jobs reading it used that content (module comment)."""
    for path in glob(W("sources/*.json")) + glob(W("sources/dequantized/*.json")):
        model = Path(path).stem
        if model not in config["models"]:
            continue
        key = dequantized_key if "/sources/dequantized/" in path else checkpoint_content_key
        text = key(types.SimpleNamespace(model=model)) + "\n"
        yield path, lambda sha, text=text: sha == hashlib.sha256(text.encode()).hexdigest()
    for path in glob(W("*/decoders/*/*/seed*.yaml")):
        rel = Path(path).relative_to(WORK).parts  # suite, "decoders", model, bench, seed<S>.yaml
        suite, model, bench, seed = rel[0], rel[2], rel[3], rel[4][len("seed"):-len(".yaml")]
        outs = _generation_outputs(suite, bench, model, seed)
        yield path, lambda sha, outs=outs: _recorded(outs, "decoder_sha256", sha)
    for path in glob(W("*/problems/*.for-generation.jsonl")):
        suite, bench = Path(path).relative_to(WORK).parts[0], Path(path).name.split(".")[0]
        outs = _generation_outputs(suite, bench)
        yield path, lambda sha, outs=outs: _recorded(outs, "problems_sha256", sha)
    for path in glob(W("*/problems/*.jsonl")):
        if path.endswith(".for-generation.jsonl"):
            continue
        suite, bench = Path(path).relative_to(WORK).parts[0], Path(path).name.split(".")[0]
        # scores record no problems sha256: confirmed when every score made from it is newer than it
        scores = glob(W(f"{suite}/scores/*/{bench}/seed*.jsonl"))
        mtime = os.stat(path).st_mtime_ns
        yield path, lambda sha, scores=scores, mtime=mtime: all(os.stat(s).st_mtime_ns >= mtime for s in scores)


def pin_content_keyed_mtimes():
    """Pin every content-keyed file whose content the jobs reading it recorded, and un-pin a pinned one whose
    content they did not (module comment); a dry run only counts. Returns ``(pinned, unpinned)``: the files
    given the pinned mtime and those given the current time back (in a dry run: that a real run would)."""
    pinned, unpinned = 0, []
    for path, confirm in _content_keyed_files():
        st = os.stat(path)
        ok = confirm(_file_sha256(path))
        if ok and st.st_mtime_ns != PINNED_MTIME_NS:
            pinned += 1
            if not DRY_RUN:
                os.utime(path, ns=(st.st_atime_ns, PINNED_MTIME_NS))
        elif not ok and st.st_mtime_ns == PINNED_MTIME_NS:
            unpinned.append(path)  # changed with its mtime kept: the jobs made from the old content re-run by date
            if not DRY_RUN:
                os.utime(path)
    if unpinned:
        what = "a real run re-runs" if DRY_RUN else "re-running"
        print(f"note: {len(unpinned)} decoder / problem / source-key file(s) changed with their fixed mtime kept "
              f"(e.g. {unpinned[0]}): not what the jobs reading them recorded; {what} those jobs", file=sys.stderr)
    if pinned and DRY_RUN:
        print(f"note: {NO_RUN}: {pinned} decoder / problem / source-key file(s) under {WORK} have new mtimes but the "
              "content the jobs reading them used (a copied or touched work directory); a real run gives them back "
              "their fixed mtime, so jobs listed here only for them ('Updated input files') do not run",
              file=sys.stderr)
    return pinned, len(unpinned)


if workflow.is_main_process and os.path.isdir(WORK):
    pin_content_keyed_mtimes()
