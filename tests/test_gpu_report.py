"""The real-model report reads run folders (config.json + metrics.jsonl) and writes markdown with a plot."""
import json

import pytest

from gpu.config import from_dict
from harness.reports.real import write_report


def _run(folder, algo, rewards):
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps(from_dict({"algo": {"name": algo}}).to_dict()))
    with (folder / "metrics.jsonl").open("w") as f:
        for i, r in enumerate(rewards):
            f.write(json.dumps({"step": i + 1, "reward": r, "accuracy": r, "entropy": 1.0, "tcr": 0.01, "rur": 0.5,
                                "len_mean": 10.0, "gap_mean_abs": 1e-5, "step_time_s": 2.0}) + "\n")


def test_report_compares_runs(tmp_path):
    _run(tmp_path / "runs" / "grpo", "grpo", [0.1, 0.2, 0.3, 0.4, 0.5])
    _run(tmp_path / "runs" / "dcpo", "dcpo", [0.2, 0.2, 0.2, 0.2, 0.2])
    md = write_report([tmp_path / "runs"], tmp_path / "out" / "README.md", title="t")
    text = md.read_text()
    assert "| grpo | 5 | 0.1 | 0.5 |" in text and "| dcpo | 5 | 0.2 | 0.2 |" in text
    assert (tmp_path / "out" / "README_curves.png").stat().st_size > 1000
    with pytest.raises(ValueError, match="dirs"):
        write_report([tmp_path / "out"], tmp_path / "x.md")
