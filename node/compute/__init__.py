"""Models in torch: the on-disk model format and everything that runs a model (servers, clients, committees,
trainers). Nothing here touches the network or the ledger.

The modules that run a model import torch at their top; the pure ones (``model``, ``families``, ``shards``,
``executor``, ``compare``, ``lazyhead``, ``data``) do not, so a node that loads no model never imports torch (issue 35).

* :mod:`~node.compute.model` -- the model dir (manifest, per-block files, hashes, model id), the built-in models
  (SmolLM2 from the bundled GGUF, the tiny test model), :func:`~node.compute.model.tokenizer_trusted`.
* :mod:`~node.compute.arch`, :mod:`~node.compute.families` -- the decoder architectures and how their pieces are
  built; :mod:`~node.compute.int8` -- int8 weights at run time.
* :mod:`~node.compute.span` -- a server's span of blocks; :mod:`~node.compute.head` -- the client's embedding, norm
  and LM head (:mod:`~node.compute.lazyhead`: built at its first use); :mod:`~node.compute.reference` -- the
  one-process reference run.
* :mod:`~node.compute.shards` -- span arithmetic and route planning (pure); :mod:`~node.compute.executor` -- torch
  off the event loop.
* :mod:`~node.compute.train` -- deterministic LoRA training in segments; :mod:`~node.compute.data` -- datasets as
  tensors.
* :mod:`~node.compute.compare` -- the distance between committed and re-executed outputs (pure);
  :mod:`~node.compute.cheats` -- how a cheating server cheats (test switches).
"""
