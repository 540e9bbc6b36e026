"""Images as model inputs: a stranger's file walked before it is opened (``scan``) and
decoded within limits checked before any pixel is decoded (``decode``); a request's images
as encoded files, whatever way they were sent (``inputs``), and fetched by URL where
allowed (``fetch``); the dual encoder (CLIP, SigLIP) that embeds texts and images into one
space (``dual_encoder``: on torch; ``onnx_dual``: on onnxruntime)."""
