"""Evaluation reports: per-category accuracy (average@k), results.json, a Markdown table and
readable transcripts of the first failures."""

from __future__ import annotations

import json
import os
from typing import Any, Sequence


def accuracy_table(rows: Sequence[dict]) -> dict[str, dict]:
    """Returns {category: {"accuracy", "n", "samples", "infra_failed"}} from per-episode rows
    {"category", "id", "valid" (bool), "infra_failed" (bool)}; accuracy is average@k: the mean of
    `valid` over every scored (entry, sample), n the number of distinct entries. Episodes hit by
    an infrastructure failure (server crash) are counted apart, never scored as wrong."""
    cats: dict[str, dict[str, Any]] = {}
    for r in rows:
        c = cats.setdefault(r["category"], {"ok": 0, "samples": 0, "ids": set(), "infra_failed": 0})
        if r.get("infra_failed"):
            c["infra_failed"] += 1
            continue
        c["samples"] += 1
        c["ok"] += bool(r["valid"])
        c["ids"].add(r["id"])
    out = {name: {"accuracy": c["ok"] / c["samples"] if c["samples"] else 0.0, "n": len(c["ids"]),
                  "samples": c["samples"], "infra_failed": c["infra_failed"]}
           for name, c in cats.items()}
    scored = [r for r in rows if not r.get("infra_failed")]
    if len(cats) > 1 and scored:
        # Overall = mean of the category accuracies (BFCL's multi-turn aggregate is unweighted).
        out["overall"] = {"accuracy": sum(v["accuracy"] for v in out.values()) / len(out),
                          "n": sum(v["n"] for v in out.values()),
                          "samples": len(scored), "infra_failed": len(rows) - len(scored)}
    return out


def markdown_table(categories: dict[str, dict], title: str, reference: dict[str, float] | None = None) -> str:
    """Returns a Markdown table: category | accuracy % | n (| reference column)."""
    head = f"### {title}\n\n| category | accuracy (%) | entries | samples | infra failed |"
    sep = "|---|---|---|---|---|"
    if reference:
        head += " reference (%) |"
        sep += "---|"
    lines = [head, sep]
    for name, v in categories.items():
        line = f"| {name} | {100 * v['accuracy']:.2f} | {v['n']} | {v['samples']} | {v['infra_failed']} |"
        if reference:
            ref = reference.get(name)
            line += f" {ref:.2f} |" if ref is not None else " |"
        lines.append(line)
    return "\n".join(lines) + "\n"


def transcript(messages: Sequence[dict], max_chars: int = 600) -> str:
    """Returns a chat as readable Markdown (system prompt elided, long outputs cut)."""
    out = []
    for m in messages:
        role = m["role"]
        text = str(m.get("content", ""))
        if role == "system":
            out.append(f"**system** ({len(text)} chars, elided)")
            continue
        if len(text) > max_chars:
            text = text[:max_chars] + f" … [{len(text) - max_chars} more chars]"
        if m.get("revealed_tools"):
            text = f"[reveals held-out functions {m['revealed_tools']}] " + HOLDOUT_SHORT
        out.append(f"**{role}**: " + text.replace("\n", "\n    "))
    return "\n\n".join(out)


HOLDOUT_SHORT = "I have updated some more functions you can choose from. What about now?"


def failures_markdown(failed: Sequence[dict], limit: int) -> str:
    """Returns the first `limit` failed episodes {"id", "verdict", "messages", "expected"?} as
    Markdown transcripts."""
    if not failed:
        return "### Failure examples\n\nnone\n"
    parts = [f"### Failure examples (first {min(limit, len(failed))} of {len(failed)})\n"]
    for f in failed[:limit]:
        v = f.get("verdict", {})
        parts.append(f"#### {f['id']} (sample {f.get('sample', 0)}): "
                     f"{v.get('error_type', f.get('end_reason', ''))}\n\n{v.get('error_message', '')}\n")
        if f.get("expected") is not None:
            parts.append("expected calls per turn: `" + json.dumps(f["expected"])[:1500] + "`\n")
        parts.append(transcript(f["messages"]) + "\n")
    return "\n".join(parts)


def write_results(workdir: str, results: dict, markdown: str, episodes: Sequence[dict]) -> dict:
    """Writes DIR/results.json, DIR/results.md and DIR/episodes.jsonl; returns the paths."""
    os.makedirs(workdir, exist_ok=True)
    paths = {"json": os.path.join(workdir, "results.json"), "markdown": os.path.join(workdir, "results.md"),
             "episodes": os.path.join(workdir, "episodes.jsonl")}
    with open(paths["json"], "w") as f:
        json.dump(results, f, indent=2, sort_keys=True)
        f.write("\n")
    with open(paths["markdown"], "w") as f:
        f.write(markdown)
    with open(paths["episodes"], "w") as f:
        for e in episodes:
            f.write(json.dumps(e, ensure_ascii=False, default=str) + "\n")
    return paths
