"""Run HiGHS on an MPS file in a fresh interpreter (python highs_worker.py MODEL.mps START.json OUT.json).

OR-Tools and highspy each ship their own, different libhighs.so.1; a process can load
only one of them, and pipesched needs OR-Tools. So HiGHS runs here, in a process that
never imports OR-Tools, reading the model PuLP wrote and a MIP start, and writing the
status, the proven bound and the values back as JSON. Of pipesched it imports only
optimizer.lifeline (the standard library alone), to end with the solve that started it.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path


def main(model_path: str, start_path: str, out_path: str) -> None:
    with open(start_path) as handle:
        settings = json.load(handle)
    # Run as a script: the checkout (or the installed package's root) is not on the path.
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from optimizer.lifeline import end_with

    # Its folder is the solve's, which removes it: where the solve was killed outright,
    # the worker ends with it (HiGHS would run to its time limit) and removes it itself.
    end_with(settings["starter"], cleanup=lambda: shutil.rmtree(Path(out_path).parent, ignore_errors=True))
    import highspy

    highs = highspy.Highs()
    highs.setOptionValue("output_flag", False)
    highs.readModel(model_path)
    highs.setOptionValue("time_limit", float(settings["time_limit"]))
    highs.setOptionValue("threads", int(settings["threads"]))
    highs.setOptionValue("random_seed", int(settings["seed"]))
    names = list(highs.getLp().col_names_)
    start = settings["start"]
    if start and all(name in start for name in names):
        solution = highspy.HighsSolution()
        solution.col_value = [float(start[name]) for name in names]
        solution.value_valid = True
        highs.setSolution(solution)
    highs.run()
    info = highs.getInfo()
    status = highs.modelStatusToString(highs.getModelStatus())
    has_solution = info.primal_solution_status == 2  # kSolutionStatusFeasible
    values = dict(zip(names, highs.getSolution().col_value)) if has_solution else {}
    with open(out_path, "w") as handle:
        json.dump(
            {
                "status": status,
                "optimal": highs.getModelStatus() == highspy.HighsModelStatus.kOptimal,
                "has_solution": has_solution,
                "bound": info.mip_dual_bound,
                "values": values,
            },
            handle,
        )


if __name__ == "__main__":
    main(*sys.argv[1:4])
