"""AISBench dataset config of the demo case `accuracy`: the question as the prompt, exact match
per sample with details (AccwithDetailsEvaluator), both sides normalised by AISBench's `general`
postprocessor. The probe sets `path` to the trial's samples."""

from ais_bench.benchmark.datasets import CustomDataset
from ais_bench.benchmark.openicl.icl_evaluator import AccwithDetailsEvaluator
from ais_bench.benchmark.openicl.icl_inferencer import GenInferencer
from ais_bench.benchmark.openicl.icl_prompt_template import PromptTemplate
from ais_bench.benchmark.openicl.icl_retriever import ZeroRetriever

demo_qa_datasets = [
    dict(
        abbr="demo_qa",
        type=CustomDataset,
        path="qa.jsonl",
        meta_path="",
        reader_cfg=dict(input_columns=["question"], output_column="answer"),
        infer_cfg=dict(prompt_template=dict(type=PromptTemplate, template="{question}"),
                       retriever=dict(type=ZeroRetriever), inferencer=dict(type=GenInferencer)),
        eval_cfg=dict(evaluator=dict(type=AccwithDetailsEvaluator), pred_postprocessor=dict(type="general"),
                      dataset_postprocessor=dict(type="general")),
    )
]
