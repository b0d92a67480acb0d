"""Sum what `VIJAX_TEST_PROGRAMS=<prefix> python -m pytest` recorded, by test file (or by test with --tests).

    VIJAX_TEST_PROGRAMS=/tmp/suite python -m pytest && python tests/programs.py /tmp/suite
"""

import argparse
import collections
import glob
import json

parser = argparse.ArgumentParser()
parser.add_argument("prefix")
parser.add_argument("--tests", action="store_true", help="one row per test instead of per file")
parser.add_argument("--top", type=int, default=40)
args = parser.parse_args()
rows = [row for name in glob.glob(f"{args.prefix}.*.json") for row in json.load(open(name))]
totals = collections.defaultdict(lambda: [0, 0, 0.0, 0.0])
for row in rows:
    total = totals[row["test"] if args.tests else row["test"].split("::")[0]]
    total[0] += 1
    total[1] += row["programs"]
    total[2] += row["compile"]
    total[3] += row["wall"]
print(f"{len(rows)} tests: {sum(t[1] for t in totals.values())} programs, "
      f"{sum(t[2] for t in totals.values()):.0f} s compiling, {sum(t[3] for t in totals.values()):.0f} s in tests")
print(f"{'wall s':>8} {'compile s':>10} {'programs':>9} {'tests':>6}  name")
for name, (n, programs, compile_s, wall) in sorted(totals.items(), key=lambda kv: -kv[1][3])[:args.top]:
    print(f"{wall:8.1f} {compile_s:10.1f} {programs:9d} {n:6d}  {name}")
