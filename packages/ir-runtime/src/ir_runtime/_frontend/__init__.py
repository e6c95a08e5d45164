"""The PyTorch lazy-tensor front end. Importing this package, or any module in it, changes
nothing in torch: ``install()`` (in ``_install``) does, once, and ``ir_runtime`` calls it the
first time one of the front end's public names is used.

By stage, each group importing only the groups above it (and the graph layer):

``recording/``
    Turning torch ops into IR. ``_convert`` (dtypes, host arrays) -> ``_tensor`` (the
    ``LazyTensor`` type, the live registry, the one writer of a tensor's value and placement)
    -> ``_meta`` (shape inference) -> ``_record`` (plans per ATen overload, ``record``) ->
    ``_views`` (writes in place) -> ``_device_orders`` (no op combines tensors over two
    device orders) -> ``_dispatch`` (routing, ``@special``, and the one place the C hot path
    ``_fast`` is configured) -> ``_rng`` (the lazy random stream's one owner) -> the
    handlers (``_handlers``, ``_samplers``, ``_dynamic``, ``_factories``, ``_optim``) and
    ``_api`` (``to_lazy``, ``mark_sharding``, ``dump``, ...).
``steps/``
    Running what was recorded. ``_step`` (``mark_step``, host reads, the step's event counts)
    -> ``_guards`` -> ``_replay`` (a compiled step's replay of one traced call) -> ``_trace``
    (tracing one call into a replay) -> ``_capture`` (``compile_step``); ``_generate``.
``regions/``
    Bodies traced once and scopes: ``_shard_map`` (manual regions, collectives), ``_scan``
    (``scan_layers``), ``_stack`` (``stack_layers``: a stack's tensors stored stacked),
    ``_recompute`` (``torch.utils.checkpoint``), ``_autocast``,
    ``_layouts`` (placements that follow into gradients).
``io/``
    Data in and out: ``_checkpoints`` (``CheckpointManager``), ``_loader``
    (``ShardedLoader``).
``dynamo/``
    ``_backend``: ``torch.compile(model, backend="ir_runtime")``, AOTAutograd's ATen graphs
    traced on placeholders through ``recording/`` and compiled by the cache.

``inspect`` is the one seam tests and tools may read the front end's state through.
Which buffers a step donates is decided in the graph layer (``ir_runtime._donation``).
"""
