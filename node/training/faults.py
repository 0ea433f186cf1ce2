"""The run worker's test switches (``node start --fault``, devnet and test chains only): one cheat per name, done
by :func:`node.training.rounds.train_round` and :class:`node.training.worker.RunWorker`. Apart from the torch code
that carries them out, so that building a node's run worker imports no torch (issue 35)."""

from __future__ import annotations

# "run-copyroot" trains nothing: it commits another participant's Δ root, copied from its receipt on the ledger
# (node.training.worker.RunWorker; the ledger refuses it, node.ledger.core.runs)
RUN_FAULTS = ("run-zero", "run-scale", "run-flip", "run-nan", "run-fewer", "run-otherdata", "run-stale",
              "run-replay", "run-copyroot", "run-codec", "run-residual", "run-slow")
# "run-slow" is no cheat: honest work, ready at a third of the fastest worker's pace (node.training.worker.RunWorker)
RUN_FAULT_HELP = ("Training runs (node run join): 'run-zero' sends a zero pseudo-gradient (free rider), 'run-scale' "
                  "×100, 'run-flip' sign-flipped, 'run-nan' NaN, 'run-fewer' trains one inner step fewer, "
                  "'run-otherdata' other batches, 'run-stale' from an earlier round's parameters, 'run-replay' its "
                  "previous round's pseudo-gradient, 'run-copyroot' commits another worker's Δ root, 'run-codec' "
                  "encodes its pseudo-gradient with another codec than the run's, 'run-residual' encodes it from "
                  "another error-feedback residual than the one it committed; 'run-slow' is honest but takes three "
                  "times as long to commit (a straggler).")
