"""The proof's two tiers and its cache (grpo_katas/proof/verify.py): the full tier judges every planting and runs every
symptom, the static tier applies every rule that needs no run; verdicts are reused only under the key they were
judged with, a key that covers every file the judge imports; a second run judges only what an edit changed.
Run: pytest tests/test_verify.py"""
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from grpo_katas import ROOT
from grpo_katas.catalogue.katas import CheckId, fail_to_pass, load_bugs, load_katas
from grpo_katas.judge.matrix import Verdict
from grpo_katas.proof import verify


def fake_matrix(calls: list, troubled=()):
    """A stand-in for run_matrix: a target fails one check when its file says so; `troubled` targets had a hang."""
    def run_matrix(targets, seeds, processes, cost=None):
        calls.append(sorted(targets))
        verdicts = {n: {CheckId("loss", "grad"): Verdict("fail" not in Path(p).read_text(), items=1)}
                    for n, p in targets.items()}
        return {s: dict(verdicts) for s in seeds}, [], [n for n in targets if n not in troubled]
    return run_matrix


@pytest.fixture
def files(tmp_path):
    for name, text in [("a", "pass"), ("b", "pass"), ("c", "fail")]:
        (tmp_path / f"{name}.py").write_text(text)
    return {name: tmp_path / f"{name}.py" for name in "abc"}


def test_a_second_run_judges_only_what_changed_and_fresh_judges_everything(tmp_path, files, monkeypatch):
    calls = []
    monkeypatch.setattr(verify, "run_matrix", fake_matrix(calls))
    cache = verify.VerdictCache(tmp_path / "cache")
    runs, _, judged, reused = verify.judge(files, (0, 1), 2, cache)
    assert calls == [["a", "c"]] and (judged, reused) == (2, 0)  # a and b have the same bytes: judged once
    assert [runs[1][n][CheckId("loss", "grad")].passed for n in "abc"] == [True, True, False]
    again, _, judged, reused = verify.judge(files, (0, 1), 2, cache)
    assert calls[-1] == [] and (judged, reused) == (0, 3) and again == runs
    files["c"].write_text("pass now")
    runs, _, judged, reused = verify.judge(files, (0, 1), 2, cache)
    assert calls[-1] == ["c"] and (judged, reused) == (1, 2) and runs[0]["c"][CheckId("loss", "grad")].passed
    verify.judge(files, (0, 1, 2), 2, cache)  # a seed not judged before: judged, at every seed
    assert calls[-1] == ["a", "c"]
    verify.judge(files, (0,), 2, verify.VerdictCache(tmp_path / "cache", fresh=True))
    assert calls[-1] == ["a", "c"]


def test_the_verdicts_of_a_judge_that_saw_a_hang_are_not_kept(tmp_path, files, monkeypatch):
    calls = []
    monkeypatch.setattr(verify, "run_matrix", fake_matrix(calls, troubled={"c"}))
    cache = verify.VerdictCache(tmp_path / "cache")
    verify.judge(files, (0,), 2, cache)
    verify.judge(files, (0,), 2, cache)
    assert calls == [["a", "c"], ["c"]]


def test_a_target_rebuilt_while_it_was_judged_is_named_and_its_verdicts_not_kept(tmp_path, files, monkeypatch):
    calls, matrix = [], fake_matrix([])

    def rebuilt_meanwhile(targets, seeds, processes, cost=None):
        found = matrix(targets, seeds, processes)
        files["c"].write_text("pass, rebuilt")
        return found
    monkeypatch.setattr(verify, "run_matrix", rebuilt_meanwhile)
    cache = verify.VerdictCache(tmp_path / "cache")
    _, problems, _, _ = verify.judge(files, (0,), 2, cache)
    assert problems == ["c: its file changed while it was judged: run verify again once nothing is rebuilding it"]
    files["c"].write_text("fail")
    monkeypatch.setattr(verify, "run_matrix", fake_matrix(calls))
    verify.judge(files, (0,), 2, cache)
    assert calls == [["c"]]  # judged again: nothing was kept under the bytes it was judged as


def test_the_key_changes_with_the_target_and_every_judge_file_and_nothing_else(repo, tmp_path):
    def key():
        return verify.VerdictCache(tmp_path, source=repo).key(repo / "katas" / "01-kl-creep" / "grpo.py")
    first = key()
    for unrelated in ["README.md", "katas/bugs.toml", "grpo_katas/practice/cli.py"]:
        (repo / unrelated).write_text((repo / unrelated).read_text() + "\n")
    assert key() == first
    seen = {first}
    for rel in ["katas/01-kl-creep/grpo.py", "checks/oracle.py", "lab/model.py", "grpo_katas/judge/wire.py",
                "conftest.py", "grpo_katas/judge/matrix.py"]:
        (repo / rel).write_text((repo / rel).read_text() + "\n# edited\n")
        assert key() not in seen, rel
        seen.add(key())


def test_the_judge_files_are_every_file_of_the_repository_the_judge_and_its_worker_import():
    modules = ["conftest", "grpo_katas.judge.matrix", "grpo_katas.judge.worker"]
    modules += [f"checks.{p.stem}" for p in sorted((ROOT / "checks").glob("*.py"))]
    code = (f"import importlib, sys\nfor m in {modules!r}: importlib.import_module(m)\n"
            "print('\\n'.join(str(getattr(m, '__file__', None)) for m in list(sys.modules.values())))")
    out = subprocess.run([sys.executable, "-W", "ignore", "-c", code], cwd=ROOT, capture_output=True, text=True,
                         check=True, timeout=120).stdout.split()
    ours = {Path(f).relative_to(ROOT) for f in out if f.startswith(str(ROOT)) and "/.venv/" not in f}
    assert ours, out
    uncovered = [str(f) for f in ours if not any(str(f) == j or str(f).startswith(j + "/") for j in verify.JUDGE_FILES)]
    assert not uncovered


@pytest.mark.slow
def test_after_an_edit_to_one_bugs_edit_a_second_proof_judges_only_that_target(repo):
    """The done-when of issue 21 in small: one codebase at one seed, then the same after one edit changed. The copy
    starts from this repository's verdicts, where a proof made them (CI's, before the slow tests): a verdict's key
    is the bytes judged, so the first proof judges only what no proof here has judged (an empty cache judging
    everything is test_a_second_run_judges_only_what_changed_and_fresh_judges_everything's)."""
    if (verify.CACHE / "0").is_dir():
        shutil.copytree(verify.CACHE / "0", repo / ".cache" / "verify" / "0")

    def proof():
        r = subprocess.run([sys.executable, "-m", "grpo_katas.proof.verify", "--seeds", "0", "--codebase", "core"],
                           cwd=repo, capture_output=True, text=True, timeout=600)
        return next(line for line in r.stdout.splitlines() if "targets at seeds" in line)
    n = int(proof().split()[0])
    edits = repo / "katas" / "edits" / "core.toml"
    lines = edits.read_text().splitlines(keepends=True)
    bug = None
    for i, line in enumerate(lines):  # the first one-line replace of a bug
        bug = line.split('"')[1] if line.startswith("bug = ") else bug
        if bug and line.startswith('replace = "    ') and line.endswith('"\n'):
            lines[i] = line[:-2] + '  # tuned"\n'
            break
    edits.write_text("".join(lines))
    assert f"{n} targets at seeds (0,): 1 judged (1 distinct files), {n - 1} reused" in proof()


@pytest.mark.slow
def test_the_full_tier_judges_every_planting_and_applies_every_rule(tmp_path, monkeypatch, capsys):
    """The whole proof with a stand-in judge whose verdicts are what the catalogue declares (and without the
    unused-name rule's parse of every planting, the one costly static rule)."""
    bugs, katas = load_bugs(), {k.name: k for k in load_katas()}
    checks = sorted({c for b in bugs.values() for name in b.edits for c in b.checks_in(name)})
    seen = {}

    def declared(name):
        if name.startswith("nan:"):  # a contract function returning NaN fails its component's checks
            return {c for c in checks if c.component == verify.CONTRACT[name[4:]]}
        if "@" in name:
            bug, codebase = name.split("@")
            return set(bugs[bug].checks_in(codebase))
        return fail_to_pass(katas[name], bugs) if name in katas else set()

    def run_matrix(targets, seeds, processes, cost=None):
        seen.update(dict.fromkeys(targets, seeds))
        verdicts = {n: {c: Verdict(c not in declared(n), kind="assertion") for c in checks} for n in targets}
        return {s: verdicts for s in seeds}, [], list(targets)
    monkeypatch.setattr(verify, "run_matrix", run_matrix)
    symptoms = []
    monkeypatch.setattr(verify, "symptom_problems", lambda katas, processes, seeds, kernels, cost: symptoms.append(
        (len(katas), seeds, kernels)) or [])
    monkeypatch.setattr(verify, "has_avx512", lambda: True)  # as on a CPU that has it
    monkeypatch.setattr(verify, "CACHE", tmp_path)
    monkeypatch.setattr(verify, "unused_names", lambda source: set())
    assert verify.main(["--tier", "full"]) == 0, capsys.readouterr().out
    out = capsys.readouterr().out
    plantings = sum(len(b.edits) for b in bugs.values())
    assert f"full tier: {plantings} of {plantings} plantings judged" in out and "0 problem(s)" in out
    assert {n.split("@")[0] for n in seen if "@" in n} == set(bugs)
    assert set(seen.values()) == {verify.TIERS["full"].seeds}
    assert symptoms == [(len(katas), (0, 1, 2, 3, 4), ("default", "avx2", "avx512"))]
    assert re.search(r"^make verify: judging \d+ CPU-s for \d+ file-seeds .* runs \d+ CPU-s for \d+ runs", out, re.M)


@pytest.mark.slow
def test_the_static_tier_runs_nothing_and_still_applies_every_static_rule(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(verify, "run_matrix", lambda *a: pytest.fail("the static tier judges nothing"))
    monkeypatch.setattr(verify, "symptom_problems", lambda *a, **k: pytest.fail("the static tier runs nothing"))
    # the repository passes the static tier: make test runs it beside the tests; here a kata without its record
    broken = tmp_path / "katas"
    shutil.copytree(ROOT / "katas", broken)
    (broken / "01-kl-creep" / "run.txt").unlink()
    monkeypatch.setattr(verify, "load_katas", lambda: load_katas(broken))
    assert verify.main(["--tier", "static"]) == 1
    out = capsys.readouterr().out
    assert "01-kl-creep: no recorded run with both tables (run.txt)" in out and " 1 problem(s)" in out, out
