"""The verl plug-in inside verl 0.9.1's own trainer step on the CPU: ``ray_trainer.compute_advantage`` (what
``RayPPOTrainer.fit`` calls on the driver) with ``cliplab_sas`` and ``grpo_overlong_filter``, on batches laid out as
``fit`` lays them (a fresh uuid per prompt at every step, the dataset row's ``extra_info``, left-padded prompts), and
``RayPPOTrainer._save_checkpoint`` / ``_load_checkpoint`` with stand-in worker groups and data loader.

verl's ray_trainer imports torchdata's StatefulDataLoader, which the Makefile leaves out of the environment
(unused by what cliplab calls); where it is absent, torch's DataLoader stands in for it while the module loads."""
import os
import sys
import types
import uuid
from types import SimpleNamespace

import numpy as np
import pytest
import torch

pytest.importorskip("verl.trainer.ppo.core_algos")
from omegaconf import OmegaConf  # noqa: E402

import gpu  # noqa: E402
from gpu.integrations import verl_plugin  # noqa: E402

G, WIDTH, PROMPT_WIDTH = 4, 5, 4


@pytest.fixture(scope="module")
def ray_trainer():
    stubbed = []
    try:
        import torchdata.stateful_dataloader  # noqa: F401
    except ImportError:
        package, module = types.ModuleType("torchdata"), types.ModuleType("torchdata.stateful_dataloader")
        module.StatefulDataLoader = torch.utils.data.DataLoader
        package.stateful_dataloader = module
        stubbed = {"torchdata": package, "torchdata.stateful_dataloader": module}
        sys.modules.update(stubbed)
    try:
        from verl.trainer.ppo import ray_trainer
        assert verl_plugin._patch_trainer()
        yield ray_trainer
    finally:
        for name in stubbed:
            sys.modules.pop(name, None)


def step_batch(prompts, rewards, lengths=None, index=None):
    """One step's batch as RayPPOTrainer.fit has it at compute_advantage: G responses per prompt (interleaved),
    a new uid per prompt, the reward on each response's last token."""
    from verl import DataProto
    rows = len(prompts) * G
    lengths = np.full(rows, 3) if lengths is None else np.asarray(lengths)
    prompt_ids = torch.zeros(rows, PROMPT_WIDTH, dtype=torch.long)
    prompt_mask = torch.zeros(rows, PROMPT_WIDTH, dtype=torch.long)
    for r in range(rows):
        ids = prompts[r // G]
        prompt_ids[r, PROMPT_WIDTH - len(ids):] = torch.tensor(ids)  # left padding
        prompt_mask[r, PROMPT_WIDTH - len(ids):] = 1
    response_mask = torch.tensor([[1] * n + [0] * (WIDTH - n) for n in lengths])
    scores = torch.zeros(rows, WIDTH)
    scores[torch.arange(rows), torch.as_tensor(lengths) - 1] = torch.tensor(rewards, dtype=torch.float32).flatten()
    uids = [str(uuid.uuid4()) for _ in prompts]
    extra = [{} if index is None else {"index": index[r // G]} for r in range(rows)]
    return DataProto.from_dict(
        tensors={"prompts": prompt_ids, "responses": torch.randint(4, 60, (rows, WIDTH)),
                 "attention_mask": torch.cat([prompt_mask, response_mask], 1), "response_mask": response_mask,
                 "token_level_rewards": scores},
        non_tensors={"uid": np.array([uids[r // G] for r in range(rows)], dtype=object),
                     "extra_info": np.array(extra, dtype=object)})


def advantages(ray_trainer, data, estimator=verl_plugin.SAS_NAME):
    from verl.trainer.config import AlgoConfig
    out = ray_trainer.compute_advantage(data, adv_estimator=estimator, num_repeat=G,
                                        config=AlgoConfig(adv_estimator=estimator))
    return out.batch["advantages"]


@pytest.mark.parametrize("keyed_by", ["dataset index", "prompt token ids"])
def test_a_second_visit_of_an_all_equal_group_trains_with_its_history(ray_trainer, keyed_by):
    """Visit 1 of prompt P scores [1, 0, 1, 1]: history mean 3/4, population variance 3/16. Visit 2 scores all 1:
    pooled mean (1 + 3/4) / 2 = 7/8, variance (0 + 3/16) / 2 + (1/4)(1/4)^2 = 7/64, so every response gets
    A_total / i = (1 - 7/8) / sqrt(7/64) / 2 (DCPO Eq. 11-12, the new group's sigma being 0); a prompt Q seen for
    the first time with an all-equal group gets 0, as GRPO."""
    verl_plugin._SAS.smoother = gpu.SmoothAdvantage()
    p, q = [7, 8, 9], [11, 12]
    index = (lambda *ids: list(ids)) if keyed_by == "dataset index" else (lambda *ids: None)
    first = advantages(ray_trainer, step_batch([p], [[1, 0, 1, 1]], index=index(40)))
    assert first[:, 0].numpy() == pytest.approx(np.array([1, -3, 1, 1]) / 3 ** 0.5, rel=1e-6)  # GRPO, population std
    second = advantages(ray_trainer, step_batch([q, p], [[1, 1, 1, 1], [1, 1, 1, 1]], index=index(41, 40)))
    want = (1 - 7 / 8) / (7 / 64) ** 0.5 / 2
    assert second[:G].abs().max() == 0
    assert second[G:, :3].numpy() == pytest.approx(np.full((G, 3), want), rel=1e-6)
    assert second[G:, 3:].abs().max() == 0  # beyond each response's tokens


def test_the_history_rides_along_in_verls_checkpoints(ray_trainer, tmp_path):
    """RayPPOTrainer._save_checkpoint writes the SAS history into global_step_N/; _load_checkpoint of a new trainer
    restores it, so the resumed step computes what the uninterrupted run computes; a fresh run starts with none, and a
    checkpoint without the history is refused."""
    class Loader:  # verl's StatefulDataLoader's part that checkpoints use
        def state_dict(self):
            return {}

        def load_state_dict(self, state):
            pass

        def __len__(self):
            return 100

    def trainer():
        workers = SimpleNamespace(save_checkpoint=lambda path, *a, **k: os.makedirs(path, exist_ok=True),
                                  load_checkpoint=lambda *a, **k: None)
        config = OmegaConf.create({
            "algorithm": {"adv_estimator": verl_plugin.SAS_NAME},
            "trainer": {"default_local_dir": str(tmp_path), "default_hdfs_dir": None, "resume_mode": "auto",
                        "resume_from_path": None, "del_local_ckpt_after_load": False},
            "actor_rollout_ref": {"actor": {"checkpoint": {"async_save": False}}}})
        return SimpleNamespace(config=config, global_steps=0, actor_rollout_wg=workers, use_critic=False,
                               train_dataloader=Loader())

    cls = ray_trainer.RayPPOTrainer
    run = trainer()
    cls._load_checkpoint(run)  # nothing to resume: a fresh history
    assert verl_plugin._SAS.smoother.history == {}
    advantages(ray_trainer, step_batch([[5, 6]], [[1, 0, 0, 1]]))
    run.global_steps = 1
    cls._save_checkpoint(run)
    assert (tmp_path / "global_step_1" / verl_plugin.SAS_STATE).is_file()
    later = step_batch([[5, 6]], [[1, 1, 1, 1]])
    uninterrupted = advantages(ray_trainer, later)

    verl_plugin._SAS.smoother = gpu.SmoothAdvantage()  # a new driver process
    resumed = trainer()
    cls._load_checkpoint(resumed)
    assert resumed.global_steps == 1 and len(verl_plugin._SAS.smoother.history) == 1
    later.non_tensor_batch["uid"][:] = str(uuid.uuid4())  # verl's uid is new again after the restart
    assert torch.equal(advantages(ray_trainer, later), uninterrupted) and uninterrupted.abs().max() > 0

    os.remove(tmp_path / "global_step_1" / verl_plugin.SAS_STATE)
    with pytest.raises(ValueError, match=f"{verl_plugin.SAS_STATE}: missing"):
        cls._load_checkpoint(resumed)


def test_overlong_filter_masks_truncated_responses_out_of_the_loss(ray_trainer):
    """grpo_overlong_filter (DAPO Sec. 3.4): the responses that fill the response width leave the loss (mask and
    advantage 0); the others keep verl's own GRPO advantages, the group statistics counting every reward."""
    lengths = [5, 2, 3, 5, 1, 4, 5, 2]
    rewards = [[1, 0, 0, 1], [0, 1, 1, 0]]
    filtered = step_batch([[3, 4], [5]], rewards, lengths=lengths)
    plain = step_batch([[3, 4], [5]], rewards, lengths=lengths)
    got = advantages(ray_trainer, filtered, "grpo_overlong_filter")
    want = advantages(ray_trainer, plain, "grpo")
    truncated = torch.tensor(lengths) == WIDTH
    assert filtered.batch["response_mask"][truncated].abs().max() == 0 and got[truncated].abs().max() == 0
    assert torch.equal(filtered.batch["response_mask"][~truncated], plain.batch["response_mask"][~truncated])
    assert torch.allclose(got[~truncated], want[~truncated]) and want[truncated].abs().max() > 0


def test_batches_sas_cannot_key_are_one_line_errors(ray_trainer):
    clash = step_batch([[1, 2], [3]], [[1, 0, 1, 0], [0, 1, 1, 1]], index=[9, 9])
    with pytest.raises(ValueError, match="extra_info.index: 9 names two different prompts"):
        advantages(ray_trainer, clash)
    no_prompts = step_batch([[1, 2]], [[1, 0, 1, 0]])
    no_prompts.batch.pop("prompts")  # what verl's V1 trainer gives its advantage step
    with pytest.raises(ValueError, match="trainer.use_v1=False"):
        advantages(ray_trainer, no_prompts)
    no_prompts.batch.pop("responses")
    with pytest.raises(ValueError, match="overlong_filter needs the batch's responses"):
        advantages(ray_trainer, no_prompts, "grpo_overlong_filter")
