"""Write each kata's recorded run (katas/NN-slug/run.txt, the file format in grpo_katas/catalogue/record.py), or check it on this machine.

    python -m grpo_katas.proof.record_runs              # write every kata's record, from runs under each kernel path
                                                        # this CPU has, which must print the same table (else nothing
                                                        # is written)
    python -m grpo_katas.proof.record_runs 14 26        # the same for these katas
    python -m grpo_katas.proof.record_runs --check 14   # run kata 14 here (this CPU's own kernel path) and compare its
                                                        # table with the record: the first row that differs is named
"""
import argparse
import sys

from grpo_katas.catalogue.katas import find_kata, load_katas
from grpo_katas.catalogue.record import KERNELS, NAME, SIDES, differences, first_difference, render, runs_of, tables_of
from grpo_katas.catalogue.symptoms import CACHE, Store, cpu, kernel, supported


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("katas", nargs="*", help="kata numbers (default: all)")
    p.add_argument("--check", action="store_true",
                   help="compare fresh runs with the records instead of writing them")
    p.add_argument("--kernels", nargs="+", default=None,
                   help="kernel paths to run under (default: writing, every one this CPU has; checking, its own)")
    p.add_argument("--processes", type=int, default=2, help="runs made in parallel (default 2)")
    p.add_argument("--fresh", action="store_true", help="make every run again instead of reading .cache/symptoms/")
    a = p.parse_args(argv)
    katas = [find_kata(n) for n in a.katas] if a.katas else load_katas()
    native = kernel()
    names = a.kernels or ([native] if a.check else [k for k in dict.fromkeys((native,) + KERNELS) if supported(k)])
    store = Store(CACHE, a.fresh)
    store.fetch({name: [spec for k in katas for spec in runs_of(k).values()] for name in names}, a.processes)
    names = [n for n in names if n not in store.skipped]
    problems = []
    for k in katas:
        per_path = {name: tables_of(k, store, name) for name in names}
        if a.check:
            for name, tables in per_path.items():
                problems += differences(k, tables, f"the {name} kernel path on {cpu()}")
            continue
        first, exact = per_path[names[0]], {}
        for side in SIDES:
            rows = [d[0] for name in names[1:] for d in [first_difference(first[side], per_path[name][side])] if d]
            exact[side] = min(rows) - 1 if rows else None
        (k.path / NAME).write_text(render(k, first, exact, names))
        parts = "; ".join(f"the {side} table's paths part from row {n + 1}" for side, n in exact.items()
                          if n is not None)
        print(f"{k.name}: {NAME} written, {len(first['kata']) - 1} rows, the same under {', '.join(names)}"
              + (f" but where marked: {parts}" if parts else ""))
    for p_ in problems:
        print(p_)
    if a.check:
        print(f"{len(katas)} kata(s) compared with their records under {', '.join(names)}: {len(problems)} "
              f"difference(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
