"""Metric trackers: where the rows of metrics.jsonl also go. One small Protocol, five implementations
(JSONL, TensorBoard, CSV, W&B, MLflow), and `build_tracker` that turns a `monitor.trackers` entry into one.

A tracker of your own is any object with `log(row)` and `close()`; name it in the config as
"pkg.module:factory", where `factory(run_dir, start_step) -> Tracker`. One that sets `best_effort = True` (as
W&B and MLflow do: a server elsewhere) is turned off with a warning when its `log` raises, and the run goes on;
otherwise its failure ends the run.
Rank 0 only: MetricsLogger builds trackers on the main process alone.

A write that fails (a full disk, a run directory that became read-only) is one UserError naming the file and
the fix; the files stay readable: metrics.jsonl and metrics.csv end with the last whole row (a row that did not
fit is cut back out), and `close` after such a failure does not fail again.
"""
from __future__ import annotations

import contextlib
import csv
import errno
import io
import os
import threading
import time
from pathlib import Path
from typing import Protocol

from turbotrain.errors import UserError
from turbotrain.files import room_left
from turbotrain.log import say
from turbotrain.rundir import strict_json

BUILTIN = ("jsonl", "tensorboard", "csv", "wandb", "mlflow")


class Tracker(Protocol):
    """A sink for metric rows: `{"step": int, "loss": float, ...}`, one per logged step (eval rows too)."""

    def log(self, row: dict) -> None: ...

    def close(self) -> None: ...


def scalars(row: dict) -> dict[str, float]:
    """The row's numbers other than the step, NaN/inf included: TensorBoard, W&B and MLflow each draw them as such,
    and a loss left out at its NaN would end the curve on the last finite value, hiding what stopped the run.
    (An int too large for a float, a damaged one, is no scalar.)"""
    return {k: float(v) for k, v in row.items() if k != "step" and (
        isinstance(v, float) or isinstance(v, int) and not isinstance(v, bool) and abs(v) < 2 ** 1023)}


def write_error(what: str, path: Path, e: OSError, kept: str = "the rows logged so far are kept") -> UserError:
    """The UserError for a failed write of a run file, in the checkpoint writer's words: the reason (errno), the
    free space, what is kept, the fix."""
    reason = e.strerror or type(e).__name__
    if e.errno in errno.errorcode:
        reason += f" [{errno.errorcode[e.errno]}]"
    free = room_left(path)
    if e.errno in (errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC)):
        fix = f"free {'files' if 'inodes' in free else 'space'} on that disk, or set run.out_dir to another disk"
    else:
        fix = "make it writable, or set run.out_dir to another disk"
    return UserError(f"{what}: cannot write {path} ({reason}{free}); {kept}: {fix}")


def append_whole(f, data: bytes) -> None:
    """Append `data` to `f` (opened by open_run_file in mode "a") whole or not at all, unbuffered: on a failure
    (a full disk: the first part fits, the rest does not) the file is cut back to its length before, so it ends
    with the last whole row, and the OSError is raised. Nothing stays buffered in `f`: closing it cannot fail
    again over the same write."""
    fd = f.fileno()
    size = os.fstat(fd).st_size  # O_APPEND: the row goes at the end
    view = memoryview(data)
    try:
        while view:
            n = os.write(fd, view)
            if n <= 0:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            view = view[n:]
    except OSError:
        with contextlib.suppress(OSError):
            os.ftruncate(fd, size)
        raise


def _close_metrics_file(tracker) -> None:
    """Close a tracker's file (`f`, `path`, `failed`); after a failed write it stays quiet."""
    try:
        tracker.f.close()
    except OSError as e:  # a network file system reports a lost write at close
        if not tracker.failed:
            tracker.failed = True
            raise write_error("metrics", tracker.path, e) from None


class JsonlTracker:
    """metrics.jsonl: one JSON object per row, full float precision (the run's record; always on). Each row is
    one unbuffered append, cut back out when it does not fit: the file never ends in half a row."""

    def __init__(self, run_dir: Path):
        from turbotrain.rundir import open_run_file

        self.path = run_dir / "metrics.jsonl"
        self.f = open_run_file(self.path, "a")
        self.failed = False

    def log(self, row: dict) -> None:
        try:
            append_whole(self.f, (strict_json(row) + "\n").encode())
        except OSError as e:
            self.failed = True
            raise write_error("metrics", self.path, e) from None

    def close(self) -> None:
        _close_metrics_file(self)


def _after_existing_event_files(tb_dir: Path) -> None:
    """TensorBoard reads a run's event files in name order, and the purge of redone steps only works when the
    resumed run's file comes last. Names are events.out.tfevents.<second>.<host>.<pid>.<counter>: within one
    second the pid and counter compare as text ("10" < "9"), so a resume in the second its crashed run started
    would be read first. Waiting for the next second (at most one) makes the time decide the order."""
    parts = [p.name.split(".") for p in tb_dir.glob("events.out.tfevents.*")]
    last = max((int(n[3]) for n in parts if len(n) > 3 and n[3].isdigit()), default=0)
    deadline = time.monotonic() + 1.1  # a file stamped in the future (a skewed clock) costs no more than this
    while time.time() < last + 1 and time.monotonic() < deadline:
        time.sleep(0.05)


class TensorBoardTracker:
    """tb/: scalars by step. On resume the events of the redone steps (after the checkpoint) are purged.
    TensorBoard writes in a background thread; a write error there (a full disk) ends that thread and comes
    back from the next add_scalar, flush or close: it is said once, as a UserError (see _quiet_writer_threads)."""

    def __init__(self, run_dir: Path, start_step: int = 0):
        from torch.utils.tensorboard import SummaryWriter

        from turbotrain.report import refuse_links

        self.dir, self.failed = run_dir / "tb", False
        refuse_links([], folders=[self.dir])  # a file there (EEXIST, "make it writable") or a link to elsewhere
        _quiet_writer_threads()
        _after_existing_event_files(self.dir)
        try:
            self.w = SummaryWriter(str(self.dir), purge_step=start_step + 1 if start_step else None)
        except OSError as e:  # the first event (the file version) is written and flushed at once
            raise self._error(e) from None

    def log(self, row: dict) -> None:
        try:
            for k, v in scalars(row).items():
                self.w.add_scalar(k, v, row["step"])
        except OSError as e:
            raise self._error(e) from None

    def close(self) -> None:
        try:
            self.w.close()  # flushes: the writer thread's error, if any, comes back here
        except OSError as e:
            if not self.failed:
                raise self._error(e) from None

    def _error(self, e: OSError) -> UserError:
        self.failed = True
        return write_error("monitor.trackers tensorboard", self.dir, e, kept="the events logged so far are kept")


def _quiet_writer_threads() -> None:
    """TensorBoard's writer thread (tensorboard.summary.writer.event_file_writer._AsyncWriterThread) keeps the
    exception that ends it and re-raises it, so Python prints a thread traceback; the writer raises the same
    exception again to its owner at the next add_event, flush or close (_AsyncWriter._check_worker_status),
    where TensorBoardTracker turns it into one UserError line. This threading.excepthook (installed when it is
    not the current one) leaves out the thread's print of such an OSError, one the thread kept for its owner;
    every other thread's exception goes to the hook that was there before."""
    if getattr(threading.excepthook, "quiets_tensorboard_writer", False):
        return
    try:
        from tensorboard.summary.writer.event_file_writer import _AsyncWriterThread
    except ImportError:  # another tensorboard layout: its threads print as before
        return
    previous = threading.excepthook

    def hook(args) -> None:
        if (isinstance(args.thread, _AsyncWriterThread) and isinstance(args.exc_value, OSError)
                and getattr(args.thread, "exception", None) is args.exc_value):
            return
        previous(args)

    hook.quiets_tensorboard_writer = True
    threading.excepthook = hook


class CsvTracker:
    """metrics.csv: one line per row, a column per key seen so far. A row that brings a new key (the first eval
    row, GPU readings) rewrites the file once with the wider header; on resume the rows after the checkpoint go.
    A row is appended whole or not at all; after a failed write the next row rewrites the file (all rows)."""

    def __init__(self, run_dir: Path, start_step: int = 0):
        self.path, self.fields, self.rows, self.failed = run_dir / "metrics.csv", ["step"], [], False
        if start_step and self.path.is_file() and not self.path.is_symlink():
            self.rows = _kept_rows(self.path, start_step)
            self.fields = list(dict.fromkeys(k for r in self.rows for k in r)) or ["step"]
        self._rewrite()

    def log(self, row: dict) -> None:
        new = [k for k in row if k not in self.fields]
        self.rows.append(row)
        if new or self.failed or self.f.closed:  # after a failed write: every row again, whole
            self.fields += new
            self._rewrite()
        else:
            buf = io.StringIO(newline="")
            self._writer(buf).writerow(row)
            try:
                append_whole(self.f, buf.getvalue().encode(self.f.encoding))
            except OSError as e:
                self.failed = True
                raise write_error("metrics", self.path, e) from None

    def _writer(self, f) -> csv.DictWriter:
        return csv.DictWriter(f, self.fields, restval="", extrasaction="ignore")

    def _rewrite(self) -> None:
        from turbotrain.rundir import open_run_file, write_run_file

        if hasattr(self, "f"):
            self.close()
        buf = io.StringIO(newline="")
        w = self._writer(buf)
        w.writeheader()
        w.writerows(self.rows)
        try:
            write_run_file(self.path, buf.getvalue())  # atomic: a crash mid-rewrite keeps the old file
            self.f = open_run_file(self.path, "a")
        except OSError as e:
            self.failed = True
            with contextlib.suppress(OSError):  # write_run_file's temp file: not left behind, taking the space
                self.path.with_name(f".{self.path.name}.tmp").unlink(missing_ok=True)
            raise write_error("metrics", self.path, e) from None
        self.failed = False

    def close(self) -> None:
        if hasattr(self, "f") and not self.f.closed:
            _close_metrics_file(self)


def _kept_rows(path: Path, start_step: int) -> list[dict]:
    """metrics.csv's rows up to a resume's step, leniently (the file is a copy of metrics.jsonl's rows, and the
    rewrite that follows drops what is left out): damaged bytes read as U+FFFD, and a line cut short, of the wrong
    width or that the csv module refuses (a field past its size limit) is no row."""
    try:
        with open(path, encoding="utf-8", errors="replace", newline="") as f:
            text = f.read()
    except OSError as e:
        raise UserError(f"cannot read {path} ({e.strerror or e}); move it aside to resume this run") from None
    if not text.endswith("\n"):  # a line cut short (a crash mid-write): not a row
        text = text[:text.rfind("\n") + 1]
    reader, rows = csv.DictReader(io.StringIO(text, newline="")), []
    while True:
        try:
            r = next(reader)
        except StopIteration:
            return rows
        except csv.Error:  # the reader goes on at the next line
            continue
        if (None not in r and None not in r.values()  # a short or long (damaged) line
                and r.get("step", "").isdigit() and int(r["step"]) <= start_step):
            rows.append(r)


class WandbTracker:
    """Weights & Biases: one W&B run per start of the process (a resume starts a new W&B run, tagged with the
    step it resumed from, so no step is drawn twice). Its local files go to {run_dir}/wandb; WANDB_MODE=offline
    keeps them there (`wandb sync` uploads them later). Project: $WANDB_PROJECT, else "turbotrain"."""

    best_effort = True  # a failure mid-run turns W&B off with a warning, not the run (MetricsLogger)

    def __init__(self, run_dir: Path, start_step: int = 0):
        wandb = _import("wandb")
        (run_dir / "wandb").mkdir(exist_ok=True)
        self.run = wandb.init(project=os.environ.get("WANDB_PROJECT", "turbotrain"), name=run_dir.name,
                              dir=str(run_dir), config={"run_dir": str(run_dir), "resumed_from": start_step},
                              reinit="create_new", settings=wandb.Settings(console="off"))  # our console stays ours

    def log(self, row: dict) -> None:
        self.run.log(scalars(row), step=row["step"])

    def close(self) -> None:
        self.run.finish()


class MlflowTracker:
    """MLflow: one MLflow run per start of the process (like W&B) in the experiment "turbotrain" (or
    $MLFLOW_EXPERIMENT_NAME), logged to $MLFLOW_TRACKING_URI, else to a store in {run_dir}/mlflow: SQLite
    where SQLAlchemy is installed (full mlflow), else MLflow's file store (mlflow-skinny; MLflow >= 3.7 wants
    MLFLOW_ALLOW_FILE_STORE=true for it). Uses a client of its own: the global MLflow state is left alone."""

    best_effort = True  # a failure mid-run turns MLflow off with a warning, not the run (MetricsLogger)

    def __init__(self, run_dir: Path, start_step: int = 0):
        _import("mlflow")
        from mlflow.tracking import MlflowClient

        uri = os.environ.get("MLFLOW_TRACKING_URI") or _local_store(run_dir / "mlflow")
        name = os.environ.get("MLFLOW_EXPERIMENT_NAME", "turbotrain")
        try:
            self.client = MlflowClient(tracking_uri=uri)
            exp = self.client.get_experiment_by_name(name)
        except Exception as e:  # noqa: BLE001 - MlflowException and the store's own errors: one line, no traceback
            reason = str(e).split(". ")[0].splitlines()[0]
            raise UserError(f"monitor.trackers mlflow: cannot open the tracking store {uri} ({reason}); set "
                            f"MLFLOW_TRACKING_URI, or MLFLOW_ALLOW_FILE_STORE=true for a file store") from None
        exp_id = exp.experiment_id if exp is not None else self.client.create_experiment(name)
        self.run_id = self.client.create_run(exp_id, run_name=run_dir.name,
                                             tags={"turbotrain.resumed_from": str(start_step)}).info.run_id

    def log(self, row: dict) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        self.client.log_batch(self.run_id, metrics=[Metric(k, v, now, row["step"]) for k, v in scalars(row).items()])

    def close(self) -> None:
        self.client.set_terminated(self.run_id)


def _local_store(folder: Path) -> str:
    import importlib.util

    folder.mkdir(exist_ok=True)
    if importlib.util.find_spec("sqlalchemy") is not None:
        return f"sqlite:///{(folder / 'mlflow.db').resolve()}"
    return folder.resolve().as_uri()


def _import(name: str):
    import importlib

    try:
        return importlib.import_module(name)
    except ImportError:
        raise UserError(_not_installed(name)) from None


def _not_installed(name: str) -> str:
    return (f"monitor.trackers names {name!r} but {name} is not installed: pip install {name} "
            f"(or turbotrain[trackers]), or remove it from monitor.trackers")


def tracker_problem(spec: str) -> str | None:
    """Why `spec` cannot name a tracker (None: it can), for config validation: a built-in or "pkg.module:factory"."""
    mod, _, attr = spec.partition(":")
    if spec in BUILTIN or (attr.isidentifier() and all(p.isidentifier() for p in mod.split("."))):
        return None
    return f"unknown tracker {spec!r}; expected one of {', '.join(BUILTIN)} or \"pkg.module:factory\""


def trackers_problem(specs: list) -> str | None:
    """Why a `monitor.trackers` list cannot name trackers (None: it can), as a whole UserError message, for the
    config load: each entry a string, a built-in name or of the "pkg.module:factory" form. Nothing here depends
    on the machine (what is installed): a finished run's config.toml must load wherever it is read (export,
    load); `check_trackers` does that part before a run starts."""
    for spec in specs:
        if not isinstance(spec, str):  # a number from TOML, or an object set from Python (config.toml records names)
            return (f"monitor.trackers = {specs!r}: {spec!r} is not a tracker name; expected a list of strings, each "
                    f"one of {', '.join(BUILTIN)} or \"pkg.module:factory\" (a tracker of your own: its factory)")
        if problem := tracker_problem(spec):
            return f"monitor.trackers: {problem}"
    return None


def check_trackers(specs: list[str]) -> None:
    """Before a run touches its directory (MonitorConfig.check_trackers, where train.callbacks are imported):
    the extras of wandb / mlflow installed (found, not imported) and each "pkg.module:factory" of your own
    importable and callable (the user's module is imported here, as train.callbacks' are). One UserError."""
    import importlib.util

    from turbotrain.plugins import load_object

    for spec in specs:
        if spec in ("wandb", "mlflow"):
            try:
                found = importlib.util.find_spec(spec) is not None
            except (ImportError, ValueError):  # a module in sys.modules without a spec: it is there
                found = True
            if not found:
                raise UserError(_not_installed(spec))
        elif ":" in spec:
            _check_factory(spec, load_object(spec, "monitor.trackers"))


def _check_factory(spec: str, factory) -> None:
    """A factory that cannot take `(run_dir, start_step)` is said before the run directory is made."""
    import inspect

    try:
        inspect.signature(factory).bind(Path("."), 0)
    except TypeError:
        raise UserError(f"monitor.trackers = {spec!r}: it is called as factory(run_dir, start_step), which "
                        f"{getattr(factory, '__name__', spec)}{inspect.signature(factory)} does not take; give it "
                        "those two parameters") from None
    except ValueError:  # no signature to read (a builtin): the call itself will tell
        pass


def build_tracker(spec: str | Tracker, run_dir: Path, start_step: int = 0) -> Tracker | None:
    """One tracker from a `monitor.trackers` entry: a built-in name, "pkg.module:factory", or a Tracker object
    (Python API). None when an optional sink is unavailable (TensorBoard not installed: said once)."""
    if not isinstance(spec, str):  # a Tracker object (Python API): it must be one, or the first row fails deep
        if not _is_tracker(spec):
            raise UserError(f"monitor.trackers: {repr(spec)[:60]} is not a tracker (an object with log(row) and "
                            f"close()); pass a tracker name, \"pkg.module:factory\" or such an object")
        return spec
    if spec == "jsonl":
        return JsonlTracker(run_dir)
    if spec == "tensorboard":
        try:
            return TensorBoardTracker(run_dir, start_step)
        except ImportError:
            say("warning: monitor: tensorboard is not installed, so this run writes no TensorBoard events (tb/); "
                "pip install tensorboard, or leave \"tensorboard\" out of monitor.trackers")
            return None
    if spec in ("csv", "wandb", "mlflow"):
        return {"csv": CsvTracker, "wandb": WandbTracker, "mlflow": MlflowTracker}[spec](run_dir, start_step)
    if ":" in spec:
        from turbotrain.plugins import call_user, load_object

        tracker = call_user(load_object(spec, "monitor.trackers"), f"monitor.trackers: {spec}", run_dir, start_step)
        if not _is_tracker(tracker):  # a factory that forgot its `return` would log nowhere, silently
            raise UserError(f"monitor.trackers: {spec}(run_dir, start_step) returned {repr(tracker)[:60]}, not a "
                            f"tracker (an object with log(row) and close()); return one from the factory")
        return tracker
    raise UserError(f"monitor.trackers: {tracker_problem(spec)}")


def _is_tracker(obj) -> bool:
    return callable(getattr(obj, "log", None)) and callable(getattr(obj, "close", None))
