"""Every example in README.md runs: its Python blocks and one-liners, its YAML, its commands and their flags."""
import importlib.util
import inspect
import re
import shlex
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from typer.testing import CliRunner

from harness.cli import app

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()
BLOCKS = re.findall(r"^```(\w+)\n(.*?)^```", README, flags=re.M | re.S)
INLINE = re.findall(r"`([^`\n]+)`", re.sub(r"^```.*?^```", "", README, flags=re.M | re.S))


def blocks(lang):
    return [body for tag, body in BLOCKS if tag == lang]


def inputs():
    """The small batch the API examples name: [B, T] = [4, 3], two groups of two (numpy and torch)."""
    rng = np.random.default_rng(0)
    old = -rng.exponential(1.0, (4, 3))
    ns = {"logp": old + 0.1 * rng.normal(size=(4, 3)), "old_logp": old, "adv": rng.normal(size=(4, 3)),
          "mask": np.array([[1, 1, 1], [1, 1, 0], [1, 0, 0], [1, 1, 1]], dtype=float)}
    ns.update({f"{k}_t": torch.tensor(ns[k], requires_grad=k == "logp") for k in ("logp", "adv", "mask")})
    ns["old_t"] = torch.tensor(old)
    return ns


@pytest.mark.parametrize("code", blocks("python"))
def test_python_blocks_run(code):
    ns = inputs()
    exec(compile(code, "README.md", "exec"), ns)
    assert "clip_frac" in ns["stats"] and bool(torch.isfinite(ns["loss"]))


def test_api_block_layers_agree():
    ns = inputs()
    for line in blocks("python")[0].splitlines():
        if line.startswith("import"):
            exec(line, ns)
    exact, exact_grad = ns["spec"].policy_loss("dcpo", ns["logp"], ns["old_logp"], ns["adv"], ns["mask"],
                                               group_size=4)
    loss, grad, _ = ns["sim"].policy_loss("dcpo", ns["logp"], ns["old_logp"], ns["adv"], ns["mask"], group_size=4)
    loss_t, _ = ns["gpu"].policy_loss("dcpo", ns["logp_t"], ns["old_t"], ns["adv_t"], ns["mask_t"], group_size=4)
    assert loss == pytest.approx(float(exact), abs=1e-12) == pytest.approx(float(loss_t), abs=1e-12)
    np.testing.assert_allclose(grad, exact_grad.astype(float), atol=1e-12)


def test_symbolic_objective_as_described():
    """The one-liner gives one sympy expression over lp_i_t, old_i_t, A_i_t, ref_i_t, and its symbols by name."""
    ns = {}
    exec(next(c for c in INLINE if "symbolic_objective(" in c), ns)
    expr, syms = ns["expr"], ns["syms"]
    assert {"lp_0_0", "old_1_2", "A_1_2", "ref_0_0"} <= {s.name for s in expr.free_symbols}  # grpo: beta > 0
    assert syms["lp"][1][2].name == "lp_1_2" and {"old", "A", "ref"} <= set(syms)


@pytest.mark.parametrize("cmd", [c for c in INLINE if c.startswith("python -c ")])
def test_python_one_liners(cmd, monkeypatch, capsys):
    code = shlex.split(cmd)[2]
    if "compare()" in code:  # times every target in its own process: too slow here; check the name exists
        monkeypatch.setattr("harness.runs.bench.compare", lambda: "compared")
    exec(code, {})
    assert capsys.readouterr().out.strip()


@pytest.mark.parametrize("module", sorted({m for c in INLINE for m in re.findall(r"python -m ([\w.]+)", c)}))
def test_python_modules_exist(module):
    assert importlib.util.find_spec(module) is not None


def test_yaml_block_is_the_shipped_config():
    """The YAML shown is configs/smollm2_grpo.yaml (every field shown has the file's value) and loads."""
    (block,) = blocks("yaml")
    path = ROOT / block.splitlines()[0].lstrip("# ").strip()
    shown, shipped = yaml.safe_load(block), yaml.safe_load(path.read_text())
    for section, fields in shown.items():
        assert {k: shipped[section][k] for k in fields} == fields
    from gpu.config import from_dict
    from_dict(shown)


def test_trl_plugin_as_described():
    from gpu.integrations.trl_plugin import CliplabGRPOTrainer
    assert "algorithm" in inspect.signature(CliplabGRPOTrainer.__init__).parameters


def commands():
    """Every `cliplab [GROUP ...] COMMAND ...` in the README's shell blocks and inline code, as (the command's words,
    its flags)."""
    import typer
    lines = [line for body in blocks("bash") for line in body.splitlines()] + INLINE
    found = []
    for line in lines:
        for m in re.finditer(r"cliplab ([^`#]*)", line):
            words, group = [], typer.main.get_command(app)
            for word in m.group(1).split():
                if word not in getattr(group, "commands", {}):
                    break
                words.append(word)
                group = group.commands[word]
            first = (m.group(1).split() or [""])[0]
            assert words or first.startswith("-"), f"README: `cliplab {first}` is no cliplab command"
            found.append((" ".join(words), tuple(sorted(set(re.findall(r"(--[\w-]+)", m.group(1)))))))
    return sorted(set(found))


@pytest.mark.parametrize("sub,flags", commands())
def test_cli_commands_and_flags_exist(sub, flags):
    result = CliRunner().invoke(app, [*sub.split(), "--help"], terminal_width=200)
    assert result.exit_code == 0, result.output
    for flag in flags:
        assert flag in result.output, f"cliplab {sub} has no {flag}"


@pytest.mark.parametrize("target", sorted({t for body in blocks("bash") for t in re.findall(r"^make (\w+)", body,
                                                                                                flags=re.M)}
                                          | set(re.findall(r"`make (\w+)`", README))))
def test_make_targets_exist(target):
    assert re.search(rf"^{target}:", (ROOT / "Makefile").read_text(), flags=re.M)


def test_quick_start_shows_the_three_jobs_and_names_verify_the_self_check():
    """Check my loss, ablate, reproduce: one command each in the Quick start's shell blocks; `cliplab verify` named
    as cliplab's own check, not a check of the user's code."""
    quick = README.split("## Quick start")[1].split("\n## ")[0]
    shown = {words[1]: words for body in re.findall(r"^```bash\n(.*?)^```", quick, flags=re.M | re.S)
             for line in body.splitlines() if (words := line.split("#")[0].split())[:1] == ["cliplab"]}
    assert re.fullmatch(r"[\w.]+:\w+", shown["conform"][2]) and "--adapter" in shown["conform"]  # the user's loss
    assert "--algos" in shown["sim"] and shown["recipe"][2] == "launch"
    assert "`cliplab verify` is cliplab's self-check" in " ".join(quick.split())
