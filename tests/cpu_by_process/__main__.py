"""`python -m tests.cpu_by_process FILE.processes`: the CPU of the processes the tests started, per test module and
program (count, total, mean), largest first; FILE is TEST_CPU_LOG's (tests/cpu_by_process/sitecustomize.py)."""

import json
import sys
from collections import defaultdict


def main(argv: list[str]) -> int:
    totals: dict[tuple[str, str], list[float]] = defaultdict(list)
    for path in argv:
        with open(path) as log:
            for line in log:
                record = json.loads(line)
                module = record["test"].split("::")[0] or "(no test)"
                totals[module, record["program"]].append(record["cpu_s"])
    for (module, program), cpu in sorted(totals.items(), key=lambda kv: -sum(kv[1])):
        print(f"{sum(cpu):7.1f} s  {len(cpu):4d} x {sum(cpu) / len(cpu):5.2f} s  {module}  {program}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
