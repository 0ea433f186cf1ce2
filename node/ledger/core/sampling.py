"""Which receipts are re-executed: beacon sampling with BOINC-style adaptive probability.

A receipt included in block ``h`` is sampled iff ``H(beacon ‖ receipt_id) < p(worker) · 2^256``, where the
beacon is the hash of block ``h + 1`` — finalized after the receipt was included, so neither worker nor
requester can know beforehand which receipts are checked (DESIGN.md, Verification §1).

``p(worker)`` follows BOINC adaptive replication (Anderson, "BOINC: A Platform for Volunteer Computing",
2019, §5.3): a new worker is checked with the base probability; each run of ``adapt_step`` consecutive valid
results halves it; an invalid result resets the run; it never goes below the genesis floor.
Probabilities are integers in parts per million (ppm) so the rule is exact and deterministic.
"""

from __future__ import annotations

from ...encoding import H

PPM = 1_000_000


def sampling_ppm(base_ppm: int, floor_ppm: int, valid_run: int, adapt_step: int) -> int:
    """Sampling probability in ppm for a worker with ``valid_run`` consecutive valid verdicts.

    ``base_ppm >> (valid_run // adapt_step)``, clamped to ``[floor_ppm, PPM]``.
    """
    halvings = valid_run // adapt_step if adapt_step > 0 else 0
    p = base_ppm >> min(halvings, 40)
    return max(floor_ppm, min(PPM, p))


def is_sampled(beacon: bytes, receipt_id: bytes, p_ppm: int) -> bool:
    """True iff ``int(H(beacon ‖ receipt_id)) < p · 2^256`` with ``p = p_ppm / 10^6``."""
    if p_ppm >= PPM:
        return True
    if p_ppm <= 0:
        return False
    x = int.from_bytes(H(b"tally/sample/v1", beacon, receipt_id), "big")
    return x * PPM < p_ppm * (1 << 256)
