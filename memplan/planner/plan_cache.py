"""Plans kept on disk, keyed by the graph's structure and what it was planned for.

A second process that compiles the same model with the same budget and options gets the
plan the first made: its decisions are applied again (planner/plan.py's `reuse`), so the
solver does not run, and the profile cache (profile_cache.py) answers every node's cost,
so nothing is measured. The key holds the graph's fingerprint (names, ops, edges, bytes),
the costs the solver was given (node times and workspaces, as the profile and the pricing
under Inductor made them, so that a memplan that prices a node differently plans again),
the budget as asked, what earlier graphs of the step hold, the options that shape a plan
and the device. A missing or unreadable entry is a miss: the cache is only a shortcut.
A plan whose solve ran to its time limit is not kept: how far a search cut off by the
clock got depends on how busy the machine was (planner/plan.py).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json

import torch

from memplan.core import config
from memplan.core.budget import Budget
from memplan.core.errors import PlanFileError
from memplan.core.graph import Graph
from memplan.planner.options import PlanOptions
from memplan.planner.plan_file import Plan
from memplan.planner.profile_cache import device_name

# Its version goes up when the solvers plan differently for the same key, so that a plan
# kept by an older memplan is made again (v2: recompute chains read what kept views pin;
# v3: the solver's costs are in the key, and greedy prices releasing a view that pins its
# owner with the owner's chain; v4: a solve that ran to its time limit is no longer kept,
# so the plans v3 kept from such solves are dropped; v5: greedy keeps again, within the
# budget, what its descents released needlessly; v6: a transfer's host calls are priced,
# Graph.transfer_seconds, and are in the key; v7: greedy recomputes, where the budget has
# room, what costs nothing to recompute; v8: greedy also descends from the director's least
# state where its own descents miss the budget; v9: the torch.compile path keeps the plan its
# rounds chose, with its peaks as Inductor compiles it, keyed by all the step holds).
PLAN_DIR = "plans-v9"
# Options that change how a plan is shown, not what it is.
_NOT_IN_KEY = ("progress",)


def plan_key(
    fingerprint: str,
    graph: Graph,
    budget: Budget,
    held: int,
    options: PlanOptions,
    device: torch.device,
    extra: object = None,
) -> str:
    """What a plan was made for, as a hex digest: `graph` is the one the solver is given;
    `extra` is whatever else shaped it (the Inductor settings the torch.compile path
    compiled it under)."""
    shaping = {k: v for k, v in dataclasses.asdict(options).items() if k not in _NOT_IN_KEY}
    costs = [(n.time, n.workspace) for n in graph.nodes]
    text = json.dumps(
        [
            fingerprint,
            costs,
            graph.transfer_seconds,
            str(budget),
            held,
            shaping,
            device.type,
            device_name(device),
            extra,
        ],
        sort_keys=True,
        default=str,
    )
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def cached_plan(key: str) -> Plan | None:
    """The plan stored under `key`, if a readable one is."""
    path = config.cache_dir() / PLAN_DIR / f"{key}.json"
    if not path.exists():
        return None
    try:
        return Plan.load(path)
    except PlanFileError:
        return None


def store_plan(key: str, plan: Plan) -> None:
    """Keep `plan` under `key` (written atomically)."""
    folder = config.cache_dir() / PLAN_DIR
    folder.mkdir(parents=True, exist_ok=True)
    plan.save(folder / f"{key}.json")
