"""Red-team cases of session 22 on the run, its models and its files: lazy modules (nn.LazyLinear) under
parallel.meta_init and in `turbotrain.load`, a loss module with trainable parameters, fp16's first skipped steps,
torchao's import lines on stderr, a file where the run directory goes, channels_last on a model without
convolutions. User code: tests/userpkg/redteam_s22.py."""
from __future__ import annotations

import os
import subprocess
import sys
import warnings

import pytest
import torch
from torch import nn

import turbotrain
from tests.faults.common import BASE_TOML, error_line, lit, subprocess_env
from turbotrain.cli import main
from turbotrain.config import load_config
from turbotrain.errors import UserError

R = "userpkg.redteam_s22:"
LAZY = [f'model.name="{R}lazy"', "model.args={}"]


def train_cli(tmp_path, *overrides: str) -> int:
    return main(["train", str(BASE_TOML), f"run.out_dir={lit(tmp_path)}", *overrides])


def test_lazy_module_under_meta_init_names_meta_init_not_the_users_code(tmp_path, capsys):
    """meta_init's parameter hook met an UninitializedParameter and the TypeError was blamed on the factory."""
    assert train_cli(tmp_path, *LAZY, "parallel.meta_init=true") == 2
    line = error_line(capsys.readouterr().err)
    assert "parallel.meta_init = true" in line and "lazy parameter 'weight'" in line, line
    assert "meta_init = false" in line and "TypeError" not in line, line


def test_a_lazy_models_run_loads_and_exports(tmp_path, capsys):
    """`turbotrain.load` of a run whose model has lazy modules: the shapes come from the saved weights (it was a
    ValueError from safetensors reading an uninitialised parameter's storage)."""
    assert train_cli(tmp_path, *LAZY) == 0, capsys.readouterr().err
    run = tmp_path / "fault"
    trained = turbotrain.load(run, "cpu")
    x = torch.randn(3, 8)
    from userpkg.redteam_s22 import Lazy

    into = turbotrain.load(run, "cpu", model=Lazy())
    assert torch.equal(trained(x), into(x))
    assert main(["export", str(run), "--format", "safetensors"]) == 0
    exported = turbotrain.load(run / "export" / "safetensors", "cpu")
    assert torch.equal(trained(x), exported(x))


class Tempered(nn.Module):
    def __init__(self):
        super().__init__()
        self.t = nn.Parameter(torch.ones(()))

    def forward(self, out, y):
        return ((out - y) ** 2).mean() * self.t


def test_a_loss_module_with_trainable_parameters_is_refused(tmp_path):
    """Its parameters were never in the optimizer nor the checkpoints: the run "trained" them silently at 1.0."""
    cfg = load_config(str(BASE_TOML), [f"run.out_dir={lit(tmp_path)}"])
    with pytest.raises(UserError, match=r"the loss_fn passed to train\(\) has trainable parameters \(t\)"):
        turbotrain.train(cfg, loss_fn=Tempered())
    assert not (tmp_path / "fault").exists()
    frozen = Tempered().requires_grad_(False)  # a fixed weighting is fine
    assert turbotrain.train(cfg, loss_fn=frozen)["steps"] == 4
    from userpkg.models import Linear

    model = Linear(8)  # a loss holding the model (a weight penalty) holds none of its own
    assert turbotrain.train(cfg, model=model, loss_fn=Penalized(model))["steps"] == 4


class Penalized(nn.Module):
    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, out, y):
        return ((out - y) ** 2).mean() + 1e-4 * sum(p.square().sum() for p in self.model.parameters())


def test_fp16_skipping_its_first_steps_warns_nothing_from_torch(tmp_path):
    """The loss scaler skips the first steps (their gradients overflow at the initial scale); torch then warned
    on stderr of `lr_scheduler.step()` before `optimizer.step()`."""
    cfg = load_config(str(BASE_TOML), [f"run.out_dir={lit(tmp_path)}", "precision.dtype=fp16"])
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        turbotrain.train(cfg)
    assert not [w for w in seen if "lr_scheduler" in str(w.message)], [str(w.message) for w in seen]


@pytest.mark.skipif(__import__("importlib").util.find_spec("torchao") is None, reason="needs torchao")
def test_importing_torchao_writes_nothing_to_stderr():
    """torchao's import logs every native library it cannot load and torch logs its Enum registrations: four
    lines around the one `error:` line of any run that builds an HF model (transformers imports torchao)."""
    code = "from turbotrain.accel.fp8 import require_torchao; require_torchao('tensorwise')"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                       env=subprocess_env())
    assert r.returncode == 0 and r.stderr == "", r.stderr


@pytest.mark.parametrize("kind", ["file", "link"])
def test_a_file_where_the_run_directory_goes_says_what_to_do(tmp_path, capsys, kind):
    if kind == "file":
        (tmp_path / "fault").write_text("mine")
    else:
        os.symlink(tmp_path / "nowhere", tmp_path / "fault")
    assert train_cli(tmp_path) == 2
    line = error_line(capsys.readouterr().err)
    assert "is a file or a link, not a folder" in line and "another run.name" in line, line
    if kind == "file":
        assert (tmp_path / "fault").read_text() == "mine"


def test_channels_last_on_a_model_without_convolutions_says_it_changes_nothing(tmp_path, capsys):
    assert train_cli(tmp_path, "memory.channels_last=true", "train.steps=2") == 0
    out = capsys.readouterr().out
    assert "memory.channels_last = true: the model has no 4-D (convolution) weights" in out, out


def test_a_compiled_model_trains_as_the_module_inside_and_loads_back(tmp_path, capsys):
    """A factory returning torch.compile(model): final/ held the inner module's names while the config rebuilt
    the compiled wrapper (`_orig_mod.` names), so `turbotrain.load` of the finished run was refused."""
    assert train_cli(tmp_path, f'model.name="{R}compiled"', "model.args={}", "train.steps=2") == 0
    captured = capsys.readouterr()
    assert "it came compiled (torch.compile)" in captured.out and captured.err == "", captured.err
    model = turbotrain.load(tmp_path / "fault", "cpu")
    assert type(model).__name__ == "Linear"


def test_a_home_relative_out_dir_and_resume_path_are_the_homes(tmp_path, capsys, monkeypatch):
    """run.out_dir = "~/runs" wrote into a folder named "~" under the current one (and `export ~/runs/...`,
    which expands it, found nothing); checkpoint.resume = "~/..." was "no such folder"."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    assert train_cli(tmp_path, 'run.out_dir="~/runs"', "train.steps=2", "checkpoint.every=1") == 0
    assert (tmp_path / "home" / "runs" / "fault" / "final").is_dir() and not (tmp_path / "~").exists()
    ckpt = "~/runs/fault/checkpoints/step-00000002"
    assert main(["train", str(BASE_TOML), f"run.out_dir={lit(tmp_path / 'b')}", "train.steps=3",
                 f"checkpoint.resume={lit(ckpt)}"]) == 0
    assert "resumed from step 2" in capsys.readouterr().out


def test_a_resume_path_naming_a_file_says_it_is_a_file(tmp_path, capsys):
    (tmp_path / "step.pt").write_bytes(b"x")
    assert train_cli(tmp_path, f"checkpoint.resume={lit(tmp_path / 'step.pt')}") == 2
    line = error_line(capsys.readouterr().err)
    assert "no such folder (a file is there)" in line, line


def test_a_resume_with_a_new_lr_keeps_a_user_optimizers_group_ratios_and_needs_no_weight_decay(tmp_path, capsys):
    """A new train.lr on resume set every group's lr to it (a group at lr/10 jumped to the full lr), and an
    optimizer whose groups hold no weight_decay (built from the bare parameters) ended in a KeyError."""
    from userpkg import redteam_s22

    ckpt = ["checkpoint.every=2", "train.steps=2"]
    assert train_cli(tmp_path, f'train.optimizer="{R}two_lrs"', *ckpt) == 0
    assert train_cli(tmp_path, f'train.optimizer="{R}two_lrs"', "checkpoint.every=2", "train.steps=4",
                     "train.lr=0.02") == 0
    groups = redteam_s22.BUILT[-1].param_groups
    assert [g["initial_lr"] for g in groups] == pytest.approx([0.02, 0.002])
    run = tmp_path / "flat"
    assert train_cli(run, f'train.optimizer="{R}rprop_flat"', *ckpt) == 0
    assert train_cli(run, f'train.optimizer="{R}rprop_flat"', "checkpoint.every=2", "train.steps=4",
                     "train.lr=0.02", "train.weight_decay=0.2") == 0
    assert "applied the new train.lr (0.01 → 0.02)" in capsys.readouterr().out


def test_a_train_override_without_mode_fails_evaluation_in_one_line_and_keeps_the_steps(tmp_path, capsys):
    """model.eval() calls the user's train(False): a TypeError raised at the call, no frame of theirs to name,
    was a traceback."""
    assert train_cli(tmp_path, f'model.name="{R}train_no_mode"', "model.args={}", "checkpoint.every=2") == 2
    line = error_line(capsys.readouterr().err)
    assert "model.eval() failed" in line and "train(False)" in line and "checkpoints/step-00000004" in line, line


def test_a_callback_that_leaves_the_model_in_eval_mode_does_not_train_the_rest_in_it(tmp_path, capsys):
    """A sampling callback's model.eval() at a log step had every later step train in eval mode (no dropout,
    BatchNorm on running statistics), silently."""
    from userpkg.redteam_s22 import ModeSpy, Sampler

    model = ModeSpy()
    cfg = load_config(str(BASE_TOML), [f"run.out_dir={lit(tmp_path)}", "train.steps=3", "data.eval_batches=0"])
    turbotrain.train(cfg, model=model, callbacks=[Sampler()])
    # after the contract's and the FLOP count's forwards: each step's (train mode), then the callback's (eval)
    assert model.modes[2:] == [True, False] * 3, model.modes
    assert "Sampler.on_log switched the model to eval mode and left it so" in capsys.readouterr().out


@pytest.mark.parametrize("source, words", [
    ("def build(:\n    pass\n", ["raised SyntaxError", "line 1", "fix it there"]),
    ("raise RuntimeError('no GPU here')\n", ["raised RuntimeError: no GPU here", "at s22mod_", "fix it there"]),
    ("import sys\nsys.exit(3)\n", ["called sys.exit(3)", "must not exit the process"]),
], ids=["syntax-error", "raises", "exits"])
def test_a_module_that_fails_as_it_is_imported_is_one_line_naming_the_key(tmp_path, capsys, monkeypatch, source,
                                                                          words):
    """A config's `pkg.module:name` whose module has a syntax error was a traceback; one calling sys.exit ended
    the run with its code and no word."""
    name = f"s22mod_{len(source)}"
    (tmp_path / f"{name}.py").write_text(source)
    monkeypatch.syspath_prepend(str(tmp_path))
    assert train_cli(tmp_path, f'model.name="{name}:build"', "model.args={}") == 2
    line = error_line(capsys.readouterr().err)
    assert line.startswith(f"error: model.name = '{name}:build': importing '{name}'"), line
    for w in words:
        assert w in line, line


def test_a_model_with_extra_state_writes_final_and_loads_it_back(tmp_path, capsys):
    """A module's get_extra_state() (plain data in its state_dict) ended the finished run in an AttributeError
    writing final/ (safetensors holds tensors only), after the training, with no summary."""
    assert train_cli(tmp_path, f'model.name="{R}extra_state"', "model.args={}", "train.steps=2") == 0, \
        capsys.readouterr().err
    model = turbotrain.load(tmp_path / "fault", "cpu")
    assert model.extra == {"calls": 1, "note": "plain data"}
    assert (tmp_path / "fault" / "summary.json").is_file()


@pytest.mark.parametrize("args, words", [
    ({"device": "gpu"}, "load(device='gpu'): not a device of this machine"),
    ({"device": "cuda:99"}, "load(device='cuda:99'): not a device of this machine"),
    ({"run_dir": 42}, "42: expected the path of a run directory"),
    ({"run_dir": "FILE"}, "a file, not a run directory"),
], ids=["no-such-device-type", "gpu-past-the-count", "run-dir-not-a-path", "run-dir-a-file"])
def test_load_refuses_a_device_or_run_dir_it_cannot_use_with_a_user_error(tmp_path, capsys, args, words):
    """turbotrain.load(run, device="gpu") or a CUDA device on a machine without it was torch's RuntimeError or
    AssertionError, after the model was built; a non-path run_dir a TypeError."""
    assert train_cli(tmp_path, "train.steps=1") == 0
    final = tmp_path / "fault" / "final" / "model.safetensors"
    kwargs = {"run_dir": tmp_path / "fault", **args}
    if kwargs["run_dir"] == "FILE":
        kwargs["run_dir"] = final
    with pytest.raises(UserError) as e:
        turbotrain.load(**kwargs)
    assert words in str(e.value), e.value


def test_val_data_and_eval_metrics_that_no_evaluation_uses_are_said(tmp_path, capsys):
    """val_data passed with data.eval_batches = 0, or train.eval_metrics on a run without validation data, were
    accepted and silently never used."""
    items = torch.utils.data.TensorDataset(torch.randn(64, 8), torch.randn(64))
    metric = 'train.eval_metrics=["userpkg.extensions:mean_abs_error"]'
    cfg = load_config(str(BASE_TOML), [f"run.out_dir={lit(tmp_path)}", "train.steps=2", "data.eval_batches=0", metric])
    turbotrain.train(cfg, val_data=items)
    out = capsys.readouterr().out
    assert "the val_data passed to train() is not used: data.eval_batches = 0" in out, out
    assert "train.eval_metrics ['userpkg.extensions:mean_abs_error'] are never computed" in out, out
    cfg = load_config(str(BASE_TOML), [f"run.out_dir={lit(tmp_path)}", "train.steps=2", metric])
    turbotrain.train(cfg, train_data=items)
    assert "never computed: there is no validation data" in capsys.readouterr().out


def test_fp16_precision_on_a_float16_model_is_one_line_before_any_step(tmp_path, capsys):
    """A .half() model under precision.dtype = "fp16": the loss scaler's unscale_ raised torch's ValueError
    ("Attempting to unscale FP16 gradients") at the first step, a traceback."""
    assert train_cli(tmp_path, f'model.name="{R}float16"', "model.args={}", "precision.dtype=fp16") == 2
    line = error_line(capsys.readouterr().err)
    assert "the model's parameters are float16 (e.g. fc.weight)" in line and 'precision.dtype = "fp32"' in line
    assert not (tmp_path / "fault" / "metrics.jsonl").exists()


def test_a_cuda_attention_kernel_asked_for_on_a_cpu_is_said(tmp_path, capsys):
    """kernels.attention = "cudnn" on a CPU logged "SDPA backends cudnn_attention, ..." as if it ran."""
    gpt = ['model.name="gpt"', "model.args={n_layer=1, n_head=2, n_embd=16, block_size=16, vocab_size=50}",
           'data.name="synthetic"', "data.args={seq_len=16, vocab_size=50, size=64}", 'train.loss="cross_entropy"']
    assert train_cli(tmp_path, *gpt, "train.steps=1", 'kernels.attention="cudnn"') == 0
    assert 'kernels.attention = "cudnn" names a CUDA kernel; on cpu' in capsys.readouterr().out


def test_export_out_that_is_a_symbolic_link_is_named_as_one(tmp_path, capsys):
    """--out naming a link to an empty folder failed the final rename with "cannot write the export (Not a
    directory); free space or choose another folder"."""
    assert train_cli(tmp_path, "train.steps=1") == 0
    (tmp_path / "empty").mkdir()
    os.symlink(tmp_path / "empty", tmp_path / "link")
    capsys.readouterr()
    assert main(["export", str(tmp_path / "fault"), "--format", "safetensors", "--out", str(tmp_path / "link")]) == 2
    line = error_line(capsys.readouterr().err)
    assert "is a symbolic link; name the folder it points to" in line, line
    assert list((tmp_path / "empty").iterdir()) == []


@pytest.mark.parametrize("command", ["config", "train"])
def test_a_builtin_model_too_big_for_the_host_is_one_line_before_building(tmp_path, capsys, command):
    """model.args.depth=100000000 on mlp-seed was built anyway (the OOM killer ended `config` and `train`): every
    built-in model's size is estimated from its arguments and checked against the host first."""
    argv = [command, "mlp-seed", "model.args.depth=100000000"]
    assert main(argv + ([f"run.out_dir='{tmp_path}'"] if command == "train" else [])) == 2
    assert "more than this machine's available" in capsys.readouterr().err


@pytest.mark.parametrize("name,kwargs", [("mlp", {}), ("mlp", {"in_features": 784, "width": 64, "depth": 3}),
                                         ("cnn", {}), ("cnn", {"in_channels": 3, "width": 16, "num_classes": 7})])
def test_builtin_size_estimates_are_exact(name, kwargs):
    import importlib
    import inspect

    module = importlib.import_module(f"turbotrain.models.{name}")
    bound = inspect.signature(module.build).bind(**kwargs)
    bound.apply_defaults()
    assert module.estimate_params(**bound.arguments) == sum(p.numel() for p in module.build(**kwargs).parameters())


@pytest.mark.gpu
def test_a_loss_module_holding_class_weights_trains_on_the_gpu(tmp_path):
    """CrossEntropyLoss(weight=...) built on the CPU met the model's CUDA outputs: "Expected all tensors to be on
    the same device" at the first step. The loss module goes to the training device with the model."""
    from turbotrain.trainer import train

    g = torch.Generator().manual_seed(0)
    data = torch.utils.data.TensorDataset(torch.randn(64, 8, generator=g), torch.randint(0, 3, (64,), generator=g))
    cfg = load_config(str(BASE_TOML), [f"run.out_dir={lit(tmp_path)}", "run.device='cuda'", "train.steps=3",
                                       "data.batch_size=8", "data.eval_batches=0", "checkpoint.every=0"])
    loss = nn.CrossEntropyLoss(weight=torch.tensor([1.0, 2.0, 0.5]))
    summary = train(cfg, model=nn.Linear(8, 3), train_data=data, loss_fn=loss)
    assert summary["steps"] == 3 and summary["final_loss"] is not None


def test_val_acc_leaves_out_the_ignored_positions(tmp_path):
    """Labels of -100 are padding F.cross_entropy ignores: they were counted as wrong predictions in val_acc."""
    from turbotrain.trainer import train

    y = torch.tensor([0, -100] * 32)
    data = torch.utils.data.TensorDataset(torch.randn(64, 4, generator=torch.Generator().manual_seed(0)), y)
    model = nn.Linear(4, 3)
    with torch.no_grad():
        model.weight.zero_()
        model.bias.copy_(torch.tensor([10.0, 0.0, 0.0]))  # predicts class 0 everywhere
    cfg = load_config(str(BASE_TOML), [f"run.out_dir={lit(tmp_path)}", "train.steps=2", "train.lr=1e-9",
                                       "data.batch_size=8", "data.eval_batches=2", "checkpoint.every=0",
                                       "train.loss='cross_entropy'"])
    summary = train(cfg, model=model, train_data=data, val_data=data)
    assert summary["val_acc"] == 1.0


def test_a_users_error_raised_in_a_loader_worker_is_its_own_line(tmp_path, capsys):
    """torch re-raises a worker's exception with the worker's whole traceback in its message: the error line
    held all of it. It is the UserError's own line now."""
    argv = ["train", str(BASE_TOML), f"run.out_dir={lit(tmp_path)}", "train.steps=3",
            "data.name='tests.userpkg.redteam_s22:RaisesInWorkers'", "data.num_workers=1", "data.eval_batches=0"]
    assert main(argv) == 2
    line = error_line(capsys.readouterr().err)
    assert line == "error: data.name: item refused by its own check; fix the dataset", line


def test_half_precision_weights_are_said(tmp_path, capsys):
    """A model loaded in bf16 was stepped in bf16 with no word: no float32 master weights, small updates lost."""
    from turbotrain.trainer import train

    data = torch.utils.data.TensorDataset(torch.randn(32, 8).bfloat16(), torch.randn(32, 1).bfloat16())
    cfg = load_config(str(BASE_TOML), [f"run.out_dir={lit(tmp_path)}", "train.steps=2", "data.eval_batches=0",
                                       "checkpoint.every=0"])
    train(cfg, model=nn.Linear(8, 1).to(torch.bfloat16), train_data=data)
    assert "trainable parameters are bfloat16 (e.g. weight)" in capsys.readouterr().out
