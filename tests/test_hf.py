"""Real models: the Hugging Face adapter (lab/hf.py), the text tasks (lab/text.py), and the reference on them.

    .venv/bin/pip install -c constraints.txt -e '.[hf]'     # the optional extra; without it this file is skipped
    .venv/bin/python -m pytest -q tests/test_hf.py           # CPU, offline, about a minute

The models are small random LlamaForCausalLMs built from a LlamaConfig (and a GPT-2, whose positions are learned
and absolute). The user's path is taken whole where it matters: a folder written by save_pretrained, with a
tokenizer built with `tokenizers`, read back by from_pretrained through lab.hf.load.
"""
import copy
import json
import math
import subprocess
import sys

import pytest
import torch


transformers = pytest.importorskip("transformers", reason="transformers is not installed: the hf extra "
                                                          "(pip install -e '.[hf]') runs these tests")

from checks import oracle, stubs, test_logprobs, test_step  # noqa: E402
from grpo_katas import REFERENCE, ROOT  # noqa: E402
from grpo_katas.judge import contract  # noqa: E402
from grpo_katas.judge.client import Optimizer  # noqa: E402
from grpo_katas.training.loader import load_target  # noqa: E402
from grpo_katas.training.runs import ConfigError, RunConfig, build, frozen_reference  # noqa: E402
from grpo_katas.training.train import Trainer  # noqa: E402
from lab.hf import HFPolicy, encode_prompt, load, save_random_llama  # noqa: E402
from lab.text import INSTRUCTION, ArithTask, GSM8KTask, TextSumTask, final_number, make_text_task, problem, task_names  # noqa: E402
from tests.cli_helpers import ENV, cli  # noqa: E402
from tests.test_codebases import trl_loss  # noqa: E402


GRPO = load_target(REFERENCE)


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """A tiny random Llama with a chat template, saved as a user's checkpoint folder."""
    return save_random_llama(tmp_path_factory.mktemp("tiny-llama"))


@pytest.fixture(scope="module")
def policy(folder):
    torch.manual_seed(0)
    return load(str(folder))


def llama(vocab_size=12, seed=0, dtype=torch.float32, checkpointing=False) -> HFPolicy:
    """A small random Llama built from its config (no tokenizer), peaked enough that log-probs differ."""
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=vocab_size, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64,
                         initializer_range=0.3, bos_token_id=None, eos_token_id=None, pad_token_id=None)
    return HFPolicy(LlamaForCausalLM(config), gradient_checkpointing=checkpointing).to(dtype)


def gpt2(vocab_size=12, seed=0) -> HFPolicy:
    """A small random GPT-2: learned absolute positions, so a row scored at shifted positions scores differently."""
    from transformers import GPT2Config, GPT2LMHeadModel
    torch.manual_seed(seed)
    config = GPT2Config(vocab_size=vocab_size, n_embd=16, n_layer=2, n_head=2, n_positions=64, initializer_range=0.3,
                        bos_token_id=None, eos_token_id=None)
    return HFPolicy(GPT2LMHeadModel(config))


# ------------------------------------------------------------------------------------------- the adapter

def test_a_saved_folder_loads_as_any_checkpoint_does(folder, policy):
    """from_pretrained reads the folder unaided; the adapter adds a pad token apart from EOS (this tokenizer has
    none, as Llama's have none) and an embedding row for it, and prompts go through the chat template."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    plain = AutoModelForCausalLM.from_pretrained(folder)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    assert tokenizer.pad_token_id is None and tokenizer.chat_template
    assert policy.eos_id == tokenizer.eos_token_id and policy.pad_id not in (None, policy.eos_id)
    assert policy.model.get_input_embeddings().weight.shape[0] == len(policy.tokenizer) == len(tokenizer) + 1
    assert policy.model.get_input_embeddings().weight.shape[0] == plain.get_input_embeddings().weight.shape[0] + 1
    ids = encode_prompt(policy.tokenizer, "7=")
    assert policy.tokenizer.convert_ids_to_tokens(ids) == ["<|user|>", "7", "=", "<|assistant|>"]
    assert not policy.model.training
    assert all(not isinstance(m, torch.nn.Dropout) or m.p == 0 for m in policy.modules())


def test_a_tokenizer_whose_pad_is_its_eos_gets_a_pad_of_its_own(tmp_path):
    folder = save_random_llama(tmp_path / "m", chat_template=None)
    from transformers import AutoTokenizer
    tokenizer = AutoTokenizer.from_pretrained(folder)
    tokenizer.pad_token = tokenizer.eos_token  # what many fine-tuning scripts do, and what a loop must never see
    tokenizer.save_pretrained(folder)
    p = load(str(folder))
    assert p.pad_id != p.eos_id and p.tokenizer.convert_ids_to_tokens(p.pad_id) == "<|pad|>"
    assert encode_prompt(p.tokenizer, "7=") == p.tokenizer("7=")["input_ids"]  # no chat template: the plain text


def test_a_bad_model_is_one_line(tmp_path, monkeypatch):
    """A name that reads as a path is never sent to the hub (runs/x where runs/ exists, ./x, /x)."""
    (tmp_path / "empty").mkdir()
    monkeypatch.chdir(tmp_path)
    for name, words in [("empty", "without config.json"), ("empty/nowhere", "no such folder"),
                        (str(tmp_path / "nowhere"), "no such folder"), ("./nowhere", "no such folder")]:
        with pytest.raises(ConfigError) as info:
            build(RunConfig(hf_model=name, device="cpu"), torch.device("cpu"))
        assert info.value.setting == "hf_model" and words in str(info.value) and "\n" not in str(info.value)
    with pytest.raises(ConfigError, match="task must be one of sum, arith"):
        RunConfig(hf_model="x", task="copy")


@pytest.mark.parametrize("make", [llama, gpt2], ids=["llama (rotary)", "gpt2 (absolute positions)"])
def test_a_left_padded_row_scores_as_its_unpadded_twin(make):
    """Positions come from the mask. For GPT-2's learned positions HF's own default (0..L-1) is a different input,
    so this test fails without them; for rotary models it would differ only by rounding."""
    model = make()
    row = torch.tensor([[3, 7, 2, 9, 4, 5]])
    padded = torch.cat([torch.zeros(1, 4, dtype=torch.long), row], 1)
    mask = torch.cat([torch.zeros(1, 4, dtype=torch.long), torch.ones_like(row)], 1)
    with torch.no_grad():
        alone = model(row, torch.ones_like(row))
        got = model(padded, mask)[:, 4:]
        raw = model.model(input_ids=padded, attention_mask=mask).logits[:, 4:]  # HF without position_ids
    assert (got - alone).abs().max() < 1e-5
    if make is gpt2:
        assert (raw - alone).abs().max() > 1e-2, "this model does not show the positions: the test would not bite"


def test_the_kv_cache_is_the_models_own_and_matches_full_recomputation(policy):
    ids = torch.tensor([[24, 24, 2, 8, 13, 3], [2, 9, 9, 13, 14, 3]])
    mask = (ids != 24).long()
    cache = policy.make_cache()
    assert isinstance(cache, transformers.DynamicCache)
    with torch.no_grad():
        policy(ids, mask, cache=cache)
        for tok, att in (([6, 7], [1, 1]), ([1, 8], [1, 1]), ([24, 9], [0, 1])):  # EOS, then pad with attention 0
            new = torch.tensor(tok)[:, None]
            ids, mask = torch.cat([ids, new], 1), torch.cat([mask, torch.tensor(att)[:, None]], 1)
            step = policy(new, mask, cache=cache)[:, -1]
            assert (step - policy(ids, mask)[:, -1]).abs().max() < 1e-5
    assert cache.get_seq_length() == ids.shape[1]


def test_generate_on_the_adapter_keeps_the_rollout_contract(policy):
    """Groups contiguous, pad with attention 0 after EOS, the sampler's log-probs are the model's own, and the
    KV-cached tokens are the ones full recomputation draws with the same generator."""
    task = TextSumTask(policy.tokenizer)
    prompts, prompt_mask = task.sample_prompts(3, torch.Generator().manual_seed(0))
    cfg = GRPO.GRPOConfig(group_size=4, max_new_tokens=8, temperature=0.7)

    class NoCache(torch.nn.Module):
        def __init__(self, m):
            super().__init__()
            self.m = m

        def forward(self, ids, mask):
            return self.m(ids, mask)

    r = GRPO.generate(policy, prompts, prompt_mask, cfg, eos_id=task.eos_id, pad_id=task.pad_id,
                      generator=torch.Generator().manual_seed(1))
    full = GRPO.generate(NoCache(policy), prompts, prompt_mask, cfg, eos_id=task.eos_id, pad_id=task.pad_id,
                         generator=torch.Generator().manual_seed(1))
    assert torch.equal(r.input_ids, full.input_ids) and torch.equal(r.attention_mask, full.attention_mask)
    P = r.prompt_len
    assert all(torch.equal(r.input_ids[n, :P], prompts[n // 4]) for n in range(12))
    done = r.completion_mask == 0
    assert (r.input_ids[:, P:][done] == task.pad_id).all() and (r.attention_mask[:, P:][done] == 0).all()
    with torch.no_grad():
        scored = GRPO.token_logprobs(policy, r.input_ids, r.attention_mask, P, 0.7)
    keep = r.completion_mask.bool()
    assert (r.sampler_logp - scored)[keep].abs().max() < 1e-5


# ------------------------------------------------------------------- the checks that judge any model

class InProcess:
    """The reference as the checks call it, in this process instead of the judge's worker: the checks' configs,
    rollouts and optimizer descriptions become the reference's own objects (the judge does this on the wire, which
    carries only the lab model)."""

    Rollout = contract.Rollout
    GRPOConfig = staticmethod(contract.Config)

    def __getattr__(self, name):
        fn = getattr(GRPO, name)

        def call(*args, **kwargs):
            counted = []
            args = [self.own(a, counted) for a in args]
            kwargs = {k: self.own(v, counted) for k, v in kwargs.items()}
            result = fn(*args, **kwargs)
            for described, steps in counted:
                described.steps += len(steps)
            return result
        return call

    @staticmethod
    def own(value, counted):
        if isinstance(value, contract.Config):
            return GRPO.GRPOConfig(**value.overrides)
        if isinstance(value, contract.Rollout):
            return GRPO.Rollout(**vars(value))
        if isinstance(value, Optimizer):
            real = getattr(torch.optim, value.name)(value.model.parameters(), **value.hyper)
            steps = []
            real.register_step_post_hook(lambda *_: steps.append(1))
            counted.append((value, steps))
            return real
        return value


MODEL_CHECKS = [  # every check that takes a model from stubs.tiny_lm; the rest never see one
    (test_logprobs, "test_logprobs_score_the_next_token"), (test_logprobs, "test_logprobs_use_the_sampling_temperature"),
    (test_logprobs, "test_left_padding_does_not_change_logprobs"),
    *[(test_step, name) for name in ("test_one_step_moves_the_policy_like_the_oracle",
                                     "test_stale_gradients_are_cleared", "test_gradient_is_clipped_before_the_step",
                                     "test_one_optimizer_step_per_iteration",
                                     "test_policy_gradient_flows_through_the_ratio",
                                     "test_one_step_follows_the_configured_objective",
                                     "test_gradient_accumulation_matches_the_full_batch",
                                     "test_first_update_sees_a_ratio_of_one")],
]


def adapter_lm(gen, vocab_size=12, dtype=torch.float32) -> HFPolicy:
    """stubs.tiny_lm's stand-in: a small Llama behind the adapter, seeded from the check's generator."""
    return llama(vocab_size, int(torch.randint(0, 2**31 - 1, (1,), generator=gen)), dtype)


@pytest.mark.parametrize("module, name", MODEL_CHECKS, ids=[n for _, n in MODEL_CHECKS])
def test_the_reference_passes_the_model_checks_on_the_adapter(module, name, monkeypatch):
    """The hidden checks of log-probs and the update, with every model they build a Llama behind the adapter.
    (The checks of sampling, advantages, the KL and the loss never call a model; those of train build the lab
    model themselves, and the one of two ranks runs in the judge: test_make_train_raises_the_reward stands for
    training here.)"""
    monkeypatch.setattr(module, "tiny_lm", adapter_lm)
    check = getattr(module, name)
    if "draw" in check.__code__.co_varnames[:check.__code__.co_argcount]:
        for draw in stubs.DRAWS:
            check(InProcess(), 0, draw)
    else:
        check(InProcess(), 0)


def test_the_checks_see_the_adapter(monkeypatch):
    """The substitution above is real: the checks' model is the adapter, and a loop that scores without the mask's
    positions fails the left-padding check on a model with absolute positions."""
    seen = []
    monkeypatch.setattr(test_logprobs, "tiny_lm", lambda gen, V: seen.append(1) or gpt2(V))

    class NoPositions(InProcess):
        def __getattr__(self, name):
            if name != "token_logprobs":
                return super().__getattr__(name)

            def scored(model, ids, mask, P, temperature):  # HF's default positions 0..L-1
                logits = model.model(input_ids=ids, attention_mask=mask).logits[:, P - 1:-1].float() / temperature
                return torch.log_softmax(logits, -1).gather(-1, ids[:, P:, None]).squeeze(-1)
            return scored
    test_logprobs.test_left_padding_does_not_change_logprobs(InProcess(), 0, 0)
    with pytest.raises(AssertionError, match="left-padded prompts"):
        for draw in stubs.DRAWS:
            test_logprobs.test_left_padding_does_not_change_logprobs(NoPositions(), 0, draw)
    assert seen


def test_gradient_checkpointing_takes_the_same_step():
    """Checkpointing trades compute for memory and nothing else: the same update, and a ratio of exactly 1 on the
    first iteration (train and eval mode compute the same numbers: dropout is 0)."""
    gen = torch.Generator().manual_seed(3)
    ids, att, comp_mask, P = stubs.random_batch(gen, 8, 12, 4)
    rollout = GRPO.Rollout(ids, att, comp_mask, P)
    rewards = torch.rand(8, generator=gen)
    cfg = GRPO.GRPOConfig(group_size=4, num_iterations=2)
    moved = []
    for checkpointing in (False, True):
        policy = llama(seed=4, checkpointing=checkpointing)
        calls, mlp = [], policy.model.model.layers[0].mlp  # with checkpointing, backward runs each layer again
        mlp.forward = lambda x, forward=mlp.forward: calls.append(1) or forward(x)
        policy(ids, att).sum().backward()
        assert len(calls) == 1 + checkpointing
        policy.zero_grad(set_to_none=True)
        ref = frozen_reference(policy)
        before = torch.cat([p.detach().reshape(-1).clone() for p in policy.parameters()])
        stats = GRPO.grpo_step(policy, ref, torch.optim.SGD(policy.parameters(), lr=0.5), rollout, rewards, cfg)
        assert stats["ratio_dev"] == 0.0 and not any(p.requires_grad for p in ref.parameters())
        moved.append(torch.cat([p.detach().reshape(-1) for p in policy.parameters()]) - before)
    assert moved[1].norm() > 0 and (moved[0] - moved[1]).norm() < 1e-6 * moved[0].norm()


# ------------------------------------------------------------------------------------------------- TRL

def trl_selective_log_softmax(logits, index):
    """huggingface/trl trl/trainer/utils.py selective_log_softmax at main f2cd577, the float32/float64 branch."""
    squeeze = index.ndim == logits.ndim - 1
    if squeeze:
        index = index.unsqueeze(-1)
    selected_logits = torch.gather(logits, dim=-1, index=index)
    logsumexp_values = torch.stack([torch.logsumexp(lg, dim=-1) for lg in logits])
    per_token_logps = selected_logits - logsumexp_values.unsqueeze(-1)
    if squeeze:
        per_token_logps = per_token_logps.squeeze(-1)
    return per_token_logps


def trl_per_token_logps(model, input_ids, attention_mask, logits_to_keep, temperature, batch_size=None):
    """GRPOTrainer._get_per_token_logps_and_entropies at main f2cd577 (L1435-1530), for a text-only causal LM that
    takes logits_to_keep, without entropies or aux loss: the model gets input_ids and attention_mask and no
    position_ids; the last logit is dropped, the last logits_to_keep kept, divided by the temperature."""
    batch_size = batch_size or input_ids.size(0)
    all_logps = []
    for start in range(0, input_ids.size(0), batch_size):
        input_ids_batch = input_ids[start: start + batch_size]
        attention_mask_batch = attention_mask[start: start + batch_size]
        model_inputs = {"input_ids": input_ids_batch, "attention_mask": attention_mask_batch}
        model_inputs["logits_to_keep"] = logits_to_keep + 1
        model_inputs["use_cache"] = False
        outputs = model(**model_inputs)
        logits = outputs.logits
        logits = logits[:, :-1, :]
        logits = logits[:, -logits_to_keep:, :]
        logits.div_(temperature)
        completion_ids = input_ids_batch[:, -logits_to_keep:]
        logps = trl_selective_log_softmax(logits, completion_ids)
        all_logps.append(logps)
    return torch.cat(all_logps, dim=0)


def test_the_references_log_probs_and_loss_equal_trls_on_a_llama(policy):
    """The same rollout of the tiny Llama (float32, TRL's bf16=False), left-padded prompts included: pi, pi_old and
    pi_ref as TRL's _get_per_token_logps_and_entropies computes them on the bare HF model, then TRL's _compute_loss
    (tests/test_codebases.py), against the reference's token_logprobs on the adapter and grpo_loss, for each loss
    type: the same values and the same gradient on every parameter. (TRL passes no position_ids: for a rotary
    model the shifted positions of a padded row change only the rounding, so the two agree to float32 precision.)"""
    policy = copy.deepcopy(policy)
    task = TextSumTask(policy.tokenizer)
    prompts, prompt_mask = task.sample_prompts(4, torch.Generator().manual_seed(5))
    assert (prompt_mask == 0).any(), "the prompts should include left-padded ones"
    r = GRPO.generate(policy, prompts, prompt_mask, GRPO.GRPOConfig(group_size=3, max_new_tokens=6, temperature=0.9),
                      eos_id=task.eos_id, pad_id=task.pad_id, generator=torch.Generator().manual_seed(6))
    ref = frozen_reference(policy)
    with torch.no_grad():
        for p in ref.parameters():
            p.add_(torch.randn(p.shape, generator=torch.Generator().manual_seed(7)) * 0.05)
        old = copy.deepcopy(policy)
        for p in old.parameters():
            p.add_(torch.randn(p.shape, generator=torch.Generator().manual_seed(8)) * 0.05)
    T, P, mask = r.completion_mask.shape[1], r.prompt_len, r.completion_mask
    rewards = task.reward(r)
    adv = GRPO.group_advantages(rewards, 3, 1e-4)
    args = (r.input_ids, r.attention_mask)
    for loss_type in ("grpo", "bnpo", "dr_grpo", "dapo"):
        cfg = GRPO.GRPOConfig(group_size=3, temperature=0.9, loss_type=loss_type, clip_eps_high=0.28,
                              max_new_tokens=6)
        with torch.no_grad():
            ours_old, ours_ref = (GRPO.token_logprobs(m, *args, P, 0.9) for m in (old, ref))
            trl_old, trl_ref = (trl_per_token_logps(m.model, *args, T, 0.9) for m in (old, ref))
        policy.zero_grad()
        ours_logp = GRPO.token_logprobs(policy, *args, P, 0.9)
        ours = GRPO.grpo_loss(ours_logp, ours_old, ours_ref, adv, mask, cfg)
        ours.backward()
        ours_grad = [p.grad.clone() for p in policy.parameters()]
        policy.zero_grad()
        trl_logp = trl_per_token_logps(policy.model, *args, T, 0.9)
        trl = trl_loss(trl_logp, trl_old, trl_ref, adv, mask, trl_old, loss_type=loss_type, beta=cfg.beta,
                       epsilon_low=0.2, epsilon_high=0.28, cap=math.inf, max_completion_length=6)
        trl.backward()
        keep = mask.bool()
        for a, b in ((ours_logp, trl_logp), (ours_old, trl_old), (ours_ref, trl_ref)):
            assert (a.detach() - b.detach())[keep].abs().max() < 1e-5
        assert math.isclose(ours.item(), trl.item(), rel_tol=1e-4, abs_tol=1e-6), (loss_type, ours, trl)
        for g, p in zip(ours_grad, policy.parameters()):
            assert (g - p.grad).abs().max() <= 1e-4 * p.grad.abs().max() + 1e-7, loss_type


# ----------------------------------------------------------------------------------------- the text tasks

def test_the_final_number_is_parsed_as_gsm8k_writes_it():
    assert final_number("So 12 + 30 = 42.\n#### 42") == 42
    assert final_number("4 packs of 6 is 24, minus 4 leaves 20") == 20
    assert final_number("#### 1,250") == 1250 and final_number("it costs $3.50") == pytest.approx(3.5)
    assert final_number("#### -7") == -7 and final_number("no number here") is None
    assert final_number("#### 5 apples then 9") == 9  # "####" counts only where it closes the answer


class Rows:
    """A rollout of the task's own prompts, completions given as text."""

    def __init__(self, task, prompts, texts, ended):
        rows = [task.tokenizer(t, add_special_tokens=False)["input_ids"] + ([task.eos_id] if e else [])
                for t, e in zip(texts, ended)]
        width = max(map(len, rows))
        comp = torch.tensor([r + [task.pad_id] * (width - len(r)) for r in rows])
        self.input_ids = torch.cat([prompts.repeat_interleave(len(texts) // len(prompts), 0), comp], 1)
        self.prompt_len = prompts.shape[1]


def test_the_text_sum_task_rewards_as_the_lab_sum_task(policy):
    task = make_text_task("sum", policy.tokenizer)
    prompts, _ = task.sample_prompts(1, torch.Generator().manual_seed(0))
    t = task.answers[tuple(p for p in prompts[0].tolist() if p != task.pad_id)]
    texts = [str(t) if t < 10 else "9" + str(t - 9), "1" * (t + 2), "+" + str(min(t, 9)), str(min(t, 9))]
    got = task.reward(Rows(task, prompts, texts, [True, True, True, False])).tolist()
    lab = [1.0, max(0.0, 1 - 2 / t), min(t, 9) / t / 2, min(t, 9) / t / 2]
    assert got == pytest.approx(lab)


def test_arith_problems_come_from_the_seed_and_score_the_final_number(policy):
    task = ArithTask(policy.tokenizer)
    a = [task.draw(torch.Generator().manual_seed(3)) for _ in range(2)]
    assert a[0] == a[1] and len({task.draw(torch.Generator().manual_seed(s))[0] for s in range(20)}) > 10
    for kind in range(5):  # every template's answer is a positive whole number
        rng = iter([0, 5, 0, 20, 6, 3] * 2)
        question, answer = problem(kind, lambda lo, hi: max(lo, min(hi, next(rng))))
        assert question.endswith("?") and isinstance(answer, int) and answer > 0
    assert task.score(42, "30 and 12 make 42", True) == 1.0 and task.score(42, "#### 41", True) == 0.0
    shaped = make_text_task("arith-format", policy.tokenizer)
    assert shaped.score(42, "30 + 12 = 42\n#### 42", True) == pytest.approx(1.0)
    assert shaped.score(42, "30 + 12 = 42", True) == pytest.approx(0.9)
    assert shaped.score(42, "#### 41", True) == pytest.approx(0.1)
    assert shaped.score(42, "#### 42", False) == pytest.approx(0.9)  # no EOS: not the format
    prompts, _ = task.sample_prompts(2, torch.Generator().manual_seed(1))
    with pytest.raises(ValueError, match="did not draw"):
        make_text_task("arith", policy.tokenizer).reward(Rows(task, prompts, ["1", "2"], [True, True]))
    assert set(task_names()) == {"sum", "arith", "gsm8k", "arith-format", "gsm8k-format"}


def test_gsm8k_says_in_one_line_why_it_cannot_load(policy, monkeypatch):
    import builtins
    real_import = builtins.__import__

    def no_datasets(name, *args, **kwargs):
        if name == "datasets":
            raise ImportError(name)
        return real_import(name, *args, **kwargs)
    monkeypatch.setattr(builtins, "__import__", no_datasets)
    with pytest.raises(ValueError) as info:
        make_text_task("gsm8k", policy.tokenizer)
    assert "datasets" in str(info.value) and "\n" not in str(info.value)
    monkeypatch.setattr(builtins, "__import__", real_import)

    class OfflineDatasets:  # the package is there, the hub is not
        @staticmethod
        def load_dataset(*args, **kwargs):
            raise ConnectionError("Couldn't reach 'openai/gsm8k' on the Hub (LocalEntryNotFoundError)\nmore")
    monkeypatch.setitem(sys.modules, "datasets", OfflineDatasets)
    with pytest.raises(ValueError) as info:
        make_text_task("gsm8k", policy.tokenizer)
    assert "out of reach" in str(info.value) and "\n" not in str(info.value)
    rows = [{"question": "What is 6 times 7?", "answer": "6 * 7 = 42\n#### 42"}]
    task = GSM8KTask(policy.tokenizer, load=lambda: rows)
    assert task.draw(torch.Generator()) == (f"What is 6 times 7? {INSTRUCTION}", 42)


# ------------------------------------------------------------------------------------- the trainer and make

def test_make_train_raises_the_reward_and_writes_its_run(folder, tmp_path):
    """`make train MODEL=<tiny folder> STEPS=20 DEVICE=cpu` as the trainer runs it: the live display, metrics, a
    checkpoint, and the reward of the text sum task up by more than 0.1 (it goes about 0.16 -> 0.36)."""
    out = tmp_path / "run"
    r = subprocess.run([sys.executable, "-m", "grpo_katas.training.train", "--hf-model", str(folder), "--steps", "20",
                        "--device", "cpu", "--out", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=600,
                       env={**ENV, "OMP_NUM_THREADS": "1"})
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"model {folder}" in r.stdout and "step   20 | reward" in r.stdout
    lines = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [s["step"] for s in lines] == list(range(1, 21)) and (out / "checkpoint.pt").exists()
    assert (out / "model" / "config.json").exists() and "model/" in r.stdout  # the trained model, save_pretrained
    assert json.loads((out / "config.json").read_text())["run"]["hf_model"] == str(folder)
    first, last = (sum(s["reward_mean"] for s in part) / 5 for part in (lines[:5], lines[-5:]))
    assert last > first + 0.1, (first, last)


def test_a_resumed_run_on_the_adapter_matches_an_uninterrupted_one(folder, tmp_path):
    small = dict(hf_model=str(folder), steps=4, batch_size=4, device="cpu", checkpoint_every=2,
                 grpo={"group_size": 4})
    straight = Trainer(RunConfig(**small)).fit()
    Trainer(RunConfig(**{**small, "steps": 2}), tmp_path).fit()
    resumed = Trainer.resume(tmp_path, steps=4)
    assert resumed.step == 2 and isinstance(resumed.policy, HFPolicy)
    rest = resumed.fit()
    for a, b in zip(straight[2:], rest, strict=True):
        assert a["reward_mean"] == b["reward_mean"] and a["loss"] == pytest.approx(b["loss"], abs=1e-6)
        assert a["kl"] == pytest.approx(b["kl"], abs=1e-6)


def test_a_trained_hugging_face_model_is_saved_as_one_with_its_tokenizer(folder, tmp_path):
    """OUT/model holds the trained weights and the tokenizer (its pad token included), as save_pretrained writes
    them: from_pretrained reads them back, and MODEL=OUT/model trains on from there."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    trainer = Trainer(RunConfig(hf_model=str(folder), steps=2, batch_size=2, device="cpu", grpo={"group_size": 2}),
                      tmp_path)
    trainer.fit()
    saved = AutoModelForCausalLM.from_pretrained(tmp_path / "model")
    trained = trainer.policy.model.state_dict()
    assert all(torch.equal(v, trained[k]) for k, v in saved.state_dict().items())
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "model")
    assert tokenizer.pad_token_id == trainer.policy.tokenizer.pad_token_id != tokenizer.eos_token_id
    again = load(str(tmp_path / "model"))
    assert torch.equal(again.model.get_input_embeddings().weight, trained["model.embed_tokens.weight"])
    assert not (tmp_path / ".model-saving").exists()


def test_the_word_problems_take_a_real_models_settings(folder):
    from grpo_katas.training.runs import grpo_config
    arith = grpo_config(GRPO, RunConfig(hf_model=str(folder), task="arith"))
    assert (arith.lr, arith.max_new_tokens, arith.grad_accum_steps) == (1e-6, 256, 8)
    assert grpo_config(GRPO, RunConfig(hf_model=str(folder), task="arith", grpo={"lr": 1e-5})).lr == 1e-5
    assert grpo_config(GRPO, RunConfig(hf_model=str(folder))).lr == GRPO.GRPOConfig().lr  # sum: the tiny's task


def test_one_switch_in_every_make_target():
    """MODEL= reaches each command (make -n prints the commands without running them)."""
    for target, flag in [("train", "--hf-model 'm'"), ("run N=9", "--hf-model 'm'"), ("bench", "--hf-model 'm'"),
                         ("gpu-check", "--hf-model 'm'")]:
        r = subprocess.run(["make", "-n", "-o", ".venv/.installed", *target.split(), "MODEL=m"], cwd=ROOT,
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == 0 and flag in r.stdout, (target, r.stdout + r.stderr)


@pytest.mark.slow
def test_make_run_runs_a_kata_on_the_adapter(repo, folder):
    """`make run N=9 MODEL=<tiny folder>`: the kata's own loop, unchanged, on the Llama, with its table, beside a
    healthy run on the same model; a model that cannot load is one line, not the loop's crash."""
    cli(repo, "kata", "9")
    code, out = cli(repo, "run", "9", "--hf-model", str(folder), "--steps", "3")
    assert "kata 9: work/09-nan-storm/grpo.py" in out and "step  reward" in out and "healthy" in out, out
    assert f"sum task, seed 0, 3 steps, {folder} on cpu; GRPOConfig:" in out  # the header names the model
    assert code == 1 and "your loop raised" in out or code == 0, out  # kata 9's NaN may end it at once
    code, out = cli(repo, "run", "9", "--hf-model", str(repo / "no-such-model"), "--steps", "3")
    assert code == 2 and "--hf-model cannot load the model" in out and "your loop raised" not in out, out


def test_the_gpu_check_trains_a_real_model_on_the_cpu(folder, capsys):
    """The real-model stage of make gpu-check, at its --small sizes (its GPU figures are measured only on a GPU)."""
    from grpo_katas.training.gpu_check import real_model
    assert real_model(torch.device("cpu"), str(folder), small=True)
    out = capsys.readouterr().out
    assert "sampled tokens/s" in out and "peak memory" in out and "reward" in out and "FAIL" not in out, out


def test_the_random_half_billion_llama_has_qwen_s_shapes():
    """The model make gpu-check builds when no checkpoint is on disk: Qwen2.5-0.5B's 494 M parameters (no biases)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from lab.hf import SIZES
    with torch.device("meta"):  # counted, never allocated
        model = LlamaForCausalLM(LlamaConfig(**SIZES["0.5b"]))
    assert 0.45e9 < sum(p.numel() for p in model.parameters()) < 0.55e9


def test_make_bench_measures_the_model(folder, capsys):
    from grpo_katas.training import bench
    assert bench.main(["--quick", "--device", "cpu", "--hf-model", str(folder)]) == 0
    out = capsys.readouterr().out
    assert "KV cache speed-up" in out and "reward over 3 steps" in out and "data parallel" not in out, out
