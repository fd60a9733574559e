"""Interleaved rounds for benchmarks on a machine whose speed drifts between runs minutes apart (the 2-core CPU: up to
20-45% between two runs of one configuration, docs/adaptive_results.md): every configuration runs once per round,
the order rotated by one each round, so drift weighs on all of them alike; a configuration's figure is the median
over its rounds, and the per-round figures show the spread."""

from __future__ import annotations

from collections.abc import Callable


def rotated(names: list[str], r: int) -> list[str]:
    """``names`` in round ``r``'s order: rotated left by ``r``."""
    k = r % len(names)
    return names[k:] + names[:k]


def run_rounds(runs: dict[str, Callable[[], object]], rounds: int, log=None) -> tuple[dict[str, list], list[list[str]]]:
    """Call every run of ``runs`` once per round for ``rounds`` rounds, in ``rotated`` order: (each name's results in
    round order, each round's order of names); ``log(round, name)`` before each call where given."""
    if rounds < 1:
        raise ValueError(f"rounds={rounds!r}: run at least one round")
    results: dict[str, list] = {name: [] for name in runs}
    orders = []
    for r in range(rounds):
        order = rotated(list(runs), r)
        orders.append(order)
        for name in order:
            if log:
                log(r, name)
            results[name].append(runs[name]())
    return results, orders


def median_index(values: list[float]) -> int:
    """The index of the median of ``values`` (the lower of the two middle ones for an even count)."""
    order = sorted(range(len(values)), key=lambda i: values[i])
    return order[(len(values) - 1) // 2]


def spread(values: list[float]) -> float:
    """(max - min) / median of ``values``: how far one configuration's rounds lie apart."""
    mid = values[median_index(values)]
    return (max(values) - min(values)) / mid if mid else float("nan")
