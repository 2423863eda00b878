"""The product apart from the lab: scripts/ holds what a user runs, lab/ the maintainers' instruments;
both import the installed package, never each other, and never touch sys.path."""

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
USER_SCRIPTS = {"bench.py", "device_bench.py", "device_bench.sh", "plot_training.py", "prepare_models.py", "report.py",
                "warm_prior.py"}


def _python_files():
    return sorted([*(REPO / "scripts").glob("*.py"), *(REPO / "lab").glob("*.py")])


def test_scripts_holds_what_a_user_runs():
    assert {p.name for p in (REPO / "scripts").iterdir() if p.is_file()} == USER_SCRIPTS


def test_no_sys_path_and_no_imports_between_scripts():
    siblings = {p.stem for p in _python_files()}
    for path in _python_files():
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and node.attr == "path" and getattr(node.value, "id", None) == "sys":
                raise AssertionError(f"{path.relative_to(REPO)}:{node.lineno} touches sys.path")
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            for name in names:
                assert name.split(".")[0] not in siblings, f"{path.relative_to(REPO)} imports the script {name}"


def test_readme_and_results_fit_a_newcomer_and_hold_no_history():
    """README: a newcomer's page (≤ 250 lines); README and RESULTS: current facts, no commit hashes,
    issue numbers or "before/after" history (git keeps it)."""
    import re

    readme = (REPO / "README.md").read_text()
    assert len(readme.splitlines()) <= 250
    for path in (REPO / "README.md", REPO / "docs" / "RESULTS.md"):
        text = path.read_text()
        assert not re.search(r"\b[0-9a-f]{7,40}\b", text.replace("0x", "")), f"{path.name} names a commit"
        assert not re.search(r"\b[Ii]ssue \d+|#\d{2,}\b", text), f"{path.name} names an issue"
