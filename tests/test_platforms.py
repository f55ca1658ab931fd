"""Where candidates practise (issue 46): the CI workflow for Linux on x86 and ARM and a Mac with Apple silicon is one
GitHub accepts, and the Makefile asks nothing of make that macOS's own GNU make 3.81 lacks. The workflow is checked
against GitHub's schema by check-jsonschema (the ci extra, which .ci/run installs; skipped without it). The
Makefile was run under a make 3.81 built from GNU's source (the note of the session says how); the macOS leg of
the workflow runs make test under Apple's. Run: pytest tests/test_platforms.py"""
import re
import subprocess
import sys

import pytest

from grpo_katas import ROOT
from tests.test_record import REPRODUCED

WORKFLOWS = ROOT / ".github" / "workflows"


def schema_errors(*paths) -> tuple:
    r = subprocess.run([sys.executable, "-m", "check_jsonschema", "--builtin-schema", "vendor.github-workflows",
                        *map(str, paths)], capture_output=True, text=True, timeout=60)
    return r.returncode, r.stdout + r.stderr


def test_every_workflow_is_one_github_accepts(tmp_path):
    pytest.importorskip("check_jsonschema", reason="the ci extra: pip install -c constraints.txt -e '.[ci]'")
    code, out = schema_errors(*sorted(WORKFLOWS.glob("*.yml")))
    assert code == 0, out
    broken = tmp_path / "broken.yml"  # a job with steps and no runner: the schema must refuse it
    broken.write_text(re.sub(r"\n    runs-on: .*", "", (WORKFLOWS / "ci.yml").read_text()))
    assert schema_errors(broken)[0] != 0


def test_the_ci_workflow_runs_on_linux_x86_and_arm_and_a_mac_and_reproduces_a_kata_of_each_codebase():
    yaml = pytest.importorskip("ruamel.yaml", reason="comes with the ci extra")
    flow = yaml.YAML(typ="safe").load((WORKFLOWS / "ci.yml").read_text())
    job = flow["jobs"]["test"]
    assert set(job["strategy"]["matrix"]["os"]) == {"ubuntu-latest", "ubuntu-24.04-arm", "macos-14"}
    runs = [step["run"] for step in job["steps"] if "run" in step]
    assert any(run.strip().endswith("make setup") for run in runs) and "make test" in runs
    record = next(run for run in runs if "record_runs --check" in run)
    assert set(record.split("--check", 1)[1].split()) == {k.key for k in REPRODUCED}


# What GNU make added after 3.81 (its NEWS), as a Makefile would spell it: none may appear
NEWER_THAN_381 = {
    r"^\s*\.ONESHELL\s*:": "3.82", r"^\s*\.RECIPEPREFIX\b": "3.82", r"^\s*undefine\s": "3.82",
    r"^\s*(override\s+|export\s+)*private\s": "3.82", r"^\s*define\s+\S+\s*(:?:?=|\+=|\?=)": "3.82",
    r"^\s*(override\s+|export\s+)?[\w.-]+\s*!=": "4.0", r"^\s*(override\s+|export\s+)?[\w.-]+\s*::=": "4.0",
    r"\$\(file\s": "4.0", r"\$\(guile\s": "4.0",
    r"--output-sync|--trace\b": "4.0", r"\bMAKE_TERM(OUT|ERR)\b": "4.1", r"\.SHELLSTATUS\b": "4.2",
    r"\.EXTRA_PREREQS\b": "4.3", r"^[^#\t=]*&:": "4.3", r"\$\(let\s|\$\(intcmp\s|:::=": "4.4",
    r"\.NOTINTERMEDIATE\b|\.WAIT\b|--shuffle": "4.4",
}


def test_the_makefile_uses_nothing_newer_than_make_3_81():
    lines = (ROOT / "Makefile").read_text().splitlines()
    found = [f"Makefile:{i}: {line.strip()} (make {version})" for i, line in enumerate(lines, 1)
             if not line.lstrip().startswith("#") for pattern, version in NEWER_THAN_381.items()
             if re.search(pattern, line)]
    assert not found, "\n".join(found)


def test_the_guard_finds_what_it_looks_for():
    """Each pattern above matches the feature it names (else the test before could not fail)."""
    spelled = {"3.82": [".ONESHELL:", ".RECIPEPREFIX = >", "undefine X", "private X := 1", "define X :=",
                        "override private X = 1"],
               "4.0": ["X != date", "X ::= 1", "$(file >out,x)", "$(guile (+ 1 2))", "MAKEFLAGS += --output-sync"],
               "4.1": ["ifeq ($(MAKE_TERMOUT),)"], "4.2": ["X := $(.SHELLSTATUS)"], "4.3": ["a b &: c"],
               "4.4": ["$(let a,b,c)", "$(intcmp 1,2,a)", "X :::= 1", ".NOTINTERMEDIATE:", "all: a .WAIT b"]}
    for version, lines in spelled.items():
        for line in lines:
            assert any(re.search(p, line) for p, v in NEWER_THAN_381.items() if v == version), line
    for line in ["STATUS := $(shell mktemp -d x)", "\tif [ \"$$s\" != 0 ]; then", '    if [ "$$s" != 0 ]; then \\',
                 "X ?= 1", "a: b ## c", "ifneq ($(X),)", "X += -q", "$(if $(filter N,$(GIVEN)),a,b)"]:
        assert not any(re.search(p, line) for p in NEWER_THAN_381), line
