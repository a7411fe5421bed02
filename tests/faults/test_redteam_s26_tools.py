"""Red team, session 26, tools: bench's verdicts where an evaluation gave no figure, and report's table where a
run's files hold values of the wrong kind."""
from __future__ import annotations

import json

from turbotrain.bench import _judge, format_table
from turbotrain.report import write_report


def _rows(base_val: float | None, variant_val: float | None, lm: bool = True) -> list[dict]:
    """A baseline and one variant of equal speed and memory, differing only in their val loss."""
    tok = 1000.0 if lm else None
    return [{"variant": v, "samples_per_s": 10.0, "tokens_per_s": tok, "peak_mem_gib": 1.0, "val_loss": loss,
             "val_acc": None if lm else 0.9, "step_ms": 1.0, "compile_s": 0.0, "final_loss": 1.0}
            for v, loss in (("baseline", base_val), ("bf16", variant_val))]


def test_a_variant_whose_evaluation_diverged_is_never_parity_nor_ok():
    # step.evaluate logs a NaN/inf val loss as null and the run ends with exit 0: its summary's val_loss is None
    for lm in (True, False):
        rows = _rows(1.0, None, lm)
        _judge(rows, converge=True)
        assert rows[1]["verdict"].endswith("parity missed") and "val loss null" in rows[1]["verdict"]
        rows = _rows(1.0, None, lm)
        _judge(rows, converge=False)
        assert "hurts convergence" in rows[1]["verdict"] and rows[1]["verdict"] != "ok"
        assert "val loss null" in format_table({"rows": rows, "device": "cpu", "torch": "x", "steps": 10,
                                                "synthetic_data": False, "repeats": 1})


def test_parity_is_stated_only_where_the_figures_were_compared():
    rows = _rows(None, 1.0)  # the baseline's own evaluation gave null: nothing to hold the variant against
    _judge(rows, converge=True)
    assert "parity held" not in rows[1]["verdict"] and "parity not known" in rows[1]["verdict"]
    rows = _rows(1.0, 1.001)  # compared and within 1 %: parity holds as before
    _judge(rows, converge=True)
    assert rows[1]["verdict"] == "parity held"


def _table(md: str) -> dict[str, str]:
    """report.md's figure table as {figure: value}; a row that is not exactly two cells fails the test."""
    out = {}
    lines = md.splitlines()
    start = lines.index("| figure | value |") + 2
    for line in lines[start:]:
        if not line.startswith("|"):
            break
        cells = line.replace("\\|", "").strip("|").split("|")
        assert len(cells) == 2, line
        out[cells[0].strip()] = cells[1].strip()
    return out


def test_report_says_a_figure_of_the_wrong_kind_is_no_number_and_keeps_its_table_whole(tmp_path):
    run = tmp_path / "damaged"
    run.mkdir()
    (run / "metrics.jsonl").write_text('{"step": 1, "loss": 2.0}\n{"step": 2, "loss": 1.5}\n')
    # a summary.json of the wrong kinds: a text with newlines (it would end the markdown row), a list, a bool
    (run / "summary.json").write_text(json.dumps({"steps": 2, "final_loss": "1.0\n| forged | 9 |\n\n# heading",
                                                  "samples_per_s": [1, 2], "mfu": True, "peak_mem_gib": 0.5}))
    md = write_report(run)[1].read_text()
    table = _table(md)
    assert "forged" not in table and "# heading" not in md.split("\n")
    for figure in ("final loss", "samples/s (timed region)", "MFU"):
        assert table[figure].startswith("(not a number"), (figure, table[figure])
    assert table["peak memory GiB"] == "0.5" and table["last step"] == "2"  # the readable figures are the file's


def test_a_variant_slower_than_the_baseline_never_reads_ok():
    for rate, says in ((9.85, "no speedup (0.985x"), (5.0, "slower than baseline (0.50x)")):
        rows = _rows(1.0, 1.0)
        rows[1]["samples_per_s"] = rate
        _judge(rows, converge=False)
        assert rows[1]["verdict"] != "ok" and says in rows[1]["verdict"], rows[1]["verdict"]
    rows = _rows(1.0, 1.0)  # as fast: nothing to flag
    _judge(rows, converge=False)
    assert rows[1]["verdict"] == "ok"


def test_a_comparator_that_does_not_evaluate_is_no_divergence_and_no_parity():
    rows = _rows(1.0, None)
    rows[1].update(variant="accelerate (bf16 + compile)", evaluates=False)  # benchmarks/peers.py: val_loss None
    _judge(rows, converge=True)
    assert "hurts" not in rows[1]["verdict"] and "parity not known" in rows[1]["verdict"], rows[1]["verdict"]
