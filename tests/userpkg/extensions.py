"""User extensions for the callback/metric/optimizer tests: what a user writes in their own package."""
import torch

from turbotrain.callbacks import Callback


class CountSteps(Callback):
    """Counts steps and reports the count (and the hooks seen) as extra metrics."""

    def __init__(self):
        self.steps, self.seen = 0, []

    def on_train_start(self, state):
        self.seen.append("train_start")

    def on_step_end(self, state):
        self.steps += 1
        assert state.loss is None or isinstance(state.loss, float)  # never a device tensor

    def on_log(self, state):
        return {"steps_counted": self.steps}

    def on_eval_end(self, state):
        self.seen.append("eval_end")

    def on_checkpoint(self, state, path):
        self.seen.append(f"checkpoint:{path.name}")

    def on_train_end(self, state, summary):
        self.seen.append("train_end")


class CheckpointsOnDisk(Callback):
    """Checks that each checkpoint `on_checkpoint` is given is sealed on disk, and prints it."""

    def on_checkpoint(self, state, path):
        assert (path / "meta.json").is_file(), f"on_checkpoint got {path}, which is not on disk"
        print(f"on_checkpoint: step {state.step} {path.name}", flush=True)


def mean_abs_error(outputs, targets):
    """A user eval metric: fn(outputs, targets) -> number."""
    return (outputs.reshape(targets.shape) - targets).abs().mean()


def sgd_nesterov(param_groups, lr, weight_decay):
    """A user optimizer factory: factory(param_groups, lr=, weight_decay=) -> Optimizer."""
    return torch.optim.SGD(param_groups, lr=lr, momentum=0.9, nesterov=True)


def not_an_optimizer(param_groups, lr, weight_decay):
    return "adam"


class ReadsWeights(Callback):
    """A callback that does read a device value every step (the negative control of the no-sync test)."""

    def on_step_end(self, state):
        next(state.model.parameters()).sum().item()
