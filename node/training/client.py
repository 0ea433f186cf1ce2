"""The sponsor's and a worker's side of collaborative training runs, outside the node's run services.

* :func:`post_run` — compute θ_0 (:class:`~node.training.inner.InnerTrainer`'s seeded init on the node's model),
  store the dataset and θ_0 as blobs (workers fetch both by content hash from the sponsor) and submit a
  :class:`~node.ledger.core.runtx.RunPost` escrowing the run's budget.
* :func:`run_action` — a :class:`RunJoin`, :class:`RunLeave` or :class:`RunCancel` of this node's account.
* :func:`fetch_params` — the run's current (final, once finished) parameters θ by content hash, checked against
  the ledger's id, written as a standard peft adapter (``adapter_model.safetensors`` + ``adapter_config.json``)
  for LoRA runs or as a Hugging Face model dir (``model.safetensors`` + ``config.json``) for ``all`` runs.

Every request is checked against the run rules (:func:`node.ledger.core.runs.apply_run_tx` on a copy of the state)
before anything is stored or submitted, so a refused one changes nothing and says why.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..blobs import BlobUnavailable, fetch_blob
from ..compute.data import dataset_bytes, dataset_tensors
from ..compute.executor import load_torch
from ..encoding import commitments_root, format_amount
from ..ledger.core import runs as runs_mod
from ..ledger.core.runstate import Run, runs_of
from ..ledger.core.runtx import RunCancel, RunJoin, RunLeave, RunPost
from ..ledger.core.tx import InvalidTx
from ..web.deps import CapabilityNode

if TYPE_CHECKING:
    import torch

HELD_WINDOWS = 16  # held-out windows evaluated by fetch_params (bounds its time, not its meaning)
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.json", "merges.txt")
ACTIONS: dict[str, type[RunJoin | RunLeave | RunCancel]] = {"join": RunJoin, "leave": RunLeave, "cancel": RunCancel}


class RunError(ValueError):
    """A run request that cannot be carried out (bad parameters, dataset too small, unknown run, refused by the
    run rules, parameters unavailable). The message says why; nothing was stored or submitted."""


def _prepare(model_dir: Path, text: bytes, s: dict[str, Any]) -> tuple[list[torch.Tensor], int]:
    """θ_0 and the number of training windows of ``text`` (executor thread).

    Raises:
        RunError: the model has no such LoRA targets, or the dataset is too small for ``max_workers`` disjoint
            chunks of ``inner_steps × batch_size + screen_windows`` windows (the last 10 % is held out).
    """
    # local: these import torch (~2 s); they run on the executor, when a sponsor posts a run
    from ..compute.train import encode_text, split_tokens
    from . import rounds as rd
    from .assign import make_windows

    train_ids, _ = split_tokens(encode_text(Path(model_dir), text))
    need = s["max_workers"] * (s["inner_steps"] * s["batch_size"] + s["screen_windows"])
    try:
        n = make_windows(train_ids, s["seq_len"]).shape[0]
    except ValueError:
        n = 0
    if n < need:
        raise RunError(f"the dataset is too small: its training part (the first 90 %) has {n} windows of "
                       f"{s['seq_len'] + 1} tokens, a round needs max_workers × (inner_steps × batch_size + "
                       f"screen_windows) = {need}; give more text or lower those settings")
    try:
        theta0 = rd.make_trainer(model_dir, s).params()
    except ValueError as e:
        raise RunError(str(e)) from None
    return theta0, n


async def post_run(node: CapabilityNode, *, title: str, text: bytes, settings: dict[str, Any],
                   deadline_blocks: int) -> RunPost:
    """Compute θ_0 in the node's executor, then store the dataset and θ_0 as blobs and submit a signed
    :class:`RunPost` from the node's account at its next nonce.

    Args:
        settings: every :class:`RunPost` field from ``trainable`` to ``round_timeout``, and ``quorum`` (ledger
            units: learning rate in millionths, rates in ppm, amounts in base units).
        deadline_blocks: the run must finish within this many blocks from now (at most the chain's
            ``max_job_deadline``).

    Raises:
        RunError: empty or too small dataset, bad targets, too little balance, or a rule of
            :func:`node.ledger.core.runs.check_post` (its message). Nothing is stored or submitted then.
    """
    if not text:
        raise RunError("the dataset is empty")
    theta0, _ = await node.executor.run(_prepare, node.cfg.model_dir, text, settings)
    data = dataset_tensors(text)
    st = node.ledger.state
    me = node.ident.account
    post = RunPost(node.genesis.domain, me, os.urandom(16), title[:200], node.manifest.model_id,
                   commitments_root(data), params0=commitments_root(theta0), deadline=st.height + deadline_blocks,
                   nonce=node.ledger.next_nonce(me), **settings)
    if st.account(me).balance < post.budget:
        raise RunError(f"the run's budget is {format_amount(post.budget)} credits (rounds × (max_workers × "
                       f"inner_steps × price_per_step + aggregator_fee)); the balance is "
                       f"{format_amount(st.account(me).balance)}")
    try:
        runs_mod.check_post(st.copy(), post)
    except InvalidTx as e:
        raise RunError(str(e)) from None
    post = post.signed(node.ident)
    node.blobs.put(data)
    node.blobs.put(theta0)
    await node.ledger.submit(post)
    return post


async def run_action(node: CapabilityNode, run_id: bytes, action: str) -> RunJoin | RunLeave | RunCancel:
    """Submit this node's :class:`RunJoin` / :class:`RunLeave` / :class:`RunCancel` (``action``: join, leave,
    cancel) for ``run_id`` after checking it against the run rules. Returns the submitted transaction.

    Raises:
        RunError: unknown run, a join of a run of another model than this node's, or the rule that refuses it
            (e.g. "worker is not bonded", "already joined", "only a run whose first round never opened can be
            cancelled").
    """
    st = node.ledger.state
    if run_id not in runs_of(st):
        raise RunError("no such run on the ledger")
    me = node.ident.account
    if action == "join" and runs_of(st)[run_id].post.model_id != node.manifest.model_id:  # its worker would never train
        raise RunError(f"the run trains model {runs_of(st)[run_id].post.model_id.hex()[:16]}, this node holds "
                       f"{node.manifest.name} ({node.manifest.model_id.hex()[:16]}); start it with --model of the run")
    tx = ACTIONS[action](node.genesis.domain, me, run_id, node.ledger.next_nonce(me))
    try:
        runs_mod.apply_run_tx(st.copy(), tx)
    except InvalidTx as e:
        raise RunError(str(e)) from None
    tx = tx.signed(node.ident)
    await node.ledger.submit(tx)
    return tx


def param_holders(run: Run) -> list[bytes]:
    """Who should hold θ_r of ``run``: the last round's aggregator and accepted workers (each recomputes
    θ_{r+1}), then the sponsor (θ_0) and the joined workers."""
    out: list[bytes] = []
    if run.history:
        last = run.history[-1]
        out += [last.aggregator, *last.accepted]
    out += [run.post.sender, *run.workers]
    return [a for i, a in enumerate(out) if a and a not in out[:i]]


def _write_params(model_dir: Path, post: RunPost, theta: list[torch.Tensor], text: bytes | None,
                  out_dir: Path) -> dict[str, Any]:
    """Write θ under ``out_dir`` and measure held-out loss of θ_0 and θ (executor thread).

    Raises:
        RunError: θ does not fit the run's trainable set on this model. OSError: ``out_dir`` not writable.
    """
    # local: peft adds ~4 s to transformers' import and safetensors.torch imports torch; loaded only here (executor)
    from peft import get_peft_model_state_dict
    from safetensors.torch import save_file

    # local: these import torch (~2 s); they run on the executor, when a sponsor fetches a run's parameters
    from ..compute.train import encode_text, split_tokens
    from . import rounds as rd
    from .assign import make_windows

    trainer = rd.make_trainer(model_dir, post)
    held = None
    if text is not None:
        _, held_ids = split_tokens(encode_text(Path(model_dir), text))
        try:
            held = make_windows(held_ids, post.seq_len)[:HELD_WINDOWS]
        except ValueError:
            held = None
    base = trainer.eval_loss(held) if held is not None else None
    try:
        trainer.load_params(theta)
    except ValueError as e:
        raise RunError(f"the fetched parameters do not fit this run's model: {e}") from None
    tuned = trainer.eval_loss(held) if held is not None else None
    out_dir.mkdir(parents=True, exist_ok=True)
    if post.trainable == "lora":
        files = [out_dir / "adapter_model.safetensors", out_dir / "adapter_config.json"]
        save_file({k: v.detach().cpu().contiguous() for k, v in get_peft_model_state_dict(trainer.model).items()},
                  str(files[0]))
        cfg = trainer.model.peft_config["default"].to_dict()
        cfg["base_model_name_or_path"] = str(model_dir)
        cfg = {k: (sorted(v) if isinstance(v, set) else v) for k, v in cfg.items()}
        files[1].write_text(json.dumps(cfg, indent=2, default=str))
    else:
        files = [out_dir / "model.safetensors", out_dir / "config.json"]
        save_file({n: t.contiguous() for n, t in zip(trainer.names, theta, strict=True)}, str(files[0]))
        trainer.model.config.save_pretrained(str(out_dir))
        for name in TOKENIZER_FILES:
            if (Path(model_dir) / name).exists():
                shutil.copyfile(Path(model_dir) / name, out_dir / name)
                files.append(out_dir / name)
    return {"heldout_loss_initial": base, "heldout_loss": tuned, "files": [str(f) for f in files]}


async def fetch_params(node: CapabilityNode, run_id: bytes, out_dir: Path) -> dict[str, Any]:
    """Fetch ``run_id``'s current parameters θ (the ledger's ``run.params``; the final ones once the run
    finished) by content hash from the local store or the peers of :func:`param_holders` (each reply checked
    against the id), write them under ``out_dir`` (see the module doc) and measure the mean held-out loss
    (nats/token, up to 16 windows of the dataset's last 10 %) of θ_0 and θ.

    Raises:
        RunError: unknown run, a base model other than this node's, or θ unavailable from every holder.
        OSError: ``out_dir`` cannot be written.
    """
    run = runs_of(node.ledger.state).get(run_id)
    if run is None:
        raise RunError("no such run on the ledger")
    post = run.post
    if post.model_id != node.manifest.model_id:
        raise RunError(f"the run trains model {post.model_id.hex()[:16]}; this node has "
                       f"{node.manifest.model_id.hex()[:16]}")
    await load_torch(node.executor)  # fetched tensors are decoded on the loop
    try:
        theta = await fetch_blob(node.host, node.blobs, run.params, param_holders(run))
    except BlobUnavailable as e:
        raise RunError(str(e)) from None
    try:
        text = dataset_bytes(await fetch_blob(node.host, node.blobs, post.dataset_root, [post.sender]))
    except (BlobUnavailable, ValueError):
        text = None  # the parameters are still written; the losses are then null
    out = await node.executor.run(_write_params, node.cfg.model_dir, post, theta, text, Path(out_dir))
    return {"run_id": run_id.hex(), "params": run.params.hex(), "round": run.round, "rounds": post.rounds,
            "status": run.status.value, "trainable": post.trainable, **out}
