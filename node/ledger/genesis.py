"""Loading a genesis file (the embedded devnet genesis or a path); the document's meaning is in
:mod:`node.ledger.core.genesis`, whose names are re-exported here for the edges of the node."""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path

from .core.genesis import (  # re-exported
    ACCOUNT_KEYS,
    MAX_HEARTBEAT_MS,
    TREASURY,
    Genesis,
    GenesisError,
    Params,
    check_bootstrap_addr,
    parse_genesis,
)

__all__ = ["ACCOUNT_KEYS", "MAX_HEARTBEAT_MS", "TREASURY", "Genesis", "GenesisError", "Params",
           "check_bootstrap_addr", "load_genesis", "parse_genesis"]


def load_genesis(path: Path | None = None) -> Genesis:
    """Load a genesis file, or the embedded devnet genesis when ``path`` is None."""
    if path is None:
        text = resources.files("genesis").joinpath("devnet.json").read_text()
    else:
        text = Path(path).read_text()
    where = "embedded devnet genesis" if path is None else str(path)
    try:
        return parse_genesis(json.loads(text))
    except json.JSONDecodeError as e:
        raise GenesisError(f"{where} is not JSON: {e}") from None
    except GenesisError as e:
        raise GenesisError(f"{where}: {e}") from None
