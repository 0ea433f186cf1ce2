"""The model cache beyond the built-in models: ``node model add|list|remove``. Builds on the model-dir format of
:mod:`node.compute.model`.

* :mod:`~node.models.sources` -- a Hugging Face checkpoint dir or a GGUF file, checked before anything is written;
  :mod:`~node.models.convert` -- converted once into the per-block cache and registered;
  :mod:`~node.models.quantize` -- its int8 copy; :mod:`~node.models.progress` -- progress output.
* :mod:`~node.models.registry` -- ``registry.json`` of the added models; :mod:`~node.models.lookup` -- finding a
  model by name or id (:class:`~node.models.lookup.UnknownModel`).
* :mod:`~node.models.cli` -- the commands.
"""
