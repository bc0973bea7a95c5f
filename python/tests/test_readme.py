"""The README's Python examples ("Use from Python / PyTorch"), run verbatim in order."""
import pathlib
import re

README = pathlib.Path(__file__).resolve().parents[2] / "README.md"


def python_examples():
    text = README.read_text()
    section = text.split("## Use from Python / PyTorch", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```python\n(.*?)```", section, re.S)


def test_readme_examples_run():
    examples = python_examples()
    assert len(examples) == 3
    namespace = {}
    for example in examples:
        exec(compile(example, str(README), "exec"), namespace)
