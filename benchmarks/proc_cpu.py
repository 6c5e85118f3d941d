"""CPU seconds per process of a command and of everything it starts (Ray's head, agents and workers included).

    python benchmarks/proc_cpu.py -- python -m tune_as.search --task digits ...

Every process that inherits the marker this script puts in the environment is sampled from /proc every 0.25 s (its
user + system time, the highest value seen); the report groups them by role. A process that ends between two
samples loses at most 0.25 s of its time. Linux only. The command's own output goes where it would; the report goes
to stderr (docs/benchmarks.md: where the README command's CPU goes).
"""

from __future__ import annotations

import collections
import os
import subprocess
import sys
import time

HZ = os.sysconf("SC_CLK_TCK")
ROLES = ("dashboard/agent.py", "dashboard/dashboard.py", "log_monitor", "autoscaler", "runtime_env/agent",
         "default_worker.py", "ray.util.client", "gcs_server", "raylet", "ray.scripts.scripts start", "tune_as.search")


def sample(marker: bytes, seen: dict[int, tuple[float, str]]) -> None:
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                if marker not in f.read():
                    continue
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:  # ended while we looked
            continue
        fields = stat[stat.rfind(")") + 2:].split()
        cpu = (int(fields[11]) + int(fields[12])) / HZ
        name = cmd or stat[stat.find("(") + 1:stat.rfind(")")]
        old = seen.get(int(entry), (0.0, ""))
        seen[int(entry)] = (max(cpu, old[0]), name if len(name) > len(old[1]) else old[1])


def main() -> int:
    argv = sys.argv[1:]
    if argv[:1] == ["--"]:
        argv = argv[1:]
    if not argv:
        print("proc_cpu: expected a command after --, got none", file=sys.stderr)
        return 2
    marker = f"{os.getpid()}-{time.monotonic_ns()}"
    seen: dict[int, tuple[float, str]] = {}
    tic = time.monotonic()
    proc = subprocess.Popen(argv, env={**os.environ, "PROC_CPU_MARK": marker})
    while proc.poll() is None:
        sample(f"PROC_CPU_MARK={marker}".encode(), seen)
        time.sleep(0.25)
    wall = time.monotonic() - tic
    by_role: collections.Counter[str] = collections.Counter()
    count: collections.Counter[str] = collections.Counter()
    for cpu, name in seen.values():
        role = next((r for r in ROLES if r in name), name[:60])
        by_role[role] += cpu
        count[role] += 1
    print(f"wall {wall:.1f} s, CPU {sum(by_role.values()):.1f} s", file=sys.stderr)
    for role, cpu in by_role.most_common():
        print(f"{cpu:8.1f} s  {count[role]:3d} processes  {role}", file=sys.stderr)
    workers = sorted((cpu for cpu, name in seen.values() if "default_worker.py" in name), reverse=True)
    print("Ray workers, CPU s each: " + " ".join(f"{cpu:.1f}" for cpu in workers), file=sys.stderr)
    return proc.returncode


if __name__ == "__main__":
    sys.exit(main())
