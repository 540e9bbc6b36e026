"""Images as model inputs: strangers' bytes decoded safely (``decode``), within limits
checked before any pixel is decoded."""
