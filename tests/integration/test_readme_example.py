"""The README's "Bring your own model and data" example, copied verbatim into an empty directory, trains
with the `turbotrain` console script exactly as the README says to run it."""
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[2] / "README.md"


def example_files() -> dict[str, str]:
    """{relative path: text} of the section's code blocks, each named by its first-line comment."""
    section = README.read_text().split("## Bring your own model and data", 1)[1].split("\n## ", 1)[0]
    files = {}
    for lang, body in re.findall(r"```(python|toml)\n(.*?)```", section, flags=re.S):
        first = body.splitlines()[0]
        assert first.startswith("# "), f"a {lang} block of the README example does not name its file: {first!r}"
        files[first[2:].strip()] = body
    return files


def test_the_example_names_its_files():
    assert set(example_files()) == {"mypkg/task.py", "my.toml"}


def test_the_readme_example_trains_verbatim_with_the_console_script(tmp_path):
    script = shutil.which("turbotrain", path=str(Path(sys.executable).parent)) or shutil.which("turbotrain")
    if script is None:
        pytest.skip("the turbotrain console script is not installed (pip install -e .)")
    for rel, text in example_files().items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "RANK", "WORLD_SIZE", "LOCAL_RANK")}
    r = subprocess.run([script, "train", "my.toml"], cwd=tmp_path, env=env, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    summary = json.loads((tmp_path / "runs" / "my" / "summary.json").read_text())
    rows = [json.loads(x) for x in (tmp_path / "runs" / "my" / "metrics.jsonl").read_text().splitlines()]
    losses = [x["loss"] for x in rows if "loss" in x]
    assert summary["steps"] == 60 and losses[-1] < losses[0]
