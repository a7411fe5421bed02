"""`turbotrain report RUN_DIR`: a PNG and a markdown report of a run, from its files alone.

Usage:
    turbotrain report runs/gpt-shakespeare        # → report.png, report.md in the run directory
    from turbotrain.report import write_report; write_report("runs/x")

Panels (always all six; a panel without data says why): loss and val loss, throughput, MFU, memory,
GPU utilisation and temperature, data wait — over steps, with the alerts of alerts.jsonl marked on each.
"""
from __future__ import annotations

import errno
import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

from turbotrain.errors import UserError
from turbotrain.rundir import regular_fd

PANELS = ("loss", "throughput", "mfu", "memory", "gpu", "data wait")


@dataclass
class RunFiles:
    """What a run directory holds, read leniently: a running run's last line may be cut short."""

    path: Path
    rows: list[dict] = field(default_factory=list)  # metrics.jsonl, in order
    alerts: list[dict] = field(default_factory=list)  # alerts.jsonl
    summary: dict | None = None  # summary.json, once the run finished
    profile: dict | None = None  # profile/report.json, where `turbotrain profile` ran
    state: str = "finished"  # running | finished | stopped | unknown: see run_state
    alerts_unreadable: int = 0  # lines of alerts.jsonl that hold no readable alert
    metrics_unreadable: int = 0  # lines of metrics.jsonl that hold no readable row
    damaged: list[str] = field(default_factory=list)  # files read as absent because they hold no JSON object

    def series(self, key: str) -> tuple[list[int], list[float]]:
        """(steps, values) of a metric, finite values only."""
        pts = [(r["step"], r[key]) for r in self.rows if _finite(r.get(key)) and _finite(r.get("step"))]
        return [p[0] for p in pts], [p[1] for p in pts]

    @property
    def last_row(self) -> dict:
        """The last metrics row with a step (its loss may be NaN: a run stopped by a non-finite loss)."""
        return next((r for r in reversed(self.rows) if _finite(r.get("step"))), {})

    @property
    def stale_summary(self) -> bool:
        """summary.json is of an earlier attempt: a resumed run logged steps past it (then stopped or goes on)."""
        end, last = (self.summary or {}).get("steps"), self.last_row.get("step")
        return _finite(end) and last is not None and last > end

    @property
    def exposed_comm_share(self) -> float | None:
        """profile/report.json's exposed communication share; None when absent or not a number (file_notes)."""
        share = _exposed_comm(self.profile)
        return share if _finite(share) else None


def _exposed_comm(profile: dict | None):
    """The raw breakdown_share.exposed_comm of a profile report, whatever its type (None: not there)."""
    shares = (profile or {}).get("breakdown_share")
    return shares.get("exposed_comm") if isinstance(shares, dict) else None


def _finite(v) -> bool:
    """A plottable number: int or float (not bool), finite and within ±1e300 (matplotlib's axis math overflows
    beyond; comparing also keeps a 400-digit int from overflowing a float conversion)."""
    return isinstance(v, (int, float)) and not isinstance(v, bool) and -1e300 < v < 1e300


def _jsonl(path: Path, step_key: bool = False, live: bool = False) -> tuple[list[dict], int]:
    """The dict rows of a JSON-lines file, and the count of lines that hold none: not JSON (cut short, damaged
    bytes), not an object, or with `step_key` a "step" that is not a finite number (no place on a step axis).
    `live`: the run is writing, so a last line without its newline is one being written, not a damaged one."""
    out, bad = [], 0
    if path.is_file():
        try:
            text = path.read_bytes().decode("utf-8", errors="replace")
        except OSError as e:
            raise UserError(f"cannot read {path} ({e.strerror or e})") from None
        lines = text.splitlines()
        if live and lines and not text.endswith("\n"):
            lines.pop()
        for line in lines:
            try:
                obj = json.loads(line)
            except ValueError:
                bad += bool(line.strip())  # a blank line held nothing to lose
                continue
            if isinstance(obj, dict) and (not step_key or "step" not in obj or _finite(obj["step"])):
                out.append(_restored(obj))
            else:
                bad += 1
    return out, bad


def _restored(obj: dict) -> dict:
    """A record with the NaN/inf values that strict JSON holds as null put back, as its "nonfinite" marks name them
    (rundir.finite_json): a run stopped by a NaN loss reads as one, not as one whose loss went unlogged."""
    marks = obj.pop("nonfinite", None)
    if isinstance(marks, dict):
        for k, v in marks.items():
            if k in obj and obj[k] is None and v in ("NaN", "Infinity", "-Infinity"):
                obj[k] = float(v)
    return obj


def _json(run_dir: Path, name: str, damaged: list[str]) -> dict | None:
    """The JSON object file `run_dir/name`, None when absent; one that holds no object (cut short, damaged) is
    read as absent and its name added to `damaged`."""
    try:  # a FIFO planted there would block a plain read forever: not a regular file reads as damaged
        with os.fdopen(regular_fd(run_dir / name, os.O_RDONLY | os.O_NOFOLLOW), "rb") as f:
            obj = json.loads(f.read().decode("utf-8", errors="replace"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError):  # ValueError: not JSON, or an integer past Python's digit limit
        obj = None
    if not isinstance(obj, dict):
        damaged.append(name)
        return None
    return _restored(obj)


def run_path(run_dir: str | os.PathLike) -> Path:
    """`run_dir` as a run directory's path, `~` expanded; one UserError where it names no folder, a file, or a
    folder inside a run (its final/, a checkpoint), that names the run directory to give instead."""
    from turbotrain.files import path_arg

    if not isinstance(run_dir, (str, os.PathLike)):
        raise UserError(f"{run_dir!r}: expected the path of a run directory (a str or a Path), e.g. \"runs/NAME\"")
    if not str(run_dir).strip():
        raise UserError("RUN_DIR '': names no folder (an unset shell variable?); name a run's folder, e.g. runs/NAME")
    path = path_arg("RUN_DIR", run_dir)
    # a run that logged no step yet holds its config.toml; a final/ or an export holds one beside its weights
    own = path.is_dir() and (any((path / n).exists() for n in ("metrics.jsonl", ".lock", "summary.json")) or (
        (path / "config.toml").is_file() and not (path / "model.safetensors").exists()))
    run = None if own else enclosing_run(path)
    if run is not None:
        raise UserError(f"{run_dir}: not a run directory but a folder inside the run {run}; name the run: {run}")
    if not path.is_dir():
        why = ("a file, not a run directory; name the run's folder, e.g. runs/NAME" if path.exists() else
               "no such run directory; check the path (a run is {run.out_dir}/{run.name}, e.g. runs/NAME)")
        raise UserError(f"{run_dir}: {why}")
    return path


def enclosing_run(path: Path) -> Path | None:
    """The run directory that `path` lies inside (a folder above it holding metrics.jsonl or summary.json, within
    four levels: final/, checkpoints/step-N/dcp, export/hf), None where there is none."""
    above = path.absolute().parents
    return next((d for d in above[:4] if (d / "metrics.jsonl").is_file() or (d / "summary.json").is_file()), None)


def load_run(run_dir: str | Path) -> RunFiles:
    from turbotrain.rundir import RunDir

    path = run_path(run_dir)
    live = RunDir.lock_held(path) is True  # a running run's last line may be one being written, not a damaged one
    if not (path / "metrics.jsonl").is_file():
        _no_metrics(path, live)
        return RunFiles(path, state="running")  # building the model, reading data: no step logged yet
    run = RunFiles(path)
    run.rows, run.metrics_unreadable = _jsonl(path / "metrics.jsonl", True, live=live)
    run.summary = _json(path, "summary.json", run.damaged)
    run.profile = _json(path, "profile/report.json", run.damaged)
    run.state = run_state(run)
    alerts, run.alerts_unreadable = _jsonl(path / "alerts.jsonl", True, live=run.state == "running")
    # an alert is a record of a rule: one whose rule is not a name (a list, a number: damaged) is unreadable
    run.alerts = [a for a in alerts if isinstance(a.get("rule"), str)]
    run.alerts_unreadable += len(alerts) - len(run.alerts)
    return run


def _no_metrics(path: Path, live: bool) -> None:
    """A folder without metrics.jsonl: a run that logged no step yet (its lock held: fine, there is nothing to
    show yet), one that never logged a step, or no run directory at all: each said as what it is."""
    if (path / "metrics.jsonl").exists():
        raise UserError(f"{path / 'metrics.jsonl'} is not a regular file; move it aside")
    if live:
        return
    if (path / "summary.json").exists():  # the run logged steps (its summary says how many): the file went since
        raise UserError(f"{path}: metrics.jsonl is missing though summary.json says the run ran: it was deleted or "
                        f"moved; put it back in {path} (report and watch draw from it)")
    if (path / "config.toml").is_file():
        raise UserError(f"{path}: the run logged no step (no metrics.jsonl, no process holds it): it stopped before "
                        "its first log step or never started; see its console output, or train it again")
    raise UserError(f"{path}: no metrics.jsonl; expected a run directory ({{run.out_dir}}/{{run.name}})")


def file_notes(run: RunFiles) -> list[str]:
    """What of the run's files could not be read (empty: everything was): the figures shown leave it out."""
    notes = []
    if run.metrics_unreadable:
        n = run.metrics_unreadable
        notes.append(f"{n} line{'s' * (n != 1)} of metrics.jsonl unreadable (damaged or cut short): not shown")
    notes += [f"{name} unreadable (damaged or cut short): read as absent" for name in run.damaged]
    end, last = (run.summary or {}).get("steps"), run.last_row.get("step")
    if _finite(end) and (last is None or last < end):  # the run logged up to `end`: rows after `last` are gone
        notes.append(f"metrics.jsonl ends at step {_fmt(last)} but summary.json at step {_fmt(end)}: rows were lost "
                     "(the file was cut, replaced or could not be written)")
    share = _exposed_comm(run.profile)
    if share is not None and not _finite(share):
        notes.append(f"profile/report.json: breakdown_share.exposed_comm is not a number ({_fmt(share)[:40]}): "
                     "ignored")
    elif run.profile is not None and "breakdown_share" in run.profile \
            and not isinstance(run.profile["breakdown_share"], dict):
        notes.append("profile/report.json: breakdown_share is not a table of shares: ignored")
    return notes


def run_state(run: RunFiles) -> str:
    """The one verdict of watch and report on whether a run goes on. "running": its rank 0 holds the run
    directory's lock (rundir.RunDir: the kernel drops it when the process ends, however it ends); else
    "finished" with a summary.json of this attempt, "stopped" without one (a crash, kill -9, an error: the
    trainer writes the summary last); "unknown" when the lock cannot be tested and no summary says more."""
    from turbotrain.rundir import RunDir

    held = RunDir.lock_held(run.path)
    if held:
        return "running"
    if run.summary is not None and not run.stale_summary:
        return "finished"
    return "stopped" if held is False else "unknown"


def describe_state(run: RunFiles) -> str:
    """The state in words, as watch's header and report's table say it."""
    if run.state == "running":
        if not run.rows:
            return "running (no step logged yet: building, reading data or in its first steps)"
        try:
            age = f" (last write {time.time() - (run.path / 'metrics.jsonl').stat().st_mtime:.0f} s ago)"
        except OSError:  # set aside by a fresh run since it was read
            age = ""
        return "running" + age
    if run.state == "finished":
        return "finished"
    if run.stale_summary:
        why = f"summary.json is of an earlier attempt, to step {_fmt(run.summary.get('steps'))}"
    else:
        why = "no summary"
    if run.state == "stopped":
        return f"stopped ({why}: crashed, killed or ended by an error)"
    return f"not known whether it runs ({why}; the lock {run.path / '.lock'} cannot be tested)"


def alert_counts(run: RunFiles) -> dict[str, int]:
    """summary.json's count of every firing by rule (repeats held back by monitor.alert_repeat_s included)."""
    counts = (run.summary or {}).get("alerts") if not run.stale_summary else None
    if not isinstance(counts, dict):
        return {}
    return {str(r): n for r, n in counts.items() if isinstance(n, int) and not isinstance(n, bool) and n > 0}


def alert_notes(run: RunFiles) -> list[str]:
    """Why the alerts read are not the run's whole list (empty: they are). Every rule's first firing is
    written to alerts.jsonl (alerts.py holds back only repeats), so a rule summary.json counts with no line in
    the file means lines were lost."""
    notes = []
    if run.alerts_unreadable:
        n = run.alerts_unreadable
        notes.append(f"{n} line{'s' * (n != 1)} of alerts.jsonl unreadable (damaged bytes or cut short): "
                     "what they held is not shown")
    read = {a.get("rule") for a in run.alerts}
    missing = {r: n for r, n in alert_counts(run).items() if r not in read}
    if missing:
        notes.append("summary.json counts " + ", ".join(f"{n} {r}" for r, n in missing.items())
                     + " alert(s) of which alerts.jsonl holds none: the file is damaged, was removed or "
                     "replaced, or could not be written")
    return notes


def _plot(ax, run: RunFiles, keys: list[tuple[str, str]], title: str, ylabel: str, why_empty: str,
          scale: float = 1.0) -> None:
    drawn = False
    for key, label in keys:
        xs, ys = run.series(key)
        if xs:
            sparse = len(xs) < 30 or key == "val_loss"  # eval rows are few: mark each
            ax.plot(xs, [y * scale for y in ys], marker="o" if sparse else None, ms=3, label=label)
            drawn = True
    ax.set_title(title)
    ax.set_xlabel("step")
    ax.set_ylabel(ylabel)
    if not drawn:
        ax.text(0.5, 0.5, why_empty, ha="center", va="center", transform=ax.transAxes, color="gray")
    elif len(keys) > 1:
        ax.legend(fontsize=7)
    steps = [r["step"] for r in run.rows if isinstance(r.get("step"), (int, float))]
    if steps and max(steps) > min(steps):  # the run's span on every panel, a margin keeps edge alerts visible
        pad = 0.02 * (max(steps) - min(steps))
        ax.set_xlim(min(steps) - pad, max(steps) + pad)
    for a in run.alerts:  # alerts on the timeline
        if isinstance(a.get("step"), (int, float)):
            ax.axvline(a["step"], color="crimson", alpha=0.35, lw=1)


def _gpu_panel(ax, run: RunFiles) -> None:
    _plot(ax, run, [("gpu_util_pct", "util %")], "GPU utilisation / temperature", "util %",
          "no NVML readings (CPU run or no driver)")
    xs, ys = run.series("gpu_temp_c")
    if xs:
        ax2 = ax.twinx()
        ax2.plot(xs, ys, color="tab:red", ls="--", label="temp °C")
        ax2.set_ylabel("°C")


def render_png(run: RunFiles, path: Path) -> list[str]:
    """Draw the six panels into `path`; returns the panel titles (also in the PNG's Description)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(3, 2, figsize=(12, 10))
    a = axes.ravel()
    _plot(a[0], run, [("loss", "loss"), ("val_loss", "val loss")], "loss", "loss", "no loss logged")
    rate_key = "tokens_per_s" if run.series("tokens_per_s")[0] else "samples_per_s"
    _plot(a[1], run, [(rate_key, rate_key)], "throughput", rate_key.replace("_per_s", "/s"), "no throughput logged")
    _plot(a[2], run, [("mfu", "MFU")], "MFU", "%", "MFU unknown (no peak FLOP/s for this device)", scale=100)
    _plot(a[3], run, [("peak_mem_gib", "peak allocated"), ("gpu_mem_used_gib", "device used (NVML)")],
          "memory", "GiB", "no memory logged")
    _gpu_panel(a[4], run)
    _plot(a[5], run, [("data_wait_pct", "data wait")], "data wait", "% of step time", "no data wait logged")
    rules = sorted({str(x.get("rule", "?")) for x in run.alerts})
    lost = " (alerts.jsonl incomplete: see report.md)" if alert_notes(run) else ""
    fig.suptitle(f"{run.path.name}: {len(run.rows)} log rows, {len(run.alerts)} alert(s)"
                 + (f" ({', '.join(rules)})" if rules else "") + lost + " — red lines: alerts")
    fig.tight_layout()
    titles = [ax.get_title() for ax in a]
    fig.savefig(path, dpi=90, metadata={"Title": f"turbotrain report: {run.path.name}",
                                        "Description": "panels: " + "; ".join(titles)})
    plt.close(fig)
    return titles


def _fmt(v) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    if isinstance(v, int) and not isinstance(v, bool) and not _finite(v):
        return "(out of range)"  # a damaged value of hundreds of digits
    return "–" if v is None else md_cell(v)  # a string of a damaged file: its newlines would end the table row


def _figure(v) -> str:
    """A figure of the table: a value of another kind (a string, list or bool in a damaged summary.json or row) is
    said to be no number, never shown as if it were the figure."""
    if v is None or isinstance(v, float) or (isinstance(v, int) and not isinstance(v, bool)):
        return _fmt(v)
    return f"(not a number: {md_cell(json.dumps(v), 40)}; the file is damaged)"


def render_markdown(run: RunFiles, png_name: str) -> str:
    s, last, notes = ({} if run.stale_summary else run.summary or {}), run.last_row, file_notes(run)
    lines = [f"# Run report: {run.path.name}", "", f"![panels]({png_name})", "",
             "| figure | value |", "|---|---|",
             f"| state | {describe_state(run)} |",
             f"| last step | {_fmt(last.get('step'))} |",
             f"| final loss | {_figure(s.get('final_loss', last.get('loss')))} |",
             f"| val loss | {val_loss_text(run)} |",
             f"| samples/s (timed region{_attempt(s)}) | {_figure(s.get('samples_per_s'))} |",
             f"| tokens/s | {_figure(s.get('tokens_per_s'))} |", f"| MFU | {_figure(s.get('mfu'))} |",
             f"| peak memory GiB | {_figure(s.get('peak_mem_gib', last.get('peak_mem_gib')))} |",
             f"| data wait % (last window) | {_figure(last.get('data_wait_pct'))} |",
             *([f"| optimizer steps skipped (fp16) | {skipped} |"] if (skipped := skipped_text(run)) else []),
             f"| exposed communication share (profile) | {_fmt(run.exposed_comm_share)} |", "",
             *[f"- **{note}**" for note in notes], *([""] if notes else []),
             *_alert_lines(run)]
    return "\n".join(lines) + "\n"


def _attempt(summary: dict) -> str:
    """Which steps summary.json's speeds are of: a resumed run's are of its last attempt's steps alone."""
    start = summary.get("resumed_from")
    return f", steps after the resume at {_fmt(start)}" if _finite(start) and start > 0 else ""


def skipped_text(run: RunFiles) -> str | None:
    """The optimizer steps fp16's loss scaling skipped, from the summary of this attempt (None: none, or not
    known): a run whose steps mostly left the weights unchanged must not read as an ordinary finished one."""
    s = {} if run.stale_summary else run.summary or {}
    n, steps, start = s.get("skipped_steps"), s.get("steps"), s.get("resumed_from") or 0
    if not (_finite(n) and n > 0 and _finite(steps) and _finite(start)):
        return None
    return (f"{_fmt(n)} of {_fmt(steps - start)} (gradients overflowed at the loss scale in force: those steps left "
            "the weights unchanged)")


def val_loss_text(run: RunFiles, fmt=None) -> str:
    """The last evaluation's loss as watch and report say it (`fmt`: how a number is written): one that was NaN/inf
    (logged as null) is said so, not "–" as if none ran; one of an earlier step than the last names its step."""
    fmt = fmt or _fmt
    row = next((r for r in reversed(run.rows) if "val_loss" in r), None)
    if row is None:
        return fmt(None)
    if not _finite(row["val_loss"]):
        return "null (NaN/inf: the last evaluation diverged)"
    at = row.get("step")
    return fmt(row["val_loss"]) + (f" (at step {_fmt(at)})" if at != run.last_row.get("step") else "")


def _alert_lines(run: RunFiles) -> list[str]:
    """The alerts section: "No alerts." only where nothing says alerts were lost (alert_notes)."""
    notes, counts = alert_notes(run), alert_counts(run)
    lines = [f"## Alerts ({len(run.alerts)}{' readable, incomplete' if notes else ''})", ""]
    if notes:
        lines += ["**Warning: the alerts below are not all the run's alerts.**", "", *[f"- {n}" for n in notes], ""]
    if not notes and sum(counts.values()) > len(run.alerts):
        lines += [f"summary.json counts every firing: {', '.join(f'{n} {r}' for r, n in counts.items())}; "
                  "alerts.jsonl holds the ones sent (repeats within monitor.alert_repeat_s are counted, not sent).",
                  ""]
    if run.alerts:
        lines += ["| step | rank | rule | value | threshold | message |", "|---|---|---|---|---|---|"]
        for a in run.alerts:
            msg = md_cell(str(a.get("message", "")).split("\n", 1)[0])
            lines.append(f"| {_fmt(a.get('step'))} | {_fmt(a.get('rank'))} | {md_cell(a.get('rule'))} "
                         f"| {_fmt(a.get('value'))} | {_fmt(a.get('threshold'))} | {msg} |")
    else:
        lines.append("No alert could be read." if notes else "No alerts.")
    return lines


def write_report(run_dir: str | Path) -> tuple[Path, Path]:
    """Write report.png and report.md into the run directory; returns their paths."""
    from turbotrain.rundir import write_run_file

    run = load_run(run_dir)
    png, md = run.path / "report.png", run.path / "report.md"
    refuse_links([png, md])
    try:
        render_png(run, png)
    except OSError as e:  # a file-size or open-files limit is not cured by permissions or free space
        from turbotrain.rundir import write_fix

        fix = write_fix(e) if e.errno in (errno.EFBIG, errno.EMFILE, errno.ENFILE) else \
            "check the run directory's permissions and free space"
        raise UserError(f"cannot write {png} ({e.strerror or e}); {fix}") from None
    write_run_file(md, render_markdown(run, png.name))
    return png, md


def refuse_links(files: list[Path], folders: list[Path] = ()) -> None:
    """Before anything is written: none of these output files and folders is a symbolic link (a write would land
    wherever it points: nothing is written through a link in a run directory) or of the other kind (a folder
    where a file goes, or the reverse). Usage: `refuse_links([out / "bench.json"], folders=[out / "tune"])`."""
    for path, folder in [*((f, False) for f in files), *((d, True) for d in folders)]:
        wrong = path.exists() and not (path.is_dir() if folder else path.is_file())
        if path.is_symlink() or wrong:
            what = "a symbolic link" if path.is_symlink() else "not a folder" if folder else "not a regular file"
            raise UserError(f"{path} is {what}; turbotrain does not write through links or over other files in a "
                            "run directory: remove it and run again")


def md_cell(value, width: int | None = None) -> str:
    """Text for a markdown table cell: one line, `|` escaped (it would end the cell), cut to `width`."""
    text = " ".join(str(value).split())[:width]
    return text.replace("|", "\\|")
