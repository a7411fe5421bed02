"""turbotrain: PyTorch training acceleration, every technique one config key away, measured honestly.

    from turbotrain import load, load_config, train
    summary = train(load_config("gpt-shakespeare", ["train.steps=30"]))
    model = load("runs/gpt-shakespeare")  # the trained model, eval mode
"""
import importlib

__all__ = ["Config", "UserError", "load", "load_config", "train"]
__version__ = "0.1.0"

# imported on first use: `turbotrain ...` on the command line imports torch inside cli.main, where a Ctrl-C
# during that import is one line, not a traceback from the package's import
_HOME = {"Config": "turbotrain.config", "load_config": "turbotrain.config", "UserError": "turbotrain.errors",
         "load": "turbotrain.export", "train": "turbotrain.trainer"}


def __getattr__(name: str):
    if name in _HOME:
        return getattr(importlib.import_module(_HOME[name]), name)
    raise AttributeError(f"module 'turbotrain' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *_HOME])
