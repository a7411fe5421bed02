import torch

from turbotrain.accel.memory_format import apply_channels_last, resolve_channels_last
from turbotrain.data.datasets import Pairs, TokenWindows
from turbotrain.data.loader import Batches, StepSampler
from turbotrain.models.cnn import build as build_cnn

CPU = torch.device("cpu")


def test_token_windows_shift_by_one():
    ds = TokenWindows(torch.arange(100, dtype=torch.int32), block_size=10)
    x, y = ds.gather(torch.tensor([0, 3]))
    assert x.dtype == torch.int64 and x.shape == (2, 10)
    assert torch.equal(x[1], torch.arange(30, 40)) and torch.equal(y[1], torch.arange(31, 41))
    assert len(ds) == 9


def test_user_style_dataset_goes_through_the_dataloader():
    class Items(torch.utils.data.Dataset):
        def __len__(self):
            return 32

        def __getitem__(self, i):
            return torch.full((3,), float(i)), i

    b = Batches(Items(), StepSampler(32, 4, 1, seed=0, shuffle=False), CPU, resident=False,
                settings=dict(num_workers=0, pin_memory=False, prefetch_factor=None, persistent_workers=False))
    x, y = next(b)
    assert x.shape == (4, 3) and y.tolist() == [0, 1, 2, 3]


def test_channels_last_changes_layout_not_results():
    torch.manual_seed(0)
    model = build_cnn().eval()
    x = torch.randn(2, 1, 28, 28)
    ref = model(x)
    assert resolve_channels_last("auto", model, CPU) is False and resolve_channels_last(True, model, CPU)
    model = apply_channels_last(model)
    assert model[0][0].weight.is_contiguous(memory_format=torch.channels_last)
    torch.testing.assert_close(model(x.contiguous(memory_format=torch.channels_last)), ref, rtol=1e-4, atol=1e-5)


def test_pairs_move_and_keep_meta():
    ds = Pairs(torch.randn(4, 2), torch.arange(4), num_classes=4)
    assert ds.to(CPU).num_classes == 4 and ds[2][1] == 2
