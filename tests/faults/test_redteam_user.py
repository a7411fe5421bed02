"""Red-team cases on user code and the Python API: each bad input is ONE `error:` line naming the user's
function and the fix, exit code 2, no traceback — never a traceback from a hook, a metric, an optimizer
factory, a dataset that changes after its first batch, transformers, or a text file; never a wrong result
with exit code 0. User code: tests/userpkg/redteam.py (imported as `userpkg.redteam`)."""
from __future__ import annotations

import json
import re

import pytest
import torch

import turbotrain
from tests.faults.common import BASE_TOML, error_line, lit, loss_rows, rows
from turbotrain.cli import main
from turbotrain.config import load_config
from turbotrain.errors import UserError

R = "userpkg.redteam:"


def _text(tmp, name, data: bytes):
    d = tmp / name
    d.mkdir()
    (d / ("a.jsonl" if name == "jsonl" else "a.txt")).write_bytes(data)
    return d


def _hf_dir(tmp, config: str | None):
    d = tmp / "hfdir"
    d.mkdir()
    (d / "config.json").write_text(config)
    return d


LATIN1 = ("café naïve " * 300).encode("latin-1")
HF_SMALL = ["model.args.n_layer=1", "model.args.n_embd=32", "model.args.n_head=2"]

# (id, overrides ({tmp}: the test's folder), words the error line must hold, prepare(tmp) or None)
CLI_CASES = [
    ("callback-hook-raises", [f'train.callbacks=["{R}RaisingCallback"]'],
     ["RaisingCallback.on_step_end", "ValueError", "redteam.py:"], None),
    ("callback-start-raises", [f'train.callbacks=["{R}RaisingStart"]'], ["RaisingStart.on_train_start"], None),
    ("callback-end-raises", [f'train.callbacks=["{R}EndRaises"]'], ["EndRaises.on_train_end", "KeyError"], None),
    ("callback-init-raises", [f'train.callbacks=["{R}InitRaises"]'], ["train.callbacks", "InitRaises", "bad init"],
     None),
    ("callback-on-log-list", [f'train.callbacks=["{R}LogReturnsList"]'], ["on_log returned list", "dict"], None),
    ("callback-on-log-int-name", [f'train.callbacks=["{R}LogNonStringKey"]'], ["metric name 1", "new names"], None),
    ("callback-on-log-val-name", [f'train.callbacks=["{R}LogValLoss"]'], ["'val_loss'", "val_*"], None),
    ("callback-on-log-huge-int", [f'train.callbacks=["{R}LogHugeInt"]'], ["'count'", "beyond what a float"], None),
    ("val-item-raises", [f'data.name="{R}val_fails_at"'], ["evaluation", "LookupError", "val item 4", "redteam.py:"],
     None),
    ("val-item-narrower", [f'data.name="{R}val_fails_at"', 'data.args.mode="narrow"'],
     ["evaluation", "validation batch", "stack"], None),
    ("eval-forward-raises", [f'model.name="{R}eval_mode"'], ["evaluation", "eval mode", "NotImplementedError",
                                                             "redteam.py:"], None),
    ("eval-forward-pair", [f'model.name="{R}eval_mode"', 'model.args.mode="pair"'],
     ["evaluation", "the model returned a tuple", "output tensor"], None),
    ("eval-model-loss-int", [f'model.name="{R}eval_mode"', 'model.args.mode="int"', 'train.loss="model"'],
     ["evaluation", "forward(inputs, targets) returned an int64", "floating-point"], None),
    ("forward-raises-at-a-later-step", [f'model.name="{R}fails_at_call"'],
     ["your code raised ArithmeticError", "forward broke at call", "redteam.py:", "TURBOTRAIN_TRACEBACK=1"], None),
    ("data-item-0-raises", [f'data.name="{R}no_item_zero"'], ["no_item_zero", "__getitem__(0)", "KeyError"], None),
    ("data-len-negative", [f'data.name="{R}negative_len"'], ["negative_len", "len()", "ValueError"], None),
    ("metric-vector", [f'train.eval_metrics=["{R}metric_vector"]'], ["metric_vector", "shape (8,)", "one number"],
     None),
    ("metric-none", [f'train.eval_metrics=["{R}metric_none"]'], ["metric_none returned None"], None),
    ("metric-string", [f'train.eval_metrics=["{R}metric_string"]'], ["metric_string", "str"], None),
    ("metric-dict", [f'train.eval_metrics=["{R}metric_dict"]'], ["metric_dict", "dict"], None),
    ("metric-raises", [f'train.eval_metrics=["{R}metric_raises"]'], ["metric_raises", "ZeroDivisionError"], None),
    ("metric-named-loss", [f'train.eval_metrics=["{R}loss"]'], ["val_loss", "rename"], None),
    ("metric-twice", [f'train.eval_metrics=["{R}metric_tensor", "{R}metric_tensor"]'], ["val_metric_tensor"], None),
    ("optimizer-raises", [f'train.optimizer="{R}opt_raises"'], ["train.optimizer", "opt_raises", "bad opt"], None),
    ("optimizer-ignores-groups", [f'train.optimizer="{R}opt_ignores_groups"'],
     ["opt_ignores_groups", "does not hold", "param_groups"], None),
    ("batchnorm-micro-batch-1", [f'model.name="{R}batchnorm"', "data.batch_size=1"],
     ["userpkg.redteam:batchnorm", "more than 1 value"], None),
    ("items-change-shape", [f'data.name="{R}shape_shift"'], ["shape_shift", "[11] float32", "[8] float32"], None),
    ("items-change-dtype", [f'data.name="{R}shape_shift"', 'data.args.mode="dtype"'], ["float64", "same shape"],
     None),
    ("items-become-none", [f'data.name="{R}shape_shift"', 'data.args.mode="none"'], ["shape_shift", "NoneType"],
     None),
    ("items-become-none-worker", [f'data.name="{R}shape_shift"', 'data.args.mode="none"', "data.num_workers=1"],
     ["shape_shift", "NoneType"], None),
    ("dict-label-missing-later", [f'data.name="{R}dicts_missing_later"'], ["dicts_missing_later", "KeyError"], None),
    ("text-latin1", ['data.name="text"', "data.args.path={dir}", "data.args.block_size=16"],
     ["a.txt", "not UTF-8", "offset 3"], lambda t: _text(t, "latin1", LATIN1)),
    ("text-utf16-with-bom", ['data.name="text"', "data.args.path={dir}", "data.args.block_size=16"],
     ["a.txt", "not UTF-8", "iconv -f utf-16 "], lambda t: _text(t, "utf16", ("hello " * 300).encode("utf-16"))),
    ("prometheus-addr-unresolvable", ["monitor.prometheus_port=1", 'monitor.prometheus_addr="no-such-host.invalid"'],
     ["monitor.prometheus_addr", "no-such-host.invalid", "address of this host"], None),
    ("text-binary", ['data.name="text"', "data.args.path={dir}", "data.args.block_size=16"],
     ["a.txt", "binary"], lambda t: _text(t, "binary", b"\x00\x01abc" * 500)),
    ("text-jsonl-not-utf8", ['data.name="text"', "data.args.path={dir}", "data.args.block_size=16"],
     ["a.jsonl", "not UTF-8"], lambda t: _text(t, "jsonl", b'{"text": "hi"}\n\xff\xfe\n')),
    ("hf-arg-wrong-type", ['model.name="hf:gpt2"', "model.args.n_layer='two'"], ["hf:gpt2", "n_layer", "model.args"],
     None),
    ("hf-heads-do-not-divide", ['model.name="hf:gpt2"', "model.args.n_layer=1", "model.args.n_embd=30",
                                "model.args.n_head=4"], ["hf:gpt2", "divisible"], None),
    ("hf-negative-layers", ['model.name="hf:gpt2"', "model.args.n_layer=-1"], ["model.args.n_layer = -1", ">= 1"],
     None),
    ("hf-dir-corrupt-config", ['model.name="hf:{dir}"'], ["config.json", "save_pretrained"],
     lambda t: _hf_dir(t, '{"model_type": "gpt2", "n_layer": 1')),
    ("hf-dir-no-weights", ['model.name="hf:{dir}"'], ["weights", "model.safetensors"],
     lambda t: _hf_dir(t, '{"model_type": "gpt2", "n_layer": 1, "n_head": 2, "n_embd": 32}')),
]


@pytest.mark.parametrize("overrides, words, prepare",
                         [pytest.param(o, w, p, id=i) for i, o, w, p in CLI_CASES])
def test_cli_user_error_is_one_line(tmp_path, monkeypatch, capsys, overrides, words, prepare):
    if any("hf:" in o for o in overrides):
        pytest.importorskip("transformers")
    if any("prometheus" in o for o in overrides):
        pytest.importorskip("prometheus_client")
    monkeypatch.setenv("TURBOTRAIN_CACHE", str(tmp_path / "cache"))
    where = prepare(tmp_path) if prepare else None
    argv = ["train", str(BASE_TOML), f"run.out_dir={lit(tmp_path)}",
            *(o.replace("{dir}", lit(where) if "=" in o and "hf:" not in o else str(where)) for o in overrides)]
    rc = main(argv)
    err = capsys.readouterr().err
    line = error_line(err)
    assert rc == 2, err
    for w in words:
        assert w in line, line


def test_nan_metric_is_null_not_invalid_json(tmp_path, capsys):
    assert main(["train", str(BASE_TOML), f"run.out_dir={lit(tmp_path)}",
                 f'train.eval_metrics=["{R}metric_nan"]']) == 0
    text = (tmp_path / "fault" / "metrics.jsonl").read_text()
    assert "NaN" not in text
    assert rows(tmp_path / "fault")[-1]["val_metric_nan"] is None
    json.loads(text.splitlines()[-1], parse_constant=lambda c: pytest.fail(f"non-JSON constant {c}"))


def _cfg(tmp_path):
    return load_config(str(BASE_TOML), [f"run.out_dir={lit(tmp_path)}"])


class _Raises:
    def on_step_end(self, state):
        raise RuntimeError("api hook")


def _good():
    from userpkg.data import regression

    return regression("train")


API_CASES = [
    ("cfg-is-a-path", lambda c: turbotrain.train("fault.toml"), ["train(cfg)", "load_config"]),
    ("callbacks-not-a-list", lambda c: turbotrain.train(c, callbacks=_Raises()), ["callbacks", "list"]),
    ("callback-raises", lambda c: turbotrain.train(c, callbacks=[_Raises()]), ["_Raises.on_step_end", "api hook"]),
    ("train-data-int", lambda c: turbotrain.train(c, train_data=42), ["train_data", "int", "Dataset"]),
    ("train-data-tensor", lambda c: turbotrain.train(c, train_data=torch.randn(64, 8)), ["train_data", "Tensor"]),
    ("val-data-int", lambda c: turbotrain.train(c, train_data=_good(), val_data=5), ["val_data", "int"]),
    ("val-data-other-shape", lambda c: turbotrain.train(
        c, train_data=_good(), val_data=[(torch.randn(3), torch.randn(()))] * 16), ["val_data", "[3] float32"]),
    ("loss-raises", lambda c: turbotrain.train(c, loss_fn=lambda o, y: 1 / 0), ["loss_fn", "ZeroDivisionError"]),
]


@pytest.mark.parametrize("call, words", [pytest.param(f, w, id=i) for i, f, w in API_CASES])
def test_python_api_user_error(tmp_path, call, words):
    with pytest.raises(UserError) as e:
        call(_cfg(tmp_path))
    msg = str(e.value)
    assert "\n" not in msg, msg
    for w in words:
        assert w in msg, msg



@pytest.mark.parametrize("section, key, value, said", [
    ("kernels", "fused_loss", "yes", 'kernels.fused_loss = "yes": expected'),
    ("kernels", "fused_loss", None, "kernels.fused_loss = "),
    ("train", "lr", "x", 'train.lr = "x": expected'),
    ("train", "lr", float("nan"), "train.lr = nan: must be a finite number"),
    ("precision", "dtype", "fp64", 'precision.dtype = "fp64"'),
])
def test_a_value_set_on_a_loaded_config_is_checked_as_a_files_would_be(tmp_path, section, key, value, said):
    """Python API: a field changed after load_config passes the loader's checks (one UserError, nothing written),
    instead of running as something else and landing in config.toml as a value the next load refuses."""
    cfg = load_config("gpt-shakespeare", [f"run.out_dir={str(tmp_path)!r}", "train.steps=1"])
    setattr(getattr(cfg, section), key, value)  # as `cfg.kernels.fused_loss = "yes"` does
    with pytest.raises(UserError, match=re.escape(said)):
        turbotrain.train(cfg)
    assert not any(tmp_path.iterdir())


def test_a_path_object_set_on_a_loaded_config_is_taken_as_its_text(tmp_path):
    from pathlib import Path

    cfg = load_config("gpt-shakespeare", ["train.steps=1", "model.args.n_layer=1", "model.args.n_embd=32"])
    cfg.run.out_dir = Path(tmp_path)
    turbotrain.train(cfg)
    assert 'out_dir = "' + str(tmp_path) in (tmp_path / "gpt-shakespeare" / "config.toml").read_text()


def test_an_evaluation_failure_saves_the_steps_trained_and_the_fixed_rerun_continues_the_curve(tmp_path, capsys):
    """The user's val data failing at an evaluation step ends the run with one error line, but the training
    is not the problem: its steps are saved first, and once the data is fixed a rerun resumes there and
    continues the exact loss curve (checkpoint.every alone would have saved nothing before step 4)."""
    common = ["train.steps=6", "train.eval_every=2", "checkpoint.every=4", f'data.name="{R}val_fails_at"']
    assert main(["train", str(BASE_TOML), f"run.out_dir={lit(tmp_path / 'whole')}", *common,
                 "data.args.at=1000000"]) == 0
    cut = ["train", str(BASE_TOML), f"run.out_dir={lit(tmp_path / 'cut')}", *common]
    capsys.readouterr()
    assert main([*cut, "data.args.at=4"]) == 2
    line = error_line(capsys.readouterr().err)
    assert "val item 4" in line and "steps trained are saved in checkpoints/step-00000002" in line, line
    assert "a rerun resumes from step 2" in line, line
    assert main([*cut, "data.args.at=1000000"]) == 0
    assert loss_rows(tmp_path / "cut" / "fault") == loss_rows(tmp_path / "whole" / "fault")
    # step 2's row holds its training figures; its val_loss is the one evaluation that failed
    assert [r["step"] for r in rows(tmp_path / "cut" / "fault") if "val_loss" in r] == [4, 6]


def test_a_later_failure_of_the_users_code_in_profile_is_one_line(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("TURBOTRAIN_CACHE", str(tmp_path / "cache"))
    rc = main(["profile", str(BASE_TOML), f"run.out_dir={lit(tmp_path)}", f'model.name="{R}fails_at_call"',
               "model.args.at=5"])
    line = error_line(capsys.readouterr().err)
    assert rc == 2 and "ArithmeticError" in line and "redteam.py:" in line, line


def test_turbotrain_traceback_shows_the_users_traceback(tmp_path, monkeypatch):
    """The one-line verdict is for users; TURBOTRAIN_TRACEBACK=1 gives the traceback to debug their code."""
    monkeypatch.setenv("TURBOTRAIN_TRACEBACK", "1")
    with pytest.raises(ArithmeticError, match="forward broke"):
        main(["train", str(BASE_TOML), f"run.out_dir={lit(tmp_path)}", f'model.name="{R}fails_at_call"'])
