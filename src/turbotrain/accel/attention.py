"""The attention kernel behind `F.scaled_dot_product_attention`.

Which backend is fastest depends on the GPU, the shapes and the dtype, so on a GPU "auto" measures: the
SDPA calls of one forward of the model are recorded (shapes, dtype under the run's autocast, causal flag),
each candidate backend (cuDNN, flash, efficient) times forward+backward of those calls (CUDA events,
warm-up, median), and the fastest that runs is chosen. The verdict is kept as JSON beside the compile
caches, keyed by GPU, torch and the calls, so later runs reuse it. On a CPU there is nothing to measure:
torch's choice is kept.

A choice is enforced by *disabling* the backends before it in the chain cuDNN → flash → efficient → math,
not by a priority order alone, which neither eager mode (it prefers cuDNN on Hopper) nor torch.compile's
trace (it picks by the enabled set) obeys (benchmarks/NOTES.md, session 10). Shapes the chosen backend
cannot serve fall through to the ones after it. The set must be in force while
torch.compile traces (it picks the kernel at trace time), so the trainer holds this context for the whole
run, and "auto" is measured before the first step compiles.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import statistics
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Literal

import torch
from torch import nn

from turbotrain.log import say

CANDIDATES = ("cudnn", "flash", "efficient")  # math is the reference kernel: never the fastest on a GPU


@dataclass
class KernelsConfig:
    """The `[kernels]` section."""

    attention: Literal["auto", "default", "cudnn", "flash", "efficient", "math"] = "default"
    """SDPA backend ("auto": fastest measured on the GPU, torch's choice on a CPU); backends before it in the
    chain cudnn → flash → efficient → math are disabled, those after it serve shapes it cannot."""
    fused_loss: bool | Literal["auto"] = False
    """LM head + cross-entropy as one op (Triton on GPU): no fp32 logits, gradients computed in the forward;
    needs model `hidden` and a bias-free `head`, cross-entropy, no FSDP2/HSDP/pipeline, the head not in FP8
    ("auto": on where all of that holds, else off)."""
    packed_attention: bool | Literal["auto"] = "auto"
    """Attention over a fused qkv projection with its gradient written in qkv's layout (cuDNN through
    cudnn-frontend, `pip install 'turbotrain[cudnn]'`): no copy of the qkv gradient in backward. For modules that
    call `turbotrain.models.packed_attention.qkv_attention` and set `calls_qkv_attention = True` (turbotrain's GPT
    blocks); bf16/fp16, no dropout
    ("auto": on a Hopper or newer GPU where cudnn-frontend imports and kernels.attention leaves cuDNN allowed;
    measured in docs/benchmarks.md)."""
    gelu_epilogue: bool | Literal["auto"] = "auto"
    """A GELU MLP's GELU and its gradient computed in the epilogues of GEMMs that run anyway (cuBLASLt, the
    library torch loaded): no GELU kernels of their own. For modules that call
    `turbotrain.models.gelu_epilogue.gelu_mlp` and name its linears in `calls_gelu_mlp = ("fc", "out")`
    (attribute names or dotted paths; turbotrain's GPT blocks do); tanh GELU, plain nn.Linear layers with biases
    and sizes of multiples of 8, bf16/fp16, no FP8 ("auto": on a Hopper or newer GPU, but not under selective
    checkpointing, where it would keep more activations; measured in docs/benchmarks.md)."""
    convnet: bool | Literal["auto"] = "auto"
    """Exact rewrites of a convnet's slow layers: a stride-2 stem conv over ≤ 4 channels as space-to-depth, max
    pools on channels_last GPU tensors by Triton kernels (bit-identical), and BatchNorm2d → ReLU → MaxPool2d
    as consecutive children of an nn.Sequential fused into one layer by Triton kernels on a GPU ("auto": on a
    GPU, for models with any of them; measured in docs/benchmarks.md)."""


@contextlib.contextmanager
def model_ops(kernels: KernelsConfig):
    """`with model_ops(cfg.kernels): train...` — the ops models opt into (kernels.packed_attention,
    kernels.gelu_epilogue) run where the resolved config turns them on; the model's plain code elsewhere."""
    from turbotrain.models.gelu_epilogue import gelu_epilogue
    from turbotrain.models.packed_attention import packed_attention

    with packed_attention(kernels.packed_attention is True), gelu_epilogue(kernels.gelu_epilogue is True):
        yield


def attention_backend(setting: str, device: torch.device) -> contextlib.AbstractContextManager:
    """`with attention_backend("flash", device): train...` — the setting's backend and those after it in the
    chain cuDNN → flash → efficient → math enabled, the ones before it disabled ("auto" here, unmeasured, and
    "default": torch's own choice)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    if setting in ("default", "auto"):
        return contextlib.nullcontext()
    if device.type != "cuda" and setting in ("cudnn", "efficient"):  # else the line below reads as if it ran
        say(f"warning: kernels.attention = \"{setting}\" names a CUDA kernel; on {device.type} SDPA has its flash "
            "and math kernels only, and runs those")
    chain = [SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]
    first = {"cudnn": 0, "flash": 1, "efficient": 2, "math": 3}[setting]
    enabled = chain[first:]
    stack = contextlib.ExitStack()
    try:
        stack.enter_context(sdpa_kernel(enabled, set_priority=True))
    except TypeError:  # torch < 2.6: no priority order; the enabled set alone still decides
        stack.enter_context(sdpa_kernel(enabled))
    # torch's compile caches key a graph by its code, not by the enabled set its trace chose a kernel from:
    # without a tag of their own, a graph compiled under one setting is served under another
    config = torch.compiler.config
    if hasattr(config, "cache_key_tag"):
        tag = "+".join(t for t in (config.cache_key_tag, f"sdpa-{setting}") if t)
        stack.enter_context(config.patch(cache_key_tag=tag))
    say(f"attention: SDPA backends {', '.join(b.name.lower() for b in enabled)} (in that order; "
        f"{', '.join(b.name.lower() for b in chain[:first]) or 'none'} disabled)")
    return stack


# ---------------------------------------------------------------- "auto": measured on the device

@dataclass(frozen=True)
class SdpaCall:
    """One distinct SDPA call of a forward, as the kernel sees it."""

    q: tuple[int, ...]
    k: tuple[int, ...]
    v: tuple[int, ...]
    dtype: str  # after autocast
    is_causal: bool
    mask: tuple[int, ...] | None  # attn_mask's shape (a boolean mask of that shape is timed)
    dropout_p: float
    enable_gqa: bool
    count: int = 1  # how many times one forward makes it


Timer = Callable[[str, SdpaCall], float]  # (backend, call) → ms of forward+backward; raises if it cannot run


def capture_sdpa_calls(module: nn.Module, batch: tuple, device: torch.device, dtype: str) -> list[SdpaCall]:
    """The distinct SDPA calls of one forward of `module(*batch)` under the run's autocast. The forward runs
    eagerly (a compiled module is not traced here), without grad, and leaves the RNG streams as they were."""
    import torch.nn.functional as F
    from torch.overrides import TorchFunctionMode

    from turbotrain.accel.precision import autocast

    seen: Counter = Counter()

    class Record(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            if func is F.scaled_dot_product_attention:
                seen[_describe(args, kwargs, device)] += 1
            return func(*args, **kwargs)

    stance = getattr(torch.compiler, "set_stance", None)  # torch >= 2.6: a compiled module runs eagerly
    eager = stance("force_eager") if stance is not None else contextlib.nullcontext()
    devices = [device] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices), torch.no_grad(), eager, autocast(dtype, device), Record():
        module(*(t.to(device) for t in batch))
    return [SdpaCall(**{**asdict(c), "count": n}) for c, n in seen.items()]


def _describe(args: tuple, kwargs: dict, device: torch.device) -> SdpaCall:
    names = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal")
    a = {**dict(zip(names, args)), **kwargs}
    q = a["query"]
    dtype = q.dtype
    if dtype == torch.float32 and torch.is_autocast_enabled(device.type):  # the kernel gets the autocast dtype
        dtype = torch.get_autocast_dtype(device.type)
    mask = a.get("attn_mask")
    return SdpaCall(q=tuple(q.shape), k=tuple(a["key"].shape), v=tuple(a["value"].shape),
                    dtype=str(dtype).removeprefix("torch."), is_causal=bool(a.get("is_causal", False)),
                    mask=tuple(mask.shape) if mask is not None else None, dropout_p=float(a.get("dropout_p", 0.0)),
                    enable_gqa=bool(a.get("enable_gqa", False)))


def time_backends(calls: list[SdpaCall], timer: Timer) -> dict[str, float | None]:
    """ms of one forward's SDPA work (forward+backward, each call times its count) per candidate; None
    where the backend cannot serve one of the calls."""
    out: dict[str, float | None] = {}
    for name in CANDIDATES:
        try:
            out[name] = sum(c.count * timer(name, c) for c in calls)
        except RuntimeError:  # "No available kernel": this backend cannot serve these shapes/dtype
            out[name] = None
    return out


def choose(timings: dict[str, float | None]) -> str:
    """The fastest backend that ran; "default" (torch's order) when none did."""
    ran = {k: v for k, v in timings.items() if v is not None}
    return min(ran, key=ran.__getitem__) if ran else "default"


def pick_attention(calls: list[SdpaCall], device: torch.device, folder: Path | None,
                   timer: Timer | None = None) -> str:
    """The backend for these calls: the verdict kept in `folder` for this GPU/torch/calls, else measured
    (with `timer`, default CUDA events) and kept. Says the timings once."""
    if not calls:
        say("attention: the model makes no scaled_dot_product_attention call; torch's order kept")
        return "default"
    path = folder / f"attention-{_verdict_key(calls, device)}.json" if folder is not None else None
    kept = _read_verdict(path)
    if kept is not None:
        say(f"attention: {_shown(kept)} → {choose(kept)} (measured earlier: {path})")
        return choose(kept)
    timings = time_backends(calls, timer or cuda_timer(device))
    choice = choose(timings)
    say(f"attention: {_shown(timings)} → {choice}")
    if path is not None:
        _write_verdict(path, timings, calls)
    return choice


def _shown(timings: dict[str, float | None]) -> str:
    return ", ".join(f"{k} {v:.2f} ms" if v is not None else f"{k} cannot run" for k, v in timings.items())


def _verdict_key(calls: list[SdpaCall], device: torch.device) -> str:
    where = ([torch.cuda.get_device_name(device), *torch.cuda.get_device_capability(device),
              torch.backends.cudnn.version()] if device.type == "cuda" else [device.type])
    text = json.dumps([where, torch.__version__, [asdict(c) for c in calls]], default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _read_verdict(path: Path | None) -> dict[str, float | None] | None:
    """The kept timings, or None (none kept, or a damaged file: measured again)."""
    if path is None or not path.is_file():
        return None
    try:
        timings = json.loads(path.read_text())["timings_ms"]
        if isinstance(timings, dict) and set(timings) == set(CANDIDATES) and all(map(_a_time, timings.values())):
            return timings
    except (OSError, ValueError, KeyError, TypeError):
        pass
    say(f"warning: attention verdict {path} is damaged; measuring again")
    return None


def _a_time(v) -> bool:
    """A kept timing: None (the backend cannot run) or milliseconds, finite and >= 0 (json reads NaN too)."""
    return v is None or (type(v) in (int, float) and 0 <= v < float("inf"))


def _write_verdict(path: Path, timings: dict, calls: list[SdpaCall]) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(json.dumps({"timings_ms": timings, "choice": choose(timings),
                                   "calls": [asdict(c) for c in calls]}, indent=1) + "\n")
        os.replace(tmp, path)  # atomic: a reader sees no half-written verdict
    except OSError as e:
        say(f"warning: attention verdict not kept in {path.parent} ({e.strerror})")
    finally:  # a Ctrl-C or a full disk mid-write leaves no half-written file behind
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)


def cuda_timer(device: torch.device, warmup: int = 3, reps: int = 10) -> Timer:
    """Median ms of forward+backward of one call on one backend alone (CUDA events; warm-up first)."""
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    only = {"cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION,
            "efficient": SDPBackend.EFFICIENT_ATTENTION}

    def time_one(backend: str, c: SdpaCall) -> float:
        dtype = getattr(torch, c.dtype)
        with torch.random.fork_rng(devices=[device]):
            q, k, v = (torch.randn(s, device=device, dtype=dtype, requires_grad=True) for s in (c.q, c.k, c.v))
            grad = torch.randn(c.q[:-1] + c.v[-1:], device=device, dtype=dtype)
        mask = torch.ones(c.mask, device=device, dtype=torch.bool) if c.mask is not None else None
        extra = {"enable_gqa": True} if c.enable_gqa else {}

        def fwd_bwd() -> None:
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=c.dropout_p,
                                                 is_causal=c.is_causal, **extra)
            torch.autograd.grad(out, (q, k, v), grad)

        with sdpa_kernel([only[backend]]):
            for _ in range(warmup):  # raises here when the backend cannot serve the call
                fwd_bwd()
            events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                      for _ in range(reps)]
            for start, end in events:
                start.record()
                fwd_bwd()
                end.record()
            torch.cuda.synchronize(device)  # sync point: read the events
        return statistics.median(s.elapsed_time(e) for s, e in events)

    return time_one


def measure_attention(module: nn.Module, batch: tuple, micro: int, device: torch.device, dtype: str,
                      folder: Path | None) -> str:
    """"auto" made concrete on a GPU (before compile traces): the fastest backend for the model's own SDPA
    calls at the micro-batch size (`batch`'s items repeated to `micro` rows). Every rank takes rank 0's
    verdict, so all run the same kernel. Usage:
    `setting = measure_attention(step_module, first_batch, 16, device, "bf16", folder)`."""
    batch = tuple(t[torch.arange(micro) % len(t)] for t in batch)
    choice = pick_attention(capture_sdpa_calls(module, batch, device, dtype), device, folder)
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        verdict = [choice]
        torch.distributed.broadcast_object_list(verdict, src=0)  # collective: every rank measured, rank 0 decides
        choice = verdict[0]
    return choice
