"""Red team, session 26: a user's own Hugging Face model passed to `turbotrain.train(cfg, model=...)` from Python.
final/ recorded only config.toml's model.name (and the adapter's class), so `turbotrain.load(run)` and `turbotrain
export --format hf` rebuilt another model (hf:gpt2 at its default sizes, or the config's own model) and refused the
weights: the trained model could not be exported at all from the CLI."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.faults.common import BASE_TOML, lit

transformers = pytest.importorskip("transformers")

PKG = "userpkg.redteam_s26_hf"


def _train(tmp_path: Path, model, model_name: str) -> Path:
    import turbotrain

    cfg = turbotrain.load_config(str(BASE_TOML), [f"run.out_dir={lit(tmp_path)}", "train.steps=3",
                                                   "data.eval_batches=0", f"model.name={model_name!r}",
                                                   "model.args={}", "data.name='userpkg.hf_s22:padded_rows'",
                                                   "data.args={}", "train.loss='model'"])
    turbotrain.train(cfg, model=model)
    return tmp_path / "fault"


@pytest.mark.parametrize("factory", ["tiny_llama", "tiny_gpt2"])
@pytest.mark.parametrize("model_name", ["hf:gpt2", "userpkg.models:linear"])
def test_an_hf_model_passed_in_code_loads_and_exports_as_the_model_trained(factory, model_name, tmp_path):
    import importlib

    from turbotrain import export, load

    model = getattr(importlib.import_module(PKG), factory)()
    run = _train(tmp_path, model, model_name)
    trained = {k: v.detach().clone() for k, v in model.state_dict().items()}
    ids = torch.randint(1, 50, (2, 8), generator=torch.Generator().manual_seed(0))

    loaded = load(run, "cpu")
    assert type(loaded.hf) is type(model)
    assert all(torch.equal(v, trained[k]) for k, v in loaded.hf.state_dict().items())

    out = export.export(run, "hf")
    back = transformers.AutoModelForCausalLM.from_pretrained(out)
    assert type(back) is type(model)
    assert back.state_dict().keys() == trained.keys()
    assert all(torch.equal(v, trained[k]) for k, v in back.state_dict().items())
    model.eval()
    with torch.no_grad():
        assert torch.allclose(back(ids).logits, model(ids).logits)

    # the safetensors export carries it too: loading that folder gives the same model
    again = load(export.export(run, "safetensors"), "cpu")
    assert all(torch.equal(v, trained[k]) for k, v in again.hf.state_dict().items())


@pytest.mark.parametrize("typed, meant", [("GPT2", "gpt2"), ("gpt-2", "gpt2"), ("Llama", "llama"), ("gtp2", "gpt2")])
def test_a_misspelt_hf_model_type_is_one_line_naming_the_type_meant(typed, meant, tmp_path, capsys):
    from tests.faults.common import error_line
    from turbotrain.cli import main

    capsys.readouterr()
    rc = main(["train", str(BASE_TOML), f"run.out_dir={lit(tmp_path)}", f"model.name='hf:{typed}'", "model.args={}"])
    err = capsys.readouterr().err
    assert rc == 2 and "Traceback" not in err
    assert f"did you mean 'hf:{meant}'" in error_line(err)


def _cli(capsys, tmp_path, *overrides) -> tuple[int, str]:
    from turbotrain.cli import main

    capsys.readouterr()
    rc = main(["train", str(BASE_TOML), f"run.out_dir={lit(tmp_path / 'runs')}", "train.steps=2",
               "data.eval_batches=0", "data.name='userpkg.hf_s22:padded_rows'", "data.args={}", "train.loss='model'",
               *overrides])
    return rc, capsys.readouterr().err


def test_a_saved_model_of_its_own_code_needs_trust_remote_code_and_then_trains_and_loads(tmp_path, capsys):
    from userpkg.redteam_s26_hf import save_remote_code_model

    from tests.faults.common import error_line
    from turbotrain import export, load

    folder = tmp_path / "remote"
    save_remote_code_model(folder)
    name = f"model.name='hf:{folder.as_posix()}'"

    # transformers' own refusal ended in "save the model again with save_pretrained(dir)", which cannot help
    rc, err = _cli(capsys, tmp_path, name, "model.args={}")
    assert rc == 2 and "Traceback" not in err
    line = error_line(err)
    assert "model.args.trust_remote_code = true" in line and "modeling_tiny.py" in line
    assert "save_pretrained" not in line

    rc, err = _cli(capsys, tmp_path, name, "model.args={trust_remote_code='yes'}")
    assert rc == 2 and "trust_remote_code" in error_line(err)

    # with the flag the folder's own head (its auto_map's AutoModelForCausalLM) trains, not a bare AutoModel
    rc, err = _cli(capsys, tmp_path, name, "model.args={trust_remote_code=true}")
    assert rc == 0, err
    run = tmp_path / "runs" / "fault"
    model = load(run, "cpu")
    assert type(model.hf).__name__ == "TinyLM"
    out = export.export(run, "hf")
    assert (out / "modeling_tiny.py").is_file()


def test_a_classifier_built_from_an_lm_config_loads_and_exports_as_the_classifier(tmp_path):
    from userpkg.redteam_s26_hf import classifier_from_lm_config

    import turbotrain
    from turbotrain import export, load

    model = classifier_from_lm_config()
    cfg = turbotrain.load_config(str(BASE_TOML), [f"run.out_dir={lit(tmp_path)}", "train.steps=2",
                                                   "data.eval_batches=0", "model.args={}", "data.args={}",
                                                   "data.name='userpkg.redteam_s25_hf:labelled_rows'",
                                                   "train.loss='model'"])
    turbotrain.train(cfg, model=model)
    trained = {k: v.detach().clone() for k, v in model.state_dict().items()}
    loaded = load(tmp_path / "fault", "cpu")
    assert type(loaded.hf) is type(model)
    back = transformers.AutoModelForSequenceClassification.from_pretrained(export.export(tmp_path / "fault", "hf"))
    assert type(back) is type(model)
    assert all(torch.equal(v, trained[k]) for k, v in back.state_dict().items())
