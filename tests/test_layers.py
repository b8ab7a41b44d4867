"""The layers keep pointing one way (tests/import_contract.py), modules stay small, and the
commands that need no torch do not load it."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from import_contract import private_torch, read_imports, violations
from test_plan_file import hand_made_plan

import memplan

PACKAGE = Path(memplan.__file__).parent
REPO = PACKAGE.parent
MAX_LINES = 600


def test_the_import_contract_holds():
    modules, edges = read_imports(PACKAGE)
    assert "memplan.core.graph" in modules and len(edges) > 100  # the reader sees the real code
    assert violations(modules, edges) == []


def test_the_contract_fails_when_a_forbidden_import_is_added(tmp_path):
    copy = tmp_path / "memplan"
    shutil.copytree(PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__"))
    additions = {
        # core, but graph takes only errors
        "core/graph.py": "from memplan.core.budget import Budget\n",
        "solvers/greedy.py": "import torch\n",
        "core/simulate.py": "from memplan.solvers import get_solver\n",  # core stands on nothing
        # the planner stands below the torch.compile path
        "planner/solve.py": "from memplan.compile.backend import MemplanBackend\n",
        # passes -> planner, which imports the passes: a forbidden layer and a cycle
        "passes/rewrite.py": "def f():\n    from memplan.planner.plan import Partitioner\n",
        "compat.py": "from memplan.core.units import format_bytes\n",  # compat stands alone
    }
    for name, text in additions.items():
        path = copy / name
        path.write_text(path.read_text() + text)
    found = violations(*read_imports(copy))
    assert any(
        "memplan.core.graph:" in v and "imports memplan.core.budget" in v and "but errors" in v
        for v in found
    )
    assert any("memplan.solvers.greedy:" in v and "imports no torch" in v for v in found)
    assert any(
        "memplan.core.simulate:" in v and "the core layer may not import" in v for v in found
    )
    assert any(
        "memplan.passes.rewrite:" in v and "passes layer may not import the planner" in v
        for v in found
    )
    assert any(
        "memplan.planner.solve:" in v and "planner layer may not import the compile" in v
        for v in found
    )
    assert any("memplan.compat:" in v and "imports nothing of memplan" in v for v in found)
    cycle = next(v for v in found if v.startswith("import cycle"))
    assert "memplan.passes.rewrite" in cycle and "memplan.planner.plan" in cycle
    assert len(found) == 7, found


def test_only_compat_reads_private_torch_names(tmp_path):
    assert private_torch(PACKAGE) == []
    copy = tmp_path / "memplan"
    shutil.copytree(PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__"))
    additions = {
        "planner/lower.py": "from torch._guards import TracingContext\n",
        "passes/rewrite.py": "def f():\n    return torch._C._autograd\n",
        "tools/compare.py": "import torch.utils._pytree\n",
        # public: an operator's name, a dunder
        "planner/views.py": "X = (torch.ops.aten._unsafe_view.default, torch.__version__)\n",
    }
    for name, text in additions.items():
        path = copy / name
        path.write_text(path.read_text() + text)
    found = sorted(line.split(" ", 1)[1] for line in private_torch(copy))
    assert found == ["torch._C._autograd", "torch._guards.TracingContext", "torch.utils._pytree"]


def test_no_module_is_over_600_lines():
    long = {
        str(path.relative_to(REPO)): lines
        for path in PACKAGE.rglob("*.py")
        if (lines := len(path.read_text().splitlines())) > MAX_LINES
    }
    assert long == {}


def test_show_solve_and_solvers_run_without_torch(tmp_path):
    plan = tmp_path / "plan.json"
    hand_made_plan().save(plan)
    vgg = REPO / "benchmarks" / "graphs" / "checkmate_vgg16_b256_224x224_train.json"
    code = (
        "import sys\n"
        "from memplan.cli.main import main\n"
        f"assert main(['show', {str(plan)!r}]) == 0\n"
        f"assert main(['solve', {str(vgg)!r}, '--budget', '0.9', '--solver', 'director', "
        f"'-o', {str(tmp_path / 'schedule.json')!r}]) == 0\n"
        "assert main(['solvers']) == 0\n"
        "assert 'torch' not in sys.modules, 'torch was imported'\n"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
