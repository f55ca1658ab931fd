"""Drills: drawn drills are proven (every bug caught, none hidden), the same seed gives the same drill, the
scheduler leans towards what was missed, and the CLI handles a drill like a kata. Run: pytest tests/test_drills.py"""
import json
import random
import subprocess
import sys
from datetime import datetime, timedelta, timezone

import pytest

from grpo_katas.catalogue import drawn
from grpo_katas.catalogue.katas import CODEBASES, codebase_source, load_bugs, plant
from grpo_katas.judge import matrix
from grpo_katas.practice import drills
from tests.cli_helpers import cli


BUGS = load_bugs()


@pytest.mark.slow
def test_drawn_drills_for_many_seeds_catch_every_bug_and_heal_to_their_codebase(tmp_path):
    draws = []
    for seed in range(12):
        tier = ["warm-up", "practice", "frontier", "interview"][seed % 4]
        name, chosen = drills.draw(BUGS, tier, None, None, random.Random(seed), {})
        assert drills.TIER_BUGS[tier][0] <= len(chosen) <= drills.TIER_BUGS[tier][1]
        if tier == "interview":
            assert len({BUGS[b].component for b in chosen}) >= 4
        path = tmp_path / f"drill_{seed}.py"
        path.write_text(plant(codebase_source(name), [BUGS[b] for b in chosen], name))
        draws.append((name, chosen, path))
    run = matrix.run([p for _, _, p in draws], [0])
    assert not run.load_errors
    for i, (name, chosen, _) in enumerate(draws):
        verdicts = run.of(i, 0)
        assert not drills.hidden_bugs(BUGS, chosen, name, verdicts), (name, chosen)


def test_the_same_seed_gives_the_same_draw():
    a = drills.draw(BUGS, "practice", None, None, random.Random(7), {})
    b = drills.draw(BUGS, "practice", None, None, random.Random(7), {})
    assert a == b and a != drills.draw(BUGS, "practice", None, None, random.Random(8), {})


def test_the_scheduler_leans_towards_missed_classes():
    when = datetime(2026, 12, 3, tzinfo=timezone.utc)
    past, future = (when - timedelta(days=3)).isoformat(), (when + timedelta(days=8)).isoformat()
    missed, known = ["kl-sign-flipped", "adv-biased-std"], ["loss-pg-sign", "mask-eos-dropped"]
    state = {"katas": {}, "classes": {**{b: {"box": 0, "attempts": [{"found": False}], "due": past} for b in missed},
                                      **{b: {"box": 3, "attempts": [{"found": True}], "due": future} for b in known}}}
    state["classes"]["adv-biased-std"]["due"] = (when - timedelta(days=5)).isoformat()  # the most overdue
    w = drills.schedule_weights(state, when)
    assert all(w[m] > 4 for m in missed) and all(w[k] < 1 for k in known) and w["loss-no-min"] == 2.0
    picks = [drills.draw(BUGS, "warm-up", 1, "paper", random.Random(s), w)[1][0] for s in range(200)]
    assert sum(p in missed for p in picks) > 5 * max(1, sum(p in known for p in picks))
    first = drills.missed_and_due(state, when)
    assert first == ("adv-biased-std", "kl-sign-flipped")
    for s in range(20):  # a scheduled draw starts from the missed classes, in a codebase the most overdue plants in
        name, chosen = drills.draw(BUGS, "practice", None, None, random.Random(s), w, first)
        assert set(first) <= set(chosen) and BUGS["adv-biased-std"].applies_to(name)
        name, chosen = drills.draw(BUGS, "warm-up", None, None, random.Random(s), w, first)
        assert chosen == ["adv-biased-std"]


def test_an_attempt_moves_its_classes_between_boxes():
    state = {"katas": {}, "classes": {"kl-sign-flipped": {"box": 2, "attempts": []}}}
    kata = type("K", (), {"drill": True, "key": "d1", "bugs": ("kl-sign-flipped", "loss-pg-sign"), "minutes": 20})
    drills.record_attempt(state, kata, ["kl-sign-flipped", "loss-pg-sign"], seconds=300, hints=0, revealed=False)
    assert state["classes"]["kl-sign-flipped"]["box"] == 3 and state["classes"]["loss-pg-sign"]["box"] == 1
    drills.record_attempt(state, kata, [], seconds=300, hints=0, revealed=False)  # the same drill is filed once
    assert len(state["classes"]["kl-sign-flipped"]["attempts"]) == 1
    kata.key = "d2"
    drills.record_attempt(state, kata, ["kl-sign-flipped"], seconds=3000, hints=0, revealed=False)  # slow: to 0
    assert state["classes"]["kl-sign-flipped"]["box"] == 0 and state["classes"]["loss-pg-sign"]["box"] == 0
    assert state["classes"]["loss-pg-sign"]["due"] == state["classes"]["loss-pg-sign"]["attempts"][-1]["at"]  # at once
    rows = {r[0]: r for r in drills.stats(state)}
    assert rows["kl-sign-flipped"][1:3] == (2, 1.0) and rows["loss-pg-sign"][2] == 0.5


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_drill_from_the_cli_is_a_kata_like_any_other_named_d1_everywhere(repo, tmp_path):
    code, out = cli(repo, "drill", "--tier", "warm-up", "--seed", "3")
    assert code == 0 and "kata d1: d1-drill" in out and "make check N=d1" in out and "work/d1-drill/grpo.py" in out
    folder = repo / "work" / "drills" / "d1"
    assert sorted(p.name for p in folder.iterdir()) == ["BRIEF.md", "drill.json", "grpo.py"]
    assert not list((repo / "work").rglob("d01*")) and "d01" not in out
    recipe = drawn.unseal(json.loads((folder / "drill.json").read_text())["sealed"])
    beside = " ".join(p.read_text() for p in [*folder.iterdir(), repo / "work" / "d1-drill" / "grpo.py"]
                      if p.name != "grpo.py")
    for answer in (*recipe["bugs"], recipe["codebase"], *(h[:40] for h in recipe["hints"])):
        assert answer not in beside and answer not in out, answer  # nothing beside the copy gives the drill away
    brief = (folder / "BRIEF.md").read_text()
    paragraphs = brief.strip().split("\n\n")
    assert paragraphs[0] == "# Drill d1" and paragraphs[1].startswith("A warm-up drill, drawn for you. ")
    assert paragraphs[-1] == ("Your copy to edit is work/d1-drill/grpo.py (`make kata N=d1` shows this brief again); "
                              "see the run with `make run N=d1` (a few seconds on a CPU), and check your fix with "
                              "`make check N=d1`.")
    assert not any(c in brief.lower() for c in ("advantage", "sampler", "mask", "optimizer"))
    code, out = cli(repo, "drill", "--tier", "warm-up", "--seed", "3")
    assert drawn.unseal(json.loads((repo / "work" / "drills" / "d2" / "drill.json").read_text())["sealed"])["bugs"] \
        == recipe["bugs"]
    code, out = cli(repo, "check", "d1")
    assert code == 1 and "0 of 1 bugs fixed" in out
    (repo / "work" / "d1-drill" / "grpo.py").write_text(CODEBASES[recipe["codebase"]].path.read_text())
    code, out = cli(repo, "check", "d1")
    assert code == 0 and "Solved" in out
    code, out = cli(repo, "stats")
    assert code == 0 and recipe["bugs"][0][:10] in out
    code, out = cli(repo, "solution", "d1")
    assert code == 0 and f"drill d1: the {recipe['codebase']} codebase with {recipe['bugs'][0]}" in out
    graded = subprocess.run([sys.executable, "-m", "grpo_katas.judge.grade", "d1", "work/d1-drill/grpo.py", str(tmp_path)],
                            cwd=repo, capture_output=True, text=True, timeout=300)
    assert graded.returncode == 0 and "kata d1: RESOLVED_FULL" in graded.stdout, graded.stdout + graded.stderr
    assert cli(repo, "check", "d9")[0] == 2


def test_a_brief_uses_the_right_article_for_its_tier():
    symptoms = [("kl", "last", 2.0, 0.5)]
    assert drills.brief_text(symptoms, 1, "interview").startswith("An interview drill, drawn for you. On the default")
    assert drills.brief_text(symptoms, 2, "warm-up").startswith("A warm-up drill")
    assert drills.brief_text(symptoms, 2, "practice").endswith("There are 2 bugs in the loop; find and fix them.")


def test_a_drill_state_of_the_wrong_shape_is_set_aside(repo):
    (repo / "work").mkdir()
    (repo / "work" / "state.json").write_text(json.dumps({"katas": {}, "classes": {"x": {"box": "high"}}}))
    code, out = cli(repo, "stats")
    assert code == 0 and "set aside" in out


def test_drill_draws_are_refused_in_one_line(repo):
    r = subprocess.run([sys.executable, "-m", "grpo_katas.practice.cli", "drill", "--bugs", "9"], cwd=repo,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "BUGS must be between 1 and 6" in r.stdout + r.stderr


def test_a_file_rewritten_in_place_is_run_again(tmp_path, monkeypatch):
    """Drawing proves each try in the same file: a run cached by path gave every later try the first try's
    symptoms (none), and a scheduled draw then failed for minutes."""
    from grpo_katas.catalogue import symptoms
    from grpo_katas.training import loader
    runs = []
    monkeypatch.setattr(loader, "load_target", lambda path: path.read_text())
    monkeypatch.setattr(symptoms, "drive", lambda source, run, log: runs.append(source) or log({"loss": len(runs)}))
    settings = {"steps": 1, "seed": 0, "nproc": 1, "set": {}}
    path = tmp_path / "grpo.py"
    path.write_text("X = 1\n")
    first = symptoms.run_loop(path, settings).history
    path.write_text("X = 2\n")
    second = symptoms.run_loop(path, settings).history
    path.write_text("X = 1\n")
    assert runs == ["X = 1\n", "X = 2\n"] and first != second and symptoms.run_loop(path, settings).history == first


def test_every_drawn_bug_is_seen_in_the_run_under_its_probe_or_by_a_look(tmp_path, monkeypatch):
    """The proof asks of each drawn bug: does healing it alone change the brief's run? Else does its probe rerun,
    healed against not? Else does the first hint name where to look? A bug that none of that reaches is hidden,
    and the draw is refused."""
    from pathlib import Path

    from grpo_katas.catalogue import symptoms
    chosen = ["adv-biased-std", "kl-beta-hardcoded", "logprobs-off-by-one", "sampling-with-grad"]
    path = tmp_path / "grpo.py"
    path.write_text(plant(codebase_source("paper"), [BUGS[b] for b in chosen], "paper"))

    def has(text, bug):
        return all(new in text for _, new in BUGS[bug].edits["paper"])

    def run_loop(loop, settings):  # logprobs-off-by-one shows at once; kl-beta-hardcoded only at beta 0.5
        text = Path(loop).read_text()
        kl = 1.0 + 5.0 * has(text, "logprobs-off-by-one") + 5.0 * (has(text, "kl-beta-hardcoded")
                                                            and settings["set"].get("beta") == 0.5)
        return symptoms.Run([{"kl": kl}] * 5, None)
    monkeypatch.setattr(symptoms, "run_loop", run_loop)
    probes, hidden = drills.reach(BUGS, "paper", chosen, path)
    assert hidden == ["adv-biased-std"]
    assert [(b, settings) for b, settings, _ in probes] == [("kl-beta-hardcoded", {"beta": 0.5}),
                                                            ("sampling-with-grad", None)]
    first = drills.hints_for(BUGS, chosen, [("kl", "last", 11.0, 1.0)], probes)[0]
    assert "SET='beta=0.5'" in first and drills.LOOK["sampling-with-grad"] in first


def test_a_bug_that_lives_under_an_option_is_drawn_with_it_and_never_beside_one_that_contradicts_it():
    """cispo-weight-attached breaks code that only loss_type='cispo' runs: a drill holding it runs with that setting,
    and its brief says so; sapo-temperature-by-ratio needs loss_type='sapo', so the two are never drawn together."""
    assert drills.settings_for(["cispo-weight-attached", "kl-k1"]) == {"loss_type": "cispo"}
    assert drills.settings_for(["cispo-weight-attached", "sapo-temperature-by-ratio"]) is None
    assert drills.settings_for(["gspo-ratio-summed", "gspo-ratio-over-padding"]) == {"importance_sampling_level":
                                                                                     "sequence"}
    for bug in drills.NEEDS:
        assert bug in drills.FRONTIER and BUGS[bug], bug
    for seed in range(40):
        _, chosen = drills.draw(BUGS, "frontier", 2, None, random.Random(seed), {})
        assert drills.settings_for(chosen) is not None, chosen
    brief = drills.brief_text([("reward_mean", "last", 0.0, 0.7)], 1, "frontier", {"loss_type": "cispo"})
    assert brief.startswith("A frontier drill, drawn for you. With loss_type = cispo, the mean reward over the last")
    assert "default" not in brief


@pytest.mark.slow
def test_a_drill_holding_an_option_bug_runs_under_that_option(repo, monkeypatch):
    code, out = cli(repo, "drill", "--tier", "frontier", "--seed", "7")
    folder = repo / "work" / "drills" / "d1"
    meta = json.loads((folder / "drill.json").read_text())
    recipe = drawn.unseal(meta["sealed"])
    assert code == 0, out
    assert meta["set"] == drills.settings_for(recipe["bugs"]) != {}, recipe["bugs"]
    monkeypatch.setattr(drawn, "DRILLS", repo / "work" / "drills")
    assert drawn.load("d1").run["set"] == meta["set"]
