"""pytest plugin for `lab/trl_grpo_tests.py`: runs each of TRL's GRPO tests once per trainer class.

Loaded with `-p rollout_graft_tools.trl_grpo_plugin`. Every test of the fetched `test_grpo_trainer.py` is
parametrised by `grpo_trainer_class` ("GRPOTrainer" / "GraftGRPOTrainer"): the test module's
`GRPOTrainer` name is rebound to our class for the second run, so `GRPOTrainer(...)` in the test
body builds a `GraftGRPOTrainer`. `load_dataset("trl-internal-testing/zen", ...)` reads the
local stand-in (models resolve through the stand-in hub cache, `rollout_graft_tools/trl_standins.py`). Each
outcome is appended as one JSON line to `$GRAFT_TRL_RESULTS`: a failure whose innermost frame
is in our `trainers/` package and is a ValueError/TypeError counts as a refusal, with its message.
"""

from __future__ import annotations

import importlib.util
import json
import os
import traceback
from pathlib import Path

import pytest

CLASSES = ("GRPOTrainer", "GraftGRPOTrainer")
_OURS = str(Path(importlib.util.find_spec("trainers").origin).parent)  # where our refusals are raised


def _shim_trl_import_utils() -> None:
    """TRL's testing_utils (newer than trl 1.16) imports availability checks 1.16 lacks: all False."""
    import trl.import_utils as utils

    for name in ("is_harbor_available", "is_openreward_available", "is_joblib_available", "is_math_verify_available",
                 "is_mergekit_available", "is_jmespath_available", "is_liger_kernel_available", "is_vllm_available"):
        if not hasattr(utils, name):
            setattr(utils, name, lambda: False)


_shim_trl_import_utils()


def pytest_generate_tests(metafunc):
    if "grpo_trainer_class" in metafunc.fixturenames:
        metafunc.parametrize("grpo_trainer_class", CLASSES, indirect=True)


@pytest.fixture(autouse=True)
def grpo_trainer_class(request, monkeypatch):
    from rollout_graft_tools.trl_standins import zen_dataset

    module = request.module
    if hasattr(module, "load_dataset"):
        original = module.load_dataset

        def load_dataset(path, name=None, *args, **kwargs):
            if isinstance(path, str) and path.startswith("trl-internal-testing/"):
                return zen_dataset(path, name, kwargs.get("split"), kwargs.get("streaming", False))
            return original(path, name, *args, **kwargs)

        monkeypatch.setattr(module, "load_dataset", load_dataset)
    if request.param == "GraftGRPOTrainer" and hasattr(module, "GRPOTrainer"):
        from trainers import GraftGRPOTrainer

        monkeypatch.setattr(module, "GRPOTrainer", GraftGRPOTrainer)
    return request.param


def _refusal(excinfo) -> str | None:
    """The message of a ValueError/TypeError raised by our trainers package, else None."""
    if excinfo is None or not excinfo.errisinstance((ValueError, TypeError)):
        return None
    frames = traceback.extract_tb(excinfo.tb)
    if frames and frames[-1].filename.startswith(_OURS):
        return str(excinfo.value)
    return None


def _test_name(nodeid: str, cls: str) -> str:
    """`Class::test[params]` without the trainer class's parameter id."""
    name = nodeid.split("::", 1)[1]
    return name.replace(f"[{cls}]", "").replace(f"[{cls}-", "[").replace(f"-{cls}]", "]").replace(f"-{cls}-", "-")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    path = os.environ.get("GRAFT_TRL_RESULTS")
    if not path or not hasattr(item, "callspec") or "grpo_trainer_class" not in item.callspec.params:
        return
    if not (report.when == "call" or (report.when == "setup" and report.outcome != "passed")):
        return
    cls = item.callspec.params["grpo_trainer_class"]
    test = _test_name(item.nodeid, cls)
    result, message = report.outcome, None
    if report.outcome == "skipped":
        message = str(report.longrepr[-1]) if isinstance(report.longrepr, tuple) else None
        if hasattr(report, "wasxfail"):
            result, message = "xfail", report.wasxfail
    elif report.outcome == "failed":
        refusal = _refusal(call.excinfo)
        result = "refused" if refusal else "failed"
        message = refusal or (call.excinfo.exconly()[:400] if call.excinfo else str(report.longrepr)[-400:])
    elif hasattr(report, "wasxfail"):
        result = "xpass"
    with open(path, "a") as fh:
        fh.write(json.dumps({"test": test, "class": cls, "result": result, "message": message}) + "\n")
