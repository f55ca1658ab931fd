"""The lab: the model's contract and the tasks. Run: pytest tests/test_lab.py"""
import pytest
import torch

from lab import EOS, PAD, ModelConfig, SumTask, CopyTask, TinyLM, encode, left_pad


def model(seed=0):
    torch.manual_seed(seed)
    return TinyLM(ModelConfig(d_model=32, n_layer=2, n_head=4))


def test_left_padding_scores_like_the_unpadded_row():
    m = model()
    row = torch.tensor([encode("12+3=4")])
    padded = torch.cat([torch.full((1, 3), PAD), row], 1)
    mask = torch.cat([torch.zeros(1, 3, dtype=torch.long), torch.ones_like(row)], 1)
    a = m(row, torch.ones_like(row))
    b = m(padded, mask)[:, 3:]
    assert torch.allclose(a, b, atol=1e-5)


def test_kv_cache_matches_full_recomputation():
    m = model(1)
    ids, mask = left_pad([encode("123="), encode("9=")])
    cache = m.make_cache()
    step = m(ids, mask, cache=cache)[:, -1]
    for tok in ([3, 4], [EOS, 5], [PAD, 6]):
        new = torch.tensor(tok)[:, None]
        ids = torch.cat([ids, new], 1)
        mask = torch.cat([mask, torch.ones_like(new)], 1)
        step = m(new, mask, cache=cache)[:, -1]
        assert torch.allclose(step, m(ids, mask)[:, -1], atol=1e-5)


def test_rewards_are_verifiable():
    class R:  # a rollout-shaped object
        def __init__(self, prompts, completions):
            p, _ = left_pad([encode(x) for x in prompts])
            c = [encode(x.rstrip("$")) + ([EOS] if x.endswith("$") else []) for x in completions]
            width = max(map(len, c))
            c = torch.tensor([r + [PAD] * (width - len(r)) for r in c])
            self.input_ids, self.prompt_len = torch.cat([p, c], 1), p.shape[1]

    assert SumTask().reward(R(["7=", "7=", "7="], ["34$", "7", "9$"])).tolist() == pytest.approx([1.0, 0.5, 1 - 2 / 7])
    assert CopyTask().reward(R(["318=", "5="], ["318$", "3"])).tolist() == [1.0, 0.0]
