"""Code that runs *inside* a candidate environment (a worktree's Python or a container).

Standard library plus the engine only, and relative imports only: the package is copied into
images under another name, so it must not import anything else from `bisect_npu`.
"""
