"""kernels.graph_fills (accel/graph_memsets.py): what a CPU can check — which memset nodes the rewrite takes and the
fill it writes instead, the CUDAGraph class swapped only while in force, the resolver's rule and its error line. The
graph rewrite itself runs in tests/integration/test_graph_memsets_gpu.py."""
import pytest
import torch
import torch.cuda.graphs

from turbotrain.accel import graph_memsets as gm
from turbotrain.config import config_from_dict
from turbotrain.errors import UserError
from turbotrain.resolve import Facts, resolve

CPU, CUDA = torch.device("cpu"), torch.device("cuda")


@pytest.mark.parametrize("value,size,width,pattern", [(0, 1, 4, 0), (0, 4, 1, 0), (0xAB, 1, 8, 0xABABABAB),
                                                      (0x1FF, 1, 4, 0xFFFFFFFF), (0x1234, 2, 2, 0x12341234),
                                                      (0xDEADBEEF, 4, 3, 0xDEADBEEF), (0x12345678, 2, 2, 0x56785678)])
def test_a_fill_writes_what_the_memset_writes(value, size, width, pattern):
    """The driver takes the low element-size bytes of the value and repeats them over the span."""
    got = gm.fill_of(0x7F0000001000, value, size, width, 1)
    assert got == (pattern, size * width // 4)
    assert got[0] < 2**32
    span = pattern.to_bytes(4, "little") * got[1]
    assert span == (value & (256**size - 1)).to_bytes(size, "little") * width  # byte for byte what a memset writes


@pytest.mark.parametrize("dst,size,width,height", [(0x1000, 4, 1, 2),  # 2D: a pitch between rows
                                                   (0x1000, 4, gm.MAX_BYTES // 4 + 1, 1),  # a buffer's zeros
                                                   (0x1002, 4, 1, 1),  # not 4-byte aligned
                                                   (0x1000, 1, 6, 1),  # not whole 32-bit words
                                                   (0x1000, 4, 0, 1),  # nothing
                                                   (0x1000, 8, 1, 1)])  # no such element size
def test_memsets_the_rewrite_leaves_alone(dst, size, width, height):
    assert gm.fill_of(dst, 0, size, width, height) is None


def test_the_largest_memset_taken_is_max_bytes():
    assert gm.fill_of(0x1000, 0, 4, gm.MAX_BYTES // 4, 1) == (0, gm.MAX_BYTES // 4)


def test_the_graph_class_is_ours_only_while_in_force():
    base = torch.cuda.CUDAGraph
    with gm.graph_fills(True):
        ours = torch.cuda.CUDAGraph
        assert ours is not base and issubclass(ours, base) and torch.cuda.graphs.CUDAGraph is ours
        with gm.graph_fills(True):  # nested: the same class, not a subclass of a subclass
            assert torch.cuda.CUDAGraph is ours
        assert torch.cuda.CUDAGraph is ours
        with gm.graph_fills(False):  # off inside: nothing changes (the outer block decides)
            assert torch.cuda.CUDAGraph is ours
    assert torch.cuda.CUDAGraph is base and torch.cuda.graphs.CUDAGraph is base


def test_the_graph_class_is_given_back_when_the_block_raises():
    base = torch.cuda.CUDAGraph
    with pytest.raises(KeyError), gm.graph_fills(True):
        raise KeyError("a run that failed")
    assert torch.cuda.CUDAGraph is base


@pytest.mark.parametrize("value", ["auto", "true", None])
def test_an_unresolved_setting_is_no_switch(value):
    with pytest.raises(TypeError, match="takes True or False"):
        gm.graph_fills(value)


def test_without_a_gpu_there_is_nothing_to_rewrite():
    if torch.cuda.is_available():
        pytest.skip("a CUDA machine")
    assert gm.problem() == "a CUDA GPU"


def _resolved(setting, device=CPU, **compile_):
    cfg = config_from_dict({"kernels": {"graph_fills": setting},
                            "compile": {"enabled": True, "mode": "reduce-overhead", **compile_}})
    return resolve(cfg, Facts(device=device)).kernels.graph_fills


def test_auto_is_on_where_cuda_graphs_are_captured(monkeypatch):
    monkeypatch.setattr(gm, "problem", lambda: None)
    assert _resolved("auto", CUDA) is True
    assert _resolved("auto", CUDA, mode="max-autotune") is True
    assert _resolved("auto", CUDA, mode="default", inductor={"triton.cudagraphs": True}) is True
    assert _resolved("auto", CUDA, mode="default") is False
    assert _resolved("auto", CUDA, mode="max-autotune-no-cudagraphs") is False
    assert _resolved("auto", CUDA, enabled=False) is False
    assert _resolved("auto") is False  # a CPU: "reduce-overhead" itself resolves to "default" there
    assert _resolved(False, CUDA) is False


def test_auto_is_off_where_the_driver_cannot_be_reached(monkeypatch):
    monkeypatch.setattr(gm, "problem", lambda: "the CUDA driver's graph API")
    assert _resolved("auto", CUDA) is False


def test_explicit_true_where_nothing_is_captured_is_one_error_line(monkeypatch):
    monkeypatch.setattr(gm, "problem", lambda: None)
    with pytest.raises(UserError, match=r'^kernels.graph_fills = true rewrites the CUDA graphs .* captures none '
                                        r'\(compile.enabled = true, compile.mode = "default"\); set '
                                        r"kernels.graph_fills=false$"):
        _resolved(True, CUDA, mode="default")
    with pytest.raises(UserError, match="which need a CUDA GPU \\(this run is on cpu\\)"):
        _resolved(True)


def test_explicit_true_on_a_cpu_from_the_cli_is_one_error_line(tmp_path, capsys):
    from turbotrain.cli import main

    args = ["train", "gpt-shakespeare", "train.steps=1", f"run.out_dir='{tmp_path}'", "kernels.graph_fills=true"]
    assert main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("error: kernels.graph_fills = true rewrites CUDA graphs, which need a CUDA GPU")
    assert err[-1].endswith("set kernels.graph_fills=false")
