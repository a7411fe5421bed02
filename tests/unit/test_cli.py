"""Command-line parsing: flags anywhere, overrides kept, strays refused."""
import pytest

from turbotrain.cli import _parse


def test_flags_between_overrides():
    a = _parse(["bench", "gpt-shakespeare", "train.steps=5", "--converge", "data.batch_size=8", "--variants", "bf16"])
    assert a.config == "gpt-shakespeare" and a.converge and a.variants == "bf16"
    assert a.overrides == ["train.steps=5", "data.batch_size=8"]


def test_stray_words_are_refused(capsys):
    with pytest.raises(SystemExit) as e:
        _parse(["train", "gpt-shakespeare", "--nope"])
    assert e.value.code == 2 and "--nope" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        _parse(["env", "x=1"])  # env takes no overrides
