"""Red team, session 23, models, techniques and export: user models of unusual kinds (sparse gradients, an
output no built-in loss can take, built on the meta device, parameters that are views of one storage),
compile.fullgraph with a graph break, activation checkpointing over a block with BatchNorm, mse under autocast.
User code: tests/userpkg/redteam_s23_models.py."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import turbotrain
from tests.faults.common import BASE_TOML, error_line, lit
from turbotrain.accel.activation_ckpt import apply_activation_checkpointing
from turbotrain.contract import Names, check_model, check_model_data
from turbotrain.errors import UserError
from turbotrain.losses import cross_entropy, mse

PKG = "userpkg.redteam_s23_models"


def train_cli(capsys, tmp_path, *overrides) -> tuple[int, str]:
    from turbotrain.cli import main

    capsys.readouterr()
    rc = main(["train", str(BASE_TOML), f"run.out_dir={lit(tmp_path)}", *overrides])
    return rc, capsys.readouterr().err


def test_a_module_with_sparse_gradients_is_one_line_naming_it(capsys, tmp_path):
    """nn.Embedding(sparse=True) passed every build check, then the first step died in the gradient clip with a
    NotImplementedError traceback (SparseCPU has no linalg_vector_norm; AdamW and DDP take no sparse grads)."""
    from userpkg.redteam_s23_models import sparse

    with pytest.raises(UserError, match=r"sparse=True in emb,.*sparse=False"):
        check_model(sparse())
    check_model(nn.Embedding(4, 2))  # dense: fine
    rc, err = train_cli(capsys, tmp_path, f'model.name="{PKG}:sparse"')
    assert rc == 2 and "sparse=True" in error_line(err)


@pytest.mark.parametrize("dtype", [torch.int64, torch.bool, torch.complex64])
@pytest.mark.parametrize("loss", [mse, cross_entropy])
def test_an_output_the_builtin_losses_cannot_take_is_named(dtype, loss):
    """A complex output trained under mse with its imaginary part dropped (a UserWarning on stderr, rc 0); an
    integer one was blamed on the loss ("does not depend on the model's parameters")."""
    class Out(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(4, 3)

        def forward(self, x):
            out = self.fc(x)
            return torch.complex(out, out) if dtype.is_complex else (out * 10).to(dtype)

    y = torch.randint(0, 3, (2,)) if loss is cross_entropy else torch.randn(2, 3)
    with pytest.raises(UserError, match=rf"is an? {str(dtype)[6:]} tensor.*needs a floating-point output"):
        check_model_data(Out(), (torch.randn(2, 4), y), loss, Names())


def test_a_complex_output_under_mse_through_the_cli_is_one_line(capsys, tmp_path):
    rc, err = train_cli(capsys, tmp_path, f'model.name="{PKG}:complex_out"')
    assert rc == 2 and "complex64" in error_line(err)
    assert not list(tmp_path.rglob("summary.json"))


@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float16, torch.int64])
def test_mse_compares_against_the_targets_as_given(out_dtype):
    """The targets were cast to the output's dtype first: rounded to bf16 under autocast (another loss and
    gradient), truncated to integers for an integer output (a wrong val_loss)."""
    out = (torch.randn(64) * 5).to(out_dtype)
    y = torch.randn(64) * 5 + 0.123
    torch.testing.assert_close(mse(out, y), F.mse_loss(out.float(), y), rtol=0, atol=0)
    torch.testing.assert_close(mse(out.reshape(8, 8), y), F.mse_loss(out.float(), y), rtol=0, atol=0)


@pytest.mark.parametrize("factory", ["meta", "views", "tied", "lazy"])
def test_load_gives_back_the_weights_the_run_wrote(capsys, tmp_path, factory):
    """A model built on the meta device trained (the trainer materialises it) but turbotrain.load died with a
    NotImplementedError traceback; parameters that are views of one storage trained but load refused them
    (safetensors' load_model will not load shared storage)."""
    from safetensors.torch import load_file

    rc, err = train_cli(capsys, tmp_path, f'model.name="{PKG}:{factory}"', "train.steps=2")
    assert rc == 0, err
    run = tmp_path / "fault"
    model = turbotrain.load(run, device="cpu")
    saved, state = load_file(str(run / "final" / "model.safetensors")), model.state_dict()
    assert set(saved) <= set(state)
    for k, v in saved.items():
        assert torch.equal(state[k], v), k
    if factory == "tied":
        assert model.a.weight is model.b.weight
    x = torch.randn(3, 8)
    assert torch.isfinite(model(x)).all()


def test_compile_fullgraph_with_a_graph_break_fails_instead_of_running_eager(capsys, tmp_path):
    """compile.fullgraph = true ("fail instead of breaking the graph") fell back to eager and the run passed."""
    rc, err = train_cli(capsys, tmp_path, f'model.name="{PKG}:graph_break"', "compile.enabled=true",
                        'compile.backend="eager"', "compile.fullgraph=true", "train.steps=2")
    assert rc == 2
    lines = [ln for ln in err.splitlines() if ln.startswith("error:")]
    assert len(lines) == 1 and "compile.fullgraph = true" in lines[0] and "Traceback" not in err
    rc, err = train_cli(capsys, tmp_path / "breaks", f'model.name="{PKG}:graph_break"', "compile.enabled=true",
                        'compile.backend="eager"', "train.steps=2")
    assert rc == 0, err


class Counter(nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("calls", torch.zeros((), dtype=torch.long))

    def forward(self, x):
        self.calls += 1
        return x


def _bn_net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(*[nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4), nn.ReLU(), Counter()) for _ in range(2)])


@pytest.mark.parametrize("mode", ["full", "selective"])
def test_activation_checkpointing_leaves_the_blocks_buffers_as_without_it(mode):
    """The recompute in backward ran each block in training mode again: BatchNorm's running statistics and
    num_batches_tracked (and any counter of the user's) were updated twice per step, so eval differed."""
    ref, net = _bn_net(), _bn_net()
    apply_activation_checkpointing(net, mode)
    x = torch.randn(8, 4)
    for m in (ref, net):
        for _ in range(2):
            m(x).sum().backward()
    for (name, want), got in zip(ref.named_buffers(), net.buffers()):
        assert torch.equal(got, want), name
    for a, b in zip(ref.parameters(), net.parameters()):
        torch.testing.assert_close(a.grad, b.grad)


@pytest.mark.parametrize("damage", ["truncated", "not-safetensors", "metadata"])
def test_a_damaged_exported_weights_file_is_one_user_error(capsys, tmp_path, damage):
    """An exported folder has no final.json sha256 to check: a truncated or foreign model.safetensors came out of
    load() as safetensors' own SafetensorError."""
    from safetensors.torch import load_file, save_file

    from turbotrain.export import export

    rc, err = train_cli(capsys, tmp_path, "train.steps=1")
    assert rc == 0, err
    dest = export(tmp_path / "fault", "safetensors", tmp_path / "exported")
    (dest / "final.json").unlink()
    weights = dest / "model.safetensors"
    if damage == "truncated":
        weights.write_bytes(weights.read_bytes()[:40])
    elif damage == "not-safetensors":
        weights.write_bytes(b"PK\x03\x04 a zip, say")
    else:
        save_file(load_file(str(weights)), str(weights), metadata={"format": "pt", "tied": "{not json"})
    with pytest.raises(UserError, match=r"model.safetensors: damaged.*turbotrain export"):
        turbotrain.load(dest, device="cpu")
