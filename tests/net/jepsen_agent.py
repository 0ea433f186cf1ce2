"""A Tally node's HTTP API, called from inside its namespace for the Jepsen-style test (test infra only).

    python tests/net/jepsen_agent.py DATA_DIR

Reads one JSON request a line on stdin, ``{"m": "GET"|"POST", "p": "/v1/...", "b": body or null, "t": timeout in
seconds or null}``, and answers one JSON line on stdout, ``{"s": HTTP status, "j": decoded body}``, or
``{"s": 0, "e": "why"}`` when the node does not answer (killed, restarting). The API address is read from
``DATA_DIR/node.json`` for every request (a restarted node listens on another port), the token from
``DATA_DIR/api_token``. Ends at end of input.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import httpx

TIMEOUT_S = 10.0


def main() -> int:
    data_dir = Path(sys.argv[1])
    http = httpx.Client(timeout=TIMEOUT_S)
    for line in sys.stdin:
        try:
            req = json.loads(line)
            api = json.loads((data_dir / "node.json").read_text())["api"]
            headers = {}
            if req["m"] != "GET":
                headers["Authorization"] = "Bearer " + (data_dir / "api_token").read_text().strip()
            r = http.request(req["m"], api + req["p"], json=req.get("b"), headers=headers,
                             timeout=float(req.get("t") or TIMEOUT_S))
            try:
                body = r.json()
            except ValueError:
                body = r.text[:500]
            out = {"s": r.status_code, "j": body}
        except (OSError, ValueError, KeyError, httpx.HTTPError) as e:
            out = {"s": 0, "e": f"{type(e).__name__}: {e}"}
        sys.stdout.write(json.dumps(out) + "\n")
        sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
