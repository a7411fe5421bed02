"""Command line: `turbotrain train|bench|profile|scale|config|env|data ...`. User errors (bad config, bad
usage) end with one `error:` line on stderr and exit 2; out of memory, GPU or host, is a user error too."""
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


class _ArgError(Exception):
    """An argparse error, raised instead of argparse's usage + exit so that main prints one `error:` line."""

    def __init__(self, prog: str, message: str) -> None:
        super().__init__(message)
        self.prog, self.message = prog, message


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # type: ignore[override]
        raise _ArgError(self.prog, message)


CONFIG_HELP = "preset name or .toml path (default: gpt-shakespeare)"


def _version() -> str:
    from importlib import metadata

    import torch

    import turbotrain

    try:
        ours = metadata.version("turbotrain")
    except metadata.PackageNotFoundError:
        ours = turbotrain.__version__
    return f"turbotrain {ours} (torch {torch.__version__}, Python {sys.version.split()[0]})"


def _config_epilog(full: bool) -> str:
    from turbotrain.config import config_summary

    keys = f"config sections and keys (set any as KEY=VALUE, e.g. train.steps=30):\n{config_summary()}\n\n" \
        if full else "config keys: turbotrain train --help; "
    return keys + "`turbotrain config --reference` prints every key with its type, default and meaning;\n" \
        "`turbotrain config CONFIG [KEY=VALUE ...]` prints the effective TOML a run would use."


def _parser() -> argparse.ArgumentParser:
    p = _Parser(prog="turbotrain", description="PyTorch training acceleration, measured honestly.",
                epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--version", action="version", version=_version())
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def with_config(name: str, help: str, full_epilog: bool = False) -> argparse.ArgumentParser:
        sp = sub.add_parser(name, help=help, description=help, epilog=_config_epilog(full_epilog),
                            formatter_class=argparse.RawDescriptionHelpFormatter)
        sp.add_argument("config", nargs="?", default=None, metavar="CONFIG", help=CONFIG_HELP)
        sp.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="dotted overrides, e.g. train.steps=30")
        return sp

    with_config("train", "train a preset or a .toml config", full_epilog=True)
    sc = with_config("scale", "throughput and efficiency at each world size, through torchrun")
    sc.add_argument("--gpus", required=True, help="world sizes, e.g. 1,2,4,8 (CPU processes without a GPU)")
    sc.add_argument("--strategies", default="ddp", help="comma list of ddp,fsdp (default ddp)")
    sc.add_argument("--repeats", type=int, default=1, help="runs per row; the median is reported with the spread")
    b = with_config("bench", "what each technique buys: speed, memory, loss reached")
    b.add_argument("--variants", default=None, help="comma list (default: sensible per device): baseline,tf32,"
                   "bf16,fp16,compile,accum,channels_last,convnet,act_ckpt,fused_opt,triton_opt,fused_loss,"
                   "packed_attn,gelu_epilogue,weight_copies,workers,all")
    b.add_argument("--repeats", type=int, default=1, help="runs per variant; the median is reported")
    b.add_argument("--converge", action="store_true", help="judge convergence parity (val loss within 1%%, acc 0.3 pt)")
    b.add_argument("--compare", default=None, help="comma list of accelerate,fabric: same workload through them")
    tu = with_config("tune", "the fastest configuration that fits, for this model: short measured trials")
    tu.add_argument("--budget-min", type=float, default=10.0, help="wall-clock budget in minutes, trials included "
                    "(default 10)")
    tu.add_argument("--repeats", type=int, default=2, help="re-runs of each finalist; compared by median (default 2)")
    tu.add_argument("--converge", action="store_true", help="re-check the winner's val loss against the input "
                    "config's on real data (bench's parity rule)")
    tu.add_argument("--nproc", type=int, default=1, help="processes per trial, launched through torchrun (default 1)")
    tu.add_argument("--allow-fp16", action="store_true", help="also try fp16 + loss scaling where bf16 exists")
    tu.add_argument("--allow-fp8", action="store_true", help="also try FP8 matmuls (changes numerics; sm89+ GPU, "
                    "torchao; --converge allows them too and re-checks the loss)")
    pr = with_config("profile", "where a step's time goes: breakdown, verdict, fixes")
    pr.add_argument("--active", type=int, default=5, help="profiled steps (default 5)")
    c = with_config("config", "print the effective TOML of a config (auto values resolved), or the key reference")
    c.add_argument("--reference", action="store_true", help="print the reference of every section and key (markdown)")
    e = _plain(sub, "env", "device, versions, peak FLOP/s and recommended settings")
    e.add_argument("--json", action="store_true", help="print it as one JSON object")
    d = _plain(sub, "data", "list or fetch datasets")
    dsub = d.add_subparsers(dest="data_command", required=True, metavar="ACTION")
    _plain(dsub, "list", "datasets and whether they are cached")
    f = _plain(dsub, "fetch", "fetch and prepare a dataset into the cache")
    f.add_argument("name", help="a dataset of `turbotrain data list`, e.g. shakespeare")
    _plain(sub, "presets", "list the built-in presets")
    _run_dir_commands(sub)
    return p


def _plain(parent, name: str, help: str) -> argparse.ArgumentParser:
    """A command whose own --help says what it does (argparse shows `help` only in the parent's list)."""
    return parent.add_parser(name, help=help, description=help)


def _run_dir_commands(sub) -> None:
    run_dir = "a run's folder, e.g. runs/gpt-shakespeare"
    rp = _plain(sub, "report", "PNG + markdown report of a run (report.png, report.md in RUN_DIR)")
    rp.add_argument("run_dir", metavar="RUN_DIR", help=run_dir)
    w = _plain(sub, "watch", "live terminal view of a running or finished run")
    w.add_argument("run_dir", metavar="RUN_DIR", help=run_dir)
    w.add_argument("--once", action="store_true", help="print one frame and exit")
    w.add_argument("--interval", type=float, default=2.0, help="seconds between frames (default 2)")
    x = _plain(sub, "export", "a run's trained model as safetensors or an HF directory")
    x.add_argument("run_dir", metavar="RUN_DIR", help=run_dir)
    x.add_argument("--format", required=True, choices=("safetensors", "hf"), dest="fmt",
                   help="safetensors: any model; hf: a model built from Hugging Face (model.name = \"hf:...\")")
    x.add_argument("--out", default=None, metavar="DIR", help="default: RUN_DIR/export/FORMAT")


def _commands(parser: argparse.ArgumentParser) -> list[str]:
    return next((list(a.choices) for a in parser._actions if isinstance(a, argparse._SubParsersAction)), [])


def _arg_error_line(parser: argparse.ArgumentParser, e: _ArgError) -> str:
    """argparse's complaint as one line that names the problem and points to the right --help."""
    import re

    msg = e.message
    if e.prog == parser.prog:  # the top level: no command, or an unknown one
        commands = _commands(parser)
        choice = re.search(r"invalid choice: '?([^' ]*)'?", msg)
        if choice:
            from turbotrain.config import did_you_mean

            hint = did_you_mean(choice.group(1), commands)
            return f"unknown command {choice.group(1)!r}{hint}; commands: {', '.join(commands)}; see turbotrain --help"
        if "required" in msg and "COMMAND" in msg:
            return f"no command given; commands: {', '.join(commands)}; see turbotrain --help"
    msg = re.sub(r"^argument ([^:]+): ", r"\1: ", msg)
    return f"{' '.join(msg.split())}; see {e.prog} --help"


def _user_code_on_path(config: str | None) -> None:
    """The console script, unlike `python -m`, has not the current directory on sys.path: put the folders of the
    config file and of the files it extends, then the current directory, first, for `pkg.module:name` objects in
    the config, and export them on PYTHONPATH for the processes bench and scale start."""
    from turbotrain.config import chain_folders

    dirs = [str(folder) for folder in chain_folders(config)] if config else []  # each file's code beside it
    dirs.append(os.getcwd())
    dirs = list(dict.fromkeys(dirs))
    sys.path[:] = dirs + [p for p in sys.path if p not in dirs]
    old = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and p not in dirs]
    os.environ["PYTHONPATH"] = os.pathsep.join(dirs + old)


def _is_path(arg: str) -> bool:
    """A CONFIG holding `=` that is a file all the same (a=b.toml): an existing one, or a path (a separator before
    the `=`, where an override's key has none unless quoted, as in model.args."a/b"=1)."""
    key = arg.split("=")[0]
    return os.path.isfile(os.path.expanduser(arg)) or \
        (not any(q in key for q in "\"'") and any(sep in key for sep in "/\\"))


def _split_config(config: str | None, overrides: list[str]) -> tuple[str | None, list[str]]:
    """`turbotrain train train.steps=3` — an override in the config slot means "default preset"."""
    if config is not None and not config.strip():  # `train ""` or `train "$UNSET"`: never the default silently
        raise UserError("CONFIG is an empty string; name a preset or a .toml file (or leave it out for "
                        "the default preset gpt-shakespeare)")
    if config is not None and "=" in config and not _is_path(config):
        return None, [config, *overrides]
    return config, overrides


# Presets sized for a GPU. On a CPU gpt2-124m compiles for minutes before its first step, then takes tens of
# seconds a step: with nothing said, a first-time user reads that as a hang.
GPU_PRESETS = ("gpt2-124m", "llama-1b", "llama-8b", "resnet50-synthetic")


def _say_if_gpu_preset_on_cpu(config: str | None) -> None:
    import torch

    from turbotrain.log import say

    if config in GPU_PRESETS and not torch.cuda.is_available():
        say(f"warning: {config} is sized for a GPU and this machine has none: its first step alone can take "
            "minutes here; on a CPU try gpt-shakespeare or mlp-seed, or shrink it (model.args, data.batch_size)")


def _train(args: argparse.Namespace) -> None:
    from turbotrain.config import load_config
    from turbotrain.trainer import train

    cfg = load_config(args.config, args.overrides)
    _say_if_gpu_preset_on_cpu(args.config)
    train(cfg)


def _check_processes(n: int, flag: str) -> None:
    """A world size this host can start: at most its GPUs or CPU cores, whichever is more (a process each); a
    typo such as --gpus 44 would otherwise spawn that many training processes."""
    import torch

    have = max(torch.cuda.device_count() if torch.cuda.is_available() else 0, os.cpu_count() or 1)
    if n > have:
        raise UserError(f"{flag} asks for {n} processes; this host has {have} GPUs or CPU cores: give at most {have}")


def _scale(args: argparse.Namespace) -> None:
    from turbotrain.scale import check_args, run_scale

    try:
        gpus = [int(x) for x in args.gpus.split(",") if x.strip()]
    except ValueError:
        raise UserError(f"--gpus {args.gpus!r}: expected comma-separated integers, e.g. 1,2,4") from None
    strategies = [x.strip() for x in args.strategies.split(",") if x.strip()]
    check_args(gpus, strategies, args.repeats)
    _check_processes(max(gpus), "--gpus")
    run_scale(args.config, args.overrides, gpus, strategies, args.repeats)


def _bench(args: argparse.Namespace) -> None:
    from turbotrain.bench import run_bench

    if args.repeats < 1:
        raise UserError("--repeats must be >= 1")
    variants = [v.strip() for v in args.variants.split(",") if v.strip()] if args.variants is not None else None
    if variants == []:  # `--variants ""` (an unset shell variable, say) is not a request for the default set
        raise UserError("--variants names no variant; give a comma list, e.g. --variants baseline,compile, or leave "
                        "it out for the default set")
    compare = [c.strip() for c in args.compare.split(",") if c.strip()] if args.compare is not None else []
    if args.compare is not None and not compare:
        raise UserError("--compare names no framework; give a comma list, e.g. --compare accelerate,fabric, or "
                        "leave it out")
    run_bench(args.config, args.overrides, variants, args.repeats, args.converge, compare)


def _tune(args: argparse.Namespace) -> None:
    from turbotrain.tune import check_args, process_start, run_tune

    check_args(args.budget_min, args.repeats, args.nproc)
    _check_processes(args.nproc, "--nproc")
    since = process_start() if getattr(args, "whole_process", False) else None
    run_tune(args.config, args.overrides, args.budget_min, args.repeats, args.converge, args.nproc, args.allow_fp16,
             since, args.allow_fp8)


def _profile(args: argparse.Namespace) -> None:
    from turbotrain.config import load_config
    from turbotrain.profile import run_profile

    if args.active < 1:
        raise UserError("--active must be >= 1")
    cfg = load_config(args.config, args.overrides)
    _say_if_gpu_preset_on_cpu(args.config)
    run_profile(cfg, active=args.active)


def _config(args: argparse.Namespace) -> None:
    import contextlib

    from turbotrain.config import config_reference, load_config, to_toml

    if args.reference:
        if args.config or args.overrides:
            raise UserError("config --reference takes no CONFIG or KEY=VALUE; see turbotrain config --help")
        print(config_reference())
        return
    from turbotrain.resolve import effective_config

    with contextlib.redirect_stdout(sys.stderr):  # stdout holds the TOML alone: `> my.toml` works
        cfg = effective_config(load_config(args.config, args.overrides))
    print(_spellable_toml(to_toml(cfg)), end="")


def _spellable_toml(text: str) -> str:
    """`text` as this stdout can write it: where its encoding lacks a character (PYTHONIOENCODING=ascii), TOML's
    own \\u escape, which reads back the same inside the basic strings to_toml writes every key and value as; the
    stream's backslashreplace would write "é" as \\xe9, which TOML refuses."""
    try:
        text.encode(getattr(sys.stdout, "encoding", None) or "utf-8")
        return text
    except UnicodeEncodeError:
        return "".join(c if c.isascii() else f"\\u{ord(c):04x}" if ord(c) <= 0xFFFF else f"\\U{ord(c):08x}"
                       for c in text)


def _env(args: argparse.Namespace) -> None:
    from turbotrain.env import describe_env, format_env

    info = describe_env()
    print(json.dumps(info, indent=2) if args.json else format_env(info))


def _data(args: argparse.Namespace) -> None:
    from turbotrain.data.fetch import fetch, list_datasets

    if args.data_command == "list":
        for row in list_datasets():
            print(f"{row['name']:<14} {'cached' if row['cached'] else 'not fetched':<12} "
                  f"{row['source']:<36} {row['about']}")
    else:
        print(fetch(args.name))


def _report(args: argparse.Namespace) -> None:
    from turbotrain.report import write_report

    png, md = write_report(args.run_dir)
    print(f"{png}\n{md}")


def _watch(args: argparse.Namespace) -> None:
    from turbotrain.watch import watch

    if not 0 < args.interval <= 86400:  # nan and inf too: time.sleep(inf) overflows
        raise UserError(f"--interval {args.interval}: must be > 0 and at most 86400 seconds")
    watch(args.run_dir, once=args.once, interval_s=args.interval)


def _presets(args: argparse.Namespace) -> None:
    from turbotrain.config import list_presets

    print("\n".join(list_presets()))


def _export(args: argparse.Namespace) -> None:
    from turbotrain.export import export

    _user_code_on_path(None)  # a pkg.module:factory model is rebuilt from the run's config
    print(export(args.run_dir, args.fmt, args.out))


COMMANDS = {"train": _train, "scale": _scale, "bench": _bench, "profile": _profile, "config": _config, "env": _env,
            "data": _data, "presets": _presets, "tune": _tune,
            "export": _export, "report": _report, "watch": _watch}


def run(args: argparse.Namespace) -> int:
    if hasattr(args, "config"):
        args.config, args.overrides = _split_config(args.config, args.overrides)
        _user_code_on_path(args.config)
    COMMANDS[args.command](args)
    return 0


def _parse(argv: list[str] | None) -> argparse.Namespace:
    """Flags may sit anywhere: `bench gpt2-124m --converge train.steps=50` keeps train.steps=50 an override."""
    parser = _parser()
    try:
        args, extra = parser.parse_known_args(argv)
        stray = [a for a in extra if a.startswith("-") or "=" not in a or not hasattr(args, "overrides")]
        if stray:
            prog = f"turbotrain {args.command}" + (
                f" {args.data_command}" if getattr(args, "data_command", None) else "")
            what = "option" if stray[0].startswith("-") else "argument"
            why = "" if what == "option" or not hasattr(args, "overrides") else " (overrides are SECTION.KEY=VALUE)"
            raise _ArgError(prog, f"unrecognized {what} {stray[0]!r}{why}")
    except _ArgError as e:  # one line, as for every user error; main returns the code
        raise SystemExit(_error(_arg_error_line(parser, e))) from None
    if extra:
        args.overrides = [*args.overrides, *extra]
    return args


def main(argv: list[str] | None = None) -> int:
    if (problem := _environment_problem(argv is None)) is not None:
        return _error(problem)
    if argv is None:
        _import_torch_or_exit()
    try:
        try:
            args = _parse(argv)
        except SystemExit as e:  # --help, --version (0) and usage errors (2, their line printed)
            return e.code if isinstance(e.code, int) else int(e.code is not None)
        args.whole_process = argv is None  # the command is this process (tune's budget then counts its imports)
        rc = _run_reporting_errors(args)
    except KeyboardInterrupt:  # Ctrl-C before the run's own handling took over (while torch is imported, say)
        return _interrupted()
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


def _error(text: str) -> int:
    """`error: text` on stderr; the user-error exit code. A stderr that cannot take the line (its disk full, its
    reader gone, `2>/dev/full`) leaves the exit code 2, not 1 and a second failure: the rest of stderr goes to
    the null device, so the interpreter's last flush does not fail again either (that would make it 120). Under
    torchrun the same line from every rank is said once (distributed.env.first_to_say)."""
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True":  # a torchrun worker (imports torch: not before)
        from turbotrain.distributed.env import first_to_say

        if not first_to_say(f"error: {text}"):
            return 2
    try:
        print(f"error: {text}", file=sys.stderr, flush=True)
    except (OSError, ValueError, AttributeError):  # ValueError: closed; AttributeError: None (fd 2 closed)
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stderr.fileno())
            os.close(devnull)
        except (OSError, ValueError, AttributeError):
            sys.stderr = open(os.devnull, "w")
    return 2


def _environment_problem(whole_process: bool) -> str | None:
    """The process's surroundings, checked before torch's import: a current folder deleted under the shell makes
    that import die in MKL with a cryptic FATAL ERROR. Standard descriptors the shell closed (`2>&-`) are pointed
    at the null device, or the run's first open file would take their number and anything written to "stderr"
    (a C++ warning, a DataLoader worker) would land in its checkpoint or metrics. A stdout that cannot spell
    every character (PYTHONIOENCODING=ascii) shows escapes instead of failing the run at its first `→`."""
    try:
        os.getcwd()
    except FileNotFoundError:
        return ("the current folder no longer exists (deleted or moved while this shell was in it); cd to a folder "
                "that exists and rerun")
    for fd in (0, 1, 2) if whole_process else ():
        try:
            os.fstat(fd)
        except OSError:
            null = os.open(os.devnull, os.O_RDWR)
            if null != fd:
                os.dup2(null, fd)
                os.close(null)
    if getattr(sys.stdout, "errors", None) == "strict" and hasattr(sys.stdout, "reconfigure"):
        sys.stdout.reconfigure(errors="backslashreplace")
    return None


def _interrupted() -> int:
    """A Ctrl-C handled: one line, exit 130. A KeyboardInterrupt that left code run by exec() (dataclasses build
    their methods so, at import) marks itself unhandled inside CPython, which then ends the process by SIGINT at
    exit all the same (-2, not 130); CPython clears that mark at the start of every exec() of a string."""
    _error("interrupted")
    exec("")
    return 130


def _import_torch_or_exit() -> None:
    """torch's import (seconds) under a Ctrl-C that ends the process with one line: raised as KeyboardInterrupt
    there, it can be swallowed by the libraries being imported (the run would then train on, the Ctrl-C lost)
    or leave one half-imported. Nothing is written before it, so there is nothing to save."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        import torch  # noqa: F401
        return

    def interrupted(signum, frame):
        _error("interrupted")
        os._exit(130)

    before = signal.signal(signal.SIGINT, interrupted)
    try:
        import torch  # noqa: F401
    finally:
        signal.signal(signal.SIGINT, before)


def _one_line(e: BaseException) -> str:
    return " ".join(str(e).split()) or type(e).__name__


def _cpu_oom(e: BaseException) -> str | None:
    """The host allocation that failed, or None when `e` is not a host out-of-memory."""
    import re

    if isinstance(e, MemoryError):
        return _one_line(e) if str(e) else "MemoryError"
    if isinstance(e, RuntimeError) and "can't allocate memory" in str(e) and "CPUAllocator" in str(e):
        size = re.search(r"allocate (\d+) bytes", str(e))
        return f"tried to allocate {int(size.group(1)) / 2**30:.1f} GiB" if size else "DefaultCPUAllocator"
    return None


def _run_reporting_errors(args: argparse.Namespace) -> int:
    try:
        if sys.stdout is None and args.command in ("config", "env", "presets", "data"):  # their product is stdout
            raise UserError(f"stdout is closed, so `turbotrain {args.command}` has nowhere to print; run it with "
                            "stdout open (a terminal, a file or a pipe)")
        if sys.stdout is None:  # the others' product is the run directory: they run on, their messages unheard
            sys.stdout = open(os.devnull, "w")
        rc = run(args)
        if sys.stdout is not None:
            sys.stdout.flush()  # a full disk or a gone reader is said here, not at interpreter exit
        return rc
    except SystemExit as e:  # SIGTERM/SIGINT after the checkpoint: 128 + signal number; or the user's sys.exit
        from turbotrain.plugins import users_exit

        if (line := users_exit(e, args.command)) is not None:
            return _error(line)
        return e.code if isinstance(e.code, int) else int(e.code is not None)
    except UserError as e:
        return _error(_one_line(e))
    except KeyboardInterrupt:
        return _interrupted()
    except OSError as e:  # stdout's reader gone, or its disk full: said, not a traceback
        if (limit := _os_limit(e)) is not None:
            return _said_limit(limit, e)
        if not _write_failed(e):
            return _users_error(e)
        why = ("cannot write to stdout (its reader exited); send the output to a pipe that reads it all, or a file"
               if isinstance(e, BrokenPipeError) else f"a write failed ({e.strerror}); free space on the disk that "
               "stdout or the run's files go to, or send stdout elsewhere")
        return _error(why)
    except Exception as e:  # out of memory (GPU or host) is the user's to fix: say how
        import torch

        fixes = ("lower data.batch_size and raise train.grad_accum, set memory.activation_checkpointing=\"full\", "
                 "or precision.dtype=bf16")
        if isinstance(e, torch.OutOfMemoryError):
            peak = torch.cuda.max_memory_allocated() / 2**30 if torch.cuda.is_available() else 0
            return _error(f"out of memory (peak {peak:.1f} GiB allocated); {fixes}")
        if (limit := _os_limit(e)) is not None:
            return _said_limit(limit, e)
        host = _cpu_oom(e)
        if host is not None:
            return _error(f"out of memory on the host ({host}); {fixes}, or use a smaller model")
        return _users_error(e)


def _os_limit(e: BaseException) -> str | None:
    """A limit of this host or session that stopped the run (open files, memory for a new process), said with
    its fix; None for anything else. torch's DataLoader says the descriptor limit in a RuntimeError."""
    import errno
    import resource

    if (isinstance(e, OSError) and e.errno in (errno.EMFILE, errno.ENFILE)) or \
            (isinstance(e, RuntimeError) and "Too many open files" in str(e)):
        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        return (f"too many open files (this session allows {soft}, `ulimit -n`); raise it (ulimit -n 4096) or "
                "lower data.num_workers")
    if isinstance(e, OSError) and e.errno == errno.ENOMEM and e.filename is None:  # fork, mmap
        return f"out of memory on the host ({e.strerror}); lower data.num_workers or data.batch_size, or free memory"
    return None


def _said_limit(limit: str, e: BaseException) -> int:
    """One line for a host limit, and nothing after it: what the limit left half-built (a DataLoader iterator
    whose workers could not start) is collected here, quietly, not at exit where its __del__ would print a
    traceback under the error line."""
    import gc

    _error(limit)
    hook, sys.unraisablehook = sys.unraisablehook, lambda unraisable: None
    try:
        e.__traceback__ = None
        gc.collect()
    finally:
        sys.unraisablehook = hook
    return 2


def _write_failed(e: OSError) -> bool:
    """Whether `e` is a write that found its reader gone or its disk full (ENOSPC, EDQUOT), with no file named
    (stdout, /dev/full): then stdout is pointed at the null device, so the interpreter's last flush does not fail
    a second time."""
    import errno

    from turbotrain.log import stdout_to_devnull

    if not isinstance(e, BrokenPipeError) and (e.errno not in (errno.ENOSPC, errno.EDQUOT) or e.filename):
        return False
    stdout_to_devnull()
    return True


def _users_error(e: Exception) -> int:
    """An exception raised in the user's own code (model, dataset, loss, callback...) at any step, not only the
    first ones the contract checks: one line naming it and where (TURBOTRAIN_TRACEBACK=1 shows the traceback).
    Raised in turbotrain or torch alone, it is ours: the traceback goes to the bug report."""
    from turbotrain.plugins import where

    spot = where(e)
    if not spot or os.environ.get("TURBOTRAIN_TRACEBACK") == "1":
        raise e
    return _error(f"your code raised {type(e).__name__}: {_one_line(e)[:300]}{spot}; fix it there (rerun with "
                  "TURBOTRAIN_TRACEBACK=1 for the traceback)")
