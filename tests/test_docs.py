"""Every code block marked ```python run in README.md and docs/*.md is executed, in order, per file."""
import os
import pathlib
import re
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
BLOCK = re.compile(r"^```python run\n(.*?)^```", re.S | re.M)
FILES = [p for p in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))] if BLOCK.search(p.read_text())]


def test_docs_have_runnable_examples():
    assert FILES, "no ```python run blocks found"


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
def test_doc_examples_run(path, tmp_path):
    code = "\n\n".join(BLOCK.findall(path.read_text()))
    script = tmp_path / f"{path.stem}_examples.py"
    script.write_text(code)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True,
                          timeout=600, env=env)
    assert proc.returncode == 0, f"{path.name} examples failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"


def test_relative_links_resolve():
    link = re.compile(r'\]\(([^)#\s]+\.md)(?:#[^)\s]*)?(?:\s+"[^"]*")?\)')  # [text](file.md#anchor "title")
    broken = [f"{p.relative_to(ROOT)} -> {target}" for p in [ROOT / "README.md", *(ROOT / "docs").glob("*.md")]
              for target in link.findall(p.read_text())
              if "://" not in target and not (p.parent / target).exists()]
    assert not broken, f"links to missing files: {broken}"


def test_pass_catalog_is_current():
    from passline.pipeline.registry import catalog_markdown

    text = (ROOT / "docs" / "passes.md").read_text()
    start, end = text.index("<!-- catalog:start -->\n"), text.index("<!-- catalog:end -->")
    assert text[start + len("<!-- catalog:start -->\n"):end] == catalog_markdown(), \
        "docs/passes.md is stale: paste passline.pipeline.registry.catalog_markdown() between the markers"
