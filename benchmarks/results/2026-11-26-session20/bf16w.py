"""Experiment (not shipped): the plain GPT-2 loop (plain_gpt.py: reduce-overhead, fused AdamW, clip 1.0) against the same
loop with the blocks' Linear weights and biases held in bf16 by the model and in fp32 by the optimizer (masters), so
that no step casts them: the forward reads bf16 weights directly (autocast would cast the fp32 ones to the same
values), the backward's bf16 gradients are copied into the masters' fp32 gradients in one multi-tensor copy (autocast's
cast backward does the same per tensor), and after the fused AdamW step the masters are copied back in one more.
Same math as autocast. Prints each variant's JSON line, alternately A B A B."""
import sys, json
import torch
sys.path.insert(0, "benchmarks/baselines")
import common, plain_gpt


def bf16_variant(argv):
    args = plain_gpt.parse(argv)
    device = common.setup_device(args)
    work = common.gpt_workload(args, device)
    model = work.module.model if hasattr(work.module, "model") else work.module
    low, master = [], []
    for blk in model.blocks:
        for lin in (blk.qkv, blk.proj, blk.fc, blk.out):
            for name in ("weight", "bias"):
                p = getattr(lin, name)
                m = torch.nn.Parameter(p.detach().clone())  # fp32 master
                m.grad = torch.zeros_like(m)
                p.data = p.data.to(torch.bfloat16)
                low.append(p); master.append(m)
    low_ids = {id(p) for p in low}
    rest = [(n, p) for n, p in model.named_parameters() if id(p) not in low_ids]
    decay = [p for n, p in rest if p.dim() >= 2] + [m for m in master if m.dim() >= 2]
    nodecay = [p for n, p in rest if p.dim() < 2] + [m for m in master if m.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": nodecay, "weight_decay": 0.0}],
                            lr=args.lr or 6e-4, betas=(0.9, 0.95),
                            **({"foreach": True} if args.no_fused else {"fused": True}))
    sched = common.warmup_cosine(opt, args.schedule_warmup, args.warmup_steps + args.steps)
    module = common.maybe_compile(work.module, args.compile_mode)
    to_master = {id(p): m for p, m in zip(low, master)}
    clip_params = [to_master.get(id(p), p) for p in model.parameters()]  # the plain loop's order: the same norm
    low_grads = None

    def step():
        x, y = work.batches()
        with torch.autocast(device.type, dtype=torch.bfloat16):
            loss = module(x, y)
        loss.backward()
        torch._foreach_copy_([m.grad for m in master], [p.grad for p in low])
        if args.clip > 0:
            torch.nn.utils.clip_grad_norm_(clip_params, args.clip, foreach=True)
        opt.step()
        for _, p in rest:
            p.grad = None
        for p in low:
            p.grad = None
        torch._foreach_copy_([p.data for p in low], master)
        sched.step()
        return loss
    timing = common.time_steps(step, device, args.warmup_steps, args.steps, args.windows)
    return common.report("plain GPT-2, bf16 weights + fp32 masters", work, timing, device, args)


if __name__ == "__main__":
  argv = sys.argv[1:] or ["--compile-mode", "reduce-overhead"]
  for i in range(2):
    plain_gpt.main(argv)
    torch._dynamo.reset()
    bf16_variant(argv)
    torch._dynamo.reset()
