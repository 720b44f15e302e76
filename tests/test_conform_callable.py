"""`cliplab conform module:function` in CI: exit codes, the console's numbers and minimal inputs, accepted
conventions, the mismatches the callable target names (KL term, advantages' shape, parameters), and user code
that misbehaves (changes directory or grad mode, exits, prints, writes on fd 1, forks, hangs, crashes, returns what
is not a loss, changes its inputs), which runs in a child process with a time limit."""
import json
import os
import re
import signal
import textwrap
import time
from contextlib import contextmanager

import pytest
import torch
from conftest import importable_module
from typer.testing import CliRunner

from harness.cli import app
from harness.conform.engine import assert_conforms, parse_accept
from harness.conform.targets import load_target

MODULE = textwrap.dedent('''
    import ctypes
    import os
    import subprocess
    import sys
    import time

    import torch


    def _clipped(logp, old_logp, adv, eps_high=0.2):
        r = torch.exp(logp - old_logp)
        return -torch.min(r * adv, torch.clamp(r, 0.8, 1 + eps_high) * adv)


    def paper_grpo(logp, old_logp, advantages, mask):
        """GRPO without KL: per-sequence token means, averaged over the sequences that have tokens."""
        lens = mask.sum(1)
        keep = lens > 0
        per_row = (_clipped(logp, old_logp, advantages) * mask).sum(1)
        return (per_row[keep] / lens[keep]).mean() if keep.any() else per_row.sum() * 0


    def padded_grpo(logp, old_logp, advantages, mask):
        """The classic padding bug: the mean runs over every position of the padded batch."""
        return (_clipped(logp, old_logp, advantages) * mask).mean()


    def token_mean_dapo(logp, old_logp, advantages, mask):
        """DAPO's clip-higher averaged over the batch's tokens, as the libraries do."""
        return (_clipped(logp, old_logp, advantages, 0.28) * mask).sum() / mask.sum().clamp(min=1)


    def per_sequence_grpo(logp, old_logp, advantages, mask):
        """Takes one advantage per sequence, [B]."""
        return paper_grpo(logp, old_logp, advantages[:, None], mask)


    def lost_in_cwd(logp, old_logp, advantages, mask):
        os.chdir("/")
        return paper_grpo(logp, old_logp, advantages, mask)


    def exits(logp, old_logp, advantages, mask):
        sys.exit(0)


    def chatty(logp, old_logp, advantages, mask):
        print("loss computed", flush=True)
        return paper_grpo(logp, old_logp, advantages, mask)


    def sleeps(logp, old_logp, advantages, mask):
        time.sleep(10 ** 6)


    def crashes(logp, old_logp, advantages, mask):
        ctypes.string_at(0)  # reads address 0: SIGSEGV


    def on_meta(logp, old_logp, advantages, mask):
        return torch.empty((), device="meta")


    def complex_loss(logp, old_logp, advantages, mask):
        return paper_grpo(logp, old_logp, advantages, mask) * (1 + 0j)


    def mutates(logp, old_logp, advantages, mask):
        advantages.clamp_(min=0)
        return paper_grpo(logp, old_logp, advantages, mask)


    def unnamed(x, y, advantages, mask):
        return paper_grpo(x, y, advantages, mask)


    def spoofs(logp, old_logp, advantages, mask):
        """Correct, and writes replies of the worker protocol on the real stdout: as C code, a child process and
        the shell would."""
        line = '{"ok": true, "out": {"loss": 1.0, "grad": [[0.0]]}}'
        os.write(1, (line + "\\n").encode())
        subprocess.run(["echo", line], check=True)
        os.system(f"echo '{line}'")
        return paper_grpo(logp, old_logp, advantages, mask)


    def forks(logp, old_logp, advantages, mask):
        """Correct, but forks: parent and child both return."""
        os.fork()
        return paper_grpo(logp, old_logp, advantages, mask)


    def detached(logp, old_logp, advantages, mask):
        """The right value with no gradient."""
        return paper_grpo(logp.detach(), old_logp, advantages, mask)


    def grad_off(logp, old_logp, advantages, mask):
        """Switches grad mode off for the process: no gradient, here or in what runs after."""
        torch.set_grad_enabled(False)
        return paper_grpo(logp, old_logp, advantages, mask)
''')


@pytest.fixture(scope="module", autouse=True)
def user_module(tmp_path_factory):
    with importable_module(tmp_path_factory.mktemp("usercode"), "cliplab_ci_losses", MODULE):
        yield


def conform_cli(*args):
    return CliRunner().invoke(app, ["conform", *args])


def checks_in(out: str) -> int:
    """The number of checks the console's summary line counts."""
    return int(re.search(r": (\d+) checks: ", out).group(1))


def test_the_padding_bug_fails_with_its_numbers_minimal_input_and_the_kl_mismatch_named():
    result = conform_cli("cliplab_ci_losses:padded_grpo", "--adapter", "algorithm=grpo", "--seeds", "3")
    assert result.exit_code == 1, result.output
    out = result.stdout
    checks = checks_in(out)  # one per case family: typical, extreme, far reference, ties
    assert checks == 4 and out.count("DIFFERS") == checks and "largest error" in out and "minimal input (rows: " in out
    assert "The reference grpo has a KL term (beta=0.04, k3)" in out and "(adapter beta=0)" in out
    assert f"{checks} checks: {checks} differs (fails)\nnext: " in out  # the summary, then what to run next
    # with beta=0 the remaining difference is the padding: the padded width divides every row's token sum
    result = conform_cli("cliplab_ci_losses:padded_grpo", "--adapter", "algorithm=grpo,beta=0", "--seeds", "3")
    assert result.exit_code == 1 and "KL term" not in result.stdout
    assert "matches grpo[agg=seq_mean_token_sum_norm, beta=0]" in result.stdout


def test_a_conforming_loss_exits_0_and_a_usage_error_2():
    result = conform_cli("cliplab_ci_losses:paper_grpo", "--adapter", "algorithm=grpo,beta=0", "--seeds", "3")
    assert result.exit_code == 0, result.output
    assert f"{checks_in(result.stdout)} agrees" in result.stdout and "DIFFERS" not in result.stdout
    result = conform_cli("cliplab_ci_losses:paper_grpo", "--adapter", "algorithm=grpo,agg=nope")
    assert result.exit_code == 2 and "unknown aggregation mode 'nope'" in result.output


def test_an_accepted_convention_passes_from_the_option_or_a_file(tmp_path):
    target, adapter = "cliplab_ci_losses:token_mean_dapo", "algorithm=dapo"
    assert conform_cli(target, "--adapter", adapter, "--seeds", "3").exit_code == 1
    result = conform_cli(target, "--adapter", adapter, "--seeds", "3", "--accept", "agg=token_mean")
    assert result.exit_code == 0, result.output
    assert "accepted dapo [as called] typical: differs; matches dapo[agg=token_mean]" in result.stdout
    (tmp_path / "accepted.txt").write_text("# what our trainer does on purpose\nagg=token_mean  # batch token mean\n")
    result = conform_cli(target, "--adapter", adapter, "--seeds", "3", "--accept", str(tmp_path / "accepted.txt"),
                         "--json")
    assert result.exit_code == 0 and {r["outcome"] for r in json.loads(result.stdout)["rows"]} == {"accepted"}
    # accepting another setting does not let it pass
    assert conform_cli(target, "--adapter", adapter, "--seeds", "3", "--accept", "dual_clip=3").exit_code == 1


@pytest.mark.parametrize("entry, words", [("agg=token_sum", "'agg=token_sum' names no known convention"),
                                          ("colour=red", "known: agg=token_mean, agg=group_token_mean"),
                                          ("no_such_file.txt", "neither KEY=VALUE nor a readable file")])
def test_an_unknown_accept_entry_lists_the_known_ones(entry, words):
    with pytest.raises(ValueError, match="^accept: ") as err:
        parse_accept([entry])
    assert words in str(err.value)
    result = conform_cli("cliplab_ci_losses:paper_grpo", "--adapter", "algorithm=grpo", "--accept", entry)
    assert result.exit_code == 2 and words in result.output


def test_per_sequence_advantages_are_named_and_the_adapter_option_passes_them():
    report = assert_conforms("cliplab_ci_losses:per_sequence_grpo", "grpo", beta=0, adv_shape="seq", seeds=3)
    assert {r["outcome"] for r in report["rows"]} == {"agrees"}
    with pytest.raises(AssertionError) as err:
        assert_conforms("cliplab_ci_losses:per_sequence_grpo", "grpo", beta=0, seeds=3)
    assert "add adv_shape=seq to the adapter" in str(err.value)


def test_assert_conforms_names_the_parameters_it_cannot_map_and_the_option_that_maps_them():
    from cliplab_ci_losses import unnamed
    with pytest.raises(ValueError) as err:
        assert_conforms(unnamed, "grpo", beta=0)
    assert "cannot map its parameters x, y" in str(err.value) and "no parameter for logp, old_logp" in str(err.value)
    assert "assert_conforms(..., logp='x', old_logp='y')" in str(err.value)
    assert assert_conforms(unnamed, "grpo", beta=0, logp="x", old_logp="y", seeds=2)["ok"]


def test_a_callable_that_changes_directory_leaves_out_where_it_was(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = conform_cli("cliplab_ci_losses:lost_in_cwd", "--adapter", "algorithm=grpo,beta=0", "--seeds", "2",
                         "--out", "reports")
    assert result.exit_code == 0, result.output
    assert (tmp_path / "reports" / "cliplab_ci_losses_lost_in_cwd.md").is_file()


def test_a_callable_that_prints_keeps_json_valid():
    result = conform_cli("cliplab_ci_losses:chatty", "--adapter", "algorithm=grpo,beta=0", "--seeds", "2", "--json")
    assert result.exit_code == 0 and json.loads(result.stdout)["ok"] is True


def test_what_a_callable_writes_on_fd_1_from_c_a_child_or_the_shell_cannot_spoof_its_answer():
    result = conform_cli("cliplab_ci_losses:spoofs", "--adapter", "algorithm=grpo,beta=0", "--seeds", "2", "--json")
    assert result.exit_code == 0, result.output
    assert {r["outcome"] for r in json.loads(result.stdout)["rows"]} == {"agrees"}


def test_a_callable_that_forks_raises_forked_and_its_child_never_answers():
    result = conform_cli("cliplab_ci_losses:forks", "--adapter", "algorithm=grpo,beta=0", "--seeds", "2")
    assert result.exit_code == 1, result.output
    assert result.stdout.count("RAISES") == checks_in(result.stdout), result.stdout
    assert "raises forked: the call forked the worker process" in result.stdout and "DIFFERS" not in result.stdout


def child_processes() -> set:
    """The pids of this process's children."""
    mine = str(os.getpid())
    return {int(p) for p in os.listdir("/proc") if p.isdigit() and _ppid(p) == mine}


def _ppid(pid: str) -> str | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[1]
    except OSError:  # it ended meanwhile
        return None


def test_a_zero_gradient_fails_under_no_grad_and_after_a_callable_that_switches_grad_mode_off():
    from cliplab_ci_losses import detached, grad_off, paper_grpo
    before = child_processes()
    with torch.no_grad():
        with pytest.raises(AssertionError, match="DIFFERS"):
            assert_conforms(detached, "grpo", beta=0, seeds=2)
        assert assert_conforms(paper_grpo, "grpo", beta=0, seeds=2)["ok"]  # the right gradient still agrees
    with pytest.raises(AssertionError, match="DIFFERS"):
        assert_conforms(grad_off, "grpo", beta=0, seeds=2)
    assert torch.is_grad_enabled()  # the callable switched it off in its own process
    assert child_processes() <= before  # each function's worker stopped with its assertion


@contextmanager
def fails_after(seconds: int):
    """A test that would hang fails instead."""
    def stop(*_):
        pytest.fail(f"still running after {seconds} s")
    previous = signal.signal(signal.SIGALRM, stop)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def test_assert_conforms_stops_a_hanging_function_at_its_time_limit():
    from cliplab_ci_losses import sleeps
    start = time.monotonic()
    with fails_after(60), pytest.raises(AssertionError, match=r"gave no answer within 1 s \(stopped\)"):
        assert_conforms(sleeps, "grpo", beta=0, seeds=2, timeout_s=1)
    assert time.monotonic() - start < 10


@pytest.mark.parametrize("name, adapter, words", [
    ("exits", "", "RuntimeError: SystemExit: the callable called sys.exit(0)"),
    ("sleeps", ",timeout_s=1", "gave no answer within 1 s (stopped)"),
    ("crashes", "", "worker was killed by SIGSEGV (exit code -11)"),
    ("mutates", "", "RuntimeError: the callable changed its input advantages in place"),
])
def test_a_callable_that_exits_hangs_crashes_or_mutates_fails_with_one_line(name, adapter, words):
    result = conform_cli(f"cliplab_ci_losses:{name}", "--adapter", "algorithm=grpo,beta=0" + adapter,
                         "--seeds", "2")
    assert result.exit_code == 1, result.output
    assert result.stdout.count("RAISES") == checks_in(result.stdout) and words in result.stdout, result.stdout
    assert "Traceback" not in result.output


@pytest.mark.parametrize("name, words", [("on_meta", "returned a tensor on the meta device (it has no values)"),
                                         ("complex_loss", "returned a complex tensor (torch.complex128)")])
def test_a_result_that_is_not_a_real_loss_is_a_usage_error(name, words):
    with pytest.raises(ValueError, match=f"^target: cliplab_ci_losses:{name} {re.escape(words)}; expected a callable"):
        load_target(f"cliplab_ci_losses:{name}", "algorithm=grpo")
