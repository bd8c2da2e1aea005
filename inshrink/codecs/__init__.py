"""Tensor codecs: pure transforms between arrays and encoded streams; they never touch files."""
