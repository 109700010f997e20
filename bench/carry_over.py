"""Keep rows and planning times of a recorded simulate JSON in a re-run of the same setting.

    python bench/carry_over.py RECORDED.json RERUN.json --rows flexsp --why "..." [--plan-ms "..."]

--rows: planners not re-run (flexsp's MILPs take minutes per setting); their recorded row goes
into RERUN with `vs_lower_bound` re-taken as its mean step over RERUN's mean bound and a
`carried_over` note. --plan-ms: every planner's plan_ms and plan_ms_max come from RECORDED
(a re-run on a busier or slower machine times planning apart from the code), noted in
`plan_ms_carried_over`. RERUN is rewritten in place.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("recorded", type=Path)
    parser.add_argument("rerun", type=Path)
    parser.add_argument("--rows", default="", help="comma-separated planners whose recorded rows are kept")
    parser.add_argument("--why", default="", help="the carried rows' note")
    parser.add_argument("--plan-ms", default=None, help="keep every recorded planning time, with this note")
    args = parser.parse_args()
    recorded, rerun = json.loads(args.recorded.read_text()), json.loads(args.rerun.read_text())
    old, new = recorded["setting"], rerun["setting"]
    if any(old[key] != new[key] for key in old.keys() & new.keys()):
        raise SystemExit(f"{args.recorded} and {args.rerun} record different settings")
    for name in filter(None, args.rows.split(",")):
        row = dict(recorded["planners"][name])
        row["vs_lower_bound"] = row["step_time_s"] / rerun["lower_bound_s"]
        row["carried_over"] = args.why
        rerun["planners"][name] = row
    if args.plan_ms is not None:
        for name, row in rerun["planners"].items():
            if name in recorded["planners"] and "carried_over" not in row:
                row["plan_ms"] = recorded["planners"][name]["plan_ms"]
                row["plan_ms_max"] = recorded["planners"][name]["plan_ms_max"]
        rerun["plan_ms_carried_over"] = args.plan_ms
    args.rerun.write_text(json.dumps(rerun, indent=2))


if __name__ == "__main__":
    main()
