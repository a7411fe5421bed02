"""Shared pieces of the fault tests: the CLI as a subprocess or in-process, run-dir readers, checkpoint
tampering (byte flips, resealed manifests, pickle payloads) and process lookup for kill tests."""
from __future__ import annotations

import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.helpers import TESTS, USERPKG, userpkg_env

FAULTS = TESTS  # the path entry that makes `userpkg` importable (old name: it held faultpkg/)
BASE_TOML = USERPKG / "fault.toml"  # a sub-second run over userpkg.models:linear / userpkg.data:regression

# The resume workload: gpt2-124m's wiring, 2 layers x 64 wide on synthetic tokens, dropout on so the RNG
# state matters for bitwise resume; a step takes tens of ms on a CPU, so a kill lands mid-run.
RESUME_STEPS = 40
RESUME_EVERY = 5
RESUME_GPT = ["model.args.n_layer=2", "model.args.n_head=2", "model.args.n_embd=64", "model.args.block_size=64",
              "model.args.vocab_size=64", "model.args.dropout=0.1", "data.args.seq_len=64",
              "data.args.vocab_size=64", "data.args.size=256", "data.batch_size=16", "data.eval_batches=2",
              "precision.dtype=fp32", "compile.enabled=false", 'run.device="cpu"', "train.log_every=1",
              f"train.steps={RESUME_STEPS}", f"checkpoint.every={RESUME_EVERY}"]


class CrashAt:
    """Fails the run at the end of a step (after the checkpoint before it, before that step's log)."""

    def __init__(self, step: int):
        self.step = step

    def on_step_end(self, state):
        if state.step == self.step:
            raise RuntimeError("crash for the test")


def lit(path) -> str:
    """A path as a TOML literal string for KEY=VALUE overrides."""
    return repr(str(path))


def subprocess_env(**extra: str) -> dict:
    env = userpkg_env()
    env.pop("RANK", None), env.pop("WORLD_SIZE", None), env.pop("LOCAL_RANK", None)
    env.update(extra)
    return env


def train_argv(config: str, *overrides: str) -> list[str]:
    return [sys.executable, "-m", "turbotrain", "train", config, *overrides]


def run_cli(argv: list[str], cwd, timeout: float = 240, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(argv, cwd=cwd, env=subprocess_env(**env), capture_output=True, text=True, timeout=timeout)


def report(r) -> str:
    return f"rc={r.returncode}\nstdout (tail):\n{r.stdout[-3000:]}\nstderr:\n{r.stderr[-3000:]}"


def error_line(stderr: str) -> str:
    """The contract for user errors: exactly one non-empty stderr line, starting `error:`, no traceback."""
    assert "Traceback" not in stderr, stderr
    lines = [ln for ln in stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, f"expected exactly one stderr line, got {len(lines)}:\n{stderr}"
    assert lines[0].startswith("error:"), lines[0]
    return lines[0]


# ---------------------------------------------------------------- run directories

def rows(run_dir: Path) -> list[dict]:
    path = run_dir / "metrics.jsonl"
    return [json.loads(ln) for ln in path.read_text().splitlines() if ln.strip()] if path.exists() else []


def loss_rows(run_dir: Path) -> list[tuple[int, float]]:
    return [(r["step"], r["loss"]) for r in rows(run_dir) if "loss" in r]


def checkpoint_steps(run_dir: Path) -> list[int]:
    d = run_dir / "checkpoints"
    if not d.is_dir():
        return []
    return sorted(int(p.name[5:]) for p in d.iterdir() if p.is_dir() and re.fullmatch(r"step-\d{8}", p.name))


def ckpt_dir(run_dir: Path, step: int) -> Path:
    return run_dir / "checkpoints" / f"step-{step:08d}"


def resumed_step(stdout: str) -> int | None:
    m = re.search(r"resumed from step (\d+)", stdout)
    return int(m.group(1)) if m else None


# ---------------------------------------------------------------- tampering

def flip_bytes(path: Path, n: int = 16) -> None:
    """Invert n bytes in the middle of a file (same size: only the checksum can tell)."""
    data = bytearray(path.read_bytes())
    mid = len(data) // 2
    for i in range(mid, min(len(data), mid + n)):
        data[i] ^= 0xFF
    path.write_bytes(bytes(data))


def reseal(ckpt: Path) -> None:
    """Recompute the sha256 manifest in meta.json, so a tampered checkpoint verifies again."""
    meta_path = ckpt / "meta.json"
    meta = json.loads(meta_path.read_text())
    meta["manifest"] = {rel: hashlib.sha256((ckpt / rel).read_bytes()).hexdigest() for rel in meta["manifest"]}
    meta_path.write_text(json.dumps(meta, indent=1))


class Payload:
    """Unpickling this runs a shell command that creates `marker` (what a malicious checkpoint does)."""

    def __init__(self, marker: Path):
        self.marker = str(marker)

    def __reduce__(self):
        return os.system, (f"touch '{self.marker}'",)


def plant_payload(path: Path, marker: Path, fmt: str) -> None:
    """Replace a checkpoint file with a pickle that creates `marker` when loaded without weights_only:
    fmt "torch" = torch.save's zip format, "pickle" = a bare pickle stream."""
    import pickle

    import torch

    obj = {"model": Payload(marker), "optim": {}, "sched": {}, "scaler": {}, "torch": Payload(marker)}
    if fmt == "torch":
        torch.save(obj, path)
    else:
        path.write_bytes(pickle.dumps(obj, protocol=2))


# ---------------------------------------------------------------- processes

def wait_for(predicate, timeout: float, what: str, proc: subprocess.Popen | None = None, interval: float = 0.005):
    """Poll until predicate() is truthy; fail with `what` after `timeout` s or when `proc` exits first."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"the process exited (rc={proc.returncode}) before: {what}")
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for: {what}")


def _ppid(pid: int) -> int | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[1])


def _environ(pid: int) -> set[bytes]:
    try:
        return set(Path(f"/proc/{pid}/environ").read_bytes().split(b"\0"))
    except OSError:
        return set()


def is_descendant(pid: int, ancestor: int) -> bool:
    for _ in range(64):
        pid = _ppid(pid)
        if pid is None or pid <= 1:
            return False
        if pid == ancestor:
            return True
    return False


def worker_pids(root_pid: int, token: str, local_rank: int) -> list[int]:
    """Worker processes of OUR torchrun (descendants of root_pid carrying our unique token) with the
    given LOCAL_RANK; the topmost of them only (not their own children, e.g. DataLoader workers).
    Uses psutil when installed, else /proc/*/environ."""
    want = {f"TT_FAULTS_TOKEN={token}".encode(), f"LOCAL_RANK={local_rank}".encode()}
    try:
        import psutil  # type: ignore

        found = []
        for p in psutil.Process(root_pid).children(recursive=True):
            try:
                env = p.environ()
            except (psutil.Error, OSError):
                continue
            if env.get("TT_FAULTS_TOKEN") == token and env.get("LOCAL_RANK") == str(local_rank):
                found.append(p.pid)
    except ImportError:
        found = [int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit()
                 and want <= _environ(int(p.name)) and is_descendant(int(p.name), root_pid)]
    return [pid for pid in found if _ppid(pid) not in found]


def stop_tree(proc: subprocess.Popen) -> None:
    """Kill a Popen started with start_new_session=True and everything in its session (ours only)."""
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait(timeout=30)


def step_events(fn):
    """The profiler's events of one forward + backward of `fn` (it returns the loss), recorded in phases as
    `turbotrain profile` records a step."""
    from torch.profiler import ProfilerActivity, profile

    from turbotrain.monitor import phases

    phases.enable(True)
    try:
        with profile(activities=[ProfilerActivity.CPU], record_shapes=True, profile_memory=True) as p:
            with phases.phase("forward"):
                loss = fn()
            with phases.phase("backward"):
                loss.backward()
    finally:
        phases.enable(False)
    return p.events()
