"""The accuracy oracle: per-sample results of a harness run, judged with paired statistics.

`samples` reads the per-sample JSONL format; the statistics, focusing and the judge live beside it.
"""

from __future__ import annotations

from bisect_npu.oracle.accuracy.samples import SampleFormatError, parse_sample_lines, read_samples_jsonl

__all__ = ["SampleFormatError", "parse_sample_lines", "read_samples_jsonl"]
