"""Red-team cases of session 21 on user code and monitoring: data that breaks the contract after the first
items the contract checks (labels, token ids, items on an autograd graph, an output that changes shape) is one
`error:` line naming the data and the step, not a traceback; -100 labels are the ignored positions they are in
PyTorch; weights that go NaN behind a finite loss are alerted and never saved; optimizers, losses, factories and
callbacks of the wrong kind, a callback that exits the process, a malformed webhook URL, a busy Prometheus port,
a dataset that blocks on its first item: each one line (or, for the hang, a closing `hung:` line). User code:
tests/userpkg/redteam2.py."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch

import turbotrain
from tests.faults.common import BASE_TOML, error_line, lit, rows, subprocess_env
from tests.helpers import run_bounded
from turbotrain.callbacks import Callback
from turbotrain.cli import main
from turbotrain.config import load_config
from turbotrain.errors import UserError
from turbotrain.files import cache_root
from turbotrain.plugins import _users_frame

R = "userpkg.redteam2:"
CLASSES = [f'model.name="{R}classifier"', f'data.name="{R}classes"', 'train.loss="cross_entropy"', "train.steps=2"]
TOKENS = [f'data.name="{R}tokens"', 'train.loss="cross_entropy"', "train.steps=2"]
GPT = ['model.name="gpt"', "model.args={n_layer=1, n_head=2, n_embd=16, block_size=16, vocab_size=50}"]

# (id, overrides, words the one error line must hold)
CASES = [
    ("label-past-classes-later", CLASSES, ["at step 1", "has label 7", "outputs 3 classes"]),
    ("negative-label-later", [*CLASSES, "data.args.bad_label=-1"], ["at step 1", "has label -1", "-100"]),
    ("token-id-past-builtin-vocab-later", [*GPT, *TOKENS], ["at step 1", "token id 80", "vocab_size = 50"]),
    ("token-id-past-user-embedding-later", [f'model.name="{R}tiny_lm"', "model.args={}", *TOKENS],
     ["at step 1", "input id 80", "50 rows"]),
    ("output-widens-mid-run", [f'model.name="{R}widens_at"', "model.args={}", "train.steps=8"],
     ["output has shape (8, 3)", "targets (8,)", "change during training"]),
    ("items-require-grad", [f'data.name="{R}grad_items"', "data.args={}"], ["grad_items", "require grad", "detach"]),
    ("optimizer-needs-closure", [f'train.optimizer="{R}lbfgs"'], ["LBFGS.step needs a closure"]),
    ("optimizer-sparse-only", [f'train.optimizer="{R}sparse_adam"'], ["SparseAdam", "sparse gradients"]),
    ("callback-metric-named-like-a-gpu-reading", [f'train.callbacks=["{R}GpuTemp"]'], ["'gpu_temp_c'", "new names"]),
    ("callback-exits", [f'train.callbacks=["{R}Exits"]'], ["Exits.on_step_end called sys.exit(0)", "not finished"]),
    ("model-name-is-a-module-instance", [f'model.name="{R}MODULE_INSTANCE"', "model.args={}"],
     ["built Linear module, not a factory"]),
    ("loss-is-a-class", ['train.loss="torch.nn:MSELoss"'], ["names the class MSELoss", "function"]),
    ("meta-init-parameter-nothing-resets", [f'model.name="{R}scale_only"', "model.args={}", "parallel.meta_init=true"],
     ["meta_init", "no reset_parameters() sets (scale)", "init_weights()"]),
    ("nan-weights-behind-a-finite-loss", [f'model.name="{R}nan_grad"', "model.args={}", "train.grad_clip=0",
                                          "train.steps=6", "checkpoint.every=2"], ["weights hold NaN/inf", "(e.g. p)"]),
    ("nan-in-the-data", [f'data.name="{R}nan_targets"', "data.args={}", "train.steps=6"],
     ["loss is nan", "batch holds NaN/inf in its targets", "nan_targets", "clean the data"]),
    ("dataset-size-attribute-not-an-int", [f'model.name="{R}classifier_of"', "model.args={}",
                                           f'data.name="{R}float_classes"', "data.args={}",
                                           'train.loss="cross_entropy"'],
     ["attribute num_classes = 3.0", "model.args.num_classes", "positive integer"]),
    ("dataset-len-past-any-epoch", [f'data.name="{R}huge_len"', "data.args={}"], ["1,000,000,000,000 items",
                                                                                  "check its __len__"]),
    ("webhook-url-bad-ipv6", ['monitor.webhook_url="http://[::1/hook"'], ["monitor.webhook_url", "IPv6"]),
    ("webhook-url-space", ['monitor.webhook_url="http://exa mple.com/"'], ["monitor.webhook_url", "whitespace"]),
    ("loss-spike-factor-below-one", ["monitor.loss_spike_factor=0.5"], ["loss_spike_factor = 0.5", "> 1"]),
    ("hang-timeout-sub-second", ["monitor.hang_timeout_s=1e-9"], ["hang_timeout_s", ">= 1 second"]),
]


@pytest.mark.parametrize("overrides, words", [pytest.param(o, w, id=i) for i, o, w in CASES])
def test_one_error_line(tmp_path, capsys, overrides, words):
    rc = main(["train", str(BASE_TOML), f"run.out_dir={lit(tmp_path)}", *overrides])
    err = capsys.readouterr().err
    line = error_line(err)
    assert rc == 2 and "Traceback" not in err, err
    for w in words:
        assert w in line, line


def test_nan_weights_leave_no_end_checkpoint_nor_final_and_are_alerted(tmp_path, capsys):
    assert main(["train", str(BASE_TOML), f"run.out_dir={lit(tmp_path)}", f'model.name="{R}nan_grad"',
                 "model.args={}", "train.grad_clip=0", "train.steps=6", "checkpoint.every=2"]) == 2
    run = tmp_path / "fault"
    assert not (run / "final").exists()
    assert not list((run / "checkpoints").glob("step-*")) if (run / "checkpoints").exists() else True
    alerts = [json.loads(line) for line in (run / "alerts.jsonl").read_text().splitlines()]
    assert any(a["rule"] == "grad_nonfinite" for a in alerts)
    assert all(r["loss"] == r["loss"] for r in rows(run))  # the loss stayed finite all along


def test_ignore_index_labels_train(tmp_path, capsys):
    """-100 marks a position the loss ignores (PyTorch's and Hugging Face's padding): accepted, not 'a label'."""
    assert main(["train", str(BASE_TOML), f"run.out_dir={lit(tmp_path)}", f'model.name="{R}tiny_lm"', "model.args={}",
                 f'data.name="{R}padded"', "data.args={}", 'train.loss="cross_entropy"', "train.steps=2"]) == 0, \
        capsys.readouterr().err


def test_isolated_nan_losses_are_alerted_without_stopping(tmp_path, capsys):
    assert main(["train", str(BASE_TOML), f"run.out_dir={lit(tmp_path)}", f'train.loss="{R}nan_at_some_steps"',
                 "train.steps=8"]) == 0
    alerts = [json.loads(line) for line in (tmp_path / "fault" / "alerts.jsonl").read_text().splitlines()]
    nonfinite = [a for a in alerts if a["rule"] == "loss_nonfinite"]
    first_nan = next(r["step"] for r in rows(tmp_path / "fault") if r["loss"] is None)
    assert nonfinite and nonfinite[0]["step"] == first_nan and "stops at 3 in a row" in nonfinite[0]["message"]


def test_small_val_split_is_said(tmp_path, capsys):
    assert main(["train", str(BASE_TOML), f"run.out_dir={lit(tmp_path)}", "data.batch_size=16",
                 "data.args.n=64"]) == 0  # the val split of userpkg.data:regression is as big: fine, no warning
    assert "val items" not in capsys.readouterr().out
    cfg = load_config(str(BASE_TOML), [f"run.out_dir={lit(tmp_path)}", "run.name=small"])
    small = torch.utils.data.TensorDataset(torch.randn(3, 8), torch.randn(3))
    big = torch.utils.data.TensorDataset(torch.randn(64, 8), torch.randn(64))
    summary = turbotrain.train(cfg, train_data=big, val_data=small)
    assert summary["val_loss"] is None
    assert "3 val items, fewer than one batch" in capsys.readouterr().out


def test_python_api_objects_of_the_wrong_kind(tmp_path):
    cfg = load_config(str(BASE_TOML), [f"run.out_dir={lit(tmp_path)}"])
    with pytest.raises(UserError, match=r"MSELoss is a class; pass an instance"):
        turbotrain.train(cfg, loss_fn=torch.nn.MSELoss)
    with pytest.raises(UserError, match=r"Callback is a class; pass an instance"):
        turbotrain.train(cfg, callbacks=[Callback])
    model_loss = load_config(str(BASE_TOML), [f"run.out_dir={lit(tmp_path)}", 'train.loss="model"'])
    with pytest.raises(UserError, match=r"drop one of the two"):
        turbotrain.train(model_loss, loss_fn=torch.nn.functional.mse_loss)


def test_config_toml_says_what_it_cannot_rebuild(tmp_path):
    cfg = load_config(str(BASE_TOML), [f"run.out_dir={lit(tmp_path)}"])
    turbotrain.train(cfg, loss_fn=lambda out, y: torch.nn.functional.l1_loss(out, y))
    head = (tmp_path / "fault" / "config.toml").read_text().splitlines()[0]
    assert head.startswith("# loss_fn passed to turbotrain.train()"), head
    load_config(str(tmp_path / "fault" / "config.toml"))  # still a config


def test_meta_init_counts_flops_of_a_model_with_buffers(tmp_path, capsys):
    """A meta-built model whose forward uses a real buffer: the FLOP count runs on meta buffers too."""
    assert main(["train", str(BASE_TOML), f"run.out_dir={lit(tmp_path)}", f'model.name="{R}masked"', "model.args={}",
                 "parallel.meta_init=true"]) == 0, capsys.readouterr().err
    assert "Masked.init_weights()" in capsys.readouterr().out


def test_installed_packages_are_not_the_users_code(tmp_path):
    assert not _users_frame("/usr/lib/python3/dist-packages/torch/nn/functional.py")
    assert not _users_frame("/opt/venv/lib/python3.11/site-packages/torch/nn/functional.py")
    assert not _users_frame(torch.__file__)
    assert _users_frame(str(tmp_path / "mine.py"))


def test_users_package_installed_in_site_packages_is_theirs(tmp_path):
    """A user's package pip-installed (non-editable) lives in site-packages; a config naming it makes its frames
    the user's, so a failure at a later step is one line pointing at their file."""
    pkg = tmp_path / "lib" / "site-packages" / "sitepkg"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "m.py").write_text(textwrap.dedent("""
        import torch
        from torch import nn

        class FailsAt(nn.Module):
            def __init__(self):
                super().__init__()
                self.fc, self.calls = nn.Linear(8, 1), 0

            def forward(self, x):
                self.calls += 1
                if self.calls >= 5:
                    raise ArithmeticError("forward broke")
                return self.fc(x).squeeze(-1)

        def fails_at():
            return FailsAt()
    """))
    env = subprocess_env(PYTHONPATH=os.pathsep.join([subprocess_env()["PYTHONPATH"], str(pkg.parent)]))
    r = subprocess.run([sys.executable, "-m", "turbotrain", "train", str(BASE_TOML), f"run.out_dir={lit(tmp_path)}",
                        'model.name="sitepkg.m:fails_at"', "model.args={}"], env=env, capture_output=True, text=True,
                       timeout=240)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert "your code raised ArithmeticError" in error_line(r.stderr) and "m.py:" in error_line(r.stderr)


def test_cache_root_is_absolute_and_empty_means_unset(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("TURBOTRAIN_CACHE", "rel")
    assert cache_root() == tmp_path / "rel"
    monkeypatch.setenv("TURBOTRAIN_CACHE", "")
    assert cache_root() == (tmp_path.home() / ".cache" / "turbotrain").absolute()


def test_busy_prometheus_port_is_refused_before_the_run_dir(tmp_path, capsys):
    pytest.importorskip("prometheus_client")
    import socket

    assert main(["train", str(BASE_TOML), f"run.out_dir={lit(tmp_path)}"]) == 0
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        rc = main(["train", str(BASE_TOML), f"run.out_dir={lit(tmp_path)}", "train.lr=0.02",
                   f"monitor.prometheus_port={port}", 'monitor.prometheus_addr="127.0.0.1"'])
    assert rc == 2 and "monitor.prometheus_port" in error_line(capsys.readouterr().err)
    assert (tmp_path / "fault" / "summary.json").exists() and not list(tmp_path.glob("fault/previous-*"))


def test_dataset_blocking_on_its_first_item_is_a_hang(tmp_path):
    """The loop's watchdog starts with the loop; the first reads of the data, before it, have their own."""
    r = run_bounded([sys.executable, "-m", "turbotrain", "train", str(BASE_TOML), f"run.out_dir={lit(tmp_path)}",
                     f'data.name="{R}blocks"', "data.args={}", "monitor.hang_timeout_s=1"], timeout=120,
                    what="a run whose dataset blocks", env=subprocess_env())
    assert r.returncode == 1, r.stderr
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith("[turbotrain] hung:") and "first items of data.name" in last, last


def test_every_metric_name_a_run_writes_is_reserved(tmp_path, capsys):
    """ROW_NAMES is what a callback's extra metrics may not take: every name the monitor writes must be in it."""
    from turbotrain.monitor.run_monitor import ROW_NAMES

    assert main(["train", str(BASE_TOML), f"run.out_dir={lit(tmp_path)}"]) == 0
    written = {k for r in rows(tmp_path / "fault") for k in r if not k.startswith("val_")}
    assert written and written <= ROW_NAMES, written - ROW_NAMES
