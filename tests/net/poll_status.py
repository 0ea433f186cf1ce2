"""Poll a node's ``/v1/status`` from inside its namespace for a while; print one JSON line of what was seen.

    python tests/net/poll_status.py DATA_DIR SECONDS

Output: ``{"heights": {h: [head_time_ms, first_seen_ms]}, "errors": n}``: when each height was first seen as the
head, beside the time in its header (the same clock: every namespace shares this machine's), so
``first_seen_ms - head_time_ms`` is how long the block took to be final and stored at this node.
"""

import json
import sys
import time
from pathlib import Path

import httpx


def main() -> int:
    data_dir, seconds = Path(sys.argv[1]), float(sys.argv[2])
    api = json.loads((data_dir / "node.json").read_text())["api"]
    seen: dict[int, list[int]] = {}
    errors = 0
    deadline = time.monotonic() + seconds
    with httpx.Client(timeout=5.0) as http:
        while time.monotonic() < deadline:
            try:
                st = http.get(api + "/v1/status").json()
                if st["height"] not in seen and st["head_time_ms"] is not None:
                    seen[st["height"]] = [st["head_time_ms"], int(time.time() * 1000)]
            except (httpx.HTTPError, ValueError, KeyError):
                errors += 1
            time.sleep(0.05)
    print(json.dumps({"heights": seen, "errors": errors}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
