"""Batch jobs: OpenAI's Files and Batches API."""
