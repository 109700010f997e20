"""The memory model against the measured peak per sharding mode (bench/results/memory.json)."""
from __future__ import annotations

from record_files import commit_note, record


def memory_table() -> str:
    """One row per model, sharding mode and precision: the measured peak of its worst rank
    (`bench/memory_fit.py` runs two steps per rank, the second's peak counts), the prediction and
    the error, with the model before memory per sharding mode beside it."""
    data = record("memory")
    worst: dict[tuple, dict] = {}
    for row in data["rows"]:
        key = (row["model"], row["sharding"], row["precision"])
        if key not in worst or abs(row["ratio"] - 1) > abs(worst[key]["ratio"] - 1):
            worst[key] = row
    lines = ["| model | sharding | precision | measured peak (MB) | predicted (MB) | error | before (states / world, no loss) |",
             "|---|---|---|---:|---:|---:|---:|"]
    for (model, sharding, precision), row in worst.items():
        lines.append(f"| {model} | {sharding} | {precision} | {row['peak'] / 1e6:.2f} | {row['predicted'] / 1e6:.2f} "
                     f"| {row['ratio'] - 1:+.1%} | {row['old_ratio'] - 1:+.1%} |")
    lines.append("")
    lines.append(f"Worst error {data['worst_error']:.1%} against a tolerance of {data['tolerance']:.0%} "
                 f"({len(data['rows'])} rank-rows, {data['setting']['world']} gloo ranks{commit_note(data)}).")
    return "\n".join(lines)
