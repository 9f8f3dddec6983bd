"""Generate a few tokens offline."""

from tinyvllm.engine import LLM
from tinyvllm.sampling_params import SamplingParams

llm = LLM("seed:0")
print(llm.tokenizer.decode(llm.generate("hello world", SamplingParams(temperature=0, max_tokens=16))))
