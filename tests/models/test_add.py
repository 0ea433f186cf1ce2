"""``node model add|list|remove`` and check 3 of issue 15: a corrupted safetensors file, a pickled checkpoint and
an unknown architecture are each refused with a clear message, a non-zero exit code and nothing new in the cache."""

from __future__ import annotations

import json
import pickle
import shutil
from pathlib import Path

import pytest

from node.cli import build_parser, main, resolve_model
from node.compute.model import load_manifest
from node.models import registry
from node.models.convert import add_model
from node.models.registry import RegistryError
from node.models.sources import CheckpointError

from .conftest import write_checkpoint


def snapshot(cache: Path) -> list[str]:
    """Every path under ``cache`` (relative), or [] when it does not exist."""
    return sorted(str(p.relative_to(cache)) for p in cache.rglob("*")) if cache.exists() else []


def copy_ckpt(checkpoints, model_type: str, dst: Path) -> Path:
    shutil.copytree(checkpoints[model_type], dst)
    return dst


class _Armed:
    """Unpickling this creates ``path``: proof that a pickle was (or was not) loaded."""

    def __init__(self, path: Path):
        self.path = path

    def __reduce__(self):
        return (Path.touch, (self.path,))


def refused(capsys, src: Path, cache: Path, *extra: str) -> str:
    """Run ``node model add src``; assert exit code 1 and an unchanged cache; return the error message."""
    before = snapshot(cache)
    capsys.readouterr()  # drop earlier output
    rc = main(["model", "add", str(src), "--model-cache", str(cache), *extra])
    err = capsys.readouterr().err
    assert rc == 1 and err.startswith("node model add: ")
    assert snapshot(cache) == before
    return err


def test_add_list_remove_and_start_resolves_the_name(checkpoints, tmp_path, capsys):
    cache = tmp_path / "cache"
    assert main(["model", "add", str(checkpoints["qwen3"]), "--name", "q3", "--model-cache", str(cache)]) == 0
    out = capsys.readouterr().out
    assert "added q3: Qwen3, 4 blocks, hidden 64" in out
    assert "converting blocks 4/4" in out  # stdout is not a terminal here: plain progress lines
    assert main(["model", "list", "--json", "--model-cache", str(cache)]) == 0
    [entry] = json.loads(capsys.readouterr().out)
    assert (entry["name"], entry["architecture"], entry["num_blocks"], entry["hidden_size"]) == ("q3", "Qwen3", 4, 64)
    model_dir = cache / entry["dir"]
    m = load_manifest(model_dir)
    assert m.model_id.hex() == entry["model_id"] == entry["dir"] and m.name == "q3"
    assert entry["bytes"] == sum(p.stat().st_size for p in model_dir.iterdir())
    assert main(["model", "list", "--model-cache", str(cache)]) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[0].split() == ["NAME", "ID", "ARCHITECTURE", "QUANT", "BLOCKS", "HIDDEN", "SIZE"]
    assert table[1].split()[:6] == ["q3", entry["model_id"][:16], "Qwen3", "-", "4", "64"]
    # node start --model accepts the name and the id (or an 8-digit prefix); unknown names exit with a hint
    for ref in ("q3", entry["model_id"], entry["model_id"][:8]):
        args = build_parser().parse_args(["start", "--model", ref, "--model-cache", str(cache)])
        assert resolve_model(args) == model_dir
    with pytest.raises(SystemExit, match=r"no added model named or with id 'nope'.*node model add"):
        resolve_model(build_parser().parse_args(["start", "--model", "nope", "--model-cache", str(cache)]))
    # the same weights again, or the same name again: refused, nothing written
    assert "already added as 'q3'" in refused(capsys, checkpoints["qwen3"], cache, "--name", "other")
    assert "already added" in refused(capsys, checkpoints["llama"], cache, "--name", "q3")
    assert main(["model", "remove", "q3", "--model-cache", str(cache)]) == 0
    assert "removed q3" in capsys.readouterr().out
    assert not model_dir.exists() and json.loads((cache / "registry.json").read_text())["models"] == []
    assert main(["model", "remove", "q3", "--model-cache", str(cache)]) == 1
    assert "no added model named or with id 'q3'" in capsys.readouterr().err


def test_truncated_safetensors_is_refused(checkpoints, tmp_path, capsys):
    src = copy_ckpt(checkpoints, "llama", tmp_path / "ck")
    f = src / "model.safetensors"
    f.write_bytes(f.read_bytes()[:-1000])
    err = refused(capsys, src, tmp_path / "cache")
    assert "model.safetensors is not a valid safetensors file (truncated or corrupt?)" in err


def test_corrupt_safetensors_header_and_nan_weights_are_refused(checkpoints, tmp_path, capsys):
    src = copy_ckpt(checkpoints, "mistral", tmp_path / "ck")
    f = src / "model.safetensors"
    good = f.read_bytes()
    f.write_bytes(good[:8] + b"{not json" + good[17:])
    assert "not a valid safetensors file" in refused(capsys, src, tmp_path / "cache")
    # a data region overwritten with NaN: the header is fine, so this is found while writing -- and the temp dir
    # it was being written into is gone afterwards (an existing cache with one model stays exactly as it was)
    cache = tmp_path / "cache2"
    add_model(checkpoints["qwen2"], cache, name="keep")
    n = int.from_bytes(good[:8], "little")
    header = json.loads(good[8:8 + n])
    a = header["model.layers.2.mlp.down_proj.weight"]["data_offsets"][0]
    nan = bytes([0x00, 0x00, 0xC0, 0x7F]) * 4  # float32 NaN
    body = bytearray(good)
    body[8 + n + a:8 + n + a + len(nan)] = nan
    f.write_bytes(bytes(body))
    err = refused(capsys, src, cache)
    assert "model.layers.2.mlp.down_proj.weight holds NaN or inf values" in err
    assert [e.name for e in registry.load(cache)] == ["keep"]


def test_pickled_checkpoints_are_refused_and_never_loaded(checkpoints, tmp_path, capsys):
    marker = tmp_path / "UNPICKLED"
    payload = pickle.dumps(_Armed(marker))
    src = copy_ckpt(checkpoints, "llama", tmp_path / "ck")
    (src / "model.safetensors").unlink()
    (src / "pytorch_model.bin").write_bytes(payload)
    err = refused(capsys, src, tmp_path / "cache")
    assert "pytorch_model.bin is a pickled PyTorch checkpoint" in err and "never opens it" in err
    pt = tmp_path / "model.pt"
    pt.write_bytes(payload)
    assert "model.pt is a pickled PyTorch checkpoint" in refused(capsys, pt, tmp_path / "cache")
    (src / "pytorch_model.bin").rename(src / "model.safetensors")  # a pickle under a safetensors name
    assert "model.safetensors is a pickled PyTorch checkpoint" in refused(capsys, src, tmp_path / "cache")
    assert not marker.exists()
    pickle.loads(payload)  # the payload is armed: loading it would have left the marker
    assert marker.exists()


def test_unknown_architecture_and_missing_tokenizer_are_refused(checkpoints, tmp_path, capsys):
    src = copy_ckpt(checkpoints, "llama", tmp_path / "ck")
    cfg = json.loads((src / "config.json").read_text())
    (src / "config.json").write_text(json.dumps({**cfg, "model_type": "bloom", "architectures": ["BloomForCausalLM"]}))
    err = refused(capsys, src, tmp_path / "cache")
    assert "unsupported architecture: model_type 'bloom'" in err and "qwen3" in err
    (src / "config.json").write_text(json.dumps({**cfg, "model_type": "gemma3"}))
    assert "multimodal" in refused(capsys, src, tmp_path / "cache")
    bare = write_checkpoint(tmp_path / "bare", "qwen2", tokenizer=False)
    assert "has no tokenizer" in refused(capsys, bare, tmp_path / "cache")


def test_bad_names_and_missing_paths(checkpoints, tmp_path):
    for bad in ("tiny", "smollm2", "a b", "-x", "deadbeefcafe"):
        with pytest.raises(RegistryError):
            add_model(checkpoints["llama"], tmp_path / "c", name=bad)
    with pytest.raises(FileNotFoundError):
        add_model(tmp_path / "absent", tmp_path / "c", name="x")
    (tmp_path / "notes.txt").write_text("hello")
    with pytest.raises(CheckpointError, match=r"neither a checkpoint directory nor a \.gguf file"):
        add_model(tmp_path / "notes.txt", tmp_path / "c", name="x")
    assert not (tmp_path / "c").exists()
