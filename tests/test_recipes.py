"""The paper-scale recipes: every verl recipe composes with verl's own hydra config and resolves; its loss and
advantage names resolve to cliplab's functions through verl's registry, and one actor loss call equals
gpu.policy_loss; the TRL variant builds its trainer on a tiny model; the cost model equals a hand computation; bad
paths are one-line errors naming the file."""
import os
import zlib

import pytest
import torch

pytest.importorskip("verl.trainer.ppo.core_algos")
from gpu_helpers import tiny_path  # noqa: E402,F401  (fixture)
from hydra import compose, initialize_config_dir  # noqa: E402
from omegaconf import OmegaConf  # noqa: E402

import gpu  # noqa: E402
from gpu.integrations import verl_plugin  # noqa: E402
from harness.recipes import cost as recipe_cost, launch as recipes  # noqa: E402
from spec.registry import get_algorithm  # noqa: E402

RECIPES = {r["name"]: r for r in recipes.all_recipes()}
RUNS = [(name, run) for name, r in RECIPES.items() for run in r["runs"]]
PATHS = {"model": "/models/m", "train": "/data/train.parquet", "val": "/data/val.parquet"}


def compose_run(recipe, run):
    import verl
    folder = os.path.join(os.path.dirname(verl.__file__), "trainer", "config")
    with initialize_config_dir(config_dir=folder, version_base=None):
        cfg = compose("ppo_trainer", overrides=recipes.overrides(RECIPES[recipe], run, PATHS))
    OmegaConf.resolve(cfg)
    return cfg


def test_the_four_paper_runs_are_there_and_every_setting_has_its_source():
    assert set(RECIPES) == {"dcpo_math7b", "dapo_ladder_32b", "gspo_vs_grpo", "sapo_temperature"}
    assert set(RECIPES["dcpo_math7b"]["runs"]) == {"grpo", "dapo", "gspo", "dcpo"}
    assert list(RECIPES["dapo_ladder_32b"]["runs"]) == ["naive_grpo", "overlong_filter", "clip_higher",
                                                        "soft_overlong", "token_level", "dynamic_sampling"]
    for r in RECIPES.values():
        assert r["not_reproduced"] and (r["folder"] / "launch_verl.sh").exists()
        items = r.get("settings", []) + [s for spec in r["runs"].values() for s in spec.get("settings", [])]
        assert all(len(s) == 2 and s[1].strip() for s in items)


@pytest.mark.parametrize("recipe, run", RUNS)
def test_each_verl_run_composes_and_its_names_resolve_to_cliplab(recipe, run):
    from verl.trainer.ppo.core_algos import get_adv_estimator_fn, get_policy_loss_fn
    from verl.utils.config import omega_conf_to_dataclass
    cfg = compose_run(recipe, run)
    actor_cfg = cfg.actor_rollout_ref.actor
    assert cfg.actor_rollout_ref.model.path == PATHS["model"] and actor_cfg.rollout_n == cfg.actor_rollout_ref.rollout.n
    loss_mode = actor_cfg.policy_loss.loss_mode
    algorithm = RECIPES[recipe]["runs"][run]["algorithm"]
    assert verl_plugin.LOSSES[loss_mode] == (algorithm, None)  # the run's algorithm, the paper's aggregation
    fn = get_policy_loss_fn(loss_mode)
    assert fn is verl_plugin._LOSS_FNS[loss_mode]
    estimator = cfg.algorithm.adv_estimator
    if estimator.startswith("cliplab_"):
        assert get_adv_estimator_fn(estimator) is verl_plugin._SAS
    if estimator in verl_plugin.FILTERED or estimator == verl_plugin.SAS_NAME:  # keyed in RayPPOTrainer's step only
        assert cfg.trainer.use_v1 is False

    # one actor loss call, on CPU tensors, with the ActorConfig verl builds from the composed config
    actor = omega_conf_to_dataclass(actor_cfg)
    g = torch.Generator().manual_seed(zlib.crc32(f"{recipe}/{run}".encode()))
    rows, width = 2 * actor.rollout_n, 5
    old = -torch.rand(rows, width, generator=g, dtype=torch.float64) * 3
    logp = (old + 0.3 * torch.randn(rows, width, generator=g, dtype=torch.float64)).requires_grad_(True)
    adv = torch.randn(rows, 1, generator=g, dtype=torch.float64).expand(rows, width).contiguous()
    adv[actor.rollout_n:] = 0.0  # the second group is all-equal: its responses carry no gradient
    mask = torch.rand(rows, width, generator=g) < 0.8
    mask[:, 0] = True
    loss, metrics = fn(old, logp, adv, mask, "token-mean", actor)
    alg = get_algorithm(algorithm)
    hp = {"beta": 0.0}
    if alg.clip in ("fixed", "dynamic"):
        hp.update(eps_low=float(actor_cfg.clip_ratio_low), eps_high=float(actor_cfg.clip_ratio_high))
    if alg.clip == "soft":
        hp.update(tau_pos=float(actor_cfg.tau_pos), tau_neg=float(actor_cfg.tau_neg))
    want, stats = gpu.policy_loss(algorithm, logp, old, adv, mask.double(), group_size=actor.rollout_n, **hp)
    assert loss.item() == pytest.approx(want.item(), rel=1e-12, abs=1e-15)
    assert metrics["actor/pg_clipfrac"] == pytest.approx(stats["clip_frac"])
    assert metrics["actor/cliplab_rur"] == 0.5  # RUR: half the responses have a non-zero advantage


def test_recipe_settings_are_the_papers():
    def actor(recipe, run):
        return compose_run(recipe, run).actor_rollout_ref.actor
    a = actor("dcpo_math7b", "dcpo")
    assert (a.clip_ratio_low, a.clip_ratio_high) == (0.16, 0.2) and not a.use_kl_loss
    g = actor("gspo_vs_grpo", "gspo")
    assert (g.clip_ratio_low, g.clip_ratio_high) == (3e-4, 4e-4)
    s, rev = actor("sapo_temperature", "sapo"), actor("sapo_temperature", "sapo_reversed")
    assert (s.tau_pos, s.tau_neg) == (1.0, 1.05) and (rev.tau_pos, rev.tau_neg) == (1.05, 1.0)
    ladder = [compose_run("dapo_ladder_32b", run) for run in RECIPES["dapo_ladder_32b"]["runs"]]
    assert [c.actor_rollout_ref.actor.clip_ratio_high for c in ladder] == [0.2, 0.2, 0.28, 0.28, 0.28, 0.28]
    assert [c.algorithm.adv_estimator for c in ladder] == ["grpo"] + ["grpo_overlong_filter"] * 4 + ["grpo"]
    assert [c.trainer.use_v1 for c in ladder] == [True] + [False] * 4 + [True]  # V1: dynamic sampling's trainer
    assert [c.reward.reward_manager.name for c in ladder] == ["naive"] * 3 + ["dapo"] * 3
    assert [c.actor_rollout_ref.actor.policy_loss.loss_mode for c in ladder] == \
        ["cliplab_grpo"] * 4 + ["cliplab_dapo"] * 2
    assert [bool(c.algorithm.filter_groups.enable) for c in ladder] == [False] * 5 + [True]
    assert ladder[3].reward.reward_kwargs.overlong_buffer_cfg.len == 4096
    assert compose_run("dcpo_math7b", "dcpo").trainer.use_v1 is False


def test_missing_paths_are_one_line_errors(tmp_path):
    from typer.testing import CliRunner

    from harness.cli import app
    r = RECIPES["dcpo_math7b"]
    result = CliRunner().invoke(app, ["recipe", "launch", "verl", str(r["folder"]), "dcpo", "--model",
                                      str(tmp_path / "Qwen2.5-Math-7B"), "--train", str(tmp_path), "--val",
                                      str(tmp_path), "--out", str(tmp_path)])
    err = result.output.strip().splitlines()
    assert result.exit_code == 2 and len(err) == 1 and str(tmp_path / "Qwen2.5-Math-7B") in err[0]
    (tmp_path / "m").mkdir()
    with pytest.raises(ValueError, match=f"--train: {tmp_path / 'nope.parquet'} does not exist"):
        recipes.verl_launch(r, "dcpo", {"model": tmp_path / "m", "train": tmp_path / "nope.parquet",
                                        "val": tmp_path}, tmp_path, [])
    cmd, _ = recipes.verl_launch(r, "dcpo", {"model": tmp_path / "m", "train": tmp_path, "val": tmp_path}, tmp_path,
                                 ["trainer.total_training_steps=2"])
    assert cmd[1:3] == ["-m", "verl.trainer.main_ppo"] and cmd[-1] == "trainer.total_training_steps=2"
    assert not (tmp_path / "dcpo_math7b").exists()  # building the command writes nothing
    import verl  # the launched command line is valid for verl's config too
    with initialize_config_dir(config_dir=os.path.join(os.path.dirname(verl.__file__), "trainer", "config"),
                               version_base=None):
        cfg = compose("ppo_trainer", overrides=cmd[3:])
    assert list(cfg.trainer.logger) == ["console", "file"] and cfg.trainer.total_training_steps == 2


def test_a_launch_runs_verls_trainer_with_cliplabs_plugin_and_keeps_its_logs(tmp_path, monkeypatch):
    """verl's trainer replaced by a process that prints as verl's console logger does: the launcher tees it into
    console.log, points verl's file logger into the run folder and loads cliplab's plug-in in every process."""
    import json
    seen = {}

    class FakeVerl:
        def __init__(self, cmd, env, stdout, stderr, text):
            seen.update(cmd=cmd, env=env)
            self.stdout, self.returncode = iter(["step:1 - actor/pg_clipfrac:0.01\n"]), 0

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False
    monkeypatch.setattr(recipes.subprocess, "Popen", FakeVerl)
    (tmp_path / "m").mkdir()
    paths = {"model": tmp_path / "m", "train": tmp_path, "val": tmp_path}
    recipes.launch_verl(RECIPES["dcpo_math7b"], "dcpo", paths, tmp_path, ["trainer.total_training_steps=7"])
    folder = tmp_path / "dcpo_math7b" / "dcpo"
    assert seen["env"]["VERL_FILE_LOGGER_PATH"] == str(folder / "verl.jsonl")
    assert seen["env"]["VERL_USE_EXTERNAL_MODULES"] == "gpu.integrations.verl_plugin"
    assert (folder / "console.log").read_text() == "step:1 - actor/pg_clipfrac:0.01\n"
    meta = json.loads((folder / "run.json").read_text())
    assert (meta["algorithm"], meta["steps"], meta["framework"]) == ("dcpo", 7, "verl")


def test_a_recipe_without_a_source_or_with_an_unknown_algorithm_is_refused(tmp_path):
    good = (RECIPES["gspo_vs_grpo"]["folder"] / "recipe.yaml").read_text()
    unsourced = good.replace(', "GSPO Sec. 5.1 (3e-4 / 4e-4)"]', "]", 1)
    for broken, expected in ((unsourced, "every setting needs its source"),
                             (good.replace("algorithm: gspo", "algorithm: gspox"), "runs.gspo.algorithm: expected"),
                             (good.replace("not_reproduced:", "skipped:"), "expected the keys")):
        (tmp_path / "recipe.yaml").write_text(broken)
        with pytest.raises(ValueError, match=f"^{tmp_path / 'recipe.yaml'}: .*{expected}"):
            recipes.load(tmp_path)


def test_gpu_hours_and_memory_equal_a_hand_computation():
    """dcpo_math7b's grpo run (KL loss: a reference forward) on H100, worked from Qwen2.5-Math-7B's config.json:
    N = 7.61e9 - 152064 * 3584 (the input embedding table out), L d = 28 * (28 heads * 128)."""
    b = recipe_cost.Budget(prompts=512, group=16, prompt_len=1024, response_len=3072, steps=400, ref=True)
    got = recipe_cost.gpu_hours("Qwen2.5-Math-7B", "H100", b)
    n, ld, seqs, speed = 7.61e9 - 544_997_376, 100_352, 512 * 16, 989e12 * 0.4
    pairs = 4096 * 4097 / 2  # causal token pairs of one 1024 + 3072-token sequence
    train = seqs * (10 * n * 4096 + 20 * ld * pairs)  # 6N + 2N + 2N per token; 12 + 4 + 4 L d per pair
    prefill = 512 * (2 * n * 1024 + 4 * ld * 1024 * 1025 / 2)  # once per prompt
    kv = 2 * 28 * 4 * 128 * 2
    decode_bytes = seqs / 256 * 3072 * 2 * 7.61e9 + seqs * kv * (1024 * 3072 + 3072 ** 2 / 2)
    decode_flops = seqs * (2 * n * 3072 + 4 * ld * (1024 * 3072 + 3072 * 3073 / 2))
    assert decode_bytes / 3.35e12 > decode_flops / speed  # decoding is memory-bound here
    hours = ((train + prefill) / speed + decode_bytes / 3.35e12) * 400 / 3600
    assert got["gpu_hours"] == pytest.approx(hours, rel=1e-12)
    assert got["train_flops_per_step"] == pytest.approx(train, rel=1e-12)
    assert 0.05 < got["train_attention_flops_per_step"] / (10 * n * 4096 * seqs) < 0.06  # attention adds ~5-6%
    # DAPO's 32B ladder at 22528 tokens: attention adds about a quarter to training (12 L d (T + 1) / 2 vs 6N)
    ladder = recipe_cost.gpu_hours("Qwen2.5-32B", "H200", recipe_cost.Budget(512, 16, 2048, 20480, 5000))
    share = ladder["train_attention_flops_per_step"] / (ladder["train_flops_per_step"] -
                                                        ladder["train_attention_flops_per_step"])
    assert share == pytest.approx(64 * 5120 * 12 * 22529 / 2 / (6 * (32.5e9 - 152064 * 5120)), rel=1e-12)
    assert 0.2 < share < 0.3
    mem = recipe_cost.memory_per_gpu("Qwen2.5-32B", "H100", 128, 22528, 0.8)
    assert mem["train"] == pytest.approx(16 * 32.5e9 / 128 + 22528 * 5120 * 64 * 2 + 22528 * 152064 * 4)
    assert mem["fits"] and not recipe_cost.memory_per_gpu("Qwen2.5-32B", "H100", 8, 22528, 0.8)["fits"]
    with pytest.raises(ValueError, match="model: expected one of"):
        recipe_cost.gpu_hours("llama", "H100", b)


def test_the_model_table_matches_each_models_published_sizes():
    """Heads x head_dim is the hidden size for Qwen2.5 (and twice it for Qwen3-30B-A3B); the non-embedding counts the
    model cards publish (Qwen2.5-7B 6.53B, Qwen2.5-32B 31.0B, Qwen3-30B-A3B 29.9B) are the totals less the input
    table and the untied head."""
    m = recipe_cost.MODELS
    assert m["Qwen2.5-Math-7B"].attention_width == 3584 and m["Qwen2.5-32B"].attention_width == 5120
    assert m["Qwen3-30B-A3B-Base"].attention_width == 4096
    for name, non_embedding in (("Qwen2.5-Math-7B", 6.53e9), ("Qwen2.5-32B", 31.0e9), ("Qwen3-30B-A3B-Base", 29.9e9)):
        assert m[name].params - 2 * m[name].vocab * m[name].hidden == pytest.approx(non_embedding, rel=0.01)
        assert "heads" in m[name].source and "KV heads" in m[name].source


def test_the_readme_cost_table_is_the_generated_one():
    text = (recipes.ROOT / "README.md").read_text()
    assert recipes.cost_table() in text


def test_the_trl_variant_builds_its_trainer_on_a_tiny_model(tmp_path, tiny_path):
    pytest.importorskip("trl")
    data = tmp_path / "train.jsonl"
    data.write_text('{"problem": "1 + 1 = ?", "answer": "2"}\n{"problem": "2 + 3 = ?", "answer": "5"}\n')
    r = RECIPES["dcpo_math7b"]
    small = dict(use_vllm=False, bf16=False, use_cpu=True, gradient_checkpointing=False, num_generations=2,
                 per_device_train_batch_size=2, gradient_accumulation_steps=1, max_completion_length=4, max_steps=1)
    for run in ("dcpo", "grpo", "gspo"):
        trainer = recipes.trl_trainer(r, run, {"model": tiny_path, "train": data}, tmp_path, **small)
        assert trainer.cliplab_algorithm == run and trainer.args.temperature == 1.0
        beta = 0.0 if run == "dcpo" else 0.001  # the k3 term (cliplab's, inside the token sum) needs TRL's ref
        assert trainer.args.learning_rate == 1e-6 and trainer.beta == beta
        assert trainer.cliplab_hparams.get("beta", 0.0) == beta
    import pandas as pd  # verl's RL parquet layout trains the TRL variant too (one data file for both frameworks)
    verl_layout = tmp_path / "train.parquet"
    pd.DataFrame({"data_source": ["math"], "prompt": [[{"role": "user", "content": "1 + 1 = ?"}]],
                  "reward_model": [{"ground_truth": "2", "style": "rule"}]}).to_parquet(verl_layout)
    trainer = recipes.trl_trainer(r, "dcpo", {"model": tiny_path, "train": verl_layout}, tmp_path, **small)
    assert trainer.train_dataset[0] == {"prompt": [{"role": "user", "content": "1 + 1 = ?"}], "answer": "2"}
    with pytest.raises(ValueError, match="has no TRL variant"):
        recipes.trl_trainer(r, "dapo", {"model": tiny_path, "train": data}, tmp_path)
