"""Differential checks that hold the three layers together: generated batches and the `cliplab verify` table."""
