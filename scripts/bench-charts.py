#!/usr/bin/env python3
"""The charts of BENCHMARKS.md, drawn from scripts/bench's raw output (its *.tsv files).

    python3 scripts/bench-charts.py BENCH_OUT CHART_DIR

Each chart shows medians over the rounds, as the tables do. A chart whose runs are missing
(that part of the bench was not run) is left as it is.
"""

import csv
import statistics
import sys
from collections import defaultdict
from pathlib import Path

import matplotlib

matplotlib.use("svg")
import matplotlib.pyplot as plt  # noqa: E402

plt.rcParams["svg.hashsalt"] = "clicks-bench"  # stable element ids: charts diff cleanly
MIXES = ["zipf", "uniform"]
PROCESSES = ["redirector", "collector", "PostgreSQL"]


def rows(path):
    if not path.exists():
        return []
    with path.open() as f:
        return [r for r in csv.reader(f, delimiter="\t") if r]


def medians(table, key, column):
    """{key(row): median of float(row[column])} over the rows."""
    groups = defaultdict(list)
    for r in table:
        try:
            groups[key(r)].append(float(r[column]))
        except (ValueError, IndexError):
            pass
    return {k: statistics.median(v) for k, v in groups.items()}


def save(fig, path):
    fig.tight_layout()
    fig.savefig(path, format="svg", metadata={"Date": None})
    plt.close(fig)
    print(f"wrote {path}")


def grouped_bars(ax, groups, series, values, ylabel, title):
    width = 0.8 / len(series)
    for i, name in enumerate(series):
        xs = [g + i * width for g in range(len(groups))]
        ys = [values.get((group, name), 0) for group in groups]
        bars = ax.bar(xs, ys, width, label=name)
        ax.bar_label(bars, fmt="%.3g", fontsize=7)
    ax.set_xticks([g + width * (len(series) - 1) / 2 for g in range(len(groups))], groups)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.legend(fontsize=8)


def redirect_charts(out, charts):
    table = rows(out / "redirect.tsv")
    if not table:
        return
    # Mode paired's two redirectors each serve half the load at once: their req/s and p99
    # are not comparable with the other modes', which serve all of it in turn.
    modes = [m for m in dict.fromkeys(r[1] for r in table) if not m.startswith("paired")]
    rps = medians(table, lambda r: (r[0], r[1]), 3)
    p99 = medians(table, lambda r: (r[0], r[1]), 5)
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    grouped_bars(left, MIXES, modes, rps, "requests/s", "Redirects: req/s per mode")
    grouped_bars(right, MIXES, modes, p99, "ms", "Redirects: p99 latency per mode")
    save(fig, charts / "redirect-throughput.svg")

    cpu_modes = [m for m in modes if m in ("pipeline", "baseline")]
    groups = [f"{mix}\n{mode}" for mix in MIXES for mode in cpu_modes]
    cpu = {}
    for i, process in enumerate(PROCESSES):
        per = medians(table, lambda r: (r[0], r[1]), 10 + i)
        for mix in MIXES:
            for mode in cpu_modes:
                cpu[(f"{mix}\n{mode}", process)] = per.get((mix, mode), 0)
    fig, ax = plt.subplots(figsize=(8, 4))
    grouped_bars(ax, groups, PROCESSES, cpu, "CPU us per click",
                 "CPU per click by process (baseline: before the change)")
    save(fig, charts / "redirect-cpu-per-click.svg")


def ingest_chart(out, charts):
    table = rows(out / "collector.tsv")
    if not table:
        return
    kinds = list(dict.fromkeys(r[0] for r in table))
    names = {"current": "collector", "baseline": "collector (baseline)",
             "flat": "collector,\nunpartitioned", "copy": "psql \\copy"}
    groups = [f"{mix}\n{names.get(k, k)}" for mix in MIXES for k in kinds]
    cpu = {}
    for process, column in (("collector", 7), ("PostgreSQL", 8)):
        per = medians(table, lambda r: (r[1], r[0]), column)
        for mix in MIXES:
            for kind in kinds:
                cpu[(f"{mix}\n{names.get(kind, kind)}", process)] = per.get((mix, kind), 0)
    fig, ax = plt.subplots(figsize=(9, 4))
    grouped_bars(ax, groups, ["collector", "PostgreSQL"], cpu, "CPU us per click",
                 "Ingest at full speed: CPU per click by process")
    save(fig, charts / "ingest-cpu-per-click.svg")


def main():
    out, charts = Path(sys.argv[1]), Path(sys.argv[2])
    charts.mkdir(parents=True, exist_ok=True)
    redirect_charts(out, charts)
    ingest_chart(out, charts)


if __name__ == "__main__":
    main()
