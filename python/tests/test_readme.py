"""Runs the README's Python section, in order, as one script, so that it cannot rot: its Python
examples, and its `build/bin/convnn` commands (the checkpoint round trip) at their place between
them, in a scratch folder."""
import os
import pathlib
import re
import runpy
import shlex
import subprocess

README = pathlib.Path(__file__).resolve().parents[2] / "README.md"
CONVNN = os.environ.get("CONVNN_BIN", str(README.parent / "build" / "bin" / "convnn"))


def python_section_blocks():
    """(language, text) of each code block of the section, in order."""
    text = README.read_text()
    section = text[text.index("## Using it from Python"):]
    section = section[:section.index("\n## ", 1)]
    return re.findall(r"```(python|bash)\n(.*?)```", section, flags=re.S)


def convnn_commands(bash):
    """The `build/bin/convnn` commands of a bash block, continuation lines joined, as argv lists
    naming the convnn under test (others, such as `pip install`, are the reader's set-up)."""
    commands = []
    for line in bash.replace("\\\n", " ").splitlines():
        words = shlex.split(line, comments=True)
        if words and words[0] == "build/bin/convnn":
            commands.append([CONVNN] + words[1:])
    return commands


def run_commands(commands):
    for argv in commands:
        result = subprocess.run(argv, capture_output=True, text=True)
        assert result.returncode == 0, f"{shlex.join(argv)} failed:\n{result.stdout}\n{result.stderr}"


def test_the_readme_python_section_runs(tmp_path, monkeypatch):
    blocks = python_section_blocks()
    assert sum(language == "python" for language, _ in blocks) >= 5
    commands = [convnn_commands(text) for language, text in blocks if language == "bash"]
    assert sum(len(c) for c in commands) >= 2, "the checkpoint round trip's commands are gone"
    # One script in which each bash block's commands run at their place; a real file, so that
    # torch.compile (which reads the source of what it traces) finds it.
    parts = []
    for language, text in blocks:
        parts.append(text if language == "python" else f"_run_commands({convnn_commands(text)!r})\n")
    script = tmp_path / "readme_examples.py"
    script.write_text("\n".join(parts))
    monkeypatch.chdir(tmp_path)
    runpy.run_path(str(script), init_globals={"_run_commands": run_commands}, run_name="__main__")
