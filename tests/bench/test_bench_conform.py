"""pytest-benchmark: one conformance check of a correct user loss as the pytest plugin runs it (assert_conforms with a
function object) and as `cliplab conform module:function` runs it (conform_command), each in a forked worker over the
typical, extreme and ties families at the default 30 seeds (run with `make bench`; `make test` runs each once,
untimed)."""
from harness.conform.engine import assert_conforms, conform_command

SOURCE = '''import torch


def grpo_loss(logp, old_logp, advantages, mask):
    """GRPO without KL (DeepSeekMath Eq. 3, beta 0): token means per sequence, over the sequences with tokens."""
    r = torch.exp(logp - old_logp)
    per_token = -torch.min(r * advantages, torch.clamp(r, 0.8, 1.2) * advantages)
    lens = mask.sum(1)
    keep = lens > 0
    return ((per_token * mask).sum(1)[keep] / lens[keep]).mean() if keep.any() else (per_token * mask).sum()
'''
NAMESPACE = {}
exec(compile(SOURCE, "bench_losses.py", "exec"), NAMESPACE)  # noqa: S102 (the benchmark's own loss)


def test_assert_conforms(benchmark):
    report = benchmark.pedantic(assert_conforms, args=(NAMESPACE["grpo_loss"], "grpo"), kwargs={"beta": 0},
                                rounds=3)
    assert report["ok"] and len(report["rows"]) == 3


def test_conform_module_function(benchmark, tmp_path, monkeypatch, capsys):
    (tmp_path / "bench_losses.py").write_text(SOURCE)
    monkeypatch.chdir(tmp_path)  # the worker imports the module from the working directory, as `python -m` does
    report = benchmark.pedantic(conform_command, args=("bench_losses:grpo_loss",),
                                kwargs={"adapter": "algorithm=grpo,beta=0"}, rounds=3)
    assert report["ok"] and "3 checks: 3 agrees" in capsys.readouterr().out
