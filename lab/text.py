"""Text tasks with verifiable rewards, for a real tokenizer and a real model (lab/hf.py).

Same interface as lab/tasks.py: task.eos_id, task.pad_id, sample_prompts(batch_size, generator) -> left-padded
(ids (B, P), mask (B, P)), reward(rollout) -> (N,) float32 from the tokens alone. A prompt is the user turn of the
tokenizer's chat template where it has one (lab.hf.encode_prompt); a completion is read as text, up to its first
EOS, special tokens dropped.

    sum     the lab's sum task posed as text: "7=" -> digits adding up to 7, then EOS. Small enough for the tiny
            random Llama to learn in seconds on a CPU.
    arith   arithmetic word problems generated from the seed (no download), answered in words; rewarded 1 when the
            final number of the answer (the one after "####" if there is one, else the last) is the right one.
    gsm8k   GSM8K's training questions through the `datasets` package, with the same parser; needs the package and
            the Hugging Face hub (or its local cache), and says so in one line where it has neither.
    NAME-format (arith-format, gsm8k-format)  the same, with a format reward: 0.9 for the right number plus 0.1 for
            ending on a "#### <number>" line, as GSM8K's answers do.
"""
import re
from fractions import Fraction

import torch

NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")
FINAL = re.compile(r"####\s*(-?\d[\d,]*(?:\.\d+)?)\s*$")
INSTRUCTION = "Solve it, then give the final answer as a number on its own line after ####."
FORMAT_WEIGHT = 0.1


def final_number(text: str) -> Fraction | None:
    """The answer a completion gives: the number after a closing "####", else the last number in it, else None.
    "1,250" reads as 1250; "3.50" as 7/2."""
    found = FINAL.search(text.strip())
    raw = found.group(1) if found else next(reversed(NUMBER.findall(text)), None)
    if raw is None:
        return None
    try:
        return Fraction(raw.replace(",", ""))
    except (ValueError, ZeroDivisionError):
        return None


def left_pad(rows: list, pad_id: int):
    """Token lists -> (ids (B, P), mask (B, P)), padded on the left with pad_id."""
    P = max(len(r) for r in rows)
    ids = torch.full((len(rows), P), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), P), dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, P - len(r):] = torch.tensor(r, dtype=torch.long)
        mask[i, P - len(r):] = 1
    return ids, mask


class TextTask:
    """Prompts as text through the tokenizer; rewards from the decoded completions. A subclass draws
    (prompt text, answer) pairs and scores (answer, completion text, ended with EOS)."""

    name = "text"

    def __init__(self, tokenizer):
        from lab.hf import encode_prompt
        self.tokenizer = tokenizer
        self.eos_id, self.pad_id = tokenizer.eos_token_id, tokenizer.pad_token_id
        if self.pad_id is None or self.pad_id == self.eos_id:
            raise ValueError("the tokenizer needs a pad token apart from its EOS (lab.hf.load adds one)")
        self.encode = lambda text: encode_prompt(tokenizer, text)
        self.answers = {}  # prompt tokens -> answer, for the prompts drawn last (a reward reads its own prompts)

    def draw(self, generator) -> tuple:
        raise NotImplementedError

    def score(self, answer, text: str, ended: bool) -> float:
        raise NotImplementedError

    def sample_prompts(self, batch_size: int, generator=None):
        pairs = [self.draw(generator) for _ in range(batch_size)]
        rows = [self.encode(text) for text, _ in pairs]
        if len(self.answers) > 4096:  # keep the map small; a step only ever rewards the prompts it just drew
            self.answers.clear()
        self.answers.update({tuple(r): answer for r, (_, answer) in zip(rows, pairs)})
        return left_pad(rows, self.pad_id)

    def completions(self, rollout) -> list:
        """(text up to the first EOS, whether there was one) per row."""
        out = []
        for row in rollout.input_ids[:, rollout.prompt_len:].tolist():
            ended = self.eos_id in row
            tokens = row[:row.index(self.eos_id)] if ended else row
            out.append((self.tokenizer.decode(tokens, skip_special_tokens=True), ended))
        return out

    def reward(self, rollout) -> torch.Tensor:
        # a prompt's own tokens are those that are not pad: the pad token is never one of them (lab.hf.load adds it)
        prompts = [tuple(t for t in row if t != self.pad_id)
                   for row in rollout.input_ids[:, :rollout.prompt_len].tolist()]
        missing = [p for p in prompts if p not in self.answers]
        if missing:
            raise ValueError(f"{self.name}: a rollout of a prompt this task did not draw ({len(missing)} rows)")
        return torch.tensor([self.score(self.answers[p], text, ended)
                             for p, (text, ended) in zip(prompts, self.completions(rollout))], dtype=torch.float32)


class TextSumTask(TextTask):
    """The lab's sum task as text: prompt "7=", completion digits that add up to 7, then EOS. Reward
    1 - |sum - t| / t floored at 0, halved when the completion holds anything but digits or never ends."""

    name = "sum"

    def __init__(self, tokenizer, max_target: int = 12):
        super().__init__(tokenizer)
        self.max_target = max_target

    def draw(self, generator):
        t = int(torch.randint(1, self.max_target + 1, (1,), generator=generator))
        return f"{t}=", t

    def score(self, t, text, ended):
        digits = [int(c) for c in text if c.isdigit()]
        r = max(0.0, 1.0 - abs(sum(digits) - t) / t)
        return r if ended and len(digits) == len(text) else r / 2


NAMES = ["Ava", "Ben", "Chen", "Dina", "Eli", "Farah", "Gus", "Hana", "Ivan", "Jo"]
THINGS = ["apples", "marbles", "stickers", "books", "pencils", "coins", "shells", "cards"]


def problem(kind: int, pick) -> tuple:
    """(question, answer) of one of five templates; pick(lo, hi) draws an integer in [lo, hi]."""
    name, friend = NAMES[pick(0, 4)], NAMES[pick(5, 9)]
    things = THINGS[pick(0, len(THINGS) - 1)]
    a, b, c = pick(2, 40), pick(2, 12), pick(1, 9)
    if kind == 0:
        return f"{name} has {a} {things} and gets {b} more from {friend}. How many {things} does {name} have now?", a + b
    if kind == 1:
        return (f"{name} had {a + b} {things} and gave {b} of them to {friend}. How many {things} does {name} have "
                f"left?", a)
    if kind == 2:
        return f"A box holds {b} {things}. How many {things} are there in {c} boxes?", b * c
    if kind == 3:
        return (f"{name} buys {c} packs of {b} {things} and gives {friend} {c} of them. How many {things} does "
                f"{name} keep?", c * b - c)
    return f"{b * c} {things} are shared equally among {c} friends. How many {things} does each friend get?", b


class ArithTask(TextTask):
    """Arithmetic word problems generated from the seed (five templates, small numbers); reward 1 for the right
    final number (final_number), else 0; with format_weight w, (1 - w) for the number and w for a closing
    "#### <number>" line."""

    name = "arith"

    def __init__(self, tokenizer, format_weight: float = 0.0):
        super().__init__(tokenizer)
        self.format_weight = format_weight

    def draw(self, generator):
        pick = lambda lo, hi: int(torch.randint(lo, hi + 1, (1,), generator=generator))
        question, answer = problem(pick(0, 4), pick)
        return f"{question} {INSTRUCTION}", answer

    def score(self, answer, text, ended):
        right = float(final_number(text) == Fraction(answer))
        formatted = float(ended and FINAL.search(text.strip()) is not None)
        return (1 - self.format_weight) * right + self.format_weight * formatted


class GSM8KTask(ArithTask):
    """GSM8K (openai/gsm8k, main, train) through `datasets`: each question with the instruction, rewarded as
    arith is; the answer is the number after the dataset's "####"."""

    name = "gsm8k"

    def __init__(self, tokenizer, format_weight: float = 0.0, load=None):
        super().__init__(tokenizer, format_weight)
        rows = (load or load_gsm8k)()
        self.items = [(r["question"], final_number(r["answer"])) for r in rows]

    def draw(self, generator):
        question, answer = self.items[int(torch.randint(0, len(self.items), (1,), generator=generator))]
        return f"{question} {INSTRUCTION}", answer


def load_gsm8k() -> list:
    """GSM8K's training split as dicts with question and answer; one line of ValueError where it cannot be had."""
    try:
        import datasets
    except ImportError:
        raise ValueError("gsm8k needs the datasets package (.venv/bin/pip install datasets) and the Hugging Face "
                         "hub or its cache; TASK=arith is generated locally") from None
    try:
        return list(datasets.load_dataset("openai/gsm8k", "main", split="train"))
    except Exception as exc:  # no network, no cache, a hub error: one line, whatever the cause
        why = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
        raise ValueError(f"gsm8k cannot be loaded ({why}): the hub is out of reach and the dataset is not in the "
                         f"local cache; TASK=arith is generated locally") from None


TEXT_TASKS = {"sum": TextSumTask, "arith": ArithTask, "gsm8k": GSM8KTask}


def task_names() -> list:
    return [*TEXT_TASKS, "arith-format", "gsm8k-format"]


def make_text_task(name: str, tokenizer):
    """sum, arith, gsm8k, or arith-format / gsm8k-format (the same with the 0.1 format reward)."""
    base, fmt = (name[:-len("-format")], True) if name.endswith("-format") else (name, False)
    if base not in TEXT_TASKS or (fmt and base == "sum"):
        raise ValueError(f"unknown text task {name!r}; choose one of: {', '.join(task_names())}")
    return TEXT_TASKS[base](tokenizer, FORMAT_WEIGHT) if fmt else TEXT_TASKS[base](tokenizer)
