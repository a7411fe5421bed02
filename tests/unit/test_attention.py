import json

import pytest
import torch
import torch.nn.functional as F

from turbotrain.accel.attention import (
    SdpaCall,
    attention_backend,
    capture_sdpa_calls,
    choose,
    pick_attention,
    time_backends,
)
from turbotrain.models.gpt import GPT
from turbotrain.models.structure import WithLoss


def test_auto_and_default_leave_torchs_choice():
    for setting in ("auto", "default"):
        assert type(attention_backend(setting, torch.device("cpu"))).__name__ == "nullcontext"


def _enabled() -> tuple[bool, ...]:
    b = torch.backends.cuda
    return b.cudnn_sdp_enabled(), b.flash_sdp_enabled(), b.mem_efficient_sdp_enabled(), b.math_sdp_enabled()


@pytest.mark.parametrize("setting, enabled", [("cudnn", (True, True, True, True)),
                                              ("flash", (False, True, True, True)),
                                              ("efficient", (False, False, True, True)),
                                              ("math", (False, False, False, True))])
def test_a_setting_disables_the_backends_before_it_and_restores_them(setting, enabled):
    """A priority order alone did not decide the kernel (cuDNN won eager over "flash first" on Hopper, flash won
    compiled over "efficient first"); the enabled set does, in eager and compiled alike."""
    before, tag = _enabled(), torch.compiler.config.cache_key_tag
    with attention_backend(setting, torch.device("cpu")):
        assert _enabled() == enabled
        # torch's compile caches do not key on the enabled set: the tag keeps each setting's graphs apart
        assert torch.compiler.config.cache_key_tag.endswith(f"sdpa-{setting}")
    assert _enabled() == before and torch.compiler.config.cache_key_tag == tag


# ---------------------------------------------------------------- "auto": measured (timer injected on a CPU)

CALL = SdpaCall(q=(16, 12, 1024, 64), k=(16, 12, 1024, 64), v=(16, 12, 1024, 64), dtype="bfloat16", is_causal=True,
                mask=None, dropout_p=0.0, enable_gqa=False, count=12)


def fake_timer(ms: dict, calls: list | None = None):
    """ms per backend for one call; a backend missing from `ms` cannot run (as SDPA's "No available kernel")."""
    def timer(backend, call):
        if calls is not None:
            calls.append((backend, call))
        if backend not in ms:
            raise RuntimeError("No available kernel. Aborting execution.")
        return ms[backend]
    return timer


def test_the_fastest_backend_that_runs_is_chosen():
    timings = time_backends([CALL], fake_timer({"cudnn": 0.5, "flash": 0.4}))
    assert timings == {"cudnn": pytest.approx(6.0), "flash": pytest.approx(4.8), "efficient": None}  # x12 calls
    assert choose(timings) == "flash"
    assert choose({"cudnn": None, "flash": None, "efficient": None}) == "default"


def test_the_verdict_is_kept_and_reused(tmp_path, capsys):
    seen = []
    assert pick_attention([CALL], torch.device("cpu"), tmp_path, fake_timer({"cudnn": 1.0, "flash": 2.0,
                                                                              "efficient": 3.0}, seen)) == "cudnn"
    assert "attention: cudnn 12.00 ms, flash 24.00 ms, efficient 36.00 ms → cudnn" in capsys.readouterr().out
    (kept,) = tmp_path.glob("attention-*.json")
    assert json.loads(kept.read_text())["choice"] == "cudnn"
    n = len(seen)
    assert pick_attention([CALL], torch.device("cpu"), tmp_path, fake_timer({}, seen)) == "cudnn"
    assert len(seen) == n  # read back, not measured again
    other = SdpaCall(**{**CALL.__dict__, "q": (8, 12, 1024, 64)})
    assert pick_attention([other], torch.device("cpu"), tmp_path, fake_timer({"efficient": 1.0}, seen)) == "efficient"
    kept.write_text("{not json")  # a damaged verdict: measured again, not a crash
    assert pick_attention([CALL], torch.device("cpu"), tmp_path, fake_timer({"flash": 1.0})) == "flash"
    assert "is damaged; measuring again" in capsys.readouterr().out


def test_one_forward_records_the_models_sdpa_calls():
    model = GPT(vocab_size=64, block_size=32, n_layer=3, n_head=2, n_embd=16, dropout=0.0)
    x = torch.randint(0, 64, (4, 32))
    calls = capture_sdpa_calls(WithLoss(model, lambda out, y: F.cross_entropy(out.flatten(0, 1), y.flatten())),
                               (x, x), torch.device("cpu"), "bf16")
    assert calls == [SdpaCall(q=(4, 2, 32, 8), k=(4, 2, 32, 8), v=(4, 2, 32, 8), dtype="bfloat16", is_causal=True,
                              mask=None, dropout_p=0.0, enable_gqa=False, count=3)]
    assert capture_sdpa_calls(model, (x,), torch.device("cpu"), "fp32")[0].dtype == "float32"


def test_the_capture_does_not_trace_a_compiled_model():
    from torch._dynamo.utils import counters

    model = GPT(vocab_size=64, block_size=32, n_layer=2, n_head=2, n_embd=16, dropout=0.0)
    model.compile(backend="eager")
    counters.clear()
    calls = capture_sdpa_calls(model, (torch.randint(0, 64, (4, 32)),), torch.device("cpu"), "fp32")
    assert calls[0].count == 2 and not counters["stats"]  # compiled later, under the chosen backend
