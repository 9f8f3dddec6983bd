"""`python -m bisect_npu` is the `bisect-npu` command."""

from bisect_npu.cli import main

main()
