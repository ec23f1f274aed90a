"""One markdown table from `bench/results/*.json`; printed and written to `SUMMARY.md`.

Only numbers found in the result files appear; a missing file or field reads "not run".
With `--since EPOCH`, results written before then are marked stale (with their date).

    .venv/bin/python -m bench.summarize [--since EPOCH] [--wall SECONDS]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"
NOT_RUN = "not run"
Row = tuple[str, str, str]
Fmt = Callable[[], str]


class Results:
    def __init__(self, since: float | None) -> None:
        self.since = since
        self.data: dict[str, Any] = {}
        self.stale: dict[str, str] = {}
        for path in sorted(RESULTS.glob("*.json")):
            try:
                self.data[path.stem] = json.loads(path.read_text())
            except (OSError, ValueError):
                continue
            mtime = path.stat().st_mtime
            if since is not None and mtime < since:
                when = datetime.fromtimestamp(mtime, UTC).strftime("%Y-%m-%d %H:%M UTC")
                self.stale[path.stem] = f" *(stale: {when})*"

    def cell(self, name: str, fmt: Fmt) -> str:
        """`fmt()`; "not run" when the file or a field it needs is missing."""
        if name not in self.data:
            return NOT_RUN
        try:
            text = fmt()
        except (KeyError, TypeError, IndexError, ZeroDivisionError):
            return NOT_RUN
        return text + self.stale.get(name, "")


def ms(p: dict[str, Any], *keys: str) -> str:
    return " / ".join(f"{p[k]:,.0f}" if p[k] >= 10 else f"{p[k]:.1f}" for k in keys) + " ms"


def n(v: float) -> str:
    return f"{v:,.0f}"


def decider(d: Any) -> list[tuple[str, Fmt]]:
    return [
        (
            "decide + evolve + Avro encode, one core",
            lambda: f"**{n(d['commands_per_s'])} cmd/s** ({n(d['events_per_s'])} events/s)",
        )
    ]


def processor(d: Any) -> list[tuple[str, Fmt]]:
    t, la, rc = d.get("throughput"), d.get("latency"), d.get("recovery")
    return [
        (
            "throughput, backlog, exactly-once, 4 partitions",
            lambda: (
                f"**{n(t['commands_per_s'])} cmd/s** ({n(t['events_per_s'])} events/s, "
                f"{n(t['commands'])} commands)"
            ),
        ),
        (
            "command -> event visible (read_committed) p50 / p99 / p99.9",
            lambda: f"@{la['achieved_rate']:g} cmd/s: " + ms(la, "p50_ms", "p99_ms", "p99.9_ms"),
        ),
        (
            "recovery after kill -9 and restart, median",
            lambda: (
                f"first new event **{rc['median']['first_event_s']} s**, backlog drained "
                f"{rc['median']['drained_s']} s ({len(rc['kills'])} kills "
                f"@{rc['load_rate']:g} cmd/s); "
                "log check " + ("OK" if d["log_check"]["ok"] else "**FAILED**")
            ),
        ),
    ]


def sink(d: Any) -> list[tuple[str, Fmt]]:
    w, e, la = d.get("writer"), d.get("end_to_end"), d.get("latency")
    return [
        (
            "write_batch rows/s, batch 1000: copy vs executemany",
            lambda: (
                f"{n(w['write_batch']['copy']['1000']['rows_per_s'])} vs "
                f"{n(w['write_batch']['executemany']['1000']['rows_per_s'])}"
            ),
        ),
        (
            "end to end, events topic -> rows, rows/s: copy vs executemany",
            lambda: f"**{n(e['copy']['rows_per_s'])}** vs {n(e['executemany']['rows_per_s'])}",
        ),
        (
            "command -> row in PostgreSQL p50 / p99",
            lambda: (
                f"@{la['achieved_rate']:g} cmd/s: " + ms(la["command_to_row"], "p50_ms", "p99_ms")
            ),
        ),
    ]


def worker(d: Any) -> list[tuple[str, Fmt]]:
    tk = d.get("takeover_after_kill9")
    return [
        (
            "cancel: abort -> tool aborted; abort -> run cancelled (p50 / p99)",
            lambda: (
                ms(d["cancel_propagation_abort_to_tool"], "p50_ms", "p99_ms")
                + "; "
                + ms(d["abort_to_terminal_cancelled"], "p50_ms", "p99_ms")
            ),
        ),
        (
            "takeover after a worker's kill -9 (p50 / max)",
            lambda: _takeovers(tk, d["lease_ms"]),
        ),
    ]


def _takeovers(tk: Any, lease_ms: Any) -> str:
    """One figure per pool size (`{n}_workers`), or the older single figure."""
    if "p50_ms" in tk:
        return ms(tk, "p50_ms", "max_ms") + f" ({tk['n']} rounds, lease {lease_ms} ms)"
    cells = [
        f"{v['workers']} workers: "
        + ms(v["takeover"], "p50_ms", "max_ms")
        + f" ({v['takeover']['n']} takeovers)"
        for _, v in sorted(tk.items())
    ]
    return "; ".join(cells) + f"; lease {lease_ms} ms"


def baselines(d: Any) -> list[tuple[str, Fmt]]:
    c, a, o, b, op = (
        d.get(k) for k in ("ceiling", "baseline_a", "ours_a", "baseline_b", "ours_paced")
    )
    x = d.get("ratios")
    return [
        (
            "**ceiling**: raw transactional pass-through on the same backlog",
            lambda: (
                f"{n(c['records_per_s'])} rec/s (runs before / after ours: "
                f"{' / '.join(n(x['records_per_s']) for x in c['runs'])}); ours "
                f"{n(c['ours']['commands_per_s'])} cmd/s = **{c['ratio']:.0%} of the ceiling**"
            ),
        ),
        (
            "**Baseline A**: JSONB document, read-modify-write, no lock",
            lambda: (
                f"**{n(a['lost'])} of {n(a['committed'])} events lost** ({a['lost_pct']}%), "
                f"{n(a['commands_per_s'])} cmd/s; {a['writers']} writers, {a['sessions']} sessions"
            ),
        ),
        (
            "&nbsp; the same load through sessionstream (processor + sink)",
            lambda: (
                f"**{o['lost']} lost** ({n(o['commands_with_rows'])} of "
                f"{n(o['acknowledged'])} acknowledged commands have rows); "
                f"{n(o['commands_per_s_to_rows'])} cmd/s to rows"
            ),
        ),
        (
            "**Baseline B**: PostgreSQL only (row lock + our decider), saturated",
            lambda: (
                f"{n(b['saturated']['commands_per_s'])} cmd/s with {b['saturated']['writers']} "
                f"writers; sessionstream **{x['throughput_processor_vs_b']}x** (processor) / "
                f"**{x['throughput_to_rows_vs_b']}x** (to rows)"
            ),
        ),
        (
            "&nbsp; B command -> committed vs ours command -> row, p50 / p99",
            lambda: (
                f"@{b['paced']['achieved_rate']:g} cmd/s: B "
                + ms(b["paced"]["command_to_committed"], "p50_ms", "p99_ms")
                + ", ours "
                + ms(op["command_to_row"], "p50_ms", "p99_ms")
                + f" (ours/B **{x['latency_p50_vs_b']}x / {x['latency_p99_vs_b']}x**)"
            ),
        ),
        (
            "replay: events topic by offset (read_range); rebuild of the projection",
            lambda: (
                f"{n(d['replay']['read_range_events_per_s'])} events/s; "
                f"{n(d['replay']['rebuild_events_per_s'])} events/s "
                f"({n(d['replay']['rebuild_events'])} events, equal to live: "
                f"{d['replay']['rebuild_equal']})"
            ),
        ),
    ]


def sweep(d: Any) -> list[tuple[str, Fmt]]:
    return [
        (
            "command -> event p50 / p99 by load (1 processor, 4 partitions)",
            lambda: (
                "; ".join(
                    f"{p['achieved_rate']:,.0f}/s: " + ms(p, "p50_ms", "p99_ms")
                    for p in d["latency_vs_load"]
                )
                + " — [plot](latency_vs_load.png)"
            ),
        ),
        (
            "throughput by partitions x processor instances, cmd/s",
            lambda: (
                "; ".join(
                    f"{p['partitions']}p x {p['instances']}: {n(p['commands_per_s'])}"
                    for p in d["scale"]
                )
                or NOT_RUN
            ),
        ),
    ]


def gateway_abuse(d: Any) -> list[tuple[str, Fmt]]:
    r = d.get("resume_first_event_ms", {})
    g = d.get("gateway", {})
    return [
        (
            "a resume -> first event: quiet; another tenant stalling 8 resumes (p50 / max)",
            lambda: ms(r["quiet"], "p50", "max") + "; " + ms(r["under_attack"], "p50", "max"),
        ),
        (
            "gateway RSS at rest -> peak under that attack",
            lambda: f"{g['at_rest']['rss_mb']:.0f} -> {g['peak_under_attack']['rss_mb']:.0f} MB",
        ),
        (
            "600 made-up keys from one address: lookups reaching PostgreSQL",
            lambda: n(d["bad_key_flood"]["key_queries"]),
        ),
    ]


def peers(d: Any) -> list[tuple[str, Fmt]]:
    s, r = d.get("systems", {}), d.get("ratios_to_restate", {})

    def line(name: str) -> str:
        ph = s[name]["phases"]
        lat = ph["open-500"]
        return (
            f"{n(ph['closed-16']['commands_per_s'])} / {n(ph['closed-64']['commands_per_s'])} "
            f"cmd/s (C=16 / 64); 500/s p50 / p99 {ms(lat, 'p50_ms', 'p99_ms')}; "
            f"**{r[name]['c64_cmd_s']}x** Restate's C=64 cmd/s"
        )

    return [
        (f"{name}: closed loop, open loop 500/s, vs Restate (same run)", lambda k=name: line(k))
        for name in ("sessionstream-sdk", "sessionstream-http", "restate", "temporal")
    ]


SECTIONS: list[tuple[str, str, Callable[[Any], list[tuple[str, Fmt]]]]] = [
    ("decider", "decider", decider),
    ("processor", "processor", processor),
    ("sink", "sink", sink),
    ("worker", "worker", worker),
    ("baselines", "vs baselines", baselines),
    ("sweep", "load sweep", sweep),
    ("gateway-abuse", "gateway under attack", gateway_abuse),
    ("peers", "vs Restate and Temporal", peers),
]


def rows(r: Results) -> list[Row]:
    out: list[Row] = []
    for name, area, section in SECTIONS:
        for measure, fmt in section(r.data.get(name) or {}):
            out.append((area, measure, r.cell(name, fmt)))
    return out


def render(r: Results, wall: float | None) -> str:
    steps = r.data.get("run_all", {}).get("steps", []) if r.since else []
    head = [f"# sessionstream benchmarks ({datetime.now(UTC).strftime('%Y-%m-%d %H:%M UTC')})\n"]
    host = f"{os.cpu_count()} CPUs"
    if wall is not None:
        host += f"; bench/run_all.sh took {wall:.0f} s"
    if steps:
        host += "; steps (mode, status, seconds, 1-min load average at start): " + "; ".join(
            f"{s['name']} {s['mode']} {s['status']} {s['seconds']} s load {s.get('loadavg_start')}"
            for s in steps
        )
    head.append(
        host + ". The host is shared (Kafka, PostgreSQL and whatever else runs there): a load "
        "average above 2 means the benchmarks competed for the CPUs. "
        "Every number is in `bench/results/*.json`.\n"
    )
    table = ["| area | measure | result |", "|---|---|---|"]
    table += [f"| {a} | {m} | {v} |" for a, m, v in rows(r)]
    return "\n".join(head + table) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--since", type=float, help="epoch: results older than this are stale")
    ap.add_argument("--wall", type=float, help="wall seconds of the whole run, for the header")
    a = ap.parse_args(argv)
    text = render(Results(a.since), a.wall)
    (RESULTS / "SUMMARY.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
