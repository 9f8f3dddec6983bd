"""vllm-ascend's nightly where it is: its case files (`tests/e2e/nightly/**/*.yaml`) as recipes,
and its good table (`good_table.csv`) as the good end.

`cases` reads a case file into recipes (one per benchmark of a case) or refuses it with a
one-line reason; `good_table` finds the last good commit of a case the way the nightly's own
`tools/bisect/good_table.py` does, and says which dimension matched nothing when none does.
"""
