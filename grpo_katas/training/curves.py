"""Training curves and the run table's digits: the one summary of a run (where a curve starts and ends, where it
reaches a target), terminal sparklines (plain strings; the CLI colours them), a PNG when matplotlib, an optional
extra, is installed, and the columns and digits every run table prints. `make run` shows a kata's curves beside the
reference's; `make train` writes the reference's to curve.png; a kata's recorded run (record.py) keeps its table.
"""
import math
import re
from dataclasses import dataclass
from pathlib import Path


# The run table's columns: (stats key, header, digits), in the order they are drawn. A column shows once the loop
# reports its key; keys not listed here come after these, at EXTRA_DIGITS, in the order they first appear. A curve's
# first and last 5-step means are printed at the same digits, and a brief quotes a number at them.
RUN_COLUMNS = [("step", "step", 0), ("rank", "rank", 0), ("reward_mean", "reward", 3), ("reward_max", "max", 2),
               ("kl", "kl", 4), ("loss", "loss", 4), ("clip_frac", "clip", 2), ("grad_norm", "gnorm", 2),
               ("adv_std", "adv std", 2), ("completion_len", "len", 1), ("ratio_dev", "|r-1|", 3),
               ("seconds", "s/step", 2)]
EXTRA_DIGITS = 3
# A loop's own timing of a step: the runner's seconds (s/step) measure every loop alike, and one time column is enough.
TIME_KEYS = {"dt", "time", "step_time", "elapsed", "dt_ms", "time_ms"}
DIGITS = {key: digits for key, _, digits in RUN_COLUMNS}

# (stats key, label, digits): the curves a run is judged by, in the order they are drawn.
CURVES = [("reward_mean", "reward", DIGITS["reward_mean"]), ("kl", "KL", DIGITS["kl"]),
          ("grad_norm", "grad norm", DIGITS["grad_norm"])]
# The other metrics the loops report, for a brief that cites one: its curve is drawn after CURVES.
MORE = {"reward_max": "reward max", "loss": "loss", "clip_frac": "clip frac", "adv_std": "adv std",
        "completion_len": "length", "ratio_dev": "|ratio-1|"}
BARS = "▁▂▃▄▅▆▇█"
NOT_FINITE = "×"
PLOT_HINT = "for a PNG of these curves: .venv/bin/pip install matplotlib (the optional [plot] extra)"


def digits(metric: str) -> int:
    """The digits a metric is printed at (a rank's copy, reward_mean@1, as the metric itself)."""
    return DIGITS.get(metric.split("@")[0], EXTRA_DIGITS)


def cell(value, places: int) -> str:
    """A number as the run table prints it, at `places` decimals, a rounded zero without its sign (-0.0000 is
    0.0000: the sign of a value that rounds to nothing is not a reading); anything else as it is."""
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return str(value)
    text = f"{value:.{places}f}"
    return text.lstrip("-") if re.fullmatch(r"-0\.?0*", text) else text


def by_rank(row: dict) -> list:
    """A data-parallel step (rank 0's stats as key, rank r's as key@r) as one row per rank, so the table keeps
    one column per metric however many ranks there are."""
    ranks = sorted({int(k.rsplit("@", 1)[1]) for k in row if re.fullmatch(r".+@\d+", k)})
    if not ranks:
        return [row]
    rows = [{"step": row.get("step"), "rank": 0, **{k: v for k, v in row.items() if "@" not in k and k != "step"}}]
    for r in ranks:
        rows.append({"step": "", "rank": r, **{k[: -len(f"@{r}")]: v for k, v in row.items() if k.endswith(f"@{r}")}})
    return rows


def table_columns(rows: list) -> list:
    """(key, header, digits) of each column a table of these rows (already split by rank) has: RUN_COLUMNS' that
    some row reports, then every other key but a loop's own timing, in the order they first appear."""
    known = {key for key, _, _ in RUN_COLUMNS}
    extra = list(dict.fromkeys(k for r in rows for k in r if k not in known and k not in TIME_KEYS))
    return [c for c in RUN_COLUMNS if any(c[0] in r for r in rows)] + [(k, k, EXTRA_DIGITS) for k in extra]


def curves_for(cited=()) -> list:
    """CURVES, then each metric in `cited` (those a brief cites) that they lack, labelled by its key where it is
    not one the loops report."""
    drawn = {key for key, _, _ in CURVES}
    return CURVES + [(key, MORE.get(key, key), digits(key)) for key in dict.fromkeys(cited) if key not in drawn]


def series(history: list, key: str, steps: int, width: int = 40) -> list:
    """The value of `key` over steps 1..steps, averaged into at most `width` equal buckets of steps. A bucket is
    None where the run has no value (it stopped early, or never reports `key`) and nan where a value is not finite."""
    by_step = {int(h["step"]): h[key] for h in history if key in h and isinstance(h.get("step"), (int, float))}
    width = max(1, min(width, steps))
    out = []
    for b in range(width):
        values = [by_step[s] for s in range(b * steps // width + 1, (b + 1) * steps // width + 1) if s in by_step]
        if not values:
            out.append(None)
        elif not all(math.isfinite(v) for v in values):
            out.append(math.nan)
        else:
            out.append(sum(values) / len(values))
    return out


def sparkline(values: list, lo: float, hi: float) -> str:
    """One character per value, from ▁ at lo to █ at hi; × where a value is not finite, a space where it is None.
    Give two runs the same lo and hi and their heights compare."""
    chars = []
    for v in values:
        if v is None:
            chars.append(" ")
        elif not math.isfinite(v):
            chars.append(NOT_FINITE)
        else:
            level = (v - lo) / (hi - lo) if hi > lo else 0.5
            chars.append(BARS[min(len(BARS) - 1, max(0, int(level * len(BARS))))])
    return "".join(chars)


def shared_range(*runs: list) -> tuple:
    """(lo, hi) over the finite values of every series given."""
    finite = [v for run in runs for v in run if v is not None and math.isfinite(v)]
    return (min(finite), max(finite)) if finite else (0.0, 1.0)


def plot_png(runs: dict, path: Path, title: str = "", curves=CURVES) -> bool:
    """One panel per curve in `curves` (key, label, digits), one line per run ({label: history}); False when
    matplotlib is missing. A value that is not finite is an × on the panel's top edge, in its run's colour, so
    that a run gone NaN still shows (a line through NaN draws nothing); so does a run of one step (a dot)."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fig, axes = plt.subplots(len(curves), 1, figsize=(7, 2.2 * len(curves)), sharex=True, squeeze=False)
    for ax, (key, label, _) in zip(axes[:, 0], curves):
        points = {name: [(h["step"], _number(h[key])) for h in history if key in h] for name, history in runs.items()}
        lines = {}
        for name, run in points.items():
            good = [(s, v) for s, v in run if math.isfinite(v)]
            if run:
                lines[name], = ax.plot(*(zip(*good) if good else ([], [])), label=name,
                                       marker="." if len(good) < 3 else None)
        lo, hi = ax.get_ylim()
        for name, run in points.items():
            bad = [s for s, v in run if not math.isfinite(v)]
            if bad:
                ax.plot(bad, [hi] * len(bad), "x", color=lines[name].get_color(), markersize=9, clip_on=False,
                        label=f"{name}: not finite")
        ax.set_ylim(lo, hi)
        ax.set_ylabel(label)
        ax.legend(loc="best", fontsize="small")
    axes[-1, 0].set_xlabel("step")
    if title:
        axes[0, 0].set_title(title)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return True


def _number(v) -> float:
    try:
        return float(v)
    except (TypeError, ValueError):
        return math.nan


@dataclass(frozen=True)
class Summary:
    first: float            # mean of the first `window` values (fewer when the run is shorter); nan when empty
    last: float             # mean of the last `window` values
    reached: int | None     # the step at which the trailing `window`-step mean first reached the target


def summarize(history: list, key: str = "reward_mean", target: float | None = None, window: int = 5) -> Summary:
    """Where a curve starts and ends, as `window`-step means, and where it first reaches `target`."""
    values = [_number(h.get(key)) for h in history]

    def mean(xs):
        return sum(xs) / len(xs) if xs else math.nan

    reached = None
    if target is not None:
        reached = next((history[i - 1]["step"] for i in range(window, len(values) + 1)
                        if mean(values[i - window:i]) >= target), None)
    return Summary(mean(values[:window]), mean(values[-window:]), reached)
