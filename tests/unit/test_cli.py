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


def test_scale_row_names_a_ranks_own_error(tmp_path):
    """A world size that fails shows the rank's one-line error in the table, not torchrun's crash summary."""
    from turbotrain.tune import _failure

    log = tmp_path / "run.log"
    log.write_text("[turbotrain] model: 25.56M params\n"
                   "[rank1]: error: data: the dataset has 512 samples, fewer than one global batch of 1024\n"
                   "E1122 torch.distributed.elastic.multiprocessing.api: failed (exitcode: 2)\n"
                   "  error_file: <N/A>\n  traceback : To enable traceback see: https://pytorch.org/docs\n")
    assert _failure(log) == "data: the dataset has 512 samples, fewer than one global batch of 1024"
    log.write_text("Traceback (most recent call last):\nRuntimeError: CUDA error\nexit 1\n")
    assert _failure(log) == "Traceback (most recent call last): | RuntimeError: CUDA error | exit 1"
