"""AdamW as one Triton kernel launch per parameter group, and the gradients' squared norm as one more
(`train.optimizer_impl = "triton"`).

torch's fused AdamW runs a multi-tensor kernel whose launches hold at most 320 blocks of 65,536 elements: fewer
blocks than an H100 runs at once, so each of its ~9 launches a GPT-2 step leaves SMs idle and ends in a tail. Here
every parameter is cut into blocks of BLOCK elements and one grid covers them all; the kernel finds its tensor
through a table of device pointers (parameter, gradient, exp_avg, exp_avg_sq), so nothing is copied into a flat
buffer and the optimizer's state stays torch's own: `state_dict()` is the same as torch.optim.AdamW's with
foreach, and a checkpoint moves between the implementations.

The update is torch's foreach AdamW's, in fp32: p *= 1 - lr*wd; m += (1-b1)(g - m); v = b2*v + (1-b2)*g*g;
p -= lr/(1-b1^t) * m / (sqrt(v)/sqrt(1-b2^t) + eps). A `grad_scale` tensor set on the optimizer (the folded clip of
accel/optim.clip_grad_norm, torch's fused-kernel hook) divides each gradient as it is read. A step the kernel does
not take (a CPU or non-fp32 tensor, one not 16-byte aligned or not contiguous, steps that differ within a group,
amsgrad/maximize) runs torch's foreach AdamW instead, with the same state."""
from __future__ import annotations

import functools
import math

import torch

BLOCK = 4096  # elements a program updates: four 16-byte vectors a thread at 8 warps
_WARPS = 8
_ALIGN = 16


def triton_problem(device: torch.device) -> str | None:
    """Why the kernels cannot run on `device`, or None."""
    if device.type != "cuda":
        return f"the kernels run on a GPU, not on {device.type}"
    try:
        import triton  # noqa: F401
    except ImportError:
        return "triton is not installed"
    return None


@functools.cache
def _kernels():
    import triton
    import triton.language as tl

    @triton.jit
    def _tensor_of(b, blk_tensor, first_blk, numels, BLOCK: tl.constexpr):
        t = tl.load(blk_tensor + b)
        start = (b - tl.load(first_blk + t)).to(tl.int64) * BLOCK  # a multiple of BLOCK: vector loads
        return t, start, tl.load(numels + t)

    @triton.jit
    def _ptr(table, row, n_tensors, t):
        addr = tl.multiple_of(tl.load(table + row * n_tensors + t), 16)  # the host checks the alignment
        return addr.to(tl.pointer_type(tl.float32))

    @triton.jit
    def _update(p_ptr, g_ptr, m_ptr, v_ptr, offs, n, scale_ptr, decay, one_minus_b1, beta2, one_minus_b2,
                step_size, bc2_sqrt, eps, HAS_SCALE: tl.constexpr, MASKED: tl.constexpr):
        mask = offs < n if MASKED else None
        g = tl.load(g_ptr + offs, mask=mask)
        if HAS_SCALE:
            g = tl.div_rn(g, tl.load(scale_ptr))
        p = tl.load(p_ptr + offs, mask=mask) * decay
        m = tl.load(m_ptr + offs, mask=mask)
        m = m + one_minus_b1 * (g - m)
        v = tl.load(v_ptr + offs, mask=mask) * beta2 + one_minus_b2 * g * g
        p = p - step_size * tl.div_rn(m, tl.div_rn(tl.sqrt_rn(v), bc2_sqrt) + eps)
        tl.store(p_ptr + offs, p, mask=mask)
        tl.store(m_ptr + offs, m, mask=mask)
        tl.store(v_ptr + offs, v, mask=mask)

    @triton.jit
    def adamw(ptrs, numels, blk_tensor, first_blk, n_tensors, scale_ptr, decay, one_minus_b1, beta2,
              one_minus_b2, step_size, bc2_sqrt, eps, HAS_SCALE: tl.constexpr, BLOCK: tl.constexpr):
        t, start, n = _tensor_of(tl.program_id(0), blk_tensor, first_blk, numels, BLOCK)
        p_ptr = _ptr(ptrs, 0, n_tensors, t)
        g_ptr = _ptr(ptrs, 1, n_tensors, t)
        m_ptr = _ptr(ptrs, 2, n_tensors, t)
        v_ptr = _ptr(ptrs, 3, n_tensors, t)
        offs = start + tl.arange(0, BLOCK)
        if start + BLOCK <= n:  # full blocks take no mask, so their loads are 16-byte vectors
            _update(p_ptr, g_ptr, m_ptr, v_ptr, offs, n, scale_ptr, decay, one_minus_b1, beta2, one_minus_b2,
                    step_size, bc2_sqrt, eps, HAS_SCALE, False)
        else:
            _update(p_ptr, g_ptr, m_ptr, v_ptr, offs, n, scale_ptr, decay, one_minus_b1, beta2, one_minus_b2,
                    step_size, bc2_sqrt, eps, HAS_SCALE, True)

    @triton.jit
    def sq_sum(ptrs, numels, blk_tensor, first_blk, n_tensors, out, BLOCK: tl.constexpr):
        b = tl.program_id(0)
        t, start, n = _tensor_of(b, blk_tensor, first_blk, numels, BLOCK)
        offs = start + tl.arange(0, BLOCK)
        x = tl.load(_ptr(ptrs, 0, n_tensors, t) + offs, mask=offs < n, other=0.0)
        tl.store(out + b, tl.sum(x * x))

    return adamw, sq_sum


class _TableCache:
    """Device tables for rows of tensors (parameters, gradients, ...): their pointers [rows x tensors] and, per block
    of BLOCK elements, the tensor it is in and that tensor's first block. Each part is rebuilt only when its
    pointers or sizes change, and copied from page-locked memory without waiting for the GPU."""

    def __init__(self):
        self.sizes: tuple = ()
        self.addrs: tuple = ()

    def get(self, rows: list[list[torch.Tensor]]) -> _TableCache:
        device = rows[0][0].device
        sizes = tuple(t.numel() for t in rows[0])
        if sizes != self.sizes:
            counts = [-(-n // BLOCK) for n in sizes]
            first = [sum(counts[:i]) for i in range(len(counts))]
            self.n_tensors, self.n_blocks = len(sizes), sum(counts)
            self.numels = _to_device(list(sizes), torch.int64, device)
            self.blk_tensor = _to_device([i for i, c in enumerate(counts) for _ in range(c)], torch.int32, device)
            self.first_blk = _to_device(first, torch.int32, device)
            self.sizes, self.addrs = sizes, ()
        addrs = tuple(t.data_ptr() for row in rows for t in row)
        if addrs != self.addrs:
            self.ptrs, self.addrs = _to_device(list(addrs), torch.int64, device), addrs
        return self


def _to_device(values: list[int], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    return torch.tensor(values, dtype=dtype).pin_memory().to(device, non_blocking=True)


def _fits(tensors: list[torch.Tensor], device: torch.device) -> bool:
    """The kernels' layout: plain fp32 tensors, contiguous, 16-byte aligned, on `device`."""
    return all(type(t) in (torch.Tensor, torch.nn.Parameter) and t.dtype == torch.float32 and t.device == device
               and t.layout == torch.strided and t.is_contiguous() and t.data_ptr() % _ALIGN == 0 for t in tensors)


def grad_sq_sum(grads: list[torch.Tensor], cache: _TableCache | None = None) -> torch.Tensor | None:
    """Sum of the squares of every element of `grads` (fp32, one kernel plus a sum of one value per block), or None
    where the kernel does not take these tensors (the caller uses torch's foreach norm then)."""
    if not grads or triton_problem(grads[0].device) or not _fits(grads, grads[0].device):
        return None
    grads = [g for g in grads if g.numel()]
    if not grads:
        return None
    table = (cache or _TableCache()).get([grads])
    out = torch.empty(table.n_blocks, dtype=torch.float32, device=grads[0].device)
    _, sq_sum = _kernels()
    sq_sum[(table.n_blocks,)](table.ptrs, table.numels, table.blk_tensor, table.first_blk, table.n_tensors, out,
                              BLOCK=BLOCK, num_warps=_WARPS)
    return out.sum()


class TritonAdamW(torch.optim.AdamW):
    """torch.optim.AdamW (foreach, same state) whose step is one Triton launch per parameter group on a GPU."""

    def __init__(self, params, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 1e-2):
        super().__init__(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, foreach=True)
        self._tables: dict[int, _TableCache] = {}
        self._norm_table = _TableCache()

    def grad_sq_sum(self, grads: list[torch.Tensor]) -> torch.Tensor | None:
        return grad_sq_sum(grads, self._norm_table)

    def load_state_dict(self, state_dict: dict) -> None:
        super().load_state_dict(state_dict)
        for st in self.state.values():  # torch's fused AdamW keeps step counts on the GPU: here they are host values
            if isinstance(st.get("step"), torch.Tensor) and st["step"].device.type != "cpu":
                st["step"] = st["step"].detach().to("cpu", torch.float32)

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        plans = [self._plan(group) for group in self.param_groups]
        if any(plan is False for plan in plans):
            self._foreach_step()
            return loss
        scale = getattr(self, "grad_scale", None)
        adamw, _ = _kernels()
        for i, (group, plan) in enumerate(zip(self.param_groups, plans)):
            if plan is None:
                continue
            live, steps = plan
            torch._foreach_add_(steps, 1)
            t = float(steps[0])
            table = self._tables.setdefault(i, _TableCache()).get(
                [live, [p.grad for p in live], *([self.state[p][k] for p in live] for k in ("exp_avg", "exp_avg_sq"))])
            lr, (beta1, beta2) = float(group["lr"]), group["betas"]
            adamw[(table.n_blocks,)](
                table.ptrs, table.numels, table.blk_tensor, table.first_blk, table.n_tensors,
                scale if scale is not None else table.ptrs, 1.0 - lr * group["weight_decay"], 1.0 - beta1, beta2,
                1.0 - beta2, lr / (1.0 - beta1 ** t), math.sqrt(1.0 - beta2 ** t), group["eps"],
                HAS_SCALE=scale is not None, BLOCK=BLOCK, num_warps=_WARPS)
        return loss

    def _plan(self, group: dict):
        """(parameters with a gradient, their step counts) for the kernel; None: nothing to update; False: this
        step runs torch's foreach AdamW."""
        live = [p for p in group["params"] if p.grad is not None]
        if not live:
            return None
        if group["amsgrad"] or group["maximize"] or group["capturable"] or group["differentiable"]:
            return False
        device = live[0].device
        if triton_problem(device) or not _fits(live, device) or not _fits([p.grad for p in live], device):
            return False
        scale = getattr(self, "grad_scale", None)
        if scale is not None and (not isinstance(scale, torch.Tensor) or scale.device != device or scale.numel() != 1):
            return False
        for p in live:
            st = self.state[p]
            if not st:
                st["step"] = torch.tensor(0.0, dtype=torch.float32)
                st["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                st["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
        states = [self.state[p] for p in live]
        steps = [st["step"] for st in states]
        if (any(s.device.type != "cpu" for s in steps) or len({float(s) for s in steps}) != 1
                or not _fits([st[k] for st in states for k in ("exp_avg", "exp_avg_sq")], device)):
            return False
        return live, steps

    def _foreach_step(self) -> None:
        """torch's foreach AdamW, with a folded clip's scale applied first (torch takes it only in the fused kernel)."""
        scale = self.__dict__.pop("grad_scale", None)
        if scale is not None:
            grads = [p.grad for g in self.param_groups for p in g["params"] if p.grad is not None]
            torch._foreach_div_(grads, scale)
        try:
            super().step()
        finally:
            if scale is not None:
                self.grad_scale = scale
