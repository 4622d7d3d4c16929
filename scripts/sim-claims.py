#!/usr/bin/env python3
"""The seeds' claims beside the simulated figures, from a simulated experiment's summary.csv.

    peregrine experiment configs/experiment-sim.toml
    scripts/sim-claims.py runs/experiment-sim-seeds/summary.csv

Prints Markdown: every scheme's time per iteration relative to Ideal (bsp, no straggler) of the
same world, per world and pattern; then, per claim, the simulated figure in every world (the
pattern each claim was made under, and the best case over patterns where the claim says "up to").
Time per iteration only: the simulator does not model convergence (see the README).
"""

import csv
import sys
from collections import defaultdict


def load(path):
    per = defaultdict(dict)  # (workload, pattern) -> scheme -> s/iteration
    for row in csv.DictReader(open(path, newline="")):
        per[(row["workload"], row["pattern"])][row["scheme"]] = float(row["seconds_per_iteration"])
    return per


def world_key(w):
    r, t = w.split("x")
    return (int(r), int(t))


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: scripts/sim-claims.py runs/experiment-sim-seeds/summary.csv")
    per = load(sys.argv[1])
    worlds = sorted({w for w, _ in per}, key=world_key)
    patterns = []
    for _, p in per:
        if p not in patterns:
            patterns.append(p)
    schemes = []
    for v in per.values():
        for s in v:
            if s not in schemes:
                schemes.append(s)

    def ideal(w):
        return per[(w, "ideal")]["bsp"]

    print("| world | pattern | " + " | ".join(schemes) + " |")
    print("|---|---|" + "---|" * len(schemes))
    for w in worlds:
        for p in patterns:
            v = per.get((w, p), {})
            cells = [f"{v[s] / ideal(w):.2f}" if s in v else "-" for s in schemes]
            print(f"| {w} | {p} | " + " | ".join(cells) + " |")
    print()

    def best(f):
        """The pattern (other than ideal) where f is largest, and its value, per world."""
        out = {}
        for w in worlds:
            vals = [(f(per[(w, p)]), p) for p in patterns if p != "ideal" and (w, p) in per]
            vals = [(x, p) for x, p in vals if x is not None]
            if vals:
                out[w] = max(vals)
        return out

    def get(v, s):
        return v.get(s)

    het = next((p for p in patterns if p.startswith("heterogeneous")), None)
    print("| claim | world | simulated |")
    print("|---|---|---|")
    for falcon in ("falcon", "falcon:slack:2"):
        def gain(v, falcon=falcon):
            return v["flexrr:3"] / v[falcon] - 1 if falcon in v and "flexrr:3" in v else None

        for w in worlds:
            x = gain(per.get((w, het), {})) if het else None
            if x is not None:
                print(f"| {falcon} faster than FlexRR, heterogeneous | {w} | {x * 100:+.1f} % |")
        for w, (x, p) in best(gain).items():
            print(f"| {falcon} faster than FlexRR, best pattern | {w} | {x * 100:+.1f} % ({p}) |")
    for w in worlds:
        worst = max(
            (per[(w, p)]["flexrr:3"] / ideal(w), per[(w, p)]["flexrr:3"] / min(per[(w, p)].values()), p)
            for p in patterns
            if "flexrr:3" in per.get((w, p), {})
        )
        print(f"| FlexRR near Ideal (worst pattern) | {w} | {worst[0]:.2f}x Ideal, "
              f"{worst[1]:.2f}x the best scheme there ({worst[2]}) |")

    def dbw(v):
        fixed = [v[s] for s in ("backup:1", "backup:2", "backup:4") if s in v]
        return min(fixed) / v["backup-dynamic"] if fixed and "backup-dynamic" in v else None

    for w, (x, p) in best(dbw).items():
        print(f"| DBW vs the best fixed backup count, best pattern | {w} | {x:.2f}x ({p}) |")
    for w, (x, p) in best(lambda v: v["bsp"] / v["lb-bsp"] - 1 if "lb-bsp" in v and "bsp" in v else None).items():
        print(f"| LB-BSP faster than BSP, best pattern | {w} | {x * 100:+.1f} % ({p}) |")


if __name__ == "__main__":
    main()
