"""turbotrain: PyTorch training acceleration, every technique one config key away, measured honestly.

    from turbotrain import load_config, train
    summary = train(load_config("gpt-shakespeare", ["train.steps=30"]))
    model = load("runs/gpt-shakespeare")  # the trained model, eval mode
"""
from turbotrain.config import Config, load_config
from turbotrain.errors import UserError
from turbotrain.export import load
from turbotrain.trainer import train

__all__ = ["Config", "UserError", "load", "load_config", "train"]
__version__ = "0.1.0"
