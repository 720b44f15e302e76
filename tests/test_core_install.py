"""The core install (pyproject.toml's dependencies, no extra) runs `cliplab sim` to its ranking and `cliplab --help`;
every command that needs an extra says which, in one line, before it starts."""
import sys
import tomllib
from importlib import metadata

import pytest
import typer
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from typer.testing import CliRunner

from harness.cli import NEEDS, app
from spec.extras import MODULES, require
from test_install_into_framework import ROOT, lock_wheels, pip, run, source_copy

WHEELS = ROOT / ".cache" / "wheels" / "core"
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
#: Arguments that get each command past its option parsing (train's --config must exist).
ARGS = {"verify": [], "conform": ["grpo"], "train": ["--config", "{tmp}/c.yaml"], "report": ["{tmp}"],
        "demo": ["--out", "{tmp}/demo"]}


def message(command: str) -> str:
    extra = NEEDS[command]
    return (f"error: cliplab {command} needs the {extra} extra: pip install 'cliplab[{extra}]' "
            f"(not installed: {MODULES[extra][0]})")


@pytest.mark.parametrize("command", sorted(NEEDS))
def test_a_command_without_its_extra_names_it_in_one_line_before_it_starts(command, tmp_path, monkeypatch):
    (tmp_path / "c.yaml").write_text("run: {}\n")
    monkeypatch.setitem(sys.modules, MODULES[NEEDS[command]][0], None)  # as if not installed: `import` fails too
    result = CliRunner().invoke(app, [command, *(a.format(tmp=tmp_path) for a in ARGS[command])])
    assert result.exit_code == 2 and result.stderr == message(command) + "\n", result.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.yaml"]  # nothing written
    assert CliRunner().invoke(app, [command, "--help"]).exit_code == 0  # help needs no extra


def test_every_command_needing_an_extra_exists_and_the_extras_are_pyprojects():
    assert set(NEEDS) <= set(typer.main.get_command(app).commands) and "sim" not in NEEDS
    extras = PYPROJECT["project"]["optional-dependencies"]

    def distributions(extra):
        names = set()
        for r in map(Requirement, extras[extra]):
            names |= set().union(*map(distributions, r.extras)) if r.name == "cliplab" else {canonicalize_name(r.name)}
        return names
    providers = metadata.packages_distributions()  # this environment has every extra
    for extra, modules in MODULES.items():
        assert {canonicalize_name(d) for m in modules for d in providers[m]} == distributions(extra), extra


def test_a_report_plot_without_matplotlib_names_the_reports_extra(monkeypatch):
    from harness.reports.rundirs import Groups
    from harness.reports.sim import plot_curves
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    runs = [{"label": "grpo", "algo": "grpo", "params": {}, "records": [{"step": 0, "accuracy_exact": 0.5}]}]
    with pytest.raises(ValueError, match=r"^plotting needs the reports extra: pip install 'cliplab\[reports\]' "
                                         r"\(not installed: matplotlib\)$"):
        plot_curves(Groups(runs), ["grpo"], ROOT / "never.png")
    require("torch", "this test")  # the real environment has the extras: no error


@pytest.mark.parametrize("name", ["torch_policy_loss", "conform", "assert_conforms", "Batch"])
def test_an_api_name_without_its_extra_names_it(name, monkeypatch):
    import cliplab
    monkeypatch.setitem(sys.modules, "torch", None)
    monkeypatch.delitem(vars(cliplab), name, raising=False)  # not yet loaded, as in a fresh process
    with pytest.raises(ImportError, match=rf"^cliplab\.{name} needs the torch extra: pip install 'cliplab\[torch\]' "
                                          r"\(not installed: torch\)$"):
        getattr(cliplab, name)


def core_pins() -> list[str]:
    """pyproject.toml's dependencies and theirs (from the installed packages' metadata; extras and other platforms
    left out) at requirements.lock's pins, and setuptools to build cliplab."""
    lock = {canonicalize_name(line.split("==")[0]): line for line in (ROOT / "requirements.lock").read_text().split()
            if "==" in line}
    todo, names = [*PYPROJECT["project"]["dependencies"], "setuptools"], set()
    while todo:
        req = Requirement(todo.pop())
        if req.marker is None or req.marker.evaluate({"extra": ""}):
            if canonicalize_name(req.name) not in names:
                names.add(canonicalize_name(req.name))
                todo += metadata.requires(req.name) or []
    assert names <= set(lock), f"not in requirements.lock: {names - set(lock)}"
    return sorted(lock[n] for n in names)


def test_the_core_install_runs_sim_to_its_ranking_and_names_the_extras_it_lacks(tmp_path):
    env = tmp_path / "env"
    run(sys.executable, "-m", "venv", "--without-pip", env)
    python, cliplab = env / "bin" / "python", env / "bin" / "cliplab"
    (tmp_path / "core.txt").write_text("\n".join(core_pins()) + "\n")
    lock_wheels(python, tmp_path / "core.txt", WHEELS)
    pip(python, "install", "-q", "--no-deps", "--no-build-isolation", "--no-index", source_copy(tmp_path / "src"))
    absent = run(python, "-c", "import importlib.util as u; print([m for m in ('torch', 'pandas', 'matplotlib') "
                               "if u.find_spec(m)])")
    assert absent.stdout.strip() == "[]"  # nothing of the project's environment is seen

    assert "sim" in run(cliplab, "--help", cwd=tmp_path).stdout
    sweep = tmp_path / "sweep"
    done = run(cliplab, "sim", "--steps", "5", "--seeds", "4", "--algos", "grpo,dapo", "--workers", "1", "--out",
               sweep, cwd=tmp_path)
    ranking, table = done.stdout.split("summary at the end of each run")  # the ranking first
    assert ranking.startswith("ranking at equal generation budget")
    assert [line.split()[0] for line in table.strip().splitlines()[1:4]] == ["label", "grpo", "dapo"]
    lines = ranking.splitlines()
    head = next(i for i, line in enumerate(lines) if line.startswith("rank "))
    assert sorted(line.split()[2] for line in lines[head + 1:head + 3]) == ["dapo", "grpo"]
    assert done.stderr.splitlines()[-1] == (f"note: the plots and claims of `cliplab report {sweep}` need the "
                                            "reports extra: pip install 'cliplab[reports]'")
    for command, extra, lacking in (("verify", "torch", "torch"), ("report", "reports", "pandas, matplotlib")):
        refused = run(cliplab, command, *([sweep] if command == "report" else []), cwd=tmp_path, check=False)
        assert refused.returncode == 2 and refused.stderr == (
            f"error: cliplab {command} needs the {extra} extra: pip install 'cliplab[{extra}]' "
            f"(not installed: {lacking})\n"), refused.stderr
