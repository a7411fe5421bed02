"""Command line: `turbotrain train|env|data ...`. User errors end with one `error:` line and exit 2."""
from __future__ import annotations

import argparse
import json
import os
import sys

from turbotrain.errors import UserError

EXAMPLES = """examples:
  turbotrain train                                   # default preset gpt-shakespeare
  turbotrain train gpt2-124m precision.dtype=bf16 compile.enabled=true
  turbotrain train my.toml train.steps=30 data.batch_size=8
  torchrun --nproc_per_node=2 -m turbotrain train gpt2-124m
  turbotrain scale gpt2-124m --gpus 1,2 --strategies ddp,fsdp
"""


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="turbotrain", description="PyTorch training acceleration, measured honestly.",
                                epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    t = sub.add_parser("train", help="train a preset or a .toml config")
    t.add_argument("config", nargs="?", default=None, help="preset name or .toml path (default: gpt-shakespeare)")
    t.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="dotted overrides, e.g. train.steps=30")
    sc = sub.add_parser("scale", help="throughput and efficiency at each world size, through torchrun")
    sc.add_argument("config", nargs="?", default=None, help="preset name or .toml path")
    sc.add_argument("overrides", nargs="*", metavar="KEY=VALUE")
    sc.add_argument("--gpus", required=True, help="world sizes, e.g. 1,2,4,8 (CPU processes without a GPU)")
    sc.add_argument("--strategies", default="ddp", help="comma list of ddp,fsdp (default ddp)")
    sc.add_argument("--repeats", type=int, default=1, help="runs per row; the median is reported with the spread")
    b = sub.add_parser("bench", help="what each technique buys: speed, memory, loss reached")
    b.add_argument("config", nargs="?", default=None, help="preset name or .toml path")
    b.add_argument("overrides", nargs="*", metavar="KEY=VALUE")
    b.add_argument("--variants", default=None, help="comma list (default: sensible per device): baseline,tf32,"
                   "bf16,fp16,compile,accum,channels_last,act_ckpt,fused_opt,workers,all")
    b.add_argument("--repeats", type=int, default=1, help="runs per variant; the median is reported")
    b.add_argument("--converge", action="store_true", help="judge convergence parity (val loss within 1%%, acc 0.3 pt)")
    b.add_argument("--compare", default="", help="comma list of accelerate,fabric: same workload through them")
    pr = sub.add_parser("profile", help="where a step's time goes: breakdown, verdict, fixes")
    pr.add_argument("config", nargs="?", default=None, help="preset name or .toml path")
    pr.add_argument("overrides", nargs="*", metavar="KEY=VALUE")
    pr.add_argument("--active", type=int, default=5, help="profiled steps (default 5)")
    e = sub.add_parser("env", help="device, versions, peak FLOP/s and recommended settings")
    e.add_argument("--json", action="store_true")
    d = sub.add_parser("data", help="list or fetch datasets")
    dsub = d.add_subparsers(dest="data_command", required=True, metavar="ACTION")
    dsub.add_parser("list", help="datasets and whether they are cached")
    f = dsub.add_parser("fetch", help="fetch and prepare a dataset into the cache")
    f.add_argument("name")
    sub.add_parser("presets", help="list the built-in presets")
    return p


def _split_config(config: str | None, overrides: list[str]) -> tuple[str | None, list[str]]:
    """`turbotrain train train.steps=3` — an override in the config slot means "default preset"."""
    if config is not None and "=" in config:
        return None, [config, *overrides]
    return config, overrides


def run(args: argparse.Namespace) -> int:
    if args.command == "train":
        from turbotrain.config import load_config
        from turbotrain.trainer import train

        config, overrides = _split_config(args.config, args.overrides)
        train(load_config(config, overrides))
    elif args.command == "scale":
        from turbotrain.scale import run_scale

        config, overrides = _split_config(args.config, args.overrides)
        try:
            gpus = [int(x) for x in args.gpus.split(",") if x.strip()]
        except ValueError:
            raise UserError(f"--gpus {args.gpus!r}: expected comma-separated integers, e.g. 1,2,4") from None
        strategies = [x.strip() for x in args.strategies.split(",") if x.strip()]
        bad = [x for x in strategies if x not in ("ddp", "fsdp")]
        if not gpus or min(gpus) < 1 or bad:
            raise UserError("--gpus needs positive integers and --strategies only ddp,fsdp")
        if args.repeats < 1:
            raise UserError("--repeats must be >= 1")
        run_scale(config, overrides, gpus, strategies, args.repeats)
    elif args.command == "bench":
        from turbotrain.bench import run_bench

        config, overrides = _split_config(args.config, args.overrides)
        if args.repeats < 1:
            raise UserError("--repeats must be >= 1")
        variants = [v.strip() for v in args.variants.split(",") if v.strip()] if args.variants else None
        compare = [c.strip() for c in args.compare.split(",") if c.strip()]
        run_bench(config, overrides, variants, args.repeats, args.converge, compare)
    elif args.command == "profile":
        from turbotrain.config import load_config
        from turbotrain.profile import run_profile

        config, overrides = _split_config(args.config, args.overrides)
        if args.active < 1:
            raise UserError("--active must be >= 1")
        run_profile(load_config(config, overrides), active=args.active)
    elif args.command == "env":
        from turbotrain.env import describe_env, format_env

        info = describe_env()
        print(json.dumps(info, indent=2) if args.json else format_env(info))
    elif args.command == "data":
        from turbotrain.data.fetch import fetch, list_datasets

        if args.data_command == "list":
            for row in list_datasets():
                print(f"{row['name']:<14} {'cached' if row['cached'] else 'not fetched':<12} {row['source']:<36} {row['about']}")
        else:
            print(fetch(args.name))
    elif args.command == "presets":
        from turbotrain.config import list_presets

        print("\n".join(list_presets()))
    return 0


def _parse(argv: list[str] | None) -> argparse.Namespace:
    """Flags may sit anywhere: `bench gpt2-124m --converge train.steps=50` keeps train.steps=50 an override."""
    parser = _parser()
    args, extra = parser.parse_known_args(argv)
    stray = [a for a in extra if a.startswith("-") or "=" not in a or not hasattr(args, "overrides")]
    if stray:
        parser.error(f"unrecognized arguments: {' '.join(stray)}")
    if extra:
        args.overrides = [*args.overrides, *extra]
    return args


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    rc = _run_reporting_errors(args)
    if argv is None and "LOCAL_RANK" in os.environ:
        # A torchrun worker, its files saved and closed, leaves without interpreter teardown. Once FSDP2 is
        # imported, gloo's threads outlive destroy_process_group (torch keeps the group in C++) and are torn
        # down at interpreter exit, where a thread that asks for the GIL is ended: a finished 2-rank CPU
        # FSDP2 run aborted there once ("terminate called without an active exception", exit -6 after
        # "done"). Skipping the teardown takes that path away.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(rc)
    return rc


def _run_reporting_errors(args: argparse.Namespace) -> int:
    try:
        return run(args)
    except SystemExit as e:  # SIGTERM/SIGINT after the checkpoint: 128 + signal number
        return e.code if isinstance(e.code, int) else int(e.code is not None)
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        return 130
    except Exception as e:  # CUDA out of memory is the user's to fix: say how
        import torch

        if isinstance(e, torch.OutOfMemoryError):
            peak = torch.cuda.max_memory_allocated() / 2**30 if torch.cuda.is_available() else 0
            print(f"error: out of memory (peak {peak:.1f} GiB allocated); lower data.batch_size and raise "
                  f"train.grad_accum, set memory.activation_checkpointing=\"full\", or precision.dtype=bf16",
                  file=sys.stderr)
            return 2
        raise
