"""Batch jobs the way OpenAI's users script them, Ray-free (``deployments/batches.py`` runs
the runner; docs/batches.md): where files and batches are kept, per owner (``store``),
OpenAI's file and batch objects (``objects``), a batch's input, output and error lines
(``lines``), the API's calls on the ingress within each key's limits (``service``), a
batch's life from validating to its output files, pieces run exactly once (``runner``), and
the ``blitz batch`` command (``client``)."""
