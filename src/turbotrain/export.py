"""A model you can use: `final/` in every finished run directory, `turbotrain export`, `turbotrain.load`.

    run_dir/final/model.safetensors   the trained weights (tied weights stored once), one consolidated file
                                      whatever the strategy (FSDP2 shards are gathered first)
    run_dir/final/config.toml         the effective config, data-derived model arguments included: enough to
                                      rebuild the model (`models.build_model(cfg.model)`) without the data
    run_dir/final/final.json          what wrote it, the model's class, the weights' sha256
    run_dir/final/hf_config.json      an HF model's own config (its class in `architectures`): the model trained,
                                      even one passed in code, rebuilt for `load` and `export --format hf`

Usage:
    model = turbotrain.load("runs/gpt-shakespeare")            # eval mode, on the GPU when there is one
    model = turbotrain.load("runs/my", model=MyModel())        # a run trained on `train(cfg, model=MyModel())`
    turbotrain export runs/my-hf-run --format hf [--out DIR]    # AutoModelFor*.from_pretrained(DIR) loads it
    turbotrain export runs/gpt-shakespeare --format safetensors # model.safetensors + config.toml (+ final.json)
A run without final/ (stopped before the end) is exported from its latest checkpoint: state.pt, or the
sharded dcp/ of FSDP2 consolidated into one file; so is a finished run resumed past its end (train.steps
raised) that stopped again, its earlier final/ kept as final.step-N (final.json records each final/'s step), and
`load` refuses it until then rather than hand out the earlier end's model as the run's. A run still training is
refused, and so is an --out inside any run directory (but the run's own export/) or over existing files: an export
never overwrites a run's files.
"""
from __future__ import annotations

import errno
import json
import os
import re
import shutil
import sys
import uuid
import warnings
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

import torch
from torch import nn

from turbotrain.errors import UserError
from turbotrain.files import path_arg, sha256
from turbotrain.log import say
from turbotrain.models.structure import model_class_name
from turbotrain.rundir import RunDir, write_fix

FINAL, WEIGHTS, FORMATS = "final", "model.safetensors", ("safetensors", "hf")
HF_CONFIG = "hf_config.json"


def _user_module(model: nn.Module) -> nn.Module:
    from turbotrain.models.structure import unwrap

    return unwrap(model)


def _full_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """The user's model's state on the CPU. Under FSDP2 a collective: every rank calls, rank 0 gets the whole
    (gathered) state, the others nothing; elsewhere the module's own tensors, copied to the CPU."""
    from torch.distributed.fsdp import FSDPModule

    # by module, not by parameter: a root kept gathered after the last forward (the final evaluation) holds
    # plain tensors, while its state_dict still hands out shards
    if any(isinstance(m, FSDPModule) for m in model.modules()):
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        # rank 0 gets it
        state = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    else:
        state = model.state_dict()
    return {k.replace("_orig_mod.", ""): v.detach().to("cpu") if isinstance(v, torch.Tensor) else v  # extra state
            for k, v in state.items()}


def _tied_duplicates(model: nn.Module) -> dict[str, str]:
    """{name: the name it is tied to} for every parameter that is another's (GPT-2's lm_head.weight is
    transformer.wte.weight): safetensors stores a tensor once, `load` ties it again."""
    first: dict[int, str] = {}
    dup = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        name = name.replace("_orig_mod.", "")
        if id(p) in first:
            dup[name] = first[id(p)]
        else:
            first[id(p)] = name
    return dup


def save_weights(state: dict[str, torch.Tensor], tied: dict[str, str], path: Path) -> None:
    """`state` as one safetensors file, tied duplicates left out, any other shared storage copied apart."""
    from safetensors.torch import save_file

    out, seen, meta = {}, set(), {"format": "pt", "tied": json.dumps(tied)}
    extra = {k: v for k, v in state.items() if not isinstance(v, torch.Tensor)}
    if extra:  # a module's get_extra_state(): safetensors holds tensors only, its metadata text
        try:
            meta["extra_state"] = json.dumps(extra)
        except (TypeError, ValueError):
            say(f"warning: {path.name} leaves out the model's extra state ({', '.join(sorted(extra)[:3])}): it is "
                "not plain JSON data; the checkpoints keep it")
    for k, v in state.items():
        if k in tied or k in extra:
            continue
        v = v.contiguous()
        key = (v.untyped_storage().data_ptr(), v.storage_offset())
        out[k] = v.clone() if key in seen else v
        seen.add(key)
    try:
        save_file(out, str(path), metadata=meta)
    except Exception as e:  # safetensors' own error type carries the write's I/O error (a full disk, no inodes)
        if type(e).__name__ != "SafetensorError":
            raise
        text = " ".join(str(e).split())[:200]
        # its errno only in words ("File too large (os error 27)"): kept, so that the fix names a file-size limit
        # (ulimit -f) or a read-only folder, not free space
        code = re.search(r"\(os error (\d+)\)", text)
        raise (OSError(int(code.group(1)), text) if code else OSError(text)) from e


def write_final(model: nn.Module, cfg, run_dir: Path, is_main: bool, step: int | None = None,
                passed: int | None = None) -> Path | None:
    """Write `run_dir/final/` (see the module docstring) at the end of a run; all ranks call (FSDP2 gathers),
    rank 0 writes, atomically. `step`: the step the model is of (None: cfg.train.steps, where every run that
    finishes ends); `passed`: the newest checkpoint an export passed over as unreadable, if any (see
    _newer_checkpoint). A failed write is a warning where checkpoints hold the model, else a UserError on every
    rank (with checkpoint.every = 0 the trained model would be lost under a run that says it is done).
    Usage: `write_final(trainee.model, cfg, run_dir, env.is_main)`."""
    from turbotrain.checkpoint import agree

    user = _user_module(model)
    state = _full_state(user)
    final = run_dir / FINAL
    failure = _write_final_files(user, state, cfg, final, step, passed) if is_main else None
    if not cfg.checkpoint.every and agree(1 if failure else 0):
        why = f"{failure.strerror or failure}; {write_fix(failure)}" if failure else "on rank 0"
        raise UserError(f"{final} could not be written ({why}): with checkpoint.every = 0 no checkpoint holds the "
                        "trained model, so the run is not done; rerun it, with checkpoint.every = N to keep progress")
    if failure is not None:  # the run is done and its metrics are written: say it, keep the summary
        say(f"warning: {final} not written ({failure.strerror or failure}); the checkpoints hold the model; "
            f"{write_fix(failure)}")
        return None
    return final if is_main else None


def _write_final_files(user: nn.Module, state: dict, cfg, final: Path, step: int | None,
                       passed: int | None) -> OSError | None:
    """final/ written aside, then renamed over the earlier one (moved aside first, put back on failure): no
    moment holds neither model whole. The failure, if any."""
    from turbotrain.config import to_toml

    tmp, old = (final.with_name(f".{FINAL}-{uuid.uuid4().hex[:8]}.{end}") for end in ("tmp", "old"))
    try:
        tmp.mkdir(parents=True)
        save_weights(state, _tied_duplicates(user), tmp / WEIGHTS)
        (tmp / "config.toml").write_text(to_toml(cfg), encoding="utf-8")
        if (text := hf_config_text(user)) is not None:
            (tmp / HF_CONFIG).write_text(text, encoding="utf-8")
        info = {"format": 1, "weights": WEIGHTS, "sha256": sha256(tmp / WEIGHTS), "model": cfg.model.name,
                "class": model_class_name(user), "torch": torch.__version__,
                "step": cfg.train.steps if step is None else step}  # see _newer_checkpoint
        if passed is not None:
            info["passed"] = passed
        (tmp / "final.json").write_text(json.dumps(info, indent=1))
        if final.exists() or final.is_symlink():
            os.replace(final, old)
        os.replace(tmp, final)
    except OSError as e:
        if (old.exists() or old.is_symlink()) and not final.exists():
            with suppress(OSError):
                os.replace(old, final)
        return e
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if old.is_symlink():
        old.unlink()
    shutil.rmtree(old, ignore_errors=True)
    return None


def hf_config_text(user: nn.Module) -> str | None:
    """An HF model's own config, written beside config.toml (the run's and final/'s): config.toml names only
    `model.name`, which for a model passed in code (`train(cfg, model=LlamaForCausalLM(...))`) builds another
    model, or hf:gpt2 at its default sizes. None for any other model."""
    from turbotrain.models.hf import HFModel, is_hf_model

    # transformers' own classes only: one of the user's code (a subclass, a trust_remote_code folder) is rebuilt
    # from config.toml's model.name or loaded into the user's instance
    m = _user_module(user)
    hf = m.hf if isinstance(m, HFModel) else m if is_hf_model(m) else None
    if hf is None or getattr(sys.modules["transformers"], type(hf).__name__, None) is not type(hf):
        return None
    # the class trained, whatever `architectures` the config came with (a classifier built from an LM's config
    # keeps the LM's); the rebuild reads it
    saved = json.loads(hf.config.to_json_string(use_diff=False))
    return json.dumps({**saved, "architectures": [type(hf).__name__]}, indent=2)


def _build_hf_saved(final: Path) -> nn.Module | None:
    """The HF model `final`/hf_config.json describes (hf_config_text), fresh weights; None without one."""
    if not (final / HF_CONFIG).is_file():
        return None
    from turbotrain.models.hf import HFModel, require_transformers

    transformers = require_transformers(f"{final}: the HF model it holds")
    try:
        config = transformers.AutoConfig.from_pretrained(str(final / HF_CONFIG))
        cls = getattr(transformers, (config.architectures or [""])[0])
        hf = cls._from_config(config)  # HFModel keeps it in float32
    except Exception as e:  # a config from another transformers, an architecture this one lacks
        raise UserError(f"{final / HF_CONFIG}: transformers {transformers.__version__} cannot rebuild the model it "
                        f"describes ({type(e).__name__}: {e}); install the transformers the run was trained with, "
                        f"or load into your own instance: `turbotrain.load(run, model=MyHFModel(...))`") from None
    return HFModel(hf)


def _final_dir(run_dir: str | os.PathLike) -> Path:
    """`run_dir/final`, or `run_dir` itself when it is a final/ (or exported safetensors) folder."""
    root = _existing_dir(run_dir)
    for d in (root / FINAL, root):
        if (d / WEIGHTS).is_file():
            _check_final(d)
            _check_config(d)
            if d != root and (newer := _newer_checkpoint(root)) is not None:
                at = _final_step(d)
                raise UserError(f"{run_dir}: its {FINAL}/ is the model at step {at}, but the run went on to step "
                                f"{newer} (resumed past its end) and has not finished; let it finish (or rerun it "
                                f"to), write step {newer}'s model with `turbotrain export {run_dir} --format "
                                f"safetensors` (it keeps this {FINAL}/ as {FINAL}.step-{at:08d}), or load step "
                                f"{at}'s by naming {d}")
            return d
    if not _holds_run_files(root):
        _not_a_run(run_dir, root)
    if not _checkpoints(root):
        raise UserError(f"{run_dir}: {NO_MODEL}")
    raise UserError(f"{run_dir}: no {FINAL}/{WEIGHTS} (the run did not finish); `turbotrain export {run_dir} "
                    f"--format safetensors` writes one from its latest checkpoint")


def _final_step(final: Path, key: str = "step") -> int | None:
    """The step final.json says its model is of (`key` "passed": the newest checkpoint its export passed over as
    unreadable); None when it does not say (written before it recorded one)."""
    try:
        info = json.loads((final / "final.json").read_text())
    except (OSError, ValueError):
        return None
    step = info.get(key) if isinstance(info, dict) else None
    return step if type(step) is int else None


def _newer_checkpoint(root: Path) -> int | None:
    """The step of the run's latest checkpoint where it is past the step of its final/: a finished run resumed
    with a higher train.steps that stopped before its new end keeps the earlier end's final/ (prepare sets only
    summary.json aside), so final/ is then not the run's latest model. None: final/ is, or its step is unknown."""
    at = _final_step(root / FINAL)
    if at is None:
        return None
    at = max(at, _final_step(root / FINAL, "passed") or 0)
    steps = [int(p.name.removeprefix("step-")) for p in _checkpoints(root)]
    return max(steps) if steps and max(steps) > at else None


def _checkpoints(root: Path) -> list[Path]:
    """The run's checkpoint folders (checkpoints/step-N), oldest first, verified or not."""
    from turbotrain.checkpoint import CheckpointConfig, Checkpointer

    return Checkpointer(CheckpointConfig(), root, 0, 1, sharded=False).list()


def _existing_dir(run_dir: str | os.PathLike) -> Path:
    """`run_dir` as an existing folder's path (`~` expanded), or one UserError saying what it is instead."""
    if not isinstance(run_dir, (str, os.PathLike)):
        raise UserError(f"{run_dir!r}: expected the path of a run directory (a str or a Path), e.g. \"runs/NAME\"")
    if not str(run_dir).strip():
        raise UserError("RUN_DIR '': names no folder (an unset shell variable?); name a run's folder, e.g. runs/NAME")
    root = path_arg("run_dir", run_dir)
    if root.exists() and not root.is_dir():
        _not_a_run(run_dir, root, "a file")  # final/model.safetensors, say: the run it lies in is named
    if not root.is_dir():
        raise UserError(f"{run_dir}: no such run directory")
    return root


def _check_final(final: Path) -> None:
    """A final/ whose final.json is damaged or whose weights no longer match its sha256 is refused: exporting or
    loading it would hand out wrong weights (a folder without final.json, e.g. an exported one, is taken as is)."""
    info_path = final / "final.json"
    if not info_path.exists():
        return
    try:
        info = json.loads(info_path.read_text())
        if not isinstance(info, dict):
            raise ValueError(f"a JSON {type(info).__name__}, not an object")
    except (OSError, ValueError) as e:
        raise UserError(f"{info_path} is damaged ({' '.join(str(e).split())[:120]}); re-export from a checkpoint: "
                        f"move {final} aside and run `turbotrain export` again") from None
    want = info.get("sha256")
    if want is not None and sha256(final / WEIGHTS) != want:
        raise UserError(f"{final / WEIGHTS} does not match the sha256 in final.json (damaged or replaced); "
                        f"move {final} aside and run `turbotrain export` again to rebuild it from a checkpoint")


def _check_config(final: Path) -> None:
    """config.toml is what rebuilds the model: a missing or damaged one is refused here, with where to restore
    it from, rather than blamed on the weights ("did not finish") or copied into an export as is."""
    from turbotrain.config import load_config

    path = final / "config.toml"
    if not path.is_file():
        raise UserError(f"{path} is missing (the weights are there, but not the config that says which model they "
                        f"fit); {_config_fix(final)}")
    try:
        load_config(str(path))
    except UserError as e:
        why = " ".join(str(e).removeprefix(f"{path}: ").split())[:200]
        raise UserError(f"{path} is damaged ({why}); {_config_fix(final)}") from None


def _config_fix(final: Path) -> str:
    """How to restore final/config.toml: the run's own config.toml holds the same effective config (written
    before step 1, rewritten on resume) when it is there and sound; else the config the run was trained with."""
    from turbotrain.config import load_config

    own = final.parent / "config.toml"
    if final.name == FINAL and own.is_file():
        try:
            load_config(str(own))
            return f"restore it from the run's own copy: cp {own} {final / 'config.toml'}"
        except UserError:
            pass  # damaged too: suggesting it would send the user round in a loop
    return (f"write the config the run was trained with there (`turbotrain config CONFIG [KEY=VALUE ...] > "
            f"{final / 'config.toml'}`; each checkpoint's meta.json holds a copy under \"config\")")


def _check_class(final: Path, model: nn.Module, run_dir: str | os.PathLike) -> None:
    """final.json records the class trained; config.toml only the config's model.name. They differ when the
    run was trained on a model passed in code (`train(cfg, model=...)`): the config's model would be another
    one (another forward, maybe other weights), so it is refused with the way to load into the user's own."""
    info_path = final / "final.json"
    if not info_path.is_file():
        return  # an export without final.json: config.toml is all there is
    info = json.loads(info_path.read_text())  # _check_final has vetted it
    trained, built = info.get("class"), model_class_name(model)
    # runs written before _class_name recorded FSDP2's wrapper class (torch.distributed...FSDPGPT)
    legacy = isinstance(trained, str) and trained.startswith("torch.distributed.") \
        and trained.rsplit(".", 1)[-1] == "FSDP" + type(model).__name__
    if not isinstance(trained, str) or trained == built or legacy:
        return
    raise UserError(f"{run_dir}: trained on a model passed in code ({trained}), not the {built} its config.toml "
                    f"builds (model.name = {info.get('model')!r}); load the weights into your own instance: "
                    f"`turbotrain.load({str(run_dir)!r}, model={trained.rsplit('.', 1)[-1]}(...))`")


def _build(config_toml: Path) -> tuple[nn.Module, object]:
    """The model as the run's config builds it, on the CPU (its weights are replaced next)."""
    from turbotrain.config import load_config
    from turbotrain.models import build_model

    cfg = load_config(str(config_toml))
    return _build_hf_saved(config_toml.parent) or build_model(cfg.model), cfg


def load(run_dir: str | os.PathLike, device: str | torch.device | None = None,
         model: nn.Module | None = None) -> nn.Module:
    """The trained model of a finished run, in eval mode on `device` (None: the GPU when there is one).
    Usage: `model = turbotrain.load("runs/gpt-shakespeare"); logits = model(ids)`. An HF model comes as
    turbotrain's adapter: `.hf` is the `transformers` model (`.generate`, `.save_pretrained`). A run trained
    on a model passed in code: `turbotrain.load(run, model=MyModel())` loads the weights into that instance."""
    target = _load_device(device)  # before the build: a device this machine lacks is refused at once
    final = _final_dir(run_dir)
    if model is None:
        with torch.random.fork_rng(devices=[]):  # the build's initialisation draws; the caller's streams stay put
            model = _build(final / "config.toml")[0]
        _check_class(final, model, run_dir)
        into = "the model its config.toml builds"
        fix = (f"if the run was trained on a model passed in code, load into an instance of it: "
               f"`turbotrain.load({str(run_dir)!r}, model=MyModel(...))`; else restore the config.toml the run wrote")
    elif not isinstance(model, nn.Module):
        raise UserError(f"load(model={model!r}): expected an nn.Module instance of the model the run trained, "
                        "e.g. model=MyModel(...)")
    else:
        from turbotrain.models import adapt

        into = f"the model passed ({model_class_name(model)})"
        fix = "pass an instance of the model the run trained, built with the same arguments"
        model = adapt(model)  # as train(model=...) adapted it: an HF model's weights are saved under `hf.`
    _load_weights(model, final / WEIGHTS, into, fix)
    _for_inference(model)
    return model.to(target).eval()


def _load_device(device) -> torch.device:
    """load()'s `device` (None: the GPU when there is one), one that this machine has."""
    if device is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        d = torch.device(device)
        ok = d.type != "cuda" or (d.index or 0) < torch.cuda.device_count()
    except (RuntimeError, TypeError, ValueError):
        d, ok = None, False
    if not ok:
        raise UserError(f"load(device={device!r}): not a device of this machine ({torch.cuda.device_count()} CUDA "
                        f"GPU(s)); pass \"cpu\", \"cuda\", \"cuda:N\", or None for the GPU when there is one")
    return d


def _load_weights(model: nn.Module, weights: Path, into: str, fix: str) -> None:
    """`weights` into `model`, every tensor and shape matching, by torch's load_state_dict: it sizes lazy modules
    (nn.LazyLinear) from the saved tensors, and it takes parameters that share a storage without being tied
    (views of one fused tensor) and extra state, which safetensors' load_model refuses."""
    state = _read_weights(weights)
    for dup, first in _tied_duplicates(model).items():  # also for a file written without the "tied" record
        if first in state:
            state.setdefault(dup, state[first])
    _materialise_meta(model, into, fix)
    try:
        missing, unexpected = model.load_state_dict(state, strict=False)
    except RuntimeError as e:  # a shape mismatch
        why = " ".join(str(e).split())[:200]
    else:
        if not missing and not unexpected:
            return
        why = f"missing {sorted(missing)[:3]}, unexpected {sorted(unexpected)[:3]}"
    raise UserError(f"{weights}: does not fit {into} ({why}); {fix}")


def _read_weights(weights: Path) -> dict:
    """The tensors of a model.safetensors, with the tied duplicates and the extra state (get_extra_state) its
    metadata records; one UserError when it is damaged (an exported folder has no final.json sha256 to check)."""
    from safetensors import SafetensorError, safe_open
    from safetensors.torch import load_file

    try:
        with safe_open(str(weights), "pt") as f:
            meta = f.metadata() or {}
        state: dict = load_file(str(weights))
        tied, extra = (json.loads(meta.get(key) or "{}") for key in ("tied", "extra_state"))
        if not isinstance(tied, dict) or not isinstance(extra, dict):
            raise ValueError("its metadata records are not JSON objects")
    except (SafetensorError, OSError, ValueError) as e:
        raise UserError(f"{weights}: damaged, not a readable model file ({' '.join(str(e).split())[:160]}); export "
                        f"it again from its run: turbotrain export RUN_DIR --format safetensors") from None
    for dup, first in tied.items():
        if isinstance(first, str) and first in state:
            state[dup] = state[first]
    state.update(extra)
    return state


def _materialise_meta(model: nn.Module, into: str, fix: str) -> None:
    """A factory that builds its model on the meta device (shapes, no storage; training materialised it) gives
    one that holds no values until the saved weights fill it: CPU storage for each tensor, ties kept. A buffer
    left out of the state (persistent=False) would keep whatever memory held, so it is refused."""
    from turbotrain.distributed.meta_init import _tied

    meta = [n for n, t in [*model.named_parameters(), *model.named_buffers()] if t.is_meta]
    if not meta:
        return
    unsaved = sorted(set(meta) - set(model.state_dict()))
    if unsaved:
        raise UserError(f"cannot load into {into}: it is built on the meta device and its buffers {unsaved[:3]} are "
                        f"not saved (persistent=False), so nothing would set them; build them on the CPU; {fix}")
    ties = _tied(model)
    model.to_empty(device="cpu")
    for slots in ties:  # to_empty gives each slot a tensor of its own: tie them again
        for m, name in slots[1:]:
            setattr(m, name, getattr(*slots[0]))


def _for_inference(model: nn.Module) -> None:
    from turbotrain.models.hf import HFModel

    if isinstance(model, HFModel) and hasattr(model.hf.config, "use_cache"):
        model.hf.config.use_cache = True  # training turned the KV cache off; generation wants it


def export(run_dir: str | os.PathLike, fmt: str, out: str | os.PathLike | None = None) -> Path:
    """`export(run, "hf")` → a `save_pretrained` directory; `export(run, "safetensors")` → model.safetensors +
    config.toml. `out` defaults to `run_dir/export/<fmt>`. Returns the folder written. Every check runs before
    anything is written, and the export appears whole or not at all (written aside, then renamed)."""
    if fmt not in FORMATS:
        raise UserError(f"--format {fmt!r}: expected one of {', '.join(FORMATS)}")
    root = _run_root(run_dir)
    dest, replace = _export_dest(root, fmt, out)
    lock = _hold_lock(root)
    try:
        _final_from_checkpoint(root, fmt)
        final = _final_dir(root)
        if fmt == "safetensors":
            # final.json too: its class record lets `load` on the export refuse a config that builds another model
            with _writing(dest, replace) as tmp:
                for name in (WEIGHTS, "config.toml", "final.json", HF_CONFIG):
                    if (final / name).is_file():
                        shutil.copyfile(final / name, tmp / name)
        else:
            model, cfg = load(root, "cpu"), _build_cfg(root)
            _require_hf(model, cfg)
            with _writing(dest, replace) as tmp:
                model.hf.save_pretrained(tmp)
                _save_tokenizer(cfg, tmp)
    finally:
        if lock is not None:
            os.close(lock)  # drops the shared lock
    say(f"export: {fmt} → {dest}")
    return dest


def _final_from_checkpoint(root: Path, fmt: str) -> None:
    """final/ written from the latest checkpoint where the run has none, or where the run went on past it (see
    _newer_checkpoint: that final/ is kept beside, as final.step-N, not replaced)."""
    behind = None
    if (root / FINAL / WEIGHTS).is_file():
        if _newer_checkpoint(root) is None:
            return
        behind = _final_step(root / FINAL)
    elif (root / WEIGHTS).is_file():
        return  # an exported folder: its model as it is
    model, cfg, step = _model_from_checkpoint(root, after=behind)
    newest = max((int(p.name.removeprefix("step-")) for p in _checkpoints(root)), default=step)
    if fmt == "hf":
        _require_hf(model, cfg)  # before final/ is written: a refused export writes nothing
    if behind is not None:
        n, aside = 1, root / f"{FINAL}.step-{behind:08d}"
        while aside.exists():
            n, aside = n + 1, root / f"{FINAL}.step-{behind:08d}.{n + 1}"
        os.replace(root / FINAL, aside)
        say(f"export: {root / FINAL} held the model at step {behind}, before the run went on to step {step}; it was "
            f"moved to {aside}")
    if write_final(model, cfg, root, True, step=step, passed=newest if newest > step else None) is None:
        raise UserError(f"{root / FINAL} could not be written (the warning above says why and what to do); then "
                        "export again")
    say(f"export: {root / FINAL} written")


@contextmanager
def _writing(dest: Path, replace: bool) -> Iterator[Path]:
    """A folder beside `dest` to write the export into, renamed to `dest` once whole: a failed export (a full
    disk) leaves no half-written model behind, and an earlier export being replaced stays whole until then."""
    tmp = dest.parent / f".{dest.name}-{uuid.uuid4().hex[:8]}.tmp"
    try:
        dest.parent.mkdir(parents=True, exist_ok=True)
        tmp.mkdir()
        yield tmp
        if replace and dest.is_dir():
            shutil.rmtree(dest)
        os.replace(tmp, dest)  # onto a missing or empty folder
    except OSError as e:
        raise UserError(f"--out {dest}: cannot write the export ({e.strerror or e}); {_export_fix(e)}") from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _export_fix(e: OSError) -> str:
    """The fix for an export write that failed with `e`: a file-size limit, too many open files or a folder this
    process may not write is not cured by freeing space."""
    if e.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        return "choose an --out folder you can write"
    if e.errno in (errno.EFBIG, errno.EMFILE, errno.ENFILE):
        return write_fix(e)
    return "free space or choose another folder"


# what a run directory holds beside its config.toml (rundir.RUN_FILES, RunDir's .lock); a project folder with a
# config.toml and, say, a wandb/ of its own is not one
RUN_MARKERS = ("metrics.jsonl", "summary.json", FINAL, "checkpoints", ".lock")


NOT_A_RUN = (f"not a run directory (no config.toml, metrics.jsonl, {FINAL}/ or checkpoints/ in it); name a run's "
             "folder, e.g. runs/NAME")


NO_MODEL = (f"no {FINAL}/{WEIGHTS} and no checkpoint (the run stopped before it finished and before its first "
            "save, or with checkpoint.every = 0): it holds no trained model; train it again")


def _is_run_dir(d: Path) -> bool:
    """Surely a run directory: where an export must never write."""
    return (d / "config.toml").is_file() and any((d / n).exists() for n in RUN_MARKERS)


def _holds_run_files(d: Path) -> bool:
    """A run directory, maybe a damaged one (its config.toml lost, say): worth exporting from, or naming what
    is missing."""
    return any((d / n).exists() for n in ("config.toml", *RUN_MARKERS))


def _run_root(run_dir: str | os.PathLike) -> Path:
    """The run directory that `run_dir` names: RUN/final stands for RUN (its export goes to RUN/export/, never
    into final/); an exported folder (model.safetensors + config.toml) is taken as is."""
    root = _existing_dir(run_dir)
    if root.resolve().name == FINAL:
        root = root.resolve().parent
    if not (root / WEIGHTS).is_file() and not _holds_run_files(root):
        _not_a_run(run_dir, root)
    return root


def _not_a_run(run_dir: str | os.PathLike, root: Path, what: str = "a folder"):
    """Refuse `root`, which holds no run, naming the run it lies inside (a checkpoint folder, say) if any: export
    and load both take the run, whose final/ (else latest checkpoint that verifies) holds its model."""
    from turbotrain.report import enclosing_run

    if (run := enclosing_run(root)) is not None:
        kind = "a file, not a run directory," if what == "a file" else "not a run directory but a folder"
        raise UserError(f"{run_dir}: {kind} inside the run {run}; name the run: {run} "
                        f"(its model is its {FINAL}/; `turbotrain export {run}` writes one from its latest checkpoint "
                        f"that verifies if the run did not finish)")
    if what == "a file":
        raise UserError(f"{run_dir}: a file, not a run directory; name the run's folder, e.g. runs/NAME")
    raise UserError(f"{run_dir}: {NOT_A_RUN}")


def _export_dest(root: Path, fmt: str, out: str | os.PathLike | None) -> tuple[Path, bool]:
    """The export folder (checked, not created) and whether an earlier export there is replaced: only in the
    run's own export/ folder. Never inside any run directory but there (another run's, a checkpoint, a final/,
    this run itself: the export would overwrite its files or fail its checkpoint's verification), never over
    existing files."""
    if out is not None and not str(out).strip():
        raise UserError("--out '': names no folder (an unset shell variable?); give a folder, or leave --out out "
                        f"for {root / 'export' / fmt}")
    own = root.resolve() / "export"  # its last part unresolved: a link there into another run is refused below
    dest = path_arg("--out", out) if out is not None else root / "export" / fmt
    real = dest.resolve()
    if not real.is_relative_to(own):
        run = next((d for d in (real, *real.parents) if _is_run_dir(d)), None)
        if run is not None:
            raise UserError(f"--out {dest}: cannot create the export inside the run directory {run} (it would "
                            f"overwrite or add to the run's config.toml, {FINAL}/ or checkpoints/); choose a folder "
                            f"outside every run directory, or leave --out out for {root / 'export' / fmt}")
    inner = next((own / f for f in FORMATS if real.is_relative_to(own / f) and real != own / f), None)
    if inner is not None:  # the next default export of that format replaces its folder whole, this one with it
        raise UserError(f"--out {dest}: is inside {inner}, which `turbotrain export --format {inner.name}` replaces "
                        f"whole; choose a folder beside it, e.g. {own / 'mine'}")
    if real == own:  # the folder of the run's exports, one per format: an export there would hold the next ones
        raise UserError(f"--out {dest}: is the run's folder of exports (one folder per format); leave --out out "
                        f"for {own / fmt}, or name a folder in it, e.g. {own / 'mine'}")
    if dest.is_symlink():  # the export is renamed into place: a rename onto a link fails, or replaces the link
        raise UserError(f"--out {dest}: is a symbolic link; name the folder it points to ({real}) or a new one")
    replace = real == own / fmt
    if dest.exists() and (not dest.is_dir() or (any(dest.iterdir()) and not replace)):
        raise UserError(f"--out {dest}: already exists and is not an empty folder (an export there would overwrite "
                        "its files); choose a new folder, or move that one aside")
    near = next(p for p in real.parents if p.exists())
    if not near.is_dir() or not os.access(near, os.W_OK | os.X_OK):
        why = "a file" if not near.is_dir() else "not writable"
        raise UserError(f"--out {dest}: cannot create it ({near} is {why}); choose another folder")
    return dest, replace


def _hold_lock(root: Path) -> int | None:
    """Refuse a run still training (its rank 0 holds `.lock` exclusively, see rundir.RunDir: checkpoints rotate
    under the export, final/ is the run's to write); else hold a shared lock on it until the export is done, so a
    run started meanwhile is refused rather than racing it. None: no lock to hold (no run ever held this folder
    here) or a filesystem without locks."""
    import fcntl

    try:  # O_NONBLOCK: a FIFO planted as .lock must not hang the open
        fd = os.open(root / ".lock", os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        return fd
    except BlockingIOError:
        os.close(fd)
        raise UserError(f"{root} is still training{RunDir.lock_holder(root)}; export it when it finishes, or copy it "
                        "first") from None
    except OSError:
        os.close(fd)
        return None


def _require_hf(model: nn.Module, cfg) -> None:
    from turbotrain.models.hf import HFModel

    if not isinstance(model, HFModel):
        raise UserError(f"--format hf needs an HF model (model.name = 'hf:...' or a factory returning one); this "
                        f"run's model is {cfg.model.name!r}: use --format safetensors")


def _build_cfg(root: Path):
    from turbotrain.config import load_config

    return load_config(str(_final_dir(root) / "config.toml"))


def _save_tokenizer(cfg, dest: Path) -> None:
    """The run's tokenizer.json (data.name = "text", data.args.tokens) beside the HF model, when there is one."""
    tokens = cfg.data.args.get("tokens") if cfg.data.name == "text" else None
    if isinstance(tokens, str) and tokens.endswith(".json") and path_arg("data.args.tokens", tokens).is_file():
        from transformers import PreTrainedTokenizerFast

        PreTrainedTokenizerFast(tokenizer_file=str(path_arg("data.args.tokens", tokens))).save_pretrained(dest)


def _model_from_checkpoint(root: Path, after: int | None = None) -> tuple[nn.Module, object, int]:
    """The model of an unfinished run, its config and step, from its latest checkpoint (past step `after`) that
    verifies and reads whole: state.pt's model, or FSDP2's sharded dcp/ read into the full model (one process,
    no process group). A checkpoint that fails or disappears while it is read (deleted, rotated) is passed over
    for the one before."""
    from turbotrain.checkpoint import Checkpointer, CodeInCheckpoint, CorruptCheckpoint

    model = cfg = None
    listed = _checkpoints(root)
    for path in reversed(listed):
        step = int(path.name.removeprefix("step-"))
        if after is not None and step <= after:
            break
        try:
            problem = Checkpointer.verify(path)
            if problem is None:
                if model is None:
                    model, cfg = _build(root / "config.toml")
                _load_checkpoint(path, model, root / "config.toml")
                say(f"export: the run did not finish; its model comes from checkpoint {path.name}")
                return model, cfg, step
        except (OSError, CorruptCheckpoint, CodeInCheckpoint) as e:
            problem = (e.strerror if isinstance(e, OSError) else None) or str(e)
        say(f"warning: checkpoint {path.name} cannot be exported ({problem}); trying the previous one")
    if after is not None:
        raise UserError(f"{root}: its {FINAL}/ is the model at step {after} and no checkpoint past it verifies; "
                        f"rerun the run to finish it, or load step {after}'s: turbotrain.load({str(root / FINAL)!r})")
    if not listed:
        raise UserError(f"{root}: {NO_MODEL}")
    raise UserError(f"{root}: no {FINAL}/{WEIGHTS} and no good checkpoint to export from")


def _load_checkpoint(path: Path, model: nn.Module, config: Path) -> None:
    """The checkpoint's model state into `model`; OSError, CorruptCheckpoint or CodeInCheckpoint when the
    checkpoint cannot be read, a UserError when it is not the model `config` builds."""
    from turbotrain.checkpoint import _dcp_failure, _safe_planner, _safe_reader, _safe_torch_load

    meta = json.loads((path / "meta.json").read_text())  # verified: an OSError at most
    trained = meta.get("model_class")
    if isinstance(trained, str) and trained != model_class_name(model):  # train(cfg, model=...): not the config's
        short, root = trained.rsplit(".", 1)[-1], config.parent
        raise UserError(f"checkpoint {path} was trained on a model passed in code ({trained}), not the "
                        f"{model_class_name(model)} {config} builds; finish the run in code (turbotrain.train(cfg, "
                        f"model={short}(...)) resumes it and writes {FINAL}/), then turbotrain.load({str(root)!r}, "
                        f"model={short}(...))")
    if meta.get("sharded"):
        import torch.distributed.checkpoint as dcp

        state = {"model": model.state_dict()}
        reader, planner = _safe_reader(path / "dcp"), _safe_planner()
        try:
            with warnings.catch_warnings():  # "torch.distributed is uninitialized ... load in a single process": yes
                warnings.simplefilter("ignore", UserWarning)
                dcp.load(state, storage_reader=reader, planner=planner, no_dist=True)
        except BaseException as e:  # CheckpointException (a BaseException) wraps the reading error
            if isinstance(e, (KeyboardInterrupt, SystemExit)):
                raise
            raise (reader.refused or planner.refused or _dcp_failure(e)) from None
        state = state["model"]
    else:
        with open(path / "state.pt", "rb") as f:
            state = _safe_torch_load(f, "state.pt")["model"]
    try:
        model.load_state_dict(state)
    except RuntimeError as e:  # config.toml edited or replaced since the checkpoint
        raise UserError(f"checkpoint {path} does not fit the model {config} builds "
                        f"({' '.join(str(e).split())[:200]}); restore the run's config.toml") from None
