"""Tensor dumps: the file formats read without torch, and the streaming comparison."""
