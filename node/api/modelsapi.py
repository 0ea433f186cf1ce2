"""``GET /v1/models`` and the explorer's ``/models`` page: every model this node knows, with its swarm coverage.

A node *knows* a model when its dir is in the node's model cache (``cfg.model_cache``, default the parent of its
``--model`` dir): the models added with ``node model add`` (their registry names) and the converted built-ins,
each read from its checked ``manifest.json``; plus every other model id live servers announce (name, architecture
and quantization unknown then). For each: id, name, architecture, quantization (``"int8"`` or null), blocks,
and from the swarm table the number of live servers holding each block and those servers.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fastapi import APIRouter
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field

from ..compute.families import SUPPORTED
from ..compute.model import ManifestError, config_dict, load_manifest
from ..models import registry
from .deps import NodeAPI, NodeAPIDep


class ModelServerOut(BaseModel):
    peer: str
    span: list[int] = Field(..., description="[start, end) decoder blocks it serves")
    active: int = Field(0, description="sessions open at its last announcement")


class ModelOut(BaseModel):
    model_id: str
    name: str | None = Field(..., description="registry or manifest name; null for a model only announced by peers")
    architecture: str | None = None
    quantization: str | None = Field(None, description='"int8" for a weight-only int8 copy, null for float32')
    num_blocks: int | None = Field(..., description="decoder blocks (from the manifest; for an unknown model: the "
                                                    "largest announced span end)")
    local: bool = Field(..., description="its converted files are in this node's model cache")
    this_node: bool = Field(..., description="the model this node runs")
    coverage: list[int] = Field(..., description="live servers holding each decoder block")
    covered: int = Field(..., description="blocks held by at least one live server")
    servers: list[ModelServerOut]


class ModelsOut(BaseModel):
    models: list[ModelOut] = Field(..., description="this node's model first, then local models, then announced")


def _local(node: NodeAPI) -> dict[bytes, dict[str, Any]]:
    """``{model id: row}`` of the model dirs in the node's cache (unreadable dirs skipped) and its own model."""
    cache = Path(node.cfg.model_cache or Path(node.cfg.model_dir).parent)
    try:
        names = {e.model_id: e.name for e in registry.load(cache)}
    except registry.RegistryError:  # a damaged registry: the manifests' own names
        names = {}
    dirs = [Path(node.cfg.model_dir)]
    if cache.is_dir():
        dirs += sorted(p.parent for p in cache.glob("*/manifest.json"))
    out: dict[bytes, dict[str, Any]] = {}
    for d in dirs:
        try:
            m = load_manifest(d)
            model_type = config_dict(d).get("model_type")
            arch = SUPPORTED.get(model_type) if isinstance(model_type, str) else None
        except (ManifestError, OSError):
            continue
        out.setdefault(m.model_id, {"model_id": m.model_id.hex(), "name": names.get(m.model_id.hex(), m.name),
                                    "architecture": arch, "quantization": m.quantization,
                                    "num_blocks": m.num_blocks, "local": True})
    return out


def models_view(node: NodeAPI) -> dict[str, Any]:
    """The body of ``GET /v1/models`` (see the module docstring) for a running :class:`~node.runtime.Node`."""
    rows = _local(node)
    mine = node.manifest.model_id
    now = node.swarm.clock()
    servers: dict[bytes, list[dict[str, Any]]] = {}
    for peer, e in sorted(node.swarm.entries.items()):
        if now - e["seen"] >= e["ttl"]:
            continue
        servers.setdefault(bytes(e["model_id"]), []).append(
            {"peer": peer, "span": [int(e["start"]), int(e["end"])], "active": int(e.get("active", 0))})
    if node.cfg.span is not None and node.server is not None:  # this node's own span (it hears no own gossip)
        own = servers.setdefault(mine, [])
        if all(s["peer"] != node.ident.peer_id for s in own):
            own.append({"peer": node.ident.peer_id, "span": list(node.cfg.span), "active": node.server.active})
    for mid, ss in servers.items():
        rows.setdefault(mid, {"model_id": mid.hex(), "name": None, "architecture": None, "quantization": None,
                              "num_blocks": max(s["span"][1] for s in ss), "local": False})
    out = []
    for mid, row in rows.items():
        ss = sorted(servers.get(mid, []), key=lambda s: (s["span"][0], s["peer"]))
        cov = [0] * row["num_blocks"]
        for s in ss:
            for b in range(max(0, s["span"][0]), min(len(cov), s["span"][1])):
                cov[b] += 1
        out.append({**row, "this_node": mid == mine, "coverage": cov, "covered": sum(1 for c in cov if c),
                    "servers": ss})
    out.sort(key=lambda r: (not r["this_node"], not r["local"], r["name"] or "~", r["model_id"]))
    return {"models": out}


router = APIRouter(prefix="/v1", tags=["swarm"])
"""``GET /v1/models`` for the node of the app it reached (:data:`~node.api.deps.NodeAPIDep`)."""


@router.get("/models", response_model=ModelsOut,
            summary="Models this node knows (its cache and the swarm): id, name, quantization, block coverage")
async def models(node: NodeAPIDep) -> JSONResponse:
    return JSONResponse(models_view(node))
