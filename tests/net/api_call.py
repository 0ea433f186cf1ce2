"""Call a Tally node's HTTP API from inside its namespace (the API binds 127.0.0.1 there) and print the JSON.

    python tests/net/api_call.py DATA_DIR GET /v1/status
    python tests/net/api_call.py DATA_DIR POST /v1/generate '{"prompt_ids": [1, 2], "max_new_tokens": 8}'

The API address comes from ``DATA_DIR/node.json``, the token from ``DATA_DIR/api_token``. Exit 1 with the body on
a non-2xx answer.
"""

import json
import sys
from pathlib import Path

import httpx


def main() -> int:
    data_dir, method, path = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
    body = json.loads(sys.argv[4]) if len(sys.argv) > 4 else None
    api = json.loads((data_dir / "node.json").read_text())["api"]
    token = (data_dir / "api_token").read_text().strip()
    r = httpx.request(method, api + path, json=body, timeout=120.0,
                      headers={"Authorization": f"Bearer {token}"} if method != "GET" else {})
    print(r.text)
    return 0 if r.is_success else 1


if __name__ == "__main__":
    sys.exit(main())
