#!/usr/bin/env python3
"""What a session costs, every row of issue 38's table in one run,
longhaul builds against wstunnel, interleaved (benchmark; docs/BENCHMARKS.md).

  session_cost.py --wstunnel PATH [--rounds 2] [--sessions 1000]
                  [--spread 200] [--streams 10000] LABEL=BINARY ...

Per round, for each relay in turn (wstunnel, then each longhaul build):
  * memory per idle TLS session with one stream at the server, and the
    server's idle CPU per session: `--sessions` tunnels from one process
    (many_sessions.py: `longhaul bench sessions`; one wstunnel client);
  * the server's idle CPU per session when each client is a process of
    its own (`--spread` of them: keepalives at their own times, as a real
    fleet's are; longhaul only: a wstunnel client's tunnels are all one
    process);
  * 10 000 idle streams through one -L, both processes' RSS, opened as
    fast as one client can and then 2 000 a second (stream_memory.py;
    longhaul only);
then loopback_vs_wstunnel.sh (1-stream iperf3 throughput, CPU seconds per
GB of both relays, 1 B request/response p50), itself interleaved.

Loopback only; every process started here is killed by PID at the end.
"""
import argparse
import os
import re
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import many_sessions  # noqa: E402
from loopback import kill_all  # noqa: E402


def spread_idle(lh, n, idle):
    """Server idle CPU (us/s per session) and KiB per session, `n` client processes."""
    env = dict(os.environ, LH=lh, IDLE=str(idle))
    out = subprocess.run([sys.executable, f"{HERE}/session_memory.py", str(n), "--tls"],
                         capture_output=True, text=True, env=env, timeout=600).stdout
    kib = re.search(r"([\d.]+) KiB per session", out)
    us = re.search(r"server CPU ([\d.]+) us/s", out)
    return (float(kib.group(1)) if kib else float("nan"),
            float(us.group(1)) if us else float("nan"))


def idle_streams(lh, n, pace=0):
    """Both processes' RSS in MiB with `n` idle streams through one -L,
    opened at once (`pace` 0) or `pace` a second."""
    out = subprocess.run([sys.executable, f"{HERE}/stream_memory.py", "--bin", lh,
                          "--idle", str(n), "--busy", "0", "--pace", str(pace)],
                         capture_output=True, text=True, timeout=900).stdout
    m = re.search(r"together ([\d.]+) MiB \(PSS ([\d.]+) MiB\)", out)
    return (float(m.group(1)), float(m.group(2))) if m else (float("nan"), float("nan"))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("builds", nargs="+", help="LABEL=BINARY")
    ap.add_argument("--wstunnel", required=True)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--sessions", type=int, default=1000)
    ap.add_argument("--spread", type=int, default=200)
    ap.add_argument("--streams", type=int, default=10000)
    ap.add_argument("--idle", type=int, default=30)
    a = ap.parse_args()
    builds = [b.split("=", 1) for b in a.builds]
    rows = {name: {} for name in ["wstunnel"] + [n for n, _ in builds]}

    def add(name, key, v):
        rows[name].setdefault(key, []).append(v)

    work = tempfile.mkdtemp(prefix="lh-cost-")
    target = many_sessions.Hold()
    for rnd in range(a.rounds):
        print(f"-- round {rnd + 1}", flush=True)
        r = many_sessions.wstunnel(a.wstunnel, a.sessions, a.idle, target,
                                  tempfile.mkdtemp(dir=work))
        target.reset()
        add("wstunnel", "kib_session", r["kib_per_tunnel"])
        add("wstunnel", "idle_us", r["idle_cpu_ms_per_s"] * 1000 / max(1, r["tunnels"]))
        print(f"wstunnel: {r['kib_per_tunnel']:.1f} KiB/session, "
              f"idle {rows['wstunnel']['idle_us'][-1]:.2f} us/s per session", flush=True)
        for name, lh in builds:
            r = many_sessions.longhaul(lh, a.sessions, a.idle, target,
                                      tempfile.mkdtemp(dir=work), "15s")
            target.reset()
            add(name, "kib_session", r["kib_per_tunnel"])
            add(name, "idle_us", r["idle_cpu_ms_per_s"] * 1000 / max(1, r["tunnels"]))
            kib, us = spread_idle(lh, a.spread, a.idle)
            add(name, "kib_spread", kib)
            add(name, "idle_us_spread", us)
            mib, pss = idle_streams(lh, a.streams)
            add(name, "streams_mib", mib)
            add(name, "streams_pss", pss)
            paced, _ = idle_streams(lh, a.streams, 2000)
            add(name, "streams_paced", paced)
            print(f"{name}: {r['kib_per_tunnel']:.1f} KiB/session, idle "
                  f"{rows[name]['idle_us'][-1]:.2f} us/s per session (one client process), "
                  f"{us:.2f} us/s ({a.spread} client processes, {kib:.1f} KiB/session); "
                  f"{a.streams} idle streams {mib:.1f} MiB (PSS {pss:.1f}; "
                  f"{paced:.1f} opened 2 000/s)", flush=True)
    print("-- loopback: throughput, CPU per GB, rr (scripts/loopback_vs_wstunnel.sh)", flush=True)
    lb = subprocess.run(["bash", f"{HERE}/loopback_vs_wstunnel.sh", *a.builds],
                        capture_output=True, text=True,
                        env=dict(os.environ, WSTUNNEL=a.wstunnel, ROUNDS=str(a.rounds)))
    print(lb.stdout, flush=True)
    for line in lb.stdout.splitlines():
        m = re.match(r"(\S+)\s+([\d.]+) Gbit/s\s+cpu\s+([\d.na]+) s/GB\s+rr p50\s+([\d.na]+) us", line)
        if m and m.group(1) in rows:
            add(m.group(1), "gbit", float(m.group(2)))
            add(m.group(1), "cpu_gb", float(m.group(3)))
            add(m.group(1), "rr_us", float(m.group(4)))

    def span(name, key, fmt="{:.1f}"):
        v = rows[name].get(key)
        if not v:
            return "—"
        lo, hi = min(v), max(v)
        return fmt.format(lo) if lo == hi else f"{fmt.format(lo)}–{fmt.format(hi)}"

    names = list(rows)
    print("\n| | " + " | ".join(names) + " |")
    print("|---|" + "---|" * len(names))
    for label, key, fmt in [
        ("KiB per idle TLS session with one stream (server)", "kib_session", "{:.1f}"),
        ("idle CPU µs/s per session (server; one client process)", "idle_us", "{:.2f}"),
        (f"idle CPU µs/s per session (server; {a.spread} client processes)", "idle_us_spread",
         "{:.2f}"),
        (f"{a.streams} idle streams, both processes, MiB (RSS)", "streams_mib", "{:.1f}"),
        (f"{a.streams} idle streams, both processes, MiB (PSS: shared code once)", "streams_pss",
         "{:.1f}"),
        (f"{a.streams} idle streams opened 2 000/s, both processes, MiB (RSS)", "streams_paced",
         "{:.1f}"),
        ("CPU s per GB, both relays, 1 stream", "cpu_gb", "{:.3f}"),
        ("1 stream Gbit/s", "gbit", "{:.2f}"),
        ("1 B rr p50 µs", "rr_us", "{:.1f}"),
    ]:
        print(f"| {label} | " + " | ".join(span(n, key, fmt) for n in names) + " |")


if __name__ == "__main__":
    try:
        main()
    finally:
        kill_all()
