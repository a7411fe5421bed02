"""Shared by the fused-layer red-team files: a small ResNet-preset run (their fixtures are in conftest.py)."""
from turbotrain.config import load_config


def fused_cfg(tmp_path, *more):
    return load_config("resnet50-synthetic", [
        "data.batch_size=4", "data.args.shape=[3, 32, 32]", "data.args.num_classes=10", "data.args.size=16",
        "data.eval_batches=0", "train.steps=2", "precision.dtype=fp32", "checkpoint.every=0",
        "checkpoint.final=false", f"run.out_dir='{tmp_path}'", "run.name=x", "kernels.convnet=true", *more])


def train(*args, **kwargs):
    from turbotrain.trainer import train as run
    return run(*args, **kwargs)
