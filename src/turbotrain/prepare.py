"""Build order (torchtitan's): data → model (on the CPU) → resolve the config → run directory → techniques
and optimizer → resume → write `config.toml`. Nothing is written into the run directory until the config is
resolved and a resume is known to work, so a refused run changes nothing of an earlier one.

Usage: `run = prepare(cfg)`; the trainer's loop and `profile` take it from there.
"""
from __future__ import annotations

import contextlib
import copy
import dataclasses
import json
import math
import os
import random
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import torch
from torch import nn
from torch.distributed.tensor import DTensor
from torch.utils.data import Dataset

from turbotrain import contract
from turbotrain.accel.activation_ckpt import checkpointed_blocks
from turbotrain.accel.attention import measure_attention, model_ops
from turbotrain.accel.compile_cache import CompileCache, cache_folder, graph_digest, open_compile_cache
from turbotrain.accel.precision import tf32_kept
from turbotrain.checkpoint import Checkpointer, param_shapes
from turbotrain.config import Config, config_from_dict, to_toml
from turbotrain.data.datasets import map_dict_items
from turbotrain.data.loader import Batches, StepSampler, build_dataset
from turbotrain.distributed import meta_init
from turbotrain.distributed.env import DistEnv, all_mean, init_distributed
from turbotrain.distributed.parallel import SHARDED, data_parallel, resolve_strategy
from turbotrain.errors import UserError
from turbotrain.log import new_run, say
from turbotrain.losses import LossFn, cross_entropy, resolve_loss
from turbotrain.models import BUILTIN, adapt, args_from_data, build_model, estimate_params
from turbotrain.models.structure import WithLoss, model_class_name
from turbotrain.monitor.alerts import NonFiniteLoss
from turbotrain.monitor.flops import flops_per_sample, peak_flops
from turbotrain.monitor.run_monitor import StepCost
from turbotrain.monitor.watchdog import watching
from turbotrain.pipeline import Trainee, build_trainee, give_back
from turbotrain.resolve import facts_of, resolve
from turbotrain.rundir import RunDir, check_shared_run_dir, write_run_file
from turbotrain.workload import data_meta, resolve_device, seed_all


@dataclass(kw_only=True)
class Run:
    """Everything the loop needs, built once."""

    cfg: Config  # the effective config (what config.toml holds)
    env: DistEnv
    rundir: RunDir
    trainee: Trainee
    batches: Batches
    val_ds: Dataset | None
    ckpt: Checkpointer
    start_step: int
    cost: StepCost
    info: dict  # facts of the run for the summary
    shapes: dict  # the whole model's parameter shapes: a checkpoint's identity (a pipeline stage holds a part)
    compile_cache: CompileCache | None = None  # where the first step's compile artifacts are saved
    names: contract.Names = contract.Names()  # how messages name the user's model, data and loss
    classes: int | None = None  # the labels' classes the first batch's cross-entropy saw

    def close(self) -> None:
        """The run dir's lock released and the user's model given back as they built it (`give_back`; blocks
        compiled alone uncompiled)."""
        self.rundir.release()
        give_back(self.trainee.model, self.trainee.device, self.cfg.memory.channels_last)
        for m in self.trainee.compiled:
            m._compiled_call_impl = None
        if self.cfg.compile.enabled:  # dynamo keeps a code object's graphs for the process and stops compiling
            torch._dynamo.reset()  # it at recompile_limit: a notebook's 9th run would train uncompiled, unsaid
        # a failed run's traceback holds this Run for as long as the caller keeps the error (a notebook keeps the
        # last one): its loader's worker processes and the optimizer's state are let go now
        self.batches = self.trainee.opt = None

    @contextlib.contextmanager
    def blame_batch(self, micro_batches: list, step: int):
        """A step that fails inside torch on a batch that breaks the data contract (a label or token id past
        the model's) ends as one UserError naming the data and the step, and a non-finite loss on a batch that
        holds NaN/inf says so; any other failure goes on as it was. The checks run on a CPU copy, after the
        failure: nothing on the good path."""
        try:
            yield
        except NonFiniteLoss as e:
            part = next((p for b in micro_batches if (p := contract.nonfinite_part(b))), None)
            which = "that step's batch"
            if part is None and e.first is not None and e.first != step:  # NaN weights carry it on from there
                part, which = self._nonfinite_at(e.first), f"the batch of step {e.first} (where it went non-finite)"
            if part is None:
                raise
            raise UserError(f"{str(e).split(';')[0]}, and {which} holds NaN/inf in its {part}: "
                            f"{self.names.data} gives non-finite values; clean the data") from None
        except (UserError, torch.OutOfMemoryError, MemoryError):
            raise
        except Exception as e:
            model = getattr(self.trainee.model, "module", self.trainee.model)  # DDP's wrapper holds the model
            for batch in micro_batches:
                try:
                    contract.check_later_batch(model, batch, self.classes, self.names, step)
                except UserError as bad:
                    raise bad from e
                except Exception:  # noqa: BLE001 - no verdict (e.g. the device is gone): the original stands
                    break
            raise

    def _nonfinite_at(self, step: int) -> str | None:
        """Which part of step `step`'s batch (read again) holds NaN/inf, or None (also when it cannot be read)."""
        try:
            return next((p for b in self.batches.read_step(step - 1) if (p := contract.nonfinite_part(b))), None)
        except Exception:  # noqa: BLE001 - no verdict on the data: the non-finite stop stands as it was
            return None

    def nonfinite_weights(self) -> str | None:
        """Which parameter holds NaN/inf (e.g. "e.g. fc.weight"), or None when every rank's are finite. A NaN
        gradient can reach the weights while the loss stays finite (a branch the forward does not take), so the
        loss and the gradient norm alone do not vouch for what a checkpoint would hold. A norm per tensor, a sync."""
        named = [(n, p.to_local() if isinstance(p, DTensor) else p) for n, p in self.trainee.model.named_parameters()]
        named = [(n, p.detach()) for n, p in named if p.numel() and p.is_floating_point()]
        try:
            norms = torch.stack(torch._foreach_norm([p for _, p in named])).float() if named else None
        except (RuntimeError, NotImplementedError):  # a weight subclass (FP8's) without the multi-tensor kernel
            norms = torch.stack([p.norm().float() for _, p in named])
        bad = [] if norms is None else [n for (n, _), ok in zip(named, torch.isfinite(norms).tolist()) if not ok]
        if all_mean([float(bool(bad))], self.trainee.device)[0] == 0:
            return None
        return f"e.g. {bad[0]}" if bad else "on another rank"

    def refuse_nonfinite_weights(self, step: int) -> None:
        if (bad := self.nonfinite_weights()) is not None:
            raise UserError(f"the model's weights hold NaN/inf after step {step} ({bad}), though the loss stayed "
                            "finite: the end checkpoint and final/ are not written (earlier checkpoints are kept); "
                            "keep train.grad_clip on, lower train.lr, or find the op with a NaN gradient")

    def save_checkpoint(self, step: int, wait: bool = True) -> list[tuple[int, Path]]:
        """The checkpoints (step, folder) this call put on disk, oldest first: an async save still in flight is
        sealed first; this one too unless wait=False and checkpoint.async_save (written in the background,
        returned by the next call)."""
        sealed = [done] if (done := self.ckpt.finish()) else []
        tr = self.trainee
        meta = {"global_batch": self.cost.global_batch, "strategy": self.cfg.parallel.strategy,
                "param_shapes": self.shapes, "optimizer": self.cfg.train.optimizer, "dtype": tr.dtype,
                "seed": self.cfg.run.seed, "data": data_identity(self.cfg, self.batches.sampler.n),
                "model_class": self.info["model_class"],
                "config": to_toml(self.cfg)}
        path = self.ckpt.save(step, tr.model, tr.opt, tr.sched, tr.scaler, meta, wait=wait)
        return sealed if self.ckpt.in_flight else [*sealed, (step, path)]


def check_config(cfg) -> Config:
    """The Python API's `cfg`, checked as a config file is: it must be a Config (a path or a dict would fail
    deep inside with AttributeError), and values set on it after load_config pass the same type, literal and
    range checks (else `fused_loss = "yes"` would run as true and be written to config.toml as a value that
    the file's next load refuses)."""
    if not isinstance(cfg, Config):
        raise UserError(f"turbotrain.train(cfg): got {type(cfg).__name__}; pass a Config, e.g. "
                        f"turbotrain.load_config(\"my.toml\", [\"train.steps=100\"])")
    try:
        raw = dataclasses.asdict(cfg)  # deep-copies every value
    except (TypeError, copy.Error) as e:  # a lock, a socket, a generator set as an args value
        raise UserError(f"turbotrain.train(cfg): the config holds a value that cannot be copied ({e}); config values "
                        "must be plain data (numbers, strings, lists, tables), as a TOML file holds") from None
    for table in raw.values():  # `cfg.run.out_dir = tmp_path` (a Path) is a path all the same
        table.update({k: os.fspath(v) for k, v in table.items() if isinstance(v, os.PathLike)})
    return config_from_dict(raw)


# the environment variables a run points: the compile caches' folders, and a SLURM step's launcher variables
_RUN_ENV = ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE",
            "MASTER_ADDR", "MASTER_PORT")


@contextlib.contextmanager
def process_state_kept():
    """What a run sets process-wide is the Python API caller's own again after it, however the run ends: the RNG
    streams (a run seeds them, a resume loads a checkpoint's), TF32, the environment variables in _RUN_ENV. Else
    a notebook's next cell draws the run's random numbers and computes in the run's precision. Warnings said once
    are said once per run: a second run with the same problem says it too."""
    new_run()
    env = {k: os.environ.get(k) for k in _RUN_ENV}
    py, np_state = random.getstate(), np.random.get_state()
    cuda = list(range(torch.cuda.device_count())) if torch.cuda.is_initialized() else []
    with torch.random.fork_rng(devices=cuda), tf32_kept():
        try:
            yield
        finally:
            random.setstate(py)
            np.random.set_state(np_state)
            for k, v in env.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v


def _same_on_every_rank(n: int, env: DistEnv, who: str) -> None:
    """Every rank draws its share of one permutation of 0..n-1: ranks whose datasets differ in length would each
    permute their own, and samples would repeat or go missing across ranks, unsaid."""
    if env.world_size < 2 or not torch.distributed.is_initialized():
        return
    lengths: list = [None] * env.world_size
    torch.distributed.all_gather_object(lengths, n)
    if len(set(lengths)) > 1:
        each = ", ".join(f"rank {r}: {k}" for r, k in enumerate(lengths))
        raise UserError(f"{who}: the ranks built datasets of different lengths ({each}); every rank must build the "
                        "same dataset (each takes its own share of its batches)")


def prepare(cfg: Config, model: nn.Module | None = None, train_data: Dataset | None = None,
            val_data: Dataset | None = None, loss_fn: LossFn | None = None, probe: bool = False) -> Run:
    """probe=True (profile): a throwaway build that leaves the run's config, metrics and checkpoints alone."""
    given = _given(cfg, model=model, train_data=train_data, val_data=val_data, loss_fn=loss_fn)
    names = contract.Names.of(cfg, model=model, train_data=train_data, loss_fn=loss_fn)  # for error messages
    host = meta_init.HostPeak()
    env = DistEnv.from_environ()
    device = resolve_device(cfg.run.device)
    strategy = resolve_strategy(cfg.parallel.strategy, env.world_size)
    if strategy != "none":
        device = init_distributed(env, device, cfg)  # and refuses ranks started with different configs
    seed_all(cfg.run.seed)  # same seed on every rank: identical initial weights, one data permutation
    # the user's data and code run here first; the loop's watchdog is not running yet, so a read that blocks
    # forever is caught by one of its own (monitor.hang_timeout_s)
    with watching(cfg.monitor.hang_timeout_s, f"building the model and reading the first items of {names.data}"):
        # the Python API's datasets get the mapping of dict items that build_dataset gives the config's
        train_ds = (map_dict_items(train_data, "train_data") if train_data is not None
                    else build_dataset(cfg.data, "train"))
        # no evaluation, no val split built: a factory (or a text corpus too short) without one still trains
        val_ds = map_dict_items(val_data, "val_data") if val_data is not None else (
            build_dataset(cfg.data, "val") if train_data is None and cfg.data.eval_batches else None)
        model, data_args = _build_model(cfg, model, train_ds, strategy, env.world_size)
        loss_in_code = loss_fn is not None and loss_fn is not cross_entropy
        loss_fn = loss_fn if loss_fn is not None else resolve_loss(cfg.train.loss)
        contract.check_model(model, names)
        fused_why = contract.fused_loss_problem(model, train_ds, names) if cfg.kernels.fused_loss is not False else None
        cfg = resolve(cfg, facts_of(device, model, train_ds, data_args, env.world_size, env.local_world_size,
                                    loss_in_code, fused_why))
        dp_rank, dp_world = data_parallel(cfg.parallel.strategy, env.rank, env.world_size, cfg.parallel.pp_stages)
        _same_on_every_rank(len(train_ds), env, names.data)
        sampler = StepSampler(len(train_ds), cfg.data.batch_size, cfg.train.grad_accum, dp_rank, dp_world,
                              cfg.run.seed)  # refuses a dataset smaller than one global batch, before any work
        # the user's code against the contract, once, on the CPU model before any technique: first items, forward, loss
        sample = contract.first_batch(train_ds, torch.device("cpu"), names, micro=cfg.data.batch_size)
        classes = _check_first_batch(model, sample, loss_fn, names)
        _check_val_items(val_ds, val_data is not None, sample, names, cfg, dp_world)
    cost = _step_cost(model, sample, loss_fn, cfg, device, dp_world)
    shapes, n_params = param_shapes(model), sum(p.numel() for p in model.parameters())
    rundir = RunDir(cfg.run, env.is_main and not probe).open()
    with _undone_on_failure(rundir, model, device, cfg.memory.channels_last):
        check_shared_run_dir(rundir.path, env.rank, env.world_size)  # multi-node: one run directory for all ranks
        ckpt = Checkpointer(cfg.checkpoint, rundir.path, env.rank, env.world_size,
                            sharded=cfg.parallel.strategy in (*SHARDED, "pipeline"),  # DCP: each rank its part
                            flat_optim=cfg.parallel.strategy == "pipeline")
        compile_cache = open_compile_cache(cfg.compile, device, graph_digest(cfg))  # before anything compiles
        trainee, setup_growth, classes = _build_checked(model, loss_fn, cfg, device, env.world_size, host, sample,
                                                        names, classes)
        cfg = _measured_attention(cfg, trainee, sample)
        start_step, cfg = (0, cfg) if probe else _resume(ckpt, trainee, cfg, shapes, cost.global_batch, sampler.n)
        if env.is_main and not probe:
            _start_files(rundir, cfg, start_step, ckpt.from_elsewhere, given, model)
        sampler.start_step, sampler.seed = start_step, cfg.run.seed
        batches = Batches(train_ds, sampler, device, cfg.data.device_resident, _loader_settings(cfg),
                          cfg.memory.channels_last, who=names.data, first=sample)
        info = {**_info(cfg, trainee, n_params, cost, start_step, model), "setup_host_growth_mb": setup_growth,
                "compile_cache": compile_cache.info() if compile_cache else None}
        _say_model(cfg, info, n_params, trainee, cost, dp_world)
    return Run(cfg=cfg, env=env, rundir=rundir, trainee=trainee, batches=batches, val_ds=val_ds, ckpt=ckpt,
               start_step=start_step, cost=cost, info=info, compile_cache=compile_cache, shapes=shapes,
               names=names, classes=classes)


def _given(cfg: Config, **objects) -> list[str]:
    """Which of train()'s model, train_data, val_data, loss_fn were passed (config.toml cannot rebuild them),
    once they are known not to contradict the config."""
    for key, obj in objects.items():  # the call forgotten: a class has no len(), no parameters, unbound methods
        if isinstance(obj, type):
            raise UserError(f"train({key}=...): {obj.__name__} is a class; pass an instance ({obj.__name__}(...))"
                            + (" or a function fn(outputs, targets)" if key == "loss_fn" else ""))
    loss_fn = objects["loss_fn"]
    if loss_fn is not None and not callable(loss_fn):  # else it fails on the first batch as the loss's own bug
        shown = " ".join(repr(loss_fn).split())[:40]  # one line, whatever the object prints as
        raise UserError(f"train(loss_fn=...): got {type(loss_fn).__name__} {shown}; pass a function "
                        "fn(outputs, targets) or a loss module (a built-in loss is named by train.loss, e.g. "
                        "train.loss = \"mse\")")
    if loss_fn is not None and cfg.train.loss == "model":
        raise UserError("train(loss_fn=...) was given while train.loss = \"model\" says the model computes its own "
                        "loss: drop one of the two")
    return [k for k, v in objects.items() if v is not None]


def _check_first_batch(model: nn.Module, sample: tuple, loss_fn: LossFn | None, names: contract.Names) -> int | None:
    """The user's code against the contract on the first batch (the labels' classes it saw, which later
    batches are held to); a meta model runs its forward once materialised (_build_checked), and here only the
    sizes a built-in model declares are checked, before shapes that do not fit reach the FLOP count. A loss
    module's own trainable parameters would never change: the optimizer and the checkpoints hold the model's
    (a loss that holds the model itself, for a weight penalty, holds no parameters of its own)."""
    own = {id(p) for p in model.parameters()}
    trained = [n for n, p in loss_fn.named_parameters() if p.requires_grad and id(p) not in own] \
        if isinstance(loss_fn, nn.Module) else []
    if trained:
        raise UserError(f"{names.loss} has trainable parameters ({', '.join(trained[:3])}), which turbotrain neither "
                        "optimizes nor checkpoints (only the model's are); move them into the model, or freeze them "
                        "with requires_grad_(False)")
    if not meta_init.is_meta(model):
        return contract.check_model_data(model, sample, loss_fn, names)
    contract.check_declared(model, sample[0], names)
    return None


def _start_files(rundir: RunDir, cfg: Config, start_step: int, from_elsewhere: bool, given: list[str],
                 model: nn.Module) -> None:
    """The run directory's files at the start: an earlier run set aside whole unless this run continues it (a
    fresh start, or a resume from another run's checkpoint, starts anew here), config.toml (and an HF model's own
    config: `export` rebuilds the model of an unfinished run from them), the metrics trimmed to the step resumed
    from."""
    from turbotrain.export import HF_CONFIG, hf_config_text

    fresh = start_step == 0 or from_elsewhere
    if fresh and (moved := rundir.set_aside()):
        why = "" if start_step or from_elsewhere or cfg.checkpoint.resume == "never" else (
            " (it left no checkpoint to resume from, so this run starts at step 0: checkpoint.every = N saves them, "
            "and a rerun with a higher train.steps then continues)")
        say(f"run: {rundir.path} held an earlier run; it was moved to {moved}{why}")
    note = (f"# {', '.join(given)} passed to turbotrain.train() as Python objects: this file does not rebuild "
            "them\n" if given else "")
    write_run_file(rundir.path / "config.toml", note + to_toml(cfg))
    if (text := hf_config_text(model)) is not None:
        write_run_file(rundir.path / HF_CONFIG, text)
    if start_step and not fresh:
        rundir.trim_metrics(start_step)
        _set_aside_finished(rundir.path, start_step)


def _set_aside_finished(path: Path, start_step: int) -> None:
    """A resume of a finished run (extended, or branched back to an earlier checkpoint) sets its summary.json
    aside, else a crash of the new attempt would still read as the finished run; on a branch its final/ too,
    which is the model of the timeline left behind (an extension's final/ stays: it records its step, and load()
    refuses it once a checkpoint is past it). Renamed by the step they were of: kept, never deleted."""
    summary = path / "summary.json"
    if not summary.is_file():
        return
    try:
        steps = json.loads(summary.read_bytes()).get("steps")
    except (OSError, ValueError, AttributeError):
        steps = None
    tag = f"step-{steps:08d}" if isinstance(steps, int) and not isinstance(steps, bool) and steps >= 0 else "earlier"
    moved = [(summary, _free(path, f"summary.{tag}", ".json"))]
    if isinstance(steps, int) and steps > start_step and (path / "final").is_dir():
        moved.append((path / "final", _free(path, f"final.{tag}", "")))
    for src, dest in moved:
        os.replace(src, dest)
    say(f"run: resuming a finished run from step {start_step}; its " + " and ".join(p.name for p, _ in moved) +
        f" moved to {', '.join(d.name for _, d in moved)}")


def _free(path: Path, stem: str, suffix: str) -> Path:
    """path/stem+suffix, or stem.2, stem.3... where an earlier branch of the run left that name."""
    n, dest = 1, path / f"{stem}{suffix}"
    while dest.exists():
        n, dest = n + 1, path / f"{stem}.{n + 1}{suffix}"
    return dest


@contextlib.contextmanager
def _undone_on_failure(rundir: RunDir, model: nn.Module, device: torch.device, channels_last: bool):
    """A prepare that fails once the run directory is locked releases it and gives the user's model back as
    they built it."""
    try:
        yield
    except BaseException:
        rundir.release()
        give_back(model, device, channels_last)
        raise


def _say_model(cfg: Config, info: dict, n_params: int, trainee: Trainee, cost: StepCost, dp_world: int) -> None:
    stages = f" ({cfg.parallel.pp_stages} pipeline stages)" if cfg.parallel.strategy == "pipeline" else ""
    say(f"model: {n_params / 1e6:.2f}M params on {info['device_name']} | precision {trainee.dtype} | parallel "
        f"{cfg.parallel.strategy} | global batch {cost.global_batch} = micro {cfg.data.batch_size} x accum "
        f"{cfg.train.grad_accum} x world {dp_world}{stages} | data: {info['data_path']}")


def _check_val_items(val_ds: Dataset | None, passed: bool, sample: tuple, names: contract.Names, cfg: Config,
                     dp_world: int) -> None:
    """Checked before any work: a val split unlike the train split would fail at the end of the run, and one
    too small for a single evaluation batch per rank gives no val metrics (said now, not found at the end), as
    do val_data or train.eval_metrics that no evaluation will use."""
    off = ("data.eval_batches = 0 turns evaluation off" if not cfg.data.eval_batches else
           "there is no validation data (train() given train_data takes val_data for it)" if val_ds is None
           else "")
    if val_ds is not None and passed and off:
        say(f"warning: validation: the val_data passed to train() is not used: {off}; set data.eval_batches >= 1 "
            "to evaluate on it")
    if cfg.train.eval_metrics and off:
        say(f"warning: validation: train.eval_metrics {cfg.train.eval_metrics} are never computed: {off}")
    if off:
        return
    val_names = contract.Names(names.model, "the val_data passed to train()", names.loss) if passed else names
    if len(val_ds) < cfg.data.batch_size * dp_world:
        say(f"warning: validation: {val_names.data} gives {len(val_ds)} val items, fewer than one batch of "
            f"data.batch_size = {cfg.data.batch_size} per rank ({dp_world} rank(s)): this run logs no val metrics; "
            f"give the val split more items, lower data.batch_size, or set data.eval_batches = 0")
    if not len(val_ds):
        return
    contract.check_same_items(sample, contract.first_batch(val_ds, torch.device("cpu"), val_names, split="val"),
                              val_names)


def _build_checked(model: nn.Module, loss_fn: LossFn | None, cfg: Config, device: torch.device, world: int,
                   host: meta_init.HostPeak, sample: tuple, names: contract.Names,
                   classes: int | None) -> tuple[Trainee, list, int | None]:
    """The trainee, each rank's host memory growth so far (data, the model built, sharded and initialised),
    and the contract's first forward for a meta-built model, which could not run before it was materialised
    (with the classes it saw)."""
    trainee = build_trainee(model, loss_fn, cfg, device, world)
    growth = host.growth_mb_per_rank()
    if cfg.parallel.meta_init:
        classes = contract.check_model_data(model, tuple(t.to(device) for t in sample), loss_fn, names)
    return trainee, growth, classes


def _measured_attention(cfg: Config, tr: Trainee, sample: tuple) -> Config:
    """kernels.attention="auto" on a GPU (the resolver settles a CPU's) becomes the measured fastest backend:
    with the model on the device and before the first step compiles (the backend is fixed at trace time)."""
    if cfg.kernels.attention != "auto":
        return cfg
    with model_ops(cfg.kernels):  # as train runs the model: packed attention's calls are not SDPA's to measure
        choice = measure_attention(tr.step_module, sample, cfg.data.batch_size, tr.device, tr.dtype,
                                   cache_folder(cfg.compile, tr.device))
    return replace(cfg, kernels=replace(cfg.kernels, attention=choice))


def _build_model(cfg: Config, model: nn.Module | None, train_ds: Dataset, strategy: str,
                 world: int) -> tuple[nn.Module, dict]:
    """(model, data-derived args): the user's model adapted, or the config's built on the CPU, its parameters
    on the meta device under parallel.meta_init, initialised from the run seed where it has the seeded hook.
    Building leaves the global RNG as it was, so a meta build and a full-size one train alike."""
    if model is not None:
        return adapt(model), {}
    declared = data_meta(train_ds)
    _fits_declared(cfg, declared)
    data_args = args_from_data(cfg.model, declared)
    meta = meta_init.wanted(cfg.parallel.meta_init, strategy, cfg.model.name, BUILTIN)
    model_cfg = replace(cfg.model, args={**data_args, **cfg.model.args})
    check_host_memory(model_cfg, world if meta else 1)
    with torch.random.fork_rng(devices=[]), meta_init.params_on_meta(meta):
        model = build_model(model_cfg)
    if not meta:
        meta_init.initialise(model, cfg.run.seed, fresh=False)
    return model, data_args


def _fits_declared(cfg: Config, declared: dict) -> None:
    """A built-in model given fewer token ids or classes than its dataset declares: refused now, not at the first
    batch that holds an id past them, perhaps many steps in (the first batch alone is checked before)."""
    if cfg.model.name not in BUILTIN:
        return
    for key in ("vocab_size", "num_classes"):
        have, need = cfg.model.args.get(key), declared.get(key)
        if isinstance(have, int) and not isinstance(have, bool) and isinstance(need, int) and have < need:
            what = "token ids" if key == "vocab_size" else "classes"
            raise UserError(f"model.args.{key} = {have} gives the model {have} {what}, fewer than the data's {need} "
                            f"(its {key}); raise it to at least {need}, or leave it out to take the data's")


def check_host_memory(model_cfg, shards: int) -> None:
    """Refuse a built-in model whose fp32 parameters (a rank's share of them when it is built on the meta device
    and sharded) outgrow this host's available memory, before anything is allocated: a typo such as
    n_layer=100000 would otherwise swap the machine to a halt instead of failing."""
    n = estimate_params(model_cfg)
    avail = meta_init.available_host_bytes()
    if n is None or avail is None or 4 * n / shards <= avail:
        return
    raise UserError(f"model.args: {model_cfg.name} with these arguments has ~{n:,} parameters, "
                    f"{4 * n / shards / 2**30:,.0f} GiB in fp32 per process, more than this machine's available "
                    f"{avail / 2**30:,.0f} GiB; make the model smaller (model.args) or shard it over more ranks "
                    f"(parallel.strategy=\"fsdp\")")


def _step_cost(model: nn.Module, sample: tuple, loss_fn: LossFn | None, cfg: Config, device: torch.device,
               world: int) -> StepCost:
    """FLOPs counted on the CPU model before any technique: activation-checkpoint recompute is not model work
    (a meta model is counted on meta inputs: shapes only)."""
    meta = meta_init.is_meta(model)
    if meta:
        sample = tuple(t.to("meta") for t in sample)
    x = sample[0]
    tokens = x.shape[1] if x.dim() == 2 and not x.is_floating_point() else None
    buffers = [(b, b.detach().clone()) for b in model.buffers()]  # the counting forward trains BatchNorm
    with meta_init.buffers_on_meta(model) if meta else contextlib.nullcontext():
        fps, source = flops_per_sample(model, sample, WithLoss(model, loss_fn))
    with torch.no_grad():
        for b, saved in buffers:
            b.copy_(saved)
    return StepCost(global_batch=cfg.data.batch_size * cfg.train.grad_accum * world, tokens_per_sample=tokens,
                    flops_per_sample=fps, flops_source=source, peak_flops=peak_flops(device, cfg.precision.dtype))


def _resume(ckpt: Checkpointer, tr: Trainee, cfg: Config, shapes: dict, global_batch: int,
            samples: int) -> tuple[int, Config]:
    """The step to start from (0, or the step of the checkpoint `checkpoint.resume` names, loaded; under
    "auto" a damaged one falls back to the previous good one: `ckpt.loaded` is the one restored), and the
    config to go on with: the checkpoint's run.seed, which fixes the data order of the epoch under way."""
    path = ckpt.find_resume()
    if path is None:
        return 0, cfg
    t = cfg.train
    expect = {"param_shapes": shapes, "global_batch": global_batch, "optimizer": t.optimizer, "dtype": tr.dtype,
              "strategy": cfg.parallel.strategy, "model": {"name": cfg.model.name, "args": dict(cfg.model.args)}}
    step = ckpt.load(path, tr.model, tr.opt, tr.sched, tr.scaler, expect)
    if ckpt.loaded is None:  # every checkpoint was damaged (kept in checkpoints.old-N): a fresh start
        return 0, cfg
    if step >= t.steps:
        run_dir = ckpt.dir.parent
        lost = "" if ckpt.from_elsewhere or (run_dir / "final").is_dir() else \
            f" (its final/ is missing: `turbotrain export {run_dir}` writes the model from this checkpoint)"
        if not ckpt.from_elsewhere and not (run_dir / "summary.json").is_file():  # killed after its end save
            lost += (" (it ended between its end checkpoint and summary.json, so report and watch read it as "
                     "stopped; its metrics.jsonl holds the whole curve)")
        raise UserError(f"the run already reached step {step} ({ckpt.loaded}) and asks for train.steps={t.steps}: "
                        f"nothing to do{lost}; raise train.steps to continue it, or choose another run.name for a new "
                        "run")
    changed, meta = _apply_hyperparameters(tr, cfg), ckpt.loaded_meta
    was, now = meta.get("data"), data_identity(cfg, samples)
    moved = [f"{k} {was[k]!r} → {now[k]!r}" for k in now if isinstance(was, dict) and was.get(k) != now[k]]
    say(f"resumed from step {step} ({ckpt.loaded}): kept the model, optimizer, LR schedule position, loss scaler, "
        f"RNG" + (" and data order" if not moved else "") +
        (f"; applied the new {', '.join(changed)} from here on" if changed else ""))
    if moved:  # deliberate (more data, say), as a new lr is: done, and said
        say(f"warning: the training data changed since the checkpoint ({'; '.join(moved)}): from step {step} on "
            f"batches follow this data's order, so the epoch under way may repeat or skip samples")
    seed = meta.get("seed")
    if type(seed) is int and seed != cfg.run.seed:  # a new seed would reshuffle the epoch half-way through
        say(f"warning: run.seed = {cfg.run.seed} differs from the checkpoint's {seed}: kept {seed} (the data order "
            f"and RNG state are the checkpoint's); use another run.name for a run with seed {cfg.run.seed}")
        cfg = replace(cfg, run=replace(cfg.run, seed=seed))
    return step, cfg


def data_identity(cfg: Config, samples: int) -> dict:
    """What fixes the training data's order: which data (name, args as JSON holds them) and how many samples
    (the Python API's train_data has only its length). A checkpoint keeps it to tell a resume on other data."""
    return {"data.name": cfg.data.name, "data.args": json.loads(json.dumps(cfg.data.args, default=str, sort_keys=True)),
            "samples": samples}


def _apply_hyperparameters(tr: Trainee, cfg: Config) -> list[str]:
    """A resumed optimizer carries the checkpoint's lr and weight decay; the config may ask for others. Apply
    the config's deliberately (the LR schedule continues from its position) and say which changed. A new lr
    scales every group's by the same factor (a user optimizer's groups may hold lrs of their own); weight
    decay is set where the optimizer has it."""
    t, groups, changed = cfg.train, tr.opt.param_groups, []
    old_lr = groups[0]["initial_lr"]  # the schedule's base LR (LambdaLR: lr = initial_lr x lambda(step))
    if old_lr and not math.isclose(old_lr, t.lr, rel_tol=1e-12):
        changed.append(f"train.lr ({old_lr:g} → {t.lr:g})")
        for g, lam in zip(groups, tr.sched.lr_lambdas):
            g["initial_lr"] *= t.lr / old_lr
            g["lr"] = g["initial_lr"] * lam(tr.sched.last_epoch)
        tr.sched.base_lrs = [g["initial_lr"] for g in groups]
    else:  # a schedule of another shape (train.steps raised, warmup or schedule changed) moves the LR here
        was, now = groups[0]["lr"], old_lr * tr.sched.lr_lambdas[0](tr.sched.last_epoch)
        if not math.isclose(was, now, rel_tol=1e-9):
            changed.append(f"LR schedule (train.steps, warmup_steps or schedule: lr {was:.4g} → {now:.4g} here)")
            for g, lam in zip(groups, tr.sched.lr_lambdas):
                g["lr"] = g["initial_lr"] * lam(tr.sched.last_epoch)
    old_wd = groups[0].get("weight_decay")  # accel.optim: group 0 holds the decayed matrices, group 1 no decay
    if isinstance(old_wd, (int, float)) and not math.isclose(old_wd, t.weight_decay, rel_tol=1e-12):
        changed.append(f"train.weight_decay ({old_wd:g} → {t.weight_decay:g})")
        groups[0]["weight_decay"] = t.weight_decay
    return changed


def _loader_settings(cfg: Config) -> dict | None:
    d = cfg.data
    if d.device_resident:
        return None
    return dict(num_workers=d.num_workers, pin_memory=d.pin_memory,
                prefetch_factor=d.prefetch_factor if d.num_workers else None,
                persistent_workers=bool(d.persistent_workers and d.num_workers))


def _info(cfg: Config, tr: Trainee, n_params: int, cost: StepCost, start_step: int, model: nn.Module) -> dict:
    device, c = tr.device, cfg.compile
    return dict(device=str(device), device_name=torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
                dtype=tr.dtype, params=n_params, global_batch=cost.global_batch, micro_batch=cfg.data.batch_size,
                grad_accum=cfg.train.grad_accum,
                world_size=cost.global_batch // (cfg.data.batch_size * cfg.train.grad_accum),
                strategy=cfg.parallel.strategy, channels_last=cfg.memory.channels_last,
                activation_checkpointing=cfg.memory.activation_checkpointing,
                checkpointed_blocks=checkpointed_blocks(tr.model),
                compile=c.enabled and {"mode": c.mode, "scope": c.scope},
                data_path="device-resident" if cfg.data.device_resident else f"DataLoader {_loader_settings(cfg)}",
                torch=torch.__version__, resumed_from=start_step, run_dir=str(Path(cfg.run.out_dir) / cfg.run.name),
                model_class=model_class_name(model))  # a checkpoint's too: export tells a model passed in code
