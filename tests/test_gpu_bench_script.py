"""gpu/bench_h200.py runs end to end with --tiny on the CPU and reports throughput for each algorithm asked."""
from gpu.bench_h200 import main, run


def test_tiny_bench_rows(tmp_path):
    rows = run(tiny=True, steps=1, prompts=1, group=2, prompt_len=8, gen_len=8, algos=["grpo", "dpo"])
    assert [r["algo"] for r in rows] == ["grpo", "dpo"]
    assert all(r["train_tokens_per_s"] > 0 and r["peak_mem_gib"] > 0 and r["device"] == "cpu" for r in rows)
    main(["--tiny", "--steps", "1", "--prompts", "1", "--group", "2", "--prompt-len", "4", "--gen-len", "4",
          "--algos", "sapo", "--out", str(tmp_path / "b.json")])
    assert (tmp_path / "b.json").read_text().count("sapo") == 1
