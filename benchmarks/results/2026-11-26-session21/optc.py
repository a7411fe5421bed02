"""Experiment (not shipped): the plain GPT-2 loop (plain_gpt.py) against (B) the same loop with the clip and the
AdamW step compiled by inductor (foreach AdamW, LR as a tensor so the schedule does not recompile; the clip's norm,
scaling and the update fused into inductor's kernels), and (D) B with the update in a CUDA graph of its own, (C) the plain loop with cuBLASLt preferred for every
matmul. Same math. Prints each variant's JSON line, A B D C A B D C."""
import sys, json, traceback
import torch
sys.path.insert(0, "benchmarks/baselines")
import common, plain_gpt


def compiled_opt_variant(argv, mode):
    args = plain_gpt.parse(argv)
    device = common.setup_device(args)
    work = common.gpt_workload(args, device)
    opt = torch.optim.AdamW(common.param_groups(work.module, 0.1), lr=torch.tensor(args.lr or 6e-4, device=device),
                            betas=(0.9, 0.95), foreach=True, capturable=True)
    sched = common.warmup_cosine(opt, args.schedule_warmup, args.warmup_steps + args.steps)
    module = common.maybe_compile(work.module, args.compile_mode)
    params = list(work.module.parameters())
    dtype = common.autocast_dtype(args.dtype)

    @torch.compile(mode=mode)
    def update():
        if args.clip > 0:
            torch.nn.utils.clip_grad_norm_(params, args.clip, foreach=True)
        opt.step()

    def step():
        x, y = work.batches()
        with torch.autocast(device.type, dtype=dtype or torch.float32, enabled=dtype is not None):
            loss = module(x, y)
        loss.backward()
        update()
        opt.zero_grad(set_to_none=True)
        sched.step()
        return loss
    timing = common.time_steps(step, device, args.warmup_steps, args.steps, args.windows)
    return common.report(f"plain GPT-2, clip + AdamW compiled ({mode})", work, timing, device, args)


def cublaslt_variant(argv):
    before = torch.backends.cuda.preferred_blas_library()
    torch.backends.cuda.preferred_blas_library("cublaslt")
    try:
        row = plain_gpt.main(argv)
    finally:
        torch.backends.cuda.preferred_blas_library(before)
    print(json.dumps({"variant": "cublaslt preferred", "before": str(before)}), flush=True)
    return row


def guarded(fn, *a):
    try:
        fn(*a)
    except Exception:
        traceback.print_exc()
    torch._dynamo.reset()


if __name__ == "__main__":
    argv = sys.argv[1:] or ["--compile-mode", "reduce-overhead"]
    for i in range(2):
        guarded(plain_gpt.main, argv)
        guarded(compiled_opt_variant, argv, "default")
        guarded(compiled_opt_variant, argv, "reduce-overhead")
        if torch.cuda.is_available():
            guarded(cublaslt_variant, argv)
