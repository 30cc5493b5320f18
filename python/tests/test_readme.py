"""Runs the README's Python section in order, so that it cannot rot: each Python example alone, in a
namespace of its own (a block that needs a name another block defines fails with NameError, as it
would for a reader who copies that block alone), and its `build/bin/convnn` commands (the
checkpoint round trip) at their place between them, in a scratch folder."""
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


def test_each_readme_python_block_runs_alone(tmp_path, monkeypatch):
    blocks = python_section_blocks()
    assert sum(language == "python" for language, _ in blocks) >= 5
    commands = [convnn_commands(text) for language, text in blocks if language == "bash"]
    assert sum(len(c) for c in commands) >= 2, "the checkpoint round trip's commands are gone"
    monkeypatch.chdir(tmp_path)
    for index, (language, text) in enumerate(blocks):
        if language == "bash":
            run_commands(convnn_commands(text))
            continue
        # A real file, so that torch.compile (which reads the source of what it traces) finds it.
        script = tmp_path / f"readme_block_{index}.py"
        script.write_text(text)
        try:
            runpy.run_path(str(script), run_name="__main__")
        except NameError as error:
            raise AssertionError(f"README Python block {index} does not run alone: {error}\n{text}") from error
