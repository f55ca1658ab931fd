"""A tokenizer and toy tasks with verifiable rewards, small enough that GRPO visibly learns on a CPU in seconds.

Task interface (what `train` relies on):
    task.eos_id, task.pad_id
    task.sample_prompts(batch_size, generator) -> prompt_ids (B, P), prompt_mask (B, P)   (left-padded)
    task.reward(rollout) -> (N,) float32, computed from the tokens alone, no grad
"""
import torch

PAD, EOS = 0, 1
CHARS = "0123456789+="                 # token ids 2 .. 13
VOCAB_SIZE = 16                        # 14 used, 2 spare
DIGIT0 = 2


def encode(text: str) -> list[int]:
    return [DIGIT0 + CHARS.index(c) for c in text]


def decode(ids) -> str:
    out = []
    for i in (int(i) for i in ids):
        if i == EOS:
            out.append("$")
            break
        out.append("" if i == PAD else CHARS[i - DIGIT0] if DIGIT0 <= i < DIGIT0 + len(CHARS) else "?")
    return "".join(out)


def left_pad(rows: list[list[int]]):
    """Token lists -> (ids (B, P), mask (B, P)), padded on the left."""
    P = max(len(r) for r in rows)
    ids = torch.full((len(rows), P), PAD, dtype=torch.long)
    mask = torch.zeros((len(rows), P), dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, P - len(r):] = torch.tensor(r)
        mask[i, P - len(r):] = 1
    return ids, mask


def completions(rollout) -> list[list[int]]:
    """The completion of each row up to (not including) its first EOS, and whether it had one."""
    ids = rollout.input_ids[:, rollout.prompt_len:].tolist()
    out = []
    for row in ids:
        end = row.index(EOS) if EOS in row else None
        out.append((row[:end] if end is not None else row, end is not None))
    return out


class SumTask:
    """Prompt: a target t (1..max_target) written in digits, then '='. The completion should be digits
    that add up to t, then EOS ("7=" -> "34$" or "7$"). Reward: 1 - |sum - t| / t, floored at 0, where sum
    adds the digits before the first EOS; any other token there, or no EOS at all, halves the reward."""

    name = "sum"
    eos_id, pad_id = EOS, PAD

    def __init__(self, max_target: int = 12):
        self.max_target = max_target

    def sample_prompts(self, batch_size: int, generator=None):
        t = torch.randint(1, self.max_target + 1, (batch_size,), generator=generator).tolist()
        return left_pad([encode(f"{x}=") for x in t])

    def reward(self, rollout) -> torch.Tensor:
        targets = [int(decode(p).rstrip("=")) for p in rollout.input_ids[:, :rollout.prompt_len]]
        out = []
        for t, (toks, ended) in zip(targets, completions(rollout)):
            digits = [i - DIGIT0 for i in toks if DIGIT0 <= i < DIGIT0 + 10]
            r = max(0.0, 1.0 - abs(sum(digits) - t) / t)
            clean = ended and len(digits) == len(toks)
            out.append(r if clean else r / 2)
        return torch.tensor(out, dtype=torch.float32)


class CopyTask:
    """Prompt: k random digits (min_len <= k <= max_len), then '='. The completion should repeat them, then
    EOS ("318=" -> "318$"). Reward, partial credit: the share of the k + 1 target tokens (digits and the
    closing EOS) emitted at the right place."""

    name = "copy"
    eos_id, pad_id = EOS, PAD

    def __init__(self, min_len: int = 1, max_len: int = 3):
        self.min_len, self.max_len = min_len, max_len

    def sample_prompts(self, batch_size: int, generator=None):
        lens = torch.randint(self.min_len, self.max_len + 1, (batch_size,), generator=generator).tolist()
        rows = [torch.randint(0, 10, (k,), generator=generator).tolist() for k in lens]
        return left_pad([[DIGIT0 + d for d in r] + encode("=") for r in rows])

    def reward(self, rollout) -> torch.Tensor:
        P = rollout.prompt_len
        out = []
        for prompt, row in zip(rollout.input_ids[:, :P].tolist(), rollout.input_ids[:, P:].tolist()):
            target = [i for i in prompt if i != PAD][:-1] + [EOS]
            hits = sum(1 for a, b in zip(row, target) if a == b)
            out.append(hits / len(target))
        return torch.tensor(out, dtype=torch.float32)


TASKS = {"sum": SumTask, "copy": CopyTask}


def make_task(name: str):
    if name not in TASKS:
        raise ValueError(f"unknown task {name!r}; choose one of: {', '.join(TASKS)}")
    return TASKS[name]()
