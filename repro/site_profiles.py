"""Site profiles of the workflow: Snakemake 7 keys, where a profile lives, and what a command line loses.

Used by ``repro/cluster.py`` (which re-exports these names), ``workflow/rules/cluster.smk`` at parse time and the
scripts' ``python -m repro.cluster check-profile``.

Contract
--------
* ``legacy_profile_problems(profile)``: the Snakemake 7 keys of a profile (``cluster``, ``cluster-config``,
  ``cluster-status``, ``cluster-cancel``, ``cluster-sidecar``, ``drmaa``, ``slurm``, ...), each with one line
  saying what replaced it in Snakemake 8+ (``executor: slurm`` and resources; see README "On a Slurm
  cluster"). ``profiles_from_argv(argv)``: the profiles a Snakemake command line names (the workflow
  checks them at parse time, before Snakemake 9 turns ``cluster: X`` into the target ``--cluster=X``).
* ``profile_warnings(argv)``: one line per site setting a command line silently loses: a ``--default-resources``
  / ``--set-resources`` that replaces the site profile's whole mapping (its account with it; snakemake #3429,
  plugin #238), and each key the workflow profile sets over the site profile's value (``latency-wait: 300``
  becoming 60; plugin #23). The workflow prints them at start-up (``workflow/rules/cluster.smk``).
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import yaml

# Snakemake 7 profile keys -> what replaced them (Snakemake >= 8, snakemake-executor-plugin-slurm)
LEGACY_KEYS = {
    "cluster": "executor: slurm (snakemake-executor-plugin-slurm) plus default-resources/set-resources "
               "(slurm_account, slurm_partition, runtime, mem_mb, gpu_model)",
    "cluster-config": "default-resources/set-resources per rule in the profile",
    "cluster-status": "the Slurm executor's own status checks (slurm-status-command: sacct|squeue)",
    "cluster-cancel": "the Slurm executor's own scancel",
    "cluster-cancel-nargs": "the Slurm executor's own scancel",
    "cluster-sidecar": "the Slurm executor (no sidecar)",
    "cluster-sync": "executor: slurm",
    "drmaa": "executor: slurm (or executor: drmaa with snakemake-executor-plugin-drmaa)",
    "drmaa-log-dir": "slurm-logdir",
    "slurm": "executor: slurm",
    "jobscript": "executor: slurm (no jobscript template)",
}
REPLACED_HINT = "see README 'On a Slurm cluster' for a complete site profile"

class ProfileError(ValueError):
    """A profile uses keys Snakemake 9 no longer understands; the message says what replaced them."""


def _legacy_line(key: str, where: str) -> str:
    return (f"{where}: `{key}:` is a Snakemake 7 profile key; Snakemake 8+ replaced it with "
            f"{LEGACY_KEYS[key]}; {REPLACED_HINT}")


def profile_file(profile: str | os.PathLike) -> Path | None:
    """The YAML file of a profile given as the file, a folder (config.yaml / profile.yaml), or a name that
    Snakemake looks up in ``$XDG_CONFIG_HOME/snakemake`` (default ~/.config/snakemake) and /etc/xdg/snakemake."""
    p = Path(profile).expanduser()
    if p.is_file():
        return p
    dirs = [p]
    if not p.exists() and len(p.parts) == 1:
        xdg = os.environ.get("XDG_CONFIG_HOME") or os.path.expanduser("~/.config")
        dirs += [Path(xdg) / "snakemake" / p, Path("/etc/xdg/snakemake") / p]
    for d in dirs:
        # Snakemake 8+ also reads config.v8+.yaml / profile.v9+.yaml (the newest version tag wins)
        names = sorted((f for f in (d.glob("*.yaml") if d.is_dir() else [])
                        if re.fullmatch(r"(profile|config)(\.v\d+\+)?\.yaml", f.name)),
                       key=lambda f: (int(re.sub(r"\D", "", f.name) or 0), f.name != "profile.yaml"))
        if names:
            return names[-1]
    return None


def profile_missing(profile: str) -> str | None:
    """One line when ``profile`` names no profile Snakemake could read (no such file or folder, or a folder
    without ``config.yaml`` / ``profile.yaml``), else None. ``none`` (Snakemake's "no workflow profile") is
    not a problem."""
    if profile == "none" or profile_file(profile) is not None:
        return None
    p = Path(profile).expanduser()
    if p.is_dir():
        return (f"{profile}: this folder holds no config.yaml (or profile.yaml); a Snakemake profile is a folder "
                "with a config.yaml, or the YAML file itself")
    where = " (nor a profile of that name under ~/.config/snakemake or /etc/xdg/snakemake)" if len(p.parts) == 1 else ""
    return (f"{profile}: no such profile file or folder{where}; give the folder holding the profile's config.yaml "
            "(or that YAML file)")


def legacy_profile_problems(profile: str | os.PathLike) -> list[str]:
    """One line per Snakemake 7 key in the profile (empty when none, or when the profile has no YAML)."""
    f = profile_file(profile)
    if f is None:
        return []
    try:
        data = yaml.safe_load(f.read_text()) or {}
    except yaml.YAMLError:
        return []  # Snakemake reports syntax errors itself
    if not isinstance(data, dict):
        return []
    return [_legacy_line(k, str(f)) for k in data if k in LEGACY_KEYS]


def profiles_from_argv(argv: list[str], environ=os.environ) -> list[str]:
    """Profile folders/files named on a Snakemake command line (``--profile``, ``--workflow-profile``) or in
    ``$SNAKEMAKE_PROFILE``."""
    found = []
    if environ.get("SNAKEMAKE_PROFILE"):
        found.append(environ["SNAKEMAKE_PROFILE"])
    for i, a in enumerate(argv):
        for opt in ("--profile", "--workflow-profile"):
            if a == opt and i + 1 < len(argv):
                found.append(argv[i + 1])
            elif a.startswith(opt + "="):
                found.append(a.split("=", 1)[1])
    return found


# Long options of the profile keys the start-up check compares, with their aliases (snakemake/cli.py)
OPTION_ALIASES = {"jobs": ("-j",), "latency-wait": ("--output-wait", "-w"), "retries": ("--restart-times", "-T"),
                  "default-resources": ("--default-res",), "cores": ("-c",)}
#: keys that take key=value lists: one given on the command line replaces a profile's whole mapping
MAPPING_KEYS = ("default-resources", "set-resources")


def _on_command_line(key: str, argv: list[str]) -> bool:
    names = ("--" + key, *OPTION_ALIASES.get(key, ()))
    for a in argv:
        if a in names or any(a.startswith(n + "=") for n in names if n.startswith("--")):
            return True
        if any(len(n) == 2 and a.startswith(n) and len(a) > 2 and not a.startswith("--") for n in names):
            return True  # -j64, -w300
    return False


def _cli_values(key: str, argv: list[str]) -> list[str]:
    """The values after ``--key`` (and its aliases) up to the next option: ``['slurm_account=a', ...]``."""
    names = ("--" + key, *OPTION_ALIASES.get(key, ()))
    vals, on = [], False
    for a in argv:
        if a.startswith("-"):
            on = a in names
            if any(a.startswith(n + "=") for n in names):
                vals.append(a.split("=", 1)[1])
        elif on:
            vals.append(a)
    return vals


def _profile_data(profile) -> dict:
    f = profile_file(profile) if profile else None
    try:
        data = yaml.safe_load(f.read_text()) if f else None
    except (OSError, yaml.YAMLError):
        return {}
    if not isinstance(data, dict):
        return {}
    # YTE keys (__use_yte__, __definitions__: the workflow profiles' overlay check) are no settings
    return {str(k).replace("_", "-"): v for k, v in data.items() if not str(k).startswith("__")}


def profile_layers(argv: list[str], environ=os.environ, basedir: str | os.PathLike = ".") -> tuple[list[str], str | None]:
    """``(site_profiles, workflow_profile)`` of a Snakemake command line, as Snakemake 9 picks them: every
    ``--profile`` (else ``$SNAKEMAKE_PROFILE``), and ``--workflow-profile`` (a path, or a name under
    ``<basedir>/profiles``), else ``<basedir>/profiles/default`` when it exists; ``none`` gives None."""
    site, wf = [], None
    for i, a in enumerate(argv):
        for opt in ("--profile", "--workflow-profile"):
            if a == opt and i + 1 < len(argv):
                val = argv[i + 1]
            elif a.startswith(opt + "="):
                val = a.split("=", 1)[1]
            else:
                continue
            if opt == "--profile":
                site.append(val)
            else:
                wf = val
    if not site and environ.get("SNAKEMAKE_PROFILE"):
        site.append(environ["SNAKEMAKE_PROFILE"])
    site = [p for p in site if p != "none"]
    if wf == "none":
        return site, None
    if wf is None:
        wf = str(Path(basedir) / "profiles" / "default")
    elif profile_file(wf) is None and profile_file(Path(basedir) / "profiles" / wf) is not None:
        wf = str(Path(basedir) / "profiles" / wf)
    return site, (wf if profile_file(wf) is not None else None)


def profile_warnings(argv: list[str], environ=os.environ, basedir: str | os.PathLike = ".") -> list[str]:
    """One line per site setting this command line silently loses (printed at start-up by the workflow):

    * a ``--default-resources`` / ``--set-resources`` on the command line replaces the profiles' whole
      mapping (snakemake #3429, plugin #238): the site's ``slurm_account`` etc. that the command line does not
      repeat are named, with the fix (put the value into the site profile, or repeat the site's values);
    * a key the workflow profile sets (``latency-wait``, ``jobs``, ``retries``, ...) replaces the site
      profile's value for it (Snakemake merges profiles key by key; plugin #23): both values are named, with
      the option that keeps the site's. Keys given on the command line win over both and are not reported."""
    site, wf = profile_layers(argv, environ, basedir)
    site_data = [(p, _profile_data(p)) for p in site]
    out = []
    for key in MAPPING_KEYS:
        if not _on_command_line(key, argv):
            continue
        for p, data in site_data:
            given = data.get(key)
            if not isinstance(given, dict):
                continue
            cli = {v.split("=", 1)[0] for v in _cli_values(key, argv)}  # default-resources: NAME; set-resources: RULE:NAME
            if key == "set-resources":  # {rule: {name: value}} -> {"rule:name": value}
                given = {f"{r}:{k}": v for r, kv in given.items() if isinstance(kv, dict) for k, v in kv.items()}
            lost = {k: v for k, v in given.items() if k not in cli}
            if lost:
                names = ", ".join(f"{k}={v}" for k, v in lost.items())
                out.append(f"--{key} on the command line replaces the whole `{key}` of the site profile {p} "
                           f"(Snakemake #3429): this run loses {names}. Put the new value into the site profile's "
                           f"`{key}`, or repeat those values on the command line")
    wf_data = _profile_data(wf) if wf else {}
    for key, wval in wf_data.items():
        if _on_command_line(key, argv):
            continue
        for p, data in site_data:
            if key in data and data[key] != wval:
                keep = f"--{key} {data[key]}" if not isinstance(data[key], (dict, list)) else f"--{key} ..."
                out.append(f"the workflow profile {wf} sets {key}: {wval}, which replaces {key}: {data[key]} of the "
                           f"site profile {p} (Snakemake merges profiles key by key); pass {keep} to keep the site's")
    return out
