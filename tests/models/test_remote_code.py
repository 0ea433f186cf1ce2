"""No code from a model dir is ever run (issue 24, finding 4): every ``from_pretrained`` in the node passes
``trust_remote_code=False`` explicitly (a fetched dir's tokenizer files come from a peer), and a model dir whose
config or tokenizer config names custom code (``auto_map``) is refused without that code running."""

from __future__ import annotations

import ast
import json
import shutil
from pathlib import Path

import pytest

import node
from node.compute.model import load_span_config, make_tiny
from node.compute.train import encode_text

NODE = Path(node.__file__).parent

EVIL = """from pathlib import Path
Path(__file__).with_name("RAN").write_text("remote code ran")
"""


def from_pretrained_calls() -> list[tuple[str, int, ast.Call]]:
    out = []
    for path in sorted(NODE.rglob("*.py")):
        for n in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "from_pretrained":
                out.append((str(path.relative_to(NODE.parent)), n.lineno, n))
    return out


def test_every_from_pretrained_in_the_node_refuses_remote_code():
    calls = from_pretrained_calls()
    assert len(calls) >= 8  # config, model and tokenizer loads of the node, converters and batch workers
    missing = [f"{f}:{line}" for f, line, c in calls
               if not any(k.arg == "trust_remote_code" and isinstance(k.value, ast.Constant) and k.value.value is False
                          for k in c.keywords)]
    assert missing == [], f"from_pretrained without trust_remote_code=False: {missing}"


@pytest.fixture
def evil_dir(tmp_path):
    d = shutil.copytree(make_tiny(tmp_path / "cache"), tmp_path / "evil")
    (d / "evil.py").write_text(EVIL)
    return d


def test_a_config_naming_custom_code_is_refused_without_running_it(evil_dir):
    cfg = json.loads((evil_dir / "config.json").read_text())
    cfg.update(model_type="evil_llama", auto_map={"AutoConfig": "evil.EvilConfig"})
    (evil_dir / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError):
        load_span_config(evil_dir)
    assert not (evil_dir / "RAN").exists()


def test_a_peer_tokenizer_naming_custom_code_is_refused_without_running_it(evil_dir):
    (evil_dir / "tokenizer.json").write_text("{}")
    (evil_dir / "tokenizer_config.json").write_text(json.dumps(
        {"tokenizer_class": "EvilTokenizer", "auto_map": {"AutoTokenizer": ["evil.EvilTokenizer", None]}}))
    with pytest.raises(ValueError):
        encode_text(evil_dir, b"hello")
    assert not (evil_dir / "RAN").exists()
