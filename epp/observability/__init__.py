"""Metrics and logging set-up: what the picker reports about itself."""
