import pytest

from turbotrain.config import Config, list_presets, load_config, parse_value, to_toml
from turbotrain.errors import UserError


def test_default_preset_loads():
    cfg = load_config()
    assert cfg.model.name == "gpt" and cfg.data.name == "shakespeare"


@pytest.mark.parametrize("name", list_presets())
def test_every_preset_is_valid(name):
    assert isinstance(load_config(name), Config)


def test_overrides_parse_as_toml_literals():
    cfg = load_config("gpt-shakespeare", ["train.steps=7", "train.lr=1e-3", "compile.enabled=true",
                                          "precision.dtype=bf16", "model.args.n_layer=2", 'run.name="x y"'])
    assert cfg.train.steps == 7 and cfg.train.lr == 1e-3 and cfg.compile.enabled is True
    assert cfg.precision.dtype == "bf16" and cfg.model.args["n_layer"] == 2 and cfg.run.name == "x y"


def test_int_accepted_for_float():
    assert load_config(None, ["train.lr=1"]).train.lr == 1.0


def test_missing_and_malformed_files(tmp_path):
    with pytest.raises(UserError, match="not found"):
        load_config(str(tmp_path / "missing.toml"))
    bad = tmp_path / "bad.toml"
    bad.write_text("[train\nsteps = 3")
    with pytest.raises(UserError, match="malformed TOML"):
        load_config(str(bad))
    with pytest.raises(UserError, match="no preset or file named .nosuch."):
        load_config("nosuch")


def test_resolved_config_round_trips(tmp_path):
    cfg = load_config("resnet50-synthetic", ["train.lr=0.05", "memory.channels_last=true"])
    path = tmp_path / "c.toml"
    path.write_text(to_toml(cfg))
    assert load_config(str(path)) == cfg


def test_extends_a_preset(tmp_path):
    path = tmp_path / "mine.toml"
    path.write_text('extends = "mlp-seed"\n[train]\nsteps = 5\n[model.args]\ndepth = 2\n')
    cfg = load_config(str(path))
    assert cfg.train.steps == 5 and cfg.model.args["depth"] == 2 and cfg.model.args["width"] == 1024
    assert cfg.model.name == "mlp"


def test_parse_value_bare_strings():
    assert parse_value("gpt") == "gpt" and parse_value("3") == 3 and parse_value("[1, 2]") == [1, 2]
