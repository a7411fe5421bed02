"""AdamW as one Triton kernel launch per parameter group, and the gradients' squared norm as one more
(`train.optimizer_impl = "triton"`).

torch's fused AdamW runs its multi-tensor kernel in several launches of a bounded number of blocks each, and on
GPT-2's parameters it moves their bytes at 60-70 % of the copy rate (benchmarks/NOTES.md, session 29). Here every
parameter is cut into blocks of BLOCK elements and one grid covers them all (93 % of the copy rate there); the
kernel finds its tensor through a table of device pointers (parameter, gradient, exp_avg, exp_avg_sq), so
nothing is copied into a flat buffer and the optimizer's state stays torch's own: `state_dict()` is the same as
torch.optim.AdamW's with foreach, and a checkpoint moves between the implementations.

The update is torch's foreach AdamW's, in fp32: p *= 1 - lr*wd; m += (1-b1)(g - m); v = b2*v + (1-b2)*g*g;
p -= lr/(1-b1^t) * m / (sqrt(v)/sqrt(1-b2^t) + eps). A `grad_scale` tensor set on the optimizer (the folded clip of
accel/optim.clip_grad_norm, torch's fused-kernel hook) divides each gradient as it is read. A step the kernel does
not take (a CPU or non-fp32 tensor, a non-contiguous one, step counts that differ within a group,
amsgrad/maximize) runs torch's foreach AdamW instead, with the same state."""
from __future__ import annotations

import functools
import math

import torch

BLOCK = 1024  # elements a program updates, at 4 warps: larger blocks cost registers (the loads are not vectors)
_WARPS = 4


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
    def _block(ptrs, row, n_tensors, blk_tensor, first_blk, numels, BLOCK: tl.constexpr):
        """This program's block: the element offsets into its tensor, their mask, and the tensor's pointer in
        `row` of the table (the others follow n_tensors apart)."""
        b = tl.program_id(0)
        t = tl.load(blk_tensor + b)
        offs = (b - tl.load(first_blk + t)).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        return offs, offs < tl.load(numels + t), ptrs + row * n_tensors + t

    @triton.jit
    def _at(entry, offset):
        return tl.load(entry + offset).to(tl.pointer_type(tl.float32))

    @triton.jit
    def adamw(ptrs, numels, blk_tensor, first_blk, n_tensors, scale_ptr, decay, one_minus_b1, beta2, one_minus_b2,
              step_size, bc2_sqrt, eps, HAS_SCALE: tl.constexpr, BLOCK: tl.constexpr):
        offs, mask, entry = _block(ptrs, 0, n_tensors, blk_tensor, first_blk, numels, BLOCK)
        p_ptr = _at(entry, 0) + offs
        g_ptr = _at(entry, n_tensors) + offs
        m_ptr = _at(entry, 2 * n_tensors) + offs
        v_ptr = _at(entry, 3 * n_tensors) + offs
        g = tl.load(g_ptr, mask=mask)
        if HAS_SCALE:
            g = tl.div_rn(g, tl.load(scale_ptr))
        p = tl.load(p_ptr, mask=mask) * decay
        m = tl.load(m_ptr, mask=mask)
        m = m + one_minus_b1 * (g - m)
        v = tl.load(v_ptr, mask=mask) * beta2 + one_minus_b2 * g * g
        p = p - step_size * tl.div_rn(m, tl.div_rn(tl.sqrt_rn(v), bc2_sqrt) + eps)
        tl.store(p_ptr, p, mask=mask)
        tl.store(m_ptr, m, mask=mask)
        tl.store(v_ptr, v, mask=mask)

    @triton.jit
    def sq_sum(ptrs, numels, blk_tensor, first_blk, n_tensors, out, BLOCK: tl.constexpr):
        offs, mask, entry = _block(ptrs, 0, n_tensors, blk_tensor, first_blk, numels, BLOCK)
        x = tl.load(_at(entry, 0) + offs, mask=mask, other=0.0)
        tl.store(out + tl.program_id(0), tl.sum(x * x))

    return adamw, sq_sum


class _TableCache:
    """Device tables for rows of tensors (parameters, gradients, ...): their pointers [rows x tensors] and, per block
    of BLOCK elements, the tensor it is in and that tensor's first block. Rebuilt (and the tensors' layout checked)
    only when a pointer or a size changes; copied from page-locked memory without waiting for the GPU."""

    def __init__(self):
        self.sizes: tuple = ()
        self.addrs: tuple = ()

    def get(self, rows: list[list[torch.Tensor]]) -> _TableCache | None:
        """The tables, or None where a tensor does not fit the kernels (`_fits`)."""
        addrs = tuple(t.data_ptr() for row in rows for t in row)
        sizes = tuple(t.numel() for t in rows[0])
        if addrs == self.addrs and sizes == self.sizes:
            return self
        device = rows[0][0].device
        if not all(_fits(row, device) and [t.numel() for t in row] == list(sizes) for row in rows):
            return None
        if sizes != self.sizes:
            counts = [-(-n // BLOCK) for n in sizes]
            first = [sum(counts[:i]) for i in range(len(counts))]
            self.n_tensors, self.n_blocks = len(sizes), sum(counts)
            self.numels = _to_device(list(sizes), torch.int64, device)
            self.blk_tensor = _to_device([i for i, c in enumerate(counts) for _ in range(c)], torch.int32, device)
            self.first_blk = _to_device(first, torch.int32, device)
        self.ptrs = _to_device(list(addrs), torch.int64, device)
        self.addrs, self.sizes = addrs, sizes
        return self


def _to_device(values: list[int], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    host = torch.tensor(values, dtype=dtype)
    return host if device.type == "cpu" else host.pin_memory().to(device, non_blocking=True)


def _fits(tensors: list[torch.Tensor], device: torch.device) -> bool:
    """The kernels' layout: plain fp32 tensors, contiguous, on `device`."""
    return all(type(t) in (torch.Tensor, torch.nn.Parameter) and t.dtype == torch.float32 and t.device == device
               and t.layout == torch.strided and t.is_contiguous() for t in tensors)


def grad_sq_sum(grads: list[torch.Tensor], cache: _TableCache | None = None) -> torch.Tensor | None:
    """Sum of the squares of every element of `grads` (fp32, one kernel plus a sum of one value per block), or None
    where the kernel does not take these tensors (the caller uses torch's foreach norm then)."""
    grads = [g for g in grads if g.numel()]
    if not grads or triton_problem(grads[0].device):
        return None
    table = (cache or _TableCache()).get([grads])
    if table is None:
        return None
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
        self._tables: dict[int, _TableCache] = {}  # per param group
        self._norm_table = _TableCache()

    def grad_sq_sum(self, grads: list[torch.Tensor]) -> torch.Tensor | None:
        return grad_sq_sum(grads, self._norm_table)

    def load_state_dict(self, state_dict: dict) -> None:
        """torch's load, which takes the saved groups' kernel flags: a state of torch's fused AdamW would make the
        fallback steps fused ones. The flags stay foreach, and step counts (on the GPU under fused) come to the host."""
        super().load_state_dict(state_dict)
        for group in self.param_groups:
            group.update(foreach=True, fused=None, capturable=False)
        for st in self.state.values():
            if isinstance(st.get("step"), torch.Tensor) and st["step"].device.type != "cpu":
                st["step"] = st["step"].detach().to("cpu", torch.float32)

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        plans = [self._plan(i, group) for i, group in enumerate(self.param_groups)]
        if any(plan is False for plan in plans):
            self._foreach_step()
            return loss
        scale = getattr(self, "grad_scale", None)
        adamw, _ = _kernels()
        for group, plan in zip(self.param_groups, plans):
            if plan is None:
                continue
            table, steps = plan
            torch._foreach_add_(steps, 1)
            t = float(steps[0])
            lr, (beta1, beta2) = float(group["lr"]), group["betas"]
            adamw[(table.n_blocks,)](
                table.ptrs, table.numels, table.blk_tensor, table.first_blk, table.n_tensors,
                scale if scale is not None else table.ptrs, 1.0 - lr * group["weight_decay"], 1.0 - beta1, beta2,
                1.0 - beta2, lr / (1.0 - beta1 ** t), math.sqrt(1.0 - beta2 ** t), group["eps"],
                HAS_SCALE=scale is not None, BLOCK=BLOCK, num_warps=_WARPS)
        return loss

    def _plan(self, i: int, group: dict):
        """(the tables, the step counts) of the group's parameters with a gradient for the kernel; None: nothing to
        update; False: this step runs torch's foreach AdamW."""
        live = [p for p in group["params"] if p.grad is not None]
        if not live:
            return None
        scale = getattr(self, "grad_scale", None)
        if (group["amsgrad"] or group["maximize"] or group["capturable"] or group["differentiable"]
                or triton_problem(live[0].device)
                or scale is not None and not (isinstance(scale, torch.Tensor) and scale.device == live[0].device
                                              and scale.numel() == 1)):
            return False
        states = [self.state[p] for p in live]
        for p, st in zip(live, states):
            if not st:  # torch's foreach AdamW's initial state
                st["step"] = torch.tensor(0.0, dtype=torch.float32)
                st["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                st["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
        steps = [st["step"] for st in states]
        cache = self._tables.setdefault(i, _TableCache())
        known = cache.addrs
        table = cache.get([live, [p.grad for p in live], [st["exp_avg"] for st in states],
                           [st["exp_avg_sq"] for st in states]])
        if table is None:
            return False
        if table.addrs != known and (any(s.device.type != "cpu" for s in steps)  # new tensors: their steps, once
                                     or len({float(s) for s in steps}) != 1):
            cache.addrs = ()  # checked again next step
            return False
        return table, steps

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
