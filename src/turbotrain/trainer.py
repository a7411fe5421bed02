"""The spine: prepare the run (prepare.py), then the loop — fetch → step → monitor → eval → stop/checkpoint.

Usage (Python API, same as the CLI):
    from turbotrain import load_config, train
    summary = train(load_config("gpt-shakespeare", ["train.steps=30"]))
    summary = train(cfg, model=my_model, train_data=my_ds, val_data=my_val, loss_fn=my_loss)
"""
from __future__ import annotations

import math
import os
import signal
import threading
import time
from contextlib import nullcontext
from typing import TYPE_CHECKING

from torch import nn
from torch.utils.data import Dataset

from turbotrain.accel.attention import attention_backend, model_ops
from turbotrain.accel.compile import compile_stats
from turbotrain.accel.compile_cache import save_compile_cache
from turbotrain.callbacks import Hooks, build_callbacks, eval_metric_fns, rng_kept
from turbotrain.distributed.env import DistEnv, LaggedVote, all_mean, shutdown
from turbotrain.export import write_final
from turbotrain.log import Heartbeat, is_rank0, say
from turbotrain.monitor.run_monitor import RunMonitor
from turbotrain.prepare import Run, check_config, prepare, process_state_kept
from turbotrain.rundir import strict_json, write_run_file
from turbotrain.step import EvalFailed, UserError, evaluate, first_train_step, train_step  # errors.UserError, via step

if TYPE_CHECKING:
    from turbotrain.losses import LossFn


def train(cfg, model: nn.Module | None = None, train_data: Dataset | None = None, val_data: Dataset | None = None,
          loss_fn: LossFn | None = None, callbacks: list | tuple = ()) -> dict:
    """Train per `cfg` (a `Config`); returns the summary (also written to summary.json by rank 0).
    `callbacks`: objects with the hooks of `turbotrain.callbacks.Callback`, after those of train.callbacks."""
    cfg = check_config(cfg)
    t_start, stop, run = time.perf_counter(), None, None
    with process_state_kept():  # the caller's RNG, TF32 and environment are theirs again after the run
        try:
            cbs, metrics = build_callbacks(cfg.train.callbacks, callbacks), eval_metric_fns(cfg.train)
            env = DistEnv.from_environ()
            cfg.monitor.check_sinks(env.local_rank, env.is_main)  # trackers importable, port free: before the run dir
            run = prepare(cfg, model, train_data, val_data, loss_fn)  # Ctrl-C here interrupts at once: nothing saved
            hooks = Hooks(cbs, run.cfg.train.steps, run.trainee.model, run.rundir.path)
            # from here until the final checkpoint and summary are written, a signal waits (a second Ctrl-C does not)
            stop = StopRequest(saves=bool(run.cfg.checkpoint.every), ranks=run.env.world_size)
            kernels = run.cfg.kernels  # the attention settings and model ops are in force while compile traces
            with attention_backend(kernels.attention, run.trainee.device), model_ops(kernels):
                return _train(run, hooks, metrics, stop, t_start)
        except StopNow as e:  # the exit a scheduler reads (143: stopped by SIGTERM), from wherever it landed
            raise SystemExit(128 + e.signum) from None
        finally:
            if stop is not None:
                stop.restore()
            if run is not None:
                run.close()
            shutdown()


def _train(run: Run, hooks: Hooks, metrics: dict, stop: StopRequest, t_start: float) -> dict:
    monitor = RunMonitor(run.rundir.path, run.env, run.trainee.device, run.cost, steps=run.cfg.train.steps,
                         start_step=run.start_step, max_bad_steps=run.cfg.train.max_bad_steps,
                         straggler_ratio=run.cfg.parallel.straggler_ratio, cfg=run.cfg.monitor,
                         scaler=run.trainee.scaler, read_step=run.batches.read_step)
    try:
        hooks.call("on_train_start", run.start_step)
        done = _loop(run, monitor, hooks, metrics, stop)
    except Stopped as e:
        say(f"{e}; " + ("checkpoint saved — rerun the same command to resume" if e.saved else
                       "no checkpoint of it (non-finite): a rerun resumes from the last good checkpoint, if any"
                       if run.cfg.checkpoint.every else "checkpointing is off (checkpoint.every=0): progress is lost"))
        raise SystemExit(128 + e.signum)
    finally:
        monitor.close()
    if run.cfg.checkpoint.every or run.cfg.checkpoint.final:
        run.refuse_nonfinite_weights(done)  # a loss can stay finite over NaN weights: never saved
    # final/ before the end checkpoint: a crash between them leaves steps for the rerun to redo (and final/ to write
    # again); the other order could leave a finished run without final/, which no rerun writes
    if run.cfg.checkpoint.final:
        write_final(run.trainee.model, run.cfg, run.rundir.path, run.env.is_main, step=done)  # the model, always
    saved = run.save_checkpoint(done) if run.cfg.checkpoint.every else []
    summary = _summary(run, monitor, done, t_start)  # summary.json last: it marks the run finished (watch, report)
    # the end checkpoint's hook after summary.json: a hook that raises would leave a finished run unmarked, read as
    # crashed, with a rerun that finds nothing left to train (and so never writes the summary)
    for saved_step, path in saved:
        hooks.call("on_checkpoint", saved_step, path)
    hooks.call("on_train_end", done, summary, loss=summary["final_loss"])
    if stop.signum:
        say(f"received {signal.Signals(stop.signum).name} during the final save; the run had finished and is saved")
    say(f"done: {summary['steps']} steps in {summary['wall_s']:.1f}s, loss {summary['final_loss']:.4f}"
        + (f", val_loss {summary['val_loss']:.4f}" if summary.get("val_loss") is not None else "")
        + f" → {run.rundir.path}")
    return summary


def _summary(run: Run, monitor: RunMonitor, done: int, t_start: float) -> dict:
    """The run's summary, written to summary.json by rank 0."""
    tr = run.trainee
    summary = monitor.summary(done, time.perf_counter() - t_start, run.cfg.compile.enabled, run.info)
    if run.cfg.compile.enabled:
        if tr.compiled:  # evaluation's graphs too, compiled after the first step
            save_compile_cache(run.compile_cache, run.env.is_main)
        summary.update(compile_fell_back=not tr.compiled, **compile_stats())
        say(f"compile: {summary['compile_s']:.1f} s; FX graphs: {summary['fxgraph_cache_hit']} from the cache, "
            f"{summary['fxgraph_cache_miss']} compiled")
    if run.env.is_main:
        write_run_file(run.rundir.path / "summary.json", strict_json(summary, indent=2))
    return summary


def _loop(run: Run, monitor: RunMonitor, hooks: Hooks, metrics: dict, stop: StopRequest) -> int:
    """Steps from the start (or resumed) step to train.steps; returns the last step done."""
    t, tr, every, done = run.cfg.train, run.trainee, run.cfg.checkpoint.every, run.start_step
    d, vote = run.cfg.data, LaggedVote(tr.device) if run.env.world_size > 1 else None
    defer = monitor.can_defer and not hooks.reads_rows()  # a callback's on_log sees the row at its own step
    tr.model.train()
    loss = grad_norm = None  # the step before's: none yet in this process
    for step in range(run.start_step, t.steps):
        done = step + 1
        is_log = done % t.log_every == 0 or done == t.steps
        is_eval = (t.eval_every and done % t.eval_every == 0) or done == t.steps
        micro = _fetch(run, monitor, hooks, step, loss, grad_norm)  # fetch (prefetched asynchronously)
        lr = tr.opt.param_groups[0]["lr"]  # what this step uses (the step then advances the schedule)
        if step == run.start_step:  # compile happens here (a compiler error falls back to eager), shapes fail here
            with Heartbeat("compile: compiling the model in the first step") if tr.compiled else nullcontext(), \
                    run.blame_batch(micro, done):
                loss, grad_norm = first_train_step(tr, micro, t.grad_clip)
            stop.at_once = False
            if tr.compiled:  # the compile artifacts for the next run; writing them is not training time
                monitor.exclude(save_compile_cache(run.compile_cache, run.env.is_main))
        else:
            with run.blame_batch(micro, done):  # a batch that breaks the data contract is named, not a traceback
                loss, grad_norm = train_step(tr, micro, t.grad_clip, want_norm=is_log, fwd_timer=monitor.fwd_timer)
        _write_deferred(run, monitor, hooks)  # the last log step's row: read now that this step is queued behind it
        monitor.after_step(done, loss)  # on the device: no sync
        hooks.call("on_step_end", done)  # host values only: no sync
        if defer and is_log and not is_eval and done < t.steps and not (every and done % every == 0):
            monitor.snapshot(done, loss, grad_norm, float(lr), run.batches.wait_s, micro)  # no sync
        elif is_log or is_eval:
            with run.blame_batch(micro, done):  # a NaN stop on a batch holding NaN says so
                row = monitor.measure(done, loss, grad_norm, float(lr), run.batches.wait_s, micro)  # sync point
            if is_eval:
                try:  # the val data's random draws (augmentation) leave training's stream as it was: else
                    with rng_kept():  # train.eval_every alone would change the loss curve, and a resume's
                        row.update(evaluate(tr, run.val_ds, d.batch_size, d.eval_batches, t.grad_accum, run.env,
                                            metrics))
                except EvalFailed as e:
                    monitor.write(row, run.batches.wait_s)  # the step's own figures, measured: kept
                    raise _saved_first(run, hooks, done, e, loss, grad_norm) from None
            hooks.log(row)
            monitor.write(row, run.batches.wait_s)
            if is_eval:
                hooks.call("on_eval_end", done, loss=row["loss"])
        # at the last step the run ends as a finished one (end checkpoint, final/, summary): a stop there would
        # leave no final/, and the rerun it asks for would find nothing left to train
        if done < t.steps and _agreed_stop(stop, vote):
            _write_deferred(run, monitor, hooks)
            saved = bool(every) and _finite(run, loss, grad_norm)  # a NaN checkpoint would be the one resumed
            if saved:
                _save(run, hooks, done)
            raise Stopped(stop.signum, done, saved)
        if every and done % every == 0 and done < t.steps and _finite(run, loss, grad_norm):  # sync point
            t0 = time.perf_counter()
            _save(run, hooks, done, wait=False)  # the end and stop saves wait for theirs
            monitor.exclude(time.perf_counter() - t0)  # a save is not training time
    return done


def _fetch(run: Run, monitor: RunMonitor, hooks: Hooks, step: int, loss, grad_norm) -> list:
    """The micro-batches of `step`. The user's data failing to read them ends the run (one error line), but the
    `step` steps trained before it are good: as for a failed evaluation, they are saved first (`loss`, `grad_norm`:
    the step before's; None when no step trained yet in this process)."""
    try:
        return [next(run.batches) for _ in range(run.cfg.train.grad_accum)]
    except UserError as e:
        every = run.cfg.checkpoint.every
        if loss is None or (every and step % every == 0):  # the checkpoint resumed from, or the one just saved
            raise
        _write_deferred(run, monitor, hooks)  # the last log step's row goes with its checkpoint
        raise _saved_first(run, hooks, step, e, loss, grad_norm) from None


def _write_deferred(run: Run, monitor: RunMonitor, hooks: Hooks) -> None:
    """The row of a log step whose values `monitor.snapshot` took without a sync, if one is pending."""
    if monitor.pending is None:
        return
    pending = monitor.pending
    with run.blame_batch(pending.batch, pending.done):  # a NaN stop on a batch holding NaN says so
        row = monitor.deferred()
    hooks.log(row)
    monitor.write(row, pending.wait_s, overlapped=True)


def _save(run: Run, hooks: Hooks, step: int, wait: bool = True) -> None:
    """Save; `on_checkpoint` sees each checkpoint once it is on disk (an async one: at the next save)."""
    for saved_step, path in run.save_checkpoint(step, wait=wait):
        hooks.call("on_checkpoint", saved_step, path)


def _saved_first(run: Run, hooks: Hooks, done: int, error: UserError, loss, grad_norm) -> UserError:
    """The user's val data, eval-mode model or training data failing ends the run, but the bug is not in the
    training: in one process the steps trained since the last checkpoint are saved first (with several ranks the
    others may wait in a collective, and a save would hang with them)."""
    run.trainee.model.train()  # as training left it (the Python API's caller may go on with the model)
    if not run.cfg.checkpoint.every or run.env.world_size > 1 or not _finite(run, loss, grad_norm):
        return error
    _save(run, hooks, done)
    after = (f"a rerun resumes from step {done}" if done < run.cfg.train.steps else
             f"`turbotrain export {run.rundir.path} --format safetensors` writes the model from it")
    # of the error's own class: an evaluation out of memory stays a MemoryError to a Python caller
    kind = type(error) if isinstance(error, EvalFailed) else UserError
    return kind(f"{error} (the {done} steps trained are saved in checkpoints/step-{done:08d}: {after})")


def _finite(run: Run, loss, grad_norm) -> bool:
    """A checkpoint of NaN weights would poison every resume: skip the save on a non-finite step
    (decided together, so every rank saves or none does). Under fp16's loss scaling an inf gradient norm is a step
    the scaler skipped, not a fault: its weights are the last good ones (nonfinite_weights checks them anyway)."""
    scaled = run.trainee.scaler.is_enabled()
    bad = not math.isfinite(loss.item()) or \
        (grad_norm is not None and not scaled and not math.isfinite(grad_norm.item()))
    ok = all_mean([float(bad)], run.trainee.device)[0] == 0 and run.nonfinite_weights() is None
    if not ok:
        say("warning: non-finite loss, gradients or weights at a checkpoint step; checkpoint skipped")
    return ok


def _agreed_stop(stop: StopRequest, vote: LaggedVote | None) -> bool:
    """Single process: stop after the current step. Several ranks agree each step, a step late (LaggedVote: no
    sync), so that all of them save the same step whatever train.log_every."""
    if vote is None:
        return stop.signum != 0
    agreed = vote.step(bool(stop.signum))
    if agreed and not stop.signum:
        stop.signum = signal.SIGTERM
    return agreed


class StopRequest:
    """SIGTERM/SIGINT set a flag; the loop finishes the step, saves a checkpoint and exits. A second SIGINT (Ctrl-C
    again) raises KeyboardInterrupt at once; a repeated SIGTERM waits, as a scheduler may send it more than once.
    Until the first step is done (`at_once`) a signal stops at once: that step compiles, for minutes on a CPU, and
    nothing this process trained would be saved by waiting for it."""

    def __init__(self, saves: bool = True, ranks: int = 1):
        self.signum, self.saves, self.at_once, self.ranks = 0, saves, True, ranks
        self._old = {}
        if threading.current_thread() is threading.main_thread():  # handlers can only be set there
            # a handler installed outside Python (an embedding host) reads as None and cannot be put back: kept
            self._old = {sig: signal.signal(sig, self._handle) for sig in (signal.SIGTERM, signal.SIGINT)
                         if signal.getsignal(sig) is not None}

    def _handle(self, signum, frame) -> None:
        if self.at_once:  # BaseExceptions: a compile's fallback to eager (except Exception) must not swallow them
            self.restore()
            _say_now(f"{signal.Signals(signum).name} before the first step finished: stopping now (nothing of this "
                     "run's training to save yet)")
            raise KeyboardInterrupt if signum == signal.SIGINT else StopNow(signum)
        if signum == signal.SIGINT and self.signum:  # Ctrl-C again: the user will not wait (a step hung on a read)
            self.restore()
            raise KeyboardInterrupt
        if not self.signum:  # a long step or evaluation is silent until it ends: say what comes
            then = "saving and exiting" if self.saves else "exiting (checkpoint.every=0: nothing is saved)"
            steps = "this step" if self.ranks == 1 else "this step and the next (the ranks agree where to stop)"
            _say_now(f"{signal.Signals(signum).name}: finishing {steps}, then {then} (Ctrl-C again: stop at once, "
                     "without saving this step)")
        self.signum = signum

    def restore(self) -> None:
        for sig, handler in self._old.items():
            signal.signal(sig, handler)
        self._old = {}


def _say_now(msg: str) -> None:
    """From a signal handler (rank 0): os.write, as a print here could re-enter the print the loop is in."""
    if is_rank0():
        try:
            os.write(1, f"[turbotrain] {msg}\n".encode())
        except OSError:
            pass


class StopNow(BaseException):
    """SIGTERM before the first step finished, raised wherever it lands: in a callback's on_train_start or the
    first batch's read too, whose guards take a SystemExit there for the user's own sys.exit (one user error,
    exit 2). Neither a SystemExit nor an Exception, it passes them as KeyboardInterrupt does; `train` ends the
    process with 128 + signum."""

    def __init__(self, signum: int):
        super().__init__(f"stopped by {signal.Signals(signum).name} before the first step finished")
        self.signum = signum


class Stopped(Exception):
    def __init__(self, signum: int, step: int, saved: bool):
        super().__init__(f"stopped by {signal.Signals(signum).name} at step {step}")
        self.signum, self.step, self.saved = signum, step, saved
