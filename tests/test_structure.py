"""The structural-tell rules of grpo_katas/proof/structure.py bite on the shapes they name, and only on what a planting adds.

    .venv/bin/python -m pytest -q tests/test_structure.py
"""
from grpo_katas.catalogue.katas import Bug
from grpo_katas.proof.structure import near_identical, planted_tokens, structural_tells


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


REF = '''
def build(self, role):
    """(module, optimizer) of a role: the actor with its optimizer; the ref a module of its own, with no optimizer
    and no gradient."""
    if role == "ref":
        ref_module = copy.deepcopy(self.actor_module)
        ref_module.requires_grad_(False)
        return ref_module, None
    return self.actor_module, torch.optim.AdamW(self.actor_module.parameters())


def token_logprobs(model, ids, temperature):
    logits = model(ids)[:, :-1]  # (N, T, V) the mask is the model's
    # divide the logits by the sampling temperature
    logits.div_(temperature)
    return logits.log_softmax(-1)
'''


def test_a_comment_that_says_what_the_planted_line_no_longer_does_is_a_tell():
    planted = REF.replace('''        ref_module = copy.deepcopy(self.actor_module)
        ref_module.requires_grad_(False)
        return ref_module, None''', "        return self.actor_module, None")
    tells = structural_tells(REF, planted)
    assert len(tells) == 1 and "a comment that contradicts it: line 4 says 'no grad'" in tells[0], tells
    # the comment goes with the planting: no tell
    assert structural_tells(REF, planted.replace("a module of its own, with no optimizer\n    and no gradient.",
                                                 "with none.")) == []
    # the temperature dropped under the comment that names it
    tells = [t for t in structural_tells(REF, REF.replace("    logits.div_(temperature)\n", "")) if "contradicts" in t]
    assert len(tells) == 1 and "line 14 says 'temperature'" in tells[0], tells
    # a comment that trails a line the planting left speaks of that line only
    assert structural_tells(REF, REF.replace("return logits.log_softmax(-1)", "return logits.softmax(-1).log()")) == []


def test_a_dropped_result_of_a_pure_call_is_a_tell():
    tells = structural_tells(REF, REF.replace("logits.div_(temperature)", "logits.div(temperature)"))
    assert [t for t in tells if "dropped" in t] == ["a dropped result: `logits.div(temperature)` keeps nothing of its value"], tells
    for dropped in ["torch.clamp(logits, max=30.0)", "logits.masked_fill(logits.isnan(), 0.0)"]:
        planted = REF.replace("    return logits.log_softmax(-1)", f"    {dropped}\n    return logits.log_softmax(-1)")
        assert [t for t in structural_tells(REF, planted) if "dropped" in t] == [
            f"a dropped result: `{dropped}` keeps nothing of its value"]
    # an in-place method, or a call with effects, keeps its value where it is
    assert structural_tells(REF, REF.replace("logits.div_(temperature)", "logits.clamp_(max=30.0).div_(temperature)")) == []


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
    from grpo_katas.proof.verify import PROVENANCE
    for line in ["# style: karpathy/nanochat scripts/chat_rl.py", "python solutions/codebases/script.py",
                 "in the manner of volcengine/verl"]:
        assert PROVENANCE.search(f'"""A loop."""\n{line}\nimport torch\n'), line
    for line in ["# the reference policy stays frozen", "see https://huggingface.co/papers/2402.03300",
                 "# nanochat-like print lines are fine in prose"]:
        assert not PROVENANCE.search(f'"""A loop."""\n{line}\nimport torch\n'), line
