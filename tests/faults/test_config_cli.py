"""Config and CLI faults (issue #20 classes 11, 12, 14, 16) and discoverability (issue #21).

Every refusal is one `error:` line on stderr, exit 2, no traceback, nothing written. In-process through
`turbotrain.cli.main` except the user-code test, which needs the real console script."""
from __future__ import annotations

import dataclasses
import json
import math
import os
import random
import subprocess
import sys
import tomllib
import typing
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch

from turbotrain import config as config_mod
from turbotrain.cli import main
from turbotrain.config import Config, config_from_dict, config_reference, config_summary, load_config, to_toml
from turbotrain.errors import UserError

VENV_BIN = Path(sys.executable).parent


@pytest.fixture(autouse=True)
def _keep_sys_path(monkeypatch):
    """The CLI puts the config's folder and the cwd first on sys.path: undo it after each test."""
    monkeypatch.setattr(sys, "path", list(sys.path))


@pytest.fixture
def no_train(monkeypatch):
    """`turbotrain train` without training: the config it would have trained, or an exception to raise."""
    seen: dict = {}

    def fake(cfg, *a, **k):
        seen["cfg"] = cfg
        if "raise" in seen:
            raise seen["raise"]
        return {}

    monkeypatch.setattr("turbotrain.trainer.train", fake)
    return seen


def cli_error(capsys, argv: list[str]) -> str:
    """Run the CLI in-process and check the user-error contract; return the error line."""
    rc = main(argv)
    out, err = capsys.readouterr()
    assert rc == 2, (rc, out, err)
    assert "Traceback" not in err, err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    return lines[0]


def toml_lit(s: str) -> str:
    return json.dumps(s)  # a JSON string is a TOML basic string


# ---------------------------------------------------------------- 1. run.name and to_toml escaping

BAD_NAMES = ["..", ".", "a/b", "../escape", "a\\b", "a\x00b", "a\nb", "tab\there", "-rf", " lead", "x" * 129, "",
             "semi;colon", "star*", "bell\x07", "del\x7f"]


@pytest.mark.parametrize("name", BAD_NAMES, ids=[repr(n)[:20] for n in BAD_NAMES])
def test_bad_run_name_refused_with_the_rule(capsys, tmp_path, no_train, name):
    out = tmp_path / "out"
    line = cli_error(capsys, ["train", "mlp-seed", f"run.name={toml_lit(name)}", f"run.out_dir={toml_lit(str(out))}"])
    assert "run.name" in line and "a run name is 1-128 letters, digits" in line, line
    assert "cfg" not in no_train and not out.exists() and sorted(p.name for p in tmp_path.iterdir()) == []


@pytest.mark.parametrize("name", ["my run_1.2", "a+b=c@host,v2", "café-ß", "x" * 128, "..."])
def test_good_run_names_accepted(name):
    assert load_config("mlp-seed", [f"run.name={toml_lit(name)}"]).run.name == name


@pytest.mark.parametrize("seed", [-1, 2**32, 2**40])
def test_seed_out_of_numpy_range_refused(capsys, no_train, seed):
    assert "run.seed" in cli_error(capsys, ["train", "mlp-seed", f"run.seed={seed}"])


def test_seed_edges_accepted():
    assert load_config("mlp-seed", ["run.seed=0"]).run.seed == 0
    assert load_config("mlp-seed", [f"run.seed={2**32 - 1}"]).run.seed == 2**32 - 1


ODD = ["", "a\nb", "tab\t", "cr\r", "nul\x00", "bell\x07\x1b[31m", "del\x7f", 'quote"', "back\\slash\\",
       "'''", '"""', "é😀\u2028\u00a0", "#not a comment", "[section]", "x = 1", "\\u0041", "\ufeffbom"]


def _odd_string(rnd: random.Random) -> str:
    pool = [chr(c) for c in range(0, 0x80)] + list("é😀\u2028\u00a0\ufeff中")
    return rnd.choice(ODD) if rnd.random() < 0.4 else "".join(rnd.choice(pool) for _ in range(rnd.randint(0, 12)))


def _odd_value(rnd: random.Random, depth: int = 0):
    kind = rnd.randint(0, 7 if depth < 2 else 4)
    if kind == 0:
        return _odd_string(rnd)
    if kind == 1:
        return rnd.choice([0, -1, 2**62, -(2**63)])
    if kind == 2:
        return rnd.choice([0.1, -0.0, 1e-300, 1.7976931348623157e308, float("inf"), float("-inf"), 5e-324])
    if kind == 3:
        return rnd.choice([True, False])
    if kind == 4:
        return rnd.random() * 10 ** rnd.randint(-20, 20)
    if kind == 5:
        return [_odd_string(rnd) for _ in range(rnd.randint(0, 3))]
    if kind == 6:
        return [{_odd_string(rnd): _odd_value(rnd, depth + 2)}]  # an inline table in an array
    return {_odd_string(rnd): _odd_value(rnd, depth + 1) for _ in range(rnd.randint(0, 3))}


def test_to_toml_round_trips_odd_strings_property(tmp_path):
    """to_toml -> tomllib.loads -> Config is the identity, for args dicts full of odd keys and strings."""
    rnd = random.Random(20)
    for i in range(200):
        model_args = {_odd_string(rnd): _odd_value(rnd) for _ in range(rnd.randint(0, 5))}
        data_args = {_odd_string(rnd): _odd_value(rnd) for _ in range(rnd.randint(0, 5))}
        cfg = config_from_dict({"run": {"name": "odd", "out_dir": "outs/é 😀 'q' \"dq\" \\"},
                                "model": {"args": model_args}, "data": {"args": data_args}})
        text = to_toml(cfg)
        try:
            back = config_from_dict(tomllib.loads(text))
        except Exception as e:  # noqa: BLE001 - show the case
            raise AssertionError(f"case {i}: {e}\n{model_args!r}\n{data_args!r}\n{text}") from None
        assert back == cfg, (i, model_args, data_args)
    path = tmp_path / "odd.toml"
    path.write_text(text, encoding="utf-8")
    assert load_config(str(path)) == cfg  # the written file itself sets run.name: it stays "odd"


def test_to_toml_escapes_every_control_character():
    s = "".join(chr(c) for c in range(32)) + "\x7f\"\\é😀"
    cfg = config_from_dict({"model": {"args": {s: s, "k": [s]}}})
    text = to_toml(cfg)
    assert all(ord(c) >= 32 or c == "\n" for c in text) and "\x7f" not in text
    assert config_from_dict(tomllib.loads(text)) == cfg


def test_control_characters_refused_in_any_string_field(capsys, no_train):
    line = cli_error(capsys, ["train", "mlp-seed", 'train.loss="mse\\n"'])
    assert "train.loss" in line and '"\\n"' in line
    line = cli_error(capsys, ["train", "mlp-seed", 'run.out_dir="a\\u0000b"'])
    assert "run.out_dir" in line


# ---------------------------------------------------------------- 2. config files

def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def test_self_extends_refused(capsys, tmp_path, no_train):
    a = write(tmp_path / "a.toml", 'extends = "a.toml"\n')
    assert "extends itself" in cli_error(capsys, ["train", str(a)])


def test_extends_cycle_refused(capsys, tmp_path, no_train):
    write(tmp_path / "a.toml", 'extends = "b.toml"\n')
    write(tmp_path / "b.toml", 'extends = "./c.toml"\n')
    write(tmp_path / "c.toml", f'extends = {toml_lit(str(tmp_path / "a.toml"))}\n')
    line = cli_error(capsys, ["train", str(tmp_path / "a.toml")])
    assert "cycle" in line and "a.toml -> " in line and "c.toml" in line


def test_extends_chain_too_deep_refused(capsys, tmp_path, no_train):
    for i in range(40):
        write(tmp_path / f"c{i}.toml", f'extends = "c{i + 1}.toml"\n')
    write(tmp_path / "c40.toml", 'extends = "mlp-seed"\n')
    assert "extends chain is longer than" in cli_error(capsys, ["train", str(tmp_path / "c0.toml")])
    assert load_config(str(tmp_path / "c30.toml")).model.name == "mlp"  # 11 files: fine


@pytest.mark.parametrize("value", ["3", "true", '["mlp-seed"]', '""', "{a = 1}"])
def test_extends_not_a_string_refused(capsys, tmp_path, no_train, value):
    p = write(tmp_path / "x.toml", f"extends = {value}\n")
    assert "extends" in cli_error(capsys, ["train", str(p)])


def test_non_utf8_config_refused(capsys, tmp_path, no_train):
    p = tmp_path / "latin1.toml"
    p.write_bytes('[run]\nname = "caf\xe9"\n'.encode("latin-1"))
    assert "not UTF-8" in cli_error(capsys, ["train", str(p)])
    base = tmp_path / "base.toml"
    base.write_bytes(b"\xff\xfe[\x00r\x00")
    child = write(tmp_path / "child.toml", 'extends = "base.toml"\n')
    line = cli_error(capsys, ["train", str(child)])
    assert "not UTF-8" in line and "extended by" in line


def test_utf8_bom_accepted(tmp_path):
    p = tmp_path / "bom.toml"
    p.write_bytes(b'\xef\xbb\xbfextends = "mlp-seed"\n')
    assert load_config(str(p)).model.name == "mlp"


def test_unreadable_config_refused(capsys, tmp_path, no_train, monkeypatch):
    p = write(tmp_path / "secret.toml", 'extends = "mlp-seed"\n')
    p.chmod(0)
    if os.geteuid() == 0:  # root reads anything: make the read fail as it would for a user
        real = Path.read_bytes
        monkeypatch.setattr(Path, "read_bytes", lambda self: (_ for _ in ()).throw(PermissionError(13, "denied"))
                            if self.name == "secret.toml" else real(self))
    try:
        assert "permission denied" in cli_error(capsys, ["train", str(p)])
    finally:
        p.chmod(0o644)


def test_directory_as_config_refused(capsys, tmp_path, no_train):
    d = tmp_path / "configs"
    d.mkdir()
    assert "is a directory" in cli_error(capsys, ["train", str(d)])
    assert "is a directory" in cli_error(capsys, ["train", str(d) + "/"])
    write(tmp_path / "x.toml", 'extends = "configs"\n')
    assert "is a directory" in cli_error(capsys, ["train", str(tmp_path / "x.toml")])


def test_missing_extends_names_the_extending_file(capsys, tmp_path, no_train):
    p = write(tmp_path / "x.toml", 'extends = "nothere.toml"\n')
    line = cli_error(capsys, ["train", str(p)])
    assert "not found" in line and "extended by" in line and "x.toml" in line


def test_relative_extends_resolves_from_the_extending_file(tmp_path, monkeypatch):
    write(tmp_path / "proj" / "base" / "common.toml", 'extends = "mlp-seed"\n[train]\nsteps = 7\n')
    write(tmp_path / "proj" / "exp" / "one.toml", 'extends = "../base/common.toml"\n[train]\nlr = 0.5\n')
    write(tmp_path / "proj" / "exp" / "two.toml", 'extends = "one.toml"\n')
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    cfg = load_config(str(tmp_path / "proj" / "exp" / "two.toml"))
    assert (cfg.train.steps, cfg.train.lr, cfg.model.name) == (7, 0.5, "mlp")
    monkeypatch.chdir(tmp_path)
    assert load_config("proj/exp/two.toml").train.steps == 7


# ---------------------------------------------------------------- 3. values that got past validation

def _float_fields() -> list[tuple[str, str]]:
    out = []
    for sec in dataclasses.fields(Config):
        cls = typing.get_type_hints(Config)[sec.name]
        for f in dataclasses.fields(cls):
            tp = typing.get_type_hints(cls)[f.name]
            if tp is float or float in typing.get_args(tp):
                out.append((sec.name, f.name))
    return out


@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")], ids=["nan", "inf", "-inf"])
def test_non_finite_refused_in_every_float_field(value):
    fields = _float_fields()
    assert ("train", "grad_clip") in fields and ("train", "lr") in fields
    for sec, key in fields:
        with pytest.raises(UserError, match=rf"{sec}\.{key} = .*finite"):
            config_from_dict({sec: {key: value}})


def test_grad_clip_nan_refused_on_the_command_line(capsys, no_train):
    line = cli_error(capsys, ["train", "mlp-seed", "train.grad_clip=nan"])
    assert "train.grad_clip = nan: must be a finite number" in line
    assert "finite" in cli_error(capsys, ["train", "mlp-seed", "train.lr=inf"])
    assert "finite" in cli_error(capsys, ["train", "mlp-seed", "parallel.straggler_ratio=inf"])


def test_non_finite_allowed_where_a_field_says_so():
    @dataclass
    class Section:
        limit: float = field(default=1.0, metadata={"nonfinite": True})
        other: float = 1.0

    assert math.isinf(config_mod._build_section(Section, {"limit": float("inf")}, "x").limit)
    with pytest.raises(UserError, match="finite"):
        config_mod._build_section(Section, {"other": float("inf")}, "x")


def test_direct_train_config_refuses_nan():
    from turbotrain.step import TrainConfig

    with pytest.raises(UserError, match="grad_clip"):
        TrainConfig(grad_clip=float("nan"))


def test_compile_backend_typo_refused(capsys, no_train):
    line = cli_error(capsys, ["train", "mlp-seed", 'compile.backend="inductr"'])
    assert "compile.backend" in line and "did you mean 'inductor'" in line and "aot_eager" in line


@pytest.mark.parametrize("item, words", [
    ('compile.inductor."triton.mix_order_reductoin"=false',
     ["no inductor setting", "did you mean 'triton.mix_order_reduction'", "compile.inductor={}"]),
    ('compile.inductor."triton.mix_order_reduction"=1', ['"triton.mix_order_reduction" = 1', "expected bool"]),
    ('compile.inductor."coordinate_descent_search_radius"=true', ["expected int"]),
    ("compile.inductor=3", ["compile.inductor = 3", "expected a table"]),
])
def test_inductor_setting_errors_name_the_setting(capsys, no_train, item, words):
    line = cli_error(capsys, ["train", "mlp-seed", item])
    assert all(w in line for w in words), line


def test_inductor_settings_accept_ints_for_floats_and_drop_with_an_empty_table():
    from turbotrain.accel.compile import CompileConfig

    got = CompileConfig(inductor={"min_overlap_ratio": 1, "cpp.cxx": [None, "g++"]}).inductor  # TOML's int, list
    assert got == {"min_overlap_ratio": 1.0, "cpp.cxx": (None, "g++")} and type(got["min_overlap_ratio"]) is float
    cfg = config_mod.load_config("gpt2-124m", ["compile.inductor={}"])
    assert cfg.compile.inductor == {}


def test_compile_backend_registered_at_run_time_accepted():
    from torch._dynamo.backends.registry import _COMPILER_FNS

    name = "tt_cfgtest_backend"
    if name not in _COMPILER_FNS:
        torch._dynamo.register_backend(lambda gm, inputs: gm.forward, name=name)
    assert load_config("mlp-seed", [f'compile.backend="{name}"']).compile.backend == name
    assert load_config("mlp-seed", ['compile.backend="aot_eager"']).compile.backend == "aot_eager"


CPU_OOM = ("[enforce fail at alloc_cpu.cpp:117] data. DefaultCPUAllocator: can't allocate memory: you tried to "
           "allocate 1099511627776 bytes. Error code 12 (Cannot allocate memory)")


@pytest.mark.parametrize("exc", [RuntimeError(CPU_OOM), MemoryError(), MemoryError("big\nlist")],
                         ids=["cpu-allocator", "MemoryError", "MemoryError-multiline"])
def test_host_out_of_memory_is_a_user_error(capsys, no_train, exc):
    no_train["raise"] = exc
    line = cli_error(capsys, ["train", "mlp-seed"])
    assert line.startswith("error: out of memory") and "data.batch_size" in line


def test_other_runtime_errors_still_raise(monkeypatch):
    """A bug in turbotrain (no frame of the user's code on the traceback) keeps its traceback for the report;
    the fake trainer is compiled under trainer.py's file name, as the real one's frames are."""
    import turbotrain.trainer

    code = compile("def train(cfg, *a, **k):\n    raise RuntimeError('a bug')\n", turbotrain.trainer.__file__, "exec")
    scope: dict = {}
    exec(code, scope)
    monkeypatch.setattr("turbotrain.trainer.train", scope["train"])
    with pytest.raises(RuntimeError, match="a bug"):
        main(["train", "mlp-seed"])


def test_an_error_raised_in_the_users_code_is_one_line(no_train, capsys):
    no_train["raise"] = RuntimeError("their bug")  # raised in this file: the user's code, as far as turbotrain knows
    line = cli_error(capsys, ["train", "mlp-seed"])
    assert "your code raised RuntimeError: their bug" in line and "test_config_cli.py:" in line, line


# ---------------------------------------------------------------- 4. argparse errors, one line each

@pytest.mark.parametrize("argv, wants", [
    (["trian"], ["unknown command 'trian'", "did you mean train", "turbotrain --help"]),
    ([], ["no command given", "turbotrain --help"]),
    (["scale", "mlp-seed"], ["--gpus", "turbotrain scale --help"]),
    (["scale", "--gpus", "1", "--repeats", "x"], ["--repeats", "'x'", "turbotrain scale --help"]),
    (["bench", "--repeats", "1.5"], ["--repeats", "turbotrain bench --help"]),
    (["train", "--flag"], ["'--flag'", "turbotrain train --help"]),
    (["train", "mlp-seed", "--steps=3"], ["'--steps=3'", "turbotrain train --help"]),
    (["env", "--jsn"], ["--jsn", "turbotrain env --help"]),
    (["env", "train.steps=3"], ["train.steps=3", "turbotrain env --help"]),
    (["data"], ["ACTION", "turbotrain data --help"]),
    (["data", "fetch"], ["name", "turbotrain data fetch --help"]),
    (["data", "get", "x"], ["invalid choice", "turbotrain data --help"]),
    (["scale", "--gpus"], ["--gpus", "expected one argument"]),
])
def test_usage_errors_are_one_line(capsys, no_train, argv, wants):
    line = cli_error(capsys, argv)
    assert "usage:" not in line
    for w in wants:
        assert w in line, (w, line)


def test_help_still_exits_zero(capsys):
    assert main(["--help"]) == 0
    assert "COMMAND" in capsys.readouterr().out


# ---------------------------------------------------------------- 5. discoverability (issue #21)

def test_version(capsys):
    import turbotrain

    assert main(["--version"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"turbotrain {turbotrain.__version__}") and turbotrain.__version__ == "0.1.0"
    assert torch.__version__ in out


def test_train_help_lists_sections_and_keys(capsys):
    assert main(["train", "--help"]) == 0
    out = capsys.readouterr().out
    assert "turbotrain config --reference" in out
    flat = " ".join(out.split())
    assert " ".join(config_summary().split()) in flat
    for sec in dataclasses.fields(Config):
        assert f"[{sec.name}] " in flat
    assert "[train] steps, grad_accum," in flat and "grad_clip" in flat and "[checkpoint] every, keep, resume" in flat


def test_config_reference(capsys):
    assert main(["config", "--reference"]) == 0
    assert capsys.readouterr().out == config_reference() + "\n"
    assert "takes no CONFIG" in cli_error(capsys, ["config", "--reference", "mlp-seed"])


def test_config_prints_effective_toml_that_loads_back(capsys, tmp_path):
    assert main(["config", "gpt2-124m", "train.steps=5"]) == 0
    out = capsys.readouterr().out
    raw = tomllib.loads(out)  # stdout is the TOML alone
    assert raw["train"]["steps"] == 5
    path = write(tmp_path / "eff.toml", out)
    cfg = load_config(str(path))
    assert cfg.train.steps == 5 and cfg.run.name == "gpt2-124m" and "auto" not in (cfg.precision.dtype,)


def test_config_refuses_like_train(capsys):
    assert "train.steps" in cli_error(capsys, ["config", "mlp-seed", "train.steps=x"])


def test_file_runs_are_named_after_the_file(tmp_path, capsys, no_train):
    write(tmp_path / "base.toml", 'extends = "mlp-seed"\n[run]\nname = "base"\n')
    mine = write(tmp_path / "my-exp.toml", 'extends = "mlp-seed"\n[train]\nsteps = 3\n')
    named = write(tmp_path / "named.toml", 'extends = "mlp-seed"\n[run]\nname = "kept"\n')
    child = write(tmp_path / "child.toml", 'extends = "base.toml"\n')
    odd = write(tmp_path / "my exp!.toml", 'extends = "mlp-seed"\n')
    assert load_config(str(mine)).run.name == "my-exp"  # not the preset's "mlp-seed"
    assert load_config(str(named)).run.name == "kept"
    assert load_config(str(child)).run.name == "child"  # a file it extends does not count
    assert load_config(str(mine), ["run.name=over"]).run.name == "over"
    assert load_config(str(odd)).run.name == "my exp_"
    assert load_config("mlp-seed").run.name == "mlp-seed"  # presets keep their names
    assert main(["train", str(mine)]) == 0 and no_train["cfg"].run.name == "my-exp"


def test_config_folder_and_cwd_go_first_on_paths(tmp_path, monkeypatch, no_train):
    cfgdir, cwd = tmp_path / "cfgs", tmp_path / "work"
    p = write(cfgdir / "x.toml", 'extends = "mlp-seed"\n')
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    monkeypatch.setenv("PYTHONPATH", "/already/there")
    assert main(["train", str(p)]) == 0
    assert sys.path[:2] == [str(cfgdir), str(cwd)]
    assert os.environ["PYTHONPATH"].split(os.pathsep) == [str(cfgdir), str(cwd), "/already/there"]


USER_TASK = '''
import torch
from torch import nn
from torch.utils.data import TensorDataset


def model(dim=4):
    return nn.Sequential(nn.Linear(dim, 1), nn.Flatten(0))


def data(split, n=32, dim=4):
    g = torch.Generator().manual_seed(0 if split == "train" else 1)
    x = torch.randn(n, dim, generator=g)
    return TensorDataset(x, x.sum(1))
'''

USER_TOML = '''extends = "mlp-seed"

[model]
name = "mypkg.task:model"
args = { dim = 4 }

[data]
name = "mypkg.task:data"
batch_size = 8
num_workers = 0
eval_batches = 1
args = { n = 32, dim = 4 }

[train]
loss = "mse"
log_every = 1
warmup_steps = 0

[precision]
dtype = "fp32"

[run]
device = "cpu"
'''


def test_console_script_imports_user_code_next_to_the_config(tmp_path):
    """The real `turbotrain` script (not `python -m`) finds mypkg beside my.toml, from there and from elsewhere."""
    proj = tmp_path / "proj"
    write(proj / "mypkg" / "__init__.py", "")
    write(proj / "mypkg" / "task.py", USER_TASK)
    write(proj / "my.toml", USER_TOML)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "RANK", "WORLD_SIZE", "LOCAL_RANK")}
    script = str(VENV_BIN / "turbotrain")
    for i, (cwd, cfg) in enumerate(((proj, "my.toml"), (tmp_path, "proj/my.toml"))):
        runs = tmp_path / f"runs{i}"
        r = subprocess.run([script, "train", cfg, "train.steps=2", "checkpoint.every=0",
                            f"run.out_dir={toml_lit(str(runs))}"],
                           cwd=cwd, env=env, capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, f"cwd={cwd}\n{r.stdout[-2000:]}\n{r.stderr[-2000:]}"
        assert (runs / "my" / "config.toml").is_file()  # named after my.toml, not mlp-seed
