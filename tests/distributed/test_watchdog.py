"""2 gloo ranks through torchrun: rank 0's data blocks forever; the hung-step watchdog of the stuck rank
alerts with its stack and exits, and the whole job ends non-zero instead of hanging (rank 1, stuck in the
gradient all-reduce, is ended by its own watchdog or by torchrun)."""
import json
import sys
import time

from tests.helpers import USERPKG, run_bounded, userpkg_env


def test_a_rank_whose_data_blocks_ends_the_job(tmp_path):
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "-m", "turbotrain",
           "train", str(USERPKG / "fault.toml"), f"run.out_dir={str(tmp_path)!r}", "parallel.strategy=ddp",
           "train.steps=40", 'data.name="userpkg.monitoring:blocks_at"', "data.args.after=28", "data.args.rank=0",
           "monitor.hang_timeout_s=2"]
    t0 = time.perf_counter()
    r = run_bounded(cmd, 150, "the job (despite the watchdog)", env=userpkg_env())
    proc, out, err = r, r.stdout, r.stderr
    assert proc.returncode != 0, out[-2000:] + err[-2000:]
    lines = [json.loads(x) for x in (tmp_path / "fault" / "alerts.jsonl").read_text().splitlines()]
    hung = {a["rank"]: a for a in lines if a["rule"] == "hung_step"}
    assert 0 in hung, lines
    assert "in __getitem__" in hung[0]["message"] and "Event().wait()" in hung[0]["message"]
    assert hung[0]["value"] > 2.0 and 1 <= hung[0]["step"] < 6
    assert time.perf_counter() - t0 < 150
    # the log steps before the hang carry the synchronisation latency of 2 ranks (a small all-reduce)
    rows = [json.loads(x) for x in (tmp_path / "fault" / "metrics.jsonl").read_text().splitlines()]
    assert rows and all(r["sync_ms"] >= 0 for r in rows)
