"""Drills: a fresh kata every time, drawn from the catalogue and the codebases, proven on the spot, and scheduled
by what you keep missing.

    make drill [TIER=warm-up|practice|frontier|interview] [BUGS=k] [CODEBASE=name] [SEED=s]

A drill is a codebase with k compatible bugs planted (their edits apply together), written to work/drills/dN/
(the pristine file, its brief and drill.json) and then handled like any kata, named dN everywhere: `make run
N=d3`, `make check N=d3`, hints, solution, reset, mock, grade, bundle; your copy is work/d3-drill/grpo.py. Before it is handed over it is proven: the
checks run on it and each drawn bug trips at least one check that no other drawn bug trips (so none hides
another), and a short run of it against a run of its healthy codebase shows a symptom the brief can cite; a draw
that fails either is redrawn, within a time bound, unseen. The brief is written from that run: one or two
metrics that moved, with their numbers, and how many bugs there are; never a component.

The same seed always gives the same drill. Without SEED, the draw is scheduled: each bug is a class with a
Leitner box (0 to 4) in work/state.json. A class you found without hints moves up a box; one you needed hints
for stays; one you missed, revealed early or solved slowly (over the time box) goes back to box 0. A class in box
0 is due again at once, one in box b after 2**(b-1) days. A scheduled drill starts from the classes you missed
that are due (the most overdue first, as many as the drill holds), and draws its other bugs weighing due classes
and classes never seen over the rest, the most overdue most.

The recipe (codebase, bugs, seed) and the hint ladder are never shown until the drill is solved or revealed, and
drill.json, beside the pristine file, holds them sealed: compressed and encoded, so that opening the file does not
give the drill away. Sealed is not secret (anyone can decode it, as anyone can read katas/bugs.toml); it keeps
the answers out of sight, as a kata's are in its kata.toml.
"""
import json
import math
import random
import tempfile
import time
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path

from grpo_katas import UserError
from grpo_katas.catalogue.drawn import DRILL_RUN, DRILLS, Drill, is_drill, load, seal
from grpo_katas.catalogue.katas import (CODEBASES, TIERS, CatalogueError, Kata, codebase_source, find_kata, load_bugs,
                                       load_katas, plant)
from grpo_katas.practice import progress
from grpo_katas.practice.progress import WORK, cannot_write, now, shown


# The settings a bug lives under: the option whose code it breaks, which the default settings never run. A drill
# with one of these bugs runs under them (its brief says so); bugs whose settings disagree are not drawn together.
NEEDS = {
    "gspo-ratio-over-padding": {"importance_sampling_level": "sequence"},
    "gspo-ratio-summed": {"importance_sampling_level": "sequence"},
    "cispo-weight-attached": {"loss_type": "cispo"},
    "truncated-by-last-token": {"mask_truncated_completions": True},
    "entropy-quantile-over-padding": {"top_entropy_quantile": 0.2},
    "entropy-quantile-uncomplemented": {"top_entropy_quantile": 0.2},
    "off-policy-mask-against-old": {"off_policy_mask_threshold": 0.1},
    "sapo-temperature-by-ratio": {"loss_type": "sapo", "sapo_temperature_pos": 0.5, "sapo_temperature_neg": 2.0},
    "rollout-is-sequence-mean": {"rollout_is_mode": "sequence_mask"},
    "rollout-is-mask-upper-only": {"rollout_is_mode": "token_mask", "rollout_is_clip_min": 0.5},
    "delta-on-clipped-term": {"delta": 1.5},
    "bias-kl-ratio-detached": {"use_bias_correction_kl": True, "beta": 0.5},
}
# The frontier pool: the bugs beyond the textbook loop, and every bug of an option (NEEDS)
FRONTIER = {"accum-divided-by-steps", "accum-local-token-count", "kl-detached-logp", "old-logp-bf16",
            "is-weight-inverted", "is-weight-uncapped", "is-weight-from-policy", "kl-in-reward", "loss-type-ignored",
            "dr-grpo-rollout-width", "scale-rewards-truthy", "clip-high-on-lower", "mask-by-multiplication",
            "sampler-logp-untempered", *NEEDS}
TIER_BUGS = {"warm-up": (1, 1), "practice": (2, 3), "frontier": (1, 2), "interview": (4, 5)}
TIER_MINUTES = {"warm-up": 10, "practice": 20, "frontier": 20, "interview": 45}
PROOF_SECONDS = 180          # drawing and proving gives up (with a message) after this long
BOXES = 5


def find(key, command: str = "kata") -> Kata:
    """The kata or the drill a user named after N= (7, d3), with its loop file in place; a UserError that says
    what to type otherwise (`command` is the make target to show in it)."""
    if key in (None, ""):
        valid = ", ".join(str(k.number) for k in load_katas())
        target = " (or `make check TARGET=path/to/grpo.py` for any file)" if command == "check" else ""
        raise UserError(f"which kata? give its number, e.g. `make {command} N=1`{target}; valid: {valid}")
    try:
        kata = load(key) if is_drill(key) else find_kata(key)
    except CatalogueError as exc:
        raise UserError(str(exc)) from None
    if not kata.loop.is_file():
        raise UserError(f"{kata.loop} is missing; restore it with `git checkout -- {shown(kata.loop)}` "
                        f"or rebuild the katas with `make katas`")
    return kata


# --- drawing --------------------------------------------------------------------------------------------

def candidates(bugs: dict, tier: str, codebase: str) -> list:
    """The bugs a drill of this tier can hold in this codebase (single-rank runs: no data-parallel bugs)."""
    out = []
    for b in bugs.values():
        if not b.applies_to(codebase) or b.id.startswith("ddp-"):
            continue
        if tier == "frontier" and b.id not in FRONTIER:
            continue
        if tier in ("warm-up", "practice") and b.id in FRONTIER:
            continue
        out.append(b.id)
    return sorted(out)


def draw(bugs: dict, tier: str, k: int | None, codebase: str | None, rng: random.Random, weights: dict,
         first: tuple = ()) -> tuple:
    """(codebase, bug ids): k bugs whose edits plant together, each a different place; interview rounds span at
    least 4 components. `weights` (bug id -> weight) biases the choice; empty means uniform. The bugs of `first`
    (most urgent first) that plant in the codebase are drawn before any other."""
    lo, hi = TIER_BUGS[tier]
    pools = {c: candidates(bugs, tier, c) for c in sorted(CODEBASES)}
    first = [b for b in first if any(b in pool for pool in pools.values())]
    for attempt in range(200):
        homes = [c for c, pool in pools.items() if first and first[0] in pool]  # where the most urgent plants
        name = codebase or rng.choice(homes or sorted(pools))
        urgent = [b for b in first if b in pools[name]]
        n = k or rng.randint(lo, hi)
        pool = list(pools[name])
        chosen = []
        while len(chosen) < n and pool:
            w = [weights.get(b, 1.0) for b in pool]
            due = [b for b in urgent if b in pool] if attempt < 100 else []
            pick = due[0] if due else rng.choices(pool, weights=w)[0]
            pool.remove(pick)
            try:
                plant(codebase_source(name), [bugs[b] for b in chosen + [pick]], name)
            except CatalogueError:
                continue  # its edits collide with one already drawn
            if settings_for(chosen + [pick]) is None:
                continue  # it lives under settings another drawn bug contradicts
            chosen.append(pick)
        if len(chosen) < n:
            continue
        if tier == "interview" and len({bugs[b].component for b in chosen}) < min(4, n):
            continue
        return name, sorted(chosen)
    raise UserError(f"no {tier} drill with {k or 'its usual number of'} bugs can be drawn"
                    + (f" in the {codebase} codebase" if codebase else ""))


# --- proving --------------------------------------------------------------------------------------------

def own_checks(bugs: dict, chosen: list, codebase: str) -> dict:
    """bug id -> the checks that only it trips among the drawn bugs (or, sharing all, those of its component)."""
    out = {}
    for b in chosen:
        declared = bugs[b].checks_in(codebase)
        others = set().union(*(bugs[o].checks_in(codebase) for o in chosen if o != b))
        out[b] = [c for c in declared if c not in others] or [c for c in declared if c.component == bugs[b].component]
    return out


def hidden_bugs(bugs: dict, chosen: list, codebase: str, verdicts: dict) -> list:
    """The drawn bugs none of whose own checks fails in the combination (another bug hides them)."""
    mine = own_checks(bugs, chosen, codebase)
    return [b for b in chosen if not any(c in verdicts and not verdicts[c].passed for c in mine[b])]


DRILL_SEEDS = (0, 1)  # a drill's symptom shows at the seed its brief reports and at one more: an effect, not luck

def settings_for(chosen) -> dict | None:
    """The settings the drawn bugs live under together (NEEDS), or None where two of them disagree."""
    out = {}
    for b in chosen:
        for key, value in NEEDS.get(b, {}).items():
            if out.setdefault(key, value) != value:
                return None
    return out


# A rerun that shows a bug the default settings hide (its effect needs the setting), named by the first hint.
PROBES = {
    "sampling-no-temperature": {"temperature": 0.7},
    "logprobs-no-temperature": {"temperature": 0.7},
    "logprobs-temperature-after-softmax": {"temperature": 0.7},
    "sampler-logp-untempered": {"temperature": 0.7, "is_cap": 3.0},
    "is-weight-uncapped": {"temperature": 0.7, "is_cap": 3.0},
    "is-weight-from-policy": {"is_cap": 3.0},
    "loss-type-ignored": {"loss_type": "dr_grpo"},
    "dr-grpo-rollout-width": {"loss_type": "dr_grpo"},
    "accum-divided-by-steps": {"loss_type": "dapo", "grad_accum_steps": 4},
    "accum-local-token-count": {"loss_type": "dapo", "grad_accum_steps": 4},
    "scale-rewards-truthy": {"scale_rewards": "none"},
    "clip-high-on-lower": {"clip_eps_high": 0.28},
    "kl-beta-hardcoded": {"beta": 0.5},
    "kl-detached-logp": {"beta": 0.5},
    "kl-in-reward": {"beta": 0.5},
    "old-logp-bf16": {"num_iterations": 1},
}
# Bugs that change no number a run logs, whatever the settings: the first hint names what to look at instead.
LOOK = {
    "sampling-with-grad": "print whether the log-probs `generate` records require grad",
    "sampling-pad-attended": "print one finished row's attention mask next to its tokens",
    "sampling-no-early-stop": "count the columns `generate` appends after every row has ended",
    "mask-last-eos": "build a completion with two EOS tokens and print its completion mask",
    "adv-grad-leak": "pass the advantages rewards with requires_grad=True and look at the result",
    "update-ref-with-grad": "after one step, print whether the reference model's parameters carry a .grad",
    "is-weight-inverted": "give `grpo_loss` a sampler_logp below old_logp and print the weight it applies",
    "mask-by-multiplication": "put -inf in a log-prob under the mask and print the loss",
    "off-policy-mask-against-old": "give `grpo_loss` sampler log-probs far from old_logp on a row with a negative "
                                   "advantage and print whether that row keeps its policy term",
    "rollout-is-sequence-mean": "give `grpo_loss` sampler log-probs a little below old_logp on every token of a "
                                "long row and print the weight the correction gives that row",
    "rollout-is-mask-upper-only": "give `grpo_loss` a sampler log-prob far above old_logp on one token and print the "
                                  "weight the correction gives it",
    "delta-on-clipped-term": "give `grpo_loss` a token with a negative advantage and a ratio of 3 and print its loss",
    "bias-kl-ratio-detached": "at ratio 1, print the gradient the KL term alone sends to the policy's log-probs, "
                              "with use_bias_correction_kl and without",
}


def departures(mine, other) -> list:
    """(size, metric, window, a, b) for each window where two runs clearly differ (a factor of 1.5, opposite
    signs, or not finite), largest first."""
    from grpo_katas.catalogue.symptoms import METRICS
    found = []
    for m in METRICS:
        for window in ("last", "max"):
            a, b = mine.window(m, window), other.window(m, window)
            if a is None or b is None:
                continue
            if not math.isfinite(a):
                found.append((10.0, m, window, a, b))
                continue
            floor = {"ratio_dev": 1e-3, "clip_frac": 0.02}.get(m, 0.05)
            big, small = max(abs(a), abs(b), floor), max(min(abs(a), abs(b)), floor)
            if (a * b < 0 and abs(a - b) > floor) or big / small > 1.5:
                found.append((big / small if a * b >= 0 else 5.0, m, window, a, b))
    return sorted(found, reverse=True)


def symptoms_of(drill_path: Path, codebase: str, settings: dict = DRILL_RUN) -> list:
    """(metric, window, the drill's value, the healthy value) at the brief's seed for the metrics that moved most
    in a short run, largest first: clear departures (departures()), or a crash, that show at every seed of
    DRILL_SEEDS in the same direction."""
    from grpo_katas.catalogue.symptoms import run_loop
    runs = [(run_loop(drill_path, {**settings, "seed": s}), run_loop(CODEBASES[codebase].path, {**settings, "seed": s}))
            for s in DRILL_SEEDS]
    if all(mine.crash for mine, _ in runs):
        return [("crash", None, runs[0][0].crash, None)]
    others = [{(m, w): (a > b) for _, m, w, a, b in departures(*pair)} for pair in runs[1:]]
    seen, out = set(), []
    for _, m, window, a, b in departures(*runs[0]):
        if m not in seen and all(o.get((m, window)) == (a > b) for o in others):
            seen.add(m)
            out.append((m, window, a, b))
    return out[:2]


def reach(bugs: dict, codebase: str, chosen: list, path: Path, run: dict = DRILL_RUN) -> tuple:
    """(probes, hidden): how each drawn bug can be seen. A bug shows in the brief's run when healing it alone (the
    others left in) clearly changes that run; else under its PROBES rerun, healed against not; else by what LOOK
    says to look at. probes: (bug, settings or None, words) for the first hint; hidden: bugs none of that reaches."""
    from grpo_katas.catalogue.symptoms import run_loop
    probes, hidden = [], []
    for b in chosen if len(chosen) > 1 else ():  # one bug: the brief's run against the healthy one shows it
        healed = path.with_name(f"healed-{b}.py")
        healed.write_text(plant(codebase_source(codebase), [bugs[o] for o in chosen if o != b], codebase))
        if departures(run_loop(path, run), run_loop(healed, run)):
            continue
        probe = {**run, "set": {**run["set"], **PROBES.get(b, {})}}
        if b in PROBES and departures(run_loop(path, probe), run_loop(healed, probe)):
            setting = " ".join(f"{k}={v}" for k, v in PROBES[b].items())
            probes.append((b, PROBES[b], f"rerun with `SET='{setting}'` against a healthy run at the same settings"))
        elif b in LOOK:
            probes.append((b, None, LOOK[b]))
        else:
            hidden.append(b)
    return probes, hidden


WORDS = {"reward_mean": "the mean reward", "reward_max": "the best reward in a batch", "kl": "the logged KL",
         "loss": "the loss", "clip_frac": "the clip fraction", "grad_norm": "the grad norm",
         "adv_std": "the advantage std", "completion_len": "the completion length",
         "ratio_dev": "the largest |ratio - 1| on the first inner update"}


def brief_text(symptoms: list, n_bugs: int, tier: str, settings: dict | None = None) -> str:
    """A colleague's report of the run, from its numbers: one or two symptoms, how many bugs, no component. Each
    number is what `make run` prints for it (a float64 run prints the same digits on every CPU); `settings`, the
    options the run turns on (NEEDS), are named."""
    from grpo_katas.catalogue.symptoms import quote
    steps = DRILL_RUN["steps"]
    if symptoms and symptoms[0][0] == "crash":
        seen = f"The run stopped before step {steps}: `{symptoms[0][2]}`."
    else:
        parts = []
        for m, window, a, b in symptoms:
            when = f"over the last 5 of {steps} steps" if window == "last" else f"at its highest over {steps} steps"
            value = "NaN" if math.isnan(a) else quote(a, m)
            parts.append(f"{WORDS[m]} {when} is {value} where a healthy run of the same code shows {quote(b, m)}")
        where = (f"With {' and '.join(f'{k} = {v}' for k, v in settings.items())}, " if settings
                 else "On the default settings, ")
        seen = where + "; and ".join(parts) + "."
    count = "There is one bug in the loop; find and fix it." if n_bugs == 1 else \
        f"There are {n_bugs} bugs in the loop; find and fix them."
    return f"{'An' if tier[0] in 'aeiou' else 'A'} {tier} drill, drawn for you. {seen} {count}"


def hints_for(bugs: dict, chosen: list, symptoms: list, key: str, probes: list = ()) -> list:
    """The ladder: how to see every bug (the brief's run, then a probe for each bug it does not show), where to
    look, what is wrong."""
    comps = sorted({bugs[b].component for b in chosen})
    first = (f"Reproduce it first: `make run N={key}` shows the same run beside a healthy one; watch "
             + (" and ".join(WORDS.get(s[0], s[0]) for s in symptoms if s[0] != "crash") or "where it stops")
             + ", and change one setting at a time (`SET=beta=0`, then `SET=num_iterations=1`) to see what moves "
               "them.")
    if probes:
        first += (" Not every bug shows on that run: " + "; ".join(dict.fromkeys(words for _, _, words in probes))
                  + ".")
    second = "Look at: " + ", ".join(comps) + (" (one bug in each)" if len(comps) == len(chosen) else "") + "."
    third = " ".join(bugs[b].what.split(". ")[0].rstrip(".") + "." for b in chosen)
    return [first, second, third]


def prove(bugs: dict, codebase: str, chosen: list, workdir: Path) -> tuple:
    """(None, (symptoms, probes, settings)) when the drill is proven, else (why not, None): every drawn bug trips a
    check of its own, the run (under the settings its bugs live under) shows a symptom at every seed of DRILL_SEEDS,
    and every bug is reachable (reach())."""
    from grpo_katas.judge import matrix
    path = workdir / "grpo.py"
    path.write_text(plant(codebase_source(codebase), [bugs[b] for b in chosen], codebase))
    run = matrix.run([path], [0])
    if run.exit_code == 2:  # pytest's status for Ctrl-C, which it caught
        raise KeyboardInterrupt
    if 0 in run.load_errors:
        return f"it does not import: {run.load_errors[0]}", None
    hidden = hidden_bugs(bugs, chosen, codebase, run.of(0, 0))
    if hidden:
        return f"{', '.join(hidden)} hidden by the others", None
    settings = settings_for(chosen)  # draw() never pairs bugs whose settings disagree
    run_settings = {**DRILL_RUN, "set": settings}
    symptoms = symptoms_of(path, codebase, run_settings)
    if not symptoms:
        return "no symptom shows in a short run at every seed", None
    probes, unseen = reach(bugs, codebase, chosen, path, run_settings)
    if unseen:
        return f"{', '.join(unseen)} shows in no run and has no probe", None
    return None, (symptoms, probes, settings)


# --- the work area ------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Draw:
    """A proven draw, not yet filed: what file() writes to work/drills/dN/."""
    tier: str
    codebase: str
    bugs: list
    symptoms: list
    seed: int
    scheduled: bool
    source: str
    seconds: float
    tries: int
    probes: list = ()   # (bug, setting, what to print) for each drawn bug the brief's run does not show
    settings: tuple = ()  # (key, value) of the options its run turns on (NEEDS), in order


def make(state: dict, tier: str | None = None, k: int | None = None, codebase: str | None = None,
         seed: int | None = None, on_try=lambda note: None) -> Draw:
    """Draw and prove a new drill (scheduled by `state`, read only, when no seed is given); file() files it."""
    tier = tier or "practice"
    if tier not in TIERS:
        raise UserError(f"TIER must be one of {', '.join(TIERS)}, got {tier!r}")
    if codebase is not None and codebase not in CODEBASES:
        raise UserError(f"CODEBASE must be one of {', '.join(CODEBASES)}, got {codebase!r}")
    if k is not None and not 1 <= k <= 6:
        raise UserError(f"BUGS must be between 1 and 6, got {k}")
    bugs = load_bugs()
    scheduled = seed is None
    if scheduled:
        seed = len(state.get("drills", {})) + 1000 * len(state.get("classes", {}))
    rng = random.Random(seed)
    when = datetime.now(timezone.utc)
    weights = schedule_weights(state, when) if scheduled else {}
    first = missed_and_due(state, when) if scheduled else ()
    start, tries, why = time.monotonic(), 0, []
    with tempfile.TemporaryDirectory() as tmp:
        while time.monotonic() - start < PROOF_SECONDS:
            tries += 1
            name, chosen = draw(bugs, tier, k, codebase, rng, weights, first if tries <= 3 else ())
            on_try(f"try {tries}: proving a {tier} drill")
            problem, proof = prove(bugs, name, chosen, Path(tmp))
            if problem is None:
                break
            why.append(problem)
        else:
            raise UserError(f"no drill could be proven in {PROOF_SECONDS} s ({tries} draws: {'; '.join(why[-3:])}); "
                            f"try another SEED or TIER")
        source = (Path(tmp) / "grpo.py").read_text()
    symptoms, probes, settings = proof
    return Draw(tier, name, chosen, symptoms, seed, scheduled, source, time.monotonic() - start, tries, probes,
                tuple(settings.items()))


def file(state: dict, d: Draw) -> Drill:
    """Write a proven draw to work/drills/dN/ under the next free number, and note it in `state`."""
    drills = state.setdefault("drills", {})
    folders = [p.name for p in DRILLS.iterdir()] if DRILLS.is_dir() else []  # progress set aside keeps its drills
    number = max([int(n[1:]) for n in [*drills, *folders] if is_drill(n)] + [0]) + 1
    key, target = f"d{number}", DRILLS / f"d{number}"
    minutes = TIER_MINUTES[d.tier] + 5 * (len(d.bugs) - TIER_BUGS[d.tier][0])
    recorded = [{"metric": m, "window": w, "relation": "above" if a > b else "below", "kata": a, "healthy": b}
                if m != "crash" else {"relation": "crash", "message": a} for m, w, a, b in d.symptoms]
    brief = brief_text(d.symptoms, len(d.bugs), d.tier, dict(d.settings))
    copy = WORK / f"{key}-drill" / "grpo.py"
    recipe = {"codebase": d.codebase, "bugs": d.bugs, "seed": d.seed, "scheduled": d.scheduled,
              "hints": hints_for(load_bugs(), d.bugs, d.symptoms, key, d.probes)}
    meta = {"tier": d.tier, "minutes": minutes, "symptoms": recorded, "set": dict(d.settings), "made": now(),
            "seconds_to_prove": round(d.seconds, 1), "tries": d.tries, "sealed": seal(recipe)}
    try:
        target.mkdir(parents=True)
        (target / "grpo.py").write_text(d.source)
        (target / "BRIEF.md").write_text(
            f"# Drill {key}\n\n{brief}\n\nYour copy to edit is {copy.relative_to(WORK.parent)} (`make kata N={key}` "
            f"shows this brief again); see the run with `make run N={key}` (a few seconds on a CPU), and check your "
            f"fix with `make check N={key}`.\n")
        (target / "drill.json").write_text(json.dumps(meta, indent=1))
    except OSError as exc:
        raise cannot_write(target, exc) from None
    drills[key] = {"made": meta["made"], "recorded": False}
    return load(key)


# --- spaced repetition --------------------------------------------------------------------------------

def record_attempt(state: dict, kata: Kata, fixed: list, seconds: float, hints: int, revealed: bool) -> None:
    """File a finished drill under each of its bug classes (once per drill): found or not, time, hints."""
    if not kata.drill:
        return
    entry = state.setdefault("drills", {}).setdefault(kata.key, {})
    if entry.get("recorded"):
        return
    at = now()
    for b in kata.bugs:
        found = b in fixed and not revealed
        c = state.setdefault("classes", {}).setdefault(b, {"box": 0, "attempts": []})
        c["attempts"].append({"at": at, "found": found, "seconds": round(seconds), "hints": hints,
                              "revealed": revealed, "drill": kata.key})
        slow = seconds > kata.minutes * 60
        c["box"] = 0 if not found or slow else min(BOXES - 1, c["box"] + 1) if hints == 0 else c["box"]
        days = 2 ** (c["box"] - 1) if c["box"] else 0
        c["due"] = (datetime.fromisoformat(at) + timedelta(days=days)).isoformat(timespec="seconds")
    entry["recorded"] = True


def schedule_weights(state: dict, when: datetime) -> dict:
    """bug id -> weight for the next draw: never seen 2, due 2 plus a day's overdue, not yet due 0.25."""
    weights = {}
    for b in load_bugs():
        c = state.get("classes", {}).get(b)
        if not c:
            weights[b] = 2.0
            continue
        overdue = (when - datetime.fromisoformat(c["due"])).total_seconds() / 86400 if c.get("due") else 1.0
        weights[b] = 2.0 + min(overdue, 10.0) if overdue >= 0 else 0.25
    return weights


def missed_and_due(state: dict, when: datetime) -> tuple:
    """The classes whose last attempt was missed and that are due, the most overdue first."""
    out = []
    for b, c in state.get("classes", {}).items():
        attempts = c.get("attempts") or [{}]
        if c.get("box", 0) == 0 and attempts[-1].get("found") is False and c.get("due"):
            overdue = (when - datetime.fromisoformat(c["due"])).total_seconds()
            if overdue >= 0:
                out.append((-overdue, b))
    return tuple(b for _, b in sorted(out))


def stats(state: dict) -> list:
    """Per class with attempts: (bug id, attempts, solve rate, median seconds of the found ones, next due, box)."""
    rows = []
    for b, c in sorted(state.get("classes", {}).items()):
        attempts = c.get("attempts", [])
        if not attempts:
            continue
        found = [a for a in attempts if a["found"]]
        times = sorted(a["seconds"] for a in found)
        median = times[len(times) // 2] if times else None
        rows.append((b, len(attempts), len(found) / len(attempts), median, c.get("due", ""), c.get("box", 0)))
    return rows


def after_check(state: dict, kata: Kata, fixed: list, passed: bool) -> dict | None:
    """Record a check of a kata or a drill: the kata solved when every check passed (its record returned, else
    None); for a drill, the bugs found fixed (a reveal before solving counts only those as found) and, once
    solved, the attempt."""
    if kata.drill:
        state.setdefault("drills", {}).setdefault(kata.key, {})["fixed"] = list(fixed)
    if not passed:
        return None
    record = progress.solve(state, kata)
    record_attempt(state, kata, list(kata.bugs), record["seconds"], progress.hints_counted(record), revealed=False)
    return record


def reveal(state: dict, kata: Kata, force: bool) -> None:
    """progress.reveal; a drill revealed before it is solved also files its attempt, its unfixed bugs missed."""
    record = progress.record_of(state, kata)
    unsolved = not record.get("solved")
    progress.reveal(state, kata, force)
    if kata.drill and unsolved:
        fixed = state.get("drills", {}).get(kata.key, {}).get("fixed", [])
        record_attempt(state, kata, fixed, progress.elapsed(record), progress.hints_counted(record), revealed=True)
