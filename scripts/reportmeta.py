#!/usr/bin/env python3
"""The stamp every report in docs/reports carries, for the scripts' own reports.

`pleio ... --json` reports carry `run` and `machine` themselves (the CLI's
report envelope); a script that writes a report calls `start()` first and
`stamp(state)` last, which gives the same two objects:

    run:     {"argv", "commit", "started_unix", "seconds", "load_start", "load_end"}
    machine: {"cpu", "cpus", "mem_bytes", "kernel", "page_bytes"}

`commit` is `git rev-parse HEAD` of this checkout, with `-dirty` when a
tracked file outside `docs/` differs from it (the reports being re-made
and the pages are not what ran); the loads are /proc/loadavg's 1-, 5- and
15-minute averages.

As a command it wraps another one whose standard output is JSON, JSON
lines or text, and writes that output with the stamp to a report:

    python3 scripts/reportmeta.py --out docs/reports/NAME.json [--from REGEX] -- CMD ARGS...

(`output`: the parsed JSON, a list of the JSON lines, or a list of text
lines, with `--from` only the text from the first line matching REGEX on,
e.g. a bench's summary after criterion's own output; the command's
standard error passes through, and a failed command writes no report).
"""

import json
import os
import re
import platform
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def load_average():
    try:
        return [float(v) for v in Path("/proc/loadavg").read_text().split()[:3]]
    except (OSError, ValueError):
        return None


def commit():
    def git(*args):
        r = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True)
        return r.stdout.strip() if r.returncode == 0 else None

    head = git("rev-parse", "HEAD") or "unknown"
    # docs/ (the reports being re-made, the pages) is not what a figure runs
    dirty = git("status", "--porcelain", "--untracked-files=no", "--", ".", ":(exclude)docs")
    return head + ("-dirty" if dirty else "")


def machine():
    def field(path, key):
        try:
            for line in Path(path).read_text().splitlines():
                if line.startswith(key):
                    return line.split(":", 1)[1].strip()
        except OSError:
            pass
        return ""

    mem = field("/proc/meminfo", "MemTotal")
    return {
        "cpu": field("/proc/cpuinfo", "model name"),
        "cpus": len(os.sched_getaffinity(0)),
        "mem_bytes": int(mem.split()[0]) * 1024 if mem else 0,
        "kernel": platform.release(),
        "page_bytes": os.sysconf("SC_PAGE_SIZE"),
    }


def start(argv=None):
    """The state `stamp` needs: call it before the work."""
    return {"argv": list(sys.argv if argv is None else argv),
            "env": {k: v for k, v in sorted(os.environ.items()) if k.startswith("PLEIO_")}, "commit": commit(),
            "started_unix": int(time.time()), "t0": time.monotonic(), "load_start": load_average()}


def stamp(state):
    """`{"run": ..., "machine": ...}` for a report whose work began at `start()`."""
    run = {k: v for k, v in state.items() if k != "t0"}
    run["seconds"] = time.monotonic() - state["t0"]
    run["load_end"] = load_average()
    return {"run": run, "machine": machine()}


def parse(text):
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        pass
    lines = [line for line in text.splitlines() if line.strip()]
    try:
        return [json.loads(line) for line in lines]
    except json.JSONDecodeError:
        return lines


def main():
    args = sys.argv[1:]
    if len(args) < 4 or args[0] != "--out" or "--" not in args:
        sys.exit(__doc__)
    out, opts, cmd = Path(args[1]), args[2:args.index("--")], args[args.index("--") + 1:]
    if opts not in ([],) and not (len(opts) == 2 and opts[0] == "--from"):
        sys.exit(__doc__)
    state = start(cmd)
    done = subprocess.run(cmd, stdout=subprocess.PIPE, text=True)
    if done.returncode != 0:
        sys.exit(f"reportmeta: {' '.join(cmd)} exited with {done.returncode}; no report written")
    text = done.stdout
    if opts:
        m = re.search(opts[1], text, re.M)
        if not m:
            sys.exit(f"reportmeta: no line of the output matches {opts[1]!r}; no report written")
        text = text[text.rfind("\n", 0, m.start()) + 1:]
    rep = {"schema": "pleio-script-report/1", **stamp(state), "output": parse(text)}
    out.write_text(json.dumps(rep, indent=1) + "\n")
    print(f"reportmeta: wrote {out} ({rep['run']['seconds']:.0f} s)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
