#!/usr/bin/env python3
"""Generates the example workload trace for `flexq simulate` (docs/simulate.md).

    python3 examples/traces/generate.py --seed 1 --days 7 > examples/traces/week.csv

Three teams share europe-west4 (32 L4 GPUs in europe-west4-a with the
embedded default config):

- research: working-hours bursts of 3-GPU batches (a driver and two
  executors), 20 to 90 minutes each — far more than the zone holds; they
  set no allocation timeout, so provisioning.default_allocation_timeout
  applies;
- etl: a 3-GPU batch every 10 minutes, day and night, 10 to 20 minutes;
- training: a 16-GPU gang (a driver and 15 executors) every 6 hours,
  about two hours each, with a 2-hour allocation timeout.

With --mixed, a heavier trace over two regions and several GPU types
(docs/simulate.md, "placement alternatives"):

    python3 examples/traces/generate.py --seed 1 --days 7 --mixed > examples/traces/mixed.csv

adds, in us-central1 (64 L4, 16 A100-40 and 16 A100-80 GPUs):

- vision: weekday-morning bursts of 9-GPU L4 batches (a driver and eight
  executors), 30 to 90 minutes each, far more than the region's L4s hold;
  the config's default allocation timeout;
- nlp: a 5-GPU A100-80 batch every 3 hours, about an hour each.

With --urgent, the week trace plus on-call work that cannot wait
(docs/simulate.md, "preemption"):

    python3 examples/traces/generate.py --seed 1 --days 7 --urgent > examples/traces/urgent.csv

adds, in europe-west4:

- oncall: a 6-GPU batch (a driver and five executors) about every 4 hours,
  30 to 45 minutes each, label flexq-priority 10, a 10-minute allocation
  timeout.

With --loans, the mixed trace plus native users of every GPU type the
shipped ladders borrow (docs/simulate.md, "loans and reclaim"):

    python3 examples/traces/generate.py --seed 1 --days 7 --loans > examples/traces/loans.csv

adds:

- train40: in us-central1, an 8-GPU A100-40 gang (a driver and seven
  executors) about every 2 hours, 60 to 90 minutes each, a 2-hour
  allocation timeout;
- serving: in us-central1, a 4-GPU A100-80 batch about every 45 minutes,
  30 to 50 minutes each, a 1-hour allocation timeout;
- eval: in europe-west4, a 4-GPU A100-40 batch about every 90 minutes,
  40 to 70 minutes each, a 1-hour allocation timeout.

With --elastic, the week trace where every other research batch runs
with Spark's dynamic allocation on (docs/simulate.md, "elastic batches"):

    python3 examples/traces/generate.py --seed 1 --days 7 --elastic > examples/traces/elastic.csv

- such a batch starts on its core (a driver and two executors) and Spark
  wants 6 executors for the first 40 % of its run, then its 2 again
  (max_executors 6, min_executors 2, peak_share 0.4);

and with --fixed the same batches sized for their peak: 6 executors held
for the whole run, of which Spark wants 2 after the first 40 %:

    python3 examples/traces/generate.py --seed 1 --days 7 --fixed > examples/traces/elastic-fixed.csv

The same seed writes the same file (Python's random.Random is
deterministic for a seed).
"""

import argparse
import random
import sys

HEADER = "submit_s,project,region,run_s,allocation_timeout,executors,priority,accelerator"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--days", type=int, default=7)
    parser.add_argument("--mixed", action="store_true",
                        help="add us-central1's teams on several GPU types")
    parser.add_argument("--loans", action="store_true",
                        help="the mixed trace plus native users of the A100s")
    parser.add_argument("--urgent", action="store_true",
                        help="add europe-west4's on-call team, priority 10")
    parser.add_argument("--elastic", action="store_true",
                        help="every other research batch with dynamic allocation, up to 6 executors")
    parser.add_argument("--fixed", action="store_true",
                        help="the --elastic batches sized for their peak, 6 executors")
    args = parser.parse_args()
    args.mixed = args.mixed or args.loans
    rng = random.Random(args.seed)
    rows = []
    span = args.days * 86400
    # research: bursts on weekdays, 09:00-18:00.
    for day in range(args.days):
        if day % 7 >= 5:
            continue
        for _ in range(rng.randint(3, 6)):
            start = day * 86400 + rng.randint(9 * 3600, 17 * 3600)
            for i in range(rng.randint(10, 40)):
                # No allocation timeout: the config's default applies.
                rows.append((start + i * rng.randint(5, 60), "research",
                             rng.randint(20, 90) * 60, "", 2, "", "europe-west4", ""))
    # etl: every 10 minutes, all week.
    for t in range(0, span, 600):
        rows.append((t + rng.randint(0, 59), "etl", rng.randint(10, 20) * 60,
                     "1800s", 2, "", "europe-west4", ""))
    # training: a big gang every 6 hours.
    for t in range(3600, span, 6 * 3600):
        rows.append((t + rng.randint(0, 600), "training",
                     rng.randint(100, 140) * 60, "7200s", 15, "", "europe-west4", ""))
    if args.mixed:
        # vision: bursts of 9-GPU L4 batches on weekday mornings.
        for day in range(args.days):
            if day % 7 >= 5:
                continue
            for _ in range(rng.randint(2, 4)):
                start = day * 86400 + rng.randint(8 * 3600, 12 * 3600)
                for i in range(rng.randint(8, 20)):
                    rows.append((start + i * rng.randint(30, 120), "vision",
                                 rng.randint(30, 90) * 60, "", 8, "", "us-central1", "l4"))
        # nlp: a 5-GPU A100-80 batch every 3 hours.
        for t in range(1800, span, 3 * 3600):
            rows.append((t + rng.randint(0, 600), "nlp", rng.randint(50, 70) * 60,
                         "3600s", 4, "", "us-central1", "a100-80"))
    if args.loans:
        # train40: A100-40 gangs of 8 GPUs in us-central1.
        for t in range(2400, span, 2 * 3600):
            rows.append((t + rng.randint(0, 1200), "train40", rng.randint(60, 90) * 60,
                         "7200s", 7, "", "us-central1", "a100-40"))
        # serving: 4-GPU A100-80 batches in us-central1.
        for t in range(900, span, 45 * 60):
            rows.append((t + rng.randint(0, 600), "serving", rng.randint(30, 50) * 60,
                         "3600s", 3, "", "us-central1", "a100-80"))
        # eval: 4-GPU A100-40 batches in europe-west4.
        for t in range(1200, span, 90 * 60):
            rows.append((t + rng.randint(0, 900), "eval", rng.randint(40, 70) * 60,
                         "3600s", 3, "", "europe-west4", "a100-40"))
    if args.urgent:
        # oncall: urgent 6-GPU batches, about every 4 hours.
        for t in range(2 * 3600, span, 4 * 3600):
            rows.append((t + rng.randint(0, 3600), "oncall", rng.randint(30, 45) * 60,
                         "600s", 5, 10, "europe-west4", ""))
    if args.elastic or args.fixed:
        research = [i for i, r in enumerate(rows) if r[1] == "research"]
        for n, i in enumerate(research):
            if n % 2:
                continue
            r = list(rows[i])
            if args.elastic:
                r.append("6,2,0.4")
            else:
                r[4] = 6
                r.append(",2,0.4")
            rows[i] = tuple(r)
    rows.sort()
    out = sys.stdout
    if args.elastic or args.fixed:
        out.write(HEADER.rsplit(",", 1)[0] + ",max_executors,min_executors,peak_share\n")
        for r in rows:
            submit, project, run, timeout, executors, priority, region, _ = r[:8]
            tail = r[8] if len(r) > 8 else ",,"
            out.write(f"{submit},{project},{region},{run},{timeout},{executors},{priority},{tail}\n")
        return
    # The week trace keeps its seven columns; --mixed adds accelerator.
    out.write((HEADER if args.mixed else HEADER.rsplit(",", 1)[0]) + "\n")
    for r in rows:
        submit, project, run, timeout, executors, priority, region, accelerator = r
        line = f"{submit},{project},{region},{run},{timeout},{executors},{priority}"
        out.write(line + (f",{accelerator}" if args.mixed else "") + "\n")


if __name__ == "__main__":
    main()
