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
# At start-up (before the DAG is built) each such file whose mtime is not the pinned one is checked: its
# content is confirmed when it equals what the jobs reading it recorded -- a shard's or speed probe's
# `decoder_sha256` / `problems_sha256` (.meta.json), the source key the config gives now -- or the sha256 this
# step recorded when it last pinned it (CONTENT_REGISTRY in the work directory, copied along with it), or no
# output reading it exists yet; a confirmed file gets the pinned mtime back. A dry run changes no mtime: it says
# how many files a real run would re-pin (the jobs it lists for them, "Updated input files", do not run then).
import hashlib
import types
from glob import glob

PINNED_MTIME_NS = 0
CONTENT_REGISTRY = "content_keys.json"  # {path relative to the work directory: sha256}, in the work directory


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
    return (glob(W(f"{suite}/generations/{model}/{bench}/seed{seed}/shard*of*.jsonl"))
            + glob(W(f"{suite}/generations/{model}/seed{seed}/shard*of*/{bench}.jsonl"))
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
    """Give every content-keyed file whose content is confirmed the pinned mtime (module comment); a dry run
    only counts them. Returns the number of files (re-)pinned or, in a dry run, to pin."""
    registry_path = Path(W(CONTENT_REGISTRY))
    try:
        registry = json.loads(registry_path.read_text())
    except (OSError, ValueError):
        registry = {}
    pinned, changed = 0, False
    for path, confirm in _content_keyed_files():
        st = os.stat(path)
        if st.st_mtime_ns == PINNED_MTIME_NS:
            continue
        rel = os.path.relpath(path, WORK)
        sha = _file_sha256(path)
        if registry.get(rel) != sha and not confirm(sha):
            continue  # changed since the jobs reading it ran: they re-run by date
        pinned += 1
        if not DRY_RUN:
            os.utime(path, ns=(st.st_atime_ns, PINNED_MTIME_NS))
            registry[rel], changed = sha, True
    if changed:
        tmp = registry_path.with_name(f"{registry_path.name}.tmp")
        tmp.write_text(json.dumps(registry, indent=1, sort_keys=True) + "\n")
        os.replace(tmp, registry_path)
    if pinned and DRY_RUN:
        print(f"note: dry run: {pinned} decoder / problem / source-key file(s) under {WORK} have new mtimes but the "
              "content the jobs reading them used (a copied or touched work directory); a real run gives them back "
              "their fixed mtime, so jobs listed here only for them ('Updated input files') do not run",
              file=sys.stderr)
    return pinned


if workflow.is_main_process and os.path.isdir(WORK):
    pin_content_keyed_mtimes()
