"""The README's Python examples run, and its Quickstart is the two commands CI uses."""

import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def test_python_examples_run(capsys):
    blocks = re.findall(r"```python\n(.*?)```", README, re.S)
    assert blocks
    for code in blocks:
        exec(compile(code, "README.md", "exec"), {})


def test_quickstart_has_two_commands_and_ci_runs_the_test_one():
    quick = README.split("## Quickstart", 1)[1].split("\n## ", 1)[0]
    commands = [
        line.strip()
        for block in re.findall(r"```(?:bash|sh)?\n(.*?)```", quick, re.S)
        for line in block.splitlines()
        if line.strip() and not line.strip().startswith("#")
    ]
    assert len(commands) == 2
    assert commands[0].endswith("rnstensor demo")
    assert commands[1] in (ROOT / ".ci" / "run").read_text()
