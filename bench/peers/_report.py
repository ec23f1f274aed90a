"""peers.json -> peers.md: the numbers per system, and ratios to Restate from the same run."""

from __future__ import annotations

from typing import Any

PHASES = ("closed-16", "closed-64", "open-100", "open-500")
BASE = "restate"


def _lat(p: dict[str, Any]) -> str:
    if "p50_ms" not in p:
        return "—"
    return f"{p['p50_ms']:.1f} / {p['p99_ms']:.1f} / {p['max_ms']:.0f}"


def cpu_per_command(sys_: dict[str, Any]) -> float | None:
    ph = sys_.get("phases", {}).values()
    cmds = sum(p["commands"] for p in ph)
    cpu = sum(p["meter"]["system_cpu_s"] for p in ph)
    return round(1000 * cpu / cmds, 3) if cmds else None


def driver_cpu_per_command(sys_: dict[str, Any]) -> float | None:
    ph = sys_.get("phases", {}).values()
    cmds = sum(p["commands"] for p in ph)
    cpu = sum(p["meter"]["processes"]["driver"]["cpu_s"] for p in ph)
    return round(1000 * cpu / cmds, 3) if cmds else None


def _shapes(shapes: dict[str, Any], systems: dict[str, Any]) -> str:
    """The pass-through with our transactions' shape, beside Restate's latency at the same
    rate: what Kafka alone costs before any of our logic."""
    names = {
        "outcome": "the record, then its outcome record (a second produce round)",
        "one-changelog": "the record to two topics (events and one changelog topic in place of"
        " two: a layout not built yet), then its outcome record",
        "ours": "the record to three topics (events, two changelogs), then its outcome record",
    }
    restate = systems.get("restate", {}).get("phases", {})
    lines = []
    for shape, by_rate in shapes.items():
        cells = []
        for r, v in by_rate.items():
            if not isinstance(v, dict) or "p50_ms" not in v:
                continue
            cell = f"{r}/s: {_lat(v)}"
            rp = restate.get(f"open-{r}", {})
            if rp.get("p50_ms"):
                x50, x99 = v["p50_ms"] / rp["p50_ms"], v["p99_ms"] / rp["p99_ms"]
                cell += f" ({x50:.2f}x / {x99:.2f}x Restate's)"
            cells.append(cell)
        if cells:
            lines.append(f"- {names.get(shape, shape)}: " + "; ".join(cells))
    return _paragraph(
        "The same pass-through (no logic, one transaction at a time) with our transactions' "
        "shape, p50 / p99 / max ms (ratios: p50 / p99):\n",
        lines,
        "\n",
    )


def _paragraph(head: str, items: list[str], sep: str) -> str:
    """`head` and `items` after a blank line, or nothing without items."""
    return "\n" + head + sep.join(items) if items else ""


def _cpu_floor(pt: dict[str, Any], systems: dict[str, Any]) -> str:
    """The broker's CPU per record under the raw pass-through beside each system's CPU per
    command in the open-loop phase of the same rate."""
    cells = []
    for r, v in pt.items():
        if not isinstance(v, dict) or "broker_cpu_ms_per_record" not in v:
            continue
        row = [f"pass-through broker {v['broker_cpu_ms_per_record']}"]
        for name, sys_ in systems.items():
            ph = sys_.get("phases", {}).get(f"open-{r}")
            if ph and ph.get("commands"):
                row.append(f"{name} {ph['meter']['cpu_ms_per_command']}")
        cells.append(f"{r}/s: " + ", ".join(row))
    return _paragraph(
        "CPU ms per record or command in the open-loop phases (the Kafka floor: a broker "
        "running one transaction a poll of the pass-through, no logic): ",
        cells,
        "; ",
    )


def _idle(systems: dict[str, Any]) -> str:
    """Each system's CPU (cores) with no load, after its phases."""
    cells = []
    for name, s in systems.items():
        got = s.get("idle")
        if got:
            parts = " + ".join(f"{n} {c:.3f}" for n, c in got["cores"].items())
            cells.append(f"{name} {got['total_cores']:.3f} ({parts})")
    return _paragraph(
        "Idle, after the phases (no load, the driver's process included), CPU in cores: ",
        cells,
        "; ",
    )


def rss(sys_: dict[str, Any]) -> dict[str, float]:
    """Peak RSS (MiB) per process over the run, the load driver left out."""
    out: dict[str, float] = {}
    for p in sys_.get("phases", {}).values():
        for name, v in p["meter"]["processes"].items():
            if name != "driver":
                out[name] = max(out.get(name, 0.0), v["peak_rss_mb"])
    return out


def derived(sys_: dict[str, Any]) -> dict[str, Any]:
    ph = sys_.get("phases", {})
    return {
        "c16_cmd_s": ph.get("closed-16", {}).get("commands_per_s"),
        "c64_cmd_s": ph.get("closed-64", {}).get("commands_per_s"),
        "p50_100": ph.get("open-100", {}).get("p50_ms"),
        "p99_100": ph.get("open-100", {}).get("p99_ms"),
        "p50_500": ph.get("open-500", {}).get("p50_ms"),
        "p99_500": ph.get("open-500", {}).get("p99_ms"),
        "cpu_ms_per_cmd": cpu_per_command(sys_),
        "idle_cores": sys_.get("idle", {}).get("total_cores"),
        "rss_mb": round(sum(rss(sys_).values()), 1) if ph else None,
    }


def ratios(systems: dict[str, Any]) -> dict[str, dict[str, float | None]]:
    """Each system's figure divided by Restate's (throughput: higher is better; latency,
    CPU, idle CPU and RSS: lower is better)."""
    if BASE not in systems:
        return {}
    base = derived(systems[BASE])
    out: dict[str, dict[str, float | None]] = {}
    for name, s in systems.items():
        d = derived(s)
        out[name] = {k: (round(d[k] / base[k], 2) if d[k] and base[k] else None) for k in d}
    return out


def markdown(doc: dict[str, Any]) -> str:
    systems, lines = doc["systems"], []
    lines.append(
        f"# Peers: sessionstream beside Restate and Temporal ({doc['mode']} run, {doc['date']})\n"
    )
    lines.append(
        f"`{doc['command']}` on {doc['host']['cpus']} CPUs; "
        f"load average at start {doc['host']['loadavg_start']}; "
        f"{doc['host'].get('note') or ''}\n"
    )
    lines.append(
        "Workload: 1,000 sessions; a cycle = `prompt` (reject) -> accepted, a second "
        "`prompt` -> rejected `session_busy`, `abort` -> run cancelled, each awaited. "
        "Closed loop with C cycles in flight (commands/s); open loop at R commands/s "
        "(command -> outcome p50 / p99 / max ms).\n"
    )
    lines.append(
        "| system | C=16 cmd/s | C=64 cmd/s | 100/s p50 / p99 / max ms | "
        "500/s p50 / p99 / max ms | CPU ms/cmd (driver) | peak RSS MiB | "
        "load avg (phases) | correctness |"
    )
    lines.append("|---|---|---|---|---|---|---|---|---|")
    for name, s in systems.items():
        if "error" in s and not s.get("phases"):
            lines.append(f"| {name} | failed: {s['error'][:120]} |||||||| ")
            continue
        ph = s["phases"]
        cells = [name]
        for k in ("closed-16", "closed-64"):
            cells.append(f"{ph[k]['commands_per_s']:,.0f}" if k in ph else "—")
        for k in ("open-100", "open-500"):
            cells.append(_lat(ph.get(k, {})))
        cells.append(f"{cpu_per_command(s)} ({driver_cpu_per_command(s)})")
        r = rss(s)
        cells.append(
            f"{sum(r.values()):,.0f} (" + " + ".join(f"{n} {v:,.0f}" for n, v in r.items()) + ")"
        )
        cells.append(" / ".join(f"{ph[k]['meter']['loadavg_end']:.1f}" for k in PHASES if k in ph))
        bad = sum(p["two_active_runs"] for p in ph.values())
        lost = sum(p["cycles_without_outcome"] for p in ph.values())
        odd = sum(sum(p["unexpected"].values()) + sum(p["errors"].values()) for p in ph.values())
        ok = sum(p["cycles_ok"] for p in ph.values())
        chk = s.get("check", {})
        cells.append(
            f"{ok:,} cycles ok; two active runs: {bad}; without outcome: {lost}; "
            f"other: {odd}" + ("" if chk.get("ok", True) else "; LOG CHECK FAILED")
        )
        lines.append("| " + " | ".join(cells) + " |")
    idle = _idle(systems)
    if idle:
        lines.append(idle)
    pt = doc.get("passthrough") or {}
    if pt:
        lines.append(
            "\nRaw transactional Kafka pass-through (no logic, same run), produce -> "
            "visible p50 / p99 / max ms: "
            + "; ".join(f"{r}/s: {_lat(v)}" for r, v in pt.items() if isinstance(v, dict))
        )
        floor = _cpu_floor(pt, systems)
        if floor:
            lines.append(floor)
        shaped = _shapes(doc.get("passthrough_shapes") or {}, systems)
        if shaped:
            lines.append(shaped)
    rt = ratios(systems)
    if rt:
        lines.append(
            "\nRatios to Restate, same run (cmd/s: higher is better; latency, CPU, "
            "idle CPU, RSS: lower is better):\n"
        )
        keys = [
            "c16_cmd_s",
            "c64_cmd_s",
            "p50_100",
            "p99_100",
            "p50_500",
            "p99_500",
            "cpu_ms_per_cmd",
            "idle_cores",
            "rss_mb",
        ]
        lines.append("| system | " + " | ".join(keys) + " |")
        lines.append("|---" * (len(keys) + 1) + "|")
        for name, ratio in rt.items():
            lines.append(
                f"| {name} | "
                + " | ".join("—" if ratio[k] is None else f"{ratio[k]:.2f}x" for k in keys)
                + " |"
            )
    lines.append("\n" + doc.get("notes", ""))
    return "\n".join(lines) + "\n"
