"""`tune`'s four files: `tuned.toml` (extends the input config, only the changed keys, each with its
measured effect), `tune.json`, `tune.md` (the table) and `tune.png` (throughput vs peak memory).

Usage: `write_outputs(Path("runs/NAME/tune"), result)` with the dict `tune.run_tune` builds.
"""
from __future__ import annotations

import os
import time
from pathlib import Path

from turbotrain.config import _toml_key, _toml_value, apply_override, config_path
from turbotrain.files import make_dir
from turbotrain.log import say
from turbotrain.rundir import strict_json, write_run_file
from turbotrain.tune_space import NUMERICS_KEYS


def write_outputs(tune_dir: Path, result: dict) -> None:
    """tune.json, tune.md, tune.png and, where a configuration ran to the end, tuned.toml (without one there is
    nothing to train with: a tuned.toml repeating the input would read as a result). Each file is written whole
    or not at all (a temporary file renamed over it): a tune stopped mid-write leaves no half file."""
    make_dir(tune_dir)
    tuned = tune_dir / "tuned.toml"
    if result["winner"] is None:
        tuned.unlink(missing_ok=True)  # a re-run into the same folder must not leave an earlier result behind
        _write_record(tune_dir, result)
        why = ("partial: tune was stopped, it recommends nothing" if result.get("partial")
               else "no configuration ran to the end")
        say(f"tune: wrote tune.json, tune.md, tune.png in {tune_dir} (no tuned.toml: {why})")
        return
    launcher = (f"torchrun --nproc_per_node={result['world_size']} -m turbotrain"
                if result["world_size"] > 1 else "turbotrain")
    result.update(tuned_toml=str(tuned), command=f"{launcher} train {tuned}", numerics=numerics_note(result))
    write_run_file(tuned, tuned_toml(result))
    _keep_the_input(tuned, result)
    _write_record(tune_dir, result)
    say(f"tune: wrote {tuned}, tune.json, tune.md, tune.png in {tune_dir}")
    say(f"tune: train with the result: {result['command']}")
    if result["numerics"]:
        say(f"warning: {result['numerics']}")
    if not result["winner"]["changes"] and unchanged(result).startswith("no configuration"):
        say(f"warning: tune: {unchanged(result)}; tuned.toml is the input config; give it more minutes "
            "(--budget-min) or fix what failed")


def _keep_the_input(tuned: Path, result: dict) -> None:
    """tuned.toml must load as the input config (its file or preset, plus the command line's overrides) with the
    winner's changes. `extends` merges tables key by key while an override replaces a table (model.args.t={y=2}
    over a file's t={x=1}: the trials ran without x); where the two differ, tuned.toml is rewritten whole (every
    key, no extends), so it trains what was measured."""
    from turbotrain.config import load_config, to_toml

    w = result["winner"]
    sets = [*result["overrides"], *(f"{k}={_toml_value(v)}" for k, v in w["changes"].items()),
            f"run.name={_toml_value(result['run_name'] + '-tuned')}"]
    try:
        want = load_config(result["config"], sets)
    except Exception:  # noqa: BLE001 - the trials loaded it; a check that cannot run leaves the file as written
        return
    try:
        if to_toml(load_config(str(tuned))) == to_toml(want):  # as text: a nan in model.args equals itself
            return
    except Exception:  # noqa: BLE001 - a file that does not load at all is rewritten whole, as one that differs
        pass
    effects = _effects(result)
    changed = [f"#   {k} = {_toml_value(v)}: {effects.get((k, _toml_value(v)), 'part of ' + w['label'])}"
               for k, v in w["changes"].items()]
    write_run_file(tuned, "\n".join([
        *tuned_toml(result).splitlines()[:2],
        "# Every key, no extends: the input's overrides replace tables that extends would merge into.",
        "# Input: " + " ".join(" ".join([result["config"], *result["overrides"]]).split()),  # one comment line
        "# The winner's changes:" if changed else "# No changes.", *changed, "", to_toml(want)]) + "\n")


def numerics_note(result: dict) -> str | None:
    """What the winner changes beyond speed: its precision keys round (FP8: compute) differently from the input
    config, so the loss curve is not the input's; said wherever the winner is, unless a convergence check held."""
    changed = {k: v for k, v in (result["winner"] or {}).get("changes", {}).items() if k in NUMERICS_KEYS}
    if not changed:
        return None
    what = ", ".join(f"{k}={_toml_value(v)}" for k, v in changed.items())
    conv = result.get("converge") or {}
    if conv.get("checked") and "parity held" in str(conv.get("verdict")):
        return f"{what} changes the numerics from the input config; the convergence check held parity"
    return (f"{what} changes the numerics from the input config (rounding, not the model or the batch): the loss "
            "curve will differ slightly; check it with tune --converge, or bench --converge")


def unchanged(result: dict) -> str:
    """Why the winner is the input config: no other configuration was measured at all, or none beat it beyond
    noise (said apart: the first compared nothing)."""
    if not any(t["tried"] and t.get("samples_per_s") and t["status"] in ("ok", "slower") for t in result["trials"]):
        return ("no configuration but the input config was measured (every candidate was skipped or failed: see "
                "tune.md); nothing was compared")
    return result.get("noise") or "nothing measured faster than the input config beyond noise"


def _write_record(tune_dir: Path, result: dict) -> None:
    png, tmp = tune_dir / "tune.png", tune_dir / ".tune.png.tmp"
    plot(result, tmp)
    os.replace(tmp, png)
    table = format_table(result)
    write_run_file(tune_dir / "tune.md", table + "\n")
    write_run_file(tune_dir / "tune.json", strict_json(result, indent=2))
    print(table)


def _extends(config: str) -> str:
    path = config_path(config)
    return str(path.resolve()) if path is not None else config  # a preset by name, a file by absolute path


def _effects(result: dict) -> dict[str, str]:
    """Each changed key → the measured effect of the trial that brought it in: the last of the winner's ancestors
    (the trials kept as the best up to it, each built on the one before) that set the key to the winner's value.
    A best after the winner measured another configuration; one the winner leaves out (`without`: the best
    without its weakly measured changes) is no ancestor of it."""
    w, trials = result["winner"] or {}, result["trials"]
    at = next((i for i, t in enumerate(trials) if t.get("id") == w.get("trial")), None)
    wt = trials[at] if at is not None else {"config": w.get("changes", {})}
    win, without = wt["config"], set(wt.get("without", ()))
    out = {}
    for t in trials[:None if at is None else at + 1]:
        if t["status"] != "ok" or not t["tried"] or t["id"] in without:
            continue
        effect = f"{t['gain']:.2f}x over the best before it" if t.get("gain") else "first configuration that ran"
        for key, value in t["tried"].items():
            if key in win and win[key] == value:
                out[(key, _toml_value(value))] = \
                    f"{t['label']}: {effect} ({t['id']}, {t['samples_per_s']:,.1f} samples/s)"
    return out


def tuned_toml(result: dict) -> str:
    """The input config (its file or preset, plus the command line's overrides) and the winner's changes."""
    w = result["winner"]
    raw: dict = {}
    for item in result["overrides"]:
        if not item.split("=", 1)[0].strip().startswith("run.name"):
            apply_override(raw, item)
    raw.setdefault("run", {})["name"] = f"{result['run_name']}-tuned"
    comments = {"run.name": "its own run directory, beside the input config's"}
    changes = w["changes"]
    effects = _effects(result)
    for key, value in changes.items():
        section, name = key.split(".", 1)
        raw.setdefault(section, {})[name] = value
        comments[key] = effects.get((key, _toml_value(value)), f"part of {w['label']}, the finalists' fastest median")
    note = numerics_note(result)
    for key in (k for k in changes if k in NUMERICS_KEYS) if note else ():  # said where the change is
        comments[key] += f"; {note}"
    if not changes:
        head = f"{unchanged(result)}: it is kept unchanged"
    else:
        speed = (f"{w['speedup']:.2f}x the input config's samples/s" if w.get("speedup") else _no_base(result))
        head = f"{speed} (median of the finalists' runs, {w['samples_per_s']:,.1f} samples/s)"
    lines = [f"# turbotrain tune, {time.strftime('%Y-%m-%d %H:%M')}, {result['device']}, torch {result['torch']}:",
             f"# {head}.", "# Only the changed keys; each comment is the measured effect of the trial that chose it.",
             f"extends = {_toml_value(_extends(result['config']))}", ""]
    _tables(lines, "", raw, comments)
    return "\n".join(lines) + "\n"


def _no_base(result: dict) -> str:
    """Why the winner has no speed-up: the input config has no median to compare with (it failed, or ran only
    once, or did not run), said with how it ended."""
    base = result.get("baseline") or {}
    if base.get("status") in ("error", "oom", "timeout"):
        return (f"the input config failed ({base['status']}: {' '.join(str(base.get('reason')).split())[:160]}), "
                "this configuration ran: no speed-up is measured")
    return "the input config did not run"


def _tables(lines: list[str], prefix: str, table: dict, comments: dict[str, str]) -> None:
    scalars = {k: v for k, v in table.items() if not isinstance(v, dict)}
    if scalars and prefix:
        lines.append(f"[{prefix}]")
        for k, v in scalars.items():
            note = comments.get(f"{prefix}.{k}") or comments.get(prefix)  # a table's keys: its comment
            lines.append(f"{_toml_key(k)} = {_toml_value(v)}" + (f"  # {note}" if note else ""))
        lines.append("")
    for k, v in table.items():
        if isinstance(v, dict):
            _tables(lines, f"{prefix}.{_toml_key(k)}" if prefix else _toml_key(k), v, comments)


def _f(v, fmt: str) -> str:
    return format(v, fmt) if v is not None else "—"


def format_table(result: dict) -> str:
    """tune.md. Every ratio compares like with like, and each table says over what: the trials' column over
    the input config's own screening trial t00 (one run each), the finalists' and the winner's over the input
    config's median of the same re-runs."""
    w = result["winner"]
    unit = "tok/s" if any(t.get("tokens_per_s") for t in result["trials"]) else "samples/s"
    lines = [f"Device: {result['device']}, torch {result['torch']}, world size {result['world_size']}, "
             f"{result['trial_steps']} steps a trial, {result['elapsed_min']:.1f} of {result['budget_min']:g} min",
             *_partial(result), *_not_searched(result), "",
             "Trials (one screening run each; `x t00`: its throughput over the input config's screening trial t00, "
             "the same kind of run):", "",
             f"| trial | dimension | tried | {unit} | x t00 | peak GiB | compile s | status |",
             "|---|---|---|---|---|---|---|---|"]
    for t in result["trials"]:
        rate = t.get("tokens_per_s") or t.get("samples_per_s")
        tried = ", ".join(f"{k}={_toml_value(v)}" for k, v in t["tried"].items()) or \
            (f"(the best without {', '.join(t['without'])})" if t.get("without") else "(input config)")
        status = t["status"] + (f": {t['reason']}" if t.get("reason") else "")
        lines.append(f"| {t['id']} | {t['dimension']} | {tried} | {_f(rate, ',.1f')} | {_f(t.get('speedup'), '.2f')} | "
                     f"{_f(t.get('peak_mem_gib'), '.2f')} | {_f(t.get('compile_s'), '.1f')} | {status[:120]} |")
    lines += ["", "Finalists (the screening run and the re-runs; `x input`: the median over the input config's "
              "median):", "", "| finalist | runs (samples/s) | median | x input |", "|---|---|---|---|"] \
        if result["finalists"] else ["", "Finalists: none."]
    for f in result["finalists"]:
        runs = ", ".join([*(f"{r:,.1f}" for r in f["rates"]), *(x[:120] for x in f.get("failed", ()))])
        lines.append(f"| {f['label']} ({f['id']}) | {runs} | "
                     f"{f['median_samples_per_s']:,.1f} | {_f(f.get('speedup'), '.2f')} |")
    if w is not None:
        lines.append(f"\nWinner: **{w['label']}** ({w['trial']}), {_f(w.get('speedup'), '.2f')}x the input config "
                     f"(finalists' medians); changes: "
                     f"{', '.join(f'{k}={_toml_value(v)}' for k, v in w['changes'].items()) or 'none'}")
    if w is not None and (result.get("noise") or not w["changes"]):
        lines.append(f"\n**Note:** {result.get('noise') or unchanged(result)}.")
    if result.get("numerics"):
        lines.append(f"\n**Numerics:** {result['numerics']}.")
    if result.get("converge"):
        lines.append(f"\nConvergence check: {result['converge']}")
    if result.get("command"):
        lines.append(f"\nTrain with: `{result['command']}`")
    return "\n".join(lines)


def _not_searched(result: dict) -> list[str]:
    """What the probe kept out of the search because it would change the math, and why."""
    why = (result.get("probe") or {}).get("micro_batch_math")
    return ["", f"Not searched: micro-batch x accumulation, as {why}; it would change the math."] if why else []


def _partial(result: dict) -> list[str]:
    """The warning on top of a report that tune did not finish: what stopped it, and the best screening run so
    far, which is no recommendation (the finalists did not compare it)."""
    p = result.get("partial")
    if not p:
        return []
    best = p.get("best_so_far")
    line = (f"best screening run so far: {best['label']} ({best['id']}), {_f(best.get('speedup'), '.2f')}x t00 — "
            "one run, not re-run by the finalists: no recommendation" if best else "no trial ran to the end")
    return ["", f"**PARTIAL REPORT**: {p['why']} during {p['during']}; only the trials that finished before it are "
            f"measured, and there is no tuned.toml. {line[0].upper()}{line[1:]}."]


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tok = any(t.get("tokens_per_s") for t in result["trials"])
    colors = {"ok": "tab:green", "slower": "tab:gray"}
    fig, ax = plt.subplots(figsize=(8, 5))
    for t in result["trials"]:
        rate = t.get("tokens_per_s") if tok else t.get("samples_per_s")
        if rate is None or t.get("peak_mem_gib") is None:
            continue
        ax.scatter(t["peak_mem_gib"], rate, color=colors.get(t["status"], "tab:red"), s=30)
        ax.annotate(t["id"], (t["peak_mem_gib"], rate), fontsize=7, xytext=(3, 3), textcoords="offset points")
    w = result["winner"]
    win = next((t for t in result["trials"] if w and t["id"] == w["trial"]), None)
    if win is not None and win.get("peak_mem_gib") is not None:
        ax.scatter(win["peak_mem_gib"], win.get("tokens_per_s") if tok else win["samples_per_s"], marker="*", s=300,
                   facecolor="none", edgecolor="tab:orange", linewidth=2, label=f"winner: {w['label']}")
        ax.legend(loc="best", fontsize=8)
    ax.set_xlabel("peak memory (GiB)")
    ax.set_ylabel("tokens/s" if tok else "samples/s")
    partial = " — PARTIAL: tune was stopped" if result.get("partial") else ""
    ax.set_title(f"turbotrain tune — {result['config']} on {result['device']}, each trial's screening run "
                 f"(green: kept, gray: slower){partial}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110, format="png")  # `path` may be a temporary name
    plt.close(fig)
