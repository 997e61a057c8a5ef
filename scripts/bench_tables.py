#!/usr/bin/env python3
"""Markdown tables of `pleio bench --json` reports, as docs/benchmarks.md shows them.

    python3 scripts/bench_tables.py qwen.json gemma.json

For each report: one row per batch size and cold/warm, one column per
strategy (mean latency per batch; for `limit`, the device floor, its
median, which the ratios divide by), then `auto`'s ratio to `fault` and to
the device floor (`limit`'s median, the bench's own `ratio_to_limit`), and
the lowest ratio to the floor of any strategy in the cold rows (the issue-15
check: no strategy may read faster than the floor, i.e. below 0.95x).
Every figure comes from the report; nothing is computed but formatting and
the minimum.
"""

import json
import sys

ORDER = ["fault", "advise", "pread", "uring", "uring-direct", "pool", "auto", "cached", "shared", "redis",
         "redis-shared", "limit", "qd1-page"]


def fmt_us(us):
    return f"{us:.1f} us" if us < 1000 else f"{us / 1000:.2f}"


def table(report):
    """The Markdown of one report: a heading line, then the table."""
    t = report["table"]
    fl = report["floor"]
    out = [f"**{t['name']}**, {t['type']}, {t['rows']:,} rows of {t['row_bytes']} B "
           f"({t['bytes'] / 2**30:.2f} GiB), {report['batches']} batches per arm, "
           f"cold mode `{report['cold_mode']}`, floor at queue depth {fl['queue_depth']}. "
           "Times in ms unless marked.", ""]
    arms = report["arms"]
    present = [s for s in ORDER if any(a["strategy"] == s for a in arms)]
    head = ["rows", "cold/warm"] + [f"{s} (median)" if s == "limit" else s for s in present]
    head += ["auto vs fault", "auto vs limit", "lowest vs limit"]
    out.append("| " + " | ".join(head) + " |")
    out.append("|" + "---|" * len(head))
    keys = sorted({(a["rows"], not a["cold"]) for a in arms})
    for rows, warm in keys:
        by = {a["strategy"]: a for a in arms if a["rows"] == rows and a["cold"] != warm}
        cells = [str(rows), "warm" if warm else "cold"]
        # every arm's mean; the floor's median, the figure the ratios divide by
        cells += [fmt_us(by[s]["median_us" if s == "limit" else "mean_us"]) if s in by else "-"
                  for s in present]
        auto = by.get("auto")
        cells.append(f"{auto['ratio_to_fault']:.2f}x" if auto and auto.get("ratio_to_fault") is not None else "-")
        ratio = auto.get("ratio_to_limit") if auto else None
        cells.append(f"{ratio:.2f}x" if ratio is not None else "-")
        if warm:
            cells.append("-")
        else:
            low = [(a["ratio_to_limit"], s) for s, a in by.items()
                   if s not in ("limit", "qd1-page") and a.get("ratio_to_limit") is not None]
            r, s = min(low) if low else (None, None)
            cells.append(f"{r:.2f}x ({s})" if low else "-")
        out.append("| " + " | ".join(cells) + " |")
    return "\n".join(out)


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    for path in sys.argv[1:]:
        with open(path) as f:
            print(table(json.load(f)))
            print()


if __name__ == "__main__":
    main()
