"""A kata's recorded run (katas/NN-slug/run.txt, grpo_katas/catalogue/record.py) is what this machine prints: a kata of each
codebase under this CPU's own kernel path (the one `make run` takes), and (slow: CI, beside its proof of every kata on
every path) one kata under every kernel path the CPU has, each table compared with the record digit for digit. A CPU
whose digits differ is named, with the first row that differs. Run: pytest tests/test_record.py"""
import math

import pytest

from grpo_katas.catalogue import record
from grpo_katas.catalogue.katas import CODEBASES, load_katas
from grpo_katas.catalogue.symptoms import Store, cpu, kernel, supported


KATAS = load_katas()


def whole(kata) -> bool:
    """A one-process kata whose recorded run goes all its steps, every row the same on every kernel path."""
    tables = record.load(kata) or {"exact": {"kata": 0}, "kata": []}
    return kata.run["nproc"] == 1 and tables["exact"].get("kata") is None and \
        len(tables["kata"]) == kata.run["steps"] + 1


# the first such kata of each codebase: the cheapest runs that still cover every codebase
REPRODUCED = [next(k for k in KATAS if k.codebase == name and whole(k)) for name in CODEBASES]


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """Runs made here and now, in child processes, never read from a cache: what this machine prints."""
    return Store(tmp_path_factory.mktemp("runs"), fresh=True)


def kata_table(store, kata, name) -> dict:
    run = store.get(kata.loop, kata.run, name)
    return {"kata": record.table(run.history, run.crash)}


@pytest.mark.parametrize("kata", REPRODUCED, ids=lambda k: f"{k.codebase}-{k.name}")
def test_a_kata_of_each_codebase_prints_its_recorded_table_here(store, kata):
    name = kernel()
    store.fetch({name: [(kata.loop, kata.run)]}, processes=1)
    where = f"this CPU ({cpu().strip()}, the {name} kernel path)"
    found = record.differences(kata, kata_table(store, kata, name), where, sides=("kata",))
    assert not found, found[0]


@pytest.mark.slow
def test_every_kernel_path_this_cpu_has_prints_the_same_table(store):
    kata = REPRODUCED[0]
    names = [n for n in dict.fromkeys((kernel(),) + record.KERNELS) if supported(n)]
    store.fetch({n: [(kata.loop, kata.run)] for n in names}, processes=2)
    names = [n for n in names if n not in store.skipped]
    assert "default" in names, store.skipped
    found = [d for n in names
             for d in record.differences(kata, kata_table(store, kata, n), f"the {n} kernel path", sides=("kata",))]
    assert not found, "\n".join(found)


def test_a_table_prints_each_rank_and_the_digits_make_run_prints():
    history = [{"step": 1, "reward_mean": 0.12345, "kl": -1e-9, "loss": float("nan"), "seconds": 0.5, "dt": 0.4,
                "reward_mean@1": 0.5, "kl@1": 0.25, "loss@1": 1.0}]
    lines = record.table(history, crash="ValueError: boom")
    assert lines[0].split() == ["step", "rank", "reward", "kl", "loss"]  # no seconds, no loop timing
    assert lines[1].split() == ["1", "0", "0.123", "0.0000", "nan"]     # -0.0000 is 0.0000
    assert lines[2].split() == ["1", "1", "0.500", "0.2500", "1.0000"]
    assert lines[3] == "raised ValueError: boom"


def test_the_first_row_that_differs_is_named_with_both_lines():
    recorded = ["step  kl", "   1  0.1000", "   2  0.2000"]
    assert record.first_difference(recorded, ["step kl", "1 0.1000", "2 0.2000"]) is None  # spacing is not a digit
    assert record.first_difference(recorded, ["step  kl", "   1  0.1000", "   2  0.2001"]) == (
        2, "   2  0.2000", "   2  0.2001")
    assert record.first_difference(recorded, recorded[:2]) == (2, "   2  0.2000", "")


def test_every_kata_has_a_record_whose_tables_cover_its_brief_run():
    for kata in KATAS:
        tables = record.load(kata)
        assert tables is not None, f"{kata.name}: no {record.NAME}"
        rows = len(tables["kata"]) - 1
        per_step = kata.run["nproc"]
        crashed = tables["kata"][-1].startswith("raised")
        assert rows - crashed == per_step * kata.run["steps"] or crashed, kata.name
        assert len(tables["healthy"]) - 1 == per_step * kata.run["steps"], kata.name
        assert all(not math.isnan(float(c)) for c in tables["healthy"][-1].split()), kata.name
        assert tables["exact"]["healthy"] is None, f"{kata.name}: a healthy run whose kernel paths part"
    assert sum(whole(k) for k in KATAS) >= 6  # the six katas, at least one per codebase
