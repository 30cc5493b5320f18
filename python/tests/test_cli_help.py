"""`convnn <command> --help` shows the defaults of the library's structs (CLI11 reads them off the
fields the flags are bound to) and no help text restates one; the enum flags offer the library's
name lists."""
import subprocess

import pytest
import torch

import convnn  # noqa: F401  (registers torch.ops.convnn)
from cli_support import BINARY

COMMANDS = ["train", "eval", "compare", "verify", "bench", "info", "checkpoint", "viz"]


def run(*args):
    return subprocess.run([BINARY, *args], capture_output=True, text=True, timeout=60)


def option_line(help_text, flag):
    lines = [line for line in help_text.splitlines() if line.strip().startswith(flag + " ")]
    assert len(lines) == 1, (flag, help_text)
    return lines[0]


@pytest.mark.parametrize("command", COMMANDS)
def test_no_help_text_restates_a_default(command):
    result = run(command, "--help")
    assert result.returncode == 0, result.stderr
    for line in result.stdout.splitlines():
        assert "(default" not in line, line


def test_train_help_shows_the_defaults_of_the_config_structs():
    help_text = run("train", "--help").stdout
    for flag, shown in [("--opt", "=adamw"), ("--sched", "=cosine"), ("--precision", "=float32"),
                        ("--decay-on", "=all"), ("--layer", "=conv"), ("--attention", "=mhsa"),
                        ("--lr", "=0.001"), ("--opt-betas", "=0.9 0.999"), ("--model", "=resnet18"),
                        ("--dataset", "=fashion-mnist"), ("--dist-backend", "=auto")]:
        assert shown in option_line(help_text, flag), (flag, shown)


@pytest.mark.parametrize("command,flag,names", [
    ("train", "--similarity", lambda: torch.ops.convnn.similarity_names()),
    ("train", "--rho", lambda: torch.ops.convnn.rho_names()),
    ("info", "--similarity", lambda: torch.ops.convnn.similarity_names()),
])
def test_similarity_and_rho_flags_offer_the_librarys_lists(command, flag, names):
    result = run(command, flag, "not-a-name")
    assert result.returncode != 0
    assert "{" + ",".join(names()) + "}" in result.stderr, result.stderr
