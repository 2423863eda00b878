#!/usr/bin/env python
"""TRL's own GRPOTrainer test file, run offline against GRPOTrainer and GraftGRPOTrainer.

    python lab/trl_grpo_tests.py --trl PATH_TO_TRL [--json docs/bench/trl_grpo_tests.json] [-- PYTEST_ARGS]

PATH_TO_TRL is a TRL checkout (a work tree with `tests/`) or a git directory of one (e.g. a
mirror: its HEAD's files are read with `git show`); TRL's wheel ships no tests, and their code
is never copied into this repo. Its `tests/{__init__,conftest,testing_utils,testing_constants,
test_grpo_trainer}.py` are copied into a scratch directory as the package `trl_tests` and run
by pytest with `rollout_graft_tools/trl_grpo_plugin.py`: each test once per class, Hub ids mapped to local
stand-ins (`rollout_graft_tools/trl_standins.py`: the embedded tiny-math target, random tiny models of the
other architectures, the tiny-math prompts as `zen`), `HF_HUB_OFFLINE=1`. Tests whose Hub ids
have no stand-in (vision models, remote code) fail with both classes and are counted apart.

The JSON table: per test, each class's result (passed / failed / skipped / xfail, and for
GraftGRPOTrainer "refused": a ValueError/TypeError raised by our trainer, with its message).
`python scripts/report.py` renders it into docs/RESULTS.md. Extra pytest arguments after `--`
(e.g. `-- -k loss_types`) run a subset; the JSON is written only for full runs unless --json is given.
Takes tens of minutes on 2 CPU cores; needs the lab extra (`pip install -e ".[test,lab-trl]"`: peft, jmespath).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

FILES = ("__init__.py", "conftest.py", "testing_utils.py", "testing_constants.py", "test_grpo_trainer.py")
DEFAULT_JSON = REPO / "docs" / "bench" / "trl_grpo_tests.json"
HUB_CACHE = Path(os.environ.get("ROLLOUT_GRAFT_CACHE", Path.home() / ".cache" / "rollout_graft")) / "trl_standins" / "hub"


def copy_tests(trl: Path, out: Path) -> str:
    """Copy TRL's test files into `out`; returns a description of the source (commit)."""
    out.mkdir(parents=True, exist_ok=True)
    if (trl / "tests" / "test_grpo_trainer.py").is_file():
        for name in FILES:
            src = trl / "tests" / name
            (out / name).write_text(src.read_text() if src.is_file() else "")
        rev = subprocess.run(["git", "-C", str(trl), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
        return rev or str(trl)
    git = ["git", f"--git-dir={trl}"]
    rev = subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True)
    if rev.returncode:
        raise SystemExit(f"{trl} is neither a TRL checkout with tests/test_grpo_trainer.py nor a git directory of one")
    for name in FILES:
        text = subprocess.run([*git, "show", f"HEAD:tests/{name}"], capture_output=True, text=True)
        (out / name).write_text(text.stdout if text.returncode == 0 else "")
    return rev.stdout.strip()


def run_pytest(work: Path, results: Path, pytest_args: list[str], **kwargs) -> subprocess.CompletedProcess:
    from rollout_graft_tools.trl_standins import build_hub_cache

    hub = build_hub_cache(HUB_CACHE)
    (work / "pytest.ini").write_text("[pytest]\naddopts = -p no:cacheprovider\n")
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
               HF_HUB_CACHE=str(hub), GRAFT_TRL_RESULTS=str(results), TOKENIZERS_PARALLELISM="false",
               PYTHONPATH=os.pathsep.join([str(REPO), str(work)]), WANDB_DISABLED="true")
    cmd = [sys.executable, "-m", "pytest", str(work / "trl_tests" / "test_grpo_trainer.py"), "-p", "rollout_graft_tools.trl_grpo_plugin",
           "-q", "-rN", "--tb=line", "-c", str(work / "pytest.ini"), "--rootdir", str(work), *pytest_args]
    return subprocess.run(cmd, env=env, cwd=work, **kwargs)


def collected(work: Path, pytest_args: list[str]) -> list[str]:
    """The tests the run covers (names as in the table), from pytest's collection."""
    from rollout_graft_tools.trl_grpo_plugin import _test_name

    out = run_pytest(work, work / "collect.jsonl", ["--collect-only", *pytest_args], capture_output=True, text=True).stdout
    ids = [line.strip() for line in out.splitlines() if "::" in line]
    return sorted({_test_name(i, "GraftGRPOTrainer" if "GraftGRPOTrainer" in i else "GRPOTrainer") for i in ids})


def table(results: list[Path]) -> list[dict]:
    """One row per test from the plugin's JSON lines; a later file's result for a (test, class) replaces
    an earlier one (a rerun subset updates a full run)."""
    rows: dict[str, dict] = {}
    for line in (line for path in results for line in path.read_text().splitlines()):
        r = json.loads(line)
        row = rows.setdefault(r["test"], {"test": r["test"]})
        row[r["class"]] = r["result"]
        row.pop(f"{r['class']}_message", None)
        if r["message"] and r["result"] != "passed":
            row[f"{r['class']}_message"] = r["message"]
    return sorted(rows.values(), key=lambda r: r["test"])


def summarise(rows: list[dict]) -> dict:
    counts = {cls: dict(Counter(r.get(cls, "missing") for r in rows)) for cls in ("GRPOTrainer", "GraftGRPOTrainer")}
    trl_pass = [r for r in rows if r.get("GRPOTrainer") == "passed"]
    gaps = [r["test"] for r in trl_pass if r.get("GraftGRPOTrainer") not in ("passed", "refused")]
    return {"counts": counts, "passes_with_GRPOTrainer": len(trl_pass),
            "of_those_passes_with_GraftGRPOTrainer": sum(r.get("GraftGRPOTrainer") == "passed" for r in trl_pass),
            "of_those_refused": sum(r.get("GraftGRPOTrainer") == "refused" for r in trl_pass),
            "of_those_failing": gaps}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trl", type=Path, required=True, help="a TRL checkout or git directory (tests/ are read there)")
    parser.add_argument("--json", type=Path, default=None, help=f"table to write (default {DEFAULT_JSON} for a full run)")
    parser.add_argument("--work", type=Path, default=None, help="scratch directory (default: a temporary one)")
    parser.add_argument("--results", type=Path, nargs="*", default=[],
                        help="earlier runs' results.jsonl: this run's results replace theirs test by test")
    parser.add_argument("--no-run", action="store_true", help="only build the table from --results")
    args, pytest_args = parser.parse_known_args()
    pytest_args = [a for a in pytest_args if a != "--"]
    out = args.json or (DEFAULT_JSON if not pytest_args else None)
    with tempfile.TemporaryDirectory(prefix="trl_grpo_tests_") as tmp:
        work = args.work or Path(tmp)
        source = copy_tests(args.trl.resolve(), work / "trl_tests")
        if args.work is not None and not args.no_run:  # keep the previous run's lines for --results
            old = work / "results.jsonl"
            if old.is_file():
                old.rename(work / "results.previous.jsonl")
        results = work / "results.jsonl"
        results.unlink(missing_ok=True)
        rc = 0 if args.no_run else run_pytest(work, results, pytest_args).returncode
        rows = table([*args.results, *([results] if results.is_file() else [])])
        rows = [r for r in rows if "GRPOTrainer" in r and "GraftGRPOTrainer" in r]  # both classes ran
        names = {r["test"] for r in rows}
        not_run = [t for t in collected(work, pytest_args) if t not in names]
    import torch
    import transformers
    import trl

    subset = " ".join(["--", *pytest_args]) if pytest_args else ""
    report = {"command": f"python lab/trl_grpo_tests.py --trl TRL_CHECKOUT {subset}".strip(),
              "trl_tests_commit": source, "trl": trl.__version__, "transformers": transformers.__version__,
              "torch": torch.__version__, "argv": sys.argv[1:],
              "merged": [str(p) for p in args.results],  # earlier runs' results this table started from
              **summarise(rows), "not_run": not_run, "tests": rows}
    print(json.dumps({k: v for k, v in report.items() if k != "tests"}, indent=1))
    if out is not None:
        out.write_text(json.dumps(report, indent=1) + "\n")
        print(f"wrote {out}")
    sys.exit(0 if rows else rc)


if __name__ == "__main__":
    main()
