"""Solver outcomes shared by every formulation: :class:`Status`, :class:`Solution`,
:class:`Formulation` and the HiGHS status mapping.

A formulation is four functions (``build -> solve -> certify -> export``, see
``DESIGN.md``). ``solve`` never raises for solver outcomes: it returns a :class:`Solution`
whose ``status`` says what happened, with the objective, a proven bound, named primal and
dual arrays, the wall time and the digest of the instance it was solved for.
"""
from __future__ import annotations

import enum
import math
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np


class Status(str, enum.Enum):
    """Outcome of a solve.

    ``OPTIMAL``: proven optimal (objective == bound within tolerance). ``FEASIBLE``: a
    feasible incumbent and a proven bound, not proven optimal (time limit). ``INFEASIBLE``:
    proven infeasible. ``UNBOUNDED``: objective unbounded. ``LIMIT``: a limit was hit
    before any incumbent was found (``bound`` may still hold). ``ERROR``: the solver failed.
    """

    OPTIMAL = "optimal"
    FEASIBLE = "feasible"
    INFEASIBLE = "infeasible"
    UNBOUNDED = "unbounded"
    LIMIT = "limit"
    ERROR = "error"

    def __str__(self) -> str:
        return self.value


class SolutionError(ValueError):
    """A solution used where it cannot be (unsolved, or solved for another instance)."""


@dataclass(frozen=True, eq=False)
class Solution:
    """What a formulation's ``solve`` returns.

    Attributes:
        formulation: formulation name (e.g. ``"schedule-ip"``).
        status: a :class:`Status`.
        objective: objective of the incumbent (NaN when there is none). Units are the
            formulation's (``objective_units``).
        bound: proven lower bound on the optimum of a minimization (NaN when none).
        wall_s: wall-clock seconds of build + solve.
        digest: ``Instance.digest()`` of the instance solved ("" for raw arrays).
        primal: named primal arrays, names as in ``models/`` (e.g. ``start_round``).
        dual: named dual arrays, one entry per named constraint family.
        message: human-readable detail (the offending request of an infeasible instance,
            the solver's own status string, ...).
        objective_units: unit of ``objective`` and ``bound`` (``"rounds"``, ``"s"``,
            ``"request-s/s"``).
        info: other scalars (node count, gap, model sizes).
    """

    formulation: str
    status: Status
    objective: float = math.nan
    bound: float = math.nan
    wall_s: float = 0.0
    digest: str = ""
    primal: dict[str, np.ndarray] = field(default_factory=dict)
    dual: dict[str, np.ndarray] = field(default_factory=dict)
    message: str = ""
    objective_units: str = ""
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def solved(self) -> bool:
        """True when there is a usable incumbent (OPTIMAL or FEASIBLE)."""
        return self.status in (Status.OPTIMAL, Status.FEASIBLE)

    @property
    def gap(self) -> float:
        """Relative gap ``(objective - bound) / max(|objective|, 1e-9)`` (NaN if either is)."""
        if not (math.isfinite(self.objective) and math.isfinite(self.bound)):
            return math.nan
        return max(0.0, self.objective - self.bound) / max(abs(self.objective), 1e-9)

    def require_solved(self, digest: str | None = None) -> None:
        """Raise :class:`SolutionError` unless solved (and, if given, for ``digest``)."""
        if not self.solved:
            raise SolutionError(f"{self.formulation}: cannot export a solution with status "
                                f"{self.status.value} ({self.message or 'no incumbent'})")
        if digest is not None and self.digest and digest != self.digest:
            raise SolutionError(f"{self.formulation}: solution was solved for instance "
                                f"{self.digest[:12]}, not {digest[:12]}")

    def summary(self) -> dict[str, Any]:
        """A flat JSON-friendly dict: formulation, status, objective, bound, gap, wall_s."""
        return {"formulation": self.formulation, "status": self.status.value,
                "objective": self.objective, "bound": self.bound, "gap": self.gap,
                "wall_s": self.wall_s, "objective_units": self.objective_units,
                "digest": self.digest, "message": self.message, **self.info}


@dataclass(frozen=True)
class Formulation:
    """A named formulation: ``build(instance, **options) -> model``,
    ``solve(model, time_limit_s=None) -> Solution``, ``certify(model, solution) -> dict``
    of residuals, ``export(solution, instance) -> policy role`` (``None`` if the
    formulation exports nothing, e.g. a pure bound).

    ``limit(name, instance, options, exc, wall_s) -> Solution``, when given, is the
    answer of ``lp.solve`` when the time limit runs out inside ``build``
    (:class:`~lpserve.opt.budget.TimeLimitReached` ``exc`` carries what the build had
    found): the best incumbent and bound known without the solver. Without it such a
    call returns ``LIMIT`` with no bound."""

    name: str
    build: Callable[..., Any]
    solve: Callable[..., Solution]
    certify: Callable[[Any, Solution], dict[str, float]]
    export: Callable[[Solution, Any], Any] | None = None
    is_bound: bool = False
    limit: Callable[..., Solution] | None = None


@dataclass(frozen=True, eq=False)
class HighsRun:
    """What a HiGHS run gave back.

    Attributes:
        model_status: HiGHS's model status name (e.g. ``"kOptimal"``, ``"kTimeLimit"``),
            ``"killed"`` when the child was stopped at the deadline.
        message: HiGHS's own status string, or why the run was stopped.
        has_solution: a primal feasible point exists.
        objective: its objective (NaN without one).
        mip_dual_bound: HiGHS's MIP dual bound (NaN when none or not a MIP).
        col_value: primal values, shape (n_col,), or None.
        row_dual: row duals, shape (n_row,), or None.
        mip_nodes: branch-and-bound nodes.
        killed: the run was stopped at the deadline, so nothing else is known.
        in_process: it ran in this process (False: in a child).
    """

    model_status: str
    message: str
    has_solution: bool = False
    objective: float = math.nan
    mip_dual_bound: float = math.nan
    col_value: np.ndarray | None = None
    row_dual: np.ndarray | None = None
    mip_nodes: int = 0
    killed: bool = False
    in_process: bool = True
    info: dict[str, Any] = field(default_factory=dict)


def highs_run_of(h: Any, *, in_process: bool = True) -> HighsRun:
    """The :class:`HighsRun` of a solved ``highspy.Highs`` object."""
    import highspy

    ms = h.getModelStatus()
    info = h.getInfo()
    has_sol = info.primal_solution_status == 2  # kSolutionStatusFeasible
    sol = h.getSolution()
    names = {v: k for k, v in highspy.HighsModelStatus.__members__.items()}
    bound = float(info.mip_dual_bound)
    return HighsRun(
        model_status=names.get(ms, str(ms)), message=h.modelStatusToString(ms),
        has_solution=bool(has_sol),
        objective=float(info.objective_function_value) if has_sol else math.nan,
        mip_dual_bound=bound if math.isfinite(bound) and abs(bound) < 1e30 else math.nan,
        col_value=np.asarray(sol.col_value, np.float64) if has_sol else None,
        row_dual=np.asarray(sol.row_dual, np.float64) if sol.dual_valid else None,
        mip_nodes=int(info.mip_node_count), in_process=in_process)


def highs_status(h: Any, *, has_integers: bool) -> tuple[Status, float, float, str]:
    """Map a solved ``highspy.Highs`` object, or the
    :class:`HighsRun` of one, to (status, objective, bound, message).

    ``bound`` is HiGHS's MIP dual bound for integer models and the objective for an
    optimal LP (NaN otherwise). A run killed at its deadline is ``LIMIT`` with neither.
    """
    run = h if isinstance(h, HighsRun) else highs_run_of(h)
    ms, text = run.model_status, run.message
    if run.killed:
        return Status.LIMIT, math.nan, math.nan, text
    obj = run.objective if run.has_solution else math.nan
    if has_integers:
        bound = run.mip_dual_bound
    else:
        bound = obj if ms == "kOptimal" else math.nan
    if ms == "kOptimal":
        return Status.OPTIMAL, obj, bound if math.isfinite(bound) else obj, text
    if ms == "kInfeasible":
        return Status.INFEASIBLE, math.nan, math.nan, text
    if ms in ("kUnbounded", "kUnboundedOrInfeasible"):
        return Status.UNBOUNDED, math.nan, math.nan, text
    if ms in ("kTimeLimit", "kIterationLimit", "kSolutionLimit", "kObjectiveBound",
              "kObjectiveTarget", "kInterrupt"):
        return (Status.FEASIBLE if run.has_solution else Status.LIMIT), obj, bound, text
    return Status.ERROR, obj, bound, text


def highs_model(*, col_cost: np.ndarray, col_lower: np.ndarray, col_upper: np.ndarray,
                row_lower: np.ndarray, row_upper: np.ndarray, a_start: np.ndarray,
                a_index: np.ndarray, a_value: np.ndarray, integer: Any = False,
                time_limit_s: float | None = None, seed: int = 0,
                options: dict[str, Any] | None = None) -> Any:
    """A silent ``highspy.Highs`` holding the column-wise (CSC) model
    ``min c'x  s.t.  row_lower <= A x <= row_upper,  col_lower <= x <= col_upper``
    (all integer when ``integer`` is True; a bool array (n_col,) marks the integer
    columns). Arrays: ``col_*`` shape (n_col,), ``row_*`` (n_row,),
    ``a_start`` (n_col + 1,), ``a_index``/``a_value`` (nnz,)."""
    import highspy

    lp = highspy.HighsLp()
    lp.num_col_ = int(col_cost.size)
    lp.num_row_ = int(row_lower.size)
    lp.col_cost_ = np.ascontiguousarray(col_cost, dtype=np.float64)
    lp.col_lower_ = np.ascontiguousarray(col_lower, dtype=np.float64)
    lp.col_upper_ = np.ascontiguousarray(col_upper, dtype=np.float64)
    lp.row_lower_ = np.ascontiguousarray(row_lower, dtype=np.float64)
    lp.row_upper_ = np.ascontiguousarray(row_upper, dtype=np.float64)
    lp.a_matrix_.format_ = highspy.MatrixFormat.kColwise
    lp.a_matrix_.start_ = np.ascontiguousarray(a_start, dtype=np.int32)
    lp.a_matrix_.index_ = np.ascontiguousarray(a_index, dtype=np.int32)
    lp.a_matrix_.value_ = np.ascontiguousarray(a_value, dtype=np.float64)
    if isinstance(integer, np.ndarray):
        if integer.shape != (lp.num_col_,):
            raise ValueError(f"integer must be a bool or a ({lp.num_col_},) bool array, got "
                             f"shape {integer.shape}")
        V = highspy.HighsVarType
        lp.integrality_ = [V.kInteger if b else V.kContinuous for b in integer.tolist()]
    elif integer:
        lp.integrality_ = [highspy.HighsVarType.kInteger] * lp.num_col_
    h = new_highs()
    h.setOptionValue("random_seed", int(seed))
    if time_limit_s is not None:
        if not time_limit_s > 0:
            raise ValueError(f"time_limit_s must be > 0 or None, got {time_limit_s!r}")
        h.setOptionValue("time_limit", float(time_limit_s))
    for k, v in (options or {}).items():
        h.setOptionValue(k, v)
    h.passModel(lp)
    return h


def new_highs() -> Any:
    """A ``highspy.Highs`` with all output off. HiGHS prints a banner on stdout from C++
    when the first instance is created; it is sent to /dev/null so ``--json`` output stays
    one object."""
    import os
    import sys

    import highspy

    try:
        sys.stdout.flush()
        fd = os.dup(1)
    except (OSError, ValueError):
        h = highspy.Highs()
    else:
        try:
            with open(os.devnull, "w") as null:
                os.dup2(null.fileno(), 1)
                h = highspy.Highs()
        finally:
            os.dup2(fd, 1)
            os.close(fd)
    h.setOptionValue("output_flag", False)
    return h
