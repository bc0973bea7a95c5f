"""The Python examples of the README and of docs/python.md, each document's run verbatim, in
order, in one namespace."""
import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("document", ["README.md", "docs/python.md"])
def test_examples_run(document):
    path = ROOT / document
    examples = re.findall(r"```python\n(.*?)```", path.read_text(), re.S)
    assert examples, f"{document} shows no Python example"
    namespace = {}
    for example in examples:
        exec(compile(example, str(path), "exec"), namespace)
