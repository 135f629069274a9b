"""The markdown table of the models benchmark, made from its JSON (``bench/results/models.json``).

:func:`markdown` turns the document :mod:`bench.models` writes into a page fragment (a heading
line of context, the table, the errors and findings as numbered notes) that the documentation
can include as it is; :func:`write` reads the JSON and writes the fragment atomically.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from dpcore.atomic import atomic_write_text

__all__ = ["markdown", "summary", "write"]

COLUMNS = (
    "model",
    "`auto` picks",
    "dpcore exact",
    "dpcore / non-private",
    "of which noise",
    "Opacus hooks / non-private",
    "Opacus ghost / non-private",
    "dpcore / Opacus hooks",
    "dpcore / Opacus ghost",
    "Opacus hooks exact",
    "notes",
)
#: Longest error text in a note (the JSON keeps the whole first line).
NOTE_LENGTH = 240


def _ratio(value: float | None) -> str:
    return "—" if value is None else f"{value:.2f}"


def _error_text(error: dict[str, Any]) -> str:
    text = f"{error['type']}: {error['message']}".strip()
    reasons = error.get("reasons")
    if reasons:
        text += " (" + "; ".join(f"{name}: {reason}" for name, reason in reasons.items()) + ")"
    if len(text) > NOTE_LENGTH:
        text = text[: NOTE_LENGTH - 1] + "…"
    return text.replace("|", "\\|")


class _Notes:
    """Numbered notes under the table; a cell refers to one as ``[n]``."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def add(self, text: str) -> str:
        text = text.replace("\n", " ")
        if text not in self.lines:
            self.lines.append(text)
        return f"[{self.lines.index(text) + 1}]"


def _method_cell(method: dict[str, Any] | None, notes: _Notes) -> str:
    if method is None:
        return "—"
    if method.get("error"):
        error = method["error"]
        verb = "refused" if error["stage"] == "build" else "fails"
        return f"{verb} {notes.add(_error_text(error))}"
    if method.get("after_fix"):
        refused = _error_text(method["after_fix"])
        note = notes.add(
            f"Opacus refuses the model as given ({refused}); measured after ModuleValidator.fix, "
            "which leaves its outputs unchanged"
        )
        return f"{_ratio(method.get('ratio_to_nonprivate'))} {note}"
    return _ratio(method.get("ratio_to_nonprivate"))


def _exact_cell(check: dict[str, Any] | None, notes: _Notes) -> str:
    if not check:
        return "—"
    if check.get("error"):
        return f"fails {notes.add(_error_text(check['error']))}"
    if check["exact"]:
        return f"yes ({check['max_abs_diff']:.1e})"
    if check.get("missing") or check.get("wrong_shape"):
        return "**no** (gradients missing or of the wrong shape)"
    return f"**no** ({check['max_abs_diff']:.1e})"


def _row(row: dict[str, Any], notes: _Notes) -> str:
    name = f"{row['title']} (`{row['model']}`)"
    if row.get("sizes", "default") != "default":
        name += f", **{row['sizes']}**"
    if row.get("status") != "measured":
        status = row.get("status", "")
        if row.get("error"):
            status += " " + notes.add(_error_text(row["error"]))
        return "| " + " | ".join([name, status] + ["—"] * (len(COLUMNS) - 2)) + " |"
    methods = row["methods"]
    dpcore = methods["dpcore"]
    picks = dpcore.get("engine") or "—"
    if dpcore.get("error"):
        picks = _method_cell(dpcore, notes)
    checks = row.get("exactness", {})
    over = row.get("dpcore_over", {})
    finding_marks = " ".join(notes.add(text) for text in row.get("findings", []))
    cells = [
        name,
        picks,
        _exact_cell(checks.get("dpcore"), notes),
        _method_cell(dpcore, notes) if not dpcore.get("error") else "—",
        _ratio((row.get("noise") or {}).get("over_nonprivate_step")),
        _method_cell(methods.get("opacus_hooks"), notes),
        _method_cell(methods.get("opacus_ghost"), notes),
        _ratio(over.get("opacus_hooks")),
        _ratio(over.get("opacus_ghost")),
        _exact_cell(checks.get("opacus_hooks"), notes),
        finding_marks,
    ]
    return "| " + " | ".join(cells) + " |"


def _sizes_text(sizes: dict[str, Any]) -> str:
    return (
        f"width {sizes['width']}, {sizes['heads']} heads, feed-forward {sizes['feed_forward']}, "
        f"{sizes['layers']} layers, {sizes['sequence_length']} tokens of a vocabulary of "
        f"{sizes['vocabulary']}, {sizes['image_size']} x {sizes['image_size']} images in "
        f"{sizes['patch_size']} x {sizes['patch_size']} patches, LoRA rank {sizes['lora_rank']}"
    )


def _size_lines(document: dict[str, Any]) -> list[str]:
    """What the rows' sizes are: the default ones, and the wide ones where rows use them."""
    config = document["config"]
    if "sizes" not in config:
        return []
    lines = ["", f"Sizes: {_sizes_text(config['sizes'])}."]
    if any(row.get("sizes") == "wide" for row in document["rows"]) and "wide_sizes" in config:
        lines[-1] += (
            f" Rows marked **wide**: {_sizes_text(config['wide_sizes'])}; "
            f"{config.get('wide_repetitions', config['repetitions'])} interleaved repetitions."
        )
    return lines


def markdown(document: dict[str, Any]) -> str:
    """The table (and its notes) of a ``models.json`` document (its facts and ``rows``)."""
    meta = document
    config = meta["config"]
    hardware = meta.get("hardware") or {}
    versions = ", ".join(
        f"{name} {found}" if found else f"{name} not installed"
        for name, found in (meta.get("versions") or {}).items()
    )
    lines = [
        f"Step-time ratios at lot {config['batch_size']}, {config['dtype']}, "
        f"{config['threads']} CPU thread(s): medians of {config['repetitions']} interleaved "
        f"repetitions, each a ratio of step times measured in the same process"
        f"{' (a fresh interpreter for each row)' if config.get('fresh_process_per_model') else ''}"
        f". Exactness: "
        f"per-example gradients against a one-example-at-a-time {config['exactness_dtype']} "
        f"loop on a lot of {config['exactness_lot']} (largest absolute difference; exact at "
        f"most {config['tolerance']:g}). *Of which noise*: the seconds dpcore's default "
        f"source takes to draw one step's noise for the trainable parameters (float64 draws "
        f"rounded to float32), over the non-private step: a cost per step, whatever the lot "
        f"size. Commit `{meta['commit']}`, {meta['date']}, "
        f"{hardware.get('cpu') or 'unknown CPU'}; {versions}.",
        *_size_lines(document),
        "",
        "| " + " | ".join(COLUMNS) + " |",
        "|" + "---|" * len(COLUMNS),
    ]
    notes = _Notes()
    lines += [_row(row, notes) for row in document["rows"]]
    if notes.lines:
        lines.append("")
        lines += [f"{i}. {text}" for i, text in enumerate(notes.lines, 1)]
    for addition in meta.get("added", []):
        lines += [
            "",
            f"Rows {', '.join(addition['models'])} added later: commit `{addition['commit']}`, "
            f"{addition['date']}, same machine kind and configuration.",
        ]
    if meta.get("quick"):
        lines += ["", "Quick profile: fewer repetitions and models; not for comparison."]
    return "\n".join(lines) + "\n"


def write(json_path: Path, markdown_path: Path) -> None:
    """Read the benchmark's JSON at ``json_path`` and write its table to ``markdown_path``."""
    document = json.loads(Path(json_path).read_text(encoding="utf-8"))
    atomic_write_text(markdown_path, markdown(document))


def summary(row: dict[str, Any]) -> str:
    """One line about a row, for the console while the benchmark runs."""
    if row.get("status") != "measured":
        return f"{row['model']}: {row.get('status')}"
    parts = []
    for method, entry in row["methods"].items():
        if entry.get("error"):
            parts.append(f"{method} {entry['error']['type']}")
        elif method != "nonprivate":
            parts.append(f"{method} {_ratio(entry['ratio_to_nonprivate'])}x")
        else:
            seconds = entry["step_seconds"]
            parts.append(f"nonprivate {seconds * 1e3:.1f} ms" if seconds else "nonprivate —")
    return f"{row['model']}: " + ", ".join(parts)
