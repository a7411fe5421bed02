"""Callbacks: the user's code at fixed points of the loop, without owning the loop and without slowing the
step. A callback never gets a device tensor: `State.loss` is a float at log steps (where the loop syncs
anyway) and None between them, so no hook can add a host↔device sync by reading it.

    from turbotrain.callbacks import Callback

    class CountSteps(Callback):
        def __init__(self):
            self.n = 0

        def on_step_end(self, state):
            self.n += 1

        def on_log(self, state):          # numbers returned here join the metrics.jsonl row
            return {"steps_seen": self.n}

From the config: `train.callbacks = ["mypkg.cbs:CountSteps"]` (built with no arguments); from Python:
`turbotrain.train(cfg, callbacks=[CountSteps()])`.
"""
from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any, Mapping

import numpy as np
from torch import nn

from turbotrain.accel.weight_copies import forget as forget_copies
from turbotrain.checkpoint import rng_kept
from turbotrain.errors import UserError
from turbotrain.log import say_once
from turbotrain.monitor.run_monitor import ROW_NAMES
from turbotrain.plugins import call_factory, call_user, factory_label, load_object


@dataclass(frozen=True, kw_only=True)
class State:
    """A read-only view of the run at a hook."""

    step: int  # optimizer steps done
    total_steps: int
    loss: float | None  # the logged loss at log steps; None between them (reading it would sync the device)
    metrics: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))  # the last logged row
    model: nn.Module | None = None  # the user's model (unwrapped from DDP and the loss)
    run_dir: Path | None = None


class Callback:
    """Override the hooks you need; each is a no-op here. `on_log` may return extra numeric metrics under new
    names (not the row's, not val_*: evaluation's; a val metric is a train.eval_metrics function). A hook may
    draw random numbers: the global RNGs are put back after it, so training's stream (dropout) is unchanged."""

    def on_train_start(self, state: State) -> None: ...

    def on_step_end(self, state: State) -> None: ...

    def on_log(self, state: State) -> Mapping[str, float] | None: ...

    def on_eval_end(self, state: State) -> None: ...

    def on_checkpoint(self, state: State, path: Path) -> None: ...

    def on_train_end(self, state: State, summary: Mapping[str, Any]) -> None: ...


def build_callbacks(specs: list[str], given: list | tuple = ()) -> list[Callback]:
    """Callbacks named in `train.callbacks` (each built with no arguments), then the ones given in Python."""
    if not isinstance(given, (list, tuple)):
        raise UserError(f"train(callbacks=...): got {type(given).__name__}; pass a list of callback objects")
    built = [call_factory(load_object(spec, "train.callbacks"), "train.callbacks") for spec in specs]
    for cb in given:
        if isinstance(cb, type):  # its hooks would be unbound functions, missing `self`
            raise UserError(f"train(callbacks=...): {cb.__name__} is a class; pass an instance ({cb.__name__}())")
    for cb in given:
        if isinstance(cb, str):  # "pkg.cbs:MyCallback" is a config spec: in code, the object itself is passed
            raise UserError(f"train(callbacks=...): got the string {cb!r}; pass callback objects there, or set the "
                            f"spec in the config: train.callbacks = [{cb!r}]")
    for cb, name in zip([*built, *given], [*(f"train.callbacks: {s}" for s in specs),
                                           *(f"train(callbacks=...): {type(g).__name__}" for g in given)]):
        # a misspelt or another framework's hook (on_epoch_end, on_validation_end) would never be called: said
        unknown = [a for a in dir(cb) if a.startswith("on_") and a not in HOOKS and callable(getattr(cb, a, None))]
        if unknown:
            raise UserError(f"{name}.{unknown[0]} is not a hook turbotrain calls; the hooks are "
                            f"{', '.join(HOOKS)}: rename it, or give it a name not starting with on_")
        if not any(callable(getattr(cb, h, None)) for h in HOOKS):
            raise UserError(f"{name} has none of the hooks of turbotrain.callbacks.Callback "
                            f"({', '.join(HOOKS)})")
    return [*built, *given]


HOOKS = ("on_train_start", "on_step_end", "on_log", "on_eval_end", "on_checkpoint", "on_train_end")


def eval_metric_fns(train_cfg) -> dict:
    """`train.eval_metrics` as {name: fn}: each fn(outputs, targets) -> number, averaged over the val batches."""
    if train_cfg.eval_metrics and train_cfg.loss == "model":
        raise UserError("train.eval_metrics need the model's outputs, and train.loss = \"model\" returns only the "
                        "loss: compute the metric in the model, or use a loss function")
    fns = {}
    for spec in train_cfg.eval_metrics:
        fn = load_object(spec, "train.eval_metrics")
        name = getattr(fn, "__name__", spec.rpartition(":")[2])
        if name in fns or name in ("loss", "acc"):  # logged as val_<name>: it would replace another column
            raise UserError(f"train.eval_metrics = {spec!r}: its name would be logged as val_{name}, which "
                            f"{'another metric' if name in fns else 'turbotrain'} already writes; rename the function")
        fns[name] = fn
    return fns


class Hooks:
    """Calls every callback's hook that exists, in order; `log` merges their extra metrics into a row."""

    def __init__(self, callbacks: list, total_steps: int, model: nn.Module, run_dir: Path):
        from turbotrain.models.structure import unwrap

        self.callbacks, self.total, self.model, self.run_dir = callbacks, total_steps, unwrap(model), run_dir
        self.row: Mapping[str, Any] = MappingProxyType({})

    def state(self, step: int, loss: float | None = None) -> State:
        return State(step=step, total_steps=self.total, loss=loss, metrics=self.row, model=self.model,
                     run_dir=self.run_dir)

    def call(self, hook: str, step: int, *args, loss: float | None = None) -> list:
        """Each callback's `hook(state, *args)`; the state is only built when some callback has the hook."""
        fns = [(getattr(cb, hook), cb) for cb in self.callbacks if callable(getattr(cb, hook, None))]
        state = self.state(step, loss) if fns else None
        out = []
        for fn, cb in fns:
            who, training = f"train.callbacks: {factory_label(type(cb))}.{hook}", self.model.training
            # a hook's random draws (sampling text, say) leave training's RNG stream alone: on_checkpoint's come after
            # the checkpoint saved the stream, on_train_start's after a resume restored it, and either would move a
            # resumed run off the uninterrupted run's curve
            with rng_kept():
                out.append(call_user(fn, who, state, *args))
            if out[-1] is not None and hook != "on_log":  # metrics or a stop flag returned here would be lost unsaid
                say_once(f"warning: {who} returned {type(out[-1]).__name__}; turbotrain ignores what this hook returns "
                         "(only on_log's: a dict of extra metrics to log)")
            # a sampling hook's model.eval() would have the rest of the run train without dropout, on BatchNorm's
            # running statistics; after on_train_end the model is the caller's to switch
            if self.model.training != training and hook != "on_train_end":
                self.model.train(training)
                say_once(f"warning: {who} switched the model to {'eval' if training else 'train'} mode and left it "
                         f"so; turbotrain switched it back (a hook that runs the model must restore its mode)")
        if any(getattr(type(cb), hook, None) is not getattr(Callback, hook, None) for _, cb in fns):
            forget_copies(self.model)  # the hook may have written weights through .data: no version counter moves
        return out

    def reads_rows(self) -> bool:
        """Whether a callback has an on_log of its own (Callback's is a no-op): it may read the model or the run
        at that step, so the loop builds rows at their step (no deferred rows: trainer._write_deferred)."""
        return any(callable(getattr(cb, "on_log", None)) and getattr(type(cb), "on_log", None) is not Callback.on_log
                   for cb in self.callbacks)

    def log(self, row: dict) -> None:
        """At a log step: the callbacks see the row and may add numbers to it (never overwrite a key)."""
        self.row = MappingProxyType(dict(row))
        for extra in self.call("on_log", row["step"], loss=row.get("loss")):
            if extra is not None and not isinstance(extra, Mapping):
                raise UserError(f"train.callbacks: on_log returned {type(extra).__name__}; return None or a dict "
                                "of new metric names to numbers")
            for key, value in (extra or {}).items():
                row[key] = _extra_metric(key, value, row)
        self.row = MappingProxyType(dict(row))


def _extra_metric(key: Any, value: Any, row: dict) -> float | int | None:
    """A metric a callback's on_log adds, as the row holds it (non-finite: None, which JSON can hold). Its name
    must be a new one on every row, not only on this one: evaluation rows add val_*, and a callback's val_loss
    on the other rows would sit in metrics.jsonl as if measured. Its value must be a real number a float can
    hold (TensorBoard's scalars are floats)."""
    if not isinstance(key, str) or not key.strip() or key in row or key in ROW_NAMES or key.startswith("val_"):
        raise UserError(f"train.callbacks: on_log returned the metric name {key!r}; extra metrics need new names: "
                        f"non-empty strings, not the trainer's ({', '.join(sorted(ROW_NAMES)[:6])}, ...; all in "
                        f"docs/monitoring.md) nor val_* (evaluation's)")
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
        raise UserError(f"train.callbacks: on_log returned {key!r} = {value!r:.80}; extra metrics need numeric "
                        f"values (an int or a float)")
    try:
        finite = math.isfinite(float(value))
    except OverflowError:
        raise UserError(f"train.callbacks: on_log returned {key!r} = a number beyond what a float holds (about "
                        f"1.8e308); scale it down") from None
    return (value.item() if isinstance(value, np.generic) else value) if finite else None
