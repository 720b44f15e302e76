"""pytest-benchmark: our batched KV-cache sampler (gpu.rollout.HFEngine) against transformers ``generate``, alternating
in one process (harness.runs.bench.sampler_compare): on the tiny tier's model at its batch (16 prompts x G = 8, 24
new tokens) under `make bench`, when `make tiny-model` has built it; `make test` runs one small round on the tiny
test model, untimed, as a check that the timing runs."""
import json

from gpu.models import resolve_model, tiny_char_path
from harness.runs.bench import sampler_compare


def test_sampler_against_generate(benchmark):
    if benchmark.disabled:
        path, kw = resolve_model("tiny"), {"prompts": 2, "n": 2, "max_new_tokens": 4, "rounds": 1}
    else:
        path, kw = tiny_char_path(build=True), {"rounds": 8}
    res = benchmark.pedantic(sampler_compare, args=(path,), kwargs=kw, rounds=1)
    print(json.dumps(res["median_s"] | {"generate_over_ours": res["generate_over_ours"]}))
    assert len(res["cpu_s"]["ours"]) == len(res["cpu_s"]["generate"]) == kw["rounds"]
    if not benchmark.disabled:  # whichever is faster is the engine: ours, by prompt sharing
        benchmark.extra_info.update(generate_over_ours=res["generate_over_ours"])
        assert res["generate_over_ours"] > 1.0
