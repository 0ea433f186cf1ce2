"""`node run post`'s settings reach the ledger as posted (issue 40: the codec, H, the quorum, the deadline)."""

from __future__ import annotations

import pytest

from node.cli import build_parser
from node.training.api import RunRequest, ledger_settings
from node.web.errors import ApiError


def test_the_quorum_and_codec_go_to_the_run_post_and_a_bad_quorum_is_the_users_error():
    s = ledger_settings(RunRequest(play="hamlet", codec="int8", inner_steps=30, min_workers=2, max_workers=4,
                                   quorum=3, round_timeout=400))
    assert (s["quorum"], s["codec"], s["inner_steps"], s["round_timeout"]) == (3, "int8", 30, 400)
    assert ledger_settings(RunRequest(play="hamlet"))["quorum"] == 0  # default: every participant
    for bad in (1, 5):
        with pytest.raises(ApiError, match="quorum"):
            ledger_settings(RunRequest(play="hamlet", min_workers=2, max_workers=4, quorum=bad))


def test_node_run_post_takes_the_quorum_flag():
    args = build_parser().parse_args(["run", "post", "--play", "hamlet", "--quorum", "3", "-H", "40",
                                      "--round-timeout", "120"])
    assert (args.quorum, args.inner_steps, args.round_timeout) == (3, 40, 120)
    assert build_parser().parse_args(["run", "post", "--play", "hamlet"]).quorum == 0
