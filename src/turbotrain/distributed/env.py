"""The process group: read the launcher's environment (torchrun, or SLURM's `srun` without torchrun), pick
NCCL (GPU) or gloo (CPU), bind the device.

torchrun is the launcher (single- and multi-node, --max-restarts); nothing here spawns processes. Tasks started
by `srun` alone are mapped onto torchrun's variables (as Lightning does), so they form one world instead of N
independent runs; torchrun's own variables win wherever both are set.
"""
from __future__ import annotations

import dataclasses
import hashlib
import os
import re
import socket
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

from turbotrain.errors import UserError

SRUN_TORCHRUN = ("srun --ntasks-per-node=1 torchrun --nnodes=$SLURM_NNODES --nproc_per_node=GPUS_PER_NODE "
                 "--rdzv_backend=c10d --rdzv_endpoint=$(scontrol show hostnames $SLURM_NODELIST | head -n1):29500 "
                 "-m turbotrain train ... (docs/slurm.md)")


@dataclass(frozen=True)
class DistEnv:
    rank: int = 0
    local_rank: int = 0
    world_size: int = 1
    local_world_size: int = 1
    launcher: str = "none"  # "torchrun" (or any launcher that sets RANK/WORLD_SIZE) | "slurm" | "none"

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @staticmethod
    def from_environ() -> "DistEnv":
        """This process's place in the world. Under `srun` without torchrun, SLURM's layout is also exported as
        torchrun's variables (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT), so the
        process group and rank-0 logging see one launcher."""
        e = os.environ
        if "RANK" in e or "WORLD_SIZE" in e:
            world = _env_int("WORLD_SIZE", 1, 1)
            env = DistEnv(_env_int("RANK", 0, 0, world - 1), _env_int("LOCAL_RANK", 0, 0),
                          world, _env_int("LOCAL_WORLD_SIZE", world, 1, world), "torchrun")
            if env.local_rank >= env.local_world_size:
                raise UserError(f"environment: LOCAL_RANK={env.local_rank} but LOCAL_WORLD_SIZE="
                                f"{env.local_world_size}; {_LAUNCH}")
            return env
        exports = slurm_exports(e)
        if not exports:
            return DistEnv()
        for k, v in exports.items():
            os.environ.setdefault(k, v)  # a MASTER_ADDR / MASTER_PORT the user exported wins
        return DistEnv(int(exports["RANK"]), int(exports["LOCAL_RANK"]), int(exports["WORLD_SIZE"]),
                       int(exports["LOCAL_WORLD_SIZE"]), "slurm")


_LAUNCH = ("these are torchrun's variables: launch with torchrun --nproc_per_node=N -m turbotrain train ..., or "
           "unset RANK, WORLD_SIZE, LOCAL_RANK and LOCAL_WORLD_SIZE for one process")


def _env_int(key: str, default: int, lo: int, hi: int | None = None) -> int:
    """An integer launcher variable in [lo, hi]: a typo there (RANK=abc, WORLD_SIZE=0, RANK past the world) is
    one error here, not a traceback deep in the run or a rank that trains and silently writes nothing."""
    text = os.environ.get(key)
    if text is None:
        return default
    try:
        value = int(text)
    except ValueError:
        raise UserError(f"environment: {key}={text!r} is not an integer; {_LAUNCH}") from None
    if value < lo or (hi is not None and value > hi):
        bound = f"{lo} .. {hi}" if hi is not None else f">= {lo}"
        raise UserError(f"environment: {key}={value} is out of range ({bound}); {_LAUNCH}")
    return value


# ---------------------------------------------------------------- SLURM (srun without torchrun)

def expand_hostlist(hostlist: str) -> list[str]:
    """SLURM's compressed host list, expanded: "node[01-03,07],gpu5" → node01 node02 node03 node07 gpu5.
    Usage: `expand_hostlist(os.environ["SLURM_NODELIST"])[0]` is the head node."""
    hosts, token, depth = [], "", 0
    for c in hostlist + ",":
        depth += c == "["
        depth -= c == "]"
        if c == "," and depth == 0:
            if token:
                hosts.extend(_expand_host(token))
            token = ""
        else:
            token += c
    if depth:
        raise ValueError(f"unbalanced brackets in host list {hostlist!r}")
    return hosts


def _expand_host(token: str) -> list[str]:
    m = re.match(r"^([^\[]*)\[([^\]]+)\](.*)$", token)
    if not m:
        return [token]
    prefix, ranges, rest = m.groups()
    out = []
    for part in ranges.split(","):
        lo, _, hi = part.partition("-")
        if not lo.isdigit() or (hi and not hi.isdigit()):
            raise ValueError(f"bad range {part!r} in host list entry {token!r}")
        for n in range(int(lo), int(hi or lo) + 1):
            out.extend(f"{prefix}{n:0{len(lo)}d}{tail}" for tail in _expand_host(rest))
    return out


def expand_tasks_per_node(spec: str) -> list[int]:
    """SLURM_TASKS_PER_NODE's compressed form, one count per node: "2(x3),1" → [2, 2, 2, 1]."""
    counts = []
    for part in spec.split(","):
        m = re.fullmatch(r"(\d+)(?:\(x(\d+)\))?", part.strip())
        if not m:
            raise ValueError(f"bad tasks-per-node entry {part!r} in {spec!r}")
        counts.extend([int(m.group(1))] * int(m.group(2) or 1))
    return counts


def slurm_port(job_id: str) -> int:
    """MASTER_PORT from the job id (Lightning's rule): 15000 + its last 4 digits, the same on every task."""
    digits = "".join(c for c in job_id if c.isdigit())
    return 15000 + int(digits[-4:] or 0)


def srun_tasks(e: Mapping[str, str]) -> int:
    """How many tasks this process's srun step has; 1 outside a step. A batch script (no SLURM_STEP_ID) or an
    interactive shell step runs one process whatever the allocation holds: world size 1."""
    if "SLURM_PROCID" not in e or "SLURM_JOB_ID" not in e:
        return 1
    if "SLURM_STEP_ID" not in e and "SLURM_STEPID" not in e:
        return 1  # the batch step: `python -m turbotrain` in an sbatch script without srun
    if e.get("SLURM_JOB_NAME") in ("bash", "interactive"):
        return 1  # `srun --pty bash`, then python by hand (Lightning's rule too)
    key = "SLURM_STEP_NUM_TASKS" if e.get("SLURM_STEP_NUM_TASKS") else "SLURM_NTASKS"
    text = e.get(key) or "1"
    if not text.strip().isdigit() or int(text) < 1:
        raise UserError(f"environment: {key}={text!r} is not an integer >= 1; srun sets it: {SRUN_TORCHRUN}")
    return int(text)


def slurm_exports(e: Mapping[str, str]) -> dict[str, str]:
    """torchrun's variables for a task of a multi-task srun step ({} when this is not one). Refuses, with the
    srun … torchrun recipe, a step whose layout cannot be read."""
    world = srun_tasks(e)
    if world <= 1:
        return {}
    nodelist = e.get("SLURM_STEP_NODELIST") or e.get("SLURM_NODELIST") or e.get("SLURM_JOB_NODELIST", "")
    per_node = e.get("SLURM_STEP_TASKS_PER_NODE") or e.get("SLURM_TASKS_PER_NODE") or e.get("SLURM_NTASKS_PER_NODE", "")
    try:
        head = expand_hostlist(nodelist)[0]
        counts = expand_tasks_per_node(per_node)
        local_world = counts[min(int(e.get("SLURM_NODEID", 0)), len(counts) - 1)]
        rank, local_rank = int(e["SLURM_PROCID"]), int(e.get("SLURM_LOCALID", 0))
    except (ValueError, IndexError, KeyError) as err:
        raise UserError(f"srun started {world} tasks but their layout is unreadable ({err}); launch torchrun "
                        f"once per node instead: {SRUN_TORCHRUN}") from None
    return {"RANK": str(rank), "WORLD_SIZE": str(world), "LOCAL_RANK": str(local_rank),
            "LOCAL_WORLD_SIZE": str(local_world), "MASTER_ADDR": head,
            "MASTER_PORT": str(slurm_port(e["SLURM_JOB_ID"]))}


# ---------------------------------------------------------------- one error line a job

SAID_TIMEOUT_S = 3  # the launcher's store (on its node 0) answers at once; a gone one is retried this long


def first_to_say(line: str) -> bool:
    """Whether this process prints `line` (an error line): under torchrun every rank usually fails the same way
    (a bad config value, a missing file), and N identical lines bury the one that matters. The first rank to
    register the exact text in torchrun's own store says it; a text that differs (a rank-specific error) is
    said by its rank. True outside torchrun, without the launcher's shared store (TORCH_DISABLE_SHARE_RDZV_TCP_STORE
    or SLURM's srun: no store outlives the process group there) and whenever the store cannot be asked:
    a line said twice beats a line lost."""
    e = os.environ
    if e.get("TORCHELASTIC_USE_AGENT_STORE") != "True" or e.get("WORLD_SIZE", "1").strip() in ("0", "1"):
        return True
    host, port = e.get("MASTER_ADDR", ""), e.get("MASTER_PORT", "").strip()
    if not port.isdigit() or not 0 < int(port) < 65536:
        return True
    try:
        socket.getaddrinfo(host, None)  # an unknown host: said at once, not after SAID_TIMEOUT_S of retries
        store = dist.TCPStore(host, int(port), is_master=False,
                              timeout=timedelta(seconds=SAID_TIMEOUT_S))
        # a restarted worker group (--max-restarts) says its own errors again: the attempt is part of the key
        attempt = f"{e.get('TORCHELASTIC_RUN_ID', '')}/{e.get('TORCHELASTIC_RESTART_COUNT', '0')}"
        key = f"turbotrain/said/{attempt}/{hashlib.sha256(line.encode()).hexdigest()}"
        return store.add(key, 1) == 1
    except (RuntimeError, ValueError, OSError, UnicodeError):  # the launcher gone, MASTER_ADDR unknown
        return True


# ---------------------------------------------------------------- torchrun --max-restarts

def restart_store_warning(e: Mapping[str, str] = os.environ) -> str | None:
    """The fix to print when torchrun restarts workers while sharing its rendezvous TCPStore with them (torch
    >= 2.4's default): restarted workers then meet a store that is gone ("Connection refused") or hang. None
    when restarts are off or the launcher was started with TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1."""
    restarts = e.get("TORCHELASTIC_MAX_RESTARTS", "0") or "0"
    if not restarts.strip().lstrip("-").isdigit():
        raise UserError(f"environment: TORCHELASTIC_MAX_RESTARTS={restarts!r} is not an integer; torchrun "
                        "--max-restarts=N sets it (unset it when not launched by torchrun)")
    if int(restarts) <= 0 or e.get("TORCH_DISABLE_SHARE_RDZV_TCP_STORE") == "1":
        return None
    if e.get("TORCHELASTIC_USE_AGENT_STORE", "True") != "True":
        return None  # this launcher does not share its store (static rendezvous, or the opt-out was honored)
    if tuple(int(x) for x in re.findall(r"\d+", torch.__version__)[:2]) < (2, 4):
        return None
    return ("warning: torchrun --max-restarts shares its rendezvous store with the workers, and restarts then fail "
            "(Connection refused, or a hang); start the launcher as: TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 torchrun "
            "--max-restarts=N ...")


def init_distributed(env: DistEnv, device: torch.device, cfg=None) -> torch.device:
    """Join the process group (once) and return this rank's device (cuda:LOCAL_RANK on GPUs). With `cfg`, refuse
    ranks started with different configs (same_config)."""
    if device.type == "cuda":
        device = _rank_device(env)
        torch.cuda.set_device(device)
    if not dist.is_initialized():
        missing = [k for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT") if k not in os.environ]
        if missing:
            command = next((a for a in sys.argv[1:] if a in ("train", "profile", "bench", "tune")), "train")
            raise UserError(f"parallel.strategy ddp, fsdp, hsdp and pipeline run under torchrun "
                            f"({', '.join(missing)} not set): torchrun --nproc_per_node=N -m turbotrain {command} ...")
        if env.is_main and (warning := restart_store_warning()):
            from turbotrain.log import say_once

            say_once(warning)
        _join(env, "nccl" if device.type == "cuda" else "gloo", device)
    if cfg is not None:
        same_config(cfg)
    return device


JOIN_TIMEOUT_MIN = 10  # every rank must reach the rendezvous within this (a large job's nodes start unevenly)


def _join(env: DistEnv, backend: str, device: torch.device) -> None:
    """init_process_group, said while it waits (a missing rank would otherwise be minutes of silence) and one
    error line when the other ranks never come."""
    from turbotrain.log import Heartbeat

    _env_int("MASTER_PORT", 0, 1, 65535)
    _check_resolves(os.environ["MASTER_ADDR"])
    where = f"{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}"
    try:
        with Heartbeat(f"distributed: waiting for {env.world_size} ranks at {where} (at most {JOIN_TIMEOUT_MIN} min)"):
            dist.init_process_group(backend, timeout=timedelta(minutes=JOIN_TIMEOUT_MIN),
                                    device_id=device if device.type == "cuda" else None)
    except dist.DistStoreError as e:
        raise UserError(f"distributed: the {env.world_size} ranks did not all join at {where} within "
                        f"{JOIN_TIMEOUT_MIN} min ({' '.join(str(e).split())[:120]}); start every rank (torchrun "
                        f"--nproc_per_node=N, on each node), and check WORLD_SIZE and MASTER_ADDR/PORT") from None
    except dist.DistNetworkError as e:  # rank 0 hosts the store at MASTER_PORT: taken, or an address not its own
        why = " ".join(str(e).split())
        if "EADDRINUSE" in why or "address already in use" in why.lower():
            raise UserError(f"distributed: MASTER_PORT={os.environ['MASTER_PORT']} is in use on "
                            f"{os.environ['MASTER_ADDR']} (another job, or a run that has not exited); pick a free "
                            "port (torchrun --master_port=P, or --standalone to pick one itself)") from None
        raise UserError(f"distributed: rank {env.rank} could not open the process group's store at {where} "
                        f"({why[:160]}); check MASTER_ADDR/PORT name rank 0's node and a free port") from None


def same_config(cfg) -> None:
    """Refuse ranks started with different configs (a node's copy of the TOML edited, another override on one
    node): they would train different models under one DDP or FSDP2 group, or reach the end at different steps
    and wait for the others until the collective timeout (10 min), then print tracebacks. Every rank raises the
    same line, naming the first keys that differ. Usage: `same_config(cfg)` once the process group is joined."""
    if not dist.is_initialized() or dist.get_world_size() < 2:
        return
    mine = _flat(cfg)
    digests: list = [None] * dist.get_world_size()
    dist.all_gather_object(digests, hashlib.sha256(repr(sorted(mine.items())).encode()).hexdigest())
    if len(set(digests)) == 1:
        return
    every: list = [None] * dist.get_world_size()
    dist.all_gather_object(every, mine)
    keys = sorted(k for k in set().union(*every) if len({c.get(k) for c in every}) > 1)
    said = "; ".join(f"{k}: " + ", ".join(f"rank {r} {c.get(k, 'unset')}" for r, c in enumerate(every))
                     for k in keys[:3])
    raise UserError(f"config: the ranks were started with different configs ({said}{'; ...' if len(keys) > 3 else ''}"
                    "); start every rank with the same config file and overrides (each node's copy of the file "
                    "must be identical)")


def _flat(tree, prefix: str = "") -> dict[str, str]:
    """A config as {dotted key: repr of its value}; reprs, so an object the Python API put there is compared
    (and pickled) by what it prints, never copied, less its address (each process has its own)."""
    if dataclasses.is_dataclass(tree):
        tree = {f.name: getattr(tree, f.name) for f in dataclasses.fields(tree)}
    out = {}
    for k, v in tree.items():
        nested = isinstance(v, dict) or dataclasses.is_dataclass(v)
        out.update(_flat(v, f"{prefix}{k}.") if nested else {f"{prefix}{k}": re.sub(r" at 0x[0-9a-f]+", "", repr(v))})
    return out


def _check_resolves(host: str) -> None:
    """A MASTER_ADDR that no name server knows (a typo, a node name from another cluster) is said at once: torch
    would retry it for the whole JOIN_TIMEOUT_MIN, printing a warning a second. A temporary lookup failure
    (EAI_AGAIN) is left to those retries."""
    try:
        socket.getaddrinfo(host, None)
    except socket.gaierror as e:
        if e.errno in (socket.EAI_NONAME, getattr(socket, "EAI_NODATA", socket.EAI_NONAME)):
            raise UserError(f"environment: MASTER_ADDR={host!r} is not a known host ({e.strerror}); set it to the "
                            "host name or address of rank 0's node (torchrun sets it from --rdzv_endpoint or "
                            "--master_addr)") from None
    except UnicodeError:  # an empty or over-long label: no lookup can succeed
        raise UserError(f"environment: MASTER_ADDR={host!r} is not a valid host name; set it to the host name or "
                        "address of rank 0's node") from None


def _rank_device(env: DistEnv) -> torch.device:
    visible = torch.cuda.device_count()
    if env.launcher == "slurm" and visible == 1:
        return torch.device("cuda", 0)  # srun --gpus-per-task / --gpu-bind: each task sees its own GPU only
    if env.local_rank >= visible:
        fix = ("lower --ntasks-per-node (or use --gpus-per-task)" if env.launcher == "slurm"
               else "lower --nproc_per_node")
        raise UserError(f"LOCAL_RANK {env.local_rank} but only {visible} GPU(s) visible; {fix}")
    return torch.device("cuda", env.local_rank)


def all_mean(values: list[float], device: torch.device, maxed: tuple[int, ...] = ()) -> list[float]:
    """Mean of each value over ranks, or the largest for the positions in `maxed` (one collective for all of
    them). A count of events on any rank (non-finite losses in a row: the averaged loss is NaN when one rank's
    is) is the largest: its mean over N ranks would say 1/N of it, and a limit on it would trip N times late.
    Usage: `loss, streak = all_mean([loss, streak], device, maxed=(1,))`."""
    if not dist.is_initialized():
        return values
    t = torch.tensor(values, dtype=torch.float64, device=device)
    if not maxed:
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
        return (t / dist.get_world_size()).tolist()
    rows = [torch.zeros_like(t) for _ in range(dist.get_world_size())]
    dist.all_gather(rows, t)
    every = torch.stack(rows)
    out = every.mean(0)
    out[list(maxed)] = every[:, list(maxed)].amax(0)
    return out.tolist()


class LaggedVote:
    """Whether any rank raised a flag, agreed every step without a sync: each step casts this rank's flag in an
    asynchronous all-reduce (max) and reads the one cast a step earlier, done by then. On a GPU the result goes
    to pinned memory behind an event recorded right after that reduce, so the read waits for that point of the
    queue only, never for the step just launched. Every rank reads the same result at the same step: a signal
    that reached one rank, or every rank at different steps, stops them all at one step within two.
    Usage, each step: `if vote.step(flag): stop`."""

    def __init__(self, device: torch.device):
        self.device, self.pending = device, None
        self.host = torch.zeros(1, pin_memory=device.type == "cuda")

    def step(self, flag: bool) -> bool:
        if not dist.is_initialized():  # ranks launched with parallel.strategy none share nothing: each decides
            return flag
        agreed = self._read()
        t = torch.full((1,), float(flag), device=self.device)  # a fill, not a copy from the host: no sync
        work = dist.all_reduce(t, op=dist.ReduceOp.MAX, async_op=True)
        if self.device.type == "cuda":
            work.wait()  # NCCL: the stream waits for the reduce, the host does not
            self.host.copy_(t, non_blocking=True)
            self.pending, self.value = torch.cuda.Event(), self.host
            self.pending.record()
        else:
            self.pending, self.value = work, t  # gloo's wait blocks the host: left to the next step's read
        return agreed

    def _read(self) -> bool:
        if self.pending is None:
            return False
        waiting, self.pending = self.pending, None
        if isinstance(waiting, torch.cuda.Event):
            waiting.synchronize()
        else:
            waiting.wait()
        return bool(self.value[0])


def all_gather_floats(value: float, device: torch.device) -> list[float]:
    if not dist.is_initialized():
        return [value]
    t = torch.tensor([value], dtype=torch.float64, device=device)
    out = [torch.zeros_like(t) for _ in range(dist.get_world_size())]
    dist.all_gather(out, t)
    return [float(x) for x in out]


# What gloo, NCCL and the c10d store say when the rank at the other end is gone (it failed, was killed, its host
# went down): on the ranks left behind that is the lost rank's consequence, not a fault of theirs to trace back
_PEER_GONE = ("connection reset by peer", "connection closed by peer", "broken pipe", "remote process exited",
              "communicator was aborted", "connection refused", "socket closed")


def peer_lost(e: BaseException | None) -> UserError | None:
    """The one line for a collective that failed because another rank is gone; None for any other error."""
    if not isinstance(e, RuntimeError) or not dist.is_available() or not dist.is_initialized():
        return None
    text = " ".join(str(e).split())
    found = next((s for s in _PEER_GONE if s in text.lower()), None)
    if found is None:
        return None
    return UserError(f"distributed: rank {dist.get_rank()} lost another rank mid-run ({found}); that rank failed "
                     "or was killed: its own error line, or torchrun's exit code for it (-9: killed, e.g. out of "
                     "host memory), says why; fix that and rerun the same command (it resumes from the last "
                     "checkpoint)")


def shutdown() -> None:
    """Leave the process group. DDP's reducers go first (see ddp.release_reducers: a deadlock otherwise).
    Called while an exception ends the run (train's `finally`): a collective that failed because another rank is
    gone is raised again as one error line (`peer_lost`), not this rank's traceback."""
    from turbotrain.distributed.ddp import release_reducers  # ddp imports this module

    lost = peer_lost(sys.exc_info()[1])
    release_reducers()
    if dist.is_initialized():
        dist.destroy_process_group()
    if lost is not None:
        raise lost from None
