"""What each backend's import path loads: vLLM's worker imports the proposer module and, through
it, the chain D-cut (`rollout_graft.dcut.chains` over the numpy `dcut.core`) — never transformers,
the engine or the engine's D-cut (`dcut.trees` → `cost` → the model runner), and no vLLM until the
proposer is built. torch is loaded (`config` → `templates`, `selection` → `tree`): vLLM's worker
holds it anyway."""

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def loaded_after(statement: str, modules: tuple[str, ...]) -> list[str]:
    """Which of `modules` a fresh interpreter holds after running `statement`."""
    code = f"import sys\n{statement}\nprint([m for m in {modules!r} if m in sys.modules])"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-2000:]
    return eval(out.stdout.strip().splitlines()[-1])


def test_the_vllm_proposer_imports_neither_transformers_nor_the_engine_nor_vllm():
    heavy = ("transformers", "vllm", "rollout_graft.engine", "rollout_graft.runner", "rollout_graft.cost",
             "rollout_graft.dcut.trees")
    assert loaded_after("import rollout_graft.vllm.proposer", heavy) == []
    assert loaded_after("import rollout_graft.vllm.config, rollout_graft.dcut.chains", heavy) == []


def test_the_packages_exports_load_on_first_use():
    import rollout_graft

    assert loaded_after("import rollout_graft", ("torch", "transformers", "rollout_graft.config")) == []
    assert {"RolloutEngine", "EngineConfig", "calibrate"} <= set(dir(rollout_graft))
    assert loaded_after("from rollout_graft import RolloutEngine", ("transformers",)) == ["transformers"]
    with pytest.raises(AttributeError, match="no attribute 'nothing'"):
        rollout_graft.nothing  # noqa: B018
