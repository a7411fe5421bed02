"""AdamW as one Triton kernel launch per parameter group, and the gradients' squared norm as one more
(`train.optimizer_impl = "triton"`).

torch's fused AdamW runs its multi-tensor kernel in several launches of a bounded number of blocks each, each
ending in a tail; here every parameter is cut into blocks of BLOCK elements and one grid covers them all, nearer
the copy rate (benchmarks/NOTES.md, session 29). The kernel finds its tensor through a table of device pointers
(parameter, gradient, exp_avg, exp_avg_sq), so nothing is copied into a flat buffer and the optimizer's state stays
torch's own: `state_dict()` is the same as torch.optim.AdamW's with foreach, and a checkpoint moves between the
implementations.

The update is torch's foreach AdamW's, in fp32: p *= 1 - lr*wd; m += (1-b1)(g - m); v = b2*v + (1-b2)*g*g;
p -= lr/(1-b1^t) * m / (sqrt(v)/sqrt(1-b2^t) + eps). A `grad_scale` tensor set on the optimizer (the folded clip of
accel/optim.clip_grad_norm, torch's fused-kernel hook) divides each gradient as it is read. A step the kernel does
not take (a CPU or non-fp32 tensor, a non-contiguous one, amsgrad/maximize) runs torch's foreach AdamW instead,
with the same state. Parameters of a group whose step counts differ (one got no gradient some steps: its bias
correction is another) are one launch per step count.

With weight copies (accel/weight_copies.py) a table's `flags` mark, per tensor, the rows that hold bf16: a copied
weight's gradient (row 1) and its copy (row 4), which the kernel writes as it steps the weight. The squared norm sums
one partial a block in the tensors' order, so bf16 gradients give the sum their float32 values would."""
from __future__ import annotations

import contextlib
import functools
import itertools
import math

import torch

from turbotrain.accel import weight_copies
from turbotrain.log import say
from turbotrain.models.structure import on_device

BLOCK = 1024  # elements a program updates, at 4 warps: larger blocks cost registers (the loads are not vectors)
_WARPS = 4
COPY_DTYPE = weight_copies.DTYPE  # of the layers' weight copies and their gradients
_GRAD_DTYPES = (torch.float32, COPY_DTYPE)


def triton_problem(device: torch.device) -> str | None:
    """Why the kernels cannot run on `device`, or None."""
    if device.type != "cuda":
        return f"the kernels run on a GPU, not on {device.type}"
    try:
        import triton  # noqa: F401
    except ImportError:
        return "triton is not installed"
    if torch.cuda.is_available() and torch.cuda.get_device_capability(device) < (7, 0):
        return "triton compiles for compute capability 7.0 and newer"
    return None


@functools.cache
def _kernels():
    import triton
    import triton.language as tl

    @triton.jit
    def _block(ptrs, row, n_tensors, blk_tensor, first_blk, numels, BLOCK: tl.constexpr):
        """This program's block: the element offsets into its tensor, their mask, the tensor's pointer in `row` of
        the table (the others follow n_tensors apart), and the tensor's index."""
        b = tl.program_id(0)
        t = tl.load(blk_tensor + b)
        offs = (b - tl.load(first_blk + t)).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        return offs, offs < tl.load(numels + t), ptrs + row * n_tensors + t, t

    @triton.jit
    def _at(entry, offset, DTYPE: tl.constexpr):
        return tl.load(entry + offset).to(tl.pointer_type(DTYPE))

    @triton.jit
    def _load(entry, offset, offs, mask, bf16):  # float32 values of a row's tensor; bf16: a runtime flag
        if bf16:
            x = tl.load(_at(entry, offset, tl.bfloat16) + offs, mask=mask, other=0.0).to(tl.float32)
        else:
            x = tl.load(_at(entry, offset, tl.float32) + offs, mask=mask, other=0.0)
        return x

    @triton.jit
    def adamw(ptrs, numels, blk_tensor, first_blk, n_tensors, flags, scale_ptr, decay, one_minus_b1, beta2,
              one_minus_b2, step_size, bc2_sqrt, eps, HAS_SCALE: tl.constexpr, MIXED: tl.constexpr,
              BLOCK: tl.constexpr):  # MIXED: flags bit 1 = a bf16 gradient, bit 4 = a weight copy to write
        offs, mask, entry, t = _block(ptrs, 0, n_tensors, blk_tensor, first_blk, numels, BLOCK)
        f = 0
        if MIXED:
            f = tl.load(flags + t)
        p_ptr = _at(entry, 0, tl.float32) + offs
        m_ptr = _at(entry, 2 * n_tensors, tl.float32) + offs
        v_ptr = _at(entry, 3 * n_tensors, tl.float32) + offs
        g = _load(entry, n_tensors, offs, mask, (f & 2) != 0)
        if HAS_SCALE:
            g = tl.div_rn(g, tl.load(scale_ptr))
        p = tl.load(p_ptr, mask=mask) * decay
        m = tl.load(m_ptr, mask=mask)
        m = m + one_minus_b1 * (g - m)
        v = tl.load(v_ptr, mask=mask) * beta2 + one_minus_b2 * (g * g)  # addcmul's order
        p = p - step_size * tl.div_rn(m, tl.div_rn(tl.sqrt_rn(v), bc2_sqrt) + eps)
        tl.store(p_ptr, p, mask=mask)
        tl.store(m_ptr, m, mask=mask)
        tl.store(v_ptr, v, mask=mask)
        if (f & 16) != 0:  # triton rounds to nearest even, as torch's cast
            tl.store(_at(entry, 4 * n_tensors, tl.bfloat16) + offs, p.to(tl.bfloat16), mask=mask)

    @triton.jit
    def sq_sum(ptrs, numels, blk_tensor, first_blk, n_tensors, flags, out, MIXED: tl.constexpr, BLOCK: tl.constexpr):
        offs, mask, entry, t = _block(ptrs, 0, n_tensors, blk_tensor, first_blk, numels, BLOCK)
        f = 0
        if MIXED:
            f = tl.load(flags + t)
        x = _load(entry, 0, offs, mask, (f & 1) != 0)
        tl.store(out + tl.program_id(0), tl.sum(x * x))

    return adamw, sq_sum


class _TableCache:
    """Device tables for rows of tensors (parameters, gradients, ...): their pointers [rows x tensors] and, per block
    of BLOCK elements, the tensor it is in and that tensor's first block. Rebuilt (and the tensors' layout checked)
    only when a pointer or a size changes; copied from page-locked memory without waiting for the GPU."""

    def __init__(self):
        self.sizes: tuple = ()
        self.addrs: tuple = ()
        self.want: list = []  # each row's dtypes

    def get(self, rows: list[list[torch.Tensor]], dtypes: tuple = ()) -> _TableCache | None:
        """The tables, or None where a tensor does not fit the kernels (`_fits`): checked on every call, the
        tables' addresses alone do not say the tensors there are still contiguous and of their dtype. `dtypes`: per
        row, its tensors' dtype, or a tuple of each one's (float32 where it names none); `flags` holds, per tensor,
        bit r where row r's is bf16, and `mixed` whether any is."""
        want = [(d,) * len(row) if isinstance(d, torch.dtype) else tuple(d)
                for row, d in zip(rows, dtypes or (torch.float32,) * len(rows))]
        addrs = tuple(t.data_ptr() for row in rows for t in row)
        sizes = tuple(t.numel() for t in rows[0])
        if addrs == self.addrs and sizes == self.sizes and want == self.want:
            # the same addresses need not be the same layout: a gradient the user set to a transposed view of the
            # old one's storage, a tensor of another dtype where a freed one was; kept only while those still fit.
            # Parameters, gradients and copies (rows 0, 1, 4): the optimizer's own state changes only through a
            # load, which drops the tables
            if all(t.is_contiguous() and t.dtype is d for r in (0, 1, 4) if r < len(rows)
                   for t, d in zip(rows[r], want[r])):
                return self
            self.addrs = ()
            return None
        device = rows[0][0].device
        if not all(_fits([t], device, d) for row, ds in zip(rows, want) for t, d in zip(row, ds)) \
                or any([t.numel() for t in row] != list(sizes) for row in rows):
            return None
        marks = [sum(1 << r for r, row in enumerate(want) if row[k] is COPY_DTYPE) for k in range(len(sizes))]
        if want != self.want:
            self.flags, self.mixed = _to_device(marks, torch.int32, device), any(marks)
        self.want = want
        if sizes != self.sizes:
            counts = [-(-n // BLOCK) for n in sizes]
            first = [0, *itertools.accumulate(counts[:-1])]
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


def _fits(tensors: list[torch.Tensor], device: torch.device, dtype: torch.dtype = torch.float32) -> bool:
    """The kernels' layout: plain tensors of `dtype`, contiguous, on `device`."""
    return all(type(t) in (torch.Tensor, torch.nn.Parameter) and t.dtype == dtype and t.device == device
               and t.layout == torch.strided and t.is_contiguous() for t in tensors)


def grad_sq_sum(grads: list[torch.Tensor], cache: _TableCache | None = None) -> torch.Tensor | None:
    """Sum of the squares of every element of `grads` (float32, or the bf16 of weight copies: summed in float32, one
    kernel plus a sum of one value per block), or None where the kernel does not take these tensors (the caller
    uses torch's foreach norm then)."""
    grads = [g for g in grads if g.numel()]
    if not grads or triton_problem(grads[0].device) or any(g.dtype not in _GRAD_DTYPES for g in grads):
        return None
    dtypes = tuple(g.dtype for g in grads)
    table = (cache or _TableCache()).get([grads], (dtypes,))
    if table is None:
        return None
    out = torch.empty(table.n_blocks, dtype=torch.float32, device=grads[0].device)
    _, sq_sum = _kernels()
    with on_device(out.device):
        sq_sum[(table.n_blocks,)](table.ptrs, table.numels, table.blk_tensor, table.first_blk, table.n_tensors,
                                  table.flags, out, MIXED=table.mixed, BLOCK=BLOCK, num_warps=_WARPS)
    return out.sum()


class TritonAdamW(torch.optim.AdamW):
    """torch.optim.AdamW (foreach, same state) whose step is one Triton launch per parameter group on a GPU.

    `copies`: (float32 parameter, its layer's bf16 copy) pairs (accel/weight_copies.py). The kernel writes each copy
    as it steps the parameter; a weight's gradient is its copy's (bf16), a bias's its own (float32)."""

    def __init__(self, params, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 1e-2, copies: list[tuple[torch.Tensor, torch.Tensor]] = ()):
        super().__init__(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, foreach=True)
        self._tables: dict[int, _TableCache] = {}  # per param group
        self._parts: dict[int, list] = {}  # per param group whose step counts differ: (tables, indices) per count
        self._norm_table = _TableCache()
        self._built: set[str] = set()  # the kernels that have launched
        self._broken = ""  # why the kernels could not be built
        held = {id(p) for g in self.param_groups for p in g["params"]}
        if any(id(p) not in held or c.shape != p.shape or c.dtype is not COPY_DTYPE for p, c in copies):
            raise ValueError("TritonAdamW: a copy's parameter is not one it steps, or the copy is not its bf16 twin")
        self._pairs = list(copies)
        self._copies = {id(p): c for p, c in copies}
        self._leaves = {id(c) for _, c in copies if c.requires_grad}  # weights' copies; a bias's takes no gradient

    @property
    def copies(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """(parameter, its layer's bf16 copy) pairs this optimizer writes."""
        return self._pairs

    def grad_of(self, p: torch.Tensor) -> torch.Tensor | None:
        """The gradient this step applies to `p`: a copied weight's is its copy's. A weight that also got one of its
        own (read directly besides through its layer) gets the sum, in float32, on itself; a weight frozen since
        its copy's last sync (requires_grad off) gets none."""
        copy = self._copies.get(id(p))
        if copy is None or copy.grad is None:
            return p.grad
        if not p.requires_grad:
            copy.grad = None
            return p.grad
        if p.grad is None:
            return copy.grad
        p.grad.add_(copy.grad)
        copy.grad = None
        return p.grad

    @torch.no_grad()
    def sync_copies(self) -> None:
        """Before a forward: every copy equal to its parameter (a checkpoint load or an in-place edit changed the
        parameter, or a callback ran: accel/weight_copies.stale), no copy holding a gradient left by a backward
        outside the train step, and a copy takes a gradient only while its parameter does (a layer frozen
        mid-run). The kernel's own writes move no version counter."""
        stale = [(p, c) for p, c in self._pairs if weight_copies.stale(p, c)]
        if stale:
            torch._foreach_copy_([c for _, c in stale], [p for p, _ in stale])
            for p, c in stale:
                weight_copies.written(p, c)
        for p, c in self._pairs:
            c.grad = None
            if id(c) in self._leaves and c.requires_grad != p.requires_grad:
                c.requires_grad_(p.requires_grad)

    def zero_grad(self, set_to_none: bool = True) -> None:
        super().zero_grad(set_to_none)
        for _, c in self._pairs:
            if c.grad is not None:
                c.grad = None if set_to_none else c.grad.zero_()

    def grad_sq_sum(self, grads: list[torch.Tensor]) -> torch.Tensor | None:
        """The gradients' squared norm in one kernel, or None (torch's foreach norm then)."""
        if self._broken:
            return None
        with self._first_build("sq_sum"):
            total = grad_sq_sum(grads, self._norm_table)
            if total is not None:
                self._built.add("sq_sum")
            return total
        return None  # the kernel failed to build: said once, torch's kernels from now on

    @contextlib.contextmanager
    def _first_build(self, kernel: str):
        """Triton compiles a kernel at its first launch, on the user's machine. Where that fails (no C compiler for
        its launcher, a GPU it cannot target) before `kernel` ever launched, the run goes on with torch's kernels,
        said once: nothing was updated yet. A failure after it launched (one group stepped already) is the run's
        error."""
        try:
            yield
        except Exception as e:
            if kernel in self._built:
                raise
            self._broken = f"{type(e).__name__}: {(str(e).strip().splitlines() or [''])[0][:200]}"
            say(f"optimizer: the Triton AdamW kernels failed to build here ({self._broken}); torch's foreach AdamW "
                "steps instead (train.optimizer_impl=\"fused\" takes torch's fused kernel)")

    def load_state_dict(self, state_dict: dict) -> None:
        """torch's load, which takes the saved groups' kernel flags: a state of torch's fused AdamW would make the
        fallback steps fused ones. The flags stay foreach, step counts (on the GPU under fused) come to the host, and
        the next step plans its launches afresh."""
        super().load_state_dict(state_dict)
        # torch keeps a state tensor that needs no cast as the one it is given: the tables' addresses can be the
        # same with other step counts, which are checked only where the tables change
        self._tables.clear()
        self._parts.clear()
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
        if not self._broken and not any(plan is False for plan in plans):
            with self._first_build("adamw"):
                self._launch(plans)
                return loss
        for cache in self._tables.values():  # step counts may differ after this step: checked again at the next
            cache.addrs = ()
        self._parts.clear()
        self._foreach_step()  # also where the first build failed: nothing was updated yet
        return loss

    def _launch(self, plans: list) -> None:
        scale = getattr(self, "grad_scale", None)
        adamw, _ = _kernels()
        for group, plan in zip(self.param_groups, plans):
            for table, steps in plan or ():
                t = float(steps[0]) + 1
                lr, (beta1, beta2) = float(group["lr"]), group["betas"]
                if table.n_blocks:  # zero-size parameters count steps too (torch's do), with no blocks
                    with on_device(table.ptrs.device):
                        adamw[(table.n_blocks,)](
                            table.ptrs, table.numels, table.blk_tensor, table.first_blk, table.n_tensors, table.flags,
                            scale if scale is not None else table.ptrs, 1.0 - lr * group["weight_decay"],
                            1.0 - beta1, beta2, 1.0 - beta2, lr / (1.0 - beta1 ** t), math.sqrt(1.0 - beta2 ** t),
                            group["eps"], HAS_SCALE=scale is not None, MIXED=table.mixed, BLOCK=BLOCK,
                            num_warps=_WARPS)
                    self._built.add("adamw")
                torch._foreach_add_(steps, 1)

    def _plan(self, i: int, group: dict):
        """[(the tables, the step counts)] of the group's parameters with a gradient, one launch per step count;
        None: nothing to update; False: this step runs torch's foreach AdamW."""
        live = [p for p in group["params"] if self.grad_of(p) is not None]
        if not live:
            return None
        scale = getattr(self, "grad_scale", None)
        if (group["amsgrad"] or group["maximize"] or group["capturable"] or group["differentiable"] or self._broken
                or triton_problem(live[0].device)
                or scale is not None and not (isinstance(scale, torch.Tensor) and scale.device == live[0].device
                                              and scale.numel() == 1 and scale.dtype == torch.float32)):
            return False
        states = [self.state[p] for p in live]
        fresh = False  # a state created now (a parameter's first step, a state the user dropped) can sit where a
        for p, st in zip(live, states):  # freed one was: same addresses, another step count
            if not st:  # torch's foreach AdamW's initial state
                fresh = True
                st["step"] = torch.tensor(0.0, dtype=torch.float32)
                st["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                st["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
        steps = [st["step"] for st in states]
        cache = self._tables.setdefault(i, _TableCache())
        known = cache.addrs, cache.want
        rows, dtypes = self._rows(live, states)
        table = cache.get(rows, dtypes)
        if table is None:
            return False
        if (table.addrs, table.want) == known and not fresh:  # the same tensors as last step: they stepped together
            parts = self._parts.get(i)
            return [(sub, [steps[k] for k in idx]) for sub, idx in parts] if parts else [(table, steps)]
        self._parts.pop(i, None)
        if any(s.device.type != "cpu" for s in steps):  # new tensors: their steps, once
            cache.addrs = ()  # checked again next step
            return False
        counts = [float(s) for s in steps]
        if len(set(counts)) == 1:
            return [(table, steps)]
        # a parameter that got no gradient some steps (frozen a while, unused) counts fewer: its bias correction
        # differs, so each step count is a launch of its own
        self._parts[i] = [(_TableCache().get([[row[k] for k in idx] for row in rows],
                                             [[ds[k] for k in idx] for ds in dtypes]), idx)
                          for idx in ([k for k, c in enumerate(counts) if c == n] for n in sorted(set(counts)))]
        return [(sub, [steps[k] for k in idx]) for sub, idx in self._parts[i]]

    def _rows(self, live: list, states: list) -> tuple[list, list]:
        """The kernel's rows (parameters, gradients, exp_avg, exp_avg_sq; and where a parameter has a weight copy,
        the copies) with each tensor's dtype: a copied weight's gradient is bf16. A parameter without a copy stands
        in its own copy's place (its flag says not to write it)."""
        grads = [self.grad_of(p) for p in live]
        rows = [live, grads, [st["exp_avg"] for st in states], [st["exp_avg_sq"] for st in states]]
        f32 = (torch.float32,) * len(live)
        dtypes = [f32, tuple(g.dtype if g.dtype is COPY_DTYPE else torch.float32 for g in grads), f32, f32]
        if self._copies:
            copies = [self._copies.get(id(p), p) for p in live]
            rows.append(copies)
            dtypes.append(tuple(c.dtype if c.dtype is COPY_DTYPE else torch.float32 for c in copies))
        return rows, dtypes

    def _foreach_step(self) -> None:
        """torch's foreach AdamW, with a folded clip's scale applied first (torch takes it only in the fused kernel).
        A copied weight's bf16 gradient goes to it in float32 first, and the copies are written after."""
        scale = self.__dict__.pop("grad_scale", None)
        for p, c in self._pairs:
            g = self.grad_of(p)
            if g is not None and g is not p.grad:
                p.grad, c.grad = g.float(), None
        grads = [p.grad for g in self.param_groups for p in g["params"] if p.grad is not None]
        if scale is not None and grads:  # the kernel reads any one-element tensor; torch's division takes a 0-d one
            torch._foreach_div_(grads, scale.reshape(()).to(grads[0].device) if isinstance(scale, torch.Tensor)
                                else scale)
        try:
            super().step()
        finally:
            if scale is not None:
                self.grad_scale = scale
            self.sync_copies()  # torch's step moved the parameters' version counters: each copy is written
