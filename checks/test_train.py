"""Training: train(). Run: pytest checks/test_train.py [--target FILE]

A learning curve is a noisy statistic, so this end-to-end check trains at one fixed seed whatever --seed
says (the unit checks vary their draws with --seed). The improvement is measured by this file's own sampler
on a fixed set of prompts, before and after training: a measure of the policy, not of the sampler under test.
"""
import copy
import math

import pytest
import torch

from checks import oracle
from checks.compare import at_least, close
from checks.oracle import expected_reward
from checks.stubs import memo
from grpo_katas.judge.contract import Rollout
from lab import ModelConfig, SumTask, TinyLM, encode, left_pad

pytestmark = pytest.mark.component("training")
STEPS, SEED = 32, 0
TASK = SumTask(max_target=6)
EVAL_PROMPTS = left_pad([encode(f"{t}=") for t in range(1, 7)])


def evaluate(policy) -> float:
    return expected_reward(policy, TASK, *EVAL_PROMPTS, samples=64, max_new_tokens=4, seed=SEED)


@pytest.fixture(scope="module")
def run(grpo):
    torch.manual_seed(SEED)
    policy = TinyLM(ModelConfig(d_model=32, n_layer=1, n_head=2, max_len=16))
    cfg = grpo.GRPOConfig(group_size=8, max_new_tokens=4, lr=1e-2)
    before = memo(evaluate, policy)
    history = grpo.train(policy, TASK, cfg, steps=STEPS, batch_size=8, seed=SEED)
    finite = all(torch.isfinite(p).all() for p in policy.parameters())
    return before, evaluate(policy) if finite else float("nan"), history


def test_history_has_one_entry_per_step(run):
    _, _, history = run
    assert isinstance(history, list) and len(history) == STEPS, (
        f"training: train(steps={STEPS}) returned {len(history) if isinstance(history, list) else short(history)} "
        f"entries; expected one stats dict per step")
    for key in ("reward_mean", "kl", "loss"):
        values = [h.get(key) if isinstance(h, dict) else h for h in history]
        bad = [(step, v) for step, v in enumerate(values, 1) if not (isinstance(v, (int, float)) and math.isfinite(v))]
        assert not bad, (
            f"training: the logged {key!r} at step {bad[0][0]} is {short(bad[0][1])}, and {len(bad)} of the "
            f"{len(values)} steps log no finite number; expected a finite number every step")


def short(value) -> str:
    """A value for a message: its repr, cut to 60 characters."""
    text = repr(value)
    return text if len(text) <= 60 else f"{text[:60]}... ({len(text)} characters)"


def test_training_raises_the_reward(run):
    before, after, _ = run
    assert math.isfinite(after), f"training: after {STEPS} steps the policy's weights hold NaN or inf"
    assert at_least(after, before + 0.15), (
        f"training: {STEPS} steps on the sum task took the policy's mean reward from {before:.2f} to {after:.2f}; "
        f"expected a gain above 0.15 (a healthy loop gains about 0.45 here)")


def test_reference_stays_frozen_while_the_policy_moves(run):
    kls = torch.tensor([float(h["kl"]) for h in run[2]], dtype=torch.float64)
    assert at_least(kls[1:].max(), 1e-4), (
        f"training: over {STEPS} steps of training the logged KL never exceeds {kls[1:].max():.2g}; expected it to "
        f"grow above 1e-4 as the policy moves away from where it started")


RANK_STEPS, RANK_BATCH, RANK_G = 3, 4, 4


@pytest.fixture(scope="module")
def ranks(grpo):
    """train on 2 data-parallel ranks (a gloo process group in the worker), each rank's task noting the
    parameters before every step and the rollout and rewards of the step."""
    torch.manual_seed(SEED)
    policy = TinyLM(ModelConfig(d_model=16, n_layer=1, n_head=2, max_len=16))
    cfg = grpo.GRPOConfig(group_size=RANK_G, max_new_tokens=4, lr=1e-2)
    kwargs = {"steps": RANK_STEPS, "batch_size": RANK_BATCH, "seed": SEED}
    copies = [copy.deepcopy(policy) for _ in range(2)]
    out = grpo.distributed("train", [((m, TASK, cfg), kwargs) for m in copies], record=True)
    return policy, cfg, copies, [r["records"] for r in out]


def test_two_ranks_train_as_one(ranks):
    policy, cfg, copies, records = ranks
    for rank, steps in enumerate(records):
        scored = [s for s in steps if "rewards" in s]
        assert len(steps) == RANK_STEPS and len(scored) == RANK_STEPS, (
            f"training: train(steps={RANK_STEPS}) on 2 data-parallel ranks drew prompts {len(steps)} time(s) and "
            f"scored {len(scored)} rollout(s) on rank {rank}; expected {RANK_STEPS} of each")
        for k, s in enumerate(steps):
            ids, P = s["input_ids"], s["prompt_len"]
            assert ids.shape[0] == RANK_BATCH * RANK_G, (
                f"training: at step {k + 1} rank {rank} scored {ids.shape[0]} completions for batch_size "
                f"{RANK_BATCH} and group_size {RANK_G}; expected {RANK_BATCH * RANK_G}")
            for g in range(RANK_BATCH):
                rows = ids[g * RANK_G:(g + 1) * RANK_G, :P]
                assert (rows == rows[0]).all(), (
                    f"training: at step {k + 1}, rows {g * RANK_G}..{(g + 1) * RANK_G - 1} of rank {rank}'s rollout "
                    f"hold different prompts; expected each run of group_size rows to share one")
    prompts = [[s["input_ids"][:, :s["prompt_len"]] for s in steps] for steps in records]   # (N, P) per step
    assert not all(torch.equal(a, b) for a, b in zip(*prompts)), (
        f"training: at every one of the {RANK_STEPS} steps both ranks drew the same {RANK_BATCH} prompts; expected "
        f"each rank to draw its own")
    for k in range(RANK_STEPS):
        assert not torch.equal(records[0][k]["input_ids"], records[1][k]["input_ids"]), (
            f"training: at step {k + 1} both ranks sampled the same {RANK_BATCH * RANK_G} completions of the same "
            f"prompts; expected each rank to draw its own")
    for k in range(1, RANK_STEPS + 1):
        a = records[0][k]["params"] if k < RANK_STEPS else copies[0].state_dict()
        b = records[1][k]["params"] if k < RANK_STEPS else copies[1].state_dict()
        gap = max(float((a[n] - b[n]).abs().max()) for n in a)
        assert all(close(a[n], b[n], atol=1e-6) for n in a), (
            f"training: after step {k} the two ranks' parameters differ by up to {gap:.3g}; expected data-parallel "
            f"ranks to hold the same parameters after every step")
    replay(policy, cfg, copies[0], records)


def replay(policy, cfg, final, records):
    """Each step of the 2-rank run against the oracle's AdamW step on both ranks' rollouts at once, from the
    parameters the run had before that step."""
    state = {}
    for k in range(RANK_STEPS):
        before = records[0][k]["params"]
        after = records[0][k + 1]["params"] if k + 1 < RANK_STEPS else final.state_dict()
        batch = Rollout(*(torch.cat([r[k][f] for r in records]) for f in ("input_ids", "attention_mask",
                                                                          "completion_mask")),
                        records[0][k]["prompt_len"])
        rewards = torch.cat([r[k]["rewards"] for r in records])
        # most targets' runs share their first steps (the same prompts and completions from the same weights),
        # and many the whole run: each step is worked out once
        stepped, state = memo(oracle_adamw_step, policy, before, cfg, batch, rewards, state)
        got = torch.cat([(after[n] - before[n]).double().reshape(-1) for n in before])
        want = torch.cat([(p - before[n].double()).reshape(-1) for n, p in stepped.items()])
        err = float((got - want).norm() / want.norm().clamp(min=1e-12))
        assert close(err, 0.0, atol=0.05), (
            f"training: step {k + 1} on 2 data-parallel ranks moved the parameters by {got.norm():.4g}; AdamW on "
            f"both ranks' rollouts and rewards together moves them by {want.norm():.4g}; the two moves differ by a "
            f"vector {err:.0%} as long as AdamW's "
            f"(cosine {float(torch.dot(got, want) / (got.norm() * want.norm()).clamp(min=1e-12)):+.3f})")


def oracle_adamw_step(policy, before, cfg, batch, rewards, state) -> tuple:
    """The oracle's AdamW step from the parameters `before`, against `policy` as the frozen reference, with the
    AdamW state `state` (left as it was): (the parameters after the step, the AdamW state after it)."""
    model = copy.deepcopy(policy).double()
    model.load_state_dict({n: t.double() for n, t in before.items()})
    state = dict(state)
    oracle.grpo_step(model, copy.deepcopy(policy).double(), cfg.lr, batch, rewards, cfg, adamw=state)
    return {n: p.detach() for n, p in model.named_parameters()}, state
