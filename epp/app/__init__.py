"""Composition: the only place that wires components together and reads flags."""
