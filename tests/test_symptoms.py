"""A brief's symptoms are its bugs' effects on any seed and CPU, its numbers are the ones a run shows, and the proof
of that re-runs only what changed. Run: pytest tests/test_symptoms.py"""
import dataclasses
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import tomllib

from grpo_katas import ROOT
from grpo_katas.catalogue import symptoms
from grpo_katas.catalogue.katas import CODEBASES, find_kata, load_katas
from grpo_katas.catalogue.symptoms import Store, check, needed, plan, quote, quotes, run_key, run_loop
from grpo_katas.training.curves import digits
from grpo_katas.training.runs import PRACTICE_GRPO


KATAS = load_katas()


@pytest.mark.slow
def test_make_run_shows_the_run_the_symptoms_were_measured_on():
    """Float sums differ with torch's thread count, and over 40 steps so does the whole run: the runner behind
    make run and the symptom runs both use one thread, whatever the machine has (this one has two)."""
    kata = find_kata(14)
    settings = {**kata.run, "steps": 40}
    measured = [h["reward_mean"] for h in run_loop(kata.loop, settings).history]
    out = subprocess.run([sys.executable, "-W", "ignore", "-m", "grpo_katas.training.runner", str(kata.loop), "--steps", "40",
                          "--seed", str(kata.run["seed"]), "--set", *kata.settings],
                         cwd=ROOT, capture_output=True, text=True, timeout=300).stdout
    shown = [e["reward_mean"] for e in map(json.loads, out.splitlines()) if e.get("event") == "step"]
    assert shown == measured


def test_a_symptom_must_hold_at_all_but_one_seed_in_five():
    assert [needed(n) for n in (1, 2, 3, 4, 5, 10)] == [1, 2, 3, 4, 4, 8]


@pytest.mark.parametrize("value, metric, text", [
    (2.74318, "kl", "2.7432"), (-1e-9, "loss", "0.0000"), (0.12345, "reward_mean", "0.123"),
    (0.12345, "reward_mean@1", "0.123"), (0.125, "grad_norm", "0.12"), (5.06, "completion_len", "5.1"),
    (float("nan"), "kl", "nan"), (None, "kl", "none"),
])
def test_a_reading_is_quoted_as_make_run_prints_it(value, metric, text):
    assert quote(value, metric) == text


def test_a_symptom_quotes_each_reading_at_its_own_metrics_digits():
    symptom = {"metric": "reward_mean@1", "says": "0.500", "says_against": "0.2500",
               "against": {"metric": "kl"}}
    assert quotes(symptom) == [("0.500", "reward_mean@1"), ("0.2500", "kl")]


# --- the briefs ---------------------------------------------------------------------------------------------

def prose(kata) -> str:
    """The brief's report, without its title and the closing line of commands."""
    body = kata.brief.split("\n", 1)[1]
    return body.split("Start with `make kata", 1)[0]


def allowed_numbers(kata) -> set:
    """The numbers a brief may print: the settings of its runs, the steps its windows name, and what its symptoms
    say (checked by the proof at the brief's seed on every kernel path: what make run prints there)."""
    from solutions.grpo import GRPOConfig
    numbers = {kata.number, kata.run["steps"], kata.run["seed"], kata.run["nproc"], *PRACTICE_GRPO.values()}
    numbers |= {v for v in GRPOConfig.__dataclass_fields__.values() for v in [v.default] if isinstance(v, (int, float))}
    numbers |= set(kata.run["set"].values())
    for s in kata.symptoms:
        if isinstance(s.get("window"), int):
            numbers.add(s["window"])
        numbers |= set(s.get("against", {}).get("set", {}).values()) | set(s.get("probe", {}).get("set", {}).values())
        numbers |= {s.get("probe", {}).get("steps")}
        for said in (s.get("says"), s.get("says_against")):
            if said is not None:
                numbers.add(said.split()[-1])
    return {str(n) for n in numbers if n is not None and not isinstance(n, bool)} | \
        {f"{float(n):g}" for n in numbers if isinstance(n, (int, float)) and not isinstance(n, bool)}


@pytest.mark.parametrize("kata", KATAS, ids=lambda k: k.name)
def test_every_number_a_brief_prints_is_a_setting_or_a_checked_reading(kata):
    printed = re.findall(r"(?<![\w.])-?\d+(?:\.\d+)?(?![\w])", prose(kata))
    unchecked = [n for n in printed if n not in allowed_numbers(kata) and f"{float(n):g}" not in allowed_numbers(kata)]
    assert not unchecked, f"{kata.name}: the brief prints {unchecked}, which no symptom says and no setting is"


@pytest.mark.parametrize("kata", KATAS, ids=lambda k: k.name)
def test_what_a_symptom_says_is_what_the_brief_prints(kata):
    for s in kata.symptoms:
        for said, metric in quotes(s):
            number = said.split()[-1]  # a bound (about, under, over X) where the kernel paths print different numbers
            assert said in (number, *(f"{how} {number}" for how in ("about", "under", "over"))), said
            places = len(number.partition(".")[2])
            assert places == digits(metric) or said != number and places <= digits(metric), (
                f"{kata.name}: a symptom says {said!r}: make run prints {metric} at {digits(metric)} decimals")
            assert said in prose(kata), f"{kata.name}: a symptom says {said!r}, the brief does not print it"


# --- the proof, on made-up runs ---------------------------------------------------------------------------------

def fake_store(tmp_path, wanted: dict, history) -> None:
    """Write a made-up run for every wanted (path, settings), standing for a run as long as the longest asked for:
    history(path, settings) -> list of step dicts."""
    for name, specs in wanted.items():
        longest = {}
        for path, settings in specs:
            key = run_key(path, settings, name)
            longest[key] = max(longest.get(key, 0), settings["steps"])
        for path, settings in specs:
            entry = {"history": history(path, settings), "crash": None, "steps": longest[run_key(path, settings, name)]}
            (tmp_path / f"{run_key(path, settings, name)}.json").write_text(json.dumps(entry))


@pytest.fixture(autouse=True)
def made_up_runs_have_no_record(request, monkeypatch):
    """The made-up runs below are not kata 13's brief run, which its record holds: its comparison is left out,
    but where a test is about the record."""
    if "record" not in request.node.name:
        monkeypatch.setattr(symptoms.record, "differences", lambda *a, **k: [])


def a_kata(tmp_path, seed_kl: dict, symptom: dict, bugs=("kl-k1", "update-clip-after-step")):
    """Kata 13 (two bugs) with one symptom, and made-up runs: the kata's kl per seed, the healthy one's 1.0, and a
    kata healed of either bug at 1.0."""
    import dataclasses
    kata = dataclasses.replace(find_kata(13), symptoms=(symptom,), bugs=bugs)
    wanted, _ = plan([kata], list(seed_kl), [symptoms.kernel()], symptoms.kernel(), tmp_path)
    own = kata.loop

    def history(path, settings):
        kl = seed_kl[settings["seed"]] if path == own else 1.0
        return [{"kl": kl}] * 5
    fake_store(tmp_path, wanted, history)
    return kata


@pytest.fixture
def clip_bug_probed(monkeypatch):
    """A made-up probe of the first hint that names update-clip-after-step, the bug of a_kata's that SYMPTOM does
    not name, so that the kata's every bug is reachable."""
    monkeypatch.setattr(symptoms, "load_probes", lambda kata: [{"bugs": ["update-clip-after-step"], "look": "Rerun",
                                                                "why": "made up"}])


SYMPTOM = {"metric": "kl", "window": "last", "relation": "above", "factor": 2.0, "bugs": ["kl-k1"]}


def test_a_symptom_that_holds_at_four_of_five_seeds_passes(tmp_path, clip_bug_probed):
    kata = a_kata(tmp_path, {0: 3.0, 1: 3.0, 2: 1.5, 3: 3.0, 4: 3.0}, SYMPTOM)
    assert check([kata], seeds=range(5), folder=tmp_path) == []


def test_a_symptom_that_holds_at_three_of_five_seeds_fails(tmp_path, clip_bug_probed):
    kata = a_kata(tmp_path, {0: 3.0, 1: 1.0, 2: 1.5, 3: 3.0, 4: 3.0}, SYMPTOM)
    found = check([kata], seeds=range(5), folder=tmp_path)
    assert len(found) == 1 and "holds at 3 of 5 seeds, fewer than 4" in found[0] and "seed 1: kl (last) 1" in found[0]


@pytest.mark.parametrize("seed_kl, swept", [({0: 3.0, 1: 3.0, 2: 3.0, 3: 3.0, 4: 1.0}, [0, 1, 2, 3]),
                                             ({0: 3.0, 1: 1.0, 2: 3.0, 3: 3.0, 4: 3.0}, [0, 1, 2, 3, 4])])
def test_the_fifth_seed_is_run_only_where_one_of_the_first_four_missed(tmp_path, clip_bug_probed, monkeypatch,
                                                                      seed_kl, swept):
    kata = a_kata(tmp_path, seed_kl, SYMPTOM)
    asked, get = set(), Store.get

    def spy(self, path, settings, name):
        if path == kata.loop:
            asked.add(settings["seed"])
        return get(self, path, settings, name)
    monkeypatch.setattr(Store, "get", spy)
    assert check([kata], seeds=range(5), folder=tmp_path) == []  # 4 of 5 either way: the fifth cannot change that
    assert sorted(asked) == swept
    assert symptoms.first_seeds(dataclasses.replace(kata, run={**kata.run, "seed": 4}), range(5)) == [4, 0, 1, 2]


def test_a_symptom_must_hold_at_the_briefs_own_seed(tmp_path, clip_bug_probed):
    kata = a_kata(tmp_path, {0: 1.0, 1: 3.0, 2: 3.0, 3: 3.0, 4: 3.0}, SYMPTOM)
    found = check([kata], seeds=range(5), folder=tmp_path)
    assert len(found) == 1 and "does not show at the brief's seed 0" in found[0]


def test_the_numbers_a_brief_prints_are_what_the_run_prints_at_its_seed(tmp_path, clip_bug_probed):
    kata = a_kata(tmp_path, {0: 3.0}, {**SYMPTOM, "says": "3.0000", "says_against": "1.0000"})
    assert check([kata], seeds=[0], folder=tmp_path) == []
    for said in ("about 3.0", "3.0", "3.00001"):
        kata = a_kata(tmp_path, {0: 3.0}, {**SYMPTOM, "says": said, "says_against": "1.0000"})
        found = check([kata], seeds=[0], folder=tmp_path)
        assert len(found) == 1 and f"the brief says {said!r}" in found[0] and "the run prints 3.0000" in found[0]


def test_where_the_kernel_paths_print_different_numbers_the_brief_prints_a_bound_for_each():
    symptom = {"metric": "kl", "says": "over 2.7", "says_against": "0.5518"}
    read = {"default": (2.7244, 0.55181), "avx512": (2.7232, 0.55179)}
    assert symptoms.says_problems(symptom, read) == []
    found = symptoms.says_problems({**symptom, "says": "2.7232"}, read)
    assert len(found) == 1 and "2.7244 under default, 2.7232 under avx512" in found[0] and "'about 2.7238'" in found[0]
    assert symptoms.says_problems({**symptom, "says": "over 2.724"}, read)  # not over it under avx512


def test_a_brief_run_that_prints_another_table_than_its_record_is_named(tmp_path, clip_bug_probed):
    kata = a_kata(tmp_path, {0: 3.0}, SYMPTOM)
    found = check([kata], seeds=[0], folder=tmp_path)
    assert len(found) == 2 and all(f"{kata.name}: the {symptoms.kernel()} kernel path prints a different" in f
                                   for f in found)
    assert "kata table from row 0 on" in found[0] and "healthy table from row 0 on" in found[1]


def test_every_bug_is_shown_by_a_symptom_or_named_by_a_probe_of_the_first_hint(tmp_path):
    kata = a_kata(tmp_path, {0: 3.0}, SYMPTOM)
    found = check([kata], seeds=[0], folder=tmp_path)
    assert found == [f"{kata.name}: no symptom shows update-clip-after-step and no probe of the first hint names "
                     f"where to see it"]


def test_a_symptom_that_stays_when_its_bug_is_healed_is_not_that_bugs(tmp_path, clip_bug_probed):
    kata = a_kata(tmp_path, {0: 3.0}, {**SYMPTOM, "bugs": ["kl-k1", "update-clip-after-step"]})
    wanted, _ = plan([kata], [0], [symptoms.kernel()], symptoms.kernel(), tmp_path)
    healed_of_clip = symptoms.healed_loop(kata, "update-clip-after-step", symptoms.load_bugs(), tmp_path)
    fake_store(tmp_path, wanted, lambda path, settings: [{"kl": 3.0 if path in (kata.loop, healed_of_clip) else 1.0}])
    found = check([kata], seeds=[0], folder=tmp_path)
    assert len(found) == 1 and "still shows with update-clip-after-step fixed" in found[0]


def test_a_probe_run_must_be_named_by_the_first_hint(tmp_path, clip_bug_probed):
    kata = a_kata(tmp_path, {0: 3.0}, {**SYMPTOM, "probe": {"set": {"temperature": 0.7}}})
    found = check([kata], seeds=[0], folder=tmp_path)
    assert found == [f"{kata.name}: symptom above kl is seen on a rerun with temperature=0.7, which neither the "
                     f"brief nor the first hint names"]


def test_a_second_check_makes_no_run_again(tmp_path, monkeypatch):
    made = []

    def compute(self, name, chunk, todo):
        for key in chunk:
            made.append(key)
            (self.folder / f"{key}.json").write_text(json.dumps({"history": [{"kl": 1.0}], "crash": None,
                                                                 "steps": todo[key][2]["steps"]}))
    monkeypatch.setattr(Store, "compute", compute)
    kata = find_kata(1)
    wanted = {symptoms.kernel(): [(kata.loop, kata.run), (CODEBASES[kata.codebase].path, kata.run)]}
    Store(tmp_path).fetch(wanted, processes=2)
    assert len(made) == 2
    again = Store(tmp_path)
    again.fetch(wanted, processes=2)
    assert len(made) == 2 and again.get(kata.loop, kata.run, symptoms.kernel()).history == [{"kl": 1.0}]
    Store(tmp_path, fresh=True).fetch(wanted, processes=2)
    assert len(made) == 4


def test_runs_that_differ_only_in_length_are_made_once_at_the_longest_and_read_as_their_first_steps(tmp_path,
                                                                                                   monkeypatch):
    made = []

    def compute(self, name, chunk, todo):
        for key in chunk:
            steps = todo[key][2]["steps"]
            made.append(steps)
            history = [{"kl": float(i)} for i in range(1, steps + 1)]
            (self.folder / f"{key}.json").write_text(json.dumps({"history": history, "crash": None, "steps": steps}))
    monkeypatch.setattr(Store, "compute", compute)
    kata = find_kata(1)
    short, long = {**kata.run, "steps": 5}, {**kata.run, "steps": 12}
    store = Store(tmp_path)
    store.fetch({"default": [(kata.loop, short), (kata.loop, long)]}, processes=1)
    assert made == [12]
    assert [h["kl"] for h in store.get(kata.loop, short, "default").history] == [1.0, 2.0, 3.0, 4.0, 5.0]
    assert len(store.get(kata.loop, long, "default").history) == 12
    Store(tmp_path).fetch({"default": [(kata.loop, short)]}, processes=1)
    assert made == [12]  # a shorter run is read from the longer one kept
    Store(tmp_path).fetch({"default": [(kata.loop, {**kata.run, "steps": 20})]}, processes=1)
    assert made == [12, 20]  # a longer one is made, and kept in its place


def test_a_run_that_raised_answers_for_any_length_raising_only_where_it_did(tmp_path, monkeypatch):
    def compute(self, name, chunk, todo):
        for key in chunk:
            (self.folder / f"{key}.json").write_text(json.dumps({"history": [{"kl": 1.0}] * 3, "crash": "boom",
                                                                 "steps": todo[key][2]["steps"]}))
    monkeypatch.setattr(Store, "compute", compute)
    kata = find_kata(1)
    store = Store(tmp_path)
    store.fetch({"default": [(kata.loop, kata.run)]}, processes=1)
    monkeypatch.setattr(Store, "compute", lambda *a: pytest.fail("nothing to run"))
    again = Store(tmp_path)
    again.fetch({"default": [(kata.loop, {**kata.run, "steps": 80})]}, processes=1)
    at = lambda steps: again.get(kata.loop, {**kata.run, "steps": steps}, "default")  # noqa: E731
    assert (len(at(2).history), at(2).crash) == (2, None)
    assert (len(at(3).history), at(3).crash) == (3, None)
    assert (len(at(80).history), at(80).crash) == (3, "boom")


def test_a_symptom_runs_only_the_steps_its_window_reads_and_is_read_on_each_path_only_from_the_record():
    kata = find_kata(14)
    first = {"metric": "kl", "window": "first", "relation": "above"}
    at_step = {"metric": "kl", "window": 3, "relation": "above"}
    last = {"metric": "kl", "window": "last", "relation": "above"}
    crash = {"relation": "crash", "window": 1}
    rerun = {**last, "against": {"set": {"beta": 0.0}}}
    assert [s[1]["steps"] for s in symptoms.sides(kata, first, 1)] == [5, 5]
    assert [s[1]["steps"] for s in symptoms.sides(kata, at_step, 1)] == [3, 3]
    assert [s[1]["steps"] for s in symptoms.sides(kata, last, 1)] == [kata.run["steps"]] * 2
    assert symptoms.sides(kata, crash, 1)[0][1]["steps"] == kata.run["steps"]
    assert symptoms.recorded(kata, first) and symptoms.recorded(kata, last) and symptoms.recorded(kata, crash)
    assert not symptoms.recorded(kata, rerun) and not symptoms.recorded(kata, {**last, "probe": {"set": {"lr": 1.0}}})
    wanted, readings = plan([dataclasses.replace(kata, symptoms=(last, rerun))], [0, 1], ["default", "avx2"], "avx2",
                            Path(tempfile.mkdtemp()))
    assert [(r.symptom, r.kernel) for r in readings if r.how == "kernel"] == [(0, "default")]


def test_a_file_rebuilt_while_its_runs_were_made_is_named_not_a_traceback(tmp_path, monkeypatch):
    loop = tmp_path / "grpo.py"
    loop.write_bytes(find_kata(1).loop.read_bytes())
    settings = find_kata(1).run

    def compute(self, name, chunk, todo):  # the kata is rebuilt while its run is made
        loop.write_bytes(loop.read_bytes() + b"\n")
        for key in chunk:
            (self.folder / f"{key}.json").write_text(json.dumps({"history": [{"kl": 1.0}], "crash": None}))
    monkeypatch.setattr(Store, "compute", compute)
    store = Store(tmp_path)
    store.fetch({"default": [(loop, settings)]}, processes=1)
    with pytest.raises(symptoms.Changed, match="grpo.py changed while its runs were made"):
        store.get(loop, settings, "default")


def test_a_child_keeps_no_run_under_a_key_its_file_no_longer_has(tmp_path, monkeypatch):
    loop = tmp_path / "grpo.py"
    loop.write_bytes(find_kata(1).loop.read_bytes())
    settings = {**find_kata(1).run, "steps": 1}
    key = run_key(loop, settings, symptoms.kernel())
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps([[key, str(loop), settings]]))
    monkeypatch.setattr(symptoms, "fresh_run", lambda path, st: loop.write_text("# rebuilt") or symptoms.Run([], None))
    symptoms.compute_main(str(spec), str(tmp_path), str(tmp_path / "kernel"), symptoms.kernel())
    assert not (tmp_path / f"{key}.json").exists()


def test_a_run_is_kept_under_its_code_settings_kernel_path_and_cpu(tmp_path):
    kata = find_kata(1)
    key = run_key(kata.loop, kata.run, "avx2")
    assert key != run_key(kata.loop, {**kata.run, "seed": 1}, "avx2")
    assert key != run_key(kata.loop, kata.run, "default")
    assert key != run_key(CODEBASES[kata.codebase].path, kata.run, "avx2")
    other = tmp_path / "grpo.py"
    other.write_bytes(kata.loop.read_bytes() + b"\n")
    assert key != run_key(other, kata.run, "avx2")


def test_a_kernel_path_the_cpu_lacks_is_skipped_not_run(tmp_path, monkeypatch):
    monkeypatch.setattr(symptoms, "supported", lambda name: name != "avx512")
    monkeypatch.setattr(Store, "compute", lambda *a: pytest.fail("nothing to run"))
    store = Store(tmp_path)
    store.fetch({"avx512": [(find_kata(1).loop, find_kata(1).run)]}, processes=1)
    assert store.skipped == {"avx512": "this CPU has no avx512 kernels"}


def test_a_child_runs_under_the_kernel_path_it_is_given(tmp_path):
    """The variable is read when torch is imported: the child, not this process, must carry it."""
    kata = find_kata(24)  # NaN from step one: one step tells
    settings = {**kata.run, "steps": 1}
    store = Store(tmp_path)
    store.fetch({"default": [(kata.loop, settings)]}, processes=1)
    entry = json.loads((tmp_path / f"{run_key(kata.loop, settings, 'default')}.json").read_text())
    assert entry["kernel"] == "default" and len(entry["history"]) == 1


def test_the_kata_tomls_name_only_their_own_bugs_and_known_keys():
    keys = {"metric", "window", "relation", "factor", "margin", "against", "probe", "bugs", "says", "says_against",
            "match"}
    for kata in KATAS:
        for s in kata.symptoms:
            assert set(s) <= keys, f"{kata.name}: unknown symptom keys {set(s) - keys}"
            assert set(s.get("bugs", [])) <= set(kata.bugs), kata.name
        for p in tomllib.loads((kata.path / "kata.toml").read_text()).get("probe", []):
            assert set(p) == {"bugs", "look", "why"} and set(p["bugs"]) <= set(kata.bugs), kata.name
