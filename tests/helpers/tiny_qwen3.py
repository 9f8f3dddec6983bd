"""Tiny random-weight Qwen3, Llama and Qwen3-MoE model directories that real vLLM can load (no hub).

Random weights with a fixed seed, saved as safetensors by `save_pretrained`, and a byte-level BPE
tokenizer trained here with the `tokenizers` package, with a ChatML-style chat template. Random
weights matter for the tests: greedy decoding of such a model repeats itself, which is exactly
what the repetition-penalty and loop-guard tests need.
"""

from __future__ import annotations

from pathlib import Path

CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
WORDS = [
    "the", "quick", "brown", "fox", "jumps", "over", "lazy", "dog", "repeat", "this", "sentence",
    "fifty", "times", "please", "answer", "a", "question", "about", "numbers", "and", "words",
    "in", "english", "with", "some", "more", "text", "to", "learn", "merges", "from", "apple",
    "banana", "cherry", "orange", "grape", "lemon", "mango", "peach", "pear", "plum", "kiwi",
    "melon", "berry",
]


def _corpus(lines: int = 400) -> list[str]:
    """Deterministic training text: word sequences from a fixed permutation walk."""
    out = []
    for i in range(lines):
        out.append(" ".join(WORDS[(i * 7 + j * 3) % len(WORDS)] for j in range(12)) + f" {i} .")
    return out


def write_tiny_qwen3(directory: Path, vocab_size: int = 2000, seed: int = 0, initializer_range: float = 0.02,
                     generation_config: dict | None = None) -> Path:
    """`initializer_range` sets how peaked the logits are: at the default 0.02 they are nearly flat
    and greedy decoding repeats one token at once (loop tests); at 0.3 they spread enough that a
    repetition penalty of 1.3 changes which token wins (penalty tests)."""
    return write_tiny_model(directory, "Qwen3", vocab_size=vocab_size, seed=seed, initializer_range=initializer_range,
                            generation_config=generation_config)


# Each family's tiny sizes beside the shared ones (hidden 128, 2 layers, 4 query and 2 key-value heads).
FAMILY_SIZES: dict[str, dict] = {
    "Qwen3": {"head_dim": 32},
    "Llama": {"head_dim": 32},
    # Layer 0 dense (a Qwen3MoeMLP), layer 1 a sparse MoE block: both kinds in one model.
    "Qwen3Moe": {"head_dim": 32, "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 64,
                 "decoder_sparse_step": 1, "mlp_only_layers": [0], "norm_topk_prob": True},
}


def _tokenizer(directory: Path, vocab_size: int):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    bpe.train_from_iterator(_corpus(), trainer=trainer)
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                        bos_token=None, chat_template=CHAT_TEMPLATE)
    tokenizer.save_pretrained(directory)
    return bpe


def write_tiny_model(directory: Path, family: str, vocab_size: int = 2000, seed: int = 0,
                     initializer_range: float = 0.02, generation_config: dict | None = None) -> Path:
    """A tiny random-weight `<family>ForCausalLM` (a key of FAMILY_SIZES) with the shared tokenizer."""
    import torch
    import transformers
    from transformers import GenerationConfig

    directory.mkdir(parents=True, exist_ok=True)
    bpe = _tokenizer(directory, vocab_size)
    torch.manual_seed(seed)
    config = getattr(transformers, f"{family}Config")(
        vocab_size=bpe.get_vocab_size(), hidden_size=128, intermediate_size=256, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096, tie_word_embeddings=True,
        torch_dtype="float32", eos_token_id=bpe.token_to_id("<|im_end|>"), bos_token_id=None,
        initializer_range=initializer_range, **FAMILY_SIZES[family])
    model = getattr(transformers, f"{family}ForCausalLM")(config)
    model.save_pretrained(directory, safe_serialization=True)
    GenerationConfig(eos_token_id=config.eos_token_id, **(generation_config or {})).save_pretrained(directory)
    return directory


def write_with_fault(source: Path, directory: Path, weight: str, factor: float) -> Path:
    """A copy of the model directory `source` with one weight (a safetensors key) multiplied by `factor`:
    a fault injected at a known module."""
    import shutil

    from safetensors.torch import load_file, save_file

    shutil.copytree(source, directory)
    weights = load_file(directory / "model.safetensors")
    weights[weight] = weights[weight] * factor
    save_file(weights, directory / "model.safetensors", metadata={"format": "pt"})
    return directory
