"""Runs the README's Python examples, in order, as one script, so that they cannot rot."""
import pathlib
import re
import runpy

README = pathlib.Path(__file__).resolve().parents[2] / "README.md"


def python_examples():
    text = README.read_text()
    section = text[text.index("## Using it from Python"):]
    section = section[:section.index("\n## ", 1)]
    return re.findall(r"```python\n(.*?)```", section, flags=re.S)


def test_the_readme_python_examples_run(tmp_path):
    examples = python_examples()
    assert len(examples) >= 3
    # A real file, so that torch.compile (which reads the source of what it traces) finds it.
    script = tmp_path / "readme_examples.py"
    script.write_text("\n".join(examples))
    runpy.run_path(str(script), run_name="__main__")
