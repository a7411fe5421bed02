"""Shared by the fused-layer red-team files: a small convnet, a small ResNet-preset run (their fixtures are in
conftest.py)."""
import torch
from torch import nn

from turbotrain.config import load_config


def module_types(model):
    return [type(m) for m in model.modules()]


def small_net():
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 8, 3, 2, 1), nn.BatchNorm2d(8), nn.ReLU(inplace=True), nn.MaxPool2d(3, 2, 1),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 10))


def fused_cfg(tmp_path, *more):
    return load_config("resnet50-synthetic", [
        "data.batch_size=4", "data.args.shape=[3, 32, 32]", "data.args.num_classes=10", "data.args.size=16",
        "data.eval_batches=0", "train.steps=2", "precision.dtype=fp32", "checkpoint.every=0",
        "checkpoint.final=false", f"run.out_dir='{tmp_path}'", "run.name=x", "kernels.convnet=true", *more])


def train(*args, **kwargs):
    from turbotrain.trainer import train as run
    return run(*args, **kwargs)
