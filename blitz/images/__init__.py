"""Images as model inputs: strangers' bytes decoded safely (``decode``), within limits
checked before any pixel is decoded; the dual encoder (CLIP, SigLIP) that embeds texts and
images into one space (``dual_encoder``: on torch; ``onnx_dual``: on onnxruntime, and the
export of its towers)."""
