"""The structural-tell rules of grpo_katas/structure.py bite on the shapes they name, and only on what a planting adds.

    .venv/bin/python -m pytest -q tests/test_structure.py
"""
from grpo_katas.catalogue import Bug
from grpo_katas.structure import near_identical, planted_tokens, structural_tells

LOOP = '''
def generate(policy, ids, steps, eos_id, generator=None):
    finished = torch.zeros(ids.shape[0], dtype=torch.bool)
    for _ in range(steps):
        logits = policy(ids)[:, -1]
        probs = torch.softmax(logits / 0.7, dim=-1)
        logp = torch.log_softmax(logits / 0.7, dim=-1)
        tok = torch.where(finished, 0, torch.multinomial(probs, 1, generator=generator).squeeze(1))
        finished = finished | (tok == eos_id)
    return tok, logp


def step(x, scale=1.0):
    return x * scale


def run(x):
    return step(x, scale=2.0) + generate(None, x, 3, 1)[0]
'''


def test_a_state_variable_no_longer_updated_is_a_tell():
    planted = LOOP.replace("        finished = finished | (tok == eos_id)\n", "")
    assert structural_tells(LOOP, planted) == ["generate:finished is read but no longer updated"]


def test_a_keyword_parameter_no_caller_passes_is_a_tell():
    dropped = LOOP.replace("step(x, scale=2.0)", "step(x)")
    assert structural_tells(LOOP, dropped) == ["step:scale is a keyword parameter no caller passes"]
    added = LOOP.replace("def step(x, scale=1.0):", "def step(x, scale=1.0, clip=False):")
    assert structural_tells(LOOP, added) == ["step:clip is a keyword parameter no caller passes"]
    # passed positionally counts as passed
    assert structural_tells(LOOP, LOOP.replace("step(x, scale=2.0)", "step(x, 2.0)")) == []


def test_a_twin_computation_from_another_expression_is_a_tell():
    planted = LOOP.replace("torch.log_softmax(logits / 0.7, dim=-1)", "torch.log_softmax(logits, dim=-1)")
    tells = structural_tells(LOOP, planted)
    assert len(tells) == 1 and "computes a softmax of logits unlike a line beside it" in tells[0]


def test_the_codebases_own_shape_is_not_a_tell():
    assert structural_tells(LOOP, LOOP) == []
    # an edit that changes a value but no shape
    assert structural_tells(LOOP, LOOP.replace("logits / 0.7", "logits / 0.5")) == []


def test_planted_tokens_are_what_the_planting_adds():
    planted = LOOP.replace("step(x, scale=2.0)", "step(x, scale=3.0)")
    assert planted_tokens(LOOP, planted) == ["3.0"]


def test_near_identical_plantings_are_counted_per_pair_of_codebases():
    sources = {"a": LOOP, "b": LOOP.replace("finished", "done")}

    def bug(name, edits):
        return Bug(name, "update", "", "", "", (), edits={k: tuple(v) for k, v in edits.items()})

    same = bug("same", {"a": [("step(x, scale=2.0)", "step(x, scale=9.0)")],
                        "b": [("step(x, scale=2.0)", "step(x, scale=9.0)")]})
    apart = bug("apart", {"a": [("step(x, scale=2.0)", "step(x, scale=9.0)")],
                          "b": [("return x * scale", "return torch.clamp(x, max=scale) * 2")]})
    found, pairs = near_identical({"same": same, "apart": apart}, sources)
    assert pairs == 2 and [f[0] for f in found] == ["same"]


def test_a_kata_that_says_where_it_comes_from_is_refused():
    from grpo_katas.verify import PROVENANCE
    for line in ["# style: karpathy/nanochat scripts/chat_rl.py", "python solutions/codebases/script.py",
                 "in the manner of volcengine/verl"]:
        assert PROVENANCE.search(f'"""A loop."""\n{line}\nimport torch\n'), line
    for line in ["# the reference policy stays frozen", "see https://huggingface.co/papers/2402.03300",
                 "# nanochat-like print lines are fine in prose"]:
        assert not PROVENANCE.search(f'"""A loop."""\n{line}\nimport torch\n'), line
