"""Structural tells: what a planting leaves in the code's shape that points at it, whatever the words say.

A careful reader (or a linter) finds a planted bug without understanding it when the planting leaves the code in a
shape that healthy code does not have. `make verify` refuses a planting that adds one of these, compared with its
codebase (the codebase's own shape is not a tell):

  - a state variable that is no longer updated: a name the codebase's function updates (stores twice, augments,
    or changes in place) that the planted function only initialises and reads;
  - a keyword parameter no caller passes: a parameter with a default that some call in the codebase passes and no
    call in the planted file does, or a new parameter with a default that nothing passes;
  - a twin computation: a planted line that computes the same kind of quantity (a spread, a softmax, a mean, an
    exponential) from the same tensor as a line a few lines away, so one of the two is plainly the odd one out;
and a reader's tells, what the words and statements around a planted line say against it:
  - a comment that contradicts it: a comment or docstring line within NEAR lines of a planted line, left as the
    codebase has it, that names what the codebase's lines did there (no grad, detach, a mask, the temperature, an
    eps, a clamp, a copy, ...) where the planted lines no longer do it (their code lost every token of it);
  - a dropped result: a statement that calls a pure function of tensors (x.div(t), x.clamp(...), x.masked_fill(...),
    torch.exp(...)) and keeps nothing of its value, which the codebase does not have.

    python -m grpo_katas.proof.structure                    # every planting's structural tells, and the near-identical
                                                      # plantings of one bug across codebases
"""
import ast
import collections
import difflib
import functools
import io
import itertools
import re
import sys
import tokenize


INPLACE = re.compile(r"^[a-z][a-z0-9_]*_$")           # torch's in-place methods: add_, masked_fill_, copy_
MUTATORS = {"append", "extend", "update", "insert", "pop", "setdefault", "clear", "remove", "add"}
FAMILIES = {  # the kind of quantity a call computes, for twin computations
    "spread": {"std", "var", "std_mean", "var_mean", "sqrt"},
    "softmax": {"softmax", "log_softmax", "logsumexp", "log_probs", "selective_log_softmax", "logprobs_from_logits"},
    "mean": {"mean", "masked_mean", "nanmean"},
    "exp": {"exp", "expm1"},
    "log": {"log", "log1p"},
    "sort": {"sort", "argsort", "topk", "argmax", "max"},
}
NOT_A_TENSOR = {"cfg", "config", "self", "torch", "F", "math", "args", "dim", "keepdim", "eps"}
WINDOW = 4  # lines either side of a planted line in which a twin counts
NEAR = 3    # lines either side of a planted line in which a comment or docstring speaks of it
# what a comment can say a line does: (what it says, as a pattern over the prose; the code tokens that do it)
SAYS = {
    "no grad": (r"no[ _-]?grad|without (a )?grad|no gradient|inference[ _]mode",
                r"^(no_grad|inference_mode|detach|requires_grad_?)$"),
    "detach": (r"\bdetach", r"^detach$"),
    "mask": (r"\bmask", r"mask"),
    "temperature": (r"temperature", r"temperature"),
    "eps": (r"\beps\b|epsilon", r"(^|_)eps$|epsilon"),
    "clamp": (r"\bclamp|\bclip", r"^(clamp|clip|clamp_|clip_|clip_grad_norm_)$"),
    "copy": (r"\b(deep)?copy\b|\bclone", r"^(deepcopy|copy|clone)$"),
    "frozen": (r"\bfrozen\b|\bfreeze", r"^(requires_grad_?|no_grad|deepcopy|eval)$"),
    "sync": (r"\bsync", r"sync"),
    "zero grad": (r"zero(es|ed)? (the |its )?grad|zero_grad", r"^zero_grad$"),
}
# tensor methods and torch functions whose only effect is the value they return
PURE = {"div", "mul", "add", "sub", "neg", "pow", "sqrt", "exp", "log", "abs", "clamp", "clip", "masked_fill",
        "masked_scatter", "where", "softmax", "log_softmax", "logsumexp", "sum", "mean", "std", "var", "max", "min",
        "minimum", "maximum", "detach", "clone", "float", "double", "half", "bfloat16", "to", "type", "view",
        "reshape", "unsqueeze", "squeeze", "transpose", "permute", "contiguous", "expand", "expand_as", "repeat",
        "repeat_interleave", "gather", "index_select", "cat", "stack", "flip", "cumsum", "sigmoid", "tanh",
        "argmax", "zeros_like", "ones_like", "full_like", "empty_like", "nan_to_num", "tril", "triu", "chunk",
        "split", "tensor_split", "narrow", "roll", "lerp", "addcmul", "addcdiv", "reciprocal", "rsqrt"}


def _own_nodes(fn):
    """The nodes of a function's body, not of functions nested in it."""
    stack = list(fn.body)
    while stack:
        node = stack.pop()
        yield node
        for child in ast.iter_child_nodes(node):
            if not isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
                stack.append(child)


def _root(node):
    while isinstance(node, (ast.Attribute, ast.Subscript)):
        node = node.value
    return node.id if isinstance(node, ast.Name) else None


def _call_name(call: ast.Call):
    return call.func.attr if isinstance(call.func, ast.Attribute) else getattr(call.func, "id", None)


@functools.lru_cache(maxsize=8)  # a planting's source is read by both rules in turn
def _shape(source: str) -> tuple:
    """([(function node, its lines)], {called name: [calls]}): one parse and one walk of the source."""
    lines, functions, calls = source.splitlines(), [], {}
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            functions.append((node, "\n".join(lines[node.lineno - 1:node.end_lineno])))
        elif isinstance(node, ast.Call):
            calls.setdefault(_call_name(node), []).append(node)
    return functions, calls


@functools.lru_cache(maxsize=8)  # a codebase's own shape, compared with each of its plantings
def state_updates(source: str) -> dict:
    """{'function:name': (stores, updated)} for every local name a function reads: how often it is stored, and
    whether it is ever updated (stored again, augmented, assigned into, or changed by an in-place method)."""
    out = {}
    for fn, text in _shape(source)[0]:
        out.update(_function_updates(fn.name, text, fn))
    return out


_UPDATES = {}  # (function name, its lines) -> its state_updates: a planting changes one or two functions of a file


def _function_updates(name: str, text: str, fn) -> dict:
    if (name, text) not in _UPDATES:
        stores, updated, loads = {}, set(), set()
        for node in _own_nodes(fn):
            if isinstance(node, ast.Name):
                if isinstance(node.ctx, ast.Store):
                    stores[node.id] = stores.get(node.id, 0) + 1
                else:
                    loads.add(node.id)
            elif isinstance(node, ast.AugAssign):
                updated.add(_root(node.target))
            elif isinstance(node, ast.Assign):
                updated.update(_root(t) for t in node.targets if isinstance(t, (ast.Subscript, ast.Attribute)))
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                if INPLACE.match(node.func.attr) or node.func.attr in MUTATORS:
                    updated.add(_root(node.func.value))
        _UPDATES[name, text] = {f"{name}:{n}": (stores[n], stores[n] > 1 or n in updated) for n in loads & set(stores)}
    return _UPDATES[name, text]


def never_updated(healthy: str, planted: str) -> list:
    """Names the healthy function updates and the planted one only initialises and reads."""
    before, after = state_updates(healthy), state_updates(planted)
    return sorted(k for k, (n, upd) in after.items() if not upd and before.get(k, (0, False))[1])


@functools.lru_cache(maxsize=8)
def unpassed_keywords(source: str) -> frozenset:
    """'function:param' for every parameter with a default that no call in the source passes."""
    functions, calls = _shape(source)
    out = set()
    for fn, _ in functions:
        a = fn.args
        positional = a.posonlyargs + a.args
        with_default = positional[len(positional) - len(a.defaults):] if a.defaults else []
        with_default += [k for k, d in zip(a.kwonlyargs, a.kw_defaults) if d is not None]
        bound = 1 if positional and positional[0].arg in ("self", "cls") else 0  # a method called as obj.name(...)
        for p in with_default:
            index = positional.index(p) if p in positional else None
            if not any(any(k.arg is None or k.arg == p.arg for k in c.keywords)
                       or (index is not None and (any(isinstance(x, ast.Starred) for x in c.args)
                                                  or len(c.args) > index - (bound if isinstance(c.func, ast.Attribute)
                                                                            else 0)))
                       for c in calls.get(fn.name, ())):
                out.add(f"{fn.name}:{p.arg}")
    return frozenset(out)


def new_unpassed(healthy: str, planted: str) -> list:
    """Keyword parameters no caller passes in the planted file that the healthy file passes or does not have."""
    return sorted(unpassed_keywords(planted) - unpassed_keywords(healthy))


def _calls(line: str) -> dict:
    """{(family, tensor name): operand text} of the calls on one line of code that compute a known kind of quantity."""
    text = line.strip().rstrip(":")
    for prefix in ("return ", "elif ", "if ", "while ", "else"):
        text = text.removeprefix(prefix)
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return {}
    out = {}
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
        family = next((f for f, names in FAMILIES.items() if name in names), None)
        if family is None:
            continue
        operands = list(node.args[:1])
        if isinstance(node.func, ast.Attribute) and _root(node.func.value) not in ("torch", "F", "math", None):
            operands.append(node.func.value)
        for operand in operands:
            for n in ast.walk(operand):
                if isinstance(n, ast.Name) and n.id not in NOT_A_TENSOR:
                    out.setdefault((family, n.id), ast.unparse(operand))
    return out


def _twins(lines: list, i: int) -> dict:
    """{(family, tensor name): operand texts agree} for line i's calls that another line within WINDOW shares."""
    mine, out = _calls(lines[i]), {}
    for j in range(max(0, i - WINDOW), min(len(lines), i + WINDOW + 1)):
        if j != i:
            for key, operand in _calls(lines[j]).items():
                if key in mine:
                    out[key] = out.get(key, True) and operand == mine[key]
    return out


def twin_computations(healthy: str, planted: str) -> list:
    """'line N ...' for each planted line that computes a quantity of the same kind from the same tensor as a line
    within WINDOW lines of it, from another expression, where the codebase had no such twin there or had it
    computed from the same expression (a consistent pair the planting broke)."""
    old, new = healthy.splitlines(), planted.splitlines()
    out = []
    for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(None, old, new, autojunk=False).get_opcodes():
        if tag not in ("replace", "insert"):
            continue
        before = {}
        for i in range(max(0, i1 - 1), min(len(old), max(i2, i1 + 1))):
            for key, same in _twins(old, i).items():
                before[key] = before.get(key, True) and same
        for j in range(j1, j2):
            broken = [key for key, same in _twins(new, j).items() if not same and before.get(key, True)]
            if broken:
                family, name = broken[0]
                out.append(f"line {j + 1} ({new[j].strip()[:70]!r}) computes a {family} of {name} unlike a line "
                           f"beside it")
    return out


@functools.lru_cache(maxsize=8)  # a codebase's, read beside each of its plantings (never changed by a caller)
def _prose(source: str) -> dict:
    """{line index: (the comment or docstring text on that line, whether it trails code)} of a source; each line
    of a docstring counts."""
    out = {}
    try:
        for t in tokenize.generate_tokens(io.StringIO(source).readline):
            if t.type == tokenize.COMMENT:
                out[t.start[0] - 1] = (t.string.lstrip("#"), bool(t.line[:t.start[1]].strip()))
        tree = ast.parse(source)
    except (tokenize.TokenError, IndentationError, SyntaxError):
        return out
    lines = source.splitlines()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr) and \
                isinstance(body[0].value, ast.Constant) and isinstance(body[0].value.value, str):
            for i in range(body[0].lineno - 1, body[0].end_lineno):
                out[i] = (lines[i], False)
    return out


def _code(lines: list, prose: dict, a: int, b: int) -> list:
    """The code tokens of lines a..b-1, their comments and docstrings left out."""
    return [t for k in range(a, b) if k not in prose or prose[k][1]
            for t in _tokens(lines[k][:lines[k].index("#")] if prose.get(k, ("", False))[1] else lines[k])]


def _does(tokens, pattern: str) -> bool:
    return any(re.search(pattern, t) for t in tokens)


def contradicting_comments(healthy: str, planted: str) -> list:
    """'line N ...' for each comment or docstring line within NEAR lines of a planted line, the same as the codebase
    has it, that names something (SAYS) the codebase's lines there did and the planted lines no longer do."""
    old, new = healthy.splitlines(), planted.splitlines()
    old_prose, new_prose = _prose(healthy), _prose(planted)
    out = []
    for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(None, old, new, autojunk=False).get_opcodes():
        if tag == "equal":
            continue
        before, after = _code(old, old_prose, i1, i2), _code(new, new_prose, j1, j2)
        lost = [what for what, (_, does) in SAYS.items() if _does(before, does) and not _does(after, does)]
        if not lost:
            continue
        kept = {" ".join(old_prose[k][0].split()) for k in range(max(0, i1 - NEAR), min(len(old), i2 + NEAR))
                if k in old_prose}
        for k in range(max(0, j1 - NEAR), min(len(new), max(j2, j1 + 1) + NEAR)):
            text, trailing = new_prose.get(k, ("", False))
            text = " ".join(text.split())
            if not text or text not in kept or (trailing and not j1 <= k < j2):
                continue  # a comment that trails a line the planting left speaks of that line
            said = [what for what in lost if re.search(SAYS[what][0], text, re.I)]
            if said:
                out.append(f"line {k + 1} says {said[0]!r} ({text[:60]!r}) where the planted code no longer does it")
                break
    return out


@functools.lru_cache(maxsize=8)  # a codebase's, read beside each of its plantings
def _dropped(source: str) -> tuple:
    """The statements of a source that call a pure function of tensors (PURE) and keep nothing of its value."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Call):
            func = node.value.func
            if isinstance(func, ast.Attribute) and func.attr in PURE and _root(func) not in ("self", "dist", None):
                out.append(ast.unparse(node))
    return tuple(out)


def dropped_results(healthy: str, planted: str) -> list:
    """The statements that drop a pure call's value (x.div(t), torch.exp(x)) the planted file has beyond its codebase."""
    extra = collections.Counter(_dropped(planted)) - collections.Counter(_dropped(healthy))
    return sorted(extra.elements())


def structural_tells(healthy: str, planted: str) -> list:
    """Every structural tell and reader's tell the planting adds to its codebase, as one phrase each."""
    return ([f"{k} is read but no longer updated" for k in never_updated(healthy, planted)]
            + [f"{k} is a keyword parameter no caller passes" for k in new_unpassed(healthy, planted)]
            + [f"a twin computation: {t}" for t in twin_computations(healthy, planted)]
            + [f"a comment that contradicts it: {t}" for t in contradicting_comments(healthy, planted)]
            + [f"a dropped result: `{t[:70]}` keeps nothing of its value" for t in dropped_results(healthy, planted)])


def planted_tokens(healthy: str, planted: str) -> list:
    """The code tokens a planting adds or changes, in order (comments and layout dropped)."""
    old, new = _tokens(healthy), _tokens(planted)
    out = []
    for tag, _, _, j1, j2 in difflib.SequenceMatcher(None, old, new, autojunk=False).get_opcodes():
        if tag in ("replace", "insert"):
            out += new[j1:j2]
    return out


def _tokens(source: str) -> list:
    """Python's tokens of a piece of code, comments and layout dropped; a fragment that does not tokenize (half a
    bracket) falls back to words and punctuation."""
    skip = {tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT, tokenize.ENCODING,
            tokenize.ENDMARKER}
    try:
        return [t.string for t in tokenize.generate_tokens(io.StringIO(source).readline) if t.type not in skip]
    except (tokenize.TokenError, IndentationError, SyntaxError):
        return re.findall(r"\w+|[^\w\s]", re.sub(r"#[^\n]*", "", source))


def near_identical(bugs, sources: dict = None, threshold: float = 0.8) -> tuple:
    """([(bug, codebase a, codebase b, similarity)], pairs compared): plantings of one bug in two codebases whose
    planted tokens are near-identical (difflib's ratio at or above the threshold), so knowing one is knowing both."""
    from grpo_katas.catalogue.katas import codebase_source, plant
    sources, found, pairs = dict(sources or {}), [], 0
    for bug in bugs.values():
        planted = {}
        for name in bug.edits:
            if name not in sources:
                sources[name] = codebase_source(name)
            planted[name] = planted_tokens(sources[name], plant(sources[name], [bug], name))
        for a, b in itertools.combinations(sorted(planted), 2):
            pairs += 1
            if not planted[a] and not planted[b]:  # both plantings only delete: compare what they delete
                continue
            ratio = difflib.SequenceMatcher(None, planted[a], planted[b], autojunk=False).ratio()
            if ratio >= threshold:
                found.append((bug.id, a, b, ratio))
    return found, pairs


def main() -> int:
    from grpo_katas.catalogue.katas import codebase_source, load_bugs, plant
    bugs = load_bugs()
    count = 0
    for bug in bugs.values():
        for name in bug.edits:
            healthy = codebase_source(name)
            for tell in structural_tells(healthy, plant(healthy, [bug], name)):
                count += 1
                print(f"{bug.id}@{name}: {tell}")
    found, pairs = near_identical(bugs)
    for bug_id, a, b, ratio in found:
        print(f"near-identical: {bug_id} in {a} and {b} ({ratio:.2f})")
    print(f"{count} structural tell(s); {len(found)} of {pairs} codebase pairs of one bug's plantings near-identical")
    return 0


if __name__ == "__main__":
    sys.exit(main())
