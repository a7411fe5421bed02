"""Red-team cases of `turbotrain export` / `turbotrain.load` on a run directory whose final/ cannot rebuild the
model it holds: a missing or damaged final/config.toml (refused, naming the copy to restore it from, never
blamed on the weights nor copied into an export), and a run trained on a model passed in code, whose
config.toml builds another model (refused with the way out, `load(run, model=...)`, never a silent other model)."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from torch import nn

import turbotrain
from tests.faults.common import BASE_TOML, error_line, lit
from tests.helpers import TESTS
from turbotrain.cli import main
from turbotrain.config import load_config
from turbotrain.errors import UserError

pytestmark = pytest.mark.usefixtures("userpkg_importable")


def _train(out: Path, model: nn.Module | None = None, *overrides: str) -> Path:
    turbotrain.train(load_config(str(BASE_TOML), [f"run.out_dir={lit(out)}", *overrides]), model=model)
    return out / "fault"


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> Path:
    """One finished run of the config's own model (userpkg.models:linear), copied per case."""
    import sys

    sys.path.insert(0, str(TESTS))
    try:
        return _train(tmp_path_factory.mktemp("finished"))
    finally:
        sys.path.remove(str(TESTS))


def _copy(finished: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(finished, tmp_path / "run"))


def export_cli(capsys, run: Path) -> tuple[int, str]:
    capsys.readouterr()
    rc = main(["export", str(run), "--format", "safetensors"])
    return rc, capsys.readouterr().err


# ------------------------------------------------------------------ final/config.toml missing or damaged

def _remove(p: Path) -> None:
    p.unlink()


def _folder(p: Path) -> None:
    p.unlink()
    p.mkdir()


DAMAGE = {  # how final/config.toml is damaged -> a word the error line must hold
    "missing": (_remove, "is missing"),
    "a-folder": (_folder, "is missing"),
    "malformed-toml": (lambda p: p.write_text("garbage = ["), "malformed TOML"),
    "not-utf8": (lambda p: p.write_bytes(b"\xff\xfe[model]\n"), "damaged"),
    "bad-value": (lambda p: p.write_text(p.read_text().replace("steps = 4", 'steps = "four"')), "train.steps"),
    "truncated": (lambda p: p.write_text(p.read_text()[:40]), "damaged"),
}


@pytest.mark.parametrize("damage, word", DAMAGE.values(), ids=DAMAGE.keys())
def test_export_refuses_a_damaged_final_config_and_names_the_runs_copy(tmp_path, capsys, finished, damage, word):
    run = _copy(finished, tmp_path)
    damage(run / "final" / "config.toml")
    rc, err = export_cli(capsys, run)
    assert rc == 2, err
    line = error_line(err)
    assert "final/config.toml" in line and word in line, line
    assert "did not finish" not in line and "turbotrain export" not in line  # neither the weights nor a loop
    assert f"cp {run / 'config.toml'} {run / 'final' / 'config.toml'}" in line, line
    assert not (run / "export" / "safetensors" / "config.toml").exists()  # nothing damaged handed out
    with pytest.raises(UserError, match=f"final/config.toml .*; restore it from the run's own copy: cp {run}"):
        turbotrain.load(run)


def test_the_named_fix_works(tmp_path, capsys, finished):
    run = _copy(finished, tmp_path)
    (run / "final" / "config.toml").write_text("garbage = [")
    assert export_cli(capsys, run)[0] == 2
    shutil.copyfile(run / "config.toml", run / "final" / "config.toml")  # what the error line says
    assert export_cli(capsys, run)[0] == 0
    x = torch.randn(3, 8)
    want = turbotrain.load(finished, "cpu")(x)
    torch.testing.assert_close(turbotrain.load(run / "export" / "safetensors", "cpu")(x), want, rtol=0, atol=0)


@pytest.mark.parametrize("run_copy", ["missing", "damaged"])
def test_without_a_sound_run_copy_the_fix_is_the_config_trained_with(tmp_path, capsys, finished, run_copy):
    run = _copy(finished, tmp_path)
    (run / "final" / "config.toml").unlink()
    if run_copy == "missing":
        (run / "config.toml").unlink()
    else:
        (run / "config.toml").write_text("[model\n")
    rc, err = export_cli(capsys, run)
    line = error_line(err)
    assert rc == 2 and "is missing" in line and "cp " not in line, line  # never a copy that is damaged too
    assert f"turbotrain config CONFIG [KEY=VALUE ...] > {run / 'final' / 'config.toml'}" in line, line


def test_load_of_the_final_folder_itself_names_the_runs_copy(tmp_path, finished):
    run = _copy(finished, tmp_path)
    (run / "final" / "config.toml").write_text("[[model]]\n")
    with pytest.raises(UserError, match=f"damaged .*cp {run / 'config.toml'}"):
        turbotrain.load(run / "final")


# ------------------------------------------------------------------ a run trained on a model passed in code

class Scaled(nn.Module):
    """userpkg.models.Linear's parameters (fc.weight, fc.bias), another forward."""

    def __init__(self, dim: int = 8):
        super().__init__()
        self.fc = nn.Linear(dim, 1)

    def forward(self, x):
        return 3 * torch.tanh(self.fc(x).squeeze(-1))


class TwoLayer(nn.Module):
    def __init__(self, dim: int = 8):
        super().__init__()
        self.a, self.b = nn.Linear(dim, 4), nn.Linear(4, 1)

    def forward(self, x):
        return self.b(torch.relu(self.a(x))).squeeze(-1)


@pytest.mark.parametrize("cls", [Scaled, TwoLayer])
def test_load_refuses_the_configs_model_for_a_run_trained_on_a_model_passed_in_code(tmp_path, capsys, cls):
    trained = cls()
    run = _train(tmp_path, trained)
    with pytest.raises(UserError) as e:
        turbotrain.load(run)
    msg = str(e.value)
    assert f"{cls.__module__}.{cls.__qualname__}" in msg and "userpkg.models.Linear" in msg, msg
    assert f"model={cls.__name__}(...)" in msg and "does not fit" not in msg, msg
    # the named way out: the weights into the user's own instance, the trained model's outputs exactly
    x = torch.randn(5, 8)
    got = turbotrain.load(run, "cpu", model=cls())
    assert type(got) is cls and not got.training
    torch.testing.assert_close(got(x), trained.eval()(x), rtol=0, atol=0)
    # an export keeps final.json, so loading the export refuses the same way
    assert export_cli(capsys, run)[0] == 0
    with pytest.raises(UserError, match="trained on a model passed in code"):
        turbotrain.load(run / "export" / "safetensors")


def test_load_into_a_model_that_does_not_fit_names_the_fix(tmp_path):
    run = _train(tmp_path, Scaled())
    with pytest.raises(UserError, match=r"does not fit the model passed .*size mismatch.*; pass an instance of the "
                                        r"model the run trained"):
        turbotrain.load(run, model=Scaled(dim=4))
    with pytest.raises(UserError, match=r"does not fit the model passed .*missing \['a.bias'.*; pass an instance"):
        turbotrain.load(run, model=TwoLayer())
    with pytest.raises(UserError, match="expected an nn.Module instance"):
        turbotrain.load(run, model=Scaled)  # the class, not an instance


def test_the_configs_class_with_other_arguments_does_not_fit_and_names_the_fix(tmp_path):
    from userpkg.models import Linear

    run = _train(tmp_path, Linear(16), "data.args.dim=16")  # the config's class, wider than its model.args.dim
    with pytest.raises(UserError, match=r"does not fit the model its config.toml builds \(.*size mismatch.*\); if "
                                        r"the run was trained on a model passed in code.*model=MyModel\(\.\.\.\)"):
        turbotrain.load(run)
    assert turbotrain.load(run, "cpu", model=Linear(16)).fc.weight.shape == (1, 16)


def test_fsdp2_wrapper_class_counts_as_the_users_class(tmp_path, finished):
    """FSDP2 swaps in a subclass (FSDPLinear): recorded as the user's class, and an older final.json that
    recorded the wrapper still loads."""
    from torch.distributed.fsdp import FSDPModule
    from userpkg.models import Linear

    from turbotrain.models.structure import model_class_name

    m = Linear(8)
    m.__class__ = type("FSDPLinear", (FSDPModule, Linear), {})  # what fully_shard does
    assert model_class_name(m) == "userpkg.models.Linear"
    run = _copy(finished, tmp_path)
    info = json.loads((run / "final" / "final.json").read_text())
    (run / "final" / "final.json").write_text(json.dumps(
        {**info, "class": "torch.distributed.fsdp._fully_shard._fsdp_init.FSDPLinear"}))
    assert type(turbotrain.load(run, "cpu")).__name__ == "Linear"


def test_export_of_an_unfinished_run_trained_on_a_model_passed_in_code_is_refused(tmp_path, capsys):
    """Without final/, export rebuilds the model from a checkpoint and the run's config.toml: a checkpoint
    written by a model passed in code (here the same parameters, another forward) would be exported as the
    config's model; the checkpoint records the class, so it is refused with the way out."""
    run = _train(tmp_path, Scaled(), "checkpoint.every=2", "checkpoint.final=false")
    assert not (run / "final").exists() and (run / "checkpoints" / "step-00000004").is_dir()
    rc, err = export_cli(capsys, run)
    line = error_line(err)
    assert rc == 2 and "trained on a model passed in code" in line and "model=Scaled(...)" in line, line
    assert not (run / "final").exists()
    # the config's own model: its checkpoint still exports
    own = _train(tmp_path / "own", None, "checkpoint.every=2", "checkpoint.final=false")
    assert export_cli(capsys, own)[0] == 0 and (own / "final" / "model.safetensors").is_file()
