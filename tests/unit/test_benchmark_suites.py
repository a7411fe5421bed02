"""benchmarks/run.py's suites: tune's naive config is bench's baseline, and every suite builds its commands."""
import importlib.util
import sys
from pathlib import Path

from turbotrain.bench import BASELINE

RUN = Path(__file__).resolve().parents[2] / "benchmarks" / "run.py"


def _run_module():
    spec = importlib.util.spec_from_file_location("benchmarks_run", RUN)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_tunes_naive_config_is_benchs_baseline():
    assert _run_module().NAIVE == BASELINE


def test_tune_suites_train_the_reference_tune_and_the_tuned_config():
    run = _run_module()
    table = run.suites([1], "/tmp/runs")
    for suite in ("tune-gpt", "tune-resnet", "tune-edge"):
        verbs = [c.argv[3] for c in table[suite].commands]
        assert verbs == ["train", "tune", "train"], (suite, verbs)
        assert table[suite].commands[-1].after == "tune_ratio"
        assert table[suite].commands[-1].argv[4].endswith("/tune/tuned.toml")


def test_bench_baseline_has_the_fused_loss_off_and_a_row_of_its_own_where_it_applies():
    """The LM presets' fused loss is "auto": bench's baseline turns it off so that one row (and "all") adds it, and
    only a model with `hidden` + `head` gets that row."""
    from tests.helpers import TINY_GPT
    from turbotrain.bench import default_variants, variant_overrides
    from turbotrain.config import load_config

    assert "kernels.fused_loss=false" in BASELINE
    gpt = load_config("gpt2-124m", TINY_GPT)
    assert "fused_loss" in default_variants(gpt, on_gpu=True)
    assert variant_overrides("fused_loss", gpt) == ['kernels.fused_loss="auto"']
    assert 'kernels.fused_loss="auto"' in variant_overrides("all", gpt)
    mlp = load_config("mlp-seed", ["compile.enabled=false"])
    assert "fused_loss" not in default_variants(mlp, on_gpu=True)


def test_bench_offers_the_convnet_kernels_only_for_a_model_with_a_layer_they_rewrite():
    from turbotrain.bench import default_variants, variant_overrides
    from turbotrain.config import load_config

    resnet = load_config("resnet50-synthetic", ["model.args.base_width=4", "data.args.shape=[3, 32, 32]"])
    assert "kernels.convnet=false" in BASELINE
    assert "convnet" in default_variants(resnet, on_gpu=True) and "convnet" not in default_variants(resnet, False)
    assert "convnet" not in default_variants(load_config("mlp-seed"), on_gpu=True)
    # explicit on, with the NHWC layout the pool kernels need: "auto" would measure the baseline on a CPU
    assert variant_overrides("convnet", resnet) == ["kernels.convnet=true", 'memory.channels_last="auto"']


def test_bench_baseline_has_packed_attention_off_and_a_bf16_row_with_it_for_gpt_blocks():
    """Packed attention is "auto" (on for GPT blocks on Hopper): the baseline turns it off; its row runs in bf16 (the
    op's only dtypes besides fp16), to be read against the bf16 row; models without qkv_attention calls get none."""
    from tests.helpers import TINY_GPT
    from turbotrain.bench import default_variants, variant_overrides
    from turbotrain.config import load_config

    assert "kernels.packed_attention=false" in BASELINE
    gpt = load_config("gpt2-124m", TINY_GPT)
    assert "packed_attn" in default_variants(gpt, on_gpu=True) and "packed_attn" not in default_variants(gpt, False)
    assert variant_overrides("packed_attn", gpt) == ["precision.dtype=bf16", 'kernels.packed_attention="auto"']
    assert 'kernels.packed_attention="auto"' in variant_overrides("all", gpt)
    assert "packed_attn" not in default_variants(load_config("mlp-seed", ["compile.enabled=false"]), on_gpu=True)
