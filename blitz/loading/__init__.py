"""Loading a registered model, one way from a ``ModelSpec`` to an ``Encoder`` (``load``):
the source as a local folder (``fetch``), checked for code of its own (``model_trust``),
built and opened (``opening``), one encoder; what a model's files say without loading it
(``facts``: its config, shape, dimension, input length, pooling). The ONNX builds (``onnx_export``, its
transformer traced by torch's exporter: ``graph_export``; a dual encoder's two towers:
``dual_export``) and their accuracy guard (``accuracy``),
``cpu_backend: auto``'s choice (``auto``, recorded in the model cache), the child processes
that build and measure (``child_work``, the parent's side; ``child_main``, the child's),
failed loads remembered (``failures``), and in-process throughput (``throughput``, for
``blitz optimize``)."""
