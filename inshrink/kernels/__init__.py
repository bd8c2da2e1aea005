"""Numba kernels: loops only, over arrays the Python layer has already validated.

Numba does no bounds checking, so callers must check every length, shape and width first.
"""
